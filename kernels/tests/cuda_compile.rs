//! Every CUDA kernel compiles with NVRTC — no GPU needed. NVRTC and the CUDA headers come from
//! NVIDIA's Python wheels, fetched into the asset cache by `scripts/fetch-assets nvrtc`.
//!
//! - PTX for compute_80 and compute_90 (the portable images), each defining its entry points.
//! - cubins for sm_80 and sm_90: this also runs ptxas, which checks the inline PTX (mma.sync,
//!   cp.async, cvt) and the register and shared-memory budgets that PTX generation alone does not.
//! - the Hopper-only sources (`sources::HOPPER`: wgmma) to PTX for compute_90a and a cubin for
//!   sm_90a, the only target they are built for.
//!
//! A kernel that does not compile fails the test with NVRTC's log.

use std::path::PathBuf;

use sieve_kernels::cuda::nvrtc::{Arch, NvrtcCompiler, Target};
use sieve_kernels::cuda::sources::{self, KernelSource};

fn cuda_assets() -> (PathBuf, PathBuf) {
    let cache = std::env::var_os("SIEVE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"));
    (cache.join("cuda/lib"), cache.join("cuda/include"))
}

fn compiler() -> NvrtcCompiler {
    let (lib, include) = cuda_assets();
    assert!(
        lib.join("libnvrtc.so.12").is_file(),
        "NVRTC is missing from {}: run `scripts/fetch-assets nvrtc` (scripts/test does)",
        lib.display()
    );
    NvrtcCompiler::new(std::slice::from_ref(&lib), vec![include])
        .unwrap_or_else(|e| panic!("loading NVRTC from {}: {e}", lib.display()))
}

#[test]
fn nvrtc_is_loaded_from_the_asset_cache() {
    let c = compiler();
    let (lib, _) = cuda_assets();
    assert_eq!(c.preloaded_from(), Some(lib.join("libnvrtc.so.12").as_path()));
    assert_eq!(c.version(), (12, 9));
    let archs = c.supported_archs().unwrap();
    assert!(archs.contains(&80) && archs.contains(&90), "NVRTC archs {archs:?}");
}

/// (architecture, the sources built for it).
fn builds() -> [(Arch, Vec<&'static KernelSource>); 3] {
    let all: Vec<&KernelSource> = sources::ALL.iter().collect();
    [(Arch::new(8, 0), all.clone()), (Arch::new(9, 0), all), (Arch::specific(9, 0), sources::HOPPER.iter().collect())]
}

#[test]
fn every_kernel_compiles_to_ptx_for_compute_80_and_90() {
    let c = compiler();
    let mut failures = Vec::new();
    for (arch, srcs) in builds() {
        for src in srcs {
            match c.compile(src, Target::Ptx(arch)) {
                Ok(img) => {
                    let ptx = img.ptx().expect("PTX is text");
                    assert!(ptx.contains(&format!(".target sm_{}", arch.name())), "{}: PTX target", src.file);
                    for entry in src.entries {
                        assert!(
                            ptx.contains(&format!(".entry {entry}(")),
                            "{} (compute_{}): no entry {entry}",
                            src.file,
                            arch.name()
                        );
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{} compile failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn every_kernel_assembles_to_cubin_for_sm_80_and_sm_90() {
    let c = compiler();
    let mut failures = Vec::new();
    for (arch, srcs) in builds() {
        let target = Target::Cubin(arch);
        for src in srcs {
            let mut options = c.options(target);
            options.push("--ptxas-options=-v".into());
            match c.compile_text(src.file, src.source, &options, target) {
                Ok((cubin, log)) => {
                    assert!(cubin.starts_with(b"\x7fELF"), "{}: cubin is not an ELF image", src.file);
                    // ptxas -v: one "Used N registers" line per kernel; print them for the record.
                    for line in log
                        .lines()
                        .filter(|l| l.contains("Compiling entry") || l.contains("registers") || l.contains("spill"))
                    {
                        println!("sm_{} {}: {}", arch.name(), src.file, line.trim());
                    }
                    // ptxas notes (C75xx) when it serialized wgmma or waited on one in flight to
                    // free its accumulators: the kernel would run, at a fraction of its speed.
                    let serialized: Vec<&str> = log.lines().filter(|l| l.contains("(C75")).collect();
                    assert!(serialized.is_empty(), "{} (sm_{}): {}", src.file, arch.name(), serialized.join("\n"));
                    for line in log.lines().filter(|l| l.contains("bytes spill stores")) {
                        let spilled: u64 = line
                            .split(',')
                            .find(|p| p.contains("spill stores"))
                            .and_then(|p| p.split_whitespace().next())
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(u64::MAX);
                        assert_eq!(spilled, 0, "{} (sm_{}) spills registers: {line}", src.file, arch.name());
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{} compile failure(s):\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn a_broken_kernel_fails_with_nvrtcs_log() {
    let c = compiler();
    let target = Target::Ptx(Arch::new(8, 0));
    let bad = "#include \"common.cuh\"\nextern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n";
    let err = c.compile_text("broken.cu", bad, &c.options(target), target).expect_err("must not compile").to_string();
    assert!(err.contains("broken.cu") && err.contains("undefined_name"), "error lacks the log: {err}");
}

#[test]
fn the_fetched_cuda_headers_compile_with_nvrtc() {
    // The kernels need no CUDA header; this checks the fetched include folder is usable for
    // anything that does (bf16/fp16 intrinsics).
    let c = compiler();
    let target = Target::Ptx(Arch::new(8, 0));
    let src = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n\
               extern \"C\" __global__ void probe(__nv_bfloat16* y, const float* x) { y[0] = __float2bfloat16_rn(x[0]); }\n";
    let (ptx, _) = c.compile_text("probe.cu", src, &c.options(target), target).unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&ptx).contains(".entry probe("));
}
