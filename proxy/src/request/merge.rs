//! Putting shard answers back together: scores by original index, usage summed, the indices
//! the deadline left unscored listed in `missing` (never silently absent). A failed shard
//! fails the request with its error, item indices in the message mapped back to the caller's.
//! Items answered from the pair-score cache take their stored score and token counts (their
//! prompt tokens counted in `usage.prompt_tokens` as a worker counts them).

use std::time::Instant;

use sieve_shared::{ApiError, ScoreResponse, Timing, Usage};

use crate::pair_cache::Lookup;
use crate::request::shard::{ShardOutcome, ShardResult};

/// Summary figures for metrics and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MergeStats {
    pub shards: usize,
    pub hedged: usize,
    pub retries: u32,
    pub missing: usize,
}

pub fn merge(
    n_items: usize,
    ids: Option<Vec<Option<String>>>,
    budget_ms: u64,
    results: Vec<ShardResult>,
    arrival: Instant,
    cached: Option<&Lookup>,
) -> Result<(ScoreResponse, MergeStats), ApiError> {
    let mut results = results;
    // A request sent whole as one shard (nothing from the cache): its answer's vectors are the
    // merged ones, in order, so they are taken as they are instead of copied item by item.
    let whole = match results.as_mut_slice() {
        [ShardResult { items, outcome: ShardOutcome::Done(d) }]
            if cached.is_none_or(|c| c.hits == 0)
                && d.response.scores.len() == n_items
                && d.response.usage.item_tokens.len() == n_items
                && items.iter().copied().eq(0..n_items) =>
        {
            Some((std::mem::take(&mut d.response.scores), std::mem::take(&mut d.response.usage.item_tokens)))
        }
        _ => None,
    };
    let taken = whole.is_some();
    let (mut scores, mut item_tokens) = whole.unwrap_or_else(|| (vec![None; n_items], vec![0u32; n_items]));
    let mut missing = Vec::new();
    let mut usage = Usage::default();
    let mut prefix: Option<u32> = None;
    let mut queue_ms = f64::INFINITY;
    let mut compute_ms = 0.0;
    let mut model = String::new();
    let mut stats = MergeStats { shards: results.len(), ..MergeStats::default() };
    let mut done_any = false;
    if let Some(c) = cached.filter(|c| c.hits > 0) {
        done_any = true;
        usage.cached_items = c.hits as u32;
        for (i, e) in c.found.iter().enumerate() {
            if let Some(e) = e {
                scores[i] = Some(e.score);
                item_tokens[i] = e.item_tokens;
                // The pair's prompt, as a worker would count it: the tokens a caller is told
                // it used are the same cached or not.
                usage.prompt_tokens += u64::from(e.prefix_tokens) + u64::from(e.item_tokens);
                prefix = Some(prefix.map_or(e.prefix_tokens, |p| p.min(e.prefix_tokens)));
            }
        }
        model = c.model.clone().unwrap_or_default();
    }

    for r in results {
        match r.outcome {
            ShardOutcome::Failed(e) => return Err(remap_item_indices(e, &r.items)),
            ShardOutcome::Missed => missing.extend(r.items.iter().copied()),
            ShardOutcome::Done(d) => {
                done_any = true;
                stats.hedged += usize::from(d.hedged);
                stats.retries += d.retries;
                let resp = d.response;
                if !taken {
                    for (k, &i) in r.items.iter().enumerate() {
                        scores[i] = resp.scores.get(k).copied().flatten();
                        if let Some(&t) = resp.usage.item_tokens.get(k) {
                            item_tokens[i] = t;
                        }
                    }
                }
                // A worker's partial answer (its deadline came first): those items are missing.
                missing.extend(resp.missing.iter().filter_map(|&k| r.items.get(k).copied()));
                usage.pairs += resp.usage.pairs;
                usage.prompt_tokens += resp.usage.prompt_tokens;
                usage.computed_tokens += resp.usage.computed_tokens;
                usage.cached_prefix_tokens += resp.usage.cached_prefix_tokens;
                usage.item_shared_tokens += resp.usage.item_shared_tokens;
                usage.truncated_items += resp.usage.truncated_items;
                prefix = Some(prefix.map_or(resp.usage.prefix_tokens, |p| p.min(resp.usage.prefix_tokens)));
                queue_ms = f64::min(queue_ms, d.sent_after_ms + resp.timing.queue_ms);
                compute_ms += resp.timing.compute_ms;
                if model.is_empty() {
                    model = resp.model;
                }
            }
        }
    }
    if !done_any {
        return Err(ApiError::deadline(format!(
            "the deadline of {budget_ms} ms passed before any of the {n_items} items was scored; {}",
            sieve_shared::RAISE_DEADLINE
        )));
    }
    missing.sort_unstable();
    missing.dedup();
    stats.missing = missing.len();
    usage.prefix_tokens = prefix.unwrap_or(0);
    usage.item_tokens = item_tokens;
    let timing = Timing {
        queue_ms: if queue_ms.is_finite() { queue_ms } else { 0.0 },
        compute_ms,
        total_ms: arrival.elapsed().as_secs_f64() * 1e3,
    };
    Ok((ScoreResponse { scores, ids, missing, usage, timing, model, template: String::new() }, stats))
}

/// Rewrites `items[k]` (the shard's index) in a worker's error message to the caller's index.
pub fn remap_item_indices(mut e: ApiError, items: &[usize]) -> ApiError {
    const TAG: &str = "items[";
    let msg = &e.message;
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg.as_str();
    while let Some(pos) = rest.find(TAG) {
        out.push_str(&rest[..pos + TAG.len()]);
        rest = &rest[pos + TAG.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<usize>().ok().and_then(|k| items.get(k)) {
            Some(orig) if rest[digits..].starts_with(']') => {
                out.push_str(&orig.to_string());
                rest = &rest[digits..];
            }
            _ => {}
        }
    }
    out.push_str(rest);
    e.message = out;
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::shard::ShardDone;

    fn done(items: &[usize], scores: &[f32], tokens: &[u32], prefix: u32) -> ShardResult {
        let response = ScoreResponse {
            scores: scores.iter().map(|&s| Some(s)).collect(),
            ids: None,
            missing: vec![],
            usage: Usage {
                pairs: scores.len() as u32,
                prompt_tokens: tokens.iter().map(|&t| u64::from(t + prefix)).sum(),
                computed_tokens: u64::from(prefix) + tokens.iter().map(|&t| u64::from(t)).sum::<u64>(),
                prefix_tokens: prefix,
                cached_prefix_tokens: 0,
                cached_items: 0,
                item_tokens: tokens.to_vec(),
                item_shared_tokens: 0,
                truncated_items: 0,
            },
            timing: Timing { queue_ms: 1.0, compute_ms: 10.0, total_ms: 11.0 },
            model: "m".into(),
            template: String::new(),
        };
        ShardResult {
            items: items.to_vec(),
            outcome: ShardOutcome::Done(ShardDone { response, sent_after_ms: 0.5, hedged: false, retries: 0 }),
        }
    }

    #[test]
    fn scores_go_back_to_their_original_index() {
        let t0 = Instant::now();
        let (r, stats) = merge(
            5,
            None,
            500,
            vec![done(&[4, 0], &[0.4, 0.0], &[14, 10], 50), done(&[1, 2, 3], &[0.1, 0.2, 0.3], &[11, 12, 13], 50)],
            t0,
            None,
        )
        .unwrap();
        assert_eq!(r.scores, vec![Some(0.0), Some(0.1), Some(0.2), Some(0.3), Some(0.4)]);
        assert_eq!(r.usage.item_tokens, vec![10, 11, 12, 13, 14]);
        assert_eq!(r.usage.pairs, 5);
        assert_eq!(r.usage.prefix_tokens, 50);
        assert_eq!(r.usage.computed_tokens, 50 + 24 + 50 + 36);
        assert!(r.missing.is_empty());
        assert_eq!(stats.shards, 2);
        assert_eq!(r.timing.compute_ms, 20.0);
        assert_eq!(r.timing.queue_ms, 1.5);
    }

    #[test]
    fn the_deadline_leaves_missing_indices_never_silent_gaps() {
        let missed = ShardResult { items: vec![1, 3], outcome: ShardOutcome::Missed };
        let (r, stats) =
            merge(4, None, 100, vec![done(&[0, 2], &[0.5, 0.6], &[1, 1], 5), missed], Instant::now(), None).unwrap();
        assert_eq!(r.missing, vec![1, 3]);
        assert_eq!(r.scores, vec![Some(0.5), None, Some(0.6), None]);
        assert_eq!(stats.missing, 2);
        let all_missed = vec![ShardResult { items: vec![0, 1], outcome: ShardOutcome::Missed }];
        assert_eq!(merge(2, None, 100, all_missed, Instant::now(), None).unwrap_err().status(), 504);
    }

    #[test]
    fn a_workers_partial_answer_maps_its_missing_to_the_callers_indices() {
        let mut partial = done(&[5, 2, 7], &[0.5, 0.0, 0.0], &[1, 1, 1], 5);
        if let ShardOutcome::Done(d) = &mut partial.outcome {
            d.response.scores[1] = None;
            d.response.scores[2] = None;
            d.response.missing = vec![1, 2];
        }
        let (r, stats) =
            merge(8, None, 100, vec![done(&[0, 1, 3, 4, 6], &[0.1; 5], &[1; 5], 5), partial], Instant::now(), None)
                .unwrap();
        assert_eq!(r.missing, vec![2, 7]);
        assert_eq!((r.scores[5], r.scores[2], r.scores[7]), (Some(0.5), None, None));
        assert_eq!(stats.missing, 2);
    }

    #[test]
    fn a_failed_shard_fails_the_request_with_the_callers_indices() {
        let failed = ShardResult {
            items: vec![7, 9, 12],
            outcome: ShardOutcome::Failed(ApiError::too_large(
                "items[2] too long: 9000 tokens; see items[0] too and items[x]",
            )),
        };
        let e = merge(13, None, 100, vec![done(&[0], &[0.1], &[1], 1), failed], Instant::now(), None).unwrap_err();
        assert_eq!(e.status(), 413);
        assert_eq!(e.message, "items[12] too long: 9000 tokens; see items[7] too and items[x]");
    }

    #[test]
    fn a_whole_request_in_one_shard_merges_as_its_pieces_would() {
        // The one-shard answer's vectors are taken as they are; the same answers cut in two
        // shards are copied item by item: the merged answers are equal.
        let (scores, tokens) = ([0.5, -1.25, 3.0, 0.0, 7.5], [3, 1, 4, 1, 5]);
        let with_missing = |mut r: ShardResult, missing: &[usize]| {
            if let ShardOutcome::Done(d) = &mut r.outcome {
                for &k in missing {
                    d.response.scores[k] = None;
                }
                d.response.missing = missing.to_vec();
            }
            r
        };
        let whole = vec![with_missing(done(&[0, 1, 2, 3, 4], &scores, &tokens, 9), &[3])];
        let pieces = vec![
            done(&[0, 1], &scores[..2], &tokens[..2], 9),
            with_missing(done(&[2, 3, 4], &scores[2..], &tokens[2..], 9), &[1]),
        ];
        let t0 = Instant::now();
        let (a, _) = merge(5, None, 100, whole, t0, None).unwrap();
        let (b, _) = merge(5, None, 100, pieces, t0, None).unwrap();
        assert_eq!(a.scores, vec![Some(0.5), Some(-1.25), Some(3.0), None, Some(7.5)]);
        assert_eq!((&a.scores, &a.missing, &a.usage.item_tokens), (&b.scores, &b.missing, &b.usage.item_tokens));
        assert_eq!(a.missing, vec![3]);
        assert_eq!(a.usage.item_tokens, tokens);
        // Out of order, or fewer answers than items: copied by index, as any other shard.
        let (c, _) = merge(2, None, 100, vec![done(&[1, 0], &[0.1, 0.2], &[1, 2], 9)], t0, None).unwrap();
        assert_eq!((c.scores, c.usage.item_tokens), (vec![Some(0.2), Some(0.1)], vec![2, 1]));
        let (d, _) = merge(2, None, 100, vec![done(&[0, 1], &[0.1], &[1], 9)], t0, None).unwrap();
        assert_eq!((d.scores, d.usage.item_tokens), (vec![Some(0.1), None], vec![1, 0]));
    }

    mod properties {
        //! Invariants of a merge over generated splits: every score lands at its caller index,
        //! `missing` lists exactly the unscored indices, sorted, ids and token counts are kept
        //! in input order; a failed shard fails the call, all missed is a 504.
        use super::*;
        use proptest::prelude::*;

        /// The score a shard gives caller item `i` (so a misplaced score is visible).
        fn score_of(i: usize) -> f32 {
            i as f32 * 0.25 - 3.0
        }

        /// How one shard ended: done (with the shard indices the worker itself left
        /// unscored), or missed by the deadline.
        #[derive(Debug, Clone)]
        enum Kind {
            Done(Vec<bool>),
            Missed,
        }

        /// A request of `n` items split into shards: a permutation cut into pieces, each piece
        /// in its own (shuffled) order, each with an outcome.
        fn split() -> impl Strategy<Value = (usize, Vec<(Vec<usize>, Kind)>)> {
            (1usize..120).prop_flat_map(|n| {
                (Just((0..n).collect::<Vec<usize>>()).prop_shuffle(), prop::collection::vec(1usize..20, 1..40))
                    .prop_flat_map(move |(order, cuts)| {
                        let mut pieces = Vec::new();
                        let mut at = 0;
                        for c in cuts.iter().cycle() {
                            if at >= order.len() {
                                break;
                            }
                            let end = (at + c).min(order.len());
                            pieces.push(order[at..end].to_vec());
                            at = end;
                        }
                        let kinds: Vec<_> = pieces
                            .iter()
                            .map(|p| prop_oneof![3 => prop::collection::vec(prop::bool::weighted(0.1), p.len()).prop_map(Kind::Done), 1 => Just(Kind::Missed)])
                            .collect();
                        (Just(n), Just(pieces), kinds)
                            .prop_map(|(n, pieces, kinds)| (n, pieces.into_iter().zip(kinds).collect::<Vec<_>>()))
                    })
            })
        }

        fn shard(items: &[usize], kind: &Kind) -> ShardResult {
            match kind {
                Kind::Missed => ShardResult { items: items.to_vec(), outcome: ShardOutcome::Missed },
                Kind::Done(worker_missing) => {
                    let mut r = done(items, &[], &[], 3);
                    if let ShardOutcome::Done(d) = &mut r.outcome {
                        d.response.scores =
                            items.iter().zip(worker_missing).map(|(&i, &m)| (!m).then(|| score_of(i))).collect();
                        d.response.missing = (0..items.len()).filter(|&k| worker_missing[k]).collect();
                        d.response.usage.item_tokens = items.iter().map(|&i| i as u32 + 1).collect();
                    }
                    r
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn scores_in_input_order_and_missing_exact((n, shards) in split(), with_ids in any::<bool>()) {
                let ids = with_ids.then(|| (0..n).map(|i| (i % 3 != 0).then(|| format!("id{i}"))).collect::<Vec<_>>());
                let mut want_missing: Vec<usize> = Vec::new();
                for (items, kind) in &shards {
                    match kind {
                        Kind::Missed => want_missing.extend(items),
                        Kind::Done(m) => want_missing.extend(items.iter().zip(m).filter(|(_, &m)| m).map(|(&i, _)| i)),
                    }
                }
                want_missing.sort_unstable();
                let any_done = shards.iter().any(|(_, k)| matches!(k, Kind::Done(_)));
                let results = shards.iter().map(|(items, kind)| shard(items, kind)).collect();
                let merged = merge(n, ids.clone(), 100, results, Instant::now(), None);
                if !any_done {
                    prop_assert_eq!(merged.unwrap_err().status(), 504);
                    return Ok(());
                }
                let (r, stats) = merged.unwrap();
                prop_assert_eq!(r.scores.len(), n);
                prop_assert_eq!(&r.missing, &want_missing, "missing: exact and sorted");
                prop_assert_eq!(stats.missing, want_missing.len());
                prop_assert_eq!(stats.shards, shards.len());
                for i in 0..n {
                    let want = if want_missing.binary_search(&i).is_ok() { None } else { Some(score_of(i)) };
                    prop_assert_eq!(r.scores[i], want, "score of item {}", i);
                }
                prop_assert_eq!(&r.ids, &ids, "ids kept as given");
                prop_assert_eq!(r.usage.item_tokens.len(), n);
                for (items, kind) in &shards {
                    if let Kind::Done(_) = kind {
                        for &i in items {
                            prop_assert_eq!(r.usage.item_tokens[i], i as u32 + 1);
                        }
                    }
                }
            }

            #[test]
            fn a_failed_shard_fails_the_call_with_caller_indices((n, shards) in split(), pick in any::<prop::sample::Index>()) {
                let failed = pick.index(shards.len());
                let results = shards
                    .iter()
                    .enumerate()
                    .map(|(j, (items, kind))| {
                        if j == failed {
                            let k = items.len() - 1;
                            ShardResult { items: items.clone(), outcome: ShardOutcome::Failed(ApiError::invalid(format!("items[{k}] is empty"))) }
                        } else {
                            shard(items, kind)
                        }
                    })
                    .collect();
                let e = merge(n, None, 100, results, Instant::now(), None).unwrap_err();
                prop_assert_eq!(e.status(), 422);
                let last = *shards[failed].0.last().unwrap();
                prop_assert_eq!(e.message, format!("items[{last}] is empty"));
            }
        }
    }
}
