"""The engine's own figures: claim latency by budget and size, claim + complete throughput by
process count, merge, add_many, bytes per row, worker memory.

    .venv/bin/python bench/bench_engine.py [--smoke] [--out FILE] [--only PARTS] [--sizes N,...]

Corpus: rows over the 10 lanes of the default policy, due 3 to 30 days ago (so everything is
due), window 140. A claim's rows are completed at once (untimed) as a worker would, rescheduled
to now + interval, so the rows in flight stay at one batch; an engine is rebuilt before it runs
out of due rows. Latency is the median over rounds of the mean µs per claim in a round.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from common import BUDGET, NOW, Slot, drop, figure, finish, new_engine, parse_args, run_clients

from engine import Engine
from engine.shm.segment import ffi, lib

FULL = {"sizes": (10_000, 100_000, 1_600_000, 16_000_000), "budgets": (1, 16, 64),
        "rounds": 5, "per_round": 2000, "tp_rows": 1_600_000, "tp_runs": 3, "tp_seconds": 0.6,
        "procs": (1, 2, 8), "merge_sizes": (1_600_000, 16_000_000), "merge_writes": 65_536,
        "merge_rounds": 3, "add_rows": 1_600_000}
SMOKE = {"sizes": (10_000,), "budgets": (1, 16, 64), "rounds": 2, "per_round": 50,
         "tp_rows": 20_000, "tp_runs": 1, "tp_seconds": 0.1, "procs": (1, 2, 8),
         "merge_sizes": (20_000,), "merge_writes": 2_000, "merge_rounds": 1, "add_rows": 20_000}


def size_label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"


def claim_latency(n: int, budget: int, rounds: int, per_round: int, bare: bool = False
                  ) -> list[float]:
    """µs per claim(budget) through the public API (or the bare cffi call), one value a round."""
    fresh = Slot("eng", n)
    per_round = max(1, min(per_round, n // (4 * budget)))
    out_buf = ffi.new("int64_t[]", 4 * budget)
    ok = ffi.new("uint8_t[]", budget)
    advice = ffi.new("uint32_t *")
    clock = time.perf_counter_ns
    vals = []
    try:
        for _ in range(rounds):
            eng = fresh.get(per_round * budget)
            t = 0
            if not bare:
                for _ in range(per_round):
                    t0 = clock()
                    b = eng.claim(budget=budget, now_ms=NOW)
                    t += clock() - t0
                    eng.complete_many(b.rows, b.tokens, now_ms=NOW)
            else:
                h, owner = eng._seg.handle, eng._seg.owner
                for _ in range(per_round):
                    t0 = clock()
                    got = lib.rl_claim(h, owner, budget, NOW, 30_000, 140, out_buf, advice)
                    t += clock() - t0
                    lib.rl_complete_many(h, owner, got, out_buf, out_buf + 3 * budget, ffi.NULL,
                                         NOW, ok, advice)
                    if advice[0]:
                        eng.compact()
            vals.append(t / per_round / 1000)
    finally:
        fresh.close()
    return vals


def throughput(n: int, procs: int, seconds: float, separate: bool = False) -> dict[str, Any]:
    """claim(16) + complete_many rows/s with `procs` forked workers on a fresh engine (or, with
    `separate`, each on an engine of its own: what the machine gives that many processes that
    share nothing, for comparison)."""
    engs = [new_engine("tp", n) for _ in range(procs if separate else 1)]
    names = [e.name for e in engs]
    try:
        def setup(i: int) -> Engine:
            return Engine.attach(names[i % len(names)])

        def step(e: Engine) -> int:
            b = e.claim(budget=BUDGET, now_ms=NOW, lease_ms=600_000)
            return np.count_nonzero(e.complete_many(b.rows, b.tokens, now_ms=NOW)) if len(b) else 0

        return run_clients(procs, seconds, setup, step, lambda e: e.close(),
                           quota=n // (2 * (procs // len(names))))  # half of each engine
    finally:
        for e in engs:
            drop(e)


def merge(n: int, writes: int, rounds: int) -> tuple[list[float], list[float], float]:
    """ms to merge `writes` recent writes (completions) into an n-entry index; ms for a full
    rebuild from the row table; bytes of shared memory per row."""
    eng = new_engine("merge", n)
    merges, rebuilds = [], []
    try:
        bpr = eng.stats(NOW)["bytes"] / n
        for _ in range(rounds):
            b = eng.claim(budget=writes, now_ms=NOW, lease_ms=600_000)
            eng.complete_many(b.rows, b.tokens, now_ms=NOW)  # lands in the ring
            t0 = time.perf_counter()
            eng.compact()
            merges.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            eng.compact(full=True)
            rebuilds.append((time.perf_counter() - t0) * 1000)
        problems = eng.verify()
        if problems:
            raise RuntimeError(f"verify after merges: {problems[:3]}")
    finally:
        drop(eng)
    return merges, rebuilds, bpr


def add_rate(n: int, rounds: int) -> list[float]:
    """add_many rows/s into an empty engine of capacity n (one call of n rows; a batch larger
    than the ring is published by a full index rebuild inside the call)."""
    from common import corpus
    rows = corpus(n)
    vals = []
    for _ in range(rounds):
        eng = new_engine("add", 0, capacity=n, rows=(rows[0][:0],) * 4)
        try:
            t0 = time.perf_counter()
            eng.add_many(*rows)
            vals.append(n / (time.perf_counter() - t0))
        finally:
            drop(eng)
    return vals


PARTS = ("latency", "throughput", "merge", "add")


def options(ap: Any) -> None:
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all): {', '.join(PARTS)}")
    ap.add_argument("--sizes", help="comma-separated row counts for the latency part "
                    "(default: the configured sizes)")


def main() -> None:
    args = parse_args(__doc__, options)
    started = time.perf_counter()
    c = dict(SMOKE if args.smoke else FULL)
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    if only - set(PARTS):
        raise SystemExit(f"--only: unknown part(s) {sorted(only - set(PARTS))}; known: {PARTS}")
    if args.sizes:
        c["sizes"] = tuple(int(x) for x in args.sizes.split(","))
    if "latency" not in only:
        c["sizes"] = ()
    if "throughput" not in only:
        c["tp_runs"] = 0
    if "merge" not in only:
        c["merge_sizes"] = ()
    figs: list[dict[str, Any]] = []
    for n in c["sizes"]:
        for b in c["budgets"]:
            vals = claim_latency(n, b, c["rounds"], c["per_round"])
            figs.append(figure(f"engine.claim_us.b{b}.n{n}",
                               f"claim({b}) at {size_label(n)} rows, API", "µs", vals))
            print(figs[-1]["label"], f"{figs[-1]['median']:.2f} µs", flush=True)
    if c["sizes"]:
        n_ref = 1_600_000 if 1_600_000 in c["sizes"] else c["sizes"][-1]
        vals = claim_latency(n_ref, BUDGET, c["rounds"], c["per_round"], bare=True)
        figs.append(figure(f"engine.claim_bare_us.b16.n{n_ref}",
                           f"claim(16) at {size_label(n_ref)} rows, bare cffi call", "µs", vals))

    runs: dict[int, list[dict[str, Any]]] = {p: [] for p in c["procs"]}
    apart: list[dict[str, Any]] = []  # 2 processes, an engine each: the machine's own scaling
    for _ in range(c["tp_runs"]):  # alternate process counts, so drift hits all alike
        for p in c["procs"]:
            runs[p].append(throughput(c["tp_rows"], p, c["tp_seconds"]))
            if p == 2:
                apart.append(throughput(c["tp_rows"], 2, c["tp_seconds"], separate=True))
    one = [r["total"] for r in runs[c["procs"][0]]]
    for p in c["procs"] if c["tp_runs"] else ():
        figs.append(figure(f"engine.cycle_rows_s.p{p}.per_proc",
                           f"claim(16) + complete_many, {p} proc, per process", "rows/s",
                           [r["per_proc"] for r in runs[p]], better="higher"))
        figs.append(figure(f"engine.cycle_rows_s.p{p}.total",
                           f"claim(16) + complete_many, {p} proc, total", "rows/s",
                           [r["total"] for r in runs[p]], better="higher"))
        if p > 1:
            figs.append(figure(f"engine.cycle_scaling.p{p}", f"{p} proc total / 1 proc", "x",
                               [t / o for t, o in zip((r["total"] for r in runs[p]), one,
                                                      strict=True)],
                               better="higher"))
        if p == 2 and apart:
            figs.append(figure("engine.cycle_rows_s.p2.apart",
                               "claim(16) + complete_many, 2 proc on an engine each, total",
                               "rows/s", [r["total"] for r in apart], better="higher"))
            figs.append(figure("engine.cycle_sharing.p2",
                               "2 proc sharing one engine / 2 proc on an engine each", "x",
                               [r["total"] / a["total"]
                                for r, a in zip(runs[2], apart, strict=True)],
                               better="higher"))
        figs.append(figure(f"engine.worker_peak_rss_mib.p{p}",
                           f"peak RSS per worker ({p} proc; shared segment pages included)",
                           "MiB", [r["peak_rss_mib"] for r in runs[p]]))
        figs.append(figure(f"engine.worker_uss_mib.p{p}",
                           f"memory unique to a worker ({p} proc, USS)", "MiB",
                           [r["uss_mib"] for r in runs[p]]))

    for n in c["merge_sizes"]:
        merges, rebuilds, bpr = merge(n, c["merge_writes"], c["merge_rounds"])
        w = c["merge_writes"]
        figs.append(figure(f"engine.merge_ms.n{n}",
                           f"merge of {w:,} recent writes into {size_label(n)} index", "ms",
                           merges))
        figs.append(figure(f"engine.rebuild_ms.n{n}",
                           f"full index rebuild at {size_label(n)} rows", "ms", rebuilds))
        figs.append(figure(f"engine.bytes_per_row.n{n}",
                           f"shared memory per row at {size_label(n)}", "bytes", [bpr]))
    if "add" in only:
        figs.append(figure(f"engine.add_many_rows_s.n{c['add_rows']}",
                           f"add_many of {size_label(c['add_rows'])} rows", "rows/s",
                           add_rate(c["add_rows"], c["merge_rounds"]), better="higher"))
    finish("bench_engine", args, figs, started)


if __name__ == "__main__":
    main()
