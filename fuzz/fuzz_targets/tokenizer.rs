//! Caller text through the worker's tokenizer wrapper (the Qwen3 tokenizer from the asset
//! cache, else SmolLM2's rebuilt from its GGUF: `SIEVE_CACHE`, filled by scripts/fetch-assets).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sieve_worker::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| sieve_worker::fuzzing::fuzz_tokenizer().expect("tokenizer asset"))
}

fuzz_target!(|text: &str| {
    sieve_worker::fuzzing::tokenizer(tokenizer(), text);
});
