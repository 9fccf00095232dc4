"""The checks of what a store is given: one place, so every store refuses the same input."""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from ..checks import is_number
from ..errors import EngineTypeError, EngineValueError

MAX_URL: Final = 65_536


def html_bytes(html: object) -> bytes:
    if isinstance(html, str):
        return html.encode("utf-8", "surrogateescape")
    if isinstance(html, (bytes, bytearray, memoryview)):
        return bytes(html)
    raise EngineTypeError(f"a snapshot's HTML is bytes or str, got {type(html).__name__}")


def checked_meta(url: object, status: object, location: object, interval_s: object,
                  lane: object, render_ms: object, at_ms: object) -> tuple[Any, ...]:
    if not isinstance(url, str) or not url or len(url) > MAX_URL or "\x00" in url:
        raise EngineValueError(f"a snapshot's URL is a non-empty str without NUL, got {url!r}")
    code = _integer(status, "status", 100, 599)
    if location is not None and (not isinstance(location, str) or "\n" in location
                                 or "\r" in location):
        raise EngineValueError(f"location must be None or a one-line str, got {location!r}")
    if (not is_number(render_ms) and not isinstance(render_ms, np.floating)) or not (
            math.isfinite(render_ms) and render_ms >= 0):
        raise EngineValueError(f"render_ms must be a finite number >= 0, got {render_ms!r}")
    return (code, location, _integer(at_ms, "rendered_at_ms", 0, 2**62),
            _integer(interval_s, "interval_s", 1, 2**62), _integer(lane, "lane", 0, 2**31),
            float(render_ms))


def _integer(value: object, what: str, lo: int, hi: int) -> int:
    """An integer (numpy's too) in [lo, hi]; bools and floats are refused, not coerced."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EngineValueError(f"{what} must be an int in [{lo}, {hi}], got {value!r}")
    if not lo <= int(value) <= hi:
        raise EngineValueError(f"{what} must be an int in [{lo}, {hi}], got {value!r}")
    return int(value)
