//! One attempt: a shard's call to one worker, a future polled in the shard's task holding the
//! worker's in-flight guard (dropping it closes the connection, so the worker drops the work), and
//! what its answer means: a usable score response or an error classified for the retry and
//! breaker decisions.

use std::sync::Arc;
use std::time::Instant;

use hyper::header::{HeaderName, HeaderValue};
use sieve_shared::api::headers;
use sieve_shared::{ApiError, ErrorKind, ScoreResponse};
use tracing::Instrument as _;

use super::in_flight::InFlight;
use crate::client::ClientError;
use crate::cluster::worker::Worker;
use crate::request::RequestCtx;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    Primary,
    Retry,
    Hedge,
}

impl AttemptKind {
    /// The `kind` of the attempt's span.
    pub fn name(self) -> &'static str {
        match self {
            AttemptKind::Primary => "primary",
            AttemptKind::Retry => "retry",
            AttemptKind::Hedge => "hedge",
        }
    }
}

#[derive(Debug)]
pub enum AttemptError {
    Client(ClientError),
    /// The worker answered with an error status.
    Api(ApiError),
    /// 200 with a body that is not a matching score response.
    BadResponse(String),
}

impl AttemptError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AttemptError::Client(ClientError::Connect(_)) => ErrorKind::NotReady,
            AttemptError::Client(_) | AttemptError::BadResponse(_) => ErrorKind::Internal,
            AttemptError::Api(e) => match e.kind {
                ErrorKind::NotFound | ErrorKind::MethodNotAllowed => ErrorKind::Internal,
                k => k,
            },
        }
    }

    /// Whether another worker might succeed.
    pub fn retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// Whether it says the worker is unhealthy (breaker food). Refusals (503 draining or
    /// loading, 429 full) and deadlines are the worker working as designed.
    pub fn is_worker_fault(&self) -> bool {
        match self {
            AttemptError::Client(_) | AttemptError::BadResponse(_) => true,
            // 404/405: the URL does not point at a worker (misconfiguration).
            AttemptError::Api(e) => {
                matches!(e.kind, ErrorKind::Internal | ErrorKind::NotFound | ErrorKind::MethodNotAllowed)
            }
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            AttemptError::Client(e) => Self::client_label(e),
            AttemptError::BadResponse(_) => "bad_response",
            AttemptError::Api(e) => match e.kind {
                ErrorKind::NotReady => "not_ready",
                ErrorKind::Overloaded => "overloaded",
                ErrorKind::DeadlineExceeded => "deadline",
                ErrorKind::Internal => "internal",
                _ => "client_error",
            },
        }
    }

    /// The `kind` label of a failure to get any answer.
    pub fn client_label(e: &ClientError) -> &'static str {
        match e {
            ClientError::Connect(_) => "connect",
            _ => "connection",
        }
    }

    pub fn into_api(self, worker: &str) -> ApiError {
        match self {
            AttemptError::Api(e) if !matches!(e.kind, ErrorKind::NotFound | ErrorKind::MethodNotAllowed) => e,
            AttemptError::Client(ClientError::Connect(e)) => {
                ApiError::not_ready(format!("no worker could take the shard; last: {worker}: {e}"))
            }
            other => ApiError::internal(format!("worker {worker}: {}", other.message())),
        }
    }

    pub fn message(&self) -> String {
        match self {
            AttemptError::Client(e) => e.to_string(),
            AttemptError::Api(e) => e.message.clone(),
            AttemptError::BadResponse(m) => m.clone(),
        }
    }
}

pub struct AttemptResult {
    pub worker: Arc<Worker>,
    pub kind: AttemptKind,
    pub sent: Instant,
    pub result: Result<ScoreResponse, AttemptError>,
}

/// The call's header names, made once (a name given as a string is copied per call).
const DEADLINE_MS: HeaderName = HeaderName::from_static(headers::DEADLINE_MS);
const TRACEPARENT: HeaderName = HeaderName::from_static(sieve_server::trace::TRACEPARENT);

/// `n` as a header value, written on the stack and copied once: `HeaderValue::from(u64)`
/// allocates a buffer and then a second, shrunk one.
fn number_header(n: u64) -> HeaderValue {
    sieve_server::http::formatted_header(format_args!("{n}")).unwrap_or_else(|| HeaderValue::from(n))
}

/// The worker's deadline for a call sent now: the request's time left, less the margin its
/// answer needs to come back and be merged ([`AnswerMargin`](crate::estimate::answer_margin)).
fn worker_deadline_ms(ctx: &RequestCtx) -> u64 {
    let left_ms = ctx.deadline.saturating_duration_since(Instant::now()).as_secs_f64() * 1e3;
    let margin_ms = ctx.state.answer_margin.margin_ms(left_ms);
    // Round up: a worker given 0 would refuse outright.
    ((left_ms - margin_ms).ceil() as u64).max(1)
}

async fn attempt(
    ctx: Arc<RequestCtx>,
    items: Arc<Vec<usize>>,
    worker: Arc<Worker>,
    kind: AttemptKind,
    predicted_ms: f64,
) -> AttemptResult {
    let guard = worker.begin(predicted_ms);
    let sent = Instant::now();
    let deadline_ms = worker_deadline_ms(&ctx);
    let body = ctx.wire.shard(&items, deadline_ms);
    // The attempt's span (a CLIENT child of the request's, with the HTTP client's semantic-
    // convention attributes); the worker's SERVER span is its child through the `traceparent`
    // header. Neither exists when tracing is off.
    let span = sieve_server::span!(
        parent: &ctx.span,
        "shard_attempt",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        http.request.method = "POST",
        server.address = worker.score_uri.host().unwrap_or_default(),
        server.port = i64::from(worker.score_uri.port_u16().unwrap_or(80)),
        url.full = %worker.score_uri,
        http.response.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        worker = worker.url(),
        items = items.len() as i64,
        kind = kind.name(),
        outcome = tracing::field::Empty,
    );
    let deadline_hdr = (DEADLINE_MS, number_header(deadline_ms));
    let sending = match sieve_server::trace::traceparent(&span) {
        None => ctx.state.client.post_json(&worker.score_uri, body, &[deadline_hdr]).await,
        Some(tp) => {
            let hdrs = [deadline_hdr, (TRACEPARENT, tp)];
            ctx.state.client.post_json(&worker.score_uri, body, &hdrs).instrument(span.clone()).await
        }
    };
    if !span.is_none() {
        match &sending {
            Ok(reply) => sieve_server::trace::record_http_status(&span, reply.status.as_u16()),
            Err(e) => sieve_server::trace::record_error(&span, AttemptError::client_label(e)),
        }
    }
    let result = match sending {
        Err(e) => Err(AttemptError::Client(e)),
        Ok(reply) if reply.status.is_success() => match serde_json::from_slice::<ScoreResponse>(&reply.body) {
            Ok(r) => check_shard_response(r, items.len()).map_err(AttemptError::BadResponse),
            Err(e) => Err(AttemptError::BadResponse(format!("unreadable score response: {e}"))),
        },
        Ok(reply) => Err(AttemptError::Api(ApiError::from_response(reply.status.as_u16(), &reply.body))),
    };
    // The worker's load is released only now that the body is read.
    drop(guard);
    if let Ok(r) = &result {
        // A worker that reports no time of its own teaches nothing of the answer's lag.
        if r.timing.total_ms > 0.0 {
            let elapsed_ms = sent.elapsed().as_secs_f64() * 1e3;
            ctx.state.answer_margin.record(elapsed_ms, r.timing.total_ms, deadline_ms as f64);
        }
    }
    if !span.is_none() {
        span.record("outcome", result.as_ref().map_or_else(AttemptError::label, |_| "ok"));
        if let Err(AttemptError::BadResponse(_)) = &result {
            sieve_server::trace::record_error(&span, "bad_response");
        }
    }
    AttemptResult { worker, kind, sent, result }
}

/// A worker's 200 is usable when it has one entry per item and a score wherever `missing` does
/// not list the index. A partial answer (the worker's deadline came first) is a success, never
/// retried: its `missing` items are reported as such. A null outside `missing` (how a NaN score
/// is written in JSON) means the worker's model is broken: the attempt failed, and the shard is
/// retried elsewhere like after a 500.
fn check_shard_response(r: ScoreResponse, n_items: usize) -> Result<ScoreResponse, String> {
    if r.scores.len() != n_items {
        return Err(format!("{} scores for a shard of {} items", r.scores.len(), n_items));
    }
    // The usual answer, complete: every score present, nothing to look up.
    if r.missing.is_empty() {
        return match r.scores.iter().position(Option::is_none) {
            Some(k) => Err(format!("no score for items[{k}] and it is not listed missing")),
            None => Ok(r),
        };
    }
    let mut listed = vec![false; n_items];
    for &k in &r.missing {
        match listed.get_mut(k) {
            Some(l) => *l = true,
            None => return Err(format!("missing index {k} in a shard of {n_items} items")),
        }
    }
    if let Some(k) = r.scores.iter().zip(&listed).position(|(s, &l)| s.is_none() && !l) {
        return Err(format!("no score for items[{k}] and it is not listed missing"));
    }
    Ok(r)
}

/// Counts the attempt on its worker and starts it (in the shard's task).
pub fn launch(
    set: &mut InFlight<AttemptResult>,
    ctx: &Arc<RequestCtx>,
    items: &Arc<Vec<usize>>,
    worker: Arc<Worker>,
    kind: AttemptKind,
    predicted_ms: f64,
) {
    worker.counters.shards.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    worker.counters.items.fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
    set.push(attempt(ctx.clone(), items.clone(), worker, kind, predicted_ms));
}

#[cfg(test)]
mod tests {
    use super::*;
    use sieve_shared::{Timing, Usage};

    fn response(scores: Vec<Option<f32>>, missing: Vec<usize>) -> ScoreResponse {
        ScoreResponse {
            scores,
            ids: None,
            missing,
            usage: Usage::default(),
            timing: Timing::default(),
            model: "m".into(),
            template: String::new(),
        }
    }

    #[test]
    fn numbers_are_header_values_as_hyper_writes_them() {
        for n in [0, 7, 250, 10_000, u64::MAX] {
            assert_eq!(number_header(n), HeaderValue::from(n), "{n}");
        }
    }

    #[test]
    fn a_partial_shard_is_a_success_and_a_stray_null_a_failure() {
        // The worker's deadline left items 1 and 2 unscored: usable as is (no retry).
        let partial = check_shard_response(response(vec![Some(0.5), None, None], vec![1, 2]), 3).unwrap();
        assert_eq!(partial.missing, vec![1, 2]);
        // A null nobody listed (a NaN written as JSON): a failed attempt, retryable elsewhere.
        let e = check_shard_response(response(vec![Some(0.5), None], vec![]), 2).unwrap_err();
        assert!(e.contains("items[1]"), "{e}");
        let err = AttemptError::BadResponse(e);
        assert!(err.retryable() && err.is_worker_fault());
        assert!(check_shard_response(response(vec![Some(0.5)], vec![3]), 1).is_err());
        assert!(check_shard_response(response(vec![Some(0.5)], vec![]), 2).is_err());
        // A worker's 500 (its non-finite-score error) is retried elsewhere and counts against it.
        let e500 = AttemptError::Api(ApiError::from_response(
            500,
            br#"{"error":{"type":"internal","code":500,"message":"non-finite score for items[0]"}}"#,
        ));
        assert!(e500.retryable() && e500.is_worker_fault());
    }
}
