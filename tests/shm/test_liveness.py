"""Owner liveness (csrc/lease.c): a lease of a live process holds, a lease of a dead one comes
back at once. The kernel is the authority (kill(pid, 0)); the beacon, a robust mutex that the
registering thread keeps locked, only spares that system call while the thread lives. These
tests pin each way the beacon can be missing or stale, and check that liveness stays right in
each of them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
from lanes_testlib import HOUR, NOW, get_result, past_owner_check, shm_path

from engine import Engine
from engine.shm.segment import OWNER_ALIVE, ffi, lib

CTX = mp.get_context("fork")


def _hold(name: str, how: str, q) -> None:
    """Claim one row with a long lease and report (owner, rows), then wait to be killed.
    how: "main" registers in the main thread; "thread" registers in a thread that ends first;
    "closed-elsewhere" registers in the main thread, then closes from another thread (which
    cannot unlock the beacon), reports, and stays alive holding it."""
    try:
        from engine import Engine

        eng = Engine.attach(name)
        if how == "thread":
            t = threading.Thread(target=lambda: eng._seg.owner)
            t.start()
            t.join()
        c = eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR)
        owner = eng._seg.owner
        if how == "closed-elsewhere":
            t = threading.Thread(target=eng.close)
            t.start()
            t.join()
        q.put(("ok", {"owner": owner, "rows": c.rows.tolist()}))
    except BaseException:
        import traceback

        q.put(("error", traceback.format_exc()))
        return
    time.sleep(600)


def _start(name: str, how: str):
    q = CTX.Queue()
    p = CTX.Process(target=_hold, args=(name, how, q), daemon=True)
    p.start()
    return p, get_result(q)


def _stop(p) -> None:
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def _beacon(eng, owner: int) -> int:
    return int(lib.rl_owner_beacon(eng._h, owner))


def _beacon_clears(eng, owner: int) -> bool:
    """The kernel marks a beacon when its thread has ended; a joined Python thread may still be
    ending for a moment (longer under the sanitizers), so poll."""
    deadline = time.monotonic() + 10
    while _beacon(eng, owner) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _beacon(eng, owner) == 0


def _fill(eng, n: int = 4) -> list[int]:
    return [eng.add(NOW - HOUR - i, 3600) for i in range(n)]


def test_a_live_owner_is_known_alive_by_its_beacon_and_a_killed_one_is_not(make_engine):
    eng = make_engine()
    rows = _fill(eng)
    assert _beacon(eng, eng._seg.owner) == 1  # this process registered in this thread
    p, res = _start(eng.stats()["name"], "main")
    try:
        held, owner = res["rows"], res["owner"]
        assert _beacon(eng, owner) == 1
        c = eng.claim(budget=len(rows), now_ms=NOW + 1000, lease_ms=HOUR)
        assert held[0] not in c.rows.tolist()  # its lease holds
        eng.complete_many(c.rows, c.tokens, now_ms=NOW + 1000)
        os.kill(p.pid, signal.SIGKILL)
        assert _beacon_clears(eng, owner)  # marked when the thread ends, before the reaping
    finally:
        _stop(p)
    past_owner_check()  # the next owners check finds it dead: no supervisor needed
    c = eng.claim(budget=1, now_ms=NOW + 2000, lease_ms=HOUR)
    assert c.rows.tolist() == held
    assert eng.verify() == []


@pytest.mark.parametrize("how", ["thread", "closed-elsewhere"])
def test_without_a_beacon_the_kernel_still_decides(make_engine, how):
    """"thread": the beacon's thread ended while the process lives. "closed-elsewhere": the slot
    was freed by a close from another thread, so its beacon is still held by a live thread of
    the previous owner, and the next owner of the slot has none."""
    eng = make_engine()
    name = eng.stats()["name"]
    _fill(eng)
    previous = None
    if how == "closed-elsewhere":
        previous, res0 = _start(name, how)
        p, res = _start(name, "main")
        assert res["owner"] == res0["owner"]  # the freed slot, its beacon held elsewhere
    else:
        p, res = _start(name, "thread")
    try:
        held, owner = res["rows"], res["owner"]
        assert _beacon_clears(eng, owner)
        c = eng.claim(budget=8, now_ms=NOW + 1000, lease_ms=HOUR)
        assert held[0] not in c.rows.tolist()  # alive, by kill(pid, 0)
        eng.complete_many(c.rows, c.tokens, now_ms=NOW + 1000)
    finally:
        _stop(p)
    past_owner_check()
    c = eng.claim(budget=8, now_ms=NOW + 2000, lease_ms=HOUR)
    assert held[0] in c.rows.tolist()  # dead: back by the next owners check
    if previous is not None:
        _stop(previous)
    assert eng.verify() == []


def _mappings(path: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(path in line for line in f)


def _close_elsewhere_then_carry_on(name: str, path: str, q) -> None:
    """Register in this (main) thread, close from another thread, then register and release
    again through new handles in this thread: the robust-list work of those locks and unlocks
    starts at the first beacon, which must still be mapped."""
    try:
        from engine import Engine

        inherited = _mappings(path)  # the parent's mapping, inherited by fork
        first = Engine.attach(name)
        first.claim(budget=1, now_ms=NOW, lease_ms=HOUR)
        assert _mappings(path) == inherited + 1
        t = threading.Thread(target=first.close)
        t.start()
        t.join()
        kept = _mappings(path)
        for _ in range(3):
            second = Engine.attach(name)
            second.claim(budget=1, now_ms=NOW, lease_ms=HOUR)
            second.close()  # same thread: unlocked and unmapped
        q.put(("ok", {"inherited": inherited, "kept": kept, "after": _mappings(path)}))
    except BaseException:
        import traceback

        q.put(("error", traceback.format_exc()))


def test_an_engine_closed_from_another_thread_keeps_its_beacon_mapped(make_engine):
    eng = make_engine()
    _fill(eng, 8)
    name = eng.stats()["name"]
    q = CTX.Queue()
    p = CTX.Process(target=_close_elsewhere_then_carry_on, args=(name, shm_path(name), q))
    p.start()
    try:
        res = get_result(q)
    finally:
        p.join(30)
    assert p.exitcode == 0  # not SIGSEGV in glibc's robust-list code
    # the first handle's mapping stayed (its beacon is on the main thread's robust list); the
    # handles closed by the thread that registered them were unmapped
    assert res["kept"] == res["inherited"] + 1 and res["after"] == res["kept"]
    assert eng.verify() == []


def _owners_of_this_process(eng) -> int:
    pid, start, state = ffi.new("uint32_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    n = 0
    for o in range(1, lib.RL_MAX_OWNERS):
        assert lib.rl_owner_get(eng._h, o, pid, start, state) == 0
        n += pid[0] == os.getpid() and (state[0] & 0xFFFFFFFF) == OWNER_ALIVE
    return n


def test_threads_that_first_use_an_engine_together_register_one_owner(make_engine):
    eng = make_engine()
    _fill(eng, 64)
    other = Engine.attach(eng.stats()["name"])
    try:
        before = _owners_of_this_process(eng)
        go = threading.Barrier(4)

        def first_use() -> None:
            go.wait()
            c = other.claim(2, now_ms=NOW, lease_ms=HOUR)
            other.complete_many(c.rows, c.tokens, now_ms=NOW)

        threads = [threading.Thread(target=first_use) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert _owners_of_this_process(eng) == before + 1
        # the thread that registered has ended, so the kernel marked its beacon: this owner's
        # liveness is asked of the kernel, and its leases still hold
        assert _beacon_clears(eng, other._seg.owner)
        held = other.claim(1, now_ms=NOW, lease_ms=HOUR)
        assert len(held) == 1
        assert int(held.rows[0]) not in eng.claim(64, now_ms=NOW, lease_ms=HOUR).rows.tolist()
    finally:
        other.close()
    assert eng.verify() == []


def test_remove_refuses_a_bad_owner_id(make_engine):
    eng = make_engine()
    row = _fill(eng, 1)[0]
    for owner in (0, lib.RL_MAX_OWNERS):
        assert lib.rl_remove(eng._h, owner, row, ffi.NULL) == lib.RL_E_VALUE
    assert eng.describe(row)["queued"]
