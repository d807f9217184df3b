//! Score / rerank request bodies: parsed as the API parses them and checked against the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sieve_worker::fuzzing::request_json(data);
});
