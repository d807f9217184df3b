//! gRPC messages to and from the JSON API's types, so everything after the conversion (limits,
//! scoring, rerank sorting) is the HTTP path's own code. A missing score is NaN in a message
//! (proto3 has no optional element in a repeated field) and listed in `missing`, exactly as it is
//! `null` and listed in the JSON.

use super::pb;
use sieve_shared::{
    ApiError, Item, OnOverload, RerankRequest, RerankResponse, ScoreRequest, ScoreResponse, Timing,
    TruncationDirection, Usage,
};

fn item(i: pb::Item) -> Item<'static> {
    match i.id {
        Some(id) => Item::Object { id: Some(id.into()), text: i.text.into() },
        None => Item::Text(i.text.into()),
    }
}

fn on_overload(v: i32) -> Result<Option<OnOverload>, ApiError> {
    match pb::OnOverload::try_from(v) {
        Ok(pb::OnOverload::Unspecified) => Ok(None),
        Ok(pb::OnOverload::Reject) => Ok(Some(OnOverload::Reject)),
        Ok(pb::OnOverload::Partial) => Ok(Some(OnOverload::Partial)),
        Err(_) => Err(ApiError::invalid(format!(
            "on_overload {v} is not one of ON_OVERLOAD_UNSPECIFIED (0), ON_OVERLOAD_REJECT (1), ON_OVERLOAD_PARTIAL (2)"
        ))),
    }
}

pub(super) fn score_request(r: pb::ScoreRequest) -> Result<ScoreRequest<'static>, ApiError> {
    Ok(ScoreRequest {
        on_overload: on_overload(r.on_overload)?,
        query: r.query.into(),
        items: r.items.into_iter().map(item).collect(),
        instruction: r.instruction.map(Into::into),
        deadline_ms: r.deadline_ms,
        cache: r.cache,
        max_item_tokens: r.max_item_tokens,
        truncation_direction: direction(r.max_item_tokens, r.truncate_left),
        model: None,
    })
}

/// `truncate_left` as the JSON's `truncation_direction` (said only when something is cut).
fn direction(max_item_tokens: Option<u32>, left: bool) -> Option<TruncationDirection> {
    max_item_tokens.map(|_| if left { TruncationDirection::Left } else { TruncationDirection::Right })
}

pub(super) fn rerank_request(r: pb::RerankRequest) -> Result<RerankRequest, ApiError> {
    Ok(RerankRequest {
        on_overload: on_overload(r.on_overload)?,
        query: r.query,
        documents: r.documents.into_iter().map(|d| item(d).into()).collect(),
        // A u32 always fits a usize on the platforms we build for; saturate rather than assume.
        top_n: r.top_n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        return_documents: Some(r.return_documents),
        instruction: r.instruction,
        deadline_ms: r.deadline_ms,
        model: r.model,
        max_item_tokens: r.max_item_tokens,
        truncation_direction: direction(r.max_item_tokens, r.truncate_left),
        // The HTTP clients' extra options (`compat::rerank`) have no field in the message.
        ..RerankRequest::default()
    })
}

/// Indices are below `max_items`, far under `u32::MAX`; saturating keeps a bad one visible.
fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

fn usage(u: Usage) -> pb::Usage {
    pb::Usage {
        pairs: u.pairs,
        prompt_tokens: u.prompt_tokens,
        computed_tokens: u.computed_tokens,
        prefix_tokens: u.prefix_tokens,
        cached_prefix_tokens: u.cached_prefix_tokens,
        item_tokens: u.item_tokens,
        cached_items: u.cached_items,
        truncated_items: u.truncated_items,
    }
}

fn timing(t: Timing) -> pb::Timing {
    pb::Timing { queue_ms: t.queue_ms, compute_ms: t.compute_ms, total_ms: t.total_ms }
}

pub(super) fn score_response(r: ScoreResponse) -> pb::ScoreResponse {
    pb::ScoreResponse {
        scores: r.scores.into_iter().map(|s| s.unwrap_or(f32::NAN)).collect(),
        ids: r.ids.map(|ids| ids.into_iter().map(Option::unwrap_or_default).collect()).unwrap_or_default(),
        missing: r.missing.into_iter().map(index).collect(),
        usage: Some(usage(r.usage)),
        timing: Some(timing(r.timing)),
        model: r.model,
    }
}

pub(super) fn rerank_response(r: RerankResponse) -> pb::RerankResponse {
    pb::RerankResponse {
        results: r
            .results
            .into_iter()
            .map(|x| pb::RerankResult {
                index: index(x.index),
                relevance_score: x.relevance_score,
                document: x.document.map(|d| d.text),
            })
            .collect(),
        missing: r.missing.into_iter().map(index).collect(),
        usage: Some(usage(r.usage)),
        timing: Some(timing(r.timing)),
        model: r.model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_keep_every_field_and_refuse_an_unknown_overload_policy() {
        let r = score_request(pb::ScoreRequest {
            query: "q".into(),
            items: vec![pb::Item { text: "a".into(), id: None }, pb::Item { text: "b".into(), id: Some("x".into()) }],
            instruction: Some("i".into()),
            deadline_ms: Some(40),
            on_overload: pb::OnOverload::Partial as i32,
            cache: Some(false),
            max_item_tokens: Some(30),
            truncate_left: true,
        })
        .unwrap();
        assert_eq!(r.cache, Some(false), "the cache opt-out reaches the call");
        assert_eq!((r.max_item_tokens, r.truncation_direction), (Some(30), Some(TruncationDirection::Left)));
        assert_eq!(r.items, vec![Item::from("a"), Item::Object { id: Some("x".into()), text: "b".into() }]);
        assert_eq!(
            (r.instruction.as_deref(), r.deadline_ms, r.on_overload),
            (Some("i"), Some(40), Some(OnOverload::Partial))
        );
        let e = score_request(pb::ScoreRequest { on_overload: 9, ..pb::ScoreRequest::default() }).unwrap_err();
        assert_eq!(e.status(), 422);
        assert!(e.message.contains("on_overload 9"), "{}", e.message);
        let r =
            rerank_request(pb::RerankRequest { top_n: Some(3), return_documents: true, ..Default::default() }).unwrap();
        assert_eq!((r.top_n, r.return_documents, r.on_overload), (Some(3), Some(true), None));
    }

    #[test]
    fn a_missing_score_is_nan_and_listed_ids_are_empty_strings() {
        let r = score_response(ScoreResponse {
            scores: vec![Some(0.5), None],
            ids: Some(vec![None, Some("x".into())]),
            missing: vec![1],
            usage: Usage { pairs: 1, ..Usage::default() },
            timing: Timing::default(),
            model: "m".into(),
            template: String::new(),
        });
        assert_eq!(r.scores[0], 0.5);
        assert!(r.scores[1].is_nan());
        assert_eq!(r.missing, vec![1]);
        assert_eq!(r.ids, vec![String::new(), "x".to_string()]);
        assert_eq!(r.usage.map(|u| u.pairs), Some(1));
    }
}
