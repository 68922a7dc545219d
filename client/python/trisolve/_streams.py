"""Parallel streams into the server's memory, for clients on another host.

The server reserves a region of its own memory (``AllocateMemory``); the client writes a job's
arrays into it over several connections at once (``WriteMemory``, one client stream a
connection), the request refers to them as it would to a shared-memory region, the server
writes x there (``x_region``) and the client reads it back the same way (``ReadMemory``). One
gRPC connection moves a few hundred MB/s of large messages; several move several times that.
The rules are the C++ client's (client/transport.cc): 4 MiB chunks, a connection for every
8 MiB up to ``parallel_streams``, regions of 16 MiB doubling, kept for reuse until idle for
half their time-to-live.
"""
from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._proto import pb
from .errors import DataLoss, ResourceExhausted, from_rpc_error

CHUNK = 4 << 20
PER_LANE_MIN = 8 << 20       # less than this a connection is not worth opening
MIN_REGION = 16 << 20
MAX_REGIONS = 16             # upload regions a client keeps at most (as the C++ client)
ALIGN = 64


@dataclass
class Remote:
    """A region of the server's memory this client allocated."""
    name: str
    size: int
    ttl_s: float
    since: float = field(default_factory=time.monotonic)


def shares(total: int, parts: int) -> List[Tuple[int, int]]:
    """[0, total) in ``parts`` contiguous shares, as (begin, end)."""
    per = -(-total // parts)
    return [(b, min(total, b + per)) for b in range(0, total, per)] if total else []


def lanes_for(total: int, parallel: int) -> int:
    return max(1, min(parallel, total // PER_LANE_MIN))


def raw(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without a copy."""
    return memoryview(arr.reshape(-1).view(np.uint8))


class Streams:
    """The lanes (connections of their own) and the upload regions of one Client."""

    def __init__(self, make_stub: Callable[[], Tuple[grpc.Channel, Any]], stub: Any,
                 metadata: Callable[[], List[Tuple[str, str]]], parallel: int) -> None:
        self._make_stub = make_stub
        self._stub = stub
        self._metadata = metadata
        self.parallel = max(1, int(parallel))
        self._lock = threading.Lock()
        self._lanes: List[Tuple[grpc.Channel, Any]] = []
        self._idle: List[Remote] = []
        self._count = 0
        self._pool: Optional[ThreadPoolExecutor] = None

    # ---- regions --------------------------------------------------------------------------
    def acquire(self, need: int, timeout: Optional[float]) -> Remote:
        """An idle region of at least ``need`` bytes, or a new one."""
        with self._lock:
            now = time.monotonic()
            stale = [r for r in self._idle if now - r.since > 0.5 * r.ttl_s]
            for r in stale:  # left to expire on the server, which may have dropped them already
                self._idle.remove(r)
                self._count -= 1
            fits = [r for r in self._idle if r.size >= need]
            if fits:
                best = min(fits, key=lambda r: r.size)
                self._idle.remove(best)
                return best
            if self._count >= MAX_REGIONS:
                raise ResourceExhausted(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        "every upload region of this client is in use")
            self._count += 1
        size = MIN_REGION
        while size < need:
            size *= 2
        name = f"upload-{secrets.token_hex(8)}"
        try:
            info = self._stub.AllocateMemory(pb.AllocateMemoryRequest(name=name, bytes=size),
                                             timeout=timeout, metadata=self._metadata())
        except grpc.RpcError as e:
            with self._lock:
                self._count -= 1
            raise from_rpc_error(e) from None
        return Remote(name, size, info.ttl_s if info.ttl_s > 0 else float("inf"))

    def release(self, remote: Remote) -> None:
        remote.since = time.monotonic()
        with self._lock:
            self._idle.append(remote)

    # ---- bytes both ways ------------------------------------------------------------------
    def _lane(self, i: int) -> Any:
        with self._lock:
            while len(self._lanes) <= i:
                self._lanes.append(self._make_stub())
            return self._lanes[i][1]

    def _in_parallel(self, n: int, f: Callable[[int], None]) -> None:
        """f(i) for each i < n, lane i on a thread of its own; raises the first error."""
        if n == 1:
            f(0)
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.parallel,
                                                thread_name_prefix="trisolve-stream")
            pool = self._pool
        futures = [pool.submit(f, i) for i in range(n)]
        errors = [fut.exception() for fut in futures]
        for e in errors:
            if e is not None:
                raise e

    def upload(self, region: str, pieces: Sequence[Tuple[memoryview, int]],
               timeout: Optional[float]) -> None:
        """Writes each (bytes, offset) piece into ``region``, spread over the lanes."""
        total = sum(len(p) for p, _ in pieces)
        parts = shares(total, lanes_for(total, self.parallel))

        def lane(i: int) -> None:
            begin, end = parts[i]

            def chunks() -> Iterator[Any]:
                at = 0  # position in the concatenation of the pieces
                for data, offset in pieces:
                    lo, hi = max(begin, at), min(end, at + len(data))
                    for q in range(lo, hi, CHUNK):
                        n = min(CHUNK, hi - q)
                        yield pb.MemoryChunk(region=region, offset=offset + (q - at),
                                             data=bytes(data[q - at:q - at + n]))
                    at += len(data)

            try:
                self._lane(i).WriteMemory(chunks(), timeout=timeout, metadata=self._metadata())
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None

        self._in_parallel(len(parts), lane)

    def download(self, region: str, offset: int, dst: memoryview,
                 timeout: Optional[float]) -> None:
        """Reads ``len(dst)`` bytes of ``region`` from ``offset`` into ``dst``."""
        total = len(dst)
        parts = shares(total, lanes_for(total, self.parallel))

        def lane(i: int) -> None:
            begin, end = parts[i]
            req = pb.ReadMemoryRequest(region=region, offset=offset + begin, bytes=end - begin)
            got = 0
            try:
                for c in self._lane(i).ReadMemory(req, timeout=timeout,
                                                  metadata=self._metadata()):
                    at = c.offset - offset
                    if at < begin or at + len(c.data) > end:
                        raise DataLoss(grpc.StatusCode.DATA_LOSS,
                                       "the server sent a chunk outside the range asked for")
                    dst[at:at + len(c.data)] = c.data
                    got += len(c.data)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
            if got != end - begin:
                raise DataLoss(grpc.StatusCode.DATA_LOSS,
                               f"the server sent {got} of the {end - begin} bytes asked for")

        self._in_parallel(len(parts), lane)

    def close(self, unregister: Callable[[str], None]) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            lanes, self._lanes = self._lanes, []
            pool, self._pool = self._pool, None
        for r in idle:
            unregister(r.name)
        for ch, _ in lanes:
            ch.close()
        if pool is not None:
            pool.shutdown(wait=False)
