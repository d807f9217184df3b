//! What a run's requests add up to: outcome counts, HDR latency percentiles, goodput, and a
//! per-window timeline.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// 200 with every score.
    Ok,
    /// 200 with some indices listed in `missing` (the deadline cut it short).
    Partial,
    /// An error status.
    Status(u16),
    /// No answer within the client's timeout.
    Timeout,
    /// Connection refused, reset or closed.
    Connection,
    /// 200 with a body that is not a matching score response.
    BadResponse,
    /// 200 with scores that differ from the simulated workers' (checked with `verify`).
    WrongScores,
}

impl Outcome {
    pub fn answered(&self) -> bool {
        matches!(self, Outcome::Ok | Outcome::Partial)
    }

    pub fn is_error(&self) -> bool {
        !self.answered()
    }

    pub fn label(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Partial => "partial".into(),
            Outcome::Status(s) => format!("http_{s}"),
            Outcome::Timeout => "timeout".into(),
            Outcome::Connection => "connection".into(),
            Outcome::BadResponse => "bad_response".into(),
            Outcome::WrongScores => "wrong_scores".into(),
        }
    }
}

/// One request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// When it was due to be sent, seconds after the run started (open loop: the arrival;
    /// latency counts from there, so a late send is the system's delay, not hidden).
    pub sent_s: f64,
    pub latency_us: u64,
    pub outcome: Outcome,
    pub items: u32,
    pub missing: u32,
    pub deadline_ms: Option<u64>,
}

impl Record {
    /// Complete, correct and within its deadline.
    pub fn good(&self) -> bool {
        self.outcome == Outcome::Ok && self.deadline_ms.is_none_or(|d| self.latency_us <= d * 1000)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs to 1 hour at 3 significant digits; the arguments are valid constants.
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

impl Percentiles {
    /// From a histogram of microseconds, in milliseconds.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1e3;
        Percentiles {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64 / 1e3,
            mean: h.mean() / 1e3,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Requests sent in the measured window (after the warm-up).
    pub requests: u64,
    pub ok: u64,
    pub partial: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub items: u64,
    /// Items left unscored by partial answers (errors excluded: their items count in
    /// `items_of_errors`).
    pub missing_items: u64,
    pub items_of_errors: u64,
    /// Length of the measured window.
    pub duration_s: f64,
    pub sent_qps: f64,
    /// Requests answered completely and correctly within their deadline, per second.
    pub goodput_qps: f64,
    /// Latency of answered requests (complete or partial).
    pub latency_ms: Percentiles,
}

impl Summary {
    /// Requests sent at or after `from_s` and before `to_s`.
    pub fn of(records: &[Record], from_s: f64, to_s: f64) -> (Summary, Histogram<u64>) {
        let mut h = new_histogram();
        let mut s = Summary { duration_s: (to_s - from_s).max(1e-9), ..Summary::default() };
        let mut good = 0u64;
        for r in records.iter().filter(|r| r.sent_s >= from_s && r.sent_s < to_s) {
            s.requests += 1;
            s.items += u64::from(r.items);
            match r.outcome {
                Outcome::Ok => s.ok += 1,
                Outcome::Partial => s.partial += 1,
                o => {
                    s.errors += 1;
                    s.items_of_errors += u64::from(r.items);
                    *s.errors_by_kind.entry(o.label()).or_default() += 1;
                }
            }
            if r.outcome.answered() {
                s.missing_items += u64::from(r.missing);
                let _ = h.record(r.latency_us.max(1));
            }
            if r.good() {
                good += 1;
            }
        }
        s.sent_qps = s.requests as f64 / s.duration_s;
        s.goodput_qps = good as f64 / s.duration_s;
        s.latency_ms = Percentiles::of(&h);
        (s, h)
    }
}

/// One window of the timeline (by send time).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Window {
    pub t_s: f64,
    pub sent: u64,
    pub errors: u64,
    pub partial: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

pub fn timeline(records: &[Record], window_s: f64, until_s: f64) -> Vec<Window> {
    let n = (until_s / window_s).ceil().max(1.0) as usize;
    let mut hs: Vec<Histogram<u64>> = (0..n).map(|_| new_histogram()).collect();
    let mut w: Vec<Window> = (0..n)
        .map(|i| Window {
            t_s: i as f64 * window_s,
            sent: 0,
            errors: 0,
            partial: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            max_ms: 0.0,
        })
        .collect();
    for r in records {
        let i = ((r.sent_s / window_s) as usize).min(n - 1);
        w[i].sent += 1;
        match r.outcome {
            Outcome::Partial => w[i].partial += 1,
            o if o.is_error() => w[i].errors += 1,
            _ => {}
        }
        if r.outcome.answered() {
            let _ = hs[i].record(r.latency_us.max(1));
        }
    }
    for (win, h) in w.iter_mut().zip(&hs) {
        let p = Percentiles::of(h);
        win.p50_ms = p.p50;
        win.p99_ms = p.p99;
        win.max_ms = p.max;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(sent_s: f64, ms: u64, outcome: Outcome) -> Record {
        Record {
            sent_s,
            latency_us: ms * 1000,
            outcome,
            items: 10,
            missing: if outcome == Outcome::Partial { 3 } else { 0 },
            deadline_ms: Some(100),
        }
    }

    #[test]
    fn counts_percentiles_and_goodput() {
        let mut rs: Vec<Record> = (0..100).map(|i| rec(1.0 + i as f64 * 0.01, 1 + i, Outcome::Ok)).collect();
        rs.push(rec(1.5, 100, Outcome::Partial));
        rs.push(rec(1.6, 3, Outcome::Status(503)));
        rs.push(rec(0.5, 1, Outcome::Ok)); // warm-up: excluded
        let (s, _) = Summary::of(&rs, 1.0, 3.0);
        assert_eq!((s.requests, s.ok, s.partial, s.errors), (102, 100, 1, 1));
        assert_eq!(s.errors_by_kind.get("http_503"), Some(&1));
        assert_eq!(s.missing_items, 3);
        assert_eq!(s.items_of_errors, 10);
        // Good: complete and within 100 ms: all 100 ok ones (1..=100 ms).
        assert!((s.goodput_qps - 50.0).abs() < 1e-9);
        assert!((s.latency_ms.p50 - 51.0).abs() < 0.1, "{:?}", s.latency_ms);
        assert!((s.latency_ms.max - 100.0).abs() < 0.1);
        let t = timeline(&rs, 1.0, 3.0);
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].sent, 1);
        assert_eq!(t[1].sent, 102);
        assert_eq!(t[1].errors, 1);
    }
}
