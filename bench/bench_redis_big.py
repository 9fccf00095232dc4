"""A big Redis queue read whole: ``verify()`` and ``save()`` by chunks, against the one
MULTI/EXEC read (``dump()``: the whole queue in one transaction, as verify and save read it
before they read by chunks). docs/redis.md "Big queues" quotes it.

    .venv/bin/python bench/bench_redis_big.py [--rows 1000000 3000000] [--repeat 3] [--smoke]

For each size: a redis-server of its own (unix socket, default settings), N rows added
(random lanes and due times, as bench_redis_memory.py), 10,000 of them in flight. Then each
read runs in a fresh child process (so that its peak RSS is its own), ``--repeat`` times,
alternating: wall time, how much the child's RSS grew during the read (sampled), and
the server's memory above its level before the read (``used_memory``, sampled every 5 ms by
the parent: output buffers included), plus ``used_memory_peak`` at the end of the size.
Medians and [min .. max] are printed (a read that failed, e.g. a reply slower than redis-py's
socket timeout, is counted with its time and named), and the whole as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "lib")]

import redis  # noqa: E402
from redis_server import RedisServer  # noqa: E402

from engine import Engine  # noqa: E402
from engine.errors import EngineError  # noqa: E402

NOW = 1_800_000_000_000
DAY = 86_400_000
READS = ("verify", "save", "dump")


def child(url: str, op: str) -> None:
    """One read in this process; prints {seconds, rss_mib, base_mib}: the most its RSS grew
    during the read (sampled every 5 ms by a thread), and its RSS before the read (imports,
    connection). ru_maxrss would hide the read under the imports' transient peak."""
    me = psutil.Process()
    eng = Engine.connect(url, "big")
    base = me.memory_info().rss
    top = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            top[0] = max(top[0], me.memory_info().rss)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    t0 = time.perf_counter()
    error = ""
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as d:
        try:
            if op == "verify":
                problems = eng.verify()
                assert problems == [], problems[:5]
            elif op == "save":
                eng.save(Path(d) / "big.npz")
            else:
                eng.dump()
        except EngineError as e:  # e.g. a reply slower than redis-py's socket timeout
            error = str(e)
        seconds = time.perf_counter() - t0
    done.set()
    w.join(timeout=1)
    eng.close()
    print(json.dumps({"seconds": seconds, "rss_mib": (top[0] - base) / 2**20,
                      "base_mib": base / 2**20, "error": error}))


def fill(srv: RedisServer, n: int) -> float:
    t0 = time.perf_counter()
    with Engine.connect(srv.url, "big", create=True) as eng:
        rng = np.random.default_rng(1)
        for start in range(0, n, 1_000_000):
            k = min(n, start + 1_000_000) - start
            eng.add_many(NOW + rng.integers(-DAY, DAY, k),
                         rng.choice(np.array([600, 7200, 43200, 172800]), k),
                         rng.integers(0, 2, k), np.where(rng.random(k) < 0.05, 3, 0))
        eng.claim(budget=10_000, now_ms=NOW + DAY, lease_ms=DAY, window=10_000)
    return time.perf_counter() - t0


def measure(srv: RedisServer, op: str) -> dict[str, float]:
    r = redis.Redis(unix_socket_path=srv.socket)
    base = r.info("memory")["used_memory"]
    top = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            top[0] = max(top[0], r.info("memory")["used_memory"])

    w = threading.Thread(target=watch)
    w.start()
    try:
        out = subprocess.run([sys.executable, __file__, "--child", srv.url, op], check=True,
                             capture_output=True, text=True, timeout=1800).stdout
    finally:
        done.set()
        w.join()
        r.close()
    got = json.loads(out.strip().splitlines()[-1])
    return {**got, "server_mib": (top[0] - base) / 2**20}


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def run(n: int, repeat: int) -> dict[str, Any]:
    with RedisServer(prefix="rl-bench-") as srv:
        filled = fill(srv, n)
        r = redis.Redis(unix_socket_path=srv.socket)
        used = r.info("memory")["used_memory"]
        runs: dict[str, list[dict[str, float]]] = {op: [] for op in READS}
        for _ in range(repeat):
            for op in READS:
                runs[op].append(measure(srv, op))
        peak = r.info("memory")["used_memory_peak"]
        r.close()
    out: dict[str, Any] = {"rows": n, "fill_s": filled, "used_memory_mib": used / 2**20,
                           "used_memory_peak_mib": peak / 2**20}
    for op, rs in runs.items():
        out[op] = {k: summary([x[k] for x in rs])
                   for k in ("seconds", "rss_mib", "base_mib", "server_mib")}
        out[op]["errors"] = [x["error"] for x in rs if x["error"]]
    return out


def show(res: dict[str, Any]) -> None:
    print(f"\n{res['rows']:,} rows (filled in {res['fill_s']:.0f} s): used_memory "
          f"{res['used_memory_mib']:.0f} MiB, used_memory_peak {res['used_memory_peak_mib']:.0f}"
          " MiB")
    base = statistics.median(res["verify"]["base_mib"]["values"])
    print(f"{'read':8} {'seconds':>22} {'client RSS + MiB':>26} {'server + MiB':>22}"
          f"   (a child's RSS before its read: {base:.0f} MiB)")
    for op in READS:
        cells = []
        for k in ("seconds", "rss_mib", "server_mib"):
            s = res[op][k]
            cells.append(f"{s['median']:.1f} [{s['min']:.1f} .. {s['max']:.1f}]")
        failed = res[op]["errors"]
        note = f"   {len(failed)} failed: {failed[0][:120]}" if failed else ""
        print(f"{op:8} {cells[0]:>22} {cells[1]:>26} {cells[2]:>22}{note}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        sys.stdout.flush()
        os._exit(0)  # nothing left to wait for (a stray thread never holds the parent up)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 3_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="20,000 rows, one round")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    sizes, repeat = ([20_000], 1) if args.smoke else (args.rows, args.repeat)
    results = []
    for n in sizes:
        results.append(run(n, repeat))
        show(results[-1])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
