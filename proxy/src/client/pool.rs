//! Idle keep-alive connections to workers, by worker (the URI's authority), most recently used
//! first. A connection comes back here only after a complete keep-alive response; one idle past
//! `pool_idle_timeout_ms` is closed rather than used (the workers close theirs later, so no
//! request goes out on a connection a worker is closing), and at most `max_idle_per_worker`
//! wait per worker. A sweeper task on the runtime that first used the pool closes expired ones
//! even when no call comes to take them.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use fnv::FnvHashMap;
use hyper::http::uri::Authority;

use super::conn::Conn;

pub struct Pool {
    /// FNV, not the default SipHash: `Authority` hashes a byte at a time (case-folded), each a
    /// hasher call, which SipHash made ~900 instructions per take or put (twice per worker
    /// call). The keys are the configured or discovered workers, not anything a client sends.
    idle: Mutex<FnvHashMap<Authority, Vec<Conn>>>,
    timeout: Duration,
    max_idle: usize,
    sweeper: std::sync::Once,
}

impl Pool {
    pub fn new(timeout: Duration, max_idle: usize) -> Arc<Pool> {
        Arc::new(Pool { idle: Mutex::new(FnvHashMap::default()), timeout, max_idle, sweeper: std::sync::Once::new() })
    }

    /// The most recently freed usable connection to `key`, if any; the stale and closed ones
    /// met on the way are closed.
    pub fn take(self: &Arc<Self>, key: &Authority) -> Option<Conn> {
        self.start_sweeper();
        let now = Instant::now();
        loop {
            let mut conn = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                let list = idle.get_mut(key)?;
                let conn = list.pop()?;
                if now.saturating_duration_since(conn.idle_since) >= self.timeout {
                    // The rest are older still.
                    let stale = std::mem::take(list);
                    drop(idle);
                    drop((conn, stale));
                    return None;
                }
                conn
            };
            if conn.is_usable() {
                return Some(conn);
            }
        }
    }

    /// Keeps a connection that finished a keep-alive call, unless `max_idle_per_worker` wait
    /// already (then the oldest is closed).
    pub fn put(&self, key: &Authority, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = match idle.get_mut(key) {
            Some(list) => list,
            None => idle.entry(key.clone()).or_default(),
        };
        list.push(conn);
        let evicted = (list.len() > self.max_idle).then(|| list.remove(0));
        drop(idle);
        drop(evicted);
    }

    /// Closes every connection idle past the timeout.
    fn sweep(&self) {
        let now = Instant::now();
        let mut stale = Vec::new();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, list| {
            let fresh = list.iter().position(|c| now.saturating_duration_since(c.idle_since) < self.timeout);
            stale.extend(list.drain(..fresh.unwrap_or(list.len())));
            !list.is_empty()
        });
        drop(idle);
        drop(stale);
    }

    /// The sweeper, started once from a runtime; it ends with the pool (or the runtime).
    fn start_sweeper(self: &Arc<Self>) {
        self.sweeper.call_once(|| {
            let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
            let pool: Weak<Pool> = Arc::downgrade(self);
            let every = (self.timeout / 2).max(Duration::from_millis(100));
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match pool.upgrade() {
                        Some(pool) => pool.sweep(),
                        None => return,
                    }
                }
            });
        });
    }
}
