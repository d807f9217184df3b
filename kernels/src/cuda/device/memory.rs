//! Device storage types and the host↔device copies.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    PinnedHostSlice, ValidAsZeroBits,
};

use super::{driver_err, CudaBackend};
use crate::backend::{BatchLayout, KernelError, Result};
use crate::cuda::layout::PackedBatch;

/// An activation matrix `[rows, cols]` on the device: f32, or bf16 for a GEMM operand
/// (`Backend::reshape_operand` with fused epilogues), then packed two to a word of `buf`.
pub struct CudaTensor {
    pub(crate) buf: CudaSlice<f32>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) bf16: bool,
}

impl CudaTensor {
    /// An f32 tensor on `buf`.
    pub(crate) fn f32(buf: CudaSlice<f32>, rows: usize, cols: usize) -> Self {
        CudaTensor { buf, rows, cols, bf16: false }
    }

    /// Whether the tensor is stored bf16 (a GEMM operand).
    pub fn is_bf16(&self) -> bool {
        self.bf16
    }

    /// The bf16 elements of an operand.
    pub(crate) fn bf16_view(&self) -> Result<CudaView<'_, u16>> {
        // SAFETY: u16 is plain data; the length is checked against the buffer by transmute.
        unsafe { self.buf.transmute::<u16>(self.rows * self.cols) }
            .ok_or_else(|| KernelError::Device("bf16 tensor storage too small".into()))
    }

    pub(crate) fn bf16_view_mut(&mut self) -> Result<CudaViewMut<'_, u16>> {
        let n = self.rows * self.cols;
        // SAFETY: as in bf16_view.
        unsafe { self.buf.transmute_mut::<u16>(n) }
            .ok_or_else(|| KernelError::Device("bf16 tensor storage too small".into()))
    }
}

/// A bf16 matrix on the device: a linear weight `[out, in]` or an embedding `[vocab, hidden]`.
pub struct CudaMatrix {
    pub(crate) buf: CudaSlice<u16>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// An f32 vector (norm weight, bias, folded score vector).
pub struct CudaVector {
    pub(crate) buf: CudaSlice<f32>,
    pub(crate) len: usize,
}

/// The paged bf16 K and V pools of all layers: `[layer][slot][kv_dim]` each.
pub struct CudaKvCache {
    pub(crate) k: CudaSlice<u16>,
    pub(crate) v: CudaSlice<u16>,
    pub(crate) num_layers: usize,
    pub(crate) num_slots: usize,
    pub(crate) kv_dim: usize,
}

impl CudaKvCache {
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        (self.num_layers, self.num_slots, self.kv_dim)
    }
    pub(crate) fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per = self.num_slots * self.kv_dim;
        layer * per..(layer + 1) * per
    }
}

/// A batch layout on the device: one buffer holding every array the kernels read.
pub struct CudaBatch {
    pub(crate) layout: BatchLayout,
    pub(crate) packed: PackedBatch,
    pub(crate) words: CudaSlice<u32>,
}

impl CudaBatch {
    pub(crate) fn view(&self, r: &std::ops::Range<usize>) -> CudaView<'_, u32> {
        self.words.slice(r.clone())
    }
}

/// The device's current stream-ordered pool, the one cudarc allocates from (`cuMemAllocAsync`);
/// `None` where the device has none (cudarc then allocates synchronously).
fn memory_pool(ctx: &CudaContext) -> Result<Option<cudarc::driver::sys::CUmemoryPool>> {
    use cudarc::driver::{result, sys};
    let pools = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(driver_err("reading whether the device has memory pools"))?;
    if pools == 0 {
        return Ok(None);
    }
    // SAFETY: the device is the context's.
    let pool = unsafe { result::device::get_mem_pool(ctx.cu_device()) };
    pool.map(Some).map_err(driver_err("reading the memory pool"))
}

/// Keeps device memory freed to the pool mapped across synchronisations. Its release threshold
/// is 0 by default: every forward pass's closing synchronisation handed the pass's scratch
/// (gigabytes for a MoE layer's permuted rows) back to the driver, and the next pass mapped it
/// again. The worker owns its GPU, so the pool keeps what it has held.
pub(crate) fn keep_freed_memory(ctx: &CudaContext) -> Result<()> {
    use cudarc::driver::{result::mem_pool, sys};
    let Some(pool) = memory_pool(ctx)? else { return Ok(()) };
    let mut threshold = u64::MAX;
    // SAFETY: a valid pool; the attribute takes a u64 that outlives the call.
    unsafe {
        mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .map_err(driver_err("setting the memory pool's release threshold"))
}

/// Hands what the pool holds unused back to the driver, once the stream is idle: before an
/// allocation sized against the GPU's free memory (the KV cache, after start-up's calibration
/// scratch was freed into the pool).
pub(crate) fn trim_pool(ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
    let Some(pool) = memory_pool(ctx)? else { return Ok(()) };
    stream.synchronize().map_err(driver_err("waiting for the stream before trimming the pool"))?;
    // SAFETY: a valid pool.
    unsafe { cudarc::driver::result::mem_pool::trim_to(pool, 0) }.map_err(driver_err("trimming the memory pool"))
}

/// Pinned host memory for uploads and downloads, reused; `done` marks the end of its last copy.
pub(crate) struct Staging {
    ctx: Arc<CudaContext>,
    buf: Option<PinnedHostSlice<u32>>,
    done: CudaEvent,
    pending: bool,
}

impl Staging {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Staging {
            ctx: ctx.clone(),
            buf: None,
            done: ctx.new_event(None).map_err(driver_err("creating an event"))?,
            pending: false,
        })
    }

    /// The buffer with room for `words` 32-bit words, once its previous copy has finished.
    fn ready(&mut self, words: usize) -> Result<&mut PinnedHostSlice<u32>> {
        if self.pending {
            self.done.synchronize().map_err(driver_err("waiting for a staging copy"))?;
            self.pending = false;
        }
        if self.buf.as_ref().is_none_or(|b| b.len() < words) {
            let cap = words.next_power_of_two().max(1 << 16);
            // SAFETY: the contents are written before every use.
            let b =
                unsafe { self.ctx.alloc_pinned::<u32>(cap) }.map_err(driver_err("allocating pinned host memory"))?;
            self.buf = Some(b);
        }
        self.buf.as_mut().ok_or_else(|| KernelError::Device("staging buffer".into()))
    }

    /// Copies `data` (any 4-byte plain type) to `dst` asynchronously through pinned memory.
    pub fn upload<T: DeviceRepr + Copy, D: DevicePtrMut<T>>(
        &mut self,
        stream: &Arc<CudaStream>,
        data: &[T],
        dst: &mut D,
    ) -> Result<()> {
        // At compile time: a wider type (the f64 RoPE frequencies once) fails the build, not a run.
        const { assert!(size_of::<T>() == 4, "staging moves 32-bit words") };
        if data.is_empty() {
            return Ok(());
        }
        let buf = self.ready(data.len())?;
        let host = buf.as_mut_slice().map_err(driver_err("pinned buffer"))?;
        // SAFETY: T is a 4-byte plain value; the destination has room for data.len() words.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr() as *const u32, host.as_mut_ptr(), data.len()) };
        let (dptr, _sync) = dst.device_ptr_mut(stream);
        // SAFETY: the source is pinned and outlives the copy (we wait on `done` before reuse).
        unsafe { cudarc::driver::result::memcpy_htod_async(dptr, &host[..data.len()], stream.cu_stream()) }
            .map_err(driver_err("host-to-device copy"))?;
        self.done.record(stream).map_err(driver_err("recording an event"))?;
        self.pending = true;
        Ok(())
    }

    /// Copies `n` 4-byte values from `src` to the host, waiting for the stream to get there.
    pub fn download<T: DeviceRepr + Copy + Default, S: DevicePtr<T>>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &S,
        n: usize,
    ) -> Result<Vec<T>> {
        // At compile time: a wider type (the f64 RoPE frequencies once) fails the build, not a run.
        const { assert!(size_of::<T>() == 4, "staging moves 32-bit words") };
        if n == 0 {
            return Ok(Vec::new());
        }
        let buf = self.ready(n)?;
        let host = buf.as_mut_slice().map_err(driver_err("pinned buffer"))?;
        let (sptr, _sync) = src.device_ptr(stream);
        // SAFETY: the pinned buffer has room for n words; we synchronise before reading it.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host[..n], sptr, stream.cu_stream()) }
            .map_err(driver_err("device-to-host copy"))?;
        stream.synchronize().map_err(driver_err("waiting for a device-to-host copy"))?;
        let mut out = vec![T::default(); n];
        // SAFETY: as in upload.
        unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), out.as_mut_ptr() as *mut u32, n) };
        Ok(out)
    }
}

/// A device buffer grown on demand and reused (stream order makes reuse safe).
pub(crate) struct Scratch<T> {
    buf: Option<CudaSlice<T>>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch { buf: None }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> Scratch<T> {
    pub fn get(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<&mut CudaSlice<T>> {
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = None; // freed in stream order before the new allocation
            self.buf = Some(alloc(stream, len)?);
        }
        self.buf.as_mut().ok_or_else(|| KernelError::Device("scratch buffer".into()))
    }
}

/// A zeroed device buffer of `len` elements (at least one, so empty shapes stay valid).
pub(crate) fn alloc<T: DeviceRepr + ValidAsZeroBits>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(len.max(1)).map_err(driver_err("device allocation"))
}

/// A device buffer of `len` elements (at least one) left unset: only for buffers the kernels
/// write in full before anything reads them.
pub(crate) fn alloc_unset<T: DeviceRepr>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: device memory of plain values; the caller's kernels write every element before any
    // kernel or copy reads it.
    unsafe { stream.alloc::<T>(len.max(1)) }.map_err(driver_err("device allocation"))
}

impl CudaBackend {
    pub(crate) fn upload<T: DeviceRepr + Copy + ValidAsZeroBits>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let mut dst = alloc::<T>(&self.stream, data.len())?;
        self.lock_staging().upload(&self.stream, data, &mut dst)?;
        Ok(dst)
    }

    /// Large one-off uploads (weights at load time) straight from pageable memory.
    pub(crate) fn upload_bulk<T: DeviceRepr + Copy + ValidAsZeroBits>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let mut dst = alloc::<T>(&self.stream, data.len())?;
        if !data.is_empty() {
            self.stream.memcpy_htod(data, &mut dst).map_err(driver_err("weight upload"))?;
        }
        Ok(dst)
    }

    pub(crate) fn lock_staging(&self) -> std::sync::MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(|p| p.into_inner())
    }
}
