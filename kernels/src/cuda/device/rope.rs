//! The attention block's input on the device: the RoPE angle table and rope.cu's `qk_norm_rope`
//! (with its K/V write).

use std::sync::MutexGuard;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};

use super::memory::{alloc, CudaBatch, CudaKvCache, CudaTensor, CudaVector};
use super::ops::{f32_only, grid_stride, per_row};
use super::{driver_err, CudaBackend};
use crate::backend::{KernelError, QkvLayout, Result, RopeConfig, RopeLayout};
use crate::cuda::checks;
use crate::cuda::layout::{check_rope_shape, rope_chunk_heads, rope_smem_bytes};
use crate::cuda::sources::consts::ROPE_THREADS;

/// Positions the angle table is first built for; it grows by powers of two past that.
const ROPE_TABLE_MIN_POSITIONS: usize = 4096;
/// Positions past this are refused (the table would be gigabytes).
const ROPE_TABLE_MAX_POSITIONS: usize = 1 << 20;

/// rope.cu's angle table for one RoPE config: cos and sin in double of every rotated pair at
/// positions `0..positions`. Computed once on the device instead of in every layer's kernel;
/// rebuilt when a batch reaches past it.
#[derive(Default)]
pub(crate) struct RopeTable {
    key: Option<RopeConfig>,
    positions: usize,
    buf: Option<CudaSlice<f64>>,
}

/// The q/k norm weights, as the kernels take them: raw device addresses, 0 when absent.
type NormAddrs = (u64, u64);

impl CudaBackend {
    /// The angle table for `rope`, covering positions `0..n_pos` (held locked while the caller
    /// enqueues the launch that reads it).
    fn rope_table(&self, rope: RopeConfig, n_pos: usize) -> Result<MutexGuard<'_, RopeTable>> {
        if n_pos > ROPE_TABLE_MAX_POSITIONS {
            return Err(KernelError::Shape(format!(
                "rope: position {} is past the {ROPE_TABLE_MAX_POSITIONS} the angle table supports",
                n_pos - 1
            )));
        }
        let mut t = self.rope_table.lock().unwrap_or_else(|p| p.into_inner());
        let key = rope;
        if t.key == Some(key) && t.positions >= n_pos && t.buf.is_some() {
            return Ok(t);
        }
        let positions = n_pos.next_power_of_two().max(ROPE_TABLE_MIN_POSITIONS);
        t.buf = None; // freed in stream order before the new allocation
        let mut buf = alloc::<f64>(&self.stream, positions * rope.rotary_dim)?;
        let half = rope.rotary_dim / 2;
        if half > 0 {
            // f64: the staging path moves 32-bit words only.
            let inv_freq = self.upload_bulk(&rope.inv_freq())?;
            let (n, scale, rotary_dim) = (positions as i32, rope.attention_scaling(), rope.rotary_dim as i32);
            let mut b = self.stream.launch_builder(&self.k.rope_table);
            b.arg(&mut buf).arg(&n).arg(&inv_freq).arg(&scale).arg(&rotary_dim);
            // SAFETY: the arguments match rope_table's signature; it writes positions * rotary_dim values.
            unsafe { b.launch(grid_stride(positions * half)) }.map_err(driver_err("rope_table"))?;
        }
        *t = RopeTable { key: Some(key), positions, buf: Some(buf) };
        Ok(t)
    }

    fn norm_addrs(&self, q_norm: Option<&CudaVector>, k_norm: Option<&CudaVector>) -> NormAddrs {
        let addr = |v: Option<&CudaVector>| -> u64 { v.map_or(0, |v| v.buf.device_ptr(&self.stream).0) };
        (addr(q_norm), addr(k_norm))
    }

    /// The raw addresses of `layer`'s K and V pools.
    fn pool_addrs(&self, cache: &mut CudaKvCache, layer: usize) -> (u64, u64) {
        let range = cache.layer_range(layer);
        let k = cache.k.slice_mut(range.clone()).device_ptr_mut(&self.stream).0;
        let v = cache.v.slice_mut(range).device_ptr_mut(&self.stream).0;
        (k, v)
    }

    /// rope.cu's `qk_norm_rope`, with its K/V write to `kv`'s layer when given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_qk_norm_rope(
        &self,
        qkv: &mut CudaTensor,
        layout: QkvLayout,
        (q_norm, k_norm): (Option<&CudaVector>, Option<&CudaVector>),
        eps: f32,
        rope: RopeConfig,
        batch: &CudaBatch,
        kv: Option<(&mut CudaKvCache, usize)>,
    ) -> Result<()> {
        checks::qk_norm_rope(
            (qkv.rows, qkv.cols),
            layout,
            q_norm.map(|v| v.len),
            k_norm.map(|v| v.len),
            batch.packed.num_rows,
        )?;
        f32_only("qk_norm_rope", &[qkv])?;
        check_rope_shape(layout, rope)?;
        if qkv.rows == 0 {
            return Ok(());
        }
        let table = self.rope_table(rope, batch.packed.positions_end)?;
        let (qkv_cols, n_heads, n_kv_heads, head_dim) =
            (qkv.cols as i32, layout.n_heads as i32, layout.n_kv_heads as i32, layout.head_dim as i32);
        let (rotary_dim, interleaved) = (rope.rotary_dim as i32, (rope.layout == RopeLayout::Interleaved) as i32);
        // Norm weights and the K/V pools go as raw device addresses: null when absent (the kernel
        // never reads or writes them then).
        let (q_addr, k_addr) = self.norm_addrs(q_norm, k_norm);
        let (k_pool, v_pool) = match kv {
            Some((cache, layer)) => self.pool_addrs(cache, layer),
            None => (0u64, 0u64),
        };
        let cfg = per_row(qkv.rows, ROPE_THREADS, rope_smem_bytes(layout));
        let chunk_heads = rope_chunk_heads(layout) as i32;
        let positions = batch.view(&batch.packed.positions);
        let row_slots = batch.view(&batch.packed.row_slots);
        let cs = table.buf.as_ref().ok_or_else(|| KernelError::Device("rope table".into()))?;
        let mut b = self.stream.launch_builder(&self.k.qk_norm_rope);
        b.arg(&mut qkv.buf).arg(&positions).arg(cs).arg(&q_addr).arg(&k_addr);
        b.arg(&qkv_cols).arg(&n_heads).arg(&n_kv_heads).arg(&head_dim).arg(&eps).arg(&rotary_dim).arg(&interleaved);
        b.arg(&row_slots).arg(&k_pool).arg(&v_pool).arg(&chunk_heads);
        // SAFETY: the arguments match the kernel's signature; the shapes were checked above.
        unsafe { b.launch(cfg) }.map_err(driver_err("qk_norm_rope"))?;
        Ok(())
    }
}
