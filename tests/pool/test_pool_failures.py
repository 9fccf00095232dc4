"""Why renders fail, and what the pool does about it: every failure's reason is logged and kept
in the failure log; permanent failures go cold at once, transient ones back off, a row that
failed ``max_failures`` times is parked until a rush or a re-add; a corpus grows while the pool
runs (``add_corpus``, ``lanes add``) and through ``--resume``."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest
from lanes_testlib import unique_name
from pool_testlib import files_of, rendered

from engine import CapacityError, EngineValueError
from engine import checkpoint as ck
from engine.corpus.model import Corpus
from engine.corpus.routes import Route, Routes
from engine.keys import PARKED_MS
from engine.pool import Pool, PoolOptions
from engine.pool.grow import add_corpus
from engine.pool.render import RenderSpec
from engine.shm.urls import UrlTable

NOW = int(time.time() * 1000)
URLS = [f"https://shop.example/{kind}/{i}" for kind in ("ok", "gone", "flaky") for i in range(4)]


def _pool(name: str, urls: list[str], **options: object) -> Pool:
    env = {k: v for k, v in os.environ.items() if k == "RL_TEST_RENDER_LOG"}
    render = RenderSpec(callable="pool_renders:gone_or_flaky", permanent_errors=("Gone",))
    n = len(urls)
    options = {"workers": 2, "grace_s": 5.0, "env": env, **options}
    return Pool.create(name, urls, np.full(n, NOW - 1000), np.full(n, 3600),
                       np.zeros(n, np.int64), render, PoolOptions(**options))  # type: ignore[arg-type]


def _failed(pool: Pool) -> int:
    return len(pool.failures.entries())


def _until(pool: Pool, done: object, timeout: float = 30.0) -> None:
    """Run the pool until ``done()``, then stop its workers (files kept, for a look)."""
    pool.start()
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the pool did not get there in time"
        pool.supervise()
        time.sleep(0.05)
    pool.board.request_stop()
    for p in pool._procs:
        p.join(10)


def test_reasons_are_kept_and_logged_permanent_goes_cold_transient_backs_off(
        log: Path, capfd: pytest.CaptureFixture[str]) -> None:
    name = unique_name()
    pool = _pool(name, URLS)
    cold = pool.engine.policy.cold_lane
    with pool:
        _until(pool, lambda: len(rendered(log)) >= 4 and _failed(pool) >= 8)
        entries = {e.url: e for e in pool.failures.entries()}
        assert set(entries) == {u for u in URLS if "/ok/" not in u}
        for url, e in entries.items():
            info = pool.engine.describe(e.row)
            assert e.failures == 1
            if "/gone/" in url:
                assert e.permanent and e.reason == f"Gone: {url} is gone" and info["lane"] == cold
            else:
                assert not e.permanent and e.reason == f"RuntimeError: {url} timed out upstream"
                assert info["lane"] != cold and info["due_ms"] > NOW + 25_000  # backed off 30 s
    err = capfd.readouterr().err
    for url in URLS[4:]:
        assert f"{url} (row {URLS.index(url)}) failed: " in err  # one log line per failure
    assert "permanent, retry in" in err and files_of(name) == []


def test_a_row_failing_max_failures_times_is_parked_until_a_rush_or_a_re_add(log: Path) -> None:
    name = unique_name()
    pool = _pool(name, URLS, max_failures=1)
    with pool:
        _until(pool, lambda: _failed(pool) >= 8)
        parked = [e.row for e in pool.failures.entries()]
        assert all(pool.engine.due_ms(r) == PARKED_MS for r in parked)
        eng = pool.engine
        assert len(eng.claim(64, now_ms=NOW + 400 * 86_400_000)) == 4  # only the /ok/ rows
        eng.reap()
        gone = URLS.index("https://shop.example/gone/0")
        eng.prioritize(gone, "rush")  # a rush: claimable again, in the urgent lane
        flaky = URLS.index("https://shop.example/flaky/1")
        again = add_corpus(eng, pool.urls, Corpus([URLS[flaky], "https://shop.example/ok/new"],
                                                   [3600, 3600], [0, 0], [NOW, NOW]))
        assert (again.added, again.known, again.unparked) == (1, 1, 1)
        c = eng.claim(64, now_ms=wall())
        assert {gone, flaky, len(URLS)} <= set(c.rows.tolist())
    assert files_of(name) == []


def wall() -> int:
    return int(time.time() * 1000)


def test_add_corpus_publishes_urls_before_rows_refuses_what_does_not_fit(log: Path) -> None:
    name = unique_name()
    pool = _pool(name, URLS[:4])
    with pool:
        eng = pool.engine
        cap = int(eng.stats()["capacity"])
        assert cap >= 100_000  # room to grow by default
        known = Corpus(URLS[:2], [60, 60], [0, 0], [NOW, NOW])
        assert add_corpus(eng, pool.urls, known).added == 0
        assert eng.stats()["rows"] == 4 and eng.describe(0)["interval_s"] == 3600  # left alone
        new = [f"https://shop.example/new/{i}" for i in range(3)]
        got = add_corpus(eng, pool.urls, Corpus(new, [60] * 3, [1] * 3, [NOW] * 3))
        assert (got.added, got.first_row) == (3, 4)
        reader = UrlTable.attach(name)  # a worker's view: finds the new rows' URLs
        assert [reader[r] for r in range(4, 7)] == new and reader.find(new[2]) == 6
        reader.close()
        _until(pool, lambda: len(rendered(log)) >= 7)
        assert {u for _, u in rendered(log)} >= set(new)
        too_many = [f"https://shop.example/x/{i}" for i in range(cap)]
        with pytest.raises(CapacityError, match="--resume it with a larger --capacity"):
            add_corpus(eng, pool.urls, Corpus(too_many, [60] * cap, [0] * cap, [NOW] * cap))
        assert len(UrlTable.attach(name)) == 7  # no URL file left by the refused add
    assert files_of(name) == []


def _adder(name: str, k: int) -> None:
    from engine import Engine

    eng = Engine.attach(name)
    table = eng.row_urls()
    for j in range(10):
        urls = [f"https://shop.example/add/{k}/{j}/{i}" for i in range(5)]
        add_corpus(eng, table, Corpus(urls, [60] * 5, [0] * 5, [NOW] * 5))
    table.close()
    eng.close()


def test_concurrent_adders_each_get_rows_whose_urls_match() -> None:
    name = unique_name()
    pool = _pool(name, URLS[:4])
    with pool:
        procs = [mp.get_context("fork").Process(target=_adder, args=(name, k)) for k in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        table = UrlTable.attach(name)
        urls = table.urls()
        table.close()
        assert len(urls) == pool.engine.stats()["rows"] == 4 + 3 * 10 * 5
        assert len(set(urls)) == len(urls)
    assert files_of(name) == []


def test_resume_keeps_failures_applies_routes_and_adds_a_corpus(log: Path,
                                                                tmp_path: Path) -> None:
    name, path = unique_name(), str(tmp_path / "ck.npz")
    pool = _pool(name, URLS, checkpoint=path)
    with pool:
        pool.run(seconds=30, until=lambda: _failed(pool) >= 8)
    saved = ck.read(path)
    assert len(saved.extra["failures"]) == 8
    routes = Routes((Route("ok", "https://shop.example/ok/*", False, 7200, None),))
    more = Corpus([URLS[0], "https://shop.example/ok/9"], [60, 60], [0, 0], [NOW, NOW])
    render = RenderSpec(callable="pool_renders:gone_or_flaky", permanent_errors=("Gone",))
    pool = Pool.resume(name, path, render, PoolOptions(workers=1), routes=routes, corpus=more)
    with pool:
        assert pool.added is not None and (pool.added.added, pool.added.known) == (1, 1)
        by_url = {e.url: e for e in pool.failures.entries()}
        assert set(by_url) == {u for u in URLS if "/ok/" not in u}
        assert all(pool.urls[e.row] == u for u, e in by_url.items())  # re-keyed to new rows
        rows, cols = ck.snapshot(pool.engine)
        intervals = dict(zip([pool.urls[r] for r in rows.tolist()], cols["interval_s"].tolist(),
                             strict=True))
        assert intervals[URLS[0]] == 7200 and intervals["https://shop.example/gone/0"] == 3600
        assert intervals["https://shop.example/ok/9"] == 60  # read by the caller, routes and all
        pool.close()
    assert files_of(name) == []


def test_pool_options_refuse_bad_politeness_and_max_failures() -> None:
    for bad in ({"per_host": 0}, {"per_host": 1.5}, {"delay_ms": -1}, {"max_failures": 0},
                {"max_failures": True}):
        with pytest.raises(EngineValueError):
            PoolOptions(**bad)  # type: ignore[arg-type]
    assert np.iinfo(np.int64).max > PARKED_MS


def test_a_discovered_page_that_answers_404_leaves_the_queue(
        log: Path, capfd: pytest.CaptureFixture[str]) -> None:
    name = unique_name()
    urls = [f"https://shop.example/{kind}/{i}" for kind in ("ok", "gone") for i in range(4)]
    n = len(urls)
    provenance = np.array([0, 1] * (n // 2), np.int64)  # even rows submitted, odd discovered
    env = {k: v for k, v in os.environ.items() if k == "RL_TEST_RENDER_LOG"}
    pool = Pool.create(name, urls, np.full(n, NOW - 1000), np.full(n, 3600), provenance,
                       RenderSpec(callable="pool_renders:answers_404"),
                       PoolOptions(workers=1, grace_s=5.0, env=env))
    with pool:
        _until(pool, lambda: len(rendered(log)) >= 4 and _failed(pool) >= 2
               and not pool.engine.describe(7)["queued"])
        for row, url in enumerate(urls):
            info = pool.engine.describe(row)
            if "/gone/" in url and row % 2:  # discovered: gone from the queue
                assert not info["queued"] and info["lane"] is None, (url, info)
            elif "/gone/" in url:  # submitted (a sitemap lists it): failed, permanent, kept
                assert info["queued"] and info["lane"] == pool.engine.policy.cold_lane
        assert {e.url for e in pool.failures.entries()} == {urls[4], urls[6]}
    err = capfd.readouterr().err
    assert f"{urls[5]} (row 5, discovered) answered 404: removed from the queue" in err
