//! One line of the proxy's sampled request trace (`[request_trace]`): what the proxy writes
//! (`proxy/src/request_trace.rs`) and what the capacity planner reads (`loadtest/src/plan/`),
//! defined once so the two cannot drift. Hashes and counts only, never any text.

use serde::{Deserialize, Serialize};

/// One traced request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Arrival, in milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// XXH3-64 of the query text.
    pub query: u64,
    /// XXH3-64 of the instruction text, when the request had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<u64>,
    /// XXH3-64 of each item text, in input order.
    pub items: Vec<u64>,
    /// Tokens of each item's own segment as the workers counted them (0: unscored); empty when
    /// the request failed.
    #[serde(default)]
    pub item_tokens: Vec<u32>,
    /// Tokens of the prefix the prompts share (template head, instruction, query); 0 when the
    /// request failed.
    #[serde(default)]
    pub prefix_tokens: u32,
    #[serde(default)]
    pub cached_items: u32,
    #[serde(default)]
    pub missing: u32,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// HTTP status of the answer (200 when absent).
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Arrival to answer, ms.
    #[serde(default)]
    pub latency_ms: f64,
}

fn ok_status() -> u16 {
    200
}

impl TraceRecord {
    /// Whether the request was answered (its scores could be cached).
    pub fn answered(&self) -> bool {
        self.status == 200 && self.item_tokens.len() == self.items.len()
    }
}
