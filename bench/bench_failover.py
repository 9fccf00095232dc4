"""A primary SIGKILLed under running pools, several times, with and without --wait-replicas:
the stall, the renders made again, the acknowledged writes lost, the cost of WAIT per call
(docs/redis.md, "Failover").

    .venv/bin/python bench/bench_failover.py [--smoke] [--kills N] [--cycles N]
                                             [--only sentinel|cluster] [--out FILE]

Per deployment (Sentinel: a primary, its replica, three Sentinels, down-after 500 ms; Cluster:
three primaries with a replica each, cluster-node-timeout 1000 ms) and per ``--wait-replicas``
0 and 1, one run of tests/lib/failover_lib.py: two ``lanes pool --redis`` pools (two workers
each, batches of 4, lease 1.5 s, 10 ms renders of a corpus whose rows are due hourly) and a
probe client run; N times the primary serving the queue is SIGKILLed, its replica promoted, the
killed server restarted as the new replica. Figures, medians and ranges over the kills:

* ``failover_s``: SIGKILL to the replica serving the queue;
* ``stall_s``: the longest time no pool started a render, from the kill to the next;
* ``rerenders``: renders that began between a kill and the next and were a row's second;
* ``probe_stall_s``: the longest time the probe had no call acknowledged;
* once per run: acknowledged probe adds and completes lost (of how many), calls whose outcome
  was unknown, and the probe's claim latency (p50, p99) before the first kill.

And per deployment, before the kills, what WAIT costs a worker's cycle, side by side: two
engines on one queue, one with ``wait_replicas=1``, take turns at ``complete_and_claim`` of 16
rows (``--cycles`` each); p50 and p99 of each, and the ratio of the p50s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np
from common import ROOT, figure, finish, parse_args

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from failover_lib import (  # noqa: E402
    ClusterTarget,
    FailoverConfig,
    FailoverResult,
    FailoverRun,
    SentinelTarget,
    Target,
)

from engine import Engine  # noqa: E402


def one_run(target: Target, wait: int, kills: int, smoke: bool) -> FailoverResult:
    cfg = FailoverConfig(kills=kills, wait_replicas=wait, rows=3000 if smoke else 6000 * kills)
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as d:
        return FailoverRun(cfg, target, f"rl-bf-{uuid.uuid4().hex[:8]}", d).run()


def wait_cost(kind: str, target: Target, cycles: int) -> list[dict[str, Any]]:
    """p50/p99 of complete_and_claim(16) with and without WAIT 1, taking turns on one queue."""
    name = f"rl-bw-{uuid.uuid4().hex[:8]}"
    target.probe_name(name)  # a cluster target picks its URL here
    plain = Engine.connect(target.url, name, create=True)
    waiting = Engine.connect(target.url, name, wait_replicas=1)
    times: dict[Any, list[float]] = {plain: [], waiting: []}
    try:
        plain.add_many(np.zeros(16 * 4 * cycles, np.int64), 3600)
        held = {e: e.claim(16, lease_ms=60_000) for e in times}
        for _ in range(cycles):
            for eng in times:
                t0 = time.perf_counter()
                _, held[eng] = eng.complete_and_claim(held[eng].rows, held[eng].tokens, 16,
                                                      lease_ms=60_000)
                times[eng].append((time.perf_counter() - t0) * 1000)
        plain.drop()
    finally:
        plain.close()
        waiting.close()
    k = f"failover.{kind}.cycle"
    p50 = {e: float(np.percentile(v, 50)) for e, v in times.items()}
    return [figure(f"{k}.w0_p50_ms", f"{kind}: complete_and_claim(16) p50, no WAIT (p99"
                   f" {np.percentile(times[plain], 99):.2f})", "ms", [p50[plain]]),
            figure(f"{k}.w1_p50_ms", f"{kind}: complete_and_claim(16) p50, WAIT 1 (p99"
                   f" {np.percentile(times[waiting], 99):.2f})", "ms", [p50[waiting]]),
            figure(f"{k}.w1_over_w0", f"{kind}: WAIT 1 / no WAIT, p50", "x",
                   [p50[waiting] / p50[plain]])]


def figures_of(kind: str, wait: int, res: FailoverResult) -> list[dict[str, Any]]:
    k = f"failover.{kind}.w{wait}"
    what = f"{kind}, --wait-replicas {wait}"
    out = [figure(f"{k}.failover_s", f"{what}: SIGKILL to replica serving", "s",
                  res.failover_s),
           figure(f"{k}.stall_s", f"{what}: pools' longest stall", "s", res.stalls),
           figure(f"{k}.probe_stall_s", f"{what}: probe's longest gap between acknowledged"
                  " calls", "s", res.probe_stalls),
           figure(f"{k}.rerenders", f"{what}: renders made again per kill", "renders",
                  res.rerenders_per_kill),
           figure(f"{k}.acked_adds_lost", f"{what}: acknowledged adds lost (of"
                  f" {res.acked_adds})", "adds", [res.acked_adds_lost]),
           figure(f"{k}.acked_completes_lost", f"{what}: acknowledged completes lost (of"
                  f" {res.acked_completes})", "completes", [res.acked_completes_lost]),
           figure(f"{k}.unknown", f"{what}: calls with an unknown outcome {res.unknown}",
                  "calls", [sum(res.unknown.values())])]
    for call in ("claim", "complete", "add"):
        if call in res.latency_ms:
            p50, p99 = res.latency_ms[call]
            out.append(figure(f"{k}.{call}_p50_ms", f"{what}: {call} p50 (p99 {p99:.2f})",
                              "ms", [p50]))
    return out


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kills", type=int, default=5, help="kills per run")
    ap.add_argument("--cycles", type=int, default=3000, help="cycles per engine, timed")
    ap.add_argument("--only", choices=("sentinel", "cluster"))


def main() -> None:
    args = parse_args(__doc__, _options)
    started = time.perf_counter()
    kills = 1 if args.smoke else args.kills
    figures: list[dict[str, Any]] = []
    for kind in [args.only] if args.only else ["sentinel", "cluster"]:
        target: Target = SentinelTarget() if kind == "sentinel" else ClusterTarget(1000)
        target.start()
        try:
            figures += wait_cost(kind, target, 200 if args.smoke else args.cycles)
            for wait in (0, 1):
                res = one_run(target, wait, kills, args.smoke)
                print(f"{kind} --wait-replicas {wait}: {res.summary()}", flush=True)
                if res.problems():
                    raise SystemExit(f"{kind} w{wait}: {res.problems()}")
                figures += figures_of(kind, wait, res)
        finally:
            target.stop()
    finish("bench_failover", args, figures, started)


if __name__ == "__main__":
    main()
