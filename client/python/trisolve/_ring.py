"""Request rings: small unary solves and solves by handle of a client on the server's host, asked
and answered through a slot in shared memory (proto/ring_abi.h) instead of over the socket.

The same choices as the C++ client (client/ring.cc): each call takes a ring of the client's own
(one a calling thread at a time, opened on first use and kept), copies its arrays into the
ring's arena, rings the server's doorbell, spins briefly where the ring's last answer came
within the spin, then sleeps on its slot's futex until the answer is there, watching the
server's heartbeat. No compiled code: the ABI's structs are NumPy dtypes (the layout, pinned to
the header by the tests) and precompiled ``struct`` layouts that a call writes its request and
reads its answer with; the futex is ``syscall(SYS_futex, ...)`` through ctypes.

Memory order: the words that change hands are written with single aligned 4-byte stores and
read with single loads, in program order. On x86-64 that orders the request before its
``state`` word (stores are not reordered with stores) and the answer after it (nor loads with
loads). A store then a load of another word may pass each other there, and the two handshakes
need that order (doorbell += 1 then read ``sleeping``; ``waiting`` = 1 then read ``state``: of
the client's store and the server's, one side must see the other's), so a full fence sits
between them: a locked instruction, which ``pthread_spin_trylock`` on a lock of our own is.
On other architectures Python has no fence for the first order, hence x86-64 only.
"""
from __future__ import annotations

import ctypes
import math
import os
import platform
import re
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from .errors import DataLoss, DeadlineExceeded, TrisolveError, Unavailable, error_for
from .shm import SharedMemory

# ---- the ABI (proto/ring_abi.h; tests/test_ring_abi.py pins it to the header) -----------------
RING_MAGIC = 0x31474E4952535454  # "TTSRING1", little-endian
RING_VERSION = 2
MAX_ARRAYS = 8
MAX_RANK = 4
MESSAGE_BYTES = 240
MAX_REGIONS = 2
ALIGN = 64

SLOT_FREE, SLOT_SUBMITTED, SLOT_TAKEN, SLOT_DONE = 0, 1, 2, 3
OP_SOLVE, OP_SOLVE_SYSTEM = 1, 2
FAMILY = {"tridiagonal": 0, "tree": 1, "block-tridiagonal": 2, "dense": 3}
FLAG_SKIP_RESIDUAL, FLAG_SCALE_ROWS, FLAG_MAX_ITERATIONS, FLAG_TOL = 1, 2, 4, 8
RING_OPEN = 0

ARRAY = np.dtype([("name", "S16"), ("rank", "<i4"), ("region", "<u4"),
                  ("shape", "<i8", (MAX_RANK,)), ("offset", "<i8"), ("bytes", "<i8")], align=True)
REQUEST = np.dtype([
    ("op", "<u4"), ("family", "<u4"), ("dtype", "<u4"), ("layout", "<u4"), ("flags", "<u4"),
    ("narrays", "<i4"), ("method", "S32"), ("handle", "S64"), ("request_id", "S64"),
    ("deadline_unix_ns", "<i8"), ("max_iterations", "<i8"), ("tol", "<f8"),
    ("arrays", ARRAY, (MAX_ARRAYS,)), ("x_offset", "<i8"), ("x_bytes", "<i8"),
    ("status_offset", "<i8"), ("status_bytes", "<i8"), ("regions", "S64", (MAX_REGIONS,)),
    ("x_region", "<u4"), ("reserved", "<u4"), ("tag", "<u8")], align=True)
ANSWER = np.dtype([
    ("code", "<i4"), ("message_bytes", "<u4"), ("message", "S%d" % MESSAGE_BYTES),
    ("dtype", "<u4"), ("x_rank", "<i4"), ("x_shape", "<i8", (MAX_RANK,)), ("statuses", "<i8"),
    ("systems", "<i8"), ("ok", "<i8"), ("singular", "<i8"), ("not_converged", "<i8"),
    ("diverged", "<i8"), ("iterations", "<i8"), ("residual", "<f8"),
    ("receive_us", "<f8"), ("queue_us", "<f8"), ("h2d_us", "<f8"), ("compute_us", "<f8"),
    ("d2h_us", "<f8"), ("residual_us", "<f8"), ("total_us", "<f8"),
    ("batched_with", "<i4"), ("reserved", "<i4"), ("batch_systems", "<i8"),
    ("right_hand_sides", "<i8"), ("method", "S32"), ("backend", "S16"), ("tag", "<u8")],
    align=True)
SLOT = np.dtype([("state", "<u4"), ("waiting", "<u4"), ("sequence", "<u8"),
                 ("reserved", "u1", (48,)), ("request", REQUEST), ("answer", ANSWER),
                 ("tail", "u1", (24,))], align=True)
HEADER = np.dtype([("magic", "<u8"), ("version", "<u4"), ("slots", "<u4"),
                   ("slot_bytes", "<u4"), ("header_bytes", "<u4"), ("doorbell", "<u4"),
                   ("sleeping", "<u4"), ("heartbeat", "<u4"), ("closed", "<u4"),
                   ("queued", "<u4"), ("reserved", "u1", (20,))], align=True)

# The sizes ring_abi.h asserts; a dtype that disagrees is a bug here, caught on import.
assert (ARRAY.itemsize, REQUEST.itemsize, ANSWER.itemsize, SLOT.itemsize, HEADER.itemsize) == (
    72, 960, 488, 1536, 64)


# The request and the answer as struct layouts: a call writes its request with one pack_into
# and reads its answer with one unpack_from, where a NumPy field write or read costs about a
# microsecond each and a request took some forty of them. Little-endian, no padding: the C
# layout has none inside these (every member falls on its natural alignment), which the
# offsets checked below, and test_ring.py's round trip through the dtypes, hold to.
_REQUEST_HEAD = "<6I32s64s64sqqd"  # op .. tol
_ARRAY_FIELDS = "16siI4qqq"  # RingArray
_REQUEST_TAIL = "4q64s64sIIQ"  # x_offset .. tag
# One layout for each count of arrays used; the arrays past it are written as zeros.
_REQUESTS = [struct.Struct(_REQUEST_HEAD + _ARRAY_FIELDS * k + "%dx" % (ARRAY.itemsize *
                                                                         (MAX_ARRAYS - k))
                           + _REQUEST_TAIL) for k in range(MAX_ARRAYS + 1)]
_ANSWER = struct.Struct("<iI%dsIi4qq6qd7dii2q32s16sQ" % MESSAGE_BYTES)
# Where each answer member lies in _ANSWER's tuple.
(_A_CODE, _A_MESSAGE_BYTES, _A_MESSAGE, _A_DTYPE, _A_X_RANK, _A_X_SHAPE, _A_STATUSES,
 _A_SYSTEMS) = (0, 1, 2, 3, 4, 5, 9, 10)
_A_SUMMARY = {name: i for i, name in enumerate(
    ("systems", "ok", "singular", "not_converged", "diverged", "iterations", "residual",
     "receive_us", "queue_us", "h2d_us", "compute_us", "d2h_us", "residual_us", "total_us",
     "batched_with"), start=_A_SYSTEMS)}
_A_SUMMARY["right_hand_sides"] = 27
_A_METHOD, _A_BACKEND, _A_TAG = 28, 29, 30
assert all(r.size == REQUEST.itemsize for r in _REQUESTS) and _ANSWER.size == ANSWER.itemsize
assert struct.calcsize(_REQUEST_HEAD) == REQUEST.fields["arrays"][1]
assert struct.calcsize("<" + _ARRAY_FIELDS) == ARRAY.itemsize
assert (struct.calcsize("<iI%dsIi4qq6qd7di" % MESSAGE_BYTES) == ANSWER.fields["reserved"][1]
        and struct.calcsize("<iI%dsIi4qq6qd7dii2q" % MESSAGE_BYTES) == ANSWER.fields["method"][1])


def ring_bytes(slots: int) -> int:
    return HEADER.itemsize + slots * SLOT.itemsize


def _align(v: int) -> int:
    return -(-v // ALIGN) * ALIGN


# ---- the futex ---------------------------------------------------------------------------------
# Where the ring may be used: x86-64 Linux (see the module's docstring on memory order).
SUPPORTED = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (no FUTEX_PRIVATE_FLAG): the server is another process


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


# CDLL's functions release the GIL around the call, PyDLL's keep it. Only the futex wait
# blocks; every other call here is short, and a GIL released there is a switch to another
# calling thread that this one then waits (up to the interpreter's 5 ms interval) to get back.
_libc = ctypes.CDLL(None, use_errno=True) if SUPPORTED else None
_libc_held = ctypes.PyDLL(None) if SUPPORTED else None
_syscall = _syscall_held = None
_fence_lock = ctypes.c_int(0)  # a pthread_spinlock_t (an int on Linux) of this module's
if _libc is not None and _libc_held is not None:
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
    _syscall_held = _libc_held.syscall
    _syscall_held.restype = ctypes.c_long
    _libc_held.pthread_spin_init(ctypes.byref(_fence_lock), 0)
    _trylock, _unlock = _libc_held.pthread_spin_trylock, _libc_held.pthread_spin_unlock


def fence() -> None:
    """A full memory fence (store-load included): the lock's locked compare-exchange."""
    if _trylock(ctypes.byref(_fence_lock)) == 0:
        _unlock(ctypes.byref(_fence_lock))


def futex_wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleeps while the word at ``address`` holds ``expected``, at most ``timeout_s`` (the GIL
    is released meanwhile: ctypes drops it around the call)."""
    ts = _Timespec(int(timeout_s), int((timeout_s - int(timeout_s)) * 1e9))
    assert _syscall is not None
    _syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAIT),
             ctypes.c_uint32(expected), ctypes.byref(ts), None, ctypes.c_int(0))


def futex_wake(address: int) -> None:
    assert _syscall_held is not None
    _syscall_held(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAKE),
             ctypes.c_int(0x7FFFFFFF), None, None, ctypes.c_int(0))


# ---- the client's choices (as client/ring.cc) ----------------------------------------------------
# A server that stops advancing a ring's heartbeat for this long is taken for gone.
HEARTBEAT_TIMEOUT_S = 3.0
# A ring whose last answer took longer than the spin sleeps at once on its next call; one call
# in SPIN_PROBE spins anyway to notice that the load fell, unless the server said its thread
# had others queued (RingHeader.queued above 1).
SPIN_PROBE = 16
# A long call (its ring's last answer took LONG_CALL_US or more: a large solve by reference)
# sleeps until EARLY_US before the time its last answer took, then spins up to 2 EARLY_US for
# this one: the answer then finds the caller awake instead of paying a futex wake-up. Not past
# a second (that sleep watches neither the heartbeat nor the deadline), nor where the server's
# thread had others queued (the time was the queue's, not the solve's).
LONG_CALL_US = 1500.0
EARLY_US = 125.0
# Calls of this process spinning now, and the most that may: past half the cores a spinning
# caller takes the core a ring thread (or, in Python, the GIL another caller) needs.
_MAX_SPINNERS = max(1, (os.cpu_count() or 2) // 2)
_spinners = 0
_spin_lock = threading.Lock()

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,63}")
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _u32(buf: Any, offset: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_buffer(buf, offset)


class Lane:
    """One ring of the client's: its shared memory (the header, one slot, then the arena),
    registered and opened on the server."""

    def __init__(self, shm: SharedMemory, region: str) -> None:
        self.shm = shm
        self.region = region
        self.ring_id = ""
        self.arena = _align(ring_bytes(1))
        mem = shm._mapping
        self.mem = mem
        self.base = np.frombuffer(mem, dtype=np.uint8)
        # A 0-d structured array: its fields are views that write through to the mapping.
        self.header = self.base[:HEADER.itemsize].view(HEADER).reshape(())
        # The words that change hands, as single 4-byte loads and stores.
        h = 0
        s = HEADER.itemsize
        self.doorbell = _u32(mem, h + HEADER.fields["doorbell"][1])
        self.sleeping = _u32(mem, h + HEADER.fields["sleeping"][1])
        self.heartbeat = _u32(mem, h + HEADER.fields["heartbeat"][1])
        self.closed_word = _u32(mem, h + HEADER.fields["closed"][1])
        self.queued = _u32(mem, h + HEADER.fields["queued"][1])
        self.state = _u32(mem, s + SLOT.fields["state"][1])
        self.waiting = _u32(mem, s + SLOT.fields["waiting"][1])
        self.request_at = s + SLOT.fields["request"][1]
        self.answer_at = s + SLOT.fields["answer"][1]
        self.doorbell_address = shm.address + HEADER.fields["doorbell"][1]
        self.state_address = shm.address + s + SLOT.fields["state"][1]
        self.sequence = 0
        self.last_wait_us = 0.0
        self.last_queued = 0
        self.broken = False  # the server went, or a request was left with it: not reused
        self.server_gone = False  # its heartbeat stopped: nothing to close on the server

    def write_header(self) -> None:
        h = self.header
        h["magic"] = RING_MAGIC
        h["version"] = RING_VERSION
        h["slots"] = 1
        h["slot_bytes"] = SLOT.itemsize
        h["header_bytes"] = HEADER.itemsize

    @property
    def closed(self) -> bool:
        return self.closed_word.value != RING_OPEN

    @property
    def arena_bytes(self) -> int:
        return self.shm.size - self.arena

    def release_views(self) -> None:
        """Drops every view of the mapping, so that closing it is not refused."""
        for name in ("header", "base", "doorbell", "sleeping", "heartbeat",
                     "closed_word", "queued", "state", "waiting", "mem"):
            setattr(self, name, None)


def _spin_enter() -> bool:
    global _spinners
    with _spin_lock:
        _spinners += 1
        return _spinners <= _MAX_SPINNERS


def _spin_leave() -> None:
    global _spinners
    with _spin_lock:
        _spinners -= 1


def exchange(lane: Lane, spin_us: float, deadline: Optional[float], expect_us: float = 0.0) -> None:
    """Hands the slot's request to the server and waits for its answer (spinning ``spin_us``,
    then on the slot's futex; ``expect_us`` > 0: asleep until a little before the answer is
    expected, then spinning). Raises Unavailable / DeadlineExceeded (the lane broken) where no
    answer comes; on return the answer is in the slot, which is still DONE."""
    if lane.closed:
        lane.broken = True
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, "the server closed the ring")
    lane.waiting.value = 0
    # The request was written before this store (x86-64: stores stay in order).
    lane.state.value = SLOT_SUBMITTED
    lane.doorbell.value = (lane.doorbell.value + 1) & 0xFFFFFFFF  # only this client rings it
    fence()
    if lane.sleeping.value != 0:
        futex_wake(lane.doorbell_address)
    submitted = time.perf_counter()
    state = lane.state.value
    if expect_us > 0:
        wake_at = submitted + (expect_us - EARLY_US) * 1e-6
        while state != SLOT_DONE and not lane.closed:
            left = wake_at - time.perf_counter()
            if left <= 0:
                break
            lane.waiting.value = 1
            fence()
            state = lane.state.value
            if state == SLOT_DONE:
                break
            futex_wait(lane.state_address, state, min(left, 0.05))
            state = lane.state.value
        lane.waiting.value = 0
        state = lane.state.value
        spin_us = 2 * EARLY_US
    if spin_us > 0:
        if _spin_enter():
            until = time.perf_counter() + spin_us * 1e-6
            while state != SLOT_DONE and time.perf_counter() < until:
                state = lane.state.value
        _spin_leave()
    beat = lane.heartbeat.value
    beat_seen = time.monotonic()
    while state != SLOT_DONE:
        lane.waiting.value = 1
        fence()
        state = lane.state.value
        if state == SLOT_DONE:
            break
        futex_wait(lane.state_address, state, 0.05)
        state = lane.state.value
        if state == SLOT_DONE:
            break
        now = time.monotonic()
        b = lane.heartbeat.value
        if b != beat:
            beat, beat_seen = b, now
        # The slot stays the server's: this ring is not used again.
        if lane.closed and state == SLOT_SUBMITTED:
            lane.broken = True
            raise Unavailable(grpc.StatusCode.UNAVAILABLE,
                              "the server closed the ring before taking the request")
        if now - beat_seen > HEARTBEAT_TIMEOUT_S:
            lane.broken = lane.server_gone = True
            raise Unavailable(grpc.StatusCode.UNAVAILABLE,
                              f"the server stopped serving the ring (no heartbeat for "
                              f"{HEARTBEAT_TIMEOUT_S:g} s)")
        if deadline is not None and now > deadline + 1.0:
            lane.broken = True
            raise DeadlineExceeded(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "the server did not answer within the deadline")
    lane.waiting.value = 0


@dataclass
class Call:
    """One call for a ring: the arrays in the family's order (the right-hand side first), with
    their RegionRefs where they lie in registered memory."""
    op: int
    family: str
    dtype: np.dtype
    arrays: Sequence[Tuple[str, np.ndarray, Optional[Any]]]
    rhs_field: str
    x_shape: Tuple[int, ...]
    x_ref: Optional[Any] = None
    layout: int = 0
    flags: int = 0
    method: str = ""
    handle: str = ""
    request_id: str = ""
    timeout: Optional[float] = None
    max_iterations: Optional[int] = None
    tol: Optional[float] = None
    # By handle: the system's batch and whether its sizes vary (None: not known here).
    system: Optional[Tuple[int, bool]] = None


def not_on_ring(call: Call) -> Optional[str]:
    """Why the call cannot go through a ring at all (None: it can)."""
    if len(call.arrays) > MAX_ARRAYS:
        return "too many arrays"
    if len(call.method.encode()) >= 32:
        return "the method name is too long"
    if len(call.handle.encode()) >= 64:
        return "the handle is too long"
    for field, arr, _ in call.arrays:
        if arr.ndim == 0 or arr.ndim > MAX_RANK:
            return "an array of rank 0 or above 4"
        if len(field.encode()) >= 16:
            return "an array name is too long"
    return None


def most_systems(call: Call) -> int:
    """Room for a status a system (as client/ring.cc): the right-hand side's values over its
    shortest dimension, a variable-size batch's lengths, or a status a value."""
    most = max(1, math.prod(call.x_shape))
    for field, arr, _ in call.arrays:
        if field != call.rhs_field:
            continue
        if call.system is not None and call.system[1]:
            most = (arr.shape[0] if arr.ndim == 2 else 1) * call.system[0]
        elif arr.ndim >= 2 and (not call.handle or call.system is not None):
            shortest = min(arr.shape)
            if shortest > 0:
                most = arr.size // shortest
    for field, arr, _ in call.arrays:
        if field == "lengths":
            most = max(1, arr.size)
    return max(1, most)


def region_names(call: Call) -> Optional[List[str]]:
    """The registered regions the call's references name (None: more than MAX_REGIONS)."""
    names: List[str] = []
    for ref in [r for _, _, r in call.arrays] + [call.x_ref]:
        if ref is not None and ref.region not in names:
            names.append(ref.region)
    if len(names) > MAX_REGIONS or any(len(n.encode()) >= 64 for n in names):
        return None
    return names


def need_bytes(call: Call) -> int:
    x_bytes = math.prod(call.x_shape) * call.dtype.itemsize
    need = (0 if call.x_ref is not None else _align(x_bytes)) + _align(most_systems(call))
    for _, arr, ref in call.arrays:
        if ref is None:
            need += _align(arr.nbytes)
    return need


def ask(lane: Lane, call: Call, spin_us: float) -> Tuple[np.ndarray, np.ndarray, Dict[str, Any]]:
    """Writes the call into the lane's slot, waits for the answer and returns x, the statuses
    and the answer's summary fields. Raises the answer's error as over gRPC."""
    own_id = bool(call.request_id) and _REQUEST_ID.fullmatch(call.request_id) is not None
    deadline = None
    deadline_ns = 0
    if call.timeout is not None:
        deadline_ns = time.time_ns() + int(call.timeout * 1e9)
        deadline = time.monotonic() + call.timeout
    names = region_names(call) or []
    at = lane.arena
    base = lane.base
    values: List[Any] = [
        call.op, FAMILY[call.family] if call.op == OP_SOLVE else 0,
        2 if call.dtype == np.float32 else 1, call.layout, call.flags, len(call.arrays),
        b"" if call.method == "auto" else call.method.encode(), call.handle.encode(),
        call.request_id.encode() if own_id else b"", deadline_ns,
        call.max_iterations if call.max_iterations is not None else 0,
        call.tol if call.tol is not None else 0.0]
    for field, arr, ref in call.arrays:
        shape = arr.shape + (0,) * (MAX_RANK - arr.ndim)
        if ref is not None:
            values += (field.encode(), arr.ndim, names.index(ref.region) + 1, *shape, ref.offset,
                       arr.nbytes)
            continue
        values += (field.encode(), arr.ndim, 0, *shape, at, arr.nbytes)
        # The mapping takes a contiguous array's buffer: one memcpy, no NumPy views to make.
        lane.mem[at:at + arr.nbytes] = np.ascontiguousarray(arr)
        at += _align(arr.nbytes)
    x_bytes = math.prod(call.x_shape) * call.dtype.itemsize
    if call.x_ref is not None:
        x_region, x_offset = names.index(call.x_ref.region) + 1, call.x_ref.offset
    else:
        x_region, x_offset = 0, at  # in the arena
        at += _align(x_bytes)
    status_offset, status_bytes = at, most_systems(call)
    names += [""] * (MAX_REGIONS - len(names))
    lane.sequence += 1
    tag = lane.sequence
    values += (x_offset, x_bytes, status_offset, status_bytes, names[0].encode(),
               names[1].encode(), x_region, 0, tag)
    _REQUESTS[len(call.arrays)].pack_into(lane.mem, lane.request_at, *values)
    queue = lane.last_queued > 1
    spin = lane.last_wait_us <= spin_us or (not queue and tag % SPIN_PROBE == 0)
    long_call = (not queue and spin_us > 0 and LONG_CALL_US <= lane.last_wait_us <= 1e6)
    asked = time.perf_counter()
    try:
        exchange(lane, spin_us if spin else 0.0, deadline,
                 lane.last_wait_us if long_call else 0.0)
    except BaseException:
        # (KeyboardInterrupt in the futex wait, too) the slot may still be the server's.
        lane.broken = True
        raise
    finally:
        lane.last_wait_us = (time.perf_counter() - asked) * 1e6
        if lane.mem is not None:
            lane.last_queued = lane.queued.value
    ans = _ANSWER.unpack_from(lane.mem, lane.answer_at)
    code, statuses = ans[_A_CODE], ans[_A_STATUSES]
    x = None
    if code == 0:
        dt = np.dtype(np.float32 if ans[_A_DTYPE] == 2 else np.float64)
        rank = min(max(ans[_A_X_RANK], 0), MAX_RANK)
        shape = ans[_A_X_SHAPE:_A_X_SHAPE + rank]
        if (math.prod(shape) * dt.itemsize != x_bytes or statuses < 0
                or statuses > status_bytes):
            lane.state.value = SLOT_FREE
            lane.broken = True
            raise DataLoss(grpc.StatusCode.DATA_LOSS, "the ring's answer does not fit its request")
        if call.x_ref is None:
            x = base[x_offset:x_offset + x_bytes].view(dt).reshape(shape).copy()
        else:
            x = np.empty(0, dt)  # the server wrote x in place
    status = base[status_offset:status_offset + max(statuses, 0)].view(np.int8).copy()
    lane.state.value = SLOT_FREE
    if ans[_A_TAG] != tag:
        lane.broken = True
        raise DataLoss(grpc.StatusCode.DATA_LOSS, "the ring's answer is not its request's")
    if code != 0:
        n = min(ans[_A_MESSAGE_BYTES], MESSAGE_BYTES)
        message = ans[_A_MESSAGE][:n].decode("utf-8", "replace")
        raise error_for(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
    assert x is not None
    fields = {k: ans[i] for k, i in _A_SUMMARY.items()}
    # NUL-terminated
    fields["method"] = ans[_A_METHOD].partition(b"\0")[0].decode("utf-8", "replace")
    fields["backend"] = ans[_A_BACKEND].partition(b"\0")[0].decode("utf-8", "replace")
    fields["request_id"] = call.request_id if own_id else f"{lane.ring_id}.{tag}"
    return x, status, fields


class Pool:
    """The client's rings: idle ones, how many are open, and whether the server serves them."""

    def __init__(self, max_rings: int, arena_bytes: int, max_arena_bytes: int) -> None:
        self.lock = threading.Lock()
        self.idle: List[Lane] = []
        self.open = 0
        self.max_rings = max(1, int(max_rings))
        self.arena_bytes = int(arena_bytes)  # a ring's to start with
        self.max_arena_bytes = max(self.arena_bytes, int(max_arena_bytes))  # auto's to grow to
        self.state = "untried"  # "ring" once one was opened, "grpc" once refused for good
        self.why_not = ""
        # After a refusal for want of room (the server's ring or region caps), no new ring is
        # asked for before this: auto's calls take the RPC meanwhile.
        self.retry_after = 0.0


def unsupported_reason() -> Optional[str]:
    if SUPPORTED:
        return None
    return (f"the Python client's ring needs x86-64 Linux (this is {platform.system()} "
            f"{platform.machine()})")


def refusal_is_final(e: TrisolveError) -> bool:
    """A refusal that will not change for this client: another host, rings or shared memory
    off on the server."""
    return e.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED)


__all__ = ["Lane", "Pool", "Call", "ask", "need_bytes", "not_on_ring", "region_names",
           "ring_bytes", "unsupported_reason", "refusal_is_final"]
