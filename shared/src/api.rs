//! The scoring API on the wire. Worker and proxy serve exactly these shapes, so a worker can be
//! called directly and the proxy is transparent.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// One candidate item: either a bare string or an object with an optional id. Deserialized by
/// hand (not `untagged`) so an object with a misspelt or extra field is refused with an error
/// that names the field, instead of serde's "did not match any variant".
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Item {
    Text(String),
    Object {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        text: String,
    },
}

/// The object form of an item, strict about its fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemObject {
    #[serde(default)]
    id: Option<String>,
    text: String,
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;

        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an item: a string, or an object with `text` and an optional `id`")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Item, E> {
                Ok(Item::Text(s.to_string()))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Item, E> {
                Ok(Item::Text(s))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                let o = ItemObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Item::Object { id: o.id, text: o.text })
            }
        }

        d.deserialize_any(ItemVisitor)
    }
}

impl Item {
    pub fn text(&self) -> &str {
        match self {
            Item::Text(t) => t,
            Item::Object { text, .. } => text,
        }
    }

    pub fn id(&self) -> Option<&str> {
        match self {
            Item::Text(_) => None,
            Item::Object { id, .. } => id.as_deref(),
        }
    }
}

impl From<&str> for Item {
    fn from(s: &str) -> Self {
        Item::Text(s.to_string())
    }
}

impl From<String> for Item {
    fn from(s: String) -> Self {
        Item::Text(s)
    }
}

/// `POST /v1/score`: one query, M candidate items; one score per item, in input order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest {
    pub query: String,
    pub items: Vec<Item>,
    /// Task instruction placed in the prompt template; the model's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    /// Time budget for the whole call, in milliseconds from arrival. Work that cannot finish
    /// in time is dropped (worker: 504; proxy: partial answer with `missing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// What the proxy does when even its best plan cannot finish the request within the
    /// deadline: `reject` (429 with `Retry-After`, at once) or `partial` (score what can finish
    /// in time, list the rest in `missing`). Default `reject`. A worker accepts the field and
    /// ignores it: it already answers what its deadline allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overload: Option<OnOverload>,
}

/// The per-request overload policy (`on_overload`): what the proxy answers when admission
/// control predicts the deadline cannot be met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOverload {
    /// 429 with `Retry-After`, before any shard is sent.
    #[default]
    Reject,
    /// 200 with the items that can finish in time; the others listed in `missing`.
    Partial,
}

/// Token accounting for a call. `item_tokens` lets the proxy recalibrate its token estimator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Number of (query, item) pairs scored.
    pub pairs: u32,
    /// Sum over pairs of the full prompt length: what an engine without prefix sharing computes.
    pub prompt_tokens: u64,
    /// Tokens actually run through the model (the shared prefix once, cache hits not at all).
    pub computed_tokens: u64,
    /// Length in tokens of the prefix shared by every prompt of the call.
    pub prefix_tokens: u32,
    /// Prefix tokens served from the cross-batch prefix cache instead of being computed.
    #[serde(default)]
    pub cached_prefix_tokens: u32,
    /// Per item, in input order: tokens of the item's own segment (its prompt minus the prefix).
    #[serde(default)]
    pub item_tokens: Vec<u32>,
}

/// Where the time went, in milliseconds. Also sent as `x-sieve-*-ms` headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// From arrival until the first forward pass of this call started.
    pub queue_ms: f64,
    /// Time spent in forward passes for this call.
    pub compute_ms: f64,
    /// From arrival until the response was ready.
    pub total_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreResponse {
    /// One score per input item, in input order; `null` only for indices listed in `missing`.
    pub scores: Vec<Option<f32>>,
    /// Ids echoed back in input order, present when any item carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<Option<String>>>,
    /// Indices the deadline left unscored. Never silently absent: empty means complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<usize>,
    pub usage: Usage,
    #[serde(default)]
    pub timing: Timing,
    #[serde(default)]
    pub model: String,
}

/// `POST /v1/rerank` (and `/v2/rerank`), in the shape Cohere, Jina and vLLM share. What Sieve
/// does with each client field is in `compat::rerank`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<Item>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_n: Option<usize>,
    #[serde(default)]
    pub return_documents: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// As [`ScoreRequest::on_overload`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overload: Option<OnOverload>,
    /// Accepted for client compatibility; the served model is fixed per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Cohere v1: the document fields to rank on; only `["text"]` is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_fields: Option<Vec<String>>,
    /// Cohere v1, refused when set: Sieve does not chunk documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chunks_per_doc: Option<u64>,
    /// Cohere v2, refused when set: Sieve does not truncate documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_doc: Option<u64>,
    /// vLLM, refused when set: Sieve does not truncate prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate_prompt_tokens: Option<i64>,
    /// Cohere v2 and vLLM, refused when set: Sieve orders work by deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Cohere v2, refused when set: Sieve scores whole documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevant_spans: Option<serde_json::Value>,
}

impl RerankRequest {
    /// The equivalent score call: reranking is scoring followed by a sort.
    pub fn to_score_request(&self) -> ScoreRequest {
        ScoreRequest {
            query: self.query.clone(),
            items: self.documents.clone(),
            instruction: self.instruction.clone(),
            deadline_ms: self.deadline_ms,
            on_overload: self.on_overload,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankResult {
    pub index: usize,
    pub relevance_score: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankResponse {
    /// Scored documents, best first; at most `top_n`.
    pub results: Vec<RerankResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<usize>,
    pub usage: Usage,
    #[serde(default)]
    pub timing: Timing,
    #[serde(default)]
    pub model: String,
}

impl RerankResponse {
    /// Sorts a score response into rerank results (stable on ties: lower index first).
    pub fn from_scores(req: &RerankRequest, resp: ScoreResponse) -> Self {
        let mut results: Vec<RerankResult> = resp
            .scores
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                s.map(|relevance_score| RerankResult {
                    index,
                    relevance_score,
                    document: req
                        .return_documents
                        .then(|| RerankDocument { text: req.documents[index].text().to_string() }),
                })
            })
            .collect();
        results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score).then(a.index.cmp(&b.index)));
        if let Some(n) = req.top_n {
            results.truncate(n);
        }
        RerankResponse { results, missing: resp.missing, usage: resp.usage, timing: resp.timing, model: resp.model }
    }
}

/// Response header names for the timing breakdown.
pub mod headers {
    pub const QUEUE_MS: &str = "x-sieve-queue-ms";
    pub const COMPUTE_MS: &str = "x-sieve-compute-ms";
    pub const TOTAL_MS: &str = "x-sieve-total-ms";
    /// Deadline as an absolute budget left, in ms, propagated proxy → worker.
    pub const DEADLINE_MS: &str = "x-sieve-deadline-ms";
    /// Indices the deadline left unscored, comma-separated, on answers with any (the drop-in
    /// shapes whose body cannot say so, a bare array, carry it only here).
    pub const MISSING: &str = "x-sieve-missing";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_accept_strings_and_objects() {
        let req: ScoreRequest =
            serde_json::from_str(r#"{"query":"q","items":["a",{"id":"x","text":"b"},{"text":"c"}]}"#).unwrap();
        assert_eq!(req.items.len(), 3);
        assert_eq!(req.items[0].text(), "a");
        assert_eq!(req.items[1].id(), Some("x"));
        assert_eq!(req.items[2].id(), None);
        assert_eq!(req.items[2].text(), "c");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<ScoreRequest>(r#"{"query":"q","items":["a"],"itmes":[]}"#).is_err());
    }

    #[test]
    fn an_item_object_with_an_unknown_field_is_refused_by_name() {
        let e =
            serde_json::from_str::<ScoreRequest>(r#"{"query":"q","items":["a",{"text":"b","idd":"1"}]}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `idd`"), "{e}");
        let e = serde_json::from_str::<ScoreRequest>(r#"{"query":"q","items":[{"id":"x"}]}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `text`"), "{e}");
        let e = serde_json::from_str::<ScoreRequest>(r#"{"query":"q","items":[3]}"#).unwrap_err();
        assert!(e.to_string().contains("expected an item: a string, or an object"), "{e}");
    }

    #[test]
    fn on_overload_is_reject_or_partial_and_nothing_else() {
        let req: ScoreRequest = serde_json::from_str(r#"{"query":"q","items":["a"],"on_overload":"partial"}"#).unwrap();
        assert_eq!(req.on_overload, Some(OnOverload::Partial));
        let req: ScoreRequest = serde_json::from_str(r#"{"query":"q","items":["a"]}"#).unwrap();
        assert_eq!(req.on_overload.unwrap_or_default(), OnOverload::Reject);
        let e = serde_json::from_str::<RerankRequest>(r#"{"query":"q","documents":["a"],"on_overload":"drop"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown variant `drop`, expected `reject` or `partial`"), "{e}");
    }

    #[test]
    fn items_serialize_back_to_the_shape_they_came_in() {
        let items: Vec<Item> = serde_json::from_str(r#"["a",{"id":"x","text":"b"},{"text":"c"}]"#).unwrap();
        assert_eq!(serde_json::to_string(&items).unwrap(), r#"["a",{"id":"x","text":"b"},{"text":"c"}]"#);
    }

    #[test]
    fn rerank_sorts_best_first_and_truncates() {
        let req = RerankRequest {
            query: "q".into(),
            documents: vec!["a".into(), "b".into(), "c".into()],
            top_n: Some(2),
            return_documents: true,
            ..RerankRequest::default()
        };
        let resp = ScoreResponse {
            scores: vec![Some(0.1), Some(0.9), Some(0.9)],
            ids: None,
            missing: vec![],
            usage: Usage::default(),
            timing: Timing::default(),
            model: "m".into(),
        };
        let r = RerankResponse::from_scores(&req, resp);
        assert_eq!(r.results.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(r.results[0].document.as_ref().unwrap().text, "b");
    }
}
