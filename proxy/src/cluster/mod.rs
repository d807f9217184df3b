//! The workers as the proxy knows them: each one's state and load (`worker`), its circuit
//! breaker (`breaker`), the list swapped on reload (`pool`), where the list comes from
//! (`discovery`), the active health checks (`health`), and the retry and hedge allowances
//! (`budget`).

pub mod breaker;
pub mod budget;
pub mod discovery;
pub mod health;
pub mod pool;
pub mod worker;
