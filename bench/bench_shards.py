"""A Redis queue over shards (engine/redis/shards.py): what spreading costs, and what it buys.

    .venv/bin/python bench/bench_shards.py [--smoke] [--out F] [--runs N] [--seconds S]
        [--workers W] [--pool-rows N] [--memory-rows N] [--skip instructions,pool,memory]

Three figures, in one run:

* **server instructions per granted row** (callgrind, bench/redis_instructions.py's harness): a
  worker's cycle (``complete_and_claim`` of 16 on 100k due rows) against one server holding the
  queue as one shard and as 3 (all three on that server, so the count is what the servers run
  in all per row, routing included: a cycle is one FCALL, two when the client moves on);
* **rows/s of one pool** (forked, ``--workers``, a render that does nothing, so the queue is the
  work) against a cluster of 3 primaries, its queue over 1 shard and over 3, alternated
  ``--runs`` times: renders counted on the pool's board over ``--seconds`` after a warm-up;
* **used memory per primary** (``INFO memory`` ``used_memory``, less the empty cluster's) of a
  ``--memory-rows`` queue over 3 shards on the cluster, with the time its ``add_many`` took.

Needs valgrind for the first (skipped with the reason without it).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "lib"))

from common import BUDGET, NOW, corpus, figure, finish, parse_args, skipped  # noqa: E402
from redis_instructions import LEASE_MS, measure  # noqa: E402
from redis_server import LocalCluster, RedisServer  # noqa: E402

from engine import Engine  # noqa: E402
from engine.pool import Pool, PoolOptions  # noqa: E402
from engine.pool.render import RenderSpec  # noqa: E402

SHARDS = 3


def noop(url: str, claim: Any) -> None:
    """The pool's render: nothing, so what the pool does is claim and complete."""


def _fcalls(srv: RedisServer) -> int:
    stats = srv.client().info("commandstats")  # type: ignore[attr-defined]
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


def _cycles(shards: int) -> Any:
    """redis_instructions.measure's ``make``: a worker's cycle on a queue over ``shards``; its
    FCALLs per cycle counted over 400 cycles (commandstats)."""
    def make(srv: RedisServer, rows: int) -> tuple[Any, float]:
        eng = Engine.connect(srv.url, "calls", create=True, shards=shards, timeout=60)
        eng.add_many(*corpus(rows))
        held = [eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)]

        def cycle() -> None:
            _, held[0] = eng.complete_and_claim(held[0].rows, held[0].tokens, budget=BUDGET,
                                                now_ms=NOW, lease_ms=LEASE_MS)
            assert len(held[0]) == BUDGET, "the queue ran dry: more --rows"
        before = _fcalls(srv)
        for _ in range(400):
            cycle()
        return cycle, (_fcalls(srv) - before) / 400
    return make


def instructions(runs: int, rows: int, cycles: int) -> list[dict[str, Any]]:
    if shutil.which("valgrind") is None:
        return [skipped(f"shards.instructions_per_row.s{s}", f"server instructions per granted"
                        f" row, shards={s}", "valgrind is not installed") for s in (1, SHARDS)]
    got: dict[int, list[float]] = {1: [], SHARDS: []}
    calls: dict[int, list[float]] = {1: [], SHARDS: []}
    for _ in range(runs):
        for s in (1, SHARDS):  # alternated, so both meet the same machine
            m = measure(rows, cycles, make=_cycles(s))
            got[s].append(int(m["instructions_per_cycle"]) / BUDGET)  # type: ignore[call-overload]
            calls[s].append(int(m["commands"]))  # type: ignore[call-overload]
    return [figure(f"shards.instructions_per_row.s{s}", f"server instructions per granted row,"
                   f" shards={s}", "instr", got[s], note=f"FCALLs counted {calls[s]}")
            for s in (1, SHARDS)]


def _pool_rate(url: str, shards: int, rows: int, seconds: float, workers: int,
               tag: str) -> float:
    """Rows/s of one pool over a fresh queue of ``rows`` due URLs (dropped after)."""
    name = f"bench-shards-{os.getpid()}-{tag}"
    urls = [f"https://bench.example/{tag}/{i}" for i in range(rows)]
    due = np.full(rows, int(time.time() * 1000) - 3_600_000)
    pool = Pool.create(name, urls, due, 30 * 86_400, "submitted",
                       RenderSpec(callable="bench_shards:noop"),
                       PoolOptions(workers=workers), redis=url, local=name,
                       shards=None if shards == 1 else shards)
    try:
        pool.start()
        time.sleep(min(2.0, seconds / 2))  # workers forked and claiming
        r0, t0 = pool.board.totals()["renders"], time.perf_counter()
        time.sleep(seconds)
        r1, t1 = pool.board.totals()["renders"], time.perf_counter()
        if r1 >= rows:
            raise RuntimeError(f"the pool rendered all {rows} rows: give more --pool-rows")
    finally:
        pool.shutdown()
        with Engine.connect(url, name) as eng:
            eng.row_urls().drop()
            eng.drop()
    return (r1 - r0) / (t1 - t0)


def pool_rates(runs: int, rows: int, seconds: float, workers: int) -> list[dict[str, Any]]:
    got: dict[int, list[float]] = {1: [], SHARDS: []}
    with LocalCluster(3) as cluster:
        for i in range(runs):
            for s in (1, SHARDS):
                got[s].append(_pool_rate(cluster.url, s, rows, seconds, workers, f"{s}.{i}"))
    figs = [figure(f"shards.pool_rows_s.s{s}", f"one pool ({workers} workers, no-op render),"
                   f" queue over {s} shard(s) on 3 primaries", "rows/s", got[s], "higher")
            for s in (1, SHARDS)]
    figs.append(figure("shards.pool_ratio", f"pool rows/s, {SHARDS} shards / 1", "x",
                       [a / b for a, b in zip(got[SHARDS], got[1], strict=True)], "higher"))
    return figs


def memory(rows: int) -> list[dict[str, Any]]:
    with LocalCluster(3) as cluster:
        def used() -> list[int]:
            return [int(n.client().info("memory")["used_memory"])  # type: ignore[attr-defined]
                    for n in cluster.nodes]
        base = used()
        t0 = time.perf_counter()
        with Engine.connect(cluster.url, "mem", create=True, shards=SHARDS, timeout=60) as eng:
            for start in range(0, rows, 500_000):
                n = min(500_000, rows - start)
                eng.add_many(*corpus(n, seed=start))
            took = time.perf_counter() - t0
            per_shard = [s["rows"] for s in eng.stats()["shards"]]
        delta = [a - b for a, b in zip(used(), base, strict=True)]
    figs = [figure(f"shards.memory_mib.primary{i}", f"used_memory of primary {i}, a {rows:,}-row"
                   f" queue over {SHARDS} shards", "MiB", [d / 2**20]) for i, d in enumerate(delta)]
    figs.append(figure("shards.memory_bytes_per_row", "used_memory per row, all primaries", "B",
                       [sum(delta) / sum(per_shard)]))
    figs.append(figure("shards.add_many_rows_s", f"add_many of {rows:,} rows over {SHARDS}"
                       " shards", "rows/s", [rows / took], "higher"))
    return figs


def main() -> None:
    started = time.perf_counter()

    def extra(ap: Any) -> None:
        ap.add_argument("--runs", type=int, default=3)
        ap.add_argument("--seconds", type=float, default=10.0)
        ap.add_argument("--workers", type=int, default=4)
        ap.add_argument("--pool-rows", type=int, default=200_000)
        ap.add_argument("--memory-rows", type=int, default=3_000_000)
        ap.add_argument("--skip", default="", help="comma separated: instructions,pool,memory")
    a = parse_args(__doc__, extra)
    if a.smoke:
        a.runs, a.seconds, a.pool_rows, a.memory_rows = 1, 1.0, 20_000, 30_000
    skip = set(a.skip.split(",")) - {""}
    figures: list[dict[str, Any]] = []
    if "instructions" not in skip:
        figures += instructions(min(a.runs, 2), 20_000 if a.smoke else 100_000,
                                30 if a.smoke else 300)
    if "pool" not in skip:
        figures += pool_rates(a.runs, a.pool_rows, a.seconds, a.workers)
    if "memory" not in skip:
        figures += memory(a.memory_rows)
    finish("bench_shards", a, figures, started)


if __name__ == "__main__":
    main()
