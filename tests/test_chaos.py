"""Multi-process chaos in real time (issue 3, item 2): forked workers claim, complete, fail,
release, renew, prioritize, add and remove against one engine with 200-500 ms leases while a
supervisor SIGKILLs a random worker about once a second and forks a replacement. An oracle then
reads every worker's append-only lease log and the engine (see ``chaos_lib``).

``RL_CHAOS_SECONDS`` sets the length of the chaos (default 20 s; the whole test stays under a
minute). ``pytest -s tests/test_chaos.py`` prints the counts. The long form is
``bench/chaos_long.py``.
"""

from __future__ import annotations

import os

from chaos_lib import ChaosConfig, children_alive, run_chaos
from lanes_testlib import shm_path, unique_name

SECONDS = float(os.environ.get("RL_CHAOS_SECONDS", "20"))


def test_chaos_kill_workers_no_overlap_no_loss(tmp_path):
    name = unique_name()
    cfg = ChaosConfig(seconds=SECONDS, workers=4, kill_every=1.0, lease_ms=(200, 500),
                      rows=20_000, capacity=1 << 17, seed=int.from_bytes(os.urandom(4), "little"))
    res = run_chaos(cfg, str(tmp_path), name)
    print()
    print(f"seed {cfg.seed}")
    print(res.summary())
    print(f"claims made {res.claims:,}, workers killed {res.workers_killed}, "
          f"overlaps {res.overlaps}, lost {res.lost}, stranded {res.stranded}")

    assert children_alive() == [], "a worker process was left behind"
    assert not os.path.exists(shm_path(name)), "the segment was left in /dev/shm"
    assert res.crash_logs == [], "\n".join(res.crash_logs)
    assert res.claims > 0 and res.workers_killed >= max(1, int(SECONDS / 2))
    assert res.verify == [], res.verify
    assert res.overlaps == 0, res.examples["overlap"]
    assert res.lost == 0, res.examples["lost"]
    assert res.stranded == 0, res.examples["stranded"]
    assert res.problems() == [], res.summary()
