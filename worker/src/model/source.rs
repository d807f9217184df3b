//! The seam between model files and model graphs: a source of named tensors, converted to f32.
//!
//! Both file formats (GGUF, HF safetensors) answer in HF tensor names, so an architecture loads
//! its weights the same way whichever file they came from.

use crate::error::{Result, WorkerError};

/// A tensor converted to f32, row-major, shape outer-first (HF/numpy order: a linear weight is
/// `[out, in]`).
#[derive(Debug, Clone, PartialEq)]
pub struct HostWeight {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

impl HostWeight {
    /// Builds a weight, checking that the element count matches the shape.
    pub fn new(data: Vec<f32>, shape: Vec<usize>) -> Result<Self> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(WorkerError::ModelFile(format!(
                "tensor data has {} elements but shape {:?} needs {}",
                data.len(),
                shape,
                expected
            )));
        }
        Ok(Self { data, shape })
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Checks the shape against what a model expects, naming the tensor in the error.
    pub fn expect_shape(&self, name: &str, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(WorkerError::ModelFile(format!(
                "tensor {name}: shape {:?}, expected {:?}",
                self.shape, expected
            )));
        }
        Ok(())
    }
}

/// Where a model's weights come from. Names are HF names
/// (e.g. `model.layers.0.self_attn.q_proj.weight`).
pub trait WeightSource: Send + Sync {
    /// Tensor by its HF name, converted to f32.
    fn get(&self, name: &str) -> Result<HostWeight>;
    fn has(&self, name: &str) -> bool;
    /// All tensor names (HF names), sorted.
    fn names(&self) -> Vec<String>;
}

/// The error for a tensor a model needs but the file lacks.
pub(crate) fn missing_tensor(file: &std::path::Path, name: &str) -> WorkerError {
    WorkerError::ModelFile(format!("{}: no tensor named {name}", file.display()))
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
        self.tensors.get(name).cloned().ok_or_else(|| WorkerError::ModelFile(format!("missing tensor {name}")))
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }
}
