//! Items of a call whose texts begin alike (a category path, a brand block put first), found
//! from the texts alone: the proxy's split keeps such a group on one shard, and the simulated
//! worker charges its run once, as a real worker computes it once per call that holds two or
//! more of its items (the worker's radix grouping on token ids, `[engine] item_prefix_sharing`).
//!
//! A byte-level longest common prefix over the sorted texts, cut back to a word boundary (a
//! tokenizer's last token of the run may merge with what follows), is enough to find the groups;
//! the caller's tokenizer or estimator turns a run's bytes into tokens. One level only: where the
//! worker's tree nests runs, a group here takes the run that saves the most.

/// The shortest run worth sharing, in tokens: the worker's `[engine] item_prefix_min_tokens`
/// default (chosen by measurement, `docs/benchmarks/item-sharing.md`). Runs shorter than this
/// form no group on a worker, so they form none here.
pub const DEFAULT_MIN_RUN_TOKENS: usize = 8;

/// Items of a call that share a leading run.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemRun {
    /// Bytes of the run (a prefix of every member's text, ending on a word boundary).
    pub bytes: usize,
    /// The run's tokens, as the caller's `tokens_of` counts them.
    pub tokens: f64,
    /// The members' indices into the texts, ascending; at least two.
    pub items: Vec<usize>,
}

/// The groups of `texts` sharing a leading run of at least `min_tokens` (as `tokens_of` counts
/// a run's text). Every item is in at most one group; groups come in the texts' sorted order.
///
/// The sorted texts and their neighbours' common prefixes are a radix tree laid flat: a range
/// of sorted texts shares the smallest common prefix between neighbours in it. A range is one
/// group, or it is cut where that smallest prefix is (into the subtrees below the node), which
/// ever saves more tokens ((members − 1) × run tokens summed): a family with a long shared
/// header is not merged into the short run it shares with its neighbours, and many small
/// families do not stay apart when one short run over all of them saves more.
pub fn leading_runs(texts: &[&str], min_tokens: f64, tokens_of: impl Fn(&str) -> f64) -> Vec<ItemRun> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    // Equal texts are interchangeable here (a group's members are sorted again): no need for a
    // stable sort.
    order.sort_unstable_by(|&a, &b| texts[a].cmp(texts[b]));
    // Between sorted neighbours j-1 and j (index j; 0 unused): the shared run, bytes and tokens.
    let mut shared = vec![(0usize, 0.0f64); order.len()];
    for j in 1..order.len() {
        let (a, b) = (texts[order[j - 1]], texts[order[j]]);
        let bytes = word_boundary(b, common_prefix(a, b));
        shared[j] = match shared[j - 1] {
            _ if bytes == 0 => (0, 0.0),
            // The same length as the previous neighbours' run is the same text (both are
            // prefixes of `a`): its tokens are known.
            (prev, tokens) if prev == bytes => (bytes, tokens),
            _ => (bytes, tokens_of(&b[..bytes])),
        };
    }
    let mut out = Vec::new();
    best_cut(&order, &shared, 0, order.len(), min_tokens, &mut out);
    out
}

/// The groups of sorted range `lo..hi` that save the most tokens, pushed onto `out`; returns
/// what they save.
fn best_cut(order: &[usize], shared: &[(usize, f64)], lo: usize, hi: usize, min: f64, out: &mut Vec<ItemRun>) -> f64 {
    if hi - lo < 2 {
        return 0.0;
    }
    // The node: the smallest run between neighbours in the range.
    let (bytes, tokens) = shared[lo + 1..hi].iter().copied().min_by_key(|s| s.0).unwrap_or((0, 0.0));
    // Its subtrees: the range cut wherever neighbours share only the node's run.
    let mark = out.len();
    let mut below = 0.0;
    let mut start = lo;
    for j in lo + 1..=hi {
        if j == hi || shared[j].0 == bytes {
            below += best_cut(order, shared, start, j, min, out);
            start = j;
        }
    }
    let whole = (hi - lo - 1) as f64 * tokens;
    if bytes == 0 || tokens < min || below >= whole {
        return below;
    }
    out.truncate(mark);
    let mut items = order[lo..hi].to_vec();
    items.sort_unstable();
    out.push(ItemRun { bytes, tokens, items });
    whole
}

/// Length of the longest common prefix of `a` and `b`, in bytes.
fn common_prefix(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // 8 bytes a step, then bytewise.
    let mut n = 0;
    while n + 8 <= a.len().min(b.len()) {
        let x = u64::from_ne_bytes(a[n..n + 8].try_into().unwrap_or_default());
        let y = u64::from_ne_bytes(b[n..n + 8].try_into().unwrap_or_default());
        if x != y {
            break;
        }
        n += 8;
    }
    n + a[n..].iter().zip(&b[n..]).take_while(|(x, y)| x == y).count()
}

/// `len` cut back to just after the last byte of `text[..len]` that is not part of a word (a
/// space or a symbol), so that the run ends where a token ends; 0 when there is none.
fn word_boundary(text: &str, len: usize) -> usize {
    let bytes = text.as_bytes();
    // A whole text, or one that goes on with a space or a symbol, ends on a boundary here.
    if bytes.get(len).is_none_or(|b| b.is_ascii_whitespace() || b.is_ascii_punctuation()) {
        return len;
    }
    bytes[..len].iter().rposition(|b| b.is_ascii_whitespace() || b.is_ascii_punctuation()).map_or(0, |p| p + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per word.
    fn words(s: &str) -> f64 {
        s.split_whitespace().count() as f64
    }

    #[test]
    fn groups_are_the_items_that_share_a_long_enough_run() {
        let texts = [
            "shoes running trail brand acme model x1 red",
            "bags leather tote",
            "shoes running trail brand acme model x2 blue",
            "shoes running road brand zeta",
            "shoes running trail brand acme model x3 green",
        ];
        let g = leading_runs(&texts, 3.0, words);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].items, vec![0, 2, 4]);
        assert_eq!(&texts[0][..g[0].bytes], "shoes running trail brand acme model ");
        assert_eq!(g[0].tokens, 6.0);
        // The road shoe shares two words with them: below the threshold, no group of 4.
        assert!(leading_runs(&texts, 7.0, words).is_empty(), "runs shorter than the threshold form no group");
        // With a threshold of 2 the road shoe still stays out: taking it would cut 3 × 6 tokens
        // of saving to 3 × 2.
        assert_eq!(leading_runs(&texts, 2.0, words)[0].items, vec![0, 2, 4]);
    }

    #[test]
    fn a_run_ends_on_a_word_boundary() {
        // "waterproof" and "waterproofing" share "waterproof" but not as a token.
        let texts = ["trail shoe waterproof mesh", "trail shoe waterproofing kit"];
        let g = leading_runs(&texts, 1.0, words);
        assert_eq!(&texts[0][..g[0].bytes], "trail shoe ");
        // Identical texts share all of themselves.
        let same = ["a b c", "a b c", "x"];
        assert_eq!(leading_runs(&same, 1.0, words), vec![ItemRun { bytes: 5, tokens: 3.0, items: vec![0, 1] }]);
        assert!(leading_runs(&[], 1.0, words).is_empty());
        assert!(leading_runs(&["only one"], 1.0, words).is_empty());
    }

    #[test]
    fn every_item_is_in_one_group_at_most_and_the_run_is_every_members_prefix() {
        let mut texts = Vec::new();
        for g in 0..20u32 {
            for v in 0..(g % 5 + 1) {
                texts.push(format!(
                    "cat {} > sub {} brand b{} spec s{} variant {v} w{}",
                    g % 3,
                    g % 4,
                    g,
                    g * 7,
                    g + v
                ));
            }
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let groups = leading_runs(&refs, 4.0, words);
        let mut seen = vec![0; texts.len()];
        for g in &groups {
            assert!(g.items.len() >= 2 && g.items.windows(2).all(|w| w[0] < w[1]));
            assert!(g.tokens >= 4.0);
            let run = &texts[g.items[0]][..g.bytes];
            for &i in &g.items {
                seen[i] += 1;
                assert!(texts[i].starts_with(run), "{run:?} / {:?}", texts[i]);
            }
        }
        assert!(seen.iter().all(|&n| n <= 1));
        // Each family of two or more variants is one group (its brand block is its own).
        assert_eq!(groups.len(), (0..20).filter(|g| g % 5 >= 1).count());
    }
}
