"""Prometheus metrics of an engine and, when a pool runs over it, of the pool; with a snapshot
store, its served staleness (``engine.report.staleness``).

Nothing is counted twice: on every scrape a collector reads the engine's own per-lane counters
(``Engine.stats``) and the pool board's per-worker counters (``engine.pool.board``) and turns them
into metric families, so a scrape from ``lanes serve`` in another process sees exactly
what the pool's processes counted. The lane is a label (its stable id, e.g. ``submitted/b0``);
``lanes_lane_info`` gives each id its range in words (``ttl="≤ 30 min"``) and the tables' name.
prometheus_client (the ``metrics`` extra) does the exposition format and the HTTP server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ..checks import is_int, wall_ms
from ..corpus.routes import Routes
from ..errors import EngineError, EngineValueError, SegmentMissing
from ..pool.board import DURATION_BUCKETS, FAILED, OK, Board, coarse
from ..store.api import Store
from .lanes import lane_label, ttl_range
from .staleness import RouteOf, VariantOf, staleness

_LANE_GAUGES = (("queued", "rows queued in the lane"),
                ("due", "backlog: rows due now in the lane"),
                ("leased", "rows of the lane under a live lease"))
_LANE_COUNTERS = (("granted", "lane_granted", "rows granted by claim passes"),
                  ("spilled", "lane_spilled",
                   "due entries a claim pass left past its window, for later passes"),
                  ("stale_skipped", "lane_stale_skipped", "stale index entries skipped"),
                  ("lease_refused", "lane_lease_refused", "leases lost to a concurrent claimer"))


def _client() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError:
        raise EngineValueError("metrics need prometheus_client: pip install"
                               " 'render-lanes[metrics]'") from None
    return prometheus_client


class LanesCollector:
    """A prometheus_client collector over one engine (and its pool board, if any: the board
    named ``local``, by default the engine's name; on Redis, this host's pool's)."""

    def __init__(self, eng: Any, local: str | None = None) -> None:
        self.engine = eng
        self.local = local or eng.name

    def _board(self) -> Board | None:
        try:
            return Board.attach(self.local)
        except SegmentMissing:
            return None

    def collect(self) -> Iterator[Any]:
        core = _client().core
        board = self._board()
        try:
            now = board.clock.now_ms() if board is not None else None
            stats = self.engine.stats(now_ms=now)
            for key, help_ in _LANE_GAUGES:
                g = core.GaugeMetricFamily(f"lanes_lane_{key}", help_, labels=["lane"])
                for lane in stats["lanes"]:
                    g.add_metric([lane["name"]], lane[key])
                yield g
            for key, metric, help_ in _LANE_COUNTERS:
                c = core.CounterMetricFamily(f"lanes_{metric}", help_, labels=["lane"])
                for lane in stats["lanes"]:
                    c.add_metric([lane["name"]], lane[key])
                yield c
            g = core.GaugeMetricFamily("lanes_lane_floor_minute",
                                       "the lane's claim floor, minutes since the epoch (0: none)",
                                       labels=["lane"])
            for lane in stats["lanes"]:
                g.add_metric([lane["name"]], lane["floor_minute"])
            yield g
            yield self._lane_info(core, stats)
            yield core.GaugeMetricFamily("lanes_rows", "rows ever added", value=stats["rows"])
            if board is not None:
                yield from self._pool(core, board, stats)
        finally:
            if board is not None:
                board.close()

    def _lane_info(self, core: Any, stats: dict[str, Any]) -> Any:
        """``lanes_lane_info{lane, ttl, label} 1``: the readable range beside the stable id.
        The series keep ``lane`` alone, so a policy edit that moves the bands renames no
        series; a dashboard joins the words in (``* on(lane) group_left(label)
        lanes_lane_info``)."""
        policy = self.engine.policy
        g = core.GaugeMetricFamily("lanes_lane_info", "the lane's refresh-interval range in"
                                   " words (ttl) and the name the tables show (label)",
                                   labels=["lane", "ttl", "label"])
        for lane in stats["lanes"]:
            i = lane["lane"]
            g.add_metric([lane["name"], ttl_range(policy, i) or "", lane_label(policy, i)], 1)
        return g

    def _pool(self, core: Any, board: Board, stats: dict[str, Any]) -> Iterator[Any]:
        t = board.totals()
        for key, help_ in (("renders", "renders that succeeded"),
                           ("failures", "renders that failed"),
                           ("released", "claimed rows given back unrendered at a stop"),
                           ("lease_lost", "renders whose lease was lost before completion"),
                           ("restarts", "workers restarted by the supervisor"),
                           ("checkpoints", "checkpoints written")):
            yield core.CounterMetricFamily(f"lanes_pool_{key}", help_, value=t[key])
        yield core.HistogramMetricFamily("lanes_pool_render_duration_seconds",
                                         "wall time of one render",
                                         buckets=_cumulative(t["duration_buckets"]),
                                         sum_value=t["duration_s"])
        h = core.HistogramMetricFamily("lanes_pool_lane_render_duration_seconds",
                                       "wall time of one render, per lane and outcome",
                                       labels=["lane", "outcome"])
        for lane in stats["lanes"]:
            i = lane["lane"]
            for outcome, o in (("success", OK), ("failure", FAILED)):
                h.add_metric([lane["name"], outcome],
                             _cumulative(coarse(t["lane_hist"][i][o])),
                             float(t["lane_duration_s"][i][o]))
        yield h
        c = core.CounterMetricFamily("lanes_pool_lane_renders", "renders per lane",
                                     labels=["lane"])
        a = core.CounterMetricFamily("lanes_pool_lane_age_over_ttl",
                                     "sum over renders of the page's age / TTL when rendered",
                                     labels=["lane"])
        for lane in stats["lanes"]:
            i = lane["lane"]
            c.add_metric([lane["name"]], int(t["lane_renders"][i]))
            a.add_metric([lane["name"]], float(t["lane_age_sum"][i]))
        yield c
        yield a


def _cumulative(counts: Any) -> list[tuple[str, int]]:
    """Per-bucket counts (the board's) as Prometheus's cumulative ``le`` buckets."""
    buckets, acc = [], 0
    for bound, n in zip((*DURATION_BUCKETS, float("inf")), counts, strict=True):
        acc += int(n)
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
    return buckets


STALENESS_EVERY_S = 10.0
"""A scrape reads every snapshot's metadata at most this often (a million take seconds)."""

_STALENESS = (("snapshot", "lanes_snapshot_age_over_interval",
               "age / interval of every snapshot in the store (quantile 1: the max)"),
              ("served", "lanes_served_age_over_interval",
               "age / interval of the snapshots served over the last hour, when served"))


class StalenessCollector:
    """The store's staleness figures, per lane, per route (with ``routes``) and per variant
    (where a snapshot has one)."""

    def __init__(self, store: Store, routes: Routes | None = None,
                 lane_name: Any = None) -> None:
        self.store = store
        self.routes = None if routes is None else RouteOf(routes)  # URLs matched once
        self.variants = VariantOf(routes)  # keys looked at once
        self.lane_name = lane_name
        self._last: tuple[float, dict[str, Any]] | None = None

    def figures(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._last is None or now - self._last[0] > STALENESS_EVERY_S:
            self._last = (now, staleness(self.store, wall_ms(), self.routes, self.lane_name,
                                         variants=self.variants))
        return self._last[1]

    def collect(self) -> Iterator[Any]:
        core = _client().core
        f = self.figures()
        for by, groups in (("lane", f["lanes"]), ("route", f.get("routes", [])),
                           ("variant", f.get("variants", []))):
            if by == "variant" and not groups:
                continue  # no route names a variant: /metrics as it always was
            prefix = "" if by == "lane" else f"{by}_"
            for reading, metric, help_ in _STALENESS:
                g = core.GaugeMetricFamily(metric.replace("lanes_", f"lanes_{prefix}", 1),
                                           f"{help_}, per {by}", labels=[by, "quantile"])
                for group in groups:
                    q = group[reading]
                    for label, key in (("0.5", "p50"), ("0.95", "p95"), ("1", "max")):
                        if q[key] is not None:
                            g.add_metric([group["key"], label], q[key])
                yield g
            counts = core.GaugeMetricFamily(f"lanes_{prefix}snapshots",
                                            f"snapshots in the store, per {by}", labels=[by])
            hits = core.GaugeMetricFamily(f"lanes_{prefix}served_hits",
                                          f"hits served over the last hour, per {by}",
                                          labels=[by])
            refused = core.GaugeMetricFamily(f"lanes_{prefix}refused_stale_hits",
                                             "hits refused as staler than --max-stale over"
                                             f" the last hour, per {by}", labels=[by])
            for group in groups:
                counts.add_metric([group["key"]], group["snapshot"]["count"])
                hits.add_metric([group["key"]], group["served"]["count"])
                refused.add_metric([group["key"]], group["refused"])
            yield from (counts, hits, refused)


def registry(eng: Any, local: str | None = None, store: Store | None = None,
             routes: Routes | None = None) -> Any:
    reg = _client().CollectorRegistry()
    if eng is not None:
        reg.register(LanesCollector(eng, local))
    if store is not None:
        reg.register(StalenessCollector(store, routes, None if eng is None else eng.lane_name))
    return reg


def exposition(eng: Any, local: str | None = None, store: Store | None = None,
               routes: Routes | None = None) -> str:
    """The Prometheus text exposition of ``eng`` (and its pool, and ``store``) right now."""
    return generate(registry(eng, local, store, routes))


def generate(reg: Any) -> str:
    """The Prometheus text exposition of registry ``reg`` right now."""
    text: bytes = _client().generate_latest(reg)
    return text.decode()


def start_server(eng: Any, port: int, host: str = "127.0.0.1", local: str | None = None) -> Any:
    """Serve ``/metrics`` of ``eng`` from a daemon thread; returns the server (``shutdown()``)."""
    if not is_int(port) or not 0 <= port <= 65535:
        raise EngineValueError(f"port must lie in [0, 65535], got {port!r}")
    try:
        server, _thread = _client().start_http_server(port, addr=host,
                                                      registry=registry(eng, local))
    except OSError as e:
        raise EngineError(f"cannot serve metrics on {host}:{port}: {e}") from None
    print(f"serving metrics of {eng.name!r} on http://{host}:{server.server_port}/metrics",
          flush=True)
    return server
