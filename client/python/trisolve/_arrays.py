"""The array rules of the Python client: which arrays are accepted and how they travel.

- Coefficient and right-hand-side arrays must be floating point: float32 or float64. Integer,
  boolean, complex, float16 and long-double arrays raise ``TypeError`` naming the array (convert
  them yourself, e.g. ``b.astype(np.float64)``, so the choice of precision is yours).
- The request's precision (the proto's ``dtype``): with ``dtype=None``, float32 when every array
  is float32, otherwise float64 -- a mix of float32 and float64 is sent as float64, never
  narrowed to float32. With ``dtype=np.float32`` or ``np.float64`` every array is converted to
  it (narrowing only when you ask for it). The answer comes back in that dtype.
- Any memory order is accepted: a Fortran-order or otherwise non-C-contiguous array (a
  transpose, a slice with steps) is copied into C order with ``np.ascontiguousarray`` -- its
  *logical* shape and values are what is sent, never its memory reinterpreted. So ``X.T`` of a
  ``batch x n`` array is the ``n x batch`` interleaved array of the same systems. Big-endian
  arrays are converted to little-endian.
- ``parent`` (tree) and ``lengths`` (variable-size tridiagonal batches, tree cells of different
  sizes) must be integer arrays;
  values are sent as int32 (an int64 or other integer array is converted after checking every
  value fits int32; ``ValueError`` otherwise).
- Arrays must have at least one dimension; a 1-D array is a batch of one.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from .results import Layout

DTypeLike = Union[None, str, type, np.dtype]
LayoutLike = Union[str, int, Layout]

_ALLOWED = (np.dtype(np.float32), np.dtype(np.float64))


def float_array(name: str, value: Any) -> np.ndarray:
    """``value`` as an ndarray of float32 or float64 (not yet converted); TypeError otherwise."""
    arr = np.asarray(value)
    if arr.dtype.kind != "f" or arr.dtype.newbyteorder("=") not in _ALLOWED:
        raise TypeError(
            f"{name} has dtype {arr.dtype}; trisolve takes float32 or float64 arrays "
            f"(convert it yourself, e.g. {name}.astype(np.float64))")
    if arr.ndim == 0:
        raise ValueError(f"{name} is a scalar; trisolve takes arrays (a 1-D array is one system)")
    return arr


def parse_dtype(dtype: DTypeLike) -> Optional[np.dtype]:
    if dtype is None:
        return None
    dt = np.dtype(dtype)
    if dt.kind != "f" or dt.newbyteorder("=") not in _ALLOWED:
        raise ValueError(f"dtype={dtype!r}: expected float32 or float64")
    return dt.newbyteorder("=")


def choose_dtype(arrays: Mapping[str, np.ndarray], dtype: DTypeLike) -> np.dtype:
    """The request's precision: ``dtype`` if given, else float64 unless every array is float32."""
    dt = parse_dtype(dtype)
    if dt is not None:
        return dt
    if arrays and all(a.dtype.itemsize == 4 for a in arrays.values()):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def wire(arr: np.ndarray, dt: np.dtype) -> np.ndarray:
    """A C-contiguous little-endian copy of ``arr`` in ``dt`` (no copy when it already is one)."""
    return np.ascontiguousarray(arr, dtype=np.dtype(dt).newbyteorder("<"))


def index_array(name: str, value: Any, expect: str) -> np.ndarray:
    """An integer array (``parent``, ``lengths``) as C-contiguous little-endian int32, checking
    that int64 values fit."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} has dtype {arr.dtype}; expected an integer array (int32 or int64)")
    if arr.ndim == 0:
        raise ValueError(f"{name} is a scalar; expected {expect}")
    if arr.dtype.itemsize > 4 or arr.dtype == np.uint32:
        info = np.iinfo(np.int32)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(
                f"{name} holds values outside int32 (min {arr.min()}, max {arr.max()}); "
                f"{name} travels as int32")
    return np.ascontiguousarray(arr, dtype="<i4")


def parent_array(value: Any) -> np.ndarray:
    """``parent`` as C-contiguous little-endian int32, checking int64 values fit."""
    return index_array("parent", value, "[n] or [batch, n]")


def lengths_array(value: Any) -> np.ndarray:
    """A variable-size batch's ``lengths`` (``[systems]`` or ``[cells]``) as int32."""
    arr = index_array("lengths", value, "[systems]")
    if arr.ndim != 1:
        raise ValueError(f"lengths has shape {arr.shape}; expected [systems]")
    return arr


def parse_layout(layout: LayoutLike) -> Layout:
    if isinstance(layout, str):
        try:
            return Layout[layout.strip().upper()]
        except KeyError:
            raise ValueError(f"layout={layout!r}: expected 'flat' or 'interleaved'") from None
    try:
        return Layout(int(layout))
    except (TypeError, ValueError):
        raise ValueError(f"layout={layout!r}: expected 'flat' or 'interleaved'") from None


def prepare(floats: Dict[str, Any], dtype: DTypeLike) -> Tuple[np.dtype, Dict[str, np.ndarray]]:
    """Checks the named float arrays, picks the precision, returns them ready for the wire."""
    checked = {name: float_array(name, v) for name, v in floats.items()}
    dt = choose_dtype(checked, dtype)
    return dt, {name: wire(a, dt) for name, a in checked.items()}


def decode(data: bytes, shape: Tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """A writable array of ``shape`` from little-endian bytes."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    need = count * np.dtype(dt).itemsize
    if len(data) != need:
        raise ValueError(f"x has {len(data)} bytes of data, expected {need} for shape {list(shape)}")
    return np.frombuffer(data, dtype=np.dtype(dt).newbyteorder("<")).reshape(shape).astype(
        np.dtype(dt).newbyteorder("="), copy=True)
