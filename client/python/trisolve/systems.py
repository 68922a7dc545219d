"""Persistent systems: a matrix kept on the server, solved by handle, and the time-step stream.

A simulation code that solves with the same matrix (or one whose diagonal changes) every step
sends the coefficients once (:meth:`Client.create_system`), then only right-hand sides and the
arrays that changed (:meth:`System.solve`, :meth:`System.update`), or streams its steps over
one call (:meth:`System.stream`), the next step travelling while the current one is solved.
"""
from __future__ import annotations

import collections
import queue
import time
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Mapping, Optional, Tuple

import grpc
import numpy as np

from . import _arrays, _ring
from ._arrays import DTypeLike, LayoutLike
from ._proto import pb
from .errors import FailedPrecondition, NotFound, TrisolveError
from .results import Result, SystemInfo, proto_dtype

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["System", "SystemStream"]


def _coefficient_names(fam: Any) -> Tuple[str, List[str]]:
    rhs = fam.fields[0][0]
    # y0 is optional; lengths and abc (a solve's variable sizes and unified layout) are not
    # taken by a kept system.
    return rhs, [user for user, _ in fam.fields[1:] if user not in ("y0", "lengths", "abc")]


def build_create_request(client: "Client", family_name: str, arrays: Mapping[str, Any], *,
                         layout: LayoutLike, method: str, dtype: DTypeLike, ttl_s: float,
                         label: str, max_iterations: Optional[int], tol: Optional[float],
                         scale_rows: bool, lengths: Any = None
                         ) -> Tuple["pb.CreateSystemRequest", np.dtype, Dict[str, np.ndarray]]:
    """The CreateSystemRequest for :meth:`Client.create_system` (shapes set, no data yet), the
    system's dtype, and its arrays by proto field, ready for the wire."""
    from .client import family

    fam = family(family_name)
    rhs_name, coefficients = _coefficient_names(fam)
    arrays = dict(arrays)
    if fam.name == "dense" and "a" in arrays and "A" not in arrays:
        arrays["A"] = arrays.pop("a")
    unknown = set(arrays) - set(coefficients) - {rhs_name}
    if unknown:
        raise ValueError(f"unknown arrays {sorted(unknown)} for a {fam.name} system (expected "
                         f"{', '.join(coefficients)} and optionally {rhs_name})")
    missing = [n for n in coefficients if n not in arrays]
    if missing:
        raise ValueError(f"a {fam.name} system needs {', '.join(coefficients)}; "
                         f"missing {', '.join(missing)}")
    floats = {n: v for n, v in arrays.items() if n != "parent"}
    dt, named = _arrays.prepare(floats, dtype)
    if "parent" in arrays:
        named["parent"] = _arrays.parent_array(arrays["parent"])
    if lengths is not None:
        if fam.name not in ("tridiagonal", "tree"):
            raise ValueError(f"lengths: a {fam.name} system has no systems of different sizes "
                             "(tridiagonal and tree take lengths)")
        named["lengths"] = _arrays.lengths_array(lengths)
    inner = fam.request(dtype=proto_dtype(dt), method=method)
    if fam.name in ("tridiagonal", "tree"):
        inner.layout = int(_arrays.parse_layout(layout))
    if fam.name == "block-tridiagonal":
        inner.scale_rows = scale_rows
        if max_iterations is not None:
            inner.max_iterations = int(max_iterations)
        if tol is not None:
            inner.tol = float(tol)
    field_of = dict(fam.fields)
    by_field = {field_of[user]: arr for user, arr in named.items()}
    for field, arr in by_field.items():
        getattr(inner, field).shape.extend(arr.shape)
    req = pb.CreateSystemRequest(ttl_s=float(ttl_s), label=label)
    getattr(req, fam.oneof).CopyFrom(inner)
    return req, dt, by_field


def _same_or_wider(name: str, arr: np.ndarray, dt: np.dtype) -> np.ndarray:
    if arr.dtype.itemsize > np.dtype(dt).itemsize:
        raise TypeError(
            f"{name} is {arr.dtype.newbyteorder('=')} but the system is {np.dtype(dt)}: pass "
            f"{name}.astype(np.{np.dtype(dt)}) to narrow it yourself, or create the system with "
            "dtype=np.float64")
    return _arrays.wire(arr, dt)


class System:
    """A system kept on the server (from :meth:`Client.create_system` or :meth:`Client.system`).

    A context manager: ``with client.create_system(...) as sys: ...`` releases it on exit.

    Attributes:
        handle: the server's handle.
        family: ``"tridiagonal"``, ``"tree"``, ``"block-tridiagonal"`` or ``"dense"``.
        dtype: the precision it solves in; right-hand sides and updates are converted to it
            (float32 to a float64 system: widened; float64 to a float32 system: ``TypeError``).
        last_info: the :class:`SystemInfo` the server last returned for it.
    """

    def __init__(self, client: "Client", info: SystemInfo, dtype: np.dtype) -> None:
        self.client = client
        self.handle = info.handle
        self.family = info.family
        self.dtype = np.dtype(dtype)
        self.last_info = info
        self.released = False

    def __repr__(self) -> str:
        return f"trisolve.System({self.handle!r}, {self.family}, {self.dtype})"

    def __enter__(self) -> "System":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.released:
            return
        try:
            self.release()
        except NotFound:
            pass  # expired or evicted meanwhile: nothing left to release
        except TrisolveError:
            if exc_type is None:
                raise  # otherwise keep the exception that is already on its way

    # ---- requests ------------------------------------------------------------------------
    def _message(self, arr: np.ndarray, ref: Any = None) -> "pb.Array":
        """An array by reference when it lies in registered shared memory, as bytes otherwise."""
        if ref is None:
            ref = self.client._ref_of(arr)
        if ref is not None:
            return pb.Array(shape=arr.shape, region=ref)
        return pb.Array(shape=arr.shape, data=arr.tobytes())

    def _rhs_array(self, rhs: Any) -> np.ndarray:
        return _same_or_wider("rhs", _arrays.float_array("rhs", rhs), self.dtype)

    def _update_arrays(self, update: Optional[Mapping[str, Any]]) -> List[Tuple[str, np.ndarray]]:
        out = []
        for name, value in (update or {}).items():
            if name == "parent":
                arr = _arrays.parent_array(value)
            else:
                arr = _same_or_wider(name, _arrays.float_array(name, value), self.dtype)
            out.append((name, arr))
        return out

    def _updates(self, update: Optional[Mapping[str, Any]]) -> List["pb.NamedArray"]:
        return [pb.NamedArray(name=name, array=self._message(arr))
                for name, arr in self._update_arrays(update)]

    def request(self, rhs: Any, update: Optional[Mapping[str, Any]] = None,
                skip_residual: bool = False,
                out: Optional[np.ndarray] = None) -> "pb.SolveSystemRequest":
        """The ``SolveSystemRequest`` for one solve (what the stream sends): arrays in registered
        shared memory by reference, and ``x_region`` when ``out`` lies in it."""
        from .client import check_out, overlaps

        arr = self._rhs_array(rhs)
        updates = self._update_arrays(update)
        req = pb.SolveSystemRequest(
            handle=self.handle, rhs=self._message(arr),
            update=[pb.NamedArray(name=k, array=self._message(v)) for k, v in updates],
            skip_residual=skip_residual)
        if out is not None:
            check_out(out, arr.shape, self.dtype)
            if not overlaps(out, [arr] + [v for _, v in updates]):
                ref = self.client._ref_of(out)
                if ref is not None:
                    req.x_region.CopyFrom(ref)
        return req

    # ---- calls ---------------------------------------------------------------------------
    def solve(self, rhs: Any, update: Optional[Mapping[str, Any]] = None,
              skip_residual: bool = False, timeout: Optional[float] = None,
              out: Optional[np.ndarray] = None) -> Result:
        """Solves the kept system for ``rhs``.

        Args:
            rhs: the system's right-hand-side shape, or that shape with a leading k for k
                right-hand sides; ``x`` has ``rhs``'s shape. C order after
                ``np.ascontiguousarray``.
            update: coefficient arrays (by name: ``"b"``, ``"diag"``, ``"cC"``, ``"A"``, ...) to
                replace before this solve, as :meth:`update` would.
            out: an array for x (``rhs``'s shape, the system's dtype): in registered shared
                memory the server writes x into it, elsewhere the client copies x there; the
                Result's ``x`` is then ``out``.

        With the client's transport ``"auto"`` (large right-hand sides) or ``"shm"``, ``rhs``
        and x go through a staging region when they do not lie in registered memory already;
        arrays in ``update`` go by reference when they lie in registered memory.
        """
        from .client import check_out

        t0 = time.perf_counter()
        client = self.client
        arr = self._rhs_array(rhs)
        updates = self._update_arrays(update)
        if out is not None:
            check_out(out, arr.shape, self.dtype)
        if not updates:
            call = _ring.Call(op=_ring.OP_SOLVE_SYSTEM, family=self.family, dtype=self.dtype,
                              arrays=[("rhs", np.ascontiguousarray(arr), None)], rhs_field="rhs",
                              x_shape=tuple(arr.shape),
                              flags=_ring.FLAG_SKIP_RESIDUAL if skip_residual else 0,
                              handle=self.handle, timeout=client._timeout(timeout),
                              system=(self.last_info.systems, self.last_info.variable))
            on_ring = client._on_ring(call, out)
            if on_ring is not None:
                on_ring.summary.timings.client_total_us = (time.perf_counter() - t0) * 1e6
                return on_ring
        elif client.transport == "ring":
            raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                     "transport ring: updates travel through the RPC")
        pl = client._place({"rhs": arr}, out, tuple(arr.shape), self.dtype,
                           also_read=[v for _, v in updates])
        try:
            req = pb.SolveSystemRequest(
                handle=self.handle, rhs=self._message(arr, pl.refs["rhs"]),
                update=[pb.NamedArray(name=k, array=self._message(v)) for k, v in updates],
                skip_residual=skip_residual)
            if pl.x_ref is not None:
                req.x_region.CopyFrom(pl.x_ref)
            result = client._deliver(pl, client._handle_unary("SolveSystem", self.handle, req, timeout),
                                         out)
        finally:
            client._release(pl)
        result.summary.timings.client_total_us = (time.perf_counter() - t0) * 1e6
        return result

    def update(self, timeout: Optional[float] = None, **arrays: Any) -> SystemInfo:
        """Replaces coefficient arrays in place (e.g. ``sys.update(b=new_b)``)."""
        if not arrays:
            raise ValueError("update: no arrays given")
        req = pb.UpdateSystemRequest(handle=self.handle, update=self._updates(arrays))
        self.last_info = SystemInfo.from_proto(
            self.client._handle_unary("UpdateSystem", self.handle, req, timeout))
        return self.last_info

    def info(self, timeout: Optional[float] = None) -> SystemInfo:
        """The server's current description (``NotFound`` when released or expired)."""
        for info in self.client.list_systems(timeout):
            if info.handle == self.handle:
                self.last_info = info
                return info
        raise NotFound(grpc.StatusCode.NOT_FOUND, f"system {self.handle} not found")

    def release(self, timeout: Optional[float] = None) -> SystemInfo:
        """Frees the system on the server; the handle is NOT_FOUND afterwards."""
        info = SystemInfo.from_proto(self.client._handle_unary(
            "ReleaseSystem", self.handle, pb.SystemRequest(handle=self.handle), timeout))
        self.released = True
        self.last_info = info
        return info

    def stream(self, timeout: Optional[float] = None, skip_residual: bool = False) -> "SystemStream":
        """Opens the time-step stream (``SolveSystemStream``) on this system."""
        return SystemStream(self, timeout=timeout, skip_residual=skip_residual)


_END = object()


class SystemStream:
    """The time-step stream of a :class:`System`: one ``SolveSystemStream`` call for many steps.

    :meth:`send` queues a step (right-hand side and optional coefficient updates) and returns
    at once; :meth:`recv` returns the next answer, in the order the steps were sent. Sending a
    step or two ahead of receiving lets the next step travel while the server solves the
    current one; :meth:`solve` is ``send`` then ``recv``. A context manager: on exit the stream
    is closed (the answers not yet received are read and dropped), or cancelled when an
    exception is on its way::

        with sys.stream() as st:
            st.send(rhs0)
            for step in range(1, steps):
                st.send(rhs(step), update={"b": b(step)})
                x = st.recv().x          # the answer to step - 1
            x = st.recv().x

    Errors (a bad array in step k, the handle gone) end the stream: :meth:`recv` raises the
    :class:`TrisolveError`, and later calls raise it again.
    """

    def __init__(self, system: System, timeout: Optional[float] = None,
                 skip_residual: bool = False) -> None:
        self.system = system
        self.skip_residual = skip_residual
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._pending = 0
        self._closed = False
        self._error: Optional[TrisolveError] = None
        client = system.client
        stub, self._routed = client._by_handle(system.handle)
        self._call = stub.SolveSystemStream(
            self._requests(), timeout=timeout, metadata=client._metadata())
        self._sent_at: "queue.Queue[float]" = queue.Queue()
        # Each unanswered step's out, whether x goes into it in shared memory, whether any of
        # its arrays went by reference.
        self._outs: Deque[Tuple[Optional[np.ndarray], bool, bool]] = collections.deque()

    def _requests(self) -> Iterator["pb.SolveSystemRequest"]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            yield item

    @property
    def pending(self) -> int:
        """Steps sent whose answers have not been received."""
        return self._pending

    def send(self, rhs: Any, update: Optional[Mapping[str, Any]] = None,
             out: Optional[np.ndarray] = None) -> None:
        """Queues one step; never blocks (keep at most a few steps ahead of :meth:`recv`).

        Arrays that lie in registered shared memory go by reference (they must not change until
        the step is answered); ``out``: where this step's x goes, as in :meth:`System.solve`
        (written by the server when it lies in registered memory)."""
        if self._closed:
            raise ValueError("send on a closed stream")
        if self._error is not None:
            raise self._error
        req = self.system.request(rhs, update, self.skip_residual, out)
        by_ref = (req.HasField("x_region") or req.rhs.HasField("region")
                  or any(u.array.HasField("region") for u in req.update))
        self._outs.append((out, req.HasField("x_region"), by_ref))
        self._sent_at.put(time.perf_counter())
        self._queue.put(req)
        self._pending += 1

    def recv(self) -> Result:
        """The answer to the oldest step not yet received."""
        if self._error is not None:
            raise self._error
        if self._pending == 0:
            raise ValueError("recv with no step in flight (send one first)")
        try:
            resp = next(self._call)
        except grpc.RpcError as e:
            self._error = self.system.client._handle_error(e, self.system.handle, self._routed)
            raise self._error from None
        except StopIteration:
            self._error = TrisolveError(grpc.StatusCode.DATA_LOSS,
                                        "the stream ended before every step was answered")
            raise self._error from None
        self._pending -= 1
        out, in_region, by_ref = self._outs.popleft()
        result = _step_result(resp, out, in_region, by_ref)
        result.summary.timings.client_total_us = (time.perf_counter() - self._sent_at.get()) * 1e6
        return result

    def solve(self, rhs: Any, update: Optional[Mapping[str, Any]] = None,
              out: Optional[np.ndarray] = None) -> Result:
        """One step, waited for: :meth:`send` then :meth:`recv` (needs no step in flight)."""
        if self._pending:
            raise ValueError(f"solve with {self._pending} step(s) in flight: recv them first")
        self.send(rhs, update, out)
        return self.recv()

    def close(self) -> None:
        """Ends the stream: the answers not yet received are read and dropped, and the call's
        final status is checked (a :class:`TrisolveError` if it failed)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_END)
        if self._error is not None:
            return
        try:
            for _ in self._call:
                self._pending -= 1
        except grpc.RpcError as e:
            self._error = self.system.client._handle_error(e, self.system.handle, self._routed)
            raise self._error from None

    def cancel(self) -> None:
        """Abandons the stream at once."""
        self._closed = True
        self._queue.put(_END)
        self._call.cancel()

    def __enter__(self) -> "SystemStream":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.close()


def _step_result(resp: "pb.SolveResponse", out: Optional[np.ndarray], in_region: bool,
                 by_ref: bool) -> Result:
    from .client import Client, _Placement

    pl = _Placement(refs={"rhs": pb.RegionRef() if by_ref else None},
                    x_ref=pb.RegionRef() if in_region else None)
    return Client._deliver(pl, resp, out)
