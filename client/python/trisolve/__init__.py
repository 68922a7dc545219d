"""trisolve: solve batches of structured linear systems on a trisolve server, NumPy in and out.

    import numpy as np, trisolve
    with trisolve.Client("127.0.0.1:50051") as client:
        r = client.solve_tridiagonal(a, b, c, d)          # arrays batch x n (or n for one)
        print(r.x, r.summary.method, r.summary.residual)

Families: :meth:`Client.solve_tridiagonal`, :meth:`Client.solve_tree` (Hines),
:meth:`Client.solve_block_tridiagonal`, :meth:`Client.solve_dense`; persistent systems with
:meth:`Client.create_system` (handles, updates, a time-step stream). Jobs over ~4 MiB go through
the streaming RPC on their own. On the server's host, :class:`SharedMemory` regions
(:meth:`Client.register_memory`) carry arrays and ``x`` (``out=``) without crossing the socket;
``Client(transport="auto")`` stages large jobs through one of its own; to a server on another
host it writes jobs of 32 MiB or more into the server's memory over parallel connections
(``transport="streams"`` for every job). ``python3 -m trisolve plot`` (:mod:`trisolve.plot`,
with matplotlib) draws block solutions as heat maps, residual histories and the benchmark CSVs
as plots. Any solve takes ``progress=callable`` (called with a :class:`Progress` while it runs);
a block solve takes ``residual_history=True`` (``summary.residual_history``).

Array rules (see ``trisolve._arrays``): float32 or float64 only (``TypeError`` naming the array
otherwise); a float32/float64 mix travels as float64 unless ``dtype=`` says otherwise;
non-C-contiguous (Fortran-order) arrays are copied to C order with ``np.ascontiguousarray``,
never reinterpreted; ``parent`` is int32 on the wire (int64 accepted when it fits).
Server errors raise :class:`TrisolveError` subclasses carrying ``.code`` and ``.message``.
"""
from __future__ import annotations

from .client import DEFAULT_TARGET, TLS, Client
from .errors import (AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition,
                     Internal, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted,
                     TrisolveError, Unauthenticated, Unavailable, Unimplemented)
from .results import (Layout, MemoryRegion, Progress, ResidualHistory, Result, Summary,
                      SystemInfo, SystemStatus, Timings)
from .shm import SharedMemory
from .systems import System, SystemStream

__version__ = "0.1.0"

__all__ = [
    "Client", "TLS", "DEFAULT_TARGET", "System", "SystemStream", "Result", "Summary", "Timings",
    "SystemInfo", "Layout", "SystemStatus", "TrisolveError", "InvalidArgument", "NotFound",
    "ResourceExhausted", "Unavailable", "DeadlineExceeded", "Unauthenticated", "PermissionDenied",
    "Unimplemented", "Cancelled", "FailedPrecondition", "AlreadyExists", "Internal", "DataLoss",
    "SharedMemory",
    "MemoryRegion", "Progress", "ResidualHistory", "__version__",
]
