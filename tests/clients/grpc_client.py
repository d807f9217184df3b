"""Scores and reranks over gRPC with stubs grpcio-tools generates from proto/sieve.proto, against
a Sieve server's gRPC port (tests/client_libraries.rs runs it).

Reads {"grpc": "HOST:PORT", "proto": path of sieve.proto, "query", "documents", "top_n"} as JSON
on stdin; prints one JSON object:
  score:     {"scores", "model", "prompt_tokens"}        Sieve.Score
  rerank:    {"results": [{"index", "relevance_score", "document"}], "model"}   Sieve.Rerank
  malformed: {"code"} of a Rerank call whose message is not a RerankRequest
  invalid:   {"code", "details"} of a Score call with an empty query
"""

import atexit
import importlib
import json
import os
import shutil
import sys
import tempfile

import grpc
from grpc_tools import protoc


def stubs(proto):
    out = tempfile.mkdtemp(prefix="sieve-grpc-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    # protoc wants the file under an include path spelled the same way: both absolute, no "..".
    proto = os.path.realpath(proto)
    include = os.path.dirname(proto)
    # grpcio-tools ships the well-known protos; Sieve's imports none, but the include is harmless.
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{include}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}", proto])
    if rc != 0:
        raise SystemExit(f"protoc failed ({rc}) on {proto}")
    sys.path.insert(0, out)
    return importlib.import_module("sieve_pb2"), importlib.import_module("sieve_pb2_grpc")


def main():
    args = json.load(sys.stdin)
    pb, rpc = stubs(args["proto"])
    query, docs, top_n = args["query"], args["documents"], args["top_n"]
    with grpc.insecure_channel(args["grpc"]) as channel:
        stub = rpc.SieveStub(channel)
        s = stub.Score(pb.ScoreRequest(query=query, items=[pb.Item(text=d) for d in docs]), timeout=30)
        r = stub.Rerank(
            pb.RerankRequest(query=query, documents=[pb.Item(text=d) for d in docs], top_n=top_n, return_documents=True),
            timeout=30,
        )
        out = {
            "score": {"scores": list(s.scores), "model": s.model, "prompt_tokens": s.usage.prompt_tokens},
            "rerank": {
                "results": [
                    {"index": x.index, "relevance_score": x.relevance_score, "document": x.document} for x in r.results
                ],
                "model": r.model,
            },
        }
        # Bytes that are not a RerankRequest (field 1 a string that runs past the end).
        raw = channel.unary_unary("/sieve.v1.Sieve/Rerank", request_serializer=None, response_deserializer=None)
        try:
            raw(b"\x0a\x7f\x01", timeout=30)
            out["malformed"] = {"code": "OK"}
        except grpc.RpcError as e:
            out["malformed"] = {"code": e.code().name}
        try:
            stub.Score(pb.ScoreRequest(query=" ", items=[pb.Item(text="a")]), timeout=30)
            out["invalid"] = {"code": "OK"}
        except grpc.RpcError as e:
            out["invalid"] = {"code": e.code().name, "details": e.details()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
