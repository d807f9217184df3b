//! `--tail`: where the time of part 1's slowest requests goes. Around each request (outside its
//! timed span) the bench reads, for the router, each worker and the bench process itself, the
//! time their threads spent runnable but not running (run-queue delay,
//! `/proc/PID/task/*/schedstat`, ns), the times their threads were put on a CPU and the
//! router's CPU time; the machine's CPU pressure (`/proc/pressure/cpu`, "some":
//! the µs during which at least one task waited for a CPU); and the router's sockets (one that
//! was not there before: a connection opened during the request). The slowest requests' figures
//! are printed next to the medians: a slow request whose excess the run-queue delays match waited
//! for a CPU; one without such delays waited on something else (a timer, a lost wake-up, a new
//! connection). Linux only; a figure that cannot be read is 0.

use std::collections::HashSet;

/// A process (with its direct children: nginx's workers) whose run-queue delay is followed.
#[derive(Clone)]
pub struct Watched {
    pub label: String,
    pids: Vec<u32>,
}

impl Watched {
    /// `pid` alone, or with its direct children (nginx's workers; not the bench's, which are
    /// the servers it measures).
    pub fn new(label: &str, pid: u32, children: bool) -> Self {
        Watched { label: label.into(), pids: if children { family(pid) } else { vec![pid] } }
    }
}

/// What is followed around each request of one row.
#[derive(Clone)]
pub struct Probe {
    /// The router first when there is one (its sockets are watched too), then the workers, then
    /// the bench.
    pub watched: Vec<Watched>,
    router: Option<Vec<u32>>,
}

/// The counters at one instant.
pub struct Snapshot {
    delays_ns: Vec<u64>,
    runs: Vec<u64>,
    cpu_ns: Vec<u64>,
    pressure_us: u64,
    sockets: HashSet<u64>,
}

/// One request's figures.
#[derive(Clone, Default)]
pub struct Sample {
    /// When it was sent, seconds into the row (do the slow ones come together?).
    pub at_s: f64,
    pub latency_us: u64,
    /// What the server that answered the bench says it spent (`timing.total_ms` of the answer:
    /// the proxy's arrival to answer; with the bench's own fan-out, the slowest shard's worker).
    pub served_ms: f64,
    /// Run-queue delay per watched process over the request, µs.
    pub waits_us: Vec<u64>,
    /// Times a thread of the router, and of any worker, was put on a CPU (every wake-up is one).
    pub router_runs: u64,
    pub worker_runs: u64,
    /// CPU time the router's threads spent over the request, µs (utime + stime, not counting
    /// time the host took the virtual CPU away).
    pub router_cpu_us: u64,
    pub pressure_us: u64,
    pub new_sockets: usize,
}

impl Probe {
    /// `router`: the proxy's or nginx's pid (None: the bench talks to the workers itself).
    pub fn new(router: Option<u32>, workers: &[u32]) -> Self {
        let mut watched = Vec::new();
        if let Some(pid) = router {
            watched.push(Watched::new("router", pid, true));
        }
        watched.extend(workers.iter().enumerate().map(|(i, &pid)| Watched::new(&format!("w{i}"), pid, false)));
        watched.push(Watched::new("bench", std::process::id(), false));
        Probe { router: router.map(family), watched }
    }

    pub fn snapshot(&self) -> Snapshot {
        let stats: Vec<[u64; 3]> = self
            .watched
            .iter()
            .map(|w| w.pids.iter().map(|&p| schedstat(p)).fold([0; 3], |a, s| [a[0] + s[0], a[1] + s[1], a[2] + s[2]]))
            .collect();
        Snapshot {
            cpu_ns: stats.iter().map(|s| s[0]).collect(),
            delays_ns: stats.iter().map(|s| s[1]).collect(),
            runs: stats.iter().map(|s| s[2]).collect(),
            pressure_us: cpu_pressure_us(),
            sockets: self.router.as_deref().map(sockets).unwrap_or_default(),
        }
    }

    pub fn sample(&self, before: &Snapshot, after: &Snapshot, at_s: f64, latency_us: u64, served_ms: f64) -> Sample {
        let runs: Vec<u64> = before.runs.iter().zip(&after.runs).map(|(b, a)| a.saturating_sub(*b)).collect();
        let router = usize::from(self.router.is_some());
        Sample {
            router_runs: if router == 1 { runs[0] } else { 0 },
            router_cpu_us: if router == 1 { after.cpu_ns[0].saturating_sub(before.cpu_ns[0]) / 1000 } else { 0 },
            // The bench comes last.
            worker_runs: runs[router..runs.len() - 1].iter().sum(),
            at_s,
            latency_us,
            served_ms,
            waits_us: before.delays_ns.iter().zip(&after.delays_ns).map(|(b, a)| a.saturating_sub(*b) / 1000).collect(),
            pressure_us: after.pressure_us.saturating_sub(before.pressure_us),
            new_sockets: after.sockets.difference(&before.sockets).count(),
        }
    }

    /// The medians and the slowest `max(3, 1%)` requests of a row.
    pub fn report(&self, samples: &[Sample]) {
        if samples.is_empty() {
            return;
        }
        let mut by_latency = samples.to_vec();
        by_latency.sort_by_key(|s| s.latency_us);
        let slowest = (samples.len() / 100).max(3).min(samples.len());
        let median = |f: &dyn Fn(&Sample) -> f64| {
            let mut v: Vec<f64> = samples.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let labels: String = self.watched.iter().map(|w| format!("{:>7}", w.label)).collect();
        println!(
            "      tail: the slowest {slowest} of {} and the medians; run-queue delay per process, µs \
             (path: the bench's, the router's and the slowest worker's); CPU pressure, µs; new router \
             sockets; times the router's and the workers' threads were put on a CPU; the router's CPU time, µs:",
            samples.len()
        );
        println!(
            "      {:>6} {:>8} {:>9}{labels} {:>7} {:>8} {:>5} {:>6} {:>6} {:>6}",
            "at s", "ms", "served ms", "path", "cpu psi", "conns", "r.runs", "w.runs", "r.cpu"
        );
        let router = usize::from(self.router.is_some());
        let n = self.watched.len();
        // The waits a request's answer queues behind: the bench's, the router's, the slowest worker's.
        let path = |s: &Sample| {
            let workers = s.waits_us[router..n - 1].iter().copied().max().unwrap_or(0);
            s.waits_us[n - 1] + workers + if router == 1 { s.waits_us[0] } else { 0 }
        };
        let line = |name: &str, at: f64, lat_ms: f64, served: f64, waits: &[f64], rest: [f64; 6]| {
            let w: String = waits.iter().map(|w| format!("{w:>7.0}")).collect();
            let [path, psi, conns, r_runs, w_runs, r_cpu] = rest;
            println!(
                "    {name:<3} {at:>6.2} {lat_ms:>8.3} {served:>9.3}{w} {path:>7.0} {psi:>8.0} {conns:>5.0} {r_runs:>6.0} {w_runs:>6.0} {r_cpu:>6.0}"
            );
        };
        let median_waits: Vec<f64> = (0..n).map(|i| median(&|s| s.waits_us[i] as f64)).collect();
        line(
            "p50",
            f64::NAN,
            median(&|s| s.latency_us as f64 / 1e3),
            median(&|s| s.served_ms),
            &median_waits,
            [
                median(&|s| path(s) as f64),
                median(&|s| s.pressure_us as f64),
                median(&|s| s.new_sockets as f64),
                median(&|s| s.router_runs as f64),
                median(&|s| s.worker_runs as f64),
                median(&|s| s.router_cpu_us as f64),
            ],
        );
        // How much of the slowest requests' excess over the median the run-queue delays on their
        // path match (in excess of the path's own median).
        let (lat50, path50) = (median(&|s| s.latency_us as f64), median(&|s| path(s) as f64));
        let tail = &by_latency[by_latency.len() - slowest..];
        let excess_ms = tail.iter().map(|s| s.latency_us as f64 - lat50).sum::<f64>() / 1e3 / slowest as f64;
        let waited_ms = tail.iter().map(|s| (path(s) as f64 - path50).max(0.0)).sum::<f64>() / 1e3 / slowest as f64;
        let matched = tail.iter().filter(|s| (path(s) as f64 - path50) >= (s.latency_us as f64 - lat50) / 2.0).count();
        for s in by_latency.iter().rev().take(slowest) {
            let waits: Vec<f64> = s.waits_us.iter().map(|&w| w as f64).collect();
            line(
                "",
                s.at_s,
                s.latency_us as f64 / 1e3,
                s.served_ms,
                &waits,
                [
                    path(s) as f64,
                    s.pressure_us as f64,
                    s.new_sockets as f64,
                    s.router_runs as f64,
                    s.worker_runs as f64,
                    s.router_cpu_us as f64,
                ],
            );
        }
        println!(
            "      the slowest {slowest}: {excess_ms:.3} ms over the median on average, {waited_ms:.3} ms more \
             run-queue delay on their path than the median; {matched} of {slowest} waited at least half their excess"
        );
    }
}

/// `pid` and its direct children.
fn family(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let Ok(dir) = std::fs::read_dir("/proc") else { return pids };
    for e in dir.flatten() {
        let Some(n) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{n}/stat")) else { continue };
        // After the parenthesised command name: state, then ppid.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            pids.push(n);
        }
    }
    pids
}

/// Of all of `pid`'s threads so far, the three fields of `schedstat`: time on a CPU (ns),
/// run-queue delay (ns) and the times put on a CPU.
fn schedstat(pid: u32) -> [u64; 3] {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return [0; 3] };
    tasks.flatten().filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok()).fold([0; 3], |acc, s| {
        let mut f = s.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        [0, 1, 2].map(|i| acc[i] + f.next().unwrap_or(0))
    })
}

/// The "some" line's `total=` of `/proc/pressure/cpu`, µs.
fn cpu_pressure_us() -> u64 {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|s| {
            let some = s.lines().find(|l| l.starts_with("some"))?;
            some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
        })
        .unwrap_or(0)
}

/// The socket inodes the processes hold.
fn sockets(pids: &[u32]) -> HashSet<u64> {
    let mut out = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let inode: Option<u64> =
                target.to_str().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
            out.extend(inode);
        }
    }
    out
}
