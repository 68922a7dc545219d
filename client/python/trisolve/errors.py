"""Exceptions: every gRPC error the server answers becomes a :class:`TrisolveError` subclass.

Each carries ``code`` (a :class:`grpc.StatusCode`) and ``message`` (the server's message, which
names the field and the fault, e.g. ``"b has shape [3, 9], expected [3, 10]"``)::

    try:
        client.solve_tridiagonal(a, b, c, d)
    except trisolve.InvalidArgument as e:
        print(e.code, e.message)

Errors found before anything is sent are Python's own: ``TypeError`` for an array of the wrong
kind (integers where coefficients are expected), ``ValueError`` for a bad option or a ``parent``
value outside int32.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "TrisolveError", "InvalidArgument", "NotFound", "ResourceExhausted", "Unavailable",
    "DeadlineExceeded", "Unauthenticated", "PermissionDenied", "Unimplemented", "Cancelled",
    "FailedPrecondition", "AlreadyExists", "Internal", "DataLoss", "from_rpc_error",
]


class TrisolveError(Exception):
    """A call the server (or the channel) refused or failed.

    Attributes:
        code: the gRPC status code (:class:`grpc.StatusCode`).
        message: the server's message ("details" in gRPC terms).
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")


class InvalidArgument(TrisolveError):
    """INVALID_ARGUMENT: a malformed request (shapes, NaN/Inf, unknown method, bad tree, ...)."""


class NotFound(TrisolveError):
    """NOT_FOUND: a system handle or shared-memory region that is unknown, released, expired or
    another identity's."""


class ResourceExhausted(TrisolveError):
    """RESOURCE_EXHAUSTED: a job or message over a server limit, or the queue is full."""


class Unavailable(TrisolveError):
    """UNAVAILABLE: no server at the target, or the server is shutting down."""


class DeadlineExceeded(TrisolveError):
    """DEADLINE_EXCEEDED: the call's timeout passed before the answer came."""


class Unauthenticated(TrisolveError):
    """UNAUTHENTICATED: a missing or unknown bearer token."""


class PermissionDenied(TrisolveError):
    """PERMISSION_DENIED."""


class Unimplemented(TrisolveError):
    """UNIMPLEMENTED: the server does not offer this call (an older server)."""


class Cancelled(TrisolveError):
    """CANCELLED: the call was cancelled (by the client, or the server stopping)."""


class FailedPrecondition(TrisolveError):
    """FAILED_PRECONDITION: shared memory the server cannot map (another host or IPC namespace,
    another user, a server started with ``--no-shared-memory``), or a region that shrank."""


class AlreadyExists(TrisolveError):
    """ALREADY_EXISTS: a shared-memory region of that name is registered already (this token)."""


class Internal(TrisolveError):
    """INTERNAL: a fault inside the server (or a broken message)."""


class DataLoss(TrisolveError):
    """DATA_LOSS: an answer that does not fit its declared shape."""


_BY_CODE: Dict[grpc.StatusCode, Type[TrisolveError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.DATA_LOSS: DataLoss,
}


def error_for(code: grpc.StatusCode, message: str) -> TrisolveError:
    """The exception for a status code (TrisolveError itself for codes without a subclass)."""
    return _BY_CODE.get(code, TrisolveError)(code, message)


def from_rpc_error(e: grpc.RpcError) -> TrisolveError:
    """Turns a :class:`grpc.RpcError` into the matching :class:`TrisolveError` subclass."""
    code: Optional[grpc.StatusCode] = None
    message = ""
    if isinstance(e, grpc.Call) or hasattr(e, "code"):
        try:
            code = e.code()  # type: ignore[attr-defined]
            message = e.details() or ""  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - an RpcError without a status: keep its text
            code = None
    if code is None:
        return TrisolveError(grpc.StatusCode.UNKNOWN, str(e))
    return error_for(code, message)
