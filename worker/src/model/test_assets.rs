//! Test-only paths to fixtures (committed) and assets (fetched by `scripts/fetch-assets`).

use std::path::PathBuf;

/// A committed fixture under `worker/tests/fixtures/`, parsed as JSON.
pub(crate) fn fixture_json(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// An asset in the cache (`$SIEVE_CACHE`, default `<repo>/.cache`); panics with the fix when
/// it is missing, so a missing asset is a loud failure rather than a silently skipped test.
pub(crate) fn asset(rel: &str) -> PathBuf {
    let path = crate::assets::cache_dir().join(rel);
    assert!(path.is_file(), "asset {} is missing: run scripts/fetch-assets (scripts/test does)", path.display());
    path
}

pub(crate) use crate::assets::{DEFAULT_MODEL as SMOLLM2_GGUF, QWEN3_TOKENIZER};

/// Pieces of text whose joins tokenizers treat apart (newlines, spaces, tabs, apostrophes and
/// contractions, digits, punctuation, letters with and without combining marks that NFC
/// composes, wide spaces, CJK, emoji, special and added tokens' strings): random texts for the
/// tokenizer tests are strung from these.
pub(crate) const TEXT_PIECES: [&str; 33] = [
    "\n",
    "\r",
    "\r\n",
    " ",
    "  ",
    "   ",
    "\t",
    "'",
    "'s",
    "'LL",
    "0",
    "42",
    "2024",
    ":",
    "<",
    ">",
    "|",
    "?!",
    "...",
    "a",
    "Zz",
    "running",
    "é",
    "e\u{301}",
    "\u{301}",
    "\u{1100}\u{1161}",
    "\u{3000}",
    "\u{a0}",
    "漢字",
    "🙂",
    "<|im_end|>",
    "<think>",
    "<s>",
];

/// A fresh, empty temporary directory for one test (removed when dropped).
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sieve-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
