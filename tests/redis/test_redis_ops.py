"""The Redis backend in operation (docs/redis.md, "Operations"): a server killed mid-run with
AOF ``appendfsync always`` and restarted on the same directory loses no row and grants no row
twice while workers keep going; a lost connection is ``OutcomeUnknown``, never a replay; a
server that stays down is a clear error after a bounded wait; a Redis Cluster serves queues
on different nodes. Every server here is started by the test and removed afterwards."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lanes_testlib import NOW
from redis_server import LocalCluster, RedisServer, find_server, free_port

from engine import Engine, LeaseLost, OutcomeUnknown, RedisEngine
from engine.errors import EngineError
from engine.redis import LIBRARY_VERSION, queue_keys
from engine.shm.engine import wall_ms

assert find_server() is not None, "redis-server is not installed (make test installs it)"

LEASE_MS = 1500
ROWS = 120
WORKERS = 3

# -- the worker loop docs/redis.md recommends, logging every lease ------------------------------


def _end(eng: RedisEngine, what: str, row: int, token: int) -> None:
    if what == "complete":
        eng.complete(row, token)
    elif what == "fail":
        eng.fail(row, token)
    else:
        eng.release(row, token)


def worker(url: str, name: str, log_path: str, stop_at: float, seed: int) -> None:
    """Claim, "render", end each lease (complete / fail / release, or abandon it) until
    ``stop_at``, through a server crash. Log lines (ms of this host's clock, which the server
    shares):

    * ``C row token t0 t1``: a lease granted by a claim sent at t0, answered at t1;
    * ``E row token outcome t0 t1``: an attempt to end it: ``ok`` (applied), ``lost``
      (LeaseLost: not applied, the lease had ended), ``unknown`` (the connection was lost).

    On ``OutcomeUnknown`` a fenced write (complete, fail, release) is sent once more: if the
    first one was applied the token is stale and the second changes nothing (LeaseLost). A
    claim whose outcome is unknown is not retried: whatever it leased lapses.
    """
    rng = random.Random(seed)
    eng = Engine.connect(url, name, timeout=20)
    with open(log_path, "w", buffering=1) as log:
        while time.time() < stop_at:
            t0 = wall_ms()
            try:
                batch = eng.claim(budget=4, lease_ms=LEASE_MS)
            except OutcomeUnknown:
                continue
            t1 = wall_ms()
            for row, token in zip(batch.rows.tolist(), batch.tokens.tolist(), strict=True):
                log.write(f"C {row} {token} {t0} {t1}\n")
            if not len(batch):
                time.sleep(0.01)
                continue
            time.sleep(rng.uniform(0, 0.02))  # the render
            for row, token in zip(batch.rows.tolist(), batch.tokens.tolist(), strict=True):
                what = rng.choices(["complete", "fail", "release", "abandon"], [6, 1, 1, 1])[0]
                if what == "abandon":  # a worker that dies: the lease lapses
                    continue
                for _attempt in range(2):
                    e0 = wall_ms()
                    try:
                        _end(eng, what, row, token)
                        outcome = "ok"
                    except LeaseLost:
                        outcome = "lost"
                    except OutcomeUnknown:
                        outcome = "unknown"
                    log.write(f"E {row} {token} {outcome} {e0} {wall_ms()}\n")
                    if outcome != "unknown":
                        break
    eng.close()


def overlaps(logs: list[Path], lease_ms: int) -> list[str]:
    """The oracle: per row, leases in the order the server granted them must not overlap. That
    order is the tokens': each claim's first token is above every token before it, the counter
    persisted with the grant (AOF, fsync always), so it survives the restart. (Ordered by the
    time a claim was sent instead, two claims that reached the server in the other order, the
    first released within the millisecond, read as a double grant.) Times are brackets (sent,
    answered) of calls the server timed with the same clock, so a violation is reported only
    when it is certain: the later grant was answered before the earlier lease could have ended
    at the earliest, i.e. before min(its expiry, the first end attempt that may have been
    applied)."""
    claims: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    ends: dict[tuple[int, int], int] = {}
    for path in logs:
        for line in path.read_text().splitlines():
            f = line.split()
            if f[0] == "C":
                claims[int(f[1])][int(f[2])] = (int(f[3]), int(f[4]))
            elif f[3] != "lost":  # ok or unknown: the lease may have ended then
                key = (int(f[1]), int(f[2]))
                ends[key] = min(ends.get(key, 1 << 62), int(f[4]))
    problems = []
    for row, leases in claims.items():
        order = sorted(leases.items())  # by token: the order the server granted them
        for (tok_a, (a0, _a1)), (tok_b, (_b0, b1)) in zip(order, order[1:], strict=False):
            end_a = min(a0 + lease_ms, ends.get((row, tok_a), 1 << 62))
            if b1 < end_a:
                problems.append(f"row {row}: token {tok_b} granted at <= {b1} while token "
                                f"{tok_a} held it until >= {end_a}")
    return problems


def test_a_server_killed_mid_run_loses_no_row_and_grants_no_row_twice(tmp_path):
    srv = RedisServer(aof=True).start()
    try:
        with Engine.connect(srv.url, "ops", create=True) as eng:
            # due now and every second after: rows are claimed again and again
            eng.add_many(np.full(ROWS, wall_ms() - 1000), 1)
        stop_at = time.time() + 5.0
        logs = [tmp_path / f"w{i}.log" for i in range(WORKERS)]
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=worker, args=(srv.url, "ops", str(logs[i]), stop_at, i))
                 for i in range(WORKERS)]
        for p in procs:
            p.start()
        time.sleep(1.5)
        before = sum(1 for path in logs for line in path.read_text().splitlines()
                     if line[0] == "C")
        srv.kill()  # SIGKILL mid-run: no shutdown, the AOF as it was fsynced
        time.sleep(1.0)  # the workers meet a dead server, back off, retry
        srv.start()  # same directory, same socket: replays the AOF
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0] * WORKERS
        lines = [line for path in logs for line in path.read_text().splitlines()]
        after = sum(1 for line in lines if line[0] == "C")
        assert before > 20 and after > before + 20, "the workers claimed before and after"
        problems = overlaps(logs, LEASE_MS)
        assert not problems, problems[:5]
        with Engine.connect(srv.url, "ops") as eng:
            assert eng.verify() == []
            stats = eng.stats()
            assert stats["rows"] == ROWS and stats["queued"] == ROWS  # every row ready or leased
            # appendfsync always: no acknowledged claim was lost, so no token was issued twice
            tokens = [int(line.split()[2]) for line in lines if line[0] == "C"]
            assert len(tokens) == len(set(tokens))
            meta = srv.client().hget(queue_keys("ops")[3], "token")  # type: ignore[attr-defined]
            assert int(meta) >= max(tokens)
    finally:
        srv.stop()


def test_the_oracle_catches_a_row_granted_twice(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("C 7 1 1000 1002\nC 7 2 1500 1501\n"  # token 2 granted inside token 1's lease
                   "C 8 3 1000 1001\nE 8 3 ok 1100 1101\nC 8 4 1200 1201\n"  # completed first
                   # token 6's claim was sent first but reached the server after token 5's,
                   # which was released before token 6 was granted: no overlap
                   "C 9 6 1000 1003\nC 9 5 1001 1002\nE 9 5 ok 1002 1002\n")
    assert overlaps([log], 1500) == ["row 7: token 2 granted at <= 1501 while token 1 held it "
                                     "until >= 2500"]


# -- lost connections ---------------------------------------------------------------------------


def test_a_call_whose_connection_is_lost_after_sending_is_outcome_unknown_and_not_replayed():
    with RedisServer() as srv:
        eng = Engine.connect(srv.url, "q", create=True, timeout=5)
        eng.add(NOW - 1000, 60)
        admin: Any = srv.client()
        admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # our FCALL waits, sent
        killer = threading.Timer(0.3, lambda: admin.execute_command(
            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
        killer.start()
        with pytest.raises(OutcomeUnknown, match="may or may not have been applied"):
            eng.claim(budget=1, now_ms=NOW)
        killer.join()
        admin.execute_command("CLIENT", "UNPAUSE")
        # not replayed: the row was never leased; the next call reconnects by itself
        assert eng.describe(0, now_ms=NOW)["leased"] is False
        assert len(eng.claim(budget=1, now_ms=NOW)) == 1
        assert eng.verify() == []
        eng.close()


def test_a_server_that_stays_down_is_a_clear_error_after_the_bounded_wait():
    port = free_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=rf"127\.0\.0\.1:{port}") as err:
        Engine.connect(url, "q", timeout=1.0)
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 20, waited  # retried for its timeout, then gave up
    assert "s3cret" not in str(err.value) and "tried for 1 s" in str(err.value)


def test_a_server_lost_under_a_connected_engine_is_a_clear_error_after_the_bounded_wait():
    srv = RedisServer(aof=True).start()
    try:
        url = f"unix://{srv.socket}?password=s3cret"  # redis-py takes a password there too
        srv.client().config_set("requirepass", "s3cret")  # type: ignore[attr-defined]
        eng = Engine.connect(url, "q", create=True, timeout=1.0)
        eng.add(NOW, 60)
        srv.kill()
        for call in (lambda: eng.claim(budget=1, now_ms=NOW), lambda: eng.stats(now_ms=NOW)):
            t0 = time.monotonic()
            with pytest.raises(EngineError, match="lost Redis at unix://") as err:
                call()
            assert 0.9 <= time.monotonic() - t0 < 20  # retried for its timeout, then gave up
            assert "s3cret" not in str(err.value) and "password=***" in str(err.value)
            assert not isinstance(err.value, OutcomeUnknown)  # nothing was sent
        eng.close()
    finally:
        srv.stop()


# -- Redis Cluster ------------------------------------------------------------------------------


def _on_other_nodes(cluster: LocalCluster) -> tuple[str, str]:
    """Two queue names whose slots two different primaries serve."""
    first = "alpha"
    node = cluster.node_of(queue_keys(first)[0])
    for i in range(100):
        other = f"beta{i}"
        if cluster.node_of(queue_keys(other)[0]) != node:
            return first, other
    raise AssertionError("no second node found")


def test_a_cluster_serves_two_queues_on_different_primaries():
    cluster = LocalCluster(3).start()
    dirs = [n.dir for n in cluster.nodes]
    try:
        a, b = _on_other_nodes(cluster)
        admin: Any = cluster.nodes[0].client()
        slots = {int(admin.cluster("keyslot", k)) for k in queue_keys(a)}
        assert len(slots) == 1  # a queue is one slot
        engines = {n: Engine.connect(cluster.url, n, create=True) for n in (a, b)}
        for name, eng in engines.items():
            assert eng.transport.cluster is not None  # detected from INFO cluster
            port = eng.transport.client.connection_pool.connection_kwargs["port"]
            assert port == cluster.node_of(queue_keys(name)[0])
        for node in cluster.nodes:  # the library is on every primary
            version = node.client().fcall_ro("lanes_version", 0)  # type: ignore[attr-defined]
            assert version[0].decode() == LIBRARY_VERSION
        for name, eng in engines.items():
            rows = eng.add_many([NOW - 3000, NOW - 2000, NOW - 1000, NOW + 60_000], 60)
            assert rows.tolist() == [0, 1, 2, 3]
            first = eng.claim(budget=2, now_ms=NOW, lease_ms=10_000)
            assert first.rows.tolist() == [0, 1]
            ok, second = eng.complete_and_claim(first.rows, first.tokens, budget=4, now_ms=NOW)
            assert ok.tolist() == [True, True] and second.rows.tolist() == [2]
            assert eng.due_ms(0) == NOW + 60_000
            assert len(eng.claim(budget=4, now_ms=NOW)) == 0  # row 3 is not due
            stats = eng.stats(now_ms=NOW)
            assert stats["queued"] == 4 and stats["in_flight"] == 1, name
            assert eng.verify() == []
        homes = [cluster.node_of(queue_keys(n)[0]) for n in engines]
        for node in cluster.nodes:  # each queue's five keys live on its node only
            assert node.client().dbsize() == 5 * homes.count(node.port)  # type: ignore
        # a slot that moves (resharding): the next call meets MOVED, follows it, and runs once
        eng = engines[a]
        home = cluster.node_of(queue_keys(a)[0])
        spare = next(n.port for n in cluster.nodes if n.port not in (home, cluster.node_of(
            queue_keys(b)[0])))
        cluster.move_slot(queue_keys(a)[0], spare)
        held = eng.claim(budget=4, now_ms=NOW + 60_000)  # every row due, row 2's lease lapsed
        assert sorted(held.rows.tolist()) == [0, 1, 2, 3]
        assert eng.transport.client.connection_pool.connection_kwargs["port"] == spare
        assert eng.verify() == [] and eng.stats(now_ms=NOW)["in_flight"] == 4
        for eng in engines.values():
            eng.drop()
            eng.close()
        with pytest.raises(EngineError, match="not a cluster node"):
            with RedisServer() as single:
                Engine.connect(single.url, "q", create=True, cluster=True)
    finally:
        cluster.stop()
    assert not any(os.path.exists(d) for d in dirs)
