"""Memory per row of a Redis queue (docs/redis.md), and what a claim costs beside many rows in
flight. Starts its own redis-server on a unix socket (tests/lib/redis_server.py), default settings.

    .venv/bin/python bench/bench_redis_memory.py [--rows 100000 1000000]

Prints used_memory per row after add_many of N rows (random lanes and due times) and the median
time of a claim of 16 rows with none and with 10,000 rows leased.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "lib")]

import redis  # noqa: E402
from redis_server import RedisServer  # noqa: E402

from engine import Engine  # noqa: E402

NOW = 1_800_000_000_000
DAY = 86_400_000


def per_row(n: int) -> float:
    with RedisServer() as srv:
        r = redis.Redis(unix_socket_path=srv.socket)
        base = r.info("memory")["used_memory"]
        with Engine.connect(srv.url, "mem", create=True) as eng:
            rng = np.random.default_rng(1)
            eng.add_many(NOW + rng.integers(-DAY, DAY, n),
                         rng.choice(np.array([600, 7200, 43200, 172800]), n),
                         rng.integers(0, 2, n), np.where(rng.random(n) < 0.05, 3, 0))
            used = r.info("memory")["used_memory"] - base
        r.close()
    return used / n


def claim_cost() -> tuple[float, float]:
    with RedisServer() as srv:
        out = []
        for leased in (0, 10_000):
            with Engine.connect(srv.url, f"c{leased}", create=True) as eng:
                eng.add_many(np.full(100_000, NOW - DAY), 600)
                if leased:
                    eng.claim(budget=leased, now_ms=NOW, lease_ms=DAY, window=leased)
                times = []
                for _ in range(300):
                    t0 = time.perf_counter()
                    c = eng.claim(budget=16, now_ms=NOW, lease_ms=DAY)
                    times.append(time.perf_counter() - t0)
                    eng.release_many(c.rows, c.tokens, now_ms=NOW)
                out.append(statistics.median(times))
        return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[100_000, 1_000_000])
    args = ap.parse_args()
    for n in args.rows:
        print(f"{n:>9,} rows: {per_row(n):6.1f} bytes per row (used_memory)")
    idle, busy = claim_cost()
    print(f"claim of 16 beside 100k queued: {idle * 1e6:.0f} us with none leased, "
          f"{busy * 1e6:.0f} us with 10,000 leased")


if __name__ == "__main__":
    main()
