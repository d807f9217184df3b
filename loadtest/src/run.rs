//! Driving load at a target: open loop (Poisson arrivals at a rate, sent whatever the target
//! does, latency counted from the arrival), a replayed trace (open loop at the trace's own
//! arrival times, texts made from its hashes by `trace::synth`) or closed loop (N clients, each
//! sending its next request when the last one is answered), bounded by duration and request
//! count. Each
//! answer is classified (complete, partial, error, wrong scores) into a [`Record`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::arrivals::{PoissonArrivals, RateProfile};
use crate::client::{Http, HttpError};
use crate::sim::scores;
use crate::summary::{new_histogram, Outcome, Record};
use crate::trace::synth::Replay;
use crate::workload::{GenRequest, WorkloadGen, WorkloadSpec};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum LoadMode {
    Open {
        profile: RateProfile,
    },
    Closed {
        concurrency: usize,
    },
    /// The requests of a trace at its arrival times divided by `speed`.
    Trace {
        file: String,
        speed: f64,
    },
}

/// A trace to replay (`LoadMode::Trace`).
#[derive(Debug, Clone)]
pub struct TraceSource {
    pub replay: Arc<Replay>,
    /// Arrival times are divided by it (2: twice as fast).
    pub speed: f64,
    /// Traced deadlines are multiplied by it (workers stretched in time need longer ones).
    pub deadline_scale: f64,
}

#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Base URL of the target (proxy or worker); requests go to `{target}/v1/score`.
    pub target: String,
    pub mode: LoadMode,
    /// Stop sending after this long.
    pub duration: Duration,
    /// Stop sending after this many requests.
    pub max_requests: Option<u64>,
    pub workload: WorkloadSpec,
    pub seed: u64,
    /// Give up on an answer after this long.
    pub timeout: Duration,
    /// Check every score against the simulated workers' deterministic scores.
    pub verify_sim_scores: bool,
    /// Draw a progress bar on stderr (when it is a terminal).
    pub progress: bool,
    /// Progress bar prefix.
    pub label: String,
    /// The trace of `LoadMode::Trace` (its requests, instructions and deadlines replace the
    /// workload's).
    pub trace: Option<TraceSource>,
}

pub struct RunOutput {
    pub records: Vec<Record>,
    /// From the start until the last answer.
    pub elapsed_s: f64,
    /// When sending stopped.
    pub send_window_s: f64,
}

/// Counters the progress bar reads while the run goes on.
struct Live {
    sent: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

impl Live {
    fn record(&self, r: &Record) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if r.outcome.is_error() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        } else if let Ok(mut h) = self.latency.lock() {
            let _ = h.record(r.latency_us.max(1));
        }
    }
}

#[derive(Deserialize)]
struct ScoreReply {
    scores: Vec<Option<f32>>,
    #[serde(default)]
    missing: Vec<usize>,
}

/// Classifies an answer to `req`.
fn classify(
    result: Result<crate::client::Reply, HttpError>,
    req: &GenRequest,
    instruction: Option<&str>,
    verify: bool,
) -> (Outcome, u32) {
    let reply = match result {
        Ok(r) => r,
        Err(HttpError::Timeout(_)) => return (Outcome::Timeout, 0),
        Err(_) => return (Outcome::Connection, 0),
    };
    if reply.status != 200 {
        return (Outcome::Status(reply.status), 0);
    }
    let Ok(body) = serde_json::from_slice::<ScoreReply>(&reply.body) else {
        return (Outcome::BadResponse, 0);
    };
    if body.scores.len() != req.items.len() {
        return (Outcome::BadResponse, 0);
    }
    let mut missing = vec![false; req.items.len()];
    for &i in &body.missing {
        match missing.get_mut(i) {
            Some(m) => *m = true,
            None => return (Outcome::BadResponse, 0),
        }
    }
    for (i, s) in body.scores.iter().enumerate() {
        match (s, missing[i]) {
            (None, true) => {}
            (Some(v), false) => {
                if verify && *v != scores::score(instruction, &req.query, &req.items[i]) {
                    return (Outcome::WrongScores, 0);
                }
            }
            // A score for a missing index, or no score and not listed: never silently absent.
            _ => return (Outcome::BadResponse, 0),
        }
    }
    let n_missing = body.missing.len() as u32;
    (if n_missing > 0 { Outcome::Partial } else { Outcome::Ok }, n_missing)
}

struct Sender {
    http: Http,
    url: String,
    instruction: Option<String>,
    deadline_ms: Option<u64>,
    timeout: Duration,
    verify: bool,
    start: Instant,
    live: Arc<Live>,
}

impl Sender {
    /// Sends `req` with the workload's instruction and deadline.
    async fn send(&self, req: GenRequest, due: Instant) -> Record {
        self.send_job(Job { req, instruction: self.instruction.clone(), deadline_ms: self.deadline_ms }, due).await
    }

    /// Sends `job`, due at `due` (latency counts from there), and records the outcome.
    async fn send_job(&self, job: Job, due: Instant) -> Record {
        let Job { req, instruction, deadline_ms } = job;
        let body = Bytes::from(req.body(instruction.as_deref(), deadline_ms));
        let result = self.http.post(&self.url, body, self.timeout).await;
        let latency = due.elapsed();
        let (outcome, missing) = classify(result, &req, instruction.as_deref(), self.verify);
        let r = Record {
            sent_s: due.saturating_duration_since(self.start).as_secs_f64(),
            latency_us: latency.as_micros() as u64,
            outcome,
            items: req.items.len() as u32,
            missing,
            deadline_ms,
        };
        self.live.record(&r);
        r
    }
}

/// Runs the load and returns every request's record.
pub async fn run(http: &Http, spec: &RunSpec) -> RunOutput {
    let start = Instant::now();
    let live = Arc::new(Live {
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        latency: Mutex::new(new_histogram()),
    });
    let sender = Arc::new(Sender {
        http: http.clone(),
        url: format!("{}/v1/score", spec.target.trim_end_matches('/')),
        instruction: spec.workload.instruction.clone(),
        deadline_ms: spec.workload.deadline_ms,
        timeout: spec.timeout,
        verify: spec.verify_sim_scores,
        start,
        live: live.clone(),
    });
    let finished = Arc::new(AtomicBool::new(false));
    let progress = spec.progress.then(|| spawn_progress(spec, live.clone(), finished.clone(), start));
    let max = spec.max_requests.unwrap_or(u64::MAX);
    let end = start + spec.duration;
    let mut records = Vec::new();

    let out = match &spec.mode {
        LoadMode::Open { .. } | LoadMode::Trace { .. } => {
            let mut gen = WorkloadGen::new(spec.workload.clone(), spec.seed);
            let mut set = JoinSet::new();
            for (i, (t, source)) in open_loop_arrivals(spec).enumerate() {
                let due = start + Duration::from_secs_f64(t);
                if i as u64 >= max || due >= end {
                    break;
                }
                let Some(job) = make_job(spec, &mut gen, source) else { break };
                tokio::time::sleep_until(due).await;
                live.sent.fetch_add(1, Ordering::Relaxed);
                let s = sender.clone();
                set.spawn(async move { s.send_job(job, due).await });
                while let Some(done) = set.try_join_next() {
                    records.extend(done.ok());
                }
            }
            let send_window_s = start.elapsed().as_secs_f64().min(spec.duration.as_secs_f64());
            while let Some(done) = set.join_next().await {
                records.extend(done.ok());
            }
            finish(progress, &finished);
            RunOutput { records, elapsed_s: start.elapsed().as_secs_f64(), send_window_s }
        }
        LoadMode::Closed { concurrency } => {
            let gen = Arc::new(Mutex::new(WorkloadGen::new(spec.workload.clone(), spec.seed)));
            let issued = Arc::new(AtomicU64::new(0));
            let mut set = JoinSet::new();
            for _ in 0..(*concurrency).max(1) {
                let (s, gen, issued, live) = (sender.clone(), gen.clone(), issued.clone(), live.clone());
                set.spawn(async move {
                    let mut mine = Vec::new();
                    while Instant::now() < end && issued.fetch_add(1, Ordering::Relaxed) < max {
                        let req = match gen.lock() {
                            Ok(mut g) => g.next_request(),
                            Err(_) => break,
                        };
                        live.sent.fetch_add(1, Ordering::Relaxed);
                        mine.push(s.send(req, Instant::now()).await);
                    }
                    mine
                });
            }
            while let Some(done) = set.join_next().await {
                records.extend(done.unwrap_or_default());
            }
            let elapsed_s = start.elapsed().as_secs_f64();
            finish(progress, &finished);
            RunOutput { records, elapsed_s, send_window_s: elapsed_s.min(spec.duration.as_secs_f64()) }
        }
    };
    out.sorted()
}

/// One request to send: its texts, instruction and deadline.
pub struct Job {
    pub req: GenRequest,
    pub instruction: Option<String>,
    pub deadline_ms: Option<u64>,
}

/// Where an open-loop request comes from.
enum Source {
    /// The next request of the workload generator.
    Generated,
    /// Request `i` of the trace.
    Traced(usize),
}

/// The open-loop arrivals in order: seconds after the start, and where the request comes from
/// (made only when it is sent, so the workload generator's sequence is the one it always was).
fn open_loop_arrivals(spec: &RunSpec) -> Box<dyn Iterator<Item = (f64, Source)> + Send + '_> {
    match (&spec.mode, &spec.trace) {
        (LoadMode::Trace { .. }, Some(src)) => {
            let speed = if src.speed > 0.0 { src.speed } else { 1.0 };
            Box::new((0..src.replay.len()).map(move |i| (src.replay.t_s(i) / speed, Source::Traced(i))))
        }
        (LoadMode::Open { profile }, _) => {
            Box::new(PoissonArrivals::new(profile.clone(), spec.seed).map(|t| (t, Source::Generated)))
        }
        // A trace mode without its trace, or closed loop: nothing to send open loop.
        _ => Box::new(std::iter::empty()),
    }
}

/// The request of `source`.
fn make_job(spec: &RunSpec, gen: &mut WorkloadGen, source: Source) -> Option<Job> {
    match (source, &spec.trace) {
        (Source::Generated, _) => Some(Job {
            req: gen.next_request(),
            instruction: spec.workload.instruction.clone(),
            deadline_ms: spec.workload.deadline_ms,
        }),
        (Source::Traced(i), Some(src)) => {
            let r = src.replay.request(i)?;
            Some(Job {
                req: r.req,
                instruction: r.instruction,
                deadline_ms: r.deadline_ms.map(|d| ((d as f64 * src.deadline_scale).round() as u64).max(1)),
            })
        }
        (Source::Traced(_), None) => None,
    }
}

impl RunOutput {
    fn sorted(mut self) -> Self {
        self.records.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
        self
    }
}

fn finish(progress: Option<tokio::task::JoinHandle<()>>, finished: &AtomicBool) {
    finished.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        p.abort();
    }
}

fn spawn_progress(
    spec: &RunSpec,
    live: Arc<Live>,
    finished: Arc<AtomicBool>,
    start: Instant,
) -> tokio::task::JoinHandle<()> {
    let total_ms = spec.duration.as_millis() as u64;
    let bar = ProgressBar::with_draw_target(Some(total_ms), ProgressDrawTarget::stderr_with_hz(4));
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:24}] {elapsed:>4} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(spec.label.clone());
    tokio::spawn(async move {
        let mut last = (start, 0u64);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = Instant::now();
            let done = live.done.load(Ordering::Relaxed);
            let qps = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
            last = (now, done);
            let (p50, p99) = live
                .latency
                .lock()
                .map(|h| {
                    if h.is_empty() {
                        (0.0, 0.0)
                    } else {
                        (h.value_at_quantile(0.5) as f64 / 1e3, h.value_at_quantile(0.99) as f64 / 1e3)
                    }
                })
                .unwrap_or((0.0, 0.0));
            bar.set_position((now.duration_since(start).as_millis() as u64).min(total_ms));
            bar.set_message(format!(
                "sent {} done {} | {:>6.1} qps | p50 {:>7.1} ms p99 {:>7.1} ms | errors {}",
                live.sent.load(Ordering::Relaxed),
                done,
                qps,
                p50,
                p99,
                live.errors.load(Ordering::Relaxed)
            ));
            if finished.load(Ordering::Relaxed) {
                break;
            }
        }
        bar.finish_and_clear();
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Reply;

    fn req() -> GenRequest {
        GenRequest { query: "q".into(), items: vec!["a".into(), "b".into()], reused: false }
    }

    fn reply(status: u16, body: &str) -> Result<Reply, HttpError> {
        Ok(Reply { status, headers: Default::default(), body: Bytes::from(body.to_string()) })
    }

    #[test]
    fn answers_are_classified() {
        let (a, b) = (scores::score(None, "q", "a"), scores::score(None, "q", "b"));
        let ok = format!(r#"{{"scores":[{a},{b}],"usage":{{}}}}"#);
        assert_eq!(classify(reply(200, &ok), &req(), None, true), (Outcome::Ok, 0));
        let partial = format!(r#"{{"scores":[{a},null],"missing":[1]}}"#);
        assert_eq!(classify(reply(200, &partial), &req(), None, true), (Outcome::Partial, 1));
        let swapped = format!(r#"{{"scores":[{b},{a}]}}"#);
        assert_eq!(classify(reply(200, &swapped), &req(), None, true).0, Outcome::WrongScores);
        assert_eq!(classify(reply(200, &swapped), &req(), None, false).0, Outcome::Ok, "unchecked");
        assert_eq!(
            classify(reply(200, r#"{"scores":[0.5,null]}"#), &req(), None, false).0,
            Outcome::BadResponse,
            "silently absent"
        );
        assert_eq!(classify(reply(200, r#"{"scores":[0.5]}"#), &req(), None, false).0, Outcome::BadResponse);
        assert_eq!(classify(reply(504, "{}"), &req(), None, false).0, Outcome::Status(504));
        assert_eq!(classify(Err(HttpError::Connection("reset".into())), &req(), None, false).0, Outcome::Connection);
    }
}
