//! The pair-score cache: (model, instruction, query, item text) → the score a worker gave it,
//! so a repeated pair is answered without a worker. A pair's score depends on the pair alone
//! (the determinism contract in ARCHITECTURE.md), so a stored score is the score a worker would
//! compute again, bit for bit.
//!
//! The entries live in a `moka` cache (its key, weight and shape in `sieve_shared::pair_key`,
//! which the capacity planner replays traces through): bounded in bytes (every entry weighs
//! [`ENTRY_BYTES`]), dropped after the TTL, admitted by frequency (TinyLFU: a pair seen once
//! does not push out pairs that repeat). The key is a 128-bit XXH3 digest, never the texts: per item, one digest
//! of the item text and one of (instruction, query), hashed over the borrowed strings (no copy),
//! mixed with the digest of the model and template identity (prompt template and score head) the
//! answering worker reported. A worker reporting another model or template than the last one seen
//! empties the cache; the model and template in the key keep a late answer of the old ones from
//! ever being served for the new ones.
//!
//! Only scores a worker returned are stored: never an item it listed in `missing`, nor one from
//! a failed or missed shard.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use moka::notification::RemovalCause;
use moka::sync::Cache;
use sieve_shared::pair_key::{self, digest_of_item, digest_of_model, digest_of_prefix, key, BuildDigestHasher};
use sieve_shared::proxy_config::CacheConfig;
use sieve_shared::{ScoreRequest, ScoreResponse};

use crate::metrics as m;

pub use sieve_shared::pair_key::ENTRY_BYTES;

/// A stored answer for one pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub score: f32,
    /// The item's own-segment tokens the worker reported (`usage.item_tokens`), answered again.
    pub item_tokens: u32,
    /// The prefix tokens of the call that scored it (`usage.prefix_tokens`): with
    /// `item_tokens`, the pair's prompt length, counted in `usage.prompt_tokens` when the pair
    /// is answered from the cache as when computed.
    pub prefix_tokens: u32,
}

/// The model and template identity the workers report, with their digest (mixed into every
/// key).
struct Model {
    name: String,
    template: String,
    digest: u128,
}

pub struct PairCache {
    entries: Cache<u128, Entry, BuildDigestHasher>,
    model: ArcSwapOption<Model>,
}

/// One request's look-up: its pairs' digests (for storing the answers), what was found, and
/// the items still to send.
#[derive(Debug)]
pub struct Lookup {
    /// The digest of (instruction, query).
    prefix: u128,
    /// Per item, in input order: the digest of its text.
    digests: Vec<u128>,
    /// Per item, in input order: the stored answer, if any.
    pub found: Vec<Option<Entry>>,
    pub hits: usize,
    /// The caller's indices of the items not found, ascending: what is planned and sent.
    pub todo: Vec<usize>,
    /// The model the entries were looked up under (none known yet: nothing found).
    pub model: Option<String>,
}

impl PairCache {
    /// An empty cache sized by `cfg` (`max_bytes` and `ttl_ms` are read once: a restart
    /// applies changes to them; `enabled` is read per request).
    pub fn new(cfg: &CacheConfig) -> Self {
        // The key, weight, TTL and hasher are `sieve_shared::pair_key`'s: the capacity
        // planner replays traces through the same cache.
        let entries = pair_key::builder::<Entry>(cfg.max_bytes, Duration::from_millis(cfg.ttl_ms))
            .eviction_listener(|_, _, cause| {
                // A model change (invalidate_all, `Explicit`) is counted as an invalidation.
                if matches!(cause, RemovalCause::Size | RemovalCause::Expired) {
                    metrics::counter!(m::CACHE_EVICTIONS).increment(1);
                }
            })
            .build_with_hasher(BuildDigestHasher::default());
        PairCache { entries, model: ArcSwapOption::empty() }
    }

    /// Notes the model and template identity a worker reported; another pair than the last
    /// one empties the cache (two workers of one model with different prompt templates or score
    /// heads score differently). An empty name (a worker that has not loaded its model) is
    /// ignored.
    pub fn observe_model(&self, name: &str, template: &str) {
        if name.is_empty() {
            return;
        }
        let current = self.model.load();
        if current.as_ref().is_some_and(|m| m.name == name && m.template == template) {
            return;
        }
        let digest = digest_of_model(name, template);
        self.model.store(Some(Arc::new(Model { name: name.to_string(), template: template.to_string(), digest })));
        if current.is_some() {
            self.entries.invalidate_all();
            metrics::counter!(m::CACHE_INVALIDATIONS).increment(1);
            tracing::info!(
                model = name,
                template,
                "workers report another model or template: pair-score cache emptied"
            );
        }
    }

    /// Looks every item of `req` up under the current model.
    pub fn lookup(&self, req: &ScoreRequest<'_>) -> Lookup {
        let prefix = digest_of_prefix(req.instruction.as_deref(), &req.query);
        let digests: Vec<u128> = req.items.iter().map(|i| digest_of_item(i.text())).collect();
        let model = self.model.load_full();
        let found: Vec<Option<Entry>> = match &model {
            Some(model) => digests.iter().map(|&d| self.entries.get(&key(model.digest, prefix, d))).collect(),
            None => vec![None; digests.len()],
        };
        let todo: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
        let hits = found.len() - todo.len();
        metrics::counter!(m::CACHE_HITS).increment(hits as u64);
        metrics::counter!(m::CACHE_MISSES).increment(todo.len() as u64);
        Lookup { prefix, digests, found, hits, todo, model: model.map(|m| m.name.clone()) }
    }

    /// Stores what the workers answered for `lookup`'s request, one (the shard's items, its
    /// worker's answer) pair per shard that completed: every finite score, under the model its
    /// worker reported, except the items it listed missing.
    pub fn store<'r>(&self, lookup: &Lookup, answers: impl IntoIterator<Item = (&'r [usize], &'r ScoreResponse)>) {
        let mut inserted = 0u64;
        for (items, resp) in answers {
            self.observe_model(&resp.model, &resp.template);
            let model = self.model.load();
            let Some(model) = model.as_ref().filter(|m| m.name == resp.model && m.template == resp.template) else {
                continue;
            };
            if resp.scores.len() != items.len() {
                continue; // not an answer to this shard: store nothing from it
            }
            for (k, (&i, score)) in items.iter().zip(&resp.scores).enumerate() {
                let Some(score) = score.filter(|s| s.is_finite()) else { continue };
                let (Some(&digest), false) = (lookup.digests.get(i), resp.missing.contains(&k)) else { continue };
                let item_tokens = resp.usage.item_tokens.get(k).copied().unwrap_or(0);
                let prefix_tokens = resp.usage.prefix_tokens;
                self.entries
                    .insert(key(model.digest, lookup.prefix, digest), Entry { score, item_tokens, prefix_tokens });
                inserted += 1;
            }
        }
        metrics::counter!(m::CACHE_INSERTS).increment(inserted);
    }

    /// Entries held (moka's count, which trails recent writes until its upkeep runs).
    pub fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sieve_shared::{Timing, Usage};

    /// A completed shard: its items and its answer.
    type Answer = (Vec<usize>, ScoreResponse);

    fn answers(a: &[Answer]) -> impl Iterator<Item = (&[usize], &ScoreResponse)> {
        a.iter().map(|(items, resp)| (&items[..], resp))
    }

    fn cache() -> PairCache {
        PairCache::new(&CacheConfig::default())
    }

    fn req(json: &str) -> ScoreRequest<'_> {
        serde_json::from_str(json).unwrap()
    }

    /// A completed shard of `items` with `scores`, from a worker serving `model`.
    fn done(model: &str, items: &[usize], scores: &[Option<f32>], missing: &[usize]) -> Answer {
        done_with(model, "t", items, scores, missing)
    }

    /// As [`done`], from a worker reporting `template`.
    fn done_with(model: &str, template: &str, items: &[usize], scores: &[Option<f32>], missing: &[usize]) -> Answer {
        let response = ScoreResponse {
            scores: scores.to_vec(),
            ids: None,
            missing: missing.to_vec(),
            usage: Usage { item_tokens: items.iter().map(|&i| i as u32 + 10).collect(), ..Usage::default() },
            timing: Timing::default(),
            model: model.into(),
            template: template.into(),
        };
        (items.to_vec(), response)
    }

    const REQ: &str = r#"{"query":"q","items":["a","b","c","d"]}"#;

    #[test]
    fn stored_scores_are_found_bit_for_bit_and_only_the_rest_is_sent() {
        let c = cache();
        let first = c.lookup(&req(REQ));
        assert_eq!((first.hits, &first.todo[..], first.model.as_deref()), (0, &[0, 1, 2, 3][..], None));
        let s = [Some(f32::from_bits(0x3f80_0001)), Some(-0.0), Some(1e-40)];
        c.store(&first, answers(&[done("m", &[0, 2, 3], &s, &[])]));
        let again = c.lookup(&req(REQ));
        assert_eq!(again.hits, 3);
        assert_eq!(again.todo, vec![1]);
        assert_eq!(again.model.as_deref(), Some("m"));
        let got: Vec<u32> = [0, 2, 3].iter().map(|&i| again.found[i].unwrap().score.to_bits()).collect();
        assert_eq!(got, s.iter().map(|s| s.unwrap().to_bits()).collect::<Vec<_>>(), "bit for bit");
        assert_eq!(again.found[2].unwrap().item_tokens, 12);
    }

    #[test]
    fn missing_null_nonfinite_and_failed_items_are_never_stored() {
        let c = cache();
        let l = c.lookup(&req(REQ));
        let partial = done("m", &[0, 1], &[Some(0.5), Some(0.25)], &[1]);
        let nulls = done("m", &[2], &[None], &[]);
        let nan = done("m", &[3], &[Some(f32::NAN)], &[]);
        c.store(&l, answers(&[partial, nulls, nan]));
        let again = c.lookup(&req(REQ));
        assert_eq!(again.todo, vec![1, 2, 3], "only item 0 was answered");
        // An answer of the wrong length is not this shard's: nothing from it.
        let c = cache();
        c.store(&l, answers(&[done("m", &[0, 1], &[Some(1.0)], &[])]));
        assert_eq!(c.lookup(&req(REQ)).hits, 0);
    }

    #[test]
    fn the_key_is_the_whole_pair_and_the_model() {
        let c = cache();
        let l = c.lookup(&req(r#"{"query":"q","items":["ab"]}"#));
        c.store(&l, answers(&[done("m", &[0], &[Some(1.0)], &[])]));
        for other in [
            r#"{"query":"qa","items":["b"]}"#,
            r#"{"query":"q","items":["ab"],"instruction":""}"#,
            r#"{"query":"q","items":["ab "]}"#,
            r#"{"query":"Q","items":["ab"]}"#,
        ] {
            assert_eq!(c.lookup(&req(other)).hits, 0, "{other}");
        }
        // Escaped or not, an id or not: the same text is the same pair.
        assert_eq!(c.lookup(&req(r#"{"query":"\u0071","items":[{"id":"x","text":"a\u0062"}]}"#)).hits, 1);
    }

    #[test]
    fn another_model_empties_the_cache() {
        let c = cache();
        let l = c.lookup(&req(REQ));
        c.store(&l, answers(&[done("m1", &[0, 1, 2, 3], &[Some(1.0); 4], &[])]));
        assert_eq!(c.lookup(&req(REQ)).hits, 4);
        c.observe_model("", "");
        assert_eq!(c.lookup(&req(REQ)).hits, 4, "a worker still loading changes nothing");
        c.observe_model("m1", "t");
        assert_eq!(c.lookup(&req(REQ)).hits, 4, "the same model and template change nothing");
        c.observe_model("m2", "t");
        assert_eq!(c.lookup(&req(REQ)).hits, 0, "emptied");
        assert_eq!(c.entry_count(), 0);
        // Answers of the new model are stored under it.
        let l = c.lookup(&req(REQ));
        c.store(&l, answers(&[done("m2", &[0], &[Some(2.0)], &[])]));
        let under_m2 = c.lookup(&req(REQ));
        assert_eq!((under_m2.hits, under_m2.found[0].unwrap().score), (1, 2.0));
    }

    #[test]
    fn another_template_of_the_same_model_empties_the_cache() {
        let c = cache();
        let l = c.lookup(&req(REQ));
        c.store(&l, answers(&[done_with("m", "t1", &[0, 1], &[Some(1.0); 2], &[])]));
        assert_eq!(c.lookup(&req(REQ)).hits, 2);
        c.observe_model("m", "t2");
        assert_eq!(c.lookup(&req(REQ)).hits, 0, "another template scores differently: emptied");
        // The new template's answers are stored under it, apart from the old one's.
        c.store(&l, answers(&[done_with("m", "t2", &[0], &[Some(2.0)], &[])]));
        let now = c.lookup(&req(REQ));
        assert_eq!((now.hits, now.found[0].map(|e| e.score)), (1, Some(2.0)));
        assert_ne!(digest_of_model("m", "t1"), digest_of_model("m", "t2"), "the template is in the key");
    }

    #[test]
    fn the_size_bound_holds() {
        let c = PairCache::new(&CacheConfig { max_bytes: 100 * u64::from(ENTRY_BYTES), ..CacheConfig::default() });
        let items: Vec<String> = (0..1000).map(|i| format!("\"item {i}\"")).collect();
        let json = format!(r#"{{"query":"q","items":[{}]}}"#, items.join(","));
        let l = c.lookup(&req(&json));
        c.store(&l, answers(&[done("m", &(0..1000).collect::<Vec<_>>(), &[Some(0.5); 1000], &[])]));
        let held = c.entry_count();
        assert!(held > 0 && held <= 100, "{held} entries held, bound 100");
        let zero = PairCache::new(&CacheConfig { max_bytes: 0, ..CacheConfig::default() });
        let l = zero.lookup(&req(REQ));
        zero.store(&l, answers(&[done("m", &[0], &[Some(1.0)], &[])]));
        assert_eq!(zero.lookup(&req(REQ)).hits, 0, "max_bytes 0 holds nothing");
    }
}
