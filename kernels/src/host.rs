//! Host-memory storage shared by the CPU backends.

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
    pub fn new(num_layers: usize, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        let per_layer = num_slots * n_kv_heads * head_dim;
        HostKvCache {
            num_layers,
            num_slots,
            n_kv_heads,
            head_dim,
            k: (0..num_layers).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..num_layers).map(|_| vec![0.0; per_layer]).collect(),
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
