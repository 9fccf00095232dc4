"""The long form of tests/chaos/test_write_chaos.py: every write path SIGKILLed midway, then the
oracle (tests/lib/write_chaos_lib.py). With ``--kinds add_many --rows 4000000 --kills 120
--kill-ms 50 120`` it is the run that found rows reserved and never written, and a fresh
``verify()`` reporting false problems after a killed ``add_many`` loop:

    .venv/bin/python bench/chaos_writes.py                                   # every kind, 120 kills
    .venv/bin/python bench/chaos_writes.py --kinds add_many --rows 4000000 --kill-ms 50 120

It prints, per run, ``rows - queued`` after the reap, what a fresh process's raw walk found before
any reap, and what ``verify()`` finds from a fresh process (which reaps dead writers first). Exit
status 0 when every count that must be zero is zero.
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

from write_chaos_lib import KINDS, WriteChaosConfig, run_write_chaos  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--kills", type=int, default=120, help="SIGKILLs per kind")
    ap.add_argument("--kill-ms", type=int, nargs=2, default=(20, 120), metavar=("LO", "HI"))
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    # room for what the add victims add in their lives (a full engine stops them)
    capacity = 1 << max(21, (a.rows * 2 - 1).bit_length())
    cfg = WriteChaosConfig(kinds=tuple(a.kinds), kills=a.kills, kill_ms=tuple(a.kill_ms),
                           rows=a.rows, capacity=capacity, batch=a.batch, seed=seed)
    log_dir = tempfile.mkdtemp(prefix="rl-write-chaos-")
    name = f"rl-write-chaos-{uuid.uuid4().hex[:8]}"
    print(f"chaos_writes: seed {seed}, kinds {' '.join(cfg.kinds)}, {cfg.kills} kills each"
          f" after {cfg.kill_ms[0]}-{cfg.kill_ms[1]} ms, {cfg.rows:,} rows", flush=True)
    t0 = time.monotonic()
    try:
        res = run_write_chaos(cfg, log_dir, name, progress=lambda m: print(m, flush=True))
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    print(res.summary())
    print(f"rows - queued after the reap: {res.rows - res.queued}"
          f" (removed {res.removed}); {time.monotonic() - t0:.1f} s")
    problems = res.problems()
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
