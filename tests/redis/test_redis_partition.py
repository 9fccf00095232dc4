"""Dead hosts, cut-off hosts and big queues on Redis (docs/redis.md "Heartbeats",
"Partitions", "Big queues"): a lapsed heartbeat puts its owner's leases back and makes its
tokens stale; a pool killed whole has its rows claimable elsewhere within three heartbeat
periods; a pool on a host cut off from Redis (a network namespace whose link goes down) loses
its rows to the others, and when the link heals its late completes are refused, no row lost
and no row completed twice; verify and save read a big queue by chunks. Every test runs real
redis-servers and leaves no server, namespace, link or process behind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from netns import unavailable
from partition_lib import HostPool, Partitioned
from redis_server import RedisServer, fresh_queue, module_server

from engine import Engine, LeaseLost
from engine.errors import EngineValueError
from engine.redis import RedisEngine
from engine.redis.codec import beats_key

NOW = 1_900_000_000_000


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from module_server()


@pytest.fixture
def queue(server: RedisServer) -> Iterator[str]:
    yield from fresh_queue(server, "rl-part-")


def _filled(server: RedisServer, queue: str, n: int) -> RedisEngine:
    eng = Engine.connect(server.url, queue, create=True)
    eng.add_many([NOW - 1000] * n, 3600)
    return eng


def _claim_in_child(server: RedisServer, queue: str, budget: int, beat_ttl_ms: int | None
                    ) -> list[tuple[int, int]]:
    """(row, token) of a batch claimed by a forked owner that beats once (at NOW, unless
    ``beat_ttl_ms`` is None) and dies holding it without a word."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a host of its own that dies
        try:
            os.close(r)
            eng = Engine.connect(server.url, queue)
            if beat_ttl_ms is not None:
                eng.heartbeat(beat_ttl_ms, now_ms=NOW)
            batch = eng.claim(budget, now_ms=NOW, lease_ms=60_000)
            os.write(w, " ".join(f"{c.row}:{c.token}" for c in batch).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return [(int(a), int(b)) for a, b in (p.split(":") for p in text.split())]


def test_a_lapsed_heartbeat_puts_its_owners_leases_back_and_makes_its_tokens_stale(
        server: RedisServer, queue: str) -> None:
    eng = _filled(server, queue, 8)
    try:
        held = _claim_in_child(server, queue, 5, beat_ttl_ms=2000)
        assert len(held) == 5
        assert eng.heartbeat(2000, now_ms=NOW + 1000) == (0, 0)  # its heartbeat holds
        assert len(eng.claim(16, now_ms=NOW + 1000)) == 3  # only the rows nobody holds
        assert eng.heartbeat(2000, now_ms=NOW + 2000) == (1, 5)  # lapsed: back, 58 s early
        assert eng.verify() == []
        again = eng.claim(16, now_ms=NOW + 2001)
        assert sorted(again.rows.tolist()) == sorted(r for r, _ in held)
        for row, token in held:  # the dead owner's tokens are stale: its completes refused
            with pytest.raises(LeaseLost):
                eng.complete(row, token)
        assert eng.complete_many(again.rows, again.tokens).all()
        assert eng.verify() == []
        client = server.client()
        assert client.zcard(beats_key(queue)) == 1  # type: ignore[attr-defined]
        assert eng.heartbeat(0) == (0, 0)  # this owner leaves: its entry goes
        assert client.zcard(beats_key(queue)) == 0  # type: ignore[attr-defined]
    finally:
        eng.close()


def test_an_owner_that_never_beats_keeps_its_leases_until_they_expire(
        server: RedisServer, queue: str) -> None:
    eng = _filled(server, queue, 4)
    try:
        held = _claim_in_child(server, queue, 4, beat_ttl_ms=None)
        assert eng.heartbeat(2000, now_ms=NOW + 30_000) == (0, 0)
        assert len(eng.claim(16, now_ms=NOW + 59_999)) == 0
        assert sorted(eng.claim(16, now_ms=NOW + 60_000).rows.tolist()) == \
            sorted(r for r, _ in held)
    finally:
        eng.close()


def test_a_reaped_lapsed_lease_already_back_in_ready_only_loses_its_token(
        server: RedisServer, queue: str) -> None:
    """A lapsed lease put back by a claim pass still holds its token until someone else is
    granted the row; the reap of its owner ends that too, and puts nothing in ready twice."""
    eng = _filled(server, queue, 2)
    try:
        held = _claim_in_child(server, queue, 2, beat_ttl_ms=120_000)
        mine = eng.claim(1, now_ms=NOW + 60_000)  # the pass puts both back, grants one
        assert len(mine) == 1 and eng.describe(held[1][0], now_ms=NOW + 60_000)["queued"]
        assert eng.heartbeat(2000, now_ms=NOW + 120_000) == (1, 0)  # nothing was in flight
        assert eng.verify() == []
        with pytest.raises(LeaseLost):  # before the reap, this complete would have held
            eng.complete(*held[1])
        assert eng.complete_many(mine.rows, mine.tokens).all()
    finally:
        eng.close()


@pytest.mark.parametrize("ttl", [-1, 1.5, "2000", 86_400_001, True])
def test_a_bad_heartbeat_ttl_is_refused_and_sends_nothing(server: RedisServer, queue: str,
                                                          ttl: object) -> None:
    eng = _filled(server, queue, 1)
    try:
        with pytest.raises((EngineValueError, TypeError)):
            eng.heartbeat(ttl)  # type: ignore[arg-type]
        assert server.client().exists(beats_key(queue)) == 0  # type: ignore[attr-defined]
    finally:
        eng.close()


# -- hosts in network namespaces -------------------------------------------------------------------

needs_netns = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _owners_of(run: Partitioned, pool: HostPool) -> set[str]:
    """The owner ids with live leases whose process belongs to ``pool``."""
    eng = run.engine()
    try:
        owners = eng.stats()["owners"]
    finally:
        eng.close()
    return {o for o in owners if int(o.rsplit(":", 2)[1]) in pool.pids}


@needs_netns
def test_a_host_killed_whole_has_its_rows_back_within_three_heartbeats() -> None:
    """Leases of 30 s; heartbeats every 1 s (a TTL of 2 s): the dead host's leases end within
    3 s of its death, not 30 s, and the other host renders its rows."""
    with Partitioned(hosts=2, rows=40, lease_s=30.0, heartbeat_s=1.0, render_s=0.3) as run:
        a, b = run.start(0), run.start(1)
        run.wait(lambda: len(run.rendered_by(a)) >= 2 and len(run.rendered_by(b)) >= 2, 60)
        a.pids |= {p for p in _tree_of(a)}
        held = _owners_of(run, a)
        assert held, "host A holds no lease at its death"
        killed = time.monotonic()
        run.kill(a)
        run.wait(lambda: not _owners_of(run, a), 30)
        back_s = time.monotonic() - killed
        run.wait(run.settled, 60)
        run.stop()
        assert run.problems() == []
    print(f"\nleases of 30 s: a host's rows claimable {back_s:.2f} s after its SIGKILL")
    assert back_s < 4.0  # 3 s (TTL + one period), and a loaded machine's delay


@needs_netns
def test_a_host_cut_off_loses_its_rows_and_its_late_completes_are_refused() -> None:
    """Host A's link goes down for 3 leases while it renders; host B takes A's rows once A's
    leases and heartbeat lapse; when the link heals, A's late renews and completes are
    refused (LeaseLost, counted), and no row is lost or completed twice (the oracle:
    tests/lib/partition_lib.py)."""
    lease_s = 1.0
    with Partitioned(hosts=2, rows=60, lease_s=lease_s, heartbeat_s=1.0, render_s=0.25) as run:
        a, b = run.start(0), run.start(1)
        run.wait(lambda: len(run.rendered_by(a)) >= 2 and len(run.rendered_by(b)) >= 2, 60)
        run.cut(0)
        cut_ms = run.cuts[-1][1]
        time.sleep(3 * lease_s)
        run.heal(0)
        run.wait(run.settled, 90)
        run.stop()
        assert run.problems() == []
        by_a, by_b = run.rendered_by(a), run.rendered_by(b)
    held_by_a = {r.row for r in by_a if r.ms < cut_ms}
    taken = sorted(min(r.ms for r in by_b if r.row == row) - cut_ms
                   for row in held_by_a if any(r.row == row and r.ms > cut_ms for r in by_b))
    assert taken, "host B took none of the rows host A held when it was cut off"
    assert a.summary is not None and a.summary[3] >= 1  # its late calls refused, counted
    print(f"\ncut for {3 * lease_s:g} s: B took {len(taken)} of A's rows, "
          f"{taken[0]}-{taken[-1]} ms after the cut; A counted {a.summary[3]} leases lost")


def _tree_of(pool: HostPool) -> set[int]:
    import psutil

    proc = psutil.Process(pool.proc.pid)
    return {proc.pid} | {c.pid for c in proc.children(recursive=True)}
