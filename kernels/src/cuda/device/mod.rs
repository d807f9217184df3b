//! `CudaBackend`: the [`Backend`](crate::Backend) on an NVIDIA GPU.
//!
//! One CUDA context and one stream per backend: every op is enqueued in program order, so a K/V
//! write completes before any attention that reads it, and nothing waits on the host except the
//! calls that return data (`to_host`, `dot_rows`). Weights, embeddings and the paged K/V pools
//! are bf16 on the device; activations are f32. The dense projections are cuBLAS `GemmEx`
//! (bf16 × bf16 → f32, f32 compute) on a bf16 copy of the activation; everything else is an
//! NVRTC-compiled kernel from kernels/cuda/. Host inputs and outputs go through a pinned staging
//! buffer with asynchronous copies.
//!
//! Start-up: probe the driver (a clear error, never a panic, when there is none), open the
//! device, then load every kernel — from the on-disk image cache when present, else compiled by
//! NVRTC for this device's architecture and stored.

mod blas;
mod kernels;
mod memory;
mod moe;
mod ops;
mod rope;
mod tma;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::libs;
use super::nvrtc::Arch;
use super::{AttentionEngine, GemmEngine};
use crate::backend::{KernelError, Result};

pub use kernels::KernelLoadReport;
pub use memory::{CudaBatch, CudaKvCache, CudaMatrix, CudaTensor, CudaVector};
pub use moe::{CudaMoeLayer, CudaMoeLog, CudaMoeStats, CudaMoeWeights};

/// Where the CUDA backend finds its libraries and keeps its compiled kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// Device ordinal (`cuda:N`).
    pub ordinal: usize,
    /// Folders searched for `libnvrtc.so.12` before the system library path.
    pub nvrtc_lib_dirs: Vec<PathBuf>,
    /// Passed to NVRTC as include paths.
    pub include_dirs: Vec<PathBuf>,
    /// Cache of compiled kernel images; `None` compiles at every start.
    pub kernel_cache_dir: Option<PathBuf>,
    /// cuBLAS or the batch-invariant tiled kernel for the dense projections.
    pub gemm: GemmEngine,
    /// Tensor-core or SIMT attention.
    pub attention: AttentionEngine,
}

impl CudaOptions {
    /// Device `ordinal`, NVRTC from the system, kernel images cached in the temp folder.
    pub fn new(ordinal: usize) -> Self {
        CudaOptions {
            ordinal,
            nvrtc_lib_dirs: Vec::new(),
            include_dirs: Vec::new(),
            kernel_cache_dir: Some(std::env::temp_dir().join("sieve-cuda-kernels")),
            gemm: GemmEngine::default(),
            attention: AttentionEngine::default(),
        }
    }

    /// Uses the asset cache that `scripts/fetch-assets nvrtc` fills (`<cache>/cuda/{lib,include}`)
    /// and keeps compiled kernels in `<cache>/cuda/kernels`.
    pub fn with_asset_cache(mut self, cache: &Path) -> Self {
        self.nvrtc_lib_dirs.push(cache.join("cuda/lib"));
        self.include_dirs.push(cache.join("cuda/include"));
        self.kernel_cache_dir = Some(cache.join("cuda/kernels"));
        self
    }
}

/// What the backend runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub arch: Arch,
    pub total_memory: usize,
    pub multiprocessors: u32,
}

/// The CUDA backend. See the module docs.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: blas::Blas,
    k: kernels::Kernels,
    /// The sm_90a kernels (a compute capability 9.0 device), or why they are not here.
    hopper: std::result::Result<kernels::HopperKernels, String>,
    info: DeviceInfo,
    load_report: KernelLoadReport,
    gemm: GemmEngine,
    attention: AttentionEngine,
    staging: Mutex<memory::Staging>,
    /// bf16 copy of a GEMM's activation; held across the cast and the GEMM it feeds.
    gemm_input: Mutex<memory::Scratch<u16>>,
    /// What the attention keeps between its passes, and its f32 rows when it writes an operand.
    attention_state: Mutex<AttentionScratch>,
    /// The RoPE angle table (rope.cu `rope_table`) of the last rope config, for the positions seen.
    rope_table: Mutex<rope::RopeTable>,
}

/// The attention's scratch: the tensor-core kernel's (m, l) per row and head between its passes,
/// and f32 rows (with a bf16 output, [`crate::Backend::reshape_operand`]: the shared passes'
/// unnormalised o, or the SIMT kernel's output before its cast).
#[derive(Default)]
struct AttentionScratch {
    ml: memory::Scratch<f32>,
    rows: memory::Scratch<f32>,
}

pub(crate) fn driver_err(what: &str) -> impl Fn(DriverError) -> KernelError + '_ {
    move |e| {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            KernelError::OutOfMemory(what.to_string())
        } else {
            KernelError::Device(format!("{what}: {e:?}"))
        }
    }
}

impl CudaBackend {
    /// The backend on device `ordinal` with default options. A clear error — not a panic —
    /// when there is no driver, no such device, or no way to get the kernels compiled.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(&CudaOptions::new(ordinal))
    }

    pub fn with_options(opts: &CudaOptions) -> Result<Self> {
        let ctx = open_device(opts.ordinal)?;
        let info = device_info(&ctx, opts.ordinal)?;
        if info.arch < Arch::new(8, 0) {
            return Err(KernelError::Unsupported(format!(
                "{} has compute capability {}.{}; the kernels need 8.0 or newer (bf16 tensor cores)",
                info.name, info.arch.major, info.arch.minor
            )));
        }
        if !libs::cublas_present() {
            return Err(KernelError::Device("cuBLAS (libcublas.so.12) not found on the library path".into()));
        }
        // One stream, ordered by construction: cudarc's cross-stream event tracking is not needed.
        // SAFETY: must precede every allocation; nothing here uses a second stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("creating a stream"))?;
        memory::keep_freed_memory(&ctx)?;
        let (k, hopper, load_report) = kernels::Kernels::load(&ctx, info.arch, opts)?;
        if let (GemmEngine::Wgmma, Err(why)) = (opts.gemm, &hopper) {
            return Err(KernelError::Unsupported(format!(
                "model.gemm = \"wgmma\" cannot run on {}: {why}; use \"tiled\"",
                info.name
            )));
        }
        let blas = blas::Blas::new(stream.clone())?;
        let staging = Mutex::new(memory::Staging::new(&ctx)?);
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            k,
            hopper,
            info,
            load_report,
            gemm: opts.gemm,
            attention: opts.attention,
            staging,
            gemm_input: Mutex::new(memory::Scratch::default()),
            attention_state: Mutex::new(AttentionScratch::default()),
            rope_table: Mutex::new(rope::RopeTable::default()),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Where each kernel image came from (cache or NVRTC) at start-up.
    pub fn kernel_load_report(&self) -> &KernelLoadReport {
        &self.load_report
    }

    /// Free and total device memory in bytes (for sizing the K/V pools).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(driver_err("reading free device memory"))
    }

    /// Waits for everything enqueued so far (benchmarks, tests).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("synchronize"))
    }

    /// The engine of the dense projections.
    pub fn gemm_engine(&self) -> GemmEngine {
        self.gemm
    }

    /// The attention kernel family in use.
    pub fn attention_engine(&self) -> AttentionEngine {
        self.attention
    }

    /// Switches the attention kernels (benchmarks compare both on the same data).
    pub fn set_attention_engine(&mut self, engine: AttentionEngine) {
        self.attention = engine;
    }

    /// The stream every op runs on (benchmarks record events on it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// The number of CUDA devices, or why there are none usable (no driver, driver error).
pub fn device_count() -> Result<usize> {
    if !libs::driver_present() {
        return Err(KernelError::Device("no CUDA driver (libcuda.so) on this machine".into()));
    }
    cudarc::driver::result::init().map_err(driver_err("initialising the CUDA driver"))?;
    let n = CudaContext::device_count().map_err(driver_err("counting CUDA devices"))?;
    Ok(n.max(0) as usize)
}

fn open_device(ordinal: usize) -> Result<Arc<CudaContext>> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(KernelError::Device(format!("CUDA device {ordinal} requested; this machine has {n}")));
    }
    CudaContext::new(ordinal).map_err(driver_err("opening the CUDA device"))
}

fn device_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    let (major, minor) = ctx.compute_capability().map_err(driver_err("reading the compute capability"))?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name().map_err(driver_err("reading the device name"))?,
        arch: Arch::new(major.max(0) as u32, minor.max(0) as u32),
        total_memory: ctx.total_mem().map_err(driver_err("reading the device memory size"))?,
        multiprocessors: ctx
            .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("reading the SM count"))?
            .max(0) as u32,
    })
}
