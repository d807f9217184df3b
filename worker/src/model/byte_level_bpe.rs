//! Text to token ids through a byte-level BPE tokenizer's own parts, without its offset
//! bookkeeping.
//!
//! `tokenizers::Tokenizer::encode_fast` carries every byte's alignment through the normalizer
//! and each pre-tokenizer (a `NormalizedString` per piece, a `String` per token); on ~100-token
//! items that bookkeeping, mostly allocation, was about two thirds of its time, and tokenizing
//! is most of a call's preparation. For the shape of Qwen2/3's tokenizer.json and every GGUF
//! rebuild (no normalizer or NFC; split regexes then `ByteLevel` without a prefix space; a BPE
//! model; no post-processor but `ByteLevel`; no truncation or padding), [`ByteLevelBpe`] cuts
//! the same pieces with the same compiled regexes and hands each to the same BPE model, so the
//! ids are the crate's. A text holding any added token's string (special or not) is left to the
//! crate whole, whose added-vocabulary pass handles them.

use std::borrow::Cow;

use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::tokenizer::pattern::Pattern;
use tokenizers::utils::SysRegex;
use tokenizers::{Model, ModelWrapper, NormalizedString, Normalizer, NormalizerWrapper, PostProcessorWrapper, Token};

use crate::error::{Result, WorkerError};

/// A byte-level BPE tokenizer's parts, for texts with no added token in them.
pub(crate) struct ByteLevelBpe {
    /// Whether the tokenizer normalizes to NFC (the identity on ASCII text).
    nfc: bool,
    /// Applied in turn, each as an isolating split of the previous one's pieces.
    splits: Vec<SysRegex>,
    bpe: BPE,
    /// GPT-2's byte → printable character map (`ByteLevel`'s alphabet).
    byte_chars: [char; 256],
    /// Every added token's string: a text holding one goes the crate's way.
    added: Vec<String>,
}

impl ByteLevelBpe {
    /// The parts of `tok`, or `None` if it is not of the shape above.
    pub(crate) fn of(tok: &tokenizers::Tokenizer) -> Option<Self> {
        let nfc = match tok.get_normalizer() {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return None,
        };
        if !matches!(tok.get_post_processor(), None | Some(PostProcessorWrapper::ByteLevel(_)))
            || tok.get_truncation().is_some()
            || tok.get_padding().is_some()
        {
            return None;
        }
        let ModelWrapper::BPE(bpe) = tok.get_model() else { return None };
        if bpe.dropout.is_some() {
            return None;
        }
        // The pre-tokenizer's serialized form names exactly what it does.
        let pre = serde_json::to_value(tok.get_pre_tokenizer()?).ok()?;
        let (byte_level, splits) = pre.get("pretokenizers")?.as_array()?.split_last()?;
        let byte_level_ok = byte_level.get("type")? == "ByteLevel"
            && byte_level.get("add_prefix_space")? == false
            && byte_level.get("use_regex")? == false;
        if pre.get("type")? != "Sequence" || !byte_level_ok || splits.is_empty() {
            return None;
        }
        let splits = splits
            .iter()
            .map(|s| {
                let isolated =
                    s.get("type")? == "Split" && s.get("behavior")? == "Isolated" && s.get("invert")? == false;
                if !isolated {
                    return None;
                }
                SysRegex::new(s.pointer("/pattern/Regex")?.as_str()?).ok()
            })
            .collect::<Option<Vec<_>>>()?;
        let added = tok.get_added_tokens_decoder().into_values().map(|t| t.content).collect();
        Some(Self { nfc, splits, bpe: bpe.clone(), byte_chars: byte_chars(), added })
    }

    /// The ids of `text`, or `None` if it holds an added token's string.
    pub(crate) fn encode(&self, text: &str) -> Option<Result<Vec<u32>>> {
        let text = match self.normalized(text)? {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        Some(self.each_piece(&text, &mut |_, _, tokens| ids.extend(tokens.iter().map(|t| t.id))).map(|()| ids))
    }

    /// Where each token of `text` begins, in bytes of `text` (the crate's `encode` offsets), or
    /// `None` if it holds an added token's string or normalizing changes it (offsets through a
    /// normalization are the crate's alignments).
    pub(crate) fn token_starts(&self, text: &str) -> Option<Result<Vec<usize>>> {
        match self.normalized(text)? {
            Ok(Cow::Borrowed(_)) => {}
            Ok(Cow::Owned(n)) if n == text => {}
            Ok(Cow::Owned(_)) => return None,
            Err(e) => return Some(Err(e)),
        }
        // A byte-level token may begin inside a character: its offset, as the crate aligns it,
        // is that character's first byte.
        let mut starts = Vec::with_capacity(text.len() / 3);
        let floor = |mut at: usize| {
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            at
        };
        let done = self.each_piece(text, &mut |at, mapped, tokens| {
            // A token's offsets are bytes of `mapped`, whose characters stand one for each byte
            // of the piece.
            let (mut byte, mut seen) = (at, 0);
            for t in tokens {
                byte += mapped[seen..t.offsets.0].chars().count();
                seen = t.offsets.0;
                starts.push(floor(byte));
            }
        });
        Some(done.map(|()| starts))
    }

    /// `text` as the model tokenizes it (its NFC form, where the tokenizer normalizes), or `None`
    /// if it or that form holds an added token's string.
    fn normalized<'a>(&self, text: &'a str) -> Option<Result<Cow<'a, str>>> {
        if self.holds_added_token(text) {
            return None;
        }
        if !self.nfc || text.is_ascii() {
            return Some(Ok(Cow::Borrowed(text)));
        }
        let mut n = NormalizedString::from(text);
        if let Err(e) = NFC.normalize(&mut n) {
            return Some(Err(WorkerError::Tokenizer(format!("normalizing failed: {e}"))));
        }
        let normalized = n.get().to_owned();
        (!self.holds_added_token(&normalized)).then_some(Ok(Cow::Owned(normalized)))
    }

    fn holds_added_token(&self, text: &str) -> bool {
        self.added.iter().any(|t| text.contains(t.as_str()))
    }

    /// Calls `f(start, mapped, tokens)` for each piece of `text` (already normalized): where it
    /// begins in `text`, its bytes as `ByteLevel` characters, and the BPE model's tokens of them.
    fn each_piece(&self, text: &str, f: &mut dyn FnMut(usize, &str, &[Token])) -> Result<()> {
        let mut mapped = String::new();
        self.pieces(0, text, 0, &mut |piece, at| {
            mapped.clear();
            mapped.extend(piece.bytes().map(|b| self.byte_chars[b as usize]));
            let tokens =
                self.bpe.tokenize(&mapped).map_err(|e| WorkerError::Tokenizer(format!("encoding failed: {e}")))?;
            f(at, &mapped, &tokens);
            Ok(())
        })
    }

    /// Calls `f(piece, start)` on each non-empty piece of `text` (which begins at byte `at` of
    /// the whole) cut by the splits from `level` on, in order.
    fn pieces(&self, level: usize, text: &str, at: usize, f: &mut dyn FnMut(&str, usize) -> Result<()>) -> Result<()> {
        let Some(regex) = self.splits.get(level) else { return f(text, at) };
        let cuts = regex.find_matches(text).map_err(|e| WorkerError::Tokenizer(format!("splitting failed: {e}")))?;
        for ((start, end), _) in cuts {
            if start < end {
                self.pieces(level + 1, &text[start..end], at + start, f)?;
            }
        }
        Ok(())
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others for the
/// characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    chars
}
