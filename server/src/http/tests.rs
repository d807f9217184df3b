//! `serve` on loopback, driven by raw TCP: timeouts, the connection cap, hyper's own errors as
//! JSON, bounded stop. Short timeouts (hundreds of ms) keep it fast; every wait is bounded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::*;

/// The bound on any single wait in these tests.
const BOUND: Duration = Duration::from_secs(5);

fn fast() -> HttpConfig {
    HttpConfig {
        header_read_timeout_ms: 300,
        body_read_timeout_ms: 300,
        idle_timeout_ms: 700,
        max_connections: 64,
        max_header_bytes: 8192,
        ..HttpConfig::default()
    }
}

struct Server {
    addr: SocketAddr,
    stopper: Stopper,
    task: JoinHandle<()>,
    /// Handlers running now (a request "in flight").
    running: Arc<AtomicUsize>,
}

/// Serves an echo: the body's length as JSON, or read_body's error.
async fn start(config: HttpConfig) -> Server {
    let (l, addr) = bind("127.0.0.1", 0, 1024, false).await.unwrap();
    let stopper = Stopper::new();
    let running = Arc::new(AtomicUsize::new(0));
    let r = running.clone();
    let handler = move |req: Request<Incoming>| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            let out = match read_body(req, 1 << 20).await {
                Ok(b) => json(StatusCode::OK, &serde_json::json!({"len": b.len()})),
                Err(e) => error(&e),
            };
            r.fetch_sub(1, Ordering::SeqCst);
            out
        }
    };
    let task = tokio::spawn(serve(l, config, handler, stopper.signal()));
    Server { addr, stopper, task, running }
}

/// Reads one response: (status, body as JSON). None when the connection closed first.
async fn response(s: &mut TcpStream) -> Option<(u16, serde_json::Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
            let len: usize = r
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |h| std::str::from_utf8(h.value).unwrap().parse().unwrap());
            if buf.len() >= n + len {
                let body = serde_json::from_slice(&buf[n..n + len]).unwrap_or(serde_json::Value::Null);
                let code = r.code.unwrap();
                buf.drain(..n + len);
                assert!(buf.is_empty(), "one response at a time in these tests");
                return Some((code, body));
            }
        }
        let n = tokio::time::timeout(BOUND, s.read(&mut chunk)).await.expect("no answer in time").ok()?;
        if n == 0 {
            assert!(buf.is_empty(), "closed mid-response: {:?}", String::from_utf8_lossy(&buf));
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Waits for the server to close the connection; how long that took.
async fn closed(s: &mut TcpStream) -> Duration {
    let t0 = Instant::now();
    let mut chunk = [0u8; 1024];
    match tokio::time::timeout(BOUND, s.read(&mut chunk)).await.expect("still open") {
        Ok(0) | Err(_) => t0.elapsed(),
        Ok(n) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&chunk[..n])),
    }
}

fn post(body: &str) -> String {
    format!("POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len())
}

fn assert_error(r: Option<(u16, serde_json::Value)>, code: u16, kind: &str) {
    let (status, body) = r.expect("an answer, not a close");
    assert_eq!(status, code, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(!body["error"]["message"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn a_trickled_body_arrives_whole() {
    let srv = start(HttpConfig { body_read_timeout_ms: 5000, ..fast() }).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 64\r\n\r\n").await.unwrap();
    for _ in 0..64 {
        s.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, body) = response(&mut s).await.unwrap();
    assert_eq!((status, body["len"].as_u64()), (200, Some(64)));
}

#[tokio::test]
async fn a_stalled_body_is_408_json_at_the_body_timeout_and_frees_its_handler() {
    let srv = start(fast()).await;
    for head in [
        // Content-Length larger than what is sent.
        "POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nabc",
        // A chunked body that never ends.
        "POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ] {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let t0 = Instant::now();
        s.write_all(head.as_bytes()).await.unwrap();
        assert_error(response(&mut s).await, 408, "request_timeout");
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(250), "answered at {took:?}, before the timeout");
        assert_eq!(srv.running.load(Ordering::SeqCst), 0, "the handler ended with its 408");
        closed(&mut s).await;
    }
}

#[tokio::test]
async fn half_sent_headers_and_silent_connections_close_at_the_header_timeout() {
    let srv = start(fast()).await;
    let mut half = TcpStream::connect(srv.addr).await.unwrap();
    half.write_all(b"POST /x HTTP/1.1\r\nhost: t\r\n").await.unwrap();
    let mut silent = TcpStream::connect(srv.addr).await.unwrap();
    let t = closed(&mut half).await;
    assert!(t >= Duration::from_millis(200) && t < Duration::from_millis(3000), "{t:?}");
    let t = closed(&mut silent).await;
    assert!(t < Duration::from_millis(3000), "{t:?}");
    assert_eq!(srv.running.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_keep_alive_connection_closes_at_the_idle_timeout_not_the_header_one() {
    let srv = start(fast()).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(post("{}").as_bytes()).await.unwrap();
    assert_eq!(response(&mut s).await.unwrap().0, 200);
    // Still open past the header timeout (300 ms): a second request works.
    tokio::time::sleep(Duration::from_millis(450)).await;
    s.write_all(post("{}").as_bytes()).await.unwrap();
    assert_eq!(response(&mut s).await.unwrap().0, 200);
    let t = closed(&mut s).await;
    assert!(
        t >= Duration::from_millis(600) && t < Duration::from_millis(3000),
        "closed after {t:?}, idle timeout 700 ms"
    );
}

#[tokio::test]
async fn connections_over_the_cap_get_503_json_and_a_freed_slot_is_reused() {
    let srv =
        start(HttpConfig { max_connections: 2, header_read_timeout_ms: 5000, idle_timeout_ms: 5000, ..fast() }).await;
    // Both slots held by connections with a request head on its way: not idle, never closed
    // for another.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(b"POST /x HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    // A third waits for a slot (SLOT_WAIT), then is refused.
    let mut third = TcpStream::connect(srv.addr).await.unwrap();
    third.write_all(post("{}").as_bytes()).await.unwrap();
    assert_error(response(&mut third).await, 503, "not_ready");
    closed(&mut third).await;
    drop(held.pop());
    // The slot frees once the server sees the close: retry a bounded number of times.
    let t0 = Instant::now();
    loop {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(post("{}").as_bytes()).await.unwrap();
        match response(&mut s).await {
            Some((200, _)) => break,
            other => assert!(t0.elapsed() < BOUND, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn idle_connections_at_the_cap_are_closed_for_a_client_with_a_request() {
    let srv =
        start(HttpConfig { max_connections: 2, header_read_timeout_ms: 5000, idle_timeout_ms: 5000, ..fast() }).await;
    // The cap held by idle connections: one that never sent anything, one served and kept alive.
    let mut silent = TcpStream::connect(srv.addr).await.unwrap();
    let mut kept = TcpStream::connect(srv.addr).await.unwrap();
    kept.write_all(post("{}").as_bytes()).await.unwrap();
    assert_eq!(response(&mut kept).await.unwrap().0, 200);
    // A client with a request is served (within the idle ones' 250 ms and its 1 s wait), not
    // refused until the idle timeout; the idle connections are closed for it.
    let mut real = TcpStream::connect(srv.addr).await.unwrap();
    real.write_all(post("{}").as_bytes()).await.unwrap();
    assert_eq!(response(&mut real).await.unwrap().0, 200);
    closed(&mut silent).await;
    closed(&mut kept).await;
}

/// A head hyper cannot parse gets hyper's own answer (400 or 431, no body) and the connection
/// closes; an answer before it on the same connection goes out untouched.
#[tokio::test]
async fn a_head_hyper_cannot_parse_is_refused_and_closed() {
    let srv = start(fast()).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"BAD REQUEST LINE\r\n\r\n").await.unwrap();
    assert_eq!(response(&mut s).await.map(|(code, _)| code), Some(400));
    closed(&mut s).await;

    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let big = format!("GET /x HTTP/1.1\r\nhost: t\r\nx-big: {}\r\n\r\n", "a".repeat(20_000));
    // The server may close before reading it all: a failed write is fine, the answer counts.
    let _ = s.write_all(big.as_bytes()).await;
    assert_eq!(response(&mut s).await.map(|(code, _)| code), Some(431));

    // A good request, then garbage, in one write: the first answer is untouched.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(format!("{}GET / HTTP/1.1\r\nbad header\r\n\r\n", post("{}")).as_bytes()).await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut all)).await.unwrap().unwrap();
    let text = String::from_utf8(all).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("{\"len\":2}HTTP/1.1 400 Bad Request\r\n"), "{text}");
}

#[tokio::test]
async fn a_graceful_stop_ends_within_its_grace_despite_a_stalled_client() {
    let srv = start(HttpConfig { body_read_timeout_ms: 30_000, header_read_timeout_ms: 30_000, ..fast() }).await;
    let mut stalled = TcpStream::connect(srv.addr).await.unwrap();
    stalled.write_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nab").await.unwrap();
    let mut half = TcpStream::connect(srv.addr).await.unwrap();
    half.write_all(b"POST /x HTTP/1.").await.unwrap();
    // Let the server take both in.
    let t0 = Instant::now();
    while srv.running.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < BOUND);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    srv.stopper.stop(StopMode::Graceful(Some(Duration::from_millis(200))));
    tokio::time::timeout(BOUND, srv.task).await.expect("serve returned").unwrap();
    let t = t0.elapsed();
    assert!(t < Duration::from_millis(1500), "stopped after {t:?}, grace 200 ms");
    closed(&mut stalled).await;
    closed(&mut half).await;
}

#[tokio::test]
async fn a_connection_served_after_waiting_at_the_cap_is_drained_by_a_graceful_stop() {
    let srv =
        start(HttpConfig { max_connections: 1, header_read_timeout_ms: 5000, body_read_timeout_ms: 5000, ..fast() })
            .await;
    let head = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\n\r\nab";
    // The one slot held by a request in progress; a second connection waits for it.
    let mut first = TcpStream::connect(srv.addr).await.unwrap();
    first.write_all(head).await.unwrap();
    let t0 = Instant::now();
    while srv.running.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < BOUND);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut waiting = TcpStream::connect(srv.addr).await.unwrap();
    waiting.write_all(head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.write_all(b"cd").await.unwrap();
    assert_eq!(response(&mut first).await.unwrap().0, 200);
    drop(first);
    // The freed slot goes to the waiting connection, whose request is then in progress.
    let t0 = Instant::now();
    while srv.running.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < BOUND, "the waiting connection was never served");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    srv.stopper.stop(StopMode::Graceful(Some(Duration::from_secs(3))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Drained like any connection: its request finishes and is answered.
    waiting.write_all(b"cd").await.unwrap();
    let (status, body) = response(&mut waiting).await.expect("answered, not aborted by the stop");
    assert_eq!((status, body["len"].as_u64()), (200, Some(4)), "{body}");
    tokio::time::timeout(BOUND, srv.task).await.expect("serve returned").unwrap();
}

/// Serves `answer_bytes` of text to every request, whatever it is: answers that overflow the
/// socket buffers when nobody reads them. Its sockets have a 4 KiB send buffer (an accepted
/// socket inherits the listener's), so that a few KiB unread stall its writes.
async fn start_big(config: HttpConfig, answer_bytes: usize) -> Server {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_send_buffer_size(4096).unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = sock.listen(64).unwrap();
    let addr = l.local_addr().unwrap();
    let stopper = Stopper::new();
    let answer = Bytes::from(vec![b'x'; answer_bytes]);
    let handler = move |_req: Request<Incoming>| {
        let answer = answer.clone();
        async move { body_with_type(StatusCode::OK, answer, "text/plain") }
    };
    let task = tokio::spawn(serve(l, config, handler, stopper.signal()));
    Server { addr, stopper, task, running: Arc::new(AtomicUsize::new(0)) }
}

/// A client socket with a 4 KiB receive buffer (set before connecting, so the window it offers
/// is that small too).
async fn small_window_client(addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(addr).await.unwrap()
}

fn pipelined_gets(n: usize) -> Vec<u8> {
    "GET /big HTTP/1.1\r\nhost: t\r\n\r\n".repeat(n).into_bytes()
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_at_the_send_timeout_and_frees_its_slot() {
    let timeout = Duration::from_millis(500);
    let config = HttpConfig {
        send_timeout_ms: timeout.as_millis() as u64,
        max_connections: 1,
        header_read_timeout_ms: 5000,
        idle_timeout_ms: 5000,
        ..fast()
    };
    let srv = start_big(config, 1 << 20).await;
    // 4 answers of 1 MiB asked for at once, none read: far more than the socket buffers hold.
    let mut hog = small_window_client(srv.addr).await;
    hog.write_all(&pipelined_gets(4)).await.unwrap();
    let t0 = Instant::now();
    // The one slot is held (the hog's answer waits on it: not idle, never closed for another
    // client): another client waits for it, or is refused, until the server gives up on the hog.
    let freed_after = loop {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(b"GET /big HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut head = [0u8; 12];
        tokio::time::timeout(BOUND, s.read_exact(&mut head)).await.expect("an answer in time").unwrap();
        match &head {
            b"HTTP/1.1 503" => {}
            b"HTTP/1.1 200" => break t0.elapsed(),
            other => panic!("unexpected answer {:?}", String::from_utf8_lossy(other)),
        }
        assert!(t0.elapsed() < timeout + BOUND, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Its stall started a little after its requests were sent.
    assert!(freed_after >= timeout - Duration::from_millis(100), "freed after {freed_after:?}, before the timeout");
    drop(hog);
}

#[tokio::test]
async fn a_client_that_reads_slowly_but_steadily_is_served_whole() {
    // Far longer than the client's pauses, so a loaded machine does not make one look like a stall.
    let timeout = Duration::from_secs(1);
    let answer = 64 << 10;
    // The idle timer starts once the last answer is in the socket buffers, which the client
    // takes a while to drain: long enough not to close the connection checked at the end.
    let config = HttpConfig { send_timeout_ms: timeout.as_millis() as u64, idle_timeout_ms: 5000, ..fast() };
    let srv = start_big(config, answer).await;
    let mut s = small_window_client(srv.addr).await;
    // 8 answers of 64 KiB (more than the buffers hold), read at most 4 KiB every 20 ms (so in
    // 2.5 s at least): the server's writes stall often, each time far less than the timeout,
    // for longer than it in all.
    let n = 8;
    s.write_all(&pipelined_gets(n)).await.unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut answers = 0;
    while answers < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let k = tokio::time::timeout(BOUND, s.read(&mut chunk)).await.expect("bytes in time").unwrap();
        assert!(k > 0, "closed after {:?} with {answers} answers read", t0.elapsed());
        got.extend_from_slice(&chunk[..k]);
        // Take whole answers off the front.
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 8];
            let mut r = httparse::Response::new(&mut headers);
            let Ok(httparse::Status::Complete(h)) = r.parse(&got) else { break };
            assert_eq!(r.code, Some(200));
            if got.len() < h + answer {
                break;
            }
            assert!(got[h..h + answer].iter().all(|&b| b == b'x'));
            got.drain(..h + answer);
            answers += 1;
        }
    }
    let took = t0.elapsed();
    assert!(took > 2 * timeout, "read in {took:?}: not slow enough to prove anything");
    // Still open and usable.
    s.write_all(&pipelined_gets(1)).await.unwrap();
    let k = tokio::time::timeout(BOUND, s.read(&mut chunk)).await.expect("an answer").unwrap();
    assert!(chunk[..k].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&chunk[..k]));
}

#[test]
fn formatted_headers_are_the_text_whatever_its_length() {
    use hyper::header::HeaderValue;
    assert_eq!(formatted_header(format_args!("{}", u64::MAX)), Some(HeaderValue::from(u64::MAX)));
    assert_eq!(formatted_header(format_args!("{:.3}", 12.5f64)), Some(HeaderValue::from_static("12.500")));
    // Longer than the stack buffer: formatted on the heap, the same text.
    let long = 1e40f64;
    assert_eq!(
        formatted_header(format_args!("{long:.3}")).map(|v| v.to_str().map(str::to_owned).ok()),
        Some(Some(format!("{long:.3}")))
    );
    // Not a header value (a control character): none.
    assert_eq!(formatted_header(format_args!("a\nb")), None);
}
