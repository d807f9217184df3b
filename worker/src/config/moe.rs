//! The `[moe]` section of the worker config, typed: `policy` and `variant` are enums, parsed
//! once by serde, so a bad value is refused when the file is read, with the value named and the
//! allowed ones listed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sieve_kernels::cpu::CpuMoeVariant;
use sieve_kernels::cuda::moe::CudaMoeVariant;
use sieve_kernels::moe::{BackendVariant, VariantCost};
use sieve_kernels::reference::ReferenceMoeVariant;

use crate::{Result, WorkerError};

/// How MoE layers choose their grouped-GEMM variant (ignored for dense models).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MoeSection {
    /// `auto` (the selector, per layer and pass) or the name of a variant to always run (one of
    /// the device's: it is checked against the loaded backend at start-up).
    pub variant: MoeVariantSetting,
    /// `cost_model` (per-variant costs, calibrated) or `padding_ratio` (the GPU rule over the
    /// backend's padded variants: the smaller tile when padded / real rows > threshold).
    pub policy: MoePolicyKind,
    pub padding_ratio_threshold: f64,
    /// Measure the variants at start-up unless a calibration for this model and machine is
    /// cached (`--no-autotune`: never measure; a cached calibration is still used).
    pub autotune: bool,
    pub autotune_budget_ms: u64,
    /// Where calibrations are cached; empty = `<asset cache>/moe-autotune`.
    pub cache_dir: String,
    /// Cost entries that replace the calibrated ones of the same variant (`[[moe.cost]]`).
    pub cost: Vec<VariantCost>,
}

impl Default for MoeSection {
    fn default() -> Self {
        MoeSection {
            variant: MoeVariantSetting::Auto,
            policy: MoePolicyKind::CostModel,
            padding_ratio_threshold: 1.5,
            autotune: true,
            autotune_budget_ms: 30_000,
            cache_dir: String::new(),
            cost: Vec::new(),
        }
    }
}

impl MoeSection {
    /// What serde cannot check: the threshold's range.
    pub fn validate(&self) -> Result<()> {
        let t = self.padding_ratio_threshold;
        if !(t.is_finite() && t >= 1.0) {
            return Err(WorkerError::Config(format!("moe.padding_ratio_threshold {t} must be a number ≥ 1")));
        }
        Ok(())
    }
}

/// `moe.policy`: how an `auto` MoE layer chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoePolicyKind {
    /// The cheapest variant by a cost model (calibrated at start-up, cached).
    #[default]
    CostModel,
    /// The GPU rule over the backend's two padded variants.
    PaddingRatio,
}

impl MoePolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            MoePolicyKind::CostModel => "cost_model",
            MoePolicyKind::PaddingRatio => "padding_ratio",
        }
    }
}

/// `moe.variant`: `auto`, or one variant of one of the backends by its name. Which backend runs
/// is a separate setting (`model.device`), so any backend's name parses here and the loaded
/// backend refuses a name that is not its own at start-up, listing its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum MoeVariantSetting {
    /// The selector (per layer and pass, from the live histogram).
    #[default]
    Auto,
    Cpu(CpuMoeVariant),
    Cuda(CudaMoeVariant),
    Reference(ReferenceMoeVariant),
}

impl MoeVariantSetting {
    /// The fixed variant's name; `None` for `auto`.
    pub fn fixed(self) -> Option<&'static str> {
        match self {
            MoeVariantSetting::Auto => None,
            MoeVariantSetting::Cpu(v) => Some(v.name()),
            MoeVariantSetting::Cuda(v) => Some(v.name()),
            MoeVariantSetting::Reference(v) => Some(v.name()),
        }
    }

    /// Every accepted value, as the config spells it.
    pub fn allowed() -> Vec<&'static str> {
        let mut names = vec!["auto"];
        names.extend(CpuMoeVariant::names());
        names.extend(CudaMoeVariant::names());
        names.extend(ReferenceMoeVariant::names());
        names
    }
}

impl FromStr for MoeVariantSetting {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(MoeVariantSetting::Auto);
        }
        CpuMoeVariant::from_name(s)
            .map(MoeVariantSetting::Cpu)
            .or_else(|_| CudaMoeVariant::from_name(s).map(MoeVariantSetting::Cuda))
            .or_else(|_| ReferenceMoeVariant::from_name(s).map(MoeVariantSetting::Reference))
            .map_err(|_| format!("moe.variant '{s}' is not a variant (one of {})", Self::allowed().join(", ")))
    }
}

impl TryFrom<String> for MoeVariantSetting {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<MoeVariantSetting> for String {
    fn from(v: MoeVariantSetting) -> String {
        v.to_string()
    }
}

impl fmt::Display for MoeVariantSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.fixed().unwrap_or("auto"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

    #[test]
    fn moe_cost_overrides_parse_and_bad_moe_settings_are_refused() {
        let c: WorkerConfig = toml::from_str(
            "[moe]\nvariant = \"grouped\"\nautotune = false\n[[moe.cost]]\nvariant = \"small_m\"\nper_expert = [1e-4, 2e-4]\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.moe.variant, MoeVariantSetting::Cpu(CpuMoeVariant::Grouped));
        assert_eq!(c.moe.cost[0].per_expert, vec![1e-4, 2e-4]);
        let c: WorkerConfig = toml::from_str("[moe]\npadding_ratio_threshold = 0.5\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("padding_ratio_threshold"));
        assert!(toml::from_str::<WorkerConfig>("[[moe.cost]]\nvariant = \"x\"\nper_exprt = []\n").is_err());
    }

    #[test]
    fn policy_and_variant_accept_the_documented_names_and_name_a_bad_one() {
        for (text, want) in [("cost_model", MoePolicyKind::CostModel), ("padding_ratio", MoePolicyKind::PaddingRatio)] {
            let c: WorkerConfig = toml::from_str(&format!("[moe]\npolicy = \"{text}\"\n")).unwrap();
            assert_eq!((c.moe.policy, c.moe.policy.name()), (want, text));
        }
        let err = toml::from_str::<WorkerConfig>("[moe]\npolicy = \"fastest\"\n").unwrap_err().to_string();
        assert!(err.contains("fastest") && err.contains("cost_model") && err.contains("padding_ratio"), "{err}");
        // Every variant of every backend, and auto, round-trips through its name.
        let names = MoeVariantSetting::allowed();
        for n in [
            "auto",
            "grouped",
            "small_m",
            "expert_gemm",
            "padded64",
            "padded128",
            "grouped_bf16",
            "bm128",
            "bm64",
            "per_token",
        ] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        assert_eq!(names.len(), 10);
        for n in names {
            let c: WorkerConfig = toml::from_str(&format!("[moe]\nvariant = \"{n}\"\n")).unwrap();
            assert_eq!(c.moe.variant.to_string(), n);
            assert_eq!(c.moe.variant.fixed().is_none(), n == "auto");
        }
        let err = toml::from_str::<WorkerConfig>("[moe]\nvariant = \"tile99\"\n").unwrap_err().to_string();
        assert!(err.contains("'tile99'") && err.contains("grouped_bf16") && err.contains("bm64"), "{err}");
        assert!(toml::from_str::<WorkerConfig>("[moe]\nvariant = \"\"\n").is_err(), "empty is not a variant");
    }
}
