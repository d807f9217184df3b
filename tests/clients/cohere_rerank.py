"""Reranks with the real cohere SDK against a Sieve server (tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents", "top_n", "titles"} as JSON on stdin; prints one JSON
object:
  v1, v2:     what cohere.Client().rerank and cohere.ClientV2().rerank returned
  v1_async, v2_async: the same through cohere.AsyncClient and cohere.AsyncClientV2
  v1_objects: cohere.Client().rerank with the documents as {"text"} objects and rank_fields
  v1_fields:  documents as {"id", "title", "text"} objects, ranked on rank_fields ["title", "text"]
              (each {"id", "results": [{"index", "relevance_score", "text", "id"}]}, text null when
              the answer carries no document)
  refused:    {"status", "body"} of a v1 call with an option Sieve refuses (max_chunks_per_doc)
  wrong_model: {"status", "body"} of a v2 call naming a model the server does not serve
"""

import asyncio
import json
import sys

import cohere


def results(resp):
    # v2 results have no `document` attribute at all when the answer carries none.
    docs = [getattr(r, "document", None) for r in resp.results]
    out = []
    for r, d in zip(resp.results, docs):
        text = None
        if d is not None:
            text = d.get("text") if isinstance(d, dict) else getattr(d, "text", None)
        # Fields the SDK does not declare are kept by its models (extra = allow).
        extra = getattr(r, "model_extra", None) or {}
        out.append({"index": r.index, "relevance_score": r.relevance_score, "text": text, "id": extra.get("id")})
    return {"id": resp.id, "results": out}


async def run_async(url, query, docs, top_n):
    v1 = cohere.AsyncClient(api_key="sieve-local", base_url=url, timeout=30)
    v2 = cohere.AsyncClientV2(api_key="sieve-local", base_url=url, timeout=30)
    a, b = await asyncio.gather(
        v1.rerank(model="rerank-v3.5", query=query, documents=docs, top_n=top_n),
        v2.rerank(model="rerank-v3.5", query=query, documents=docs, top_n=top_n),
    )
    return results(a), results(b)


def main():
    args = json.load(sys.stdin)
    url, query, docs, top_n = args["base_url"], args["query"], args["documents"], args["top_n"]
    # Any key: Sieve's API port takes none; the SDK insists on one. "rerank-v3.5" is an alias
    # of the served model in the test's [api] model_aliases.
    v1 = cohere.Client(api_key="sieve-local", base_url=url, timeout=30)
    v2 = cohere.ClientV2(api_key="sieve-local", base_url=url, timeout=30)
    fields = [{"id": f"doc-{i}", "title": t, "text": d} for i, (t, d) in enumerate(zip(args["titles"], docs))]
    out = {
        "v1": results(v1.rerank(model="rerank-v3.5", query=query, documents=docs, top_n=top_n, return_documents=True)),
        "v2": results(v2.rerank(model="rerank-v3.5", query=query, documents=docs, top_n=top_n)),
        # v1 also takes documents as objects, ranked on the fields rank_fields names.
        "v1_objects": results(
            v1.rerank(
                model="rerank-v3.5",
                query=query,
                documents=[{"text": d} for d in docs],
                top_n=top_n,
                rank_fields=["text"],
            )
        ),
        "v1_fields": results(
            v1.rerank(model="rerank-v3.5", query=query, documents=fields, top_n=top_n, rank_fields=["title", "text"])
        ),
    }
    out["v1_async"], out["v2_async"] = asyncio.run(run_async(url, query, docs, top_n))
    try:
        v1.rerank(model="rerank-v3.5", query=query, documents=docs, max_chunks_per_doc=4)
        out["refused"] = None
    except cohere.core.api_error.ApiError as e:
        out["refused"] = {"status": e.status_code, "body": e.body}
    try:
        v2.rerank(model="no-such-model", query=query, documents=docs)
        out["wrong_model"] = None
    except cohere.core.api_error.ApiError as e:
        out["wrong_model"] = {"status": e.status_code, "body": e.body}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
