"""The live per-lane view of a running pool: a rich table on a terminal, plain lines otherwise.

Rates and "recent" figures are differences between two looks at cumulative counters (the
engine's per-lane ``granted``, the board's per-lane renders and age sums), so the view costs
the pool nothing and shows the same numbers a Prometheus scrape would.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from .supervisor import Pool

COLUMNS = ("lane", "queued", "due", "leased", "granted/s", "age/TTL", "floor behind")


def lane_rows(pool: Pool, previous: dict[str, Any] | None) -> tuple[list[tuple[str, ...]],
                                                                     dict[str, Any]]:
    """One row of strings per lane with anything in it, and the state for the next call."""
    now_real = time.monotonic()
    now = pool.clock.now_ms()
    stats = pool.engine.stats(now_ms=now)
    totals = pool.board.totals()
    state = {"t": now_real, "granted": {ln["lane"]: ln["granted"] for ln in stats["lanes"]},
             "renders": totals["lane_renders"], "age": totals["lane_age_sum"]}
    rows: list[tuple[str, ...]] = []
    for ln in stats["lanes"]:
        i = ln["lane"]
        if not (ln["queued"] or ln["granted"]):
            continue
        rate = age = "-"
        if previous is not None:
            dt = max(1e-6, now_real - previous["t"])
            rate = f"{(ln['granted'] - previous['granted'].get(i, 0)) / dt:.0f}"
            n = int(totals["lane_renders"][i] - previous["renders"][i])
            if n:
                age = f"{(totals['lane_age_sum'][i] - previous['age'][i]) / n:.2f}"
        floor = ln["floor_minute"]
        behind = "-" if not floor else _hours(now / 60_000 - floor)
        rows.append((ln["name"], str(ln["queued"]), str(ln["due"]), str(ln["leased"]), rate, age,
                     behind))
    return rows, state


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h" if minutes >= 0 else f"ahead {-minutes / 60:.1f} h"


def headline(pool: Pool) -> str:
    t = pool.board.totals()
    virtual_h = (pool.clock.now_ms() - pool.clock.origin_ms) / 3_600_000
    return (f"{pool.engine.name}: {pool.options.workers} workers, pool time +{virtual_h:.1f} h"
            f" (x{pool.clock.scale:g}), renders {t['renders']}, failures {t['failures']},"
            f" restarts {t['restarts']}, checkpoints {t['checkpoints']}")


class LiveView:
    """Call ``update(pool)`` from the pool's tick; ``close()`` at the end."""

    def __init__(self, out: TextIO | None = None, plain_every_s: float = 5.0,
                 force_plain: bool = False) -> None:
        self.out = out or sys.stdout
        self.plain = force_plain or not self.out.isatty()
        self.plain_every_s = plain_every_s
        self._state: dict[str, Any] | None = None
        self._last = 0.0
        self._live: Any = None

    def update(self, pool: Pool) -> None:
        now = time.monotonic()
        if now - self._last < (self.plain_every_s if self.plain else 0.5):
            return
        rows, self._state = lane_rows(pool, self._state)
        self._last = now
        if self.plain:
            print(headline(pool), file=self.out)
            for r in rows:
                print("  " + "  ".join(f"{c}={v}" for c, v in zip(COLUMNS, r, strict=True)),
                      file=self.out)
            self.out.flush()
            return
        from rich.live import Live

        table = render_table(headline(pool), rows)
        if self._live is None:
            self._live = Live(table, refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self._live.update(table)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def render_table(title: str, rows: Sequence[tuple[str, ...]], columns: tuple[str, ...] = COLUMNS
                 ) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*r)
    return table


def print_table(title: str, rows: Sequence[tuple[str, ...]], columns: tuple[str, ...],
                out: TextIO | None = None) -> None:
    """A table with rich on a terminal, as aligned plain text otherwise."""
    out = out or sys.stdout
    if out.isatty():
        from rich.console import Console

        Console(file=out).print(render_table(title, rows, columns))
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    print(title, file=out)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)), file=out)
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)), file=out)


def print_summary(s: dict[str, Any]) -> None:
    """The end-of-run report of a pool (``Pool.run``'s summary)."""
    print(f"\n{s['renders']} renders, {s['failures']} failures, {s['released']} released at the"
          f" stop, {s['lease_lost']} leases lost, {s['restarts']} restarts;"
          f" invariants: {'hold' if not s['problems'] else s['problems']}")
    rows = []
    for ln in s["lanes"]:
        if not (ln["renders"] or ln["queued"]):
            continue
        age = ln["mean_age_over_ttl"]
        rows.append((ln["name"], str(ln["queued"]), str(ln["due"]), str(ln["granted"]),
                     str(ln["renders"]), "-" if age is None else f"{age:.2f}"))
    print_table("per lane, over the whole run (age/TTL: how stale a page was when rendered;"
                " 1.00 = on time)", rows,
                ("lane", "queued", "due now", "granted", "renders", "mean age/TTL"))
    sys.stdout.flush()
