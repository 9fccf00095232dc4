"""The sort key: ``key = lane * STRIDE + due_ms``, the only place that arithmetic lives.

A key is exact as int64, uint64 and float64 (every key is below 2**53), lane 0 is the identity
(a plain timestamp is a valid lane-0 key), and a lane change is a numeric update. The C core has
one mirror of these functions (``rl_encode`` in ``csrc/keys.c``); the tests hold them equal.

Two traps this module exists to close:

* an absent due time (None, NaN, inf) must never become 0 — 0 reads as "due since 1970" and
  would drag a lane's floor to "unbounded";
* a raw key of a non-zero lane looks like a plausible timestamp 139 years out. Anything that
  wants a timestamp goes through :func:`due_ms_of`, and :func:`check_due_ms` refuses a value at
  or beyond ``STRIDE`` (the horizon guard).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .errors import EngineTypeError, EngineValueError

STRIDE: int = 1 << 42
"""Width of one lane in ms (about 139 years)."""

PARKED_MS: int = STRIDE - 1
"""The due time of a parked row (``--max-failures``, or an operator's Park): never due,
until a rush or a re-add."""

KEY_LANES: int = 2048
"""Lanes the key contract allows: they keep every key below 2**53. A segment holds fewer
(``RL_MAX_LANES``, 64: the row word keeps 7 lane bits); the policy's own lane count is smaller
still."""

IntArray = npt.NDArray[np.int64]


def _as_int(value: object, what: str) -> int:
    """One scalar integer, refusing absent and fractional values instead of coercing them."""
    if value is None:
        raise EngineValueError(f"{what} is absent (None); it is never taken as 0")
    if isinstance(value, (bool, np.bool_, np.timedelta64, np.datetime64)):
        raise EngineTypeError(f"{what} must be an integer, not {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            f = float(value)
        except OverflowError:
            raise EngineValueError(f"{what}={value!r} is far outside any range") from None
        if not math.isfinite(f):
            raise EngineValueError(f"{what} is {f!r}; an absent due time is never taken as 0")
        if f != int(f):
            raise EngineValueError(f"{what} must be a whole number of ms, got {f!r}")
        return int(f)
    raise EngineTypeError(f"{what} must be an integer, got {type(value).__name__}")


def check_due_ms(value: object, what: str = "due_ms") -> int:
    """A validated due time in ``[0, STRIDE)``; the horizon guard for raw keys."""
    due = _as_int(value, what)
    if due < 0:
        raise EngineValueError(f"{what} must be >= 0, got {due}")
    if due >= STRIDE:
        raise EngineValueError(
            f"{what}={due} is beyond the horizon (>= 2**42): a raw key was passed where a "
            "timestamp belongs, or the value is not a ms timestamp"
        )
    return due


def check_lane(value: object, lane_count: int = KEY_LANES) -> int:
    # A lane is an index: a float (even a whole one, even -0.0) is refused, not truncated.
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        raise EngineValueError(f"lane must be an integer, got {value!r}")
    lane = _as_int(value, "lane")
    if not 0 <= lane < lane_count:
        raise EngineValueError(f"lane must be in [0, {lane_count}), got {lane}")
    return lane


def as_int64_array(values: Any, what: str) -> IntArray:
    """A 1-d int64 copy of ``values``, refusing NaN/inf/fractions instead of truncating them."""
    arr = _asarray(values, what)
    if arr.ndim != 1:
        raise EngineValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind in "mM":
        raise EngineTypeError(f"{what} must be integers, not {arr.dtype}")
    if kind in "iu":
        if kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise EngineValueError(f"{what} has values beyond int64")
        return arr.astype(np.int64, copy=True)
    if kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.argmax(bad))
            raise EngineValueError(
                f"{what}[{i}] is {arr[i]!r}; an absent due time is never taken as 0"
            )
        if (arr != np.floor(arr)).any():
            raise EngineValueError(f"{what} must hold whole numbers")
        if arr.size and (arr.max() >= 2.0**63 or arr.min() < -(2.0**63)):
            raise EngineValueError(f"{what} has values beyond int64")
        return arr.astype(np.int64)
    if kind == "O":
        ints = [_as_int(v, f"{what}[{i}]") for i, v in enumerate(arr)]
        if any(not -(1 << 63) <= v < (1 << 63) for v in ints):
            raise EngineValueError(f"{what} has values beyond int64")
        return np.array(ints, dtype=np.int64)
    raise EngineTypeError(f"{what} must be an integer array, got dtype {arr.dtype}")


def _asarray(values: Any, what: str) -> np.ndarray[Any, Any]:
    """``np.asarray`` with its failures (ragged lists, ints past every dtype) made ours."""
    try:
        return np.asarray(values)
    except (ValueError, OverflowError) as exc:
        raise EngineValueError(f"{what} is not a flat array of integers: {exc}") from None
    except TypeError as exc:
        raise EngineTypeError(f"{what} is not an array of integers: {exc}") from None


def ndim_of(values: Any, what: str) -> int:
    """``np.ndim`` that refuses ragged input with our error instead of numpy's."""
    try:
        return int(np.ndim(values))
    except (ValueError, OverflowError, TypeError) as exc:
        raise EngineValueError(f"{what} is not a flat array: {exc}") from None


def check_due_array(values: Any, what: str = "due_ms") -> IntArray:
    arr = as_int64_array(values, what)
    bad = (arr < 0) | (arr >= STRIDE)
    if bad.any():
        i = int(np.argmax(bad))
        raise EngineValueError(f"{what}[{i}]={int(arr[i])} is outside [0, 2**42)")
    return arr


@overload
def encode(lane: int, due_ms: int) -> int: ...
@overload
def encode(lane: Any, due_ms: Any) -> IntArray: ...
def encode(lane: Any, due_ms: Any) -> Any:
    """``lane * STRIDE + due_ms``; scalars give an int, arrays an int64 array."""
    if ndim_of(lane, "lane") == 0 and ndim_of(due_ms, "due_ms") == 0:
        return check_lane(lane) * STRIDE + check_due_ms(due_ms)
    lanes = as_int64_array(np.atleast_1d(_asarray(lane, "lane")), "lane")
    if ((lanes < 0) | (lanes >= KEY_LANES)).any():
        raise EngineValueError(f"lane must be in [0, {KEY_LANES})")
    dues = check_due_array(np.atleast_1d(_asarray(due_ms, "due_ms")))
    try:
        lanes, dues = np.broadcast_arrays(lanes, dues)
    except ValueError:
        raise EngineValueError(
            f"lane ({len(lanes)}) and due_ms ({len(dues)}) cannot be paired") from None
    return lanes * np.int64(STRIDE) + dues


def _key_array(key: Any) -> IntArray:
    arr = _asarray(key, "key")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise EngineValueError("key must be finite")
        if (arr != np.floor(arr)).any():
            raise EngineValueError("key must be a whole number")
    elif arr.dtype.kind not in "iu":
        raise EngineTypeError(f"key must be integer, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= float(KEY_LANES * STRIDE)):
        raise EngineValueError("key is outside [0, 2048 * 2**42)")
    return arr.astype(np.int64)


def _check_key(key: object) -> int:
    k = _as_int(key, "key")
    if not 0 <= k < KEY_LANES * STRIDE:
        raise EngineValueError(f"key {k} is outside [0, 2048 * 2**42)")
    return k


@overload
def lane_of(key: int) -> int: ...
@overload
def lane_of(key: Any) -> Any: ...
def lane_of(key: Any) -> Any:
    if ndim_of(key, "key") == 0:
        return _check_key(key) // STRIDE
    return _key_array(key) // np.int64(STRIDE)


@overload
def due_ms_of(key: int) -> int: ...
@overload
def due_ms_of(key: Any) -> Any: ...
def due_ms_of(key: Any) -> Any:
    if ndim_of(key, "key") == 0:
        return _check_key(key) % STRIDE
    return _key_array(key) % np.int64(STRIDE)


def minute_of(due_ms: int) -> int:
    """The floor's unit: whole minutes since the epoch."""
    return check_due_ms(due_ms) // 60_000
