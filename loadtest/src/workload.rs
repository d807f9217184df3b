//! The workload: what requests look like (items per query, tokens per item, query length,
//! how often a query repeats, the deadline) and a deterministic generator of them.
//!
//! Item and query texts are made of short words (at most six letters), each exactly one token
//! for the simulated worker's tokenizer and about one for a real BPE tokenizer, so the drawn
//! token counts are the counts the workers see. A repeated query ("reuse") sends an earlier
//! request's query and items again, as a popular search does: a real worker serves its
//! prefix from cache.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sieve_shared::CostModel;

use crate::dist::Dist;
use crate::sim::tokens;

/// The most items a generated request has, and words a generated text has.
pub const MAX_COUNT: u32 = 100_000;
/// The most words a generated request has on average (items x words an item; ~60 MB of text).
const MAX_MEAN_WORDS: f64 = 1e7;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Items (candidates) per query.
    pub items: Dist,
    /// Tokens of each item's text.
    pub item_tokens: Dist,
    /// Tokens (words) of the query.
    pub query_tokens: Dist,
    /// Probability that a request repeats an earlier one (same query, same items).
    pub reuse: f64,
    /// Repeats are drawn from this many most recent distinct requests.
    pub reuse_pool: usize,
    /// `deadline_ms` sent with every request (none: the server's default budget).
    pub deadline_ms: Option<u64>,
    /// Instruction sent with every request (none: the model's default).
    pub instruction: Option<String>,
    /// Catalogue-style items: consecutive items come in groups of this many (1: no groups),
    /// each group's items opening with the same header (a category path, a brand block).
    pub group_size: Dist,
    /// The share of each grouped item's words that is its group's header, in [0, 1).
    pub header_fraction: f64,
}

impl Default for WorkloadSpec {
    /// Search relevance: ~200 candidates per query, 40-300 tokens each with a heavy tail
    /// (median 66, mean 87, p90 167), short queries, a fifth of queries repeated, 500 ms.
    fn default() -> Self {
        WorkloadSpec {
            items: Dist::LogNormal { median: 200.0, sigma: 0.3, min: 20.0, max: 1000.0 },
            item_tokens: Dist::Pareto { scale: 40.0, alpha: 1.2, max: 300.0 },
            query_tokens: Dist::Uniform { min: 2.0, max: 8.0 },
            reuse: 0.2,
            reuse_pool: 500,
            deadline_ms: Some(500),
            instruction: None,
            group_size: Dist::Fixed(1.0),
            header_fraction: 0.0,
        }
    }
}

impl WorkloadSpec {
    /// Parses a workload file (TOML or JSON; every key optional) and validates it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let spec: WorkloadSpec = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("workload JSON: {e}"))?
        } else {
            toml::from_str(text).map_err(|e| format!("workload TOML: {e}"))?
        };
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.reuse) {
            return Err(format!("reuse must be in [0, 1], got {}", self.reuse));
        }
        if self.reuse > 0.0 && self.reuse_pool == 0 {
            return Err("reuse_pool must be positive when reuse > 0".into());
        }
        if self.items.max() < 1.0 {
            return Err("items must allow at least one item per query".into());
        }
        // Draws are capped at MAX_COUNT; a request is built in memory before it is sent.
        for (name, d) in [("items", self.items), ("item_tokens", self.item_tokens), ("query_tokens", self.query_tokens)]
        {
            if d.min() > f64::from(MAX_COUNT) {
                return Err(format!("{name} {d}: every draw is over {MAX_COUNT}"));
            }
        }
        let words = self.items.mean().min(f64::from(MAX_COUNT)) * self.item_tokens.mean().min(f64::from(MAX_COUNT));
        if words > MAX_MEAN_WORDS {
            return Err(format!(
                "items {} x item_tokens {} average {words:.0} words a request, more than {MAX_MEAN_WORDS} \
                 (give the distributions a MAX)",
                self.items, self.item_tokens
            ));
        }
        if self.deadline_ms == Some(0) {
            return Err("deadline_ms must be positive".into());
        }
        if !(0.0..1.0).contains(&self.header_fraction) {
            return Err(format!("header_fraction must be in [0, 1), got {}", self.header_fraction));
        }
        Ok(())
    }

    /// Mean compute time of one request sent whole to one simulated worker of speed 1 (the
    /// prefix once, every item), over `samples` requests drawn with `seed`.
    pub fn mean_call_ms(&self, model: &CostModel, samples: usize, seed: u64) -> f64 {
        let mut g = WorkloadGen::new(self.clone(), seed);
        let n = samples.max(1);
        (0..n).map(|_| g.next_shape().call_ms(model)).sum::<f64>() / n as f64
    }
}

/// Token counts of one request, as the simulated worker counts them.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Words (tokens) of the query text.
    pub query_words: u32,
    /// Words (tokens) of each item's text.
    pub item_words: Vec<u32>,
}

impl Shape {
    /// Shared-prefix tokens (template head + query) as the simulated worker counts them.
    pub fn prefix_tokens(&self) -> u32 {
        tokens::TEMPLATE_HEAD_TOKENS + self.query_words
    }

    /// Compute time of the whole request as one call, at speed 1.
    pub fn call_ms(&self, model: &CostModel) -> f64 {
        model.call_ms(
            f64::from(self.prefix_tokens()),
            self.item_words.iter().map(|&w| f64::from(w + tokens::TEMPLATE_TAIL_TOKENS)),
        )
    }
}

/// One generated request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub query: String,
    pub items: Vec<String>,
    /// Whether it repeats an earlier request.
    pub reused: bool,
}

impl GenRequest {
    /// The `POST /v1/score` body.
    pub fn body(&self, instruction: Option<&str>, deadline_ms: Option<u64>) -> Vec<u8> {
        #[derive(Serialize)]
        struct Body<'a> {
            query: &'a str,
            items: &'a [String],
            #[serde(skip_serializing_if = "Option::is_none")]
            instruction: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            deadline_ms: Option<u64>,
        }
        let size = 64 + self.query.len() + self.items.iter().map(|i| i.len() + 3).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        // Strings and numbers only: serialisation cannot fail.
        let _ =
            serde_json::to_writer(&mut out, &Body { query: &self.query, items: &self.items, instruction, deadline_ms });
        out
    }
}

/// Short words (one simulated token each) for item and query texts.
pub const WORDS: &[&str] = &[
    "trail", "run", "shoe", "shoes", "men", "women", "kids", "red", "blue", "black", "white", "green", "grey", "size",
    "light", "mesh", "grip", "sole", "heel", "toe", "road", "ultra", "race", "fit", "wide", "narrow", "soft", "firm",
    "foam", "carbon", "plate", "knit", "lace", "zip", "boot", "sock", "jacket", "rain", "wind", "warm", "cool", "dry",
    "fast", "long", "short", "pack", "bag", "cap", "hat", "glove", "top", "tee", "pant", "tight", "vest", "hood",
    "water", "proof", "cotton", "wool", "nylon", "rubber", "steel", "gold", "silver", "pink", "navy", "olive", "sand",
    "new", "sale", "deal", "pro", "max", "mini", "lite", "plus", "air", "gel", "flex", "core", "base", "edge", "peak",
    "hill", "city", "park", "gym", "yoga", "bike", "swim", "ski", "surf", "camp", "hike", "walk", "jog", "sprint",
    "model", "style", "brand", "year", "fall", "spring", "summer", "winter", "pair", "set", "kit", "box", "one", "two",
];

/// Deterministic request generator: the same spec and seed give the same requests.
pub struct WorkloadGen {
    spec: WorkloadSpec,
    rng: StdRng,
    recent: VecDeque<GenRequest>,
}

impl WorkloadGen {
    pub fn new(spec: WorkloadSpec, seed: u64) -> Self {
        WorkloadGen { spec, rng: StdRng::seed_from_u64(seed ^ 0x5151_e5e5_7a7a_0b0b), recent: VecDeque::new() }
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// Draws the token counts of a fresh request.
    pub fn next_shape(&mut self) -> Shape {
        let m = self.spec.items.sample_count(&mut self.rng, 1).min(MAX_COUNT);
        let query_words = self.spec.query_tokens.sample_count(&mut self.rng, 1).min(MAX_COUNT);
        let item_words = (0..m).map(|_| self.spec.item_tokens.sample_count(&mut self.rng, 1).min(MAX_COUNT)).collect();
        Shape { query_words, item_words }
    }

    fn words(&mut self, n: u32, out: &mut String) {
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(WORDS[self.rng.random_range(0..WORDS.len())]);
        }
    }

    /// The next request: a repeat of a recent one with probability `reuse`, else fresh.
    pub fn next_request(&mut self) -> GenRequest {
        if !self.recent.is_empty() && self.rng.random::<f64>() < self.spec.reuse {
            let i = self.rng.random_range(0..self.recent.len());
            let mut r = self.recent[i].clone();
            r.reused = true;
            return r;
        }
        let shape = self.next_shape();
        let mut query = String::new();
        self.words(shape.query_words, &mut query);
        let mut items = Vec::with_capacity(shape.item_words.len());
        let mut header = String::new();
        let mut left_in_group = 0u32;
        for &n in &shape.item_words {
            // A new group: its header is the share of its first item's words (at least one).
            if left_in_group == 0 {
                left_in_group = self.spec.group_size.sample_count(&mut self.rng, 1);
                header.clear();
                if left_in_group > 1 && self.spec.header_fraction > 0.0 {
                    let h = ((f64::from(n) * self.spec.header_fraction).round() as u32).max(1);
                    self.words(h, &mut header);
                }
            }
            left_in_group -= 1;
            let header_words = if header.is_empty() { 0 } else { header.split(' ').count() as u32 };
            let mut t = String::with_capacity(n as usize * 6);
            t.push_str(&header);
            if n > header_words {
                if !t.is_empty() {
                    t.push(' ');
                }
                self.words(n - header_words, &mut t);
            }
            items.push(t);
        }
        let r = GenRequest { query, items, reused: false };
        if self.spec.reuse > 0.0 {
            if self.recent.len() >= self.spec.reuse_pool {
                self.recent.pop_front();
            }
            self.recent.push_back(r.clone());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_requests_other_seed_other_requests() {
        let spec = WorkloadSpec::default();
        let a: Vec<GenRequest> = {
            let mut g = WorkloadGen::new(spec.clone(), 3);
            (0..50).map(|_| g.next_request()).collect()
        };
        let b: Vec<GenRequest> = {
            let mut g = WorkloadGen::new(spec.clone(), 3);
            (0..50).map(|_| g.next_request()).collect()
        };
        let c: Vec<GenRequest> = {
            let mut g = WorkloadGen::new(spec, 4);
            (0..50).map(|_| g.next_request()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a[7].body(None, Some(500)), b[7].body(None, Some(500)));
    }

    #[test]
    fn catalogue_items_share_their_group_header() {
        let spec = WorkloadSpec {
            items: Dist::Fixed(40.0),
            item_tokens: Dist::Fixed(50.0),
            group_size: Dist::Fixed(8.0),
            header_fraction: 0.4,
            reuse: 0.0,
            ..WorkloadSpec::default()
        };
        let r = WorkloadGen::new(spec, 1).next_request();
        assert_eq!(r.items.len(), 40);
        for group in r.items.chunks(8) {
            let header: Vec<&str> = group[0].split(' ').take(20).collect();
            for item in group {
                let words: Vec<&str> = item.split(' ').collect();
                assert_eq!(words.len(), 50);
                assert_eq!(words[..20], header[..], "a group's items open with its header");
            }
        }
        assert_ne!(
            r.items[0].split(' ').take(20).collect::<Vec<_>>(),
            r.items[8].split(' ').take(20).collect::<Vec<_>>()
        );
        assert!(WorkloadSpec::parse("header_fraction = 1.0").is_err());
    }

    /// KS distance between integer samples and a continuous law rounded to integers.
    fn ks_rounded(samples: &[u32], d: &Dist) -> f64 {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let n = s.len() as f64;
        let mut worst = 0.0f64;
        let mut i = 0;
        while i < s.len() {
            let v = s[i];
            let j = s.partition_point(|&x| x <= v);
            // Rounding: P(round(X) <= v) = F(v + 0.5).
            let f = d.cdf(f64::from(v) + 0.5);
            worst = worst.max((f - j as f64 / n).abs()).max((d.cdf(f64::from(v) - 0.5) - i as f64 / n).abs());
            i = j;
        }
        worst
    }

    #[test]
    fn requests_follow_the_configured_distributions() {
        let spec = WorkloadSpec { reuse: 0.0, ..WorkloadSpec::default() };
        let mut g = WorkloadGen::new(spec.clone(), 11);
        let mut items_per_query = Vec::new();
        let mut item_tokens = Vec::new();
        let mut query_tokens = Vec::new();
        for _ in 0..2000 {
            let r = g.next_request();
            items_per_query.push(r.items.len() as u32);
            // Counted back with the simulated worker's tokenizer: what the workers will see.
            query_tokens.push(tokens::count_tokens(&r.query));
            item_tokens.extend(r.items.iter().map(|t| tokens::count_tokens(t)));
        }
        // 99.9% KS critical values: 1.95/sqrt(n).
        let k = ks_rounded(&items_per_query, &spec.items);
        assert!(k < 1.95 / 2000f64.sqrt(), "items per query: KS {k}");
        let k = ks_rounded(&item_tokens, &spec.item_tokens);
        assert!(k < 1.95 / (item_tokens.len() as f64).sqrt() + 0.002, "item tokens: KS {k}");
        assert!(item_tokens.iter().all(|&t| (40..=300).contains(&t)));
        let mean = item_tokens.iter().map(|&t| f64::from(t)).sum::<f64>() / item_tokens.len() as f64;
        assert!((mean - spec.item_tokens.mean()).abs() < 1.0, "mean item tokens {mean}");
        let q = ks_rounded(&query_tokens, &spec.query_tokens);
        assert!(q < 1.95 / 2000f64.sqrt(), "query tokens: KS {q}");
    }

    #[test]
    fn reuse_rate_is_respected() {
        let spec = WorkloadSpec { reuse: 0.3, items: Dist::Fixed(5.0), ..WorkloadSpec::default() };
        let mut g = WorkloadGen::new(spec, 5);
        let n = 4000;
        let reused = (0..n).filter(|_| g.next_request().reused).count() as f64 / n as f64;
        // Binomial sd at n=4000: 0.0072; allow 4 sd.
        assert!((reused - 0.3).abs() < 0.03, "reused fraction {reused}");
    }

    #[test]
    fn parses_workload_files() {
        let s =
            WorkloadSpec::parse("items = \"uniform:10,20\"\nitem_tokens = 50\nreuse = 0\ndeadline_ms = 300\n").unwrap();
        assert_eq!(s.items, Dist::Uniform { min: 10.0, max: 20.0 });
        assert_eq!(s.item_tokens, Dist::Fixed(50.0));
        assert_eq!(s.deadline_ms, Some(300));
        assert!(WorkloadSpec::parse("reuse = 2\n").unwrap_err().contains("reuse"));
        assert!(WorkloadSpec::parse("itemz = 3\n").unwrap_err().contains("itemz"));
        let j = WorkloadSpec::parse(r#"{"items": "pareto:40,1.2,300", "reuse": 0.1}"#).unwrap();
        assert_eq!(j.reuse, 0.1);
    }

    /// A request is built in memory before it is sent: a workload whose requests cannot be is
    /// refused, and every draw is capped.
    #[test]
    fn workloads_too_large_to_build_are_refused_and_draws_capped() {
        let e = WorkloadSpec::parse("items = 1e300\n").unwrap_err();
        assert!(e.contains("every draw is over 100000"), "{e}");
        let e = WorkloadSpec::parse("item_tokens = \"pareto:40,0.5\"\n").unwrap_err();
        assert!(e.contains("give the distributions a MAX"), "{e}");
        let s = WorkloadSpec::parse("items = \"uniform:1,1e11\"\nitem_tokens = 1\nreuse = 0\n").unwrap();
        let mut g = WorkloadGen::new(s, 1);
        let shape = g.next_shape();
        assert!((1..=MAX_COUNT as usize).contains(&shape.item_words.len()), "{}", shape.item_words.len());
    }

    #[test]
    fn mean_call_cost_matches_the_model_arithmetic() {
        let spec = WorkloadSpec {
            items: Dist::Fixed(10.0),
            item_tokens: Dist::Fixed(50.0),
            query_tokens: Dist::Fixed(4.0),
            ..WorkloadSpec::default()
        };
        let m = CostModel { request_ms: 2.0, token_ms: 0.01, token_context_ms: 0.0 };
        let expect = 2.0 + 0.01 * (44.0 + 10.0 * 60.0);
        assert!((spec.mean_call_ms(&m, 10, 1) - expect).abs() < 1e-9);
    }
}
