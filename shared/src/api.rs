//! The scoring API on the wire. Worker and proxy serve exactly these shapes, so a worker can be
//! called directly and the proxy is transparent.
//!
//! A score request is one type, [`ScoreRequest`]: its texts borrow from the body wherever their
//! JSON had no escapes (`Cow::Borrowed`), so a 100-item call allocates for its item vector, not
//! for each text; built from owned strings (a gRPC message, a drop-in shape) it is
//! `ScoreRequest<'static>`. `POST /v1/score` bodies are read by a scanner made for the shape
//! (`score_scan.rs`, `ScoreRequest::parse`), with serde behind it for anything else.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::ApiError;

/// One candidate item: either a bare string or an object with an optional id. Deserialized by
/// hand (not `untagged`) so an object with a misspelt or extra field is refused with an error
/// that names the field, instead of serde's "did not match any variant".
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Item<'a> {
    Text(Cow<'a, str>),
    Object {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Cow<'a, str>>,
        text: Cow<'a, str>,
    },
}

/// The object form of an item, strict about its fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemObject<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Cow<'a, str>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for ItemVisitor<'a> {
            type Value = Item<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an item: a string, or an object with `text` and an optional `id`")
            }

            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Item<'a>, E> {
                Ok(Item::Text(Cow::Borrowed(s)))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Item<'a>, E> {
                Ok(Item::Text(Cow::Owned(s.to_string())))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Item<'a>, E> {
                Ok(Item::Text(Cow::Owned(s)))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item<'a>, A::Error> {
                let o = ItemObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Item::Object { id: o.id, text: o.text })
            }
        }

        d.deserialize_any(ItemVisitor(std::marker::PhantomData))
    }
}

impl Item<'_> {
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

    /// The same item holding its own strings.
    pub fn into_owned(self) -> Item<'static> {
        match self {
            Item::Text(t) => Item::Text(Cow::Owned(t.into_owned())),
            Item::Object { id, text } => {
                Item::Object { id: id.map(|i| Cow::Owned(i.into_owned())), text: Cow::Owned(text.into_owned()) }
            }
        }
    }
}

impl<'a> From<&'a str> for Item<'a> {
    fn from(s: &'a str) -> Self {
        Item::Text(Cow::Borrowed(s))
    }
}

impl From<String> for Item<'static> {
    fn from(s: String) -> Self {
        Item::Text(Cow::Owned(s))
    }
}

/// `POST /v1/score`: one query, M candidate items; one score per item, in input order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest<'a> {
    #[serde(borrow)]
    pub query: Cow<'a, str>,
    #[serde(borrow)]
    pub items: Vec<Item<'a>>,
    /// Task instruction placed in the prompt template; the model's default when absent.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<Cow<'a, str>>,
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
    /// `false`: the proxy neither answers this call from its pair-score cache nor stores its
    /// scores there (default: the cache is used when the proxy's `[cache] enabled`). A worker
    /// accepts the field and ignores it: it has no such cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<bool>,
    /// Cut each item to at most this many of its own tokens (its text's tokens in the prompt,
    /// never the template's or the query's), and any item whose prompt would exceed the
    /// model's context to what fits, instead of refusing it (413). Capped by the server's
    /// `[limits] max_item_tokens`. Absent: nothing is cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_item_tokens: Option<u32>,
    /// Which end of a cut item is kept: `right` (default) cuts the end, `left` the beginning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// The model the caller means: checked against the served model's name and the `[api]
    /// model_aliases` (404 naming the served model on a mismatch; `[api] check_model = false`
    /// accepts any). Absent: whatever the server serves.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub model: Option<Cow<'a, str>>,
}

/// The end of an item that truncation cuts (`truncation_direction`; TEI's capitalised names too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TruncationDirection {
    /// Cut the end: the item's first tokens are kept.
    #[default]
    #[serde(alias = "Right")]
    Right,
    /// Cut the beginning: the item's last tokens are kept.
    #[serde(alias = "Left")]
    Left,
}

impl<'a> ScoreRequest<'a> {
    /// A request with no options set.
    pub fn new(query: impl Into<Cow<'a, str>>, items: Vec<Item<'a>>) -> Self {
        ScoreRequest {
            query: query.into(),
            items,
            instruction: None,
            deadline_ms: None,
            on_overload: None,
            cache: None,
            max_item_tokens: None,
            truncation_direction: None,
            model: None,
        }
    }

    /// The same request holding its own strings (for work that outlives the body it was read
    /// from).
    pub fn into_owned(self) -> ScoreRequest<'static> {
        let owned = |s: Cow<'a, str>| Cow::Owned(s.into_owned());
        ScoreRequest {
            query: owned(self.query),
            items: self.items.into_iter().map(Item::into_owned).collect(),
            instruction: self.instruction.map(owned),
            deadline_ms: self.deadline_ms,
            on_overload: self.on_overload,
            cache: self.cache,
            max_item_tokens: self.max_item_tokens,
            truncation_direction: self.truncation_direction,
            model: self.model.map(owned),
        }
    }
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
    /// Items answered from the proxy's pair-score cache instead of being sent to a worker (not
    /// counted in `pairs` or `computed_tokens`, which count work done; counted in
    /// `prompt_tokens` and `item_tokens` as when computed, so the tokens a caller is told of are
    /// the same cached or not; always 0 from a worker).
    #[serde(default)]
    pub cached_items: u32,
    /// Per item, in input order: tokens of the item's own segment (its prompt minus the prefix).
    #[serde(default)]
    pub item_tokens: Vec<u32>,
    /// Item tokens not computed because items of the call share them: the leading runs that
    /// groups of items have in common after the prefix, computed once per group (or found in
    /// the prefix cache). Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub item_shared_tokens: u64,
    /// Items cut to fit `max_item_tokens` or the model's context (truncation requested). Absent
    /// when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncated_items: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// The answering worker's template identity (as in its `/stats`); absent from the proxy's
    /// own answers and from workers that predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
}

impl ScoreResponse {
    /// About how many bytes its JSON takes (a little more, for typical answers): a score as a
    /// model gives it is at most 12 characters with its comma, a token count 4, and the field
    /// names and other figures under 400. The answer's buffer is sized with it, so it is written
    /// without growing.
    pub fn json_len_hint(&self) -> usize {
        let ids = self.ids.as_ref().map_or(0, |ids| ids.iter().map(|i| i.as_ref().map_or(5, |s| s.len() + 3)).sum());
        384 + 12 * self.scores.len()
            + 4 * self.usage.item_tokens.len()
            + 8 * self.missing.len()
            + ids
            + self.model.len()
            + self.template.len()
    }
}

/// A rerank document: a string, or an object (Cohere v1: its fields, `rank_fields` naming the
/// ones ranked on, `text` by default; an `id` echoed in the results). Deserialized by hand for
/// a message that says what a document may be.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Document {
    Text(String),
    Object(serde_json::Map<String, serde_json::Value>),
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DocumentVisitor;

        impl<'de> Visitor<'de> for DocumentVisitor {
            type Value = Document;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a document: a string, or an object with a `text` field (or the fields rank_fields names)")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Document, E> {
                Ok(Document::Text(s.to_string()))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Document, E> {
                Ok(Document::Text(s))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Document, A::Error> {
                serde_json::Map::deserialize(de::value::MapAccessDeserializer::new(map)).map(Document::Object)
            }
        }

        d.deserialize_any(DocumentVisitor)
    }
}

impl From<&str> for Document {
    fn from(s: &str) -> Self {
        Document::Text(s.to_string())
    }
}

impl From<Item<'_>> for Document {
    fn from(item: Item<'_>) -> Self {
        match item {
            Item::Text(t) => Document::Text(t.into_owned()),
            Item::Object { id, text } => {
                let mut m = serde_json::Map::new();
                if let Some(id) = id {
                    m.insert("id".into(), serde_json::Value::String(id.into_owned()));
                }
                m.insert("text".into(), serde_json::Value::String(text.into_owned()));
                Document::Object(m)
            }
        }
    }
}

impl Document {
    /// The document's `id`, when it is an object with a string (or number) `id`.
    pub fn id(&self) -> Option<String> {
        match self {
            Document::Object(m) => match m.get("id")? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            },
            Document::Text(_) => None,
        }
    }

    /// The text scored for document `index`: a string as is; an object's `rank_fields` (default
    /// `["text"]`): one field's value as is, several as `field: value` lines in their order
    /// (Cohere's form). A named field that is missing, or not a string, number or boolean, is
    /// refused by name.
    pub fn rank_text(&self, index: usize, rank_fields: Option<&[String]>) -> Result<String, ApiError> {
        let m = match self {
            Document::Text(t) => return Ok(t.clone()),
            Document::Object(m) => m,
        };
        let text = [String::from("text")];
        let fields = rank_fields.unwrap_or(&text);
        let value = |f: &String| -> Result<String, ApiError> {
            match m.get(f) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => Ok(v.to_string()),
                Some(_) => Err(ApiError::invalid(format!(
                    "documents[{index}].{f} is not a string, number or boolean: rank_fields name text fields"
                ))),
                None => Err(ApiError::invalid(if rank_fields.is_some() {
                    format!("documents[{index}] has no field `{f}`, which rank_fields names")
                } else {
                    format!(
                        "documents[{index}] has no field `text`: give each object document a `text`, or name \
                         its fields in rank_fields"
                    )
                })),
            }
        };
        match fields {
            [one] => value(one),
            _ => {
                let lines: Result<Vec<String>, ApiError> =
                    fields.iter().map(|f| value(f).map(|v| format!("{f}: {v}"))).collect();
                Ok(lines?.join("\n"))
            }
        }
    }

    /// The document as echoed in a result: its `text` (an object without one: the text
    /// scored), with an object's other fields.
    fn echo(&self, index: usize, rank_fields: Option<&[String]>) -> RerankDocument {
        match self {
            Document::Text(t) => RerankDocument { text: t.clone(), fields: serde_json::Map::new() },
            Document::Object(m) => {
                let mut fields = m.clone();
                let text = match fields.remove("text") {
                    Some(serde_json::Value::String(t)) => t,
                    _ => self.rank_text(index, rank_fields).unwrap_or_default(),
                };
                RerankDocument { text, fields }
            }
        }
    }
}

/// `POST /v1/rerank` (and `/v2/rerank`), in the shape Cohere, Jina and vLLM share. What Sieve
/// does with each client field is in `compat::rerank`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<Document>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_n: Option<usize>,
    /// Absent: each result carries its `document` (vLLM's results always do, Jina's by
    /// default); `false` (Cohere's default, which its SDKs send when asked) leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_documents: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// As [`ScoreRequest::on_overload`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overload: Option<OnOverload>,
    /// As [`ScoreRequest::model`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Cohere v1: the fields of object documents to rank on, in order (default `["text"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_fields: Option<Vec<String>>,
    /// Cohere v1, refused when set: Sieve does not chunk documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chunks_per_doc: Option<u64>,
    /// Cohere v2 and Jina: each document cut to this many of its own tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_per_doc: Option<u64>,
    /// vLLM: as `max_tokens_per_doc`; `-1` means the server's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate_prompt_tokens: Option<i64>,
    /// Sieve's own names, as on `/v1/score`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_item_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// Cohere v2 and vLLM, refused when set: Sieve orders work by deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Cohere v2, refused when set: Sieve scores whole documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevant_spans: Option<serde_json::Value>,
}

impl RerankRequest {
    /// The equivalent score call: reranking is scoring followed by a sort. Refused (422) when
    /// an object document lacks a field it is ranked on.
    pub fn to_score_request(&self) -> Result<ScoreRequest<'static>, ApiError> {
        // The clients' caps are one cap: the smallest given (vLLM's -1, "the server's limit",
        // as any value above it). Values out of range were refused by `compat::rerank::check`.
        let vllm = self.truncate_prompt_tokens.map(|n| if n < 0 { u32::MAX } else { clamp_u32(n as u64) });
        let caps = [self.max_tokens_per_doc.map(clamp_u32), vllm, self.max_item_tokens];
        let fields = self.rank_fields.as_deref();
        let items = self
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let text = d.rank_text(i, fields)?;
                Ok(match d.id() {
                    Some(id) => Item::Object { id: Some(Cow::Owned(id)), text: Cow::Owned(text) },
                    None => Item::Text(Cow::Owned(text)),
                })
            })
            .collect::<Result<Vec<Item>, ApiError>>()?;
        Ok(ScoreRequest {
            instruction: self.instruction.clone().map(Cow::Owned),
            deadline_ms: self.deadline_ms,
            on_overload: self.on_overload,
            max_item_tokens: caps.into_iter().flatten().min(),
            truncation_direction: self.truncation_direction,
            model: self.model.clone().map(Cow::Owned),
            ..ScoreRequest::new(self.query.clone(), items)
        })
    }
}

/// A client's token count as a cap: any count past `u32::MAX` is past every server's limit.
pub fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A result's document: the text (as given, or as scored when an object has no `text`) and an
/// object document's other fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankDocument {
    pub text: String,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankResult {
    pub index: usize,
    pub relevance_score: f32,
    /// The document's `id`, when it was an object with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
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
        let echo = req.return_documents != Some(false);
        let mut results: Vec<RerankResult> = resp
            .scores
            .iter()
            .enumerate()
            .filter_map(|(index, s)| {
                let doc = req.documents.get(index);
                s.map(|relevance_score| RerankResult {
                    index,
                    relevance_score,
                    id: doc.and_then(Document::id),
                    document: doc.filter(|_| echo).map(|d| d.echo(index, req.rank_fields.as_deref())),
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

/// How a caller gives a call more time, for 504 and 429 messages: the three places a deadline
/// comes from, the first found wins.
pub const RAISE_DEADLINE: &str =
    "raise it with deadline_ms in the body, the x-sieve-deadline-ms header, or [deadline] default_ms in the proxy's config";

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
    fn escape_free_texts_are_borrowed_from_the_body_and_the_others_decoded() {
        let body = r#"{"query":"q","items":["plain","t\u00e9",{"id":"x","text":"obj"}],"instruction":"i"}"#;
        let r: ScoreRequest = serde_json::from_str(body).unwrap();
        assert!(matches!(r.query, Cow::Borrowed("q")));
        assert!(matches!(r.items[0], Item::Text(Cow::Borrowed("plain"))));
        assert!(matches!(&r.items[1], Item::Text(Cow::Owned(t)) if t == "t\u{e9}"));
        assert_eq!((r.items[2].id(), r.items[2].text()), (Some("x"), "obj"));
        assert_eq!(r.clone().into_owned(), r, "the owned copy is the same request");
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
    fn an_answers_length_hint_holds_its_json_without_much_to_spare() {
        for n in [1usize, 100, 1000] {
            // Scores as a sigmoid head gives them, token counts 20-80, some ids and a missing.
            let resp = ScoreResponse {
                scores: (0..n).map(|i| (i != 1).then(|| (i as f32 * 0.618_034).fract() / 1.000_003)).collect(),
                ids: Some((0..n).map(|i| (i % 2 == 0).then(|| format!("sku-{i}"))).collect()),
                missing: if n > 1 { vec![1] } else { vec![] },
                usage: Usage {
                    pairs: n as u32,
                    prompt_tokens: 123_456_789,
                    computed_tokens: 12_345_678,
                    prefix_tokens: 45,
                    cached_prefix_tokens: 40,
                    cached_items: 0,
                    item_tokens: (0..n).map(|i| 20 + (i * 7 % 60) as u32).collect(),
                    item_shared_tokens: 0,
                    truncated_items: 0,
                },
                timing: Timing { queue_ms: 0.123_456_789, compute_ms: 12.345_678_9, total_ms: 123.456_789_01 },
                model: "Qwen/Qwen3-Reranker-0.6B".into(),
                template: "0123456789abcdef".into(),
            };
            let len = serde_json::to_vec(&resp).unwrap().len();
            let hint = resp.json_len_hint();
            assert!(len <= hint && hint < 2 * len + 384, "{n} items: {len} bytes, hint {hint}");
        }
    }

    #[test]
    fn rerank_sorts_best_first_and_truncates() {
        let req = RerankRequest {
            query: "q".into(),
            documents: vec!["a".into(), "b".into(), "c".into()],
            top_n: Some(2),
            return_documents: Some(true),
            ..RerankRequest::default()
        };
        let resp = ScoreResponse {
            scores: vec![Some(0.1), Some(0.9), Some(0.9)],
            ids: None,
            missing: vec![],
            usage: Usage::default(),
            timing: Timing::default(),
            model: "m".into(),
            template: String::new(),
        };
        let r = RerankResponse::from_scores(&req, resp);
        assert_eq!(r.results.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(r.results[0].document.as_ref().unwrap().text, "b");
    }
}
