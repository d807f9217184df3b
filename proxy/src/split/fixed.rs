//! The fixed-size split (the request-level baseline): consecutive chunks of a fixed item
//! count, each placed by the balancing policy's `assign`.

use super::{plan_from_groups, Candidate, Plan, Request, SplitPolicy};
use crate::balancer::Policy;
use crate::cluster::worker::WorkerView;

/// `split.mode = "fixed"`: chunks of `items` items.
pub struct FixedSplit {
    pub items: usize,
}

impl SplitPolicy for FixedSplit {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn plan(&self, req: &Request<'_>, views: &[WorkerView], balance: &dyn Policy) -> Plan {
        let k = req.item_tokens.len().div_ceil(self.items);
        let assignment = balance.assign(views, k);
        let cands: Vec<Candidate> = views.iter().map(Candidate::from).collect();
        split_fixed(req, &cands, self.items, &assignment)
    }
}

/// Consecutive chunks of `chunk` items; shard j goes to candidate `assignment[j]`.
pub fn split_fixed(req: &Request<'_>, candidates: &[Candidate], chunk: usize, assignment: &[usize]) -> Plan {
    let m = req.item_tokens.len();
    let chunk = chunk.max(1);
    let groups: Vec<(usize, Vec<usize>)> = (0..m.div_ceil(chunk))
        .map(|j| (assignment.get(j).copied().unwrap_or(0), (j * chunk..((j + 1) * chunk).min(m)).collect()))
        .collect();
    plan_from_groups(req, candidates, groups)
}
