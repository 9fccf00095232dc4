"""Durations, due times and rates in words: "45 s", "in 3.2 h (14:05)", "1.2k", "drains in 12 min".

A leaf: it imports nothing of the package, so the pool's own log lines (``engine.pool.worker``,
``engine.pool.refresh``, ``engine.pool.failures``) use the same wording as the reports without
the pool importing the report.
"""

from __future__ import annotations

import math
from datetime import datetime

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0


def format_duration(seconds: float) -> str:
    """A duration as a person says it: "45 s", "12 min", "3.2 h", "2.1 d" (negative: "-45 s")."""
    if not math.isfinite(seconds):
        return "forever" if seconds > 0 else "-forever"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if 0 < seconds < 0.5:
        return "< 1 s"
    if round(seconds) < _MINUTE:
        return f"{seconds:.0f} s"
    if round(seconds / _MINUTE) < _MINUTE:
        return f"{seconds / _MINUTE:.0f} min"
    if round(seconds / _HOUR, 1) < 24:
        return f"{seconds / _HOUR:.1f} h"
    return f"{seconds / _DAY:.1f} d"


def format_due(due_ms: int | None, now_ms: int) -> str:
    """When a row (or a lane's next row) is due, relative to ``now_ms``, never as raw epoch ms.

    "now" within a second, "3 min ago" for the past, "in 3.2 h (14:05)" for the future: the
    local wall-clock time when less than a day ahead, else the local date ("in 2.1 d (Dec 01)",
    the year added when it is not this one). "-" for None.
    """
    if due_ms is None:
        return "-"
    ahead_s = (due_ms - now_ms) / 1000.0
    if abs(ahead_s) < 1.0:
        return "now"
    if ahead_s < 0:
        return f"{format_duration(-ahead_s)} ago"
    local = datetime.fromtimestamp(due_ms / 1000.0).astimezone()
    if ahead_s < _DAY:
        when = local.strftime("%H:%M")
    elif local.year == datetime.fromtimestamp(now_ms / 1000.0).astimezone().year:
        when = local.strftime("%b %d")
    else:
        when = local.strftime("%b %d %Y")
    return f"in {format_duration(ahead_s)} ({when})"


def rate(count: float, previous: float, seconds: float) -> float | None:
    """Events per second between two looks at a cumulative counter; None over no time."""
    if not seconds > 0:
        return None
    return max(0.0, count - previous) / seconds


def format_rate(per_s: float | None) -> str:
    """"-" (unknown), "0", "0.4", "12", "1.2k" per second."""
    if per_s is None:
        return "-"
    if per_s == 0:
        return "0"
    if per_s < 10:
        return f"{per_s:.1f}"
    if per_s < 10_000:
        return f"{per_s:.0f}"
    return f"{per_s / 1000:.1f}k"


def eta_seconds(backlog: int, per_s: float | None) -> float | None:
    """Seconds to drain ``backlog`` at ``per_s``: 0 when nothing waits, inf at a rate of 0,
    None when the rate is unknown."""
    if backlog <= 0:
        return 0.0
    if per_s is None:
        return None
    return math.inf if per_s <= 0 else backlog / per_s


def format_eta(backlog: int, per_s: float | None) -> str:
    """"-" when nothing waits or the rate is unknown, "not at this rate" at a rate of 0 (whether
    the lane waits its turn or is stalled is ``states.lane_state``'s to say), else a duration."""
    eta = eta_seconds(backlog, per_s)
    if eta is None or eta == 0:
        return "-"
    if math.isinf(eta):
        return "not at this rate"
    return format_duration(eta)


def format_elapsed(real_s: float, pool_s: float, scale: float) -> str:
    """How long a pool has run: "up 12 min", or on a scaled clock "up 12 min (pool time 3.2 h,
    x1000)"."""
    out = f"up {format_duration(real_s)}"
    if scale != 1.0:
        out += f" (pool time {format_duration(pool_s)}, x{scale:g})"
    return out


# -- ranges of intervals -----------------------------------------------------------------------

_RANGE_UNITS = ((_MINUTE, 1.0, "s"), (_HOUR, _MINUTE, "min"), (_DAY, _HOUR, "h"),
                (math.inf, _DAY, "d"))
"""A range is said in the unit its upper end fills: up to 60 s in s, up to 60 min in min, up to
24 h in h, then days ("30–42 min", "1–1.4 h", "1.1–1.6 d")."""


def format_range(lo_s: float | None, hi_s: float | None) -> str:
    """An interval range in one unit: "30–42 min"; "≤ 30 min" with no lower end, "> 483 d"
    with no upper end (a lone end in the unit it reaches: "≤ 1 h"); "any" with neither. Both
    ends are shown with as few digits as keep them apart (bands 3600 and 3700 s read "1–1.03 h",
    never "1–1 h")."""
    if lo_s is None and hi_s is None:
        return "any"
    top = hi_s if hi_s is not None else lo_s
    assert top is not None
    if lo_s is None or hi_s is None:  # one end: "≤ 1 h", "> 1 h", not "≤ 60 min"
        _, size, unit = next(u for u in _RANGE_UNITS if top < u[0])
        return f"{'≤' if lo_s is None else '>'} {_amount(top / size)} {unit}"
    _, size, unit = next(u for u in _RANGE_UNITS if top <= u[0])
    for digits in range(4):
        lo, hi = _amount(lo_s / size, digits), _amount(hi_s / size, digits)
        if lo != hi:
            break
    return f"{lo}–{hi} {unit}"


def _amount(x: float, extra: int = 0) -> str:
    """About two significant digits ("42", "1.4", "0.5"), ``extra`` more when asked; no
    trailing zeros."""
    decimals = (0 if x >= 10 else 1) + extra
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
