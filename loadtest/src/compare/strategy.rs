//! The strategies compared, each a proxy configuration (split mode, balancing policy,
//! hedging, the pair-score cache, cache-aware routing); everything else (retries, breaker, health checks, the cost-model prior) is the
//! same for all.

use sieve_shared::proxy_config::{PolicyKind, SplitMode};
use sieve_shared::{CostModel, ProxyConfig, WorkerEndpoint};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    /// Short name for flags and file names.
    pub key: &'static str,
    /// Row label in tables and plots.
    pub name: &'static str,
    pub split: SplitMode,
    pub policy: PolicyKind,
    pub hedge: bool,
    /// Admission control (a request no plan can finish in time is refused at once); the
    /// baselines model proxies that have none.
    pub admission: bool,
    /// The proxy's pair-score cache (`[cache] enabled`): off in the routing strategies, so
    /// they are compared on the same work.
    pub cache: bool,
    /// Cache-aware routing (`[split] prefix_affinity`): off in strategies 1-7, so `ours` is
    /// the baseline of `ours-affinity`.
    pub prefix_affinity: bool,
}

pub const STRATEGIES: [Strategy; 6] = [
    Strategy {
        key: "whole-random",
        name: "1 whole request, random worker",
        split: SplitMode::None,
        policy: PolicyKind::Random,
        hedge: false,
        admission: false,
        cache: false,
        prefix_affinity: false,
    },
    Strategy {
        key: "fixed-random",
        name: "2 fixed split, random",
        split: SplitMode::Fixed,
        policy: PolicyKind::Random,
        hedge: false,
        admission: false,
        cache: false,
        prefix_affinity: false,
    },
    Strategy {
        key: "fixed-least",
        name: "3 fixed split, least-loaded",
        split: SplitMode::Fixed,
        policy: PolicyKind::LeastLoaded,
        hedge: false,
        admission: false,
        cache: false,
        prefix_affinity: false,
    },
    Strategy {
        key: "ours",
        name: "4 cost split, least-loaded (ours)",
        split: SplitMode::Cost,
        policy: PolicyKind::LeastLoaded,
        hedge: false,
        admission: true,
        cache: false,
        prefix_affinity: false,
    },
    Strategy {
        key: "ours-hedge",
        name: "5 ours + hedging",
        split: SplitMode::Cost,
        policy: PolicyKind::LeastLoaded,
        hedge: true,
        admission: true,
        cache: false,
        prefix_affinity: false,
    },
    // What a rerank server behind nginx `least_conn`, or a KV-aware LLM router, does: no
    // split, the whole request to the worker with the least predicted backlog.
    Strategy {
        key: "whole-least",
        name: "6 whole request, least-loaded",
        split: SplitMode::None,
        policy: PolicyKind::LeastLoaded,
        hedge: false,
        admission: false,
        cache: false,
        prefix_affinity: false,
    },
];

/// Strategy 7, run only when named (not in `all`, which compares routing): ours with the
/// pair-score cache, against `ours` for what the cache saves on the same workload.
pub const CACHE_STRATEGY: Strategy = Strategy {
    key: "ours-cache",
    name: "7 ours + pair-score cache",
    split: SplitMode::Cost,
    policy: PolicyKind::LeastLoaded,
    hedge: false,
    admission: true,
    cache: true,
    prefix_affinity: false,
};

/// Strategy 8, run only when named: ours with cache-aware routing (a query's shards prefer
/// workers that answered its prefix lately), against `ours` on the same workload. It measures
/// something only when the workers have prefix caches (`--prefix-cache-blocks`).
pub const AFFINITY_STRATEGY: Strategy = Strategy {
    key: "ours-affinity",
    name: "8 ours + prefix affinity",
    split: SplitMode::Cost,
    policy: PolicyKind::LeastLoaded,
    hedge: false,
    admission: true,
    cache: false,
    prefix_affinity: true,
};

/// Strategy 9, run only when named: ours with the cost split blind to items that begin alike
/// (every item packed alone, `split.mode = "cost_ungrouped"`), against `ours` on a catalogue
/// workload (`group_size`, `header_fraction`) for what keeping groups together saves.
pub const UNGROUPED_STRATEGY: Strategy = Strategy {
    key: "ours-ungrouped",
    name: "9 ours, items not grouped",
    split: SplitMode::CostUngrouped,
    policy: PolicyKind::LeastLoaded,
    hedge: false,
    admission: true,
    cache: false,
    prefix_affinity: false,
};

/// Strategies run only when named, numbered after the six of `all`.
const NAMED_ONLY: [&Strategy; 3] = [&CACHE_STRATEGY, &AFFINITY_STRATEGY, &UNGROUPED_STRATEGY];

/// Parses `all` (strategies 1-6) or a comma-separated list of keys or numbers (1-9).
pub fn parse_strategies(s: &str) -> Result<Vec<Strategy>, String> {
    if s.trim() == "all" {
        return Ok(STRATEGIES.to_vec());
    }
    s.split(',')
        .map(|p| {
            let p = p.trim();
            STRATEGIES
                .iter()
                .chain(NAMED_ONLY)
                .enumerate()
                .find(|(i, st)| st.key == p || (i + 1).to_string() == p)
                .map(|(_, st)| *st)
                .ok_or_else(|| format!("unknown strategy '{p}' (expected all, 1-9 or one of {})", keys()))
        })
        .collect()
}

fn keys() -> String {
    STRATEGIES.iter().chain(NAMED_ONLY).map(|s| s.key).collect::<Vec<_>>().join(", ")
}

/// What every strategy's proxy shares.
#[derive(Debug, Clone)]
pub struct ProxyBase {
    pub workers: Vec<WorkerEndpoint>,
    /// The proxy's prior cost model (what the simulated workers really cost).
    pub cost: CostModel,
    /// Items per shard of the fixed split.
    pub fixed_items: usize,
    /// Budget of requests without a deadline.
    pub default_deadline_ms: u64,
    /// The cost split priced by the cluster's load (`[split] load_aware`).
    pub load_aware: bool,
}

impl Strategy {
    pub fn proxy_config(&self, base: &ProxyBase) -> ProxyConfig {
        let mut c = ProxyConfig::default();
        c.server.port = 0;
        c.server.admin_port = 0;
        c.deadline.default_ms = base.default_deadline_ms;
        c.split.mode = self.split;
        c.split.fixed_items = base.fixed_items.max(1);
        c.balance.policy = self.policy;
        c.hedge.enabled = self.hedge;
        c.admission.enabled = self.admission;
        c.cache.enabled = self.cache;
        c.split.prefix_affinity = self.prefix_affinity;
        c.split.load_aware = base.load_aware;
        c.health.interval_ms = 250;
        c.cost = base.cost;
        c.workers = base.workers.clone();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_configure() {
        assert_eq!(parse_strategies("all").unwrap().len(), 6);
        let six = parse_strategies("6").unwrap()[0];
        assert_eq!(
            (six.key, six.split, six.policy, six.hedge),
            ("whole-least", SplitMode::None, PolicyKind::LeastLoaded, false)
        );
        assert!(!six.admission && STRATEGIES[3].admission, "admission only in ours");
        let s = parse_strategies("1,ours-hedge").unwrap();
        assert_eq!(s[0].key, "whole-random");
        assert!(s[1].hedge);
        assert!(parse_strategies("best").unwrap_err().contains("ours"));
        let cached = parse_strategies("ours,7").unwrap();
        assert_eq!((cached[1].key, cached[1].cache), ("ours-cache", true));
        assert!(STRATEGIES.iter().all(|s| !s.cache), "the routing strategies compare the same work");
        let base = ProxyBase {
            workers: vec![WorkerEndpoint::new("http://127.0.0.1:1", None)],
            cost: CostModel::default(),
            fixed_items: 13,
            default_deadline_ms: 500,
            load_aware: true,
        };
        let c = STRATEGIES[1].proxy_config(&base);
        assert_eq!(
            (c.split.mode, c.split.fixed_items, c.balance.policy, c.hedge.enabled),
            (SplitMode::Fixed, 13, PolicyKind::Random, false)
        );
        assert!(c.split.load_aware, "the switch reaches the proxy config");
        // Every configuration is one the proxy accepts.
        for st in STRATEGIES.iter().chain(NAMED_ONLY) {
            let c = ProxyConfig::from_toml(&st.proxy_config(&base).to_toml()).unwrap();
            assert_eq!((c.cache.enabled, c.split.prefix_affinity), (st.cache, st.prefix_affinity));
        }
        let affinity = parse_strategies("ours,8").unwrap();
        assert_eq!((affinity[1].key, affinity[1].prefix_affinity), ("ours-affinity", true));
        assert!(!affinity[0].prefix_affinity, "ours is the baseline");
        let ungrouped = parse_strategies("ours,9").unwrap();
        assert_eq!((ungrouped[1].key, ungrouped[1].split), ("ours-ungrouped", SplitMode::CostUngrouped));
        assert_eq!(ungrouped[1].proxy_config(&base).split.mode, SplitMode::CostUngrouped);
    }
}
