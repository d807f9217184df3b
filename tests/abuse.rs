//! Abusive clients for the soak (`tests/abuse_soak.rs`, `benches/abuse_soak.rs`): connections
//! that trickle a body, stall, hoard most of a large body, send half a request head, stay silent,
//! idle on keep-alive, or pipeline requests and never read the answers, each reporting whether
//! (and when) the server closed it; and an overload burst of real requests.
//!
//! Everything is bounded: a connection the server never closes is given up by the client after
//! `give_up`, and every loop stops at its window's end, so a server without timeouts makes the
//! soak report "not closed", never hang.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::Http;

/// What an abusive connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Attack {
    /// A full request head announcing a large body, then one body byte every `trickle_every`.
    Trickle,
    /// A full request head and a few body bytes, then nothing.
    Stall,
    /// A full request head, then most (7/8) of its large body at once, then nothing: many at
    /// once would make a server buffer their product, which the `[http] max_buffered_bytes`
    /// budget bounds (a body that does not fit is answered 503 at once, one that does waits
    /// for the body timeout's 408).
    Hoard,
    /// Half a request head, then nothing.
    HalfHeaders,
    /// Connects and sends nothing at all.
    Silent,
    /// One complete request, its answer read, then the keep-alive connection left idle.
    Idle,
    /// A socket with a small receive buffer that pipelines cheap requests whose answers (404s
    /// naming a long path) overflow the socket buffers (some MiB), and never reads any answer: the
    /// server's writes stall, which only `[http] send_timeout_ms` ends. It keeps sending, so
    /// the server always holds requests it has not read and its close is a reset, which this
    /// client sees without reading.
    SlowRead,
}

impl Attack {
    pub const ALL: [Attack; 7] = [
        Attack::Trickle,
        Attack::Stall,
        Attack::Hoard,
        Attack::HalfHeaders,
        Attack::Silent,
        Attack::Idle,
        Attack::SlowRead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::Trickle => "trickle",
            Attack::Stall => "stall",
            Attack::Hoard => "hoard",
            Attack::HalfHeaders => "half-headers",
            Attack::Silent => "silent",
            Attack::Idle => "idle",
            Attack::SlowRead => "slow-read",
        }
    }

    /// The earliest the server may close this connection: the shortest timeout that applies.
    pub fn earliest(self, t: &Timeouts) -> Duration {
        match self {
            Attack::Silent => t.header.min(t.idle),
            // Over the budget: refused at once.
            Attack::Hoard => Duration::ZERO,
            _ => self.deadline(t),
        }
    }

    /// The server timeout that must close this connection, and from when it runs: the
    /// `Duration` the close is measured against (see `Outcome::after`).
    pub fn deadline(self, t: &Timeouts) -> Duration {
        match self {
            // The body must be complete within the body timeout after the head.
            Attack::Trickle | Attack::Stall | Attack::Hoard => t.body,
            Attack::HalfHeaders => t.header,
            // Nothing sent: whichever of the header and idle timeouts the server applies to a
            // connection with no request yet; either must close it.
            Attack::Silent => t.header.max(t.idle),
            Attack::Idle => t.idle,
            // The server's writes stall within milliseconds of the first requests.
            Attack::SlowRead => t.send,
        }
    }
}

/// The servers' configured timeouts (the `[http]` section), as the attacks expect them.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub body: Duration,
    pub idle: Duration,
    /// `send_timeout_ms`: an answer whose bytes make no progress for this long ends its connection.
    pub send: Duration,
}

/// How one abusive connection ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub attack: Attack,
    pub target: &'static str,
    /// The server closed (or reset) the connection; false when the client gave up first or
    /// could not connect.
    pub closed_by_server: bool,
    /// From the moment the attack's timeout starts (head sent for body attacks, answer read for
    /// idle ones, connect for the others, slow reads included) to the close or the give-up.
    pub after: Duration,
    /// The status line the server sent before closing, if any (e.g. 408, 503).
    pub status: Option<u16>,
    /// Connect failed (refused, or the client ran out of descriptors).
    pub connect_failed: bool,
}

/// The knobs of one attack connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnPlan {
    /// Body attacks announce this Content-Length.
    pub content_length: usize,
    pub trickle_every: Duration,
    /// The client closes a connection the server kept open this long.
    pub give_up: Duration,
}

const STALL_BYTES: &[u8] = b"{\"qu";

fn head(path: &str, content_length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    )
}

/// Runs one abusive connection against `addr` and reports how it ended.
pub async fn one(attack: Attack, target: &'static str, addr: SocketAddr, plan: ConnPlan) -> Outcome {
    let start = Instant::now();
    let mut out =
        Outcome { attack, target, closed_by_server: false, after: Duration::ZERO, status: None, connect_failed: false };
    let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(5), connect(attack, addr)).await else {
        out.connect_failed = true;
        out.after = start.elapsed();
        return out;
    };
    let _ = s.set_nodelay(true);
    // What the server answered while the request was still being sent (a hoard's 503).
    let mut got = Vec::new();
    let sent = match attack {
        Attack::Trickle => s.write_all(head("/v1/score", plan.content_length).as_bytes()).await,
        Attack::Stall => {
            let mut b = head("/v1/score", plan.content_length).into_bytes();
            b.extend_from_slice(STALL_BYTES);
            s.write_all(&b).await
        }
        Attack::Hoard => hoard(&mut s, plan.content_length, &mut got).await,
        Attack::HalfHeaders => s.write_all(b"POST /v1/score HTTP/1.1\r\nhost: soak\r\ncontent-le").await,
        Attack::Silent => Ok(()),
        Attack::Idle => answer_one(&mut s).await.map(|_| ()),
        // Its requests go out in the wait below.
        Attack::SlowRead => Ok(()),
    };
    let from = Instant::now();
    out.status = status_of(&got);
    if sent.is_err() {
        // Refused mid-request: the server closed it at once.
        out.closed_by_server = true;
        return out;
    }
    let end = from + plan.give_up;
    if attack == Attack::SlowRead {
        out.closed_by_server = slow_read(&mut s, end).await;
        out.after = from.elapsed();
        return out;
    }
    let mut buf = [0u8; 4096];
    let mut next_byte = from + plan.trickle_every;
    let mut trickled = 0usize;
    loop {
        let wake = if attack == Attack::Trickle { next_byte.min(end) } else { end };
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    out.closed_by_server = true;
                    break;
                }
                Ok(n) => {
                    // An answer before the close (408, 413, 503...): note its status, keep
                    // waiting for the close itself.
                    got.extend_from_slice(&buf[..n]);
                    out.status = status_of(&got);
                }
            },
            _ = tokio::time::sleep_until(wake.into()) => {
                if Instant::now() >= end {
                    break;
                }
                if trickled + 1 < plan.content_length && s.write_all(b" ").await.is_err() {
                    out.closed_by_server = true;
                    break;
                }
                trickled += 1;
                next_byte += plan.trickle_every;
            }
        }
    }
    out.after = from.elapsed();
    out
}

/// The attack's connection; a slow reader's with a 4 KiB receive buffer (set before connecting,
/// so the window it offers is that small too) and a 64 KiB send buffer (its writes block soon
/// after the server stops reading, rather than after MiB more).
async fn connect(attack: Attack, addr: SocketAddr) -> std::io::Result<TcpStream> {
    if attack != Attack::SlowRead {
        return TcpStream::connect(addr).await;
    }
    let sock = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    sock.set_recv_buffer_size(4096)?;
    sock.set_send_buffer_size(64 << 10)?;
    sock.connect(addr).await
}

/// A slow reader stops sending after this many request bytes. The server stalls long before:
/// on loopback its send buffer grows to `net.ipv4.tcp_wmem`'s maximum (4 MiB by default)
/// whatever the window the client offers, so about that much must be answered first; then
/// the client's own send buffer fills.
const SLOW_READ_MAX_BYTES: usize = 16 << 20;

/// A slow reader's requests, 4 at a time: a GET of an unknown route with a 16 KB path, whose
/// 404 names the path, so few requests make many answer bytes.
fn slow_read_batch() -> Vec<u8> {
    let path = format!("/soak-slow-read/{}", "x".repeat(16_000));
    format!("GET {path} HTTP/1.1\r\nhost: soak\r\n\r\n").repeat(4).into_bytes()
}

/// A slow reader's wait until `end`: more pipelined requests whenever the socket takes them
/// (one `write` at a time, which a select may cancel without losing bytes, so the stream stays
/// whole), never a read; whether the server closed the connection (a failed write, or the
/// socket's error, checked every 50 ms).
async fn slow_read(s: &mut TcpStream, end: Instant) -> bool {
    let batch = slow_read_batch();
    let (mut at, mut sent) = (0usize, 0usize);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            w = s.write(&batch[at..]), if sent < SLOW_READ_MAX_BYTES => match w {
                Ok(0) | Err(_) => return true,
                Ok(n) => {
                    sent += n;
                    at = (at + n) % batch.len();
                }
            },
            _ = tick.tick() => {
                if !matches!(s.take_error(), Ok(None)) {
                    return true;
                }
                if Instant::now() >= end {
                    return false;
                }
            }
        }
    }
}

/// A hoard's request: the head, then 7/8 of the announced body in one write, unless the server
/// answers first (its answer goes into `got`; the request counts as sent, its close is awaited).
pub async fn hoard(s: &mut TcpStream, content_length: usize, got: &mut Vec<u8>) -> std::io::Result<()> {
    s.write_all(head("/v1/score", content_length).as_bytes()).await?;
    let body = vec![b' '; content_length / 8 * 7];
    let (mut rd, mut wr) = s.split();
    let mut buf = [0u8; 4096];
    tokio::select! {
        w = wr.write_all(&body) => w,
        r = rd.read(&mut buf) => match r {
            Ok(n) if n > 0 => {
                got.extend_from_slice(&buf[..n]);
                Ok(())
            }
            Ok(_) => Err(std::io::Error::other("closed while the body was sent")),
            Err(e) => Err(e),
        },
    }
}

/// Sends one cheap complete request (an unknown route: a fast JSON 404) and reads its whole
/// answer, leaving the connection open.
async fn answer_one(s: &mut TcpStream) -> std::io::Result<u16> {
    s.write_all(b"GET /soak-idle HTTP/1.1\r\nhost: soak\r\n\r\n").await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = find(&got, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return status_of(&got).ok_or_else(|| std::io::Error::other("no status line"));
            }
        }
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("no answer to the idle connection's request"))??;
        if n == 0 {
            return Err(std::io::Error::other("closed before answering"));
        }
        got.extend_from_slice(&buf[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status code of the HTTP answer at the start of `got`, once its status line is in.
pub fn status_of(got: &[u8]) -> Option<u16> {
    let line = got.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line).ok()?.split_whitespace().nth(1)?.parse().ok()
}

/// How many connections of each attack to hold open at once against each target.
#[derive(Debug, Clone, Default)]
pub struct AttackPlan {
    pub per_target: BTreeMap<Attack, usize>,
    pub conn: Option<ConnPlan>,
}

impl AttackPlan {
    pub fn connections(&self) -> usize {
        self.per_target.values().sum()
    }
}

/// Holds `plan`'s connections open against every target from now until `window` has passed:
/// each slot opens a connection, waits for it to end, and opens the next (at most one per
/// `min_gap`, so a server that closes at once is not hammered). Returns every connection's outcome.
pub async fn run(targets: &[(&'static str, SocketAddr)], plan: &AttackPlan, window: Duration) -> Vec<Outcome> {
    let conn = plan.conn.expect("AttackPlan.conn");
    let end = Instant::now() + window;
    let min_gap = Duration::from_millis(200);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for &(target, addr) in targets {
        for (&attack, &n) in &plan.per_target {
            for i in 0..n {
                let outcomes = outcomes.clone();
                // Spread the first connections over a second rather than one SYN flood.
                let stagger = Duration::from_millis((i as u64 * 1000) / n.max(1) as u64);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(stagger).await;
                    while Instant::now() < end {
                        let opened = Instant::now();
                        let o = one(attack, target, addr, conn).await;
                        outcomes.lock().unwrap().push(o);
                        tokio::time::sleep_until((opened + min_gap).into()).await;
                    }
                }));
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let all = std::mem::take(&mut *outcomes.lock().unwrap());
    all
}

/// Figures of one attack against one target.
#[derive(Debug, Clone, Default)]
pub struct AttackSummary {
    pub connections: usize,
    pub closed_by_server: usize,
    pub connect_failed: usize,
    /// Closed by the server later than the timeout + slack allows, or not at all.
    pub late: usize,
    /// Closed by the server more than the slack before its timeout (by the wrong timeout, or a
    /// close that was not a timeout).
    pub early: usize,
    /// Close times (s) of the connections the server closed: min, median, max.
    pub closed_after_s: Option<(f64, f64, f64)>,
    pub statuses: BTreeMap<u16, usize>,
}

/// Groups outcomes by (target, attack). A connection counts as late if the server did not close
/// it within `attack.deadline(timeouts) + slack`, early if it closed it before
/// `attack.earliest(timeouts) - early_slack` (the client takes the time after its last write, a
/// little after the server's timer started).
pub fn summarise(
    outcomes: &[Outcome],
    timeouts: &Timeouts,
    slack: Duration,
    early_slack: Duration,
) -> BTreeMap<(&'static str, Attack), AttackSummary> {
    let mut by: BTreeMap<(&'static str, Attack), (AttackSummary, Vec<f64>)> = BTreeMap::new();
    for o in outcomes {
        let (s, times) = by.entry((o.target, o.attack)).or_default();
        s.connections += 1;
        if o.connect_failed {
            s.connect_failed += 1;
            continue;
        }
        if let Some(code) = o.status {
            *s.statuses.entry(code).or_default() += 1;
        }
        if o.closed_by_server {
            s.closed_by_server += 1;
            times.push(o.after.as_secs_f64());
        }
        if !o.closed_by_server || o.after > o.attack.deadline(timeouts) + slack {
            s.late += 1;
        } else if o.after + early_slack < o.attack.earliest(timeouts) {
            s.early += 1;
        }
    }
    by.into_iter()
        .map(|(k, (mut s, mut t))| {
            t.sort_by(f64::total_cmp);
            if !t.is_empty() {
                s.closed_after_s = Some((t[0], t[t.len() / 2], t[t.len() - 1]));
            }
            (k, s)
        })
        .collect()
}

/// Status counts of an overload burst.
#[derive(Debug, Clone, Default)]
pub struct BurstSummary {
    pub requests: usize,
    pub statuses: BTreeMap<u16, usize>,
    /// Transport errors and client-side timeouts.
    pub errors: usize,
}

/// `concurrency` clients each sending `body` to `url` back to back for `duration` (each call
/// bounded by `timeout` on the client side): many real requests at once.
pub async fn burst(
    http: &Http,
    url: &str,
    body: &serde_json::Value,
    concurrency: usize,
    duration: Duration,
    timeout: Duration,
) -> BurstSummary {
    let end = Instant::now() + duration;
    let body = Arc::new(serde_json::to_vec(body).expect("serializable"));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (http, url, body) = (http.clone(), url.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = BurstSummary::default();
            while Instant::now() < end {
                s.requests += 1;
                let call = http.send(hyper::Method::POST, &url, body.as_ref().clone());
                match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(r)) => *s.statuses.entry(r.status).or_default() += 1,
                    _ => {
                        s.errors += 1;
                        // A refused or failed call comes back at once: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            s
        }));
    }
    let mut all = BurstSummary::default();
    for t in tasks {
        if let Ok(s) = t.await {
            all.requests += s.requests;
            all.errors += s.errors;
            for (k, v) in s.statuses {
                *all.statuses.entry(k).or_default() += v;
            }
        }
    }
    all
}
