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

/// Reads and sums the current figures of every thread of this process.
pub fn process_schedstat() -> Schedstat {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Schedstat::default() };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()).fold(
        Schedstat::default(),
        |sum, line| {
            let mut f = line.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            let (running, waiting) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
            Schedstat { running_ns: sum.running_ns + running, waiting_ns: sum.waiting_ns + waiting }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_time_grows_with_work_where_schedstat_is_readable() {
        let readable = std::path::Path::new("/proc/self/schedstat").is_file();
        let before = process_schedstat();
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = process_schedstat();
        if !readable {
            assert_eq!(after, Schedstat::default(), "nothing to read, all zeros");
            return;
        }
        // 50 ms on a core spans several scheduler ticks, each of which adds to the running time.
        assert!(after.running_ns > before.running_ns, "{before:?} -> {after:?}");
        assert!(after.waiting_ns >= before.waiting_ns, "{before:?} -> {after:?}");
    }
}
