//! The `Sieve` gRPC service over any [`ScoreService`]: the order and checks of the HTTP path
//! (`service::serve`) — admit, parse, deadline, limits, score, observe — on a decoded message.
//! The message size limit is the codec's (`max_decoding_message_size`, set in `server.rs`).
//!
//! Cancellation: hyper drops this call's future when the client resets its stream (or the
//! connection closes), and with it the `score` future, exactly as for an HTTP client that goes
//! away: the worker's drop guard cancels the engine's work, the proxy's attempts are dropped.

use std::sync::Arc;
use std::time::Duration;

// Tokio's clock, as the HTTP path's: the simulated worker's tests run with time paused.
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::{convert, deadline, pb, status};
use crate::service::{Call, Route, ScoreService, Scored};
use crate::{ApiError, ErrorKind, RerankResponse, ScoreRequest, ScoreResponse};

/// The gRPC API of one process: its [`ScoreService`] and the margin taken off gRPC deadlines.
pub struct GrpcApi<S> {
    svc: Arc<S>,
    deadline_margin: Duration,
}

impl<S> GrpcApi<S> {
    pub fn new(svc: Arc<S>, deadline_margin: Duration) -> Self {
        GrpcApi { svc, deadline_margin }
    }
}

impl<S: ScoreService + 'static> GrpcApi<S> {
    /// Admission, the deadline and the limits, then the scoring call: `service::serve` after
    /// its body read, for a request already converted (or refused by the conversion).
    async fn run(
        &self,
        meta: &MetadataMap,
        req: Result<ScoreRequest, ApiError>,
        field: &str,
        top_n: Option<usize>,
        arrival: Instant,
    ) -> Result<Scored, ApiError> {
        let svc = self.svc.as_ref();
        let limits = svc.limits();
        let _admitted = svc.admit()?;
        let mut req = req?;
        let grpc = deadline::from_metadata(meta, self.deadline_margin, &limits)?;
        req.deadline_ms = deadline::effective(req.deadline_ms, grpc);
        limits.check_as(&req, field)?;
        if top_n == Some(0) {
            return Err(ApiError::invalid("top_n must be at least 1"));
        }
        svc.score(req, Call { arrival }).await
    }

    /// The call's span, as `service::handle` opens one for an HTTP request: the caller's
    /// `traceparent` metadata its parent; the service finds it as `Span::current()` (the
    /// proxy's plan and shard attempts hang under it). `Span::none()` when tracing is off.
    fn span(&self, meta: &MetadataMap, route: Route) -> tracing::Span {
        crate::trace::grpc_server_span(meta, self.svc.span_name(), route.name())
    }

    /// Records the call as the HTTP path does (its HTTP status as the code) and turns the
    /// outcome into the gRPC answer, the service's own headers (the proxy's shard count) as
    /// response metadata.
    fn finish<T>(
        &self,
        route: Route,
        arrival: Instant,
        out: Result<Scored, ApiError>,
        to_message: impl FnOnce(ScoreResponse) -> T,
    ) -> Result<Response<T>, Status> {
        let code = match &out {
            Ok(_) => 200,
            Err(e) => e.status(),
        };
        self.svc.observe(route, code, arrival.elapsed());
        match out {
            Ok(Scored { response, headers }) => {
                let mut r = Response::new(to_message(response));
                *r.metadata_mut() = MetadataMap::from_headers(headers);
                Ok(r)
            }
            Err(e) => {
                if e.kind == ErrorKind::Internal {
                    tracing::warn!(route = route.name(), "gRPC call failed: {}", e.message);
                }
                Err(status::to_status(&e))
            }
        }
    }
}

#[tonic::async_trait]
impl<S: ScoreService + 'static> pb::sieve_server::Sieve for GrpcApi<S> {
    async fn score(&self, request: Request<pb::ScoreRequest>) -> Result<Response<pb::ScoreResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, msg) = request.into_parts();
        let span = self.span(&meta, Route::Score);
        async {
            let out = self.run(&meta, convert::score_request(msg), "items", None, arrival).await;
            self.finish(Route::Score, arrival, out, convert::score_response)
        }
        .instrument(span)
        .await
    }

    async fn rerank(&self, request: Request<pb::RerankRequest>) -> Result<Response<pb::RerankResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, msg) = request.into_parts();
        let span = self.span(&meta, Route::Rerank);
        async {
            let rerank = match convert::rerank_request(msg) {
                Ok(r) => r,
                Err(e) => return self.finish(Route::Rerank, arrival, Err(e), |_| pb::RerankResponse::default()),
            };
            let out = self.run(&meta, Ok(rerank.to_score_request()), "documents", rerank.top_n, arrival).await;
            self.finish(Route::Rerank, arrival, out, |s| {
                convert::rerank_response(RerankResponse::from_scores(&rerank, s))
            })
        }
        .instrument(span)
        .await
    }
}
