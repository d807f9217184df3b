//! HF config.json files read into a validated model config.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sieve_worker::fuzzing::hf_config(data);
});
