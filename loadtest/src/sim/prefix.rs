//! The simulated worker's prefix cache: an LRU over the 16-token blocks of calls' shared
//! prefixes (template head, instruction, query), bounded in blocks, so a call whose prefix the
//! worker computed recently pays less compute and reports `cached_prefix_tokens` as a real
//! worker does (`worker/src/engine/prefix_cache.rs`).
//!
//! Like the worker, a prefix is cut into full blocks matched as a chain from the first, and a
//! partial tail block matched only exactly. The simulated tokenizer has no token ids, so a
//! block is keyed by the text it covers: a block wholly inside the template head is the same for
//! every call, one that reaches into the instruction is keyed by the instruction, and one that
//! reaches into the query by instruction and query (and its index, and whether it is the tail).
//! A call looks its blocks up when it starts computing and commits them when it succeeds.
//!
//! The LRU is a map key → last use and an ordered index last use → key: O(log n) per block,
//! and the same evictions every run (no clock, no randomness).

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use super::tokens;

/// Tokens per block, as the worker's KV blocks on CPU.
pub const BLOCK_TOKENS: u32 = 16;

/// The block keys of one call's prefix, first block first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixBlocks {
    keys: Vec<u64>,
    /// Tokens in each block (the last may be partial).
    sizes: Vec<u32>,
}

impl PrefixBlocks {
    /// The blocks of the prefix (template head, instruction, query) of a call.
    pub fn of(query: &str, instruction: Option<&str>) -> Self {
        let head = tokens::TEMPLATE_HEAD_TOKENS;
        let with_instruction = head + instruction.map_or(0, tokens::count_tokens);
        let total = tokens::prefix_tokens(query, instruction);
        let n = total.div_ceil(BLOCK_TOKENS);
        let mut keys = Vec::with_capacity(n as usize);
        let mut sizes = Vec::with_capacity(n as usize);
        for b in 0..n {
            let end = ((b + 1) * BLOCK_TOKENS).min(total);
            let tail = end - b * BLOCK_TOKENS < BLOCK_TOKENS;
            let mut h = DefaultHasher::new();
            (b, tail).hash(&mut h);
            if end > head {
                instruction.hash(&mut h);
            }
            if end > with_instruction {
                query.hash(&mut h);
            }
            keys.push(h.finish());
            sizes.push(end - b * BLOCK_TOKENS);
        }
        PrefixBlocks { keys, sizes }
    }

    pub fn tokens(&self) -> u32 {
        self.sizes.iter().sum()
    }
}

/// The LRU of committed prefix blocks of one simulated worker.
pub struct PrefixCache {
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Default)]
struct Lru {
    last_use: HashMap<u64, u64>,
    by_use: BTreeMap<u64, u64>,
    clock: u64,
    lookups: u64,
    hit_tokens: u64,
    lookup_tokens: u64,
}

impl Lru {
    fn touch(&mut self, key: u64) {
        self.clock += 1;
        if let Some(old) = self.last_use.insert(key, self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, key);
    }
}

/// What `/stats` shows of the cache.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PrefixCacheStats {
    pub capacity_blocks: usize,
    pub blocks: usize,
    pub lookups: u64,
    /// Prefix tokens looked up, and of them found cached.
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    /// `hit_tokens / lookup_tokens` (0 before any lookup).
    pub hit_rate: f64,
}

impl PrefixCache {
    /// A cache of at most `capacity` blocks; 0 holds nothing (every lookup misses).
    pub fn new(capacity: usize) -> Self {
        PrefixCache { capacity, inner: Mutex::new(Lru::default()) }
    }

    fn lru(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tokens of `blocks` held: full blocks matched as a chain from the first, the tail only
    /// when every block before it matched. The matched blocks count as used.
    pub fn lookup(&self, blocks: &PrefixBlocks) -> u32 {
        let mut lru = self.lru();
        lru.lookups += 1;
        lru.lookup_tokens += u64::from(blocks.tokens());
        let mut cached = 0;
        for (&key, &size) in blocks.keys.iter().zip(&blocks.sizes) {
            if !lru.last_use.contains_key(&key) {
                break;
            }
            lru.touch(key);
            cached += size;
        }
        lru.hit_tokens += u64::from(cached);
        cached
    }

    /// Commits `blocks` (a call that computed them succeeded), evicting the least recently
    /// used blocks past the capacity.
    pub fn commit(&self, blocks: &PrefixBlocks) {
        if self.capacity == 0 {
            return;
        }
        let mut lru = self.lru();
        for &key in &blocks.keys {
            lru.touch(key);
        }
        while lru.last_use.len() > self.capacity {
            let Some((_, key)) = lru.by_use.pop_first() else { break };
            lru.last_use.remove(&key);
        }
    }

    /// Drops every block (a restart or model change).
    pub fn clear(&self) {
        let mut lru = self.lru();
        lru.last_use.clear();
        lru.by_use.clear();
    }

    pub fn stats(&self) -> PrefixCacheStats {
        let lru = self.lru();
        PrefixCacheStats {
            capacity_blocks: self.capacity,
            blocks: lru.last_use.len(),
            lookups: lru.lookups,
            lookup_tokens: lru.lookup_tokens,
            hit_tokens: lru.hit_tokens,
            hit_rate: if lru.lookup_tokens == 0 { 0.0 } else { lru.hit_tokens as f64 / lru.lookup_tokens as f64 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_share_the_template_head_and_key_the_query_part() {
        // 40 head tokens + 4 query tokens: two full head blocks, a 12-token tail.
        let a = PrefixBlocks::of("red shoes for men", None);
        let b = PrefixBlocks::of("blue hats for kids", None);
        assert_eq!(a.sizes, vec![16, 16, 12]);
        assert_eq!(a.tokens(), tokens::prefix_tokens("red shoes for men", None));
        assert_eq!(a.keys[..2], b.keys[..2], "head blocks are every call's");
        assert_ne!(a.keys[2], b.keys[2], "the query's block is its own");
        let with_instruction = PrefixBlocks::of("red shoes for men", Some("rank"));
        assert_ne!(with_instruction.keys[2], a.keys[2]);
    }

    #[test]
    fn a_committed_prefix_is_found_and_the_lru_evicts_the_oldest() {
        let c = PrefixCache::new(4);
        let a = PrefixBlocks::of("red shoes for men", None);
        assert_eq!(c.lookup(&a), 0, "cold: nothing held");
        c.commit(&a);
        assert_eq!(c.lookup(&a), a.tokens(), "the whole prefix, tail included");
        // Another query shares the head blocks only.
        let b = PrefixBlocks::of("blue hats for kids", None);
        assert_eq!(c.lookup(&b), 32);
        c.commit(&b);
        assert_eq!(c.stats().blocks, 4, "two head blocks and two tails");
        // A third query's tail pushes out the least recently used block: a's tail.
        let d = PrefixBlocks::of("green socks", None);
        c.commit(&d);
        assert_eq!(c.stats().blocks, 4, "bounded");
        assert_eq!(c.lookup(&a), 32, "a's tail was evicted, the head blocks stay (used by every call)");
        assert_eq!(c.lookup(&d), d.tokens());
        c.clear();
        assert_eq!(c.lookup(&d), 0);
        assert_eq!(PrefixCache::new(0).lookup(&d), 0);
        let zero = PrefixCache::new(0);
        zero.commit(&d);
        assert_eq!(zero.lookup(&d), 0, "capacity 0 holds nothing");
    }
}
