//! safetensors files: the header (length prefix + JSON) checked against the file, every tensor
//! converted to f32.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sieve_worker::fuzzing::safetensors_header(data);
});
