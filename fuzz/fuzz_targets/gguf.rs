//! GGUF files as raw bytes: header, metadata, tensor infos, config, tensors, tokenizer, load.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sieve_worker::fuzzing::gguf(data);
});
