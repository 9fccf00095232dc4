"""What a Python shop would write instead, beside the engine, in the same run.

    .venv/bin/python bench/bench_python_peers.py [--smoke] [--out FILE]

Every system runs the same worker cycle — claim up to 16 due rows with a lease, complete them
rescheduled to now + interval — in 1 and 2 forked processes on the same corpus (the engine's
keys, lane * 2**42 + due_ms, over the default policy's lanes), and reports rows/s summed over
the processes. Runs alternate between systems, so drift on the shared machine hits all alike.

* numpy + Lock: one sorted key array and its row ids in shared memory (mp.RawArray), a row
  table of current keys, lease expiries and tokens beside it, every claim and complete under one
  multiprocessing.Lock. A claim walks lanes in order: searchsorted from the lane's floor, then
  windows of 140 entries checked in one vectorised step each (due, still the row's key, lease
  free) until the budget is met or a window had live rows, leases written, the floor raised to
  the first live entry (past the stale ones when there is none; without that, a floor left on a
  row another process completed later strands the lane — the first version did exactly that).
  Completions rewrite the row's key and leave the old entry stale (as the engine's index does);
  the new, future keys are not merged back — a simplification in numpy's favour, fine while
  the backlog lasts.
* heapq behind a Manager: a heap of (key, row) in a manager process, claim pops up to 16 due
  entries and records leases, complete pushes the rows back at their new keys; every call is
  one round trip to the manager. No lease expiry (a popped row is gone until completed).
Neither applies the engine's share policy (lane order only).
"""

from __future__ import annotations

import heapq
import multiprocessing as mp
import time
from multiprocessing.managers import BaseManager
from typing import Any

import numpy as np
from common import (
    BUDGET,
    LANES,
    NOW,
    corpus_keys,
    drop,
    figure,
    finish,
    new_engine,
    on_exit,
    parse_args,
    ratios,
    run_clients,
)

from engine import STRIDE, Engine

FULL = {"rows": 1_600_000, "runs": 3, "seconds": 1.0, "procs": (1, 2)}
SMOKE = {"rows": 20_000, "runs": 1, "seconds": 0.1, "procs": (1, 2)}
LEASE_MS = 600_000
WINDOW = 140
MAX_CHUNKS = 30  # like the engine's cap on stale entries read per lane and pass


# --------------------------------------------------------------------------- numpy + Lock ----

class NumpyQueue:
    """Shared arrays, one lock. Built before the fork; the workers share it."""

    def __init__(self, keys: np.ndarray, interval_ms: np.ndarray) -> None:
        n = len(keys)
        order = np.argsort(keys, kind="stable")

        def shared(dtype: Any, init: np.ndarray) -> np.ndarray:
            raw = mp.RawArray("b", max(1, init.nbytes))
            arr = np.frombuffer(raw, dtype=dtype, count=len(init))
            arr[:] = init
            return arr

        self.ikeys = shared(np.int64, keys[order])
        self.irows = shared(np.int64, order.astype(np.int64))
        self.rowkey = shared(np.int64, keys)
        self.lease = shared(np.int64, np.zeros(n, np.int64))
        self.token = shared(np.int64, np.zeros(n, np.int64))
        self.interval = shared(np.int64, interval_ms)
        self.floor = shared(np.int64, np.arange(LANES, dtype=np.int64) * STRIDE)
        self.lock = mp.get_context("fork").Lock()

    def claim(self, budget: int, now: int) -> tuple[np.ndarray, np.ndarray]:
        rows_out, toks_out = [], []
        need = budget
        with self.lock:
            for lane in range(LANES):
                lo = int(np.searchsorted(self.ikeys, self.floor[lane]))
                limit = lane * STRIDE + now
                first_live = None
                for _ in range(MAX_CHUNKS):  # stale entries do not use up the window
                    keys = self.ikeys[lo: lo + WINDOW]
                    rows = self.irows[lo: lo + WINDOW]
                    if not len(keys) or keys[0] > limit:
                        break
                    live = (keys <= limit) & (self.rowkey[rows] == keys)
                    if first_live is None and live.any():
                        first_live = keys[int(np.argmax(live))]
                    ok = np.flatnonzero(live & (self.lease[rows] < now))[:need]
                    if len(ok):
                        got = rows[ok]
                        self.lease[got] = now + LEASE_MS
                        self.token[got] += 1
                        rows_out.append(got)
                        toks_out.append(self.token[got].copy())
                        need -= len(ok)
                    if need == 0 or live.sum() > len(ok):  # window of live rows read: stop
                        break
                    lo += WINDOW
                # the first live row holds the floor (a leased one too); none seen: past them
                if first_live is not None:
                    self.floor[lane] = first_live
                elif lo > 0 and lo <= len(self.ikeys) and self.ikeys[lo - 1] // STRIDE == lane:
                    self.floor[lane] = self.ikeys[lo - 1]
                if need == 0:
                    break
        if not rows_out:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(rows_out), np.concatenate(toks_out)

    def complete(self, rows: np.ndarray, tokens: np.ndarray, now: int) -> int:
        with self.lock:
            mine = rows[self.token[rows] == tokens]
            lane = self.rowkey[mine] // STRIDE
            self.rowkey[mine] = lane * STRIDE + now + self.interval[mine]
            self.lease[mine] = 0
            self.token[mine] += 1
        return len(mine)


# ------------------------------------------------------------------- heapq behind a Manager ----

class HeapQueue:
    """Lives in the manager process; every method call is a round trip."""

    def __init__(self, keys: list[int], interval_ms: list[int]) -> None:
        self.heap = list(zip(keys, range(len(keys)), strict=True))
        heapq.heapify(self.heap)
        self.interval = interval_ms
        self.key = list(keys)
        self.leases: dict[int, tuple[int, int]] = {}
        self.tok = 0

    def claim(self, budget: int, now: int) -> list[tuple[int, int]]:
        out = []
        while self.heap and len(out) < budget:
            key, row = self.heap[0]
            if key % STRIDE > now:  # lane order first: a not-yet-due head ends the claim
                break
            heapq.heappop(self.heap)
            self.tok += 1
            self.leases[row] = (now + LEASE_MS, self.tok)
            out.append((row, self.tok))
        return out

    def complete(self, done: list[tuple[int, int]], now: int) -> int:
        n = 0
        for row, tok in done:
            if self.leases.get(row, (0, -1))[1] != tok:
                continue
            del self.leases[row]
            key = (self.key[row] // STRIDE) * STRIDE + now + self.interval[row]
            self.key[row] = key
            heapq.heappush(self.heap, (key, row))
            n += 1
        return n


class _Manager(BaseManager):
    pass


_Manager.register("HeapQueue", HeapQueue)


# ---------------------------------------------------------------------------------- runs ----

def run_engine(n: int, procs: int, seconds: float) -> float:
    eng = new_engine("pyp", n)
    name = eng.name
    try:
        def step(e: Engine) -> int:
            b = e.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)
            return int(e.complete_many(b.rows, b.tokens, now_ms=NOW).sum()) if len(b) else 0

        return float(run_clients(procs, seconds, lambda i: Engine.attach(name), step,
                                 lambda e: e.close(), quota=n // (2 * procs))["total"])
    finally:
        drop(eng)


def run_numpy(keys: np.ndarray, interval: np.ndarray, procs: int, seconds: float) -> float:
    q = NumpyQueue(keys, interval)

    def step(q: NumpyQueue) -> int:
        rows, toks = q.claim(BUDGET, NOW)
        return q.complete(rows, toks, NOW) if len(rows) else 0

    return float(run_clients(procs, seconds, lambda i: q, step,
                             quota=len(keys) // (2 * procs))["total"])


def run_heapq(mgr: Any, keys: list[int], interval: list[int], procs: int,
              seconds: float) -> float:
    queue = mgr.HeapQueue(keys, interval)  # released in the manager when the proxy goes

    def setup(i: int) -> Any:
        queue._connect()  # a connection of this worker's own to the manager
        return queue

    def step(q: Any) -> int:
        got = q.claim(BUDGET, NOW)
        return int(q.complete(got, NOW)) if got else 0

    return float(run_clients(procs, seconds, setup, step,
                             quota=len(keys) // (2 * procs))["total"])


def main() -> None:
    args = parse_args(__doc__)
    started = time.perf_counter()
    c = SMOKE if args.smoke else FULL
    keys, interval = corpus_keys(c["rows"])
    keys_l, interval_l = keys.tolist(), interval.tolist()
    mgr = _Manager(ctx=mp.get_context("fork"))
    mgr.start()
    on_exit(mgr.shutdown)
    res: dict[tuple[str, int], list[float]] = {}
    for _ in range(c["runs"]):
        for p in c["procs"]:
            res.setdefault(("engine", p), []).append(run_engine(c["rows"], p, c["seconds"]))
            res.setdefault(("numpy", p), []).append(run_numpy(keys, interval, p, c["seconds"]))
            res.setdefault(("heapq", p), []).append(
                run_heapq(mgr, keys_l, interval_l, p, c["seconds"]))
    figs = []
    names = {"engine": "render-lanes", "numpy": "numpy searchsorted + Lock",
             "heapq": "heapq behind a Manager"}
    rows = f"{c['rows'] / 1e6:g}M" if c["rows"] >= 1e6 else f"{c['rows'] // 1000}k"
    for p in c["procs"]:
        for sys_ in ("engine", "numpy", "heapq"):
            figs.append(figure(f"pypeers.{sys_}.p{p}", f"{names[sys_]}, {p} proc, {rows} rows: "
                               "claim(16) + complete", "rows/s", res[(sys_, p)], better="higher"))
        for sys_ in ("numpy", "heapq"):
            figs.append(figure(f"pypeers.ratio_{sys_}.p{p}", f"render-lanes / {names[sys_]}, "
                               f"{p} proc", "x", ratios(res[("engine", p)], res[(sys_, p)]),
                               better="higher"))
    finish("bench_python_peers", args, figs, started)


if __name__ == "__main__":
    main()
