use serde_json::{json, Value};
use sieve_shared::{Item, RerankResponse, Timing, Usage};

use super::*;

fn parse(route: Route, v: Value) -> Result<(ScoreRequest<'static>, Shape), ApiError> {
    Shape::parse(route, v.to_string().as_bytes()).map(|(req, shape)| (req.into_owned(), shape))
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
    assert_eq!((req.items, req.model), (vec![Item::Text("a".into())], None));
    let (req, _) = parse(Route::VllmScore, json!({"model": "m", "text_1": "q", "text_2": "a"})).unwrap();
    assert_eq!(req.model.as_deref(), Some("m"), "kept for the model check");
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
    assert_eq!(req.model.as_deref(), Some("rerank-v3.5"), "the model is kept for the check");
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
        (json!({"rank_fields": []}), "rank_fields is empty"),
        (json!({"top_n": 0}), "top_n must be at least 1"),
    ] {
        refused(Route::Rerank, q(extra), says);
    }
    assert!(parse(Route::Rerank, q(json!({"max_chunks_per_doc": null, "rank_fields": ["text"]}))).is_ok());
    // An object document lacking a field it is ranked on, or one that is not text.
    let docs = |d: Value, fields: Value| json!({"query": "q", "documents": [d], "rank_fields": fields});
    refused(Route::Rerank, docs(json!({"title": "t"}), json!(null)), "documents[0] has no field `text`");
    refused(Route::Rerank, docs(json!({"text": "t"}), json!(["title"])), "has no field `title`, which rank_fields");
    refused(Route::Rerank, docs(json!({"text": {"a": 1}}), json!(null)), "documents[0].text is not a string");
    refused(Route::Rerank, json!({"query": "q", "documents": [3]}), "expected a document: a string, or an object");
}

#[test]
fn object_documents_rank_on_their_rank_fields_and_echo_their_id() {
    let body = json!({"query": "q", "top_n": 3, "rank_fields": ["title", "text"], "documents": [
        {"id": "sku-1", "title": "Boots", "text": "waterproof", "brand": "x"},
        {"id": 7, "title": "Hat", "text": "felt"},
        "plain string",
    ]});
    let (req, shape) = parse(Route::Rerank, body).unwrap();
    let texts: Vec<&str> = req.items.iter().map(Item::text).collect();
    assert_eq!(texts, ["title: Boots\ntext: waterproof", "title: Hat\ntext: felt", "plain string"]);
    assert_eq!(req.items.iter().map(Item::id).collect::<Vec<_>>(), [Some("sku-1"), Some("7"), None]);
    let (_, v) = respond(shape, scored(&[Some(0.5), Some(0.9), Some(0.1)]));
    // Documents come back by default (return_documents absent), with an object's own fields.
    assert_eq!(
        v["results"],
        json!([{"index": 1, "relevance_score": 0.9, "id": "7", "document": {"text": "felt", "id": 7, "title": "Hat"}},
               {"index": 0, "relevance_score": 0.5, "id": "sku-1",
                "document": {"text": "waterproof", "id": "sku-1", "title": "Boots", "brand": "x"}},
               {"index": 2, "relevance_score": 0.1, "document": {"text": "plain string"}}])
    );
    // One field: its value as is; an object without `text` echoes the text scored.
    let body = json!({"query": "q", "rank_fields": ["title"], "return_documents": true,
                      "documents": [{"title": "Boots"}]});
    let (req, shape) = parse(Route::Rerank, body).unwrap();
    assert_eq!(req.items[0].text(), "Boots");
    let (_, v) = respond(shape, scored(&[Some(0.5)]));
    assert_eq!(v["results"][0]["document"], json!({"text": "Boots", "title": "Boots"}));
    // return_documents: false leaves every document out.
    let (_, shape) =
        parse(Route::Rerank, json!({"query": "q", "documents": ["a"], "return_documents": false})).unwrap();
    let (_, v) = respond(shape, scored(&[Some(0.5)]));
    assert_eq!(v["results"], json!([{"index": 0, "relevance_score": 0.5}]));
}

#[test]
fn the_rerank_path_serves_tei_s_body_and_vllm_s_by_their_keys() {
    let (req, shape) =
        parse(Route::TeiRerank, json!({"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1})).unwrap();
    assert_eq!((req.items.len(), req.model.as_deref()), (2, Some("m")));
    assert_eq!(shape.items_field(), "documents");
    let (_, v) = respond(shape, scored(&[Some(0.2), Some(0.7)]));
    // vLLM's RerankResult.document is required: there without return_documents.
    assert_eq!(v["results"], json!([{"index": 1, "relevance_score": 0.7, "document": {"text": "b"}}]));
    assert_eq!(v["usage"]["total_tokens"], 42);
    assert!(compat_is_vllm(json!({"query": "q", "documents": []})));
    assert!(!compat_is_vllm(json!({"query": "q", "texts": ["a"], "documents": ["a"]})));
    assert!(!compat_is_vllm(json!({"query": "q", "texts": ["a"]})));
    assert!(!is_vllm_rerank(b"{not json"));
    // TEI's body takes a model too.
    let (req, _) = parse(Route::TeiRerank, json!({"model": "m", "query": "q", "texts": ["a"]})).unwrap();
    assert_eq!(req.model.as_deref(), Some("m"));
}

#[test]
fn vllm_s_score_body_is_told_from_sieve_s_by_its_keys() {
    assert!(is_vllm_score(json!({"model": "m", "text_1": "q", "text_2": ["a"]}).to_string().as_bytes()));
    assert!(!is_vllm_score(json!({"query": "q", "items": ["a"]}).to_string().as_bytes()));
    assert!(!is_vllm_score(json!({"query": "q", "text_1": "q", "text_2": ["a"]}).to_string().as_bytes()));
    assert!(!is_vllm_score(b"{\"text_1\": "));
}

fn compat_is_vllm(v: Value) -> bool {
    is_vllm_rerank(v.to_string().as_bytes())
}

#[test]
fn v2_rerank_reports_api_version_2() {
    let (_, shape) = parse(Route::Rerank, json!({"query": "q", "documents": ["a"]})).unwrap();
    let (_, v) = respond(shape.v2(), scored(&[Some(0.5)]));
    assert_eq!(v["meta"]["api_version"]["version"], "2");
}

#[tokio::test]
async fn tei_errors_are_tei_s_body_with_tei_s_codes() {
    for (e, status, kind) in [
        (ApiError::invalid("query is empty"), 422, "Validation"),
        (ApiError::malformed("malformed JSON"), 400, "Validation"),
        (ApiError::too_large("too many texts"), 413, "Validation"),
        (ApiError::overloaded("queue full"), 429, "Overloaded"),
        (ApiError::not_ready("loading"), 503, "Unhealthy"),
        (ApiError::internal("engine failed"), 424, "Backend"),
        (ApiError::deadline("deadline passed"), 504, "Backend"),
    ] {
        let r = tei::error(&e);
        assert_eq!(r.status().as_u16(), status, "{e}");
        if status == 429 || status == 503 {
            assert!(r.headers().contains_key("retry-after"), "{e}");
        }
        assert_eq!(body_json(r).await, json!({"error": e.message, "error_type": kind}));
    }
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
    use sieve_shared::TruncationDirection::{Left, Right};
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
