"""A pool's URLs (``QueueEngine.row_urls``, ``RowUrls``): one suite for the three tables, the
files in /dev/shm beside a segment (``UrlTable``), the hashes beside a Redis queue
(``RedisUrls``) and their shards (``ShardedUrls``). Each URL is added with its row, a known one
left alone (a parked one made due), bad input refused with nothing changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW, is_redis

from engine import factory
from engine.errors import CapacityError, EngineValueError
from engine.keys import PARKED_MS

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

URLS = [f"https://shop.example/p/{i}" for i in range(7)]


@pytest.fixture
def urls_of(make_engine: Callable[..., Any]) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """``urls_of(capacity=4096) -> (engine, its URL table)``, both disposed at the end. On
    shared memory the table is published first, as a pool publishes it (empty here)."""
    tables: list[Any] = []

    def make(capacity: int = 4096) -> tuple[Any, Any]:
        eng = make_engine(capacity=capacity)
        if not is_redis(eng):
            factory.publish_urls(eng, []).close()
        table = eng.row_urls()
        tables.append(table)
        return eng, table

    yield make
    for table in tables:
        table.drop()


def _add(table: Any, urls: list[str], **kw: Any) -> Any:
    return table.add(urls, np.full(len(urls), NOW, np.int64), 3600, "submitted", **kw)


def test_added_urls_are_found_by_row_and_by_url(urls_of: Callable[..., tuple[Any, Any]]) -> None:
    eng, table = urls_of()
    got = _add(table, URLS)
    assert (got.added, got.known, got.unparked) == (len(URLS), 0, 0)
    assert got.new.all() and len(set(got.rows.tolist())) == len(URLS)
    rows = got.rows.tolist()
    assert [table[r] for r in rows] == URLS
    assert table.many(rows) == URLS
    assert [table.find(u) for u in URLS] == rows
    assert len(table) == len(URLS) == eng.stats()["rows"]
    every = table.urls()
    assert [every[r] for r in rows] == URLS
    assert sorted(u for u in every if u) == sorted(URLS)


def test_known_urls_are_left_alone_and_new_ones_get_rows(
        urls_of: Callable[..., tuple[Any, Any]]) -> None:
    eng, table = urls_of()
    first = _add(table, URLS[:4])
    again = _add(table, [URLS[1], URLS[5], URLS[3], URLS[6]])
    assert (again.added, again.known, again.unparked) == (2, 2, 0)
    assert again.new.tolist() == [False, True, False, True]
    assert again.rows[0] == first.rows[1] and again.rows[2] == first.rows[3]
    assert table.find(URLS[5]) == again.rows[1] and table.find(URLS[6]) == again.rows[3]
    assert eng.stats()["rows"] == len(table) == 6


def test_adding_a_parked_url_again_makes_its_row_due(
        urls_of: Callable[..., tuple[Any, Any]]) -> None:
    eng, table = urls_of()
    rows = _add(table, URLS[:2]).rows.tolist()
    batch = eng.claim(budget=2, now_ms=NOW)
    assert sorted(batch.rows.tolist()) == sorted(rows)
    parked = int(batch.rows[0])
    eng.fail(parked, int(batch.tokens[0]), retry_at_ms=PARKED_MS, now_ms=NOW)  # --max-failures
    eng.release(int(batch.rows[1]), int(batch.tokens[1]), now_ms=NOW)
    assert eng.describe(parked, now_ms=NOW)["due_ms"] == PARKED_MS
    got = _add(table, [table[parked]], now_ms=NOW + 1000)
    assert (got.added, got.known, got.unparked) == (0, 1, 1)
    assert got.rows.tolist() == [parked]
    assert eng.describe(parked, now_ms=NOW + 1000)["due_ms"] != PARKED_MS


@pytest.mark.parametrize("bad", ["", "https://a.example/\nb", None, 42])
def test_a_bad_url_is_refused_and_nothing_is_added(
        urls_of: Callable[..., tuple[Any, Any]], bad: Any) -> None:
    eng, table = urls_of()
    _add(table, URLS[:2])
    with pytest.raises(EngineValueError):
        _add(table, [URLS[2], bad])
    assert len(table) == eng.stats()["rows"] == 2
    with pytest.raises(EngineValueError):
        table.find(URLS[2])


def test_rows_beyond_the_capacity_are_refused_and_every_row_keeps_its_url(
        urls_of: Callable[..., tuple[Any, Any]], backend: str) -> None:
    eng, table = urls_of(capacity=4)
    _add(table, URLS[:3])
    with pytest.raises(CapacityError):
        _add(table, URLS[3:6])
    rows = eng.stats()["rows"]
    every = table.urls()
    assert len(table) == rows == sum(1 for u in every if u) <= 4  # no row without its URL
    assert all(table.find(u) == r for r, u in enumerate(every) if u)
    if backend != "redis-sharded":  # over shards each shard's part is a call of its own
        assert rows == 3
        with pytest.raises(EngineValueError):
            table.find(URLS[3])


def test_an_unknown_row_or_url_is_an_error(urls_of: Callable[..., tuple[Any, Any]]) -> None:
    _, table = urls_of()
    rows = _add(table, URLS[:2]).rows
    with pytest.raises(EngineValueError):
        table.find("https://shop.example/never")
    with pytest.raises(EngineValueError):
        table[int(rows.max()) + 100]


def test_the_routes_are_kept_with_the_urls(urls_of: Callable[..., tuple[Any, Any]]) -> None:
    _, table = urls_of()
    assert table.routes() is None
    table.store_routes('{"routes": []}')
    assert table.routes() == '{"routes": []}'


# -- a scope: the rows under a URL prefix (POST /api/prioritize) ---------------------------------

SCOPED = ["https://shop.example/p/1", "https://shop.example/p/10", "https://shop.example/p/2",
          "https://shop.example/p[1]", "https://shop.example/p/é", "https://shop.example:8080/p/1",
          "https://shop.example.org/p/1", "https://shop.example/q/1"]


def _state(eng: Any, rows: list[int]) -> list[tuple[Any, ...]]:
    return [(d["lane"], d["due_ms"], d["urgent"]) for d in (eng.describe(r) for r in rows)]


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 3 URLs on Redis (one FCALL each), so a scope spans several."""
    monkeypatch.setattr("engine.redis.urls.PREFIX_PAGE", 3)


@pytest.mark.usefixtures("small_pages")
@pytest.mark.parametrize("prefix", ["https://shop.example/p/1", "https://shop.example/p",
                                    "https://shop.example", "https://shop.example/p/é",
                                    "https://shop.example/none"])
def test_a_prefix_finds_and_prioritizes_exactly_the_rows_under_it(
        urls_of: Callable[..., tuple[Any, Any]], prefix: str) -> None:
    eng, table = urls_of()
    rows = table.add(SCOPED, np.full(len(SCOPED), NOW + 3_600_000, np.int64), 3600,
                     "submitted").rows.tolist()
    under = [r for r, u in zip(rows, SCOPED, strict=True) if u.startswith(prefix)]
    found, urls = table.find_prefix(prefix)
    assert sorted(found.tolist()) == sorted(under)
    assert sorted(urls) == sorted(u for u in SCOPED if u.startswith(prefix))
    assert [table[r] for r in found.tolist()] == urls  # each row with its own URL
    others = [r for r in rows if r not in under]
    before = _state(eng, others)
    got = table.prioritize_prefix(prefix, "rush", now_ms=NOW)
    assert (got.matched, got.done) == (len(under), len(under))
    assert _state(eng, under) == [(0, NOW, True)] * len(under)
    assert _state(eng, others) == before
    got = table.prioritize_prefix(prefix, "wait", now_ms=NOW + 5)
    assert (got.matched, got.done) == (len(under), len(under))
    assert all(lane != 0 and due == NOW + 5 and not urgent
               for lane, due, urgent in _state(eng, under))
    assert eng.verify() == []


@pytest.mark.usefixtures("small_pages")
def test_a_prefix_skips_removed_rows_and_leaves_leases_held(
        urls_of: Callable[..., tuple[Any, Any]]) -> None:
    eng, table = urls_of()
    urls = [f"https://shop.example/c/{i}" for i in range(8)]
    rows = table.add(urls, np.full(len(urls), NOW - 1000, np.int64), 3600).rows.tolist()
    eng.remove(rows[2])
    batch = eng.claim(budget=2, now_ms=NOW)  # in flight while the scope runs
    held = dict(zip(batch.rows.tolist(), batch.tokens.tolist(), strict=True))
    assert len(held) == 2 and rows[2] not in held
    got = table.prioritize_prefix("https://shop.example/c/", "rush", now_ms=NOW + 1)
    assert (got.matched, got.done) == (8, 7)  # a removed row matched, not made due
    assert eng.describe(rows[2])["queued"] is False
    for row, token in held.items():  # the lease goes on; it ends with the new key
        assert eng.describe(row, now_ms=NOW + 1)["leased"] is True
        eng.release(row, token, now_ms=NOW + 2)
    live = [r for r in rows if r != rows[2]]
    assert _state(eng, live) == [(0, NOW + 1, True)] * len(live)
    assert eng.verify() == []


def test_a_prefix_refuses_an_unknown_mode_and_changes_nothing(
        urls_of: Callable[..., tuple[Any, Any]]) -> None:
    eng, table = urls_of()
    rows = _add(table, URLS).rows.tolist()
    before = _state(eng, rows)
    for mode in ("later", "", None):
        with pytest.raises(EngineValueError):
            table.prioritize_prefix("https://shop.example/", mode, now_ms=NOW)
    assert _state(eng, rows) == before


@settings(max_examples=15, deadline=None)
@given(urls=st.lists(st.text("ab/é", min_size=0, max_size=4), min_size=1, max_size=30,
                     unique=True),
       prefix=st.text("ab/é", max_size=3), removed=st.sets(st.integers(0, 29), max_size=5),
       rush=st.booleans())
def test_a_prefix_is_prioritize_many_of_the_rows_a_scan_finds(
        fresh: Callable[..., Any], urls: list[str], prefix: str, removed: set[int],
        rush: bool) -> None:
    """The reference is the plain scan: every row whose URL starts with the prefix."""
    full = [f"https://h.example/{u}" for u in urls]
    with fresh(capacity=64) as eng:
        if not is_redis(eng):
            factory.publish_urls(eng, []).close()
        table = eng.row_urls()
        try:
            rows = table.add(full, np.full(len(full), NOW + 3_600_000, np.int64), 7200,
                             "discovered").rows.tolist()
            gone = {rows[i] for i in removed if i < len(rows)}
            for r in gone:
                eng.remove(r)
            under = [r for r, u in zip(rows, full, strict=True)
                     if u.startswith("https://h.example/" + prefix)]
            rest = [r for r in rows if r not in under and r not in gone]
            before = _state(eng, rest)
            got = table.prioritize_prefix("https://h.example/" + prefix,
                                          "rush" if rush else "wait", now_ms=NOW)
            assert (got.matched, got.done) == (len(under), len(set(under) - gone))
            for lane, due, urgent in _state(eng, [r for r in under if r not in gone]):
                assert due == NOW and urgent is rush and (lane == 0) is rush
            assert _state(eng, rest) == before
            assert eng.verify() == []
        finally:
            table.drop()
