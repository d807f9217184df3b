"""Reranks with LangChain's CohereRerank (langchain-cohere) and JinaRerank (langchain-community)
against a Sieve server, each with its defaults but the server's address and a key
(tests/client_libraries.rs runs it).

Reads {"base_url", "query", "documents"} as JSON on stdin; prints one JSON object:
  cohere: CohereRerank(model="rerank-v3.5").compress_documents (POST {base_url}/v2/rerank)
  jina:   JinaRerank().compress_documents (its default model, POST {base_url}/v1/rerank)
each [{"index", "score"}], best first (their default top_n: 3).
"""

import json
import sys

from langchain_cohere import CohereRerank
from langchain_community.document_compressors import jina_rerank
from langchain_core.documents import Document


def ranked(compressor, query, docs):
    documents = [Document(page_content=d, metadata={"i": i}) for i, d in enumerate(docs)]
    out = compressor.compress_documents(documents, query)
    return [{"index": d.metadata["i"], "score": d.metadata["relevance_score"]} for d in out]


def main():
    args = json.load(sys.stdin)
    url, query, docs = args["base_url"], args["query"], args["documents"]
    # Any key: Sieve's API port takes none.
    cohere = CohereRerank(model="rerank-v3.5", base_url=url, cohere_api_key="sieve-local")
    # JinaRerank posts to a module constant: pointing it at Sieve is how it is configured.
    jina_rerank.JINA_API_URL = f"{url}/v1/rerank"
    jina = jina_rerank.JinaRerank(jina_api_key="sieve-local")
    json.dump({"cohere": ranked(cohere, query, docs), "jina": ranked(jina, query, docs)}, sys.stdout)


if __name__ == "__main__":
    main()
