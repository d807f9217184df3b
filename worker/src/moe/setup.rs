//! Start-up of a MoE model's variant selection: a fixed variant from the config, the GPU
//! padding-ratio rule, or (the default) a cost model — calibrated by timing every variant on the
//! loaded model's first MoE layer, cached on disk per model and machine, with per-variant
//! overrides from the config on top.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sieve_kernels::moe::{AutotuneReport, MoeCostModel, MoeVariant};
use sieve_kernels::Backend;

use crate::config::{MoePolicyKind, MoeSection};
use crate::model::{Model, MoePolicy};
use crate::{Result, WorkerError};

/// What the MoE layers of the loaded model were set up with (shown in `/stats`).
#[derive(Debug, Clone, Serialize)]
pub struct MoeSetup {
    pub variants: Vec<MoeVariant>,
    /// `fixed`, `cost_model` or `padding_ratio`.
    pub policy: String,
    /// The fixed variant's name, for the `fixed` policy.
    pub fixed_variant: Option<String>,
    pub cost_model: Option<MoeCostModel>,
    /// Where the costs came from: `autotune`, `cache`, `default`, `padding_ratio_rule`, plus
    /// `+config` when config entries replaced some.
    pub cost_source: String,
    pub autotune: Option<AutotuneReport>,
    pub cache_file: Option<PathBuf>,
    /// The model's choice for evenly spread histograms: rows per expert → variant.
    pub thresholds: Vec<sieve_kernels::moe::ChoiceRange>,
}

/// A cached calibration: the key it was measured under, and the fitted model.
#[derive(Debug, Serialize, Deserialize)]
struct CacheEntry {
    key: String,
    model: MoeCostModel,
}

/// What a calibration depends on: the model's expert shapes and the machine (backend, ISA,
/// threads, CPU model) and the variants measured.
fn cache_key<B: Backend>(backend: &B, model_name: &str, model: &Model<B>) -> String {
    let c = &model.config;
    let m = c.moe.as_ref();
    let variants: Vec<&str> = backend.moe_variants().iter().map(|v| v.name).collect();
    format!(
        "v4 model={model_name} arch={} hidden={} experts={} inter={} top_k={} | backend={} cpu={} | variants={}",
        c.arch.name(),
        c.hidden,
        m.map_or(0, |m| m.num_experts),
        m.map_or(0, |m| m.expert_intermediate),
        m.map_or(0, |m| m.top_k),
        backend.name(),
        cpu_model(),
        variants.join(",")
    )
}

/// The CPU's model name (Linux), for the cache key.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn cache_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("moe-{:016x}.json", fnv1a64(key.as_bytes())))
}

fn read_cache(path: &Path, key: &str, variants: &[MoeVariant]) -> Option<MoeCostModel> {
    let text = std::fs::read_to_string(path).ok()?;
    let entry: CacheEntry = match serde_json::from_str(&text) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!("ignoring unreadable MoE calibration {}: {e}", path.display());
            return None;
        }
    };
    if entry.key != key || entry.model.validate(variants).is_err() {
        return None;
    }
    Some(MoeCostModel { origin: "cache".into(), ..entry.model })
}

fn write_cache(path: &Path, key: &str, model: &MoeCostModel) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(&CacheEntry { key: key.into(), model: model.clone() })
        .map_err(|e| WorkerError::Config(format!("MoE calibration: {e}")))?;
    // Write then rename, so a reader never sees half a file.
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Replaces model entries by the config's entries of the same variant (or adds them).
fn apply_overrides(model: &mut MoeCostModel, overrides: &[sieve_kernels::moe::VariantCost]) {
    for o in overrides {
        match model.variants.iter_mut().find(|c| c.variant == o.variant) {
            Some(c) => *c = o.clone(),
            None => model.variants.push(o.clone()),
        }
    }
}

/// Sets the MoE policy of `model` from the config; `None` for a dense model. `default_cache`
/// is used when `cfg.cache_dir` is empty.
pub fn configure<B: Backend>(
    backend: &B,
    model: &mut Model<B>,
    model_name: &str,
    cfg: &MoeSection,
    default_cache: &Path,
) -> Result<Option<MoeSetup>> {
    let Some(moe) = model.config.moe.clone() else { return Ok(None) };
    let variants = backend.moe_variants();
    let experts = moe.num_experts;
    let setup = |policy: &str, fixed: Option<String>, cost_model: Option<MoeCostModel>, source: String| MoeSetup {
        thresholds: cost_model.as_ref().map(|m| m.thresholds(&variants, experts, 512)).unwrap_or_default(),
        variants: variants.clone(),
        policy: policy.into(),
        fixed_variant: fixed,
        cost_model,
        cost_source: source,
        autotune: None,
        cache_file: None,
    };
    if let Some(name) = cfg.variant.fixed() {
        let policy = MoePolicy::fixed_by_name(backend, name)?;
        model.set_moe_policy(backend, policy)?;
        tracing::info!(variant = name, "MoE layers run one fixed variant");
        return Ok(Some(setup("fixed", Some(name.to_string()), None, "config".into())));
    }
    if cfg.policy == MoePolicyKind::PaddingRatio {
        let mut padded: Vec<&MoeVariant> = variants.iter().filter(|v| v.padded).collect();
        padded.sort_by_key(|v| std::cmp::Reverse(v.tile_rows));
        let (large, small) = match (padded.first(), padded.last()) {
            (Some(l), Some(s)) if l.tile_rows > s.tile_rows => (*l, *s),
            _ => {
                return Err(WorkerError::Config(format!(
                    "moe.policy padding_ratio needs two padded variants with different tiles; {} has none",
                    backend.name()
                )))
            }
        };
        let m = MoeCostModel::padding_ratio_rule(large.name, small.name, cfg.padding_ratio_threshold);
        model.set_moe_policy(backend, MoePolicy::Auto(m.clone()))?;
        tracing::info!(
            large = large.name,
            small = small.name,
            threshold = cfg.padding_ratio_threshold,
            "MoE selector: padding-ratio rule"
        );
        return Ok(Some(setup(MoePolicyKind::PaddingRatio.name(), None, Some(m), "padding_ratio_rule".into())));
    }
    let key = cache_key(backend, model_name, model);
    let dir = if cfg.cache_dir.is_empty() { default_cache.to_path_buf() } else { PathBuf::from(&cfg.cache_dir) };
    let path = cache_file(&dir, &key);
    let mut report = None;
    let mut cost = match read_cache(&path, &key, &variants) {
        Some(m) => {
            tracing::info!(file = %path.display(), "MoE cost model from the calibration cache");
            m
        }
        None if cfg.autotune => {
            let Some(layer) = model.moe_layers().next() else {
                return Err(WorkerError::Config("a MoE config without MoE layers".into()));
            };
            let budget = Duration::from_millis(cfg.autotune_budget_ms);
            let (m, r) = backend.moe_autotune(&layer.weights, layer.routing, layer.num_experts, budget)?;
            tracing::info!(
                seconds = format!("{:.2}", r.seconds),
                samples = r.samples,
                knots = r.knots_measured,
                "MoE autotune done"
            );
            if let Err(e) = write_cache(&path, &key, &m) {
                tracing::warn!("cannot cache the MoE calibration at {}: {e}", path.display());
            }
            report = Some(r);
            m
        }
        None => {
            tracing::info!("MoE autotune off and nothing cached: the backend's default cost model");
            backend.moe_default_cost(model.config.hidden, moe.expert_intermediate)
        }
    };
    let mut source = cost.origin.clone();
    if !cfg.cost.is_empty() {
        apply_overrides(&mut cost, &cfg.cost);
        source.push_str("+config");
        cost.origin = source.clone();
    }
    model.set_moe_policy(backend, MoePolicy::Auto(cost.clone()))?;
    let mut s = setup(MoePolicyKind::CostModel.name(), None, Some(cost), source);
    s.autotune = report;
    s.cache_file = Some(path);
    Ok(Some(s))
}

impl MoeSetup {
    /// The `/stats` view of the setup.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "policy": self.policy,
            "fixed_variant": self.fixed_variant,
            "variants": self.variants,
            "cost_source": self.cost_source,
            "cost_model": self.cost_model,
            "thresholds": self.thresholds,
            "autotune": self.autotune,
            "cache_file": self.cache_file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_assets::TempDir;
    use crate::model::tests::{random_source, tiny_moe_config};
    use crate::model::{Arch, HeadSpec};
    use sieve_kernels::CpuBackend;

    fn tiny(cpu: &CpuBackend) -> Model<CpuBackend> {
        let c = tiny_moe_config(Arch::Qwen3Moe);
        Model::load(cpu, &random_source(&c, 5), c, HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap()
    }

    #[test]
    fn autotune_once_then_the_cache_and_overrides() {
        let cpu = CpuBackend::new(2).unwrap();
        let dir = TempDir::new("moe-cache");
        let mut m = tiny(&cpu);
        let cfg = MoeSection { autotune_budget_ms: 300, ..Default::default() };
        let first = configure(&cpu, &mut m, "tiny", &cfg, dir.path()).unwrap().unwrap();
        assert_eq!(first.cost_source, "autotune");
        assert!(first.autotune.is_some());
        let file = first.cache_file.clone().unwrap();
        assert!(file.is_file(), "calibration cached at {}", file.display());
        assert!(matches!(m.moe_policy(), MoePolicy::Auto(c) if c.origin == "autotune"));
        assert!(!first.thresholds.is_empty());
        // A second start-up reads the cache instead of measuring, even with autotune off.
        let mut m2 = tiny(&cpu);
        let off = MoeSection { autotune: false, ..cfg.clone() };
        let second = configure(&cpu, &mut m2, "tiny", &off, dir.path()).unwrap().unwrap();
        assert_eq!(second.cost_source, "cache");
        assert!(second.autotune.is_none());
        // (JSON keeps f64s to the last digit or so.)
        for (a, b) in
            second.cost_model.as_ref().unwrap().variants.iter().zip(&first.cost_model.as_ref().unwrap().variants)
        {
            assert_eq!(a.variant, b.variant);
            assert!(
                a.per_expert.iter().zip(&b.per_expert).all(|(x, y)| (x - y).abs() <= 1e-12 * y.abs()),
                "{a:?} vs {b:?}"
            );
        }
        // Another model name is another key: not cached, autotune off → the default model.
        let other = configure(&cpu, &mut m2, "other", &off, dir.path()).unwrap().unwrap();
        assert_eq!(other.cost_source, "default");
        // Config entries replace the calibrated ones.
        let forced = sieve_kernels::moe::VariantCost {
            variant: "padded64".into(),
            per_call: 0.0,
            per_expert: vec![0.0],
            per_row: 0.0,
            per_padded_row: 0.0,
        };
        let over = MoeSection { cost: vec![forced.clone()], ..off };
        let s = configure(&cpu, &mut m2, "tiny", &over, dir.path()).unwrap().unwrap();
        assert_eq!(s.cost_source, "cache+config");
        assert!(s.cost_model.unwrap().variants.contains(&forced));
        assert!(
            s.thresholds.iter().all(|t| t.variant == "padded64"),
            "a free variant wins everywhere: {:?}",
            s.thresholds
        );
        // A corrupt cache file is ignored, not fatal.
        std::fs::write(&file, "{not json").unwrap();
        let mut m3 = tiny(&cpu);
        assert_eq!(
            configure(&cpu, &mut m3, "tiny", &MoeSection { autotune: false, ..Default::default() }, dir.path())
                .unwrap()
                .unwrap()
                .cost_source,
            "default"
        );
    }

    #[test]
    fn fixed_variant_and_padding_rule_from_config() {
        let cpu = CpuBackend::new(1).unwrap();
        let dir = TempDir::new("moe-cache");
        let mut m = tiny(&cpu);
        let s = configure(
            &cpu,
            &mut m,
            "tiny",
            &MoeSection { variant: "small_m".parse().unwrap(), ..Default::default() },
            dir.path(),
        )
        .unwrap()
        .unwrap();
        assert_eq!((s.policy.as_str(), s.fixed_variant.as_deref()), ("fixed", Some("small_m")));
        assert_eq!(m.moe_policy(), &MoePolicy::Fixed(1));
        let err = configure(
            &cpu,
            &mut m,
            "tiny",
            &MoeSection { variant: "bm64".parse().unwrap(), ..Default::default() },
            dir.path(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("small_m"), "{err}");
        let s = configure(
            &cpu,
            &mut m,
            "tiny",
            &MoeSection { policy: MoePolicyKind::PaddingRatio, padding_ratio_threshold: 2.0, ..Default::default() },
            dir.path(),
        )
        .unwrap()
        .unwrap();
        let rule = s.cost_model.unwrap();
        assert_eq!(rule, MoeCostModel::padding_ratio_rule("padded128", "padded64", 2.0));
        // Rows per expert ≥ 64 keep the 128 tile (ratio ≤ 2), fewer switch to 64.
        assert_eq!(s.thresholds.first().unwrap().variant, "padded64");
        assert_eq!(s.thresholds.iter().find(|t| t.variant == "padded128").unwrap().from_rows, 64);
        // Dense models have no MoE setup.
        let c = crate::model::tests::tiny_config(Arch::Qwen3);
        let mut dense = Model::load(&cpu, &random_source(&c, 1), c, HeadSpec::YesNo { yes: 5, no: 9 }, false).unwrap();
        assert!(configure(&cpu, &mut dense, "dense", &MoeSection::default(), dir.path()).unwrap().is_none());
    }
}
