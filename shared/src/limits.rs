//! Request limits, checked the same way by the proxy (before any shard is sent) and the worker.
//! Token-level limits (an item longer than the model's context) are the worker's, after
//! tokenization; everything checkable on the text is here.

use serde::{Deserialize, Serialize};

use crate::{ApiError, Item, ScoreRequest};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Most items in one call.
    pub max_items: usize,
    /// Longest query, in characters.
    pub max_query_chars: usize,
    /// Longest item text, in characters.
    pub max_item_chars: usize,
    /// Longest instruction, in characters.
    pub max_instruction_chars: usize,
    /// Longest accepted deadline, in milliseconds.
    pub max_deadline_ms: u64,
    /// Most tokens of its own an item keeps when the caller asks for truncation
    /// (`max_item_tokens` and the drop-in shapes' equivalents): a larger request, or TEI's
    /// `truncate: true`, cuts to this. Items are never cut unless the caller asks.
    pub max_item_tokens: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_items: 2048,
            max_query_chars: 4096,
            max_item_chars: 32_768,
            max_instruction_chars: 4096,
            max_deadline_ms: 600_000,
            max_item_tokens: 8192,
        }
    }
}

/// A cap of 0 tokens would score the template alone: refused rather than served as noise.
fn check_truncation(max_item_tokens: Option<u32>) -> Result<(), ApiError> {
    if max_item_tokens == Some(0) {
        return Err(ApiError::invalid("max_item_tokens must be at least 1 (leave it out to cut nothing)"));
    }
    Ok(())
}

impl Limits {
    /// Refuses a limit of 0 that would refuse every request (the message names the key).
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("limits.max_body_bytes", self.max_body_bytes as u64),
            ("limits.max_items", self.max_items as u64),
            ("limits.max_query_chars", self.max_query_chars as u64),
            ("limits.max_item_chars", self.max_item_chars as u64),
            ("limits.max_deadline_ms", self.max_deadline_ms),
            ("limits.max_item_tokens", self.max_item_tokens as u64),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive (0 would refuse every request)"));
            }
        }
        Ok(())
    }

    /// Checks everything that can be checked without a tokenizer. The first violation wins;
    /// the message names the field and the limit.
    pub fn check(&self, req: &ScoreRequest<'_>) -> Result<(), ApiError> {
        self.check_as(req, "items")
    }

    /// [`check`](Self::check), naming the items `field` in messages (`documents` for a rerank
    /// call).
    pub fn check_as(&self, req: &ScoreRequest<'_>, field: &str) -> Result<(), ApiError> {
        check_truncation(req.max_item_tokens)?;
        let items = req.items.iter().map(Item::text);
        self.check_parts(&req.query, req.instruction.as_deref(), items, req.deadline_ms, field)
    }

    fn check_parts<'t>(
        &self,
        query: &str,
        instruction: Option<&str>,
        items: impl ExactSizeIterator<Item = &'t str>,
        deadline_ms: Option<u64>,
        field: &str,
    ) -> Result<(), ApiError> {
        if query.trim().is_empty() {
            return Err(ApiError::invalid("query is empty"));
        }
        if items.len() == 0 {
            return Err(ApiError::invalid(format!("{field} is empty: at least one item is required")));
        }
        if items.len() > self.max_items {
            return Err(ApiError::too_large(format!(
                "too many {field}: {} > max_items {}",
                items.len(),
                self.max_items
            )));
        }
        // The character count of a text over `max` characters. A text has no more characters
        // than bytes, so only one of more than `max` bytes is counted.
        let too_long = |t: &str, max: usize| (t.len() > max).then(|| t.chars().count()).filter(|&c| c > max);
        if let Some(qc) = too_long(query, self.max_query_chars) {
            return Err(ApiError::too_large(format!(
                "query too long: {qc} characters > max_query_chars {}",
                self.max_query_chars
            )));
        }
        if let Some(instr) = instruction {
            if let Some(ic) = too_long(instr, self.max_instruction_chars) {
                return Err(ApiError::too_large(format!(
                    "instruction too long: {ic} characters > max_instruction_chars {}",
                    self.max_instruction_chars
                )));
            }
        }
        for (i, text) in items.enumerate() {
            // `trim().is_empty()`, without trimming the end of every item.
            if text.chars().all(char::is_whitespace) {
                return Err(ApiError::invalid(format!("{field}[{i}] is empty")));
            }
            if let Some(c) = too_long(text, self.max_item_chars) {
                return Err(ApiError::too_large(format!(
                    "{field}[{i}] too long: {c} characters > max_item_chars {}",
                    self.max_item_chars
                )));
            }
        }
        if let Some(d) = deadline_ms {
            if d == 0 {
                return Err(ApiError::invalid("deadline_ms must be positive"));
            }
            if d > self.max_deadline_ms {
                return Err(ApiError::invalid(format!("deadline_ms {d} > max_deadline_ms {}", self.max_deadline_ms)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(query: &'a str, items: Vec<&'a str>) -> ScoreRequest<'a> {
        ScoreRequest::new(query, items.into_iter().map(Into::into).collect())
    }

    #[test]
    fn each_violation_has_its_code() {
        let l = Limits { max_items: 2, max_item_chars: 5, ..Limits::default() };
        assert!(l.check(&req("q", vec!["a"])).is_ok());
        assert_eq!(l.check(&req(" ", vec!["a"])).unwrap_err().status(), 422);
        assert_eq!(l.check(&req("q", vec![])).unwrap_err().status(), 422);
        assert_eq!(l.check(&req("q", vec!["a", "b", "c"])).unwrap_err().status(), 413);
        let e = l.check(&req("q", vec!["a", "toolong"])).unwrap_err();
        assert_eq!(e.status(), 413);
        assert!(e.message.contains("items[1]") && e.message.contains("max_item_chars 5"), "{}", e.message);
        assert_eq!(l.check(&req("q", vec!["a", ""])).unwrap_err().status(), 422);
        // Characters, not bytes: five two-byte characters fit, six do not.
        assert!(l.check(&req("q", vec!["ééééé"])).is_ok());
        let e = l.check(&req("q", vec!["éééééé"])).unwrap_err();
        assert!(e.message.contains("6 characters"), "{}", e.message);
    }
}
