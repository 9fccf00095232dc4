"""The live per-lane view of a running pool: a rich table on a terminal, plain lines otherwise.

Rates and "recent" figures are differences between two looks at cumulative counters (the
engine's per-lane ``granted``, the board's per-lane renders and age sums), so the view costs
the pool nothing and shows the same numbers a Prometheus scrape would.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from ..api import QueueEngine, Stats
from ..checks import wall_ms
from ..errors import EngineError
from ..policy import LanePolicy
from ..pool.board import DURATION_BUCKETS, FAILED, LANES, LATENCY_BOUNDS, OK, Board
from ..pool.supervisor import Pool
from ..process import is_running
from ..store.api import StoreSpec
from . import progress, words
from .lanes import labels, lane_label
from .states import STALL_WINDOW_S, lane_state, stalled

COLUMNS = ("lane", "queued", "backlog", "in flight", "renders/s", "drains in", "next due",
           "ok p50/95/99", "failed p50/95/99", "age/TTL")
"""The per-lane table of the live view and of ``lanes stats`` over a pool (backlog: rows due
and not in flight; drains in: the backlog at the lane's current rate)."""

NEXT_DUE_EVERY_S = 2.0
"""The live view reads the whole row table for "next due" at most this often."""


def shown(lane: Mapping[str, Any], renders: int = 0, failures: int = 0) -> bool:
    """Whether a lane has anything to report: rows queued or granted, or renders either way."""
    return bool(lane["queued"] or lane["granted"] or renders or failures)


def latency(hist: Any, duration_s: Any) -> dict[str, dict[str, Any]]:
    """Render latency of one lane, per outcome (``ok``, ``failed``), from its ``lane_hist`` and
    ``lane_duration_s`` rows: count, sum and p50/p95/p99 in seconds (None: no renders; inf:
    slower than the last bucket bound ``over_s``, which ``slower`` renders were; ``below_s``:
    at most the first bound, nothing finer measured)."""
    out = {}
    for key, o in (("ok", OK), ("failed", FAILED)):
        counts = np.asarray(hist[o])
        qs = progress.quantiles(counts)
        out[key] = {"count": int(counts.sum()), "sum_s": round(float(duration_s[o]), 6),
                    **{_q_key(q): None if v is None else round(v, 6)
                       for q, v in zip(progress.QUANTILES, qs, strict=True)},
                    "over_s": DURATION_BUCKETS[-1], "slower": int(counts[-1]),
                    "below_s": LATENCY_BOUNDS[0]}
    return out


def _q_key(q: float) -> str:
    return f"p{round(q * 100)}_s"


def _latency_cell(d: dict[str, Any]) -> str:
    return progress.format_latency([d[_q_key(q)] for q in progress.QUANTILES])


def lane_figures(stats: Stats, totals: dict[str, Any], look: progress.QueueLook,
                 per_s: dict[int, float | None], now_ms: int, policy: LanePolicy,
                 stalled: AbstractSet[int] = frozenset()) -> list[dict[str, Any]]:
    """One dict of numbers per lane worth showing: the engine's per-lane statistics with the
    pool's figures added (its label under ``policy``, renders, failures, rate, backlog and the
    time to drain it, its state and, waiting, when its head should be served; next due,
    latency). ``per_s``: renders (either outcome) per real second, by lane; ``stalled``: the
    lanes a watcher found stalled (``states.stalled``)."""
    pool_per_s = sum(v for v in per_s.values() if v)
    out = []
    for ln in stats["lanes"]:
        i = ln["lane"]
        hist = totals["lane_hist"][i]
        renders, failures = int(hist[OK].sum()), int(hist[FAILED].sum())
        if not shown(ln, renders, failures):
            continue
        backlog = max(0, ln["due"] - ln["in_flight"])
        rate = per_s.get(i)
        eta = words.eta_seconds(backlog, rate)
        due = look.next_due.get(i)
        state = lane_state(backlog, rate, i in stalled)
        ahead = look.ahead.get(i)
        head_in = (ahead / pool_per_s if state == "waiting" and ahead is not None
                   and pool_per_s > 0 else None)
        n_ok = int(totals["lane_renders"][i])
        out.append({**ln, "label": lane_label(policy, i), "backlog": backlog,
                    "renders": renders, "failures": failures,
                    "renders_per_s": None if rate is None else round(rate, 3),
                    "drain_s": None if eta is None or eta == float("inf") else round(eta, 1),
                    "state": state, "stalled": state == "stalled",
                    "head_in_s": None if head_in is None else round(head_in, 1),
                    "next_due_ms": due, "next_due_in_s": None if due is None
                    else round((due - now_ms) / 1000, 1),
                    "mean_age_over_ttl": (round(float(totals["lane_age_sum"][i]) / n_ok, 4)
                                          if n_ok else None),
                    "latency": latency(hist, totals["lane_duration_s"][i])})
    return out


def lane_cells(f: dict[str, Any], now_ms: int, age: float | None) -> tuple[str, ...]:
    """A ``lane_figures`` entry as the cells of ``COLUMNS``."""
    return (f["label"], str(f["queued"]), str(f["backlog"]), str(f["in_flight"]),
            words.format_rate(f["renders_per_s"]),
            state_cell(f),
            words.format_due(f["next_due_ms"], now_ms), _latency_cell(f["latency"]["ok"]),
            _latency_cell(f["latency"]["failed"]), "-" if age is None else f"{age:.2f}")


def state_cell(f: dict[str, Any]) -> str:
    """The "drains in" cell: the time to drain while draining, else the lane's state."""
    if f["state"] == "draining":
        return words.format_eta(f["backlog"], f["renders_per_s"])
    if f["state"] == "waiting":
        head = f["head_in_s"]
        if head is None:
            return "waiting"
        said = words.format_duration(head)
        return f"waiting, head in {said if said.startswith('<') else '~' + said}"
    return "stalled" if f["state"] == "stalled" else "-"


def for_json(value: Any) -> Any:
    """``value`` with every infinite float (a quantile past the last bucket) as None, so that
    ``json.dumps`` writes strict JSON."""
    if isinstance(value, dict):
        return {k: for_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [for_json(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return None
    return value


def elapsed_s(board: Board) -> tuple[float, float]:
    """(real seconds, pool-time seconds) since the pool's clock started."""
    clock = board.clock
    return ((wall_ms() - clock.wall_origin_ms) / 1000.0,
            (clock.now_ms() - clock.origin_ms) / 1000.0)


def lane_sums(totals: dict[str, Any]) -> Any:
    """Renders of either outcome per lane (an array indexed by lane)."""
    return totals["lane_hist"].sum(axis=(1, 2))


def pool_report(eng: QueueEngine, board: Board) -> dict[str, Any]:
    """Everything ``lanes stats`` shows of a pool, as numbers: the engine's statistics at the
    pool's time, the pool's counters and ``lanes`` replaced by ``lane_figures`` (rates over the
    whole run, in real seconds)."""
    now = board.clock.now_ms()
    stats = eng.stats(now_ms=now)
    totals = board.totals()
    real_s, _ = elapsed_s(board)
    per_lane = lane_sums(totals)
    per_s = {ln["lane"]: float(per_lane[ln["lane"]]) / real_s if real_s > 0 else None
             for ln in stats["lanes"]}
    figures = lane_figures(stats, totals, progress.look_ahead(eng, now), per_s, now, eng.policy)
    return {**stats, "lanes": figures, "pool": pool_figures(board, totals, now)}


def pool_figures(board: Board, totals: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The pool's own numbers (``pool_report``'s ``pool``): its supervisor, clock and counters,
    renders per second over the whole run."""
    real_s, pool_s = elapsed_s(board)
    pid, start = board.supervisor
    return {"supervisor_pid": pid, "supervisor_running": is_running(pid, start),
            "now_ms": now_ms, "time_scale": board.clock.scale, "elapsed_s": round(real_s, 3),
            "pool_elapsed_s": round(pool_s, 3), "workers": board.slots,
            "renders_per_s": round(totals["renders"] / real_s, 3) if real_s > 0 else None,
            **{k: v for k, v in totals.items() if not k.startswith("lane_")}}


def print_pool_report(r: dict[str, Any], out: TextIO | None = None, plain: bool = False) -> None:
    """``pool_report`` as a headline and the per-lane table."""
    p = r["pool"]
    now = p["now_ms"]
    state = "running" if p["supervisor_running"] else "not running (a stale board)"
    checkpoint = (f", last {words.format_due(p['checkpoint_ms'], wall_ms())}"
                  if p["checkpoints"] else "")
    title = (f"{r['name']}: {r['rows']} rows ({r['queued']} queued) of {r['capacity']}, layout"
             f" v{r['layout_version']}\npool: {p['workers']} workers, supervisor pid"
             f" {p['supervisor_pid']} {state}, "
             f"{words.format_elapsed(p['elapsed_s'], p['pool_elapsed_s'], p['time_scale'])};"
             f" {p['renders']} renders ({words.format_rate(p['renders_per_s'])}/s over the"
             f" run), {p['failures']} failures, {p['restarts']} restarts, {p['checkpoints']}"
             f" checkpoints{checkpoint}\nper lane (rates over the whole run"
             + (", next due in pool time):" if p["time_scale"] != 1 else "):"))
    rows = [lane_cells(f, now, f["mean_age_over_ttl"]) for f in r["lanes"]]
    print_table(title, rows, COLUMNS, out, plain)


def lane_rows(pool: Pool, previous: dict[str, Any] | None) -> tuple[list[tuple[str, ...]],
                                                                     dict[str, Any]]:
    """One row of strings per lane with anything in it, and the state for the next call.

    Rates and age/TTL are over the interval since ``previous``; latency over the whole run.
    """
    now_real = time.monotonic()
    now = pool.clock.now_ms()
    stats = pool.engine.stats(now_ms=now)
    totals = pool.board.totals()
    per_lane = lane_sums(totals)
    state: dict[str, Any] = {"t": now_real, "per_lane": per_lane, "renders": totals["renders"],
                             "ok": totals["lane_renders"], "age": totals["lane_age_sum"],
                             "rate": None, "looks": [] if previous is None else previous["looks"]}
    looks = state["looks"]  # the watch that tells stalled from waiting (states.stalled)
    looks.append(_Look(now_real, per_lane, _backlog(stats), idle_worker(pool.board)))
    while len(looks) > 2 and now_real - looks[1].t >= STALL_WINDOW_S:
        looks.pop(0)
    if previous is None or now_real - previous["due_t"] >= NEXT_DUE_EVERY_S:
        state["next_due"], state["due_t"] = progress.look_ahead(pool.engine, now), now_real
    else:
        state["next_due"], state["due_t"] = previous["next_due"], previous["due_t"]
    per_s: dict[int, float | None] = {}
    if previous is not None:
        dt = now_real - previous["t"]
        per_s = {ln["lane"]: words.rate(per_lane[ln["lane"]],
                                           previous["per_lane"][ln["lane"]], dt)
                 for ln in stats["lanes"]}
        state["rate"] = words.rate(totals["renders"], previous["renders"], dt)
    rows = []
    for f in lane_figures(stats, totals, state["next_due"], per_s, now, pool.engine.policy,
                          stalled(looks)):
        i = f["lane"]
        age = None
        if previous is not None:
            n = int(totals["lane_renders"][i] - previous["ok"][i])
            age = (totals["lane_age_sum"][i] - previous["age"][i]) / n if n else None
        rows.append(lane_cells(f, now, age))
    return rows, state


@dataclass(frozen=True)
class _Look:
    t: float
    renders: Any
    backlog: Any
    idle: bool


def _backlog(stats: Stats) -> Any:
    """Rows due and not in flight, per lane (indexed by lane number)."""
    out = np.zeros(LANES, np.int64)
    for ln in stats["lanes"]:
        if ln["lane"] < LANES:
            out[ln["lane"]] = max(0, ln["due"] - ln["in_flight"])
    return out


def idle_worker(board: Board) -> bool:
    """Whether a worker of the pool has nothing to render right now (capacity to spare)."""
    return any(w["row"] is None for w in board.workers())



def headline(pool: Pool, renders_per_s: float | None = None) -> str:
    t = pool.board.totals()
    real_s, pool_s = elapsed_s(pool.board)
    return (f"{pool.engine.name}: {pool.options.workers} workers,"
            f" {words.format_elapsed(real_s, pool_s, pool.clock.scale)},"
            f" {words.format_rate(renders_per_s)} renders/s, renders {t['renders']},"
            f" failures {t['failures']}, restarts {t['restarts']},"
            f" checkpoints {t['checkpoints']}")


class LiveView:
    """Call ``update(pool)`` from the pool's tick; ``close()`` at the end. With ``store`` (the
    pool's snapshot store directory) it also shows the served staleness per lane."""

    def __init__(self, out: TextIO | None = None, plain_every_s: float = 5.0,
                 force_plain: bool = False, store: str | StoreSpec | None = None) -> None:
        self.out = out or sys.stdout
        self.plain = force_plain or not self.out.isatty()
        self.plain_every_s = plain_every_s
        self._state: dict[str, Any] | None = None
        self._last = 0.0
        self._live: Any = None
        self._staleness = None if store is None else _StalenessReader(store)

    def update(self, pool: Pool) -> None:
        now = time.monotonic()
        if now - self._last < (self.plain_every_s if self.plain else 0.5):
            return
        try:
            rows, self._state = lane_rows(pool, self._state)
        except EngineError:  # a Redis queue out of reach: the pool goes on, the view waits
            self._last = now
            return
        self._last = now
        title = headline(pool, self._state["rate"])
        stale = None if self._staleness is None else self._staleness.read(pool)
        if self.plain:
            print_table(title, rows, COLUMNS, self.out, plain=True)
            if stale is not None:
                print_staleness(stale, self.out, plain=True, routes=False)
            self.out.flush()
            return
        from rich.console import Group
        from rich.live import Live

        shown: Any = render_table(title, rows)
        if stale is not None:
            shown = Group(shown, render_table(*staleness_table(stale, "lanes")))
        if self._live is None:
            self._live = Live(shown, refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self._live.update(shown)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._staleness is not None:
            self._staleness.close()


class _StalenessReader:
    """The live view's staleness figures, re-read at most every ``STALENESS_EVERY_S`` and
    never more than a tenth of the time (reading a million snapshots takes seconds, on the
    supervisor's tick)."""

    def __init__(self, store: str | StoreSpec) -> None:
        self.spec = store
        self._store: Any = None
        self._figures: dict[str, Any] | None = None
        self._next = 0.0

    def read(self, pool: Pool) -> dict[str, Any] | None:
        from ..errors import StoreError
        from ..store import open_store
        from .staleness import staleness

        start = time.monotonic()
        if start < self._next:
            return self._figures
        try:
            if self._store is None:
                self._store = open_store(self.spec, create=False)
            policy = pool.engine.policy
            self._figures = staleness(self._store, wall_ms(), None, policy.lane_name,
                                      lane_label=lambda lane: lane_label(policy, lane))
        except StoreError:
            self._figures = None  # not made yet by the first render: shown once it is
        spent = time.monotonic() - start
        self._next = start + max(STALENESS_EVERY_S, 10 * spent)
        return self._figures

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


STALENESS_EVERY_S = 5.0


def staleness_table(f: dict[str, Any], by: str) -> tuple[str, list[tuple[str, ...]],
                                                         tuple[str, ...]]:
    """The per-lane (``by="lanes"``), per-route or per-variant table of ``staleness``
    figures."""
    from .staleness import COLUMNS as STALE_COLUMNS
    from .staleness import cells, table_rows

    a = f["all"]
    title = (f"served staleness per {by[:-1]} (age / interval; store {f['directory']}): all"
             f" {a['snapshot']['count']} snapshots {cells(a['snapshot'])}; last"
             f" {f['window_s'] // 60} min: {a['served']['count']} served"
             f" {cells(a['served'])}, {a['refused']} refused stale")
    return title, table_rows(f[by]), (by[:-1], *STALE_COLUMNS[1:])


def print_staleness(f: dict[str, Any], out: TextIO | None = None, plain: bool = False,
                    routes: bool = True) -> None:
    """The staleness tables: per lane, and per route and per variant when the figures have
    them."""
    for by in ("lanes", "routes", "variants") if routes else ("lanes",):
        if by in f:
            print_table(*staleness_table(f, by), out=out, plain=plain)


def render_table(title: str, rows: Sequence[tuple[str, ...]], columns: tuple[str, ...] = COLUMNS
                 ) -> Any:
    from rich import box
    from rich.table import Table

    # Compact (one space between columns, no edges), so the lane table fits 120 columns.
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0,
                  pad_edge=False, show_edge=False)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        table.add_row(*r)
    return table


def print_table(title: str, rows: Sequence[tuple[str, ...]], columns: tuple[str, ...],
                out: TextIO | None = None, plain: bool = False) -> None:
    """A table with rich on a terminal, as aligned plain text otherwise (or when ``plain``)."""
    out = out or sys.stdout
    if out.isatty() and not plain:
        from rich.console import Console

        Console(file=out).print(render_table(title, rows, columns))
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    print(title, file=out)
    for r in (columns, *rows):
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip(),
              file=out)


def print_summary(s: dict[str, Any], policy: LanePolicy) -> None:
    """The end-of-run report of a pool (``Pool.run``'s summary; its lanes named under
    ``policy``)."""
    named = labels(policy, len(s["lanes"]))
    print(f"\n{s['renders']} renders, {s['failures']} failures, {s['released']} released at the"
          f" stop, {s['lease_lost']} leases lost, {s['restarts']} restarts;"
          f" invariants: {'hold' if not s['problems'] else s['problems']}")
    rows = []
    for ln in s["lanes"]:
        i = ln["lane"]
        hist = s["lane_hist"][i]
        failures = int(hist[FAILED].sum())
        if not shown(ln, ln["renders"], failures):
            continue
        lat = latency(hist, s["lane_duration_s"][i])
        age = ln["mean_age_over_ttl"]
        rows.append((named.get(ln["name"], ln["name"]), str(ln["queued"]), str(ln["due"]),
                     str(ln["granted"]), str(ln["renders"]), str(failures),
                     "-" if age is None else f"{age:.2f}", _latency_cell(lat["ok"]),
                     _latency_cell(lat["failed"])))
    print_table("per lane, over the whole run (age/TTL: how stale a page was when rendered;"
                " 1.00 = on time)", rows,
                ("lane", "queued", "due now", "granted", "renders", "failures", "mean age/TTL",
                 "ok p50/95/99", "failed p50/95/99"))
    sys.stdout.flush()
