//! The HTTP/1.1 plumbing every Sieve server uses (worker, proxy, simulated worker; API and
//! admin ports): the accept loop under the `[http]` limits (`sieve_shared::http_config`) with a
//! bounded graceful or an abrupt stop ([`serve`]), JSON/text/error responses, bounded body
//! reading ([`read_body`]), the process's budget for request bytes in memory ([`ByteBudget`]) and
//! the admin token check ([`AdminAuth`]). One copy, so every port answers bad input, slow clients
//! and overload the same way. Each piece says in its own file why it is built as it is.

mod admin;
mod body;
mod body_buf;
mod budget;
mod io;
mod send_timeout;
mod serve;
#[cfg(test)]
mod tests;
mod timer;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use admin::{AdminAuth, TOKEN_ENV};
pub use body::{collect, read_body, read_body_reserved, BodyDeadline};
pub use budget::{ByteBudget, Reservation, SharedReservation};
pub(crate) use send_timeout::SendTimeout;
pub(crate) use serve::{accepted_or_back_off, EVICT_IDLE, SLOT_WAIT};
pub use serve::{serve, serve_with_slots, ConnectionSlots};

pub(crate) use sieve_shared::http_config::HttpConfig;
use sieve_shared::{ApiError, ErrorKind};

pub type HttpResponse = Response<Full<Bytes>>;

/// How [`serve`] ends once its stop future resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Stop accepting, let requests in progress finish (for at most the grace, when given),
    /// close idle keep-alive connections.
    Graceful(Option<Duration>),
    /// Drop every connection at once, as a crashed process would (the simulated worker's kill).
    Kill,
}

/// Binds a listener with `backlog` (`[http] listen_backlog`; tokio's `bind` fixes 128),
/// reporting the address actually bound (for port 0). `reuse_port`: another listener may bind
/// the same address (one per thread, the kernel spreading connections over them).
pub async fn bind(host: &str, port: u16, backlog: u32, reuse_port: bool) -> std::io::Result<(TcpListener, SocketAddr)> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        #[cfg(unix)]
        socket.set_reuseport(reuse_port)?;
        match socket.bind(addr).and_then(|()| socket.listen(backlog)) {
            Ok(l) => {
                let addr = l.local_addr()?;
                return Ok((l, addr));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, format!("no address for {host}"))))
}

/// A header value formatted on the stack (`format_args!("{n}")`): one copy into the value,
/// where `HeaderValue::from(n)` or a `String` allocates a buffer first. A value longer than the
/// stack buffer (never a number) is formatted on the heap; `None` when the text is not a valid
/// header value.
pub fn formatted_header(args: std::fmt::Arguments<'_>) -> Option<HeaderValue> {
    use std::io::Write as _;
    let mut buf = [0u8; 32];
    let mut w = std::io::Cursor::new(&mut buf[..]);
    match w.write_fmt(args) {
        Ok(()) => {
            let n = w.position() as usize;
            HeaderValue::from_bytes(&buf[..n]).ok()
        }
        Err(_) => HeaderValue::from_str(&args.to_string()).ok(),
    }
}

/// `value` as a JSON body.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> HttpResponse {
    // serde_json's own start (`to_vec`).
    json_with_capacity(status, value, 128)
}

/// [`json`] written into a buffer of `capacity` bytes to start with: a caller that knows about
/// how long the body will be has it written without the buffer growing (and copied) on the way.
pub fn json_with_capacity<T: Serialize>(status: StatusCode, value: &T, capacity: usize) -> HttpResponse {
    let mut body = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => body_with_type(status, Bytes::from(body), "application/json"),
        Err(e) => error(&ApiError::internal(format!("encoding the response: {e}"))),
    }
}

pub fn text(status: StatusCode, body: String, content_type: &'static str) -> HttpResponse {
    body_with_type(status, Bytes::from(body), content_type)
}

pub fn body_with_type(status: StatusCode, body: Bytes, content_type: &'static str) -> HttpResponse {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// The error's JSON body with its status; overload and not-ready say when to come back.
pub fn error(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = body_with_type(status, Bytes::from(e.to_json()), "application/json");
    if matches!(e.kind, ErrorKind::Overloaded | ErrorKind::NotReady) {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if e.kind == ErrorKind::Unauthorized {
        r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if e.kind == ErrorKind::RequestTimeout {
        // The rest of the body may still be on its way: this connection cannot carry another
        // request.
        r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Tells servers when and how to stop: one [`Stopper`], any number of [`Stopper::signal`]s
/// (one per `serve`).
#[derive(Debug)]
pub struct Stopper(watch::Sender<Option<StopMode>>);

impl Default for Stopper {
    fn default() -> Self {
        Stopper(watch::channel(None).0)
    }
}

impl Stopper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops every server holding a signal of this stopper (the first call wins).
    pub fn stop(&self, mode: StopMode) {
        self.0.send_if_modified(|m| {
            if m.is_none() {
                *m = Some(mode);
                true
            } else {
                false
            }
        });
    }

    /// The `stop` future for [`serve`]: resolves with the mode given to [`Stopper::stop`], or
    /// `Kill` once the stopper is dropped without stopping.
    pub fn signal(&self) -> impl Future<Output = StopMode> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(m) => m.unwrap_or(StopMode::Kill),
                Err(_) => StopMode::Kill,
            }
        }
    }
}
