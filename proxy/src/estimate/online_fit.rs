//! Online linear least squares with exponential forgetting, pulled toward a prior: the engine
//! behind both recalibrations (tokens from text, milliseconds from tokens).
//!
//! Minimises Σ_t γ^(T−t) (y_t − w·x_t)² + Σ_j r_j (w_j − w0_j)², where the prior precision
//! r_j = prior_weight · scale_j² makes the prior worth `prior_weight` typical samples. A feature
//! that is never seen (say, CJK characters in an English catalogue) keeps its prior weight.

/// Samples summed apart before being folded into the fit ([`OnlineFit::observe_many`]).
const BLOCK: usize = 64;

#[derive(Debug, Clone)]
pub struct OnlineFit<const N: usize> {
    xtx: [[f64; N]; N],
    xty: [f64; N],
    prior: [f64; N],
    precision: [f64; N],
    decay: f64,
    weights: [f64; N],
    samples: f64,
}

impl<const N: usize> OnlineFit<N> {
    /// `scales`: a typical magnitude of each feature, so the prior's pull is comparable across
    /// features of very different sizes.
    pub fn new(prior: [f64; N], scales: [f64; N], prior_weight: f64, decay: f64) -> Self {
        let mut precision = [0.0; N];
        for j in 0..N {
            precision[j] = prior_weight * scales[j] * scales[j];
        }
        OnlineFit { xtx: [[0.0; N]; N], xty: [0.0; N], prior, precision, decay, weights: prior, samples: 0.0 }
    }

    pub fn observe(&mut self, x: &[f64; N], y: f64) {
        self.observe_many([(x, y)]);
    }

    /// [`observe`](Self::observe) for each sample in order, with the same result up to
    /// rounding, at a fraction of the cost: the token estimator learns from every item of every
    /// shard, so this is on the proxy's per-item path. Instead of decaying the whole matrix once
    /// per sample, samples are taken in blocks of [`BLOCK`]: a block's samples are summed with
    /// their own decay weights (`decay^(later samples in the block)`, at most 1, so nothing can
    /// overflow), then the block is folded in with one decay of the sums. Only the upper
    /// triangle of the symmetric `xᵀx` is summed (45 products for 9 features, not 81).
    pub fn observe_many<'a>(&mut self, samples: impl IntoIterator<Item = (&'a [f64; N], f64)>) {
        let unused = [0.0; N];
        let mut block: [(&[f64; N], f64); BLOCK] = [(&unused, 0.0); BLOCK];
        let mut len = 0;
        for (x, y) in samples {
            if !y.is_finite() || x.iter().any(|v| !v.is_finite()) {
                continue;
            }
            block[len] = (x, y);
            len += 1;
            if len == BLOCK {
                self.fold(&block);
                len = 0;
            }
        }
        if len > 0 {
            self.fold(&block[..len]);
        }
    }

    /// Folds one block of samples (in arrival order) into the sums.
    // Index loops: the upper triangle is written to both [i][j] and [j][i].
    #[allow(clippy::needless_range_loop)]
    fn fold(&mut self, block: &[(&[f64; N], f64)]) {
        let mut xtx = [[0.0; N]; N];
        let mut xty = [0.0; N];
        let (mut w, mut weight_sum) = (1.0, 0.0);
        // The last sample has weight 1, each earlier one `decay` times the next.
        for &(x, y) in block.iter().rev() {
            for i in 0..N {
                let wx = w * x[i];
                for j in i..N {
                    xtx[i][j] += wx * x[j];
                }
                xty[i] += wx * y;
            }
            weight_sum += w;
            w *= self.decay;
        }
        // `w` is now decay^len: how much the block fades what came before it.
        for i in 0..N {
            for j in i..N {
                let v = w * self.xtx[i][j] + xtx[i][j];
                self.xtx[i][j] = v;
                self.xtx[j][i] = v;
            }
            self.xty[i] = w * self.xty[i] + xty[i];
        }
        self.samples = w * self.samples + weight_sum;
    }

    /// Re-solves for the weights from everything observed, with non-negative weights only
    /// (every feature adds cost or tokens). A weight the unconstrained solution wants
    /// negative is fixed at zero and the rest re-solved (an active-set step), rather than
    /// clipped: with correlated features, clipping one weight would leave the others
    /// compensating for a value it no longer has. Keeps the previous weights if degenerate.
    pub fn solve(&mut self) -> [f64; N] {
        let mut a = self.xtx;
        let mut b = self.xty;
        for j in 0..N {
            a[j][j] += self.precision[j];
            b[j] += self.precision[j] * self.prior[j];
        }
        let mut fixed = [false; N];
        for _ in 0..N {
            // Fixed weights are pinned at zero: identity rows, zero right-hand side.
            let (mut a2, mut b2) = (a, b);
            for j in 0..N {
                if fixed[j] {
                    a2[j] = [0.0; N];
                    for row in a2.iter_mut() {
                        row[j] = 0.0;
                    }
                    a2[j][j] = 1.0;
                    b2[j] = 0.0;
                }
            }
            let Some(w) = solve_linear(a2, b2) else { return self.weights };
            match (0..N).filter(|&j| w[j] < 0.0).min_by(|&i, &j| w[i].total_cmp(&w[j])) {
                Some(j) => fixed[j] = true,
                None => {
                    self.weights = w;
                    return w;
                }
            }
        }
        self.weights
    }

    pub fn weights(&self) -> [f64; N] {
        self.weights
    }

    /// Effective number of samples remembered.
    pub fn samples(&self) -> f64 {
        self.samples
    }

    pub fn predict(&self, x: &[f64; N]) -> f64 {
        dot(&self.weights, x)
    }
}

pub fn dot<const N: usize>(w: &[f64; N], x: &[f64; N]) -> f64 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

/// Gaussian elimination with partial pivoting; `None` when singular.
fn solve_linear<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let pivot = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..N {
            let f = a[row][col] / a[col][col];
            if f != 0.0 {
                let pivot_row = a[col];
                for (k, v) in a[row].iter_mut().enumerate().skip(col) {
                    *v -= f * pivot_row[k];
                }
                b[row] -= f * b[col];
            }
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let s: f64 = (row + 1..N).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_linear_law_and_keeps_the_prior_where_nothing_is_seen() {
        let truth = [3.0, 0.5, 0.0];
        let mut f = OnlineFit::new([1.0, 1.0, 7.0], [1.0, 10.0, 10.0], 1.0, 1.0);
        for i in 0..500 {
            let x = [1.0, (i % 37) as f64, 0.0];
            f.observe(&x, dot(&truth, &x));
        }
        let w = f.solve();
        assert!((w[0] - 3.0).abs() < 0.05 && (w[1] - 0.5).abs() < 0.01, "{w:?}");
        assert_eq!(w[2], 7.0, "an unseen feature keeps its prior");
    }

    #[test]
    fn a_weight_held_at_zero_lets_the_others_refit() {
        // y = 2·x0 − 0.5·x1 with x1 ≈ x0: unconstrained, w1 < 0; constrained, w1 = 0 and w0
        // takes the whole signal (≈ 1.5), instead of staying near 2 as clipping would leave it.
        let mut f = OnlineFit::new([1.0, 1.0], [10.0, 10.0], 0.001, 1.0);
        for i in 0..200 {
            let x0 = (i % 50) as f64;
            let x1 = x0 + if i % 2 == 0 { 0.5 } else { -0.5 };
            f.observe(&[x0, x1], 2.0 * x0 - 0.5 * x1);
        }
        let w = f.solve();
        assert_eq!(w[1], 0.0);
        assert!((w[0] - 1.5).abs() < 0.02, "{w:?}");
    }

    /// The one-sample-at-a-time update, as the fit did it before blocks.
    fn reference(fit: &mut OnlineFit<3>, x: &[f64; 3], y: f64) {
        for i in 0..3 {
            for j in 0..3 {
                fit.xtx[i][j] = fit.decay * fit.xtx[i][j] + x[i] * x[j];
            }
            fit.xty[i] = fit.decay * fit.xty[i] + x[i] * y;
        }
        fit.samples = fit.decay * fit.samples + 1.0;
    }

    #[test]
    fn blocks_of_samples_match_one_sample_at_a_time() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
        for (decay, n) in [(0.9995, 1000), (0.9, 130), (1.0, 64), (0.5, 65), (0.99, 1)] {
            let mut blocks = OnlineFit::new([1.0, 1.0, 1.0], [1.0, 10.0, 10.0], 1.0, decay);
            let mut single = blocks.clone();
            let xs: Vec<[f64; 3]> = (0..n).map(|i| [1.0, (i % 37) as f64, ((i * 7) % 11) as f64]).collect();
            let ys: Vec<f64> = (0..n).map(|i| 3.0 + 0.5 * (i % 37) as f64 + (i % 5) as f64).collect();
            // Two calls, so a block boundary falls mid-stream; a non-finite sample is skipped.
            let cut = n / 3;
            blocks.observe_many(xs[..cut].iter().zip(ys[..cut].iter().copied()));
            blocks.observe_many([(&[1.0, f64::NAN, 0.0], 1.0), (&xs[0], f64::INFINITY)]);
            blocks.observe_many(xs[cut..].iter().zip(ys[cut..].iter().copied()));
            for (x, &y) in xs.iter().zip(&ys) {
                reference(&mut single, x, y);
            }
            assert!(close(blocks.samples, single.samples), "decay {decay}: {} vs {}", blocks.samples, single.samples);
            for i in 0..3 {
                assert!(close(blocks.xty[i], single.xty[i]), "decay {decay}");
                for j in 0..3 {
                    assert!(close(blocks.xtx[i][j], single.xtx[i][j]), "decay {decay} [{i}][{j}]");
                }
            }
            let (a, b) = (blocks.solve(), single.solve());
            assert!(a.iter().zip(&b).all(|(p, q)| close(*p, *q)), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn forgets_old_behaviour() {
        let mut f = OnlineFit::new([1.0], [10.0], 1.0, 0.98);
        for _ in 0..500 {
            f.observe(&[10.0], 10.0);
        }
        assert!((f.solve()[0] - 1.0).abs() < 0.01);
        for _ in 0..500 {
            f.observe(&[10.0], 30.0);
        }
        assert!((f.solve()[0] - 3.0).abs() < 0.05, "{:?}", f.weights());
    }
}
