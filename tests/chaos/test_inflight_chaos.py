"""Rows in flight across processes (docs/design.md §9, §14), with real forked processes.

* After a chaos run (forked workers SIGKILLed about once a second, see ``chaos_lib``), a drain
  that keeps every row it takes, so that by its end every queued row is in flight, still returns
  every live row exactly once.
* Owners SIGKILLed while holding thousands of leases: a process that only attached
  (``Engine.attach``), with no supervisor and nobody calling ``reap()``, claiming in a loop on the
  wall clock, gets every one of the dead owner's rows within 1 s of the kill and none of a live
  owner's; after ``eng.reap()`` the next claims grant them at once, long before their leases
  expire.

``RL_INFLIGHT_CHAOS_SECONDS`` sets the length of the chaos run (default 8 s).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from chaos_lib import ChaosConfig, children_alive, run_chaos
from lanes_testlib import HOUR, get_result, shm_path, unique_name

from engine import Engine

SECONDS = float(os.environ.get("RL_INFLIGHT_CHAOS_SECONDS", "8"))
OLD_LIMIT = 140 + 4096  # in flight in one lane past which the old pass went quiet
CTX = mp.get_context("fork")


def test_a_drain_holding_every_row_after_a_kill_run_returns_each_live_row_once(tmp_path):
    name = unique_name()
    seed = (int(os.environ.get("RL_CHAOS_SEED", "0"))
            or int.from_bytes(os.urandom(4), "little"))
    # 40,000 rows over the chaos policy's lanes: the busiest lanes hold well over OLD_LIMIT
    cfg = ChaosConfig(seconds=SECONDS, workers=4, kill_every=1.0, lease_ms=(200, 500),
                      rows=40_000, capacity=1 << 17, seed=seed, drain_hold=True)
    res = run_chaos(cfg, str(tmp_path), name)
    print()
    print(f"seed {cfg.seed} (RL_CHAOS_SEED repeats the workers' choices, not the timing)")
    print(res.summary())

    assert children_alive(res.pids) == [], "a worker process was left behind"
    assert not os.path.exists(shm_path(name)), "the segment was left in /dev/shm"
    assert res.crash_logs == [], "\n".join(res.crash_logs)
    assert res.claims > 0 and res.workers_killed >= max(1, int(SECONDS / 2))
    assert res.verify == [], res.verify
    assert res.stranded == 0, (
        f"the holding drain never returned {res.stranded:,} queued rows (it held "
        f"{res.drained:,}, at most {res.drain_lane_max:,} of one lane): "
        f"{res.examples['stranded']}")
    assert res.drain_dups == 0, res.examples["drain_dup"]
    assert res.problems() == [], res.summary()
    assert res.drain_lane_max > OLD_LIMIT  # the drain really held that many rows of one lane


# -- owners killed while holding thousands of leases ---------------------------------------------


def _holder(name: str, n: int, q) -> None:
    """Attach, claim (wall clock, 1 h leases) until ``n`` rows are held or a claim grants
    nothing, report them, then wait to be killed."""
    try:
        eng = Engine.attach(name)
        rows: list[int] = []
        while len(rows) < n:
            c = eng.claim(budget=256, lease_ms=HOUR)
            if len(c) == 0:
                break
            rows += c.rows.tolist()
        q.put(("ok", rows))
    except BaseException:
        import traceback

        q.put(("error", traceback.format_exc()))
        return
    time.sleep(600)


def _claimer(name: str, want: int, q) -> None:
    """A bare user: attach, claim once (to register), say so, then claim in a loop on the wall
    clock (1 h leases, never completing) until ``want`` rows are held and 0.3 s more have passed
    (or 20 s in all). Reports each grant's CLOCK_MONOTONIC time and rows, then keeps its leases
    until it is killed."""
    try:
        eng = Engine.attach(name)
        first = eng.claim(budget=256, lease_ms=HOUR)
        q.put(("ok", first.rows.tolist()))
        grants: list[tuple[float, list[int]]] = []
        got = 0
        start = time.monotonic()
        stop_at = start + 20.0
        while time.monotonic() < stop_at:
            c = eng.claim(budget=256, lease_ms=HOUR)
            t = time.monotonic()
            if len(c):
                grants.append((t, c.rows.tolist()))
                got += len(c)
                if got >= want:
                    stop_at = min(stop_at, t + 0.3)
            else:
                time.sleep(0.0005)
        q.put(("ok", grants))
    except BaseException:
        import traceback

        q.put(("error", traceback.format_exc()))
        return
    time.sleep(600)


def _stop(p) -> None:
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def _start(target, *args):
    q = CTX.Queue()
    p = CTX.Process(target=target, args=(*args, q), daemon=True)
    p.start()
    return p, q


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-lane", "four-lanes"])
def test_leases_of_a_killed_owner_come_back_by_the_owner_check_without_a_supervisor(make_engine,
                                                                                   lanes):
    """Holders A and B each hold 3,000 rows (interleaved in due order, in one lane or spread
    over four). A is SIGKILLed: a claimer that only attached gets all of A's rows within seconds
    of the kill (the owner check runs every 100 ms; the leases last an hour), each once, and
    none of B's (alive). Then B is SIGKILLed and ``eng.reap()`` is
    called: claims made right after it grant all of B's rows, none coming back empty first, and
    none of A's (now the claimer's, alive)."""
    per = 3_000
    eng = make_engine(capacity=2 * per)
    name = eng.stats()["name"]
    intervals = np.array([600, 7200, 43200, 172800][:lanes], np.int64)
    wall = time.time_ns() // 1_000_000
    offsets = np.arange(per, dtype=np.int64) * 2

    def add(dues):
        return eng.add_many(dues, intervals[np.arange(per) % lanes]).tolist()

    procs = []
    try:
        rows_a = add(wall - 2 * HOUR + offsets)
        eng.compact()
        a, qa = _start(_holder, name, per)
        procs.append(a)
        held_a = get_result(qa)
        assert sorted(held_a) == sorted(rows_a), f"holder A holds {len(held_a):,} of {per:,}"
        rows_b = add(wall - 2 * HOUR + offsets + 1)  # each just after one of A's
        eng.compact()
        b, qb = _start(_holder, name, per)
        procs.append(b)
        held_b = get_result(qb)
        assert sorted(held_b) == sorted(rows_b), (
            f"holder B holds {len(held_b):,} of {per:,} due rows, with {per:,} of A's in flight")
        c, qc = _start(_claimer, name, per)
        procs.append(c)
        assert get_result(qc) == []  # registered; both holders alive, nothing to claim
        time.sleep(0.2)  # the claimer loops against live leases for a while
        t_kill = time.monotonic()
        os.kill(a.pid, signal.SIGKILL)
        a.join(30)  # reaped by its parent, as any parent does; nobody calls eng.reap()
        assert a.exitcode == -signal.SIGKILL
        grants = get_result(qc, timeout=60)
        got = [r for _, rows in grants for r in rows]
        early = [(round(t - t_kill, 3), len(rows)) for t, rows in grants if t < t_kill]
        assert early == [], f"granted while both holders were alive: {early}"
        assert len(got) == len(set(got)), "a row was granted twice"
        assert set(got).isdisjoint(rows_b), "a live owner's row was granted"
        assert sorted(got) == sorted(rows_a), (
            f"{len(got):,} of the dead owner's {per:,} rows came back in "
            f"{max((t for t, _ in grants), default=t_kill) - t_kill:.2f} s")
        late = max(t for t, _ in grants) - t_kill
        print(f"\n{lanes} lane(s): the dead owner's {per:,} rows were back {late * 1000:.0f} ms "
              f"after the kill")
        # the owner check runs every 100 ms and the leases last an hour: a bound of 100 checks
        # shows the owner check put the rows back, with room for a loaded machine
        assert late <= 10, f"the dead owner's last rows came back {late:.2f} s after the kill"

        os.kill(b.pid, signal.SIGKILL)
        b.join(30)
        assert eng.reap() >= 1
        back: list[int] = []
        while len(back) < per:
            batch = eng.claim(budget=256, lease_ms=HOUR)
            assert len(batch), f"after reap(): {len(back):,} of {per:,} rows, then nothing"
            back += batch.rows.tolist()
        assert sorted(back) == sorted(rows_b)
        assert len(eng.claim(budget=256, lease_ms=HOUR)) == 0
        assert eng.verify() == []
    finally:
        for p in procs:
            _stop(p)
