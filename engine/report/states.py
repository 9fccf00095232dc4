"""Lane states a person can trust: a lane that waits its turn is not a lane that is stuck.

A lane with due rows and no renders over the last few seconds is usually *waiting*: the claim
pass gives the capacity to the urgent cap, the floors and then, by the remainder, to lanes whose
heads are later than this one's. Calling that "stalled" reads as a fault. So:

* ``draining``: its due rows are being rendered (the table shows when they will be done);
* ``waiting``: it has due rows and got nothing lately while the pool was busy elsewhere; shown
  with when its head is expected to be served: the due rows the policy's remainder ranks ahead
  of the lane's head (by relative lateness, due time or lane order) at the pool's render rate.
  An estimate: the urgent cap and the floors move rows ahead of their turn;
* ``stalled``: its due rows got no render for a whole ``STALL_WINDOW_S`` while every look in
  that window saw a worker of the pool with nothing to render. Capacity was there and the lane
  still got none: a fault worth a look (a stuck lease, a host cap, a policy that gives it 0).

Only a watcher that looks repeatedly (the live view, the dashboard) can tell stalled from
waiting; ``lanes stats``, one look, says waiting at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

STALL_WINDOW_S = 60.0
"""How long due rows must get nothing, with a worker idle at every look, to call a lane stalled."""


class Look(Protocol):
    """One look at a pool, per lane indexed by lane number (the dashboard's samples are ones)."""

    @property
    def t(self) -> float: ...  # time.monotonic() seconds
    @property
    def renders(self) -> Any: ...  # cumulative renders of either outcome
    @property
    def backlog(self) -> Any: ...  # rows due and not in flight
    @property
    def idle(self) -> bool: ...  # a worker of the pool had nothing to render


def stalled(looks: Sequence[Look], window_s: float = STALL_WINDOW_S) -> set[int]:
    """The lanes whose due rows got no render through the last ``window_s`` (looks oldest
    first) while every look in it saw an idle worker; none until the looks span a window."""
    if len(looks) < 2 or looks[-1].t - looks[0].t < window_s:
        return set()
    last = looks[-1]
    start = max(i for i, look in enumerate(looks) if last.t - look.t >= window_s)
    span = looks[start:]
    if not all(look.idle for look in span):
        return set()
    due_throughout = np.logical_and.reduce([np.asarray(look.backlog) > 0 for look in span])
    served = np.asarray(last.renders) - np.asarray(looks[start].renders) > 0
    return {int(i) for i in np.flatnonzero(due_throughout & ~served)}


def lane_state(backlog: int, per_s: float | None, is_stalled: bool) -> str:
    """``idle`` (nothing due), ``draining``, ``waiting`` or ``stalled`` (see the module note)."""
    if backlog <= 0:
        return "idle"
    if per_s:
        return "draining"
    return "stalled" if is_stalled else "waiting"


def ahead_of_heads(cols: dict[str, np.ndarray], now_ms: int, remainder: str,
                   weights: Sequence[float] = ()) -> dict[int, int]:
    """{lane: due rows of other lanes the remainder ranks ahead of this lane's head}, for each
    lane with due rows, from the rows' columns (``checkpoint.snapshot``). A lane is served in
    due order, so its head is its earliest due row; the pass ranks heads as
    ``policy.remainder_lateness`` does: lateness over the interval times the lane's weight
    (``weights``, by lane; 1 past its end), lateness alone under ``edf``, and under
    ``lane-order`` every due row of a lower lane is ahead."""
    due = cols["due_ms"] <= now_ms
    lanes, due_ms = cols["lane"][due], cols["due_ms"][due]
    if not len(lanes):
        return {}
    late = (now_ms - due_ms).astype(np.float64)
    if remainder == "lateness":
        w = np.ones(int(lanes.max()) + 1)
        w[:min(len(w), len(weights))] = weights[:len(w)]
        key = late / np.maximum(cols["interval_s"][due], 1) * w[lanes]
    elif remainder == "edf":
        key = late
    else:
        key = -lanes.astype(np.float64)
    # Linear passes only (a million rows, sixty lanes, on the live view's tick): each lane's
    # earliest due time, its head's key (the largest among rows due then: a tie is served in
    # either order), and the rows above each head counted by binning every key once against
    # the sorted heads.
    size = int(lanes.max()) + 1
    earliest = np.full(size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(earliest, lanes, due_ms)
    at_head = due_ms == earliest[lanes]
    head = np.full(size, -np.inf)
    np.maximum.at(head, lanes[at_head], key[at_head])
    present = np.flatnonzero(earliest != np.iinfo(np.int64).max)
    bounds = np.unique(head[present])
    per_bin = np.bincount(np.searchsorted(bounds, key, side="left"), minlength=len(bounds) + 1)
    above_bound = per_bin[::-1].cumsum()[::-1][1:]  # rows with a key above bounds[i]
    above = above_bound[np.searchsorted(bounds, head[present])]
    own = np.bincount(lanes, weights=key > head[lanes], minlength=size)[present]
    # Its own rows wait behind its head, whatever their key.
    return dict(zip(present.tolist(), (above - own.astype(np.int64)).tolist(), strict=True))
