"""Multi-process chaos in real time (docs/design.md §14): forked workers claim, complete, fail,
release, renew, prioritize, add and remove against one engine with 200-500 ms leases while a
supervisor SIGKILLs a random worker about once a second and forks a replacement. An oracle then
reads every worker's append-only lease log and the engine (see ``chaos_lib``).

``RL_CHAOS_SECONDS`` sets the length of the chaos (default 20 s; the whole test stays well under
a minute). ``pytest -s tests/chaos/test_chaos.py`` prints the counts. The long form, millions of
claims, is ``bench/chaos_long.py``.
"""

from __future__ import annotations

import os

from chaos_lib import ChaosConfig, ChaosResult, children_alive, now_ms, oracle, run_chaos
from lanes_testlib import shm_path, unique_name

SECONDS = float(os.environ.get("RL_CHAOS_SECONDS", "20"))


def test_chaos_kill_workers_no_overlap_no_loss(tmp_path):
    name = unique_name()
    seed = int(os.environ.get("RL_CHAOS_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    cfg = ChaosConfig(seconds=SECONDS, workers=4, kill_every=1.0, lease_ms=(200, 500),
                      rows=20_000, capacity=1 << 17, seed=seed)
    res = run_chaos(cfg, str(tmp_path), name)
    print()
    print(f"seed {cfg.seed} (RL_CHAOS_SEED repeats the workers' choices, not the timing)")
    print(res.summary())
    print(f"claims made {res.claims:,}, workers killed {res.workers_killed}, "
          f"overlaps {res.overlaps}, lost {res.lost}, stranded {res.stranded}")

    assert children_alive(res.pids) == [], "a worker process was left behind"
    assert not os.path.exists(shm_path(name)), "the segment was left in /dev/shm"
    assert res.crash_logs == [], "\n".join(res.crash_logs)
    assert res.claims > 0 and res.workers_killed >= max(1, int(SECONDS / 2))
    assert res.verify == [], res.verify
    assert res.overlaps == 0, res.examples["overlap"]
    assert res.lost == 0, res.examples["lost"]
    assert res.stranded == 0, res.examples["stranded"]
    assert res.problems() == [], res.summary()


def test_oracle_catches_overlap_intrusion_and_a_lost_row(make_engine, tmp_path):
    """The oracle is not blind: hand-written logs with two overlapping successful leases of one
    row, back-to-back leases of another (legal, sharing a millisecond), and a row removed behind
    the logs' back."""
    eng = make_engine(capacity=64)
    rows = eng.add_many([now_ms() - 1000] * 10, 5).tolist()
    assert rows == list(range(10))
    (tmp_path / "worker-00000.log").write_text(
        "S 1 1000 inherit\n"
        "C 1000 1001 300 5:111\n"
        "K 1100 1101 5:1\n"
        "C 1000 1001 300 6:333\n"
        "K 1010 1010 6:1\n")
    (tmp_path / "worker-00001.log").write_text(
        "S 2 1000 attach\n"
        "C 1050 1051 300 5:222\n"
        "K 1090 1091 5:1\n"
        "C 1010 1010 300 6:444\n"
        "R 1020 1020 6 444 1\n"
        "a 2\n")  # killed mid-add: no row came of it, which is allowed
    eng.remove(7)
    res = oracle(eng, str(tmp_path), ChaosResult(), initial_rows=10)
    assert res.claims == 4 and res.ended_ok == {"complete": 3, "fail": 0, "release": 1}
    assert res.overlaps == 1 and res.examples["overlap"][0]["row"] == 5
    assert res.intrusions == 1
    assert res.lost == 1 and res.examples["lost"][0]["row"] == 7
    assert res.duplicated == 0 and res.log_errors == 0
    assert res.verify == [] and res.stranded == 0 and res.drain_dups == 0
    assert res.drained == 9
