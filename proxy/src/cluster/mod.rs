//! The workers as the proxy knows them: each one's state and load (`worker`), its circuit
//! breaker (`breaker`), the list swapped on reload (`pool`), where the list comes from
//! (`discovery`), the active health checks (`health`), and the retry and hedge allowances
//! (`budget`).

use std::sync::Arc;

use sieve_shared::ProxyConfig;
use tokio::sync::Notify;

use crate::client::HttpClient;

pub mod breaker;
pub mod budget;
pub mod discovery;
pub mod health;
pub mod pool;
pub mod worker;

/// What the health checks and discovery need of the proxy: its config, the pool, the client,
/// and where to say what they found. A narrow handle, so that `cluster` does not depend on the
/// proxy's whole state (which depends on `cluster`).
pub trait ClusterHost: Send + Sync + 'static {
    fn config(&self) -> Arc<ProxyConfig>;
    /// Applies a reloaded config (the tuning that can change while running).
    fn set_config(&self, config: ProxyConfig);
    fn pool(&self) -> &pool::WorkerPool;
    fn client(&self) -> &HttpClient;
    /// Woken when workers are added, so they are checked at once.
    fn health_wake(&self) -> &Notify;
    /// A worker reported the model and template it serves (the pair-score cache keys on them).
    fn observe_model(&self, model: &str, template: &str);
}
