//! Abusive clients of a gRPC port (HTTP/2), each reporting whether (and when) the server ended
//! what it held: a connection that never sends the HTTP/2 preface or sends half of it, one that
//! opens no call and answers every PING, one whose call's answer cannot be delivered (its
//! flow-control window shut), and one that sends a call and never reads its socket. The port's
//! `[http]` header, idle and send timeouts must end each (`server/src/grpc/conn.rs`).
//!
//! Everything is bounded: the client gives up after `give_up`, so a server without timers makes
//! the report say "not ended", never hang.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use sieve_server::grpc::pb;
use sieve_shared::http_config::HttpConfig;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// What an abusive gRPC connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GrpcAttack {
    /// Connects and sends nothing (no preface).
    Silent,
    /// Half of the HTTP/2 preface, then nothing.
    HalfPreface,
    /// Preface and SETTINGS, no call; every PING answered (and one sent every 100 ms).
    IdlePings,
    /// A `Score` call with an initial window of 0, never opened: its answer cannot be sent.
    ShutWindow,
    /// Preface, SETTINGS and a `Score` call written at once, then the socket never read. Its
    /// small answer fits the socket's buffers, so the call ends and the connection idles; it
    /// answers no PING either, so the port's keep-alive timeout may end it first.
    NoRead,
}

impl GrpcAttack {
    pub const ALL: [GrpcAttack; 5] = [
        GrpcAttack::Silent,
        GrpcAttack::HalfPreface,
        GrpcAttack::IdlePings,
        GrpcAttack::ShutWindow,
        GrpcAttack::NoRead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GrpcAttack::Silent => "grpc-silent",
            GrpcAttack::HalfPreface => "grpc-half-preface",
            GrpcAttack::IdlePings => "grpc-idle-pings",
            GrpcAttack::ShutWindow => "grpc-shut-window",
            GrpcAttack::NoRead => "grpc-no-read",
        }
    }

    /// The server timer that must end what this attack holds, as `GrpcOutcome::after` counts
    /// it: from the connect (no preface), from the handshake (idle), from the answer's head
    /// (its stream reset), or from the call sent (its answer fits the socket's buffers, so the
    /// connection then idles: ended by the idle timer at the latest).
    pub fn deadline(self, http: &HttpConfig) -> Duration {
        match self {
            GrpcAttack::Silent | GrpcAttack::HalfPreface => http.header_read_timeout(),
            GrpcAttack::IdlePings | GrpcAttack::NoRead => http.idle_timeout(),
            GrpcAttack::ShutWindow => http.send_timeout(),
        }
    }

    /// The earliest the server may end it (an end before its timer is a bug too). A connection
    /// never read is only looked at once its deadline has passed: no earliest.
    pub fn earliest(self, http: &HttpConfig) -> Duration {
        match self {
            GrpcAttack::NoRead => Duration::ZERO,
            _ => self.deadline(http),
        }
    }
}

/// How one abusive gRPC connection ended.
#[derive(Debug, Clone)]
pub struct GrpcOutcome {
    pub attack: GrpcAttack,
    /// The server ended what it held: closed the connection (GOAWAY or not) or, for
    /// `ShutWindow`, reset the stream; false when the client gave up first.
    pub ended_by_server: bool,
    /// From the moment the attack's timer starts (see [`GrpcAttack::deadline`]) to the end or
    /// the give-up; for `NoRead`, to the moment the client looked (the end came before it).
    pub after: Duration,
    /// What went wrong on the client's side, if anything (a connect or handshake that failed).
    pub error: Option<String>,
}

/// The HTTP/2 client preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SCORE_PATH: &str = "/sieve.v1.Sieve/Score";

/// Runs `attack` against the gRPC port at `addr` of a server configured with `http`; the
/// client gives up `bound` after the attack's deadline.
pub async fn run(attack: GrpcAttack, addr: SocketAddr, http: &HttpConfig, bound: Duration) -> GrpcOutcome {
    let give_up = attack.deadline(http) + bound;
    let result = match attack {
        GrpcAttack::Silent => silent(addr, &[], give_up).await,
        GrpcAttack::HalfPreface => silent(addr, &PREFACE[..12], give_up).await,
        GrpcAttack::IdlePings => idle_pings(addr, give_up).await,
        GrpcAttack::ShutWindow => shut_window(addr, give_up).await,
        GrpcAttack::NoRead => no_read(addr, give_up).await,
    };
    match result {
        Ok((ended_by_server, after)) => GrpcOutcome { attack, ended_by_server, after, error: None },
        Err(e) => GrpcOutcome { attack, ended_by_server: false, after: Duration::ZERO, error: Some(e) },
    }
}

/// A `Score` call's message, framed as gRPC frames it (uncompressed, length-prefixed).
pub fn score_message() -> Bytes {
    let req = pb::ScoreRequest {
        query: "waterproof trail running shoes".into(),
        items: vec![pb::Item { text: "a light shoe for wet trails".into(), id: None }],
        ..Default::default()
    };
    let msg = req.encode_to_vec();
    let mut framed = Vec::with_capacity(msg.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&msg);
    framed.into()
}

fn score_request() -> hyper::Request<()> {
    hyper::Request::post(format!("http://grpc{SCORE_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request head")
}

/// Sends `sent`, then reads (and drops) whatever comes until the server closes.
async fn silent(addr: SocketAddr, sent: &[u8], give_up: Duration) -> Result<(bool, Duration), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let begun = Instant::now();
    s.write_all(sent).await.map_err(|e| format!("write: {e}"))?;
    let closed = tokio::time::timeout(give_up, async {
        let mut sink = [0u8; 4096];
        // The server's SETTINGS, then its close (an end of stream, or a reset).
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await
    .is_ok();
    Ok((closed, begun.elapsed()))
}

/// An h2 client connection, driven by a task that ends (with the moment) when the server
/// closes it; h2 answers the server's PINGs and SETTINGS on its own.
async fn handshake(
    addr: SocketAddr,
    window: u32,
) -> Result<(h2::client::SendRequest<Bytes>, h2::PingPong, tokio::task::JoinHandle<Instant>), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let ping = conn.ping_pong().ok_or("no ping handle")?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    Ok((send, ping, driver))
}

/// No call; PINGs sent and answered until the server closes the connection.
async fn idle_pings(addr: SocketAddr, give_up: Duration) -> Result<(bool, Duration), String> {
    let (_send, mut ping, mut driver) = handshake(addr, 65_535).await?;
    let begun = Instant::now();
    let pings = async {
        while ping.ping(h2::Ping::opaque()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let ended = tokio::time::timeout(give_up, async {
        tokio::select! {
            end = &mut driver => end.ok(),
            () = pings => None,
        }
    })
    .await;
    driver.abort();
    match ended {
        Ok(Some(at)) => Ok((true, at.duration_since(begun))),
        _ => Ok((false, begun.elapsed())),
    }
}

/// A call whose answer's window is never opened: the server must reset its stream.
async fn shut_window(addr: SocketAddr, give_up: Duration) -> Result<(bool, Duration), String> {
    let (send, _ping, driver) = handshake(addr, 0).await?;
    let mut send = send.ready().await.map_err(|e| format!("ready: {e}"))?;
    let (answer, mut body) = send.send_request(score_request(), false).map_err(|e| format!("request: {e}"))?;
    body.send_data(score_message(), true).map_err(|e| format!("message: {e}"))?;
    let head = tokio::time::timeout(give_up, answer).await.map_err(|_| "no answer head".to_string())?;
    let head = head.map_err(|e| format!("answer: {e}"))?;
    let begun = Instant::now();
    let mut answer = head.into_body();
    let got = tokio::time::timeout(give_up, answer.data()).await;
    let after = begun.elapsed();
    driver.abort();
    match got {
        // Reset by the server (h2 CANCEL), or its connection closed with it.
        Ok(Some(Err(_)) | None) => Ok((true, after)),
        Ok(Some(Ok(data))) => Err(format!("{} answer bytes came through a window of 0", data.len())),
        Err(_) => Ok((false, after)),
    }
}

/// Preface, SETTINGS and a whole call written, the socket left unread until `give_up`, then
/// read to its end: an end reached at once shows the server closed it before the look.
async fn no_read(addr: SocketAddr, give_up: Duration) -> Result<(bool, Duration), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let mut out = PREFACE.to_vec();
    frame(&mut out, 0x4, 0, 0, &[]); // SETTINGS, none changed
    frame(&mut out, 0x1, 0x4, 1, &score_head(&addr.to_string())); // HEADERS, END_HEADERS
    frame(&mut out, 0x0, 0x1, 1, &score_message()); // DATA, END_STREAM
    s.write_all(&out).await.map_err(|e| format!("write: {e}"))?;
    let begun = Instant::now();
    // Looked at a little before the give-up, so that the look counts within it.
    tokio::time::sleep(give_up.saturating_sub(Duration::from_millis(100))).await;
    let looked = begun.elapsed();
    let ended = tokio::time::timeout(Duration::from_millis(500), async {
        let mut sink = [0u8; 16 * 1024];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await
    .is_ok();
    // What was buffered is read in a moment: an end that takes longer is not there yet.
    Ok((ended, looked))
}

/// One HTTP/2 frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The HPACK block of a `Score` call's head: static-table entries and literals, no Huffman.
fn score_head(authority: &str) -> Vec<u8> {
    let mut h = vec![0x83, 0x86]; // :method POST, :scheme http
    literal_indexed(&mut h, 4, SCORE_PATH); // :path
    literal_indexed(&mut h, 1, authority); // :authority
    literal_indexed(&mut h, 31, "application/grpc"); // content-type
    h.push(0x00); // te: a literal name
    string(&mut h, "te");
    string(&mut h, "trailers");
    h
}

/// A literal without indexing whose name is static-table entry `index` (4-bit prefix).
fn literal_indexed(h: &mut Vec<u8>, index: u8, value: &str) {
    if index < 15 {
        h.push(index);
    } else {
        h.extend_from_slice(&[0x0f, index - 15]);
    }
    string(h, value);
}

/// A string literal (no Huffman; the ones here are all shorter than 127 bytes, the 7-bit
/// prefix's one-byte length).
fn string(h: &mut Vec<u8>, s: &str) {
    let len = u8::try_from(s.len()).ok().filter(|&n| n < 0x7f).expect("a short header value");
    h.push(len);
    h.extend_from_slice(s.as_bytes());
}
