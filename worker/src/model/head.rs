//! The score head: one dot product per scored row, never the full vocabulary projection.
//!
//! For a yes/no reranker, sigmoid(l_yes − l_no) = sigmoid(h · (W[yes] − W[no])): the two LM-head
//! rows are folded into one vector at load time. A sequence-classification head (`score.weight`)
//! folds the same way: one label is used as is, two labels fold to W[1] − W[0].

use sieve_kernels::Backend;

use crate::model::layers::load;
use crate::model::source::WeightSource;
use crate::{Result, WorkerError};

#[derive(Debug, Clone, PartialEq)]
pub enum HeadKind {
    /// Folded `W[yes] − W[no]` of the LM head (or the tied embedding).
    YesNo { yes: u32, no: u32 },
    /// `score.weight` of a sequence-classification checkpoint.
    Classifier { labels: usize },
}

pub struct ScoreHead<B: Backend> {
    pub kind: HeadKind,
    folded: B::Vector,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl<B: Backend> ScoreHead<B> {
    /// Folds the yes/no rows of `lm_name` (`lm_head.weight`, or the embedding when tied).
    pub fn yes_no(
        backend: &B,
        src: &dyn WeightSource,
        lm_name: &str,
        yes: u32,
        no: u32,
        hidden: usize,
    ) -> Result<Self> {
        let lm = src.get(lm_name)?;
        if lm.shape.len() != 2 || lm.shape[1] != hidden {
            return Err(WorkerError::ModelFile(format!(
                "tensor {lm_name}: shape {:?}, expected [vocab, {hidden}]",
                lm.shape
            )));
        }
        let vocab = lm.shape[0];
        for (what, id) in [("yes", yes), ("no", no)] {
            if id as usize >= vocab {
                return Err(WorkerError::Config(format!("score head: '{what}' token id {id} ≥ vocab {vocab}")));
            }
        }
        let row = |id: u32| &lm.data[id as usize * hidden..(id as usize + 1) * hidden];
        let folded: Vec<f32> = row(yes).iter().zip(row(no)).map(|(y, n)| y - n).collect();
        Ok(ScoreHead { kind: HeadKind::YesNo { yes, no }, folded: backend.vector(&folded)? })
    }

    /// Folds `score.weight` (`[labels, hidden]`, 1 or 2 labels).
    pub fn classifier(backend: &B, src: &dyn WeightSource, hidden: usize) -> Result<Self> {
        let w = src.get("score.weight")?;
        let labels = w.shape.first().copied().unwrap_or(0);
        let folded: Vec<f32> = match labels {
            1 => load(src, "score.weight", &[1, hidden])?.data,
            2 => {
                let w = load(src, "score.weight", &[2, hidden])?;
                w.data[hidden..].iter().zip(&w.data[..hidden]).map(|(a, b)| a - b).collect()
            }
            n => {
                return Err(WorkerError::Unsupported(format!("classification head with {n} labels (1 or 2 supported)")))
            }
        };
        Ok(ScoreHead { kind: HeadKind::Classifier { labels }, folded: backend.vector(&folded)? })
    }

    /// Relevance logits (before the sigmoid) of final-normed hidden rows.
    pub fn logits(&self, backend: &B, hidden: &B::Tensor) -> Result<Vec<f32>> {
        Ok(backend.dot_rows(hidden, &self.folded)?)
    }

    /// Relevance scores in (0, 1).
    pub fn scores(&self, backend: &B, hidden: &B::Tensor) -> Result<Vec<f32>> {
        Ok(self.logits(backend, hidden)?.into_iter().map(sigmoid).collect())
    }
}
