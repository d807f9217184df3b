//! Loading the kernel images at start-up: the disk cache first, NVRTC (loaded only when needed)
//! for whatever is missing, for this device's exact architecture.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::{driver_err, CudaOptions};
use crate::backend::{KernelError, Result};
use crate::cuda::layout::{attention_mma_smem_bytes, attention_smem_bytes};
use crate::cuda::nvrtc::{cache_key, options_for, Arch, CompiledImage, KernelCache, NvrtcCompiler, Target};
use crate::cuda::sources::{self, consts::ATT_MAX_HD, KernelSource, GEMM_WGMMA, HOPPER, MOE_GEMM_WGMMA};
use crate::cuda::{GemmShape, WgmmaShape};

/// Where each translation unit's image came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelLoadReport {
    /// (file, target) loaded from the disk cache.
    pub from_cache: Vec<(String, String)>,
    /// (file, target) compiled by NVRTC at this start.
    pub compiled: Vec<(String, String)>,
    /// NVRTC's version, when it was loaded.
    pub nvrtc_version: Option<(i32, i32)>,
    /// Why the sm_90a kernels (`GemmEngine::Wgmma`) are not loaded, if they are not.
    pub wgmma_unavailable: Option<String>,
}

/// Every kernel entry point, resolved.
pub(crate) struct Kernels {
    pub rms_norm_rows: CudaFunction,
    pub rms_norm_rows_bf16: CudaFunction,
    pub add_rms_norm_rows: CudaFunction,
    pub add_rms_norm_rows_bf16: CudaFunction,
    pub qk_norm_rope: CudaFunction,
    pub rope_table: CudaFunction,
    pub silu_mul_f32: CudaFunction,
    pub silu_mul_bf16: CudaFunction,
    pub write_kv: CudaFunction,
    pub attention_prefill: CudaFunction,
    pub attention_mma_hd64: CudaFunction,
    pub attention_mma_hd128: CudaFunction,
    pub embed_rows: CudaFunction,
    pub gather_rows: CudaFunction,
    pub cast_bf16: CudaFunction,
    pub broadcast_rows: CudaFunction,
    pub dot_rows: CudaFunction,
    pub moe_topk_softmax: CudaFunction,
    pub moe_chunk_counts: CudaFunction,
    pub moe_offsets: CudaFunction,
    pub moe_scatter: CudaFunction,
    pub moe_unpermute: CudaFunction,
    pub moe_select_tile: CudaFunction,
    pub moe_gemm_bm64: CudaFunction,
    pub moe_gemm_bm128: CudaFunction,
    pub moe_gemm_swiglu_bm64: CudaFunction,
    pub moe_gemm_swiglu_bm128: CudaFunction,
    pub moe_gemm_bf16_bm64: CudaFunction,
    pub moe_gemm_bf16_bm128: CudaFunction,
    pub dense_gemm_bm64: CudaFunction,
    pub dense_gemm_bm128: CudaFunction,
    pub dense_gemm_v1_bm64: CudaFunction,
    pub dense_gemm_v1_bm128: CudaFunction,
    pub dense_gemm_swiglu_bm64: CudaFunction,
    pub dense_gemm_swiglu_bm128: CudaFunction,
}

/// The compile target for a device: a cubin for its exact architecture when this NVRTC knows
/// it, else PTX for the newest architecture NVRTC knows that the device can run (JIT-compiled by
/// the driver). Without NVRTC (cache only), the cubin target.
fn target_for(arch: Arch, nvrtc: Option<&NvrtcCompiler>) -> Result<Target> {
    let Some(c) = nvrtc else { return Ok(Target::Cubin(arch)) };
    let archs = c.supported_archs()?;
    if archs.contains(&arch.number()) {
        return Ok(Target::Cubin(arch));
    }
    let best = archs.iter().copied().filter(|&a| a <= arch.number() && a >= 80).max().ok_or_else(|| {
        KernelError::Unsupported(format!(
            "NVRTC {:?} cannot compile for sm_{} (supports {archs:?})",
            c.version(),
            arch.number()
        ))
    })?;
    Ok(Target::Ptx(Arch::new(best / 10, best % 10)))
}

/// The sm_90a kernels (sources::HOPPER), on a compute capability 9.0 device only.
pub(crate) struct HopperKernels {
    pub dense_gemm_wgmma_bn128: CudaFunction,
    pub dense_gemm_wgmma_bn256: CudaFunction,
    pub dense_gemm_wgmma_tma_bn128: CudaFunction,
    pub dense_gemm_wgmma_tma_bn256: CudaFunction,
    pub dense_gemm_wgmma_tma_swiglu_bn128: CudaFunction,
    pub dense_gemm_wgmma_tma_swiglu_bn256: CudaFunction,
    pub moe_gemm_wgmma_bm64: CudaFunction,
    pub moe_gemm_wgmma_bm128: CudaFunction,
    pub moe_gemm_wgmma_swiglu_bm64: CudaFunction,
    pub moe_gemm_wgmma_swiglu_bm128: CudaFunction,
    pub moe_gemm_wgmma_bf16_bm64: CudaFunction,
    pub moe_gemm_wgmma_bf16_bm128: CudaFunction,
}

impl HopperKernels {
    fn load(loader: &mut Loader<'_>) -> Result<HopperKernels> {
        for src in HOPPER {
            loader.load(src, Arch::specific(9, 0))?;
        }
        let (d, m) = (|e: &str| loader.function(&GEMM_WGMMA, e), |e: &str| loader.function(&MOE_GEMM_WGMMA, e));
        let h = HopperKernels {
            dense_gemm_wgmma_bn128: d("dense_gemm_wgmma_bn128")?,
            dense_gemm_wgmma_bn256: d("dense_gemm_wgmma_bn256")?,
            dense_gemm_wgmma_tma_bn128: d("dense_gemm_wgmma_tma_bn128")?,
            dense_gemm_wgmma_tma_bn256: d("dense_gemm_wgmma_tma_bn256")?,
            dense_gemm_wgmma_tma_swiglu_bn128: d("dense_gemm_wgmma_tma_swiglu_bn128")?,
            dense_gemm_wgmma_tma_swiglu_bn256: d("dense_gemm_wgmma_tma_swiglu_bn256")?,
            moe_gemm_wgmma_bm64: m("moe_gemm_wgmma_bm64")?,
            moe_gemm_wgmma_bm128: m("moe_gemm_wgmma_bm128")?,
            moe_gemm_wgmma_swiglu_bm64: m("moe_gemm_wgmma_swiglu_bm64")?,
            moe_gemm_wgmma_swiglu_bm128: m("moe_gemm_wgmma_swiglu_bm128")?,
            moe_gemm_wgmma_bf16_bm64: m("moe_gemm_wgmma_bf16_bm64")?,
            moe_gemm_wgmma_bf16_bm128: m("moe_gemm_wgmma_bf16_bm128")?,
        };
        // Every ring is past the 48 KiB a kernel gets without opting in.
        for (f, (bm, bn)) in [
            (&h.dense_gemm_wgmma_bn128, (128, 128)),
            (&h.dense_gemm_wgmma_bn256, (128, 256)),
            (&h.dense_gemm_wgmma_tma_bn128, (128, 128)),
            (&h.dense_gemm_wgmma_tma_bn256, (128, 256)),
            (&h.dense_gemm_wgmma_tma_swiglu_bn128, (128, 128)),
            (&h.dense_gemm_wgmma_tma_swiglu_bn256, (128, 256)),
            (&h.moe_gemm_wgmma_bm64, (64, 128)),
            (&h.moe_gemm_wgmma_bm128, (128, 128)),
            (&h.moe_gemm_wgmma_swiglu_bm64, (64, 128)),
            (&h.moe_gemm_wgmma_swiglu_bm128, (128, 128)),
            (&h.moe_gemm_wgmma_bf16_bm64, (64, 128)),
            (&h.moe_gemm_wgmma_bf16_bm128, (128, 128)),
        ] {
            f.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, WgmmaShape::of(bm, bn).smem_bytes as i32)
                .map_err(driver_err("wgmma GEMM shared memory limit"))?;
        }
        Ok(h)
    }
}

/// Finds each source's image (the disk cache, else NVRTC, loaded on first need) and loads it.
struct Loader<'a> {
    ctx: &'a Arc<CudaContext>,
    opts: &'a CudaOptions,
    cache: Option<KernelCache>,
    nvrtc: Option<NvrtcCompiler>,
    report: KernelLoadReport,
    modules: HashMap<&'static str, Arc<CudaModule>>,
}

impl Loader<'_> {
    /// Loads `src` built for `arch`: its cubin from the cache, else NVRTC's target for it
    /// ([`target_for`]; an architecture-specific arch is always a cubin).
    fn load(&mut self, src: &'static KernelSource, arch: Arch) -> Result<()> {
        // Cache lookup for the device's cubin first; it needs no NVRTC.
        let cubin = Target::Cubin(arch);
        let cached = self
            .cache
            .as_ref()
            .and_then(|c| c.get(src, cubin, cache_key(src, &options_for(cubin, &self.opts.include_dirs))));
        let image = match cached {
            Some(img) => {
                self.report.from_cache.push((src.file.into(), format!("{cubin:?}")));
                img
            }
            None => {
                if self.nvrtc.is_none() {
                    let c = NvrtcCompiler::new(&self.opts.nvrtc_lib_dirs, self.opts.include_dirs.clone())?;
                    self.report.nvrtc_version = Some(c.version());
                    self.nvrtc = Some(c);
                }
                let compiler = self.nvrtc.as_ref().ok_or_else(|| KernelError::Device("NVRTC not loaded".into()))?;
                let target = if arch.specific { cubin } else { target_for(arch, Some(compiler))? };
                let key = cache_key(src, &compiler.options(target));
                match self.cache.as_ref().and_then(|c| c.get(src, target, key)) {
                    Some(img) => {
                        self.report.from_cache.push((src.file.into(), format!("{target:?}")));
                        img
                    }
                    None => {
                        let img = compiler.compile(src, target)?;
                        if let Some(c) = &self.cache {
                            // A cache that cannot be written costs start-up time, not correctness.
                            let _ = c.put(src, key, &img);
                        }
                        self.report.compiled.push((src.file.into(), format!("{target:?}")));
                        img
                    }
                }
            }
        };
        self.modules.insert(src.file, load_image(self.ctx, src, image)?);
        Ok(())
    }

    fn function(&self, src: &KernelSource, entry: &str) -> Result<CudaFunction> {
        let m = self.modules.get(src.file).ok_or_else(|| KernelError::Device(format!("{} not loaded", src.file)))?;
        m.load_function(entry).map_err(|e| KernelError::Device(format!("kernel {entry} in {}: {e:?}", src.file)))
    }
}

impl Kernels {
    /// Every kernel for the device's `arch`, and the sm_90a ones when it is 9.0.
    pub fn load(
        ctx: &Arc<CudaContext>,
        arch: Arch,
        opts: &CudaOptions,
    ) -> Result<(Kernels, std::result::Result<HopperKernels, String>, KernelLoadReport)> {
        let mut loader = Loader {
            ctx,
            opts,
            cache: opts.kernel_cache_dir.as_ref().map(KernelCache::new),
            nvrtc: None,
            report: KernelLoadReport::default(),
            modules: HashMap::new(),
        };
        for src in ALL {
            loader.load(src, arch)?;
        }
        // The sm_90a kernels serve only `GemmEngine::Wgmma`: a failure to build or load them is
        // kept as the reason that engine is refused, not an error for the others.
        let hopper = if arch == Arch::new(9, 0) {
            HopperKernels::load(&mut loader).map_err(|e| format!("the sm_90a kernels did not load: {e}"))
        } else {
            Err(format!("the wgmma kernels need compute capability 9.0; this device is {}.{}", arch.major, arch.minor))
        };
        loader.report.wgmma_unavailable = hopper.as_ref().err().cloned();
        let f = |src: &KernelSource, entry: &str| loader.function(src, entry);
        use sources::*;
        let k = Kernels {
            rms_norm_rows: f(&RMSNORM, "rms_norm_rows")?,
            rms_norm_rows_bf16: f(&RMSNORM, "rms_norm_rows_bf16")?,
            add_rms_norm_rows: f(&RMSNORM, "add_rms_norm_rows")?,
            add_rms_norm_rows_bf16: f(&RMSNORM, "add_rms_norm_rows_bf16")?,
            qk_norm_rope: f(&ROPE, "qk_norm_rope")?,
            rope_table: f(&ROPE, "rope_table")?,
            silu_mul_f32: f(&SILU_MUL, "silu_mul_f32")?,
            silu_mul_bf16: f(&SILU_MUL, "silu_mul_bf16")?,
            write_kv: f(&KV_WRITE, "write_kv")?,
            attention_prefill: f(&ATTENTION, "attention_prefill")?,
            attention_mma_hd64: f(&ATTENTION_MMA, "attention_mma_hd64")?,
            attention_mma_hd128: f(&ATTENTION_MMA, "attention_mma_hd128")?,
            embed_rows: f(&GATHER, "embed_rows")?,
            gather_rows: f(&GATHER, "gather_rows")?,
            cast_bf16: f(&CONVERT, "cast_bf16")?,
            broadcast_rows: f(&CONVERT, "broadcast_rows")?,
            dot_rows: f(&SCORE_HEAD, "dot_rows")?,
            moe_topk_softmax: f(&MOE_ROUTING, "moe_topk_softmax")?,
            moe_chunk_counts: f(&MOE_PERMUTE, "moe_chunk_counts")?,
            moe_offsets: f(&MOE_PERMUTE, "moe_offsets")?,
            moe_scatter: f(&MOE_PERMUTE, "moe_scatter")?,
            moe_unpermute: f(&MOE_PERMUTE, "moe_unpermute")?,
            moe_select_tile: f(&MOE_SELECT, "moe_select_tile")?,
            moe_gemm_bm64: f(&MOE_GEMM, "moe_gemm_bm64")?,
            moe_gemm_bm128: f(&MOE_GEMM, "moe_gemm_bm128")?,
            moe_gemm_swiglu_bm64: f(&MOE_GEMM, "moe_gemm_swiglu_bm64")?,
            moe_gemm_swiglu_bm128: f(&MOE_GEMM, "moe_gemm_swiglu_bm128")?,
            moe_gemm_bf16_bm64: f(&MOE_GEMM, "moe_gemm_bf16_bm64")?,
            moe_gemm_bf16_bm128: f(&MOE_GEMM, "moe_gemm_bf16_bm128")?,
            dense_gemm_bm64: f(&GEMM, "dense_gemm_bm64")?,
            dense_gemm_bm128: f(&GEMM, "dense_gemm_bm128")?,
            dense_gemm_v1_bm64: f(&GEMM, "dense_gemm_v1_bm64")?,
            dense_gemm_v1_bm128: f(&GEMM, "dense_gemm_v1_bm128")?,
            dense_gemm_swiglu_bm64: f(&GEMM, "dense_gemm_swiglu_bm64")?,
            dense_gemm_swiglu_bm128: f(&GEMM, "dense_gemm_swiglu_bm128")?,
        };
        // Head sizes up to 256 need a little over the 48 KiB of dynamic shared memory a kernel
        // gets without opting in.
        k.attention_prefill
            .set_attribute(
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                attention_smem_bytes(ATT_MAX_HD as usize) as i32,
            )
            .map_err(driver_err("attention shared memory limit"))?;
        for (f, hd) in [(&k.attention_mma_hd64, 64), (&k.attention_mma_hd128, 128)] {
            f.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, attention_mma_smem_bytes(hd) as i32)
                .map_err(driver_err("tensor-core attention shared memory limit"))?;
        }
        // The GEMM tile's cp.async ring (BLOCK_M 128: 64 KiB) is also past the default 48 KiB.
        for (f, bm) in [
            (&k.dense_gemm_bm64, 64),
            (&k.dense_gemm_bm128, 128),
            (&k.dense_gemm_swiglu_bm64, 64),
            (&k.dense_gemm_swiglu_bm128, 128),
            (&k.moe_gemm_bm64, 64),
            (&k.moe_gemm_bm128, 128),
            (&k.moe_gemm_swiglu_bm64, 64),
            (&k.moe_gemm_swiglu_bm128, 128),
            (&k.moe_gemm_bf16_bm64, 64),
            (&k.moe_gemm_bf16_bm128, 128),
        ] {
            f.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, GemmShape::of(bm).smem_bytes as i32)
                .map_err(driver_err("GEMM shared memory limit"))?;
        }
        Ok((k, hopper, loader.report))
    }
}

fn load_image(ctx: &Arc<CudaContext>, src: &KernelSource, image: CompiledImage) -> Result<Arc<CudaModule>> {
    let ptx = match image.target {
        Target::Cubin(_) => Ptx::from_binary(image.bytes),
        Target::Ptx(_) => Ptx::from_src(
            String::from_utf8(image.bytes)
                .map_err(|_| KernelError::Device(format!("{}: PTX is not UTF-8", src.file)))?,
        ),
    };
    ctx.load_module(ptx).map_err(|e| KernelError::Device(format!("loading {} ({:?}): {e:?}", src.file, image.target)))
}
