//! `GET /stats` on a worker's admin port: the load and capacity figures the proxy balances on.
//! Readers ignore fields they do not know, so workers can add sections freely.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerStats {
    pub model: String,
    /// The worker's template identity: a digest of its prompt template and score head (empty
    /// from a worker that has not loaded its model, or predates it). Two workers of one model
    /// with different templates score differently; the proxy's pair cache keys on both.
    #[serde(default)]
    pub template: String,
    /// `cpu`, `cuda:0`, `sim`, ...
    pub device: String,
    pub ready: bool,
    /// Finishing in-flight work, accepting none.
    pub draining: bool,
    pub in_flight_requests: u64,
    /// Pairs accepted but not yet scored.
    pub queued_pairs: u64,
    /// Tokens of those pairs (prefix counted once per request).
    pub queued_tokens: u64,
    /// Largest number of tokens one forward pass takes; the proxy keeps shards within it.
    pub max_batch_tokens: u64,
    /// Longest prompt (query + item + template) the model accepts, in tokens.
    pub max_seq_tokens: u64,
    pub kv_blocks_total: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_free: u64,
    /// Tokens run through the model since start.
    pub tokens_processed: u64,
    pub pairs_processed: u64,
    pub requests_processed: u64,
    /// Recent forward throughput (computed tokens per second of forward time), 0 until measured.
    pub tokens_per_second: f64,
    /// Free-form sections (prefix cache, MoE selector, ...) keyed by name.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}
