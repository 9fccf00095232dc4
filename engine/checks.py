"""Argument checks that every backend and module shares: one rule, one home.

Every public call checks its whole input before it changes anything, and refuses instead of
coercing: a bool is not a count, a float is not a row id, None is never taken as 0. The checks
of due times and keys are in :mod:`engine.keys` (they know the key's horizon); the rest is here.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from .errors import EngineTypeError, EngineValueError
from .keys import STRIDE, as_int64_array, check_due_ms, ndim_of
from .limits import MAX_BUDGET, MAX_WINDOW

IntArray = npt.NDArray[np.int64]


def is_int(value: object) -> TypeGuard[int]:
    """An int and not a bool (``True`` is an ``int`` to Python, never a count or a row here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: object, what: str, lo: int, hi: int) -> int:
    """One integer in [lo, hi]; bools, floats and None are refused, not coerced."""
    if value is None:
        raise EngineValueError(f"{what} is absent (None)")
    if isinstance(value, (bool, np.bool_, np.timedelta64, np.datetime64)) or not isinstance(
            value, numbers.Integral):
        raise EngineTypeError(f"{what} must be an integer, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise EngineValueError(f"{what} must be in [{lo}, {hi}], got {v}")
    return v


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise EngineTypeError(f"{what} must be a bool, got {value!r}")
    return value


def check_token(token: object) -> int:
    """A token is an opaque 64-bit value carried as int64 (it may be negative)."""
    return check_int(token, "token", -(1 << 63), (1 << 63) - 1)


def check_lease_ms(lease_ms: object) -> int:
    return check_int(lease_ms, "lease_ms", 1, STRIDE - 1)


def check_mode(mode: object) -> bool:
    """``prioritize``'s mode: True for ``"rush"``, False for ``"wait"``."""
    if not isinstance(mode, str) or mode not in ("rush", "wait"):
        raise EngineValueError(f"mode must be 'rush' or 'wait', got {mode!r}")
    return mode == "rush"


def claim_args(budget: object, lease_ms: object, window: object) -> tuple[int, int, int]:
    """A claim's budget, lease and window, checked against the bounds in :mod:`engine.api`."""
    return (check_int(budget, "budget", 1, MAX_BUDGET), check_lease_ms(lease_ms),
            check_int(window, "window", 1, MAX_WINDOW))


def wall_ms() -> int:
    """This process's wall clock in ms since the epoch."""
    return time.time_ns() // 1_000_000


def check_now(now_ms: object) -> int:
    """``now_ms`` checked (a due time), or the wall clock when it is None."""
    if now_ms is None:
        return wall_ms()
    if type(now_ms) is int and 0 <= now_ms < STRIDE:
        return now_ms
    return check_due_ms(now_ms, "now_ms")


def int64_vector(values: Any, what: str) -> IntArray:
    """Pass a 1-d contiguous int64 array through untouched (a claim batch's field); copy the
    rest, checked."""
    if (type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1
            and values.flags.c_contiguous):
        return values
    return as_int64_array(values, what)


def rows_tokens(rows: Any, tokens: Any) -> tuple[IntArray, IntArray]:
    """A batch's rows and tokens as int64 arrays of one length."""
    r, t = int64_vector(rows, "rows"), int64_vector(tokens, "tokens")
    if len(r) != len(t):
        raise EngineValueError(f"rows ({len(r)}) and tokens ({len(t)}) differ in length")
    return r, t


def broadcast(values: Any, n: int, what: str, lo: int, hi: int) -> IntArray:
    """A scalar or an n-array of integers in [lo, hi], as an int64 n-array (checked even when
    n is 0, so an empty batch cannot smuggle a bad scalar through)."""
    if ndim_of(values, what) == 0:
        return np.full(n, check_int(values, what, lo, hi), np.int64)
    arr = as_int64_array(values, what)
    if len(arr) != n:
        raise EngineValueError(f"{what} has {len(arr)} elements, due_ms has {n}")
    if len(arr) and (arr.min() < lo or arr.max() > hi):
        raise EngineValueError(f"{what} must lie in [{lo}, {hi}]")
    return np.ascontiguousarray(arr)


def choice_code(value: object, names: Sequence[str], what: str) -> int:
    """One of ``names``, or its index (a code), as the code."""
    if isinstance(value, str):
        if value not in names:
            raise EngineValueError(f"unknown {what} {value!r} (known: {tuple(names)})")
        return list(names).index(value)
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
            value, (bool, np.bool_, np.timedelta64)):
        if not 0 <= int(value) < len(names):
            raise EngineValueError(f"{what} code must be in [0, {len(names) - 1}], got {value}")
        return int(value)
    raise EngineTypeError(f"{what} must be one of {tuple(names)} or its code "
                          f"(0..{len(names) - 1}), got {value!r}")


def choice_codes(values: Any, names: Sequence[str], n: int, what: str) -> IntArray:
    """A scalar or an n-array of ``names`` (or their codes), as an int64 n-array of codes."""
    if isinstance(values, str) or ndim_of(values, what) == 0:
        return np.full(n, choice_code(values, names, what), np.int64)
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError, TypeError):
        raise EngineValueError(f"{what} must be a flat array") from None
    if arr.ndim != 1 or len(arr) != n:
        raise EngineValueError(f"{what} must have {n} elements")
    if arr.dtype.kind in "UO":
        codes = np.full(n, -1, np.int64)
        for code, name in enumerate(names):
            codes[arr == name] = code
        if (codes < 0).any():
            i = int(np.argmax(codes < 0))
            raise EngineValueError(f"{what}[{i}] = {arr[i]!r} is not one of {tuple(names)}")
        return codes
    if arr.dtype.kind in "iu":
        codes = arr.astype(np.int64)
        if ((codes < 0) | (codes >= len(names))).any():
            raise EngineValueError(f"{what} codes must be in [0, {len(names) - 1}]")
        return codes
    raise EngineTypeError(f"{what} must be strings or codes, got dtype {arr.dtype}")
