"""The long form of the multi-process chaos test (tests/chaos/test_chaos.py): run until the
engine has granted at least ``--claims`` leases, SIGKILLing a random worker about once a second,
then run the same oracle and print the counts.

    .venv/bin/python bench/chaos_long.py                      # 10,000,000 claims
    .venv/bin/python bench/chaos_long.py --claims 200000      # a quick check
    .venv/bin/python bench/chaos_long.py --redis --seconds 600 --pools 3   # Redis, across hosts

``--redis`` runs the chaos across "hosts" instead (tests/lib/redis_chaos_lib.py, the long form of
tests/chaos/test_redis_chaos.py): ``--pools`` ``lanes pool --redis`` pools, each in its own process
group, on a redis-server of its own (unix socket, temporary directory), for ``--seconds``.

The worker, supervisor and oracle code lives in tests/lib/chaos_lib.py (imported from there, not
copied). Exit status 0 when every count that must be zero is zero. The workers' lease logs take
about 50 bytes per claim; they go to a temporary directory removed at the end (``--keep-logs``
keeps it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "lib"))

from chaos_lib import ChaosConfig, children_alive, run_chaos  # noqa: E402


def redis_main(a: argparse.Namespace) -> int:
    """The chaos across hosts on Redis for ``--seconds``; 0 when the oracle finds nothing."""
    from pool_testlib import running
    from redis_chaos_lib import RedisChaos, RedisChaosConfig
    from redis_server import RedisServer

    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    cfg = RedisChaosConfig(seconds=a.seconds, pools=a.pools, workers=a.workers // a.pools or 1,
                           rows=a.rows, lease_s=a.lease_s, adds=max(1, int(a.seconds // 60)),
                           seed=seed)
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="rl-chaos-logs-")
    print(f"chaos_long --redis: seed {seed}, {a.seconds:.0f} s, {cfg.pools} pools of"
          f" {cfg.workers} workers, {cfg.rows:,} rows, logs {log_dir}", flush=True)
    try:
        with RedisServer() as server:
            chaos = RedisChaos(cfg, server.url, f"rl-chaos-{uuid.uuid4().hex[:8]}", log_dir)
            res = chaos.run()
    finally:
        if not a.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    print(res.summary())
    left = running(chaos.seen)
    problems = res.problems() + (["processes left"] if left else [])
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claims", type=int, default=10_000_000, help="leases to grant in all")
    ap.add_argument("--max-seconds", type=float, default=3 * 3600.0, help="hard time limit")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=400_000, help="rows queued at the start")
    ap.add_argument("--kill-every", type=float, default=1.0, help="mean s between SIGKILLs")
    ap.add_argument("--lease-ms", type=int, nargs=2, default=(200, 500), metavar=("LO", "HI"))
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--log-dir", default=None, help="where the lease logs go (default: a tmp dir)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--redis", action="store_true", help="chaos across hosts on Redis instead")
    ap.add_argument("--seconds", type=float, default=600.0, help="with --redis: how long")
    ap.add_argument("--pools", type=int, default=3, help="with --redis: pools (hosts)")
    ap.add_argument("--lease-s", type=float, default=1.0, help="with --redis: the pools' lease")
    a = ap.parse_args(argv)
    if a.redis:
        if "--rows" not in (argv or sys.argv):
            a.rows = 120
        if "--workers" not in (argv or sys.argv):
            a.workers = 2 * a.pools
        return redis_main(a)

    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    cfg = ChaosConfig(
        seconds=None, claims=a.claims, max_seconds=a.max_seconds, workers=a.workers,
        rows=a.rows, capacity=max(1 << 16, 2 * a.rows), kill_every=a.kill_every,
        lease_ms=(a.lease_ms[0], a.lease_ms[1]), budgets=tuple(a.budgets), seed=seed,
        # throughput first: short holds, few overruns; the other mix as in the CI form
        p_hold=0.05, hold_ms=20, p_overrun=0.002, p_add=0.01)
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="rl-chaos-logs-")
    name = f"rl-chaos-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    print(f"chaos_long: seed {seed}, target {a.claims:,} claims, {a.workers} workers, "
          f"{a.rows:,} rows, segment {name}, logs {log_dir}", flush=True)
    t0 = time.monotonic()
    try:
        res = run_chaos(cfg, log_dir, name, progress=lambda m: print(m, flush=True))
    finally:
        if not a.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    print(res.summary())
    left = children_alive(res.pids)
    shm_left = os.path.exists(os.path.join("/dev/shm", name))
    print(f"\nclaims made {res.claims:,} (engine counted {res.engine_granted:,}) in "
          f"{res.seconds:.0f} s of chaos, {time.monotonic() - t0:.0f} s in all; "
          f"workers killed {res.workers_killed}; overlaps {res.overlaps}, lost {res.lost}, "
          f"stranded {res.stranded}; processes left {len(left)}, segment left {shm_left}")
    problems = res.problems() + (["processes left"] if left else []) + (
        ["segment left in /dev/shm"] if shm_left else [])
    for line in res.crash_logs:
        print(line)
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
