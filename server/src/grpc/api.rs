//! The `Sieve` gRPC service over any [`ScoreService`]: the order and checks of the HTTP path
//! (`service::serve`) — admit, parse, deadline, limits, score, observe — on a decoded message.
//! The message size limit is the codec's (`max_decoding_message_size`, set in `server.rs`).
//!
//! `Score` and `Rerank` are served by [`RawScore`] and [`RawRerank`]: the message arrives as its
//! bytes (`wire.rs`) and is decoded here, so a malformed one is INVALID_ARGUMENT. The generated
//! `Sieve` methods stay for a caller that mounts `SieveServer` on its own.
//!
//! Cancellation: hyper drops this call's future when the client resets its stream (or the
//! connection closes), and with it the `score` future, exactly as for an HTTP client that goes
//! away: the worker's drop guard cancels the engine's work, the proxy's attempts are dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sieve_shared::{ApiError, ErrorKind, RerankResponse, ScoreRequest, ScoreResponse};

// Tokio's clock, as the HTTP path's: the simulated worker's tests run with time paused.
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::{convert, deadline, pb, status, wire};
use crate::service::{Call, Route, ScoreService, Scored};

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
        req: Result<ScoreRequest<'static>, ApiError>,
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

    /// `Score` on its message's raw bytes: a message that does not decode is INVALID_ARGUMENT
    /// (as a malformed JSON body is 400), counted as any answered call.
    async fn score_raw(&self, request: Request<Bytes>) -> Result<Response<pb::ScoreResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, msg) = request.into_parts();
        let req = wire::decode(msg, "ScoreRequest").and_then(convert::score_request);
        self.score_msg(meta, req, arrival).await
    }

    async fn score_msg(
        &self,
        meta: MetadataMap,
        req: Result<ScoreRequest<'static>, ApiError>,
        arrival: Instant,
    ) -> Result<Response<pb::ScoreResponse>, Status> {
        let span = self.span(&meta, Route::Score);
        async {
            let out = self.run(&meta, req, "items", None, arrival).await;
            self.finish(Route::Score, arrival, out, convert::score_response)
        }
        .instrument(span)
        .await
    }

    /// The call's span, as `service::handle` opens one for an HTTP request: the caller's
    /// `traceparent` metadata its parent; the service finds it as `Span::current()` (the
    /// proxy's plan and shard attempts hang under it). `Span::none()` when tracing is off.
    fn span(&self, meta: &MetadataMap, route: Route) -> tracing::Span {
        let method = match route {
            Route::Rerank => "Rerank",
            _ => "Score",
        };
        crate::trace::grpc_server_span(meta, self.svc.span_name(), route.name(), method)
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
        self.svc.observe(crate::service::Protocol::Grpc, route, code, arrival.elapsed());
        // Run inside the call's span (`instrument`): the current span is the call's.
        let span = if crate::trace::enabled() { tracing::Span::current() } else { tracing::Span::none() };
        match out {
            Ok(Scored { response, headers }) => {
                crate::trace::record_grpc_status(&span, 0);
                let mut r = Response::new(to_message(response));
                *r.metadata_mut() = MetadataMap::from_headers(headers);
                Ok(r)
            }
            Err(e) => {
                if e.kind == ErrorKind::Internal {
                    tracing::warn!(route = route.name(), "gRPC call failed: {}", e.message);
                }
                let status = status::to_status(&e);
                crate::trace::record_grpc_status(&span, status.code() as i32);
                Err(status)
            }
        }
    }
}

#[tonic::async_trait]
impl<S: ScoreService + 'static> pb::sieve_server::Sieve for GrpcApi<S> {
    async fn score(&self, request: Request<pb::ScoreRequest>) -> Result<Response<pb::ScoreResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, msg) = request.into_parts();
        self.score_msg(meta, convert::score_request(msg), arrival).await
    }

    async fn rerank(&self, request: Request<pb::RerankRequest>) -> Result<Response<pb::RerankResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, msg) = request.into_parts();
        self.rerank_msg(meta, Ok(msg), arrival).await
    }
}

impl<S: ScoreService + 'static> GrpcApi<S> {
    /// `Rerank` on its message's raw bytes: a message that does not decode is INVALID_ARGUMENT
    /// (as a malformed JSON body is 400), counted as any answered call.
    async fn rerank_raw(&self, request: Request<Bytes>) -> Result<Response<pb::RerankResponse>, Status> {
        let arrival = Instant::now();
        let (meta, _, bytes) = request.into_parts();
        let msg = wire::decode(bytes, "RerankRequest");
        self.rerank_msg(meta, msg, arrival).await
    }

    async fn rerank_msg(
        &self,
        meta: MetadataMap,
        msg: Result<pb::RerankRequest, ApiError>,
        arrival: Instant,
    ) -> Result<Response<pb::RerankResponse>, Status> {
        let span = self.span(&meta, Route::Rerank);
        async {
            // `model`, when named, must be one served (or an alias), as on the HTTP routes.
            let checked = msg.and_then(convert::rerank_request).and_then(|r| match &r.model {
                Some(m) => self.svc.api_config().check_model(m, &self.svc.served_models()).map(|()| r),
                None => Ok(r),
            });
            let rerank = match checked {
                Ok(r) => r,
                Err(e) => return self.finish(Route::Rerank, arrival, Err(e), |_| pb::RerankResponse::default()),
            };
            let out = self.run(&meta, rerank.to_score_request(), "documents", rerank.top_n, arrival).await;
            self.finish(Route::Rerank, arrival, out, |s| {
                convert::rerank_response(RerankResponse::from_scores(&rerank, s))
            })
        }
        .instrument(span)
        .await
    }
}

/// `Rerank` as tonic's unary call over [`wire::RawRerankCodec`]: the message decoded here, so a
/// malformed one is INVALID_ARGUMENT and counted (the generated route's codec answers INTERNAL
/// before the call is seen).
pub(super) struct RawRerank<S>(pub(super) Arc<GrpcApi<S>>);

impl<S: ScoreService + 'static> tonic::server::UnaryService<Bytes> for RawRerank<S> {
    type Response = pb::RerankResponse;
    type Future = Pin<Box<dyn Future<Output = Result<Response<pb::RerankResponse>, Status>> + Send>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.rerank_raw(request).await })
    }
}

/// `Score` as tonic's unary call over [`wire::RawScoreCodec`]: tonic does the framing, the size
/// limit and the status; the message arrives as its bytes.
pub(super) struct RawScore<S>(pub(super) Arc<GrpcApi<S>>);

impl<S: ScoreService + 'static> tonic::server::UnaryService<Bytes> for RawScore<S> {
    type Response = pb::ScoreResponse;
    type Future = Pin<Box<dyn Future<Output = Result<Response<pb::ScoreResponse>, Status>> + Send>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.score_raw(request).await })
    }
}
