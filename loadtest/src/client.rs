//! The load generator's HTTP client: HTTP/1.1 keep-alive over a pool, one connection per
//! concurrent request, with a per-request timeout. The end-to-end tests and benches use it too
//! (`sieve_e2e::Http` wraps it); the proxy keeps its own hot-path worker client.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connection: {0}")]
    Connection(String),
    #[error("bad request: {0}")]
    Request(String),
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        let mut c = HttpConnector::new();
        c.set_nodelay(true);
        c.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(c);
        Http { client }
    }

    pub async fn send(&self, method: Method, url: &str, body: Bytes, timeout: Duration) -> Result<Reply, HttpError> {
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| HttpError::Request(e.to_string()))?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| HttpError::Connection(format!("{e:?}")))?;
            let (head, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| HttpError::Connection(e.to_string()))?.to_bytes();
            Ok(Reply { status: head.status.as_u16(), headers: head.headers, body })
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Timeout(timeout)),
        }
    }

    pub async fn post(&self, url: &str, body: Bytes, timeout: Duration) -> Result<Reply, HttpError> {
        self.send(Method::POST, url, body, timeout).await
    }

    /// GET a JSON document (200 only).
    pub async fn get_json<T: DeserializeOwned>(&self, url: &str, timeout: Duration) -> Result<T, String> {
        let r = self.send(Method::GET, url, Bytes::new(), timeout).await.map_err(|e| format!("GET {url}: {e}"))?;
        if r.status != 200 {
            return Err(format!("GET {url}: status {}: {}", r.status, String::from_utf8_lossy(&r.body)));
        }
        serde_json::from_slice(&r.body).map_err(|e| format!("GET {url}: {e}"))
    }

    pub async fn put_json<T: serde::Serialize>(
        &self,
        url: &str,
        value: &T,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let body = serde_json::to_vec(value).map_err(|e| e.to_string())?;
        self.send(Method::PUT, url, Bytes::from(body), timeout).await.map_err(|e| format!("PUT {url}: {e}"))
    }
}
