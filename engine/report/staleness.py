"""Served staleness: how old, against its interval, what the store holds and what it served.

This is the figure the lanes exist to improve: a snapshot's age ÷ its refresh interval (1.0:
exactly one interval old). Two readings of it, per lane, per route and, where a route renders
a page as more than one device (``engine.corpus.variant_rows``), per variant:

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

from ..corpus import variant_rows
from ..corpus.routes import Routes
from ..corpus.rules import VARIANT_NAMES
from ..store.api import HIT_WINDOW_MS, Store

QUANTILES: Final = (0.5, 0.95)
NO_ROUTE: Final = "(no route)"
NO_VARIANT: Final = "(none)"
"""The variant group of a snapshot rendered as Chromium is (its route names no variant)."""


def figures(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """``count``, ``p50``, ``p95`` and ``max`` of ``values`` (None for an empty set)."""
    a = np.asarray(values, dtype=np.float64)
    if not len(a):
        return {"count": 0, "p50": None, "p95": None, "max": None}
    p50, p95 = np.quantile(a, QUANTILES)
    return {"count": int(len(a)), "p50": round(float(p50), 4), "p95": round(float(p95), 4),
            "max": round(float(a.max()), 4)}


class _ByKey:
    """A group of every snapshot, by snapshot id, worked out once per key from the key: a key
    keeps its id, so a kept one looks only at the snapshots added since its last call."""

    names: list[str]
    """The groups; a code of -1 is the last of them."""

    def __init__(self) -> None:
        self._codes = np.full(0, -1, np.int64)  # by id
        self._last_id = 0

    def of(self, keys: list[str]) -> Sequence[int] | np.ndarray:
        """The group of each snapshot key (an index into ``names``, -1: the last)."""
        raise NotImplementedError

    def codes(self, store: Store, ids: np.ndarray) -> np.ndarray:
        """The group (an index into ``names``) of each snapshot id in ``ids``."""
        new = store.urls_after(self._last_id)
        if new:
            top = new[-1][0]
            if top >= len(self._codes):
                grown = np.full(top + 1, -1, np.int64)
                grown[:len(self._codes)] = self._codes
                self._codes = grown
            self._codes[[i for i, _u in new]] = self.of([u for _i, u in new])
            self._last_id = top
        out = self._codes[ids] if len(ids) else np.empty(0, np.int64)
        return np.where(out >= 0, out, len(self.names) - 1)


class RouteOf(_ByKey):
    """The route of every snapshot, matched once per URL."""

    def __init__(self, routes: Routes) -> None:
        super().__init__()
        self.routes = routes
        self.names = [*routes.names(), NO_ROUTE]

    def of(self, keys: list[str]) -> np.ndarray:
        return self.routes.match(keys)


class VariantOf(_ByKey):
    """The variant of every snapshot (``engine.corpus.variant_rows``): a further variant's
    from its key, a plain URL's from its route (without routes: no variant)."""

    def __init__(self, routes: Routes | None) -> None:
        super().__init__()
        self.routes = routes
        self.names = [*VARIANT_NAMES, NO_VARIANT]

    def of(self, keys: list[str]) -> list[int]:
        routes = () if self.routes is None else self.routes.routes
        ids = [-1] * len(keys)
        if self.routes is not None and any(r.rules.variants for r in routes):
            ids = self.routes.match(keys).tolist()
        out = []
        for key, r in zip(keys, ids, strict=True):
            v = variant_rows.variant_of(key, routes[r].rules.variants if r >= 0 else ())
            out.append(-1 if v is None else VARIANT_NAMES.index(v))
        return out


def staleness(store: Store, now_ms: int, routes: Routes | RouteOf | None = None,
              lane_name: Callable[[int], str] | None = None,
              window_ms: int = HIT_WINDOW_MS,
              lane_label: Callable[[int], str] | None = None,
              variants: VariantOf | None = None) -> dict[str, Any]:
    """Both readings, overall, per lane (by name when ``lane_name`` is given, each with its
    ``label`` when ``lane_label`` is) and, with ``routes`` (or a kept :class:`RouteOf`, which
    matches each URL once), per route; with routes or ``variants`` (a kept :class:`VariantOf`,
    which looks at each key once), per variant where a snapshot has one."""
    ids, lanes, ratio = store.ratios(now_ms)
    hit_ids, hit_lanes, hit_ratio, served = store.hit_ratios(now_ms - window_ms)
    present = np.unique(np.concatenate([lanes, hit_lanes]))  # lane numbers, sorted
    name = lane_name or str
    out: dict[str, Any] = {
        "now_ms": now_ms, "window_s": window_ms // 1000, "directory": store.address,
        "all": {"snapshot": figures(ratio), "served": figures(hit_ratio[served]),
                "refused": int((~served).sum())},
        "lanes": _grouped([name(int(ln)) for ln in present], np.searchsorted(present, lanes),
                          np.searchsorted(present, hit_lanes), ratio, hit_ratio, served)}
    if lane_label is not None:
        by_name = {name(int(ln)): lane_label(int(ln)) for ln in present}
        for g in out["lanes"]:
            g["label"] = by_name[g["key"]]
    if routes is not None:
        route_of = routes if isinstance(routes, RouteOf) else RouteOf(routes)
        out["routes"] = _grouped(route_of.names, route_of.codes(store, ids),
                                 route_of.codes(store, hit_ids), ratio, hit_ratio, served)
        if variants is None:
            variants = VariantOf(route_of.routes)
    if variants is not None:
        codes, hit_codes = variants.codes(store, ids), variants.codes(store, hit_ids)
        if (codes < len(VARIANT_NAMES)).any() or (hit_codes < len(VARIANT_NAMES)).any():
            out["variants"] = _grouped(variants.names, codes, hit_codes, ratio, hit_ratio,
                                       served)
    return out


def _grouped(names: list[str], snap_codes: np.ndarray, hit_codes: np.ndarray,
             snap_ratio: np.ndarray, hit_ratio: np.ndarray, served: np.ndarray
             ) -> list[dict[str, Any]]:
    """Figures per group (``names[code]``, in that order), for the groups with a snapshot or a
    hit."""
    out = []
    for i, key in enumerate(names):
        mine, hits = snap_codes == i, hit_codes == i
        if not (mine.any() or hits.any()):
            continue
        out.append({"key": key, "snapshot": figures(snap_ratio[mine]),
                    "served": figures(hit_ratio[hits & served]),
                    "refused": int((hits & ~served).sum())})
    return out


def cells(f: dict[str, Any]) -> str:
    """``p50 / p95 / max`` of one reading, as the tables show it."""
    if not f["count"]:
        return "-"
    return f"{f['p50']:.2f} / {f['p95']:.2f} / {f['max']:.2f}"


def table_rows(groups: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Rows of the per-lane or per-route staleness table (:data:`COLUMNS`)."""
    return [(g.get("label", g["key"]), str(g["snapshot"]["count"]), cells(g["snapshot"]),
             str(g["served"]["count"]), cells(g["served"]), str(g["refused"])) for g in groups]


COLUMNS: Final = ("", "snapshots", "age/interval p50/95/max", "hits", "served p50/95/max",
                  "refused stale")
