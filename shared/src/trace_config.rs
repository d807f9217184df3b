//! `[tracing]` and `[log]`: span export over OTLP and the log format, read by every binary at
//! start-up (the runtime that acts on them is `sieve_server::trace` and `sieve_server::cli`).

use serde::{Deserialize, Serialize};

/// `[tracing]`: span export over OTLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`; empty
    /// (the default) turns tracing off.
    pub otlp_endpoint: String,
    /// `service.name` of the exported spans (default: the binary's name).
    pub service_name: String,
    /// Fraction of new traces sampled, in [0, 1] (default 1); a request that arrives with a
    /// `traceparent` follows its caller's sampling decision.
    pub sample_ratio: f64,
    /// How often finished spans are sent, in ms (default 5000).
    pub export_interval_ms: u64,
    /// How long one export may take before it is dropped, in ms (default 10000).
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: String::new(),
            service_name: String::new(),
            sample_ratio: 1.0,
            export_interval_ms: 5000,
            export_timeout_ms: 10_000,
        }
    }
}

impl TracingConfig {
    /// Refuses values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(format!("tracing.sample_ratio {} must be in [0, 1]", self.sample_ratio));
        }
        if self.export_interval_ms == 0 || self.export_timeout_ms == 0 {
            return Err("tracing.export_interval_ms and tracing.export_timeout_ms must be > 0".into());
        }
        let e = self.otlp_endpoint.trim();
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            return Err(format!("tracing.otlp_endpoint {e:?} must be an http:// or https:// URL (or empty: off)"));
        }
        Ok(())
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for a log pipeline.
    Json,
}

/// `[log]`: the log format (the level stays `RUST_LOG`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `"text"` (default) or `"json"`.
    pub format: LogFormat,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_are_off_and_bad_values_are_named() {
        let c: TracingConfig = toml::from_str("").unwrap();
        assert_eq!(c, TracingConfig::default());
        assert!(c.otlp_endpoint.is_empty());
        let bad: TracingConfig = toml::from_str("sample_ratio = 1.5").unwrap();
        assert!(bad.validate().unwrap_err().contains("sample_ratio"));
        let bad: TracingConfig = toml::from_str("otlp_endpoint = \"collector:4318\"").unwrap();
        assert!(bad.validate().unwrap_err().contains("otlp_endpoint"));
        assert!(toml::from_str::<TracingConfig>("endpoint = \"x\"").is_err(), "a misspelt key is refused");
        let l: LogConfig = toml::from_str("format = \"json\"").unwrap();
        assert_eq!(l.format, LogFormat::Json);
        assert!(toml::from_str::<LogConfig>("format = \"xml\"").is_err());
    }
}
