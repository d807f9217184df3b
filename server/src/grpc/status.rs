//! API errors as gRPC status codes: one mapping, from the same [`ErrorKind`] the HTTP status
//! comes from, with the same message. Every status carries `google.rpc.ErrorInfo` (reason: the
//! JSON error's `type`, domain `sieve`); overload and not-ready also carry `google.rpc.RetryInfo`
//! (1 s, as the HTTP `Retry-After`).
//!
//! 413 (a count, a length or the message over a limit) is OUT_OF_RANGE, not RESOURCE_EXHAUSTED:
//! gRPC clients retry RESOURCE_EXHAUSTED (our 429), and the same request over a limit never
//! succeeds; tonic's own refusal of an over-size message is OUT_OF_RANGE too, so every size
//! violation has one code.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use sieve_shared::{ApiError, ErrorKind};

/// `google.rpc.ErrorInfo.domain` of every Sieve error.
pub const GRPC_ERROR_DOMAIN: &str = "sieve";

/// How long a client should wait before retrying an overloaded or not-ready server.
const RETRY_AFTER: Duration = Duration::from_secs(1);

fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::Malformed | ErrorKind::Invalid | ErrorKind::UriTooLong | ErrorKind::UnsupportedMediaType => {
            Code::InvalidArgument
        }
        ErrorKind::TooLarge | ErrorKind::HeadersTooLarge => Code::OutOfRange,
        ErrorKind::Overloaded => Code::ResourceExhausted,
        ErrorKind::NotReady => Code::Unavailable,
        ErrorKind::DeadlineExceeded | ErrorKind::RequestTimeout => Code::DeadlineExceeded,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Unauthorized => Code::Unauthenticated,
        ErrorKind::Forbidden => Code::PermissionDenied,
        // On this port only a `model` no worker serves is not found (an unknown method is the
        // router's UNIMPLEMENTED).
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::MethodNotAllowed => Code::Unimplemented,
    }
}

/// The gRPC status of an API error.
pub fn to_status(e: &ApiError) -> Status {
    let mut details = ErrorDetails::new();
    let reason = serde_json::to_value(e.kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    details.set_error_info(reason, GRPC_ERROR_DOMAIN, HashMap::new());
    if matches!(e.kind, ErrorKind::Overloaded | ErrorKind::NotReady) {
        details.set_retry_info(Some(RETRY_AFTER));
    }
    Status::with_error_details(code(e.kind), e.message.clone(), details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code_the_message_and_the_details() {
        for (e, want, reason) in [
            (ApiError::malformed("m"), Code::InvalidArgument, "malformed"),
            (ApiError::invalid("query is empty"), Code::InvalidArgument, "invalid"),
            (ApiError::too_large("too many items"), Code::OutOfRange, "too_large"),
            (ApiError::overloaded("full"), Code::ResourceExhausted, "overloaded"),
            (ApiError::not_ready("draining"), Code::Unavailable, "not_ready"),
            (ApiError::deadline("late"), Code::DeadlineExceeded, "deadline_exceeded"),
            (ApiError::internal("bug"), Code::Internal, "internal"),
        ] {
            let s = to_status(&e);
            assert_eq!(s.code(), want, "{e}");
            assert_eq!(s.message(), e.message);
            let info = s.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.domain, GRPC_ERROR_DOMAIN);
            assert_eq!(info.reason, reason);
            let retry = s.get_details_retry_info();
            if e.kind.is_retryable() && e.kind != ErrorKind::Internal {
                assert_eq!(retry.and_then(|r| r.retry_delay), Some(RETRY_AFTER), "{e}");
            } else {
                assert!(retry.is_none(), "{e}");
            }
        }
    }
}
