"""A Redis queue over N shards (engine/redis/shards.py): routing, shares, refusals, moves, pools.

Each shard is a whole queue, so what a single queue holds is tested on one already (the contract
suites); these tests hold what spreading adds: row ids and tokens that map back, claims that go
round the shards and move on when one comes back short, lane shares that stay the policy's
across shards, each shard's pass equal to ``reference_pass``, a shard count that is recorded and
enforced (with how to move), and the pool's URLs and commands across shards, on one server and
on a cluster of three primaries.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lanes_testlib import (
    DAY,
    HOUR,
    LANE_INTERVALS,
    NOW,
    add_to_lane,
    ten_lanes,
    unique_name,
)
from pool_testlib import corpus, rendered, until_all, wait_for
from redis_server import LocalCluster, RedisServer, module_server

from engine import Engine, LanePolicy, LeaseLost, checkpoint
from engine.checks import wall_ms
from engine.cli import main as lanes
from engine.errors import (
    EngineError,
    EngineTypeError,
    EngineValueError,
    LayoutMismatch,
    SegmentExists,
    SegmentMissing,
)
from engine.policy import INTERVALS, reference_pass
from engine.pool import Pool, PoolOptions
from engine.pool.render import RenderSpec
from engine.redis import RedisEngine, queue_keys
from engine.redis.catalog import MAX_SHARDS, ShardsMismatch, catalog_key, shard_keys
from engine.redis.restore import restore
from engine.redis.shard_urls import ShardedUrls
from engine.redis.shards import STAY, ShardedEngine

N = 3


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from module_server()


@pytest.fixture
def sharded(server: RedisServer) -> Iterator[Any]:
    """A factory of new queues over ``N`` shards (``policy``, ``capacity``); all dropped after."""
    made: list[Any] = []

    def make(policy: LanePolicy | None = None, capacity: int | None = None,
             shards: int = N) -> ShardedEngine:
        eng = Engine.connect(server.url, unique_name(), policy, create=True, shards=shards,
                             capacity=capacity)
        assert isinstance(eng, ShardedEngine)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.row_urls().drop()
        eng.drop()
        eng.close()


def _keys(server: RedisServer) -> set[bytes]:
    return set(server.client().keys("*"))  # type: ignore[attr-defined]


# -- layout ---------------------------------------------------------------------------------------


def test_one_shard_is_a_single_queue_with_no_record(server: RedisServer) -> None:
    name = unique_name()
    with Engine.connect(server.url, name, create=True, shards=1) as eng:
        assert type(eng) is RedisEngine and eng.keys == queue_keys(name)
        eng.add(NOW, 3600)
        assert {k.decode() for k in _keys(server) if name.encode() in k} == \
            {queue_keys(name)[2], queue_keys(name)[3], queue_keys(name)[0]}
        assert server.client().get(catalog_key(name)) is None  # type: ignore[attr-defined]
        eng.drop()


def test_rows_spread_evenly_and_their_ids_and_tokens_map_back(sharded: Any) -> None:
    eng = sharded()
    rows = eng.add_many(NOW - np.arange(300) * 1000, 3600)
    assert rows.tolist() == list(range(300))  # one writer: ids as a single queue gives them
    assert [s["rows"] for s in eng.stats()["shards"]] == [100] * N
    assert len({eng.shards[k].keys[0] for k in range(N)}) == N
    assert eng.describe(250)["due_ms"] == NOW - 250_000 and eng.describe(250)["row"] == 250
    c = eng.claim(budget=16, now_ms=NOW, lease_ms=HOUR)
    assert len(set((c.rows % N).tolist())) == 1  # one pass, one shard
    assert ((c.tokens % N) == (c.rows % N)).all()
    other = (int(c.rows[0]) + 1) % 300  # a row of the next shard
    with pytest.raises(LeaseLost):  # a token of another shard is never live there
        eng.complete(other, int(c.tokens[0]), now_ms=NOW)
    assert eng.complete_many(c.rows, c.tokens, now_ms=NOW).all()
    assert eng.stats(now_ms=NOW)["in_flight"] == 0 and eng.verify() == []


def test_a_claim_goes_round_the_shards_and_moves_on_when_one_comes_back_short(
        sharded: Any) -> None:
    eng = sharded()
    eng.add_many(np.full(3 * N, NOW - 1000), 3600)  # 3 due rows a shard
    start = eng.at
    c = eng.claim(budget=7, now_ms=NOW, lease_ms=HOUR)
    shards = (c.rows % N).tolist()
    assert len(c) == 7 and shards[:3] == [start] * 3  # the first shard came back short
    assert shards[3:6] == [(start + 1) % N] * 3 and shards[6] == (start + 2) % N
    assert eng.at == (start + 2) % N  # its last shard was not short: the next pass goes there
    eng.release_many(c.rows, c.tokens)
    eng.add_many(np.full(100 * N, NOW - 1000), 3600)
    seen = []
    for _ in range(2 * STAY * N):
        seen.append(eng.at)
        got = eng.claim(budget=4, now_ms=NOW, lease_ms=HOUR)
        assert set((got.rows % N).tolist()) == {seen[-1]}
    assert Counter(seen) == {k: 2 * STAY for k in range(N)}  # full passes: STAY a shard, round


def test_complete_and_claim_completes_on_every_shard_and_claims_where_it_stands(
        sharded: Any) -> None:
    eng = sharded()
    eng.add_many(np.full(30 * N, NOW - 1000), 3600)
    held = [eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR) for _ in range(STAY * N)]
    rows = np.concatenate([c.rows for c in held])
    tokens = np.concatenate([c.tokens for c in held])
    assert set((rows % N).tolist()) == set(range(N))
    tokens[0] += N  # stale: reported, nothing else
    ok, nxt = eng.complete_and_claim(rows, tokens, budget=5, now_ms=NOW, lease_ms=HOUR)
    assert ok.tolist() == [False] + [True] * (len(rows) - 1)
    assert len(nxt) == 5 and eng.stats(now_ms=NOW)["in_flight"] == 5 + 1
    assert eng.verify() == []


# -- shares and the pass --------------------------------------------------------------------------


def test_lane_shares_under_a_deficit_stay_within_two_points_of_the_policy_over_10k_grants(
        sharded: Any) -> None:
    policy = LanePolicy(urgent_max_share=0.2, min_share={"discovered": 0.25, "cold": 0.1})
    eng = sharded(policy)
    n = {"submitted": 9000, "discovered": 4000, "cold": 2000}
    eng.add_many(NOW - 1 - np.arange(n["submitted"]) * 7, 86_400)
    eng.add_many(NOW - 1 - np.arange(n["discovered"]) * 5, 86_400, "discovered")
    eng.add_many(NOW - 1 - np.arange(n["cold"]) * 3, 86_400, "submitted", failures=3)
    rush = eng.add_many(np.full(2200, NOW + DAY), 86_400)
    for r in rush.tolist():
        eng.prioritize(r, "rush", now_ms=NOW - 2)
    grants: Counter[str] = Counter()
    per_shard: Counter[int] = Counter()
    rows, tokens = np.zeros(0, np.int64), np.zeros(0, np.int64)
    while sum(grants.values()) < 10_000:
        ok, c = eng.complete_and_claim(rows, tokens, budget=16, now_ms=NOW, lease_ms=HOUR)
        assert ok.all() and len(c) == 16  # a deficit: every pass is full
        rows, tokens = c.rows, c.tokens
        grants.update(policy.lane_name(int(ln)).split("/")[0] for ln in c.lanes)
        per_shard.update((c.rows % N).tolist())
    total = sum(grants.values())
    share = {k: v / total for k, v in grants.items()}
    assert abs(share["urgent"] - 0.2) <= 0.02, share
    assert abs(share["discovered"] - 0.25) <= 0.02, share
    assert abs(share["cold"] - 0.1) <= 0.02, share
    assert abs(share["submitted"] - 0.45) <= 0.02, share  # the remainder, in lane order
    assert all(abs(v / total - 1 / N) <= 0.02 for v in per_shard.values()), per_shard
    assert eng.verify() == []


POLICIES = (ten_lanes(weights=INTERVALS),
            ten_lanes(urgent_max_share=0.3, min_share={"discovered": 0.2}, remainder="edf"),
            ten_lanes(min_share={"cold": 0.1}, remainder="lateness",
                      weights={"submitted/b0": 2.0, "discovered/b0": 0.5}),
            ten_lanes(lanes_enabled=False))


@pytest.mark.parametrize("policy", POLICIES, ids=["default", "edf", "lateness", "no-lanes"])
def test_each_shard_s_pass_grants_what_reference_pass_grants(sharded: Any,
                                                             policy: LanePolicy) -> None:
    """The client model: a pass goes to ``eng.at``, and while it comes back short the rest of
    the budget goes to the next shards; each shard's pass is ``reference_pass`` over its own
    rows with its own credits."""
    eng = sharded(policy)
    rng = np.random.default_rng(7)
    remaining: list[dict[int, dict[int, int]]] = [{ln: {} for ln in range(10)}
                                                 for _ in range(N)]
    bounds = [[(0, 0)] * 64 for _ in range(N)]  # each shard's lanes', from the rows it holds
    for _ in range(150):
        lane, due = int(rng.integers(0, 10)), NOW - int(rng.integers(1, 5 * DAY))
        row = add_to_lane(eng, lane, due)
        remaining[row % N][lane if policy.lanes_enabled else 0][row] = due
        for ln in (1, 0) if lane == 0 else (lane,):  # a rush is added to submitted/b0 first
            if policy.lanes_enabled or ln == 0:
                bounds[row % N][ln] = (LANE_INTERVALS[lane], LANE_INTERVALS[lane])
    credits: list[dict[str, int]] = [{} for _ in range(N)]
    for budget in rng.integers(1, 40, 14).tolist():
        k, left, expected = eng.at, budget, []
        for step in range(N):
            s = (k + step) % N
            due_lists = [sorted(remaining[s][ln].values()) for ln in range(10)]
            intervals = [[LANE_INTERVALS[ln]] * len(due_lists[ln]) for ln in range(10)]
            got, credits[s] = reference_pass(policy, left, due_lists, credits[s], now=NOW,
                                             intervals=intervals, bounds=bounds[s])
            expected.append((s, got))
            left -= sum(got)
            if left == 0:
                break
        c = eng.claim(budget=budget, now_ms=NOW, lease_ms=DAY)
        for s, got in expected:
            mine = (c.rows % N) == s
            counts = np.bincount(c.lanes[mine], minlength=10)[:10].tolist()
            assert counts == got, (s, budget)
            for row, lane in zip(c.rows[mine].tolist(), c.lanes[mine].tolist(), strict=True):
                del remaining[s][lane][row]
    assert eng.verify() == []


# -- the count is recorded: refusals and moves ----------------------------------------------------


def test_another_count_or_layout_is_refused_saying_how_to_move_and_changes_nothing(
        server: RedisServer, sharded: Any) -> None:
    eng = sharded()
    eng.add_many(np.full(10, NOW), 3600)
    before = _keys(server), eng.dump()
    for shards in (2, 1, 5):
        with pytest.raises(ShardsMismatch, match=r"spread over 3 shards.*save it.*load") as e:
            Engine.connect(server.url, eng.name, create=True, shards=shards)
        assert e.value.shards == N
    with pytest.raises(ShardsMismatch, match="spread over 3 shards"):
        RedisEngine.connect(server.url, eng.name, create=True)
    with Engine.connect(server.url, eng.name) as again:  # as it is
        assert isinstance(again, ShardedEngine) and again.stats()["rows"] == 10
    plain = unique_name()
    with Engine.connect(server.url, plain, create=True) as one:
        one.add(NOW, 3600)
        with pytest.raises(ShardsMismatch, match=r"one queue \(not sharded\), not 3.*save it"):
            Engine.connect(server.url, plain, create=True, shards=N)
        one.drop()
    assert (_keys(server), eng.dump()) == before
    c = server.client()
    c.set(catalog_key(eng.name), c.get(catalog_key(eng.name)).replace(  # type: ignore
        b'"layout": 1', b'"layout": 9'))
    with pytest.raises(LayoutMismatch, match="layout 9.*save it"):
        Engine.connect(server.url, eng.name)


@pytest.mark.parametrize("bad, error", [(0, EngineValueError), (MAX_SHARDS + 1, EngineValueError),
                                         (True, EngineTypeError), ("3", EngineTypeError),
                                         (2.0, EngineTypeError)])
def test_a_bad_shard_count_is_refused_and_makes_nothing(server: RedisServer, bad: Any,
                                                        error: type[Exception]) -> None:
    before = _keys(server)
    with pytest.raises(error):
        Engine.connect(server.url, unique_name(), create=True, shards=bad)
    with pytest.raises(SegmentMissing, match="shards=N"):
        ShardedEngine.connect(server.url, unique_name())
    with pytest.raises(EngineValueError, match="needs shards"):
        ShardedEngine.connect(server.url, unique_name(), create=True)
    assert _keys(server) == before


def test_bad_input_on_a_later_shard_changes_no_shard(sharded: Any) -> None:
    eng = sharded(capacity=30)
    eng.add_many(np.full(9, NOW - 1000), 3600)
    c = eng.claim(budget=9, now_ms=NOW, lease_ms=HOUR)
    before = eng.dump()
    rows = c.rows.copy()
    rows[-1] = 9 * N + 2  # past every row of its shard
    for call in (lambda: eng.complete_many(rows, c.tokens, now_ms=NOW),
                 lambda: eng.release_many(rows, c.tokens),
                 lambda: eng.complete_and_claim(rows, c.tokens, now_ms=NOW),
                 lambda: eng.add_many(np.full(22, NOW), 3600),  # room for 21
                 lambda: eng.add_many([NOW, -5], 3600),
                 lambda: eng.complete_many(c.rows, c.tokens, next_due_ms=[NOW] * 8)):
        with pytest.raises(EngineError):
            call()
        assert eng.dump() == before
    assert eng.complete_many(c.rows, c.tokens, now_ms=NOW).all() and eng.verify() == []


def test_save_then_load_moves_a_queue_between_shard_counts(server: RedisServer, sharded: Any,
                                                           tmp_path: Path) -> None:
    name = unique_name()
    one = Engine.connect(server.url, name, create=True)
    try:
        one.add_many(NOW - np.arange(50) * 1000, 600 + np.arange(50),
                     ["submitted", "discovered"] * 25, failures=np.arange(50) % 5)
        one.prioritize(7, "rush", now_ms=NOW)
        one.save(tmp_path / "one.npz")
    finally:
        one.drop()
        one.close()
    three = ShardedEngine.load(tmp_path / "one.npz", server.url, name, shards=N)
    try:
        assert three.export_rows()[0].tolist() == list(range(50))
        three.save(tmp_path / "three.npz")
        a, b = checkpoint.read(tmp_path / "one.npz"), checkpoint.read(tmp_path / "three.npz")
        for col in ("due_ms", "interval_s", "failures", "provenance", "urgent"):
            assert getattr(a, col).tolist() == getattr(b, col).tolist(), col
        assert three.describe(7)["urgent"] and three.verify() == []
        with pytest.raises(EngineValueError, match="new queue only"):
            ShardedEngine.load(tmp_path / "one.npz", server.url, name, shards=N)
    finally:
        three.drop()
        three.close()


def test_a_pool_checkpoint_resumes_into_a_queue_over_another_count_with_its_urls(
        server: RedisServer, sharded: Any, tmp_path: Path) -> None:
    eng = sharded()
    names = [f"https://shop.example/r/{i}" for i in range(40)]
    got = ShardedUrls(eng).add(names, NOW - np.arange(40) * 1000, 600 + np.arange(40))
    eng.prioritize(int(got.rows[3]), "rush", now_ms=NOW)
    eng.save(tmp_path / "ck.npz", ShardedUrls(eng).urls)
    ck = checkpoint.read(tmp_path / "ck.npz")
    made, urls = restore(ck, server.url, unique_name(), shards=2)
    try:
        assert isinstance(made, ShardedEngine) and made.catalog.shards == 2
        assert sorted(urls.urls()[r] for r in made.export_rows()[0]) == sorted(names)
        for i, u in enumerate(names):
            d = made.describe(urls.find(u))
            assert (d["due_ms"], d["interval_s"]) == ((NOW, 600 + i) if i == 3
                                                      else (NOW - i * 1000, 600 + i))
        assert made.describe(urls.find(names[3]))["urgent"] and made.verify() == []
        with pytest.raises(SegmentExists):
            restore(ck, server.url, made.name, shards=2)
    finally:
        urls.drop()
        made.drop()
        made.close()


# -- pools and commands across shards -------------------------------------------------------------


def test_urls_go_to_the_shard_of_their_hash_once_and_map_back(sharded: Any) -> None:
    eng = sharded()
    urls = ShardedUrls(eng)
    names = [f"https://shop.example/p/{i}" for i in range(60)]
    got = urls.add(names, np.full(60, NOW), 3600)
    assert got.added == 60 and len(urls) == 60
    again = urls.add(names[:30] + ["https://shop.example/new"], np.full(31, NOW), 3600)
    assert again.added == 1 and again.rows[:30].tolist() == got.rows[:30].tolist()
    assert [urls.find(u) for u in names] == got.rows.tolist()
    assert urls.many(got.rows[::-1]) == names[::-1]
    table = urls.urls()
    assert all(table[r] == u for r, u in zip(got.rows.tolist(), names, strict=True))
    assert sorted(u for u in table if u) == sorted([*names, "https://shop.example/new"])
    assert all(s["rows"] > 10 for s in eng.stats()["shards"])
    assert eng.verify() == []


def test_a_pool_over_shards_renders_every_row_once_and_commands_work_across_them(
        server: RedisServer, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        ) -> None:
    queue, local = unique_name(), unique_name()
    c = corpus(30)
    pool = Pool.create(queue, c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:record"),
                       PoolOptions(env={"RL_TEST_RENDER_LOG": str(log)}, workers=2,
                                   lease_s=5),
                       redis=server.url, local=local, shards=N)
    try:
        assert isinstance(pool.engine, ShardedEngine) and pool.added is not None
        pool.start()
        wait_for(until_all(log, 30))
        seen = Counter(u for _, u in rendered(log))
        assert set(seen) == set(c["urls"]) and max(seen.values()) == 1
        csv = tmp_path / "more.csv"
        csv.write_text("url,interval_s,provenance\n" + "".join(
            f"{u},3600,submitted\n" for u in (c["urls"][0], "https://shop.example/p/new")))
        redis = ["--redis", server.url]
        for args, status, expect in (
                (["check", queue, *redis], 0, "ok"),
                (["stats", queue, *redis, "--local-name", local, "--json"], 0, '"shards"'),
                (["prioritize", queue, *redis, "--url", c["urls"][5]], 0, "rush"),
                (["add", queue, *redis, "--corpus", str(csv)], 0, "1 new URL(s)"),
                (["failures", queue, *redis, "--local-name", local], 0, "0 failing"),
                (["pool", queue, *redis, "--shards", "2", "--render", "pool_renders:record",
                  "--local-name", unique_name()], 2, "spread over 3 shards")):
            assert lanes(args) == status, args
            out, err = capsys.readouterr()
            assert expect in out + err, (args, out, err)
        # the rush made it due at once: rendered again (its interval is an hour)
        wait_for(lambda: Counter(u for _, u in rendered(log))[c["urls"][5]] == 2)
        assert pool.urls.find("https://shop.example/p/new") >= 0
    finally:
        pool.shutdown()
    with Engine.connect(server.url, queue) as eng:
        assert eng.stats()["rows"] == 31 and eng.verify() == []
        eng.row_urls().drop()
        eng.drop()


def test_a_sharded_pool_resumes_over_another_count_with_its_failures_under_their_new_rows(
        server: RedisServer, log: Path, tmp_path: Path) -> None:
    queue, moved, ck_path = unique_name(), unique_name(), tmp_path / "ck.npz"
    urls = [f"https://shop.example/p/{i}" for i in range(8)] + ["https://shop.example/gone/1"]
    c = corpus(len(urls))
    pool = Pool.create(queue, urls, c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:gone_or_flaky",
                                  permanent_errors=("Gone",)),
                       PoolOptions(env={"RL_TEST_RENDER_LOG": str(log)}, workers=2,
                                   checkpoint=str(ck_path)),
                       redis=server.url, local=unique_name(), shards=N)
    pool.run(seconds=60, until=lambda: until_all(log, 8)() and pool.board.totals()[
        "failures"] >= 1)
    again = Pool.resume(moved, str(ck_path), RenderSpec(callable="pool_renders:record"),
                        redis=server.url, local=unique_name(), shards=2)
    try:
        assert isinstance(again.engine, ShardedEngine) and again.engine.catalog.shards == 2
        failing = again.failures.entries()
        assert [(e.url, again.urls[e.row]) for e in failing] == [(urls[8], urls[8])]
        assert sorted(u for u in again.urls.urls() if u) == sorted(urls)
    finally:
        again.close()
    for name in (queue, moved):
        with Engine.connect(server.url, name) as eng:
            eng.row_urls().drop()
            eng.drop()


def test_on_a_cluster_the_shards_fall_on_different_primaries_and_serve_claims() -> None:
    with LocalCluster(3) as cluster:
        name = unique_name()
        with Engine.connect(cluster.url, name, create=True, shards=N) as eng:
            assert isinstance(eng, ShardedEngine)
            ports = {cluster.node_of(shard_keys(name, tag)[0]) for tag in eng.catalog.tags}
            assert ports == {n.port for n in cluster.nodes}
            urls = eng.row_urls()
            urls.add([f"https://a.example/{i}" for i in range(90)], np.full(90, NOW), 3600)
            granted: list[int] = []
            while len(granted) < 90:
                c = eng.claim(budget=16, now_ms=NOW, lease_ms=HOUR)
                assert len(c)
                granted += c.rows.tolist()
                assert eng.complete_many(c.rows, c.tokens, now_ms=NOW).all()
            assert sorted(granted) == sorted(urls.find(f"https://a.example/{i}")
                                             for i in range(90))
            assert eng.verify() == []
        with Engine.connect(cluster.url, name) as again:
            assert isinstance(again, ShardedEngine) and again.stats()["rows"] == 90


def test_a_dead_owner_s_leases_on_every_shard_come_back_at_another_owner_s_beat(
        server: RedisServer, sharded: Any) -> None:
    """An owner beats on every shard it may hold leases on; when its heartbeat lapses, the next
    beat of another owner puts its rows back on each shard, long before the leases expire."""
    eng = sharded()
    eng.add_many(np.full(8 * N, wall_ms() - 60_000), 3600, provenance="submitted")  # due now
    code = ("import sys; from engine import Engine\n"
            "e = Engine.connect(sys.argv[1], sys.argv[2])\n"
            "held = 0\n"
            "for _ in range(4 * len(e.shards)):\n"
            "    held += len(e.claim(budget=2, lease_ms=600_000))\n"
            "e.heartbeat(ttl_ms=200)\n"
            "print(held, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code, server.url, eng.name],
                         capture_output=True, text=True, timeout=60, check=True)
    held = int(out.stdout)
    assert held == 8 * N and eng.stats()["in_flight"] == held  # on every shard, none back yet
    wait_for(lambda: eng.heartbeat(ttl_ms=2_000) != (0, 0), timeout=10)
    assert eng.stats()["in_flight"] == 0 and len(eng.claim(budget=8 * N)) == 8 * N
