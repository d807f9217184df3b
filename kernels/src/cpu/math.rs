//! Scalar building blocks written so that loops over them auto-vectorise, with a fixed
//! evaluation order (every reduction here has one order, set by the length alone).

/// Lanes of the fixed-order reductions (one AVX-512 vector).
pub(crate) const LANES: usize = 16;

/// Sums 16 lanes in a fixed pairwise tree.
#[inline(always)]
pub(crate) fn reduce_sum(a: [f32; LANES]) -> f32 {
    let mut w = a;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            w[l] += w[l + width];
        }
        width /= 2;
    }
    w[0]
}

/// `Σ x[i]·y[i]`: lane `l` sums elements `l, l+16, ...` in order, then [`reduce_sum`].
#[inline(always)]
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let xc = x.chunks_exact(LANES);
    let yc = y.chunks_exact(LANES);
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..LANES {
            acc[l] += a[l] * b[l];
        }
    }
    for (l, (a, b)) in xr.iter().zip(yr).enumerate() {
        acc[l] += a * b;
    }
    reduce_sum(acc)
}

/// `Σ x[i]²` in the order of [`dot`].
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    dot(x, x)
}

/// `e^x` to about 2 ulp for x in [-87, 88] (clamped outside), branch-free so it vectorises:
/// Cody–Waite reduction `x = n·ln2 + r`, a degree-7 Taylor polynomial in r, then `2^n` built in
/// the exponent bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2^23: adding it rounds to an integer, held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    p * f32::from_bits(((n_int + 127) as u32) << 23)
}

/// `x · sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_std_over_the_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn reductions_match_f64_sums() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        assert!((dot(&x, &y) as f64 - want).abs() < 1e-5);
        assert_eq!(reduce_sum([1.0; 16]), 16.0);
    }
}
