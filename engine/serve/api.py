"""The dashboard's figures and actions, and the JSON API that serves them.

A dashboard must never slow the pool it watches, however many people keep it open. So every
figure comes from one :class:`Figures` per server process:

* a **sampler** reads the cheap cumulative counters (``Engine.stats``, the board's totals)
  every ``SAMPLE_EVERY_S`` into a ring that holds the last hour: the live table's rates and
  the charts are differences between samples, as the terminal's live view computes them
  (``view.lane_figures``), so a viewer costs the pool nothing;
* a figure that reads every row (next due per lane, per-route counts: a row export, at 1M rows
  tens of milliseconds to seconds) is computed on demand, at most once per its ``*_EVERY_S``,
  and shared by every viewer (:meth:`Figures.cached`);
* every call into the engine, the URL table, the failure log or the store runs on the pool
  source's one thread (``PoolSource.call``), so the event loop never waits on them and the
  figures never take more than one core.

The history only covers the time the server has been up (the pool keeps no history of its
own); the overview says so while it covers less than ``HISTORY_S``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
from aiohttp import web

from .. import checkpoint
from ..api import LaneStats, Stats
from ..checks import wall_ms
from ..corpus import variant_rows
from ..corpus.routes import Routes
from ..errors import EngineError, EngineValueError
from ..keys import PARKED_MS
from ..policy import INTERVALS, ONE, REMAINDERS, SHARE_CLASSES, LanePolicy
from ..pool.board import Board, Clock
from ..pool.failures import failure_rows
from ..report import progress
from ..report.lanes import labels, lane_label
from ..report.staleness import RouteOf, VariantOf, staleness
from ..report.states import stalled
from ..report.view import for_json, idle_worker, lane_figures, lane_sums, pool_figures
from .source import PoolSource

SAMPLE_EVERY_S = 2.0
HISTORY_S = 3600.0
RATE_WINDOW_S = 10.0
"""The live table's renders/s and age/TTL are over (about) the last this many seconds."""
NEXT_DUE_EVERY_S = 5.0
ROUTES_EVERY_S = 10.0
STALENESS_EVERY_S = 10.0
FAILURES_EVERY_S = 2.0
SHOWN_FAILURES = 500
"""A failure search lists at most this many rows (an action on "all matching" takes all)."""
KINDS = ("transient", "permanent", "parked")


@dataclass(frozen=True)
class Sample:
    """One look at the cumulative counters (per lane, indexed by lane number)."""

    t: float  # time.monotonic()
    wall_ms: int
    renders: Any  # renders of either outcome
    ok: Any  # renders that succeeded
    age_sum: Any  # sum of age / TTL over those
    backlog: Any  # rows due and not in flight (a level, not a counter)
    granted: Any  # rows the claim passes granted (cumulative)
    idle: bool  # a worker of the pool had nothing to render (states.stalled reads it)


def _lane_array(stats: dict[str, Any], key: str) -> Any:
    out = np.zeros(64, np.float64)
    for ln in stats["lanes"]:
        if ln["lane"] < len(out):
            out[ln["lane"]] = ln[key]
    return out


def _rate(new: Sample, old: Sample) -> tuple[Any, Any]:
    """Per lane, renders per second and the mean age / TTL of the renders between two samples
    (NaN where none succeeded)."""
    dt = new.t - old.t
    per_s = (new.renders - old.renders) / dt if dt > 0 else np.full(64, np.nan)
    n = new.ok - old.ok
    with np.errstate(invalid="ignore", divide="ignore"):
        age = np.where(n > 0, (new.age_sum - old.age_sum) / np.where(n > 0, n, 1), np.nan)
    return per_s, age


def _num(v: float) -> float | None:
    return None if not np.isfinite(v) else round(float(v), 4)


class Figures:
    """Everything the dashboard shows, shared by all its viewers (see the module docstring)."""

    def __init__(self, parts: PoolSource) -> None:
        self.parts = parts
        self.started_ms = wall_ms()
        self.ring: deque[Sample] = deque(maxlen=int(HISTORY_S / SAMPLE_EVERY_S) + 1)
        self._latest: tuple[Stats, dict[str, Any], int] | None = None
        self._cache: dict[str, tuple[float, Any]] = {}
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._route_of: RouteOf | None = None
        self._variant_of: VariantOf | None = None
        self._row_routes: tuple[Routes, Any] | None = None

    # -- running ---------------------------------------------------------------------------------

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the pool source's thread."""
        return await self.parts.call(fn, *args)

    async def cached(self, key: str, every_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, computed at most once per ``every_s`` for all callers of ``key``.

        A value older than that is still answered at once while its successor is computed
        (a row export at 1M rows takes a while): only the first call, and the first after an
        action dropped it (:meth:`forget`), waits."""
        got = self._cache.get(key)
        if got is not None and (time.monotonic() - got[0] < every_s or key in self._pending):
            return got[1]
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self.run(fn, *args))
            self._pending[key] = pending

            def keep(done: asyncio.Future[Any]) -> None:
                del self._pending[key]
                if not done.cancelled() and done.exception() is None:
                    self._cache[key] = (time.monotonic(), done.result())

            pending.add_done_callback(keep)
        if got is not None:
            return got[1]
        # A viewer that leaves cancels its own wait, never the figure the others wait for.
        return await asyncio.shield(pending)

    def forget(self, *keys: str) -> None:
        """Drop cached figures an action changed."""
        for k in keys:
            self._cache.pop(k, None)

    async def start(self) -> None:
        await self.run(self.sample)
        self._task = asyncio.create_task(self._sampling())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _sampling(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            try:
                await self.run(self.sample)
            except EngineError:
                pass  # a pool restarting: the next sample will tell

    # -- the sampler -----------------------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample (on the source's thread)."""
        with self.parts.board() as board:
            now = board.clock.now_ms() if board is not None else wall_ms()
            stats = self.parts.engine.stats(now_ms=now)
            totals = board.totals() if board is not None else None
            idle = board is not None and idle_worker(board)
        zeros = np.zeros(64)
        self.ring.append(Sample(
            time.monotonic(), wall_ms(),
            lane_sums(totals).astype(np.float64) if totals else zeros,
            totals["lane_renders"].astype(np.float64) if totals else zeros,
            np.asarray(totals["lane_age_sum"], np.float64) if totals else zeros,
            np.maximum(0, _lane_array(stats, "due") - _lane_array(stats, "in_flight")),
            _lane_array(stats, "granted"), idle))
        self._latest = (stats, totals or {}, now)

    def _window(self) -> tuple[Sample, Sample] | None:
        """The latest sample and the one about ``RATE_WINDOW_S`` before it."""
        if len(self.ring) < 2:
            return None
        new = self.ring[-1]
        for old in reversed(self.ring):
            if new.t - old.t >= RATE_WINDOW_S:
                return new, old
        return new, self.ring[0]

    # -- figures (on the source's thread) --------------------------------------------------------

    def _clock(self) -> Clock | None:
        """The pool's clock (its board's), None with no pool on this host."""
        with self.parts.board() as board:
            return None if board is None else board.clock

    def look_ahead(self) -> progress.QueueLook:
        with self.parts.board() as board:
            now = board.clock.now_ms() if board is not None else wall_ms()
        return progress.look_ahead(self.parts.engine, now)

    def staleness(self) -> dict[str, Any] | None:
        """The store's staleness per lane and per route (``lanes serve --store``), or None."""
        store = self.parts.store
        if store is None:
            return None
        if self._variant_of is None:
            routes = self.parts.routes()
            self._route_of = None if routes is None else RouteOf(routes)  # URLs matched once
            self._variant_of = VariantOf(routes)  # keys looked at once
        policy = self.parts.engine.policy
        return staleness(store, wall_ms(), self._route_of, policy.lane_name,
                         lane_label=lambda lane: lane_label(policy, lane),
                         variants=self._variant_of)

    def crawlers(self) -> list[dict[str, Any]] | None:
        """Freshness per crawler family (``lanes serve --store``), or None."""
        from . import crawlers

        store = self.parts.store
        return None if store is None else crawlers.figures(store, wall_ms())

    def overview(self, look: progress.QueueLook, stale: dict[str, Any] | None
                 ) -> dict[str, Any]:
        """The live table, the pool's headline, the policy and the workers."""
        assert self._latest is not None
        stats, totals, now = self._latest
        window = self._window()
        per_s: dict[int, float | None] = {}
        age = None
        if window is not None:
            rates, age = _rate(*window)
            per_s = {ln["lane"]: float(rates[ln["lane"]]) for ln in stats["lanes"]}
        pool: dict[str, Any] | None = None
        workers: list[dict[str, Any]] = []
        policy = self.parts.engine.policy
        with self.parts.board() as board:
            if totals and board is not None:
                lanes = lane_figures(stats, totals, look, per_s, now, policy,
                                     stalled(list(self.ring)))
                pool = pool_figures(board, totals, now)
                pool["recent_renders_per_s"] = (None if window is None else
                                                _num(float(np.nansum(_rate(*window)[0]))))
                workers = self._workers(board)
            else:
                lanes = [{**ln, "label": lane_label(policy, ln["lane"]),
                          "backlog": max(0, ln["due"] - ln["in_flight"]),
                          "next_due_ms": look.next_due.get(ln["lane"])}
                         for ln in stats["lanes"]]
        served = {} if stale is None else {g["key"]: g for g in stale["lanes"]}
        for f in lanes:
            f["age_over_ttl"] = None if age is None else _num(age[f["lane"]])
            if stale is not None:
                f["staleness"] = served.get(f["name"])
        return {"name": stats["name"], "rows": stats["rows"], "queued": stats["queued"],
                "capacity": stats["capacity"], "now_ms": now, "lanes": lanes, "pool": pool,
                "workers": workers,
                "policy": policy_dict(policy, stats["lanes"]),
                "store": stale is not None, "history": self.history_note()}

    def _workers(self, board: Board) -> list[dict[str, Any]]:
        workers = board.workers()
        rows = [w["row"] for w in workers if w["row"] is not None]
        urls = dict(zip(rows, self.parts.urls().many(rows), strict=True)) if rows else {}
        return [{**w, "url": urls.get(w["row"]) if w["row"] is not None else None}
                for w in workers]

    def history_note(self) -> dict[str, Any]:
        covers = (self.ring[-1].t - self.ring[0].t) if len(self.ring) > 1 else 0.0
        return {"since_ms": self.started_ms, "covers_s": round(covers, 1),
                "full": covers >= HISTORY_S - 2 * SAMPLE_EVERY_S, "every_s": SAMPLE_EVERY_S}

    def history(self) -> dict[str, Any]:
        """Per lane and per sample: renders/s, backlog and age / TTL (for the charts)."""
        samples = list(self.ring)
        assert self._latest is not None
        lanes = [ln for ln in self._latest[0]["lanes"]
                 if ln["queued"] or ln["granted"] or any(s.renders[ln["lane"]] for s in samples)]
        policy = self.parts.engine.policy
        out: dict[str, Any] = {"t": [], "lanes": [ln["name"] for ln in lanes],
                               "labels": [lane_label(policy, ln["lane"]) for ln in lanes],
                               "renders_per_s": [[] for _ in lanes],
                               "backlog": [[] for _ in lanes],
                               "age_over_ttl": [[] for _ in lanes], **self.history_note()}
        for old, new in zip(samples, samples[1:], strict=False):
            rates, age = _rate(new, old)
            out["t"].append(new.wall_ms / 1000)
            for i, ln in enumerate(lanes):
                j = ln["lane"]
                out["renders_per_s"][i].append(_num(rates[j]))
                out["backlog"][i].append(int(new.backlog[j]))
                out["age_over_ttl"][i].append(_num(age[j]))
        return out

    def failures(self) -> list[dict[str, Any]]:
        """Every failing row (newest first), as ``lanes failures --json`` lists them, with
        whether a park was asked for."""
        log = self.parts.failures()
        if log is None:
            return []
        parking = log.parking()
        rows = failure_rows(self.parts.engine, log.entries(), wall_ms(), clock=self._clock())
        for r in rows:
            r["park_requested"] = r["row"] in parking
        return rows

    def routes(self, stale: dict[str, Any] | None) -> list[dict[str, Any]] | None:
        """``lanes stats``' per-route figures, with the store's staleness per route."""
        routes = self.parts.routes()
        if routes is None:
            return None
        with self.parts.board() as board:
            now = board.clock.now_ms() if board is not None else wall_ms()
        rows, cols = checkpoint.snapshot(self.parts.engine)
        out = progress.route_counts(routes, self._route_ids(routes, rows), cols, now)
        if stale is not None:
            served = {g["key"]: g for g in stale.get("routes", [])}
            for r in out:
                r["staleness"] = served.get(r["route"])
        return out

    def _route_ids(self, routes: Routes, rows: Any) -> Any:
        """The route of each of ``rows``, each row's URL matched once (rows only grow, and a
        row keeps its URL): at a million rows, matching them all is seconds of CPU."""
        kept = self._row_routes
        if kept is None or kept[0] != routes:
            kept = self._row_routes = (routes, np.empty(0, np.int16))
        known = kept[1]
        top = int(rows.max()) + 1 if len(rows) else 0
        if top > len(known):
            new = self.parts.urls().many(list(range(len(known), top)))
            known = np.concatenate([known, routes.match(new)])
            self._row_routes = (routes, known)
        return known[rows]

    def url_page(self, url: str | None, row: int | None) -> dict[str, Any]:
        """One row: where it is, why it failed, what route it follows."""
        eng, table = self.parts.engine, self.parts.urls()
        if url is not None:
            row = table.find(url)
        elif row is not None:
            url = table.many([row])[0]
        else:
            raise EngineValueError("give url=URL or row=N")
        assert row is not None and url is not None
        info = eng.describe(row)
        routes = self.parts.routes()
        route, variant, siblings = None, None, []
        if routes is not None:
            i = int(routes.match([url])[0])
            route = None if i < 0 else routes.routes[i].name
            variants = () if i < 0 else routes.routes[i].rules.variants
            if len(variants) > 1:  # the same page's other rows (variant_rows.py)
                variant = variant_rows.variant_of(url, variants)
                page = variant_rows.url_of(url)
                siblings = [(variant_rows.variant_of(k, variants), k) for k in
                            variant_rows.keys_of(page) if k != url]
        log = self.parts.failures()
        failure = None
        if log is not None:
            got = failure_rows(eng, log.entries(rows=[row]), wall_ms(), clock=self._clock())
            failure = got[0] if got else None
            if failure is not None:
                failure["park_requested"] = bool(log.parking([row]))
        due = info["due_ms"]
        clock = self._clock()
        return {**info, "url": url, "route": route, "variant": variant, "siblings": siblings,
                "failure": failure,
                "pool_now_ms": wall_ms() if clock is None else clock.now_ms(),
                "pool_clock": "" if clock is None or clock.scale == 1.0 else
                f" (pool time, x{clock.scale:g})",
                "snapshot": self._snapshot(url),
                "lane_name": None if info["lane"] is None else eng.lane_name(info["lane"]),
                "lane_label": None if info["lane"] is None else lane_label(eng.policy,
                                                                           info["lane"]),
                "parked": due == PARKED_MS, "now_ms": wall_ms()}

    def _snapshot(self, url: str) -> dict[str, Any] | None:
        """``url``'s snapshot in the store: when, its status, age and age / interval, and where
        this server serves it; None without a store or a snapshot."""
        store = self.parts.store
        snap = None if store is None else store.get(url)
        if snap is None:
            return None
        now = wall_ms()
        return {"rendered_at_ms": snap.rendered_at_ms, "status": snap.status,
                "age_s": snap.age_s(now), "age_over_interval": round(snap.age_over_interval(now),
                                                                     4),
                "html_bytes": snap.html_bytes, "link": "/render?url=" + quote(url, safe="")}

    # -- actions (on the source's thread) --------------------------------------------------------

    def retry(self, rows: list[int]) -> int:
        """Render ``rows`` now, through the urgent lane and its cap (``prioritize`` rush)."""
        log = self.parts.failures()
        if log is not None:
            log.cancel_park(rows)
        return self._rush(rows)

    def park(self, rows: list[int]) -> int:
        """Park ``rows``: the pool parks a row when it holds its lease, so each is asked to be
        parked and rushed, and the worker that claims it parks it unrendered."""
        log = self.parts.failures()
        if log is None:
            raise EngineValueError("no pool runs here: parking needs its workers")
        log.request_park(rows)
        return self._rush(rows)

    def _rush(self, rows: list[int]) -> int:
        eng, done = self.parts.engine, 0
        for row in rows:
            if eng.describe(row)["queued"]:
                eng.prioritize(row, "rush")
                done += 1
        return done

    def set_policy(self, form: dict[str, str]) -> dict[str, Any]:
        """The policy in force with the shares and weights of ``form`` (text, as a form sends
        it), set live; the engine's own error if it refuses it, and nothing changes."""
        eng = self.parts.engine
        policy = policy_from_form(eng.policy, form)
        eng.set_policy(policy)
        return self.policy()

    def policy(self) -> dict[str, Any]:
        """``policy_dict`` of the policy in force, with the engine's lanes and the split of the
        claim capacity (``split``) by what the passes of the last ``RATE_WINDOW_S`` granted."""
        eng = self.parts.engine
        p = eng.policy
        window = self._window()
        grants = {} if window is None else {
            i: float(g) for i, g in enumerate(window[0].granted - window[1].granted) if g > 0}
        return {**policy_dict(p, eng.stats()["lanes"]), "split": split(p, grants)}

    def preview(self, form: dict[str, str]) -> dict[str, Any]:
        """What applying ``form`` would change, without applying it: each figure that differs,
        before and after, and the new split (the engine's own error if it would refuse)."""
        eng = self.parts.engine
        before = self.policy()
        new = policy_from_form(eng.policy, form)
        after = policy_dict(new, eng.stats()["lanes"])
        after["split"] = split(new, {})
        return {"changes": policy_changes(before, after), "after": after}


def _number(text: str) -> Any:
    """A form's number; text that is none is passed on, for the engine to refuse in its words."""
    try:
        return float(text)
    except ValueError:
        return text


def policy_from_form(current: LanePolicy, form: dict[str, str]) -> LanePolicy:
    """``current`` with ``urgent_max_share``, ``min_share.<class>``, ``weights``,
    ``weight.<lane>`` and ``remainder`` from ``form`` (an empty share: none; an empty weight: 1;
    ``weights=intervals``: derived from the lanes' intervals, the ``weight.<lane>`` ignored;
    ``weights`` not given: as ``current``'s are derived or given)."""
    shares = {c: _number(form[f"min_share.{c}"].strip()) for c in SHARE_CLASSES
              if form.get(f"min_share.{c}", "").strip()}
    weights: Any = {name: _number(form[f"weight.{name}"].strip())
                    for name in current.lane_names() if form.get(f"weight.{name}", "").strip()}
    mode = form.get("weights", "").strip() or (INTERVALS if current.live_weights else "given")
    if mode not in (INTERVALS, "given"):
        raise EngineValueError(f"weights must be {INTERVALS!r} or 'given', got {mode!r}")
    if mode == INTERVALS:
        weights = INTERVALS
    return dataclasses.replace(
        current, urgent_max_share=_number(form.get("urgent_max_share", "").strip()),
        min_share=shares, weights=weights,
        remainder=form.get("remainder", current.remainder))


def split(p: LanePolicy, grants: dict[int, float]) -> list[dict[str, Any]]:
    """The claim capacity of a pass as segments of one bar (shares summing to 1): the urgent
    cap, each floor, and the remainder divided among the lanes by ``grants`` (rows granted per
    lane lately; the urgent lane's left out: the cap is its own), or whole when none."""
    floors = {c: p.min_share[c] for c in SHARE_CLASSES if p.min_share.get(c)}
    out: list[dict[str, Any]] = [{"what": "urgent cap", "share": p.urgent_max_share,
                                  "kind": "urgent"}]
    out += [{"what": f"{c} floor", "share": v, "kind": f"floor-{c}"} for c, v in floors.items()]
    rest = max(0.0, 1.0 - p.urgent_max_share - sum(floors.values()))
    lanes = {i: g for i, g in grants.items() if i != 0}
    total = sum(lanes.values())
    if total > 0:
        out += [{"what": lane_label(p, i), "share": rest * g / total, "kind": f"lane-{k % 12}"}
                for k, (i, g) in enumerate(sorted(lanes.items()))]
    else:
        out.append({"what": "remainder (nothing granted lately)", "share": rest, "kind": "rest"})
    x = 0.0
    for seg in out:  # offsets on a 1000-wide bar, for the page's SVG
        share = float(seg["share"])
        seg["x"], seg["width"] = round(x * 1000, 1), round(share * 1000, 1)
        x += share
    return out


def policy_changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, before, after) for every figure of two ``policy_dict``s that differs."""
    def share(v: Any) -> str:
        return "-" if v is None else f"{float(v):.3g}"

    rows = [("urgent cap", share(before["urgent_max_share"]), share(after["urgent_max_share"])),
            *((f"{c} floor", share(before["min_share"].get(c)), share(after["min_share"].get(c)))
              for c in SHARE_CLASSES),
            ("remainder share", share(before["remainder_share"]),
             share(after["remainder_share"])),
            ("remainder by", before["remainder"], after["remainder"]),
            ("weights", "derived" if before["weights_live"] else "given",
             "derived" if after["weights_live"] else "given"),
            *((f"weight of {after['labels'].get(n, n)}", share(before["weights"].get(n)),
               share(after["weights"].get(n)))
              for n in sorted(set(before["weights"]) | set(after["weights"])))]
    return [r for r in rows if r[1] != r[2]]


def policy_dict(p: LanePolicy, lanes: list[LaneStats] | None = None) -> dict[str, Any]:
    """The policy as the dashboard and ``/api/policy`` show it. ``weights``: the weight the next
    pass gives each lane written into under these bands (from ``lanes``, the engine's lane
    stats) or that weighs other than 1; every lane without ``lanes``. ``weights_live``: derived
    at every pass from the lanes' intervals."""
    names = p.lane_names()
    bounds = [(0, 0)] * p.lane_count
    for ln in lanes or []:
        if ln["lane"] < p.lane_count:
            bounds[ln["lane"]] = (ln["iv_min"], ln["iv_max"])
    fp = p.lane_weights_fp(p.lane_count, bounds)
    weights = {names[i]: round(fp[i] / ONE, 4) for i in range(p.lane_count)
               if bounds[i][1] or fp[i] != ONE or lanes is None}
    return {"urgent_max_share": p.urgent_max_share,
            "min_share": {c: p.min_share[c] for c in SHARE_CLASSES if c in p.min_share},
            "remainder": p.remainder, "remainders": list(REMAINDERS),
            "share_classes": list(SHARE_CLASSES), "lanes_enabled": p.lanes_enabled,
            "weights": weights, "weights_live": isinstance(p.weights, str),
            "labels": labels(p),
            "bands": [lane_label(p, i).split(" · ")[-1] for i in range(1, p.bands_per_class + 1)],
            "ttl_bands": list(p.ttl_bands), "cold_after": p.cold_after,
            "remainder_share": round(max(0.0, 1 - p.urgent_max_share
                                         - sum(p.min_share.values())), 6)}


def matching(rows: list[dict[str, Any]], q: str = "", lane: str = "", kind: str = ""
             ) -> list[dict[str, Any]]:
    """Failing rows whose URL holds ``q`` (any case), in lane ``lane``, of kind ``kind``."""
    q = q.strip().lower()
    return [r for r in rows if (not q or q in r["url"].lower()) and (not lane or r["lane"] == lane)
            and (not kind or r["kind"] == kind)]


# -- the JSON API ------------------------------------------------------------------------------

FIGURES = web.AppKey("lanes_figures", Figures)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(for_json(value), status=status)


async def overview_of(fig: Figures) -> dict[str, Any]:
    due = await fig.cached("next_due", NEXT_DUE_EVERY_S, fig.look_ahead)
    stale = await fig.cached("staleness", STALENESS_EVERY_S, fig.staleness)
    result: dict[str, Any] = await fig.cached("overview", SAMPLE_EVERY_S / 2, fig.overview, due,
                                              stale)
    return result


async def failures_of(fig: Figures, query: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The failing rows matching the filter in ``query`` (q, lane, kind), and the filter."""
    rows = await fig.cached("failures", FAILURES_EVERY_S, fig.failures)
    f = {k: str(query.get(k, "")) for k in ("q", "lane", "kind")}
    if f["kind"] and f["kind"] not in KINDS:
        raise EngineValueError(f"kind must be one of {', '.join(KINDS)}, got {f['kind']!r}")
    return matching(rows, **f), f


async def api_overview(request: web.Request) -> web.Response:
    return _json(await overview_of(request.app[FIGURES]))


async def api_history(request: web.Request) -> web.Response:
    fig = request.app[FIGURES]
    return _json(await fig.cached("history", SAMPLE_EVERY_S, fig.history))


async def api_failures(request: web.Request) -> web.Response:
    rows, f = await failures_of(request.app[FIGURES], request.query)
    return _json({"filter": f, "matching": len(rows), "rows": rows[:SHOWN_FAILURES]})


async def routes_of(fig: Figures) -> list[dict[str, Any]] | None:
    stale = await fig.cached("staleness", STALENESS_EVERY_S, fig.staleness)
    routes: list[dict[str, Any]] | None = await fig.cached("routes", ROUTES_EVERY_S, fig.routes,
                                                           stale)
    return routes


async def api_routes(request: web.Request) -> web.Response:
    return _json({"routes": await routes_of(request.app[FIGURES])})


async def api_url(request: web.Request) -> web.Response:
    fig = request.app[FIGURES]
    row = request.query.get("row")
    return _json(await fig.run(fig.url_page, request.query.get("url"),
                               None if row is None else row_number(row)))


async def crawlers_of(fig: Figures) -> list[dict[str, Any]] | None:
    bots: list[dict[str, Any]] | None = await fig.cached("crawlers", STALENESS_EVERY_S,
                                                         fig.crawlers)
    return bots


async def api_crawlers(request: web.Request) -> web.Response:
    return _json({"crawlers": await crawlers_of(request.app[FIGURES])})


async def api_policy(request: web.Request) -> web.Response:
    fig = request.app[FIGURES]
    return _json(await fig.run(fig.policy))


def row_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise EngineValueError(f"a row is a whole number, got {text!r}") from None


async def action_rows(request: web.Request, form: Any) -> list[int]:
    """The rows an action names: ``row`` fields, or with ``all=1`` every failing row matching
    the filter (``q``, ``lane``, ``kind``) in the form."""
    if form.get("all") == "1":
        fig = request.app[FIGURES]
        fig.forget("failures")
        found, _ = await failures_of(fig, form)
        return [r["row"] for r in found]
    rows = [row_number(v) for v in form.getall("row", [])]
    if not rows:
        raise EngineValueError("name the rows (row=N) or all=1 with a filter")
    return rows


async def api_action(request: web.Request) -> web.Response:
    """POST /api/retry or /api/park."""
    fig = request.app[FIGURES]
    form = await request.post()
    rows = await action_rows(request, form)
    what = request.match_info["action"]
    done = await fig.run(fig.retry if what == "retry" else fig.park, rows)
    fig.forget("failures", "overview")
    return _json({"action": what, "asked": len(rows), "done": done})


async def api_set_policy(request: web.Request) -> web.Response:
    fig = request.app[FIGURES]
    form = await request.post()
    policy = await fig.run(fig.set_policy, {k: str(v) for k, v in form.items()})
    fig.forget("overview")
    return _json({"policy": policy})


@web.middleware
async def engine_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """An ``EngineError`` under /api/ is a 400 with the engine's own words."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except EngineError as e:
        if not request.path.startswith("/api/"):
            raise
        return _json({"error": str(e)}, status=400)


def add_api_routes(app: web.Application, read_only: bool) -> None:
    app.router.add_get("/api/overview", api_overview)
    app.router.add_get("/api/history", api_history)
    app.router.add_get("/api/failures", api_failures)
    app.router.add_get("/api/routes", api_routes)
    app.router.add_get("/api/url", api_url)
    app.router.add_get("/api/policy", api_policy)
    app.router.add_get("/api/crawlers", api_crawlers)
    app.router.add_post("/api/{action:retry|park}", refused if read_only else api_action)
    app.router.add_post("/api/policy", refused if read_only else api_set_policy)


async def refused(request: web.Request) -> web.Response:
    """Every action of a read-only server."""
    raise web.HTTPForbidden(text="this dashboard is read-only (lanes serve --read-only)")
