"""The generated stubs (trisolve/_gen, written by generate.sh from the proto; never committed)."""
from __future__ import annotations

try:
    from ._gen.trisolve.v1 import trisolve_pb2 as pb
    from ._gen.trisolve.v1 import trisolve_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a source tree that was never generated
    raise ImportError(
        "trisolve: the gRPC stubs are missing (trisolve/_gen). Run client/python/generate.sh "
        "(needs protoc and grpc_python_plugin: apt-get install protobuf-compiler "
        "protobuf-compiler-grpc), or install the package with "
        "`pip install --no-build-isolation --no-deps client/python`, which runs it. "
        f"({e})") from e

__all__ = ["pb", "pb_grpc"]
