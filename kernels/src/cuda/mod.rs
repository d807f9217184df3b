//! The CUDA backend: cudarc (driver, NVRTC, cuBLAS — all loaded dynamically, so this builds and
//! runs on machines with no CUDA at all) and the kernels in `kernels/cuda/*.cu`.
//!
//! - [`sources`]: the embedded `.cu` sources and their entry points.
//! - [`nvrtc`]: compiling them with NVRTC (PTX or cubin), and the on-disk image cache.
//! - [`twin`]: a CPU twin of every kernel — the same indexing, tiling and reduction order, run on
//!   the host — and [`twin::TwinBackend`], the `Backend` the CUDA backend would be if the device
//!   were the CPU. It is how the kernels' math is tested without a GPU.
//! - [`CudaBackend`]: the `Backend` on a GPU.
//! - [`moe`]: MoE routing and tile-selection settings shared by the GPU pipeline and its twin.

pub mod checks;
mod device;
pub mod layout;
mod libs;
pub mod moe;
pub mod nvrtc;
pub mod sources;
pub mod twin;

pub use device::{
    device_count, CudaBackend, CudaBatch, CudaKvCache, CudaMatrix, CudaMoeStats, CudaMoeWeights, CudaOptions, CudaTensor, CudaVector,
    DeviceInfo, KernelLoadReport,
};
pub use libs::{cublas_present, driver_present, nvrtc_present};
