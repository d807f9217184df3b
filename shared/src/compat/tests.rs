use serde_json::{json, Value};

use super::*;
use crate::{Item, RerankResponse, Timing, Usage};

fn parse(route: Route, v: Value) -> Result<(ScoreRequest, Shape), ApiError> {
    Shape::parse(route, v.to_string().as_bytes())
}

fn refused(route: Route, v: Value, says: &str) {
    let e = parse(route, v.clone()).unwrap_err();
    assert_eq!(e.status(), 422, "{v}: {}", e.message);
    assert!(e.message.contains(says), "{v}: {:?} lacks {says:?}", e.message);
}

/// A scored answer: scores by index, `None` for the missing ones.
fn scored(scores: &[Option<f32>]) -> ScoreResponse {
    ScoreResponse {
        scores: scores.to_vec(),
        ids: None,
        missing: scores.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| i).collect(),
        usage: Usage { pairs: 3, prompt_tokens: 42, computed_tokens: 30, ..Usage::default() },
        timing: Timing::default(),
        model: "m".into(),
        template: String::new(),
    }
}

async fn body_json(r: HttpResponse) -> Value {
    use http_body_util::BodyExt;
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn respond(shape: Shape, resp: ScoreResponse) -> (Option<String>, Value) {
    let r = shape.respond(resp);
    let missing = r.headers().get(headers::MISSING).map(|v| v.to_str().unwrap().to_string());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    (missing, rt.block_on(body_json(r)))
}

#[test]
fn tei_rerank_is_a_score_call_answered_as_a_sorted_array() {
    let (req, shape) =
        parse(Route::TeiRerank, json!({"query": "q", "texts": ["a", "b", "c"], "return_text": true})).unwrap();
    assert_eq!(req.query, "q");
    assert_eq!(req.items.iter().map(Item::text).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(shape.items_field(), "texts");
    let (missing, v) = respond(shape, scored(&[Some(0.2), Some(0.9), Some(0.2)]));
    assert_eq!(missing, None);
    assert_eq!(
        v,
        json!([{"index": 1, "text": "b", "score": 0.9}, {"index": 0, "text": "a", "score": 0.2},
               {"index": 2, "text": "c", "score": 0.2}])
    );
    // Without return_text no entry has a text; a missing index is absent and in the header.
    let (_, shape) = parse(Route::TeiRerank, json!({"query": "q", "texts": ["a", "b", "c"]})).unwrap();
    let (missing, v) = respond(shape, scored(&[Some(0.2), None, Some(0.7)]));
    assert_eq!(missing.as_deref(), Some("1"));
    assert_eq!(v, json!([{"index": 2, "score": 0.7}, {"index": 0, "score": 0.2}]));
}

#[test]
fn tei_options_sieve_cannot_honour_are_refused_by_name() {
    let q = |extra: Value| {
        let mut v = json!({"query": "q", "texts": ["a"]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    refused(Route::TeiRerank, q(json!({"raw_scores": true})), "raw_scores: true is not supported");
    refused(Route::TeiRerank, q(json!({"truncation_direction": "up"})), "unknown variant `up`");
    refused(Route::TeiRerank, q(json!({"documents": ["a"]})), "unknown field `documents`");
    refused(Route::TeiRerank, json!({"query": "q", "texts": [{"text": "a"}]}), "invalid type: map");
    for ok in [
        json!({"raw_scores": false, "truncate": false}),
        json!({"truncate": null, "truncation_direction": "Left"}),
        json!({"truncation_direction": "right"}),
    ] {
        assert!(parse(Route::TeiRerank, q(ok.clone())).is_ok(), "{ok}");
    }
}

#[test]
fn vllm_score_takes_one_query_in_any_of_its_forms() {
    for text_1 in [json!("q"), json!(["q"]), json!(["q", "q"])] {
        let (req, shape) = parse(Route::VllmScore, json!({"model": "x", "text_1": text_1, "text_2": ["a", "b"]}))
            .unwrap_or_else(|e| panic!("{text_1}: {}", e.message));
        assert_eq!(req.query, "q");
        assert_eq!(req.items.len(), 2);
        assert_eq!(shape.items_field(), "text_2");
    }
    let (req, _) = parse(Route::VllmScore, json!({"text_1": "q", "text_2": "a"})).unwrap();
    assert_eq!(req.items, vec![Item::Text("a".into())]);
    refused(Route::VllmScore, json!({"text_1": ["q", "r"], "text_2": ["a", "b"]}), "text_1[1] differs");
    refused(Route::VllmScore, json!({"text_1": ["q", "q"], "text_2": ["a"]}), "text_1 has 2 entries and text_2 1");
    refused(Route::VllmScore, json!({"text_1": [], "text_2": ["a"]}), "text_1 is empty");
    refused(Route::VllmScore, json!({"text_1": "q", "text_2": [1]}), "a string or a list of strings");
    refused(Route::VllmScore, json!({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 0}), "at least 1, or -1");
    refused(Route::VllmScore, json!({"text_1": "q", "text_2": "a", "queries": "a"}), "unknown field `queries`");
}

#[test]
fn vllm_score_answers_in_input_order_in_vllm_s_shape() {
    let (_, shape) = parse(Route::VllmScore, json!({"text_1": "q", "text_2": ["a", "b", "c"]})).unwrap();
    let (missing, v) = respond(shape, scored(&[Some(0.2), None, Some(0.7)]));
    assert_eq!(missing.as_deref(), Some("1"));
    assert!(v["id"].as_str().unwrap().starts_with("score-"), "{v}");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "m");
    assert_eq!(
        v["data"],
        json!([{"index": 0, "object": "score", "score": 0.2}, {"index": 2, "object": "score", "score": 0.7}])
    );
    assert_eq!(v["missing"], json!([1]));
    assert_eq!(v["usage"], json!({"prompt_tokens": 42, "total_tokens": 42, "completion_tokens": 0}));
}

#[test]
fn rerank_keeps_its_fields_and_adds_what_cohere_jina_and_vllm_clients_read() {
    let body = json!({"model": "rerank-v3.5", "query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2,
                      "return_documents": true, "rank_fields": ["text"]});
    let (req, shape) = parse(Route::Rerank, body).unwrap();
    assert_eq!(req.items.len(), 3);
    assert_eq!(shape.items_field(), "documents");
    let (missing, v) = respond(shape, scored(&[Some(0.2), Some(0.9), Some(0.5)]));
    assert_eq!(missing, None);
    assert_eq!(
        v["results"],
        json!([{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
               {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}}])
    );
    assert!(v["id"].as_str().unwrap().starts_with("rerank-"), "{v}");
    assert_eq!(v["usage"]["total_tokens"], 42);
    assert_eq!(v["usage"]["pairs"], 3);
    assert_eq!(v["meta"], json!({"api_version": {"version": "1"}, "tokens": {"input_tokens": 42, "output_tokens": 0}}));
    // Sieve's own rerank answer still parses from it.
    let back: RerankResponse = serde_json::from_value(v).unwrap();
    assert_eq!(back.results.len(), 2);
    assert_eq!(back.usage.prompt_tokens, 42);
}

#[test]
fn rerank_options_sieve_cannot_honour_are_refused_by_name() {
    let q = |extra: Value| {
        let mut v = json!({"query": "q", "documents": ["a", "b"]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    for (extra, says) in [
        (json!({"max_chunks_per_doc": 4}), "max_chunks_per_doc is not supported"),
        (json!({"max_tokens_per_doc": 0}), "must be at least 1"),
        (json!({"truncate_prompt_tokens": -2}), "must be at least 1"),
        (json!({"priority": 1}), "priority is not supported"),
        (json!({"relevant_spans": {"mode": "x"}}), "relevant_spans is not supported"),
        (json!({"rank_fields": ["title"]}), "rank_fields other than [\"text\"] is not supported"),
        (json!({"top_n": 0}), "top_n must be at least 1"),
    ] {
        refused(Route::Rerank, q(extra), says);
    }
    assert!(parse(Route::Rerank, q(json!({"max_chunks_per_doc": null, "rank_fields": ["text"]}))).is_ok());
}

#[test]
fn response_ids_differ_call_to_call() {
    let a = response_id("x");
    let b = response_id("x");
    assert_ne!(a, b);
    assert!(a.starts_with("x-") && a.len() == 2 + 24, "{a}");
}

#[test]
fn every_shape_s_truncation_becomes_one_cap() {
    let cap = |route, body: Value| {
        let (req, _) = parse(route, body).unwrap();
        (req.max_item_tokens, req.truncation_direction)
    };
    let rerank = |extra: Value| {
        let mut v = json!({"query": "q", "documents": ["a"]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    use crate::TruncationDirection::{Left, Right};
    assert_eq!(cap(Route::Rerank, rerank(json!({}))), (None, None));
    assert_eq!(cap(Route::Rerank, rerank(json!({"max_tokens_per_doc": 4096}))), (Some(4096), None));
    assert_eq!(cap(Route::Rerank, rerank(json!({"truncate_prompt_tokens": -1}))), (Some(u32::MAX), None));
    assert_eq!(
        cap(Route::Rerank, rerank(json!({"truncate_prompt_tokens": 9, "max_tokens_per_doc": 20}))),
        (Some(9), None),
        "the smallest cap wins"
    );
    assert_eq!(
        cap(Route::Rerank, rerank(json!({"max_item_tokens": 7, "truncation_direction": "left"}))),
        (Some(7), Some(Left))
    );
    let tei = json!({"query": "q", "texts": ["a"], "truncate": true, "truncation_direction": "Left"});
    assert_eq!(cap(Route::TeiRerank, tei), (Some(u32::MAX), Some(Left)));
    let tei = json!({"query": "q", "texts": ["a"], "truncate": false, "truncation_direction": "Right"});
    assert_eq!(cap(Route::TeiRerank, tei), (None, Some(Right)));
    assert_eq!(
        cap(Route::VllmScore, json!({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 64})),
        (Some(64), None)
    );
    let score = json!({"query": "q", "items": ["a"], "max_item_tokens": 5, "truncation_direction": "right"});
    assert_eq!(cap(Route::Score, score), (Some(5), Some(Right)));
}
