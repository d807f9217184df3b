"""Ranks with cohere-haystack's CohereRanker, with its defaults (model "rerank-v3.5", top_k 10,
max_tokens_per_doc 4096) but the server's address and a key, against a Sieve server, sync and
async (tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents"} as JSON on stdin; prints one JSON object:
  sync, async: [{"index", "score"}], best first
"""

import asyncio
import json
import os
import sys

# No usage telemetry from a test (the machine has no way out anyway).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document  # noqa: E402
from haystack.utils import Secret  # noqa: E402
from haystack_integrations.components.rankers.cohere import CohereRanker  # noqa: E402


def ranked(out):
    return [{"index": d.meta["i"], "score": d.score} for d in out["documents"]]


def main():
    args = json.load(sys.stdin)
    url, query, docs = args["base_url"], args["query"], args["documents"]
    documents = [Document(content=d, meta={"i": i}) for i, d in enumerate(docs)]
    ranker = CohereRanker(api_base_url=url, api_key=Secret.from_token("sieve-local"))
    ranker.warm_up()
    out = {"sync": ranked(ranker.run(query=query, documents=documents))}
    out["async"] = ranked(asyncio.run(ranker.run_async(query=query, documents=documents)))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
