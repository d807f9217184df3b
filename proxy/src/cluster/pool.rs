//! The current worker list, swapped atomically (arc-swap) when discovery changes it. A request
//! works on the snapshot it took; a worker removed meanwhile finishes the shards it has (they
//! hold an `Arc` to it), so reloading the list never drops a request. A worker that stays in
//! the list keeps its state (load, breaker, speed) across reloads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use sieve_shared::proxy_config::BreakerConfig;
use sieve_shared::sync::lock;
use sieve_shared::WorkerEndpoint;

use crate::cluster::worker::Worker;

pub type Snapshot = Arc<Vec<Arc<Worker>>>;

pub struct WorkerPool {
    list: ArcSwap<Vec<Arc<Worker>>>,
    /// Serialises writers (discovery sources); readers never wait.
    update: Mutex<()>,
}

#[derive(Debug, Default)]
pub struct PoolChange {
    pub added: Vec<Arc<Worker>>,
    pub removed: Vec<Arc<Worker>>,
}

impl Default for WorkerPool {
    fn default() -> Self {
        WorkerPool { list: ArcSwap::from_pointee(Vec::new()), update: Mutex::new(()) }
    }
}

impl WorkerPool {
    pub fn snapshot(&self) -> Snapshot {
        self.list.load_full()
    }

    pub fn eligible(&self, now: Instant) -> Vec<Arc<Worker>> {
        self.list.load().iter().filter(|w| w.is_eligible(now)).cloned().collect()
    }

    /// Makes the list exactly `endpoints` (deduplicated by API URL, first wins).
    pub fn replace(&self, endpoints: &[WorkerEndpoint], breaker: &BreakerConfig) -> PoolChange {
        let _writer = lock(&self.update);
        let current = self.list.load_full();
        let by_url: HashMap<&str, &Arc<Worker>> = current.iter().map(|w| (w.url(), w)).collect();
        let mut next: Vec<Arc<Worker>> = Vec::with_capacity(endpoints.len());
        let mut change = PoolChange::default();
        for ep in endpoints {
            if next.iter().any(|w| w.url() == ep.url) {
                continue;
            }
            match by_url.get(ep.url.as_str()) {
                Some(w) if w.endpoint == *ep => next.push((*w).clone()),
                _ => match Worker::new(ep.clone(), breaker.clone()) {
                    Ok(w) => {
                        let w = Arc::new(w);
                        change.added.push(w.clone());
                        next.push(w);
                    }
                    Err(e) => tracing::warn!("worker {ep}: {e}; ignored"),
                },
            }
        }
        for w in current.iter() {
            if !next.iter().any(|n| Arc::ptr_eq(n, w)) {
                change.removed.push(w.clone());
            }
        }
        if !change.added.is_empty() || !change.removed.is_empty() {
            self.list.store(Arc::new(next));
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16) -> WorkerEndpoint {
        WorkerEndpoint::new(format!("http://127.0.0.1:{port}"), None)
    }

    #[test]
    fn replace_keeps_surviving_workers_and_their_state() {
        let pool = WorkerPool::default();
        let c = pool.replace(&[ep(1), ep(2)], &BreakerConfig::default());
        assert_eq!((c.added.len(), c.removed.len()), (2, 0));
        let old = pool.snapshot();
        let held = old[1].begin(5.0);
        let c = pool.replace(&[ep(2), ep(3), ep(3)], &BreakerConfig::default());
        assert_eq!((c.added.len(), c.removed.len()), (1, 1));
        assert_eq!(c.removed[0].url(), "http://127.0.0.1:1");
        let now = pool.snapshot();
        assert_eq!(now.len(), 2);
        assert!(Arc::ptr_eq(&now[0], &old[1]), "worker 2 kept its identity");
        assert_eq!(now[0].in_flight(), 1, "and its load");
        assert_eq!(old.len(), 2, "an old snapshot is unchanged");
        drop(held);
        assert_eq!(now[0].in_flight(), 0);
    }
}
