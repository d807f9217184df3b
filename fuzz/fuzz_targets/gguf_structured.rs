//! GGUF files built from `arbitrary` input: a well-formed header with varied values, so the
//! fuzzer spends its time in the config, tensor and tokenizer code.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = sieve_worker::fuzzing::arbitrary_gguf(&mut Unstructured::new(data)) {
        let _ = sieve_worker::fuzzing::gguf(&file);
    }
});
