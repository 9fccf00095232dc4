"""Served staleness: how old, against its interval, what the store holds and what it served.

This is the figure the lanes exist to improve: a snapshot's age ÷ its refresh interval (1.0:
exactly one interval old). Two readings of it, per lane and per route:

* **snapshot**: every snapshot in the store, now (p50 / p95 / max);
* **served**: the hits ``lanes serve`` answered over the hit log's window (the last hour), each
  at the age it had when served; hits refused as staler than ``--max-stale`` are counted apart.

Both come from the store alone (its metadata and hit log), so ``lanes stats``, the live view
and ``/metrics`` read the same numbers whether or not a pool or a server runs. A snapshot's lane
is the lane it was rendered from; its route is matched now, by URL, against the pool's routes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from ..store import HIT_WINDOW_MS, SnapshotStore
from .routes import Routes

QUANTILES: Final = (0.5, 0.95)
NO_ROUTE: Final = "(no route)"


def figures(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """``count``, ``p50``, ``p95`` and ``max`` of ``values`` (None for an empty set)."""
    a = np.asarray(values, dtype=np.float64)
    if not len(a):
        return {"count": 0, "p50": None, "p95": None, "max": None}
    p50, p95 = np.quantile(a, QUANTILES)
    return {"count": int(len(a)), "p50": round(float(p50), 4), "p95": round(float(p95), 4),
            "max": round(float(a.max()), 4)}


def staleness(store: SnapshotStore, now_ms: int, routes: Routes | None = None,
              lane_name: Callable[[int], str] | None = None,
              window_ms: int = HIT_WINDOW_MS) -> dict[str, Any]:
    """Both readings, overall, per lane (by name when ``lane_name`` is given) and, with
    ``routes``, per route."""
    ages = store.ages()
    hits = store.hits(now_ms - window_ms)
    name = lane_name or str
    snap_ratio = np.array([max(0, now_ms - at) / 1000 / iv for _u, _ln, at, iv in ages])
    snap_lane = [name(ln) for _u, ln, _a, _i in ages]
    served = [(u, ln, r) for u, ln, r, ok in hits if ok]
    hit_ratio = np.array([r for _u, _ln, r in served])
    hit_lane = [name(ln) for _u, ln, _r in served]
    refused = [name(ln) for _u, ln, _r, ok in hits if not ok]
    out: dict[str, Any] = {
        "now_ms": now_ms, "window_s": window_ms // 1000, "directory": store.directory,
        "all": {"snapshot": figures(snap_ratio), "served": figures(hit_ratio),
                "refused": len(refused)},
        "lanes": _grouped(snap_lane, snap_ratio, hit_lane, hit_ratio, refused)}
    if routes is not None:
        cache: dict[str, str] = {}
        route_of = _route_namer(routes, cache, [u for u, *_ in ages] + [u for u, *_ in hits])
        out["routes"] = _grouped([route_of(u) for u, *_ in ages], snap_ratio,
                                 [route_of(u) for u, *_ in served], hit_ratio,
                                 [route_of(u) for u, _ln, _r, ok in hits if not ok])
    return out


def _grouped(snap_keys: list[str], snap_ratio: np.ndarray, hit_keys: list[str],
             hit_ratio: np.ndarray, refused: list[str]) -> list[dict[str, Any]]:
    keys = sorted(set(snap_keys) | set(hit_keys) | set(refused))
    sk, hk = np.array(snap_keys, dtype=object), np.array(hit_keys, dtype=object)
    return [{"key": k, "snapshot": figures(snap_ratio[sk == k] if len(sk) else []),
             "served": figures(hit_ratio[hk == k] if len(hk) else []),
             "refused": refused.count(k)} for k in keys]


def _route_namer(routes: Routes, cache: dict[str, str], urls: list[str]
                 ) -> Callable[[str], str]:
    unique = sorted(set(urls))
    names = routes.names()
    for url, i in zip(unique, routes.match(unique), strict=True):
        cache[url] = names[i] if i >= 0 else NO_ROUTE
    return cache.__getitem__


def cells(f: dict[str, Any]) -> str:
    """``p50 / p95 / max`` of one reading, as the tables show it."""
    if not f["count"]:
        return "-"
    return f"{f['p50']:.2f} / {f['p95']:.2f} / {f['max']:.2f}"


def table_rows(groups: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Rows of the per-lane or per-route staleness table (:data:`COLUMNS`)."""
    return [(g["key"], str(g["snapshot"]["count"]), cells(g["snapshot"]),
             str(g["served"]["count"]), cells(g["served"]), str(g["refused"])) for g in groups]


COLUMNS: Final = ("", "snapshots", "age/interval p50/95/max", "hits", "served p50/95/max",
                  "refused stale")
