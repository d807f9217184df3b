//! The CUDA kernel sources (kernels/cuda/*.cu), embedded in the binary so a deployed worker needs
//! no source tree, with the entry points each one defines.

/// One `.cu` translation unit.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name under kernels/cuda/ (also the NVRTC program name, so it appears in its log).
    pub file: &'static str,
    pub source: &'static str,
    /// `extern "C"` kernels it defines.
    pub entries: &'static [&'static str],
}

/// Headers the `.cu` files `#include "..."`, handed to NVRTC in memory: (include name, contents).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("mma_tile.cuh", include_str!("../../cuda/mma_tile.cuh")),
    ("mma_tile_v1.cuh", include_str!("../../cuda/mma_tile_v1.cuh")),
    ("rope.cuh", include_str!("../../cuda/rope.cuh")),
    ("wgmma_tile.cuh", include_str!("../../cuda/wgmma_tile.cuh")),
    ("wgmma_tma_tile.cuh", include_str!("../../cuda/wgmma_tma_tile.cuh")),
];

macro_rules! kernel_source {
    ($file:literal, [$($entry:literal),* $(,)?]) => {
        KernelSource { file: $file, source: include_str!(concat!("../../cuda/", $file)), entries: &[$($entry),*] }
    };
}

pub const RMSNORM: KernelSource = kernel_source!(
    "rmsnorm.cu",
    ["rms_norm_rows", "rms_norm_rows_bf16", "add_rms_norm_rows", "add_rms_norm_rows_bf16"]
);
pub const ROPE: KernelSource = kernel_source!("rope.cu", ["qk_norm_rope", "rope_table"]);
pub const SILU_MUL: KernelSource = kernel_source!("silu_mul.cu", ["silu_mul_f32", "silu_mul_bf16"]);
pub const KV_WRITE: KernelSource = kernel_source!("kv_write.cu", ["write_kv"]);
pub const ATTENTION: KernelSource = kernel_source!("attention.cu", ["attention_prefill"]);
pub const ATTENTION_MMA: KernelSource =
    kernel_source!("attention_mma.cu", ["attention_mma_hd64", "attention_mma_hd128"]);
pub const GATHER: KernelSource = kernel_source!("gather.cu", ["embed_rows", "gather_rows"]);
pub const CONVERT: KernelSource = kernel_source!("convert.cu", ["cast_bf16", "broadcast_rows"]);
pub const SCORE_HEAD: KernelSource = kernel_source!("score_head.cu", ["dot_rows"]);
pub const MOE_ROUTING: KernelSource = kernel_source!("moe_routing.cu", ["moe_topk_softmax"]);
pub const MOE_PERMUTE: KernelSource =
    kernel_source!("moe_permute.cu", ["moe_chunk_counts", "moe_offsets", "moe_scatter", "moe_unpermute"]);
pub const MOE_SELECT: KernelSource = kernel_source!("moe_select.cu", ["moe_select_tile"]);
pub const MOE_GEMM: KernelSource = kernel_source!(
    "moe_gemm.cu",
    [
        "moe_gemm_bm64",
        "moe_gemm_bm128",
        "moe_gemm_swiglu_bm64",
        "moe_gemm_swiglu_bm128",
        "moe_gemm_bf16_bm64",
        "moe_gemm_bf16_bm128"
    ]
);
pub const GEMM: KernelSource = kernel_source!(
    "gemm.cu",
    [
        "dense_gemm_bm64",
        "dense_gemm_bm128",
        "dense_gemm_v1_bm64",
        "dense_gemm_v1_bm128",
        "dense_gemm_swiglu_bm64",
        "dense_gemm_swiglu_bm128"
    ]
);

pub const GEMM_WGMMA: KernelSource = kernel_source!(
    "gemm_wgmma.cu",
    [
        "dense_gemm_wgmma_bn128",
        "dense_gemm_wgmma_bn256",
        "dense_gemm_wgmma_tma_bn128",
        "dense_gemm_wgmma_tma_bn256",
        "dense_gemm_wgmma_tma_swiglu_bn128",
        "dense_gemm_wgmma_tma_swiglu_bn256"
    ]
);
pub const MOE_GEMM_WGMMA: KernelSource = kernel_source!(
    "moe_gemm_wgmma.cu",
    [
        "moe_gemm_wgmma_bm64",
        "moe_gemm_wgmma_bm128",
        "moe_gemm_wgmma_swiglu_bm64",
        "moe_gemm_wgmma_swiglu_bm128",
        "moe_gemm_wgmma_bf16_bm64",
        "moe_gemm_wgmma_bf16_bm128"
    ]
);

/// Sources that use sm_90a's architecture-specific instructions (wgmma): compiled, as `sm_90a`,
/// only for a compute capability 9.0 device, where the backend also loads them.
pub const HOPPER: &[KernelSource] = &[GEMM_WGMMA, MOE_GEMM_WGMMA];

/// Every kernel source for all architectures; the CUDA backend loads them all at start-up.
pub const ALL: &[KernelSource] = &[
    RMSNORM,
    ROPE,
    SILU_MUL,
    KV_WRITE,
    ATTENTION,
    ATTENTION_MMA,
    GATHER,
    CONVERT,
    SCORE_HEAD,
    MOE_ROUTING,
    MOE_PERMUTE,
    MOE_SELECT,
    MOE_GEMM,
    GEMM,
];

/// Launch constants shared by the `.cu` files and the host code (and the CPU twins), kept in
/// one place; a test checks each against its `#define` in the source.
pub mod consts {
    pub const RMS_THREADS: u32 = 256;
    pub const ROPE_THREADS: u32 = 128;
    pub const KV_THREADS: u32 = 128;
    pub const GATHER_THREADS: u32 = 256;
    pub const SCORE_THREADS: u32 = 256;
    pub const ATT_BQ: u32 = 16;
    pub const ATT_BK: u32 = 32;
    pub const ATT_THREADS: u32 = 128;
    pub const ATT_ROWS_PER_WARP: u32 = 4;
    pub const ATT_MAX_HD: u32 = 256;
    pub const AMMA_BQ: u32 = 64;
    pub const AMMA_BK: u32 = 64;
    pub const AMMA_THREADS: u32 = 128;
    pub const AMMA_PAD: u32 = 8;
    pub const AMMA_LOAD_STATE: u32 = 1;
    pub const AMMA_STORE_STATE: u32 = 2;
    pub const AMMA_CAUSAL: u32 = 4;
    pub const ROUTE_THREADS: u32 = 128;
    pub const ROUTE_MAX_EXPERTS: u32 = 512;
    pub const PERM_CHUNK: u32 = 256;
    pub const PERM_OFFSET_THREADS: u32 = 1024;
    pub const PERM_UNPERM_THREADS: u32 = 256;
    pub const SELECT_THREADS: u32 = 256;
    pub const GEMM_BK: u32 = 32;
    pub const GEMM_STAGES: u32 = 4;
    pub const GEMM_BN_BM64: u32 = 64;
    pub const GEMM_BN_BM128: u32 = 128;
    pub const GEMM_GROUP_M: u32 = 8;
    pub const GEMM_V1_BN: u32 = 64;
    pub const GEMM_V1_BK: u32 = 32;
    pub const WG_BK: u32 = 64;
    pub const WG_THREADS: u32 = 256;
    pub const WG_TMA_THREADS: u32 = 384;

    /// (file, macro, value) for the source check.
    pub const DEFINES: &[(&str, &str, u32)] = &[
        ("rmsnorm.cu", "RMS_THREADS", RMS_THREADS),
        ("rope.cu", "ROPE_THREADS", ROPE_THREADS),
        ("kv_write.cu", "KV_THREADS", KV_THREADS),
        ("gather.cu", "GATHER_THREADS", GATHER_THREADS),
        ("score_head.cu", "SCORE_THREADS", SCORE_THREADS),
        ("attention.cu", "ATT_BQ", ATT_BQ),
        ("attention.cu", "ATT_BK", ATT_BK),
        ("attention.cu", "ATT_THREADS", ATT_THREADS),
        ("attention.cu", "ATT_ROWS_PER_WARP", ATT_ROWS_PER_WARP),
        ("attention.cu", "ATT_MAX_HD", ATT_MAX_HD),
        ("attention_mma.cu", "AMMA_BQ", AMMA_BQ),
        ("attention_mma.cu", "AMMA_BK", AMMA_BK),
        ("attention_mma.cu", "AMMA_THREADS", AMMA_THREADS),
        ("attention_mma.cu", "AMMA_PAD", AMMA_PAD),
        ("attention_mma.cu", "AMMA_LOAD_STATE", AMMA_LOAD_STATE),
        ("attention_mma.cu", "AMMA_STORE_STATE", AMMA_STORE_STATE),
        ("attention_mma.cu", "AMMA_CAUSAL", AMMA_CAUSAL),
        ("moe_routing.cu", "ROUTE_THREADS", ROUTE_THREADS),
        ("moe_routing.cu", "ROUTE_MAX_EXPERTS", ROUTE_MAX_EXPERTS),
        ("moe_permute.cu", "PERM_CHUNK", PERM_CHUNK),
        ("moe_permute.cu", "PERM_OFFSET_THREADS", PERM_OFFSET_THREADS),
        ("moe_permute.cu", "PERM_UNPERM_THREADS", PERM_UNPERM_THREADS),
        ("moe_select.cu", "SELECT_THREADS", SELECT_THREADS),
        ("mma_tile.cuh", "GEMM_BK", GEMM_BK),
        ("mma_tile.cuh", "GEMM_STAGES", GEMM_STAGES),
        ("mma_tile.cuh", "GEMM_BN_BM64", GEMM_BN_BM64),
        ("mma_tile.cuh", "GEMM_BN_BM128", GEMM_BN_BM128),
        ("mma_tile.cuh", "GEMM_GROUP_M", GEMM_GROUP_M),
        ("mma_tile_v1.cuh", "GEMM_V1_BN", GEMM_V1_BN),
        ("mma_tile_v1.cuh", "GEMM_V1_BK", GEMM_V1_BK),
        ("wgmma_tile.cuh", "WG_BK", WG_BK),
        ("gemm_wgmma.cu", "WG_THREADS", WG_THREADS),
        ("wgmma_tma_tile.cuh", "WG_TMA_THREADS", WG_TMA_THREADS),
    ];
}

/// The source of `file`, if it is one of [`ALL`] or [`HOPPER`].
pub fn find(file: &str) -> Option<&'static KernelSource> {
    ALL.iter().chain(HOPPER).find(|s| s.file == file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cu_file_is_listed_and_every_entry_is_defined() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("kernels/cuda")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.ends_with(".cu"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = ALL.iter().chain(HOPPER).map(|s| s.file.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "kernels/cuda/*.cu and sources::ALL differ");
        for s in ALL.iter().chain(HOPPER) {
            for e in s.entries {
                let defined =
                    s.source.lines().any(|l| l.contains(&format!("{e}(")) && !l.trim_start().starts_with("//"));
                assert!(defined, "{}: entry {e} not found", s.file);
            }
        }
    }

    #[test]
    fn host_constants_match_the_sources() {
        for &(file, name, value) in consts::DEFINES {
            let src = find(file)
                .map(|s| s.source)
                .or_else(|| HEADERS.iter().find(|h| h.0 == file).map(|h| h.1))
                .unwrap_or_else(|| panic!("{file} not listed"));
            let line = src
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{file}: no #define {name}"));
            let got: u32 =
                line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{file}: {line}"));
            assert_eq!(got, value, "{file}: {name}");
        }
    }
}
