"""Dead hosts, cut-off hosts and big queues on Redis (docs/redis.md "Heartbeats",
"Partitions", "Big queues"): a lapsed heartbeat puts its owner's leases back and makes its
tokens stale, and a stall shorter than a TTL reaps no live owner; a pool killed whole has its
rows claimable elsewhere within 3.5 heartbeat periods; a pool on a host cut off from Redis (a
network namespace whose link goes down) loses its rows to the others, and when the link heals
its late completes are refused, no row lost and no row completed twice; verify and save read a
big queue by chunks. Every test runs real redis-servers and leaves no server, namespace, link
or process behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from netns import unavailable
from partition_lib import Partitioned, owners_of, process_tree
from redis_server import RedisServer, fresh_queue, module_server

from engine import Engine, LeaseLost, checkpoint
from engine.errors import EngineValueError
from engine.keys import STRIDE
from engine.pool import PoolOptions
from engine.pool.heartbeat import Heartbeat
from engine.redis import RedisEngine, codec
from engine.redis.codec import LIVE, RECORD, beats_key, member, records, split_holder

NOW = 1_900_000_000_000
HOUR_MS = 3_600_000


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


def test_an_owner_whose_own_beat_lapsed_judges_no_one_after_a_stall(
        server: RedisServer, queue: str) -> None:
    """When every beat lapsed together (the server stalled, failed over or moved a slot), the
    first owner to beat again renews itself and reaps nobody, nor does anyone for a TTL; then an
    owner that did not come back is reaped."""
    eng = _filled(server, queue, 4)
    try:
        held = _claim_in_child(server, queue, 4, beat_ttl_ms=2000)
        assert eng.heartbeat(2000, now_ms=NOW) == (0, 0)  # both beat; then nothing for 5 s
        assert eng.heartbeat(2000, now_ms=NOW + 5000) == (0, 0)  # lapsed itself: no judge
        assert eng.heartbeat(2000, now_ms=NOW + 6000) == (0, 0)  # on time, but calm until 7 s
        assert eng.stats(now_ms=NOW + 6000)["in_flight"] == len(held)
        assert eng.heartbeat(2000, now_ms=NOW + 7000) == (1, 4)  # the other never came back
    finally:
        eng.close()


def _beat_as(server: RedisServer, queue: str, owner: str, ttl_ms: int, now_ms: int) -> list[int]:
    """One ``lanes_heartbeat`` of owner id ``owner`` (another host's pool worker, as its FCALL
    reaches the server): (owners reaped, rows put back)."""
    keys = (*codec.queue_keys(queue), beats_key(queue))
    return list(server.client().fcall(  # type: ignore[attr-defined]
        "lanes_heartbeat", len(keys), *keys, codec.LIBRARY_VERSION, now_ms, owner, ttl_ms))


def test_a_stall_shorter_than_a_ttl_reaps_no_owner_that_was_due_to_beat_during_it(
        server: RedisServer, queue: str) -> None:
    """The slot migration that reaped live pools: A beats at 0, B at 0.9 s (period 1 s, TTL
    2.5 s); the server stalls from 1 s to 2.6 s. B's beat lands first after the stall, before
    its own TTL is out but 1.7 s after its previous one: late, so it judges no one though A's
    beat lapsed at 2.5 s, and nobody judges for a TTL, while A's delayed beat lands. A host that
    did die then is reaped once the calm is over."""
    eng = _filled(server, queue, 6)
    client = server.client()
    try:
        held = _claim_in_child(server, queue, 3, beat_ttl_ms=2500)  # C: beats at 0, then dies
        a = "host-a:4242:1"
        assert _beat_as(server, queue, a, 2500, NOW - 1000) == [0, 0]
        assert _beat_as(server, queue, a, 2500, NOW) == [0, 0]
        assert eng.heartbeat(2500, now_ms=NOW - 100) == (0, 0)  # B, first beat
        assert eng.heartbeat(2500, now_ms=NOW + 900) == (0, 0)
        assert eng.heartbeat(2500, now_ms=NOW + 2600) == (0, 0)  # late: no judge, though
        assert client.zscore(beats_key(queue), a) == NOW + 2500  # A and C lapsed at 2.5 s
        assert _beat_as(server, queue, a, 2500, NOW + 2700) == [0, 0]  # A lands, late too
        assert eng.heartbeat(2500, now_ms=NOW + 3600) == (0, 0)  # on time, calm until 5.2 s
        assert eng.stats(now_ms=NOW + 3600)["in_flight"] == len(held)
        assert _beat_as(server, queue, a, 2500, NOW + 3700) == [0, 0]
        assert eng.heartbeat(2500, now_ms=NOW + 4600) == (0, 0)
        assert _beat_as(server, queue, a, 2500, NOW + 4700) == [0, 0]
        assert eng.heartbeat(2500, now_ms=NOW + 5600) == (1, 3)  # calm over: C never came back
        assert client.zscore(beats_key(queue), a) is not None  # A kept (it beat at 2.7 s)
        assert eng.verify() == []
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
        assert eng.heartbeat(120_000, now_ms=NOW + 60_000) == (0, 0)  # a first beat judges none
        assert eng.heartbeat(2000, now_ms=NOW + 120_000) == (1, 0)  # nothing was in flight
        assert eng.verify() == []
        with pytest.raises(LeaseLost):  # before the reap, this complete would have held
            eng.complete(*held[1])
        assert eng.complete_many(mine.rows, mine.tokens).all()
    finally:
        eng.close()


def test_a_worker_beats_only_when_its_lease_outlasts_its_heartbeat_and_leaves_when_done(
        server: RedisServer, queue: str) -> None:
    """A pool worker's heartbeat thread: none on a lease of 2.5 periods or less (expiry is as
    quick) or with a period of 0; else it beats, and takes its entry out when stopped."""
    eng = _filled(server, queue, 1)
    client = server.client()
    try:
        assert Heartbeat.of(eng, 1.0, lease_s=2.5) is None
        assert Heartbeat.of(eng, 0.0, lease_s=30.0) is None
        beat = Heartbeat.of(eng, 0.05, lease_s=30.0)
        assert beat is not None
        deadline = time.monotonic() + 10
        while not client.zscore(beats_key(queue), eng.owner):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.01)
        beat.stop()
        assert client.zcard(beats_key(queue)) == 0  # type: ignore[attr-defined]
    finally:
        eng.close()


@pytest.mark.parametrize("period", [-1, 3601, float("nan"), "1", None])
def test_a_bad_heartbeat_period_is_refused(period: object) -> None:
    with pytest.raises(EngineValueError, match="heartbeat_s"):
        PoolOptions(heartbeat_s=period)  # type: ignore[arg-type]


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


@needs_netns
def test_a_host_killed_whole_has_its_rows_back_by_heartbeat_not_by_lease_expiry() -> None:
    """Leases of 30 s; heartbeats every 1 s (a TTL of 2.5 s): the dead host's leases end by its
    lapsed heartbeat (3.5 s after its death by design, printed; the lapse itself is held step
    by step in virtual time above), not at their 30 s expiry, and the other host renders its
    rows."""
    with Partitioned(hosts=2, rows=40, lease_s=30.0, heartbeat_s=1.0, render_s=0.3) as run:
        a, b = run.start(0), run.start(1)
        run.wait(lambda: len(run.rendered_by(a)) >= 2 and len(run.rendered_by(b)) >= 2, 60)
        a.pids |= process_tree(a.proc.pid)
        held = owners_of(run, a)
        assert held, "host A holds no lease at its death"
        killed = time.monotonic()
        run.kill(a)
        run.wait(lambda: not owners_of(run, a), 30)
        back_s = time.monotonic() - killed
        run.wait(run.settled, 60)
        run.stop()
        assert run.problems() == []
    print(f"\nleases of 30 s: a host's rows claimable {back_s:.2f} s after its SIGKILL")
    # 3.5 s by design (TTL + one period); anything well inside the 30 s leases shows the
    # heartbeat, not the leases' expiry, put the rows back
    assert back_s < 15


@needs_netns
def test_a_host_cut_off_loses_its_rows_and_its_late_completes_are_refused() -> None:
    """Host A's link goes down for 3 leases while it renders; host B takes A's rows once A's
    leases and heartbeat lapse; when the link heals, A's late renews and completes are
    refused (LeaseLost, counted), and no row is lost or completed twice (the oracle:
    tests/lib/partition_lib.py)."""
    lease_s = 1.5  # beats every 0.5 s (TTL 1 s) reap A before its leases lapse
    with Partitioned(hosts=2, rows=60, lease_s=lease_s, heartbeat_s=0.5, render_s=0.25) as run:
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



# -- big queues: verify and save by chunks ---------------------------------------------------------


def _reference_export(eng: RedisEngine) -> dict[int, tuple[int, ...]]:
    """row -> (due, interval, failures, provenance, urgent, lane) from one MULTI/EXEC of the
    whole queue (``dump``): what a read by chunks of a queue at rest must give."""
    meta, table, ready, lease, holder = eng.dump()
    n = int(meta[b"next_row"])
    recs = records(table[:n * RECORD])
    flying = {m.decode() for m, _ in lease}
    key = {int(m): int(s) for m, s in ready}
    for row, h in split_holder(holder)[1].items():
        if h.batch in flying:
            key[row] = h.key
    return {row: (key[row] % STRIDE, int(recs["interval"][row]), int(recs["failures"][row]),
                  int(recs["flags"][row]) & 1, (int(recs["flags"][row]) >> 1) & 1,
                  key[row] // STRIDE)
            for row in range(n) if recs["flags"][row] & LIVE}


def _exported(rows: Any, cols: dict[str, Any]) -> dict[int, tuple[int, ...]]:
    names = ("due_ms", "interval_s", "failures", "provenance", "urgent", "lane")
    return {int(r): tuple(int(cols[c][i]) for c in names) for i, r in enumerate(rows)}


def _busy_queue(server: RedisServer, queue: str, n: int) -> RedisEngine:
    """``n`` rows over several lanes, some in flight, some failed, one rushed, one removed."""
    eng = Engine.connect(server.url, queue, create=True)
    rng = np.random.default_rng(7)
    eng.add_many(NOW - rng.integers(0, 10 * HOUR_MS, n), rng.choice([600, 3600, 86_400], n),
                 rng.choice(["submitted", "discovered"], n))
    batch = eng.claim(64, now_ms=NOW, lease_ms=HOUR_MS)
    eng.fail(int(batch.rows[0]), int(batch.tokens[0]), now_ms=NOW)
    eng.complete_many(batch.rows[1:8], batch.tokens[1:8], now_ms=NOW)
    eng.prioritize(3, "rush", now_ms=NOW)
    eng.remove(5)
    return eng


def test_verify_and_save_read_a_big_queue_by_chunks_and_see_what_one_snapshot_sees(
        server: RedisServer, queue: str, tmp_path: Any) -> None:
    eng = _busy_queue(server, queue, 3000)
    try:
        eng.scan_count = 50  # many SCAN steps
        client = server.client()
        client.config_resetstat()  # type: ignore[attr-defined]
        assert eng.verify() == []
        rows, cols = eng.export_rows()
        stats = client.info("commandstats")  # type: ignore[attr-defined]
        assert stats["cmdstat_zscan"]["calls"] >= 2 * 3000 // 50 // 2  # by steps, not whole
        assert "cmdstat_zrange" not in stats and "cmdstat_get" not in stats
        assert _exported(rows, cols) == _reference_export(eng)
        assert len(rows) == 2999 and 5 not in rows.tolist()
        assert eng.save(tmp_path / "ck.npz") == 2999
        ck = checkpoint.read(tmp_path / "ck.npz")
        assert ck.due_ms.tolist() == cols["due_ms"].tolist()
    finally:
        eng.close()


def test_verify_by_chunks_confirms_what_it_finds_broken(server: RedisServer,
                                                       queue: str) -> None:
    eng = _busy_queue(server, queue, 500)
    try:
        eng.scan_count = 7
        ready, lease, *_ = eng.keys
        client = server.client()
        held = eng.claim(1, now_ms=NOW + 1)
        client.zadd(ready, {member(10): 64 * STRIDE + 5})  # type: ignore[attr-defined]
        client.zadd(ready, {member(int(held.rows[0])): 7})  # type: ignore[attr-defined]
        client.zrem(ready, member(20))  # type: ignore[attr-defined]
        problems = eng.verify()
        assert "a row's lane is past the 64 a policy can make" in problems
        assert f"live row {int(held.rows[0])} is in 1 ready and 1 lease entries" in problems
        assert "live row 20 is in 0 ready and 0 lease entries" in problems
        assert len(problems) == 3, problems
    finally:
        eng.close()


def _churn(url: str, queue: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """Claims, completes, releases, abandoned leases (lapsing 100 ms later) and adds, in
    virtual time, as fast as one client goes, until ``stop``."""
    try:
        eng = Engine.connect(url, queue)
        now, i = NOW, 0
        held = eng.claim(16, now_ms=now, lease_ms=100)
        while not stop.is_set():
            i, now = i + 1, now + 10
            if i % 3 == 0:
                eng.release_many(held.rows, held.tokens)
            elif i % 3 == 1:
                eng.complete_many(held.rows, held.tokens, now_ms=now)
            if i % 20 == 0:
                eng.add_many([now] * 5, 600)
            held = eng.claim(16, now_ms=now, lease_ms=100)
        eng.close()
    except BaseException as e:  # reported by the test
        errors.append(e)


def _churning(server: RedisServer, queue: str, clients: int = 2) -> Any:
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_churn, args=(server.url, queue, stop, errors))
               for _ in range(clients)]
    for t in threads:
        t.start()

    def done() -> list[BaseException]:
        stop.set()
        for t in threads:
            t.join()
        return errors
    return done


def test_verify_by_chunks_under_writes_reports_no_false_problem(
        server: RedisServer, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows move between ready and flight behind the cursors, so the chunks look broken; the
    snapshot re-read of those rows finds nothing, and nothing is reported."""
    seen: list[tuple[bool, int]] = []  # (read by chunks, problems found)

    def watched(p: codec.QueueParts) -> tuple[list[str], set[int]]:
        found = walk(p)
        seen.append((p.only is None, len(found[0])))
        return found

    walk = codec.verify
    monkeypatch.setattr(codec, "verify", watched)
    eng = _busy_queue(server, queue, 2000)
    try:
        eng.scan_count = 20
        done = _churning(server, queue)
        try:
            found = [eng.verify() for _ in range(6)]
        finally:
            errors = done()
        assert errors == []
        assert found == [[]] * 6
        assert any(chunks and n for chunks, n in seen), "the writes never moved a row mid-read"
        assert eng.verify() == []
    finally:
        eng.close()


def test_a_save_under_writes_holds_every_row_live_throughout_once(server: RedisServer,
                                                                  queue: str) -> None:
    eng = _busy_queue(server, queue, 2000)
    try:
        eng.scan_count = 20
        done = _churning(server, queue)
        try:
            exports = [eng.export_rows() for _ in range(4)]
        finally:
            errors = done()
        assert errors == []
        for rows, cols in exports:
            got = rows.tolist()
            assert len(set(got)) == len(got) and got == sorted(got)
            assert set(range(2000)) - {5} <= set(got)  # live throughout: every one, once
            assert 5 not in got
            assert (cols["lane"] < 64).all() and (cols["due_ms"] >= NOW - 10 * HOUR_MS).all()
    finally:
        eng.close()
