//! `[api]`: what the API port accepts besides the request limits, the same on the proxy, the
//! worker and the simulated worker: which names a request's `model` may give, and which browser
//! origins may call the port (CORS).

use serde::{Deserialize, Serialize};

use crate::{ApiError, ErrorKind};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Check a request's `model` against the served model's name and `model_aliases`: a
    /// mismatch is 404 naming the served model (vLLM's answer). `false`: any name is accepted
    /// (the served model answers whatever the client asked for).
    pub check_model: bool,
    /// Other names a request's `model` may give for the served model (a Cohere or Jina
    /// client's model name, say `rerank-v3.5`).
    pub model_aliases: Vec<String>,
    /// Browser origins allowed to call the API port (CORS), exactly as a browser sends them
    /// (`https://search.example.com`), or `"*"` for any. Empty (the default): no CORS headers,
    /// so browsers refuse cross-origin calls.
    pub cors_allow_origins: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig { check_model: true, model_aliases: Vec::new(), cors_allow_origins: Vec::new() }
    }
}

impl ApiConfig {
    /// Whether a request naming `requested` may be served by a process serving `served` (the
    /// names of the models its workers report; none known yet: accepted, the call fails or
    /// succeeds on its own). 404 on a mismatch, naming what is served and how to fix it.
    pub fn check_model(&self, requested: &str, served: &[String]) -> Result<(), ApiError> {
        if !self.check_model || served.is_empty() {
            return Ok(());
        }
        if served.iter().chain(&self.model_aliases).any(|m| m == requested) {
            return Ok(());
        }
        let names = served.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
        let aliases = if self.model_aliases.is_empty() {
            String::new()
        } else {
            format!(" (aliases: {})", self.model_aliases.join(", "))
        };
        Err(ApiError::new(
            ErrorKind::NotFound,
            format!(
                "model `{requested}` not found: this server serves {names}{aliases}. Send model {names}, leave \
                 model out, add `{requested}` to [api] model_aliases, or set [api] check_model = false"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_the_served_one_an_alias_or_a_404_naming_the_served_one() {
        let served = vec!["qwen3-reranker".to_string()];
        let cfg = ApiConfig { model_aliases: vec!["rerank-v3.5".into()], ..ApiConfig::default() };
        assert!(cfg.check_model("qwen3-reranker", &served).is_ok());
        assert!(cfg.check_model("rerank-v3.5", &served).is_ok());
        let e = cfg.check_model("gpt-4", &served).unwrap_err();
        assert_eq!(e.status(), 404);
        for part in ["model `gpt-4` not found", "serves `qwen3-reranker`", "aliases: rerank-v3.5", "check_model"] {
            assert!(e.message.contains(part), "{:?} lacks {part:?}", e.message);
        }
        // Nothing known yet, or checking off: accepted.
        assert!(cfg.check_model("gpt-4", &[]).is_ok());
        let off = ApiConfig { check_model: false, ..ApiConfig::default() };
        assert!(off.check_model("gpt-4", &served).is_ok());
    }

    #[test]
    fn the_section_has_defaults_and_refuses_unknown_keys() {
        let c: ApiConfig = toml::from_str("").unwrap();
        assert_eq!(c, ApiConfig::default());
        assert!(c.check_model && c.cors_allow_origins.is_empty());
        let c: ApiConfig = toml::from_str("model_aliases = [\"a\"]\ncors_allow_origins = [\"*\"]").unwrap();
        assert_eq!((c.model_aliases.len(), c.cors_allow_origins.len()), (1, 1));
        assert!(toml::from_str::<ApiConfig>("check_models = false").is_err());
    }
}
