"""How long a dead host's rows wait: from a host's SIGKILL (its pool, every process) to its
leases being gone, so that its rows are claimable elsewhere; by lease expiry alone (heartbeats
off) and with heartbeats (engine/pool/heartbeat.py), alternated in one run.
docs/redis.md "Heartbeats" quotes it.

    .venv/bin/python bench/bench_dead_host.py [--lease 10] [--heartbeat 1] [--repeat 3]

Two hosts (network namespaces, tests/lib/partition_lib.py: needs root) run ``lanes pool
--redis`` on one queue; once both render, host A is killed whole (``kill_host``) and the
queue's ``stats()["owners"]`` is read every 20 ms until no owner of host A holds a live lease.
Prints each time, then the median and [min .. max] of each mode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "lib")]

from netns import unavailable  # noqa: E402
from partition_lib import Partitioned, owners_of  # noqa: E402

from engine.pool.heartbeat import TTL_PERIODS  # noqa: E402


def once(lease_s: float, heartbeat_s: float) -> float:
    """Seconds from host A's death to its last live lease gone."""
    with Partitioned(hosts=2, rows=400, lease_s=lease_s, heartbeat_s=heartbeat_s,
                     render_s=0.3) as run:
        a, b = run.start(0), run.start(1)
        run.wait(lambda: len(run.rendered_by(a)) >= 4 and len(run.rendered_by(b)) >= 4, 90)
        killed = time.monotonic()
        run.kill(a)  # notes A's processes, then kills them all at once
        while owners_of(run, a):
            time.sleep(0.02)
        return time.monotonic() - killed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lease", type=float, default=10.0)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"skipped: {why}")
    got: dict[str, list[float]] = {"lease expiry": [], "heartbeats": []}
    for i in range(args.repeat):
        for mode, hb in (("lease expiry", 0.0), ("heartbeats", args.heartbeat)):
            t = once(args.lease, hb)
            got[mode].append(t)
            print(f"round {i + 1}, {mode:12}: rows claimable {t:.2f} s after the SIGKILL",
                  flush=True)
    print(f"\nlease {args.lease:g} s, heartbeat {args.heartbeat:g} s (TTL "
          f"{TTL_PERIODS * args.heartbeat:g} s):")
    for mode, ts in got.items():
        print(f"  {mode:12}: {statistics.median(ts):.2f} s [{min(ts):.2f} .. {max(ts):.2f}]")


if __name__ == "__main__":
    main()
