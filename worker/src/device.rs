//! Device selection: builds the backend for `--device` and starts the engine on it.

use std::sync::Arc;

use sieve_kernels::cuda::{AttentionEngine, CudaBackend, CudaOptions, GemmEngine};
use sieve_kernels::{Backend, KernelError};

use crate::assets;
use crate::config::{Attention, Device, Gemm, WorkerConfig};
use crate::engine::{EngineConfig, EngineHandle, EngineParts, EngineState, PrefixCacheConfig};
use crate::model::loader::{self, LoadOptions};
use crate::model::ModelConfig;
use crate::{moe, Result, WorkerError};

/// The engine's settings from the worker's config and the model's. The longest prompt is
/// `[model] max_seq_tokens`, by default the model's context up to 4096; at most the model's
/// [`ModelConfig::prompt_limit`] (a sliding window, dynamic RoPE), so that each prompt is computed
/// as the model's own implementation computes it (a longer `max_seq_tokens` is refused).
pub fn engine_config(cfg: &WorkerConfig, model: &ModelConfig) -> Result<EngineConfig> {
    let e = &cfg.engine;
    let (limit, why) = model.prompt_limit().unwrap_or((usize::MAX, ""));
    let max_seq = match cfg.model.max_seq_tokens {
        0 => model.max_position.min(4096).min(limit),
        n if n > limit => {
            return Err(WorkerError::Config(format!(
                "model.max_seq_tokens {n} is past {why}, {limit} tokens: a longer prompt would be computed \
                 as the model never computes it; set it to {limit} or less (or 0)"
            )))
        }
        n => n,
    };
    Ok(EngineConfig {
        max_batch_tokens: e.max_batch_tokens,
        max_seqs_per_pass: e.max_seqs_per_pass,
        max_seq_tokens: max_seq.min(e.max_batch_tokens),
        max_queued_pairs: e.max_queued_pairs,
        max_in_flight_requests: e.max_in_flight_requests,
        block_size: e.kv_block_size,
        prefix_cache_blocks: e.prefix_cache_blocks,
        prefix_cache: PrefixCacheConfig {
            enabled: e.prefix_reuse,
            high_watermark: e.prefix_cache_high_watermark,
            low_watermark: e.prefix_cache_low_watermark,
        },
        prior_tokens_per_second: e.prior_tokens_per_second,
        deadline_pass_fraction: e.deadline_pass_fraction,
        tokenize_threads: e.tokenize_threads,
        item_sharing_min_tokens: e.item_prefix_sharing.then_some(e.item_prefix_min_tokens.max(1)),
        fault: None,
    })
}

fn start_on<B: Backend>(
    backend: B,
    cfg: &WorkerConfig,
    state: Arc<EngineState>,
) -> Result<(Arc<EngineHandle>, String, String)> {
    let path = assets::resolve_model(&cfg.model.path)?;
    let opts = LoadOptions { head: cfg.model.head, template: cfg.template.clone(), keep_lm_head: false };
    let mut loaded = loader::load(&backend, &path, &opts)?;
    let calibrations = assets::cache_dir().join("moe-autotune");
    if let Some(setup) = moe::setup::configure(&backend, &mut loaded.model, &loaded.name, &cfg.moe, &calibrations)? {
        state.moe.init(setup);
    }
    let ecfg = engine_config(cfg, &loaded.model.config)?;
    let parts = EngineParts { backend, model: loaded.model, encoder: loaded.tokenizer, builder: loaded.builder };
    let engine = EngineHandle::start(parts, ecfg, state)?;
    Ok((engine, loaded.name, loaded.template_id))
}

/// Loads the configured model on `device` and starts the engine; returns it with the model's
/// name and template identity.
pub fn start_engine(
    cfg: &WorkerConfig,
    device: Device,
    state: Arc<EngineState>,
) -> Result<(Arc<EngineHandle>, String, String)> {
    match device {
        Device::Cpu => start_on(sieve_kernels::CpuBackend::new(cfg.model.threads)?, cfg, state),
        Device::Cuda(n) => {
            let gemm = match cfg.model.gemm {
                Gemm::Auto | Gemm::Wgmma => GemmEngine::Wgmma,
                Gemm::Tiled => GemmEngine::Tiled,
                Gemm::Cublas => GemmEngine::Cublas,
                Gemm::TiledV1 => GemmEngine::TiledV1,
                Gemm::TiledUnfused => GemmEngine::TiledUnfused,
            };
            let attention = match cfg.model.attention {
                Attention::Mma => AttentionEngine::Mma,
                Attention::Simt => AttentionEngine::Simt,
            };
            let opts = CudaOptions { gemm, attention, ..CudaOptions::new(n).with_asset_cache(&assets::cache_dir()) };
            let backend = match CudaBackend::with_options(&opts) {
                // `auto` where the wgmma engine cannot run (not an sm_90, or its kernels did not
                // load): the tiled engine, the same fused epilogues on mma.sync.
                Err(KernelError::Unsupported(why)) if cfg.model.gemm == Gemm::Auto => {
                    tracing::info!("model.gemm = \"auto\": the tiled engine ({why})");
                    CudaBackend::with_options(&CudaOptions { gemm: GemmEngine::Tiled, ..opts })
                }
                other => other,
            }
            .map_err(|e| WorkerError::Config(format!("--device {device}: {e}")))?;
            start_on(backend, cfg, state)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::engine_config;
    use crate::config::WorkerConfig;
    use crate::model::config::Arch;
    use crate::model::tests::tiny_config;
    use crate::model::ModelConfig;
    use sieve_kernels::{RopeConfig, RopeScaling};

    #[test]
    fn prompts_are_capped_to_the_model_s_limit_and_a_longer_one_is_refused() {
        let mut cfg = WorkerConfig::default();
        let model =
            |max_position, attention_window| ModelConfig { max_position, attention_window, ..tiny_config(Arch::Qwen2) };
        assert_eq!(engine_config(&cfg, &model(32768, None)).unwrap().max_seq_tokens, 4096);
        assert_eq!(engine_config(&cfg, &model(32768, Some(1024))).unwrap().max_seq_tokens, 1024);
        cfg.model.max_seq_tokens = 1024;
        assert_eq!(engine_config(&cfg, &model(32768, Some(1024))).unwrap().max_seq_tokens, 1024);
        cfg.model.max_seq_tokens = 2048;
        let err = engine_config(&cfg, &model(32768, Some(1024))).err().expect("refused").to_string();
        assert!(
            err.contains("model.max_seq_tokens 2048") && err.contains("sliding attention window, 1024 tokens"),
            "{err}"
        );
        assert_eq!(engine_config(&cfg, &model(32768, None)).unwrap().max_seq_tokens, 2048);
        // Dynamic NTK RoPE: unscaled within max_position_embeddings, rescaled by batch past it.
        let dynamic = |max_position| ModelConfig {
            rope: RopeConfig { scaling: RopeScaling::Dynamic { factor: 2.0 }, ..tiny_config(Arch::Qwen2).rope },
            ..model(max_position, None)
        };
        assert_eq!(engine_config(&cfg, &dynamic(4096)).unwrap().max_seq_tokens, 2048);
        let err = engine_config(&cfg, &dynamic(1024)).err().expect("refused").to_string();
        assert!(err.contains("dynamic RoPE") && err.contains("1024 or less"), "{err}");
        cfg.model.max_seq_tokens = 0;
        assert_eq!(engine_config(&cfg, &dynamic(1024)).unwrap().max_seq_tokens, 1024);
        assert_eq!(engine_config(&cfg, &model(32768, Some(512))).unwrap().max_seq_tokens, 512);
    }
}
