//! Child processes that announce themselves with a listening line
//! (`<name> listening api=HOST:PORT admin=HOST:PORT`): proxies, workers and sim-workers started
//! by `compare` and by the end-to-end tests. A child dies with its parent (Linux) and is
//! killed when its handle drops, so no process outlives the run that started it.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

pub use sieve_server::child::parse_listening;
use sieve_server::child::{self, spawn_listening, Listening, SpawnError};

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
        // SIGKILL: a load-test child is worthless without the run that started it.
        let Listening { child, api, admin, line } =
            spawn_listening(Command::new(program).args(args), libc::SIGKILL, timeout).map_err(|e| match e {
                SpawnError::Spawn(e) => format!("starting {}: {e}", program.display()),
                e => format!("{name}: {e}"),
            })?;
        Ok(Proc { child, api, admin, line })
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
        child::signal(&self.child, sig);
    }

    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        child::wait_exit(&mut self.child, timeout)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
