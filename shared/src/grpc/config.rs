//! `[grpc]`: whether a process serves the gRPC API, where, and the HTTP/2 limits of that port.
//! The connection cap, the largest request head and the message read timeout are the `[http]`
//! ones (`max_connections`, `max_header_bytes`, `body_read_timeout_ms`), and so are the
//! connection's timers (`header_read_timeout_ms` for the HTTP/2 preface, `idle_timeout_ms` with
//! no call in progress, `send_timeout_ms` for a socket or a call's answer that does not move:
//! `watchdog.rs`); the largest message is `[limits] max_body_bytes`, as for a JSON body.

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
    /// Calls of one connection served on the connection's own task, as an HTTP/1.1 request is
    /// (no task hop, no cross-thread wake-up per call); a call beyond this many in progress on
    /// the connection gets a task of its own, so one multiplexed connection still spreads over
    /// every thread. 0: every call on its own task (hyper's way).
    pub inline_streams: u32,
    /// A wake-up of a connection's task that comes while the task is being polled (hyper handing
    /// over a call, a call telling h2 its answer is ready) is served as one more round of that
    /// poll, up to this many rounds in all; past them the task yields to the runtime. 1: every
    /// such wake-up is a yield, which tokio serves by waking an idle thread to take the task (a
    /// futex call and a context switch, about one per call).
    pub poll_rounds: u32,
    /// An HTTP/2 PING is sent on a connection silent for this long...
    pub keepalive_interval_ms: u64,
    /// ...and the connection is closed if the answer does not come within this.
    pub keepalive_timeout_ms: u64,
    /// A call's gRPC deadline (`grpc-timeout`) becomes its `deadline_ms` less this, so a partial
    /// answer reaches the client before its deadline ends the call.
    pub deadline_margin_ms: u64,
    /// A connection's socket is read in chunks of up to this many bytes (h2 takes its frames
    /// from that buffer, where on its own it reads about 8 KB a system call: four reads for a
    /// 27 KB request). 0: h2 reads the socket itself. Allocated for a read and dropped once h2
    /// has taken its bytes: an idle connection holds none.
    pub read_buffer_bytes: usize,
    /// What a connection's task writes during one poll (an answer's HEADERS, DATA and trailers)
    /// is held and sent in one write at the end of the poll, up to this many bytes (past it,
    /// what is held is sent first); h2 alone writes a unary answer in two. 0: each write as h2
    /// makes it.
    pub write_buffer_bytes: usize,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            port: None,
            max_concurrent_streams: 256,
            inline_streams: 4,
            poll_rounds: 4,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            deadline_margin_ms: 5,
            read_buffer_bytes: 64 * 1024,
            write_buffer_bytes: 64 * 1024,
        }
    }
}

/// The most rounds one poll of a connection's task may take (each polls the connection and its
/// calls; more would keep one busy connection on its thread).
const MAX_POLL_ROUNDS: u32 = 64;

/// The largest per-connection buffer accepted.
const MAX_BUFFER: usize = 16 << 20;

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
        for (name, v) in
            [("grpc.read_buffer_bytes", self.read_buffer_bytes), ("grpc.write_buffer_bytes", self.write_buffer_bytes)]
        {
            if v > MAX_BUFFER {
                return Err(format!("{name} {v} is over {MAX_BUFFER} (16 MiB)"));
            }
        }
        if !(1..=MAX_POLL_ROUNDS).contains(&self.poll_rounds) {
            return Err(format!("grpc.poll_rounds {} must be 1 to {MAX_POLL_ROUNDS}", self.poll_rounds));
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
        let e = GrpcConfig { read_buffer_bytes: 1 << 30, ..GrpcConfig::default() }.validate().unwrap_err();
        assert!(e.contains("grpc.read_buffer_bytes"), "{e}");
        for rounds in [0, 65] {
            let e = GrpcConfig { poll_rounds: rounds, ..GrpcConfig::default() }.validate().unwrap_err();
            assert!(e.contains("grpc.poll_rounds"), "{e}");
        }
        assert!(GrpcConfig { read_buffer_bytes: 0, write_buffer_bytes: 0, ..GrpcConfig::default() }.validate().is_ok());
        assert!(toml::from_str::<GrpcConfig>("prot = 1").unwrap_err().to_string().contains("prot"));
    }
}
