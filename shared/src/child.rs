//! What every Sieve launcher (the `sieve` local cluster, `sieve-loadtest compare`, the
//! end-to-end tests) needs of its child processes: the listening line they announce their ports
//! with, and dying with their parent.

use std::net::SocketAddr;
use std::process::Command;

/// Parses the line every Sieve server prints once its ports are bound:
/// `<name> listening api=HOST:PORT admin=HOST:PORT`.
pub fn parse_listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let mut words = line.split_whitespace();
    words.next()?;
    if words.next()? != "listening" {
        return None;
    }
    let (mut api, mut admin) = (None, None);
    for w in words {
        if let Some(v) = w.strip_prefix("api=") {
            api = v.parse().ok();
        } else if let Some(v) = w.strip_prefix("admin=") {
            admin = v.parse().ok();
        }
    }
    Some((api?, admin?))
}

/// Linux: the child started from `cmd` gets `signal` when the thread that started it dies, however
/// it dies (panic, SIGKILL), so no server outlives its launcher. SIGTERM lets a worker drain;
/// SIGKILL is for children whose work is worthless without the parent.
pub fn die_with_parent(cmd: &mut Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, signal);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines() {
        let (api, admin) = parse_listening("sieve-worker listening api=127.0.0.1:8081 admin=127.0.0.1:9081").unwrap();
        assert_eq!((api.port(), admin.port()), (8081, 9081));
        assert!(parse_listening("sieve-worker loading api=127.0.0.1:1 admin=127.0.0.1:2").is_none());
        assert!(parse_listening("sieve-proxy listening api=127.0.0.1:1").is_none());
        assert!(parse_listening("").is_none());
    }
}
