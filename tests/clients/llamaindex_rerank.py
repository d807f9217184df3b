"""Reranks with LlamaIndex's text-embeddings-inference and Jina rerank postprocessors against a
Sieve server (tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents", "top_n"} as JSON on stdin; prints one JSON object:
  tei:   TextEmbeddingInference (POST {base_url}/rerank, TEI's shape) -> [{"index", "score"}], best first
  jina:  JinaRerank (POST {base_url}/v1/rerank, Jina's shape)          -> [{"index", "score"}], best first
"""

import json
import sys

from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.postprocessor.jinaai_rerank import JinaRerank
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference


def ranked(postprocessor, query, docs):
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i)), score=0.0) for i, d in enumerate(docs)]
    out = postprocessor.postprocess_nodes(nodes, query_bundle=QueryBundle(query_str=query))
    return [{"index": int(n.node.id_), "score": n.score} for n in out]


def main():
    args = json.load(sys.stdin)
    url, query, docs, top_n = args["base_url"], args["query"], args["documents"], args["top_n"]
    tei = TextEmbeddingInference(base_url=url, top_n=top_n, timeout=30)
    # Any key: Sieve's API port takes none. JinaRerank's default model is an alias of the served one.
    jina = JinaRerank(base_url=f"{url}/v1", api_key="sieve-local", top_n=top_n)
    json.dump({"tei": ranked(tei, query, docs), "jina": ranked(jina, query, docs)}, sys.stdout)


if __name__ == "__main__":
    main()
