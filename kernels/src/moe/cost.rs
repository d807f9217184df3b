//! The cost model: per-variant predicted seconds from a token-per-expert histogram, and the
//! selection of the cheapest variant (near-ties to the one listed first).

use serde::{Deserialize, Serialize};

use super::MoeVariant;
use crate::error::{KernelError, Result};

/// Rows per expert at which [`VariantCost::per_expert`] is given.
pub const COST_KNOTS: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/// Predicted cost of one variant, in seconds:
/// `per_call + Σ_{experts with n > 0} per_expert(c(n)) + per_row · rows + per_padded_row · padded_rows`,
/// where `c(n)` is the rows the variant computes for an expert holding n (n, or n rounded up to
/// the tile for padded variants: their cost steps with every tile) and `per_expert` is linear
/// between [`COST_KNOTS`] and extrapolated past the last knot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantCost {
    pub variant: String,
    #[serde(default)]
    pub per_call: f64,
    /// Seconds per expert computing `COST_KNOTS[i]` rows (empty: no per-expert term).
    #[serde(default)]
    pub per_expert: Vec<f64>,
    #[serde(default)]
    pub per_row: f64,
    #[serde(default)]
    pub per_padded_row: f64,
}

impl VariantCost {
    /// `per_expert` at `n` rows (`n ≥ 1`).
    pub fn expert_cost(&self, n: u32) -> f64 {
        let t = &self.per_expert;
        if t.is_empty() || n == 0 {
            return 0.0;
        }
        let knots = &COST_KNOTS[..t.len()];
        let last = t.len() - 1;
        if n <= knots[0] || last == 0 {
            return t[0];
        }
        let i = match knots.iter().position(|&k| k >= n) {
            Some(i) => i,
            None => last, // past the last knot: extrapolate the last segment
        };
        let (k0, k1) = (knots[i - 1] as f64, knots[i] as f64);
        t[i - 1] + (t[i] - t[i - 1]) * (n as f64 - k0) / (k1 - k0)
    }

    pub fn predict(&self, hist: &[u32], variant: &MoeVariant) -> f64 {
        let mut cost = self.per_call;
        let (mut rows, mut padded) = (0u64, 0u64);
        for &n in hist.iter().filter(|&&n| n > 0) {
            let computed = variant.computed_rows(n);
            cost += self.expert_cost(computed.min(u32::MAX as u64) as u32);
            rows += n as u64;
            padded += computed;
        }
        cost + self.per_row * rows as f64 + self.per_padded_row * padded as f64
    }
}

/// Per-variant costs, for the backend's variants or a subset: a variant the model does not list
/// is never chosen. The list is in order of preference: the selector runs the first variant whose
/// prediction is within `tie_margin` (relative) of the cheapest — predictions that close are
/// within the calibration's noise, and the generally cheaper variant is the safer bet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeCostModel {
    pub variants: Vec<VariantCost>,
    /// Where the figures came from: `autotune`, `cache`, `default`, `config`, `padding_ratio_rule`.
    #[serde(default)]
    pub origin: String,
    #[serde(default)]
    pub tie_margin: f64,
}

impl MoeCostModel {
    /// The GPU rule: the `large` tile (BLOCK_M 128) unless its padded rows exceed `threshold` ×
    /// the real rows, then the `small` one (BLOCK_M 64). As costs: `large` = padded rows at its
    /// tile, `small` = threshold × real rows.
    pub fn padding_ratio_rule(large: &str, small: &str, threshold: f64) -> Self {
        MoeCostModel {
            variants: vec![
                VariantCost {
                    variant: large.into(),
                    per_call: 0.0,
                    per_expert: vec![],
                    per_row: 0.0,
                    per_padded_row: 1.0,
                },
                VariantCost {
                    variant: small.into(),
                    per_call: 0.0,
                    per_expert: vec![],
                    per_row: threshold,
                    per_padded_row: 0.0,
                },
            ],
            origin: "padding_ratio_rule".into(),
            tie_margin: 0.0,
        }
    }

    /// The threshold of a model that is the padding-ratio rule for `large` / `small` (as
    /// [`MoeCostModel::padding_ratio_rule`] builds it, or scaled): `large` costed by padded rows
    /// only, `small` by real rows only. `None` for any other model. A device backend whose
    /// selector runs on the device (no host round trip per layer) evaluates only this rule.
    pub fn padding_threshold(&self, large: &str, small: &str) -> Option<f64> {
        let [a, b] = &self.variants[..] else { return None };
        let (l, s) = match (a.variant.as_str(), b.variant.as_str()) {
            (x, y) if x == large && y == small => (a, b),
            (x, y) if x == small && y == large => (b, a),
            _ => return None,
        };
        let only = |c: &VariantCost, per_row: bool| {
            c.per_call == 0.0
                && c.per_expert.is_empty()
                && if per_row {
                    c.per_padded_row == 0.0 && c.per_row > 0.0
                } else {
                    c.per_row == 0.0 && c.per_padded_row > 0.0
                }
        };
        (only(l, false) && only(s, true)).then(|| s.per_row / l.per_padded_row)
    }

    /// Checks that every entry names one of `variants` (once) and has a usable table.
    pub fn validate(&self, variants: &[MoeVariant]) -> Result<()> {
        if self.variants.is_empty() {
            return Err(KernelError::Unsupported("moe cost model lists no variant".into()));
        }
        if !(self.tie_margin.is_finite() && (0.0..1.0).contains(&self.tie_margin)) {
            return Err(KernelError::Unsupported(format!(
                "moe cost model: tie_margin {} (0 ≤ margin < 1)",
                self.tie_margin
            )));
        }
        for (i, c) in self.variants.iter().enumerate() {
            if !variants.iter().any(|v| v.name == c.variant) {
                let names: Vec<&str> = variants.iter().map(|v| v.name).collect();
                return Err(KernelError::Unsupported(format!(
                    "moe cost model: unknown variant '{}' (this backend has {names:?})",
                    c.variant
                )));
            }
            if self.variants[..i].iter().any(|d| d.variant == c.variant) {
                return Err(KernelError::Unsupported(format!("moe cost model: variant '{}' listed twice", c.variant)));
            }
            if c.per_expert.len() > COST_KNOTS.len() {
                return Err(KernelError::Unsupported(format!(
                    "moe cost model: '{}' has {} per_expert values (at most {})",
                    c.variant,
                    c.per_expert.len(),
                    COST_KNOTS.len()
                )));
            }
            let all = [c.per_call, c.per_row, c.per_padded_row].into_iter().chain(c.per_expert.iter().copied());
            if all.into_iter().any(|x| !x.is_finite()) {
                return Err(KernelError::Unsupported(format!("moe cost model: '{}' has a non-finite cost", c.variant)));
            }
        }
        Ok(())
    }

    /// Predicted seconds of each listed variant: `(index into variants, cost)`, in list order.
    pub fn predictions(&self, hist: &[u32], variants: &[MoeVariant]) -> Vec<(usize, f64)> {
        self.variants
            .iter()
            .filter_map(|c| {
                variants.iter().position(|v| v.name == c.variant).map(|i| (i, c.predict(hist, &variants[i])))
            })
            .collect()
    }

    /// The variant to run (index into `variants`): the first listed whose predicted cost is
    /// within `tie_margin` of the lowest; 0 if the model lists none of `variants`.
    pub fn select(&self, hist: &[u32], variants: &[MoeVariant]) -> usize {
        let predictions = self.predictions(hist, variants);
        let lowest = predictions.iter().map(|&(_, c)| c).fold(f64::INFINITY, f64::min);
        predictions.iter().find(|&&(_, c)| c <= lowest * (1.0 + self.tie_margin)).map_or(0, |&(i, _)| i)
    }

    /// Where the choice changes for evenly spread histograms (`experts` experts holding `n` rows
    /// each, n = 1..=max_rows): the readable thresholds of the model.
    pub fn thresholds(&self, variants: &[MoeVariant], experts: usize, max_rows: u32) -> Vec<ChoiceRange> {
        let mut out: Vec<ChoiceRange> = Vec::new();
        for n in 1..=max_rows {
            let hist = vec![n; experts.max(1)];
            let v = variants[self.select(&hist, variants)].name;
            match out.last_mut() {
                Some(r) if r.variant == v => r.to_rows = n,
                _ => out.push(ChoiceRange { variant: v, from_rows: n, to_rows: n }),
            }
        }
        out
    }
}

/// "Rows per expert in `from_rows..=to_rows` choose `variant`" (evenly spread histograms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChoiceRange {
    pub variant: &'static str,
    pub from_rows: u32,
    pub to_rows: u32,
}

/// How the start-up calibration went.
#[derive(Debug, Clone, Serialize)]
pub struct AutotuneReport {
    pub seconds: f64,
    /// Timed runs.
    pub samples: usize,
    /// Knots measured for every variant; the rest were extrapolated when the budget ran out.
    pub knots_measured: usize,
    pub complete: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variants() -> Vec<MoeVariant> {
        vec![
            MoeVariant { name: "bm128", tile_rows: 128, padded: true, description: "" },
            MoeVariant { name: "bm64", tile_rows: 64, padded: true, description: "" },
            MoeVariant { name: "exact", tile_rows: 128, padded: false, description: "" },
            MoeVariant { name: "small", tile_rows: 3, padded: false, description: "" },
        ]
    }

    #[test]
    fn padded_variants_cost_whole_tiles() {
        let vs = variants();
        // Linear in computed rows: 1 per row.
        let per_row: Vec<f64> = COST_KNOTS.iter().map(|&k| k as f64).collect();
        let c = VariantCost {
            variant: "bm128".into(),
            per_call: 0.0,
            per_expert: per_row,
            per_row: 0.0,
            per_padded_row: 0.0,
        };
        assert_eq!(c.predict(&[1], &vs[0]), 128.0);
        assert_eq!(c.predict(&[129], &vs[0]), 256.0);
        assert_eq!(c.predict(&[300], &vs[0]), 384.0);
        assert_eq!(c.predict(&[300], &vs[2]), 300.0);
    }

    #[test]
    fn near_ties_go_to_the_variant_listed_first() {
        let vs = variants();
        let flat = |name: &str, t: f64| VariantCost {
            variant: name.into(),
            per_call: 0.0,
            per_expert: vec![t],
            per_row: 0.0,
            per_padded_row: 0.0,
        };
        let mut m = MoeCostModel {
            variants: vec![flat("exact", 1.02), flat("small", 1.0)],
            origin: "test".into(),
            tie_margin: 0.03,
        };
        assert_eq!(vs[m.select(&[5, 5], &vs)].name, "exact");
        m.tie_margin = 0.0;
        assert_eq!(vs[m.select(&[5, 5], &vs)].name, "small");
        m.tie_margin = 1.5;
        assert!(m.validate(&vs).is_err());
    }

    #[test]
    fn padding_ratio_rule_is_the_gpu_threshold() {
        let vs = variants();
        let m = MoeCostModel::padding_ratio_rule("bm128", "bm64", 1.5);
        m.validate(&vs).unwrap();
        assert_eq!(m.padding_threshold("bm128", "bm64"), Some(1.5));
        assert_eq!(m.padding_threshold("bm64", "bm128"), None);
        let mut calibrated = m.clone();
        calibrated.variants[0].per_expert = vec![1.0];
        assert_eq!(calibrated.padding_threshold("bm128", "bm64"), None, "a per-expert table is not the rule");
        // 10 experts × 100 rows: padded 1280 / real 1000 = 1.28 ≤ 1.5 → bm128.
        assert_eq!(vs[m.select(&[100; 10], &vs)].name, "bm128");
        // 10 experts × 30 rows: 1280 / 300 = 4.3 → bm64.
        assert_eq!(vs[m.select(&[30; 10], &vs)].name, "bm64");
        // Exactly at the threshold (ratio 1.5: 3 × 128 padded over 256 real rows) the large tile stays.
        assert_eq!(vs[m.select(&[128, 64, 64, 0], &vs)].name, "bm128");
        assert_eq!(vs[m.select(&[128, 64, 63, 0], &vs)].name, "bm64");
        // A variant the model does not list is never chosen.
        assert!(m.predictions(&[5], &vs).iter().all(|&(i, _)| vs[i].name != "exact"));
    }

    #[test]
    fn per_expert_costs_interpolate_and_extrapolate() {
        let c = VariantCost {
            variant: "exact".into(),
            per_call: 1.0,
            per_expert: vec![10.0, 12.0, 16.0],
            per_row: 0.0,
            per_padded_row: 0.0,
        };
        assert_eq!(c.expert_cost(0), 0.0);
        assert_eq!(c.expert_cost(1), 10.0);
        assert_eq!(c.expert_cost(3), 14.0);
        assert_eq!(c.expert_cost(6), 20.0); // past knot 4: slope 2 per row
        let vs = variants();
        assert_eq!(c.predict(&[0, 1, 4, 0], &vs[2]), 1.0 + 10.0 + 16.0);
    }

    #[test]
    fn selection_follows_the_cheapest_prediction_and_thresholds_show_it() {
        let vs = variants();
        // "small" cheap per expert but steep per row; "exact" the other way round.
        let m = MoeCostModel {
            variants: vec![
                VariantCost {
                    variant: "small".into(),
                    per_call: 0.0,
                    per_expert: vec![1.0, 2.0, 4.0, 8.0, 16.0],
                    per_row: 0.0,
                    per_padded_row: 0.0,
                },
                VariantCost {
                    variant: "exact".into(),
                    per_call: 0.0,
                    per_expert: vec![3.0, 4.0, 6.0, 10.0, 14.0],
                    per_row: 0.0,
                    per_padded_row: 0.0,
                },
            ],
            origin: "test".into(),
            tie_margin: 0.0,
        };
        m.validate(&vs).unwrap();
        assert_eq!(vs[m.select(&[2; 8], &vs)].name, "small");
        assert_eq!(vs[m.select(&[16; 8], &vs)].name, "exact");
        // 1 hot expert, many cold ones: summed per expert.
        let mut hist = vec![1u32; 20];
        hist[0] = 16;
        assert_eq!(vs[m.select(&hist, &vs)].name, "small");
        let t = m.thresholds(&vs, 8, 20);
        assert_eq!(t[0].variant, "small");
        assert_eq!(t.last().unwrap().variant, "exact");
        assert_eq!(t[0].to_rows + 1, t[1].from_rows);
        // Invalid models are refused with the reason.
        let mut bad = m.clone();
        bad.variants[0].variant = "bm32".into();
        assert!(bad.validate(&vs).unwrap_err().to_string().contains("bm32"));
        let mut bad = m.clone();
        bad.variants[1].per_row = f64::NAN;
        assert!(bad.validate(&vs).is_err());
    }
}
