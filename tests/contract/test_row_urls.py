"""A pool's URLs (``QueueEngine.row_urls``, ``RowUrls``): one suite for the three tables, the
files in /dev/shm beside a segment (``UrlTable``), the hashes beside a Redis queue
(``RedisUrls``) and their shards (``ShardedUrls``). Each URL is added with its row, a known one
left alone (a parked one made due), bad input refused with nothing changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
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
