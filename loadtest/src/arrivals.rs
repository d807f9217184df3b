//! Open-loop arrival times: a Poisson process whose rate is a base rate times piecewise
//! multipliers (bursts), generated exactly (by inverting the integrated rate), deterministic
//! for a seed.

use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The rate multiplied by `factor` from `start_s` for `duration_s` seconds.
/// Command-line form: `FACTOR@START_S+DURATION_S`, e.g. `1.5@20+10`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Burst {
    pub factor: f64,
    pub start_s: f64,
    pub duration_s: f64,
}

impl FromStr for Burst {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("burst '{s}': {why} (expected FACTOR@START_S+DURATION_S, e.g. 1.5@20+10)");
        let (f, when) = s.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let (st, d) = when.split_once('+').ok_or_else(|| bad("no '+'"))?;
        let num = |t: &str| t.trim().parse::<f64>().map_err(|_| bad(&format!("'{}' is not a number", t.trim())));
        let b = Burst { factor: num(f)?, start_s: num(st)?, duration_s: num(d)? };
        if !(b.factor.is_finite()
            && b.factor >= 0.0
            && b.start_s >= 0.0
            && b.duration_s > 0.0
            && b.start_s.is_finite()
            && b.duration_s.is_finite())
        {
            return Err(bad("factor must be >= 0, start >= 0, duration > 0"));
        }
        Ok(b)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateProfile {
    pub base_qps: f64,
    pub bursts: Vec<Burst>,
}

impl RateProfile {
    pub fn constant(qps: f64) -> Self {
        RateProfile { base_qps: qps, bursts: Vec::new() }
    }

    /// Requests per second at `t` seconds.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.bursts
            .iter()
            .filter(|b| t >= b.start_s && t < b.start_s + b.duration_s)
            .fold(self.base_qps, |r, b| r * b.factor)
    }

    /// The first time after `t` where the rate changes (infinity: never).
    fn next_change(&self, t: f64) -> f64 {
        self.bursts
            .iter()
            .flat_map(|b| [b.start_s, b.start_s + b.duration_s])
            .filter(|&x| x > t)
            .fold(f64::INFINITY, f64::min)
    }

    /// Expected requests in [0, t).
    pub fn expected_count(&self, t: f64) -> f64 {
        let mut x = 0.0;
        let mut total = 0.0;
        while x < t {
            let next = self.next_change(x).min(t);
            total += self.rate_at(x) * (next - x);
            x = next;
        }
        total
    }
}

/// Arrival times in seconds from the start, increasing; endless (the caller stops).
pub struct PoissonArrivals {
    profile: RateProfile,
    rng: StdRng,
    t: f64,
}

impl PoissonArrivals {
    pub fn new(profile: RateProfile, seed: u64) -> Self {
        PoissonArrivals { profile, rng: StdRng::seed_from_u64(seed ^ 0xa771_7a15_0f0f_1234), t: 0.0 }
    }
}

impl Iterator for PoissonArrivals {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        // A unit-rate exponential in integrated-rate time, walked through the rate segments.
        let u: f64 = self.rng.random::<f64>().max(1e-300);
        let mut e = -u.ln();
        loop {
            let rate = self.profile.rate_at(self.t);
            let change = self.profile.next_change(self.t);
            if rate > 0.0 && self.t + e / rate <= change {
                self.t += e / rate;
                return Some(self.t);
            }
            if !change.is_finite() {
                return None; // zero rate for ever
            }
            e -= rate * (change - self.t);
            self.t = change;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_counts_and_gaps() {
        let times: Vec<f64> =
            PoissonArrivals::new(RateProfile::constant(100.0), 1).take_while(|&t| t < 200.0).collect();
        // 20,000 expected, sd 141.
        assert!((times.len() as f64 - 20_000.0).abs() < 600.0, "{}", times.len());
        assert!(times.windows(2).all(|w| w[1] > w[0]));
        // Exponential gaps: the coefficient of variation is 1.
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.05, "cv {}", sd / mean);
        let again: Vec<f64> = PoissonArrivals::new(RateProfile::constant(100.0), 1).take(100).collect();
        assert_eq!(&times[..100], &again[..]);
    }

    #[test]
    fn bursts_raise_the_rate_where_they_are() {
        let profile = RateProfile { base_qps: 50.0, bursts: vec!["3@100+100".parse().unwrap()] };
        assert_eq!(profile.rate_at(150.0), 150.0);
        assert_eq!(profile.expected_count(300.0), 50.0 * 200.0 + 150.0 * 100.0);
        let times: Vec<f64> = PoissonArrivals::new(profile, 2).take_while(|&t| t < 300.0).collect();
        let inside = times.iter().filter(|&&t| (100.0..200.0).contains(&t)).count() as f64;
        let before = times.iter().filter(|&&t| t < 100.0).count() as f64;
        assert!((inside - 15_000.0).abs() < 500.0, "{inside}");
        assert!((before - 5_000.0).abs() < 300.0, "{before}");
        assert!("2@1".parse::<Burst>().unwrap_err().contains("FACTOR"));
    }
}
