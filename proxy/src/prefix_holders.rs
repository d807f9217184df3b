//! Which workers hold which shared prefixes in their prefix cache, learnt from their answers:
//! a worker that answered a call whose prefix is P has just committed P's blocks
//! (`usage.prefix_tokens`), so for a while it holds P. The cost split prices that: the prefix's
//! compute is not paid on a holder (`split::Candidate::holds_prefix`), and the makespan and load
//! price trade the saving against the holder's queue. No protocol round-trip: answers only.
//!
//! Prefix digest (instruction and query, the pair cache's) → up to [`MAX_HOLDERS`] recent
//! holders, in a `moka` cache bounded in entries (`[split] prefix_holders_entries`). The worker's
//! LRU is not visible from here; a holder is trusted for `[split] prefix_holders_ttl_ms` after
//! its last answer for P, an approximation of how long the worker keeps a block nobody uses.
//! What is forgotten: a worker's every holding when it may have lost its cache (restart, model or
//! template change: `Worker::forget_prefixes` bumps its generation, and entries of an older
//! generation no longer count), and one holding when the worker answered a call expected to hit
//! with less than the whole prefix cached (it evicted sooner than the TTL guessed). A worker
//! counts as a holder only once one of its answers has shown a prefix-cache hit (a real
//! worker's calls share the template's blocks, so that is its second call): one without a
//! prefix cache never does, and is planned as it was before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::sync::Cache;
use sieve_shared::proxy_config::SplitConfig;

use crate::cluster::worker::{Worker, WorkerView};
use crate::metrics as m;

/// Holders remembered per prefix: a prefix is worth routing to a few workers, not all.
pub const MAX_HOLDERS: usize = 4;

/// One worker's holding of one prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    /// The worker's [`Worker::prefix_key`].
    worker: u64,
    /// Its prefix generation when it answered.
    generation: u64,
    /// When it last answered a call with this prefix.
    at: Instant,
}

pub struct PrefixHolders {
    entries: Cache<u128, Arc<[Holder]>>,
    ttl: Duration,
}

impl PrefixHolders {
    /// An empty map sized by `cfg` (read once: a restart applies changes).
    pub fn new(cfg: &SplitConfig) -> Self {
        let ttl = Duration::from_millis(cfg.prefix_holders_ttl_ms.max(1));
        let entries = Cache::builder().max_capacity(cfg.prefix_holders_entries).time_to_live(ttl).build();
        PrefixHolders { entries, ttl }
    }

    fn live(&self, h: &Holder, w: &Worker, now: Instant) -> bool {
        w.has_prefix_cache()
            && h.worker == w.prefix_key()
            && h.generation == w.prefix_generation()
            && now.saturating_duration_since(h.at) < self.ttl
    }

    /// Whether `w` holds `prefix` now, as far as its answers tell.
    pub fn holds(&self, prefix: u128, w: &Worker, now: Instant) -> bool {
        self.entries.get(&prefix).is_some_and(|hs| hs.iter().any(|h| self.live(h, w, now)))
    }

    /// Marks, in `views` (one per worker of `workers`), the workers that hold `prefix`: one
    /// look-up per request.
    pub fn mark(&self, prefix: u128, workers: &[Arc<Worker>], views: &mut [WorkerView], now: Instant) {
        let Some(hs) = self.entries.get(&prefix) else { return };
        for (w, v) in workers.iter().zip(views.iter_mut()) {
            v.holds_prefix = hs.iter().any(|h| self.live(h, w, now));
        }
    }

    /// What one complete answer of `w` for a call with `prefix` teaches: it holds the prefix
    /// now, unless it was expected to hold it and answered with less than all of it cached (its
    /// LRU evicted the prefix sooner than the TTL guessed): then the stale holding is forgotten,
    /// not renewed.
    pub fn observe(&self, prefix: u128, w: &Worker, prefix_tokens: u32, cached_prefix_tokens: u32, now: Instant) {
        if prefix_tokens == 0 {
            return;
        }
        if cached_prefix_tokens > 0 {
            w.note_prefix_hit();
        }
        let holders = self.entries.get(&prefix);
        let expected = holders.as_ref().is_some_and(|hs| hs.iter().any(|h| self.live(h, w, now)));
        if expected {
            let hit = cached_prefix_tokens >= prefix_tokens;
            metrics::counter!(m::PREFIX_AFFINITY_CHECKS, "outcome" => if hit { "hit" } else { "miss" }).increment(1);
            if !hit {
                self.forget(prefix, w);
                return;
            }
        }
        if holders.is_some_and(|hs| hs.iter().any(|h| self.just_renewed(h, w, now))) {
            return;
        }
        self.record(prefix, w, now);
    }

    /// Whether `h` is `w` renewed less than a thousandth of the TTL ago: renewing it again
    /// would change when it expires by less than that, and costs a cache write (a handful of
    /// allocations and the cache's upkeep), which under steady traffic on one prefix would be
    /// every answer's, and every shard's when a request is split (each shard's worker is a
    /// different holder, so not only the most recent one is looked at). The holders stay in
    /// order of renewal to within that thousandth: every holder ahead of `h` is more recent.
    fn just_renewed(&self, h: &Holder, w: &Worker, now: Instant) -> bool {
        h.worker == w.prefix_key()
            && h.generation == w.prefix_generation()
            && now.saturating_duration_since(h.at) < self.ttl / 1000
    }

    /// `w` holds `prefix` from `now`: it becomes the most recent holder; the oldest holders
    /// past [`MAX_HOLDERS`] (and any no longer live) are dropped.
    pub fn record(&self, prefix: u128, w: &Worker, now: Instant) {
        let me = Holder { worker: w.prefix_key(), generation: w.prefix_generation(), at: now };
        let ttl = self.ttl;
        self.entries.entry(prefix).and_upsert_with(|old| {
            let mut hs: Vec<Holder> = vec![me];
            if let Some(old) = old {
                hs.extend(
                    old.value()
                        .iter()
                        .filter(|h| h.worker != me.worker && now.saturating_duration_since(h.at) < ttl)
                        .take(MAX_HOLDERS - 1),
                );
            }
            hs.into()
        });
    }

    /// `w` no longer counts as holding `prefix`.
    pub fn forget(&self, prefix: u128, w: &Worker) {
        let key = w.prefix_key();
        let _ = self.entries.entry(prefix).and_compute_with(|old| {
            use moka::ops::compute::Op;
            match old {
                None => Op::Nop,
                Some(old) => {
                    let hs: Vec<Holder> = old.value().iter().filter(|h| h.worker != key).copied().collect();
                    if hs.is_empty() {
                        Op::Remove
                    } else {
                        Op::Put(hs.into())
                    }
                }
            }
        });
    }

    /// Prefixes held (moka's count, after its pending upkeep).
    pub fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use sieve_shared::proxy_config::BreakerConfig;
    use sieve_shared::{WorkerEndpoint, WorkerStats};

    use super::*;
    use crate::cluster::worker::Health;

    /// A worker whose answers have shown a prefix cache.
    fn worker(port: u16) -> Arc<Worker> {
        let w = fresh(port);
        w.note_prefix_hit();
        w
    }

    fn fresh(port: u16) -> Arc<Worker> {
        let url = format!("http://127.0.0.1:{port}");
        let endpoint = WorkerEndpoint::new(url, Some("http://127.0.0.1:1".into()));
        Arc::new(Worker::new(endpoint, BreakerConfig::default()).unwrap())
    }
    fn map(entries: u64, ttl_ms: u64) -> PrefixHolders {
        PrefixHolders::new(&SplitConfig {
            prefix_holders_entries: entries,
            prefix_holders_ttl_ms: ttl_ms,
            ..SplitConfig::default()
        })
    }

    #[test]
    fn an_answer_makes_a_holder_and_a_short_answer_forgets_it() {
        let h = map(100, 60_000);
        let (a, b) = (worker(10), worker(11));
        let now = Instant::now();
        assert!(!h.holds(1, &a, now));
        h.observe(1, &a, 45, 0, now);
        assert!(h.holds(1, &a, now) && !h.holds(1, &b, now) && !h.holds(2, &a, now));
        h.observe(1, &b, 45, 32, now);
        assert!(h.holds(1, &a, now) && h.holds(1, &b, now), "several holders");
        // Expected to hit, answered with the head blocks only: forgotten, not renewed.
        h.observe(1, &a, 45, 32, now);
        assert!(!h.holds(1, &a, now) && h.holds(1, &b, now));
        // A worker whose answers never show a prefix-cache hit has none: never a holder.
        let c = fresh(12);
        h.observe(1, &c, 45, 0, now);
        assert!(!h.holds(1, &c, now));
        h.observe(2, &c, 45, 32, now);
        assert!(h.holds(1, &c, now) && h.holds(2, &c, now), "a hit shows its cache: its holdings count");
        // A call without a prefix teaches nothing.
        h.observe(3, &a, 0, 0, now);
        assert!(!h.holds(3, &a, now));
        // Marks the views of holders only.
        let mut views = vec![
            WorkerView {
                backlog_ms: 0.0,
                in_flight: 0,
                time_factor: 1.0,
                max_batch_tokens: 0,
                holds_prefix: false
            };
            2
        ];
        h.mark(1, &[a.clone(), b.clone()], &mut views, now);
        assert_eq!(views.iter().map(|v| v.holds_prefix).collect::<Vec<_>>(), vec![false, true]);
    }

    #[test]
    fn holdings_age_out_and_are_bounded() {
        let h = map(100, 1_000);
        let a = worker(10);
        let t0 = Instant::now();
        h.record(1, &a, t0);
        assert!(h.holds(1, &a, t0 + Duration::from_millis(999)));
        assert!(!h.holds(1, &a, t0 + Duration::from_millis(1_000)), "aged out after the TTL");
        // An answer within a thousandth of the TTL of the last renewal leaves it as it is (the
        // holding still ends a TTL after t0); a later one renews it.
        h.observe(1, &a, 45, 45, t0 + Duration::from_micros(500));
        assert!(!h.holds(1, &a, t0 + Duration::from_millis(1_000)), "not renewed within 1 ms");
        h.observe(1, &a, 45, 45, t0 + Duration::from_millis(2));
        assert!(h.holds(1, &a, t0 + Duration::from_millis(1_001)), "renewed after 1 ms");
        // So is a holder behind a more recent one (a split request's shards on several workers).
        let b = worker(11);
        h.record(1, &b, t0 + Duration::from_micros(2_100));
        h.observe(1, &a, 45, 45, t0 + Duration::from_micros(2_500));
        assert!(!h.holds(1, &a, t0 + Duration::from_millis(1_002)), "the second holder not renewed within 1 ms");
        assert!(h.holds(1, &b, t0 + Duration::from_millis(1_002)));
        // At most MAX_HOLDERS per prefix: the oldest goes.
        let ws: Vec<_> = (0..MAX_HOLDERS as u16 + 2).map(|i| worker(20 + i)).collect();
        for (i, w) in ws.iter().enumerate() {
            h.record(7, w, t0 + Duration::from_millis(i as u64));
        }
        let now = t0 + Duration::from_millis(10);
        let held: Vec<bool> = ws.iter().map(|w| h.holds(7, w, now)).collect();
        assert_eq!(held.iter().filter(|&&x| x).count(), MAX_HOLDERS);
        assert!(!held[0] && !held[1] && held[MAX_HOLDERS + 1], "{held:?}");
        // At most `entries` prefixes.
        let small = map(50, 60_000);
        for p in 0..1_000u128 {
            small.record(p, &a, t0);
        }
        let n = small.entry_count();
        assert!(n > 0 && n <= 50, "{n} prefixes held, bound 50");
    }

    #[test]
    fn a_restart_or_another_model_forgets_every_holding() {
        let h = map(100, 60_000);
        let a = worker(10);
        let now = Instant::now();
        let stats = |requests, model: &str, template: &str| WorkerStats {
            requests_processed: requests,
            model: model.into(),
            template: template.into(),
            ..WorkerStats::default()
        };
        a.record_health(now, Health::Ready, None, Some(stats(10, "m", "t")));
        h.record(1, &a, now);
        a.note_prefix_hit();
        a.record_health(now, Health::Ready, None, Some(stats(12, "m", "t")));
        assert!(h.holds(1, &a, now), "a check that finds nothing new keeps it");
        a.record_health(now, Health::Ready, None, Some(stats(3, "m", "t")));
        assert!(!h.holds(1, &a, now), "fewer requests processed: restarted between checks");
        h.record(1, &a, now);
        a.note_prefix_hit();
        a.record_health(now, Health::Unreachable, None, None);
        a.record_health(now, Health::Ready, None, Some(stats(4, "m", "t")));
        assert!(!h.holds(1, &a, now), "came back from unreachable");
        h.record(1, &a, now);
        a.note_prefix_hit();
        a.record_health(now, Health::Ready, None, Some(stats(5, "m", "t2")));
        assert!(!h.holds(1, &a, now), "another template");
        h.record(1, &a, now);
        a.note_prefix_hit();
        a.record_health(now, Health::Ready, None, Some(stats(6, "m2", "t2")));
        assert!(!h.holds(1, &a, now), "another model");
        // Learnt again from the next answers, once one shows its prefix cache again.
        h.observe(1, &a, 45, 0, now);
        assert!(!h.holds(1, &a, now), "no hit seen since the restart");
        h.observe(2, &a, 45, 32, now);
        assert!(h.holds(1, &a, now) && h.holds(2, &a, now));
    }
}
