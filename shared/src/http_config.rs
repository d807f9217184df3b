//! `[http]`: the transport limits every port (worker, proxy, simulated worker; API and admin)
//! serves under. One struct, so the three processes document and validate them once. And
//! `[admin]`: who may use an admin port (the check: `sieve_server::http::AdminAuth`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Transport timeouts and caps of one process's ports (`[http]` in its config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// The whole request head must arrive within this (counted from the connection's first
    /// byte of it; on a new connection, from the accept). Half-sent heads are closed then.
    pub header_read_timeout_ms: u64,
    /// The whole request body must arrive within this after its head; later, 408.
    pub body_read_timeout_ms: u64,
    /// A keep-alive connection with no request in progress and no bytes for this long is closed.
    pub idle_timeout_ms: u64,
    /// An answer being written whose bytes make no progress for this long (the client reads
    /// nothing) ends its connection, so a client that stops reading cannot hold a connection or
    /// a stream forever. Counted between two writes that progress, as nginx's `send_timeout`,
    /// not over the whole answer: a slow but reading client is served. On the gRPC port a call
    /// whose answer the client's HTTP/2 flow-control window does not take within it closes its
    /// connection (`server/src/grpc/conn.rs`).
    pub send_timeout_ms: u64,
    /// Open connections per port beyond this are answered 503 (JSON) and closed without being
    /// served.
    pub max_connections: usize,
    /// Connections the kernel queues for each port until they are accepted (`listen`'s
    /// backlog, capped by the system's `net.core.somaxconn`). Sized for a burst of new
    /// connections: at 128 (the standard library's), a flood of 4,300 took 17-21 s to open.
    pub listen_backlog: u32,
    /// Largest request head (request line + headers) in bytes; larger gets 431. Also hyper's
    /// read buffer size, so it bounds what a connection holds while its head arrives.
    pub max_header_bytes: usize,
    /// Request bytes the whole process may hold in memory at once: HTTP bodies and gRPC
    /// messages, counted as they arrive and until their request is answered, shared by every
    /// API port of the process (HTTP and gRPC). A request whose next bytes do not fit is
    /// answered at once (HTTP 503 with `Retry-After`, gRPC RESOURCE_EXHAUSTED with retry info).
    /// Without it a process could be made to hold `max_connections` × `max_body_bytes`. Must be
    /// at least 8/7 of `[limits] max_body_bytes`: requests over 64 KiB share all but the last
    /// eighth, kept for small requests so that large bodies left unfinished cannot refuse
    /// ordinary traffic. Fixed at start (a reload does not change it).
    pub max_buffered_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 10_000,
            max_connections: 4096,
            listen_backlog: 1024,
            max_header_bytes: 65_536,
            max_buffered_bytes: 1 << 30,
        }
    }
}

impl HttpConfig {
    /// hyper refuses a read buffer smaller than this.
    pub const MIN_HEADER_BYTES: usize = 8192;
    /// The most open connections a port may be configured for: past any descriptor limit, and
    /// far below what the connection semaphore can count.
    pub const MAX_CONNECTIONS: usize = 1 << 20;

    /// Checks what the types cannot say; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("http.header_read_timeout_ms", self.header_read_timeout_ms),
            ("http.body_read_timeout_ms", self.body_read_timeout_ms),
            ("http.idle_timeout_ms", self.idle_timeout_ms),
            ("http.send_timeout_ms", self.send_timeout_ms),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.max_connections == 0 || self.max_connections > Self::MAX_CONNECTIONS {
            return Err(format!(
                "http.max_connections {} must be in 1..={} (each needs a file descriptor)",
                self.max_connections,
                Self::MAX_CONNECTIONS
            ));
        }
        if self.listen_backlog == 0 {
            return Err("http.listen_backlog must be positive".into());
        }
        if self.max_header_bytes < Self::MIN_HEADER_BYTES {
            return Err(format!(
                "http.max_header_bytes {} must be at least {}",
                self.max_header_bytes,
                Self::MIN_HEADER_BYTES
            ));
        }
        if self.max_buffered_bytes == 0 {
            return Err("http.max_buffered_bytes must be positive".into());
        }
        Ok(())
    }

    /// Checks the budget against the largest body: a body the budget could never hold would
    /// be refused with "retry later" for ever. Large bodies share all but the last eighth of
    /// the budget (kept for small requests: `ByteBudget`).
    pub fn validate_with_body_limit(&self, max_body_bytes: usize) -> Result<(), String> {
        self.validate()?;
        if large_limit_of(self.max_buffered_bytes) < max_body_bytes {
            return Err(format!(
                "http.max_buffered_bytes {} must be at least 8/7 of limits.max_body_bytes {max_body_bytes} \
                 (its last eighth is kept for small requests)",
                self.max_buffered_bytes
            ));
        }
        Ok(())
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }
}

/// What requests larger than the server's `SMALL_REQUEST_BYTES` may hold together
/// (`sieve_server::http::ByteBudget`): all but the last eighth of a budget of `limit` bytes, kept
/// for small ones. The largest body must fit in it.
pub fn large_limit_of(limit: usize) -> usize {
    limit - limit / 8
}

/// `[admin]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// File holding the bearer token (surrounding whitespace ignored); "" = read the
    /// `SIEVE_ADMIN_TOKEN` environment variable. Neither set: state-changing routes answer 403.
    pub token_file: String,
    /// Every admin route needs the token, not only the state-changing ones. Needs a token. (The
    /// proxy's health checks read workers' /ready and /stats without one.)
    pub protect_reads: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeros_are_refused() {
        HttpConfig::default().validate().unwrap();
        let c: HttpConfig = toml::from_str("idle_timeout_ms = 0").unwrap();
        assert!(c.validate().unwrap_err().contains("http.idle_timeout_ms"));
        let c: HttpConfig = toml::from_str("send_timeout_ms = 0").unwrap();
        assert!(c.validate().unwrap_err().contains("http.send_timeout_ms"));
        let c: HttpConfig = toml::from_str("max_connections = 0").unwrap();
        assert!(c.validate().unwrap_err().contains("max_connections"));
        let c: HttpConfig = toml::from_str("listen_backlog = 0").unwrap();
        assert!(c.validate().unwrap_err().contains("listen_backlog"));
        let c: HttpConfig = toml::from_str("max_header_bytes = 100").unwrap();
        assert!(c.validate().is_err());
        assert!(toml::from_str::<HttpConfig>("idle_timeout = 3").is_err(), "unknown keys are errors");
        let c: HttpConfig = toml::from_str("max_buffered_bytes = 0").unwrap();
        assert!(c.validate().unwrap_err().contains("http.max_buffered_bytes"));
        let c: HttpConfig = toml::from_str("max_buffered_bytes = 8000").unwrap();
        let e = c.validate_with_body_limit(7001).unwrap_err();
        assert!(e.contains("max_buffered_bytes") && e.contains("max_body_bytes"), "{e}");
        c.validate_with_body_limit(7000).unwrap();
    }
}
