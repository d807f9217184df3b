"""Sends vLLM's example request bodies as raw HTTP, as vLLM's own example clients do (with
`requests` and `httpx`; vLLM itself is not installed), against a Sieve server
(tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents", "model"} as JSON on stdin; prints one JSON object, each
entry {"status", "body"}:
  rerank:      POST /rerank     {"model", "query", "documents"}           (jinaai_rerank_client.py)
  v1_rerank:   POST /v1/rerank  the same body, top_n 3                    (httpx)
  v2_rerank:   POST /v2/rerank  the same body                             (httpx)
  score:       POST /score      {"model", "text_1", "text_2"}             (openai_cross_encoder_score.py)
  score_pairs: POST /score      text_1 a list: one copy of the query per text_2 entry
  v1_score:    POST /v1/score   the score body (vLLM serves it there too)  (httpx)
"""

import json
import sys

import httpx
import requests


def answer(r):
    return {"status": r.status_code, "body": r.json()}


def main():
    args = json.load(sys.stdin)
    url, query, docs, model = args["base_url"], args["query"], args["documents"], args["model"]
    headers = {"User-Agent": "Test Client"}
    rerank = {"model": model, "query": query, "documents": docs}
    score = {"model": model, "text_1": query, "text_2": docs}
    pairs = {"model": model, "text_1": [query] * len(docs), "text_2": docs}
    out = {
        "rerank": answer(requests.post(f"{url}/rerank", headers=headers, json=rerank, timeout=30)),
        "score": answer(requests.post(f"{url}/score", headers=headers, json=score, timeout=30)),
        "score_pairs": answer(requests.post(f"{url}/score", headers=headers, json=pairs, timeout=30)),
    }
    with httpx.Client(timeout=30) as client:
        out["v1_rerank"] = answer(client.post(f"{url}/v1/rerank", json={**rerank, "top_n": 3}))
        out["v2_rerank"] = answer(client.post(f"{url}/v2/rerank", json=rerank))
        out["v1_score"] = answer(client.post(f"{url}/v1/score", json=score))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
