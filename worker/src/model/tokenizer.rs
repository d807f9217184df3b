//! Text ↔ token ids, from a tokenizer.json or rebuilt from a GGUF file's `tokenizer.ggml.*`.
//!
//! Special tokens written in the text (e.g. `<|im_start|>`) are recognised as special tokens, and
//! nothing is added around the text (no BOS/EOS): the prompt template says exactly what the model
//! sees.
//!
//! The GGUF rebuild follows llama.cpp (the runtime GGUF files are made for): byte-level BPE over
//! the file's tokens and merges, with the pre-tokenizer regexes llama.cpp's `llama-vocab.cpp`
//! uses for the file's `tokenizer.ggml.pre`, each applied in turn as an isolating split (that is
//! how llama.cpp's `unicode_regex_split` applies a list of regexes).

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::byte_level_bpe::ByteLevelBpe;
use super::gguf::GgufFile;
use crate::error::{Result, WorkerError};

/// llama.cpp token types (`llama_token_type`) as stored in `tokenizer.ggml.token_type`.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The GPT-2 split regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2 and the tail of several others).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's regex as llama.cpp adapted it (case-insensitive contractions spelled out).
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's regex as llama.cpp adapted it.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a GGUF's `tokenizer.ggml.pre` value splits text before BPE.
struct PreTokenizerSpec {
    regexes: Vec<&'static str>,
    /// A piece that is itself a vocabulary token is emitted whole (llama.cpp `ignore_merges`).
    ignore_merges: bool,
}

/// The llama.cpp pre-tokenizer for a `tokenizer.ggml.pre` value (see `llama-vocab.cpp`,
/// `llm_tokenizer_bpe`).
fn pre_tokenizer_spec(pre: &str) -> Option<PreTokenizerSpec> {
    let spec = |regexes: Vec<&'static str>, ignore_merges| PreTokenizerSpec { regexes, ignore_merges };
    Some(match pre {
        // llama.cpp's default: what it uses for a missing or "default" value.
        "" | "default" => spec(vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]"], false),
        "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe" => spec(vec![GPT2_REGEX], false),
        // Digits one by one, then GPT-2 (SmolLM/SmolLM2, StarCoder, ...).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            spec(vec![r"\p{N}", GPT2_REGEX], false)
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => spec(vec![QWEN2_REGEX], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => spec(vec![LLAMA3_REGEX], true),
        "dbrx" | "smaug-bpe" => spec(vec![LLAMA3_REGEX], false),
        _ => return None,
    })
}

/// A text tokenizer (byte-level BPE in practice) wrapping the `tokenizers` crate.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special-token matching off: for caller text, so that a string
    /// such as "<|im_start|>" inside a query or item stays plain text.
    plain: tokenizers::Tokenizer,
    /// Number of token ids: the largest id (base vocabulary or added token) plus one.
    vocab_size: usize,
    /// [`crate::prompt::TextEncoder::splits_after_newline`].
    splits_after_newline: bool,
    /// The same ids without the crate's offset bookkeeping, where the tokenizer's shape allows.
    fast: Option<ByteLevelBpe>,
}

/// The split patterns whose pieces never run from a newline into a following printable ASCII
/// character other than a space (Qwen2/3's, and Llama 3's with `\p{N}{1,3}`): no alternative
/// matches a newline followed by another character (`\s*[\r\n]+` ends at the newline, the rest
/// match no newline, or only trailing ones), and the only lookahead, `\s+(?!\S)`, comes after
/// `\s*[\r\n]+`, which takes any whitespace run ending in a newline first.
const NEWLINE_SAFE_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Whether `tok` is one whose pieces end after a newline that a printable ASCII character
/// other than a space follows (see [`crate::prompt::TextEncoder::splits_after_newline`]): a
/// normalizer that is none or NFC (it composes nothing across such a character), one split by a
/// [`NEWLINE_SAFE_PATTERNS`] pattern then byte-level BPE without a prefix space, and no added
/// token holding a newline (none can then span the cut). Anything else: false.
fn splits_after_newline(tok: &tokenizers::Tokenizer) -> bool {
    let normalizer = serde_json::to_value(tok.get_normalizer()).unwrap_or_default();
    let normalizer_ok = normalizer.is_null() || normalizer == serde_json::json!({"type": "NFC"});
    let mut pre = serde_json::to_value(tok.get_pre_tokenizer()).unwrap_or_default();
    // Trimming changes offsets, not ids (Llama 3's trims, Qwen's does not).
    if let Some(byte_level) = pre.pointer_mut("/pretokenizers/1").and_then(|v| v.as_object_mut()) {
        byte_level.remove("trim_offsets");
    }
    let pre_ok = NEWLINE_SAFE_PATTERNS.iter().any(|pattern| {
        pre == serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
        ]})
    });
    let added_ok = tok.get_added_tokens_decoder().values().all(|t| !t.content.contains('\n'));
    normalizer_ok && pre_ok && added_ok
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size).finish()
    }
}

impl Tokenizer {
    /// Loads a tokenizer.json.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| WorkerError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::wrap(inner))
    }

    /// Rebuilds the tokenizer stored in a GGUF file (`tokenizer.ggml.model` = "gpt2": byte-level
    /// BPE from `tokenizer.ggml.tokens` + `tokenizer.ggml.merges`, control and user-defined
    /// tokens as added tokens, pre-tokenizer from `tokenizer.ggml.pre`).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let err = |msg: String| WorkerError::Tokenizer(format!("{}: {msg}", gguf.path().display()));
        let model = gguf.get_str("tokenizer.ggml.model")?.ok_or_else(|| err("no tokenizer.ggml.model".into()))?;
        if model != "gpt2" {
            return Err(WorkerError::Unsupported(format!(
                "{}: tokenizer.ggml.model {model:?} (supported: \"gpt2\", byte-level BPE)",
                gguf.path().display()
            )));
        }
        let pre = gguf.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
        let spec = pre_tokenizer_spec(pre).ok_or_else(|| {
            WorkerError::Unsupported(format!("{}: tokenizer.ggml.pre {pre:?} is not supported", gguf.path().display()))
        })?;
        let tokens =
            gguf.get_str_array("tokenizer.ggml.tokens")?.ok_or_else(|| err("no tokenizer.ggml.tokens".into()))?;
        let merges =
            gguf.get_str_array("tokenizer.ggml.merges")?.ok_or_else(|| err("no tokenizer.ggml.merges".into()))?;
        let token_types = gguf.get_i32_array("tokenizer.ggml.token_type")?;
        if let Some(tt) = &token_types {
            if tt.len() != tokens.len() {
                return Err(err(format!("{} token types for {} tokens", tt.len(), tokens.len())));
            }
        }

        let mut vocab = tokenizers::models::bpe::Vocab::with_capacity(tokens.len());
        for (id, tok) in tokens.iter().enumerate() {
            // llama.cpp keeps the first id for a duplicated token text; so do we.
            vocab.entry(tok.to_string()).or_insert(id as u32);
        }
        let mut merge_pairs = Vec::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            // llama.cpp splits a merge at the first space after the first byte.
            let split = m.bytes().enumerate().skip(1).find(|&(_, b)| b == b' ').map(|(p, _)| p);
            let (a, b) = match split {
                Some(p) => (&m[..p], &m[p + 1..]),
                None => return Err(err(format!("merge {i} {m:?} has no space"))),
            };
            if !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&format!("{a}{b}")) {
                return Err(err(format!("merge {i} {m:?} uses a token not in the vocabulary")));
            }
            merge_pairs.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merge_pairs)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(|e| err(format!("building BPE: {e}")))?;

        let mut pre_tokenizers = Vec::with_capacity(spec.regexes.len() + 1);
        for re in &spec.regexes {
            let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| err(format!("pre-tokenizer regex {re:?}: {e}")))?;
            pre_tokenizers.push(PreTokenizerWrapper::Split(split));
        }
        pre_tokenizers.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(pre_tokenizers)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        // Control tokens are special tokens; user-defined ones are matched in text too
        // (llama.cpp's tokenizer_st_partition with parse_special). Both are already in the
        // vocabulary with their ids, so adding them assigns no new ids.
        if let Some(tt) = &token_types {
            let specials: Vec<AddedToken> = tokens
                .iter()
                .zip(tt)
                .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
                .map(|(tok, &t)| AddedToken::from(tok.to_string(), t == TOKEN_TYPE_CONTROL).normalized(false))
                .collect();
            inner.add_special_tokens(&specials);
        }
        Ok(Self::wrap(inner))
    }

    fn wrap(inner: tokenizers::Tokenizer) -> Self {
        let vocab_size = inner.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1);
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let splits_after_newline = splits_after_newline(&plain);
        let fast = ByteLevelBpe::of(&inner);
        Self { inner, plain, vocab_size, splits_after_newline, fast }
    }

    /// Token ids of `text`; special tokens written in it are recognised; no BOS/EOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(&self.inner, text)
    }

    /// Token ids of caller text: special-token strings in it are ordinary text.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(&self.plain, text)
    }

    /// The ids the `tokenizers` crate gives `text` on its own, without the fast path (`plain`:
    /// as [`Tokenizer::encode_plain`]): the oracle of the fast path's tests and fuzz target.
    #[cfg(any(test, feature = "test-support"))]
    pub fn encode_by_crate(&self, text: &str, plain: bool) -> Result<Vec<u32>> {
        encode_ids(if plain { &self.plain } else { &self.inner }, text)
    }

    /// `text` through the fast path, or through `tok` where it holds an added token's string
    /// (only there do `inner` and `plain` differ) or the tokenizer has another shape.
    fn encode_with(&self, tok: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
        match self.fast.as_ref().and_then(|fast| fast.encode(text)) {
            Some(ids) => ids,
            None => encode_ids(tok, text),
        }
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(WorkerError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary ({} ids)",
                self.vocab_size
            )));
        }
        self.inner.decode(ids, false).map_err(|e| WorkerError::Tokenizer(format!("decoding failed: {e}")))
    }

    /// The id of a token given by its vocabulary text (e.g. "yes", "<|im_end|>", "Ġyes").
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of token ids (largest id + 1, added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

impl crate::prompt::TextEncoder for Tokenizer {
    fn encode_special(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text)
    }
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        Tokenizer::encode_plain(self, text)
    }
    fn token_starts(&self, text: &str) -> Result<Vec<usize>> {
        match self.fast.as_ref().and_then(|fast| fast.token_starts(text)) {
            Some(starts) => starts,
            None => token_starts_by(&self.plain, text),
        }
    }
    fn splits_after_newline(&self) -> bool {
        self.splits_after_newline
    }
}

/// Where each token of `text` through `tok` begins, in bytes of `text`: `encode` (not
/// `encode_fast`) computes the offsets.
fn token_starts_by(tok: &tokenizers::Tokenizer, text: &str) -> Result<Vec<usize>> {
    let enc = tok.encode(text, false).map_err(|e| WorkerError::Tokenizer(format!("encoding failed: {e}")))?;
    Ok(enc.get_offsets().iter().map(|o| o.0).collect())
}

/// Token ids of `text` through `tok`, no BOS/EOS added.
fn encode_ids(tok: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
    let enc = tok.encode_fast(text, false).map_err(|e| WorkerError::Tokenizer(format!("encoding failed: {e}")))?;
    Ok(enc.get_ids().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::test_writer::gguf_bytes;
    use crate::model::gguf::GgufValue;
    use crate::model::test_assets::{asset, fixture_json, TempDir, QWEN3_TOKENIZER, SMOLLM2_GGUF};

    fn cases(fixture: &str) -> Vec<(String, Vec<u32>)> {
        fixture_json(fixture)["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let ids = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
                (c["text"].as_str().unwrap().to_string(), ids)
            })
            .collect()
    }

    fn check_against(tok: &Tokenizer, fixture: &str, lossless: bool) {
        let cases = cases(fixture);
        assert!(cases.len() >= 30, "{fixture}: {} cases", cases.len());
        let mut failures = Vec::new();
        for (text, want) in &cases {
            let got = tok.encode(text).unwrap();
            if &got != want {
                failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            }
            // Decoding gives the (normalized) text back, special tokens included: encoding it
            // again gives the same ids. (Qwen3 normalizes to NFC, so the text itself can differ.)
            let decoded = tok.decode(&got).unwrap();
            assert_eq!(tok.encode(&decoded).unwrap(), got, "{text:?} re-encoded");
            if lossless {
                assert_eq!(&decoded, text);
            }
        }
        assert!(failures.is_empty(), "{fixture}: {} mismatches:\n{}", failures.len(), failures.join("\n"));
    }

    fn qwen3() -> Tokenizer {
        Tokenizer::from_file(&asset(QWEN3_TOKENIZER)).unwrap()
    }

    fn smollm2() -> Tokenizer {
        Tokenizer::from_gguf(&GgufFile::open(asset(SMOLLM2_GGUF)).unwrap()).unwrap()
    }

    #[test]
    fn qwen3_matches_python_tokenizers() {
        check_against(&qwen3(), "tokenizer_qwen3.json", false);
    }

    #[test]
    fn qwen3_special_and_answer_tokens() {
        let tok = qwen3();
        assert_eq!(tok.token_id("yes"), Some(9693));
        assert_eq!(tok.token_id("no"), Some(2152));
        assert_eq!(tok.token_id("<|im_start|>"), Some(151644));
        assert_eq!(tok.token_id("<|im_end|>"), Some(151645));
        assert_eq!(tok.encode("<|im_start|>").unwrap(), vec![151644]);
        // Caller text cannot produce control tokens.
        let plain = tok.encode_plain("a<|im_start|>b").unwrap();
        assert!(plain.len() > 3 && !plain.contains(&151644), "{plain:?}");
        assert_eq!(tok.encode_plain("plain words").unwrap(), tok.encode("plain words").unwrap());
        assert_eq!(tok.vocab_size(), 151669);
        assert!(tok.decode(&[151669]).is_err());
    }

    #[test]
    fn smollm2_gguf_matches_llama_cpp() {
        check_against(&smollm2(), "tokenizer_smollm2.json", true);
    }

    #[test]
    fn smollm2_special_and_answer_tokens() {
        let tok = smollm2();
        assert_eq!(tok.vocab_size(), 49152);
        assert_eq!(tok.token_id("<|im_start|>"), Some(1));
        assert_eq!(tok.token_id("<|im_end|>"), Some(2));
        assert_eq!(tok.token_id("yes"), Some(10407));
        assert_eq!(tok.token_id("no"), Some(4607));
        // Digits are split one by one (llama.cpp's "smollm" pre-tokenizer).
        assert_eq!(tok.encode("2024").unwrap().len(), 4);
    }

    fn ids_of(v: &serde_json::Value) -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    }

    #[test]
    fn logits_fixture_prompt_ids_are_our_tokenizations() {
        // The model fixtures fix their input ids; our tokenizers must produce the same ones.
        let smol = smollm2();
        let fx = fixture_json("smollm2_logits.json");
        for p in fx["prompts"].as_array().unwrap() {
            assert_eq!(smol.encode(p["text"].as_str().unwrap()).unwrap(), ids_of(&p["ids"]), "{}", p["name"]);
        }
        let greedy = &fx["greedy"];
        assert_eq!(smol.decode(&ids_of(&greedy["ids"])).unwrap(), greedy["text"].as_str().unwrap());
        for (tok, id) in fx["token_ids"].as_object().unwrap() {
            assert_eq!(smol.token_id(tok), Some(id.as_u64().unwrap() as u32), "{tok}");
        }

        let qwen = qwen3();
        let fx = fixture_json("testmodel_logits.json");
        let texts = fx["prompt_texts"].as_object().unwrap();
        for model in fx["models"].as_array().unwrap() {
            for p in model["prompts"].as_array().unwrap() {
                let text = texts[p["name"].as_str().unwrap()].as_str().unwrap();
                assert_eq!(qwen.encode(text).unwrap(), ids_of(&p["ids"]), "{} {}", model["arch"], p["name"]);
            }
        }
    }

    /// The fast path against the crate's own `encode_fast`, both ways (special tokens matched and
    /// plain), on random text: runs of what the split regexes treat apart (newlines, spaces,
    /// apostrophes, digits, punctuation), letters with combining marks that NFC composes, and
    /// characters of every UTF-8 length (so every byte value of the byte-level map), with and
    /// without added tokens' strings. `SIEVE_TOKENIZER_CASES` sets the number of texts.
    #[test]
    fn the_fast_path_gives_the_crate_ids_on_random_text() {
        use crate::model::test_assets::TEXT_PIECES;
        use rand::{Rng, SeedableRng};
        let cases = std::env::var("SIEVE_TOKENIZER_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for tok in [qwen3(), smollm2()] {
            assert!(tok.fast.is_some(), "the fast path must apply to this tokenizer");
            let mut fast_taken = 0;
            for case in 0..cases {
                let text: String = (0..rng.random_range(0..24))
                    .map(|_| match rng.random_range(0..4) {
                        0 => char::from_u32(rng.random_range(0x80..0x800)).unwrap_or('x').to_string(),
                        1 => char::from_u32(rng.random_range(0x800..0x10000)).unwrap_or('x').to_string(),
                        2 => char::from_u32(rng.random_range(0x10000..0x20000)).unwrap_or('x').to_string(),
                        _ => TEXT_PIECES[rng.random_range(0..TEXT_PIECES.len())].to_string(),
                    })
                    .collect();
                fast_taken += tok.fast.as_ref().unwrap().encode(&text).is_some() as usize;
                assert_eq!(
                    tok.encode(&text).unwrap(),
                    tok.encode_by_crate(&text, false).unwrap(),
                    "case {case}: {text:?}"
                );
                assert_eq!(
                    tok.encode_plain(&text).unwrap(),
                    tok.encode_by_crate(&text, true).unwrap(),
                    "case {case}: {text:?} (plain)"
                );
                assert_eq!(
                    crate::prompt::TextEncoder::token_starts(&tok, &text).unwrap(),
                    token_starts_by(&tok.plain, &text).unwrap(),
                    "case {case}: {text:?} (token starts)"
                );
            }
            assert!(fast_taken > cases / 2, "only {fast_taken} of {cases} texts took the fast path");
        }
    }

    #[test]
    fn the_fast_path_leaves_other_shapes_to_the_crate() {
        let mut tok = qwen3().inner;
        tok.with_normalizer(Some(tokenizers::normalizers::Lowercase));
        assert!(ByteLevelBpe::of(&tok).is_none(), "a lowercasing normalizer");
        let mut tok = qwen3().inner;
        tok.with_pre_tokenizer(Some(ByteLevel::default()));
        assert!(ByteLevelBpe::of(&tok).is_none(), "ByteLevel with its own regex and a prefix space");
        let mut tok = qwen3().inner;
        tok.with_truncation(Some(tokenizers::TruncationParams::default())).unwrap();
        assert!(ByteLevelBpe::of(&tok).is_none(), "truncation");
    }

    #[test]
    fn bpe_merges_across_a_query_item_boundary() {
        // Why the shared prefix is found on token ids: "run" + "ning" != tokens("running").
        for tok in [qwen3(), smollm2()] {
            let mut joined = tok.encode("run").unwrap();
            joined.extend(tok.encode("ning shoes").unwrap());
            assert_ne!(joined, tok.encode("running shoes").unwrap());
        }
    }

    fn tiny_gguf(pre: &str, model: &str) -> Vec<u8> {
        // Byte-level symbols: "Ġ" is the space byte; "a", "b", "1", "2" are themselves.
        let tokens = ["<s>", "a", "b", "Ġ", "1", "2", "ab", "Ġab", "12"];
        let types = [3, 1, 1, 1, 1, 1, 1, 1, 1];
        let merges = ["a b", "Ġ ab", "1 2"];
        gguf_bytes(
            &[
                ("tokenizer.ggml.model", GgufValue::Str(model.into())),
                ("tokenizer.ggml.pre", GgufValue::Str(pre.into())),
                (
                    "tokenizer.ggml.tokens",
                    GgufValue::Array(tokens.iter().map(|t| GgufValue::Str(t.to_string())).collect()),
                ),
                ("tokenizer.ggml.token_type", GgufValue::Array(types.iter().map(|&t| GgufValue::I32(t)).collect())),
                (
                    "tokenizer.ggml.merges",
                    GgufValue::Array(merges.iter().map(|t| GgufValue::Str(t.to_string())).collect()),
                ),
            ],
            &[],
        )
    }

    fn open_tiny(dir: &TempDir, pre: &str, model: &str) -> Result<Tokenizer> {
        let path = dir.path().join(format!("{pre}-{model}.gguf"));
        std::fs::write(&path, tiny_gguf(pre, model)).unwrap();
        Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
    }

    #[test]
    fn gguf_pre_tokenizer_follows_the_pre_value() {
        let dir = TempDir::new("tok");
        // "smollm" isolates each digit; "gpt2" keeps digit runs together, so "12" merges.
        let smollm = open_tiny(&dir, "smollm", "gpt2").unwrap();
        assert_eq!(smollm.encode("ab ab12<s>").unwrap(), vec![6, 7, 4, 5, 0]);
        let gpt2 = open_tiny(&dir, "gpt-2", "gpt2").unwrap();
        assert_eq!(gpt2.encode("ab ab12<s>").unwrap(), vec![6, 7, 8, 0]);
        let qwen2 = open_tiny(&dir, "qwen2", "gpt2").unwrap();
        assert_eq!(qwen2.encode("ab ab12").unwrap(), vec![6, 7, 4, 5]);
        assert_eq!(gpt2.decode(&[6, 7, 8, 0]).unwrap(), "ab ab12<s>");
    }

    #[test]
    fn unsupported_gguf_tokenizers_are_errors() {
        let dir = TempDir::new("tok");
        let err = open_tiny(&dir, "no-such-pre", "gpt2").unwrap_err();
        assert!(matches!(err, WorkerError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("no-such-pre"), "{err}");
        let err = open_tiny(&dir, "smollm", "llama").unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.model"), "{err}");
    }

    #[test]
    fn missing_tokenizer_file_is_an_error() {
        let err = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/tokenizer.json"), "{err}");
    }

    /// The cut after a newline is claimed for Qwen3's tokenizer (and with Llama 3's trimming
    /// offsets) and for nothing that could merge across it: another normalizer, a prefix space,
    /// another split pattern, an added token holding a newline.
    #[test]
    fn only_known_tokenizers_claim_the_newline_cut() {
        use crate::prompt::TextEncoder;
        let base: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(asset(QWEN3_TOKENIZER)).unwrap()).unwrap();
        let dir = TempDir::new("newline-cut");
        let claims = |edit: &dyn Fn(&mut serde_json::Value)| -> bool {
            let mut t = base.clone();
            edit(&mut t);
            let path = dir.path().join("tokenizer.json");
            std::fs::write(&path, t.to_string()).unwrap();
            Tokenizer::from_file(&path).unwrap().splits_after_newline()
        };
        assert!(claims(&|_| {}));
        assert!(claims(&|t| t["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = true.into()));
        assert!(claims(&|t| t["normalizer"] = serde_json::Value::Null));
        assert!(!claims(&|t| t["normalizer"] = serde_json::json!({"type": "NFKC"})));
        assert!(!claims(&|t| t["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true.into()));
        assert!(!claims(&|t| t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\S+".into()));
        assert!(!claims(&|t| {
            let added = t["added_tokens"].as_array_mut().unwrap();
            let mut nl = added[0].clone();
            nl["id"] = 151_700.into();
            nl["content"] = "\n<Doc".into();
            added.push(nl);
        }));
    }
}
