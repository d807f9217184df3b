//! Where weights come from: a GGUF file or an HF checkpoint, both seen through HF tensor names.

use crate::Result;

/// A tensor converted to f32, row-major, shape outer-first (a linear weight is `[out, in]`).
#[derive(Debug, Clone, PartialEq)]
pub struct HostWeight {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

pub trait WeightSource: Send + Sync {
    /// Tensor by its HF name (e.g. `model.layers.0.self_attn.q_proj.weight`).
    fn get(&self, name: &str) -> Result<HostWeight>;
    fn has(&self, name: &str) -> bool;
    /// All tensor names, HF naming.
    fn names(&self) -> Vec<String>;
}

/// Weights held in memory, by HF name (tests, and models built in-process).
#[derive(Debug, Default, Clone)]
pub struct MemorySource {
    pub tensors: std::collections::HashMap<String, HostWeight>,
}

impl MemorySource {
    pub fn insert(&mut self, name: impl Into<String>, data: Vec<f32>, shape: Vec<usize>) {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        self.tensors.insert(name.into(), HostWeight { data, shape });
    }
}

impl WeightSource for MemorySource {
    fn get(&self, name: &str) -> Result<HostWeight> {
        self.tensors.get(name).cloned().ok_or_else(|| crate::WorkerError::ModelFile(format!("missing tensor {name}")))
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }
}
