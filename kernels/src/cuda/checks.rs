//! Shape checks run before every launch, shared by the CUDA backend and its CPU twin so both
//! reject exactly the same inputs (with the same messages). A kernel never sees an index it
//! could run out of bounds with.

use super::layout::check_rope_shape;
use crate::backend::{BatchLayout, KernelError, QkvLayout, Result, RopeConfig};

pub fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape(msg()))
    }
}

pub type Shape = (usize, usize);

pub fn matmul(x: Shape, w: Shape, out: Shape, bias: Option<usize>) -> Result<()> {
    check(x.1 == w.1 && out == (x.0, w.0), || {
        format!("matmul [{}, {}] x [{}, {}]ᵀ -> [{}, {}]", x.0, x.1, w.0, w.1, out.0, out.1)
    })?;
    if let Some(b) = bias {
        check(b == w.0, || format!("matmul: bias of {b} for {} outputs", w.0))?;
    }
    Ok(())
}

pub fn rms_norm(x: Shape, w: usize, out: Shape) -> Result<()> {
    check(x.1 == w && out == x, || format!("rms_norm: x [{}, {}], weight {w}, out [{}, {}]", x.0, x.1, out.0, out.1))
}

pub fn add_rms_norm(x: Shape, delta: Shape, w: usize, out: Shape) -> Result<()> {
    check(delta == x, || format!("add_rms_norm: x [{}, {}], delta [{}, {}]", x.0, x.1, delta.0, delta.1))?;
    rms_norm(x, w, out)
}

pub fn qk_norm_rope(
    qkv: Shape,
    layout: QkvLayout,
    q_norm: Option<usize>,
    k_norm: Option<usize>,
    batch_rows: usize,
) -> Result<()> {
    check(qkv.1 == layout.qkv_dim() && qkv.0 == batch_rows, || {
        format!("qk_norm_rope: qkv [{}, {}] for {} columns and {batch_rows} batch rows", qkv.0, qkv.1, layout.qkv_dim())
    })?;
    for (what, n) in [("q_norm", q_norm), ("k_norm", k_norm)] {
        if let Some(n) = n {
            check(n == layout.head_dim, || format!("qk_norm_rope: {what} of {n} for head_dim {}", layout.head_dim))?;
        }
    }
    Ok(())
}

/// [`qk_norm_rope`], the rope config and [`write_kv`]: what every fused launch that norms,
/// rotates and writes the K/V of a QKV tensor checks. `norms` = the q and k norm lengths.
pub fn qk_norm_rope_write_kv(
    qkv: Shape,
    layout: QkvLayout,
    norms: (Option<usize>, Option<usize>),
    rope: RopeConfig,
    cache: (usize, usize, usize),
    layer: usize,
    batch_rows: usize,
) -> Result<()> {
    qk_norm_rope(qkv, layout, norms.0, norms.1, batch_rows)?;
    check_rope_shape(layout, rope)?;
    write_kv(qkv, layout, cache, layer, batch_rows)
}

/// `cache` = (num_layers, num_slots, kv_dim).
pub fn write_kv(
    qkv: Shape,
    layout: QkvLayout,
    cache: (usize, usize, usize),
    layer: usize,
    batch_rows: usize,
) -> Result<()> {
    check(qkv.1 == layout.qkv_dim() && qkv.0 == batch_rows, || {
        format!("write_kv: qkv [{}, {}] for {batch_rows} batch rows", qkv.0, qkv.1)
    })?;
    check(layer < cache.0 && cache.2 == layout.kv_dim(), || {
        format!("write_kv: layer {layer} of {}, cache kv_dim {} vs {}", cache.0, cache.2, layout.kv_dim())
    })
}

pub fn attention(
    qkv: Shape,
    layout: QkvLayout,
    cache: (usize, usize, usize),
    layer: usize,
    batch_rows: usize,
    out: Shape,
) -> Result<()> {
    super::layout::check_attention_shape(layout)?;
    check(qkv.1 == layout.qkv_dim() && qkv.0 == batch_rows, || {
        format!("attention: qkv [{}, {}] for {batch_rows} batch rows", qkv.0, qkv.1)
    })?;
    check(out == (qkv.0, layout.q_dim()), || format!("attention: output [{}, {}]", out.0, out.1))?;
    check(layer < cache.0 && cache.2 == layout.kv_dim(), || {
        format!("attention: layer {layer} of {}, cache kv_dim {} vs {}", cache.0, cache.2, layout.kv_dim())
    })
}

pub fn silu_mul(gate_up: Shape, out: Shape) -> Result<()> {
    check(gate_up.1.is_multiple_of(2) && out == (gate_up.0, gate_up.1 / 2), || {
        format!("silu_mul: [{}, {}] -> [{}, {}]", gate_up.0, gate_up.1, out.0, out.1)
    })
}

pub fn gather_rows(x: Shape, rows: &[u32], out: Shape) -> Result<()> {
    check(out == (rows.len(), x.1), || format!("gather_rows: {} rows into [{}, {}]", rows.len(), out.0, out.1))?;
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= x.0) {
        return Err(KernelError::Shape(format!("gather_rows: row {r} ≥ {}", x.0)));
    }
    Ok(())
}

pub fn embed(table: Shape, layout: &BatchLayout, out: Shape) -> Result<()> {
    check(out == (layout.num_rows(), table.1), || {
        format!("embed: output [{}, {}] for {} rows of width {}", out.0, out.1, layout.num_rows(), table.1)
    })?;
    if let Some(&id) = layout.token_ids.iter().find(|&&id| id as usize >= table.0) {
        return Err(KernelError::Shape(format!("token id {id} ≥ vocab {}", table.0)));
    }
    Ok(())
}

pub fn dot_rows(x: Shape, v: usize) -> Result<()> {
    check(x.1 == v, || format!("dot_rows: [{}, {}] · {v}", x.0, x.1))
}

pub fn host_data(len: usize, rows: usize, cols: usize, what: &str) -> Result<()> {
    check(len == rows * cols, || format!("{what} [{rows}, {cols}] from {len} values"))
}
