"""Progress a person can read: the arithmetic behind ``lanes stats`` and the live view.

Counters in shared memory are cumulative and times are epoch milliseconds; an operator wants
"p95 0.80 s", "drains in 12 min", "next due in 3.2 h (14:05)". Everything here is a plain
function of numbers (only ``next_due`` reads an engine), so the view, the CLI and the integrator's
other commands (``format_due`` for ``lanes prioritize``) share one wording, and the tests pin it
without a pool.

Quantiles follow Prometheus's ``histogram_quantile``: find the bucket holding the q-th render
and interpolate linearly inside it (from 0 in the first bucket). A quantile that lands in the
overflow bucket has no upper bound to interpolate to: it is ``math.inf``, shown as "> 60 s".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import checkpoint
from ..keys import PARKED_MS
from .board import DURATION_BUCKETS

if TYPE_CHECKING:
    from ..api import QueueEngine
    from ..corpus.routes import Routes

QUANTILES = (0.5, 0.95, 0.99)
_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0


# -- latency quantiles -------------------------------------------------------------------------


def quantile(counts: Sequence[int] | np.ndarray, q: float,
             bounds: Sequence[float] = DURATION_BUCKETS) -> float | None:
    """The ``q`` quantile (0..1) of a histogram, in the bounds' unit.

    ``counts[i]`` is the number of observations in bucket ``i`` (as the board keeps them, not
    cumulative): at most ``bounds[i]`` and above ``bounds[i - 1]``; ``counts[len(bounds)]`` holds
    the rest. None when the histogram is empty; ``math.inf`` when the quantile lies in the
    overflow bucket.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], got {q!r}")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} counts for {len(bounds)} bounds (+1 overflow)")
    cumulative = np.cumsum(np.asarray(counts, dtype=np.int64))
    total = int(cumulative[-1])
    if total <= 0:
        return None
    rank = q * total
    # The bucket holding the rank-th observation (for rank 0, the first non-empty bucket).
    i = int(np.searchsorted(cumulative, rank, side="left" if rank > 0 else "right"))
    if i >= len(bounds):
        return math.inf
    lo = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0 if i == 0 else int(cumulative[i - 1])
    inside = int(cumulative[i]) - below
    return lo + (float(bounds[i]) - lo) * (rank - below) / inside


def quantiles(counts: Sequence[int] | np.ndarray, qs: Sequence[float] = QUANTILES,
              bounds: Sequence[float] = DURATION_BUCKETS) -> tuple[float | None, ...]:
    """``quantile`` at each of ``qs`` (p50, p95, p99 by default)."""
    return tuple(quantile(counts, q, bounds) for q in qs)


def format_latency(qs: Sequence[float | None], bounds: Sequence[float] = DURATION_BUCKETS
                   ) -> str:
    """Quantiles in seconds as one cell: "0.21/0.80/1.9 s", "4.2/12/38 ms", "0.9/2.1/> 60 s".

    The unit is ms when every finite value is below a second; "-" when there were no renders.
    """
    if not qs or all(v is None for v in qs):
        return "-"
    finite = [v for v in qs if v is not None and math.isfinite(v)]
    ms = bool(finite) and max(finite) < 1.0 and len(finite) == len(qs)
    unit, factor = ("ms", 1000.0) if ms else ("s", 1.0)
    cells = []
    for v in qs:
        if v is None:
            cells.append("-")
        elif math.isinf(v):
            cells.append(f"> {bounds[-1]:g}")
        else:
            cells.append(_two_digits(v * factor))
    return "/".join(cells) + f" {unit}"


def _two_digits(x: float) -> str:
    """About two significant digits: 0.21, 0.80, 1.9, 12, 340."""
    if x < 1.0:
        return f"{x:.2f}"
    if x < 10.0:
        return f"{x:.1f}"
    return f"{x:.0f}"


# -- durations, due times, rates ---------------------------------------------------------------


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
    """"-" when nothing waits or the rate is unknown, "stalled" at a rate of 0, else a duration."""
    eta = eta_seconds(backlog, per_s)
    if eta is None or eta == 0:
        return "-"
    if math.isinf(eta):
        return "stalled"
    return format_duration(eta)


def format_elapsed(real_s: float, pool_s: float, scale: float) -> str:
    """How long a pool has run: "up 12 min", or on a scaled clock "up 12 min (pool time 3.2 h,
    x1000)"."""
    out = f"up {format_duration(real_s)}"
    if scale != 1.0:
        out += f" (pool time {format_duration(pool_s)}, x{scale:g})"
    return out


# -- next due per lane -------------------------------------------------------------------------


def next_due(eng: QueueEngine, now_ms: int) -> dict[int, int | None]:
    """{lane: earliest due time (ms) of its queued rows not due yet at ``now_ms``, or None}.

    One pass over the row table (``checkpoint.snapshot``, which reads each row's lane from its
    key, so rows an older policy placed are counted where they sit)."""
    out: dict[int, int | None] = {ln["lane"]: None for ln in eng.stats(now_ms=now_ms)["lanes"]}
    _, cols = checkpoint.snapshot(eng)
    future = (cols["due_ms"] > now_ms) & (cols["due_ms"] < PARKED_MS)  # parked: never due
    due, lanes = cols["due_ms"][future], cols["lane"][future]
    if not len(due):
        return out
    earliest = np.full(int(lanes.max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(earliest, lanes, due)
    for lane in np.unique(lanes).tolist():
        out[lane] = int(earliest[lane])
    return out


def route_figures(eng: QueueEngine, urls: Sequence[str], routes: Routes, now_ms: int
                  ) -> list[dict[str, Any]]:
    """Per route (first match wins; ``(no route)`` for the rest): its pattern and interval, and
    of its queued rows how many there are, how many are due (backlog), failing and parked."""
    rows, cols = checkpoint.snapshot(eng)
    ids = routes.match([urls[r] for r in rows.tolist()]) if len(rows) else np.empty(0, np.int16)
    return route_counts(routes, ids, cols, now_ms)


def route_counts(routes: Routes, ids: np.ndarray, cols: dict[str, np.ndarray], now_ms: int
                 ) -> list[dict[str, Any]]:
    """``route_figures`` from the route index of each queued row (``ids``, -1: none) and the
    rows' columns as ``checkpoint.snapshot`` gives them."""
    due, failing = cols["due_ms"], cols["failures"] > 0
    out = []
    for i, route in [*enumerate(routes.routes), (-1, None)]:
        mine = ids == i
        if route is None and not mine.any():
            continue
        parked = mine & (due == PARKED_MS)
        out.append({
            "route": "(no route)" if route is None else route.name,
            "pattern": "" if route is None else route.pattern,
            "interval_s": None if route is None else route.interval_s,
            "rows": int(mine.sum()),
            "due": int((mine & (due <= now_ms)).sum()),
            "failing": int((mine & failing & ~parked).sum()),
            "parked": int(parked.sum()),
        })
    return out
