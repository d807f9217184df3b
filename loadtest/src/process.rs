//! Child processes that announce themselves with a listening line
//! (`<name> listening api=HOST:PORT admin=HOST:PORT`): proxies, workers and sim-workers started
//! by `compare` and by the end-to-end tests. A child dies with its parent (Linux) and is
//! killed when its handle drops, so no process outlives the run that started it.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sieve_shared::child::die_with_parent;
pub use sieve_shared::child::parse_listening;

/// A child process that printed its listening line. Killed when dropped.
pub struct Proc {
    child: Child,
    pub api: SocketAddr,
    pub admin: SocketAddr,
    pub line: String,
}

/// Finds a Sieve binary built alongside the running program: in the same directory (a binary
/// started by a binary) or one up (a test or bench under `target/<profile>/deps/`).
pub fn locate_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let mut dir = exe.parent();
    for _ in 0..2 {
        let d = dir?;
        let p = d.join(&file);
        if p.is_file() {
            return Some(p);
        }
        dir = d.parent();
    }
    None
}

impl Proc {
    /// Starts `program args...` and waits (at most `timeout`) for its listening line.
    /// Its stderr goes to ours; `RUST_LOG` defaults to `warn` so it speaks only of problems.
    pub fn start<S: AsRef<OsStr>>(program: &Path, args: &[S], timeout: Duration) -> Result<Proc, String> {
        let name =
            program.file_name().map_or_else(|| program.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        // SIGKILL: a load-test child is worthless without the run that started it.
        die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd.spawn().map_err(|e| format!("starting {}: {e}", program.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{name}: no stdout"));
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep reading so the child never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some((api, admin)) = parse_listening(&line) {
                        return Ok(Proc { child, api, admin, line });
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    return Err(format!("{name} printed no listening line within {timeout:?} (exit: {status:?})"));
                }
            }
        }
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.api)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// `--worker` value for a proxy.
    pub fn worker_arg(&self) -> String {
        format!("{},admin={}", self.api_url(), self.admin_url())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
