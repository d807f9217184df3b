//! HTTP: the scoring API port and the admin port, on hyper.

pub mod admin;
pub mod api;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use sieve_shared::Limits;

use crate::engine::{EngineHandle, EngineState};

/// What both ports' handlers read.
pub struct AppState {
    /// Set once the model is loaded.
    pub engine: OnceLock<Arc<EngineHandle>>,
    pub state: Arc<EngineState>,
    pub limits: Limits,
    pub model_name: OnceLock<String>,
    pub device: String,
    pub prometheus: Option<PrometheusHandle>,
}

impl AppState {
    pub fn new(limits: Limits, device: String, prometheus: Option<PrometheusHandle>) -> Self {
        AppState {
            engine: OnceLock::new(),
            state: Arc::new(EngineState::default()),
            limits,
            model_name: OnceLock::new(),
            device,
            prometheus,
        }
    }
}

pub use sieve_shared::http::HttpResponse;
