//! Opens a model path (a `.gguf` file or an HF checkpoint directory) and builds everything the
//! engine needs: the model on its backend, the tokenizer, and the prompt template.

use std::path::Path;
use std::sync::Arc;

use sieve_kernels::Backend;

use super::config::{Arch, ModelConfig};
use super::tokenizer::Tokenizer;
use super::{arch, GgufFile, HeadSpec, HfCheckpoint, Model, WeightSource};
use crate::config::HeadChoice;
use crate::prompt::{PromptBuilder, PromptTemplate};
use crate::{Result, WorkerError};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub head: HeadChoice,
    /// Replaces the model's default template.
    pub template: Option<PromptTemplate>,
    /// Keep an untied LM head for full logits (tests, generation).
    pub keep_lm_head: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { head: HeadChoice::Auto, template: None, keep_lm_head: false }
    }
}

pub struct LoadedModel<B: Backend> {
    pub model: Model<B>,
    pub tokenizer: Arc<Tokenizer>,
    pub builder: PromptBuilder,
    /// A display name: the file or directory name.
    pub name: String,
    /// The template identity: a digest of the prompt template and the score head, reported
    /// in answers and `/stats` (see [`template_identity`]).
    pub template_id: String,
}

/// A digest of what, besides the weights, decides a pair's score: the prompt template (every
/// field, the yes/no tokens included) and the score head. Two workers of one model with
/// different templates report different identities, so the proxy's pair cache keeps their
/// scores apart. XXH3, so every build and machine computes the same identity.
pub fn template_identity(template: &PromptTemplate, head: &HeadSpec) -> String {
    let text = serde_json::to_string(template).unwrap_or_default();
    let head = match head {
        HeadSpec::YesNo { yes, no } => format!("yes_no:{yes}:{no}"),
        HeadSpec::Classifier => "classifier".to_string(),
    };
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [text.as_bytes(), head.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    format!("{:016x}", h.digest())
}

/// The template a model gets unless configured: Qwen3 models are trained with the empty think
/// block of the Qwen3-Reranker template; other ChatML models get it without.
pub fn default_template(arch: Arch) -> PromptTemplate {
    (arch.spec().default_template)()
}

/// The id of a token that must encode to exactly one id.
fn single_token(tok: &Tokenizer, text: &str, what: &str) -> Result<u32> {
    let ids = tok.encode_plain(text)?;
    match ids.as_slice() {
        [id] => Ok(*id),
        _ => Err(WorkerError::Config(format!(
            "template {what} {text:?} is {} tokens; it must be exactly one",
            ids.len()
        ))),
    }
}

pub fn load<B: Backend>(backend: &B, path: &Path, opts: &LoadOptions) -> Result<LoadedModel<B>> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    let (src, config, tokenizer): (Box<dyn WeightSource>, ModelConfig, Tokenizer) = if path.is_dir() {
        let ckpt = HfCheckpoint::open(path)?;
        let config = arch::config_from_hf(ckpt.config())?;
        let tj = ckpt
            .tokenizer_json_path()
            .ok_or_else(|| WorkerError::ModelFile(format!("{}: no tokenizer.json", path.display())))?;
        let tokenizer = Tokenizer::from_file(&tj)?;
        (Box::new(ckpt), config, tokenizer)
    } else {
        let g = GgufFile::open(path)?;
        let config = arch::config_from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        (Box::new(g), config, tokenizer)
    };
    let template = opts.template.clone().unwrap_or_else(|| default_template(config.arch));
    let builder = PromptBuilder::new(template, &tokenizer)?;
    let classifier = match opts.head {
        HeadChoice::Auto => src.has("score.weight"),
        HeadChoice::YesNo => false,
        HeadChoice::Classifier => true,
    };
    let head = if classifier {
        HeadSpec::Classifier
    } else {
        HeadSpec::YesNo {
            yes: single_token(&tokenizer, &builder.template.yes_token, "yes_token")?,
            no: single_token(&tokenizer, &builder.template.no_token, "no_token")?,
        }
    };
    tracing::info!(
        arch = config.arch.name(),
        layers = config.n_layers,
        hidden = config.hidden,
        heads = config.n_heads,
        kv_heads = config.n_kv_heads,
        rope = %config.rope.layout,
        rope_scaling = ?config.rope.scaling,
        attention_window = ?config.attention_window,
        ?head,
        "loading {name}"
    );
    let template_id = template_identity(&builder.template, &head);
    let model = Model::load(backend, src.as_ref(), config, head, opts.keep_lm_head)?;
    Ok(LoadedModel { model, tokenizer: Arc::new(tokenizer), builder, name, template_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_identity_follows_the_template_and_the_head() {
        let yes_no = HeadSpec::YesNo { yes: 9693, no: 2152 };
        let base = template_identity(&PromptTemplate::default(), &yes_no);
        assert_eq!(base, template_identity(&PromptTemplate::default(), &yes_no), "stable");
        assert_eq!(base.len(), 16);
        assert_ne!(base, template_identity(&PromptTemplate::chatml(), &yes_no), "another suffix");
        let instruction = PromptTemplate { default_instruction: "Rank products".into(), ..PromptTemplate::default() };
        assert_ne!(base, template_identity(&instruction, &yes_no), "another default instruction");
        assert_ne!(base, template_identity(&PromptTemplate::default(), &HeadSpec::Classifier), "another head");
        assert_ne!(base, template_identity(&PromptTemplate::default(), &HeadSpec::YesNo { yes: 9693, no: 1 }));
    }
}
