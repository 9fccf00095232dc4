"""The default policy against the bound on every named corpus of the lane simulator.

For each corpus of ``engine.sim.CORPORA`` (and the ``news`` corpus again over a second band
layout), at 100, 75 and 50 % of demand and over several seeds: the worst class's mean age / TTL
over the bound (``engine.sim.bound``), the shortest-interval class, starved classes and the
renders against ``today``, for ``default``, ``floors``, ``lateness``, ``fitted`` and ``exact``
(every due row ranked by its relative lateness, no lanes: the anchor), and each one's worst
class over ``exact``'s in the same seed. Medians over the seeds with the range in brackets.
Not part of ``make bench`` (it takes tens of minutes at full scale); the short form is
tests/shm/test_default_policy.py.

    nice python bench/bench_policy.py [--scale 1] [--seeds 1,2,3] [--jobs 2] [--out FILE]

``--out`` also saves, as figures, each policy's worst class over ``exact``'s (one value per
seed) per corpus, layout and capacity.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import figure, finish  # noqa: E402

from engine.sim import (  # noqa: E402
    CORPORA,
    SimConfig,
    SimResult,
    bound,
    corpus_config,
    policy_spec,
    run_many,
    worst_class,
)

POLICIES = ("today", "default", "floors", "lateness", "fitted", "exact")
CAPACITIES = (1.0, 0.75, 0.5)
OTHER_LAYOUT = ("news", tuple(h * 3600 for h in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)))
"""A second band layout: boundaries a factor 2 apart from 1 h to 512 h."""


def _spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def _row(config: SimConfig, runs: list[SimResult], today: list[SimResult],
         exact: list[SimResult]) -> list[str]:
    cap = runs[0].capacity
    short = min(config.classes, key=lambda c: c.interval_h[0]).name
    ratios = [worst_class(r) / bound(config, cap) for r in runs]
    anchor = [worst_class(r) / worst_class(e) for r, e in zip(runs, exact, strict=True)]
    shorts = [r.classes[short].mean_age_over_ttl or math.inf for r in runs]
    renders = [100 * (r.renders / t.renders - 1) for r, t in zip(runs, today, strict=True)]
    starved = sorted({n for r in runs for n, c in r.classes.items() if c.starved})
    return [f"{cap:.0%}", runs[0].policy, _spread(ratios, ".3f"), _spread(anchor, ".3f"),
            _spread(shorts, ".2f"),
            ", ".join(starved) or "none", _spread(renders, "+.2f") + " %"]


def measure(name: str, bands: tuple[int, ...] | None, scale: float, seeds: list[int],
            jobs: int, figs: list[dict[str, Any]]) -> list[list[str]]:
    by: dict[tuple[str, float], list[SimResult]] = {}
    config = corpus_config(name, scale=scale, ttl_bands=bands)
    for seed in seeds:
        config = corpus_config(name, scale=scale, seed=seed, ttl_bands=bands)
        specs = [policy_spec(p, config) for p in POLICIES]
        for r in run_many(config, specs, CAPACITIES, jobs):
            by.setdefault((r.policy, r.capacity), []).append(r)
    layout = "default" if bands is None else "/".join(f"{b // 3600}h" for b in bands)
    for cap in CAPACITIES:
        for pol in POLICIES[1:-1]:
            figs.append(figure(
                f"policy.{name}.{layout}.c{round(cap * 100)}.{pol}_over_exact",
                f"{name} ({layout} bands) at {cap:.0%}: {pol}'s worst class / exact's", "x",
                [worst_class(r) / worst_class(e)
                 for r, e in zip(by[pol, cap], by["exact", cap], strict=True)],
                note=f"seeds {seeds}, scale {scale}"))
    return [[name, layout, *_row(config, by[p, cap], by["today", cap], by["exact", cap])]
            for cap in CAPACITIES for p in POLICIES if p != "today"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--corpora", default=",".join(CORPORA))
    p.add_argument("--no-other-layout", action="store_true")
    p.add_argument("--out", type=Path, help="write each policy's worst class over exact's as JSON")
    args = p.parse_args()
    args.smoke = False
    started = time.perf_counter()
    figs: list[dict[str, Any]] = []
    seeds = [int(s) for s in args.seeds.split(",")]
    work: list[tuple[str, tuple[int, ...] | None]] = [
        (c, None) for c in args.corpora.split(",")]
    if not args.no_other_layout:
        work.append(OTHER_LAYOUT)
    print("| corpus | bands | capacity | policy | worst ÷ bound | worst ÷ exact's |"
          " shortest class | starved | renders vs today |")
    print("|---|---|---|---|---:|---:|---:|---|---:|")
    for name, bands in work:
        t0 = time.perf_counter()
        for row in measure(name, bands, args.scale, seeds, args.jobs, figs):
            print("| " + " | ".join(row) + " |", flush=True)
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->", flush=True)
    if args.out:
        finish("bench_policy", args, figs, started)


if __name__ == "__main__":
    main()
