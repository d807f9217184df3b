//! The API port served by threads that each run a single-threaded runtime (`[server]
//! api_threads`), the layout nginx's worker processes have: each thread accepts on a listener of
//! its own bound to the same port (`SO_REUSEPORT`: the kernel spreads new connections over the
//! listeners), and its requests' worker calls go through a connection pool of its own
//! (`client::use_own_pool_on_this_thread`). A request, its shards' calls and their answers are
//! then polled on one thread, with no wake-up of another thread and no task stolen across
//! cores; on the shared multi-thread runtime every socket event can wake a parked thread.
//! Everything else (state, admission, caches, metrics) is shared through `Arc` as before.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use sieve_shared::http::{self, ConnectionSlots, HttpConfig, StopMode};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;

use crate::state::AppState;

/// Connections waiting to be accepted, per listener (what `TcpListener::bind` uses).
const BACKLOG: u32 = 1024;

/// `n` listeners on one address, the first bound to `host:port` (0: a free port) and the rest
/// to the address it got. Each is handed to a thread of its own by [`spawn`].
pub async fn bind(host: &str, port: u16, n: usize) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match bind_one(addr) {
            Ok(first) => {
                let addr = first.local_addr()?;
                let mut all = vec![first];
                for _ in 1..n {
                    all.push(bind_one(addr)?);
                }
                return Ok((all, addr));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrNotAvailable, format!("no address for {host}"))))
}

fn bind_one(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    // Handed to another runtime: taken out of this one's reactor (`into_std`) until then.
    socket.listen(BACKLOG)?.into_std()
}

/// Serves the API on each listener from a thread of its own (a current-thread runtime) until
/// `stop` says so; the port's connection cap is shared by the threads. The returned futures
/// end when their thread's server has ended.
pub fn spawn<S>(
    listeners: Vec<std::net::TcpListener>,
    config: HttpConfig,
    state: Arc<AppState>,
    stop: impl Fn() -> S,
) -> io::Result<Vec<impl Future<Output = ()> + Send + 'static>>
where
    S: Future<Output = StopMode> + Send + 'static,
{
    let slots = ConnectionSlots::new(&config);
    let mut ended = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (config, slots, state, stop) = (config.clone(), slots.clone(), state.clone(), stop());
        let (done, done_rx) = oneshot::channel::<()>();
        std::thread::Builder::new().name(format!("sieve-api-{i}")).spawn(move || {
            crate::client::use_own_pool_on_this_thread();
            rt.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("API thread {i}: {e}");
                        return;
                    }
                };
                let handler = move |r| crate::http_api::handle(state.clone(), r);
                http::serve_with_slots(listener, config, slots, handler, stop).await;
            });
            // The runtime (and what it still holds: attempts past the stop) ends before `done`.
            drop(rt);
            drop(done);
        })?;
        ended.push(async move {
            let _ = done_rx.await;
        });
    }
    Ok(ended)
}
