//! Writes a deterministic random-weight checkpoint in the exact HF layout, for tests and
//! benchmarks.
//!
//!   sieve-testmodel --arch qwen3|qwen2|llama|qwen3_moe|qwen2_moe --preset tiny|bench|qwen3-0.6b --seed N
//!                   --dtype f32|bf16|f16 --tokenizer PATH/tokenizer.json --out DIR

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sieve_worker::model::testgen::{generate, Preset, StoreDType, TestArch, TestModelSpec};

#[derive(Parser, Debug)]
#[command(name = "sieve-testmodel", about = "Generate a deterministic HF-layout test checkpoint")]
struct Args {
    /// qwen3, qwen2, llama, qwen3_moe or qwen2_moe.
    #[arg(long)]
    arch: TestArch,
    /// tiny (CI-sized), bench (benchmark-sized) or qwen3-0.6b (Qwen3-0.6B's shapes, dense only).
    #[arg(long, default_value = "tiny")]
    preset: Preset,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Storage dtype of the weights: f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    dtype: StoreDType,
    /// The tokenizer.json to copy (its size sets vocab_size); tokenizer_config.json beside it is
    /// copied too.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Output directory (created if missing; existing files are overwritten).
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.preset == Preset::Qwen3_0_6b && matches!(args.arch, TestArch::Qwen3Moe | TestArch::Qwen2Moe) {
        eprintln!(
            "sieve-testmodel: --preset qwen3-0.6b is a dense model's shapes: use it with --arch qwen3, qwen2 or llama"
        );
        return ExitCode::FAILURE;
    }
    let spec = TestModelSpec::preset(args.arch, args.preset, args.seed, args.dtype);
    match generate(&spec, &args.out, &args.tokenizer) {
        Ok(info) => {
            println!(
                "sieve-testmodel: wrote {} ({} {:?}, seed {}): {} tensors, {} parameters, vocab {}, \
                 model.safetensors {} bytes",
                args.out.display(),
                args.arch.model_type(),
                args.preset,
                args.seed,
                info.n_tensors,
                info.n_params,
                info.vocab_size,
                info.safetensors_bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sieve-testmodel: {e}");
            ExitCode::FAILURE
        }
    }
}
