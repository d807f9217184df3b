//! The scoring API port: the shared API ([`sieve_server::service`]) over the proxy's fan-out,
//! with the proxy's admission (drain, `max_in_flight_requests`), its metrics and its
//! `x-sieve-shards` header.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Request;
use sieve_server::http::{ByteBudget, HttpResponse};
use sieve_server::service::{self, Call, Protocol, Route, ScoreService, Scored};
use sieve_shared::{ApiError, Limits, ScoreRequest};

use crate::drain::Admitted;
use crate::metrics as m;
use crate::request;
use crate::state::AppState;

pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> HttpResponse {
    service::handle(&Api(state), req).await
}

/// `x-sieve-shards`, made once (a name given as a string is copied on every insert).
const SHARDS: HeaderName = HeaderName::from_static("x-sieve-shards");

/// A shard count as a header value, formatted on the stack (one allocation, not two).
fn count_header(n: usize) -> HeaderValue {
    sieve_server::http::formatted_header(format_args!("{n}")).unwrap_or_else(|| HeaderValue::from(n))
}

/// The proxy as a [`ScoreService`] (also served over gRPC, `sieve_server::grpc`).
pub(crate) struct Api(pub(crate) Arc<AppState>);

impl Api {
    /// Both entry points: a request built from owned strings (the rerank route, in-process
    /// callers) has an empty `body`; one parsed in place keeps the body its items point into.
    async fn scored(&self, body: Bytes, req: ScoreRequest<'_>, call: Call) -> Result<Scored, ApiError> {
        let (response, stats) = request::score(&self.0, body, req, call.arrival.into_std()).await?;
        let mut scored = Scored::from(response);
        scored.headers.insert(SHARDS, count_header(stats.shards));
        // `x-sieve-missing` (the unscored indices) is the shared API's, on every route.
        Ok(scored)
    }
}

impl ScoreService for Api {
    type Admission<'a> = Admitted<'a>;

    fn span_name(&self) -> &'static str {
        "proxy"
    }

    fn limits(&self) -> Limits {
        self.0.config().limits.clone()
    }

    fn buffer_budget(&self) -> &ByteBudget {
        &self.0.buffer_budget
    }

    fn api_config(&self) -> sieve_shared::ApiConfig {
        self.0.config().api.clone()
    }

    /// The models the workers report (each once; none before a health check saw one).
    fn served_models(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for w in self.0.pool.snapshot().iter() {
            if let Some(r) = &w.state().reported {
                if !r.stats.model.is_empty() && !names.contains(&r.stats.model) {
                    names.push(r.stats.model.clone());
                }
            }
        }
        names
    }

    fn admit(&self) -> Result<Admitted<'_>, ApiError> {
        self.0.drain.admit(self.0.config().server.max_in_flight_requests)
    }

    async fn score(&self, req: ScoreRequest<'static>, call: Call) -> Result<Scored, ApiError> {
        self.scored(Bytes::new(), req, call).await
    }

    async fn score_in_place<'a>(&'a self, body: Bytes, req: ScoreRequest<'a>, call: Call) -> Result<Scored, ApiError> {
        self.scored(body, req, call).await
    }

    fn observe(&self, protocol: Protocol, route: Route, status: u16, elapsed: Duration) {
        let (p, r) = (protocol.name(), route.name());
        metrics::counter!(m::REQUESTS, "protocol" => p, "route" => r, "code" => status.to_string()).increment(1);
        metrics::histogram!(m::REQUEST_SECONDS, "protocol" => p, "route" => r).record(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_counts_are_header_values_as_formatted() {
        for n in [0, 1, 4, 16, 17, 1000] {
            assert_eq!(count_header(n), HeaderValue::from(n), "{n}");
        }
    }
}
