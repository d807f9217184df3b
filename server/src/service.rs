//! The public scoring API, implemented once: routing, the bounded body read, admission, JSON
//! parsing, validation, the deadline, rerank conversion, errors and timing headers. The proxy,
//! the worker and the simulated worker each implement [`ScoreService`] (admission, scoring,
//! metrics) and route their API port to [`handle`], so they give the same answer and code to
//! every request.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, ALLOW, CONNECTION};
use hyper::{Method, Request};
use sieve_shared::api::headers;
use sieve_shared::{ApiConfig, ApiError, ErrorKind, Limits, ScoreRequest, ScoreResponse, Timing};
// Tokio's clock, so the simulated worker's tests can run with time paused.
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::body_encoding;
pub use crate::compat::Route;
use crate::compat::{self, Shape};
use crate::http::{self, read_body_reserved, ByteBudget, HttpResponse};

/// Every API path with its route.
const ROUTES: [(&str, Route); 5] = [
    ("/v1/score", Route::Score),
    ("/v1/rerank", Route::Rerank),
    ("/v2/rerank", Route::Rerank),
    ("/rerank", Route::TeiRerank),
    ("/score", Route::VllmScore),
];

/// The front end a request came through: the `protocol` label of the request metrics, apart
/// from the `route` label (a gRPC `Score` call and a `POST /v1/score` share the route `score`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The HTTP/JSON API port.
    Http,
    /// The gRPC port (`proto/sieve.proto`).
    Grpc,
}

impl Protocol {
    /// Both, in label order.
    pub const ALL: [Protocol; 2] = [Protocol::Http, Protocol::Grpc];

    /// The `protocol` label.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// What a scoring call knows besides its request.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// When the request arrived (before its body was read): queue time and the deadline count
    /// from here.
    pub arrival: Instant,
}

/// A score answer, with any response headers of the service's own (the proxy's shard count).
#[derive(Debug, Clone)]
pub struct Scored {
    pub response: ScoreResponse,
    pub headers: HeaderMap,
}

impl From<ScoreResponse> for Scored {
    fn from(response: ScoreResponse) -> Self {
        Scored { response, headers: HeaderMap::new() }
    }
}

/// What a server supplies to [`handle`]: its limits, its admission, its scoring call and its
/// metrics. Everything else about the API is shared.
pub trait ScoreService: Send + Sync {
    /// Held from admission until the response is built (the proxy's in-flight count).
    type Admission<'a>: Send
    where
        Self: 'a;

    /// The limits in force now (the proxy's config reloads while running).
    fn limits(&self) -> Limits;

    /// The process's budget for request bytes in memory (`[http] max_buffered_bytes`), one for
    /// all its API ports: a body or message counts against it from its first byte until its
    /// answer.
    fn buffer_budget(&self) -> &ByteBudget;

    /// Called once the body is read, before it is parsed: draining (503) or overloaded (429)
    /// refuse here, so a client that stalls its body holds no admission slot.
    fn admit(&self) -> Result<Self::Admission<'_>, ApiError>;

    /// Scores a parsed and validated request (`deadline_ms` already taken from the header when
    /// the body had none).
    fn score(&self, req: ScoreRequest<'static>, call: Call) -> impl Future<Output = Result<Scored, ApiError>> + Send;

    /// Scores a `POST /v1/score` request as parsed in place: `req`'s borrowed strings point
    /// into `body` (validated as for [`score`](Self::score)). The default makes the request
    /// owned and calls `score`; the proxy overrides it to forward items as the bytes they came
    /// in.
    fn score_in_place<'a>(
        &'a self,
        body: Bytes,
        req: ScoreRequest<'a>,
        call: Call,
    ) -> impl Future<Output = Result<Scored, ApiError>> + Send + 'a {
        drop(body);
        self.score(req.into_owned(), call)
    }

    /// `[api]`: the model names accepted and the CORS origins (default: the defaults).
    fn api_config(&self) -> ApiConfig {
        ApiConfig::default()
    }

    /// The names of the models served (the proxy: those its workers report); empty while none
    /// is known, when a request's `model` is not checked.
    fn served_models(&self) -> Vec<String> {
        Vec::new()
    }

    /// Records one answered request (not 404/405) in the service's metrics.
    fn observe(&self, _protocol: Protocol, _route: Route, _status: u16, _elapsed: Duration) {}

    /// The name of the span a request runs in when tracing is on (`proxy`, `worker`, ...).
    fn span_name(&self) -> &'static str {
        "request"
    }
}

/// Serves one request of the API port: `POST /v1/score`, `POST /v1/rerank`, and the drop-in
/// routes (`/v2/rerank`, `/rerank`, `/score`); behind tower-http's CORS layer when `[api]
/// cors_allow_origins` names any.
pub async fn handle<S: ScoreService>(svc: &S, req: Request<Incoming>) -> HttpResponse {
    let api = svc.api_config();
    if api.cors_allow_origins.is_empty() {
        return handle_api(svc, &api, req).await;
    }
    use tower::{Layer as _, ServiceExt as _};
    let inner = tower::service_fn(|req| {
        let api = &api;
        async move { Ok::<_, std::convert::Infallible>(handle_api(svc, api, req).await) }
    });
    match cors(&api.cors_allow_origins).layer(inner).oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// The CORS layer for `origins` (`"*"`: any): POST from those origins, with any request
/// header, Sieve's response headers readable by the page.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    let expose = [headers::QUEUE_MS, headers::COMPUTE_MS, headers::TOTAL_MS, headers::MISSING, "x-sieve-shards"]
        .map(HeaderName::from_static);
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::POST])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(expose)
        .max_age(Duration::from_secs(600))
}

/// How a route answers errors: Sieve's body, or TEI's on its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorStyle {
    Sieve,
    Tei,
}

impl ErrorStyle {
    fn of(route: Route) -> Self {
        if route == Route::TeiRerank {
            ErrorStyle::Tei
        } else {
            ErrorStyle::Sieve
        }
    }

    fn answer(self, e: &ApiError) -> HttpResponse {
        match self {
            ErrorStyle::Sieve => http::error(e),
            ErrorStyle::Tei => compat::tei::error(e),
        }
    }
}

async fn handle_api<S: ScoreService>(svc: &S, api: &ApiConfig, req: Request<Incoming>) -> HttpResponse {
    let arrival = Instant::now();
    let path = req.uri().path();
    let (path, route) = match (req.method(), ROUTES.iter().find(|(p, _)| *p == path)) {
        (&Method::POST, Some(&(path, route))) => (path, route),
        (_, Some(&(_, route))) => {
            let e = ApiError::new(ErrorKind::MethodNotAllowed, format!("{path} needs POST"));
            let mut r = ErrorStyle::of(route).answer(&e);
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        (_, None) => {
            let msg = format!("no route {path}; try POST /v1/score or POST /v1/rerank");
            return http::error(&ApiError::new(ErrorKind::NotFound, msg));
        }
    };
    let v2 = path == "/v2/rerank";
    // The request's span (the caller's `traceparent` its parent): `score` runs in it, so a
    // service finds it as `Span::current()`. `Span::none()`, free, when tracing is off.
    let span = crate::trace::server_span(req.headers(), svc.span_name(), route.name(), path);
    let mut style = ErrorStyle::of(route);
    let resp = match serve(svc, api, route, v2, req, arrival, &mut style).instrument(span.clone()).await {
        Ok(r) => r,
        Err(e) => {
            if e.kind == ErrorKind::Internal {
                tracing::warn!(route = route.name(), "request failed: {}", e.message);
            }
            style.answer(&e)
        }
    };
    let status = resp.status().as_u16();
    crate::trace::record_http_status(&span, status);
    svc.observe(Protocol::Http, route, status, arrival.elapsed());
    resp
}

async fn serve<S: ScoreService>(
    svc: &S,
    api: &ApiConfig,
    route: Route,
    v2: bool,
    req: Request<Incoming>,
    arrival: Instant,
    style: &mut ErrorStyle,
) -> Result<HttpResponse, ApiError> {
    let limits = svc.limits();
    let header_deadline = deadline_header(req.headers());
    // The rest of the body is not read after these: this connection cannot carry another request.
    let closing = |e: &ApiError, style: ErrorStyle| {
        let mut r = style.answer(e);
        r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        r
    };
    let encoding = match body_encoding::of(req.headers()) {
        Ok(enc) => enc,
        Err(e) => return Ok(closing(&e, *style)),
    };
    // The body's bytes count against the process's budget until the answer is built (this
    // function returns), whatever way it ends.
    let mut held = svc.buffer_budget().reservation();
    let body = match read_body_reserved(req, limits.max_body_bytes, &mut held).await {
        Ok(b) => b,
        Err(e) => return Ok(closing(&e, *style)),
    };
    let body = match encoding {
        None => body,
        Some(enc) => body_encoding::decode(enc, &body, limits.max_body_bytes, &mut held)?,
    };
    if route == Route::TeiRerank && compat::is_vllm_rerank(&body) {
        *style = ErrorStyle::Sieve;
    }
    // Admission only now: a body that never arrives holds no in-flight slot.
    let _admitted = svc.admit()?;
    let check_model = |model: Option<&str>| match model {
        Some(m) => api.check_model(m, &svc.served_models()),
        None => Ok(()),
    };
    // Sieve's own route, the hot path: parsed in place, strings borrowed from the body. vLLM
    // serves its score body on `/v1/score` too: a body that is not Sieve's but has vLLM's keys
    // is read as vLLM's (looked for only then, off the hot path).
    let in_place = match route {
        Route::Score => match ScoreRequest::parse(&body) {
            Ok(req) => Some(req),
            Err(_) if compat::is_vllm_score(&body) => None,
            Err(e) => return Err(e),
        },
        _ => None,
    };
    let route = if route == Route::Score && in_place.is_none() { Route::VllmScore } else { route };
    let (Scored { response, headers: extra }, shape) = match in_place {
        Some(mut req) => {
            check_model(req.model.as_deref())?;
            if req.deadline_ms.is_none() {
                req.deadline_ms = header_deadline.transpose()?;
            }
            limits.check_as(&req, "items")?;
            (svc.score_in_place(body.clone(), req, Call { arrival }).await?, Shape::Score)
        }
        // The drop-in shapes: converted to an owned call.
        None => {
            let (mut score_req, mut shape) = Shape::parse(route, &body)?;
            check_model(score_req.model.as_deref())?;
            if v2 {
                shape = shape.v2();
            }
            if score_req.deadline_ms.is_none() {
                score_req.deadline_ms = header_deadline.transpose()?;
            }
            limits.check_as(&score_req, shape.items_field())?;
            (svc.score(score_req.into_owned(), Call { arrival }).await?, shape)
        }
    };
    let timing = response.timing;
    let mut r = shape.respond(response);
    with_timing(r.headers_mut(), &timing);
    r.headers_mut().extend(extra);
    Ok(r)
}

/// The `x-sieve-deadline-ms` request header (the proxy sends it to workers; any client may):
/// the deadline of a body that gives none.
fn deadline_header(h: &HeaderMap) -> Option<Result<u64, ApiError>> {
    let v = h.get(headers::DEADLINE_MS)?;
    let parsed = v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok());
    Some(parsed.ok_or_else(|| {
        ApiError::invalid(format!(
            "{} header {:?} is not a whole number of milliseconds",
            headers::DEADLINE_MS,
            String::from_utf8_lossy(v.as_bytes())
        ))
    }))
}

fn with_timing(h: &mut HeaderMap, t: &Timing) {
    // Typed names made once: a name given as a string is copied into a new allocation on
    // every insert.
    const QUEUE_MS: HeaderName = HeaderName::from_static(headers::QUEUE_MS);
    const COMPUTE_MS: HeaderName = HeaderName::from_static(headers::COMPUTE_MS);
    const TOTAL_MS: HeaderName = HeaderName::from_static(headers::TOTAL_MS);
    for (name, v) in [(QUEUE_MS, t.queue_ms), (COMPUTE_MS, t.compute_ms), (TOTAL_MS, t.total_ms)] {
        // Formatted on the stack: no String per header per response.
        let hv = http::formatted_header(format_args!("{v:.3}"));
        if let Some(hv) = hv {
            h.insert(name, hv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(headers::DEADLINE_MS, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn the_deadline_header_is_whole_milliseconds_or_a_clear_error() {
        assert!(deadline_header(&HeaderMap::new()).is_none());
        assert_eq!(deadline_header(&with(" 250 ")).unwrap(), Ok(250));
        for bad in ["soon", "-5", "1.5", ""] {
            let e = deadline_header(&with(bad)).unwrap().unwrap_err();
            assert_eq!(e.status(), 422, "{bad:?}");
            assert!(e.message.contains(headers::DEADLINE_MS), "{}", e.message);
        }
    }
}
