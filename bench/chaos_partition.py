"""The long form of the partition chaos (tests/chaos/test_partition_chaos.py): pools on hosts in
network namespaces, links cut at random, the partition oracle (tests/lib/partition_lib.py).

    .venv/bin/python bench/chaos_partition.py [--seconds 120] [--runs 1] [--hosts 3]
        [--rows N] [--lease 1.5] [--heartbeat 0.5] [--render 0.2] [--seed N]

Each run prints its summary (cuts, leases each pool found lost, rows rendered more than once,
problems); the exit status is 1 if any run found a problem. Needs root (ip netns).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "lib")]

from netns import unavailable  # noqa: E402
from partition_lib import Partitioned, partition_chaos  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None,
                    help="default: enough to outlast the chaos (a row renders once: an hour's"
                         " interval), 10 per host and second")
    ap.add_argument("--lease", type=float, default=1.5)
    ap.add_argument("--heartbeat", type=float, default=0.5)
    ap.add_argument("--render", type=float, default=0.2, help="seconds per render")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"skipped: {why}")
    bad = 0
    for i in range(args.runs):
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        rows = args.rows or int(10 * args.hosts * args.seconds)
        with Partitioned(hosts=args.hosts, rows=rows, lease_s=args.lease,
                         heartbeat_s=args.heartbeat, render_s=args.render) as run:
            res = partition_chaos(run, args.seconds, seed)
            renders = len(run.renders())
        print(f"run {i + 1}: {renders} renders; {res.summary()}", flush=True)
        bad += bool(res.problems)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
