//! Tokenizing one call's items on several threads.
//!
//! The scheduler prepares calls on one thread, and each item's prompt body repeats the
//! instruction and the query, so tokenization is most of a call's preparation, and on a GPU
//! it takes longer than the forward pass it feeds. The items of a call are independent, so
//! [`PooledEncoder`] encodes them on a thread pool of its own (sized by `[engine]
//! tokenize_threads`), in input order, with exactly the ids one thread would give.

use std::sync::Arc;

use rayon::prelude::*;

use crate::prompt::TextEncoder;
use crate::{Result, WorkerError};

/// An encoder whose [`TextEncoder::encode_plain_many`] runs on its own thread pool.
pub struct PooledEncoder {
    inner: Arc<dyn TextEncoder>,
    pool: rayon::ThreadPool,
}

impl PooledEncoder {
    /// `inner` on a pool of `threads` threads (named `sieve-tokenize-N`); `threads` ≥ 2.
    pub fn new(inner: Arc<dyn TextEncoder>, threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sieve-tokenize-{i}"))
            .build()
            .map_err(|e| WorkerError::Config(format!("cannot start {threads} tokenizer threads: {e}")))?;
        Ok(PooledEncoder { inner, pool })
    }

    /// `inner` as is with `threads` ≤ 1 (0 means all cores), else on a pool of that many threads.
    pub fn wrap(inner: Arc<dyn TextEncoder>, threads: usize) -> Result<Arc<dyn TextEncoder>> {
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        if threads <= 1 {
            return Ok(inner);
        }
        Ok(Arc::new(Self::new(inner, threads)?))
    }
}

impl TextEncoder for PooledEncoder {
    fn encode_special(&self, text: &str) -> Result<Vec<u32>> {
        self.inner.encode_special(text)
    }
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.inner.encode_plain(text)
    }
    fn token_starts(&self, text: &str) -> Result<Vec<usize>> {
        self.inner.token_starts(text)
    }
    fn splits_after_newline(&self) -> bool {
        self.inner.splits_after_newline()
    }
    fn encode_plain_many(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        // A single text gains nothing from a hop to the pool.
        if texts.len() < 2 {
            return self.inner.encode_plain_many(texts);
        }
        let inner = self.inner.as_ref();
        self.pool.install(|| texts.par_iter().map(|t| inner.encode_plain(t)).collect())
    }
    fn token_starts_many(&self, texts: &[&str]) -> Result<Vec<Vec<usize>>> {
        if texts.len() < 2 {
            return self.inner.token_starts_many(texts);
        }
        let inner = self.inner.as_ref();
        self.pool.install(|| texts.par_iter().map(|t| inner.token_starts(t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_assets::{asset, QWEN3_TOKENIZER};
    use crate::prompt::{PromptBuilder, PromptTemplate};
    use crate::Tokenizer;

    /// Texts with multi-byte characters, digits, special-token strings and long runs, so that
    /// the BPE cache and the regex paths are both exercised from several threads.
    fn texts() -> Vec<String> {
        (0..300)
            .map(|i| match i % 5 {
                0 => format!("Trail running shoes {i}, waterproof — size {}", i * 7),
                1 => format!("<|im_start|>user\n{i} not a control token"),
                2 => "naïve café crème brûlée ".repeat(1 + i % 7),
                3 => format!("{:x}", u128::from(i as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                _ => "   spaces\tand\nnewlines   ".repeat(i % 4),
            })
            .collect()
    }

    #[test]
    fn pooled_ids_equal_one_thread_ids_in_order() {
        let tok: Arc<dyn TextEncoder> = Arc::new(Tokenizer::from_file(&asset(QWEN3_TOKENIZER)).unwrap());
        let pooled = PooledEncoder::new(tok.clone(), 4).unwrap();
        assert!(pooled.splits_after_newline() && tok.splits_after_newline());
        let texts = texts();
        let serial: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode_plain(t).unwrap()).collect();
        assert_eq!(pooled.encode_plain_many(&texts).unwrap(), serial);
        // And a whole call through the prompt builder: the same prompts and shared prefix.
        let builder = PromptBuilder::new(PromptTemplate::default(), tok.as_ref()).unwrap();
        let items: Vec<&str> = texts.iter().map(String::as_str).collect();
        let one = builder.tokenize_call(tok.as_ref(), None, "red shoes", &items).unwrap();
        let many = builder.tokenize_call(&pooled, None, "red shoes", &items).unwrap();
        assert_eq!(one, many);
        assert!(one.prefix_len > 0 && one.prompts.iter().all(|p| p.len() > one.prefix_len));
    }

    #[test]
    fn one_thread_is_the_encoder_itself_and_an_error_is_kept() {
        struct Fails;
        impl TextEncoder for Fails {
            fn encode_special(&self, _: &str) -> Result<Vec<u32>> {
                Ok(vec![])
            }
            fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
                if text == "bad" {
                    Err(WorkerError::Tokenizer("bad text".into()))
                } else {
                    Ok(vec![text.len() as u32])
                }
            }
            fn token_starts(&self, _: &str) -> Result<Vec<usize>> {
                Ok(vec![0])
            }
        }
        let inner: Arc<dyn TextEncoder> = Arc::new(Fails);
        assert!(Arc::ptr_eq(&PooledEncoder::wrap(inner.clone(), 1).unwrap(), &inner));
        let pooled = PooledEncoder::wrap(inner, 3).unwrap();
        let ok: Vec<String> = ["a", "bb", "ccc"].iter().map(|s| s.to_string()).collect();
        assert_eq!(pooled.encode_plain_many(&ok).unwrap(), vec![vec![1], vec![2], vec![3]]);
        let bad: Vec<String> = ["a", "bad", "ccc"].iter().map(|s| s.to_string()).collect();
        let err = pooled.encode_plain_many(&bad).unwrap_err();
        assert!(err.to_string().contains("bad text"), "{err}");
    }
}
