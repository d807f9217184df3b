#!/usr/bin/env python3
"""Reference dequantization of random ggml blocks, for the worker's GGUF loader tests.

Command (from the repo root):

    /work/pyref/venv/bin/python scripts/reference/gguf_dequant.py

Versions used for the committed fixture: gguf 0.19.0 (`gguf.quants.dequantize`), numpy 2.4.6.

Writes worker/tests/fixtures/gguf_dequant.json: for each ggml type, the raw bytes of a few
blocks (hex) and the f32 values `gguf.quants.dequantize` gives for them. Block bytes are random
(fixed seed) except the f16 scale fields, which are set to finite random values so the expected
values are finite.
"""
import importlib.metadata
import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "worker/tests/fixtures/gguf_dequant.json"

# Byte offsets of the f16 scale/min fields in each block type (ggml-common.h).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
N_BLOCKS = {T.F32: 16, T.F16: 16, T.BF16: 16, T.Q2_K: 2, T.Q3_K: 2, T.Q4_K: 2, T.Q5_K: 2, T.Q6_K: 2}


def random_blocks(rng, qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = N_BLOCKS.get(qtype, 4)
    if qtype == T.F32:
        return rng.normal(0, 1, n_blocks).astype("<f4").tobytes()
    if qtype == T.F16:
        return rng.normal(0, 1, n_blocks).astype("<f2").tobytes()
    if qtype == T.BF16:
        f32 = rng.normal(0, 1, n_blocks).astype("<f4")
        return (f32.view("<u4") >> 16).astype("<u2").tobytes()
    raw = bytearray(rng.integers(0, 256, n_blocks * type_size, dtype=np.uint8).tobytes())
    for b in range(n_blocks):
        for off in F16_FIELDS[qtype]:
            # Scales of either sign for the symmetric types, positive d/dmin for the k-quants.
            v = rng.uniform(0.001, 0.05) * (rng.choice([-1, 1]) if qtype in (T.Q4_0, T.Q8_0, T.Q3_K, T.Q6_K) else 1)
            at = b * type_size + off
            raw[at : at + 2] = np.array([v], dtype="<f2").tobytes()
    return bytes(raw)


def main():
    rng = np.random.default_rng(20240611)
    cases = []
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        raw = random_blocks(rng, qtype)
        values = gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32)
        assert np.all(np.isfinite(values)), qtype.name
        cases.append(
            {
                "type": qtype.name,
                "bytes_hex": raw.hex(),
                "values": [float(v) for v in values.reshape(-1)],
            }
        )
    source = (f"gguf {importlib.metadata.version('gguf')} gguf.quants.dequantize on random blocks "
              "(scripts/reference/gguf_dequant.py)")
    # One case per line keeps the file small and diffs readable.
    body = ",\n".join(json.dumps(c) for c in cases)
    OUT.write_text(f'{{"source": {json.dumps(source)},\n"cases": [\n{body}\n]}}\n')
    print(f"wrote {OUT.relative_to(REPO)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
