#!/usr/bin/env python3
"""End-to-end side-by-side for scripts/gpu-bench: a running Sieve worker over HTTP against
transformers on the same checkpoint and the same (query, item) pairs.

Sieve side: calls of 20/100/200/500 items (one call at a time, then several in flight), each
with its own query (so every call computes its prefix), timed per call; pairs/s, p50/p99, the
worker's preparing and forward time (and its tokenizing, from its metrics with `--admin`),
computed tokens/s (from the worker's `usage`) and that rate in FLOP/s against the matrix rate
measured here. One 100-item call is repeated item by item: the scores must be bit-identical
(the determinism contract on the GPU).

PyTorch side (when torch and transformers import): the pairs as users of transformers score
them (Qwen3-Reranker's published recipe): every pair its own sequence, left-padded batches,
bf16, SDPA, the yes/no logits of the last position (`logits_to_keep=1`). Same figures. Then
the probe call through transformers in f32 (TF32 off), the exact forward: Sieve must be at
least as close to it as transformers in bf16 is (`agreement`).

The prompts are Qwen3-Reranker's (PREFIX, SUFFIX below), the worker's default for qwen3 and
qwen3_moe. Another architecture's default differs (llama, qwen2: ChatML without the think block):
give its worker `[template] suffix` = SUFFIX, or the two sides score different prompts.

Writes a JSON file and prints a Markdown report section. Standard library only, plus torch
and transformers for the PyTorch side.
"""

import argparse
import functools
import json
import math
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# The worker's default template (worker/src/prompt.rs, `PromptTemplate::default`).
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

WORDS = (
    "trail running shoe waterproof leather boot kitchen knife steel set cotton shirt blue red green "
    "organic coffee bean roast dark light wireless headphone noise cancelling battery charger cable "
    "laptop stand aluminium desk lamp warm white garden hose spray nozzle yoga mat thick grip tent "
    "camping stove pot travel bag carry on wheel backpack hiking pole carbon jacket insulated down "
    "glove wool sock merino hat cap sunglasses polarized watch strap phone case clear tablet cover"
).split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def body(query, item):
    return f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {item}"


def make_calls(seed, sizes, calls_per_size, query_words, item_words):
    """Per size, `calls_per_size` calls of (query, items); queries differ from call to call."""
    rng = random.Random(seed)
    return {
        m: [(words(rng, query_words), [words(rng, item_words) for _ in range(m)]) for _ in range(calls_per_size)]
        for m in sizes
    }


def post(url, payload, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def flops_per_token(cfg, ctx):
    """Matrix FLOPs of one token through the model at context length `ctx` (projections, MLP or
    routed experts, attention), 2 per multiply-add; the score head is one dot product."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    proj = h * (nh + 2 * nkv) * hd + nh * hd * h
    if cfg.get("num_experts"):
        mlp = cfg["num_experts_per_tok"] * 3 * h * cfg["moe_intermediate_size"] + h * cfg["num_experts"]
    else:
        mlp = 3 * h * cfg["intermediate_size"]
    attn = 2 * nh * hd * ctx
    return 2 * layers * (proj + mlp + attn)


def tokenize_seconds(admin):
    """The worker's `sieve_worker_tokenize_seconds` (sum, count) from its admin port; None when
    there is no admin URL or the worker has no such metric (an earlier build)."""
    if not admin:
        return None
    try:
        text = urllib.request.urlopen(f"{admin}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    v = {}
    for line in text.splitlines():
        if line.startswith("sieve_worker_tokenize_seconds_"):
            name, value = line.split()[:2]
            v[name] = float(value)
    if "sieve_worker_tokenize_seconds_count" not in v:
        return None
    return v.get("sieve_worker_tokenize_seconds_sum", 0.0), v["sieve_worker_tokenize_seconds_count"]


def sieve_side(args, cfg, calls):
    url = f"{args.worker}/v1/score"
    out = {}
    for m, cs in calls.items():
        post(url, {"query": cs[0][0], "items": cs[0][1][: min(m, 8)], "deadline_ms": 600000})  # warm-up
        tok0 = tokenize_seconds(args.admin)
        lat, queue, compute, computed, prompt, prefix = [], [], [], 0, 0, 0
        t0 = time.perf_counter()
        for q, items in cs:
            t = time.perf_counter()
            r = post(url, {"query": q, "items": items, "deadline_ms": 600000})
            lat.append(time.perf_counter() - t)
            # The worker's own split: arrival to the forward (parsing, tokenizing, planning),
            # then the forward passes.
            queue.append(r["timing"]["queue_ms"])
            compute.append(r["timing"]["compute_ms"])
            u = r["usage"]
            computed += u["computed_tokens"]
            prompt += u["prompt_tokens"]
            prefix = u["prefix_tokens"]
        wall = time.perf_counter() - t0
        tok1 = tokenize_seconds(args.admin)
        # Several calls in flight: the worker's throughput when it is kept busy.
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as ex:
            list(ex.map(lambda c: post(url, {"query": c[0], "items": c[1], "deadline_ms": 600000}), cs))
        busy = time.perf_counter() - t0
        n = len(cs) * m
        avg_ctx = prefix + (prompt / n - prefix) / 2
        tok_s = computed / wall
        out[m] = {
            "calls": len(cs),
            "p50_ms": 1e3 * statistics.median(lat),
            "p99_ms": 1e3 * pct(lat, 0.99),
            "queue_ms_p50": statistics.median(queue),
            "compute_ms_p50": statistics.median(compute),
            "pairs_per_s": n / wall,
            "pairs_per_s_busy": n / busy,
            "computed_tokens_per_s": tok_s,
            "tflops": tok_s * flops_per_token(cfg, avg_ctx) / 1e12,
            "prefix_tokens": prefix,
            "item_tokens_avg": prompt / n - prefix,
        }
        if tok0 and tok1 and tok1[1] > tok0[1]:
            out[m]["tokenize_ms_mean"] = 1e3 * (tok1[0] - tok0[0]) / (tok1[1] - tok0[1])
        print(f"sieve {m:>4} items: {out[m]}", flush=True)
    return out


def sieve_scores(args, query, items):
    return post(f"{args.worker}/v1/score", {"query": query, "items": items, "deadline_ms": 600000})["scores"]


def batch_invariance(args, query, items):
    """The call's scores against each item alone: exact f32 equality."""
    together = sieve_scores(args, query, items)
    alone = [sieve_scores(args, query, [it])[0] for it in items]
    diffs = sum(1 for a, b in zip(together, alone) if a != b)
    return {"items": len(items), "differing": diffs, "max_abs": max(abs(a - b) for a, b in zip(together, alone))}


def matrix_rate(torch, device):
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(torch, device)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(torch, device)
    return 10 * 2 * n**3 / (time.perf_counter() - t) / 1e12


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def torch_side(args, cfg, calls):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    pre = tok.encode(PREFIX, add_special_tokens=False).ids
    suf = tok.encode(SUFFIX, add_special_tokens=False).ids
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    pad = tok.token_to_id("<|endoftext|>") or 0
    device = args.torch_device
    # bf16, as transformers' users serve; the f32 reference below is f32 throughout, not TF32.
    torch.backends.cuda.matmul.allow_tf32 = False

    def load(dtype):
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa").to(device).eval()

    def score_with(model, query, items):
        ids = [pre + tok.encode(body(query, it), add_special_tokens=False).ids + suf for it in items]
        logits = []
        for i in range(0, len(ids), args.torch_batch):
            chunk = ids[i : i + args.torch_batch]
            width = max(len(x) for x in chunk)
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], device=device)
            # Positions from each sequence's first real token, as Sieve counts them.
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                out = model(input_ids=inp, attention_mask=mask, position_ids=pos, logits_to_keep=1)
                last = out.logits[:, -1, :]
            logits.extend((last[:, yes] - last[:, no]).float().tolist())
        return logits, sum(len(x) for x in ids)

    score = functools.partial(score_with, load(torch.bfloat16))
    out = {}
    for m, cs in calls.items():
        if args.torch_agreement_only:
            break
        score(cs[0][0], cs[0][1][: min(m, 8)])  # warm-up
        lat, tokens = [], 0
        t0 = time.perf_counter()
        for q, items in cs:
            t = time.perf_counter()
            _, n_tok = score(q, items)
            sync(torch, device)
            lat.append(time.perf_counter() - t)
            tokens += n_tok
        wall = time.perf_counter() - t0
        n = len(cs) * m
        tok_s = tokens / wall
        avg_len = tokens / n
        out[m] = {
            "calls": len(cs),
            "p50_ms": 1e3 * statistics.median(lat),
            "p99_ms": 1e3 * pct(lat, 0.99),
            "pairs_per_s": n / wall,
            "computed_tokens_per_s": tok_s,
            "tflops": tok_s * flops_per_token(cfg, avg_len / 2) / 1e12,
        }
        print(f"torch {m:>4} items: {out[m]}", flush=True)
    # The reference both sides are held to: the same checkpoint in f32 (scores the probe only).
    exact = functools.partial(score_with, load(torch.float32))
    return out, score, matrix_rate(torch, device), exact


def agreement(scores, sieve, served, exact):
    """Sieve's logits against transformers' f32 forward (`exact`). Each pair is held to the
    larger of 1e-3 and transformers' own largest drift from that forward as it is served
    (`served`: bf16 on a GPU), plus the rounding of Sieve's f32 score seen as a logit
    (2^-23 / (s (1 - s))): Sieve must be at least as close to the exact forward as transformers
    is in bf16."""
    drift = max(abs(a - b) for a, b in zip(served, exact))
    bound = max(drift, 1e-3)
    diffs = [abs(a - b) for a, b in zip(sieve, exact)]
    outside = sum(1 for d, s in zip(diffs, scores) if d > bound + 2.0**-23 / max(s * (1 - s), 1e-30))
    return {
        "pairs": len(diffs),
        "p50_abs_logit_diff": sorted(diffs)[len(diffs) // 2],
        "max_abs_logit_diff": max(diffs),
        "transformers_served_drift": drift,
        "max_abs_logit_diff_to_served": max(abs(a - b) for a, b in zip(sieve, served)),
        "bound": bound,
        "outside": outside,
        "within": outside == 0,
    }


def logit(s):
    s = min(max(s, 1e-7), 1 - 1e-7)
    return math.log(s / (1 - s))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, help="the worker's API base URL, e.g. http://127.0.0.1:8081")
    ap.add_argument("--model", required=True, help="the checkpoint directory the worker serves")
    ap.add_argument("--admin", default="", help="the worker's admin base URL: the report splits out its tokenizing time")
    ap.add_argument("--label", default="dense")
    ap.add_argument("--sizes", default="20,100,200,500")
    ap.add_argument("--calls", type=int, default=8, help="calls per size")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--query-words", type=int, default=130, help="~200-token prefix with the template")
    ap.add_argument("--item-words", type=int, default=95, help="~100-token items")
    ap.add_argument("--torch", action="store_true", help="also run transformers on the same pairs")
    ap.add_argument("--torch-device", default="cuda", help="cuda, or cpu (checks the script without a GPU)")
    ap.add_argument("--torch-batch", type=int, default=64)
    ap.add_argument("--torch-agreement-only", action="store_true", help="transformers scores the probe call only, untimed")
    ap.add_argument("--matrix-tflops", type=float, default=0.0, help="the GPU's measured bf16 rate (else measured)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    cfg = json.load(open(f"{args.model}/config.json"))
    sizes = [int(s) for s in args.sizes.split(",")]
    calls = make_calls(1, sizes, args.calls, args.query_words, args.item_words)
    result = {"label": args.label, "config": {k: cfg.get(k) for k in ("model_type", "num_hidden_layers", "hidden_size")}}
    result["sieve"] = sieve_side(args, cfg, calls)
    probe_q, probe_items = calls[sizes[min(1, len(sizes) - 1)]][0]
    result["batch_invariance"] = batch_invariance(args, probe_q, probe_items[:100])
    print(f"batch invariance: {result['batch_invariance']}", flush=True)
    rate = args.matrix_tflops
    if args.torch:
        result["torch"], score, measured, exact = torch_side(args, cfg, calls)
        rate = rate or measured
        scores = sieve_scores(args, probe_q, probe_items)
        served, _ = score(probe_q, probe_items)
        want, _ = exact(probe_q, probe_items)
        result["agreement"] = agreement(scores, [logit(s) for s in scores], served, want)
        print(f"agreement: {result['agreement']}", flush=True)
    result["matrix_tflops"] = rate
    json.dump(result, open(args.json, "w"), indent=1)

    print(f"\n### {args.label}: Sieve worker over HTTP" + (" against transformers" if args.torch else "") + "\n")
    print(f"Matrix rate used: {rate:.0f} TFLOP/s (bf16 through PyTorch, this run: 8192^3 on a GPU, 1024^3 on a CPU)\n" if rate else "")
    print("| side | items | p50 ms | p99 ms | preparing (of it tokenizing, mean) / forward ms (p50) | pairs/s (1 call at a time) | pairs/s (busy) | computed tok/s | TFLOP/s | of matrix rate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for side in ("sieve", "torch"):
        for m, r in result.get(side, {}).items():
            frac = f"{100 * r['tflops'] / rate:.1f}%" if rate else "-"
            busy = f"{r['pairs_per_s_busy']:.0f}" if "pairs_per_s_busy" in r else "-"
            tok = f" ({r['tokenize_ms_mean']:.1f})" if "tokenize_ms_mean" in r else ""
            split = f"{r['queue_ms_p50']:.1f}{tok} / {r['compute_ms_p50']:.1f}" if "queue_ms_p50" in r else "-"
            print(
                f"| {side} | {m} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {split} | {r['pairs_per_s']:.0f} | {busy} | "
                f"{r['computed_tokens_per_s']:.0f} | {r['tflops']:.1f} | {frac} |"
            )
    bi = result["batch_invariance"]
    print(f"\nBatch invariance: {bi['differing']} of {bi['items']} scores differ between the call and each item alone (max |diff| {bi['max_abs']:.3g}).")
    if "agreement" in result:
        a = result["agreement"]
        print(
            f"Agreement with transformers' f32 forward over {a['pairs']} pairs: |Δ logit| p50 {a['p50_abs_logit_diff']:.3g}, "
            f"max {a['max_abs_logit_diff']:.3g}; transformers as served drifts up to {a['transformers_served_drift']:.3g} from it, "
            f"Sieve against transformers as served up to {a['max_abs_logit_diff_to_served']:.3g}. Bound {a['bound']:.3g} "
            f"(+ the f32 score's rounding): {a['outside']} outside, {'within' if a['within'] else 'OUTSIDE'}."
        )
    ok = bi["differing"] == 0 and result.get("agreement", {}).get("within", True)
    sys.exit(0 if ok else 2)


if __name__ == "__main__":
    main()
