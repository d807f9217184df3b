//! Texts for a trace that holds only hashes: each text is made from its hash and its token
//! count alone, so a hash seen twice gives the same text twice (repeats stay repeats, for the
//! pair cache and the prefix cache alike) and different hashes give different texts.
//!
//! A text of n words: the first min(n, 3) words spell the hash in base 36 (31 bits per
//! six-character word, so two words already tell 62 bits apart and three the whole 64), the
//! rest are words of the workload generator's vocabulary drawn from a generator seeded by the
//! hash. Every word is at most six letters or digits: one token for the simulated worker's
//! tokenizer, so the sim counts exactly the tokens the trace recorded.
//!
//! Token counts come from the trace: an item's segment tokens less the template tail, a
//! query's prefix tokens less the template head (and the instruction's three words). A hash
//! whose request failed everywhere (no counts recorded) gets the median of the known ones.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::TraceRecord;
use crate::sim::tokens::{TEMPLATE_HEAD_TOKENS, TEMPLATE_TAIL_TOKENS};
use crate::workload::{GenRequest, WORDS};

/// Words of a synthesised instruction (its hash, spelled).
pub const INSTRUCTION_WORDS: u32 = 3;

/// Longest text made, in words: a trace is input like any other, and a count of billions must
/// not become gigabytes (a worker's sequence limit is far below this).
pub const MAX_WORDS: u32 = 65_536;

/// A text of `words` words (at least one, at most [`MAX_WORDS`]) made from `hash`.
pub fn text(hash: u64, words: u32) -> String {
    let words = words.clamp(1, MAX_WORDS);
    let mut out = String::with_capacity(words as usize * 7);
    for k in 0..words.min(3) {
        if k > 0 {
            out.push(' ');
        }
        push_base36((hash >> (31 * k)) & 0x7fff_ffff, &mut out);
    }
    let mut rng = StdRng::seed_from_u64(hash ^ 0x7e87_5e5e_d00d_f00d);
    for _ in 3..words {
        out.push(' ');
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out
}

/// Six base-36 digits (36^6 > 2^31).
fn push_base36(mut v: u64, out: &mut String) {
    let mut digits = [b'0'; 6];
    for d in digits.iter_mut().rev() {
        *d = b"0123456789abcdefghijklmnopqrstuvwxyz"[(v % 36) as usize];
        v /= 36;
    }
    out.extend(digits.iter().map(|&b| b as char));
}

/// One request of a replayed trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRequest {
    /// Arrival, seconds after the trace's first request.
    pub t_s: f64,
    pub req: GenRequest,
    pub instruction: Option<String>,
    pub deadline_ms: Option<u64>,
}

/// Word counts per hash, learned from the whole trace.
#[derive(Debug)]
pub struct Lengths {
    items: HashMap<u64, u32>,
    queries: HashMap<(u64, Option<u64>), u32>,
    default_item: u32,
    default_query: u32,
}

impl Lengths {
    pub fn of(records: &[TraceRecord]) -> Lengths {
        let mut items = HashMap::new();
        let mut queries = HashMap::new();
        for r in records {
            for (&h, &t) in r.items.iter().zip(&r.item_tokens) {
                if t > 0 {
                    items.entry(h).or_insert(t.saturating_sub(TEMPLATE_TAIL_TOKENS).max(1));
                }
            }
            if r.prefix_tokens > 0 {
                let own = if r.instruction.is_some() { INSTRUCTION_WORDS } else { 0 };
                let words = r.prefix_tokens.saturating_sub(TEMPLATE_HEAD_TOKENS + own).max(1);
                queries.entry((r.query, r.instruction)).or_insert(words);
            }
        }
        let median = |v: Vec<u32>, default: u32| {
            let mut v = v;
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(default)
        };
        Lengths {
            default_item: median(items.values().copied().collect(), 64),
            default_query: median(queries.values().copied().collect(), 4),
            items,
            queries,
        }
    }

    pub fn item_words(&self, hash: u64) -> u32 {
        self.items.get(&hash).copied().unwrap_or(self.default_item)
    }

    pub fn query_words(&self, query: u64, instruction: Option<u64>) -> u32 {
        self.queries.get(&(query, instruction)).copied().unwrap_or(self.default_query)
    }
}

/// The trace as requests to send, each made when asked for (a trace of thousands of requests
/// of hundreds of items would take hundreds of megabytes as texts at once).
#[derive(Debug)]
pub struct Replay {
    records: Vec<TraceRecord>,
    lengths: Lengths,
    t0_ms: u64,
}

impl Replay {
    /// `records` in arrival order (as [`super::read`] returns them).
    pub fn new(records: Vec<TraceRecord>) -> Replay {
        let lengths = Lengths::of(&records);
        let t0_ms = records.first().map_or(0, |r| r.t_ms);
        Replay { records, lengths, t0_ms }
    }

    /// Sends every request with `deadline_ms` instead of its traced one.
    pub fn set_deadlines(&mut self, deadline_ms: Option<u64>) {
        for r in &mut self.records {
            r.deadline_ms = deadline_ms;
        }
    }

    /// The requests arriving in the first `span_s` seconds (what a run of that length sends).
    pub fn truncated(&self, span_s: f64) -> Replay {
        let n = (0..self.records.len()).take_while(|&i| self.t_s(i) < span_s).count();
        Replay::new(self.records[..n].to_vec())
    }

    pub fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    pub fn lengths(&self) -> &Lengths {
        &self.lengths
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Arrival of request `i`, seconds after the first.
    pub fn t_s(&self, i: usize) -> f64 {
        self.records.get(i).map_or(0.0, |r| r.t_ms.saturating_sub(self.t0_ms) as f64 / 1e3)
    }

    /// Seconds from the first arrival to the last.
    pub fn span_s(&self) -> f64 {
        self.t_s(self.records.len().saturating_sub(1))
    }

    /// Request `i` with its texts.
    pub fn request(&self, i: usize) -> Option<ReplayRequest> {
        let r = self.records.get(i)?;
        Some(ReplayRequest {
            t_s: self.t_s(i),
            req: GenRequest {
                query: text(r.query, self.lengths.query_words(r.query, r.instruction)),
                items: r.items.iter().map(|&h| text(h, self.lengths.item_words(h))).collect(),
                reused: false,
            },
            instruction: r.instruction.map(|h| text(h, INSTRUCTION_WORDS)),
            deadline_ms: r.deadline_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tokens;

    #[test]
    fn texts_are_deterministic_distinct_and_counted_exactly() {
        for words in [1, 2, 3, 4, 40, 300] {
            let a = text(0xdead_beef_1234_5678, words);
            assert_eq!(a, text(0xdead_beef_1234_5678, words), "same hash, same text");
            assert_eq!(tokens::count_tokens(&a), words, "{a}");
        }
        assert_eq!(tokens::count_tokens(&text(7, 0)), 1, "never empty");
        assert_eq!(tokens::count_tokens(&text(7, u32::MAX)), MAX_WORDS, "bounded");
        // Different hashes, different texts, even when they differ in one high bit only.
        let mut seen = std::collections::HashSet::new();
        let hashes: std::collections::BTreeSet<u64> =
            (0..2000u64).chain((0..64).map(|b| 1u64 << b)).chain([u64::MAX]).collect();
        for &h in &hashes {
            assert!(seen.insert(text(h, 3)), "hash {h:#x} collides");
        }
        assert_ne!(text(1, 2), text(1 | (1 << 40), 2));
    }

    #[test]
    fn a_trace_becomes_requests_the_sim_counts_as_the_trace_did() {
        let rec = |t_ms, query, instruction, items: Vec<u64>, item_tokens: Vec<u32>, prefix_tokens| TraceRecord {
            t_ms,
            query,
            instruction,
            items,
            item_tokens,
            prefix_tokens,
            cached_items: 0,
            missing: 0,
            deadline_ms: Some(500),
            status: 200,
            latency_ms: 1.0,
        };
        let records = vec![
            rec(5_000, 1, None, vec![10, 11], vec![60, 15], 44),
            rec(5_250, 2, Some(9), vec![11, 12], vec![15, 0], 48),
            // Failed: no counts; item 11 known from the others, 13 not.
            rec(6_000, 1, None, vec![11, 13], vec![], 0),
        ];
        let replay = Replay::new(records);
        let r: Vec<ReplayRequest> = (0..replay.len()).filter_map(|i| replay.request(i)).collect();
        assert_eq!(replay.span_s(), 1.0);
        assert_eq!(r.iter().map(|r| r.t_s).collect::<Vec<_>>(), vec![0.0, 0.25, 1.0]);
        assert_eq!(tokens::prefix_tokens(&r[0].req.query, None), 44);
        assert_eq!(r[0].req.items.iter().map(|t| tokens::item_tokens(t)).collect::<Vec<_>>(), vec![60, 15]);
        assert_eq!(tokens::prefix_tokens(&r[1].req.query, r[1].instruction.as_deref()), 48);
        assert_eq!(r[1].req.items[0], r[0].req.items[1], "a repeated item hash is the same text");
        assert_eq!(r[2].req.query, r[0].req.query, "a repeated query is the same text");
        assert_eq!(r[2].req.items[0], r[0].req.items[1]);
        // Unknown lengths: the median of the known ones (50 and 5 words → 50).
        assert_eq!(tokens::count_tokens(&r[2].req.items[1]), 50);
        assert_eq!(tokens::count_tokens(&r[1].req.items[1]), 50, "an unscored item's count is unknown too");
        assert_eq!(r[1].deadline_ms, Some(500));
    }
}
