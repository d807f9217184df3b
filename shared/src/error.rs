//! API errors and their one mapping to HTTP status codes.

use serde::{Deserialize, Serialize};

/// What went wrong, from the caller's point of view. Each kind has exactly one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 400: the body is not valid JSON (or the request head is not valid HTTP).
    Malformed,
    /// 401: an admin route that needs the bearer token got none, or a wrong one.
    Unauthorized,
    /// 403: an admin route that needs a token, on a process with no token configured.
    Forbidden,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 408: the request body did not arrive within the body-read timeout.
    RequestTimeout,
    /// 413: body, item count or an item is over a limit.
    TooLarge,
    /// 414: the request target is longer than the HTTP parser accepts.
    UriTooLong,
    /// 415: the body's `Content-Encoding` is not one the server decodes (gzip, zstd).
    UnsupportedMediaType,
    /// 422: well-formed but semantically invalid (empty query, no items, wrong field type).
    Invalid,
    /// 429: queues are full; retry later or elsewhere.
    Overloaded,
    /// 431: the request head (headers) is over the size limit.
    HeadersTooLarge,
    /// 500: a bug or an engine failure; the request may be retried elsewhere.
    Internal,
    /// 503: not ready (loading, draining, no healthy worker).
    NotReady,
    /// 504: the deadline passed before the work could finish.
    DeadlineExceeded,
}

/// Every kind with its status: the one table both directions of the mapping read.
const STATUS: [(ErrorKind, u16); 15] = [
    (ErrorKind::Malformed, 400),
    (ErrorKind::Unauthorized, 401),
    (ErrorKind::Forbidden, 403),
    (ErrorKind::NotFound, 404),
    (ErrorKind::MethodNotAllowed, 405),
    (ErrorKind::RequestTimeout, 408),
    (ErrorKind::TooLarge, 413),
    (ErrorKind::UriTooLong, 414),
    (ErrorKind::UnsupportedMediaType, 415),
    (ErrorKind::Invalid, 422),
    (ErrorKind::Overloaded, 429),
    (ErrorKind::HeadersTooLarge, 431),
    (ErrorKind::Internal, 500),
    (ErrorKind::NotReady, 503),
    (ErrorKind::DeadlineExceeded, 504),
];

impl ErrorKind {
    pub fn status(self) -> u16 {
        STATUS.iter().find(|(k, _)| *k == self).map_or(500, |&(_, s)| s)
    }

    pub fn from_status(status: u16) -> Option<Self> {
        STATUS.iter().find(|(_, s)| *s == status).map(|&(k, _)| k)
    }

    /// Whether another attempt (elsewhere or later) could succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Overloaded | ErrorKind::Internal | ErrorKind::NotReady)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind:?} ({}): {message}", kind.status())]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into() }
    }
    pub fn malformed(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Malformed, m)
    }
    pub fn too_large(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, m)
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, m)
    }
    pub fn overloaded(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Overloaded, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, m)
    }
    pub fn not_ready(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotReady, m)
    }
    pub fn deadline(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::DeadlineExceeded, m)
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// Parses a JSON request body: syntax errors are 400, shape errors (missing field, wrong
    /// type, unknown field) are 422, each with serde's message naming the place.
    pub fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
        // One UTF-8 check of the whole body, then the str parser, which checks no string again
        // (the slice parser validates every string on its own: a call per item). A body that is
        // not UTF-8 takes the slice parser, for its message and position.
        let parsed = match std::str::from_utf8(body) {
            Ok(text) => serde_json::from_str(text),
            Err(_) => serde_json::from_slice(body),
        };
        parsed.map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ApiError::invalid(format!("invalid request: {e}")),
            _ => ApiError::malformed(format!("malformed JSON: {e}")),
        })
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { kind: self.kind, code: self.kind.status(), message: self.message.clone() } }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| String::from("{}"))
    }

    /// Rebuilds an error from a peer's HTTP status and body (proxy side).
    pub fn from_response(status: u16, body: &[u8]) -> Self {
        let kind = ErrorKind::from_status(status).unwrap_or(ErrorKind::Internal);
        let message = serde_json::from_slice::<ErrorBody>(body)
            .map(|b| b.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(body).chars().take(500).collect());
        ApiError::new(kind, message)
    }
}

/// `{"error": {"type": "invalid", "code": 422, "message": "..."}}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    pub code: u16,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScoreRequest;

    #[test]
    fn syntax_is_400_shape_is_422() {
        let e = ApiError::parse_json::<ScoreRequest>(b"{\"query\": ").unwrap_err();
        assert_eq!(e.status(), 400);
        // A body that is not UTF-8 gets the slice parser's own message and position.
        let bad = b"{\"query\": \"\xff\", \"items\": [\"a\"]}";
        let e = ApiError::parse_json::<ScoreRequest>(bad).unwrap_err();
        let want = serde_json::from_slice::<ScoreRequest>(bad).unwrap_err();
        assert_eq!((e.status(), e.message), (400, format!("malformed JSON: {want}")));
        let e = ApiError::parse_json::<ScoreRequest>(b"{\"query\": 3, \"items\": []}").unwrap_err();
        assert_eq!(e.status(), 422);
        assert!(e.message.contains("query") || e.message.contains("integer"), "{}", e.message);
    }

    #[test]
    fn every_kind_maps_to_one_status_and_back() {
        use ErrorKind::*;
        let all = [
            Malformed,
            Unauthorized,
            Forbidden,
            NotFound,
            MethodNotAllowed,
            RequestTimeout,
            TooLarge,
            UriTooLong,
            UnsupportedMediaType,
            Invalid,
            Overloaded,
            HeadersTooLarge,
            Internal,
            NotReady,
            DeadlineExceeded,
        ];
        assert_eq!(STATUS.len(), all.len(), "one row of the status table per kind");
        for k in all {
            assert_eq!(ErrorKind::from_status(k.status()), Some(k), "{k:?}");
        }
        assert_eq!(RequestTimeout.status(), 408);
        assert_eq!(HeadersTooLarge.status(), 431);
        assert_eq!(Unauthorized.status(), 401);
        assert_eq!(Forbidden.status(), 403);
    }

    #[test]
    fn round_trips_through_a_response_body() {
        let e = ApiError::too_large("too many items: 5000 > max_items 1024");
        let back = ApiError::from_response(413, e.to_json().as_bytes());
        assert_eq!(back, e);
    }
}
