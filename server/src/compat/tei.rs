//! `POST /rerank`: the text-embeddings-inference rerank shape.
//!
//! Request fields and what Sieve does with them:
//!
//! - `query`, `texts` (strings): the query and the items, as on `/v1/score`.
//! - `return_text` (default false): each answer entry carries its `text`.
//! - `raw_scores` (default false): false is what Sieve serves, the sigmoid of the relevance
//!   logit, in (0, 1); `true` (the logit itself) is refused with 422.
//! - `truncate` (default false): `true` cuts each text to the server's limit (`[limits]
//!   max_item_tokens`, and what fits the model's context) instead of refusing it (413); counted
//!   in the `usage.truncated_items` a TEI answer cannot carry, so in the worker's metrics only.
//! - `truncation_direction` (`Left` | `Right`, either case; default `Right`): which end is cut.
//!
//! - `model` (not TEI's: some clients send it): checked as on every route (`[api]`).
//!
//! No Sieve fields are added to the body (a TEI client sends none): the deadline comes from the
//! `x-sieve-deadline-ms` header or the server's default. The answer is TEI's: a JSON array of
//! `{index, score, text?}`, best first (ties: lower index first); indices a deadline left
//! unscored are absent from it and listed in the `x-sieve-missing` header.
//!
//! Errors are TEI's too ([`error`]): `{"error": "...", "error_type": "..."}`, with TEI's status
//! for each type: `Validation` 422 (400 for JSON that does not parse, 413 for a body, an item
//! count or an item over a limit, 404/405 for a wrong route or method), `Overloaded` 429,
//! `Unhealthy` 503 (not ready, draining), `Backend` 424 (a failure inside the server) and 504
//! (the deadline passed: TEI has no deadline of its own).
//!
//! The same path serves vLLM's rerank body (`documents`, `model`, `top_n`, ...) when the body
//! has `documents` and no `texts` (`super::Shape::parse`): that one is answered, errors too, as
//! `/v1/rerank` answers.

use serde::{Deserialize, Serialize};

use bytes::Bytes;
use http_body_util::Full;
use hyper::StatusCode;
use sieve_shared::{ApiError, ErrorKind, Item, ScoreRequest, ScoreResponse, TruncationDirection};

use super::refuse_if;
use crate::http::{self, HttpResponse};

/// TEI's error body.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
    pub error_type: &'static str,
}

/// TEI's error type and status for an error of `kind`.
pub fn error_type(kind: ErrorKind) -> (u16, &'static str) {
    match kind {
        ErrorKind::Overloaded => (429, "Overloaded"),
        ErrorKind::NotReady => (503, "Unhealthy"),
        ErrorKind::Internal => (424, "Backend"),
        ErrorKind::DeadlineExceeded => (504, "Backend"),
        other => (other.status(), "Validation"),
    }
}

/// An error as TEI answers it, with the headers Sieve's answer has (`Retry-After`, ...).
pub fn error(e: &ApiError) -> HttpResponse {
    let (status, error_type) = error_type(e.kind);
    let mut r = http::error(e);
    let body = serde_json::to_vec(&ErrorBody { error: &e.message, error_type }).unwrap_or_default();
    *r.body_mut() = Full::new(Bytes::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// The request, as TEI defines it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    query: String,
    texts: Vec<String>,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<TruncationDirection>,
    #[serde(default)]
    model: Option<String>,
}

/// What the answer needs of the request: the texts, when they are to be echoed.
#[derive(Debug, Clone)]
pub struct Rerank {
    texts: Option<Vec<String>>,
}

/// One entry of the answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rank {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

impl Rerank {
    pub(super) fn parse(body: &[u8]) -> Result<(ScoreRequest<'static>, Rerank), ApiError> {
        let b: Body = ApiError::parse_json(body)?;
        refuse_if(
            b.raw_scores,
            "raw_scores: true",
            "Sieve serves the sigmoid of the relevance logit, in (0, 1) (TEI's raw_scores: false)",
        )?;
        let texts = b.return_text.then(|| b.texts.clone());
        let items = b.texts.into_iter().map(Item::from).collect();
        let req = ScoreRequest {
            // Any cap above the server's is the server's.
            max_item_tokens: (b.truncate == Some(true)).then_some(u32::MAX),
            truncation_direction: b.truncation_direction,
            model: b.model.map(Into::into),
            ..ScoreRequest::new(b.query, items)
        };
        Ok((req, Rerank { texts }))
    }

    /// The scored texts, best first.
    pub fn answer(self, resp: ScoreResponse) -> Vec<Rank> {
        let mut texts = self.texts;
        let mut ranks: Vec<Rank> = resp
            .scores
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                let text = texts.as_mut().and_then(|t| t.get_mut(index)).map(std::mem::take);
                s.map(|score| Rank { index, text, score })
            })
            .collect();
        ranks.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.index.cmp(&b.index)));
        ranks
    }
}
