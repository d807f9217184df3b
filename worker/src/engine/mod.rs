//! The serving engine: KV blocks, batch planning, the scheduler and the runner thread.

pub mod layout;
