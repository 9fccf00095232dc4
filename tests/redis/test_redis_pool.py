"""Render pools on Redis (docs/redis.md "Pools on several hosts"): a pool over a Redis queue
renders every row once; two pools started as two hosts (their own process groups and local
names) share one queue, and when one is SIGKILLed whole, the other renders its rows once their
leases expire, never within a lease the dead pool held; ``lanes add --redis`` grows the queue
while both run; a dead worker's leases come back at once (``RedisEngine.reap``). Every test runs
against a real redis-server it starts and stops, and leaves no file, process or server."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from lanes_testlib import unique_name
from pool_testlib import (
    cli,
    corpus,
    files_of,
    kill_host,
    rendered,
    running,
    until_all,
    wait_for,
)
from redis_server import RedisServer, find_server, fresh_queue, module_server

from engine import Engine, checkpoint
from engine.corpus.routes import Route, Routes
from engine.errors import CapacityError, EngineValueError, SegmentExists, SegmentMissing
from engine.keys import PARKED_MS
from engine.pool import Pool, PoolOptions
from engine.pool.render import RenderSpec
from engine.pool.supervisor import remove_local_files
from engine.redis import queue_keys
from engine.redis.restore import restore
from engine.redis.urls import RedisUrls, pool_keys

assert find_server() is not None, "redis-server is not installed (make test installs it)"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from module_server()


@pytest.fixture
def queue(server: RedisServer) -> Iterator[str]:
    yield from fresh_queue(server, "rl-test-")


def _env(**more: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k.startswith("RL_TEST_")}
    return {**keep, **more}


def _csv(path: Path, urls: list[str]) -> Path:
    path.write_text("url,interval_s,provenance\n" + "".join(f"{u},3600,submitted\n"
                                                             for u in urls))
    return path


def _urls(n: int, start: int = 0) -> list[str]:
    return [f"https://shop.example/p/{i}" for i in range(start, start + n)]


# -- the URL table in Redis ---------------------------------------------------------------------


def test_urls_are_added_with_their_rows_once_and_a_parked_one_is_made_due(
        server: RedisServer, queue: str) -> None:
    eng = Engine.connect(server.url, queue, create=True, capacity=6)
    try:
        table = RedisUrls(eng)
        now = int(time.time() * 1000)
        got = table.add(["a", "b", "a", "c"], [now] * 4, 3600)
        assert got.rows.tolist() == [0, 1, 0, 2] and got.new.tolist() == [True, True, False, True]
        assert table.urls() == ["a", "b", "c"] and len(table) == 3
        assert table.many([2, 0]) == ["c", "a"] and table[1] == "b" and table.find("c") == 2
        batch = eng.claim(1)
        eng.fail(int(batch.rows[0]), int(batch.tokens[0]), retry_at_ms=PARKED_MS)
        again = table.add(["a", "d"], [now, now], 60)
        assert again.rows.tolist() == [0, 3] and again.unparked == 1 and again.added == 1
        assert eng.describe(0)["due_ms"] < PARKED_MS
        before = (eng.stats()["rows"], table.urls())
        with pytest.raises(CapacityError):  # 3 new rows, room for 2: nothing changes
            table.add(["e", "f", "g"], [now] * 3, 60)
        assert (eng.stats()["rows"], table.urls()) == before
        with pytest.raises(EngineValueError):
            table.add(["x\ny"], [now], 60)
        with pytest.raises(EngineValueError):
            table.find("nowhere")
        assert eng.verify() == []
        assert all(k.startswith(f"lanes:{{{queue}}}:") for k in pool_keys(queue))
    finally:
        eng.close()


def _start_as_a_host(url: str, queue: str, urls: list[str], start: Any, out: Any) -> None:
    """What ``lanes pool QUEUE --redis URL --corpus FILE`` does before it forks (Pool._on_redis):
    join, or create when missing, then add the corpus; the forked child reports what it did."""
    from engine.pool.grow import add_urls

    try:
        start.wait(10)
        try:
            eng = Engine.connect(url, queue)
        except SegmentMissing:
            eng = Engine.connect(url, queue, create=True)
        now = int(time.time() * 1000)
        got = add_urls(RedisUrls(eng), urls, np.full(len(urls), now), 3600, "submitted")
        out.send(("ok", got.added, got.known))
        eng.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test
        out.send(("error", repr(e), 0))
    finally:
        out.close()


def test_hosts_started_at_the_same_instant_make_one_queue_and_add_each_url_once(
        server: RedisServer, queue: str) -> None:
    ctx = multiprocessing.get_context("fork")
    urls = _urls(3000)
    start = ctx.Barrier(4)
    pipes = [ctx.Pipe(duplex=False) for _ in range(4)]
    procs = [ctx.Process(target=_start_as_a_host, args=(server.url, queue, urls, start, w))
             for _, w in pipes]
    for p in procs:
        p.start()
    results = [r.recv() if r.poll(60) else ("error", "no reply", 0) for r, _ in pipes]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert all(status == "ok" for status, _, _ in results), results
    assert sum(added for _, added, _ in results) == len(urls)  # each URL added by one host
    assert all(added + known == len(urls) for _, added, known in results)
    with Engine.connect(server.url, queue) as eng:
        table = RedisUrls(eng)
        assert eng.stats()["rows"] == len(urls) and eng.verify() == []
        assert sorted(table.urls()) == sorted(urls)
        assert sorted(table.find(u) for u in urls) == list(range(len(urls)))


# -- one pool on Redis --------------------------------------------------------------------------


def test_a_pool_on_redis_renders_every_row_once_and_leaves_the_queue(
        server: RedisServer, queue: str, log: Path, tmp_path: Path) -> None:
    local = unique_name()
    c = corpus(40)
    path = tmp_path / "ck.npz"
    pool = Pool.create(queue, c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:record"),
                       PoolOptions(env=_env(), workers=2, checkpoint=str(path)),
                       redis=server.url, local=local)
    assert pool.added is not None and pool.added.added == 40
    summary = pool.run(seconds=60, until=until_all(log, 40))
    seen = Counter(u for _, u in rendered(log))
    assert set(seen) == set(c["urls"]) and max(seen.values()) == 1
    assert summary["renders"] == 40 and summary["problems"] == []
    assert files_of(local) == [] and files_of(queue) == []
    assert running({pid for pid, _ in rendered(log)}) == set()
    saved = checkpoint.read(path)  # saved from Redis, URLs with their rows
    assert sorted(saved.urls or []) == sorted(c["urls"])
    eng = Engine.connect(server.url, queue)  # the queue outlives its pool
    try:
        stats = eng.stats()
        assert stats["rows"] == 40 and stats["queued"] == 40 and stats["in_flight"] == 0
        assert eng.verify() == []
    finally:
        eng.close()


def test_joining_a_queue_that_does_not_exist_says_how_to_make_it(
        server: RedisServer, queue: str) -> None:
    local = unique_name()
    with pytest.raises(SegmentMissing, match="--corpus"):
        Pool.join(server.url, queue, RenderSpec(callable="pool_renders:record"), local=local)
    assert files_of(local) == []
    p = cli("pool", queue, "--redis", server.url, "--render", "pool_renders:record",
            "--local-name", local)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--corpus" in err and "no queue" in err
    assert files_of(local) == []


def test_a_killed_worker_s_rows_are_claimable_at_once(server: RedisServer, queue: str,
                                                      log: Path) -> None:
    """RedisEngine.reap: the dead worker held its row under a 60 s lease; the supervisor puts
    it back as soon as it sees the worker gone, so another renders it within seconds."""
    local = unique_name()
    c = corpus(12)
    urls = list(c["urls"])
    urls[5] += "/slow"  # hangs on its first render
    pool = Pool.create(queue, urls, c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:slow_first"),
                       PoolOptions(env=_env(), workers=2, lease_s=60.0, grace_s=5.0),
                       redis=server.url, local=local)
    marker = Path(str(log) + ".slow")
    killed: list[int] = []

    def tick(p: Pool) -> None:
        if marker.exists() and not killed and marker.read_text():
            killed.append(int(marker.read_text()))
            os.kill(killed[0], signal.SIGKILL)

    t0 = time.monotonic()
    summary = pool.run(seconds=40, on_tick=tick, until=lambda: bool(killed) and until_all(
        log, 12)() and pool.board.totals()["restarts"] >= 1)
    assert killed, "the slow render never started"
    # the slow render's lease was taken after t0 and lasts 60 s: rendering its row again before
    # t0 + 60 s means reap() put it back, not its expiry
    assert time.monotonic() - t0 < 60
    assert [pid for pid, u in rendered(log) if u == urls[5]] != []
    assert summary["restarts"] >= 1 and summary["problems"] == []
    assert files_of(local) == []


def test_two_pools_on_one_host_need_two_local_names(server: RedisServer, queue: str,
                                                    log: Path) -> None:
    local = unique_name()
    c = corpus(4)
    spec = RenderSpec(callable="pool_renders:record")
    first = Pool.create(queue, c["urls"], c["due_ms"], c["interval_s"], c["provenance"], spec,
                        PoolOptions(env=_env(), workers=1), redis=server.url, local=local)
    try:
        with pytest.raises(SegmentExists, match="--local-name"):
            Pool.join(server.url, queue, spec, local=local)
    finally:
        first.close()
    assert files_of(local) == []


# -- two hosts ----------------------------------------------------------------------------------


def _pool_cli(server: RedisServer, queue: str, local: str, csv: Path, lease: str) -> Any:
    """``lanes pool`` as a host of its own (a new session); ``kill_host`` ends all of it."""
    return cli("pool", queue, "--redis", server.url, "--corpus", str(csv), "--local-name", local,
               "--render", "pool_renders:leased", "--workers", "2", "--batch", "4", "--lease",
               lease, "--grace", "5", "--plain", start_new_session=True)


def _leases(log: Path) -> list[dict[str, Any]]:
    path = Path(str(log) + ".leases")
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, row, token, start, expiry, url = line.split(" ", 5)
        out.append({"pid": int(pid), "row": int(row), "token": int(token), "start": int(start),
                    "expiry": None if expiry == "None" else int(expiry), "url": url})
    return out


def _held_by(server: RedisServer, queue: str, pids: set[int]) -> dict[int, int]:
    """{row: lease expiry ms} of the rows leased by processes ``pids`` (one MULTI/EXEC)."""
    import redis

    _ready, lease, _rows, _meta, holder = queue_keys(queue)
    client = redis.Redis.from_url(server.url)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.hgetall(holder)
        pipe.zrange(lease, 0, -1, withscores=True)
        entries, batches = pipe.execute()
    finally:
        client.close()
    ends = {m.decode(): int(score) for m, score in batches}  # a lease entry per batch
    held = {}
    for row, entry in entries.items():
        if row.startswith(b"b"):  # a batch's record, not a row
            continue
        # token:batch:n:expiry:key:owner, owner = host:pid:start_ms
        _token, batch, _n, expiry, _key, owner = entry.decode().split(":", 5)
        if batch in ends and int(owner.rsplit(":", 2)[1]) in pids:
            assert int(expiry) == ends[batch]  # a row's entry carries its batch's expiry
            held[int(row)] = ends[batch]
    return held


def _pool_pids(p: Any) -> set[int]:
    try:
        return {p.pid} | {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def test_two_hosts_share_one_queue_and_survive_one_killed_whole(
        server: RedisServer, queue: str, log: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lease_s = 1.5
    monkeypatch.setenv("RL_TEST_REDIS", server.url)
    monkeypatch.setenv("RL_TEST_QUEUE", queue)
    first, extra = _urls(240), _urls(60, start=240)
    csv = _csv(tmp_path / "corpus.csv", first)
    locals_ = (unique_name(), unique_name())
    a = _pool_cli(server, queue, locals_[0], csv, str(lease_s))
    wait_for(lambda: len(rendered(log)) >= 4)
    b = _pool_cli(server, queue, locals_[1], csv, str(lease_s))  # the same command: joins
    pools: list[Any] = [a, b]
    try:
        # Both render, then the corpus grows from a third process while both run.
        wait_for(lambda: {pid for pid, _ in rendered(log)} & _pool_pids(b) != set())
        added = cli("add", queue, "--redis", server.url, "--corpus",
                    str(_csv(tmp_path / "extra.csv", extra)))
        out, err = added.communicate(timeout=60)
        assert added.returncode == 0, err
        assert "60 new URL(s) added" in out
        # Host A dies whole: supervisor and workers, mid-run, leases held.
        a_pids = _pool_pids(a)
        assert len(a_pids) >= 3
        held = _held_by(server, queue, a_pids)  # row -> lease expiry, read just before
        kill_from_ms = time.time_ns() // 1_000_000
        kill_host(a.pid)  # every process stopped, then killed: none runs after it returns
        killed_ms = time.time_ns() // 1_000_000
        a.communicate(timeout=30)
        wait_for(lambda: not running(a_pids), timeout=10)
        wait_for(until_all(log, 300), timeout=120)
        stats = cli("stats", queue, "--redis", server.url, "--local-name", locals_[1], "--json")
        out, err = stats.communicate(timeout=60)
        assert stats.returncode == 0, err
        report = json.loads(out)
        assert report["rows"] == 300 and report["pool"]["supervisor_running"] is True
        b.send_signal(signal.SIGTERM)
        out, err = b.communicate(timeout=60)
        assert b.returncode == 0, err
        assert "invariants: hold" in out and "0 new URL(s) added, 240 known" in out
    finally:
        for p in pools:
            if p.poll() is None:
                kill_host(p.pid)
                p.communicate()

    try:
        _check_two_hosts(server, queue, log, locals_, first + extra, a_pids, held, kill_from_ms,
                         killed_ms)
    finally:  # the dead host's files, had a check failed before its restart removed them
        remove_local_files(locals_[0])


def _check_two_hosts(server: RedisServer, queue: str, log: Path, locals_: tuple[str, str],
                     urls: list[str], a_pids: set[int], held: dict[int, int],
                     kill_from_ms: int, killed_ms: int) -> None:
    """After both pools stopped: the lease-log oracle, the queue, the files host A left (host A
    was killed from ``kill_from_ms`` to ``killed_ms``: no process of it ran after)."""
    renders = rendered(log)
    by_url = Counter(u for _, u in renders)
    assert set(by_url) == set(urls)
    b_pids = {pid for pid, _ in renders} - a_pids
    assert {pid for pid, _ in renders} & a_pids and b_pids  # both hosts rendered some

    # The lease-log oracle: a row is rendered again only by the other host, after the dead
    # host's lease on it ended (never within a lease), and with a newer token.
    starts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for entry in _leases(log):
        starts[entry["row"]].append(entry)
    assert len(starts) == 300
    twice = 0
    for row, entries in starts.items():
        entries.sort(key=lambda e: e["start"])
        assert len(entries) <= 2, (row, entries)
        assert entries[-1]["pid"] not in a_pids or len(entries) == 1
        if len(entries) == 2:
            twice += 1
            dead, again = entries
            assert dead["pid"] in a_pids and again["pid"] not in a_pids, entries
            assert dead["start"] <= killed_ms and kill_from_ms < again["start"], entries
            assert dead["expiry"] is not None and again["start"] >= dead["expiry"], entries
            assert again["token"] > dead["token"], entries
    again_urls = {e[0]["url"] for e in starts.values() if len(e) == 2}
    assert all(n == 1 for u, n in by_url.items() if u not in again_urls)
    assert twice <= 2 * 4  # at most a batch per dead worker was mid-render
    # Every row the dead host held came back, but only once its lease had run out (unless the
    # dead host completed it between that look and the kill).
    assert held
    done_by_a = {u for pid, u in renders if pid in a_pids}
    for row, expiry in held.items():
        later = [e for e in starts[row] if e["pid"] not in a_pids]
        assert all(e["start"] >= max(expiry, kill_from_ms) for e in later), (row, later)
        assert later or {e["url"] for e in starts[row]} <= done_by_a, (row, starts[row])

    eng = Engine.connect(server.url, queue)
    try:
        assert eng.verify() == []
        stats_after = eng.stats()
        assert stats_after["rows"] == 300 and stats_after["queued"] == 300  # queued or leased
    finally:
        eng.close()
    # The dead host's files stay until it starts again (or `lanes cleanup`); nothing else.
    assert files_of(locals_[0]) != [] and files_of(locals_[1]) == []
    again = Pool.join(server.url, queue, RenderSpec(callable="pool_renders:record"),
                      local=locals_[0])
    again.close()
    assert files_of(locals_[0]) == [] and files_of(queue) == []
    assert running({pid for pid, _ in renders} | a_pids) == set()


def test_cli_commands_work_against_the_redis_queue(server: RedisServer, queue: str, log: Path,
                                                   tmp_path: Path) -> None:
    local = unique_name()
    urls = _urls(6) + ["https://shop.example/gone/1"]
    c = corpus(len(urls))
    routes = Routes((Route("fast", "https://shop.example/fast/*", False, 120),))
    pool = Pool.create(queue, urls, c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:gone_or_flaky",
                                  permanent_errors=("Gone",)),
                       PoolOptions(env=_env(), workers=1), redis=server.url, local=local,
                       routes=routes)
    try:
        pool.start()
        wait_for(lambda: len(rendered(log)) >= 6 and pool.board.totals()["failures"] >= 1)
        redis = ("--redis", server.url)
        for args, expect in (
                (("check", queue, *redis), "ok"),
                (("stats", queue, *redis, "--local-name", local, "--plain"), "per lane"),
                (("stats", queue, *redis, "--local-name", local, "--prometheus"),
                 "lanes_pool_renders"),
                (("failures", queue, *redis, "--local-name", local), "gone/1"),
                (("prioritize", queue, *redis, "--url", urls[2]), "rush"),
                (("add", queue, *redis, "--corpus", str(_csv(tmp_path / "c.csv", urls[:2]))),
                 "0 new URL(s) added"),
                (("add", queue, *redis, "--corpus",  # the routes the pool started with apply
                  str(_csv(tmp_path / "d.csv", ["https://shop.example/fast/1"]))),
                 "1 new URL(s) added as rows 7..7")):
            p = cli(*args)
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, (args, err)
            assert expect in out, (args, out)
        assert pool.engine.describe(7)["interval_s"] == 120
        assert pool.urls[7] == "https://shop.example/fast/1"
    finally:
        pool.shutdown()
    assert files_of(local) == []


# -- a queue moves between shared memory and Redis (lanes pool --resume --redis) ------------------


def _schedule(ck: checkpoint.Checkpoint) -> list[tuple[Any, ...]]:
    """A checkpoint's rows as (url, due, interval, failures, provenance, urgent), saved order."""
    return list(zip(ck.urls or [], *(c.tolist() for c in (
        ck.due_ms, ck.interval_s, ck.failures, ck.provenance, ck.urgent)), strict=True))


def _stop(p: Any) -> str:
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "invariants: hold" in out, out
    return str(out)


def test_a_queue_moves_from_shared_memory_to_redis_and_back(
        server: RedisServer, queue: str, log: Path, tmp_path: Path) -> None:
    """A shared-memory pool's checkpoint (one URL failing for good, one rushed row) becomes a
    Redis queue with ``lanes pool --resume --redis``: the same rows in the same order with their
    URLs, schedule and failure log, plus a --corpus's new URLs, which the pool renders; the
    Redis pool's checkpoint at its stop goes back to shared memory with ``lanes pool
    --resume``, again the same schedule."""
    shm_name, local = unique_name(), unique_name()
    ck_path = tmp_path / "ck.npz"
    urls = _urls(8) + ["https://shop.example/gone/1"]
    c = corpus(len(urls))
    pool = Pool.create(shm_name, urls, c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:gone_or_flaky",
                                  permanent_errors=("Gone",)),
                       PoolOptions(env=_env(), workers=2, checkpoint=str(ck_path)))
    pool.engine.prioritize(2, "rush", now_ms=int(c["due_ms"][2]) + 3_600_000)  # in an hour
    summary = pool.run(seconds=60, until=lambda: until_all(log, 7)() and pool.board.totals()[
        "failures"] >= 1)
    assert summary["problems"] == [] and files_of(shm_name) == []
    from_shm = checkpoint.read(ck_path)
    assert from_shm.urls == urls and from_shm.extra["failures"]
    assert int(from_shm.urgent[2]) == 1 and int(from_shm.failures[8]) >= 1

    more = _csv(tmp_path / "more.csv", _urls(3, start=100))
    p = cli("pool", queue, "--redis", server.url, "--resume", "--checkpoint", str(ck_path),
            "--corpus", str(more), "--local-name", local, "--render",
            "pool_renders:record", "--workers", "2", "--seconds", "60", "--plain")
    try:
        wait_for(until_all(log, 7 + 3), timeout=60)
        eng = Engine.connect(server.url, queue)
        try:
            table = RedisUrls(eng)
            assert table.urls() == urls + _urls(3, start=100)
            rows, cols = eng.export_rows()
            assert rows.tolist() == list(range(len(urls) + 3)) and eng.verify() == []
            for col in ("due_ms", "interval_s", "failures", "provenance", "urgent"):
                assert cols[col][:len(urls)].tolist() == getattr(from_shm, col).tolist(), col
            assert eng.describe(2)["lane"] == 0  # rushed, due when it was
            fails = cli("failures", queue, "--redis", server.url, "--local-name", local)
            out, err = fails.communicate(timeout=60)
            assert fails.returncode == 0 and "gone/1" in out, (out, err)
        finally:
            eng.close()
        out = _stop(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert "--corpus: 3 new URL(s) added" in out
    assert files_of(local) == []
    from_redis = checkpoint.read(ck_path)  # the Redis pool's, at its stop
    assert _schedule(from_redis)[:len(urls)] == _schedule(from_shm)
    assert from_redis.urls == urls + _urls(3, start=100) and from_redis.extra["failures"]

    back = unique_name()
    q = cli("pool", back, "--resume", "--checkpoint", str(ck_path), "--render",
            "pool_renders:record", "--workers", "1", "--seconds", "60", "--plain")
    try:
        wait_for(lambda: os.path.exists(f"/dev/shm/{back}.pool"), timeout=60)
        wait_for(lambda: checkpoint.read(ck_path).name == back or _running_pool(back),
                 timeout=60)
        _stop(q)
    finally:
        if q.poll() is None:
            q.kill()
            q.communicate()
    assert files_of(back) == []
    again = checkpoint.read(ck_path)
    assert again.name == back and _schedule(again) == _schedule(from_redis)
    assert again.extra["failures"] == from_redis.extra["failures"]


def _running_pool(name: str) -> bool:
    from engine.pool.supervisor import supervisor_running

    return supervisor_running(name) is not None


def test_resume_into_a_queue_that_exists_is_refused_and_says_how_to_go_on(
        server: RedisServer, queue: str, tmp_path: Path) -> None:
    local = unique_name()
    ck_path = tmp_path / "ck.npz"
    eng = Engine.connect(server.url, queue, create=True)
    try:
        table = RedisUrls(eng)
        table.add(_urls(4), [0] * 4, 60)
        checkpoint.save(eng, ck_path, table.urls)
        before = (eng.stats()["rows"], table.urls(), eng.verify())
        p = cli("pool", queue, "--redis", server.url, "--resume", "--checkpoint", str(ck_path),
                "--render", "pool_renders:record", "--local-name", local)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and "already exists" in err and "without --resume" in err, err
        assert (eng.stats()["rows"], table.urls(), eng.verify()) == before
        assert files_of(local) == []
        p = cli("pool", queue, "--redis", server.url, "--resume", "--render",
                "pool_renders:record", "--local-name", local)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and "--checkpoint" in err, err
        # URL keys an earlier queue of the name left (its queue deleted alone): refused too,
        # and the queue it had begun to make is deleted again.
        eng.drop()
        with pytest.raises(SegmentExists, match="URL keys"):
            restore(checkpoint.read(ck_path), server.url, queue)
        with pytest.raises(SegmentMissing):
            Engine.connect(server.url, queue)
        table.drop()
        with pytest.raises(EngineValueError, match="capacity"):
            restore(checkpoint.read(ck_path), server.url, queue, capacity=3)
        made, urls = restore(checkpoint.read(ck_path), server.url, queue)
        assert urls.urls() == _urls(4) and made.stats()["rows"] == 4 and made.verify() == []
        made.close()
    finally:
        eng.close()
