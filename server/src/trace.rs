//! Distributed tracing: the span exporter `[tracing]` asks for (`sieve_shared::trace_config`), W3C
//! `traceparent` in and out, and the span helper every hot path uses.
//!
//! Off by default (`otlp_endpoint = ""`): then [`enabled`] is false, [`span!`](crate::span)
//! gives `Span::none()` without evaluating its fields, and no request pays for tracing beyond
//! one relaxed atomic load per span site. On, spans go through `tracing-opentelemetry` to a
//! batch exporter that posts OTLP/protobuf over HTTP from its own thread.
//!
//! Spans cross threads by value, never by thread-local context: a worker's call carries its
//! request span into the engine's runner thread, which opens the forward-pass spans under it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use sieve_shared::trace_config::TracingConfig;
use tonic::metadata::{KeyRef, MetadataMap};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C trace-context request header.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: false unless an OTLP endpoint was configured and its exporter
/// started. Every span site checks this first.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Keeps the span exporter alive; dropping it sends the spans still buffered and stops it.
#[must_use = "dropping the guard stops span export"]
pub struct TraceGuard(Option<SdkTracerProvider>);

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            ENABLED.store(false, Ordering::Relaxed);
            if let Err(e) = p.shutdown() {
                eprintln!("tracing: flushing spans at exit failed: {e}");
            }
        }
    }
}

/// Builds the OTLP exporter and its tracer provider for `cfg` (`None` when tracing is off).
pub(crate) fn provider(cfg: &TracingConfig, default_service: &str) -> Result<Option<SdkTracerProvider>, String> {
    cfg.validate()?;
    let endpoint = cfg.otlp_endpoint.trim();
    if endpoint.is_empty() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_millis(cfg.export_timeout_ms))
        .build()
        .map_err(|e| format!("tracing: cannot build the OTLP exporter for {endpoint}: {e}"))?;
    let batch =
        BatchConfigBuilder::default().with_scheduled_delay(Duration::from_millis(cfg.export_interval_ms)).build();
    let service = if cfg.service_name.is_empty() { default_service } else { &cfg.service_name };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio))))
        .with_resource(opentelemetry_sdk::Resource::builder().with_service_name(service.to_string()).build())
        .build();
    Ok(Some(provider))
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
pub(crate) fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("sieve"))
}

/// Marks tracing on and returns the guard that keeps `provider` exporting.
pub(crate) fn started(provider: Option<SdkTracerProvider>) -> TraceGuard {
    if provider.is_some() {
        ENABLED.store(true, Ordering::Relaxed);
    }
    TraceGuard(provider)
}

/// An INFO span when tracing is on, else `Span::none()` with its fields never evaluated; the
/// arguments are `tracing::info_span!`'s (`parent: &span, "name", field = value, ...`).
#[macro_export]
macro_rules! span {
    ($($arg:tt)*) => {
        if $crate::trace::enabled() { ::tracing::info_span!($($arg)*) } else { ::tracing::Span::none() }
    };
}

/// The span a served HTTP request runs in: a SERVER span named `name`, with OpenTelemetry's
/// HTTP semantic-convention attributes (`http.request.method`, `http.route` = `path`,
/// `url.scheme`, and at the answer `http.response.status_code`, [`record_http_status`]) and the
/// API route as `sieve.route`; the child of the caller's `traceparent` when it sent a valid one,
/// else a new trace's root. `Span::none()` when tracing is off. A malformed `traceparent` is
/// ignored, as the W3C spec asks.
pub fn server_span(headers: &HeaderMap, name: &'static str, route: &'static str, path: &'static str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        parent: None,
        "request",
        otel.name = name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = "POST",
        http.route = path,
        url.scheme = "http",
        http.response.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        sieve.route = route,
    );
    with_parent(span, headers.contains_key(TRACEPARENT).then_some(&Headers(headers)))
}

/// [`server_span`] for a gRPC call: a SERVER span with the RPC semantic-convention attributes
/// (`rpc.system` = `grpc`, `rpc.service`, `rpc.method`, and at the answer
/// `rpc.grpc.status_code`, [`record_grpc_status`]). The caller's `traceparent` is read from its
/// metadata (gRPC clients send trace context as ordinary ASCII metadata, under the same key).
pub fn grpc_server_span(meta: &MetadataMap, name: &'static str, route: &'static str, method: &'static str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        parent: None,
        "request",
        otel.name = name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = GRPC_SERVICE,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        sieve.route = route,
    );
    with_parent(span, meta.contains_key(TRACEPARENT).then_some(&Metadata(meta)))
}

/// The gRPC service of `proto/sieve.proto`: `rpc.service` of its calls' spans.
pub const GRPC_SERVICE: &str = "sieve.v1.Sieve";

/// Records an HTTP answer's status on a SERVER or CLIENT span: `http.response.status_code` as
/// an integer, and for a failure (any 4xx or 5xx: a refused call did not get its scores) the
/// span's status ERROR with `error.type` = the code.
pub fn record_http_status(span: &Span, status: u16) {
    if span.is_none() {
        return;
    }
    span.record("http.response.status_code", i64::from(status));
    if status >= 400 {
        span.record("otel.status_code", "error");
        span.record("error.type", status.to_string().as_str());
    }
}

/// Records a gRPC answer's status code (0 = OK) on a SERVER span: `rpc.grpc.status_code` as an
/// integer, and for any other code the span's status ERROR with `error.type` = the code.
pub fn record_grpc_status(span: &Span, code: i32) {
    if span.is_none() {
        return;
    }
    span.record("rpc.grpc.status_code", i64::from(code));
    if code != 0 {
        span.record("otel.status_code", "error");
        span.record("error.type", code.to_string().as_str());
    }
}

/// Marks a span failed without a status code to record (a connection that failed, an answer
/// that could not be read): status ERROR, `error.type` = `kind`.
pub fn record_error(span: &Span, kind: &str) {
    if span.is_none() {
        return;
    }
    span.record("otel.status_code", "error");
    span.record("error.type", kind);
}

/// `span`, the child of the trace context in `carrier` when it holds a valid one.
fn with_parent(span: Span, carrier: Option<&dyn Extractor>) -> Span {
    if let Some(carrier) = carrier {
        let cx = TraceContextPropagator::new().extract(carrier);
        if cx.span().span_context().is_valid() {
            let _ = span.set_parent(cx);
        }
    }
    span
}

/// The `traceparent` that makes a callee's spans children of `span`; `None` when tracing is
/// off or `span` is not recorded.
pub fn traceparent(span: &Span) -> Option<HeaderValue> {
    if !enabled() || span.is_none() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    HeaderValue::from_str(&format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())).ok()
}

/// Reads W3C trace-context headers out of a hyper header map.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Reads W3C trace-context keys out of a gRPC call's metadata (binary `-bin` keys never carry
/// them).
struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_endpoint_is_off() {
        assert!(provider(&TracingConfig::default(), "x").unwrap().is_none());
    }

    #[test]
    fn off_means_no_span_and_no_header() {
        // Nothing in this test process turns tracing on.
        let mut evaluated = 0;
        let s = crate::span!(
            "x",
            field = {
                evaluated += 1;
                evaluated
            }
        );
        assert!(s.is_none());
        assert_eq!(evaluated, 0, "a span's fields are not evaluated when tracing is off");
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        assert!(server_span(&h, "proxy", "score", "/v1/score").is_none());
        assert!(grpc_server_span(&MetadataMap::from_headers(h), "proxy", "score", "Score").is_none());
        record_http_status(&Span::none(), 422);
        record_grpc_status(&Span::none(), 3);
        assert!(traceparent(&Span::none()).is_none());
    }
}
