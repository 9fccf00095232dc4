"""One engine row per (URL, variant) (engine/corpus/variant_rows.py), on every backend: a route
naming two variants gives each URL two rows, however the URL is added, each scheduled in its
lane and counted in capacity; a URL, a scope and a route reach both rows; a route without
variants keeps one row per URL under its plain URL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lanes_testlib import NOW, is_redis

from engine import factory
from engine.corpus import variant_rows
from engine.corpus.model import Corpus
from engine.corpus.routes import Routes
from engine.corpus.rules import VARIANT_NAMES
from engine.corpus.urlnorm import BadUrl, normal_url
from engine.errors import CapacityError
from engine.pool.grow import add_corpus
from engine.serve.recache import Ask, Pool, prioritize

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

P = [f"https://shop.example/p/{i}" for i in range(3)]  # two variants
C = [f"https://shop.example/c/{i}" for i in range(2)]  # none
M = ["https://shop.example/m/0"]  # mobile only: its plain URL is the mobile row


@pytest.fixture
def routes(tmp_path: Path) -> Routes:
    path = tmp_path / "routes.toml"
    path.write_text('[[route]]\nname = "product"\nmatch = "https://shop.example/p/*"\n'
                    'interval = "1d"\nvariants = ["mobile", "desktop"]\n\n'
                    '[[route]]\nname = "category"\nregex = "https://shop\\\\.example/c/[0-9]+"\n'
                    'interval = "1h"\n\n'
                    '[[route]]\nname = "mobile"\nmatch = "https://shop.example/m/*"\n'
                    'interval = "2h"\nvariants = ["mobile"]\n')
    return Routes.load(path)


@pytest.fixture
def pool_of(make_engine: Callable[..., Any], routes: Routes) -> Iterator[Callable[[], Any]]:
    """``pool_of() -> (engine, URL table)`` with the routes stored beside the URLs, as a pool
    keeps them; disposed at the end."""
    tables: list[Any] = []

    def make() -> tuple[Any, Any]:
        eng = make_engine(capacity=64)
        if not is_redis(eng):
            factory.publish_urls(eng, []).close()
        table = eng.row_urls()
        table.store_routes(routes.to_json())
        tables.append(table)
        return eng, table

    yield make
    for table in tables:
        table.drop()


def _keys(table: Any) -> list[str]:
    return [u for u in table.urls() if u]  # (sharded: a row number per shard, gaps between)


def _corpus(urls: list[str]) -> Corpus:
    n = len(urls)
    return Corpus(urls, np.full(n, 3600, np.int64), np.zeros(n, np.uint8),
                  np.full(n, NOW, np.int64))


def test_a_route_with_two_variants_gives_each_url_a_row_per_variant(
        pool_of: Callable[[], Any], routes: Routes) -> None:
    eng, table = pool_of()
    got = add_corpus(eng, table, _corpus(P + C + M))  # the stored routes apply
    assert got.added == 2 * len(P) + len(C) + len(M) == eng.stats()["rows"] == len(_keys(table))
    keys = set(_keys(table))
    assert keys == {*P, *(f"{u} mobile" for u in P), *C, *M}
    # each row has its route's interval and lane: the variant row its URL's
    for u in P:
        plain, mobile = variant_rows.rows_of(table, [u])[0]
        assert table[mobile] == f"{u} mobile" and eng.lane(plain) == eng.lane(mobile)
        assert routes.rules_for(table[mobile]).variants == ("mobile", "desktop")
    assert [variant_rows.variant_of(table[variant_rows.rows_of(table, [u])[0][0]],
                                    routes.rules_for(u).variants) for u in (P[0], C[0], M[0])] \
        == ["desktop", None, "mobile"]
    # adding again adds nothing; both rows are claimed, each in its own lease
    again = add_corpus(eng, table, _corpus(P))
    assert (again.added, again.known) == (0, 2 * len(P))
    batch = eng.claim(budget=64, now_ms=NOW + 1)
    assert sorted(table.many(batch.rows.tolist())) == sorted(keys)


@pytest.mark.one_queue("capacity is each shard's: which shard fills first is the URLs' hashes'")
def test_capacity_counts_every_variant_row(make_engine: Callable[..., Any],
                                           routes: Routes) -> None:
    eng = make_engine(capacity=5)
    if not is_redis(eng):
        factory.publish_urls(eng, []).close()
    table = eng.row_urls()
    try:
        table.store_routes(routes.to_json())
        add_corpus(eng, table, _corpus(P[:2]))
        assert eng.stats()["rows"] == 4
        with pytest.raises(CapacityError):
            add_corpus(eng, table, _corpus(P[2:]))  # two rows, one left
        assert eng.stats()["rows"] == 4 == len(_keys(table))  # refused whole
    finally:
        table.drop()


def test_a_url_a_scope_and_a_route_reach_every_variant_row(
        pool_of: Callable[[], Any], routes: Routes) -> None:
    eng, table = pool_of()
    add_corpus(eng, table, _corpus(P + C))
    later = NOW + 3_600_000 * 24
    rows = eng.claim(budget=64, now_ms=NOW + 1)
    for c in rows:
        eng.complete(c.row, c.token, next_due_ms=later, now_ms=NOW + 2)
    pool = Pool(eng, table, routes, None)

    def due_now(urls: list[str]) -> set[str]:
        batch = eng.claim(budget=64, now_ms=NOW + 10)
        got = set(table.many(batch.rows.tolist()))
        for c in batch:
            eng.complete(c.row, c.token, next_due_ms=later, now_ms=NOW + 11)
        return got

    assert prioritize(pool, Ask.of({"url": P[0], "mode": "wait"}), NOW + 5)["matched"] == 2
    assert due_now(P) == {P[0], f"{P[0]} mobile"}
    got = prioritize(pool, Ask.of({"scope": "https://shop.example/p/*", "mode": "wait"}),
                     NOW + 5)
    assert got["matched"] == 2 * len(P)
    assert due_now(P) == {*P, *(f"{u} mobile" for u in P)}
    assert prioritize(pool, Ask.of({"scope": "route:product", "mode": "wait"}),
                      NOW + 5)["matched"] == 2 * len(P)
    assert len(due_now(P)) == 2 * len(P)
    # the regex route, which no "URL mobile" key would fullmatch, still finds its plain rows
    assert prioritize(pool, Ask.of({"scope": "route:category", "mode": "wait"}),
                      NOW + 5)["matched"] == len(C)


def test_an_added_url_gets_its_variant_rows_too(pool_of: Callable[[], Any],
                                                routes: Routes) -> None:
    eng, table = pool_of()
    add_corpus(eng, table, _corpus(C))
    pool = Pool(eng, table, routes, None)
    got = prioritize(pool, Ask.of({"url": P[1], "mode": "rush", "add": True}), NOW)
    assert (got["added"], got["unknown"]) == (2, [])
    assert set(_keys(table)) == {*C, P[1], f"{P[1]} mobile"}


# -- the key itself ---------------------------------------------------------------------------

def _normal(host: str, path: str) -> str | None:
    try:
        return normal_url(f"https://{host}.example/{path}")
    except BadUrl:
        return None


def _normal_as_it_is(text: str) -> bool:
    try:
        return normal_url(text) == text
    except BadUrl:
        return False


_URLS = st.builds(_normal, st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
                  st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                          max_size=20)).filter(lambda u: u is not None)


@given(_URLS, st.lists(st.sampled_from(VARIANT_NAMES), min_size=1, max_size=2, unique=True))
def test_a_variant_key_round_trips_and_never_equals_a_url(url: str,
                                                          variants: list[str]) -> None:
    keys = [variant_rows.key_of(url, v, variants) for v in variants]
    assert len(set(keys)) == len(variants)  # one key per variant
    assert keys.count(url) == 1  # exactly one of them is the plain URL
    for v, key in zip(variants, keys, strict=True):
        assert variant_rows.url_of(key) == url
        assert variant_rows.variant_of(key, variants) == v
        assert key in variant_rows.keys_of(url)
        assert _normal_as_it_is(key) == (key == url)  # a variant key is never a normal URL
