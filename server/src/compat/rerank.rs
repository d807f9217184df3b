//! `POST /v1/rerank` (and `/v2/rerank`): the shape Cohere (v1 and v2), Jina and vLLM share.
//!
//! Request fields ([`RerankRequest`]) and what Sieve does with them:
//!
//! - `query`, `documents`, `top_n` (at least 1; absent = every document; vLLM's `0` for "all"
//!   is refused with 422, as Cohere refuses it: leave it out instead): as Cohere, Jina and vLLM
//!   define them. A document is a string or an object: its `id` (a string or number, when
//!   given) is echoed in its result; the text scored is its `text`, or with `rank_fields`
//!   (Cohere v1) the fields named, in order: one field's value as is, several as `field: value`
//!   lines (Cohere's form). A named field that is missing is refused with 422 by name.
//! - `return_documents`: absent or `true`, each result carries `document` (`{"text", ..an
//!   object's other fields}`): vLLM's results always do and Jina's by default; `false`
//!   (Cohere's SDKs send it when asked) leaves it out.
//! - `model`: checked against the served model's name and `[api] model_aliases` (404 naming
//!   the served model on a mismatch), or accepted whatever it says with `[api] check_model =
//!   false`; the answer names the served model.
//! - Truncation: `max_tokens_per_doc` (Cohere v2, Jina), `truncate_prompt_tokens` (vLLM; `-1`
//!   the server's limit), Sieve's `max_item_tokens` and `truncation_direction`: each document is
//!   cut to that many of its own tokens (at most `[limits] max_item_tokens`), and to what fits
//!   the model's context; the smallest cap given wins. Counted in `usage.truncated_items`.
//! - Refused with 422, since Sieve cannot honour them: `max_chunks_per_doc` (Cohere v1) — Sieve
//!   never chunks; `priority` (Cohere v2, vLLM) — Sieve orders work by deadline;
//!   `relevant_spans` (Cohere v2).
//! - Sieve's own: `instruction`, `deadline_ms`, `on_overload`, as on `/v1/score`.
//!
//! The answer is Sieve's rerank answer (`results` best first, each `{index, relevance_score,
//! document?: {text}}`; `missing`, `usage`, `timing`, `model`) plus what the clients read:
//! `id` (Cohere, Jina, vLLM), `usage.total_tokens` (Jina, vLLM), `meta` (Cohere: `api_version`,
//! "1" on `/v1/rerank` and vLLM's `/rerank`, "2" on `/v2/rerank`; `tokens.input_tokens`).

use serde::Serialize;
use sieve_shared::{ApiError, RerankRequest, RerankResponse, RerankResult, ScoreResponse, Timing, Usage};

use super::{refuse_if, response_id};

/// Refuses what the JSON asks for and Sieve cannot honour (after parsing, before the limits).
pub fn check(r: &RerankRequest) -> Result<(), ApiError> {
    let never = "Sieve never chunks a document: send max_tokens_per_doc to cut each one instead";
    refuse_if(r.max_chunks_per_doc.is_some(), "max_chunks_per_doc", never)?;
    if r.max_tokens_per_doc == Some(0) || r.truncate_prompt_tokens.is_some_and(|n| n == 0 || n < -1) {
        return Err(ApiError::invalid(
            "max_tokens_per_doc and truncate_prompt_tokens must be at least 1 (truncate_prompt_tokens: -1 for \
             the server's limit)",
        ));
    }
    refuse_if(r.priority.is_some(), "priority", "Sieve orders work by deadline (deadline_ms)")?;
    refuse_if(r.relevant_spans.is_some(), "relevant_spans", "Sieve scores whole documents")?;
    if r.rank_fields.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::invalid("rank_fields is empty: name the document fields to rank on, or leave it out"));
    }
    if r.top_n == Some(0) {
        return Err(ApiError::invalid("top_n must be at least 1"));
    }
    Ok(())
}

/// The `/v1/rerank` answer.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// Cohere's, Jina's and vLLM's response id.
    pub id: String,
    /// Scored documents, best first (ties: lower index first); at most `top_n`.
    pub results: Vec<RerankResult>,
    /// Indices the deadline left unscored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<usize>,
    pub usage: AnswerUsage,
    pub timing: Timing,
    pub model: String,
    /// Cohere's `meta`.
    pub meta: Meta,
}

/// Sieve's usage plus `total_tokens`, the field Jina and vLLM clients read.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerUsage {
    #[serde(flatten)]
    pub sieve: Usage,
    /// The prompt tokens: a rerank call generates none.
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub api_version: ApiVersion,
    pub tokens: MetaTokens,
}

#[derive(Debug, Clone, Serialize)]
pub struct ApiVersion {
    pub version: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetaTokens {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Which Cohere API a rerank route speaks (`meta.api_version.version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `/v1/rerank`, and vLLM's body on `/rerank`.
    V1,
    /// `/v2/rerank`.
    V2,
}

/// Sorts a score answer into the rerank answer.
pub fn answer(req: &RerankRequest, version: Version, resp: ScoreResponse) -> Answer {
    let RerankResponse { results, missing, usage, timing, model } = RerankResponse::from_scores(req, resp);
    let tokens = usage.prompt_tokens;
    Answer {
        id: response_id("rerank"),
        results,
        missing,
        usage: AnswerUsage { sieve: usage, total_tokens: tokens },
        timing,
        model,
        meta: Meta {
            api_version: ApiVersion {
                version: match version {
                    Version::V1 => "1",
                    Version::V2 => "2",
                },
            },
            tokens: MetaTokens { input_tokens: tokens, output_tokens: 0 },
        },
    }
}
