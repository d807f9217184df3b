//! The worker client against a hand-written HTTP/1 server on loopback that counts its
//! connections: keep-alive reuse, what must never be reused, and cancellation by drop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

#[derive(Clone, Copy)]
enum Mode {
    /// Answers each request with its body echoed, keeping the connection open.
    Echo,
    /// Answers with `connection: close`, then closes.
    Close,
    /// Answers with a body of this many bytes.
    Big(usize),
    /// Reads the request and never answers.
    Silent,
    /// Answers the first request as `Echo`, then closes the connection 20 ms later.
    EchoThenClose,
    /// Sends the head and half of a 1,000-byte body, then nothing more.
    HalfBody,
}

#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    requests: AtomicUsize,
    /// Connections the client closed (end of stream read by the server).
    closed_by_client: AtomicUsize,
}

async fn server(mode: Mode) -> (Uri, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}/v1/score", listener.local_addr().unwrap()).parse().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            c.accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(connection(sock, mode, c.clone()));
        }
    });
    (uri, counts)
}

async fn connection(mut sock: TcpStream, mode: Mode, counts: Arc<Counts>) {
    let mut buf = Vec::new();
    loop {
        let Some(body) = read_request(&mut sock, &mut buf).await else {
            counts.closed_by_client.fetch_add(1, Ordering::SeqCst);
            return;
        };
        counts.requests.fetch_add(1, Ordering::SeqCst);
        let (extra, payload) = match mode {
            Mode::Echo | Mode::EchoThenClose => ("", body),
            Mode::Close => ("connection: close\r\n", body),
            Mode::Big(n) => ("", vec![b'x'; n]),
            Mode::Silent => continue,
            Mode::HalfBody => {
                let head = "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n";
                if sock.write_all(head.as_bytes()).await.is_err() || sock.write_all(&[b'x'; 500]).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n", payload.len());
        if sock.write_all(head.as_bytes()).await.is_err() || sock.write_all(&payload).await.is_err() {
            return;
        }
        match mode {
            Mode::Close => return,
            Mode::EchoThenClose => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                return;
            }
            _ => {}
        }
    }
}

/// One request's body; `None` at the end of the stream.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < end + 4 + len {
                read_more(sock, buf).await?;
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Some(body);
        }
        read_more(sock, buf).await?;
    }
}

async fn read_more(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    match sock.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn client(cfg: ClientConfig) -> HttpClient {
    HttpClient::new(&cfg)
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 2 s");
}

#[tokio::test]
async fn sequential_calls_share_one_connection_and_chunks_arrive_whole() {
    let (uri, counts) = server(Mode::Echo).await;
    let c = client(ClientConfig::default());
    for k in 0..5 {
        let body = vec![Bytes::from(format!("{{\"k\":{k},")), Bytes::new(), Bytes::from_static(b"\"x\":[1,2]}")];
        let reply = c.post_json(&uri, body, &[]).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], format!("{{\"k\":{k},\"x\":[1,2]}}").as_bytes());
    }
    assert_eq!(counts.requests.load(Ordering::SeqCst), 5);
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1, "keep-alive connection reused");
}

#[tokio::test]
async fn large_bodies_both_ways_keep_the_connection() {
    // A 1,000-item request's size: the request and the answer take several reads and writes.
    let (uri, counts) = server(Mode::Echo).await;
    let c = client(ClientConfig::default());
    for k in 0..3u8 {
        let body: Vec<Bytes> = (0..100).map(|i| Bytes::from(vec![b'a' + (i + k) % 26; 3000])).collect();
        let expected: Vec<u8> = body.iter().flat_map(|b| b.iter().copied()).collect();
        let reply = c.post_json(&uri, body, &[]).await.unwrap();
        assert_eq!(reply.body.len(), 300_000);
        assert!(reply.body[..] == expected[..]);
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1, "keep-alive connection reused");
}

#[tokio::test]
async fn concurrent_calls_each_get_a_connection_and_free_them_for_later_calls() {
    let (uri, counts) = server(Mode::Echo).await;
    let c = client(ClientConfig::default());
    let mut calls = tokio::task::JoinSet::new();
    for k in 0..4 {
        let (c, uri) = (c.clone(), uri.clone());
        calls.spawn(async move { (k, c.post_json(&uri, Bytes::from(format!("{k}")), &[]).await.unwrap().body) });
    }
    while let Some(done) = calls.join_next().await {
        let (k, body) = done.unwrap();
        assert_eq!(body, Bytes::from(format!("{k}")));
    }
    let opened = counts.accepted.load(Ordering::SeqCst);
    assert!((1..=4).contains(&opened), "{opened}");
    for _ in 0..4 {
        c.post_json(&uri, Bytes::from_static(b"again"), &[]).await.unwrap();
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), opened, "the idle connections were reused");
}

#[tokio::test]
async fn a_connection_the_worker_closes_is_never_reused() {
    let (uri, counts) = server(Mode::Close).await;
    let c = client(ClientConfig::default());
    for _ in 0..3 {
        assert_eq!(&c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap().body[..], b"a");
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_idle_connection_closed_by_the_worker_is_replaced_without_an_error() {
    let (uri, counts) = server(Mode::EchoThenClose).await;
    let c = client(ClientConfig::default());
    c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap();
    // The worker closes the kept-alive connection (its idle timeout, a restart) while it waits
    // in the pool: the next call must not be sent on it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(&c.post_json(&uri, Bytes::from_static(b"b"), &[]).await.unwrap().body[..], b"b");
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_idle_past_the_timeout_is_closed_not_used() {
    let (uri, counts) = server(Mode::Echo).await;
    let c = client(ClientConfig { pool_idle_timeout_ms: 50, ..ClientConfig::default() });
    c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    c.post_json(&uri, Bytes::from_static(b"b"), &[]).await.unwrap();
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
    // The stale one was closed (by the sweeper or when met).
    eventually("stale connection closed", || counts.closed_by_client.load(Ordering::SeqCst) >= 1).await;
}

#[tokio::test]
async fn no_idle_connection_is_kept_beyond_the_cap() {
    let (uri, counts) = server(Mode::Echo).await;
    let c = client(ClientConfig { max_idle_per_worker: 0, ..ClientConfig::default() });
    for _ in 0..3 {
        c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap();
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
    eventually("connections closed", || counts.closed_by_client.load(Ordering::SeqCst) == 3).await;
}

#[tokio::test]
async fn dropping_a_call_closes_its_connection() {
    let (uri, counts) = server(Mode::Silent).await;
    let c = client(ClientConfig::default());
    let call = tokio::time::timeout(Duration::from_millis(100), c.post_json(&uri, Bytes::from_static(b"a"), &[]));
    assert!(call.await.is_err(), "the silent worker never answers");
    eventually("the worker saw the connection close", || counts.closed_by_client.load(Ordering::SeqCst) == 1).await;
    assert_eq!(counts.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn dropping_a_call_mid_answer_closes_its_connection() {
    let (uri, counts) = server(Mode::HalfBody).await;
    let c = client(ClientConfig::default());
    let call = tokio::time::timeout(Duration::from_millis(100), c.post_json(&uri, Bytes::from_static(b"a"), &[]));
    assert!(call.await.is_err(), "the answer never ends");
    eventually("the worker saw the connection close", || counts.closed_by_client.load(Ordering::SeqCst) == 1).await;
    let again = tokio::time::timeout(Duration::from_millis(100), c.post_json(&uri, Bytes::from_static(b"b"), &[]));
    assert!(again.await.is_err());
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 2, "the half-read connection was not reused");
}

#[tokio::test]
async fn a_response_over_the_cap_is_refused_and_its_connection_closed() {
    let (uri, counts) = server(Mode::Big(10_000)).await;
    let c = client(ClientConfig { max_response_bytes: 1000, ..ClientConfig::default() });
    let e = c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap_err();
    assert!(matches!(e, ClientError::TooLarge(1000)), "{e:?}");
    eventually("connection closed", || counts.closed_by_client.load(Ordering::SeqCst) == 1).await;
    let e = c.get(&uri).await.unwrap_err();
    assert!(matches!(e, ClientError::TooLarge(1000)), "{e:?}");
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 2, "the first connection was not reused");
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error_and_a_dead_worker_mid_call_is_broken() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let uri: Uri = format!("http://{addr}/v1/score").parse().unwrap();
    let c = client(ClientConfig::default());
    let e = c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap_err();
    assert!(matches!(e, ClientError::Connect(_)), "{e:?}");

    // A worker that reads the request and closes without answering.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}/v1/score", listener.local_addr().unwrap()).parse().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        read_request(&mut sock, &mut buf).await;
    });
    let e = c.post_json(&uri, Bytes::from_static(b"a"), &[]).await.unwrap_err();
    assert!(matches!(e, ClientError::Broken(_)), "{e:?}");
}
