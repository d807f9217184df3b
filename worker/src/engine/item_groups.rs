//! Items of one call that begin alike: groups whose shared leading run of tokens (after the
//! call's query prefix) is computed once for the whole group.
//!
//! Product texts of one search often open the same way (a category path, a brand block, a spec
//! header). Put first, those runs are common prefixes of many prompts: computed once, in the
//! pass before the items that read them, with the same block lifecycle as the query prefix.
//! Scores do not change: every op computes a row from its own inputs and attention visits a
//! row's keys in position order whatever blocks hold them.
//!
//! One level: each item is in at most one group. The grouping walks the items sorted by their
//! tokens (neighbours share the longest runs) and grows a group while that adds to the tokens
//! saved, `run · (members − 1)`.

/// Items sharing their first `run_len` tokens after the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemGroup {
    pub run_len: usize,
    /// Item indices, ascending.
    pub items: Vec<usize>,
}

/// Groups of at least two items whose prompts share a run of at least `min_run` tokens after
/// the first `prefix_len`. A run never takes an item's last token (its row gives the score).
pub fn item_groups(prompts: &[Vec<u32>], prefix_len: usize, min_run: usize) -> Vec<ItemGroup> {
    let tail = |i: usize| &prompts[i][prefix_len.min(prompts[i].len())..];
    // Longest run two items may share: their common tokens, leaving each at least one own token.
    let shared = |a: usize, b: usize| {
        let (ta, tb) = (tail(a), tail(b));
        let cap = ta.len().min(tb.len()).saturating_sub(1);
        ta.iter().zip(tb).take(cap).take_while(|(x, y)| x == y).count()
    };
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by(|&a, &b| tail(a).cmp(tail(b)).then(a.cmp(&b)));
    let mut groups = vec![];
    let mut k = 0;
    while k < order.len() {
        let mut members = vec![order[k]];
        let mut run = usize::MAX;
        while k + members.len() < order.len() {
            let next = order[k + members.len()];
            let r = run.min(shared(members[members.len() - 1], next));
            // Worth it only while the run stays long enough and the saving grows.
            let saved_now = if members.len() > 1 { run * (members.len() - 1) } else { 0 };
            if r < min_run.max(1) || r * members.len() < saved_now {
                break;
            }
            run = r;
            members.push(next);
        }
        k += members.len();
        if members.len() > 1 {
            members.sort_unstable();
            groups.push(ItemGroup { run_len: run, items: members });
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(prefix: &[u32], tail: &[u32]) -> Vec<u32> {
        prefix.iter().chain(tail).copied().collect()
    }

    #[test]
    fn items_sharing_a_header_form_a_group() {
        let pre = [1, 2, 3];
        let prompts = vec![
            p(&pre, &[10, 11, 12, 13, 50]),
            p(&pre, &[20, 21]),
            p(&pre, &[10, 11, 12, 13, 60, 61]),
            p(&pre, &[10, 11, 12, 14]),
            p(&pre, &[20, 21, 22]),
        ];
        let g = item_groups(&prompts, 3, 2);
        // {0, 2, 3} share [10, 11, 12] (growing to three members saves 6 > 4 for [10..13] by two);
        // {1, 4} share [20] only: item 1's last token is its own.
        assert_eq!(g, vec![ItemGroup { run_len: 3, items: vec![0, 2, 3] }]);
        assert_eq!(item_groups(&prompts, 3, 1)[1], ItemGroup { run_len: 1, items: vec![1, 4] });
        // A longer minimum keeps the two that share four tokens and each keep an own token.
        assert_eq!(item_groups(&prompts, 3, 4), vec![ItemGroup { run_len: 4, items: vec![0, 2] }]);
        assert!(item_groups(&prompts, 3, 5).is_empty());
    }

    #[test]
    fn identical_items_keep_their_last_token_and_order_does_not_matter() {
        let pre = [7];
        let a = vec![p(&pre, &[5, 6, 7, 8]), p(&pre, &[5, 6, 7, 8]), p(&pre, &[9])];
        assert_eq!(item_groups(&a, 1, 2), vec![ItemGroup { run_len: 3, items: vec![0, 1] }]);
        let b = vec![a[2].clone(), a[0].clone(), a[1].clone()];
        assert_eq!(item_groups(&b, 1, 2), vec![ItemGroup { run_len: 3, items: vec![1, 2] }]);
        assert!(item_groups(&[], 0, 1).is_empty());
    }
}
