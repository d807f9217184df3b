//! `[grpc]`: whether a process serves the gRPC API, where, and the HTTP/2 limits of that port.
//! The connection cap, the largest request head and the message read timeout are the `[http]`
//! ones (`max_connections`, `max_header_bytes`, `body_read_timeout_ms`), and so are the
//! connection's timers (`header_read_timeout_ms` for the HTTP/2 preface, `idle_timeout_ms` with
//! no call in progress, `send_timeout_ms` for a socket or a call's answer that does not move:
//! `conn.rs`); the largest message is `[limits] max_body_bytes`, as for a JSON body.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The gRPC port of one process (`[grpc]` in its config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// Port of the gRPC API, on the API port's host. Absent (the default): no gRPC port. 0: any
    /// free port (tests).
    pub port: Option<u16>,
    /// Calls in progress at once on one connection (HTTP/2 streams); the client waits for a
    /// free one beyond this.
    pub max_concurrent_streams: u32,
    /// An HTTP/2 PING is sent on a connection silent for this long...
    pub keepalive_interval_ms: u64,
    /// ...and the connection is closed if the answer does not come within this.
    pub keepalive_timeout_ms: u64,
    /// A call's gRPC deadline (`grpc-timeout`) becomes its `deadline_ms` less this, so a partial
    /// answer reaches the client before its deadline ends the call.
    pub deadline_margin_ms: u64,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            port: None,
            max_concurrent_streams: 256,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            deadline_margin_ms: 5,
        }
    }
}

impl GrpcConfig {
    /// Checks what the types cannot say; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_concurrent_streams == 0 {
            return Err("grpc.max_concurrent_streams must be positive".into());
        }
        for (name, v) in [
            ("grpc.keepalive_interval_ms", self.keepalive_interval_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.deadline_margin_ms > 60_000 {
            return Err(format!("grpc.deadline_margin_ms {} is over a minute", self.deadline_margin_ms));
        }
        Ok(())
    }

    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_millis(self.keepalive_interval_ms)
    }

    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }

    pub fn deadline_margin(&self) -> Duration {
        Duration::from_millis(self.deadline_margin_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_each_bad_value_is_named() {
        let c: GrpcConfig = toml::from_str("").unwrap();
        assert_eq!(c, GrpcConfig::default());
        assert_eq!(c.port, None);
        assert!(c.validate().is_ok());
        let c: GrpcConfig = toml::from_str("port = 50051").unwrap();
        assert_eq!(c.port, Some(50051));
        let e = GrpcConfig { max_concurrent_streams: 0, ..GrpcConfig::default() }.validate().unwrap_err();
        assert!(e.contains("grpc.max_concurrent_streams"), "{e}");
        let e = GrpcConfig { keepalive_timeout_ms: 0, ..GrpcConfig::default() }.validate().unwrap_err();
        assert!(e.contains("grpc.keepalive_timeout_ms"), "{e}");
        assert!(toml::from_str::<GrpcConfig>("prot = 1").unwrap_err().to_string().contains("prot"));
    }
}
