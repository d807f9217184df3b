//! The scoring API port: the shared API ([`sieve_server::service`]) over `run`, with the
//! worker's drain refusal and its metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::Request;
use sieve_server::service::{self, Call, Protocol, Route, ScoreService, Scored};
use sieve_shared::metrics_names::worker as m;
use sieve_shared::{ApiError, Limits, ScoreRequest, ScoreResponse, Timing, TruncationDirection};

use sieve_server::http::{ByteBudget, HttpResponse};

use super::AppState;
use crate::engine::{CancellationToken, Submission};

pub async fn handle(app: Arc<AppState>, req: Request<Incoming>) -> HttpResponse {
    service::handle(app.as_ref(), req).await
}

impl ScoreService for AppState {
    // The engine's own queue bounds do the overload refusal (429), inside `run`.
    type Admission<'a> = ();

    fn span_name(&self) -> &'static str {
        "worker"
    }

    fn limits(&self) -> Limits {
        self.limits.clone()
    }

    fn buffer_budget(&self) -> &ByteBudget {
        &self.buffer_budget
    }

    fn api_config(&self) -> sieve_shared::ApiConfig {
        self.api.clone()
    }

    fn served_models(&self) -> Vec<String> {
        self.model_name.get().cloned().into_iter().collect()
    }

    fn admit(&self) -> Result<(), ApiError> {
        if self.state.draining.load(Ordering::Acquire) {
            return Err(ApiError::not_ready("draining: not accepting new work"));
        }
        Ok(())
    }

    async fn score(&self, req: ScoreRequest<'_>, call: Call) -> Result<Scored, ApiError> {
        run(self, &req, call.arrival.into_std()).await.map(Scored::from)
    }

    fn observe(&self, protocol: Protocol, route: Route, status: u16, elapsed: Duration) {
        let (p, route) = (protocol.name(), route.name());
        if status >= 400 {
            metrics::counter!(m::REQUEST_ERRORS, "protocol" => p, "route" => route, "status" => status.to_string())
                .increment(1);
        }
        metrics::counter!(m::REQUESTS, "protocol" => p, "route" => route, "status" => status.to_string()).increment(1);
        metrics::histogram!(m::REQUEST_SECONDS, "protocol" => p, "route" => route).record(elapsed.as_secs_f64());
    }
}

/// Queues and awaits one scoring call (already validated by the shared API handler).
async fn run(app: &AppState, r: &ScoreRequest<'_>, arrived: Instant) -> Result<ScoreResponse, ApiError> {
    if app.state.draining.load(Ordering::Acquire) {
        return Err(ApiError::not_ready("draining: not accepting new work"));
    }
    let engine = app.engine.get().ok_or_else(|| {
        let why = app.state.load_error.lock().ok().and_then(|e| e.clone());
        ApiError::not_ready(match why {
            Some(e) => format!("the model failed to load: {e}"),
            None => "not ready: the model is loading".to_string(),
        })
    })?;
    let cancel = CancellationToken::new();
    // Dropped with this future when the caller goes away (hyper drops the handler's future when
    // the connection closes, even while it waits here): the engine then drops the call's work,
    // mid-pass at the next layer.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let ticket = engine.submit(Submission {
        query: r.query.to_string(),
        items: r.items.iter().map(|i| i.text().to_string()).collect(),
        instruction: r.instruction.as_deref().map(str::to_string),
        arrived,
        deadline: r.deadline_ms.map(Duration::from_millis),
        cancel,
        // The request's span (the API handler's), for the engine's spans.
        span: if sieve_server::trace::enabled() { tracing::Span::current() } else { tracing::Span::none() },
        truncate: r.max_item_tokens.map(|n| crate::prompt::Truncate {
            max_tokens: n.min(app.limits.max_item_tokens) as usize,
            left: r.truncation_direction == Some(TruncationDirection::Left),
        }),
    })?;
    // 504 at the deadline if the call has not started; partial scores (with `missing`) if it
    // was running.
    let out = ticket.wait().await?;
    let ids =
        r.items.iter().any(|i| i.id().is_some()).then(|| r.items.iter().map(|i| i.id().map(str::to_string)).collect());
    metrics::counter!(m::PAIRS).increment(out.usage.pairs as u64);
    metrics::counter!(m::TOKENS_COMPUTED).increment(out.usage.computed_tokens);
    metrics::counter!(m::PROMPT_TOKENS).increment(out.usage.prompt_tokens);
    metrics::histogram!(m::QUEUE_SECONDS).record(out.queue_ms / 1e3);
    Ok(ScoreResponse {
        scores: out.scores,
        ids,
        missing: out.missing,
        usage: out.usage,
        timing: Timing {
            queue_ms: out.queue_ms,
            compute_ms: out.compute_ms,
            total_ms: arrived.elapsed().as_secs_f64() * 1e3,
        },
        model: app.model_name.get().cloned().unwrap_or_default(),
        template: app.template_id.get().cloned().unwrap_or_default(),
    })
}
