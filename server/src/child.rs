//! What every Sieve launcher (the `sieve` local cluster, `sieve-loadtest compare`, the
//! end-to-end tests and every crate's process tests) needs of its child processes: starting one
//! and waiting for the listening line it announces its ports with, dying with their parent,
//! signalling one and waiting a bounded time for it to exit. One copy, so every launcher reads
//! the line, drains the pipe and bounds its waits the same way.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// A child that printed its listening line. Not killed on drop: each launcher decides how its
/// children end (the local cluster drains them, tests kill them); see [`KillOnDrop`].
#[derive(Debug)]
pub struct Listening {
    pub child: Child,
    pub api: SocketAddr,
    pub admin: SocketAddr,
    /// The listening line itself, without its newline.
    pub line: String,
}

/// Why a child did not get to its listening line.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("could not start: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("exited before it was listening ({0})")]
    EarlyExit(String),
    #[error("printed no listening line within {0:?}")]
    NoListeningLine(Duration),
}

/// Starts `cmd` (stdin closed, stderr shared with ours, `RUST_LOG=warn` unless set, so a child
/// speaks only of problems) and waits at most `timeout` for its listening line. The child gets
/// `death_signal` if this thread dies (see [`die_with_parent`]). Its stdout is read to the end
/// on a thread of its own, so it never blocks on a full pipe. A child that does not get there
/// is killed and reaped.
pub fn spawn_listening(cmd: &mut Command, death_signal: i32, timeout: Duration) -> Result<Listening, SpawnError> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    die_with_parent(cmd, death_signal);
    let mut child = cmd.spawn()?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(SpawnError::EarlyExit("no stdout".into()));
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let end = Instant::now() + timeout;
    loop {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))) {
            Ok(line) => {
                if let Some((api, admin)) = parse_listening(&line) {
                    return Ok(Listening { child, api, admin, line });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                return Err(SpawnError::EarlyExit(status));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() >= end {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SpawnError::NoListeningLine(timeout));
                }
            }
        }
    }
}

/// Sends `signal` to our own child (a no-op once it has been reaped). Not on Windows.
pub fn signal(child: &Child, signal: i32) {
    #[cfg(unix)]
    // SAFETY: kill(2) on the pid of a child we have not reaped (std reaps only in wait/try_wait).
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
    #[cfg(not(unix))]
    let _ = (child, signal);
}

/// Waits at most `timeout` for `child` to exit, polling: `None` if it is still running.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child killed and reaped when dropped, so a failing test leaves no server behind.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

    #[cfg(unix)]
    #[test]
    fn a_child_that_exits_silently_is_an_early_exit_and_one_that_stalls_times_out() {
        let err = spawn_listening(Command::new("true").arg("x"), libc::SIGKILL, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(err, SpawnError::EarlyExit(_)), "{err}");
        let t0 = Instant::now();
        let err =
            spawn_listening(Command::new("sleep").arg("30"), libc::SIGKILL, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, SpawnError::NoListeningLine(_)), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(10), "the stalled child was not given up on");
    }

    #[cfg(unix)]
    #[test]
    fn the_listening_line_is_found_after_other_output_and_the_child_can_be_signalled() {
        let script = "echo loading; echo 'x listening api=127.0.0.1:5 admin=127.0.0.1:6'; exec sleep 30";
        let mut l =
            spawn_listening(Command::new("sh").args(["-c", script]), libc::SIGKILL, Duration::from_secs(10)).unwrap();
        assert_eq!((l.api.port(), l.admin.port()), (5, 6));
        assert_eq!(l.line, "x listening api=127.0.0.1:5 admin=127.0.0.1:6");
        assert!(wait_exit(&mut l.child, Duration::from_millis(50)).is_none(), "still sleeping");
        signal(&l.child, libc::SIGTERM);
        let status = wait_exit(&mut l.child, Duration::from_secs(10)).expect("exits on SIGTERM");
        assert!(!status.success());
    }
}
