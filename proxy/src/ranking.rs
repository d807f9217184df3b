//! The `sieve` command's client side: reading items files, calling `/v1/score`, and printing
//! a ranking with its timing.

use std::fmt::Write as _;
use std::time::Instant;

use bytes::Bytes;
use sieve_shared::{ApiError, Item, ScoreRequest, ScoreResponse};

use crate::client::HttpClient;

/// Items (and maybe a query) from a file: a JSON object like `configs/demo-request.json`
/// (`query`, `items`), a JSON array of items (strings or `{"id", "text"}`), or plain text with
/// one item per line.
pub fn parse_items_file(text: &str) -> Result<(Option<String>, Vec<Item<'_>>), String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        #[derive(serde::Deserialize)]
        struct File<'a> {
            #[serde(default)]
            query: Option<String>,
            #[serde(borrow)]
            items: Vec<Item<'a>>,
        }
        let f: File = serde_json::from_str(text).map_err(|e| format!("items file: {e}"))?;
        Ok((f.query, f.items))
    } else if trimmed.starts_with('[') {
        let items: Vec<Item<'_>> = serde_json::from_str(text).map_err(|e| format!("items file: {e}"))?;
        Ok((None, items))
    } else {
        Ok((None, text.lines().map(str::trim).filter(|l| !l.is_empty()).map(Item::from).collect()))
    }
}

/// A scored call: the response, the client-side wall time and the proxy's shard count.
pub struct Scored {
    pub response: ScoreResponse,
    pub wall_ms: f64,
    pub shards: Option<usize>,
}

pub async fn score(client: &HttpClient, target: &str, req: &ScoreRequest<'_>) -> Result<Scored, String> {
    let uri: hyper::Uri =
        format!("{}/v1/score", target.trim_end_matches('/')).parse().map_err(|e| format!("{target}: {e}"))?;
    let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let reply = client.post_json(&uri, Bytes::from(body), &[]).await.map_err(|e| format!("{uri}: {e}"))?;
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    if !reply.status.is_success() {
        return Err(ApiError::from_response(reply.status.as_u16(), &reply.body).to_string());
    }
    let response: ScoreResponse =
        serde_json::from_slice(&reply.body).map_err(|e| format!("unreadable response: {e}"))?;
    // Only the proxy says how it split the call; a worker called directly does not.
    let shards = reply.headers.get("x-sieve-shards").and_then(|v| v.to_str().ok()?.parse().ok());
    Ok(Scored { response, wall_ms, shards })
}

/// The ranking, best first (ties: input order), then a timing line.
pub fn render(req: &ScoreRequest<'_>, scored: &Scored, top: Option<usize>) -> String {
    let resp = &scored.response;
    let mut order: Vec<usize> = (0..req.items.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (resp.scores.get(a).copied().flatten(), resp.scores.get(b).copied().flatten());
        sb.unwrap_or(f32::NEG_INFINITY).total_cmp(&sa.unwrap_or(f32::NEG_INFINITY)).then(a.cmp(&b))
    });
    let id_width = req.items.iter().map(|i| i.id().map_or(0, str::len)).max().unwrap_or(0).max(2);
    let mut out = String::new();
    let _ = writeln!(out, "query: {:?} ({} items)", req.query, req.items.len());
    let _ = writeln!(out, "\n{:>4}  {:>6}  {:<id_width$}  item", "rank", "score", "id");
    for (rank, &i) in order.iter().take(top.unwrap_or(usize::MAX)).enumerate() {
        let score = match resp.scores.get(i).copied().flatten() {
            Some(s) => format!("{s:.4}"),
            None => "  —   ".into(),
        };
        let item = &req.items[i];
        let _ = writeln!(
            out,
            "{:>4}  {score:>6}  {:<id_width$}  {}",
            rank + 1,
            item.id().unwrap_or(""),
            clip(item.text(), 80)
        );
    }
    if !resp.missing.is_empty() {
        let _ = writeln!(out, "\nmissing (deadline): {:?}", resp.missing);
    }
    let t = &resp.timing;
    let u = &resp.usage;
    let shards = scored.shards.map_or(String::new(), |n| format!(" over {n} shard{}", if n == 1 { "" } else { "s" }));
    let _ = writeln!(
        out,
        "\ntiming: {:.1} ms end to end; server {:.1} ms (queue {:.1} ms, compute {:.1} ms summed{shards})",
        scored.wall_ms, t.total_ms, t.queue_ms, t.compute_ms
    );
    let _ = writeln!(
        out,
        "usage: {} pairs, {} prompt tokens, {} computed (shared prefix {} tokens){}",
        u.pairs,
        u.prompt_tokens,
        u.computed_tokens,
        u.prefix_tokens,
        if resp.model.is_empty() { String::new() } else { format!("; model {}", resp.model) }
    );
    out
}

fn clip(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut t: String = flat.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sieve_shared::{Timing, Usage};

    #[test]
    fn items_files_in_three_shapes() {
        let (q, items) = parse_items_file(r#"{"query": "q", "items": ["a", {"id": "x", "text": "b"}]}"#).unwrap();
        assert_eq!(q.as_deref(), Some("q"));
        assert_eq!(items[1].id(), Some("x"));
        let (q, items) = parse_items_file(r#"["a", "b", "c"]"#).unwrap();
        assert!(q.is_none());
        assert_eq!(items.len(), 3);
        let (_, items) = parse_items_file("first item\n\n  second item  \n").unwrap();
        assert_eq!(items.iter().map(Item::text).collect::<Vec<_>>(), vec!["first item", "second item"]);
        assert!(parse_items_file("{\"items\": 3}").unwrap_err().contains("items file"));
    }

    #[test]
    fn renders_best_first_with_missing_last() {
        let req = ScoreRequest::new(
            "q",
            vec!["low".into(), Item::Object { id: Some("sku-9".into()), text: "high".into() }, "gone".into()],
        );
        let response = ScoreResponse {
            scores: vec![Some(0.1), Some(0.9), None],
            ids: None,
            missing: vec![2],
            usage: Usage { pairs: 2, ..Usage::default() },
            timing: Timing { queue_ms: 1.0, compute_ms: 5.0, total_ms: 7.0 },
            model: "m".into(),
            template: String::new(),
        };
        let out = render(&req, &Scored { response, wall_ms: 8.0, shards: Some(2) }, None);
        let lines: Vec<&str> =
            out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
        assert!(lines[0].contains("0.9000") && lines[0].contains("sku-9") && lines[0].contains("high"), "{out}");
        assert!(lines[1].contains("low"));
        assert!(lines[2].contains("gone") && lines[2].contains('—'));
        assert!(out.contains("missing (deadline): [2]") && out.contains("8.0 ms end to end"), "{out}");
        assert!(out.contains("over 2 shards"), "{out}");
    }
}
