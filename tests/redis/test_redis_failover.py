"""Failover, WAIT and moving slots, against real redis-server and redis-sentinel processes.

A primary SIGKILLed under running ``lanes pool --redis`` pools (tests/lib/failover_lib.py):
behind Sentinel (``redis+sentinel://``) and in a cluster with a replica per primary, the pools
follow the promoted replica and no row is lost; with ``--wait-replicas 1`` no acknowledged
write is lost either. Without WAIT an acknowledged add *can* be lost (the replica lagged when the
primary died): shown on purpose, and the same add with WAIT is not acknowledged. A queue's slot
migrated key by key while pools claim: ASK and TRYAGAIN are waited out, no error surfaces.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from failover_lib import ClusterTarget, FailoverConfig, FailoverRun, SentinelTarget
from pool_testlib import running
from redis_server import LocalCluster, RedisServer, SentinelGroup, module_server, wait_for

from engine import Engine
from engine.cli import main
from engine.errors import EngineError, EngineValueError, OutcomeUnknown
from engine.redis.codec import queue_keys
from engine.redis.sentinel import split_sentinel_url
from engine.redis.transport import durability, redact, with_wait
from engine.redis.urls import RedisUrls


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelTarget]:
    target = SentinelTarget().start()
    yield target
    target.stop()
    assert running({p.pid for p in target.group.sentinel_procs}) == set()
    assert all(not os.path.exists(s.dir) for s in target.group.servers)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from module_server()


def _queue() -> str:
    return f"rl-fo-{uuid.uuid4().hex[:10]}"


# -- URLs and options ----------------------------------------------------------------------------


def test_a_sentinel_url_names_its_sentinels_master_and_options() -> None:
    hosts, master, options, own = split_sentinel_url(
        "redis+sentinel://u:p%40ss@10.0.0.1:26379,[::1]:26380/jobs?db=2&socket_timeout=3"
        "&sentinel_password=s")
    assert hosts == [("10.0.0.1", 26379), ("::1", 26380)] and master == "jobs"
    assert options == {"db": 2, "socket_timeout": 3.0, "username": "u", "password": "p@ss"}
    assert own == {"password": "s"}
    assert redact("redis+sentinel://u:pw@h:1,h:2/m?sentinel_password=s") == \
        "redis+sentinel://u:***@h:1,h:2/m?sentinel_password=***"
    for bad in ("redis+sentinel://h:1", "redis+sentinel://h:1/", "redis+sentinel://h/m",
                "redis+sentinel://h:1,h:x/m", "redis+sentinel://h:1/a/b"):
        with pytest.raises(EngineValueError, match="bad Redis URL"):
            Engine.connect(bad, "q")


def test_wait_replicas_rides_in_the_url_and_is_checked() -> None:
    assert durability("redis://h:1/0?wait_replicas=2&db=1") == ("redis://h:1/0?db=1", 2, 1000)
    assert durability("redis://h:1?wait_replicas=1&wait_timeout_ms=50") == ("redis://h:1", 1, 50)
    assert with_wait("redis://h:1/0?wait_replicas=3", 1) == "redis://h:1/0?wait_replicas=1"
    for bad in ("?wait_replicas=x", "?wait_replicas=-1", "?wait_timeout_ms=0"):
        with pytest.raises(EngineValueError, match="wait_"):
            Engine.connect("redis://127.0.0.1:1" + bad, "q")
    with pytest.raises(EngineValueError):
        Engine.connect("redis://127.0.0.1:1", "q", wait_replicas=-1)


def test_wait_replicas_on_the_command_line_is_for_pools_on_redis(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("url,interval_s\nhttps://a.example/,60\n")
    assert main(["pool", "q", "--corpus", str(corpus), "--render", "failover_lib:render",
                 "--wait-replicas", "1"]) == 2
    assert "--wait-replicas is for pools on Redis" in capsys.readouterr().err


def test_a_write_no_replica_acknowledges_in_time_is_applied_and_reported_unknown(
        server: RedisServer) -> None:
    name = _queue()
    with Engine.connect(server.url, name, create=True) as plain:
        waiting = Engine.connect(server.url + "?wait_timeout_ms=30", name, wait_replicas=1)
        try:
            with pytest.raises(OutcomeUnknown, match="0 of 1 replica"):
                waiting.add(0, 60)
            assert plain.stats()["rows"] == 1  # applied on the primary all the same
            with pytest.raises(EngineValueError):  # a refusal is raised as itself
                waiting.remove(7)
        finally:
            waiting.close()
        plain.drop()


# -- a primary killed under running pools --------------------------------------------------------


def test_pools_follow_a_sentinel_failover_and_lose_no_row(
        sentinels: SentinelTarget, tmp_path: Path) -> None:
    res = FailoverRun(FailoverConfig(), sentinels, _queue(), str(tmp_path)).run()
    print("\nsentinel, no WAIT:", res.summary())
    assert res.problems() == [], res.summary()
    assert res.kills == 1 and res.checks.rows == 3000 and res.checks.drained == 3000
    # down-after 500 ms, the vote (a split vote retries after 2 failover-timeouts), back-off
    assert max(res.stalls) < 15, res.summary()
    assert res.renders > res.rerenders and res.acked_adds > 0


def test_with_wait_replicas_no_acknowledged_write_is_lost_in_a_cluster_failover(
        tmp_path: Path) -> None:
    """And a client that connects while the failover is under way (a worker restarted just
    then) waits for the promoted replica instead of for its timeout."""
    target = ClusterTarget(node_timeout_ms=1000).start()
    name = _queue()
    connected: list[float] = []

    def kill_and_connect() -> None:
        cluster = target.cluster
        old = cluster.by_port(target.home(name))
        old.kill()
        t0 = time.monotonic()
        with Engine.connect(target.url, name, timeout=30) as eng:
            assert eng.stats()["rows"] == 3000
        connected.append(time.monotonic() - t0)
        wait_for(lambda: target.home(name) != old.port, 20, "no replica took over")
        target.rejoin(old)

    try:
        res = FailoverRun(FailoverConfig(wait_replicas=1), target, name,
                          str(tmp_path)).run(disrupt=kill_and_connect)
    finally:
        target.stop()
    print("\ncluster, --wait-replicas 1:", res.summary(), f"connected in {connected}")
    assert connected and connected[0] < 20  # the failover (~2.5 s), not the 30 s timeout
    assert res.problems() == [], res.summary()
    assert res.checks.rows == 3000 and res.checks.drained == 3000
    assert res.acked_adds_lost == 0 and res.acked_completes_lost == 0, res.summary()
    assert res.acked_adds > 0 and res.acked_completes > 0
    assert max(res.stalls) < 15, res.summary()


def test_an_acknowledged_add_is_lost_when_the_replica_lags_unless_writes_wait(
        sentinels: SentinelTarget) -> None:
    """Async replication's window made wide on purpose: the replica stopped while the primary
    queues more than the sockets hold, an add acknowledged, the primary killed. The promoted
    replica never got the add. The same add with wait_replicas=1 is not acknowledged
    (OutcomeUnknown): the caller knows to look before relying on it."""
    group = sentinels.group
    name = _queue()
    eng = Engine.connect(group.url, name, create=True)
    waiting = Engine.connect(with_wait(group.url, 1) + "&wait_timeout_ms=100", name)
    try:
        table = RedisUrls(eng)
        table.add([f"https://before.example/{i}" for i in range(50)], [0] * 50, 3600)
        primary = group.primary()
        replica = next(s for s in group.servers if s is not primary)
        assert replica.proc is not None
        group_client: Any = primary.client()
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            for i in range(12):  # 96 MB of replication stream: more than the sockets can hold
                group_client.set(f"ballast:{i}", b"x" * (8 << 20))
            acked = table.add(["https://acked.example/"], [0], 3600)
            assert acked.added == 1
            with pytest.raises(OutcomeUnknown, match="0 of 1 replica"):
                RedisUrls(waiting).add(["https://waited.example/"], [0], 3600)
            primary.kill()
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        group.await_promotion(replica)
        group.rejoin(primary)
        urls = set(RedisUrls(eng).urls())
        assert "https://acked.example/" not in urls  # acknowledged, then lost: said in docs
        assert {f"https://before.example/{i}" for i in range(50)} <= urls  # replicated: kept
        assert eng.verify() == [] and eng.stats()["rows"] == 50
        table.drop()
        eng.drop()
    finally:
        waiting.close()
        eng.close()
        group.primary().client().flushall()  # type: ignore[attr-defined]


# -- a slot that moves while pools claim ---------------------------------------------------------


def test_pools_claim_on_while_their_queue_slot_migrates_key_by_key(tmp_path: Path) -> None:
    target = ClusterTarget(replicas=0).start()
    cluster = target.cluster
    name = _queue()
    watcher: list[Any] = []
    surfaced: list[Exception] = []
    halt = threading.Event()

    def watch() -> None:  # an engine of our own on the queue: it counts what it waited out
        eng = Engine.connect(target.url, name)
        watcher.append(eng)
        try:
            while not halt.is_set():
                eng.stats()
                held = eng.claim(1, lease_ms=5000)
                if len(held):
                    eng.release(int(held.rows[0]), int(held.tokens[0]))
        except Exception as e:  # noqa: BLE001 -- any error surfacing is the failure here
            surfaced.append(e)

    def migrate() -> None:
        spare = next(n.port for n in cluster.nodes if n.port != target.home(name))
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        cluster.move_slot(queue_keys(name)[0], int(spare or 0), pause_s=0.15)
        halt.set()
        thread.join(timeout=30)

    try:
        # Claims wait while the keys are split (TRYAGAIN): a lease longer than the migration
        # keeps every row held meanwhile, so none is rendered twice.
        cfg = FailoverConfig(before_s=0.5, after_s=0.5, lease_s=5.0)
        res = FailoverRun(cfg, target, name, str(tmp_path)).run(disrupt=migrate)
        retried = watcher[0].transport.retried
        watcher[0].close()
    finally:
        halt.set()
        target.stop()
    print("\nslot migration:", res.summary(), dict(retried))
    assert surfaced == []
    assert res.problems() == [], res.summary()
    assert res.checks.rows == 3000 and res.checks.drained == 3000
    assert res.unknown == {} and res.probe_errors == {}, res.summary()
    assert retried["TryAgainError"] + retried["AskError"] + retried["asking"] > 0, retried
    assert res.rerenders == 0, res.summary()  # nothing lost, nothing applied twice


def test_a_call_meeting_tryagain_then_ask_runs_once_on_the_importing_node() -> None:
    """Step by step: one key of the queue moved (its FCALLs answered TRYAGAIN: backed off),
    then the rest (ASK: sent to the importing node behind ASKING, where it runs as all its keys
    are there), then a read meeting ASK (backed off until the slot is handed over, then MOVED:
    followed)."""
    cluster = LocalCluster(3).start()
    name = _queue()
    try:
        eng = Engine.connect(cluster.url, name, create=True)
        eng.add_many([0] * 10, 60)
        eng.claim(2, lease_ms=60_000)  # every key of a claim exists (leases: lease, holder)
        home = cluster.node_of(queue_keys(name)[0])
        spare = next(int(n.port or 0) for n in cluster.nodes if n.port != home)
        move = cluster.begin_move(queue_keys(name)[0], spare)
        keys = move.keys()
        assert len(keys) == 5
        move.migrate(keys[:1])
        later = threading.Timer(0.3, lambda: move.migrate(move.keys()))
        later.start()
        held = eng.claim(2, lease_ms=60_000)
        later.join()
        retried = eng.transport.retried
        assert len(held) == 2 and retried["TryAgainError"] >= 1 and retried["asking"] >= 1
        handing = threading.Timer(0.3, move.hand_over)
        handing.start()
        stats = eng.stats()
        handing.join()
        assert retried["AskError"] >= 1
        assert stats["in_flight"] == 4 and stats["queued"] == 10  # the claim ran once
        assert eng.transport.client.connection_pool.connection_kwargs["port"] == spare
        assert eng.verify() == []
        eng.close()
    finally:
        cluster.stop()


def test_a_connection_to_a_dead_sentinel_group_fails_after_the_timeout() -> None:
    group = SentinelGroup()  # never started: nobody listens on its ports
    with pytest.raises(EngineError, match=r"cannot reach .*tried for 0.3 s"):
        Engine.connect(group.url, "q", timeout=0.3)
