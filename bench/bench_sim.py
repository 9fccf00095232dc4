"""The README's scheduling table: `lanes sim` of one EDF queue, the default and `floors`.

    .venv/bin/python bench/bench_sim.py [--smoke] [--renders] [--out FILE]

Runs the simulator (the real engine in virtual time, docs/simulator.md) on the default corpus,
seed 1, windows of three times the longest interval, at 100 %, 75 % and 50 % of demand, and
reports for each policy and capacity the homepages' mean age ÷ TTL, the worst class's, and the
bound no policy can beat (``engine.sim.bound``). The simulator is deterministic for a seed, so
each figure is one run. About 10 s; ``--smoke`` runs a twentieth of the corpus over short
windows (not steady: its figures are not the README's).

``--renders`` instead runs every policy of the simulator at the three capacities and reports its
renders against ``today``'s (each figure's note: within 0.5 %, the goal, or not) and its
attempts on rows that always fail (docs/simulator.md, "Lanes only redistribute work"), and
``today``'s standing lag at 100 %, which the corpus is calibrated by. About a minute.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from common import figure, finish, parse_args, skipped

from engine.sim import POLICIES as ALL_POLICIES
from engine.sim import SimConfig, bound, policy_spec, run_many, worst_class

POLICIES = ("today", "default", "floors")
RENDERS_GOAL_PCT = 0.5
"""Every policy renders within this many percent of ``today``: it only redistributes the work."""
CAPACITIES = (1.0, 0.75, 0.5)


def figures(config: SimConfig) -> list[dict[str, Any]]:
    specs = [policy_spec(p, config) for p in POLICIES]
    out: list[dict[str, Any]] = []
    for r in run_many(config, specs, CAPACITIES, jobs=1):
        cap = f"{round(r.capacity * 100)}"
        home = r.classes["home"]
        starved = " (starved)" if home.starved else ""
        if home.mean_age_over_ttl is None:  # not one render in the window
            out.append(skipped(f"sim.{r.policy}.c{cap}.home", f"sim {r.policy} at {cap} %: home "
                               "mean age / TTL", "starved: no render in the window", "x"))
        else:
            out.append(figure(f"sim.{r.policy}.c{cap}.home", f"sim {r.policy} at {cap} %: home "
                              f"mean age / TTL{starved}", "x", [home.mean_age_over_ttl]))
        worst = worst_class(r)
        if worst != float("inf"):
            out.append(figure(f"sim.{r.policy}.c{cap}.worst",
                              f"sim {r.policy} at {cap} %: worst class mean age / TTL", "x",
                              [worst]))
    for cap in CAPACITIES:
        out.append(figure(f"sim.bound.c{round(cap * 100)}",
                          f"sim bound at {round(cap * 100)} %: worst class mean age / TTL", "x",
                          [bound(config, cap)]))
    return out


def renders(config: SimConfig) -> list[dict[str, Any]]:
    """Each policy's renders over ``today``'s, minus 1, and its attempts on rows that always fail,
    at each capacity: the attempts are the same to the row, so the first is the second's
    difference from ``today``'s, give or take the random failures."""
    results = run_many(config, [policy_spec(p, config) for p in ALL_POLICIES], CAPACITIES)
    today = {r.capacity: r for r in results if r.policy == "today"}
    out: list[dict[str, Any]] = []
    for r in results:
        cap = round(r.capacity * 100)
        base = today[r.capacity]
        if r.attempts != base.attempts:
            raise RuntimeError(f"{r.policy} at {cap} % made {r.attempts} attempts against"
                               f" today's {base.attempts}: a policy must only redistribute them")
        off = 100 * (r.renders / base.renders - 1)
        out.append(figure(f"sim.renders.{r.policy}.c{cap}", f"sim {r.policy} at {cap} %: renders"
                          " / today's - 1", "%", [off], note=f"goal within {RENDERS_GOAL_PCT} %: " +
                          ("met" if abs(off) <= RENDERS_GOAL_PCT else "MISSED")))
        out.append(figure(f"sim.broken_attempts.{r.policy}.c{cap}", f"sim {r.policy} at {cap} %:"
                          " attempts on rows that always fail", "attempts", [r.broken_attempts]))
    out.append(figure("sim.today.c100.lag_h", "sim today at 100 %: standing lag (calibrated to"
                      " production's 3.05 h)", "h", [today[1.0].lag_hours]))
    return out


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument(
        "--renders", action="store_true", help="every policy's renders against today's"))
    started = time.perf_counter()
    config = SimConfig(seed=1)
    if args.smoke:
        config = replace(config, scale=0.05, warmup_h=6, measure_h=6)
    finish("bench_sim", args, (renders if args.renders else figures)(config), started)


if __name__ == "__main__":
    main()
