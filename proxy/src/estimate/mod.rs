//! What the proxy predicts and learns: tokens from text (`token_estimator`), milliseconds from
//! tokens (`cost_estimator`), both fitted online by `online_fit`; and the spread of actual over
//! predicted shard time (`latency_ratio`), which sets when a shard is hedged; and the time a
//! shard's answer needs after its worker's deadline (`answer_margin`).

pub mod answer_margin;
pub mod cost_estimator;
pub mod latency_ratio;
pub mod online_fit;
pub mod token_estimator;
