//! Small HTTP helpers both ports use: JSON and error responses, bounded body reading.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use sieve_shared::{ApiError, ErrorKind};

use crate::server::HttpResponse;

pub fn json<T: Serialize>(status: StatusCode, value: &T) -> HttpResponse {
    match serde_json::to_vec(value) {
        Ok(body) => with_type(status, Bytes::from(body), "application/json"),
        Err(e) => error(&ApiError::internal(format!("encoding the response: {e}"))),
    }
}

pub fn text(status: StatusCode, body: String, content_type: &'static str) -> HttpResponse {
    with_type(status, Bytes::from(body), content_type)
}

fn with_type(status: StatusCode, body: Bytes, content_type: &'static str) -> HttpResponse {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// The error's JSON body with its status; overload and not-ready say when to come back.
pub fn error(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = with_type(status, Bytes::from(e.to_json()), "application/json");
    if matches!(e.kind, ErrorKind::Overloaded | ErrorKind::NotReady) {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Reads a request body of at most `max` bytes (413 beyond).
pub async fn read_body(req: Request<Incoming>, max: usize) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(len) = declared {
        if len > max as u64 {
            return Err(ApiError::too_large(format!("request body of {len} bytes > max_body_bytes {max}")));
        }
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(format!("request body > max_body_bytes {max}")))
        }
        Err(e) => Err(ApiError::malformed(format!("reading the request body: {e}"))),
    }
}
