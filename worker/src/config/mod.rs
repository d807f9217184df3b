//! Worker configuration: a TOML file (every field defaulted), overridden by command-line flags.
//! The documented example is `configs/worker.toml`. Unknown keys are errors, named with their
//! section (`sieve_shared::config_file`), so a typo never silently falls back to a default.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sieve_shared::http_config::{AdminConfig, HttpConfig};
use sieve_shared::Limits;

mod moe;

use crate::prompt::PromptTemplate;
use crate::{Result, WorkerError};
pub use moe::{MoePolicyKind, MoeSection, MoeVariantSetting};

/// The default shortest run worth sharing between items (`[engine] item_prefix_min_tokens`).
pub const DEFAULT_ITEM_SHARING_MIN_TOKENS: usize = 8;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    pub server: ServerConfig,
    pub model: ModelSection,
    pub engine: EngineSection,
    pub moe: MoeSection,
    pub limits: Limits,
    /// The model names a request may give and the CORS origins (`[api]`).
    pub api: sieve_shared::ApiConfig,
    /// Transport timeouts and the connection cap of both ports.
    pub http: HttpConfig,
    /// The gRPC API port (off unless `port` is set).
    pub grpc: sieve_shared::grpc_config::GrpcConfig,
    /// Who may use the admin port's routes (`POST /drain` always needs the token).
    pub admin: AdminConfig,
    /// Overrides the model's default prompt template.
    pub template: Option<PromptTemplate>,
    /// Span export over OTLP (off by default).
    pub tracing: sieve_shared::trace_config::TracingConfig,
    /// The log format.
    pub log: sieve_shared::trace_config::LogConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the scoring API; loopback by default (deployments set 0.0.0.0).
    pub host: String,
    pub port: u16,
    /// Address of the admin port, apart from `host`: loopback unless set (a deployment sets
    /// the pod's IP, where probes and Prometheus reach it).
    pub admin_host: String,
    pub admin_port: u16,
    /// The whole SIGTERM: waiting for in-flight calls, then closing the connections, ends
    /// within this.
    pub drain_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8081,
            admin_host: "127.0.0.1".into(),
            admin_port: 9081,
            drain_timeout_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `default` (the embedded SmolLM2-135M-Instruct, fetched when missing), a `.gguf` file, or
    /// an HF checkpoint directory.
    pub path: String,
    /// `cpu` or `cuda:N`.
    pub device: Device,
    /// `auto` (a classification head when the checkpoint has `score.weight`, else yes/no),
    /// `yes_no`, or `classifier`.
    pub head: HeadChoice,
    /// Longest prompt in tokens; 0 = the model's context length capped at 4096.
    pub max_seq_tokens: usize,
    /// Compute threads (0 = all cores).
    pub threads: usize,
    /// CUDA dense projections: `auto` (the default: `wgmma` on an sm_90 GPU, else `tiled`),
    /// `tiled` (our tensor-core GEMM: a row's bits never depend on its batch; with fused
    /// epilogues: bf16 GEMM inputs written by the norm, SiLU·mul in the gate/up GEMM), `wgmma`
    /// (the same on Hopper's warpgroup tensor cores, TMA-fed, sm_90 only, batch-invariant; 25%
    /// more pairs/s than `tiled` on an H200) or `cublas` (cuBLAS picks kernels by problem size,
    /// so scores can move in the last bits with batch composition); `tiled_unfused` and
    /// `tiled_v1` to compare.
    pub gemm: Gemm,
    /// CUDA attention: `mma` (tensor cores, head sizes 64 and 128; others fall back to `simt`)
    /// or `simt` (the earlier kernel, kept to compare against). Both keep a row's bits
    /// independent of its batch.
    pub attention: Attention,
}

/// How the score head is chosen (`model.head`: `auto`, `yes_no` or `classifier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadChoice {
    /// A classifier when the checkpoint has `score.weight`, else yes/no.
    #[default]
    Auto,
    YesNo,
    Classifier,
}

/// CUDA attention kernels (`model.attention`): see [`ModelSection::attention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    #[default]
    Mma,
    Simt,
}

/// CUDA dense projections (`model.gemm`): see [`ModelSection::gemm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gemm {
    /// `wgmma` where it runs (an sm_90 GPU whose sm_90a kernels loaded), else `tiled`.
    #[default]
    Auto,
    Tiled,
    Cublas,
    /// The earlier tiled kernel (same bits as `tiled`), kept to measure against.
    #[serde(rename = "tiled_v1")]
    TiledV1,
    /// The `tiled` kernel without its fused epilogues (f32 activations between the ops, a cast
    /// before each GEMM, SiLU·mul in its own pass): the same bits, kept to measure against.
    #[serde(rename = "tiled_unfused")]
    TiledUnfused,
    /// `tiled` on Hopper's wgmma (sm_90 GPUs only; a clear error at start elsewhere):
    /// batch-invariant, the same fused epilogues.
    Wgmma,
}

/// Where the model runs: `cpu`, or `cuda:N` (`cuda` is `cuda:0`). In the config and on the
/// command line it is that string; a bad one is refused when the config is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("device '{s}': expected cpu or cuda:N (N a GPU index)")),
        }
    }
}

impl TryFrom<String> for Device {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Device, String> {
        s.parse()
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: "default".into(),
            device: Device::Cpu,
            head: HeadChoice::Auto,
            max_seq_tokens: 0,
            threads: 0,
            gemm: Gemm::Auto,
            attention: Attention::Mma,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_seqs_per_pass: usize,
    /// Pairs accepted but not yet scored before calls get 429.
    pub max_queued_pairs: usize,
    /// Calls in flight before calls get 429.
    pub max_in_flight_requests: usize,
    /// Tokens per KV block.
    pub kv_block_size: usize,
    /// Blocks of the prefix region (in-batch sharing and the cross-batch prefix cache).
    pub prefix_cache_blocks: usize,
    /// Share each call's prefix across its items and cache it across calls.
    pub prefix_reuse: bool,
    pub prefix_cache_high_watermark: f64,
    pub prefix_cache_low_watermark: f64,
    /// Threads that tokenize one call's items together (0 = all cores, 1 = on the scheduler
    /// thread). Tokenizing is most of a call's preparation and a GPU's forward pass is short, so
    /// a GPU worker waits on it unless it is spread.
    pub tokenize_threads: usize,
    /// Items of a call whose prompts share a leading run after the query prefix (a category
    /// path, a brand block) compute that run once for the group (needs `prefix_reuse`).
    pub item_prefix_sharing: bool,
    /// The shortest run worth sharing, in tokens.
    pub item_prefix_min_tokens: usize,
    /// Throughput assumed for sizing passes to deadlines until the first pass is measured
    /// (tokens/s; then the measured rate is used). Low is safe: it only makes the first passes
    /// under a tight deadline smaller than needed.
    pub prior_tokens_per_second: f64,
    /// Share of a call's remaining time that the pass holding it is planned to take, in (0, 1];
    /// the rest is margin for the throughput estimate's error.
    pub deadline_pass_fraction: f64,
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            max_batch_tokens: 8192,
            max_seqs_per_pass: 512,
            max_queued_pairs: 16_384,
            max_in_flight_requests: 512,
            kv_block_size: 16,
            prefix_cache_blocks: 1024,
            prefix_reuse: true,
            prefix_cache_high_watermark: 0.9,
            prefix_cache_low_watermark: 0.7,
            prior_tokens_per_second: 1000.0,
            deadline_pass_fraction: 0.8,
            tokenize_threads: 0,
            item_prefix_sharing: true,
            item_prefix_min_tokens: DEFAULT_ITEM_SHARING_MIN_TOKENS,
        }
    }
}

/// A bound on `engine.tokenize_threads` and `model.threads` (`--threads`), so that a typo cannot
/// ask for a million threads (spawned for minutes before the system's limit refuses one).
pub const MAX_THREADS: usize = 1024;

impl WorkerConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|e| WorkerError::Config(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| WorkerError::Config(format!("{}: {e}", path.display())))
    }

    /// Parses a TOML config (not validated: flags are applied first, then [`Self::validate`]).
    pub fn from_toml(text: &str) -> std::result::Result<Self, String> {
        sieve_shared::config_file::parse(text, &[])
    }

    pub fn validate(&self) -> Result<()> {
        let e = &self.engine;
        let bad = |m: String| Err(WorkerError::Config(m));
        self.tracing.validate().map_err(WorkerError::Config)?;
        self.limits.validate().map_err(WorkerError::Config)?;
        if e.kv_block_size == 0 || e.max_batch_tokens == 0 || e.max_seqs_per_pass == 0 {
            return bad("engine: kv_block_size, max_batch_tokens and max_seqs_per_pass must be positive".into());
        }
        if !(0.0..=1.0).contains(&e.prefix_cache_low_watermark)
            || !(0.0..=1.0).contains(&e.prefix_cache_high_watermark)
            || e.prefix_cache_low_watermark > e.prefix_cache_high_watermark
        {
            return bad("engine: need 0 <= prefix_cache_low_watermark <= prefix_cache_high_watermark <= 1".into());
        }
        if !(e.deadline_pass_fraction > 0.0 && e.deadline_pass_fraction <= 1.0) {
            return bad(format!("engine.deadline_pass_fraction {} must be in (0, 1]", e.deadline_pass_fraction));
        }
        for (name, n) in
            [("engine.tokenize_threads", e.tokenize_threads), ("model.threads (--threads)", self.model.threads)]
        {
            if n > MAX_THREADS {
                return bad(format!("{name} {n} is more than {MAX_THREADS}; 0 means all cores"));
            }
        }
        if !(e.prior_tokens_per_second > 0.0 && e.prior_tokens_per_second.is_finite()) {
            return bad(format!(
                "engine.prior_tokens_per_second {} must be a positive number",
                e.prior_tokens_per_second
            ));
        }
        if self.model.max_seq_tokens > e.max_batch_tokens {
            return bad(format!(
                "model.max_seq_tokens {} > engine.max_batch_tokens {}",
                self.model.max_seq_tokens, e.max_batch_tokens
            ));
        }
        if let Some(t) = &self.template {
            t.validate()?;
        }
        self.moe.validate()?;
        self.http.validate_with_body_limit(self.limits.max_body_bytes).map_err(WorkerError::Config)?;
        self.grpc.validate().map_err(WorkerError::Config)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses_and_matches_the_defaults() {
        let c = WorkerConfig::from_toml(include_str!("../../../configs/worker.toml")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.engine, EngineSection::default());
        assert_eq!(c.server, ServerConfig::default());
        assert_eq!(c.moe, MoeSection::default());
        assert_eq!(c.http, HttpConfig::default());
        assert_eq!(c.admin, AdminConfig::default());
        assert_eq!(c.tracing, sieve_shared::trace_config::TracingConfig::default());
        assert_eq!(c.log, sieve_shared::trace_config::LogConfig::default());
        assert!(c.tracing.otlp_endpoint.is_empty(), "tracing is off by default");
        assert_eq!(c.server.admin_host, "127.0.0.1");
    }

    #[test]
    fn device_head_and_gemm_are_typed_and_a_bad_value_is_named_with_the_allowed_ones() {
        let c: WorkerConfig =
            toml::from_str("[model]\ndevice = \"cuda:1\"\nhead = \"yes_no\"\ngemm = \"cublas\"\n").unwrap();
        assert_eq!((c.model.device, c.model.head, c.model.gemm), (Device::Cuda(1), HeadChoice::YesNo, Gemm::Cublas));
        let c: WorkerConfig = toml::from_str("[model]\ndevice = \"cuda\"\ngemm = \"wgmma\"\n").unwrap();
        assert_eq!((c.model.device, c.model.gemm), (Device::Cuda(0), Gemm::Wgmma));
        for (text, bad, allowed) in [
            ("[model]\ndevice = \"tpu\"\n", "tpu", "cpu or cuda:N"),
            ("[model]\ndevice = \"cuda:x\"\n", "cuda:x", "cpu or cuda:N"),
            ("[model]\nhead = \"logits\"\n", "logits", "classifier"),
            ("[model]\ngemm = \"fast\"\n", "fast", "cublas"),
        ] {
            let e = toml::from_str::<WorkerConfig>(text).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(allowed), "{text}: {e}");
        }
        // Written back as the same strings.
        let text = toml::to_string(&ModelSection::default()).unwrap();
        assert!(
            text.contains("device = \"cpu\"") && text.contains("head = \"auto\"") && text.contains("gemm = \"auto\"")
        );
    }

    #[test]
    fn unknown_keys_are_refused_by_name_and_section() {
        for (text, start) in [
            ("[engine]\nmax_batch_tokns = 3\n", "`max_batch_tokns` in [engine] (line 2)"),
            ("[http]\nidle_timeout = 3\n", "`idle_timeout` in [http] (line 2)"),
            ("[admin]\ntoken = \"x\"\n", "`token` in [admin] (line 2)"),
            ("[[moe.cost]]\nvariant = \"x\"\nper_exprt = []\n", "`per_exprt` in [moe.cost] (line 3)"),
            ("[server]\napi_threads = 2\n", "`api_threads` in [server] (line 2)"),
            ("modle = \"default\"\n", "`modle` at the top level (line 1)"),
        ] {
            let e = WorkerConfig::from_toml(text).unwrap_err();
            assert!(e.starts_with(&format!("{start} is not a known setting")), "{text}: {e}");
        }
    }

    #[test]
    fn thread_counts_past_the_bound_and_zero_limits_are_refused_by_name() {
        for (text, name) in [
            ("[model]\nthreads = 1000000\n", "model.threads"),
            ("[engine]\ntokenize_threads = 2000\n", "engine.tokenize_threads"),
        ] {
            let c: WorkerConfig = toml::from_str(text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("more than 1024"), "{text}: {e}");
        }
        let c: WorkerConfig = toml::from_str("[model]\nthreads = 1024\n").unwrap();
        c.validate().unwrap();
        let c: WorkerConfig = toml::from_str("[limits]\nmax_deadline_ms = 0\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("limits.max_deadline_ms must be positive"));
    }

    #[test]
    fn bad_http_settings_are_refused() {
        let c: WorkerConfig = toml::from_str("[http]\nbody_read_timeout_ms = 0\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("http.body_read_timeout_ms"));
    }
}
