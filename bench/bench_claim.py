"""Claim-engine figures: claim latency, claim + complete throughput, merge time, bytes per row.

    .venv/bin/python bench/bench_claim.py [--rows 1600000] [--rounds 5] [--seconds 1.5]

A benchmark, not a test: it prints medians and ratios measured side by side in one run (the
machine is shared and noisy). Corpus: 1.6M rows over the 10 lanes of the default policy, due
3 to 30 days ago, window 140. Baseline for the ratio: a binary heap of
(key, row) in pure Python (heapq), the queue a Python shop would otherwise write, doing the same
claim-16 / reschedule-16 cycle in one process.
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from engine import Engine, LanePolicy
from engine.keys import STRIDE
from engine.segment import ffi, lib

NOW = 1_800_000_000_000
DAY_MS = 86_400_000
BUDGET = 16


def corpus(n: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    due = NOW - rng.integers(3 * DAY_MS, 30 * DAY_MS, n)
    interval = rng.choice(np.array([1800, 3600 * 4, 3600 * 12, 3600 * 48]), n)
    prov = rng.integers(0, 2, n)
    failures = np.where(rng.random(n) < 0.02, 5, 0)
    return due, interval, prov, failures


def build(name: str, n: int) -> Engine:
    eng = Engine.create(name, capacity=n, policy=LanePolicy())
    due, interval, prov, failures = corpus(n)
    eng.add_many(due, interval, prov, failures)
    eng.compact()
    return eng


def claim_latency(eng: Engine, rounds: int, per_round: int = 3000) -> dict[str, float]:
    """Median µs per claim(budget=16) through the public API, and the bare C pass beside it.

    Each claim's rows are completed at once (untimed), as a worker would, so the rows in flight
    stay at one batch.
    """
    api, bare = [], []
    clock = time.perf_counter_ns
    out = ffi.new("int64_t[]", 4 * BUDGET)
    ok = ffi.new("uint8_t[]", BUDGET)
    advice = ffi.new("uint32_t *")
    owner = eng._seg.owner
    h = eng._seg.handle
    for _ in range(rounds):
        t_api = 0
        for _ in range(per_round):
            t0 = clock()
            b = eng.claim(budget=BUDGET, now_ms=NOW)
            t_api += clock() - t0
            eng.complete_many(b.rows, b.tokens, now_ms=NOW)
        api.append(t_api / per_round / 1000)
        t_bare = 0
        for _ in range(per_round):
            t0 = clock()
            n = lib.rl_claim(h, owner, BUDGET, NOW, 30_000, 140, out, advice)
            t_bare += clock() - t0
            lib.rl_complete_many(h, owner, n, out, out + 3 * BUDGET, ffi.NULL, NOW, ok, advice)
            if advice[0]:
                eng.compact()
        bare.append(t_bare / per_round / 1000)
    return {"api_us": statistics.median(api), "bare_us": statistics.median(bare)}


def _worker(name: str, seconds: float, q: mp.Queue) -> None:  # type: ignore[type-arg]
    """Claim 16, complete them (rescheduled at now + interval, as a render pool does), for
    `seconds`; report rows and time."""
    eng = Engine.attach(name)
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(200):
            b = eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=600_000)
            if len(b):
                done += int(eng.complete_many(b.rows, b.tokens, now_ms=NOW).sum())
    q.put((done, time.perf_counter() - t0))
    eng.close()


def throughput(rows: int, procs: int, seconds: float) -> float:
    """Rows per second claimed and completed, per process, by `procs` forked workers on a fresh
    engine (short enough that the due backlog never runs out; merges happen as they would)."""
    name = f"rl-bench-tp-{os.getpid()}"
    eng = build(name, rows)
    try:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        ps = [ctx.Process(target=_worker, args=(name, seconds, q)) for _ in range(procs)]
        for p in ps:
            p.start()
        results = [q.get() for _ in ps]
        for p in ps:
            p.join()
    finally:
        eng.close()
        eng.unlink()
    return statistics.mean(done / secs for done, secs in results)


def merge_ms(eng: Engine, writes: int) -> dict[str, float]:
    """Time to merge `writes` recent writes into the 1.6M-entry index, and a full rebuild."""
    b = eng.claim(budget=min(writes, 65536), now_ms=NOW, lease_ms=600_000)
    eng.complete_many(b.rows, b.tokens, now_ms=NOW)  # lands in the ring
    pending = eng.stats(NOW)["ring"]["pending"]
    t0 = time.perf_counter()
    eng.compact()
    merge = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    eng.compact(full=True)
    rebuild = (time.perf_counter() - t0) * 1000
    return {"pending": pending, "merge_ms": merge, "rebuild_ms": rebuild}


def heap_baseline(n: int, cycles: int) -> float:
    """µs per claim-16 + reschedule-16 cycle of a heapq queue (one process, no leases)."""
    due, interval, prov, _ = corpus(n)
    lanes = 1 + prov * 4
    heap = list(zip((lanes * STRIDE + due).tolist(), range(n)))
    heapq.heapify(heap)
    iv = (interval * 1000).tolist()
    t0 = time.perf_counter_ns()
    for _ in range(cycles):
        got = [heapq.heappop(heap) for _ in range(BUDGET)]
        for key, row in got:
            heapq.heappush(heap, (key + iv[row], row))
    return (time.perf_counter_ns() - t0) / cycles / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_600_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.6, help="per throughput measurement")
    args = ap.parse_args()
    name = f"rl-bench-{os.getpid()}"
    t0 = time.perf_counter()
    eng = build(name, args.rows)
    build_s = time.perf_counter() - t0
    try:
        st = eng.stats(NOW)
        print(f"corpus: {st['rows']:,} rows over {len(st['lanes'])} lanes, "
              f"{sum(lane['due'] for lane in st['lanes']):,} due, built in {build_s:.2f} s")
        print(f"shared memory: {st['bytes'] / args.rows:.1f} bytes per row "
              f"({st['bytes'] / 2**20:.1f} MiB)")
        lat = claim_latency(eng, args.rounds)
        print(f"claim(budget=16), window 140: median {lat['api_us']:.2f} µs through the API, "
              f"{lat['bare_us']:.2f} µs for the bare C pass")
        heap_us = heap_baseline(args.rows, 20_000)
        # alternate 1 and 2 processes, three times each, and quote the medians
        runs: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(3):
            for procs in (1, 2):
                runs[procs].append(throughput(args.rows, procs, args.seconds))
        tp1, tp2 = statistics.median(runs[1]), statistics.median(runs[2])
        print(f"claim + complete_many, budget 16 (median of 3 x {args.seconds:g} s): "
              f"{tp1:,.0f} rows/s with 1 process; {tp2:,.0f} rows/s per process with 2 "
              f"({2 * tp2:,.0f} total, {2 * tp2 / tp1:.2f}x one process)")
        print(f"heapq baseline (one process, no leases, no lanes): {BUDGET / heap_us * 1e6:,.0f}"
              f" rows/s; render-lanes/heapq = {tp1 / (BUDGET / heap_us * 1e6):.1f}x")
        m = merge_ms(eng, 65_536)
        print(f"merge of {m['pending']:,} recent writes into the index: {m['merge_ms']:.1f} ms; "
              f"full rebuild from the row table: {m['rebuild_ms']:.1f} ms")
        problems = eng.verify()
        print("verify:", "clean" if not problems else problems[:3])
    finally:
        eng.close()
        eng.unlink()


if __name__ == "__main__":
    main()
