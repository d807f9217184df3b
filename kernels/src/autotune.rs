//! The start-up calibration of a [`MoeCostModel`] (`Backend::moe_autotune` of the CPU and
//! reference backends), apart from `moe/` because it drives a [`Backend`]: every variant timed on evenly spread
//! histograms at each of [`COST_KNOTS`] rows per expert, interleaved and paired so that the load
//! of shared cores cancels out, the large knots fitted by a line ([`fit_affine_tail`]).

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{KernelError, Result};
use crate::moe::{AutotuneReport, MoeCostModel, MoeVariant, VariantCost, COST_KNOTS};

/// Rows per expert from which a variant's per-expert cost is affine in the rows it computes:
/// past the first few rows the weights' streaming is amortised and each further row costs the
/// same FMAs, so the measured knots there are fitted by one line instead of being taken one by
/// one. That averages the timing noise of the large knots (a few % per knot on shared cores),
/// which is exactly where the f32 and bf16 kernels differ by only 0–5%.
pub const AFFINE_FROM_ROWS: u32 = 64;

/// The measured knots (`(index, seconds)`, ascending) with those at ≥ [`AFFINE_FROM_ROWS`] rows
/// replaced by their least-squares line in relative error (when there are at least three).
// `!(x > 0.0)` is deliberate: it also refuses NaN timings.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn fit_affine_tail(measured: &[(usize, f64)]) -> Vec<(usize, f64)> {
    let tail: Vec<(f64, f64)> = measured
        .iter()
        .filter(|&&(ki, _)| COST_KNOTS[ki] >= AFFINE_FROM_ROWS)
        .map(|&(ki, t)| (COST_KNOTS[ki] as f64, t))
        .collect();
    if tail.len() < 3 || tail.iter().any(|&(_, t)| !(t > 0.0)) {
        return measured.to_vec();
    }
    // Minimise Σ ((a + b·n − t) / t)²: weights 1/t², normal equations of the 2×2 system.
    let (mut sw, mut sn, mut snn, mut st, mut snt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(n, t) in &tail {
        let w = 1.0 / (t * t);
        sw += w;
        sn += w * n;
        snn += w * n * n;
        st += w * t;
        snt += w * n * t;
    }
    let det = sw * snn - sn * sn;
    if !(det.abs() > 0.0) {
        return measured.to_vec();
    }
    let b = ((sw * snt - sn * st) / det).max(0.0);
    let a = (st - b * sn) / sw;
    measured
        .iter()
        .map(
            |&(ki, t)| {
                if COST_KNOTS[ki] >= AFFINE_FROM_ROWS {
                    (ki, (a + b * COST_KNOTS[ki] as f64).max(0.0))
                } else {
                    (ki, t)
                }
            },
        )
        .collect()
}

/// A full table over [`COST_KNOTS`] from the knots measured (`(index, seconds)`, ascending, at
/// least one): spikes cleaned ([`monotone`]), knots before the first measured one take its
/// value, knots between measured ones are interpolated, and knots past the last are extrapolated
/// along the last measured segment (cost per extra row; flat if only one knot was measured).
fn fill_knots(measured: &[(usize, f64)]) -> Vec<f64> {
    let mut values: Vec<f64> = measured.iter().map(|&(_, t)| t).collect();
    monotone(&mut values);
    let at = |i: usize| COST_KNOTS[measured[i].0] as f64;
    COST_KNOTS
        .iter()
        .map(|&k| {
            let k = k as f64;
            let j = measured.iter().position(|&(ki, _)| COST_KNOTS[ki] as f64 >= k);
            match j {
                Some(0) => values[0],
                Some(j) => values[j - 1] + (values[j] - values[j - 1]) * (k - at(j - 1)) / (at(j) - at(j - 1)),
                None if values.len() >= 2 => {
                    let n = values.len();
                    let slope = ((values[n - 1] - values[n - 2]) / (at(n - 1) - at(n - 2))).max(0.0);
                    values[n - 1] + slope * (k - at(n - 1))
                }
                None => values[values.len() - 1],
            }
        })
        .collect()
}

/// Cleans a measured per-expert table of timing spikes: an expert with fewer rows never costs
/// more than one with more (true of every variant, padded ones included), so each knot is capped
/// by the knots after it, then the table is made non-decreasing.
fn monotone(t: &mut [f64]) {
    for i in (0..t.len().saturating_sub(1)).rev() {
        t[i] = t[i].min(t[i + 1]);
    }
    for i in 1..t.len() {
        t[i] = t[i].max(t[i - 1]);
    }
}

/// Relative difference under which two calibrated predictions count as a tie (the first listed
/// runs; within the margin either choice costs at most the margin). Small, because where the
/// fastest CPU kernels differ at all past ~150 rows per expert (f32 and bf16 panels, 0–4% apart,
/// either ahead) a larger margin would hand every such choice to the preferred variant. The
/// calibration itself is noisier than that on shared cores: the ratios between variants at a
/// knot repeat within 2% in most runs and are off by up to 20% in some
/// (`cargo run --release -p sieve-worker --example moe_calibration_repeat`).
pub const AUTOTUNE_TIE_MARGIN: f64 = 0.01;

/// A variant measured more than this much slower than the best at two consecutive knots, and
/// not closing in, is no longer timed at the larger knots (its table is extrapolated and kept at
/// least this much above the best there): it is out of the running, and timing it would spend
/// the budget on knots that decide nothing.
const AUTOTUNE_PRUNE_RATIO: f64 = 1.25;

/// Variants within this ratio of the best at the largest knot get the refinement rounds.
const AUTOTUNE_REFINE_WITHIN: f64 = 1.10;
/// Most refinement rounds (each: every contender once at every knot of the fitted line).
const AUTOTUNE_REFINE_ROUNDS: usize = 10;

/// Experts in a calibration sample of `computed` rows per expert: enough distinct experts that
/// their weights stream from memory and the threads share the work as in a real pass
/// (consecutive samples rotate through the layer's experts), and enough rows that one sample
/// takes tens of milliseconds (shorter samples are at the mercy of scheduler noise on shared
/// cores). At least 16 even at the largest knots: with only 2 experts (one per thread) the bf16
/// panels' smaller footprint made `grouped_bf16` look as fast as the f32 kernels at 300–600 rows
/// per expert, where a real pass over all experts measures it 5–12% slower.
fn sample_experts(num_experts: usize, computed_rows: u64) -> usize {
    const TARGET_ROWS: u64 = 8192;
    ((TARGET_ROWS / computed_rows.max(1)) as usize).clamp(16, 64).min(num_experts)
}

/// The median of `values` (mean of the middle two for an even count; infinite when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::INFINITY;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Keeps the tables of the variants no longer timed (`running[v]` false) at least
/// [`AUTOTUNE_PRUNE_RATIO`] × the cheapest running variant at the knots past their last timed
/// one (`last_timed[v]`, a knot index; `None`: never timed, so every knot): their extrapolation
/// is not evidence that they caught up.
fn floor_out_of_running(tables: &mut [Vec<f64>], running: &[bool], last_timed: &[Option<usize>]) {
    let floor: Vec<f64> = (0..COST_KNOTS.len())
        .map(|ki| {
            tables.iter().zip(running).filter(|(_, &r)| r).map(|(t, _)| t[ki]).fold(f64::INFINITY, f64::min)
                * AUTOTUNE_PRUNE_RATIO
        })
        .collect();
    for (vi, t) in tables.iter_mut().enumerate().filter(|(vi, _)| !running[*vi]) {
        for (ki, v) in t.iter_mut().enumerate().skip(last_timed[vi].map_or(0, |l| l + 1)) {
            if floor[ki].is_finite() {
                *v = v.max(floor[ki]);
            }
        }
    }
}

/// One knot's interleaved passes: per pass, `(variant, seconds per expert)` of the variants
/// timed back to back.
type Passes = Vec<Vec<(usize, f64)>>;

/// Every timed run of variant `v` in one knot's passes.
fn runs_of(passes: &[Vec<(usize, f64)>], v: usize) -> Vec<f64> {
    passes.iter().flat_map(|p| p.iter().filter(|&&(x, _)| x == v).map(|&(_, t)| t)).collect()
}

/// Per variant (of `variants`), its measured knots `(index, seconds per expert)` from the
/// interleaved passes timed at each knot (`passes`, per knot).
///
/// At each knot the variant with the lowest median is the reference and keeps its median; every
/// other variant timed in at least [`PAIRED_MIN_PASSES`] of the reference's passes gets the
/// reference's median × the median of its ratios to the reference *within a pass*. The load of
/// shared cores comes and goes over seconds, so it scales the runs of one pass alike: the ratio
/// within a pass cancels it, where the medians of separate runs keep whatever phase each variant
/// happened to hit. Those ratios of a few % are the close calls the selector makes past ~100
/// rows per expert.
fn paired_tables(variants: usize, passes: &[Passes]) -> Vec<Vec<(usize, f64)>> {
    let mut tables: Vec<Vec<(usize, f64)>> = vec![Vec::new(); variants];
    for (ki, passes) in passes.iter().enumerate().take(COST_KNOTS.len()) {
        let medians: Vec<Option<f64>> =
            (0..variants).map(|v| Some(runs_of(passes, v)).filter(|t| !t.is_empty()).map(|t| median(&t))).collect();
        let Some((reference, ref_median)) =
            medians.iter().enumerate().filter_map(|(v, m)| m.map(|m| (v, m))).min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            continue;
        };
        for (v, m) in medians.iter().enumerate() {
            let Some(m) = *m else { continue };
            let ratios: Vec<f64> = passes
                .iter()
                .filter_map(|pass| {
                    let of = |w: usize| pass.iter().find(|&&(x, _)| x == w).map(|&(_, t)| t);
                    Some(of(v)? / of(reference)?).filter(|r| r.is_finite())
                })
                .collect();
            let t = if v != reference && ratios.len() >= PAIRED_MIN_PASSES { ref_median * median(&ratios) } else { m };
            tables[v].push((ki, t));
        }
    }
    tables
}

/// Passes with both a variant and the reference for the paired estimate to replace the median.
const PAIRED_MIN_PASSES: usize = 3;

/// Calibrates a cost model for `weights` (one MoE layer of the loaded model) by timing every
/// variant of `backend` on evenly spread histograms at each of [`COST_KNOTS`] rows per expert,
/// smallest first. A padded variant is timed only at knots that are whole tiles (its table is by
/// computed rows; smaller knots take the first tile's cost). From [`AFFINE_FROM_ROWS`] on, a
/// variant's knots are fitted by a line ([`fit_affine_tail`]). A variant far behind the best and
/// not closing in stops being timed ([`AUTOTUNE_PRUNE_RATIO`]). When the next knot would overrun
/// `budget`, the remaining knots are extrapolated; budget left after the last knot buys more
/// repetitions of the close calls (the variants near the best at the largest knot, at the knots
/// of the fitted line).
///
/// Every timed run is set up as a real pass sees its experts (this is what keeps the fit honest):
/// - cold: each run takes experts not touched for many runs (the histograms rotate through the
///   layer's experts), so their weights come from memory. A real pass visits each of its experts
///   once per layer, out of hundreds of MB of expert weights, so it never finds them in cache.
///   Repeating a run on the same experts and keeping the minimum would instead time weights left
///   in L2/L3 by the previous repetition — and favour the variant with the smaller weights (the
///   bf16 panels: half the bytes fit where the f32 ones do not).
/// - interleaved: each repetition runs every variant once, so a burst of background load on the
///   shared cores hits the variants alike instead of one variant's repetitions.
/// - a knot's figure is the median of its repetitions, not the minimum: on shared cores single
///   runs come out both slower and (after the backend's run-queue correction) faster than the
///   cost; one such run made a padded variant look 35% cheaper than it is at 512 rows.
/// - paired: the other variants' figures at a knot are the cheapest one's × the median of their
///   ratios to it within a pass ([`paired_tables`]).
pub fn autotune<B: Backend>(
    backend: &B,
    weights: &B::MoeWeights,
    num_experts: usize,
    budget: Duration,
) -> Result<(MoeCostModel, AutotuneReport)> {
    let variants = backend.moe_variants();
    let t0 = Instant::now();
    const REPS: usize = 5;
    let timed_at = |v: &MoeVariant, n: u32| !v.padded || n.is_multiple_of(v.tile_rows.max(1));
    // Variants still timed, and per variant the consecutive timed knots it was out of the running.
    let mut running = vec![true; variants.len()];
    let mut behind = vec![0usize; variants.len()];
    let mut last_ratio = vec![f64::INFINITY; variants.len()];
    // Per knot, every timed run, as interleaved passes (one per repetition or refinement round).
    let mut passes: Vec<Passes> = vec![Vec::new(); COST_KNOTS.len()];
    // Rotate through the experts so that consecutive runs do not reuse cached weights.
    let mut first_expert = 0usize;
    let mut hist_for = |v: &MoeVariant, n: u32| -> (Vec<u32>, usize) {
        let a = sample_experts(num_experts, v.computed_rows(n));
        let mut hist = vec![0u32; num_experts];
        for i in 0..a {
            hist[(first_expert + i) % num_experts] = n;
        }
        first_expert = (first_expert + a) % num_experts;
        (hist, a)
    };
    // Warm-up: scratch buffers grown and pages touched before anything is timed.
    for (vi, v) in variants.iter().enumerate() {
        let (hist, _) = hist_for(v, 8);
        backend.moe_time_variant(weights, vi, &hist)?;
    }
    // One interleaved pass at knot `ki`: each of `timed` once, the order rotated by `rotate` (no
    // variant always runs right after the same one).
    let mut time_pass = |ki: usize, timed: &[usize], rotate: usize| -> Result<Vec<(usize, f64)>> {
        let mut pass = Vec::with_capacity(timed.len());
        for j in 0..timed.len() {
            let vi = timed[(j + rotate) % timed.len()];
            let (hist, a) = hist_for(&variants[vi], COST_KNOTS[ki]);
            pass.push((vi, backend.moe_time_variant(weights, vi, &hist)?.as_secs_f64() / a as f64));
        }
        Ok(pass)
    };
    let mut knots_measured = 0usize;
    let mut last_knot_seconds = 0.0f64;
    // Rows one knot's samples compute, over the variants still timed: its time scales with them.
    let knot_rows = |n: u32, running: &[bool]| -> f64 {
        let timed = variants.iter().zip(running).filter(|(v, &r)| r && timed_at(v, n));
        timed
            .map(|(v, _)| (sample_experts(num_experts, v.computed_rows(n)) as u64 * v.computed_rows(n)) as f64)
            .sum::<f64>()
            .max(1.0)
    };
    for (ki, &n) in COST_KNOTS.iter().enumerate() {
        let spent = t0.elapsed().as_secs_f64();
        let predicted = if ki == 0 {
            0.0
        } else {
            last_knot_seconds * knot_rows(n, &running) / knot_rows(COST_KNOTS[ki - 1], &running)
        };
        if ki >= 2 && spent + predicted > budget.as_secs_f64() {
            break;
        }
        let tk = Instant::now();
        let timed: Vec<usize> = (0..variants.len()).filter(|&vi| running[vi] && timed_at(&variants[vi], n)).collect();
        for rep in 0..REPS {
            let pass = time_pass(ki, &timed, rep)?;
            passes[ki].push(pass);
        }
        let cost: Vec<f64> = (0..variants.len()).map(|vi| median(&runs_of(&passes[ki], vi))).collect();
        let best = timed.iter().map(|&vi| cost[vi]).fold(f64::INFINITY, f64::min);
        for &vi in &timed {
            // Behind, and not catching up (a variant whose per-expert overhead is amortised as
            // the rows grow closes in on the best from far behind: that one stays).
            let ratio = cost[vi] / best;
            behind[vi] = if ratio > AUTOTUNE_PRUNE_RATIO && ratio >= last_ratio[vi] { behind[vi] + 1 } else { 0 };
            last_ratio[vi] = ratio;
            running[vi] = behind[vi] < 2;
        }
        last_knot_seconds = tk.elapsed().as_secs_f64();
        knots_measured = ki + 1;
    }
    // Refinement: the variants within AUTOTUNE_REFINE_WITHIN of the best at the largest knot
    // measured are timed again, interleaved, at the knots of the fitted line, while the budget
    // lasts. Those close calls are the choices the noise decides; the small knots, where the
    // variants differ by 2–10×, need no more.
    if knots_measured > 0 {
        let last = knots_measured - 1;
        let at_last: Vec<(usize, f64)> = (0..variants.len())
            .map(|vi| (vi, median(&runs_of(&passes[last], vi))))
            .filter(|&(_, c)| c.is_finite())
            .collect();
        let best = at_last.iter().map(|&(_, c)| c).fold(f64::INFINITY, f64::min);
        let contenders: Vec<usize> =
            at_last.iter().filter(|&&(_, c)| c <= best * AUTOTUNE_REFINE_WITHIN).map(|&(vi, _)| vi).collect();
        let knots: Vec<usize> = (0..knots_measured).filter(|&ki| COST_KNOTS[ki] >= AFFINE_FROM_ROWS).collect();
        let mut round_seconds = 0.0f64;
        for round in 0..AUTOTUNE_REFINE_ROUNDS {
            if contenders.len() < 2 || t0.elapsed().as_secs_f64() + round_seconds > budget.as_secs_f64() {
                break;
            }
            let tr = Instant::now();
            for &ki in &knots {
                let timed: Vec<usize> =
                    contenders.iter().copied().filter(|&vi| !runs_of(&passes[ki], vi).is_empty()).collect();
                let pass = time_pass(ki, &timed, round)?;
                passes[ki].push(pass);
            }
            round_seconds = tr.elapsed().as_secs_f64();
        }
    }
    let samples = passes.iter().flatten().map(Vec::len).sum();
    let tables = paired_tables(variants.len(), &passes);
    // A padded variant is timed only at knots that are whole tiles: when the budget ends before
    // the first of those (a slow or busy machine), it has no measurement at all. It is then
    // costed at the pruning floor everywhere (never chosen over a measured variant), not
    // extrapolated from nothing.
    let measured_last: Vec<Option<usize>> = tables.iter().map(|m| m.last().map(|&(ki, _)| ki)).collect();
    if measured_last.iter().all(Option::is_none) {
        return Err(KernelError::Unsupported("MoE autotune: no variant could be timed within the budget".into()));
    }
    let mut tables: Vec<Vec<f64>> = tables
        .iter()
        .map(
            |measured| {
                if measured.is_empty() {
                    vec![0.0; COST_KNOTS.len()]
                } else {
                    fill_knots(&fit_affine_tail(measured))
                }
            },
        )
        .collect();
    let running: Vec<bool> = running.iter().zip(&measured_last).map(|(&r, last)| r && last.is_some()).collect();
    floor_out_of_running(&mut tables, &running, &measured_last);
    let mut entries: Vec<VariantCost> = variants
        .iter()
        .zip(tables)
        .map(|(v, per_expert)| VariantCost {
            variant: v.name.to_string(),
            per_call: 0.0,
            per_expert,
            per_row: 0.0,
            per_padded_row: 0.0,
        })
        .collect();
    // In order of preference: the lowest geometric mean over the knots first.
    let log_mean = |c: &VariantCost| c.per_expert.iter().map(|t| t.max(1e-12).ln()).sum::<f64>();
    entries.sort_by(|a, b| log_mean(a).total_cmp(&log_mean(b)));
    let model = MoeCostModel { variants: entries, origin: "autotune".into(), tie_margin: AUTOTUNE_TIE_MARGIN };
    let report = AutotuneReport {
        seconds: t0.elapsed().as_secs_f64(),
        samples,
        knots_measured,
        complete: knots_measured == COST_KNOTS.len(),
    };
    Ok((model, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_filled_from_the_knots_measured() {
        // Measured at knots 64, 128, 256 (indices 6, 7, 8): earlier knots take the first value,
        // 512 is extrapolated along 128 → 256.
        let t = fill_knots(&[(6, 2.0), (7, 3.0), (8, 5.0)]);
        assert_eq!(&t[..7], &[2.0; 7]);
        assert_eq!(t[7..], [3.0, 5.0, 9.0]);
        // Knot 2 lies between knots 1 and 4 (values 1 and 3); knot 8 extends that segment.
        let t = fill_knots(&[(0, 1.0), (2, 3.0)]);
        assert!((t[1] - 5.0 / 3.0).abs() < 1e-12 && (t[3] - 17.0 / 3.0).abs() < 1e-12, "{t:?}");
        // One knot only: flat.
        assert_eq!(fill_knots(&[(3, 4.0)]), vec![4.0; COST_KNOTS.len()]);
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // knot indices name the knots in the messages
    fn large_knots_are_fitted_by_one_line() {
        // On a line already: unchanged. Knots 64.. are indices 6..=9.
        let on_line: Vec<(usize, f64)> = (3..10).map(|ki| (ki, 2.0 + 0.5 * COST_KNOTS[ki] as f64)).collect();
        for (a, b) in fit_affine_tail(&on_line).iter().zip(&on_line) {
            assert_eq!(a.0, b.0);
            assert!((a.1 - b.1).abs() < 1e-9 * b.1, "{a:?} vs {b:?}");
        }
        // ±5% noise on the large knots: the fit is a line through them, closer to the truth than
        // the worst knot, and the small knots are kept as measured.
        let truth = |ki: usize| 2.0 + 0.5 * COST_KNOTS[ki] as f64;
        let noisy: Vec<(usize, f64)> =
            (0..10).map(|ki| (ki, truth(ki) * if ki % 2 == 0 { 1.05 } else { 0.95 })).collect();
        let fit = fit_affine_tail(&noisy);
        assert_eq!(&fit[..6], &noisy[..6]);
        let slope = |i: usize, j: usize| (fit[j].1 - fit[i].1) / (COST_KNOTS[j] - COST_KNOTS[i]) as f64;
        assert!((slope(6, 7) - slope(8, 9)).abs() < 1e-9, "{fit:?}");
        for ki in 6..10 {
            assert!((fit[ki].1 / truth(ki) - 1.0).abs() < 0.05, "knot {ki}: {} vs {}", fit[ki].1, truth(ki));
        }
        // Fewer than three knots from 64 rows on: nothing to average, kept.
        let two = [(0, 1.0), (6, 9.0), (7, 20.0)];
        assert_eq!(fit_affine_tail(&two), two.to_vec());
    }

    #[test]
    fn paired_ratios_cancel_the_load_of_each_pass() {
        // Variant 1 costs 3% more than variant 0 in every pass, but background load hit variant
        // 0's runs of the last two passes and not variant 1's of the third: the medians of the
        // separate runs (1.2 vs 1.03) would rank variant 1 first.
        let factor = [1.0, 1.0, 1.4, 1.4];
        let passes: Passes =
            factor.iter().enumerate().map(|(p, &f)| vec![(0, f), (1, if p == 2 { 1.03 } else { 1.03 * f })]).collect();
        let mut by_knot = vec![Vec::new(); COST_KNOTS.len()];
        by_knot[8] = passes.clone();
        let tables = paired_tables(3, &by_knot);
        let (v0, v1) = (tables[0][0].1, tables[1][0].1);
        assert_eq!(tables[0].len(), 1);
        assert_eq!(tables[1][0].0, 8);
        assert!((v1 / v0 - 1.03).abs() < 1e-12, "paired: variant 1 at {} of variant 0", v1 / v0);
        // The reference is the cheaper by the medians (variant 1 here) and keeps its median.
        assert!((v1 - median(&runs_of(&passes, 1))).abs() < 1e-12);
        // A variant never timed has no knots.
        assert!(tables[2].is_empty());
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), f64::INFINITY);
    }

    #[test]
    fn variants_out_of_the_running_stay_behind() {
        let n = COST_KNOTS.len();
        // Variant 1 was last timed at knot 5 and its extrapolation falls below variant 0 later.
        let mut tables = vec![vec![10.0; n], (0..n).map(|ki| if ki <= 5 { 20.0 } else { 5.0 }).collect()];
        floor_out_of_running(&mut tables, &[true, false], &[Some(n - 1), Some(5)]);
        assert_eq!(&tables[1][..6], &[20.0; 6]);
        assert!(tables[1][6..].iter().all(|&t| t == 10.0 * AUTOTUNE_PRUNE_RATIO), "{:?}", tables[1]);
        assert_eq!(tables[0], vec![10.0; n]);
    }

    #[test]
    fn monotone_removes_spikes() {
        let mut t = [1.0, 2.0, 40.0, 3.0, 5.0];
        monotone(&mut t);
        assert_eq!(t, [1.0, 2.0, 3.0, 3.0, 5.0]);
        let mut t = [2.0, 1.0, 1.5];
        monotone(&mut t);
        assert_eq!(t, [1.0, 1.0, 1.5]);
    }
}
