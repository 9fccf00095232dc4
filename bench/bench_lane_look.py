"""What the lane states cost the dashboard and the live view: "next due" alone beside "next due
and the rows ahead of each lane's head" (``engine.report.progress.look_ahead``), on one engine.

Both read every queued row once (the row export); the second adds, per lane, the rank of its
head among the due rows under the policy's remainder. They run alternated on the same engine
(``LanePolicy()``, its 64 lanes, a corpus a quarter of it in the future), so each round's ratio
compares the two on the same machine moment: medians and ranges over the rounds.

    .venv/bin/python bench/bench_lane_look.py [--smoke] [--out FILE] [--rows N] [--rounds R]
"""

from __future__ import annotations

import time

from common import NOW, corpus, drop, figure, finish, new_engine, on_exit, parse_args, ratios

from engine import LanePolicy
from engine.report import progress


def main() -> None:
    args = parse_args(__doc__, lambda ap: (ap.add_argument("--rows", type=int),
                                           ap.add_argument("--rounds", type=int)))
    started = time.perf_counter()
    rows = args.rows or (20_000 if args.smoke else 1_000_000)
    rounds = args.rounds or (3 if args.smoke else 9)
    eng = new_engine("lanelook", rows, LanePolicy(), rows=corpus(rows, overdue_days=(-10, 30)))
    on_exit(lambda: drop(eng))
    alone: list[float] = []
    ahead: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        due = progress.next_due(eng, NOW)
        t1 = time.perf_counter()
        look = progress.look_ahead(eng, NOW)
        t2 = time.perf_counter()
        assert look.next_due == due
        alone.append((t1 - t0) * 1000)
        ahead.append((t2 - t1) * 1000)
    figures = [
        figure("lane_look.next_due_ms", f"next due alone, {rows:,} rows", "ms", alone),
        figure("lane_look.look_ahead_ms", f"next due and rows ahead, {rows:,} rows", "ms",
               ahead),
        figure("lane_look.ratio", "look_ahead / next_due, per round", "x",
               ratios(ahead, alone)),
    ]
    drop(eng)
    finish("bench_lane_look", args, figures, started)


if __name__ == "__main__":
    main()
