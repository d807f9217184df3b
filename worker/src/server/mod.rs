//! HTTP: the scoring API port and the admin port, on hyper.

pub mod admin;
pub mod api;
pub mod start;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use sieve_server::http::{AdminAuth, ByteBudget};
use sieve_shared::http_config::HttpConfig;
use sieve_shared::Limits;
use tokio::sync::Notify;

use crate::engine::{EngineHandle, EngineState};

/// What both ports' handlers read.
pub struct AppState {
    /// Set once the model is loaded.
    pub engine: OnceLock<Arc<EngineHandle>>,
    pub state: Arc<EngineState>,
    pub limits: Limits,
    /// `[api]`: model aliases and CORS.
    pub api: sieve_shared::ApiConfig,
    pub model_name: OnceLock<String>,
    /// Set with the model: a digest of its prompt template and score head.
    pub template_id: OnceLock<String>,
    pub device: String,
    pub prometheus: Option<PrometheusHandle>,
    /// Who may use the admin routes (no token by default: `POST /drain` answers 403).
    pub admin: AdminAuth,
    /// `POST /drain` on the admin port: the process drains and exits as on SIGTERM.
    pub drain_requested: Notify,
    /// Request bytes held in memory, the API and gRPC ports together (`[http]
    /// max_buffered_bytes`; the default's until [`AppState::with_buffer_budget`]).
    pub buffer_budget: ByteBudget,
}

impl AppState {
    pub fn new(limits: Limits, device: String, prometheus: Option<PrometheusHandle>) -> Self {
        AppState {
            engine: OnceLock::new(),
            state: Arc::new(EngineState::default()),
            limits,
            api: sieve_shared::ApiConfig::default(),
            model_name: OnceLock::new(),
            template_id: OnceLock::new(),
            device,
            prometheus,
            admin: AdminAuth::default(),
            drain_requested: Notify::new(),
            buffer_budget: ByteBudget::new(HttpConfig::default().max_buffered_bytes),
        }
    }

    /// The budget of `[http] max_buffered_bytes` bytes.
    pub fn with_buffer_budget(mut self, max_buffered_bytes: usize) -> Self {
        self.buffer_budget = ByteBudget::new(max_buffered_bytes);
        self
    }

    /// `[api]`.
    pub fn with_api(mut self, api: sieve_shared::ApiConfig) -> Self {
        self.api = api;
        self
    }

    pub fn with_admin(mut self, admin: AdminAuth) -> Self {
        self.admin = admin;
        self
    }
}

pub use sieve_server::http::HttpResponse;
