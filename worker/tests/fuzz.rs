//! The fuzz target bodies (`sieve_worker::fuzzing`, also run by cargo-fuzz from `fuzz/`) driven
//! over a bounded set of generated inputs on stable Rust: random bytes, `arbitrary`-structured
//! inputs and mutations of valid seeds. Every call must return (no panic) and allocate at most
//! a bounded multiple of its input's size, counted by this binary's allocator. A few thousand
//! inputs per target, seconds in all. Regression inputs found by fuzzing are at the end.
//!
//! `SIEVE_FUZZ_SEEDS_DIR=<dir>` also writes the seeds as files (`<dir>/<target>/seed-N`), the
//! starting corpus for `cargo fuzz run` (fuzz/README.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use arbitrary::Unstructured;
use sieve_worker::fuzzing::{self, seeds, Mutator};

/// Counts the bytes live on the current thread while a measurement is on, and their peak.
struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // try_with: the thread may be tearing down its locals.
    let _ = ON.try_with(|on| {
        if on.get() {
            let live = LIVE.get() + delta;
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
        }
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new as isize - l.size() as isize);
        unsafe { System.realloc(p, l, new) }
    }
}

thread_local! {
    /// The largest peak of any call on this thread (printed per target).
    static MAX_SEEN: Cell<usize> = const { Cell::new(0) };
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak bytes `f` had live at once on this thread, beyond what was live when it started.
fn peak_bytes(f: impl FnOnce()) -> usize {
    LIVE.set(0);
    PEAK.set(0);
    ON.set(true);
    f();
    ON.set(false);
    PEAK.get().max(0) as usize
}

/// Most bytes a call may allocate for an input of `len` bytes: a constant (a tokenizer, a
/// parser's tables) plus a multiple of the input (a GGUF u8 array is 32 bytes an element as
/// values; a Q4 tensor dequantizes to about 7× its bytes).
fn budget(len: usize, per_byte: usize, fixed: usize) -> usize {
    fixed + per_byte * len
}

/// Runs `target` on `input`: it must not panic, and it must stay within its allocation budget.
/// Returns whether the target accepted the input.
fn check<T, E>(
    what: &str,
    input: &[u8],
    per_byte: usize,
    fixed: usize,
    target: impl FnOnce(&[u8]) -> Result<T, E>,
) -> bool {
    let mut ok = false;
    let peak = peak_bytes(|| {
        let r = catch_unwind(AssertUnwindSafe(|| target(input)));
        match r {
            Ok(r) => ok = r.is_ok(),
            Err(_) => panic!("{what}: panicked on {} bytes: {:02x?}", input.len(), &input[..input.len().min(256)]),
        }
    });
    let limit = budget(input.len(), per_byte, fixed);
    MAX_SEEN.with(|m| m.set(m.get().max(peak)));
    assert!(
        peak <= limit,
        "{what}: {peak} bytes allocated for a {}-byte input (budget {limit}): {:02x?}",
        input.len(),
        &input[..input.len().min(256)]
    );
    ok
}

/// Every kind of generated input for one byte-oriented target; returns how many were accepted.
fn drive<T, E>(
    what: &str,
    seeds: &[Vec<u8>],
    n: usize,
    per_byte: usize,
    fixed: usize,
    mut structured: impl FnMut(&mut Unstructured<'_>) -> Option<Vec<u8>>,
    target: impl Fn(&[u8]) -> Result<T, E>,
) -> usize {
    let mut accepted = 0;
    // Once outside the count: one-time set-up (the shared CPU backend, lazy statics).
    let _ = target(&seeds[0]);
    for s in seeds {
        assert!(check(what, s, per_byte, fixed, &target), "{what}: a seed is rejected");
    }
    let mut m = Mutator::new(fnv(what));
    for i in 0..n {
        let input = match i % 4 {
            // Random bytes, sometimes behind the seed's first bytes (its magic and header).
            0 => {
                let len = m.below(512);
                let mut d = m.bytes(len);
                if m.below(2) == 0 {
                    let seed = &seeds[m.below(seeds.len())];
                    let keep = m.below(seed.len().min(32) + 1);
                    d.splice(0..0, seed[..keep].iter().copied());
                }
                d
            }
            1 => {
                let len = m.below(4096);
                let raw = m.bytes(len);
                match structured(&mut Unstructured::new(&raw)) {
                    Some(d) => d,
                    None => continue,
                }
            }
            _ => {
                let seed = &seeds[m.below(seeds.len())];
                m.mutate(seed)
            }
        };
        accepted += usize::from(check(what, &input, per_byte, fixed, &target));
    }
    println!("{what}: {accepted} of {n} generated inputs accepted; largest peak {} bytes", MAX_SEEN.get());
    accepted
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn write_seeds(target: &str, seeds: &[Vec<u8>]) {
    if let Some(dir) = std::env::var_os("SIEVE_FUZZ_SEEDS_DIR") {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
}

#[test]
fn gguf_reader_survives_generated_files() {
    let seeds = vec![seeds::gguf()];
    write_seeds("gguf", &seeds);
    let accepted = drive("gguf", &seeds, 2000, 64, 4 << 20, |u| fuzzing::arbitrary_gguf(u).ok(), fuzzing::gguf);
    // Mutations that keep the file valid (a changed weight, say) reach the load.
    assert!(accepted > 20, "only {accepted} of the generated GGUF files were accepted");
}

#[test]
fn safetensors_reader_survives_generated_files() {
    let seeds = vec![seeds::safetensors()];
    write_seeds("safetensors_header", &seeds);
    let accepted = drive(
        "safetensors",
        &seeds,
        2000,
        64,
        1 << 20,
        |u| {
            // A header of arbitrary JSON-ish text with a correct length prefix.
            let text: String = u.arbitrary().ok()?;
            let mut d = (text.len() as u64).to_le_bytes().to_vec();
            d.extend(text.as_bytes());
            Some(d)
        },
        fuzzing::safetensors_header,
    );
    assert!(accepted > 20, "only {accepted} of the generated safetensors files were accepted");
}

#[test]
fn hf_config_reader_survives_generated_configs() {
    let seeds = seeds::hf_configs();
    // Structured: a seed with one key set to an arbitrary value (zero, negative, huge, NaN-free
    // float, wrong type, null), so the inputs reach the validation rather than the JSON parser.
    let values: Vec<serde_json::Value> = seeds.iter().map(|s| serde_json::from_slice(s).unwrap()).collect();
    let structured = |u: &mut Unstructured<'_>| -> Option<Vec<u8>> {
        let mut v = u.choose(&values).ok()?.clone();
        let obj = v.as_object_mut()?;
        let keys: Vec<String> = obj.keys().cloned().collect();
        for _ in 0..u.int_in_range(1..=3).ok()? {
            let key = u.choose(&keys).ok()?.clone();
            let value = match u.int_in_range(0..=6).ok()? {
                0 => serde_json::json!(u.int_in_range(0..=8u64).ok()?),
                1 => serde_json::json!(u.arbitrary::<u64>().ok()?),
                2 => serde_json::json!(u.arbitrary::<i64>().ok()?),
                3 => serde_json::json!(u.arbitrary::<f32>().ok().filter(|f| f.is_finite())?),
                4 => serde_json::json!(u.arbitrary::<String>().ok()?),
                5 => serde_json::Value::Null,
                _ => serde_json::json!([u.arbitrary::<u8>().ok()?]),
            };
            obj.insert(key, value);
        }
        Some(serde_json::to_vec(&v).unwrap())
    };
    let accepted = drive("hf_config", &seeds, 1500, 64, 1 << 20, structured, fuzzing::hf_config);
    assert!(accepted > 20, "only {accepted} of the generated configs were accepted");
}

#[test]
fn request_json_survives_generated_bodies() {
    let seeds = seeds::request_json();
    write_seeds("request_json", &seeds);
    let accepted = drive(
        "request_json",
        &seeds,
        3000,
        64,
        1 << 20,
        |u| {
            let query: String = u.arbitrary().ok()?;
            let items: Vec<String> = u.arbitrary().ok()?;
            let deadline: Option<u64> = u.arbitrary().ok()?;
            let body = serde_json::json!({"query": query, "items": items, "deadline_ms": deadline});
            Some(body.to_string().into_bytes())
        },
        fuzzing::request_json,
    );
    assert!(accepted > 50, "only {accepted} of the generated bodies were accepted");
}

#[test]
fn tokenizer_survives_generated_text() {
    let tok = fuzzing::fuzz_tokenizer().expect("a tokenizer in the asset cache (scripts/fetch-assets)");
    let texts = seeds::texts();
    let as_bytes: Vec<Vec<u8>> = texts.iter().map(|t| t.as_bytes().to_vec()).collect();
    write_seeds("tokenizer", &as_bytes);
    // Text: the seeds, random and mutated strings (invalid UTF-8 replaced: the target takes
    // &str), arbitrary strings. The tokenizer's own caches are the fixed part of the budget.
    let mut m = Mutator::new(7);
    let run = |text: &str| -> Result<(), ()> {
        fuzzing::tokenizer(&tok, text);
        Ok(())
    };
    let _ = run(&texts[1]);
    for t in &texts {
        check("tokenizer", t.as_bytes(), 256, 8 << 20, |b| run(std::str::from_utf8(b).unwrap()));
    }
    for i in 0..1500 {
        let text = match i % 3 {
            0 => {
                let len = m.below(256);
                String::from_utf8_lossy(&m.bytes(len)).into_owned()
            }
            1 => {
                let len = m.below(1024);
                let raw = m.bytes(len);
                match Unstructured::new(&raw).arbitrary::<String>() {
                    Ok(s) => s,
                    Err(_) => continue,
                }
            }
            _ => {
                let seed = &as_bytes[m.below(as_bytes.len())];
                String::from_utf8_lossy(&m.mutate(seed)).into_owned()
            }
        };
        check("tokenizer", text.as_bytes(), 256, 8 << 20, |b| run(std::str::from_utf8(b).unwrap()));
    }
}

/// The bad model files of issue 13, through the fuzz target under the allocation budget: each
/// is an error, not a loop over 2^40 names, a 16 GB reservation, or a model that serves NaN.
#[test]
fn issue_13_bad_model_files_are_bounded_errors() {
    use sieve_worker::model::gguf::test_writer::{gguf_bytes, TestTensor};
    use sieve_worker::model::gguf::GgufValue;

    let header = |n_tensors: u64, n_kv: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.resize(128, 0);
        b
    };
    let experts = gguf_bytes(
        &[],
        &[TestTensor { name: "blk.0.ffn_up_exps.weight".into(), dims: vec![0, 1, 1 << 40], type_id: 0, data: vec![] }],
    );
    assert!(experts.len() <= 128);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("dims [0, 1, 2^40]", experts, "a dimension is 0"),
        ("2^28 metadata entries", header(0, 1 << 28), "more than the 104 bytes left"),
        ("2^28 tensors", header(1 << 28, 0), "more than the 104 bytes left"),
    ];
    for (what, bytes, want) in cases {
        let mut msg = String::new();
        check(what, &bytes, 64, 1 << 20, |b| fuzzing::gguf(b).map_err(|e| msg = e.to_string()));
        assert!(msg.contains(want), "{what}: {msg}");
    }
    // The valid seed with one config value broken: refused at load, naming the key.
    for (key, value, want) in [
        (
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(f32::NAN),
            "llama.attention.layer_norm_rms_epsilon = NaN",
        ),
        ("llama.rope.freq_base", GgufValue::F32(-1.0), "llama.rope.freq_base = -1"),
        ("llama.context_length", GgufValue::U32(0), "llama.context_length = 0"),
        ("llama.rope.dimension_count", GgufValue::U32(0), "llama.rope.dimension_count = 0"),
    ] {
        let bytes = seeds::gguf_with(&[(key, value)]);
        let mut msg = String::new();
        check(key, &bytes, 64, 4 << 20, |b| fuzzing::gguf(b).map_err(|e| msg = e.to_string()));
        assert!(msg.contains(want), "{key}: {msg}");
    }
}

/// Inputs the cargo-fuzz targets crashed on (fuzz/README.md), replayed.
#[test]
fn fuzz_crash_inputs_replay() {
    // gguf_structured: a `general.alignment` of 2^64 - 1 overflowed the GGUF writer's padding.
    let crash: &[u8] = &[
        0xf7, 0xff, 0xff, 0x67, 0x65, 0x6e, 0x65, 0x72, 0x61, 0x6c, 0x2e, 0x61, 0x6c, 0x69, 0x67, 0x6e, 0x6d, 0x65,
        0x6e, 0x74, 0xff, 0xff, 0x97, 0x97, 0x97, 0x97, 0x97, 0x97, 0x97, 0x97, 0x87, 0x97, 0x97, 0x97, 0xff, 0x2b,
        0x29, 0x25, 0x4d, 0x25, 0x65,
    ];
    let mut file = Vec::new();
    check("gguf_structured crash", crash, 4096, 4 << 20, |b| {
        fuzzing::arbitrary_gguf(&mut Unstructured::new(b)).map(|f| file = f)
    });
    assert!(!file.is_empty(), "the crash input builds a file");
    check("gguf_structured crash file", &file, 64, 4 << 20, fuzzing::gguf);
}
