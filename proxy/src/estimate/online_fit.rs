//! Online linear least squares with exponential forgetting, pulled toward a prior: the engine
//! behind both recalibrations (tokens from text, milliseconds from tokens).
//!
//! Minimises Σ_t γ^(T−t) (y_t − w·x_t)² + Σ_j r_j (w_j − w0_j)², where the prior precision
//! r_j = prior_weight · scale_j² makes the prior worth `prior_weight` typical samples. A feature
//! that is never seen (say, CJK characters in an English catalogue) keeps its prior weight.

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
        if !y.is_finite() || x.iter().any(|v| !v.is_finite()) {
            return;
        }
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = self.decay * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = self.decay * self.xty[i] + x[i] * y;
        }
        self.samples = self.decay * self.samples + 1.0;
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
