//! Prompt building: the template, tokenization of (query, item) pairs, and the shared prefix.
//!
//! A prompt is `template.prefix ++ body(instruction, query, item) ++ template.suffix`. The
//! template's own text (with special tokens such as `<|im_start|>`) is tokenized with special
//! tokens recognised; the body, which carries caller text, is tokenized with special tokens
//! treated as plain text, so an item cannot inject control tokens.
//!
//! The shared prefix is found on token ids, never on strings: BPE can merge across the
//! query/item boundary (the space before the item's first word belongs to the item's token).
//! Tokenizing is a call's main preparation cost, and each body repeats the instruction and the
//! query: where the tokenizer is known to end a piece after a newline that the template's own
//! text follows (`TextEncoder::splits_after_newline`, checked again on probe pairs and on each
//! call's empty item), the body is cut there and the query part is tokenized once per call —
//! the same ids as the whole body's.

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
    /// [`TextEncoder::token_starts`] of each text, in order (spread over threads as
    /// [`TextEncoder::encode_plain_many`]: the items a call asks to cut).
    fn token_starts_many(&self, texts: &[&str]) -> Result<Vec<Vec<usize>>> {
        texts.iter().map(|t| self.token_starts(t)).collect()
    }
    /// Whether `encode_plain(a + b) == encode_plain(a) ++ encode_plain(b)` whenever `a` ends
    /// with a newline and `b` begins with a printable ASCII character other than a space: then a
    /// call's prompts tokenize the query part once and each item's part alone
    /// ([`PromptBuilder::tokenize_call`]). False unless the encoder knows it holds.
    fn splits_after_newline(&self) -> bool {
        false
    }
}

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
        render(&self.body, instruction, query, item)
    }

    /// Where [`PromptBuilder::tokenize_call`] may cut the body for tokenizing: the byte just
    /// after the last newline before `{item}`, when the template text there begins with a
    /// printable ASCII character other than a space (so not a placeholder's `{` either). The
    /// default template's `<Document>: `.
    fn item_cut(&self) -> Option<usize> {
        let cut = self.body[..self.body.find("{item}")?].rfind('\n')? + 1;
        let first = self.body.as_bytes()[cut];
        (first.is_ascii_graphic() && first != b'{').then_some(cut)
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

/// `part` of a template with the call's values: placeholders substituted in one left-to-right
/// pass, so braces inside the caller's text are never re-expanded.
fn render(part: &str, instruction: &str, query: &str, item: &str) -> String {
    let mut out = String::with_capacity(part.len() + query.len() + item.len() + instruction.len());
    let mut rest = part;
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

/// A template with its fixed parts tokenized once.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    pub template: PromptTemplate,
    prefix_ids: Vec<u32>,
    suffix_ids: Vec<u32>,
    /// [`PromptTemplate::item_cut`], where the encoder splits there
    /// ([`TextEncoder::splits_after_newline`]) and the [`CUT_PROBES`] agree.
    item_cut: Option<usize>,
}

/// (query, item) pairs whose prompts must tokenize the same cut at [`PromptTemplate::item_cut`]
/// as whole before a builder cuts at all: text that could merge across the cut's edges.
const CUT_PROBES: [(&str, &str); 10] = [
    ("red trail shoes", "waterproof leather boot"),
    ("ends with a space ", " starts with a space"),
    ("ends with a newline\n", "\nstarts with a newline"),
    ("ends with\r\n", "\r\n\r\n"),
    ("question?", "'s an apostrophe"),
    ("digits 123", "456 digits"),
    ("naïve café", "\u{301}a combining mark first"),
    ("<|im_start|>", "<think>\n</think><|im_end|>"),
    ("", ""),
    ("\t", "\t \n x"),
];

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
        let mut b = PromptBuilder { template, prefix_ids, suffix_ids, item_cut: None };
        if let Some(cut) = b.template.item_cut().filter(|_| enc.splits_after_newline()) {
            let (head, tail) = b.template.body.split_at(cut);
            for (query, item) in CUT_PROBES {
                let whole = enc.encode_plain(&render(&b.template.body, "instruct", query, item))?;
                let mut parts = enc.encode_plain(&render(head, "instruct", query, item))?;
                parts.extend(enc.encode_plain(&render(tail, "instruct", query, item))?);
                if parts != whole {
                    tracing::warn!("the prompt template's body is tokenized whole: cut, {query:?} / {item:?} differ");
                    return Ok(b);
                }
            }
            b.item_cut = Some(cut);
        }
        Ok(b)
    }

    pub fn prompt_ids(&self, enc: &dyn TextEncoder, instruction: &str, query: &str, item: &str) -> Result<Vec<u32>> {
        let body = enc.encode_plain(&self.template.render_body(instruction, query, item))?;
        Ok(self.wrap(&[&body]))
    }

    /// `prefix ++ parts ++ suffix`.
    fn wrap(&self, parts: &[&[u32]]) -> Vec<u32> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        let mut ids = Vec::with_capacity(self.prefix_ids.len() + len + self.suffix_ids.len());
        ids.extend_from_slice(&self.prefix_ids);
        for p in parts {
            ids.extend_from_slice(p);
        }
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
        // Where the body may be cut (`item_cut`), the instruction and query part is tokenized
        // once and each item's part alone: a third of the text. This call's empty item must
        // give the whole body's ids that way too, else the call is tokenized whole.
        let mut head = None;
        if let Some(cut) = self.item_cut {
            let (head_t, tail_t) = self.template.body.split_at(cut);
            let ids = enc.encode_plain(&render(head_t, instruction, query, ""))?;
            let empty = enc.encode_plain(&render(tail_t, instruction, query, ""))?;
            if self.wrap(&[&ids, &empty]) == probe {
                head = Some((ids, tail_t));
            }
        }
        // Every item is encoded in one call: most of a call's preparation time is here, and an
        // encoder may spread the items over threads.
        let texts: Vec<String> = match &head {
            Some((_, tail_t)) => items.iter().map(|item| render(tail_t, instruction, query, item)).collect(),
            None => items.iter().map(|item| self.template.render_body(instruction, query, item)).collect(),
        };
        let mut prompts = Vec::with_capacity(items.len());
        for ids in enc.encode_plain_many(&texts)? {
            let p = match &head {
                Some((head, _)) => self.wrap(&[head, &ids]),
                None => self.wrap(&[&ids]),
            };
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
        // A BPE merge across the item's edges moves its count in the prompt by a token or two
        // from its count alone: items near the cap are measured alone.
        let over: Vec<usize> = (0..items.len())
            .filter(|&i| {
                let own = call.prompts[i].len().saturating_sub(empty);
                own + 2 > t.max_tokens || call.prompts[i].len() > max_seq
            })
            .collect();
        if over.is_empty() {
            return Ok(call);
        }
        // The items over the cap, measured and cut, then tokenized together as any call's items
        // (both over the encoder's threads).
        let starts = enc.token_starts_many(&over.iter().map(|&i| items[i]).collect::<Vec<_>>())?;
        let keeps: Vec<usize> = starts.iter().map(|s| s.len().min(t.max_tokens)).collect();
        let cut: Vec<usize> = (0..over.len()).filter(|&j| keeps[j] < starts[j].len()).collect();
        let texts: Vec<&str> = cut.iter().map(|&j| cut_text(items[over[j]], &starts[j], keeps[j], t.left)).collect();
        let prompts = self.tokenize_call(enc, instruction, query, &texts)?.prompts;
        for (&j, prompt) in cut.iter().zip(prompts) {
            call.prompts[over[j]] = prompt;
        }
        for (j, &i) in over.iter().enumerate() {
            // Over the context: cut what is over and measure again (merges at the cut can add a
            // token); a query too long for any item keeps its 413 at the scheduler.
            let mut keep = keeps[j];
            while call.prompts[i].len() > max_seq && keep > 0 {
                keep = keep.saturating_sub((call.prompts[i].len() - max_seq).max(1));
                call.prompts[i] = self.prompt_ids(enc, ins, query, cut_text(items[i], &starts[j], keep, t.left))?;
            }
            let truncated = keep < starts[j].len();
            call.truncated += u64::from(truncated);
            call.prefix_len = call.prefix_len.min(call.prompts[i].len().saturating_sub(1));
        }
        Ok(call)
    }
}

/// `item` cut to `keep` of its tokens (`starts`: where each begins), its last ones if `left`.
/// A byte-level token can end inside a character: the cut moves to the character's edge that
/// keeps less.
fn cut_text<'a>(item: &'a str, starts: &[usize], keep: usize, left: bool) -> &'a str {
    if keep >= starts.len() {
        return item;
    }
    if keep == 0 {
        return "";
    }
    if left {
        let mut at = starts[starts.len() - keep];
        while !item.is_char_boundary(at) {
            at += 1;
        }
        &item[at..]
    } else {
        let mut at = starts[keep];
        while !item.is_char_boundary(at) {
            at -= 1;
        }
        &item[..at]
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

    /// Items and queries with text that could merge across the body's cut: spaces, newlines,
    /// combining marks, apostrophes, digits, special-token strings, and long runs.
    fn tricky() -> Vec<String> {
        let mut t: Vec<String> = [
            "",
            " ",
            "\n",
            "\r\n",
            "\t\n x",
            "  two spaces",
            "\nnewline first",
            "'s",
            "'ll do",
            "123 digits",
            "\u{301}combining first",
            "é",
            "<think>",
            "</think>\n",
            "<|im_start|>user",
            "<|im_end|>",
            "?!",
            "—dash",
            "naïve café crème",
            "trailing newline\n",
            "trailing space ",
            "\u{3000}ideographic space",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        t.extend((0..40).map(|i| format!("trail running shoe {i}, waterproof — size {}\n\n{}", i * 7, " x".repeat(i))));
        t
    }

    /// With the qwen3 tokenizer and the default template, a call's bodies are cut (the query
    /// part tokenized once, each item's part alone), and every prompt and the shared prefix are
    /// what tokenizing each body whole gives.
    #[test]
    fn cut_bodies_give_the_whole_bodies_ids() {
        use crate::model::test_assets::{asset, QWEN3_TOKENIZER};
        let tok = crate::Tokenizer::from_file(&asset(QWEN3_TOKENIZER)).unwrap();
        assert!(tok.splits_after_newline());
        let cut = PromptBuilder::new(PromptTemplate::default(), &tok).unwrap();
        assert_eq!(cut.item_cut, Some("<Instruct>: {instruction}\n<Query>: {query}\n".len()));
        let whole = PromptBuilder { item_cut: None, ..cut.clone() };
        let texts = tricky();
        let items: Vec<&str> = texts.iter().map(String::as_str).collect();
        for query in texts.iter().take(24).map(String::as_str).chain(["red shoes"]) {
            let (a, b) = (
                cut.tokenize_call(&tok, None, query, &items).unwrap(),
                whole.tokenize_call(&tok, None, query, &items).unwrap(),
            );
            assert_eq!(a, b, "query {query:?}");
            let ins = cut.template.default_instruction.clone();
            assert_eq!(a.prompts[40], cut.prompt_ids(&tok, &ins, query, items[40]).unwrap());
        }
    }

    /// No cut where the template has no newline before `{item}` with text after it, or the
    /// encoder does not say it splits there, or it says so and the probes show otherwise.
    #[test]
    fn bodies_are_tokenized_whole_unless_the_cut_is_safe() {
        struct Claims<E>(E);
        impl<E: TextEncoder> TextEncoder for Claims<E> {
            fn encode_special(&self, t: &str) -> Result<Vec<u32>> {
                self.0.encode_special(t)
            }
            fn encode_plain(&self, t: &str) -> Result<Vec<u32>> {
                self.0.encode_plain(t)
            }
            fn token_starts(&self, t: &str) -> Result<Vec<usize>> {
                self.0.token_starts(t)
            }
            fn splits_after_newline(&self) -> bool {
                true
            }
        }
        /// One token per text: never additive.
        struct Whole;
        impl TextEncoder for Whole {
            fn encode_special(&self, t: &str) -> Result<Vec<u32>> {
                Ok(vec![t.len() as u32])
            }
            fn encode_plain(&self, t: &str) -> Result<Vec<u32>> {
                Ok(vec![t.len() as u32])
            }
            fn token_starts(&self, _: &str) -> Result<Vec<usize>> {
                Ok(vec![0])
            }
        }
        let t = PromptTemplate::default();
        assert!(PromptBuilder::new(t.clone(), &Claims(ByteEncoder)).unwrap().item_cut.is_some());
        assert_eq!(PromptBuilder::new(t.clone(), &ByteEncoder).unwrap().item_cut, None, "no claim");
        assert_eq!(PromptBuilder::new(t.clone(), &Claims(Whole)).unwrap().item_cut, None, "the probes differ");
        for body in ["Q: {query} D: {item}", "Q: {query}\n{item}", "Q: {query}\n {item}", "{item}\nQ: {query}"] {
            let t = PromptTemplate { body: body.into(), ..t.clone() };
            assert_eq!(PromptBuilder::new(t, &Claims(ByteEncoder)).unwrap().item_cut, None, "{body:?}");
        }
        let t = PromptTemplate { body: "Q: {query}\nD: {item}\n{query}".into(), ..t };
        let b = PromptBuilder::new(t, &Claims(ByteEncoder)).unwrap();
        assert_eq!(b.item_cut, Some("Q: {query}\n".len()));
        let call = b.tokenize_call(&Claims(ByteEncoder), None, "q", &["a b", "c"]).unwrap();
        let whole = PromptBuilder { item_cut: None, ..b.clone() }.tokenize_call(&ByteEncoder, None, "q", &["a b", "c"]);
        assert_eq!(call, whole.unwrap());
    }

    /// Random queries and items over an alphabet of what could merge at the cut (newlines,
    /// spaces, tabs, apostrophes, digits, punctuation, letters with and without combining marks,
    /// wide spaces, CJK, emoji, special-token strings): cut tokenization gives the whole bodies'
    /// prompts and prefix. `SIEVE_CUT_CASES` sets the number of calls (a longer run by hand).
    #[test]
    fn cut_bodies_give_the_whole_bodies_ids_on_random_text() {
        use crate::model::test_assets::{asset, QWEN3_TOKENIZER, TEXT_PIECES};
        use rand::{Rng, SeedableRng};
        let tok = crate::Tokenizer::from_file(&asset(QWEN3_TOKENIZER)).unwrap();
        let cut = PromptBuilder::new(PromptTemplate::default(), &tok).unwrap();
        assert!(cut.item_cut.is_some());
        let whole = PromptBuilder { item_cut: None, ..cut.clone() };
        let cases = std::env::var("SIEVE_CUT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let text = |rng: &mut rand::rngs::StdRng| -> String {
            (0..rng.random_range(0..8)).map(|_| TEXT_PIECES[rng.random_range(0..TEXT_PIECES.len())]).collect()
        };
        for case in 0..cases {
            let query = text(&mut rng);
            let items: Vec<String> = (0..4).map(|_| text(&mut rng)).collect();
            let items: Vec<&str> = items.iter().map(String::as_str).collect();
            let (a, b) =
                (cut.tokenize_call(&tok, None, &query, &items), whole.tokenize_call(&tok, None, &query, &items));
            assert_eq!(a.unwrap(), b.unwrap(), "case {case}: query {query:?}, items {items:?}");
        }
    }
}
