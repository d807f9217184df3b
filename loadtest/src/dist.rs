//! Distributions of workload quantities (items per query, tokens per item, ...), written as
//! short strings on the command line and in workload files:
//!
//! | form | distribution |
//! |---|---|
//! | `200` | always 200 |
//! | `uniform:40,300` | uniform on [40, 300] |
//! | `lognormal:200,0.3[,MIN,MAX]` | log-normal with median 200 and sigma 0.3 (of ln x), truncated to [MIN, MAX] |
//! | `pareto:40,1.2[,MAX]` | Pareto with scale 40 and shape 1.2 (a heavy tail), truncated at MAX |
//!
//! Truncation is exact (inverse CDF of the truncated law), so [`Dist::cdf`] describes exactly
//! what [`Dist::sample`] draws, and tests can check samples against it.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    Fixed(f64),
    Uniform { min: f64, max: f64 },
    LogNormal { median: f64, sigma: f64, min: f64, max: f64 },
    Pareto { scale: f64, alpha: f64, max: f64 },
}

impl Dist {
    /// One draw (continuous). Integer quantities round it.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            _ => {
                // Inverse CDF of a uniform draw in (0, 1).
                let u: f64 = rng.random::<f64>().clamp(1e-12, 1.0 - 1e-12);
                self.quantile(u)
            }
        }
    }

    /// One draw rounded to an integer of at least `floor`.
    pub fn sample_count<R: Rng + ?Sized>(&self, rng: &mut R, floor: u32) -> u32 {
        (self.sample(rng).round().max(f64::from(floor))).min(f64::from(u32::MAX)) as u32
    }

    /// P(X ≤ x).
    pub fn cdf(&self, x: f64) -> f64 {
        match *self {
            Dist::Fixed(v) => {
                if x >= v {
                    1.0
                } else {
                    0.0
                }
            }
            Dist::Uniform { min, max } => ((x - min) / (max - min)).clamp(0.0, 1.0),
            Dist::LogNormal { median, sigma, min, max } => {
                let f = |x: f64| if x <= 0.0 { 0.0 } else { normal_cdf((x / median).ln() / sigma) };
                let (lo, hi) = (f(min), f(max));
                ((f(x.clamp(min, max)) - lo) / (hi - lo)).clamp(0.0, 1.0)
            }
            Dist::Pareto { scale, alpha, max } => {
                if x < scale {
                    return 0.0;
                }
                let f = |x: f64| 1.0 - (scale / x).powf(alpha);
                (f(x.min(max)) / f(max)).clamp(0.0, 1.0)
            }
        }
    }

    /// The inverse CDF.
    pub fn quantile(&self, u: f64) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform { min, max } => min + u * (max - min),
            Dist::LogNormal { median, sigma, min, max } => {
                let f = |x: f64| if x <= 0.0 { 0.0 } else { normal_cdf((x / median).ln() / sigma) };
                let (lo, hi) = (f(min), f(max));
                let p = (lo + u * (hi - lo)).clamp(1e-15, 1.0 - 1e-15);
                (median * (sigma * normal_quantile(p)).exp()).clamp(min, max)
            }
            Dist::Pareto { scale, alpha, max } => {
                let top = 1.0 - (scale / max).powf(alpha);
                (scale / (1.0 - u * top).powf(1.0 / alpha)).clamp(scale, max)
            }
        }
    }

    /// The mean, by numerical integration of the quantile function (exact enough for
    /// capacity arithmetic and tests).
    pub fn mean(&self) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform { min, max } => (min + max) / 2.0,
            _ => {
                const N: usize = 20_000;
                (0..N).map(|i| self.quantile((i as f64 + 0.5) / N as f64)).sum::<f64>() / N as f64
            }
        }
    }

    pub fn min(&self) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform { min, .. } | Dist::LogNormal { min, .. } => min,
            Dist::Pareto { scale, .. } => scale,
        }
    }

    pub fn max(&self) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform { max, .. } | Dist::LogNormal { max, .. } | Dist::Pareto { max, .. } => max,
        }
    }

    fn validate(&self) -> Result<(), String> {
        let ok = |b: bool, m: &str| if b { Ok(()) } else { Err(m.to_string()) };
        let finite = |v: f64| v.is_finite();
        match *self {
            Dist::Fixed(v) => ok(finite(v) && v >= 0.0, "value must be >= 0"),
            Dist::Uniform { min, max } => {
                ok(finite(min) && finite(max) && 0.0 <= min && min < max, "need 0 <= MIN < MAX")
            }
            Dist::LogNormal { median, sigma, min, max } => ok(
                finite(median)
                    && median > 0.0
                    && finite(sigma)
                    && sigma > 0.0
                    && 0.0 <= min
                    && min < max
                    && finite(max),
                "need MEDIAN > 0, SIGMA > 0, 0 <= MIN < MAX",
            ),
            Dist::Pareto { scale, alpha, max } => ok(
                finite(scale) && scale > 0.0 && finite(alpha) && alpha > 0.0 && finite(max) && max > scale,
                "need SCALE > 0, ALPHA > 0, MAX > SCALE",
            ),
        }
    }
}

impl FromStr for Dist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("distribution '{s}': {why} (expected N, uniform:MIN,MAX, lognormal:MEDIAN,SIGMA[,MIN,MAX] or pareto:SCALE,ALPHA[,MAX])")
        };
        let (kind, args) = s.trim().split_once(':').unwrap_or(("", s.trim()));
        let nums: Vec<f64> = args
            .split(',')
            .map(|a| a.trim().parse::<f64>().map_err(|_| bad(&format!("'{}' is not a number", a.trim()))))
            .collect::<Result<_, _>>()?;
        let d = match (kind.trim(), nums.as_slice()) {
            ("" | "fixed", [v]) => Dist::Fixed(*v),
            ("uniform", [min, max]) => Dist::Uniform { min: *min, max: *max },
            ("lognormal", [median, sigma]) => {
                Dist::LogNormal { median: *median, sigma: *sigma, min: 0.0, max: f64::MAX }
            }
            ("lognormal", [median, sigma, min, max]) => {
                Dist::LogNormal { median: *median, sigma: *sigma, min: *min, max: *max }
            }
            ("pareto", [scale, alpha]) => Dist::Pareto { scale: *scale, alpha: *alpha, max: f64::MAX },
            ("pareto", [scale, alpha, max]) => Dist::Pareto { scale: *scale, alpha: *alpha, max: *max },
            ("" | "fixed" | "uniform" | "lognormal" | "pareto", _) => return Err(bad("wrong number of parameters")),
            (k, _) => return Err(bad(&format!("unknown kind '{k}'"))),
        };
        d.validate().map_err(|e| bad(&e))?;
        Ok(d)
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bound = |v: f64| v < f64::MAX;
        match *self {
            Dist::Fixed(v) => write!(f, "{v}"),
            Dist::Uniform { min, max } => write!(f, "uniform:{min},{max}"),
            Dist::LogNormal { median, sigma, min, max } if bound(max) => {
                write!(f, "lognormal:{median},{sigma},{min},{max}")
            }
            Dist::LogNormal { median, sigma, .. } => write!(f, "lognormal:{median},{sigma}"),
            Dist::Pareto { scale, alpha, max } if bound(max) => write!(f, "pareto:{scale},{alpha},{max}"),
            Dist::Pareto { scale, alpha, .. } => write!(f, "pareto:{scale},{alpha}"),
        }
    }
}

impl Serialize for Dist {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Dist {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Number(v) => Dist::from_str(&v.to_string()).map_err(serde::de::Error::custom),
            Repr::Text(t) => Dist::from_str(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Standard normal CDF (Abramowitz–Stegun 7.1.26 on erf; |error| < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// Standard normal quantile (Acklam's rational approximation, refined by one Newton step on
/// [`normal_cdf`] so the two agree).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let x = if p < 0.02425 {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - 0.02425 {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let e = normal_cdf(x) - p;
    let pdf = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
    if pdf > 1e-300 {
        x - e / pdf
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn parses_prints_and_rejects() {
        for s in
            ["200", "uniform:40,300", "lognormal:200,0.3,20,1000", "lognormal:5,1", "pareto:40,1.2,300", "pareto:1,2"]
        {
            let d: Dist = s.parse().unwrap();
            assert_eq!(d.to_string().parse::<Dist>().unwrap(), d, "{s}");
        }
        assert_eq!("fixed:7".parse::<Dist>().unwrap(), Dist::Fixed(7.0));
        for bad in ["", "uniform:5", "uniform:9,1", "gauss:1,2", "pareto:40,1.2,30", "lognormal:0,1", "x"] {
            let e = bad.parse::<Dist>().unwrap_err();
            assert!(e.contains("distribution"), "{bad}: {e}");
        }
        let j: Dist = serde_json::from_str("\"pareto:40,1.2,300\"").unwrap();
        assert_eq!(j, Dist::Pareto { scale: 40.0, alpha: 1.2, max: 300.0 });
        assert_eq!(serde_json::from_str::<Dist>("12").unwrap(), Dist::Fixed(12.0));
    }

    #[test]
    fn normal_helpers_agree() {
        for &z in &[-4.0, -2.0, -0.5, 0.0, 0.7, 1.96, 3.5] {
            assert!((normal_quantile(normal_cdf(z)) - z).abs() < 1e-6, "{z}");
        }
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
    }

    /// Kolmogorov–Smirnov distance of samples against the distribution's own CDF.
    fn ks(d: &Dist, n: usize, seed: u64) -> f64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut xs: Vec<f64> = (0..n).map(|_| d.sample(&mut rng)).collect();
        xs.sort_by(f64::total_cmp);
        xs.iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = d.cdf(x);
                (f - i as f64 / n as f64).abs().max((f - (i + 1) as f64 / n as f64).abs())
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn samples_follow_the_stated_law_and_bounds() {
        // KS critical value at 99.9% for n = 20,000: 1.95 / sqrt(n) ≈ 0.0138.
        for s in ["uniform:40,300", "lognormal:200,0.3,20,1000", "pareto:40,1.2,300", "lognormal:100,1.5,50,120"] {
            let d: Dist = s.parse().unwrap();
            let k = ks(&d, 20_000, 7);
            assert!(k < 0.0138, "{s}: KS distance {k}");
            let mut rng = StdRng::seed_from_u64(1);
            for _ in 0..5000 {
                let x = d.sample(&mut rng);
                assert!(x >= d.min() && x <= d.max(), "{s}: {x}");
            }
        }
        // Analytic facts: the truncated Pareto(40, 1.2, 300) has median 66.5, mean 87.3.
        let p: Dist = "pareto:40,1.2,300".parse().unwrap();
        assert!((p.quantile(0.5) - 66.5).abs() < 0.3, "{}", p.quantile(0.5));
        assert!((p.mean() - 87.3).abs() < 0.3, "{}", p.mean());
        let l: Dist = "lognormal:200,0.3".parse().unwrap();
        assert!((l.quantile(0.5) - 200.0).abs() < 1e-6);
        assert!((l.mean() - 200.0 * (0.045f64).exp()).abs() < 0.5, "{}", l.mean());
    }
}
