"""engine/pool/refresh.py: what one refresh does to a pool on either backend (new URLs added,
provenance derived from the corpus read, parked rows left parked, removed rows skipped), and
how the refresh runs (a read in a thread, a failure that changes nothing and is tried again)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest
from lanes_testlib import unique_name

from engine import CorpusError, Engine, EngineValueError
from engine.corpus.model import Corpus
from engine.keys import PARKED_MS
from engine.pool import Pool, PoolOptions
from engine.pool.refresh import CorpusRefresh, follow, parse_duration
from engine.pool.render import RenderSpec
from engine.redis.urls import RedisUrls

URLS = [f"https://shop.test/p/{i}" for i in range(5)]


def _corpus(urls: list[str], provenance: list[int] | None = None) -> Corpus:
    n = len(urls)
    return Corpus(urls, np.full(n, 3600), np.array(provenance or [0] * n), np.full(n, 1000))


@pytest.fixture(params=["shm", "redis"])
def pool(request: pytest.FixtureRequest) -> Any:
    c = _corpus(URLS)
    redis = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    name = unique_name()
    p = Pool.create(name, c.urls, c.due_ms, c.interval_s, c.provenance,
                    RenderSpec(command="true {url}"), PoolOptions(workers=1), capacity=64,
                    redis=redis)
    yield p
    _close(p, redis, name)


def _close(pool: Pool, redis: str | None, name: str) -> None:
    pool.close()  # on Redis the queue outlives its pools: dropped here
    if redis is not None:
        eng = Engine.connect(redis, name)
        RedisUrls(eng).drop()
        eng.drop()
        eng.close()


def _prov(pool: Pool, url: str) -> str:
    return str(pool.engine.describe(pool.urls.find(url))["provenance"])


def test_parse_duration_takes_a_whole_number_and_a_unit() -> None:
    assert [parse_duration(t) for t in ("2s", "15m", " 1h ", "1d")] == [2, 900, 3600, 86400]
    for bad in ("", "0s", "1", "1.5h", "1w", "h", "-1m", "1 h", None):
        with pytest.raises(EngineValueError, match="like 30s, 15m, 1h or 1d"):
            parse_duration(bad)  # type: ignore[arg-type]


def test_a_refresh_adds_new_urls_and_derives_provenance(pool: Pool) -> None:
    got = follow(pool.engine, pool.urls, _corpus([*URLS[1:4], "https://shop.test/new"]))
    assert (got.rows, got.added, got.discovered, got.submitted) == (4, 1, 2, 0)
    assert pool.urls.urls() == [*URLS, "https://shop.test/new"]
    assert [_prov(pool, u) for u in pool.urls.urls()] == [
        "discovered", "submitted", "submitted", "submitted", "discovered", "submitted"]
    # Again with the same corpus: nothing to do.
    again = follow(pool.engine, pool.urls, _corpus([*URLS[1:4], "https://shop.test/new"]))
    assert (again.added, again.discovered, again.submitted) == (0, 0, 0)
    # A URL comes back; the corpus itself may say discovered (a CSV's column, a route).
    back = follow(pool.engine, pool.urls, _corpus([*URLS, "https://shop.test/new"],
                                                  [0, 0, 0, 1, 0, 0]))
    assert (back.added, back.discovered, back.submitted) == (0, 1, 2)
    assert [_prov(pool, u) for u in pool.urls.urls()] == [
        "submitted", "submitted", "submitted", "discovered", "submitted", "submitted"]
    assert pool.engine.verify() == []


def test_a_refresh_leaves_parked_rows_parked_and_skips_removed_ones(pool: Pool) -> None:
    eng = pool.engine
    batch = eng.claim(5, now_ms=2000)
    by_row = dict(zip(batch.rows.tolist(), batch.tokens.tolist(), strict=True))
    parked = pool.urls.find(URLS[0])
    eng.fail(parked, by_row.pop(parked), retry_at_ms=PARKED_MS, now_ms=2000)
    gone = pool.urls.find(URLS[1])
    eng.remove(gone)
    eng.release_many(list(by_row), list(by_row.values()))
    got = follow(eng, pool.urls, _corpus(URLS[2:]))
    assert got.discovered == 1  # the parked row; the removed one is not queued
    assert eng.describe(parked)["due_ms"] == PARKED_MS
    assert eng.describe(gone)["queued"] is False
    assert eng.verify() == []


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _settle(refresh: CorpusRefresh) -> Any:
    """Tick until the refresh in flight is reported (it runs in a thread)."""
    thread = refresh._thread
    assert thread is not None, "no refresh started"
    thread.join(30)
    got = refresh.tick()
    assert refresh._thread is None, "the refresh never finished"
    return got


def _attach(pool: Pool) -> Any:
    """Handles of one's own on the pool's engine and URLs, as the CLI gives a refresh."""
    name = pool.engine.name
    if pool.redis is None:
        def attach() -> tuple[Any, Any]:
            eng = Engine.attach(name)
            return eng, eng.row_urls()

        return attach

    def connect() -> tuple[Any, Any]:
        eng = Engine.connect(pool.redis, name)
        return eng, RedisUrls(eng)

    return connect


def test_a_failed_read_changes_nothing_and_the_next_period_tries_again(
        pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    outcomes: list[Any] = [CorpusError("https://shop.test/sitemap.xml: cannot fetch: HTTP 503"),
                           _corpus([]), _corpus(URLS[:4])]
    reads: list[str] = []

    def read() -> Corpus:
        reads.append(threading.current_thread().name)
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    refresh = CorpusRefresh(read, 60, _attach(pool), clock=clock)
    assert refresh.tick() is None and not reads  # not due yet
    clock.t = 60
    with caplog.at_level(logging.INFO, logger="engine.pool"):
        refresh.tick()
        assert _settle(refresh) is None
        assert refresh.failed == 1 and [_prov(pool, u) for u in URLS] == ["submitted"] * 5
        assert "corpus refresh failed, nothing changed (next in 1 min): https://shop.test/" \
               "sitemap.xml: cannot fetch: HTTP 503" in caplog.text
        clock.t = 100
        refresh.tick()
        assert refresh._thread is None  # the period counts from the end of the last one
        clock.t = 121
        refresh.tick()
        assert _settle(refresh) is None  # an empty corpus empties nothing
        assert refresh.failed == 2 and [_prov(pool, u) for u in URLS] == ["submitted"] * 5
        assert "the corpus read holds no URL" in caplog.text
        clock.t = 200
        refresh.tick()
        got = _settle(refresh)
    assert got is not None and got.discovered == 1 and refresh.done == 1
    assert [_prov(pool, u) for u in URLS] == ["submitted"] * 4 + ["discovered"]
    assert reads == ["corpus-refresh"] * 3  # never in the supervisor's thread
    assert "corpus refresh: 4 URLs read; 0 new URL(s) added, 1 now discovered" in caplog.text


def test_a_closed_refresh_changes_nothing_and_a_full_pool_is_a_failure(pool: Pool) -> None:
    clock = _Clock()
    reading = threading.Event()

    def slow_read() -> Corpus:
        reading.wait(30)
        return _corpus(URLS[:2])

    refresh = CorpusRefresh(slow_read, 1, _attach(pool), clock=clock)
    clock.t = 1
    refresh.tick()
    refresh.close()  # the pool is going: the refresh still reading changes nothing
    reading.set()
    assert _settle(refresh) is None and refresh.failed == 0 and refresh.done == 0
    assert [_prov(pool, u) for u in URLS] == ["submitted"] * 5
    clock.t = 10
    assert refresh.tick() is None and refresh._thread is None  # and none starts
    room = int(pool.engine.stats()["capacity"]) - len(URLS)
    big = CorpusRefresh(lambda: _corpus([f"https://shop.test/n/{i}" for i in range(room + 1)]),
                        1, _attach(pool), clock=clock)
    clock.t = 20
    big.tick()
    assert _settle(big) is None and big.failed == 1
    assert len(pool.urls.urls()) == len(URLS) and [_prov(pool, u) for u in URLS] == [
        "submitted"] * 5


def test_a_fitting_refresh_fits_the_lane_weights_to_the_rows_it_leaves(pool: Pool) -> None:
    """``--fit-policy`` with ``--refresh-corpus``: after the refresh the policy is
    ``LanePolicy.fitted`` to every row's interval, over the bands already in force (no row
    changes lane), on either backend."""
    from engine import LanePolicy
    from engine.policy import ONE, spread_weight_fp

    longer = [f"https://shop.test/weekly/{i}" for i in range(3)]
    corpus = Corpus(URLS + longer, np.array([3600] * 5 + [5 * 86400, 6 * 86400, 7 * 86400]),
                    np.zeros(8, np.int64), np.full(8, 1000))
    before = pool.engine.policy
    clock = _Clock()
    refresh = CorpusRefresh(lambda: corpus, 60, _attach(pool), clock=clock, fit=True)
    clock.t += 61
    refresh.tick()
    _settle(refresh)
    now = pool.engine.policy
    assert now.ttl_bands == before.ttl_bands and now.min_share == before.min_share
    assert now == LanePolicy.fitted(corpus.interval_s, corpus.provenance,
                                    ttl_bands=before.ttl_bands, min_share=before.min_share)
    name = now.lane_name
    assert now.weights == {  # 5 and 6 days share no lane with 7 (the bands are sqrt(2) apart)
        name(now.lane_for("submitted", 3600)): 4.0,
        name(now.lane_for("submitted", 7 * 86400)): spread_weight_fp(6 * 86400, 7 * 86400) / ONE}


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_a_pool_with_two_variants_makes_and_keeps_a_row_per_variant(
        request: pytest.FixtureRequest, tmp_path: Any, backend: str) -> None:
    """``Pool.create`` gives each URL of a two-variant route its ``URL mobile`` row; a refresh
    adds a new URL's two rows and keeps the variant rows' provenance their URL's."""
    from engine.corpus.routes import Routes

    path = tmp_path / "routes.toml"
    path.write_text('[[route]]\nname = "p"\nmatch = "https://shop.test/p/*"\ninterval = "1h"\n'
                    'variants = ["desktop", "mobile"]\n')
    routes = Routes.load(path)
    c = _corpus(URLS[:2] + ["https://shop.test/about"])
    redis = request.getfixturevalue("redis_server").url if backend == "redis" else None
    name = unique_name()
    p = Pool.create(name, c.urls, c.due_ms, c.interval_s, c.provenance,
                    RenderSpec(command="true {url}"), PoolOptions(workers=1), capacity=64,
                    routes=routes, redis=redis)
    try:
        mobile = [f"{u} mobile" for u in URLS[:2]]
        assert sorted(p.urls.urls()) == sorted([*c.urls, *mobile])
        assert p.engine.stats()["rows"] == 5
        same = follow(p.engine, p.urls, c)
        assert (same.added, same.discovered, same.submitted) == (0, 0, 0)
        more = follow(p.engine, p.urls, _corpus([*c.urls, URLS[2]]))
        assert more.added == 2 and f"{URLS[2]} mobile" in p.urls.urls()
        assert {_prov(p, u) for u in p.urls.urls()} == {"submitted"}
        less = follow(p.engine, p.urls, _corpus([*c.urls[1:], URLS[2]]))  # the first leaves
        assert less.discovered == 2
        assert _prov(p, f"{URLS[0]} mobile") == _prov(p, URLS[0]) == "discovered"
    finally:
        _close(p, redis, name)


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_resuming_with_a_route_that_now_names_two_variants_adds_their_rows(
        request: pytest.FixtureRequest, tmp_path: Any, backend: str) -> None:
    from engine.corpus.routes import Routes

    path = tmp_path / "routes.toml"
    path.write_text('[[route]]\nname = "p"\nmatch = "https://shop.test/p/*"\ninterval = "1h"\n'
                    'variants = ["mobile", "desktop"]\n')
    ck = str(tmp_path / "ck.npz")
    with Engine.create(unique_name(), capacity=64) as eng:
        for _ in URLS[:3]:
            eng.add(1_800_000_000_000, 3600)
        eng.save(ck, urls=URLS[:3])
    redis = request.getfixturevalue("redis_server").url if backend == "redis" else None
    name = unique_name()
    p = Pool.resume(name, ck, RenderSpec(command="true {url}"), PoolOptions(workers=1),
                    capacity=64, routes=Routes.load(path), redis=redis)
    try:
        assert sorted(p.urls.urls()) == sorted([*URLS[:3], *(f"{u} mobile" for u in URLS[:3])])
        mobile = p.urls.find(f"{URLS[1]} mobile")
        assert p.engine.due_ms(mobile) == 1_800_000_000_000  # due when its URL is
    finally:
        _close(p, redis, name)
