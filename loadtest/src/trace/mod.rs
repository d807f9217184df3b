//! Reading the proxy's request trace (`[request_trace]`, `proxy/src/request_trace.rs`): one
//! JSON object per line with hashes of the texts, token counts, the arrival time and the
//! outcome. The line's shape is `sieve_shared::trace_record::TraceRecord`, the one the proxy writes;
//! the fields the planner does not need (latency, status...) are read when present.
//!
//! A bad line is an error naming its file and line, never skipped: a plan from a silently
//! shortened trace would be a wrong plan.

pub mod synth;

use std::io::BufRead;
use std::path::Path;

pub use sieve_shared::trace_record::TraceRecord;

/// Reads a trace from `text` (named `name` in errors); blank lines are skipped. The records
/// are returned in arrival order (the proxy writes them as they finish).
pub fn parse(text: impl BufRead, name: &str) -> Result<Vec<TraceRecord>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.map_err(|e| format!("{name}:{}: {e}", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: TraceRecord =
            serde_json::from_str(&line).map_err(|e| format!("{name}:{}: not a trace record: {e}", i + 1))?;
        if r.items.is_empty() {
            return Err(format!("{name}:{}: a request with no items", i + 1));
        }
        if !r.item_tokens.is_empty() && r.item_tokens.len() != r.items.len() {
            return Err(format!(
                "{name}:{}: {} item token counts for {} items",
                i + 1,
                r.item_tokens.len(),
                r.items.len()
            ));
        }
        out.push(r);
    }
    out.sort_by_key(|r| r.t_ms);
    Ok(out)
}

/// Reads and merges trace files (a rotated trace: `PATH.2 PATH.1 PATH`, in any order).
pub fn read(paths: &[impl AsRef<Path>]) -> Result<Vec<TraceRecord>, String> {
    let mut all = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        all.extend(parse(std::io::BufReader::new(f), &p.display().to_string())?);
    }
    if all.is_empty() {
        return Err("the trace holds no requests".into());
    }
    all.sort_by_key(|r| r.t_ms);
    Ok(all)
}

/// Writes records as trace lines (what the proxy writes), for generated traces.
pub fn write(path: &Path, records: &[TraceRecord]) -> Result<(), String> {
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"t_ms":1000,"query":7,"items":[1,2],"item_tokens":[12,50],"prefix_tokens":44,"cached_items":0,"missing":0,"deadline_ms":500,"status":200,"latency_ms":12.5}"#;

    #[test]
    fn reads_the_proxys_lines_in_arrival_order() {
        let early = r#"{"t_ms":900,"query":8,"instruction":3,"items":[1],"item_tokens":[],"prefix_tokens":0,"cached_items":0,"missing":0,"deadline_ms":null,"status":429,"latency_ms":0.1}"#;
        let text = format!("{LINE}\n\n{early}\n");
        let r = parse(text.as_bytes(), "t").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].t_ms, r[0].instruction, r[0].answered()), (900, Some(3), false));
        assert_eq!((r[1].items.clone(), r[1].item_tokens.clone(), r[1].answered()), (vec![1, 2], vec![12, 50], true));
        let back: TraceRecord = serde_json::from_str(&serde_json::to_string(&r[1]).unwrap()).unwrap();
        assert_eq!(back, r[1]);
    }

    #[test]
    fn a_bad_line_is_an_error_naming_it() {
        for (bad, what) in [
            ("{\"t_ms\":1}", "missing field"),
            ("not json", "not a trace record"),
            (r#"{"t_ms":1,"query":1,"items":[]}"#, "no items"),
            (r#"{"t_ms":1,"query":1,"items":[1,2],"item_tokens":[3]}"#, "1 item token counts for 2 items"),
            (r#"{"t_ms":-1,"query":1,"items":[1]}"#, "not a trace record"),
        ] {
            let e = parse(format!("{LINE}\n{LINE}\n{bad}\n").as_bytes(), "trace.jsonl").unwrap_err();
            assert!(e.starts_with("trace.jsonl:3: ") && e.contains(what), "{bad}: {e}");
        }
        let e = read(&[Path::new("/no/such/trace")]).unwrap_err();
        assert!(e.contains("/no/such/trace"), "{e}");
    }
}
