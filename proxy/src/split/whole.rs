//! No split: the whole request to the balancing policy's first worker.

use super::{plan_from_groups, ranked, Candidate, Plan, Request, SplitPolicy};
use crate::balancer::Policy;
use crate::cluster::worker::WorkerView;

/// `split.mode = "none"`.
pub struct WholeSplit;

impl SplitPolicy for WholeSplit {
    fn name(&self) -> &'static str {
        "none"
    }

    fn plan(&self, req: &Request<'_>, views: &[WorkerView], balance: &dyn Policy) -> Plan {
        let (cands, workers) = ranked(views, balance);
        split_whole(req, &cands, 0).on_workers(&workers)
    }
}

/// Everything to one candidate.
pub fn split_whole(req: &Request<'_>, candidates: &[Candidate], candidate: usize) -> Plan {
    plan_from_groups(req, candidates, vec![(candidate, (0..req.item_tokens.len()).collect())])
}
