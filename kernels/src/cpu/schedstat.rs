//! This process's scheduler figures, summed over its threads (Linux
//! `/proc/self/task/*/schedstat`: time on a core, time runnable but waiting for one). The MoE
//! calibration discounts the waiting (other processes on shared cores are not a variant's cost)
//! and the MoE benches report CPU time beside wall time; one reader serves both.

/// Nanoseconds this process's threads have spent so far; zeros where `schedstat` is not
/// readable (not Linux, or no schedstats in the kernel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schedstat {
    /// On a core.
    pub running_ns: u64,
    /// Runnable but waiting for a core.
    pub waiting_ns: u64,
}

/// Reads and sums the current figures of every thread of this process. Threads that have
/// exited are no longer counted, so the sum is monotonic only over threads that live through
/// both readings (the worker's pool threads do).
pub fn process_schedstat() -> Schedstat {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Schedstat::default() };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()).map(|line| parse(&line)).fold(
        Schedstat::default(),
        |sum, t| Schedstat { running_ns: sum.running_ns + t.running_ns, waiting_ns: sum.waiting_ns + t.waiting_ns },
    )
}

/// One task's `schedstat` line: running ns, waiting ns, timeslices.
fn parse(line: &str) -> Schedstat {
    let mut f = line.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
    Schedstat { running_ns: f.next().unwrap_or(0), waiting_ns: f.next().unwrap_or(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's own figures: the process sum cannot be compared over time in a test
    /// binary, whose other tests' threads exit between two readings (CI saw the sum's waiting
    /// time fall).
    fn this_thread() -> Option<Schedstat> {
        std::fs::read_to_string("/proc/thread-self/schedstat").ok().map(|l| parse(&l))
    }

    #[test]
    fn running_time_grows_with_work_where_schedstat_is_readable() {
        let Some(before) = this_thread() else {
            assert_eq!(process_schedstat(), Schedstat::default(), "nothing to read, all zeros");
            return;
        };
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = this_thread().expect("readable a moment ago");
        // 50 ms never asleep: on a core or waiting for one, and on a core at some point.
        assert!(after.running_ns > before.running_ns, "{before:?} -> {after:?}");
        let spent = (after.running_ns + after.waiting_ns) - (before.running_ns + before.waiting_ns);
        assert!(spent >= 25_000_000, "{before:?} -> {after:?}");
        // The process sum counts this live thread among the others.
        let process = process_schedstat();
        assert!(process.running_ns >= after.running_ns, "{after:?} within {process:?}");
    }

    #[test]
    fn a_line_reads_running_then_waiting() {
        assert_eq!(parse("123 45 6\n"), Schedstat { running_ns: 123, waiting_ns: 45 });
        assert_eq!(parse("garbage"), Schedstat::default());
    }
}
