"""The mechanics of the engine on Redis (engine/redis, docs/redis.md) on a real server: what
the contract suites (the modules marked ``contract``, run on both backends) do not hold --
connecting, the library and server version checks, lost servers, the queue's keys and layout,
tokens as the library encodes them, the claim FCALL held to ``reference_pass`` from any
starting credits, bad input refused before anything is sent, and no server left running."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import (
    BAND_INTERVALS,
    DAY,
    HOUR,
    LANE_INTERVALS,
    MINUTE,
    NOW,
    TEN_LANES,
    add_to_lane,
    dispose,
    lane_bounds,
    lane_counts,
    share_policies,
    ten_lanes,
    unique_name,
)
from redis_server import RedisServer, find_server  # noqa: E402

from engine import Engine, LanePolicy, LeaseLost, RedisEngine, checkpoint  # noqa: E402
from engine.errors import (  # noqa: E402
    CapacityError,
    EngineError,
    EngineTypeError,
    EngineValueError,
    LayoutMismatch,
    NotAllowed,
    SegmentMissing,
)
from engine.keys import STRIDE  # noqa: E402
from engine.policy import CLASSES, ONE, reference_pass  # noqa: E402
from engine.redis.codec import member, queue_keys  # noqa: E402

assert find_server() is not None, "redis-server is not installed (make test installs it)"

STATS_LANE_KEYS = {"lane", "name", "floor_minute", "queued", "due", "leased", "granted",
                   "spilled", "stale_skipped", "lease_refused"}


@pytest.fixture(scope="session")
def server(redis_server: RedisServer) -> RedisServer:
    """The session's server (tests/conftest.py), shared with the contract suites."""
    return redis_server


def _qname() -> str:
    return f"rl-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_queue(server: RedisServer) -> Iterator[Any]:
    """A factory of fresh queues (a new name each), dropped and closed afterwards."""
    made: list[RedisEngine] = []

    def make(policy: LanePolicy | None = None, **kw: Any) -> RedisEngine:
        eng = Engine.connect(server.url, _qname(), TEN_LANES if policy is None else policy,
                             create=True, **kw)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        if eng.transport.client is None:
            eng = RedisEngine.connect(server.url, eng.name)
        eng.drop()
        eng.close()


@pytest.fixture
def q(make_queue: Any) -> RedisEngine:
    return make_queue()


def _claim_one(eng: RedisEngine, now: int = NOW, lease_ms: int = 30_000) -> tuple[int, int]:
    c = eng.claim(budget=1, now_ms=now, lease_ms=lease_ms)
    assert len(c) == 1
    return int(c.rows[0]), int(c.tokens[0])


def _dump(eng: RedisEngine) -> tuple[Any, ...]:
    """Everything the queue holds on the server, for 'nothing changed' checks."""
    r = redis.Redis.from_url(eng.transport.url)
    try:
        ready, lease, rows, meta, holder = queue_keys(eng.name)
        return (r.zrange(ready, 0, -1, withscores=True), r.zrange(lease, 0, -1, withscores=True),
                r.get(rows), r.hgetall(meta), r.hgetall(holder))
    finally:
        r.close()


# -- connecting ---------------------------------------------------------------------------------


def test_connect_is_one_line_and_a_second_client_sees_the_same_queue(server, make_queue):
    eng = make_queue()
    assert isinstance(eng, RedisEngine)
    row = eng.add(NOW - MINUTE, 3600)
    with Engine.connect(server.url, eng.name) as other:
        assert other.describe(row) == eng.describe(row)
        r, tok = _claim_one(other)
        assert r == row
        eng.complete(row, tok, now_ms=NOW)  # a token works from any client
    assert eng.due_ms(row) == NOW + 3600 * 1000
    assert all(k.startswith(f"lanes:{{{eng.name}}}:") for k in eng.keys)  # one hash tag


def test_a_missing_queue_is_refused_without_create(server):
    with pytest.raises(SegmentMissing, match="create=True"):
        Engine.connect(server.url, _qname())


def test_attaching_with_another_policy_is_refused(server, make_queue):
    eng = make_queue(ten_lanes(cold_after=5))
    with pytest.raises(EngineValueError, match="set_policy"):
        Engine.connect(server.url, eng.name, ten_lanes(cold_after=4))
    with Engine.connect(server.url, eng.name, ten_lanes(cold_after=5)) as same:
        assert same.policy == ten_lanes(cold_after=5)


@pytest.mark.parametrize("name", ["", "a{b}", "x" * 201, 5])
def test_bad_queue_names_are_refused(server, name):
    with pytest.raises((EngineValueError, EngineTypeError)):
        Engine.connect(server.url, name, create=True)


def test_an_unreachable_server_is_named_without_its_password():
    url = "redis://alice:s3cret-pw@127.0.0.1:1/0"
    t0 = time.monotonic()
    with pytest.raises(EngineError) as info:
        Engine.connect(url, "q", timeout=0.3)
    assert time.monotonic() - t0 < 20  # gave up after its timeout: it does not hang
    assert "s3cret-pw" not in str(info.value)
    assert "alice:***@127.0.0.1:1" in str(info.value)


def test_a_server_without_functions_is_refused_naming_its_version(server, monkeypatch):
    real = redis.Redis.info

    def old_info(self, section=None, *args, **kw):
        out = real(self, section, *args, **kw)
        if section == "server":
            out = {**out, "redis_version": "6.2.14"}
        return out

    monkeypatch.setattr(redis.Redis, "info", old_info)
    with pytest.raises(EngineError, match=r"version 6\.2\.14.*Redis >= 7"):
        Engine.connect(server.url, _qname(), create=True)


def test_another_library_version_is_refused_unless_upgrading():
    old = ("#!lua name=render_lanes\n"
           "redis.register_function{function_name='lanes_version', "
           "callback=function() return {'0', '1'} end, flags={'no-writes'}}\n")
    with RedisServer() as srv:
        r = redis.Redis(unix_socket_path=srv.socket)
        eng = Engine.connect(srv.url, "q", create=True)
        eng.add(NOW, 60)
        r.function_load(old, replace=True)  # another deployment's library
        with pytest.raises(LayoutMismatch, match="version 0.*upgrade=True"):
            Engine.connect(srv.url, "q")
        with pytest.raises(LayoutMismatch):  # the running client fails clearly too
            eng.add(NOW, 60)
        with Engine.connect(srv.url, "q", upgrade=True) as up:
            assert up.add(NOW, 60) == 1
        assert eng.add(NOW, 60) == 2  # the library is ours again
        # A client of another version calling the current library is refused by it.
        with pytest.raises(redis.ResponseError, match="VERSION"):
            r.fcall("lanes_add", 5, *queue_keys("q"), "999", b"")
        eng.close()
        r.close()


def test_a_lost_server_is_an_engine_error_naming_the_url():
    srv = RedisServer().start()
    eng = Engine.connect(srv.url, "q", create=True, timeout=0.5)
    eng.add(NOW, 60)
    srv.stop()
    with pytest.raises(EngineError, match=f"lost Redis at unix://{srv.socket}"):
        eng.add(NOW, 60)  # a write is not replayed
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="lost Redis"):
        eng.stats()  # a read is retried for `timeout` seconds
    assert 0.2 < time.monotonic() - t0 < 20  # retried, then gave up
    eng.close()


def test_the_helper_server_leaves_nothing_behind():
    srv = RedisServer().start()
    pid, where = srv.proc.pid, srv.dir
    assert srv.ping()
    srv.stop()
    assert srv.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not os.path.exists(where)


# -- writes and reads ---------------------------------------------------------------------------


def test_describe_names_the_owner_of_a_live_lease_only(q):
    """A Redis-only field: the lease holder's owner id (``host:pid:start_ms``)."""
    row = q.add(NOW - MINUTE, 7200)
    assert q.describe(row, now_ms=NOW)["owner"] is None
    _claim_one(q, lease_ms=45_000)
    assert q.describe(row, now_ms=NOW)["owner"] == q.owner
    assert q.describe(row, now_ms=NOW + 45_000)["owner"] is None  # lapsed


def test_add_many_in_chunks_keeps_every_row(q):
    n = 25_000  # three FCALLs
    rows = q.add_many(np.arange(n) + NOW - DAY, 600)
    assert rows.tolist() == list(range(n))
    assert q.stats(NOW)["queued"] == n and q.verify() == []


def test_a_queue_may_be_bounded(make_queue):
    eng = make_queue(capacity=5)
    eng.add_many([NOW] * 4, 60)
    before = _dump(eng)
    with pytest.raises(CapacityError):
        eng.add_many([NOW] * 2, 60)
    assert _dump(eng) == before
    eng.add(NOW, 60)
    assert eng.stats()["capacity"] == 5


def test_complete_with_explicit_next_due_and_failures_reset(q):
    row = q.add(NOW - HOUR, 7200, failures=2)
    _, tok = _claim_one(q)
    q.complete(row, tok, next_due_ms=NOW + 123_456, now_ms=NOW)
    assert q.describe(row)["due_ms"] == NOW + 123_456
    assert q.describe(row)["failures"] == 0


def test_a_token_a_lua_number_cannot_hold_is_never_a_live_lease(q):
    """Tokens are sent as 0 unless in (0, 2**53): a negative or huge one is stale, and changes
    nothing on the server."""
    row = q.add(NOW - MINUTE, 3600)
    _, tok = _claim_one(q)
    before = _dump(q)
    for bad in (0, -5, -tok, 2**53 + tok, 2**62):
        with pytest.raises(LeaseLost):
            q.complete(row, bad, now_ms=NOW)
        assert q.release_many([row], [bad], now_ms=NOW).tolist() == [False]
        assert _dump(q) == before
    q.complete(row, tok, now_ms=NOW)
    assert q.verify() == []


def test_a_lapsed_lease_put_back_keeps_its_token_until_the_row_is_granted_again(q):
    """The Redis side of tests/contract/test_leases.py's contract test: a pass that puts a
    lapsed row back into ready without granting it (budget spent elsewhere) leaves the token
    valid."""
    row = q.add(NOW - MINUTE, 3600, provenance="discovered")  # lane 5
    _, tok = _claim_one(q, lease_ms=1000)
    first = q.add(NOW - DAY, 600)  # lane 1: the next pass grants this one, not the lapsed row
    assert q.claim(budget=1, now_ms=NOW + 5000).rows.tolist() == [first]
    assert q.describe(row, now_ms=NOW + 5000)["leased"] is False
    assert q.verify() == []
    new = q.renew(row, tok, lease_ms=60_000, now_ms=NOW + 5000)  # taken out of ready again
    assert q.describe(row, now_ms=NOW + 5000)["owner"] == q.owner
    assert q.claim(budget=5, now_ms=NOW + 6000).rows.tolist() == []
    assert q.verify() == []
    q.complete(row, new, now_ms=NOW + 7000)
    assert q.due_ms(row) == NOW + 7000 + 3600 * 1000
    assert q.verify() == []


def test_a_lapsed_lease_back_in_ready_keeps_the_key_it_has_there(q):
    """Layout 3 leaves a lapsed lease's holder entry in place until the row is granted again;
    the key in that entry is void once the row is back in ready. A prioritize there moves the
    row, and a release with the lapsed token must leave it where the prioritize put it, a
    renew must take it out with that key, and the next grant must spend the old token."""
    row = q.add(NOW - MINUTE, 3600, provenance="discovered")  # lane 5
    _, tok = _claim_one(q, lease_ms=1000)
    first = q.add(NOW - DAY, 600)  # lane 1: the next pass grants this one, not the lapsed row
    assert q.claim(budget=1, now_ms=NOW + 5000).rows.tolist() == [first]
    q.prioritize(row, "wait", now_ms=NOW + 6000)  # its own lane, due now: a new key
    assert (q.lane(row), q.due_ms(row)) == (5, NOW + 6000)
    assert q.verify() == []
    q.release(row, tok, now_ms=NOW + 7000)
    assert (q.lane(row), q.due_ms(row)) == (5, NOW + 6000)
    assert q.verify() == []
    with pytest.raises(LeaseLost):  # released: the token is spent
        q.release(row, tok, now_ms=NOW + 7000)

    _, tok = _claim_one(q, now=NOW + 8000, lease_ms=1000)
    assert q.claim(budget=1, now_ms=NOW + 10_000).rows.tolist() == [row]  # lapsed, granted again
    with pytest.raises(LeaseLost):
        q.complete(row, tok, now_ms=NOW + 10_000)
    assert q.verify() == []


def test_a_renew_of_a_lapsed_lease_takes_the_row_out_with_its_ready_key(q):
    row = q.add(NOW - MINUTE, 3600, provenance="discovered")
    _, tok = _claim_one(q, lease_ms=1000)
    q.add(NOW - DAY, 600)
    q.claim(budget=1, now_ms=NOW + 5000)  # puts the lapsed row back, grants the other one
    q.prioritize(row, "wait", now_ms=NOW + 6000)
    lane = q.lane(row)
    new = q.renew(row, tok, lease_ms=60_000, now_ms=NOW + 6000)
    d = q.describe(row, now_ms=NOW + 6000)
    assert (d["leased"], d["lane"], d["due_ms"]) == (True, lane, NOW + 6000)
    assert q.verify() == []
    q.release(row, new, now_ms=NOW + 7000)
    assert (q.lane(row), q.due_ms(row)) == (lane, NOW + 6000)
    assert q.verify() == []


def test_fail_backs_off_doubling_capped_at_the_interval_then_goes_cold(q):
    row = q.add(NOW - MINUTE, 600)
    now = NOW
    for backoff_ms in (30_000, 60_000, 600_000):  # cold at the third: its interval
        r, tok = _claim_one(q, now=now)
        q.fail(r, tok, now_ms=now)
        assert q.due_ms(row) == now + backoff_ms
        now += backoff_ms
    d = q.describe(row)
    assert d["failures"] == 3 and d["lane"] == ten_lanes().cold_lane  # cold_after = 3
    capped = q.add(NOW - MINUTE, 40)  # an interval of 40 s caps the back-off
    now = NOW
    for backoff_ms in (30_000, 40_000):
        r, tok = _claim_one(q, now=now)
        assert r == capped
        q.fail(r, tok, now_ms=now)
        assert q.due_ms(r) == now + backoff_ms
        now += backoff_ms


def test_tokens_survive_a_lost_second_of_writes(q, server):
    """A claim lost with the server's last second (everysec, host crash) rolls the token
    counter back; tokens seeded from the server clock are still never issued twice, so the
    lost grant's holder cannot complete the row under the new grant's lease."""
    row = q.add(NOW - MINUTE, 3600)
    r = redis.Redis(unix_socket_path=server.socket)
    before = {k: r.dump(k) for k in q.keys if r.exists(k)}
    got, lost = _claim_one(q)  # virtual time, but tokens follow the server's clock
    assert got == row and lost > (time.time() * 1000 - MINUTE) * 1024
    for k in q.keys:  # the server comes back as it was before that claim
        r.delete(k)
    for k, v in before.items():
        r.restore(k, 0, v)
    time.sleep(0.005)
    again, tok = _claim_one(q)
    assert again == row and tok > lost
    with pytest.raises(LeaseLost):
        q.complete(row, lost, now_ms=NOW)
    q.complete(row, tok, now_ms=NOW)
    assert q.verify() == []
    r.close()


@pytest.mark.parametrize("layout", ["1", "2", "3", "4"])
def test_an_older_layout_queue_is_refused_not_misread(q, server, layout):
    """Layout 1 (library 2: key and token in the record), layout 2 (library 3 or 4: the
    speed layout with unpadded members, or the padded members with 20-byte records), layout 3
    (libraries 5 to 7: a lease entry per row, holder entries ``token:key:owner``), layout 4
    (libraries 8 to 12: no lane interval bounds, which derived weights need)."""
    q.add(NOW - MINUTE, 3600)
    r = redis.Redis(unix_socket_path=server.socket)
    r.hset(q.keys[3], "layout", layout)
    with pytest.raises(LayoutMismatch, match=f"layout {layout}"):
        Engine.connect(server.url, q.name)
    with pytest.raises(LayoutMismatch, match=f"layout {layout}"):  # a connected client
        q.claim(budget=1, now_ms=NOW)
    r.hset(q.keys[3], "layout", "5")
    assert len(q.claim(budget=1, now_ms=NOW)) == 1
    r.close()


def test_prioritize_rush_and_wait(q):
    a = q.add(NOW + DAY, 7200, provenance="discovered")
    q.prioritize(a, "rush", now_ms=NOW)
    d = q.describe(a)
    assert d["lane"] == 0 and d["due_ms"] == NOW and d["urgent"]
    q.prioritize(a, "wait", now_ms=NOW + 1)
    d = q.describe(a)
    assert d["lane"] == 6 and d["due_ms"] == NOW + 1 and not d["urgent"]
    # a row in flight keeps its lease; its new key takes effect when the lease ends
    r, tok = _claim_one(q, now=NOW + 1)
    q.prioritize(a, "rush", now_ms=NOW + 2)
    assert q.describe(a, now_ms=NOW)["leased"] and len(q.claim(1, now_ms=NOW + 3)) == 0
    q.release(a, tok, now_ms=NOW + 3)
    c = q.claim(5, now_ms=NOW + 3)  # 5 x 0.2: one urgent grant
    assert c.lanes.tolist() == [0] and c.due_ms.tolist() == [NOW + 2]
    assert q.verify() == []


def test_remove_makes_a_lease_stale_and_a_second_remove_is_refused(q):
    row = q.add(NOW - MINUTE, 3600)
    _, tok = _claim_one(q)
    q.remove(row)
    d = q.describe(row)
    assert not d["queued"] and d["due_ms"] is None and d["lane"] is None and not d["leased"]
    with pytest.raises(LeaseLost):
        q.complete(row, tok, now_ms=NOW)
    for again in (lambda: q.remove(row), lambda: q.prioritize(row, "rush", now_ms=NOW)):
        with pytest.raises(EngineValueError):
            again()
    assert len(q.claim(5, now_ms=NOW + DAY)) == 0
    assert q.verify() == []


def test_a_row_that_does_not_exist_is_refused_and_nothing_changes(q):
    q.add(NOW, 60)
    before = _dump(q)
    for attempt in (lambda: q.describe(1), lambda: q.remove(7),
                    lambda: q.complete_many([0, 9], [1, 1], now_ms=NOW),
                    lambda: q.prioritize(3, "rush", now_ms=NOW)):
        with pytest.raises(EngineValueError, match="does not exist"):
            attempt()
    assert _dump(q) == before


def test_set_policy_is_live_and_rewrites_no_row(make_queue, server):
    q = make_queue()
    q.add_many(np.arange(50) + NOW - HOUR, 600, "discovered")
    scores = _dump(q)[0]
    new = ten_lanes(min_share={"discovered": 0.5}, urgent_max_share=0.1)
    with Engine.connect(server.url, q.name) as other:
        other.set_policy(new)
    assert q.policy == new
    assert _dump(q)[0] == scores
    with pytest.raises(EngineTypeError):
        q.set_policy({"cold_after": 3})


def test_restamp_moves_lane_zero_rows_into_their_lanes_in_bounded_steps(make_queue):
    q = make_queue(ten_lanes(lanes_enabled=False))
    rows = q.add_many(np.arange(30) + NOW - HOUR, 7200, "discovered")
    urgent = q.add(NOW, 600)
    q.prioritize(urgent, "rush", now_ms=NOW)
    r, tok = _claim_one(q)  # one in flight
    assert {q.lane(int(x)) for x in rows} == {0}
    assert q.restamp(limit=20) == {"restamped": 20, "done": False}
    assert q.restamp(limit=20) == {"restamped": 10, "done": True}
    assert q.restamp(limit=20) == {"restamped": 0, "done": True}
    assert {q.lane(int(x)) for x in rows} == {6}
    assert [q.due_ms(int(x)) for x in rows] == (np.arange(30) + NOW - HOUR).tolist()
    assert q.lane(urgent) == 0
    q.set_policy(ten_lanes())
    with pytest.raises(NotAllowed):
        q.restamp()
    q.release(r, tok, now_ms=NOW)
    assert q.verify() == []


def test_stats_report_the_engines_keys_per_lane(q):
    q.add_many(np.full(5, NOW - HOUR), 600)  # lane 1
    q.add_many(np.full(3, NOW + HOUR), 600, "discovered")  # lane 5, not due
    c = q.claim(budget=2, now_ms=NOW, lease_ms=10_000)
    s = q.stats(NOW)
    assert {"name", "layout_version", "capacity", "rows", "lanes"} <= set(s)
    lanes = {ln["lane"]: ln for ln in s["lanes"]}
    assert all(STATS_LANE_KEYS <= set(ln) for ln in s["lanes"])
    assert len(s["lanes"]) == ten_lanes().lane_count
    assert (lanes[1]["queued"], lanes[1]["due"], lanes[1]["leased"], lanes[1]["granted"]) == (
        5, 5, 2, 2)
    assert (lanes[5]["queued"], lanes[5]["due"]) == (3, 0)
    assert lanes[5]["floor_minute"] == (NOW + HOUR) // MINUTE
    assert lanes[1]["floor_minute"] == (NOW - HOUR) // MINUTE
    assert lanes[0]["floor_minute"] == 0
    assert q.floor_minute(5) == (NOW + HOUR) // MINUTE
    assert s["rows"] == 8 and s["queued"] == 8 and s["in_flight"] == 2
    assert s["owners"] == {q.owner: 2}
    assert q.stats(NOW + 10_000)["lanes"][1]["leased"] == 0  # lapsed
    q.complete_many(c.rows, c.tokens, now_ms=NOW)
    assert q.stats(NOW)["owners"] == {}


def test_verify_finds_a_broken_queue(q, server):
    rows = q.add_many(np.full(3, NOW - HOUR), 600)
    c = q.claim(1, now_ms=NOW)
    assert q.verify() == []
    r = redis.Redis(unix_socket_path=server.socket)
    ready, lease, *_ = q.keys
    r.zadd(ready, {member(int(rows[1])): 64 * STRIDE + 5})  # a key lives in one place
    r.zadd(ready, {member(int(c.rows[0])): 7})
    r.zrem(ready, member(int(rows[2])))
    problems = "\n".join(q.verify())
    assert "a row's lane is past the 64 a policy can make" in problems
    assert f"live row {int(c.rows[0])} is in 1 ready and 1 lease" in problems
    assert f"live row {int(rows[2])} is in 0 ready and 0 lease" in problems
    r.close()


# -- claims -------------------------------------------------------------------------------------


def test_a_dead_workers_many_leases_all_come_back(q):
    n = 2500  # more than one pass puts back (EXPIRE_BATCH)
    q.add_many(np.full(n, NOW - HOUR), 600)
    assert len(q.claim(budget=n, now_ms=NOW, lease_ms=1000, window=n)) == n
    got: set[int] = set()
    for _ in range(20):
        got |= set(q.claim(budget=500, now_ms=NOW + 1000, lease_ms=HOUR, window=500)
                   .rows.tolist())
        assert q.verify() == []
    assert got == set(range(n))


def test_rows_in_flight_are_never_read(make_queue, server):
    """10k rows leased cost a claim nothing: a pass reads only the ready ZSET, and rows in
    flight are not in it; the claims beside them grant a due row each, at once. (What a claim
    costs beside 10,000 leased rows is measured by bench/bench_redis_memory.py.)"""
    busy = make_queue()
    busy.add_many(np.full(200, NOW - HOUR), 600)
    busy.add_many(np.full(10_000, NOW - DAY), 600)  # earlier: the first to be claimed
    assert len(busy.claim(budget=10_000, now_ms=NOW, lease_ms=DAY, window=10_000)) == 10_000
    assert busy.stats(NOW)["in_flight"] == 10_000
    r = redis.Redis(unix_socket_path=server.socket)
    try:
        ready = {int(m) for m in r.zrange(busy.keys[0], 0, -1)}
    finally:
        r.close()
    assert ready == set(range(200)), "a row in flight is still in the ready set"
    for _ in range(60):
        c = busy.claim(budget=1, now_ms=NOW, lease_ms=DAY)
        assert len(c) == 1 and int(c.rows[0]) < 200  # one of the 200 queued rows
        busy.release(int(c.rows[0]), int(c.tokens[0]), now_ms=NOW)
    assert busy.verify() == []


def test_concurrent_clients_never_share_a_row(make_queue, server):
    q = make_queue()
    q.add_many(np.full(2000, NOW - HOUR), 600)
    seen: list[list[int]] = []

    def worker() -> None:
        with Engine.connect(server.url, q.name) as eng:
            mine: list[int] = []
            while True:
                c = eng.claim(budget=7, now_ms=NOW, lease_ms=DAY)
                if not len(c):
                    break
                mine += c.rows.tolist()
            seen.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [r for mine in seen for r in mine]
    assert sorted(every) == list(range(2000))
    assert q.verify() == []


def test_a_forked_child_keeps_using_the_parents_engine_as_a_new_owner(q):
    q.add_many(np.full(4, NOW - HOUR), 600)
    parent = q.owner
    _claim_one(q)
    pid = os.fork()
    if pid == 0:  # the child: its own connection (redis-py reconnects), its own owner id
        code = 1
        try:
            c = q.claim(budget=2, now_ms=NOW)
            code = 0 if len(c) == 2 and q.owner != parent else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    owners = q.stats(NOW)["owners"]
    assert owners[parent] == 1 and sum(owners.values()) == 3 and len(owners) == 2


@settings(max_examples=50, deadline=None)
@given(
    policy=share_policies(),
    rows=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5 * DAY)), max_size=100),
    budgets=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    credits=st.lists(st.integers(-ONE, 3 * ONE), min_size=4, max_size=4),
)
def test_claim_grants_what_the_reference_pass_grants(server, policy, rows, budgets, credits):
    """Per lane grants, EDF inside a lane and the share credits after every pass equal
    ``reference_pass`` for the same state, from random starting credits."""
    eng = Engine.connect(server.url, _qname(), policy, create=True)
    try:
        remaining: dict[int, dict[int, int]] = {lane: {} for lane in range(10)}
        for target, age in rows:
            row = add_to_lane(eng, target, NOW - age)
            remaining[target if policy.lanes_enabled else 0][row] = NOW - age
        r = redis.Redis(unix_socket_path=server.socket)
        r.hset(eng.keys[3], mapping={f"c{i}": v for i, v in enumerate(credits)})
        r.close()
        cred = dict(zip(CLASSES, credits, strict=True))
        for budget in budgets:
            due_lists = [sorted(remaining[lane].values()) for lane in range(10)]
            intervals = [[LANE_INTERVALS[lane]] * len(due_lists[lane]) for lane in range(10)]
            expected, cred = reference_pass(policy, budget, due_lists, cred, now=NOW,
                                            intervals=intervals, bounds=lane_bounds(eng))
            c = eng.claim(budget=budget, now_ms=NOW, lease_ms=DAY)
            assert lane_counts(c, 10) == expected, (budget, due_lists)
            for lane in range(10):
                got = sorted(d for d, ln in zip(c.due_ms.tolist(), c.lanes.tolist(),
                                                strict=True) if ln == lane)
                assert got == due_lists[lane][: expected[lane]]
            for row, lane in zip(c.rows.tolist(), c.lanes.tolist(), strict=True):
                del remaining[lane][row]
            assert eng.stats(NOW)["credits"] == {k: v / ONE for k, v in cred.items()}
        assert eng.verify() == []
    finally:
        eng.drop()
        eng.close()


# -- bad input ----------------------------------------------------------------------------------


BAD_CALLS = [
    ("add", lambda q: q.add(None, 60)),
    ("add", lambda q: q.add(float("nan"), 60)),
    ("add", lambda q: q.add(-1, 60)),
    ("add", lambda q: q.add(2**42, 60)),
    ("add", lambda q: q.add(NOW, 0)),
    ("add", lambda q: q.add(NOW, 60, provenance="sitemap")),
    ("add", lambda q: q.add(NOW, 60, failures=256)),
    ("add", lambda q: q.add(NOW, True)),
    ("add_many", lambda q: q.add_many([NOW, None], 60)),
    ("add_many", lambda q: q.add_many([NOW, NOW], [60])),
    ("add_many", lambda q: q.add_many([NOW, NOW + 0.5], 60)),
    ("add_many", lambda q: q.add_many([NOW], 60, ["submitted", "x"])),
    ("claim", lambda q: q.claim(budget=0)),
    ("claim", lambda q: q.claim(budget=1.5)),
    ("claim", lambda q: q.claim(budget=1, window=0)),
    ("claim", lambda q: q.claim(budget=1, lease_ms=0)),
    ("claim", lambda q: q.claim(budget=1, now_ms=float("inf"))),
    ("claim", lambda q: q.claim(budget=10**6)),
    ("complete", lambda q: q.complete(0, 1, next_due_ms=float("nan"))),
    ("complete", lambda q: q.complete(0.0, 1)),
    ("complete", lambda q: q.complete(-1, 1)),
    ("complete", lambda q: q.complete(0, "1")),
    ("complete_many", lambda q: q.complete_many([0, 1], [1])),
    ("complete_many", lambda q: q.complete_many([[0]], [1])),
    ("complete_many", lambda q: q.complete_many([0], [1], next_due_ms=[1, 2])),
    ("complete_and_claim", lambda q: q.complete_and_claim([0], [1], budget=0)),
    ("fail", lambda q: q.fail(0, 1, retry_at_ms=-5)),
    ("fail", lambda q: q.fail(0, 1, permanent=1)),
    ("release", lambda q: q.release(None, 1)),
    ("release_many", lambda q: q.release_many([0], [1, 2])),
    ("renew", lambda q: q.renew(0, 1, lease_ms=0)),
    ("prioritize", lambda q: q.prioritize(0, "now")),
    ("prioritize", lambda q: q.prioritize(0, "rush", now_ms=-1)),
    ("remove", lambda q: q.remove(True)),
    ("set_policy", lambda q: q.set_policy(None)),
    ("restamp", lambda q: q.restamp(limit=0)),
    ("describe", lambda q: q.describe("0")),
    ("lane_name", lambda q: q.lane_name(64)),
    ("stats", lambda q: q.stats(now_ms=-3)),
]


def _fcalls(server: RedisServer) -> int:
    r = redis.Redis(unix_socket_path=server.socket)
    try:
        return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))
    finally:
        r.close()


@pytest.mark.parametrize("what,call", BAD_CALLS, ids=[f"{w}-{i}" for i, (w, _) in
                                                    enumerate(BAD_CALLS)])
def test_bad_input_is_refused_before_anything_is_sent(q, server, what, call):
    q.add(NOW - MINUTE, 60)
    before, fcalls = _dump(q), _fcalls(server)
    sent: list[tuple[Any, ...]] = []
    real = q.transport.client.execute_command

    def spy(*args: Any, **kw: Any) -> Any:
        sent.append(args)
        return real(*args, **kw)

    q.transport.client.execute_command = spy
    with pytest.raises((EngineValueError, EngineTypeError)):
        call(q)
    q.transport.client.execute_command = real
    assert sent == []
    assert _fcalls(server) == fcalls
    assert _dump(q) == before


# -- checkpoints --------------------------------------------------------------------------------


def test_save_and_load_round_trip_and_cross_into_shared_memory(q, server, tmp_path):
    rows = q.add_many(np.arange(6) + NOW - HOUR, [600, 7200, 600, 43200, 600, 172800],
                      ["submitted", "discovered"] * 3, failures=[0, 1, 0, 0, 4, 0])
    q.remove(int(rows[2]))
    q.prioritize(int(rows[3]), "rush", now_ms=NOW - 7)
    _claim_one(q, now=NOW - 7)  # leases are not saved: the row comes back due
    urls = [f"https://example.test/{i}" for i in range(6)]
    path = tmp_path / "q.ckpt"
    assert q.save(path, urls=urls) == 5
    ck = checkpoint.read(path)
    assert ck.urls == [urls[i] for i in (0, 1, 3, 4, 5)]
    assert ck.urgent.tolist() == [0, 0, 1, 0, 0] and ck.failures.tolist() == [0, 1, 0, 4, 0]
    assert ck.policy == q.policy

    name = _qname()
    back = RedisEngine.load(path, server.url, name)
    try:
        kept = [int(r) for r in rows if int(r) != 2]
        for new, old in enumerate(kept):
            a, b = back.describe(new, now_ms=NOW), q.describe(old, now_ms=NOW)
            for k in ("due_ms", "lane", "interval_s", "failures", "provenance", "urgent"):
                assert a[k] == b[k], (k, a, b)
        assert back.verify() == []
        with pytest.raises(EngineValueError, match="already exists"):
            RedisEngine.load(path, server.url, name)
    finally:
        back.drop()
        back.close()

    shm = unique_name()
    eng = Engine.load(path, shm)
    try:
        for new, old in enumerate(kept):
            assert eng.describe(new)["due_ms"] == q.describe(old)["due_ms"]
            assert eng.lane(new) == q.lane(old)
    finally:
        dispose(eng, shm)


# -- memory -------------------------------------------------------------------------------------


def test_memory_per_row_is_within_budget():
    """docs/redis.md: about 120 bytes per row at 100k rows (goal <= 160), default settings."""
    with RedisServer() as srv:
        r = redis.Redis(unix_socket_path=srv.socket)
        base = r.info("memory")["used_memory"]
        with Engine.connect(srv.url, "mem", create=True) as eng:
            rng = np.random.default_rng(3)
            n = 100_000
            eng.add_many(NOW + rng.integers(-DAY, DAY, n), rng.choice(BAND_INTERVALS, n),
                         rng.integers(0, 2, n))
            per_row = (r.info("memory")["used_memory"] - base) / n
        r.close()
    assert per_row <= 160, per_row


# -- layout 4: a lease entry per batch ------------------------------------------------------------

BATCH_OPS = st.lists(st.tuples(
    st.sampled_from(["claim", "complete", "release", "fail", "renew", "complete_some", "lapse",
                     "remove"]),
    st.integers(1, 6), st.integers(0, 1 << 30)), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(ops=BATCH_OPS)
def test_a_batch_keeps_one_lease_entry_until_its_last_row_ends_or_it_lapses(server, ops):
    """Layout 4: ``lease`` holds one entry per claimed batch (member = its first token, score =
    its expiry) while any of its rows is in flight under it, and none once its last row ended
    (completed, released, failed, removed, or renewed into a batch of its own) or it lapsed;
    a renewed row is a batch of one. Checked against a model after every step, with
    ``verify()`` (which checks the batch records' counts and every row's expiry) empty."""
    eng = Engine.connect(server.url, _qname(), create=True)
    r = redis.Redis(unix_socket_path=server.socket)
    try:
        eng.add_many(np.arange(20) + NOW - HOUR, 600)
        now = NOW
        held: dict[int, tuple[int, int, int]] = {}  # row -> (token, batch, expiry) in flight
        for op, k, pick in ops:
            mine = sorted(held)
            chosen = [mine[(pick + i) % len(mine)] for i in range(min(k, len(mine)))]
            chosen = list(dict.fromkeys(chosen))
            if op == "claim":
                c = eng.claim(budget=k, now_ms=now, lease_ms=5000)
                for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                    held[row] = (tok, int(c.tokens[0]), now + 5000)
            elif op == "lapse":
                now += 6000
                for row in [row for row, (_t, _b, exp) in held.items() if exp <= now]:
                    del held[row]  # the next claim pass puts the batch's rows back
                eng.claim(budget=1, now_ms=now, lease_ms=5000)  # expire; may grant one
                held.update({int(row): (int(tok), int(tok), now + 5000) for row, tok in
                             zip(*_grants_since(eng, r, held), strict=True)})
            elif chosen and op in ("complete", "release", "complete_some"):
                end = eng.complete_many if op != "release" else eng.release_many
                ok = end(chosen, [held[row][0] for row in chosen], now_ms=now)
                assert ok.all()
                for row in chosen:
                    del held[row]
            elif chosen and op == "fail":
                eng.fail(chosen[0], held.pop(chosen[0])[0], now_ms=now)
            elif chosen and op == "remove":
                eng.remove(chosen[0])
                del held[chosen[0]]
            elif chosen and op == "renew":
                new = eng.renew(chosen[0], held[chosen[0]][0], lease_ms=7000, now_ms=now)
                held[chosen[0]] = (new, new, now + 7000)
            batches = {m.decode(): int(s) for m, s in r.zrange(eng.keys[1], 0, -1,
                                                                  withscores=True)}
            assert batches == {str(b): exp for _t, b, exp in held.values()}
            assert eng.verify() == []
            for row, (_tok, _b, exp) in held.items():
                d = eng.describe(row, now_ms=now)
                assert d["leased"] and d["lease_expiry_ms"] == exp
    finally:
        r.close()
        eng.drop()
        eng.close()


def _grants_since(eng: RedisEngine, r: Any, held: dict[int, Any]) -> tuple[list[int], list[int]]:
    """(rows, tokens) held in flight on the server that the model does not know: what the
    expiring claim of one row granted (read back from the holder entries of live batches)."""
    batches = {m.decode() for m in r.zrange(eng.keys[1], 0, -1)}
    rows, tokens = [], []
    for f, v in r.hgetall(eng.keys[4]).items():
        if f.startswith(b"b"):
            continue
        token, batch = v.decode().split(":", 2)[:2]
        if batch in batches and int(f) not in held and r.zscore(eng.keys[0], f) is None:
            rows.append(int(f))
            tokens.append(int(token))
    return rows, tokens


def test_a_claim_pass_puts_back_lapsed_batches_whole_and_bounded(q, server):
    """The expiry step of a pass puts lapsed batches back whole (every row of a batch, its
    lease entry and record together), and stops taking batches once their rows reach 1000
    (EXPIRE_ROWS in the Lua library): three lapsed batches of 600 rows come back as two, then
    one."""
    q.add_many(np.full(1800, NOW - HOUR), 600)
    firsts = [int(q.claim(budget=600, now_ms=NOW + i, lease_ms=1000, window=600).tokens[0])
              for i in range(3)]
    r = redis.Redis(unix_socket_path=server.socket)
    try:
        def leased() -> list[str]:
            return [m.decode() for m in r.zrange(q.keys[1], 0, -1)]

        assert leased() == [str(t) for t in firsts]
        assert q.claim(budget=1, now_ms=NOW + 5000, lease_ms=60_000).rows.size == 1
        assert leased()[:1] == [str(firsts[2])] and len(leased()) == 2  # + the new batch of one
        assert r.zcard(q.keys[0]) == 1200 - 1 and q.verify() == []
        assert q.claim(budget=1, now_ms=NOW + 5000, lease_ms=60_000).rows.size == 1
        assert str(firsts[2]) not in leased() and len(leased()) == 2
        assert r.zcard(q.keys[0]) == 1800 - 2 and q.verify() == []
    finally:
        r.close()
