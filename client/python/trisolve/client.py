"""The trisolve client: NumPy arrays in, NumPy arrays out, over gRPC.

Small jobs go in one message (the family's unary RPC); a job whose arrays add up to more than
``stream_threshold_bytes`` (4 MiB less 64 KiB, as the C++ client: gRPC's default message limit)
goes through ``SolveStream``: a header with the shapes, then the arrays in chunks of
``chunk_bytes`` (2 MiB), the answer coming back in chunks too. Only the server's job limits bound
a streamed job.

On the server's host, arrays in registered shared memory (:class:`trisolve.SharedMemory`,
:meth:`Client.register_memory`) travel as region references and ``x`` can be written into
it (``out=``); with ``transport="auto"`` (the default) jobs of ``shm_min_bytes`` (1 MiB) or more
are copied into a staging region of the client's and sent that way, falling back to gRPC for
good when the server cannot map this process's memory. To a server elsewhere, jobs of
``streams_min_bytes`` (32 MiB) or more are written into the server's own memory over
``parallel_streams`` (8) connections at once and x is read back the same way
(``transport="streams"`` for every job; see ``trisolve._streams``).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import grpc
import numpy as np

from . import _arrays, _replicas, _ring, _streams
from ._arrays import DTypeLike, LayoutLike
from ._proto import pb, pb_grpc
from .errors import (DataLoss, FailedPrecondition, NotFound, ResourceExhausted, TrisolveError,
                     Unavailable, error_for, from_rpc_error)
from .results import (MemoryRegion, Progress, Result, Summary, SystemInfo, Timings, numpy_dtype,
                      proto_dtype)

ProgressCallback = Callable[[Progress], Any]
# The most bytes a SolveWithProgress request carries inline: the server's default message limit
# (64 MiB) less room for the rest of the message. Larger inline jobs go through SolveStream,
# which reports no progress.
_PROGRESS_INLINE_BYTES = (64 << 20) - (64 << 10)
from .shm import ALIGN, SharedMemory

if TYPE_CHECKING:  # pragma: no cover
    from .systems import System

__all__ = ["Client", "TLS", "DEFAULT_TARGET", "TRANSPORTS"]

DEFAULT_TARGET = "127.0.0.1:50051"
TRANSPORTS = ("auto", "shm", "streams", "grpc", "ring")
# grpc.ChannelConnectivity's values, as the channel's core reports them.
_READY = grpc.ChannelConnectivity.READY.value[0]
_SHUTDOWN = grpc.ChannelConnectivity.SHUTDOWN.value[0]
_MAX_ARENAS = 16             # staging regions a client keeps at most (as the C++ client)
_MIN_ARENA = 16 << 20        # the smallest staging region; larger ones double from there
PathOrPem = Union[str, bytes, "os.PathLike[str]", None]


@dataclass
class TLS:
    """TLS settings for :class:`Client`.

    Attributes:
        ca: the CA that signed the server's certificate: a PEM file path, or PEM bytes
            (``None``: the system's roots).
        cert, key: a client certificate and its key (path or PEM bytes) for mutual TLS.
        server_name: the name checked in the server's certificate, when the target's host is
            not it (e.g. connecting to 127.0.0.1 with a certificate for "localhost").
    """

    ca: PathOrPem = None
    cert: PathOrPem = None
    key: PathOrPem = None
    server_name: Optional[str] = None


def _pem(value: PathOrPem, what: str) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    with open(os.fspath(value), "rb") as f:  # FileNotFoundError names the path
        data = f.read()
    if not data:
        raise ValueError(f"TLS {what} {os.fspath(value)} is empty")
    return data


def _tls(tls: Any) -> Optional[TLS]:
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLS()
    if isinstance(tls, TLS):
        return tls
    if isinstance(tls, Mapping):
        unknown = set(tls) - {"ca", "cert", "key", "server_name"}
        if unknown:
            raise ValueError(f"tls: unknown keys {sorted(unknown)} (expected ca, cert, key, server_name)")
        return TLS(**tls)
    return TLS(ca=getattr(tls, "ca", None), cert=getattr(tls, "cert", None),
               key=getattr(tls, "key", None), server_name=getattr(tls, "server_name", None))


# The families: the request message, the unary RPC, the oneof name in StreamRequest, and the
# arrays (user-facing name -> proto field), the right-hand side first.
@dataclass(frozen=True)
class _Family:
    name: str
    oneof: str
    request: Any
    rpc: str
    fields: Tuple[Tuple[str, str], ...]


_TRIDIAGONAL = _Family("tridiagonal", "tridiagonal", pb.TridiagonalRequest, "SolveTridiagonal",
                       (("d", "d"), ("a", "a"), ("b", "b"), ("c", "c"),
                        ("lengths", "lengths"), ("abc", "abc")))
_TREE = _Family("tree", "tree", pb.TreeRequest, "SolveTree",
                (("rhs", "rhs"), ("parent", "parent"), ("lower", "lower"), ("upper", "upper"),
                 ("diag", "diag"), ("lengths", "lengths")))
_BLOCK = _Family("block-tridiagonal", "block_tridiagonal", pb.BlockTridiagonalRequest,
                 "SolveBlockTridiagonal",
                 (("f", "f"), ("aC", "a_c"), ("cC", "c_c"), ("bC", "b_c"), ("cA", "c_a"),
                  ("cB", "c_b"), ("y0", "y0")))
_DENSE = _Family("dense", "dense", pb.DenseRequest, "SolveDense", (("b", "b"), ("A", "a")))
FAMILIES = {f.name: f for f in (_TRIDIAGONAL, _TREE, _BLOCK, _DENSE)}


def family(name: str) -> _Family:
    key = name.strip().lower().replace("_", "-")
    if key == "block":
        key = "block-tridiagonal"
    try:
        return FAMILIES[key]
    except KeyError:
        raise ValueError(f"unknown family {name!r} (expected tridiagonal, tree, "
                         "block-tridiagonal or dense)") from None


def _health_request(service: str) -> bytes:
    # grpc.health.v1.HealthCheckRequest { string service = 1; }, encoded by hand so that the
    # client needs no health stubs (Debian packages none for Python).
    data = service.encode()
    if not data:
        return b""
    n, out = len(data), bytearray(b"\x0a")
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes(out) + data


def _parse_transport(transport: str) -> str:
    t = str(transport).strip().lower()
    if t == "shared-memory":
        t = "shm"
    if t not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}: expected 'auto', 'shm', 'streams', 'grpc' "
                         "or 'ring'")
    return t


@dataclass
class _Region:
    """A region this client registered: the mapping's address range in this process."""
    shm: SharedMemory
    name: str
    start: int
    stop: int
    staging: bool = False


@dataclass
class _Placement:
    """How a call's arrays travel: by reference (refs[field]) or inline (None); where x goes."""
    refs: Dict[str, Optional[Any]]
    x_ref: Optional[Any] = None
    x_staged: Optional[np.ndarray] = None    # x in a staging region, copied out after the call
    arena: Optional[SharedMemory] = None     # the staging region held for this call
    inline_bytes: int = 0
    remote: Optional[_streams.Remote] = None  # the server's memory the arrays were written to
    # Reads x from the server's memory into the given array (parallel streams).
    fetch: Optional[Any] = None

    @property
    def by_reference(self) -> bool:
        return self.x_ref is not None or any(r is not None for r in self.refs.values())

    @property
    def transport(self) -> str:
        if self.remote is not None:
            return "streams"
        return "shared-memory" if self.by_reference else "grpc"


def overlaps(out: np.ndarray, arrays: Sequence[np.ndarray]) -> bool:
    """Whether ``out``'s memory overlaps any of ``arrays`` (x may not be written by the server
    on top of an array it reads: such an x comes back and is copied into ``out``)."""
    lo, hi = np.byte_bounds(out)
    for a in arrays:
        if a.nbytes and out.nbytes:
            alo, ahi = np.byte_bounds(a)
            if alo < hi and lo < ahi:
                return True
    return False


def check_out(out: Any, shape: Tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """``out=`` must be a writable ndarray of x's shape and the job's dtype (never converted)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, not {type(out).__name__}")
    if out.dtype != np.dtype(dt).newbyteorder("="):
        raise TypeError(f"out has dtype {out.dtype}, but x comes back as {np.dtype(dt).newbyteorder('=')}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {list(out.shape)}, but x has the right-hand side's "
                         f"shape {list(shape)}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    return out


_HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_response(data: bytes) -> str:
    # HealthCheckResponse { ServingStatus status = 1; } -- one varint field (absent: UNKNOWN).
    i, status = 0, 0
    while i < len(data):
        key = data[i]
        i += 1
        value, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if key == 0x08:
            status = value
        elif key & 7 == 2:  # a length-delimited field from a newer proto: skip it
            i += value
    return _HEALTH.get(status, str(status))


class Client:
    """A connection to a trisolve server.

    Args:
        target: ``HOST:PORT`` of ``trisolved``; or replicas: ``"HOST:PORT,HOST:PORT"``
            (resolved once, here) or ``"dns:///NAME:PORT"`` (every address of the name). Calls
            are then balanced by gRPC's ``round_robin`` over the replicas whose
            ``grpc.health.v1`` status is SERVING; those that hold no state on a replica are
            retried on another on UNAVAILABLE; a system's calls go to the replica its handle
            names (the server's ``--advertise-address``) and raise ``NotFound`` once it is gone.
            A malformed list raises ``ValueError``.
        token: a bearer token, sent as ``authorization: Bearer <token>`` on every call but the
            health check (servers started with ``--token-file``).
        tls: ``None`` (plaintext), ``True`` (TLS with the system's roots), a :class:`TLS`, a
            dict with keys ``ca``, ``cert``, ``key``, ``server_name``, or any object with those
            attributes. Files are read here, so a wrong path fails at once.
        timeout: the default deadline of each call in seconds (``None``: none). The time-step
            stream of a persistent system takes only the timeout given to ``System.stream``.
        stream_threshold_bytes: jobs whose arrays add up to more go through ``SolveStream``.
        chunk_bytes: the size of each streamed chunk (at least 1024).
        transport: how arrays travel. Arrays (and ``out=``) in shared memory registered with
            :meth:`register_memory` always go by reference. ``"auto"``: besides, jobs whose
            arrays and x reach ``shm_min_bytes`` are copied into a staging region of this
            client's and go by reference too, unless the server cannot map this process's
            memory (another host, another IPC namespace, ``--no-shared-memory``): then gRPC,
            for good. ``"shm"``: every one-shot solve, ``create_system`` and ``System.solve``
            goes through shared memory, raising the server's ``FailedPrecondition`` where it
            cannot. ``"streams"``: every such call's arrays are written into the server's own
            memory over several connections at once and x is read back the same way (for
            large jobs to a server on another host). ``"auto"`` does that too for jobs of
            ``streams_min_bytes`` or more where shared memory is not possible. ``"grpc"``: in
            the messages. ``"ring"``: every one-shot solve and ``System.solve`` without
            ``update`` goes through a request ring (below), raising ``FailedPrecondition`` where
            it cannot (another host, a server with ``--rings off``, progress reports); other
            calls take gRPC. ``"auto"`` uses a ring too for such calls whose arrays, x and
            statuses fit ``ring_max_arena_bytes`` (and, unless some lie in registered memory, are at
            most ``stream_threshold_bytes``), falling back to gRPC for good when the server
            refuses rings to this process.

            A request ring (x86-64 Linux, a client on the server's host): a shared-memory
            region of this client's with a slot the server serves from a thread of its own,
            without the socket (docs/serving.md). Each calling thread takes a ring of its own
            (at most ``max_rings``), opened on first use and kept; a call spins
            ``ring_spin_us`` for its answer where the ring's last answer came that fast, then
            sleeps on the slot's futex. A server that stops serving the ring fails the call
            (``Unavailable``) within 3 s.
        shm_min_bytes: the size from which ``"auto"`` stages a job (1 MiB).
        streams_min_bytes: the size from which ``"auto"`` uses parallel streams (32 MiB).
        parallel_streams: the connections a large job's bytes are spread over (8; one for
            every 8 MiB up to that).
        connect_timeout: seconds a call on a channel that is not connected yet waits for the
            connection (at most half the time left to its deadline) before it is sent: a
            client made just before its server listens then succeeds instead of failing
            ``Unavailable`` at once; a server that cannot be reached still fails, that much
            later. 0: no wait.
        ring_arena_bytes: each ring's room for a call's arrays, x and statuses to start with
            (256 KiB).
        ring_max_arena_bytes: the most a ring grows to under auto (1 MiB): a call whose
            copied arrays, x and statuses exceed its ring's room replaces the ring with one of
            twice the room, or more; a call larger still takes another path (from
            ``shm_min_bytes`` a staging region). The room is shared memory reserved while the
            ring is open.
        ring_spin_us: how long a call spins for its answer (50 us; 0: sleep at once).
        max_rings: rings this client holds at most (one a concurrently calling thread).

    Use it as a context manager, or call :meth:`close`, to close the channel.
    """

    def __init__(self, target: str = DEFAULT_TARGET, token: Optional[str] = None,
                 tls: Any = None, timeout: Optional[float] = None, *,
                 stream_threshold_bytes: int = (4 << 20) - (64 << 10),
                 chunk_bytes: int = 2 << 20, transport: str = "auto",
                 shm_min_bytes: int = 1 << 20, streams_min_bytes: int = 32 << 20,
                 parallel_streams: int = 8, connect_timeout: float = 2.0,
                 ring_arena_bytes: int = 256 << 10, ring_max_arena_bytes: int = 1 << 20,
                 ring_spin_us: float = 50.0, max_rings: int = 64) -> None:
        self.transport = _parse_transport(transport)
        self.connect_timeout = float(connect_timeout)
        self.ring_spin_us = float(ring_spin_us)
        self._rings = _ring.Pool(max_rings, ring_arena_bytes, ring_max_arena_bytes)
        self.shm_min_bytes = int(shm_min_bytes)
        self.streams_min_bytes = int(streams_min_bytes)
        self._shm_lock = threading.Lock()
        self._regions: List[_Region] = []
        self._shm_state = "untried"   # "shared-memory" once staging worked, "grpc" once refused
        self._idle_arenas: List[SharedMemory] = []
        # Each staging region's time-to-live on the server and when it was last used here: one
        # idle for half of it is replaced rather than sent (the server may have dropped it).
        self._arena_life: Dict[SharedMemory, Tuple[float, float]] = {}
        self._arenas = 0
        self._next_arena = 0
        self._closed = False
        self.target = target
        self.token = token
        self.timeout = timeout
        self.stream_threshold_bytes = int(stream_threshold_bytes)
        self.chunk_bytes = max(int(chunk_bytes), 1024)
        options: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # As the server: bulk arrays want large HTTP/2 frames and a deep receive window.
            ("grpc.http2.max_frame_size", 4 << 20),
            ("grpc.http2.lookahead_bytes", 64 << 20),
            # A failed connection attempt is tried again after this (gRPC's default: 1 s,
            # growing 1.6 times an attempt): a call waiting for its connection
            # (connect_timeout) gets the next attempt within its wait.
            ("grpc.initial_reconnect_backoff_ms", 100),
        ]
        t = _tls(tls)
        creds = None
        if t is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_pem(t.ca, "CA"), private_key=_pem(t.key, "key"),
                certificate_chain=_pem(t.cert, "certificate"))
            if t.server_name:
                options.append(("grpc.ssl_target_name_override", t.server_name))
        spec = _replicas.parse_target(target)

        def make(dial: str, balanced: bool, own: bool = False) -> Tuple[grpc.Channel, Any]:
            opts = list(options)
            if own:  # a connection of its own, not the one the default channel shares
                opts.append(("grpc.use_local_subchannel_pool", 1))
            if spec.balanced:  # the balanced channel and each handle's replica's
                opts += _replicas.KEEPALIVE_OPTIONS
            if balanced:
                opts += [("grpc.service_config", _replicas.service_config_json()),
                         ("grpc.per_rpc_retry_buffer_size", _replicas.RETRY_BUFFER_BYTES)]
            # Addresses dialled: the certificate names the service, not each address.
            if t is not None and not t.server_name and spec.tls_name and (
                    not balanced or not spec.dns_host):
                opts.append(("grpc.ssl_target_name_override", spec.tls_name))
            ch = (grpc.insecure_channel(dial, options=opts) if creds is None
                  else grpc.secure_channel(dial, creds, options=opts))
            return ch, pb_grpc.SolverStub(ch)

        self._channel, self._stub = make(spec.dial, spec.balanced)
        self._replicas = _replicas.Replicas(spec, make)
        self._streams = _streams.Streams(lambda: make(spec.dial, False, True), self._stub,
                                         self._metadata, parallel_streams)
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=_health_request,
            response_deserializer=_health_response)

    # ---- plumbing ------------------------------------------------------------------------
    def close(self) -> None:
        """Unregisters the shared memory registered through this client (best effort), closes
        its staging regions and the channel."""
        with self._shm_lock:
            if self._closed:
                return
            self._closed = True
            regions, self._regions = self._regions, []
            idle, self._idle_arenas = self._idle_arenas, []
        with self._rings.lock:
            lanes, self._rings.idle = self._rings.idle, []
        for lane in lanes:
            self._close_ring(lane)
        for r in regions:
            r.shm._clients.discard(self)
            self._unregister_quietly(r.name)
            if r.staging:
                r.shm.close()
        for a in idle:
            a.close()
        self._streams.close(self._unregister_quietly)
        self._replicas.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"trisolve.Client({self.target!r})"

    def _metadata(self, request_id: Optional[str] = None) -> List[Tuple[str, str]]:
        md = []
        if self.token:
            md.append(("authorization", f"Bearer {self.token}"))
        if request_id:
            md.append(("x-request-id", request_id))
        return md

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _await_connection(self, timeout: Optional[float]) -> None:
        """Before a call: returns once the channel is connected, or after ``connect_timeout``
        (at most half the time left to the call's deadline); the call then fails as gRPC
        says. Asks the channel's core directly (as the C++ client's GetState and
        WaitForStateChange): ``subscribe`` would start a polling thread that outlives
        ``close``."""
        core = getattr(self._channel, "_channel", None)
        if self.connect_timeout <= 0 or not hasattr(core, "check_connectivity_state"):
            return
        state = core.check_connectivity_state(True)
        if state in (_READY, _SHUTDOWN):
            return
        wait = self.connect_timeout
        t = self._timeout(timeout)
        if t is not None:
            wait = min(wait, max(0.0, t) / 2)
        until = time.time() + wait  # watch_connectivity_state takes a wall-clock deadline
        while state not in (_READY, _SHUTDOWN):
            if time.time() >= until or not core.watch_connectivity_state(state, until).success:
                return
            state = core.check_connectivity_state(True)

    def _unary(self, rpc: str, request: Any, timeout: Optional[float] = None,
               request_id: Optional[str] = None, wait: bool = True) -> Any:
        if wait:
            self._await_connection(timeout)
        try:
            return getattr(self._stub, rpc)(request, timeout=self._timeout(timeout),
                                            metadata=self._metadata(request_id))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _by_handle(self, handle: str) -> Tuple[Any, bool]:
        """The stub for a handle's calls, and whether it is the handle's own replica's."""
        try:
            routed = self._replicas.for_handle(handle)
        except LookupError as e:
            raise NotFound(grpc.StatusCode.NOT_FOUND, str(e)) from None
        except ConnectionError as e:
            raise Unavailable(grpc.StatusCode.UNAVAILABLE, str(e)) from None
        return (self._stub, False) if routed is None else (routed[1], True)

    @staticmethod
    def _handle_error(e: grpc.RpcError, handle: str, routed: bool) -> TrisolveError:
        """UNAVAILABLE from the replica that held the system: it is gone with it (NotFound)."""
        err = from_rpc_error(e)
        if routed and err.code == grpc.StatusCode.UNAVAILABLE:
            return NotFound(grpc.StatusCode.NOT_FOUND,
                            f"system {handle}: its replica {_replicas.replica_of(handle)} is "
                            f"unavailable and its systems with it ({err.message})")
        return err

    def _handle_unary(self, rpc: str, handle: str, request: Any,
                      timeout: Optional[float] = None) -> Any:
        stub, routed = self._by_handle(handle)
        if not routed:
            self._await_connection(timeout)
        try:
            return getattr(stub, rpc)(request, timeout=self._timeout(timeout),
                                      metadata=self._metadata())
        except grpc.RpcError as e:
            raise self._handle_error(e, handle, routed) from None

    # ---- service -------------------------------------------------------------------------
    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """The ``grpc.health.v1`` status of ``service`` ("" = the whole server):
        ``"SERVING"``, ``"NOT_SERVING"`` (draining), ``"SERVICE_UNKNOWN"``, ``"UNKNOWN"``.
        Sends no token (the health service stays open on servers that check tokens)."""
        try:
            return self._health(service, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def server_info(self, timeout: Optional[float] = None) -> "pb.ServerInfo":
        """The server's ``ServerInfo`` message (a protobuf: ``.version``, ``.backend``,
        ``.cpu_threads``, ``.devices``, ``.limits.max_message_bytes``, ``.jobs_done``, ...)."""
        return self._unary("GetServerInfo", pb.GetServerInfoRequest(), timeout)

    # ---- shared memory --------------------------------------------------------------------
    def register_memory(self, shm: SharedMemory, name: Optional[str] = None, *,
                        ttl_s: float = 0.0, timeout: Optional[float] = None) -> MemoryRegion:
        """Registers ``shm`` with the server, which maps it once: from then on arrays that lie in
        it (C-contiguous, in the dtype they travel in) go by reference, and an ``out=`` in it
        gets x written by the server.

        Args:
            shm: a :class:`trisolve.SharedMemory`.
            name: the region's name on the server (``[A-Za-z0-9._-]``, at most 64 characters,
                unique for this token); default: ``shm.name``.
            ttl_s: idle seconds after which the server drops the registration (0: its default).

        Raises:
            FailedPrecondition: the server cannot map it (another host or IPC namespace, another
                user, or started with ``--no-shared-memory``).
            AlreadyExists: this token has a region of that name already (e.g. the same memory
                registered through another client: give it another ``name``).
            ResourceExhausted: over the server's regions or bytes per identity.
            ValueError: ``shm`` is closed, or already registered with this client.
        """
        return self._register(shm, name or shm.name, ttl_s, timeout, staging=False)

    def _register(self, shm: SharedMemory, name: str, ttl_s: float, timeout: Optional[float],
                  staging: bool) -> MemoryRegion:
        if shm.closed:
            raise ValueError(f"{shm!r} is closed")
        if self._replicas.spec.balanced:
            # A region lives on one replica; the balanced channel sends calls to any of them.
            raise FailedPrecondition(
                grpc.StatusCode.FAILED_PRECONDITION,
                "shared memory needs a client of one server: this one balances over replicas")
        with self._shm_lock:
            for r in self._regions:
                if r.shm is shm:
                    raise ValueError(f"{shm!r} is registered with this client already (as {r.name!r})")
        req = pb.RegisterSharedMemoryRequest(name=name, key=shm.key, offset=0, bytes=shm.size,
                                             ttl_s=float(ttl_s))
        info = MemoryRegion.from_proto(self._unary("RegisterSharedMemory", req, timeout))
        with self._shm_lock:
            self._regions.append(_Region(shm, name, shm.address, shm.address + shm.size, staging))
        shm._clients.add(self)
        return info

    def unregister_memory(self, shm: SharedMemory, timeout: Optional[float] = None) -> MemoryRegion:
        """Unregisters ``shm`` (its arrays travel as bytes again); the server unmaps it.
        ``ValueError`` when it is not registered with this client."""
        region = self._take_region(shm)
        if region is None:
            raise ValueError(f"{shm!r} is not registered with this client")
        return MemoryRegion.from_proto(self._unary(
            "UnregisterMemory", pb.UnregisterMemoryRequest(name=region.name), timeout))

    def list_memory(self, timeout: Optional[float] = None) -> List[MemoryRegion]:
        """The regions this identity (token) has registered on the server."""
        resp = self._unary("ListMemory", pb.ListMemoryRequest(), timeout)
        return [MemoryRegion.from_proto(r) for r in resp.regions]

    @property
    def shared_memory_state(self) -> str:
        """``"shared-memory"`` once a staging region was registered, ``"grpc"`` when the
        transport is grpc or auto found the server cannot map this process's memory,
        ``"untried"`` before."""
        with self._shm_lock:
            if self.transport == "grpc":
                return "grpc"
            return self._shm_state

    def _take_region(self, shm: SharedMemory) -> Optional[_Region]:
        with self._shm_lock:
            for i, r in enumerate(self._regions):
                if r.shm is shm:
                    del self._regions[i]
                    shm._clients.discard(self)
                    return r
        return None

    def _unregister_quietly(self, name: str) -> None:
        try:
            # Best effort: no wait for a connection that is not there.
            self._unary("UnregisterMemory", pb.UnregisterMemoryRequest(name=name), 5.0,
                        wait=False)
        except (TrisolveError, ValueError):
            pass  # the server is gone, or dropped it already: its time-to-live ends it anyway

    def _forget_memory(self, shm: SharedMemory) -> None:
        """``shm`` is closing: no reference to it may be sent again."""
        region = self._take_region(shm)
        if region is not None and not self._closed:
            self._unregister_quietly(region.name)

    def _ref_of(self, arr: Optional[np.ndarray]) -> Optional[Any]:
        """The RegionRef of ``arr`` when it lies in registered memory, is C-contiguous, little-
        endian and aligned for its type; None otherwise (it travels as bytes)."""
        if arr is None or not self._regions or arr.nbytes == 0:
            return None
        if not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
            return None
        start = int(arr.__array_interface__["data"][0])
        if start % arr.dtype.itemsize:
            return None
        stop = start + arr.nbytes
        with self._shm_lock:
            for r in self._regions:
                if r.start <= start and stop <= r.stop and not r.shm.closed:
                    return pb.RegionRef(region=r.name, offset=start - r.start, bytes=arr.nbytes)
        return None

    def _place(self, arrays: Mapping[str, np.ndarray], out: Optional[np.ndarray],
               x_shape: Optional[Tuple[int, ...]], dt: np.dtype,
               also_read: Sequence[np.ndarray] = ()) -> _Placement:
        """Which arrays go by reference; stages the others (and x) into a staging region when
        the transport says so (``also_read``: other arrays of the request, never staged, that
        ``out`` must not overlap). Release the placement (``_release``) after the call."""
        pl = _Placement(refs={})
        need = 0
        for field, arr in arrays.items():
            ref = self._ref_of(arr)
            pl.refs[field] = ref
            if ref is None:
                pl.inline_bytes += arr.nbytes
                need += -(-arr.nbytes // ALIGN) * ALIGN
        x_bytes = 0
        if x_shape is not None:
            x_bytes = math.prod(x_shape) * np.dtype(dt).itemsize
            if out is not None and not overlaps(out, [*arrays.values(), *also_read]):
                pl.x_ref = self._ref_of(out)
            if pl.x_ref is None:
                need += -(-x_bytes // ALIGN) * ALIGN
        moved = pl.inline_bytes + (x_bytes if pl.x_ref is None else 0)
        tr = self.transport
        if need == 0 or tr in ("grpc", "ring"):  # ring: the calls a ring cannot take, in messages
            return pl
        if self._replicas.spec.balanced:
            if tr == "auto":
                return pl
            # A region lives on one replica; the balanced channel sends calls to any of them.
            raise FailedPrecondition(
                grpc.StatusCode.FAILED_PRECONDITION,
                "shared memory and parallel streams need a client of one server: this one "
                "balances over replicas (use transport auto or grpc)")
        if tr == "shm" or (tr == "auto" and moved >= self.shm_min_bytes):
            arena = self._acquire_arena(need)  # raises where transport="shm" cannot have one
            if arena is not None:
                self._stage_shared(pl, arena, arrays, x_shape, x_bytes, dt)
                return pl
        if tr == "streams" or (tr == "auto" and moved >= self.streams_min_bytes):
            try:
                self._stage_remote(pl, arrays, x_shape, x_bytes, dt, need)
            except TrisolveError:
                self._release(pl)
                if tr == "streams":
                    raise
                # auto: in the messages after all (the references of a failed upload dropped).
                plain = _Placement(refs={f: self._ref_of(a) for f, a in arrays.items()})
                if x_shape is not None and out is not None and not overlaps(
                        out, [*arrays.values(), *also_read]):
                    plain.x_ref = self._ref_of(out)
                plain.inline_bytes = sum(a.nbytes for f, a in arrays.items()
                                         if plain.refs[f] is None)
                return plain
        return pl

    def _stage_shared(self, pl: _Placement, arena: SharedMemory,
                      arrays: Mapping[str, np.ndarray], x_shape: Optional[Tuple[int, ...]],
                      x_bytes: int, dt: np.dtype) -> None:
        pl.arena = arena
        try:
            for field, arr in arrays.items():
                if pl.refs[field] is None and arr.nbytes:
                    pl.refs[field] = self._ref_of(arena.copy(arr))
            if x_shape is not None and pl.x_ref is None and x_bytes:
                pl.x_staged = arena.array(x_shape, np.dtype(dt).newbyteorder("="))
                pl.x_ref = self._ref_of(pl.x_staged)
        except BaseException:
            self._release(pl)
            raise
        pl.inline_bytes = sum(a.nbytes for f, a in arrays.items() if pl.refs[f] is None)

    def _stage_remote(self, pl: _Placement, arrays: Mapping[str, np.ndarray],
                      x_shape: Optional[Tuple[int, ...]], x_bytes: int, dt: np.dtype,
                      need: int) -> None:
        """Writes the arrays not already by reference into server memory, over parallel
        streams, and places x there; ``pl.fetch`` reads x back."""
        timeout = self._timeout(None)
        remote = self._streams.acquire(need, timeout)
        pl.remote = remote
        pieces: List[Tuple[memoryview, int]] = []
        at = 0
        for field, arr in arrays.items():
            if pl.refs[field] is None and arr.nbytes:
                src = np.ascontiguousarray(arr)
                pieces.append((_streams.raw(src), at))
                pl.refs[field] = pb.RegionRef(region=remote.name, offset=at, bytes=arr.nbytes)
                at += -(-arr.nbytes // _streams.ALIGN) * _streams.ALIGN
        if x_shape is not None and pl.x_ref is None and x_bytes:
            x_at = at
            pl.x_ref = pb.RegionRef(region=remote.name, offset=x_at, bytes=x_bytes)

            def fetch(x: np.ndarray) -> None:
                self._streams.download(remote.name, x_at, _streams.raw(x), timeout)

            pl.fetch = fetch
        self._streams.upload(remote.name, pieces, timeout)
        pl.inline_bytes = sum(a.nbytes for f, a in arrays.items() if pl.refs[f] is None)

    def _acquire_arena(self, need: int) -> Optional[SharedMemory]:
        """A registered staging region of at least ``need`` bytes; None where auto falls back
        to gRPC; raises where transport="shm" cannot have one."""
        insist = self.transport == "shm"
        gone: Optional[SharedMemory] = None
        with self._shm_lock:
            if self._closed:
                raise ValueError("the client is closed")
            if self._shm_state == "grpc" and not insist:
                return None
            now = time.monotonic()
            stale = [a for a in self._idle_arenas
                     if now - self._arena_life[a][1] > 0.5 * self._arena_life[a][0]]
            for a in stale:
                self._idle_arenas.remove(a)
                self._arenas -= 1
            fits = [a for a in self._idle_arenas if a.size >= need]
            if fits:
                best = min(fits, key=lambda a: a.size)
                self._idle_arenas.remove(best)
            elif self._arenas >= _MAX_ARENAS and self._idle_arenas:
                gone = min(self._idle_arenas, key=lambda a: a.size)  # trade it for a larger one
                self._idle_arenas.remove(gone)
                self._arenas -= 1
            if not fits and self._arenas >= _MAX_ARENAS:
                if insist:
                    from .errors import ResourceExhausted
                    raise ResourceExhausted(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            "every staging region of this client is in use")
                return None
            if not fits:
                self._arenas += 1
                arena_id = self._next_arena
                self._next_arena += 1
        for a in stale:
            self._retire_arena(a)
        if fits:
            return best
        if gone is not None:
            self._retire_arena(gone)
        size = _MIN_ARENA
        while size < need:
            size *= 2
        arena: Optional[SharedMemory] = None
        try:
            arena = SharedMemory(size)
            info = self._register(arena, f"staging-{arena_id}-{arena.name[9:17]}", 0.0, None,
                                  staging=True)
        except (OSError, TrisolveError) as e:
            if arena is not None:
                arena.close()
            with self._shm_lock:
                self._arenas -= 1
                if isinstance(e, TrisolveError) and e.code in (
                        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                    self._shm_state = "grpc"
            if insist:
                raise
            return None
        with self._shm_lock:
            self._shm_state = "shared-memory"
            self._arena_life[arena] = (info.ttl_s if info.ttl_s > 0 else float("inf"),
                                       time.monotonic())
        return arena

    def _retire_arena(self, arena: SharedMemory) -> None:
        with self._shm_lock:
            self._arena_life.pop(arena, None)
        region = self._take_region(arena)
        if region is not None:
            self._unregister_quietly(region.name)
        arena.close()

    def _release(self, pl: _Placement) -> None:
        remote, pl.remote = pl.remote, None
        if remote is not None:
            self._streams.release(remote)
        arena, pl.arena = pl.arena, None
        if arena is None:
            return
        arena.reset()
        with self._shm_lock:
            if not self._closed:
                self._arena_life[arena] = (self._arena_life[arena][0], time.monotonic())
                self._idle_arenas.append(arena)
                return
            self._arenas -= 1
        self._retire_arena(arena)


    # ---- request rings ----------------------------------------------------------------------
    def ring_state(self) -> str:
        """``"ring"`` once a request ring was opened, ``"grpc"`` when the server serves none to
        this process, ``"off"`` when the transport is neither auto nor ring, ``"untried"``
        before (as the C++ client's ``RingState()``)."""
        if self.transport not in ("auto", "ring"):
            return "off"
        with self._rings.lock:
            return self._rings.state

    def _on_ring(self, call: "_ring.Call", out: Optional[np.ndarray], *,
                 progress: bool = False, residual_history: bool = False) -> Optional[Result]:
        """The call through a ring of this client's; None where it takes gRPC instead (auto).
        Raises FailedPrecondition where transport="ring" cannot use one."""
        forced = self.transport == "ring"
        if not forced and self.transport != "auto":
            return None

        def skip(why: str) -> None:
            if forced:
                raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                         f"transport ring: {why}")

        why = _ring.unsupported_reason()
        if self._replicas.spec.balanced:
            why = "needs a client of one server"
        elif progress:
            why = "progress reports travel through the RPC"
        elif residual_history:
            why = "a residual history travels through the RPC"
        why = why or _ring.not_on_ring(call)
        if why:
            return skip(why)
        # Arrays (and x) in registered memory travel by reference, read and written there in
        # place; the others are copied into the ring's arena.
        call.arrays = [(f, a, self._ref_of(a)) for f, a, _ in call.arrays]
        if out is not None and not overlaps(out, [a for _, a, _ in call.arrays]):
            call.x_ref = self._ref_of(out)
        if _ring.region_names(call) is None:  # more regions than a request names: copy them
            call.arrays = [(f, a, None) for f, a, _ in call.arrays]
            call.x_ref = None
        need = _ring.need_bytes(call)
        referenced = call.x_ref is not None or any(r is not None for _, _, r in call.arrays)
        # auto: small calls only, those that would go in one message, where their bytes are
        # copied; arrays already in registered memory are not, whatever their size.
        if not forced and (need > self._rings.max_arena_bytes or
                           (not referenced and need > self.stream_threshold_bytes)):
            return None
        lane = self._acquire_ring(need, forced, call.timeout)
        if lane is None:
            return None
        try:
            x, status, fields = _ring.ask(lane, call, self.ring_spin_us)
        finally:
            self._release_ring(lane)
        if call.x_ref is not None:
            assert out is not None
            x = out
        elif out is not None:
            np.copyto(out, x)
            x = out
        t = Timings(**{k: fields.pop(k) for k in ("receive_us", "queue_us", "h2d_us", "compute_us",
                                                   "d2h_us", "residual_us", "total_us")})
        return Result(x=x, status=status,
                      summary=Summary(timings=t, handle=call.handle, transport="ring", **fields))

    def _acquire_ring(self, need: int, forced: bool,
                      timeout: Optional[float]) -> Optional["_ring.Lane"]:
        """An idle ring with room for ``need`` bytes, or a new one; None where auto takes gRPC."""
        pool = self._rings
        gone: List[_ring.Lane] = []
        try:
            with pool.lock:
                if self._closed:
                    raise ValueError("the client is closed")
                if pool.state == "grpc":
                    if forced:
                        raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                                 f"transport ring: {pool.why_not}")
                    return None
                for lane in list(pool.idle):
                    if lane.closed:  # its region expired meanwhile, or the server restarted
                        pool.idle.remove(lane)
                        pool.open -= 1
                        gone.append(lane)
                for lane in pool.idle:
                    if lane.arena_bytes >= need:
                        pool.idle.remove(lane)
                        return lane
                if time.monotonic() < pool.retry_after:
                    if forced:
                        raise ResourceExhausted(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "transport ring: the server refused a new ring a moment ago (its "
                            "ring or region caps)")
                    return None
                # None idle holds the call: an idle ring too small gives way to a larger one,
                # so that the rings stay one a calling thread.
                if pool.idle:
                    gone.append(pool.idle.pop(0))
                    pool.open -= 1
                if pool.open >= pool.max_rings:
                    if forced:
                        raise ResourceExhausted(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"transport ring: this client holds {pool.open} rings (max_rings)")
                    return None
                pool.open += 1
        finally:
            for lane in gone:
                self._close_ring(lane)
        return self._open_ring(need, forced, timeout)

    def _open_ring(self, need: int, forced: bool,
                   timeout: Optional[float]) -> Optional["_ring.Lane"]:
        pool = self._rings
        lane: Optional[_ring.Lane] = None
        registered = False
        try:
            arena = -(-_ring.ring_bytes(1) // _ring.ALIGN) * _ring.ALIGN
            # Grown rings double, so that calls growing by a little do not replace the ring
            # each time.
            room = max(pool.arena_bytes, 4096)
            while room < need:
                room *= 2
            if not forced:
                room = max(need, min(room, pool.max_arena_bytes))
            shm = SharedMemory(arena + room)
            lane = _ring.Lane(shm, "ring-" + shm.name[len("trisolve-"):])
            lane.write_header()
            self._unary("RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
                name=lane.region, key=shm.key, offset=0, bytes=shm.size), timeout)
            registered = True
            info = self._unary("OpenRing", pb.OpenRingRequest(region=lane.region, offset=0,
                                                              slots=1), timeout)
            lane.ring_id = info.ring
        except (OSError, TrisolveError) as e:
            if lane is not None:
                if registered:
                    self._unregister_quietly(lane.region)
                lane.release_views()
                lane.shm.close()
            with pool.lock:
                pool.open -= 1
                if isinstance(e, TrisolveError) and _ring.refusal_is_final(e):
                    # Another host, or a server that serves no rings: never on this client.
                    pool.state = "grpc"
                    pool.why_not = e.message[:200]
                elif isinstance(e, TrisolveError) and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    pool.retry_after = time.monotonic() + 1.0
            if isinstance(e, TrisolveError) and e.code == grpc.StatusCode.UNAVAILABLE:
                # The server cannot be reached (connect_timeout was waited out already): the
                # RPC would fail the same, a wait later.
                raise e from None
            if forced:
                if isinstance(e, TrisolveError):
                    raise error_for(e.code, f"transport ring: {e.message}") from None
                raise
            return None
        with pool.lock:
            pool.state = "ring"
        return lane

    def _release_ring(self, lane: "_ring.Lane") -> None:
        if lane.broken or lane.closed:
            self._close_ring(lane)
            with self._rings.lock:
                self._rings.open -= 1
            return
        with self._rings.lock:
            if not self._closed:
                self._rings.idle.append(lane)
                return
            self._rings.open -= 1
        self._close_ring(lane)

    def _close_ring(self, lane: "_ring.Lane") -> None:
        if not lane.server_gone:  # else the ring and its region went with the server
            if lane.ring_id and lane.mem is not None and not lane.closed:
                try:
                    self._unary("CloseRing", pb.CloseRingRequest(ring=lane.ring_id), 5.0,
                                wait=False)
                except TrisolveError:
                    pass  # the server is gone: the ring went with it
            self._unregister_quietly(lane.region)
        lane.release_views()
        lane.shm.close()

    @staticmethod
    def _deliver(pl: _Placement, resp: Any, out: Optional[np.ndarray], streamed: bool = False,
                 result: Optional[Result] = None) -> Result:
        """The Result of a call placed as ``pl``: x from the response, the staging region or
        ``out`` (where the server wrote it), and into ``out`` when one was given."""
        if result is None:
            dt = numpy_dtype(resp.dtype)
            if pl.fetch is not None:  # x in the server's memory: read back over the lanes
                x = out if out is not None and out.flags.c_contiguous else np.empty(
                    tuple(resp.x.shape), dtype=dt.newbyteorder("="))
                if tuple(resp.x.shape) != tuple(x.shape) or resp.x.data or x.dtype != dt.newbyteorder("="):
                    raise DataLoss(grpc.StatusCode.DATA_LOSS,
                                   f"x written into server memory, but the answer says shape "
                                   f"{list(resp.x.shape)}, {dt}, {len(resp.x.data)} bytes of data")
                pl.fetch(x)
            elif pl.x_ref is not None:
                x = pl.x_staged if pl.x_staged is not None else out
                assert x is not None
                if tuple(resp.x.shape) != tuple(x.shape) or resp.x.data:
                    raise DataLoss(grpc.StatusCode.DATA_LOSS,
                                   f"x written into shared memory, but the answer says shape "
                                   f"{list(resp.x.shape)} with {len(resp.x.data)} bytes of data")
                if x.dtype != dt.newbyteorder("="):
                    raise DataLoss(grpc.StatusCode.DATA_LOSS,
                                   f"the server answered in {dt}, x in shared memory is {x.dtype}")
            else:
                x = _arrays.decode(resp.x.data, tuple(resp.x.shape), dt)
            result = Result(x=x, status=np.asarray(resp.status, dtype=np.int8),
                            summary=Summary.from_proto(resp.summary, transport=pl.transport))
        if pl.x_staged is not None:
            if out is not None:
                np.copyto(out, pl.x_staged)
                result.x = out
            else:
                result.x = pl.x_staged.copy()  # the staging region is reused by the next call
        elif out is not None and result.x is not out:
            np.copyto(out, result.x)
            result.x = out
        return result

    # ---- one-shot solves ------------------------------------------------------------------
    def solve_tridiagonal(self, a: Any, b: Any, c: Any, d: Any, layout: LayoutLike = "flat",
                          method: str = "auto", skip_residual: bool = False, *,
                          dtype: DTypeLike = None, timeout: Optional[float] = None,
                          request_id: Optional[str] = None,
                          out: Optional[np.ndarray] = None,
                          progress: Optional[ProgressCallback] = None,
                          progress_interval: float = 0.0, lengths: Any = None,
                          abc: Any = None) -> Result:
        """Solves ``a[k] x[k-1] + b[k] x[k] + c[k] x[k+1] = d[k]`` for each system of a batch.

        Args:
            a, b, c, d: ``batch x n`` arrays (``layout="flat"``), ``n x batch``
                (``layout="interleaved"``), or 1-D for one system; ``a[.][0]`` and
                ``c[.][n-1]`` are not used. 1-D ``a``, ``b``, ``c`` with a 2-D ``d`` solve one
                matrix for many right-hand sides. Non-C-contiguous (e.g. Fortran-order) arrays
                are copied into C order with ``np.ascontiguousarray``; their logical shape is
                what counts.
            layout: ``"flat"`` or ``"interleaved"`` (or :class:`Layout`).
            method: ``"auto"``, ``"thomas"``, ``"pcr"``, ``"partitioned"``.
            skip_residual: do not compute the backward error (``summary.residual`` is NaN).
            dtype: the precision to solve in; ``None``: float32 if every array is float32,
                else float64 (a float32/float64 mix is never narrowed to float32).
            timeout: this call's deadline in seconds (default: the client's).
            request_id: sent as ``x-request-id``; the server's log lines carry it.
            out: an array for x (``d``'s shape, the job's dtype, writable): in registered shared
                memory the server writes x straight into it; elsewhere the client copies x
                into it. The Result's ``x`` is then ``out``.
            progress: called on this thread with a :class:`Progress` as the server reports
                (``SolveWithProgress``: at most one every ``progress_interval`` seconds, 0:
                0.1 s); the job then goes in one message (its arrays inline up to 64 MiB, or
                by reference to shared memory), a larger one through ``SolveStream`` without
                reports. An exception it raises cancels the call and propagates.
            progress_interval: see ``progress`` (0, or 0.01 to 3600).
            lengths: systems of different sizes in one call: ``a``, ``b``, ``c``, ``d`` 1-D,
                each the systems' rows one system after the other, and ``lengths`` (an integer
                array, sent as int32) their sizes, every one >= 1, summing to ``len(d)``;
                ``layout`` flat. ``x`` comes back concatenated the same way, ``status`` holds
                one entry a system.
            abc: the unified-vector layout instead of ``a``, ``b``, ``c`` (pass them as
                ``None``): a, b, c of each row together, ``d``'s shape and 3
                (``abc[s, k] = (a[s, k], b[s, k], c[s, k])``); ``layout`` flat. The server
                solves it as it is, without a transpose.

        Returns:
            a :class:`Result` (``x`` in ``d``'s shape and layout).

        Raises:
            TypeError: an array that is not float32/float64 (named in the message).
            InvalidArgument, ResourceExhausted, ...: the server refused the job.
        """
        if abc is not None:
            if a is not None or b is not None or c is not None:
                raise ValueError("abc holds a, b and c: pass a, b and c as None")
            dt, arrays = _arrays.prepare({"d": d, "abc": abc}, dtype)
        else:
            dt, arrays = _arrays.prepare({"d": d, "a": a, "b": b, "c": c}, dtype)
        if lengths is not None:
            arrays["lengths"] = _arrays.lengths_array(lengths)
        req = pb.TridiagonalRequest(dtype=proto_dtype(dt), layout=int(_arrays.parse_layout(layout)),
                                    method=method, skip_residual=skip_residual)
        return self._solve(_TRIDIAGONAL, req, arrays, dt, timeout, request_id, out, progress,
                           progress_interval)

    def solve_tree(self, parent: Any, lower: Any, upper: Any, diag: Any, rhs: Any,
                   layout: LayoutLike = "flat", method: str = "auto", skip_residual: bool = False,
                   *, dtype: DTypeLike = None, timeout: Optional[float] = None,
                   request_id: Optional[str] = None, out: Optional[np.ndarray] = None,
                   progress: Optional[ProgressCallback] = None,
                   progress_interval: float = 0.0, lengths: Any = None) -> Result:
        """Solves Hines (tree) systems: ``A[i][i] = diag[i]``, ``A[i][parent[i]] = lower[i]``,
        ``A[parent[i]][i] = upper[i]``.

        Args:
            parent: ``[n]`` (one morphology for the batch) or ``[batch, n]``, an integer array,
                nodes numbered depth-first from the root 0 (``parent[0] = -1``,
                ``parent[i] < i``); int64 is accepted when every value fits int32.
            lower, upper, diag, rhs: ``batch x n`` (flat) or ``n x batch`` (interleaved), or 1-D.
                Converted to C order as in :meth:`solve_tridiagonal`.
            layout, skip_residual, dtype, timeout, request_id, out, progress,
                progress_interval: as in :meth:`solve_tridiagonal`.
            method: ``"auto"``, ``"hines"``, ``"cables"``, ``"contraction"``.
            lengths: cells of different sizes in one call: ``parent``, ``lower``, ``upper``,
                ``diag``, ``rhs`` 1-D, each the cells' nodes one cell after the other (every
                cell's ``parent`` values counted from its own first node, its root: -1), and
                ``lengths`` (an integer array, sent as int32) their sizes, every one >= 1,
                summing to ``len(rhs)``; ``layout`` flat. ``x`` comes back concatenated the
                same way, ``status`` holds one entry a cell.
        """
        dt, arrays = _arrays.prepare({"rhs": rhs, "lower": lower, "upper": upper, "diag": diag},
                                     dtype)
        arrays["parent"] = _arrays.parent_array(parent)
        if lengths is not None:
            arrays["lengths"] = _arrays.lengths_array(lengths)
        req = pb.TreeRequest(dtype=proto_dtype(dt), layout=int(_arrays.parse_layout(layout)),
                             method=method, skip_residual=skip_residual)
        return self._solve(_TREE, req, arrays, dt, timeout, request_id, out, progress,
                           progress_interval)

    def solve_block_tridiagonal(self, aC: Any, cC: Any, bC: Any, cA: Any, cB: Any, f: Any,
                                y0: Any = None, method: str = "auto",
                                max_iterations: Optional[int] = None,
                                tol: Optional[float] = None, scale_rows: bool = False, *,
                                dtype: DTypeLike = None, timeout: Optional[float] = None,
                                request_id: Optional[str] = None,
                                out: Optional[np.ndarray] = None,
                                progress: Optional[ProgressCallback] = None,
                                progress_interval: float = 0.0,
                                residual_history: bool = False) -> Result:
        """Solves the block-tridiagonal (hemodynamics) system iteratively.

        N block rows of order M, every array ``N x M``: block row i is
        ``A_i Y_{i-1} + C_i Y_i + B_i Y_{i+1} = F_i`` with ``C_i`` tridiagonal (``aC`` sub,
        ``cC`` main, ``bC`` super diagonal), ``A_i = diag(cA[i])``, ``B_i = diag(cB[i])``.

        Args:
            aC, cC, bC, cA, cB, f: ``N x M`` arrays (C order after ``np.ascontiguousarray``).
            y0: an initial guess (zero when ``None``).
            method: ``"auto"``, ``"gauss-seidel"``, ``"red-black"``, ``"jacobi"``, ``"cg"``,
                ``"multigrid-cg"``, ``"multigrid-bicgstab"``.
            max_iterations: the most sweeps (server default 1000).
            tol: stop at ``||f - A y||_2 / ||f||_2 <= tol``; 0 runs exactly ``max_iterations``
                (server default 1e-10 in float64, 1e-5 in float32).
            scale_rows: the thesis' Jacobi row scaling before iterating.
            dtype, timeout, request_id, out: as in :meth:`solve_tridiagonal` (``out``: ``f``'s
                shape).
            progress, progress_interval: as in :meth:`solve_tridiagonal`; while solving, each
                :class:`Progress` carries the iterations done and the residual at the last check.
            residual_history: the summary carries the residual history
                (``summary.residual_history``, a :class:`ResidualHistory`; one right-hand side).

        Returns:
            a :class:`Result`; ``summary.iterations`` and ``summary.residual`` say how far it
            went, ``status`` is ``NOT_CONVERGED`` when ``tol`` was not reached.
        """
        floats = {"f": f, "aC": aC, "cC": cC, "bC": bC, "cA": cA, "cB": cB}
        if y0 is not None:
            floats["y0"] = y0
        dt, named = _arrays.prepare(floats, dtype)
        arrays = {dict(_BLOCK.fields)[k]: v for k, v in named.items()}
        req = pb.BlockTridiagonalRequest(dtype=proto_dtype(dt), method=method,
                                         scale_rows=scale_rows)
        if max_iterations is not None:
            req.max_iterations = int(max_iterations)
        if tol is not None:
            req.tol = float(tol)
        req.residual_history = bool(residual_history)
        return self._solve(_BLOCK, req, arrays, dt, timeout, request_id, out, progress,
                           progress_interval)

    def solve_dense(self, A: Any, b: Any, method: str = "auto", skip_residual: bool = False, *,
                    dtype: DTypeLike = None, timeout: Optional[float] = None,
                    request_id: Optional[str] = None, out: Optional[np.ndarray] = None,
                    progress: Optional[ProgressCallback] = None,
                    progress_interval: float = 0.0) -> Result:
        """Solves dense systems ``A x = b``.

        Args:
            A: ``batch x n x n`` (row-major: ``A[s, i, j]`` is row i, column j of system s) or
                ``n x n``; a Fortran-order array is copied into C order, so ``A[i, j]`` keeps
                its meaning.
            b: ``batch x n`` or ``n``.
            method: ``"auto"``, ``"gauss-jordan"``, ``"lu"``, ``"householder-pcr"`` (symmetric A).
            skip_residual, dtype, timeout, request_id, out, progress, progress_interval: as in
                :meth:`solve_tridiagonal` (``out``: ``b``'s shape).
        """
        dt, named = _arrays.prepare({"b": b, "A": A}, dtype)
        arrays = {"b": named["b"], "a": named["A"]}
        req = pb.DenseRequest(dtype=proto_dtype(dt), method=method, skip_residual=skip_residual)
        return self._solve(_DENSE, req, arrays, dt, timeout, request_id, out, progress,
                           progress_interval)

    def _solve(self, fam: _Family, req: Any, arrays: Dict[str, np.ndarray], dt: np.dtype,
               timeout: Optional[float], request_id: Optional[str],
               out: Optional[np.ndarray] = None, progress: Optional[ProgressCallback] = None,
               progress_interval: float = 0.0) -> Result:
        t0 = time.perf_counter()
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be callable, got {type(progress).__name__}")
        # Arrays in the family's order (the right-hand side first), as the C++ client sends them.
        order = [field for _, field in fam.fields if field in arrays]
        x_shape = tuple(arrays[fam.fields[0][1]].shape)
        if out is not None:
            check_out(out, x_shape, dt)
        on_ring = self._on_ring(self._ring_call(fam, req, arrays, order, dt, self._timeout(timeout),
                                                request_id),
                                out, progress=progress is not None,
                                residual_history=getattr(req, "residual_history", False))
        if on_ring is not None:
            on_ring.summary.timings.client_total_us = (time.perf_counter() - t0) * 1e6
            return on_ring
        for field in order:
            getattr(req, field).shape.extend(arrays[field].shape)
        pl = self._place({f: arrays[f] for f in order}, out, x_shape, dt)
        try:
            reporting = progress is not None and pl.inline_bytes <= _PROGRESS_INLINE_BYTES
            if reporting or pl.inline_bytes <= self.stream_threshold_bytes:
                for field in order:
                    if pl.refs[field] is not None:
                        getattr(req, field).region.CopyFrom(pl.refs[field])
                    else:
                        getattr(req, field).data = arrays[field].tobytes()
                if pl.x_ref is not None:
                    req.x_region.CopyFrom(pl.x_ref)
                if reporting:
                    assert progress is not None
                    resp = self._solve_with_progress(fam, req, progress, progress_interval,
                                                     timeout, request_id)
                else:
                    resp = self._unary(fam.rpc, req, timeout, request_id)
                result = self._deliver(pl, resp, out)
            else:  # every array in chunks (references are for unary requests), x back in chunks
                pl.x_ref = None
                result = self._solve_stream(fam, req, [(f, arrays[f]) for f in order], timeout,
                                            request_id)
                result = self._deliver(pl, None, out, result=result)
        finally:
            self._release(pl)
        result.summary.timings.client_total_us = (time.perf_counter() - t0) * 1e6
        return result

    @staticmethod
    def _ring_call(fam: _Family, req: Any, arrays: Dict[str, np.ndarray], order: List[str],
                   dt: np.dtype, timeout: Optional[float], request_id: Optional[str]
                   ) -> "_ring.Call":
        """A one-shot solve as a ring request: the request message's options as ring flags."""
        has = req.DESCRIPTOR.fields_by_name
        flags = 0
        if "skip_residual" in has and req.skip_residual:
            flags |= _ring.FLAG_SKIP_RESIDUAL
        if "scale_rows" in has and req.scale_rows:
            flags |= _ring.FLAG_SCALE_ROWS
        call = _ring.Call(
            op=_ring.OP_SOLVE, family=fam.name, dtype=np.dtype(dt),
            arrays=[(f, np.ascontiguousarray(arrays[f]), None) for f in order],
            rhs_field=order[0], x_shape=tuple(arrays[order[0]].shape),
            layout=int(req.layout) if "layout" in has else 0, method=req.method or "",
            request_id=request_id or "", timeout=timeout)
        if "max_iterations" in has and req.HasField("max_iterations"):
            flags |= _ring.FLAG_MAX_ITERATIONS
            call.max_iterations = int(req.max_iterations)
        if "tol" in has and req.HasField("tol"):
            flags |= _ring.FLAG_TOL
            call.tol = float(req.tol)
        call.flags = flags
        return call

    def _solve_with_progress(self, fam: _Family, req: Any, progress: ProgressCallback,
                             interval: float, timeout: Optional[float],
                             request_id: Optional[str]) -> Any:
        """SolveWithProgress: ``progress`` called with each report; the answer returned."""
        preq = pb.ProgressRequest(interval_s=float(interval))
        getattr(preq, fam.oneof).CopyFrom(req)
        self._await_connection(timeout)
        call = self._stub.SolveWithProgress(preq, timeout=self._timeout(timeout),
                                            metadata=self._metadata(request_id))
        answer = None
        try:
            for msg in call:
                if msg.HasField("progress"):
                    progress(Progress.from_proto(msg.progress))
                elif msg.HasField("answer"):
                    answer = msg.answer
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()  # the callback failed: the server stops the solve and frees its slot
            raise
        if answer is None:
            raise DataLoss(grpc.StatusCode.DATA_LOSS, "SolveWithProgress ended without an answer")
        return answer

    def _solve_stream(self, fam: _Family, header: Any, arrays: Sequence[Tuple[str, np.ndarray]],
                      timeout: Optional[float], request_id: Optional[str]) -> Result:
        chunk = self.chunk_bytes

        def requests() -> Iterator[Any]:
            first = pb.StreamRequest()
            getattr(first, fam.oneof).CopyFrom(header)
            yield first
            for field, arr in arrays:
                raw = memoryview(arr.reshape(-1)).cast("B")
                for off in range(0, len(raw), chunk):
                    yield pb.StreamRequest(chunk=pb.Chunk(array=field, offset=off,
                                                          data=bytes(raw[off:off + chunk])))

        x: Optional[np.ndarray] = None
        xb: Optional[np.ndarray] = None
        statuses: List[np.ndarray] = []
        summary = pb.SolveSummary()
        self._await_connection(timeout)
        try:
            for msg in self._stub.SolveStream(requests(), timeout=self._timeout(timeout),
                                              metadata=self._metadata(request_id)):
                if x is None:
                    dt = numpy_dtype(msg.dtype)
                    x = np.empty(tuple(msg.x_shape), dtype=dt.newbyteorder("="))
                    xb = x.reshape(-1).view(np.uint8)
                if msg.HasField("chunk"):
                    c = msg.chunk
                    assert xb is not None
                    if c.offset < 0 or c.offset + len(c.data) > xb.size:
                        raise DataLoss(grpc.StatusCode.DATA_LOSS,
                                       "the server sent a chunk outside x")
                    # The wire is little-endian; so is every machine this runs on in practice.
                    xb[c.offset:c.offset + len(c.data)] = np.frombuffer(c.data, dtype=np.uint8)
                if msg.status:
                    statuses.append(np.asarray(msg.status, dtype=np.int8))
                if msg.HasField("summary"):
                    summary = msg.summary
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if x is None:
            raise DataLoss(grpc.StatusCode.DATA_LOSS, "the stream ended without an answer")
        status = np.concatenate(statuses) if statuses else np.zeros(0, dtype=np.int8)
        return Result(x=x, status=status, summary=Summary.from_proto(summary, streamed=True))

    # ---- persistent systems ----------------------------------------------------------------
    def create_system(self, family: str, *, layout: LayoutLike = "flat", method: str = "auto",
                      dtype: DTypeLike = None, ttl_s: float = 0.0, label: str = "",
                      max_iterations: Optional[int] = None, tol: Optional[float] = None,
                      scale_rows: bool = False, timeout: Optional[float] = None,
                      lengths: Any = None, **arrays: Any) -> "System":
        """Keeps a system on the server and returns a :class:`System` handle to solve it.

        The coefficients travel once; each :meth:`System.solve` sends only right-hand sides
        (and the coefficient arrays that changed). Use the handle as a context manager to
        release it on exit::

            with client.create_system("tridiagonal", a=a, b=b, c=c) as sys:
                for step in range(steps):
                    x = sys.solve(d, update={"b": b_now}).x

        Args:
            family: ``"tridiagonal"`` (arrays ``a``, ``b``, ``c``), ``"tree"`` (``parent``,
                ``lower``, ``upper``, ``diag``), ``"block-tridiagonal"`` (``aC``, ``cC``, ``bC``,
                ``cA``, ``cB``) or ``"dense"`` (``A``). The right-hand side (``d``, ``rhs``,
                ``f``, ``b``) may be given too; only its shape matters (it sets the number of
                right-hand sides a solve takes); without it the shape comes from the coefficients.
            layout, method: as in the one-shot solves (``max_iterations``, ``tol``,
                ``scale_rows`` for block-tridiagonal).
            dtype: the system's precision; ``None``: float32 if every array is float32, else
                float64. Right-hand sides and updates are converted to it; a float64 array for
                a float32 system raises ``TypeError`` rather than being narrowed.
            ttl_s: seconds the system may stay unused before the server drops it (0: the
                server's default).
            label: a name for listings and logs (``[A-Za-z0-9._-]``, at most 64 characters).
            lengths: systems (tridiagonal) or cells (tree) of different sizes, as in
                :meth:`solve_tridiagonal` / :meth:`solve_tree`: every coefficient 1-D, the
                systems one after the other, ``lengths`` (integers, sent as int32) their sizes.
                A solve then takes ``rhs`` of shape ``(total,)`` or ``(k, total)`` and answers a
                status a system; ``lengths`` cannot be updated.

        Raises:
            Unimplemented: the server has no persistent systems.
        """
        from .systems import System, build_create_request

        req, dt, by_field = build_create_request(self, family, arrays, layout=layout,
                                                 method=method, dtype=dtype, ttl_s=ttl_s,
                                                 label=label, max_iterations=max_iterations,
                                                 tol=tol, scale_rows=scale_rows,
                                                 lengths=lengths)
        inner = getattr(req, req.WhichOneof("system"))
        pl = self._place(by_field, None, None, dt)
        try:
            for field, arr in by_field.items():
                if pl.refs[field] is not None:
                    getattr(inner, field).region.CopyFrom(pl.refs[field])
                else:
                    getattr(inner, field).data = arr.tobytes()
            info = SystemInfo.from_proto(self._unary("CreateSystem", req, timeout))
        finally:
            self._release(pl)
        return System(self, info, dt)

    def list_systems(self, timeout: Optional[float] = None) -> List[SystemInfo]:
        """This identity's persistent systems on the server (on every replica, for several)."""
        if not self._replicas.spec.balanced:
            resp = self._unary("ListSystems", pb.ListSystemsRequest(), timeout)
            return [SystemInfo.from_proto(s) for s in resp.systems]
        try:
            replicas = self._replicas.all()
        except OSError as e:  # the target's name cannot be resolved now
            raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"cannot list the replicas: {e}") from None
        out = []
        for _, (_, stub) in replicas:
            try:
                resp = stub.ListSystems(pb.ListSystemsRequest(), timeout=self._timeout(timeout),
                                        metadata=self._metadata())
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # gone: it holds no system now
                    continue
                raise from_rpc_error(e) from None
            out += [SystemInfo.from_proto(s) for s in resp.systems]
        return out

    def system(self, handle: str, timeout: Optional[float] = None) -> "System":
        """A :class:`System` for an existing handle (``NotFound`` when it is gone)."""
        from .errors import NotFound
        from .systems import System

        for info in self.list_systems(timeout):
            if info.handle == handle:
                return System(self, info, info.dtype or np.dtype(np.float64))
        raise NotFound(grpc.StatusCode.NOT_FOUND, f"system {handle} not found")

