//! The pair-score cache's key, entry weight and cache shape, in one place so the proxy's cache
//! (`proxy/src/pair_cache.rs`) and the capacity planner's replay of it
//! (`loadtest/src/plan/pair.rs`) are the same cache: the same 128-bit XXH3 key over (model,
//! instruction and query, item text), the same per-entry weight, TTL and hasher, hence the same
//! moka admission and eviction decisions.

use std::time::Duration;

use moka::sync::CacheBuilder;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

/// What one entry is taken to weigh, in bytes: its 16-byte key and 8-byte value plus an
/// estimate (not a measurement) of moka's per-entry bookkeeping (hash-table slot, access-order
/// and write-order nodes, its share of the frequency sketch), rounded up. Every entry weighs the
/// same, so `max_bytes` is in effect `max_bytes / ENTRY_BYTES` entries.
pub const ENTRY_BYTES: u32 = 128;

/// The moka builder of a pair cache holding `max_bytes` (every entry weighs [`ENTRY_BYTES`]),
/// dropping entries `ttl` after they were stored. The caller adds what is its own (an eviction
/// listener) and builds it with [`BuildDigestHasher`].
pub fn builder<V>(max_bytes: u64, ttl: Duration) -> CacheBuilder<u128, V, moka::sync::Cache<u128, V>>
where
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder().max_capacity(max_bytes).weigher(|_: &u128, _: &V| ENTRY_BYTES).time_to_live(ttl)
}

/// Every string is hashed with its length first, so no two different tuples hash the same
/// bytes ("ab" + "c" differs from "a" + "bc"); the tags keep an absent instruction apart from an
/// empty one.
fn put(h: &mut Xxh3, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// The digest of the model name and template identity (prompt template and score head) the
/// workers report, mixed into every key.
pub fn digest_of_model(name: &str, template: &str) -> u128 {
    let mut h = Xxh3::new();
    h.update(b"model");
    put(&mut h, name);
    put(&mut h, template);
    h.digest128()
}

/// The digest of a request's (instruction, query): what its pairs share.
pub fn digest_of_prefix(instruction: Option<&str>, query: &str) -> u128 {
    let mut h = Xxh3::new();
    match instruction {
        Some(i) => {
            h.update(b"I");
            put(&mut h, i);
        }
        None => h.update(b"-"),
    }
    put(&mut h, query);
    h.digest128()
}

/// The digest of one item's text.
pub fn digest_of_item(text: &str) -> u128 {
    xxh3_128(text.as_bytes())
}

/// The cache key of a pair under a model: the digest of the three digests (model, instruction
/// and query, item text), one short one-shot hash per item.
pub fn key(model: u128, prefix: u128, item: u128) -> u128 {
    let mut all = [0u8; 48];
    all[..16].copy_from_slice(&model.to_le_bytes());
    all[16..32].copy_from_slice(&prefix.to_le_bytes());
    all[32..].copy_from_slice(&item.to_le_bytes());
    xxh3_128(&all)
}

/// The keys are XXH3 digests already: moka's table and frequency sketch take their low 64 bits
/// rather than hash them again with SipHash.
#[derive(Clone, Default)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u128` is called for a u128 key; any other input is folded in, not lost.
        self.0 = xxh3_128(bytes) as u64 ^ self.0.rotate_left(5);
    }

    fn write_u128(&mut self, k: u128) {
        self.0 ^= k as u64;
    }
}

pub type BuildDigestHasher = std::hash::BuildHasherDefault<DigestHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_covers_every_part_and_its_boundaries() {
        let m = digest_of_model("m", "t");
        let base = key(m, digest_of_prefix(None, "q"), digest_of_item("ab"));
        assert_eq!(base, key(digest_of_model("m", "t"), digest_of_prefix(None, "q"), digest_of_item("ab")));
        for other in [
            key(digest_of_model("m2", "t"), digest_of_prefix(None, "q"), digest_of_item("ab")),
            key(m, digest_of_prefix(Some(""), "q"), digest_of_item("ab")),
            key(m, digest_of_prefix(None, "qa"), digest_of_item("b")),
            key(m, digest_of_prefix(None, "q"), digest_of_item("ab ")),
        ] {
            assert_ne!(base, other);
        }
        assert_ne!(digest_of_prefix(Some("ab"), "c"), digest_of_prefix(Some("a"), "bc"));
    }

    #[test]
    fn the_builder_bounds_by_entry_weight() {
        let c = builder::<u8>(10 * u64::from(ENTRY_BYTES), Duration::from_secs(60))
            .build_with_hasher(BuildDigestHasher::default());
        for k in 0..1000u128 {
            c.insert(xxh3_128(&k.to_le_bytes()), 1);
        }
        c.run_pending_tasks();
        assert!((1..=10).contains(&c.entry_count()), "{} entries held, bound 10", c.entry_count());
    }
}
