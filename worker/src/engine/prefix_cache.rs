//! The prefix index: which KV blocks hold which prompt prefixes, with epoch visibility.
//!
//! A block is keyed by the chain hash of its parent's key and its own tokens; a prefix whose
//! length is not a multiple of the block size ends in a partial *tail* block keyed the same way
//! with a tail marker, matched only exactly. Entries are `Pending(epoch)` while the batch that
//! fills them runs — visible to that batch alone — and `Committed` once it succeeded, visible to
//! all later batches. A failed or cancelled batch rolls back: its pending entries are removed and
//! their blocks freed, so a block that was never fully written can never be matched.
//!
//! A chain may continue another lease's chain ([`PrefixCache::acquire_child`]): the shared
//! leading run of a group of items after the query prefix, its first block keyed under the
//! prefix's last block. Such a run starts a new block, so the prefix's partial tail is never
//! copied or recomputed.
//!
//! Committed entries hold one reference on their block (the cache's); every batch using a block
//! holds another through its [`PrefixLease`]. Eviction (LRU, leaves first) only takes blocks whose
//! one reference is the cache's, so a block in use is never evicted.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::Serialize;

use super::blocks::BlockPool;

/// Identifies one batch: its pending entries are visible to it alone.
pub type Epoch = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending { epoch: Epoch, written: bool },
    Committed,
}

#[derive(Debug)]
struct Entry {
    block: u32,
    /// The block's tokens, compared on every match (a hash is never trusted alone).
    tokens: Vec<u32>,
    parent: Option<u64>,
    state: State,
    last_used: u64,
    /// Entries whose parent this is; only leaves are evicted.
    children: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PrefixCacheConfig {
    /// Share prefix blocks across batches (and across requests of a batch).
    pub enabled: bool,
    /// When used blocks exceed this fraction of the region after a commit, evict...
    pub high_watermark: f64,
    /// ...down to this fraction.
    pub low_watermark: f64,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig { enabled: true, high_watermark: 0.9, low_watermark: 0.7 }
    }
}

/// Counters since start.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefixCacheCounters {
    pub lookups: u64,
    /// Lookups that reused at least one committed block.
    pub hits: u64,
    pub commits: u64,
    pub rollbacks: u64,
    pub evicted_blocks: u64,
}

/// A batch's hold on the blocks of one prefix of `len` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixLease {
    pub epoch: Epoch,
    pub len: usize,
    /// `ceil(len / block_size)` blocks, position order; the last one may be partial.
    pub blocks: Vec<u32>,
    /// Positions `0..reused` already have (or, for same-epoch pending entries, will have by the
    /// time any item reads them) valid KV; the lease's owner computes `reused..len`.
    pub reused: usize,
    /// Of `reused`, the positions served by committed entries (a cross-batch hit).
    pub reused_committed: usize,
    registered: Vec<u64>,
    /// The key of the last block when it is in the index for this lease (matched or registered
    /// by it): a child chain hangs off it. `None`: children stay private.
    tail_key: Option<u64>,
}

/// Where a chain starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChainStart {
    Root,
    After(u64),
    /// After a chain that is not in the index: nothing is matched or registered.
    Private,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefix cache full: {needed} blocks needed, {free} free and nothing evictable")]
pub struct NoSpace {
    pub needed: usize,
    pub free: usize,
}

#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    pool: BlockPool,
    entries: HashMap<u64, Entry>,
    pending_by_epoch: HashMap<Epoch, Vec<u64>>,
    tick: u64,
    cfg: PrefixCacheConfig,
    pub counters: PrefixCacheCounters,
}

fn block_key(parent: Option<u64>, tokens: &[u32], tail: bool) -> u64 {
    // SipHash with fixed keys: stable within a process, which is all the index needs.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tail.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PrefixCache {
    /// A cache over blocks `first_block .. first_block + num_blocks` of the KV pool.
    pub fn new(first_block: u32, num_blocks: usize, block_size: usize, cfg: PrefixCacheConfig) -> Self {
        PrefixCache {
            block_size,
            pool: BlockPool::new(first_block, num_blocks),
            entries: HashMap::new(),
            pending_by_epoch: HashMap::new(),
            tick: 0,
            cfg,
            counters: PrefixCacheCounters::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    fn visible(state: State, epoch: Epoch) -> bool {
        match state {
            State::Committed => true,
            State::Pending { epoch: e, .. } => e == epoch,
        }
    }

    /// Takes the blocks for a prefix in batch `epoch`: reuses the longest chain of visible
    /// entries, allocates the rest (registering them as pending for this epoch when no other
    /// batch is already filling the same key), evicting committed leaves if needed.
    pub fn acquire(&mut self, epoch: Epoch, tokens: &[u32]) -> Result<PrefixLease, NoSpace> {
        self.acquire_from(epoch, ChainStart::Root, tokens)
    }

    /// Takes the blocks of `tokens` continuing `parent`'s chain (positions `parent.len ..`),
    /// in new blocks, with the same matching, registration and lifecycle as [`Self::acquire`].
    pub fn acquire_child(
        &mut self,
        epoch: Epoch,
        parent: &PrefixLease,
        tokens: &[u32],
    ) -> Result<PrefixLease, NoSpace> {
        let start = parent.tail_key.map_or(ChainStart::Private, ChainStart::After);
        self.acquire_from(epoch, start, tokens)
    }

    fn acquire_from(&mut self, epoch: Epoch, start: ChainStart, tokens: &[u32]) -> Result<PrefixLease, NoSpace> {
        let bs = self.block_size;
        let n_blocks = tokens.len().div_ceil(bs);
        let mut lease = PrefixLease {
            epoch,
            len: tokens.len(),
            blocks: Vec::with_capacity(n_blocks),
            reused: 0,
            reused_committed: 0,
            registered: vec![],
            tail_key: None,
        };
        self.counters.lookups += 1;
        let indexed = self.cfg.enabled && start != ChainStart::Private;
        let mut parent = match start {
            ChainStart::After(k) => Some(k),
            ChainStart::Root | ChainStart::Private => None,
        };
        let mut matching = indexed;
        let mut registering = indexed;
        // Whether the block just taken is in the index for this lease.
        let mut last_indexed = false;
        let mut touched = vec![];
        for i in 0..n_blocks {
            let toks = &tokens[i * bs..((i + 1) * bs).min(tokens.len())];
            let key = block_key(parent, toks, toks.len() < bs);
            if matching {
                if let Some(e) = self.entries.get(&key).filter(|e| e.tokens == toks && Self::visible(e.state, epoch)) {
                    self.pool.retain(e.block);
                    lease.blocks.push(e.block);
                    lease.reused += toks.len();
                    if e.state == State::Committed {
                        lease.reused_committed += toks.len();
                    }
                    touched.push(key);
                    parent = Some(key);
                    last_indexed = true;
                    continue;
                }
                matching = false;
            }
            let Some(block) = self.alloc_block() else {
                let err = NoSpace { needed: n_blocks - i, free: self.pool.num_free() };
                self.release(&lease);
                self.unregister(&lease.registered);
                return Err(err);
            };
            lease.blocks.push(block);
            // Another batch is filling this very block: keep ours private (and everything after
            // it), so no entry ever hangs off a parent that batch may roll back.
            if registering && self.entries.contains_key(&key) {
                registering = false;
            }
            if registering {
                if let Some(p) = parent.and_then(|p| self.entries.get_mut(&p)) {
                    p.children += 1;
                }
                self.entries.insert(
                    key,
                    Entry {
                        block,
                        tokens: toks.to_vec(),
                        parent,
                        state: State::Pending { epoch, written: false },
                        last_used: 0,
                        children: 0,
                    },
                );
                self.pending_by_epoch.entry(epoch).or_default().push(key);
                lease.registered.push(key);
            }
            last_indexed = registering;
            parent = Some(key);
        }
        lease.tail_key = if last_indexed { parent } else { None };
        if lease.reused_committed > 0 {
            self.counters.hits += 1;
        }
        // Deepest first, so parents end up more recently used than their children.
        for key in touched.iter().rev() {
            self.touch(*key);
        }
        Ok(lease)
    }

    fn touch(&mut self, key: u64) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            e.last_used = self.tick;
        }
    }

    fn alloc_block(&mut self) -> Option<u32> {
        if self.pool.num_free() == 0 {
            self.evict_until(1);
        }
        self.pool.alloc()
    }

    /// Marks the blocks `lease` registered as fully written (its prefix pass succeeded).
    pub fn mark_written(&mut self, lease: &PrefixLease) {
        for key in &lease.registered {
            if let Some(e) = self.entries.get_mut(key) {
                if let State::Pending { epoch, .. } = e.state {
                    e.state = State::Pending { epoch, written: true };
                }
            }
        }
    }

    /// Batch `epoch` succeeded: its written pending entries become visible to everyone (the cache
    /// takes a reference on each), unwritten ones are dropped. Then trims to the watermark.
    pub fn commit(&mut self, epoch: Epoch) {
        let keys = self.pending_by_epoch.remove(&epoch).unwrap_or_default();
        let mut unwritten = vec![];
        for key in keys.iter().rev() {
            let Some(e) = self.entries.get_mut(key) else { continue };
            match e.state {
                State::Pending { written: true, .. } => {
                    e.state = State::Committed;
                    self.pool.retain(e.block);
                    self.touch(*key);
                }
                _ => unwritten.push(*key),
            }
        }
        self.unregister(&unwritten);
        self.counters.commits += 1;
        let cap = self.pool.capacity() as f64;
        if self.pool.num_used() as f64 > self.cfg.high_watermark * cap {
            let target_free = (cap - self.cfg.low_watermark * cap).ceil() as usize;
            self.evict_until(target_free);
        }
    }

    /// Batch `epoch` failed or was cancelled: its pending entries disappear. Their blocks are
    /// freed when the leases holding them are released.
    pub fn rollback(&mut self, epoch: Epoch) {
        let keys = self.pending_by_epoch.remove(&epoch).unwrap_or_default();
        self.unregister(&keys);
        self.counters.rollbacks += 1;
    }

    /// Removes entries (children before parents, as registered order is parent first).
    fn unregister(&mut self, keys: &[u64]) {
        for key in keys.iter().rev() {
            if let Some(e) = self.entries.remove(key) {
                if e.state == State::Committed {
                    self.pool.release(e.block);
                }
                if let Some(p) = e.parent.and_then(|p| self.entries.get_mut(&p)) {
                    p.children = p.children.saturating_sub(1);
                }
                if let State::Pending { epoch, .. } = e.state {
                    if let Some(v) = self.pending_by_epoch.get_mut(&epoch) {
                        v.retain(|k| k != key);
                    }
                }
            }
        }
    }

    /// Drops a batch's references on its prefix blocks.
    pub fn release(&mut self, lease: &PrefixLease) {
        for &b in &lease.blocks {
            self.pool.release(b);
        }
    }

    /// Evicts least-recently-used committed leaves that nothing but the cache holds, until
    /// `target_free` blocks are free or nothing more can go.
    fn evict_until(&mut self, target_free: usize) {
        while self.pool.num_free() < target_free {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| e.state == State::Committed && e.children == 0 && self.pool.refcount(e.block) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k);
            let Some(key) = victim else { break };
            self.unregister(&[key]);
            self.counters.evicted_blocks += 1;
        }
    }

    pub fn snapshot(&self) -> PrefixCacheSnapshot {
        let mut s = PrefixCacheSnapshot {
            blocks_total: self.pool.capacity() as u64,
            blocks_free: self.pool.num_free() as u64,
            block_size: self.block_size as u64,
            counters: self.counters.clone(),
            ..Default::default()
        };
        for e in self.entries.values() {
            match e.state {
                State::Committed => s.blocks_committed += 1,
                State::Pending { .. } => s.blocks_pending += 1,
            }
        }
        s.blocks_in_use = s.blocks_total - s.blocks_free;
        s
    }

    /// Checks the accounting invariants (tests and debug builds).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (k, e) in &self.entries {
            if !seen.insert(e.block) {
                return Err(format!("block {} indexed twice", e.block));
            }
            if self.pool.refcount(e.block) == 0 {
                return Err(format!("entry {k:x} points at free block {}", e.block));
            }
            if let Some(p) = e.parent {
                if !self.entries.contains_key(&p) {
                    return Err(format!("entry {k:x} has a missing parent"));
                }
            }
            let kids = self.entries.values().filter(|c| c.parent == Some(*k)).count() as u32;
            if kids != e.children {
                return Err(format!("entry {k:x}: {} children counted, {kids} present", e.children));
            }
        }
        Ok(())
    }
}

/// Gauges and counters for `/stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefixCacheSnapshot {
    pub block_size: u64,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_in_use: u64,
    pub blocks_pending: u64,
    pub blocks_committed: u64,
    #[serde(flatten)]
    pub counters: PrefixCacheCounters,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: usize) -> PrefixCache {
        PrefixCache::new(100, blocks, 4, PrefixCacheConfig::default())
    }

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn pending_is_visible_to_its_epoch_only_until_commit() {
        let mut c = cache(16);
        let p = toks(10, 0); // 2 full blocks + a tail of 2
        let a = c.acquire(1, &p).unwrap();
        assert_eq!((a.reused, a.blocks.len()), (0, 3));
        let same_epoch = c.acquire(1, &p).unwrap();
        assert_eq!(same_epoch.reused, 10);
        assert_eq!(same_epoch.blocks, a.blocks);
        let other = c.acquire(2, &p).unwrap();
        assert_eq!(other.reused, 0, "another batch never sees pending blocks");
        assert!(other.blocks.iter().all(|b| !a.blocks.contains(b)));
        c.mark_written(&a);
        c.commit(1);
        c.release(&a);
        c.release(&same_epoch);
        c.rollback(2);
        c.release(&other);
        let later = c.acquire(3, &p).unwrap();
        assert_eq!((later.reused, later.reused_committed), (10, 10));
        assert_eq!(later.blocks, a.blocks);
        c.release(&later);
        c.commit(3);
        c.check_invariants().unwrap();
    }

    /// A group's run continues its prefix's chain: pending to its epoch alone, committed with
    /// it, rolled back with it, and never evicted from under a lease or before its children.
    #[test]
    fn child_chains_follow_their_parents_lifecycle() {
        let mut c = cache(12);
        let base = c.pool.num_free();
        let (p, run) = (toks(10, 0), toks(6, 50));
        let a = c.acquire(1, &p).unwrap();
        let r = c.acquire_child(1, &a, &run).unwrap();
        assert_eq!((r.reused, r.blocks.len()), (0, 2));
        assert!(r.blocks.iter().all(|b| !a.blocks.contains(b)), "a run starts in new blocks");
        let a2 = c.acquire(1, &p).unwrap();
        let r2 = c.acquire_child(1, &a2, &run).unwrap();
        assert_eq!((r2.reused, &r2.blocks), (6, &r.blocks), "the same batch matches its pending run");
        let other = c.acquire(2, &p).unwrap();
        let other_run = c.acquire_child(2, &other, &run).unwrap();
        assert_eq!(other_run.reused, 0, "another batch never sees a pending run");
        c.rollback(1);
        c.rollback(2);
        for l in [&a, &r, &a2, &r2, &other, &other_run] {
            c.release(l);
        }
        assert_eq!(c.pool.num_free(), base, "rollback frees the runs with their prefixes");
        assert!(c.entries.is_empty());

        let a = c.acquire(3, &p).unwrap();
        let r = c.acquire_child(3, &a, &run).unwrap();
        c.mark_written(&a);
        c.mark_written(&r);
        c.commit(3);
        c.release(&a);
        c.release(&r);
        let a = c.acquire(4, &p).unwrap();
        let r = c.acquire_child(4, &a, &run).unwrap();
        assert_eq!((r.reused, r.reused_committed), (6, 6), "a committed run is a cross-batch hit");
        let r_other = c.acquire_child(4, &a, &toks(6, 90)).unwrap();
        assert_eq!(r_other.reused, 0, "another run under the same prefix is another chain");
        c.check_invariants().unwrap();
        // Filling the region evicts only what no lease holds, leaves (runs) before parents.
        c.release(&r_other);
        c.rollback(4);
        c.release(&r);
        let filler = c.acquire(5, &toks(36, 7)).unwrap(); // 9 blocks: 7 free, the run's 2 evicted
        c.check_invariants().unwrap();
        assert!(a.blocks.iter().all(|b| !filler.blocks.contains(b)), "a prefix in use is never evicted");
        c.rollback(5);
        c.release(&filler);
        c.release(&a);
        c.check_invariants().unwrap();
    }

    #[test]
    fn rollback_frees_everything_and_unwritten_blocks_never_commit() {
        let mut c = cache(8);
        let base = c.pool.num_free();
        let a = c.acquire(1, &toks(13, 1)).unwrap();
        c.rollback(1);
        c.release(&a);
        assert_eq!(c.pool.num_free(), base);
        assert!(c.entries.is_empty());
        // committed without mark_written: dropped, not visible
        let b = c.acquire(2, &toks(13, 1)).unwrap();
        c.commit(2);
        c.release(&b);
        assert_eq!(c.pool.num_free(), base);
        assert_eq!(c.acquire(3, &toks(13, 1)).unwrap().reused, 0);
    }

    #[test]
    fn exact_tail_only_and_partial_chain_match() {
        let mut c = cache(16);
        let p = toks(10, 3);
        let a = c.acquire(1, &p).unwrap();
        c.mark_written(&a);
        c.commit(1);
        c.release(&a);
        // Same first 8 tokens, different tail: the two full blocks match, the tail does not.
        let mut q = p.clone();
        q[9] += 1;
        let b = c.acquire(2, &q).unwrap();
        assert_eq!((b.reused, b.reused_committed), (8, 8));
        assert_eq!(b.blocks[..2], a.blocks[..2]);
        assert_ne!(b.blocks[2], a.blocks[2]);
        // A longer prefix reuses the full blocks, not the shorter tail.
        let longer = toks(11, 3);
        let d = c.acquire(3, &longer).unwrap();
        assert_eq!(d.reused, 8);
        c.release(&b);
        c.release(&d);
        c.rollback(2);
        c.rollback(3);
        c.check_invariants().unwrap();
    }

    #[test]
    fn eviction_never_takes_a_block_in_use_and_respects_capacity() {
        let mut c = cache(6);
        // Fill the cache with committed prefixes of 2 blocks each.
        for salt in 0..3 {
            let l = c.acquire(salt as u64, &toks(8, 100 * salt)).unwrap();
            c.mark_written(&l);
            c.commit(salt as u64);
            c.release(&l);
        }
        assert!(c.pool.num_used() <= 6);
        // Hold one prefix in use, then push new ones through.
        let held = c.acquire(10, &toks(8, 200)).unwrap();
        assert_eq!(held.reused_committed, 8, "the most recent prefix is still cached");
        let held_blocks = held.blocks.clone();
        for salt in 20..30 {
            let l = c.acquire(salt as u64, &toks(8, 100 * salt)).unwrap();
            assert!(l.blocks.iter().all(|b| !held_blocks.contains(b)), "a block in use was handed out again");
            c.mark_written(&l);
            c.commit(salt as u64);
            c.release(&l);
            assert!(c.pool.num_used() <= c.pool.capacity());
            c.check_invariants().unwrap();
        }
        // The held prefix is still indexed and intact.
        let again = c.acquire(40, &toks(8, 200)).unwrap();
        assert_eq!(again.blocks, held_blocks);
        c.release(&again);
        c.release(&held);
        // Everything in use: a new prefix cannot get space, and says so.
        let l1 = c.acquire(50, &toks(12, 7)).unwrap();
        let l2 = c.acquire(51, &toks(12, 8)).unwrap();
        assert!(c.acquire(52, &toks(8, 9)).is_err());
        c.release(&l1);
        c.release(&l2);
        c.rollback(50);
        c.rollback(51);
        c.rollback(52);
        c.check_invariants().unwrap();
    }

    #[test]
    fn disabled_cache_shares_nothing() {
        let mut c = PrefixCache::new(0, 8, 4, PrefixCacheConfig { enabled: false, ..Default::default() });
        let a = c.acquire(1, &toks(8, 0)).unwrap();
        let b = c.acquire(1, &toks(8, 0)).unwrap();
        assert_eq!(b.reused, 0);
        c.commit(1);
        c.release(&a);
        c.release(&b);
        assert_eq!(c.pool.num_free(), 8);
    }
}
