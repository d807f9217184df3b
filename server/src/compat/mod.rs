//! The request and response shapes of the rerank servers people already have clients for, as
//! views of the one Sieve call: each shape parses into a [`ScoreRequest`] (so the same limits,
//! validation, deadline and errors apply) and turns the [`ScoreResponse`] back into its own
//! answer. The routes (their paths in `sieve_shared::service`):
//!
//! | route | shape | module |
//! |---|---|---|
//! | `POST /v1/score` | Sieve's own | (none) |
//! | `POST /v1/rerank`, `POST /v2/rerank` | Cohere v1/v2, Jina, vLLM rerank | [`rerank`] |
//! | `POST /rerank` | text-embeddings-inference (`texts`), or vLLM rerank (`documents`) | [`tei`], [`rerank`] |
//! | `POST /score` | vLLM score (`text_1`/`text_2`) | [`vllm`] |
//! | `POST /v1/score` with `text_1`/`text_2` | vLLM score (vLLM serves it there too) | [`vllm`] |
//!
//! What no shape can express in its own body (the TEI answer is a bare array) is sent as the
//! `x-sieve-missing` header: the indices the deadline left unscored, comma-separated. Object
//! answers carry them as a `missing` field too, as Sieve's own do. Errors are Sieve's JSON error
//! body with Sieve's codes on every route but TEI's: a `/rerank` body that is not vLLM's is
//! answered `{"error", "error_type"}` with TEI's codes ([`tei::error`]). Every route takes a
//! `model` field, checked against the served model (`[api]`, `sieve_shared::ApiConfig`).

pub mod rerank;
pub mod tei;
pub mod vllm;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::header::HeaderValue;
use hyper::StatusCode;
use sieve_shared::api::headers;
use sieve_shared::{ApiError, RerankRequest, ScoreRequest, ScoreResponse};

use crate::http::{self, HttpResponse};

/// The scoring routes: Sieve's own and the drop-in shapes of other servers (their paths:
/// `service::ROUTES`, which also names this type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/score`
    Score,
    /// `POST /v1/rerank`, `POST /v2/rerank` (Cohere, Jina, vLLM)
    Rerank,
    /// `POST /rerank` (text-embeddings-inference)
    TeiRerank,
    /// `POST /score` (vLLM)
    VllmScore,
}

impl Route {
    /// Every route (the fuzz target parses a body as each).
    pub const ALL: [Route; 4] = [Route::Score, Route::Rerank, Route::TeiRerank, Route::VllmScore];

    /// The `route` label of the per-crate metrics.
    pub fn name(self) -> &'static str {
        match self {
            Route::Score => "score",
            Route::Rerank => "rerank",
            Route::TeiRerank => "tei_rerank",
            Route::VllmScore => "vllm_score",
        }
    }
}

/// A parsed request in the shape its route speaks, kept until the answer is built.
#[derive(Debug)]
pub enum Shape {
    /// `POST /v1/score`: answered as is.
    Score,
    /// `POST /v1/rerank`, `/v2/rerank`, and vLLM's body on `/rerank`.
    Rerank(Box<RerankRequest>, rerank::Version),
    /// `POST /rerank` (text-embeddings-inference).
    Tei(tei::Rerank),
    /// `POST /score` (vLLM).
    VllmScore(vllm::Score),
}

impl Shape {
    /// Parses `body` as `route`'s shape into the equivalent Sieve call. Only what the JSON alone
    /// can tell is refused here (unknown fields, wrong types, options Sieve cannot honour); the
    /// limits are the caller's, through [`Limits::check_as`](sieve_shared::Limits::check_as) with
    /// [`items_field`](Self::items_field).
    pub fn parse(route: Route, body: &[u8]) -> Result<(ScoreRequest<'_>, Shape), ApiError> {
        Ok(match route {
            Route::Score => (ApiError::parse_json::<ScoreRequest>(body)?, Shape::Score),
            Route::Rerank => Self::rerank(body)?,
            Route::TeiRerank if is_vllm_rerank(body) => Self::rerank(body)?,
            Route::TeiRerank => {
                let (req, shape) = tei::Rerank::parse(body)?;
                (req, Shape::Tei(shape))
            }
            Route::VllmScore => {
                let (req, shape) = vllm::Score::parse(body)?;
                (req, Shape::VllmScore(shape))
            }
        })
    }

    fn rerank(body: &[u8]) -> Result<(ScoreRequest<'static>, Shape), ApiError> {
        let r: RerankRequest = ApiError::parse_json(body)?;
        rerank::check(&r)?;
        Ok((r.to_score_request()?, Shape::Rerank(Box::new(r), rerank::Version::V1)))
    }

    /// The same shape answering as Cohere's v2 API (`/v2/rerank`: `meta.api_version` "2").
    pub fn v2(self) -> Shape {
        match self {
            Shape::Rerank(r, _) => Shape::Rerank(r, rerank::Version::V2),
            other => other,
        }
    }

    /// What the request calls its items, for limit messages (`too many texts: 9 > max_items 8`).
    pub fn items_field(&self) -> &'static str {
        match self {
            Shape::Score => "items",
            Shape::Rerank(..) => "documents",
            Shape::Tei(_) => "texts",
            Shape::VllmScore(_) => "text_2",
        }
    }

    /// The answer, in this shape, to a scored request.
    pub fn respond(self, resp: ScoreResponse) -> HttpResponse {
        let missing = resp.missing.clone();
        let mut r = match self {
            Shape::Score => http::json_with_capacity(StatusCode::OK, &resp, resp.json_len_hint()),
            Shape::Rerank(req, version) => http::json(StatusCode::OK, &rerank::answer(&req, version, resp)),
            Shape::Tei(req) => http::json(StatusCode::OK, &req.answer(resp)),
            Shape::VllmScore(req) => http::json(StatusCode::OK, &req.answer(resp)),
        };
        if !missing.is_empty() {
            let list = missing.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
            if let Ok(v) = HeaderValue::from_str(&list) {
                r.headers_mut().insert(headers::MISSING, v);
            }
        }
        r
    }
}

/// Whether a `/rerank` body is vLLM's rerank (`documents`, and no TEI `texts`) rather than
/// TEI's: only the two keys are looked at, so a body that does not parse is TEI's (and refused
/// in TEI's shape).
pub fn is_vllm_rerank(body: &[u8]) -> bool {
    use serde::de::IgnoredAny;
    #[derive(serde::Deserialize)]
    struct Keys {
        texts: Option<IgnoredAny>,
        documents: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Keys>(body).is_ok_and(|k| k.texts.is_none() && k.documents.is_some())
}

/// Whether a `/v1/score` body that is not Sieve's is vLLM's score body (`text_1` and `text_2`):
/// vLLM serves it on `/v1/score` as on `/score`.
pub fn is_vllm_score(body: &[u8]) -> bool {
    use serde::de::IgnoredAny;
    #[derive(serde::Deserialize)]
    struct Keys {
        text_1: Option<IgnoredAny>,
        text_2: Option<IgnoredAny>,
        query: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Keys>(body).is_ok_and(|k| k.text_1.is_some() && k.text_2.is_some() && k.query.is_none())
}

/// Refuses an option Sieve cannot honour, naming it and saying why, instead of ignoring it.
fn refuse_if(set: bool, field: &str, why: &str) -> Result<(), ApiError> {
    if set {
        return Err(ApiError::invalid(format!("{field} is not supported: {why}")));
    }
    Ok(())
}

/// A response id unique within this process and unlikely to repeat across processes (start
/// time and process id in the high bits, a counter in the low ones): some clients log it.
fn response_id(prefix: &str) -> String {
    static BASE: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 40)
    });
    format!("{prefix}-{base:016x}{:08x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Seconds since the Unix epoch (vLLM's `created`).
fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
