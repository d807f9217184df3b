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
//! No Sieve fields are added to the body (a TEI client sends none): the deadline comes from the
//! `x-sieve-deadline-ms` header or the server's default. The answer is TEI's: a JSON array of
//! `{index, score, text?}`, best first (ties: lower index first); indices a deadline left
//! unscored are absent from it and listed in the `x-sieve-missing` header.

use serde::{Deserialize, Serialize};

use super::refuse_if;
use crate::{ApiError, Item, ScoreRequest, ScoreResponse, TruncationDirection};

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
    pub(super) fn parse(body: &[u8]) -> Result<(ScoreRequest, Rerank), ApiError> {
        let b: Body = ApiError::parse_json(body)?;
        refuse_if(
            b.raw_scores,
            "raw_scores: true",
            "Sieve serves the sigmoid of the relevance logit, in (0, 1) (TEI's raw_scores: false)",
        )?;
        let texts = b.return_text.then(|| b.texts.clone());
        let items = b.texts.into_iter().map(Item::Text).collect();
        let req = ScoreRequest {
            // Any cap above the server's is the server's.
            max_item_tokens: (b.truncate == Some(true)).then_some(u32::MAX),
            truncation_direction: b.truncation_direction,
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
