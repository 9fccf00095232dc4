"""Progress a person can read: the arithmetic behind ``lanes stats`` and the live view.

Counters in shared memory are cumulative and times are epoch milliseconds; an operator wants
"p95 0.80 s", "drains in 12 min", "next due in 3.2 h (14:05)". Everything here is a plain
function of numbers (only ``next_due`` reads an engine), so the view, the CLI and the integrator's
other commands (``format_due`` for ``lanes prioritize``) share one wording, and the tests pin it
without a pool.

Quantiles follow Prometheus's ``histogram_quantile``: find the bucket holding the q-th render
and interpolate linearly inside it. The per-lane histograms are fine (``LATENCY_BOUNDS``: no
bucket past 1 ms is more than 15 % wide), so that is a measurement, not a guess. Where the data
gives only a bound it says the bound: a quantile in the first bucket is its upper bound, shown
"< 1 ms" (never 0.50/0.95/0.99 ms interpolated from 0), and one in the overflow bucket is
``math.inf``, shown "> 60 s".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import checkpoint
from ..keys import PARKED_MS
from ..policy import ONE
from ..pool.board import LATENCY_BOUNDS
from .states import ahead_of_heads

if TYPE_CHECKING:
    from ..api import QueueEngine
    from ..corpus.routes import Routes

QUANTILES = (0.5, 0.95, 0.99)


# -- latency quantiles -------------------------------------------------------------------------


def quantile(counts: Sequence[int] | np.ndarray, q: float,
             bounds: Sequence[float] = LATENCY_BOUNDS) -> float | None:
    """The ``q`` quantile (0..1) of a histogram, in the bounds' unit.

    ``counts[i]`` is the number of observations in bucket ``i`` (as the board keeps them, not
    cumulative): at most ``bounds[i]`` and above ``bounds[i - 1]``; ``counts[len(bounds)]`` holds
    the rest. None when the histogram is empty; ``math.inf`` when the quantile lies in the
    overflow bucket; ``bounds[0]`` when it lies in the first (at most that: nothing below it
    is measured).
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
    if i == 0:
        return float(bounds[0])
    lo = float(bounds[i - 1])
    below = 0 if i == 0 else int(cumulative[i - 1])
    inside = int(cumulative[i]) - below
    return lo + (float(bounds[i]) - lo) * (rank - below) / inside


def quantiles(counts: Sequence[int] | np.ndarray, qs: Sequence[float] = QUANTILES,
              bounds: Sequence[float] = LATENCY_BOUNDS) -> tuple[float | None, ...]:
    """``quantile`` at each of ``qs`` (p50, p95, p99 by default)."""
    return tuple(quantile(counts, q, bounds) for q in qs)


def format_latency(qs: Sequence[float | None], bounds: Sequence[float] = LATENCY_BOUNDS
                   ) -> str:
    """Quantiles in seconds as one cell: "0.21/0.80/1.9 s", "4.2/12/38 ms", "0.9/2.1/> 60 s",
    "< 1/< 1/3.1 ms" (at most the first bound: nothing finer is measured).

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
        elif v <= bounds[0]:
            cells.append(f"< {bounds[0] * factor:g}")
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


# -- next due per lane -------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueLook:
    """What one pass over the row table tells the tables: per lane, when its next row falls due
    (``next_due``) and how many due rows of other lanes are ranked ahead of its head
    (``ahead``, see ``states.ahead_of_heads``)."""

    next_due: dict[int, int | None]
    ahead: dict[int, int]


def look_ahead(eng: QueueEngine, now_ms: int) -> QueueLook:
    """``next_due`` and the rows ahead of each lane's head, from one pass over the rows."""
    _, cols = checkpoint.snapshot(eng)
    policy, lanes = eng.policy, eng.stats(now_ms=now_ms)["lanes"]
    total = max([policy.lane_count, *(ln["lane"] + 1 for ln in lanes)])
    bounds = [(0, 0)] * total
    for ln in lanes:  # the lanes' interval bounds, which derived weights are made from
        bounds[ln["lane"]] = (ln["iv_min"], ln["iv_max"])
    weights = [w / ONE for w in policy.lane_weights_fp(total, bounds)]
    return QueueLook(_next_due(eng, now_ms, cols),
                     ahead_of_heads(cols, now_ms, policy.remainder, weights))


def next_due(eng: QueueEngine, now_ms: int) -> dict[int, int | None]:
    """{lane: earliest due time (ms) of its queued rows not due yet at ``now_ms``, or None}.

    One pass over the row table (``checkpoint.snapshot``, which reads each row's lane from its
    key, so rows an older policy placed are counted where they sit)."""
    return _next_due(eng, now_ms, checkpoint.snapshot(eng)[1])


def _next_due(eng: QueueEngine, now_ms: int, cols: dict[str, np.ndarray]
              ) -> dict[int, int | None]:
    out: dict[int, int | None] = {ln["lane"]: None for ln in eng.stats(now_ms=now_ms)["lanes"]}
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
