"""Plain values the client hands back: results, summaries, system descriptions, enums."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

from ._proto import pb

__all__ = ["Layout", "SystemStatus", "Timings", "Summary", "Result", "SystemInfo", "MemoryRegion",
           "Progress", "ResidualHistory"]


class Layout(enum.IntEnum):
    """How a batch of tridiagonal or tree systems is laid out (the proto's ``Layout``).

    FLAT: each system contiguous, arrays ``batch x n``.
    INTERLEAVED: element k of every system together, arrays ``n x batch``.
    """

    FLAT = 0
    INTERLEAVED = 1


class SystemStatus(enum.IntEnum):
    """What became of one system (the proto's ``SystemStatus``); a system not OK has x = 0."""

    OK = 0
    SINGULAR = 1        # a pivot vanished
    NOT_CONVERGED = 2   # an iterative method stopped at its iteration limit above tolerance
    DIVERGED = 3        # an iterative method produced non-finite values


@dataclass
class Timings:
    """Where the time went, in microseconds: the server's phases, and the client's whole call."""

    receive_us: float = 0.0
    queue_us: float = 0.0
    h2d_us: float = 0.0
    compute_us: float = 0.0
    d2h_us: float = 0.0
    residual_us: float = 0.0
    total_us: float = 0.0          # the server's: first byte received to answer ready
    client_total_us: float = 0.0   # this client's: call started to answer decoded


@dataclass
class ResidualHistory:
    """An iterative solve's relative residual at the checks it made (``residual_history=True``):
    ``iterations`` (int64, increasing, from 0) and ``residuals`` (float64), the last pair the
    summary's ``iterations`` and ``residual``. At most 1024 points: past that the server keeps
    every other one and records at twice the stride, so they span the whole solve evenly."""

    iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    def __len__(self) -> int:
        return int(self.iterations.size)

    @classmethod
    def from_proto(cls, points) -> "ResidualHistory":
        return cls(iterations=np.array([p.iteration for p in points], dtype=np.int64),
                   residuals=np.array([p.residual for p in points], dtype=np.float64))

    def to_csv(self, path) -> None:
        """Writes ``iteration,residual`` lines (what ``trisolve solve --history-output`` writes
        and ``python3 -m trisolve plot history`` reads)."""
        with open(path, "w") as out:
            out.write("iteration,residual\n")
            for it, r in zip(self.iterations.tolist(), self.residuals.tolist()):
                out.write(f"{it},{r!r}\n")

    @classmethod
    def from_csv(cls, path) -> "ResidualHistory":
        """Reads what :meth:`to_csv` writes; ``ValueError`` naming the line otherwise."""
        its, res = [], []
        with open(path) as f:
            header = f.readline().strip()
            if header != "iteration,residual":
                raise ValueError(f"{path}: expected the header 'iteration,residual', "
                                 f"got {header[:40]!r}")
            for n, line in enumerate(f, start=2):
                if not line.strip():
                    continue
                parts = line.strip().split(",")
                try:
                    if len(parts) != 2:
                        raise ValueError
                    its.append(int(parts[0]))
                    res.append(float(parts[1]))
                except ValueError:
                    raise ValueError(f"{path}:{n}: expected ITERATION,RESIDUAL, got "
                                     f"{line.strip()[:40]!r}") from None
        return cls(iterations=np.array(its, dtype=np.int64), residuals=np.array(res))


@dataclass
class Progress:
    """Where a solve is (``progress=`` callbacks), as the server reports it.

    ``phase``: ``"received"`` (``bytes_total``: the request's arrays), ``"queued"``,
    ``"solving"`` (iterative methods: ``iteration``, ``residual`` at the last check -- NaN before
    the first -- and the request's ``max_iterations`` and ``tol``; ``max_iterations`` is 0 for a
    direct method), ``"sending"`` (``bytes_total``: x's, 0 when x goes into shared memory).
    Phases only move forward, and iterations too. ``elapsed_s``: since the server got the call.
    """

    phase: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    iteration: int = 0
    max_iterations: int = 0
    residual: float = float("nan")
    tol: float = 0.0
    elapsed_s: float = 0.0

    _PHASES = {1: "received", 2: "queued", 3: "solving", 4: "sending"}

    @classmethod
    def from_proto(cls, p: "pb.Progress") -> "Progress":
        return cls(phase=cls._PHASES.get(int(p.phase), "unknown"), bytes_done=p.bytes_done,
                   bytes_total=p.bytes_total, iteration=p.iteration,
                   max_iterations=p.max_iterations,
                   residual=p.residual if p.HasField("residual") else float("nan"),
                   tol=p.tol, elapsed_s=p.elapsed_s)


@dataclass
class Summary:
    """The server's summary of a solve (the proto's ``SolveSummary``), plus ``streamed``.

    ``residual``: for direct methods the largest normwise backward error over the OK systems
    (NaN with ``skip_residual``); for iterative methods the final ``||f - A y||_2 / ||f||_2``.
    """

    method: str = ""
    backend: str = ""
    systems: int = 0
    ok: int = 0
    singular: int = 0
    not_converged: int = 0
    diverged: int = 0
    iterations: int = 0
    residual: float = 0.0
    timings: Timings = field(default_factory=Timings)
    request_id: str = ""
    batched_with: int = 0
    right_hand_sides: int = 0
    handle: str = ""
    streamed: bool = False  # the job went through SolveStream in chunks
    # How the arrays travelled: "grpc" (bytes in one message), "grpc-stream" (SolveStream's
    # chunks), "shared-memory" (some array or x by reference to a registered region) or
    # "streams" (written into the server's memory over parallel connections, x read back).
    transport: str = "grpc"
    # Where the request asked (block-tridiagonal, ``residual_history=True``); else empty.
    residual_history: ResidualHistory = field(default_factory=ResidualHistory)

    @classmethod
    def from_proto(cls, s: "pb.SolveSummary", streamed: bool = False,
                   transport: str = "grpc") -> "Summary":
        t = s.timings
        return cls(
            method=s.method, backend=s.backend, systems=s.systems, ok=s.ok, singular=s.singular,
            not_converged=s.not_converged, diverged=s.diverged, iterations=s.iterations,
            residual=s.residual,
            timings=Timings(receive_us=t.receive_us, queue_us=t.queue_us, h2d_us=t.h2d_us,
                            compute_us=t.compute_us, d2h_us=t.d2h_us, residual_us=t.residual_us,
                            total_us=t.total_us),
            request_id=s.request_id, batched_with=s.batched_with,
            right_hand_sides=s.right_hand_sides, handle=s.handle, streamed=streamed,
            transport="grpc-stream" if streamed else transport,
            residual_history=ResidualHistory.from_proto(s.residual_history))


@dataclass
class Result:
    """A solve's answer.

    Attributes:
        x: the solution, a new writable NumPy array with the right-hand side's shape and layout,
            in the dtype the request travelled in (see the dtype rule in :mod:`trisolve`); with
            ``out=``, that array itself (the server wrote into it when it lies in registered
            shared memory, the client copied into it otherwise).
        status: one :class:`SystemStatus` value a system, as an ``int8`` array (compare with
            ``SystemStatus.OK``).
        summary: the server's :class:`Summary`.
    """

    x: np.ndarray
    status: np.ndarray
    summary: Summary

    @property
    def ok(self) -> bool:
        """Whether every system came back OK."""
        return bool(np.all(self.status == SystemStatus.OK))


_DTYPES = {pb.FLOAT64: np.dtype("<f8"), pb.FLOAT32: np.dtype("<f4")}


def numpy_dtype(proto_dtype: int) -> np.dtype:
    """The NumPy dtype (little-endian) of a proto ``DType``."""
    try:
        return _DTYPES[proto_dtype]
    except KeyError:
        raise ValueError(f"the server sent dtype {proto_dtype}, expected FLOAT64 or FLOAT32") from None


def proto_dtype(dt: np.dtype) -> int:
    return pb.FLOAT64 if np.dtype(dt).itemsize == 8 else pb.FLOAT32


@dataclass
class SystemInfo:
    """A persistent system as the server describes it (the proto's ``SystemInfo``)."""

    handle: str
    label: str
    family: str                 # "tridiagonal", "tree", "block-tridiagonal", "dense"
    dtype: Optional[np.dtype]   # float64 or float32
    layout: Layout
    method: str                 # what a solve runs
    prepared: str               # what the server keeps (e.g. "lu factors on the device")
    rhs_shape: Tuple[int, ...]  # the shape of one right-hand side
    bytes: int                  # memory the system holds on the server
    ttl_s: float
    idle_s: float
    solves: int
    updates: int
    systems: int = 1            # the batch's systems (a tree's cells)
    variable: bool = False      # systems of different sizes (lengths): rhs_shape is (total,)

    @classmethod
    def from_proto(cls, s: "pb.SystemInfo") -> "SystemInfo":
        return cls(handle=s.handle, label=s.label, family=s.family,
                   dtype=_DTYPES.get(s.dtype), layout=Layout(s.layout), method=s.method,
                   prepared=s.prepared, rhs_shape=tuple(s.rhs_shape), bytes=s.bytes,
                   ttl_s=s.ttl_s, idle_s=s.idle_s, solves=s.solves, updates=s.updates,
                   systems=s.systems, variable=s.variable)


@dataclass
class MemoryRegion:
    """A registered shared-memory region, or server memory allocated for parallel streams, as
    the server describes it (the proto's ``MemoryRegion``)."""

    name: str
    key: str
    bytes: int
    pinned: bool   # page-locked for the device's copies
    ttl_s: float
    idle_s: float
    uses: int      # requests that read or wrote it
    server_owned: bool = False  # the server's own memory (parallel streams' upload regions)

    @classmethod
    def from_proto(cls, r: "pb.MemoryRegion") -> "MemoryRegion":
        return cls(name=r.name, key=r.key, bytes=r.bytes, pinned=r.pinned, ttl_s=r.ttl_s,
                   idle_s=r.idle_s, uses=r.uses, server_owned=r.server_owned)
