//! The pair-score cache's hit rate against its size, by replaying the trace's pairs through the
//! proxy's own cache: moka built by `sieve_shared::pair_key` (the same key over the same
//! synthesised texts `run --trace` sends, the same entry weight, hasher and so the same TinyLFU
//! admission and eviction), driven as the proxy drives it:
//!
//! - at a request's arrival every item is looked up (hits and misses counted, as
//!   `sieve_proxy_cache_hits_total` / `misses_total` count them, whatever the answer);
//! - the misses are stored when the request is answered (arrival + the traced latency), only
//!   for a request answered 200 and only its scored items (a traced count of 0 is an item the
//!   workers left unscored): a repeat arriving before the first answer misses, as in the proxy;
//! - the TTL runs on the trace's clock (an entry stored longer than `ttl_ms` ago of trace time
//!   is a miss and is dropped), since the replay is faster than the trace.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use serde::Serialize;
use sieve_shared::pair_key::{self, digest_of_item, digest_of_model, digest_of_prefix, key, BuildDigestHasher};

use crate::trace::synth::{text, Replay, INSTRUCTION_WORDS};

/// One point of the curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairPoint {
    pub max_bytes: u64,
    /// Entries the size holds (`max_bytes / ENTRY_BYTES`).
    pub entries: u64,
    pub hits: u64,
    pub lookups: u64,
    pub hit_rate: f64,
}

/// Replays the trace's pairs through a cache of `max_bytes` with entries living `ttl_ms`.
pub fn hit_rate(replay: &Replay, max_bytes: u64, ttl_ms: u64) -> PairPoint {
    // The value: when the entry was stored, in trace ms (the TTL on the trace's clock).
    let cache = pair_key::builder::<u64>(max_bytes, Duration::from_millis(ttl_ms.max(1)))
        .build_with_hasher(BuildDigestHasher::default());
    let model = digest_of_model("trace", "");
    let mut digests = Digests::default();
    // Stores waiting for their request's answer: (due trace ms, request index).
    let mut due: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut misses_of: HashMap<usize, Vec<u128>> = HashMap::new();
    let (mut hits, mut lookups) = (0u64, 0u64);
    for (i, r) in replay.records().iter().enumerate() {
        while let Some(&Reverse((t, j))) = due.peek() {
            if t > r.t_ms {
                break;
            }
            due.pop();
            for k in misses_of.remove(&j).unwrap_or_default() {
                cache.insert(k, t);
            }
        }
        let prefix = digests.prefix(replay, r.query, r.instruction);
        let mut store = Vec::new();
        for (n, &h) in r.items.iter().enumerate() {
            let k = key(model, prefix, digests.item(replay, h));
            lookups += 1;
            match cache.get(&k) {
                Some(stored) if r.t_ms.saturating_sub(stored) < ttl_ms => hits += 1,
                found => {
                    if found.is_some() {
                        cache.invalidate(&k);
                    }
                    if r.answered() && r.item_tokens[n] > 0 {
                        store.push(k);
                    }
                }
            }
        }
        if !store.is_empty() {
            misses_of.insert(i, store);
            due.push(Reverse((r.t_ms + r.latency_ms.max(0.0).ceil() as u64, i)));
        }
    }
    PairPoint {
        max_bytes,
        entries: max_bytes / u64::from(pair_key::ENTRY_BYTES),
        hits,
        lookups,
        hit_rate: hits as f64 / lookups.max(1) as f64,
    }
}

/// The curve over `sizes` (bytes), one replay per size.
pub fn curve(replay: &Replay, sizes: &[u64], ttl_ms: u64) -> Vec<PairPoint> {
    sizes.iter().map(|&b| hit_rate(replay, b, ttl_ms)).collect()
}

/// Digests of the synthesised texts, made once per hash.
#[derive(Default)]
struct Digests {
    items: HashMap<u64, u128>,
    prefixes: HashMap<(u64, Option<u64>), u128>,
}

impl Digests {
    fn item(&mut self, replay: &Replay, h: u64) -> u128 {
        *self.items.entry(h).or_insert_with(|| digest_of_item(&text(h, replay.lengths().item_words(h))))
    }

    fn prefix(&mut self, replay: &Replay, query: u64, instruction: Option<u64>) -> u128 {
        *self.prefixes.entry((query, instruction)).or_insert_with(|| {
            let q = text(query, replay.lengths().query_words(query, instruction));
            let i = instruction.map(|h| text(h, INSTRUCTION_WORDS));
            digest_of_prefix(i.as_deref(), &q)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRecord;

    fn rec(t_ms: u64, query: u64, items: Vec<u64>, latency_ms: f64) -> TraceRecord {
        TraceRecord {
            t_ms,
            query,
            instruction: None,
            item_tokens: vec![20; items.len()],
            items,
            prefix_tokens: 44,
            cached_items: 0,
            missing: 0,
            deadline_ms: None,
            status: 200,
            latency_ms,
        }
    }

    #[test]
    fn repeats_hit_once_answered_and_within_the_ttl() {
        let big = 1 << 20;
        let records = vec![
            rec(0, 1, vec![1, 2, 3, 4], 100.0),
            // Before the first answer: all misses.
            rec(50, 1, vec![1, 2, 3, 4], 100.0),
            // After it: 4 hits; another query's same items: misses (the key is the pair).
            rec(200, 1, vec![1, 2, 3, 4], 10.0),
            rec(210, 2, vec![1, 2], 10.0),
            // Past the TTL (1000 ms of trace time after the store at 100 ms/150 ms).
            rec(2000, 1, vec![1, 2], 10.0),
        ];
        let p = hit_rate(&Replay::new(records.clone()), big, 1000);
        assert_eq!((p.hits, p.lookups), (4, 16));
        // A failed request stores nothing; an unscored item is not stored.
        let mut failed = records[0].clone();
        failed.status = 429;
        failed.item_tokens.clear();
        let mut partial = rec(300, 1, vec![1, 2, 3, 4], 10.0);
        partial.item_tokens[3] = 0;
        let p = hit_rate(&Replay::new(vec![failed, partial, rec(500, 1, vec![1, 2, 3, 4], 10.0)]), big, 60_000);
        assert_eq!(p.hits, 3);
        // A cache too small for one entry holds nothing.
        assert_eq!(hit_rate(&Replay::new(records), 0, 60_000).hits, 0);
    }

    #[test]
    fn a_bigger_cache_hits_no_less() {
        // 300 requests of 50 items, a third of them repeats of an early request.
        let records: Vec<TraceRecord> = (0..300u64)
            .map(|i| {
                let q = if i % 3 == 2 { i % 30 } else { 1000 + i };
                rec(i * 10, q, (0..50).map(|k| q * 100 + k).collect(), 1.0)
            })
            .collect();
        let replay = Replay::new(records);
        let sizes: Vec<u64> = [100u64, 1000, 4000, 100_000].iter().map(|e| e * 128).collect();
        let c = curve(&replay, &sizes, 600_000);
        assert!(c.windows(2).all(|w| w[0].hit_rate <= w[1].hit_rate + 0.01), "{c:?}");
        // 90 of the 300 requests repeat an answered one: 30% of the lookups, all found when
        // nothing is evicted; a 100-entry cache holds two requests' pairs.
        assert_eq!(c[3].hit_rate, 0.3, "{c:?}");
        assert!(c[0].hit_rate < 0.05, "{c:?}");
    }
}
