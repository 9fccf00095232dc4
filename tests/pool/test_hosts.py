"""The host gate (engine/pool/hosts.py): the per-host cap and the start delay hold across worker
processes under every start method, a SIGKILLed holder's slot comes back at once, hosts in
different buckets never wait for each other, and a gate that asks for nothing admits all.

The children live at module level so that spawn and forkserver can import them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lanes_testlib import shm_path, unique_name

from engine.errors import (
    EngineClosed,
    EngineError,
    EngineValueError,
    LayoutMismatch,
    SegmentExists,
    SegmentMissing,
)
from engine.pool.hosts import BUCKETS, HostGate

METHODS = ["fork", "spawn", "forkserver"]
URL = "http://site.example/page"


@pytest.fixture
def make_gate() -> Iterator[Callable[..., HostGate]]:
    """``make_gate(per_host, delay_ms)``: a new gate file; every gate closed, every file removed."""
    made: list[tuple[str, HostGate]] = []

    def make(per_host: int | None, delay_ms: int = 0) -> HostGate:
        name = unique_name()
        gate = HostGate.create(name, per_host, delay_ms)
        made.append((name, gate))
        return gate

    yield make
    for name, gate in made:
        gate.close()
        HostGate.unlink(name)
        assert not os.path.exists(shm_path(name) + ".hosts")


def _other_host(gate: HostGate, host: str, same_bucket: bool) -> str:
    """A host ``site-<i>.example:80`` in (or not in) ``host``'s bucket."""
    want = gate.bucket_of(host)
    for i in range(100 * BUCKETS):
        other = f"site-{i}.example:80"
        if (gate.bucket_of(other) == want) == same_bucket and other != host:
            return other
    raise AssertionError("no such host")  # pragma: no cover


# -- one process -------------------------------------------------------------------------------


def test_a_gate_that_asks_nothing_admits_everything_without_looking(make_gate) -> None:
    gate = make_gate(None, 0)
    tickets = {gate.try_enter(URL) for _ in range(1000)}
    assert len(tickets) == 1 and None not in tickets
    assert gate.try_enter("not even a url") is not None  # not parsed: no cost at all
    gate.leave(tickets.pop())
    assert gate.in_flight(URL) == 0


def test_the_cap_holds_between_two_gates_of_one_process(make_gate) -> None:
    a = make_gate(2)
    b = HostGate.attach(a.name)
    try:
        assert (b.per_host, b.delay_ms) == (2, 0)  # read from the file
        t1, t2 = a.try_enter(URL), a.try_enter(URL)
        assert t1 is not None and t2 is not None and t1.slot != t2.slot
        assert a.try_enter(URL) is None  # one gate never takes a byte it holds twice
        assert b.try_enter(URL) is None
        assert a.in_flight(URL) == b.in_flight(URL) == 2
        a.leave(t1)
        t3 = b.try_enter(URL)
        assert t3 is not None and a.try_enter(URL) is None
        assert a.statistics()["refused_full"] == 2 and b.statistics()["admitted"] == 1
    finally:
        b.close()


def test_a_ticket_left_twice_frees_nothing_it_no_longer_holds(make_gate) -> None:
    a = make_gate(1)
    b = HostGate.attach(a.name)
    try:
        t1 = a.try_enter(URL)
        assert t1 is not None
        a.leave(t1)
        t2 = a.try_enter(URL)  # the same byte again, for another render
        assert t2 is not None
        a.leave(t1)  # stale: must not free t2's slot
        b.leave(t2)  # not b's ticket
        assert b.try_enter(URL) is None and b.in_flight(URL) == 1
        a.leave(t2)
        assert b.try_enter(URL) is not None
    finally:
        b.close()


def test_closing_a_gate_gives_its_slots_back(make_gate) -> None:
    a = make_gate(2)
    b = HostGate.attach(a.name)
    held = [b.try_enter(URL), b.try_enter(URL)]
    assert None not in held and a.try_enter(URL) is None
    b.close()
    b.close()  # twice is fine
    assert a.in_flight(URL) == 0 and a.try_enter(URL) is not None
    with pytest.raises(EngineClosed):
        b.try_enter(URL)
    b.leave(held[0])  # ignored after close


def test_the_delay_spaces_the_starts_of_one_host(make_gate) -> None:
    gate = make_gate(None, 100)
    other = "http://" + _other_host(gate, gate.host_of(URL), same_bucket=False) + "/"
    assert gate.try_enter(URL, 1000) is not None
    assert gate.try_enter(URL, 1099) is None
    assert gate.try_enter(other, 1050) is not None  # another bucket: its own delay
    assert gate.try_enter(URL, 1100) is not None
    assert gate.try_enter(URL, 1150) is None
    assert gate.statistics()["refused_delay"] == 2


def test_a_start_refused_by_the_delay_gives_its_slot_back(make_gate) -> None:
    a = make_gate(1, 100)
    b = HostGate.attach(a.name)
    try:
        t = a.try_enter(URL, 1000)
        assert t is not None
        a.leave(t)
        assert b.try_enter(URL, 1050) is None  # took the slot, refused by the delay...
        assert a.in_flight(URL) == 0  # ...and gave the slot back
        assert b.try_enter(URL, 1100) is not None
    finally:
        b.close()


def test_a_next_start_written_on_another_clock_is_not_obeyed(make_gate) -> None:
    gate = make_gate(None, 100)
    assert gate.try_enter(URL, 10**12) is not None  # a wall-clock caller, say
    assert gate.try_enter(URL, 1000) is not None  # an hour and more ahead: overwritten
    assert gate.try_enter(URL, 1050) is None
    assert gate.try_enter(URL, 1000 - 60_000) is None  # a late caller is refused, not let in
    ticket = gate.try_enter(URL)  # the gate's own clock, read under the bucket's lock
    assert ticket is not None and ticket.at_ms > 1100


def test_hosts_in_different_buckets_never_block_each_other(make_gate) -> None:
    gate = make_gate(1, 1000)
    host = gate.host_of(URL)
    apart = _other_host(gate, host, same_bucket=False)
    assert gate.bucket_of(apart) != gate.bucket_of(host)
    assert gate.try_enter(URL, 0) is not None
    assert gate.try_enter(f"https://{apart}/x", 0) is not None


def test_hosts_sharing_a_bucket_share_its_cap_stricter_never_looser(make_gate) -> None:
    gate = make_gate(1)
    host = gate.host_of(URL)
    twin = _other_host(gate, host, same_bucket=True)
    assert gate.try_enter(URL) is not None
    assert gate.try_enter(f"http://{twin.split(':')[0]}/") is None


@pytest.mark.parametrize("url, host", [
    ("http://Example.COM/a", "example.com:80"),
    ("http://example.com:80/b", "example.com:80"),
    ("http://example.com./", "example.com:80"),
    ("https://example.com/", "example.com:443"),
    ("https://user:pw@example.com:8443/?q", "example.com:8443"),
    ("http://[::1]:8080/", "[::1]:8080"),
    ("http://127.0.0.1:5000/", "127.0.0.1:5000"),
    ("http://bücher.example/", "xn--bcher-kva.example:80"),
    ("http://xn--bcher-kva.example/", "xn--bcher-kva.example:80"),
    ("ftp://files.example/", "files.example"),
])
def test_host_of_counts_one_host_once(url: str, host: str) -> None:
    assert HostGate.host_of(url) == host


@pytest.mark.parametrize("url", ["", "/relative/path", "http://", "http://example.com:99999/",
                                 "http://[::1/"])
def test_host_of_refuses_what_has_no_host(url: str) -> None:
    with pytest.raises(EngineValueError):
        HostGate.host_of(url)


@pytest.mark.parametrize("per_host, delay_ms", [
    (0, 0), (1001, 0), (True, 0), (2.0, 0), ("2", 0),
    (None, -1), (None, 3_600_001), (None, 1.5), (None, None), (None, False),
])
def test_bad_limits_are_refused_with_a_clear_error(per_host: Any, delay_ms: Any) -> None:
    name = unique_name()
    with pytest.raises(EngineValueError, match="per_host|delay_ms"):
        HostGate.create(name, per_host, delay_ms)
    assert not os.path.exists(shm_path(name) + ".hosts")


def test_the_file_is_never_replaced_and_foreign_files_are_refused(make_gate) -> None:
    gate = make_gate(1000, 3_600_000)  # the extremes are accepted
    with pytest.raises(SegmentExists):
        HostGate.create(gate.name, 2, 0)
    name = unique_name()
    with pytest.raises(SegmentMissing):
        HostGate.attach(name)
    with open(shm_path(name) + ".hosts", "wb") as f:
        f.write(os.urandom(4096))
    try:
        with pytest.raises(LayoutMismatch):
            HostGate.attach(name)
    finally:
        assert HostGate.unlink(name)
    assert not HostGate.unlink(name)
    with pytest.raises(EngineValueError):
        HostGate.create("../etc/x", 1, 0)


def test_threads_sharing_one_gate_never_exceed_the_cap(make_gate) -> None:
    gate = make_gate(3)
    lock = threading.Lock()
    inside = [0, 0, 0]  # now, most ever, admissions

    def hammer() -> None:
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            t = gate.try_enter(URL)
            if t is None:
                time.sleep(0.0002)
                continue
            with lock:
                inside[0] += 1
                inside[1] = max(inside[1], inside[0])
                inside[2] += 1
            time.sleep(0.001)
            with lock:
                inside[0] -= 1
            gate.leave(t)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert inside[1] == 3 and inside[2] > 20
    assert gate.in_flight(URL) == 0


# -- many processes ----------------------------------------------------------------------------


def child_hammer(name: str, url: str, seconds: float, barrier: Any, counts: Any) -> None:
    """Enter, stay ~2 ms, leave, for ``seconds``; counts = [inside now, most ever, admitted,
    refused], kept under the array's own lock (the test's means, not the gate's)."""
    gate = HostGate.attach(name)
    barrier.wait(60)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = gate.try_enter(url)
        if t is None:
            with counts.get_lock():
                counts[3] += 1
            time.sleep(0.0005)
            continue
        with counts.get_lock():  # after admission...
            counts[0] += 1
            counts[1] = max(counts[1], counts[0])
            counts[2] += 1
        time.sleep(0.002)
        with counts.get_lock():  # ...and before leaving: never more than the gate let in
            counts[0] -= 1
        gate.leave(t)
    gate.close()


def child_start_often(name: str, url: str, seconds: float, barrier: Any, starts: Any) -> None:
    """Start renders as often as the gate allows; starts = [n, (at_ms, pid) ...]."""
    gate = HostGate.attach(name)
    barrier.wait(60)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = gate.try_enter(url)
        if t is not None:
            with starts.get_lock():
                i = starts[0]
                starts[0] += 1
                if 2 * i + 2 < len(starts):
                    starts[2 * i + 1], starts[2 * i + 2] = t.at_ms, os.getpid()
            gate.leave(t)
        time.sleep(0.0005)
    gate.close()


def child_hold(name: str, url: str, n: int, ready: Any) -> None:
    """Take ``n`` slots of ``url``'s host and hold them until killed."""
    gate = HostGate.attach(name)
    tickets = [gate.try_enter(url) for _ in range(n)]
    assert None not in tickets
    ready.set()
    time.sleep(120)


def child_hold_and_fork(name: str, url: str, q: Any) -> None:
    """Hold a slot, fork a grandchild that outlives us, report its pid and what it saw."""
    gate = HostGate.attach(name)
    assert gate.try_enter(url) is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the grandchild: the inherited gate must refuse to work here
        try:
            gate.try_enter(url)
            os.write(w, b"n")
        except EngineError:
            os.write(w, b"y")
        time.sleep(120)
        os._exit(0)
    q.put((pid, os.read(r, 1) == b"y"))
    time.sleep(120)


def _run_all(method: str, target: Callable[..., None], n: int, *args: Any) -> Any:
    """Run ``n`` children ``target(*args, barrier, shared)``; the shared array ``args[-1]``."""
    ctx = mp.get_context(method)
    barrier = ctx.Barrier(n)
    *args, shared = args
    procs = [ctx.Process(target=target, args=(*args, barrier, shared)) for _ in range(n)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * n
    return shared


@pytest.mark.parametrize("method", METHODS)
def test_the_cap_holds_across_processes(make_gate, method: str) -> None:
    gate = make_gate(2)
    shared = _run_all(method, child_hammer, 6, gate.name, URL, 0.5,
                      mp.get_context(method).Array("q", 4))
    now, most, admitted, refused = shared[:]
    assert now == 0
    assert most == 2, "never more than 2 inside, and the cap is reached"
    assert admitted > 50 and refused > 0
    assert gate.in_flight(URL) == 0  # every child left (or died): nothing stays taken


@pytest.mark.parametrize("method", METHODS)
def test_the_delay_holds_across_processes(make_gate, method: str) -> None:
    delay = 40
    gate = make_gate(None, delay)
    shared = _run_all(method, child_start_often, 4, gate.name, URL, 0.6,
                      mp.get_context(method).Array("q", 1 + 2 * 1000))
    n = shared[0]
    starts = sorted(zip(shared[1:2 * n + 1:2], shared[2:2 * n + 2:2], strict=True))
    gaps = [b[0] - a[0] for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= delay
    assert n >= 600 / delay / 2, "the delay is not a stall: starts come about every D ms"
    assert len({pid for _, pid in starts}) > 1  # the starts came from several processes


@pytest.mark.parametrize("method", METHODS)
def test_a_killed_holder_frees_its_slots_at_once(make_gate, method: str) -> None:
    gate = make_gate(2)
    ctx = mp.get_context(method)
    ready = ctx.Event()
    p = ctx.Process(target=child_hold, args=(gate.name, URL, 2, ready))
    p.start()
    try:
        assert ready.wait(60)
        assert gate.try_enter(URL) is None and gate.in_flight(URL) == 2
        os.kill(p.pid, signal.SIGKILL)
        p.join(60)
        assert gate.in_flight(URL) == 0
        assert gate.try_enter(URL) is not None and gate.try_enter(URL) is not None
    finally:
        if p.is_alive():
            p.kill()
            p.join()


def test_a_child_forked_by_a_holder_does_not_keep_its_slot(make_gate) -> None:
    gate = make_gate(1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child_hold_and_fork, args=(gate.name, URL, q))
    p.start()
    grandchild = None
    try:
        grandchild, refused_there = q.get(timeout=60)
        assert refused_there, "a gate inherited over fork must not work in the child"
        assert gate.try_enter(URL) is None
        os.kill(p.pid, signal.SIGKILL)
        while p.is_alive():  # not join: the grandchild holds the end of p's sentinel pipe
            time.sleep(0.01)
        os.kill(grandchild, 0)  # still there, holding the inherited descriptor (it closed it)
        assert gate.in_flight(URL) == 0 and gate.try_enter(URL) is not None
    finally:
        if p.is_alive():
            p.kill()
            p.join()
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
