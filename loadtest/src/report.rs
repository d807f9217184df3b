//! A run's outputs: `report.json` (everything measured) and the three charts, as SVG and PNG.

use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::monitor::Utilisation;
use crate::plot::{self, CdfChart, TimelineChart, UtilisationChart};
use crate::run::LoadMode;
use crate::summary::{timeline, Record, Summary, Window};
use crate::workload::WorkloadSpec;

/// What a run was asked to do: the same in the run's data and in its report.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub label: String,
    pub target: String,
    pub load: LoadMode,
    pub duration_s: f64,
    pub max_requests: Option<u64>,
    /// Requests sent before this are not in `summary` (they are in `timeline`).
    pub warmup_s: f64,
    pub seed: u64,
    pub workload: WorkloadSpec,
    pub utilisation: Option<Utilisation>,
    /// Shaded spans on the timeline (faults, bursts): (start_s, end_s, label).
    pub marks: Vec<(f64, f64, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    #[serde(flatten)]
    pub info: RunInfo,
    pub summary: Summary,
    pub window_s: f64,
    pub timeline: Vec<Window>,
}

/// What a finished run hands to the report writer.
pub struct RunData<'a> {
    pub info: RunInfo,
    pub records: &'a [Record],
    pub send_window_s: f64,
}

impl RunData<'_> {
    /// Summarises the records (after the warm-up) and builds the report and the latency
    /// histogram.
    pub fn report(self) -> (RunReport, Histogram<u64>) {
        let end = self.send_window_s.max(self.info.warmup_s + 1e-3);
        let (summary, hist) = Summary::of(self.records, self.info.warmup_s, end);
        let window_s = if end > 60.0 {
            2.0
        } else if end > 5.0 {
            1.0
        } else {
            0.25
        };
        let timeline = timeline(self.records, window_s, end);
        (RunReport { info: self.info, summary, window_s, timeline }, hist)
    }
}

/// Writes `report.json` and the charts into `dir`; returns the files written.
pub fn write(dir: &Path, report: &RunReport, hist: &Histogram<u64>) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let json = dir.join("report.json");
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("{}: {e}", json.display()))?;
    files.push(json);
    let s = &report.summary;
    files.extend(plot::save(
        &CdfChart {
            title: format!("Latency CDF: p50 {:.1} ms, p99 {:.1} ms", s.latency_ms.p50, s.latency_ms.p99),
            series: vec![(report.info.label.clone(), hist)],
        },
        &dir.join("latency_cdf"),
    )?);
    files.extend(plot::save(
        &TimelineChart {
            title: format!("Latency over time: {}", report.info.label),
            windows: &report.timeline,
            window_s: report.window_s,
            marks: report.info.marks.clone(),
        },
        &dir.join("latency_over_time"),
    )?);
    if let Some(u) = report.info.utilisation.as_ref().filter(|u| !u.t_s.is_empty()) {
        files.extend(plot::save(
            &UtilisationChart {
                title: format!("Worker utilisation: {}", report.info.label),
                util: u,
                names: (0..u.workers.len()).map(|i| format!("worker {i}")).collect(),
            },
            &dir.join("worker_utilisation"),
        )?);
    }
    Ok(files)
}

/// A few lines for the terminal.
pub fn print_summary(r: &RunReport) {
    let s = &r.summary;
    let l = &s.latency_ms;
    println!(
        "{}: {} requests in {:.1} s ({:.1} qps sent), goodput {:.1} qps",
        r.info.label, s.requests, s.duration_s, s.sent_qps, s.goodput_qps
    );
    println!(
        "  answered {} complete, {} partial ({} items missing); errors {} {:?}",
        s.ok, s.partial, s.missing_items, s.errors, s.errors_by_kind
    );
    println!(
        "  latency ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  mean {:.1}",
        l.p50, l.p90, l.p99, l.p999, l.max, l.mean
    );
    if let Some(u) = &r.info.utilisation {
        println!("  mean worker utilisation {:.0}% over {} workers", 100.0 * u.mean(), u.workers.len());
    }
}
