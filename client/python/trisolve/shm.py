"""Shared memory for clients on the server's host: arrays that lie in a registered
:class:`SharedMemory` travel as (region, offset, bytes) references instead of bytes, and ``x``
can be written by the server straight into it.

::

    with trisolve.SharedMemory(64 << 20) as shm, trisolve.Client(target) as client:
        client.register_memory(shm)                 # the server maps it once
        d = shm.array((batch, n))                   # NumPy arrays living in it: fill in place
        x = shm.array((batch, n))
        ...
        client.solve_tridiagonal(a, b, c, d, out=x)  # no array bytes cross the socket

A POSIX shared-memory object (``multiprocessing.shared_memory``) under an unguessable key
(``/trisolve-<32 hex digits>``: the key is a capability, whoever knows it can map the memory),
its pages reserved up front (``posix_fallocate``) so that a full ``/dev/shm`` fails here, not
with ``SIGBUS`` later. :meth:`SharedMemory.close` (or leaving the ``with`` block) unregisters it
from every client it was registered with and unlinks the object; the mapping stays valid for as
long as arrays made from it are alive (the memory goes with the last of them), so closing never
leaves an array pointing at unmapped memory.

Python's ``resource_tracker`` registers every object ``multiprocessing.shared_memory`` creates and
unlinks (with a "leaked shared_memory objects" warning) those still there when the process
ends: closing unlinks and unregisters it, so only a process that dies without closing gets the
tracker's clean-up -- which is what it is for.
"""
from __future__ import annotations

import math
import mmap
import os
import secrets
import threading
import weakref
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["SharedMemory"]

ALIGN = 64
_SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared-memory objects (shm_overview(7))


def _release(shm: shared_memory.SharedMemory, mapping: mmap.mmap, owner_pid: int) -> None:
    """Unlinks the object and drops this process's mapping (kept while arrays still use it).
    Only the process that created it unlinks it: a forked child exiting leaves it alone."""
    if os.getpid() == owner_pid:
        try:
            shm.unlink()  # also unregisters it from the resource tracker
        except FileNotFoundError:
            pass
    try:
        mapping.close()
    except BufferError:
        pass  # arrays made from it are alive: the mapping goes with the last of them


class SharedMemory:
    """A POSIX shared-memory object mapped into this process, handing out NumPy arrays.

    Args:
        size: bytes (rounded up to the page size).

    Attributes:
        key: the object's name for ``shm_open`` (``"/trisolve-..."``), what the server maps.
        name: the key without its leading ``/`` (``multiprocessing``'s name; the default region
            name when registered).
        size: its size in bytes.

    Pieces are handed out one after the other, each 64-byte aligned (:meth:`array`,
    :meth:`copy`); :meth:`reset` forgets them all so the memory can be reused (arrays handed out
    before then alias the new ones). A context manager: ``close`` on exit.
    """

    def __init__(self, size: int) -> None:
        size = int(size)
        if size <= 0:
            raise ValueError(f"shared memory of {size} bytes")
        page = mmap.PAGESIZE
        size = (size + page - 1) // page * page
        self._lock = threading.Lock()
        self._used = 0
        self._clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
        self._closed = False
        name = "trisolve-" + secrets.token_hex(16)
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)  # O_EXCL, mode 0600
        try:
            # A mapping of our own: multiprocessing's closes now (nothing uses it), and ours
            # may outlive close() while arrays made from it are alive.
            fd = os.open(os.path.join(_SHM_DIR, shm.name), os.O_RDWR)
            try:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    raise OSError(e.errno, f"reserving {size} bytes of shared memory ({e.strerror}; "
                                  f"is {_SHM_DIR} large enough?)", shm.name) from None
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            shm.close()
        except BaseException:
            shm.close()
            try:
                shm.unlink()
            except OSError:
                pass
            raise
        self._shm_name = shm.name
        self._size = size
        self._mapping = mapping
        self._base: Optional[np.ndarray] = np.frombuffer(mapping, dtype=np.uint8)
        self._address = int(self._base.__array_interface__["data"][0])
        # Unlinks at close(), when this object is collected, or at exit (whichever comes first).
        self._finalizer = weakref.finalize(self, _release, shm, mapping, os.getpid())

    # ---- what it is ------------------------------------------------------------------------
    @property
    def key(self) -> str:
        return "/" + self._shm_name

    @property
    def name(self) -> str:
        return self._shm_name

    @property
    def size(self) -> int:
        return self._size

    @property
    def used(self) -> int:
        """Bytes handed out since the last :meth:`reset` (alignment included)."""
        return self._used

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def address(self) -> int:
        """Where the mapping starts in this process."""
        return self._address

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._used} of {self._size} bytes used"
        return f"trisolve.SharedMemory({self.key!r}, {state})"

    def contains(self, arr: np.ndarray) -> bool:
        """Whether ``arr``'s memory lies inside this mapping."""
        if self._closed or not isinstance(arr, np.ndarray):
            return False
        start = int(arr.__array_interface__["data"][0])
        return self._address <= start and start + arr.nbytes <= self._address + self._size

    # ---- pieces ----------------------------------------------------------------------------
    def array(self, shape: Union[int, Sequence[int]], dtype: Any = np.float64) -> np.ndarray:
        """A new C-order array of ``shape`` and ``dtype`` living in this memory (contents as
        they were: zero for fresh memory, whatever was there after :meth:`reset`).

        Raises:
            MemoryError: it does not fit in what is left.
            ValueError: the memory was closed.
        """
        dt = np.dtype(dtype)
        shp = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shp):
            raise ValueError(f"negative dimension in shape {list(shp)}")
        nbytes = math.prod(shp) * dt.itemsize
        with self._lock:
            if self._closed or self._base is None:
                raise ValueError(f"{self!r}: closed")
            start = (self._used + ALIGN - 1) // ALIGN * ALIGN
            if start + nbytes > self._size:
                raise MemoryError(f"shared memory {self.key}: {nbytes} bytes do not fit "
                                  f"({self._size - self._used} of {self._size} left)")
            self._used = start + nbytes
            piece = self._base[start:start + nbytes]
        return piece.view(dt).reshape(shp)

    def zeros(self, shape: Union[int, Sequence[int]], dtype: Any = np.float64) -> np.ndarray:
        """:meth:`array`, filled with zeros."""
        a = self.array(shape, dtype)
        a.fill(0)
        return a

    def copy(self, value: Any, dtype: Any = None) -> np.ndarray:
        """A copy of ``value`` (any array-like) in this memory, C order, in ``dtype`` (default:
        ``value``'s, in native byte order)."""
        src = np.asarray(value)
        dt = np.dtype(dtype) if dtype is not None else src.dtype.newbyteorder("=")
        out = self.array(src.shape, dt)
        np.copyto(out, src, casting="unsafe" if dtype is not None else "same_kind")
        return out

    def reset(self) -> None:
        """Forgets every piece: later :meth:`array` calls reuse the memory from its start."""
        with self._lock:
            self._used = 0

    # ---- life ------------------------------------------------------------------------------
    def close(self) -> None:
        """Unregisters it from every client it was registered with (errors ignored: the server
        drops a region whose time-to-live passed anyway), unlinks the object and releases this
        process's mapping once no array made from it is left. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._base = None
        for client in list(self._clients):
            client._forget_memory(self)
        self._clients.clear()
        mapping, self._mapping = self._mapping, None
        del mapping
        self._finalizer()

    def __enter__(self) -> "SharedMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
