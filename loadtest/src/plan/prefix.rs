//! The workers' prefix-cache hit rate against cache blocks per worker: a model, not a replay
//! through the worker's code (the planner runs no real worker).
//!
//! - A call's prompts share a prefix (template head, instruction, query) of the traced
//!   `prefix_tokens`; the worker caches it in whole 16-token blocks (`kv_block_size`), so a
//!   prefix of P tokens is P / 16 blocks, the partial last block never cached.
//! - Blocks entirely inside the template head (the simulated worker's 40 tokens) are the same
//!   for every query of an instruction; the later ones are the query's own. A lookup walks the
//!   blocks in order and stops at the first miss (a block is only reusable after the ones
//!   before it, as in the worker's chained block hashes); every block of the call is then held
//!   (inserted or refreshed, last block first, so a prefix's tail is evicted before its head).
//! - Each worker holds `blocks` blocks, least recently used evicted first.
//! - Routing, approximated: a request is split into `min(workers, ceil(items / 32))` shards
//!   (the cost split's fan-out on a loaded cluster is about that), each shard a call on its
//!   own worker. `spread`: the shards go to workers drawn at random per request (the
//!   least-loaded balancer knows nothing of prefixes); `affine`: to the same workers for the
//!   same query (the top of a rendezvous hash of the query), what prefix-aware routing aims at.
//! - Arrival order only: a call in flight does not hold its blocks earlier than its arrival.
//! - Only what reached the workers when the trace was taken: items the proxy answered from its
//!   pair cache are left out of the fan-out, and a request answered wholly from it made no
//!   call (its traced `prefix_tokens` is 0).

use std::collections::{BTreeMap, HashMap};

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::sim::tokens::TEMPLATE_HEAD_TOKENS;
use crate::trace::synth::{Replay, INSTRUCTION_WORDS, MAX_WORDS};

/// Tokens per cached block (the worker's `kv_block_size`).
pub const BLOCK_TOKENS: u32 = 16;
/// Items per shard in the fan-out approximation.
pub const ITEMS_PER_SHARD: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Shards to workers drawn at random: today's least-loaded balancing.
    Spread,
    /// Shards of a query to the same workers: prefix-aware routing.
    Affine,
}

impl Routing {
    pub fn key(self) -> &'static str {
        match self {
            Routing::Spread => "spread",
            Routing::Affine => "affine",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefixPoint {
    pub routing: Routing,
    pub workers: usize,
    pub blocks_per_worker: usize,
    /// Prefix blocks looked up (calls × whole blocks).
    pub lookups: u64,
    pub hits: u64,
    pub hit_rate: f64,
    /// Prefix tokens served from cache per request.
    pub saved_tokens_per_request: f64,
}

/// One worker's cache: block → last use, and last use → block for the eviction order.
struct Lru {
    cap: usize,
    stamp: u64,
    by_key: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl Lru {
    fn new(cap: usize) -> Lru {
        Lru { cap, stamp: 0, by_key: HashMap::new(), by_age: BTreeMap::new() }
    }

    fn contains(&self, k: u64) -> bool {
        self.by_key.contains_key(&k)
    }

    /// Marks `k` used now, evicting the least recently used block when full.
    fn touch(&mut self, k: u64) {
        if self.cap == 0 {
            return;
        }
        self.stamp += 1;
        if let Some(old) = self.by_key.insert(k, self.stamp) {
            self.by_age.remove(&old);
        } else if self.by_key.len() > self.cap {
            if let Some((_, oldest)) = self.by_age.pop_first() {
                self.by_key.remove(&oldest);
            }
        }
        self.by_age.insert(self.stamp, k);
    }
}

/// The hit rate with `workers` workers of `blocks` blocks each.
pub fn hit_rate(replay: &Replay, workers: usize, blocks: usize, routing: Routing, seed: u64) -> PrefixPoint {
    let workers = workers.max(1);
    let mut caches: Vec<Lru> = (0..workers).map(|_| Lru::new(blocks)).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut hits, mut lookups) = (0u64, 0u64);
    for r in replay.records() {
        // Items the proxy answered from its pair cache went to no worker; a request answered
        // wholly from it made no call at all.
        let sent_items = r.items.len().saturating_sub(r.cached_items as usize);
        if sent_items == 0 {
            continue;
        }
        let prefix = if r.prefix_tokens > 0 {
            r.prefix_tokens
        } else {
            let own = if r.instruction.is_some() { INSTRUCTION_WORDS } else { 0 };
            TEMPLATE_HEAD_TOKENS + own + replay.lengths().query_words(r.query, r.instruction)
        };
        // Bounded as the replayed texts are: an absurd traced count costs no more than that.
        let n_blocks = prefix.min(TEMPLATE_HEAD_TOKENS + MAX_WORDS) / BLOCK_TOKENS;
        let head_blocks = TEMPLATE_HEAD_TOKENS / BLOCK_TOKENS;
        let block = |j: u32| {
            let mut b = [0u8; 21];
            b[..8].copy_from_slice(&r.instruction.unwrap_or(0).to_le_bytes());
            b[8] = u8::from(r.instruction.is_some());
            if j >= head_blocks {
                b[9..17].copy_from_slice(&r.query.to_le_bytes());
            }
            b[17..].copy_from_slice(&j.to_le_bytes());
            xxh3_64(&b)
        };
        let shards = sent_items.div_ceil(ITEMS_PER_SHARD).clamp(1, workers);
        let chosen: Vec<usize> = match routing {
            Routing::Spread => sample(&mut rng, workers, shards).into_vec(),
            Routing::Affine => {
                let mut ranked: Vec<(u64, usize)> = (0..workers)
                    .map(|w| (xxh3_64(&[r.query.to_le_bytes(), (w as u64).to_le_bytes()].concat()), w))
                    .collect();
                ranked.sort_unstable();
                ranked.iter().take(shards).map(|&(_, w)| w).collect()
            }
        };
        for w in chosen {
            let cache = &mut caches[w];
            let found = (0..n_blocks).take_while(|&j| cache.contains(block(j))).count() as u64;
            lookups += u64::from(n_blocks);
            hits += found;
            // Last block first: the head ends up most recent, so a prefix's tail is evicted
            // before its head (as vLLM frees a sequence's blocks).
            for j in (0..n_blocks).rev() {
                cache.touch(block(j));
            }
        }
    }
    let requests = replay.len().max(1) as f64;
    PrefixPoint {
        routing,
        workers,
        blocks_per_worker: blocks,
        lookups,
        hits,
        hit_rate: hits as f64 / lookups.max(1) as f64,
        saved_tokens_per_request: (hits * u64::from(BLOCK_TOKENS)) as f64 / requests,
    }
}

/// The curve over `blocks` per worker, for both routings.
pub fn curve(replay: &Replay, workers: usize, blocks: &[usize], seed: u64) -> Vec<PrefixPoint> {
    [Routing::Spread, Routing::Affine]
        .iter()
        .flat_map(|&routing| blocks.iter().map(move |&b| (routing, b)))
        .map(|(routing, b)| hit_rate(replay, workers, b, routing, seed))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRecord;

    fn rec(query: u64, items: usize, prefix_tokens: u32) -> TraceRecord {
        TraceRecord {
            t_ms: 0,
            query,
            instruction: None,
            items: (0..items as u64).collect(),
            item_tokens: vec![20; items],
            prefix_tokens,
            cached_items: 0,
            missing: 0,
            deadline_ms: None,
            status: 200,
            latency_ms: 1.0,
        }
    }

    #[test]
    fn the_head_is_shared_the_query_blocks_are_not() {
        // 80-token prefixes: 5 blocks, 2 of them inside the 40-token head.
        let replay = Replay::new(vec![rec(1, 10, 80), rec(2, 10, 80), rec(1, 10, 80)]);
        let p = hit_rate(&replay, 1, 100, Routing::Spread, 1);
        // First: 0 of 5; second: the 2 head blocks; third: all 5.
        assert_eq!((p.hits, p.lookups), (7, 15));
        assert_eq!(p.saved_tokens_per_request, 7.0 * 16.0 / 3.0);
        // Two blocks per worker: the head survives, the query blocks do not.
        let p = hit_rate(&replay, 1, 2, Routing::Spread, 1);
        assert_eq!(p.hits, 4);
        assert_eq!(hit_rate(&replay, 1, 0, Routing::Spread, 1).hits, 0, "no cache, no hits");
    }

    #[test]
    fn a_request_answered_from_the_pair_cache_makes_no_call() {
        let mut cached = rec(1, 10, 80);
        cached.cached_items = 10;
        cached.prefix_tokens = 0;
        let replay = Replay::new(vec![rec(1, 10, 80), cached, rec(1, 10, 80)]);
        let p = hit_rate(&replay, 1, 100, Routing::Spread, 1);
        assert_eq!((p.hits, p.lookups), (5, 10));
    }

    #[test]
    fn affine_routing_finds_the_prefix_where_spread_often_does_not() {
        // 40 queries asked 10 times each, 1 shard per request, on 8 workers.
        let records: Vec<TraceRecord> = (0..400).map(|i| rec(i % 40, 20, 120)).collect();
        let replay = Replay::new(records);
        let spread = hit_rate(&replay, 8, 10_000, Routing::Spread, 3);
        let affine = hit_rate(&replay, 8, 10_000, Routing::Affine, 3);
        // Affine: every repeat hits all 7 blocks (a first ask, at most its 2 head blocks);
        // spread misses the query blocks on a worker the query has not been to.
        assert!((360 * 7..=360 * 7 + 80).contains(&affine.hits), "{affine:?}");
        assert!(spread.hit_rate < affine.hit_rate, "{spread:?} {affine:?}");
    }
}
