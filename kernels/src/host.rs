//! Host-memory storage shared by the CPU backends, and the check that refuses a KV cache the
//! machine cannot hold (a clear error at start-up, not an abort or a later OOM kill).

use crate::backend::{KernelError, Result};

/// A row-major `[rows, cols]` f32 matrix in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl HostTensor {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        HostTensor { data: vec![0.0; rows * cols], rows, cols }
    }

    pub fn from_vec(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "HostTensor::from_vec: {} values for [{rows}, {cols}]", data.len());
        HostTensor { data, rows, cols }
    }

    /// Reshapes in place, keeping the allocation (growing it only when needed); the contents
    /// are whatever was there (scratch use).
    pub fn reshape_scratch(&mut self, rows: usize, cols: usize) {
        self.data.resize(rows * cols, 0.0);
        self.rows = rows;
        self.cols = cols;
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// Paged K/V in host memory: per layer, `num_slots × [n_kv_heads, head_dim]` for K and for V.
#[derive(Debug, Clone)]
pub struct HostKvCache {
    pub num_layers: usize,
    pub num_slots: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// `k[layer][slot * kv_dim + head * head_dim + d]`
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl HostKvCache {
    /// The zeroed cache, refused with [`KernelError::OutOfMemory`] when its size overflows or is
    /// more than the host memory available now.
    pub fn new(num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Result<Self> {
        let per_layer = kv_cache_values(num_layers, num_slots, n_kv_heads * head_dim, size_of::<f32>())?;
        Ok(HostKvCache {
            num_layers,
            num_slots,
            n_kv_heads,
            head_dim,
            k: (0..num_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..num_layers).map(|_| vec![0.0; per_layer]).collect(),
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The values per layer (`num_slots` × `kv_dim`, for K and again for V) and the bytes of a KV
/// cache of `elem_bytes` a value, every layer's K and V; refused when either overflows.
pub fn kv_cache_size(num_layers: usize, num_slots: usize, kv_dim: usize, elem_bytes: usize) -> Result<(usize, u64)> {
    let per_layer = num_slots.checked_mul(kv_dim);
    let bytes = per_layer
        .and_then(|v| v.checked_mul(2 * elem_bytes))
        .and_then(|v| v.checked_mul(num_layers))
        .and_then(|v| u64::try_from(v).ok());
    match (per_layer, bytes) {
        (Some(per_layer), Some(bytes)) => Ok((per_layer, bytes)),
        _ => Err(KernelError::OutOfMemory(format!(
            "a KV cache of 2 x {num_layers} layers x {num_slots} slots x {kv_dim} values overflows"
        ))),
    }
}

/// [`kv_cache_size`]'s values per layer of a host KV cache, after checking that all of it fits
/// the host memory available now.
pub fn kv_cache_values(num_layers: usize, num_slots: usize, kv_dim: usize, elem_bytes: usize) -> Result<usize> {
    let (per_layer, bytes) = kv_cache_size(num_layers, num_slots, kv_dim, elem_bytes)?;
    match available_memory() {
        Some(free) if bytes > free => Err(KernelError::OutOfMemory(format!(
            "a KV cache of {} ({num_layers} layers x {num_slots} slots x {kv_dim} values, K and V) is more \
             than the {} of host memory available",
            gib(bytes),
            gib(free)
        ))),
        _ => Ok(per_layer),
    }
}

/// Bytes as GiB for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Host memory available to a new allocation now (Linux `MemAvailable`); `None` where unknown.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kv_cache_larger_than_memory_or_overflowing_is_refused_with_its_size() {
        assert_eq!(kv_cache_values(2, 64, 8, 4).unwrap(), 512);
        let e = kv_cache_values(30, 1 << 40, 192, 4).unwrap_err().to_string();
        assert!(e.starts_with("out of memory: a KV cache of") && e.contains("GiB of host memory"), "{e}");
        let e = kv_cache_values(30, usize::MAX / 2, 192, 4).unwrap_err().to_string();
        assert!(e.contains("overflows"), "{e}");
    }
}
