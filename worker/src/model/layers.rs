//! The layers every supported decoder is built from, loaded by HF tensor name and run through a
//! [`Backend`]. Q, K and V are fused into one projection (one GEMM), as are gate and up.

use sieve_kernels::{Backend, QkvLayout};

use crate::model::config::ModelConfig;
use crate::model::source::{HostWeight, WeightSource};
use crate::{Result, WorkerError};

/// Loads a tensor and checks its shape.
pub(crate) fn load(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<HostWeight> {
    let w = src.get(name)?;
    w.expect_shape(name, shape)?;
    Ok(w)
}

/// Loads tensors with the same inner dimension and stacks them along the outer one. Each is read
/// and its shape checked against the file before the stack is sized: a config claiming more than
/// the file holds is a shape error, never an allocation sized by the claim.
pub(crate) fn load_stacked(src: &dyn WeightSource, parts: &[(String, usize)], inner: usize) -> Result<Vec<f32>> {
    let loaded =
        parts.iter().map(|(name, rows)| Ok(load(src, name, &[*rows, inner])?.data)).collect::<Result<Vec<_>>>()?;
    Ok(loaded.concat())
}

pub struct Attention<B: Backend> {
    pub layout: QkvLayout,
    pub qkv: B::Weight,
    pub qkv_bias: Option<B::Vector>,
    pub o: B::Weight,
    pub q_norm: Option<B::Vector>,
    pub k_norm: Option<B::Vector>,
}

impl<B: Backend> Attention<B> {
    pub fn load(backend: &B, src: &dyn WeightSource, cfg: &ModelConfig, prefix: &str) -> Result<Self> {
        let l = cfg.qkv_layout();
        let h = cfg.hidden;
        let parts = [
            (format!("{prefix}.q_proj.weight"), l.q_dim()),
            (format!("{prefix}.k_proj.weight"), l.kv_dim()),
            (format!("{prefix}.v_proj.weight"), l.kv_dim()),
        ];
        let qkv = backend.linear_weight(&load_stacked(src, &parts, h)?, l.qkv_dim(), h)?;
        let qkv_bias = if cfg.qkv_bias {
            let mut b = Vec::with_capacity(l.qkv_dim());
            for (name, rows) in &parts {
                let bname = name.replace(".weight", ".bias");
                b.extend_from_slice(&load(src, &bname, &[*rows])?.data);
            }
            Some(backend.vector(&b)?)
        } else {
            None
        };
        if cfg.o_bias {
            return Err(WorkerError::Unsupported("a bias on the attention output projection".into()));
        }
        let o = backend.linear_weight(
            &load(src, &format!("{prefix}.o_proj.weight"), &[h, l.q_dim()])?.data,
            h,
            l.q_dim(),
        )?;
        let (q_norm, k_norm) = if cfg.qk_norm {
            let d = [l.head_dim];
            (
                Some(backend.vector(&load(src, &format!("{prefix}.q_norm.weight"), &d)?.data)?),
                Some(backend.vector(&load(src, &format!("{prefix}.k_norm.weight"), &d)?.data)?),
            )
        } else {
            (None, None)
        };
        Ok(Attention { layout: l, qkv, qkv_bias, o, q_norm, k_norm })
    }
}

/// Reusable intermediates of an MLP.
pub struct MlpScratch<B: Backend> {
    pub gate_up: B::Tensor,
    pub act: B::Tensor,
}

/// SwiGLU MLP: `down(silu(gate(x)) * up(x))`, gate and up fused.
pub struct Mlp<B: Backend> {
    pub gate_up: B::Weight,
    pub down: B::Weight,
    pub intermediate: usize,
}

impl<B: Backend> Mlp<B> {
    pub fn load(backend: &B, src: &dyn WeightSource, hidden: usize, intermediate: usize, prefix: &str) -> Result<Self> {
        let parts =
            [(format!("{prefix}.gate_proj.weight"), intermediate), (format!("{prefix}.up_proj.weight"), intermediate)];
        let gate_up = backend.linear_weight(&load_stacked(src, &parts, hidden)?, 2 * intermediate, hidden)?;
        let down_name = format!("{prefix}.down_proj.weight");
        let down =
            backend.linear_weight(&load(src, &down_name, &[hidden, intermediate])?.data, hidden, intermediate)?;
        Ok(Mlp { gate_up, down, intermediate })
    }

    /// `out = mlp(x)`. The activation is the down projection's operand (on CUDA with fused
    /// epilogues: bf16, written by the gate/up GEMM's epilogue; `s.gate_up` then stays unused).
    pub fn forward(&self, backend: &B, x: &B::Tensor, out: &mut B::Tensor, s: &mut MlpScratch<B>) -> Result<()> {
        let (rows, _) = backend.shape(x);
        backend.reshape_operand(&mut s.act, rows, self.intermediate)?;
        backend.matmul_silu_mul(x, &self.gate_up, &mut s.gate_up, &mut s.act)?;
        backend.matmul(&s.act, &self.down, None, out)?;
        Ok(())
    }
}

pub fn load_norm<B: Backend>(backend: &B, src: &dyn WeightSource, name: &str, dim: usize) -> Result<B::Vector> {
    Ok(backend.vector(&load(src, name, &[dim])?.data)?)
}
