//! Prompt building: the template, tokenization of (query, item) pairs, and the shared prefix.
//!
//! A prompt is `template.prefix ++ body(instruction, query, item) ++ template.suffix`. The
//! template's own text (with special tokens such as `<|im_start|>`) is tokenized with special
//! tokens recognised; the body, which carries caller text, is tokenized with special tokens
//! treated as plain text, so an item cannot inject control tokens.
//!
//! The shared prefix is found on token ids, never on strings: BPE can merge across the
//! query/item boundary (the space before the item's first word belongs to the item's token).

use serde::{Deserialize, Serialize};

use crate::{Result, WorkerError};

/// What prompt building needs from a tokenizer.
pub trait TextEncoder: Send + Sync {
    /// Encodes template text: special tokens written in it are recognised.
    fn encode_special(&self, text: &str) -> Result<Vec<u32>>;
    /// Encodes caller text: special-token strings are ordinary text.
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>>;
    /// [`TextEncoder::encode_plain`] of each text, in order. One call's items come through here
    /// together so that an encoder may spread them over threads ([`crate::tokenize_pool`]).
    fn encode_plain_many(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        texts.iter().map(|t| self.encode_plain(t)).collect()
    }
    /// Where each token of [`TextEncoder::encode_plain`]`(text)` begins, in bytes of `text`:
    /// truncation cuts an item's text on these boundaries.
    fn token_starts(&self, text: &str) -> Result<Vec<usize>>;
    /// An independent [`TextEncoder::encode_plain`] giving the same ids, for another thread of
    /// [`crate::tokenize_pool`], where threads sharing one encoder would contend on its caches;
    /// `None`: the threads share this one.
    fn fork_plain(&self) -> Option<PlainEncoder> {
        None
    }
}

/// One thread's [`TextEncoder::encode_plain`] ([`TextEncoder::fork_plain`]).
pub type PlainEncoder = Box<dyn Fn(&str) -> Result<Vec<u32>> + Send + Sync>;

/// A caller's request to cut items (`max_item_tokens`, `truncation_direction`), already capped
/// by the server's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncate {
    pub max_tokens: usize,
    /// Keep the item's last tokens (cut its beginning).
    pub left: bool,
}

/// The prompt template of a model. `{instruction}`, `{query}` and `{item}` in `body` are
/// replaced by the call's values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PromptTemplate {
    pub prefix: String,
    pub body: String,
    pub suffix: String,
    pub default_instruction: String,
    /// Token whose logit means "relevant" (the folded score head reads W[yes] − W[no]).
    pub yes_token: String,
    pub no_token: String,
}

impl Default for PromptTemplate {
    /// The Qwen3-Reranker template.
    fn default() -> Self {
        PromptTemplate {
            prefix: "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n".into(),
            body: "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {item}".into(),
            suffix: "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".into(),
            default_instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
            yes_token: "yes".into(),
            no_token: "no".into(),
        }
    }
}

impl PromptTemplate {
    /// The Qwen3-Reranker template without the empty think block, for chat models that were
    /// not trained with one (SmolLM2 and other ChatML models).
    pub fn chatml() -> Self {
        PromptTemplate { suffix: "<|im_end|>\n<|im_start|>assistant\n".into(), ..Self::default() }
    }

    /// The body with the call's values. Placeholders are substituted in one left-to-right pass,
    /// so braces inside the caller's text are never re-expanded.
    pub fn render_body(&self, instruction: &str, query: &str, item: &str) -> String {
        let mut out = String::with_capacity(self.body.len() + query.len() + item.len() + instruction.len());
        let mut rest = self.body.as_str();
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            let tail = &rest[start..];
            let (value, len) = if tail.starts_with("{instruction}") {
                (instruction, "{instruction}".len())
            } else if tail.starts_with("{query}") {
                (query, "{query}".len())
            } else if tail.starts_with("{item}") {
                (item, "{item}".len())
            } else {
                ("{", 1)
            };
            out.push_str(value);
            rest = &tail[len..];
        }
        out.push_str(rest);
        out
    }

    pub fn validate(&self) -> Result<()> {
        for p in ["{query}", "{item}"] {
            if !self.body.contains(p) {
                return Err(WorkerError::Config(format!("template body lacks {p}")));
            }
        }
        Ok(())
    }
}

/// A template with its fixed parts tokenized once.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    pub template: PromptTemplate,
    prefix_ids: Vec<u32>,
    suffix_ids: Vec<u32>,
}

/// The prompts of one call, tokenized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizedCall {
    /// Full prompt of each item, in input order.
    pub prompts: Vec<Vec<u32>>,
    /// Items cut by truncation.
    pub truncated: u64,
    /// Length of the prefix shared by every prompt (≤ each prompt's length − 1, so every item
    /// computes at least its last token) and bounded by the query part of the template.
    pub prefix_len: usize,
}

impl TokenizedCall {
    pub fn prefix(&self) -> &[u32] {
        &self.prompts[0][..self.prefix_len]
    }
    pub fn prompt_tokens(&self) -> u64 {
        self.prompts.iter().map(|p| p.len() as u64).sum()
    }
}

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptBuilder {
    pub fn new(template: PromptTemplate, enc: &dyn TextEncoder) -> Result<Self> {
        template.validate()?;
        let prefix_ids = enc.encode_special(&template.prefix)?;
        let suffix_ids = enc.encode_special(&template.suffix)?;
        Ok(PromptBuilder { template, prefix_ids, suffix_ids })
    }

    pub fn prompt_ids(&self, enc: &dyn TextEncoder, instruction: &str, query: &str, item: &str) -> Result<Vec<u32>> {
        let body = enc.encode_plain(&self.template.render_body(instruction, query, item))?;
        Ok(self.wrap_body(&body))
    }

    /// `prefix ++ body ++ suffix`.
    fn wrap_body(&self, body: &[u32]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.prefix_ids.len() + body.len() + self.suffix_ids.len());
        ids.extend_from_slice(&self.prefix_ids);
        ids.extend_from_slice(body);
        ids.extend_from_slice(&self.suffix_ids);
        ids
    }

    /// Tokenizes every pair of a call and finds the shared prefix. The prefix is the longest
    /// common token prefix of the prompts, capped by the prompt of an empty item (so it never
    /// reaches into item text even for a single item, and a cached prefix serves any items of the
    /// same query) and by each prompt's length − 1.
    pub fn tokenize_call(
        &self,
        enc: &dyn TextEncoder,
        instruction: Option<&str>,
        query: &str,
        items: &[&str],
    ) -> Result<TokenizedCall> {
        let instruction = instruction.unwrap_or(&self.template.default_instruction);
        let probe = self.prompt_ids(enc, instruction, query, "")?;
        let mut prefix_len = probe.len();
        // Every body is encoded in one call: most of a call's preparation time is here (each body
        // repeats the instruction and query), and an encoder may spread the items over threads.
        let bodies: Vec<String> =
            items.iter().map(|item| self.template.render_body(instruction, query, item)).collect();
        let mut prompts = Vec::with_capacity(items.len());
        for body in enc.encode_plain_many(&bodies)? {
            let p = self.wrap_body(&body);
            prefix_len = prefix_len.min(common_prefix_len(&probe, &p)).min(p.len().saturating_sub(1));
            prompts.push(p);
        }
        Ok(TokenizedCall { prompts, prefix_len, truncated: 0 })
    }

    /// [`tokenize_call`](Self::tokenize_call), each item cut when the caller asked for it: to
    /// `t.max_tokens` of its own tokens (its text tokenized alone), and further while its prompt
    /// is over `max_seq` tokens. An item is cut on its own token boundaries and then rendered
    /// and tokenized as any other, so its prompt is what the same text sent already cut gives,
    /// whatever else is in the call (the determinism contract). An item that needs no cut is not
    /// tokenized a second time.
    pub fn tokenize_truncated(
        &self,
        enc: &dyn TextEncoder,
        instruction: Option<&str>,
        query: &str,
        items: &[&str],
        t: Truncate,
        max_seq: usize,
    ) -> Result<TokenizedCall> {
        let mut call = self.tokenize_call(enc, instruction, query, items)?;
        let ins = instruction.unwrap_or(&self.template.default_instruction);
        let empty = self.prompt_ids(enc, ins, query, "")?.len();
        for (i, item) in items.iter().enumerate() {
            let own = call.prompts[i].len().saturating_sub(empty);
            // A BPE merge across the item's edges moves its count in the prompt by a token or
            // two from its count alone: items near the cap are measured alone.
            if own + 2 <= t.max_tokens && call.prompts[i].len() <= max_seq {
                continue;
            }
            let starts = enc.token_starts(item)?;
            let mut keep = starts.len().min(t.max_tokens);
            let mut prompt = std::mem::take(&mut call.prompts[i]);
            let mut cut = keep < starts.len();
            loop {
                if keep < starts.len() {
                    // A byte-level token can end inside a character: the cut moves to the
                    // character's edge that keeps less.
                    let text = if t.left {
                        let mut at = starts[starts.len() - keep];
                        while !item.is_char_boundary(at) {
                            at += 1;
                        }
                        &item[at..]
                    } else {
                        let mut at = starts.get(keep).copied().unwrap_or(item.len());
                        while !item.is_char_boundary(at) {
                            at -= 1;
                        }
                        &item[..at]
                    };
                    prompt = self.prompt_ids(enc, ins, query, text)?;
                    cut = true;
                }
                // Over the context: cut what is over and measure again (merges at the cut can
                // add a token); a query too long for any item keeps its 413 at the scheduler.
                if prompt.len() <= max_seq || keep == 0 {
                    break;
                }
                keep = keep.saturating_sub((prompt.len() - max_seq).max(1));
            }
            call.truncated += u64::from(cut);
            call.prefix_len = call.prefix_len.min(prompt.len().saturating_sub(1));
            call.prompts[i] = prompt;
        }
        Ok(call)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One token per byte, except that a space merges with the following letter (like BPE's
    /// "Ġword" tokens) and `<s>` is one special token unless encoded as plain text.
    pub(crate) struct ByteEncoder;
    impl ByteEncoder {
        fn enc(text: &str, special: bool) -> Vec<u32> {
            let b = text.as_bytes();
            let mut out = vec![];
            let mut i = 0;
            while i < b.len() {
                if special && text[i..].starts_with("<s>") {
                    out.push(1000);
                    i += 3;
                } else if b[i] == b' ' && i + 1 < b.len() && b[i + 1].is_ascii_alphabetic() {
                    out.push(500 + b[i + 1] as u32);
                    i += 2;
                } else {
                    out.push(b[i] as u32);
                    i += 1;
                }
            }
            out
        }
    }
    impl TextEncoder for ByteEncoder {
        fn encode_special(&self, t: &str) -> Result<Vec<u32>> {
            Ok(Self::enc(t, true))
        }
        fn encode_plain(&self, t: &str) -> Result<Vec<u32>> {
            Ok(Self::enc(t, false))
        }
        fn token_starts(&self, t: &str) -> Result<Vec<usize>> {
            let b = t.as_bytes();
            let mut out = vec![];
            let mut i = 0;
            while i < b.len() {
                out.push(i);
                i += if b[i] == b' ' && i + 1 < b.len() && b[i + 1].is_ascii_alphabetic() { 2 } else { 1 };
            }
            Ok(out)
        }
    }

    /// [`ByteEncoder`] folded into a small model's vocabulary.
    pub(crate) struct ModEncoder(pub u32);
    impl TextEncoder for ModEncoder {
        fn encode_special(&self, t: &str) -> Result<Vec<u32>> {
            Ok(ByteEncoder.encode_special(t)?.into_iter().map(|x| x % self.0).collect())
        }
        fn encode_plain(&self, t: &str) -> Result<Vec<u32>> {
            Ok(ByteEncoder.encode_plain(t)?.into_iter().map(|x| x % self.0).collect())
        }
        fn token_starts(&self, t: &str) -> Result<Vec<usize>> {
            ByteEncoder.token_starts(t)
        }
    }

    fn builder() -> PromptBuilder {
        let t = PromptTemplate {
            prefix: "<s>sys\n".into(),
            body: "Q: {query}\nD: {item}".into(),
            suffix: "<s>".into(),
            default_instruction: "i".into(),
            yes_token: "yes".into(),
            no_token: "no".into(),
        };
        PromptBuilder::new(t, &ByteEncoder).unwrap()
    }

    #[test]
    fn prefix_stops_before_a_boundary_merge() {
        let b = builder();
        let call = b.tokenize_call(&ByteEncoder, None, "red shoes", &["apple", "avocado"]).unwrap();
        // "D: apple": the space merges with 'a', so the prefix ends at ':'
        let text_prefix = ByteEncoder::enc("<s>sys\nQ: red shoes\nD:", true);
        assert_eq!(call.prefix(), &text_prefix[..]);
        assert_eq!(call.prompts[0][call.prefix_len], 500 + b'a' as u32);
    }

    #[test]
    fn single_item_prefix_is_the_query_part() {
        let b = builder();
        let call = b.tokenize_call(&ByteEncoder, None, "red shoes", &["apple"]).unwrap();
        assert_eq!(call.prefix_len, ByteEncoder::enc("<s>sys\nQ: red shoes\nD:", true).len());
    }

    #[test]
    fn identical_items_keep_a_token_to_compute() {
        let b = builder();
        let call = b.tokenize_call(&ByteEncoder, None, "q", &["x", "x"]).unwrap();
        assert!(call.prefix_len < call.prompts[0].len());
    }

    #[test]
    fn caller_text_cannot_inject_special_tokens_or_placeholders() {
        let b = builder();
        let call = b.tokenize_call(&ByteEncoder, None, "{item}", &["<s>"]).unwrap();
        let p = &call.prompts[0];
        assert_eq!(p.iter().filter(|&&t| t == 1000).count(), 2, "only the template's own <s> tokens are special");
        assert_eq!(b.template.render_body("i", "{item}", "x"), "Q: {item}\nD: x");
    }
}
