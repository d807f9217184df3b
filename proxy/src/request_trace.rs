//! The sampled request trace (`[request_trace]`): one JSON line per sampled score request, for replaying
//! the traffic's shape (cache sizing, capacity planning) without its content. A line holds
//! hashes (XXH3-64 of the query, the instruction and each item text), token counts, timestamps
//! and the outcome; never any text. The file is rotated at `max_bytes` into `PATH.1` …
//! `PATH.keep` (the oldest dropped), so the trace takes at most `(keep + 1) × max_bytes`.
//!
//! Requests hand their record to a writer thread through a bounded channel; a full channel
//! drops the record (counted in `sieve_proxy_trace_dropped_total`) rather than slow a request.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sieve_shared::proxy_config::RequestTraceConfig;
use sieve_shared::{ApiError, ScoreRequest, ScoreResponse};
use xxhash_rust::xxh3::xxh3_64;

use crate::metrics as m;

/// Records waiting for the writer beyond which new ones are dropped.
const QUEUE: usize = 4096;

/// One sampled request (the line the capacity planner reads).
pub use sieve_shared::trace_record::TraceRecord as Record;

/// A request being traced: what is known at arrival.
pub struct Pending {
    arrival: Instant,
    query: u64,
    instruction: Option<u64>,
    items: Vec<u64>,
    deadline_ms: Option<u64>,
}

impl Pending {
    pub fn new(req: &ScoreRequest<'_>, arrival: Instant) -> Self {
        Pending {
            arrival,
            query: xxh3_64(req.query.as_bytes()),
            instruction: req.instruction.as_deref().map(|i| xxh3_64(i.as_bytes())),
            items: req.items.iter().map(|i| xxh3_64(i.text().as_bytes())).collect(),
            deadline_ms: req.deadline_ms,
        }
    }

    /// The record of the request's outcome.
    pub fn finish(self, outcome: Result<&ScoreResponse, &ApiError>) -> Record {
        let elapsed = self.arrival.elapsed();
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let (item_tokens, prefix_tokens, cached_items, missing, status) = match outcome {
            Ok(r) => {
                (r.usage.item_tokens.clone(), r.usage.prefix_tokens, r.usage.cached_items, r.missing.len() as u32, 200)
            }
            Err(e) => (Vec::new(), 0, 0, 0, e.status()),
        };
        Record {
            t_ms: now_ms.saturating_sub(elapsed.as_millis() as u64),
            query: self.query,
            instruction: self.instruction,
            items: self.items,
            item_tokens,
            prefix_tokens,
            cached_items,
            missing,
            deadline_ms: self.deadline_ms,
            status,
            latency_ms: elapsed.as_secs_f64() * 1e3,
        }
    }
}

/// The trace as requests see it: off, or a sampling rate and the writer's queue.
#[derive(Debug)]
pub struct Trace {
    tx: Option<SyncSender<Record>>,
    sample: f64,
}

impl Trace {
    pub fn off() -> Self {
        Trace { tx: None, sample: 0.0 }
    }

    /// Opens `cfg.path` (appending) and starts the writer thread; off when the path is empty.
    /// A file that cannot be opened is an error at start-up, not a trace silently missing.
    pub fn open(cfg: &RequestTraceConfig) -> Result<Self, String> {
        if cfg.path.is_empty() || cfg.sample <= 0.0 {
            return Ok(Trace::off());
        }
        let mut writer = Writer::open(cfg)?;
        let (tx, rx) = sync_channel::<Record>(QUEUE);
        std::thread::Builder::new()
            .name("sieve-trace".into())
            .spawn(move || {
                // Ends when every sender is gone (the proxy's state dropped).
                while let Ok(r) = rx.recv() {
                    if let Err(e) = writer.write(&r) {
                        tracing::warn!("request trace {}: {e}", writer.path.display());
                    }
                }
            })
            .map_err(|e| format!("trace: cannot start the writer thread: {e}"))?;
        Ok(Trace { tx: Some(tx), sample: cfg.sample })
    }

    /// Whether to trace the next request (a draw per request at the configured rate).
    pub fn sampled(&self) -> bool {
        self.tx.is_some() && (self.sample >= 1.0 || rand::random::<f64>() < self.sample)
    }

    pub fn send(&self, r: Record) {
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(r) {
                metrics::counter!(m::TRACE_DROPPED).increment(1);
            }
        }
    }
}

/// The file side: appends lines, rotates at the size bound.
struct Writer {
    path: PathBuf,
    file: File,
    written: u64,
    max_bytes: u64,
    keep: u32,
}

impl Writer {
    fn open(cfg: &RequestTraceConfig) -> Result<Self, String> {
        let path = PathBuf::from(&cfg.path);
        let file = append(&path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Writer { path, file, written, max_bytes: cfg.max_bytes, keep: cfg.keep })
    }

    fn write(&mut self, r: &Record) -> Result<(), String> {
        let mut line = serde_json::to_vec(r).map_err(|e| e.to_string())?;
        line.push(b'\n');
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        // A line longer than the bound on its own is not written: the bound holds.
        if line.len() as u64 > self.max_bytes {
            metrics::counter!(m::TRACE_DROPPED).increment(1);
            return Ok(());
        }
        self.file.write_all(&line).map_err(|e| e.to_string())?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// PATH.k → PATH.k+1 (PATH.keep dropped), PATH → PATH.1, a new PATH.
    fn rotate(&mut self) -> Result<(), String> {
        let numbered = |k: u32| {
            let mut p = self.path.clone().into_os_string();
            p.push(format!(".{k}"));
            PathBuf::from(p)
        };
        let _ = std::fs::remove_file(numbered(self.keep));
        for k in (1..self.keep).rev() {
            let _ = std::fs::rename(numbered(k), numbered(k + 1));
        }
        std::fs::rename(&self.path, numbered(1)).map_err(|e| format!("{}: {e}", self.path.display()))?;
        self.file = append(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

fn append(path: &PathBuf) -> Result<File, String> {
    OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("trace file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sieve-trace-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn record(req: &str) -> Record {
        let r: ScoreRequest = serde_json::from_str(req).unwrap();
        let resp = ScoreResponse {
            scores: vec![Some(0.5); r.items.len()],
            ids: None,
            missing: vec![],
            usage: sieve_shared::Usage { item_tokens: vec![7; r.items.len()], prefix_tokens: 9, ..Default::default() },
            timing: Default::default(),
            model: "m".into(),
            template: String::new(),
        };
        Pending::new(&r, Instant::now()).finish(Ok(&resp))
    }

    #[test]
    fn lines_hold_hashes_and_counts_never_text() {
        let mut r = record(
            r#"{"query":"secret query","items":["secret item",{"id":"x","text":"secret item"}],"instruction":"secret"}"#,
        );
        // A measured latency need not survive serde_json's default float parsing bit for bit
        // (it is not built with `float_roundtrip`); one exact in binary does.
        r.latency_ms = 1.5;
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains("secret"), "{line}");
        assert_eq!(r.items.len(), 2);
        assert_eq!(r.items[0], r.items[1], "the same text, the same hash");
        assert_eq!((r.item_tokens.clone(), r.prefix_tokens, r.status), (vec![7, 7], 9, 200));
        assert!(r.instruction.is_some());
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
        let failed = Pending::new(&serde_json::from_str(r#"{"query":"q","items":["a"]}"#).unwrap(), Instant::now())
            .finish(Err(&ApiError::overloaded("busy")));
        assert_eq!((failed.status, failed.item_tokens.len()), (429, 0));
    }

    #[test]
    fn the_files_rotate_and_stay_within_the_bound() {
        let d = dir("rotate");
        let path = d.join("trace.jsonl");
        let cfg = RequestTraceConfig { path: path.display().to_string(), sample: 1.0, max_bytes: 1000, keep: 2 };
        let mut w = Writer::open(&cfg).unwrap();
        for i in 0..100 {
            w.write(&record(&format!(r#"{{"query":"q{i}","items":["a","b","c"]}}"#))).unwrap();
        }
        let mut files: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let names: Vec<_> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"]);
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.len() <= 1000, "{}: {} bytes", f.display(), text.len());
            for line in text.lines() {
                serde_json::from_str::<Record>(line).expect("every line a whole record");
            }
        }
        // The newest record is in the current file.
        let last = std::fs::read_to_string(&path).unwrap();
        let newest: Record = serde_json::from_str(last.lines().last().unwrap()).unwrap();
        assert_eq!(newest.query, xxh3_64(b"q99"));
        // An unwritable path is refused at start-up.
        let bad = RequestTraceConfig { path: d.join("no/such/dir/t").display().to_string(), ..cfg };
        assert!(Trace::open(&bad).unwrap_err().contains("no/such/dir"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
