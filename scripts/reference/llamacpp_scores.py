#!/usr/bin/env python3
"""A qwen2, qwen3, qwen3_moe or qwen2_moe GGUF scored by Sieve and by llama.cpp, the yes/no logits
of the same prompts compared.

Writes a tiny `sieve-testmodel` checkpoint of one of those as a GGUF (f32, llama.cpp's
tensor names, experts stacked per layer, the Qwen3 tokenizer as its converter writes it; with `--yarn
FACTOR ORIGINAL` the YaRN keys its converter writes), then for 8 prompts built as `scripts/gpu_bench.py` builds them: llama.cpp's
logit(yes) − logit(no) at the last token (node-llama-cpp's prebuilt CPU binary, fed the token ids)
against a worker serving that GGUF, started here. Not used by tests.

    target/debug/sieve-testmodel --arch qwen3 --preset tiny \
        --tokenizer .cache/tokenizers/qwen3/tokenizer.json --out /tmp/q3      # or qwen2, qwen3_moe, qwen2_moe
    NODE_LLAMA_DIR=/tmp/nodellama python scripts/reference/llamacpp_scores.py /tmp/q3 [--yarn 4 16] \
        [--llama-yarn 4 16]

`--llama-yarn` gives llama.cpp a GGUF of its own (a control: Sieve's file without the scaling).
Needs `npm install node-llama-cpp@3.22.1` in NODE_LLAMA_DIR, and gguf, torch, safetensors,
tokenizers in the Python environment. Versions used: node-llama-cpp 3.22.1, gguf 0.19.0.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_bench  # noqa: E402  (the prompts and the score's logit)

LLAMA = r"""
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const require = createRequire(process.env.NODE_LLAMA_DIR.replace(/\/?$/, "/"));
const { getLlama } = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: process.argv[2] });
const [ids, yes, no] = JSON.parse(readFileSync(0, "utf8"));
const out = [];
for (const seq of ids) {
  const context = await model.createContext({ contextSize: 1024, sequences: 1 });
  const want = { generateNext: { logits: { filter: { tokens: [yes, no] } } } };
  const res = await context.getSequence().controlledEvaluate(seq.map((t, i) => (i === seq.length - 1 ? [t, want] : t)));
  const logits = res[seq.length - 1].next.logits;
  out.push(logits.get(yes) - logits.get(no));
  await context.dispose();
}
process.stdout.write(JSON.stringify(out));
"""

LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
# The GGUF architecture of each checkpoint's model_type.
ARCHS = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe"}


def write_gguf(src, out, yarn, quant=None):
    """The checkpoint as llama.cpp's convert_hf_to_gguf.py writes it."""
    import gguf
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    moe = cfg["model_type"].endswith("_moe")
    w = gguf.GGUFWriter(str(out), ARCHS[cfg["model_type"]])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(0)
    if moe:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(yarn[0]))
        w.add_rope_scaling_orig_ctx_len(int(yarn[1]))
    # The vocabulary as its `_set_vocab_gpt2` lays it out: added tokens over the BPE ones.
    rev = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {t["id"]: t for t in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(rev.get(i, f"[PAD{i}]"))
            types.append(gguf.TokenType.NORMAL if i in rev else gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_add_bos_token(False)
    def add(name, a):
        # The matrices in `quant` (gguf-py quantizes Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), the rest f32.
        if quant and a.ndim >= 2:
            qtype = getattr(gguf.GGMLQuantizationType, quant)
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    experts = {}  # (layer, proj) -> {expert: tensor}, stacked into one [n_expert, rows, cols] each
    weights = load_file(src / "model.safetensors")
    if cfg["model_type"] == "qwen2_moe" and "lm_head.weight" not in weights:
        # llama.cpp's qwen2moe needs an output matrix; its converter writes the tied one.
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    for name, t in weights.items():
        if ".mlp.experts." in name:
            _, _, layer, _, _, e, proj, _ = name.split(".")
            experts.setdefault((layer, proj), {})[int(e)] = t.to(torch.float32)
            continue
        if name == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif name == "model.norm.weight":
            name = "output_norm.weight"
        elif name == "lm_head.weight":
            name = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            base, kind = rest.rsplit(".", 1)
            name = f"blk.{layer}.{LAYER_NAMES[base]}.{kind}"
            if base == "mlp.shared_expert_gate":
                t = t.reshape(-1)  # llama.cpp's shared-expert gate is a vector
        add(name, t.to(torch.float32).numpy())
    for (layer, proj), per_expert in experts.items():
        stacked = torch.stack([per_expert[e] for e in sorted(per_expert)])
        add(f"blk.{layer}.ffn_{proj.removesuffix('_proj')}_exps.weight", stacked.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--yarn", nargs=2, metavar=("FACTOR", "ORIGINAL"))
    ap.add_argument("--llama-yarn", nargs=2, metavar=("FACTOR", "ORIGINAL"))
    ap.add_argument("--quant", help="the weight matrices in this GGUF type (Q8_0, Q4_0, ...); else f32")
    ap.add_argument("--port", type=int, default=18291)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    work = Path(os.environ.get("TMPDIR", "/tmp")) / "sieve-llamacpp"
    work.mkdir(exist_ok=True)
    sieve_file, llama_file = work / "sieve.gguf", work / "llama.gguf"
    write_gguf(args.checkpoint, sieve_file, args.yarn, args.quant)
    write_gguf(args.checkpoint, llama_file, args.llama_yarn or args.yarn, args.quant)
    tok = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    query, items = gpu_bench.make_calls(7, [8], 1, 20, 12)[8][0]
    ids = [enc(gpu_bench.PREFIX) + enc(gpu_bench.body(query, it)) + enc(gpu_bench.SUFFIX) for it in items]
    payload = json.dumps([ids, tok.token_to_id("yes"), tok.token_to_id("no")]).encode()
    # As a file: node-llama-cpp finds its prebuilt binary from a module file, not from `node -e`.
    (work / "llama.mjs").write_text(LLAMA)
    llama = json.loads(subprocess.run(["node", str(work / "llama.mjs"), str(llama_file)],
                                      input=payload, capture_output=True, check=True).stdout)
    # qwen2_moe's default template is ChatML's; the prompts are Qwen3-Reranker's.
    config = work / "worker.toml"
    config.write_text(f"[template]\nsuffix = {json.dumps(gpu_bench.SUFFIX)}\n")
    worker = subprocess.Popen([str(REPO / "target/debug/sieve-worker"), "--model", str(sieve_file), "--config", str(config),
                               "--port", str(args.port), "--admin-port", str(args.port + 1000)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port + 1000}/ready", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        scores = gpu_bench.post(f"http://127.0.0.1:{args.port}/v1/score", {"query": query, "items": items})["scores"]
    finally:
        worker.terminate()
        worker.wait()
    diffs = sorted(abs(gpu_bench.logit(s) - l) for s, l in zip(scores, llama))
    print(f"{len(diffs)} prompts of {min(map(len, ids))}-{max(map(len, ids))} tokens, {args.checkpoint.name} "
          f"({args.quant or 'F32'}); Sieve (GGUF yarn {args.yarn}) "
          f"against llama.cpp (yarn {args.llama_yarn or args.yarn}): |Δ logit| p50 {diffs[len(diffs) // 2]:.2g}, "
          f"max {diffs[-1]:.2g}")


if __name__ == "__main__":
    main()
