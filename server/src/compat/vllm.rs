//! `POST /score`: vLLM's score shape (`text_1` against `text_2`).
//!
//! Request fields and what Sieve does with them:
//!
//! - `text_1`: the query, a string or a list. Sieve scores one query against many items per
//!   call, so a list must be one string, or as many copies of one string as `text_2` has entries
//!   (vLLM's pairwise form, with every pair sharing its query); different queries in one call are
//!   refused with 422 (send one call per query).
//! - `text_2`: the items, a string or a list.
//! - `model`: checked against the served model and `[api] model_aliases` (404 naming the
//!   served model on a mismatch; `[api] check_model = false` accepts any); the answer names
//!   the served model.
//! - `truncate_prompt_tokens`: each `text_2` entry cut to that many of its own tokens (`-1`:
//!   the server's limit, `[limits] max_item_tokens`), and to what fits the model's context.
//! - `priority`: refused with 422 when set: Sieve orders work by deadline.
//!
//! The deadline comes from the `x-sieve-deadline-ms` header or the server's default. The answer
//! is vLLM's: `{id, object: "list", created, model, data: [{index, object: "score", score}],
//! usage: {prompt_tokens, total_tokens, completion_tokens}}`, `data` in input order; indices a
//! deadline left unscored are absent from `data` and listed in `missing` (and the
//! `x-sieve-missing` header).

use serde::{Deserialize, Serialize};
use sieve_shared::{ApiError, Item, ScoreRequest, ScoreResponse};

use super::{refuse_if, response_id, unix_seconds};

/// A string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(s) => vec![s],
            Texts::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    model: Option<String>,
    text_1: Texts,
    text_2: Texts,
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
    #[serde(default)]
    priority: Option<i64>,
}

/// The score call, as vLLM's clients see it.
#[derive(Debug, Clone)]
pub struct Score;

#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<Datum>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<usize>,
    usage: AnswerUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Datum {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

/// OpenAI-style token usage: Sieve's prompt tokens are what the model read; it generates none.
#[derive(Debug, Clone, Serialize)]
struct AnswerUsage {
    prompt_tokens: u64,
    total_tokens: u64,
    completion_tokens: u64,
}

impl Score {
    pub(super) fn parse(body: &[u8]) -> Result<(ScoreRequest<'static>, Score), ApiError> {
        let b: Body = ApiError::parse_json(body)?;
        let max_item_tokens = match b.truncate_prompt_tokens {
            None => None,
            Some(-1) => Some(u32::MAX),
            Some(n) if n >= 1 => Some(sieve_shared::api::clamp_u32(n as u64)),
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "truncate_prompt_tokens {n}: give at least 1, or -1 for the server's limit"
                )))
            }
        };
        refuse_if(b.priority.is_some(), "priority", "Sieve orders work by deadline")?;
        let queries = b.text_1.into_vec();
        let items: Vec<Item> = b.text_2.into_vec().into_iter().map(Item::from).collect();
        let Some(query) = queries.first().cloned() else {
            return Err(ApiError::invalid("text_1 is empty: one query is required"));
        };
        if queries.len() > 1 {
            if queries.len() != items.len() {
                return Err(ApiError::invalid(format!(
                    "text_1 has {} entries and text_2 {}: give one text_1, or one per text_2 entry",
                    queries.len(),
                    items.len()
                )));
            }
            if let Some(i) = queries.iter().position(|q| *q != query) {
                return Err(ApiError::invalid(format!(
                    "text_1[{i}] differs from text_1[0]: Sieve scores one query per call; send one call per query"
                )));
            }
        }
        Ok((ScoreRequest { max_item_tokens, model: b.model.map(Into::into), ..ScoreRequest::new(query, items) }, Score))
    }

    pub fn answer(self, resp: ScoreResponse) -> Answer {
        let data = resp
            .scores
            .iter()
            .enumerate()
            .filter_map(|(index, s)| s.map(|score| Datum { index, object: "score", score }))
            .collect();
        let tokens = resp.usage.prompt_tokens;
        Answer {
            id: response_id("score"),
            object: "list",
            created: unix_seconds(),
            model: resp.model,
            data,
            missing: resp.missing,
            usage: AnswerUsage { prompt_tokens: tokens, total_tokens: tokens, completion_tokens: 0 },
        }
    }
}
