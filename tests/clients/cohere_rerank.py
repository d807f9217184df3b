"""Reranks with the real cohere SDK against a Sieve server (tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents", "top_n"} as JSON on stdin; prints one JSON object:
  v1, v2:   what cohere.Client().rerank and cohere.ClientV2().rerank returned
  v1_objects: cohere.Client().rerank with the documents as {"text"} objects and rank_fields
            ({"id", "results": [{"index", "relevance_score", "text"}]}, text null when not asked)
  refused:  {"status", "body"} of a v1 call with an option Sieve refuses (max_chunks_per_doc)
"""

import json
import sys

import cohere


def results(resp):
    # v2 results have no `document` attribute at all.
    docs = [getattr(r, "document", None) for r in resp.results]
    return {
        "id": resp.id,
        "results": [
            {
                "index": r.index,
                "relevance_score": r.relevance_score,
                "text": d.text if d is not None else None,
            }
            for r, d in zip(resp.results, docs)
        ],
    }


def main():
    args = json.load(sys.stdin)
    url, query, docs, top_n = args["base_url"], args["query"], args["documents"], args["top_n"]
    # Any key: Sieve's API port takes none; the SDK insists on one.
    v1 = cohere.Client(api_key="sieve-local", base_url=url, timeout=30)
    v2 = cohere.ClientV2(api_key="sieve-local", base_url=url, timeout=30)
    out = {
        "v1": results(v1.rerank(model="sieve", query=query, documents=docs, top_n=top_n, return_documents=True)),
        "v2": results(v2.rerank(model="sieve", query=query, documents=docs, top_n=top_n)),
        # v1 also takes documents as objects, ranked on the fields rank_fields names.
        "v1_objects": results(
            v1.rerank(
                model="sieve",
                query=query,
                documents=[{"text": d} for d in docs],
                top_n=top_n,
                rank_fields=["text"],
            )
        ),
    }
    try:
        v1.rerank(model="sieve", query=query, documents=docs, max_chunks_per_doc=4)
        out["refused"] = None
    except cohere.core.api_error.ApiError as e:
        out["refused"] = {"status": e.status_code, "body": e.body}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
