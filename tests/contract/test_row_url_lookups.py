"""What ``lanes serve`` asks a URL table without reading it whole (``RowUrls.find_many``,
``RowUrls.origins``): the same answers as a scan of ``urls()`` on every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW, is_redis

from engine import factory
from engine.corpus.urlnorm import origin_of

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

# Origins whose entries interleave in byte order: a port, a longer host, a bare origin, a query
# straight after the host, a non-ASCII path, http beside https.
AWKWARD = ["https://a.example/", "https://a.example/x", "https://a.example:8443/x",
           "https://a.example.org/x", "https://a.example", "https://a.example?q=1",
           "https://a.examplf/é", "http://a.example/x", "https://b.example/",
           "https://a.example:8443/y"]


def _table(fresh_eng: Any) -> Any:
    if not is_redis(fresh_eng):
        factory.publish_urls(fresh_eng, []).close()
    return fresh_eng.row_urls()


def _add(table: Any, urls: list[str]) -> list[int]:
    rows: list[int] = table.add(urls, np.full(len(urls), NOW, np.int64), 3600).rows.tolist()
    return rows


def test_find_many_gives_each_urls_row_and_minus_one_for_the_unknown(
        fresh: Callable[..., Any]) -> None:
    urls = [f"https://shop.example/p/{i}" for i in range(100)]
    with fresh(capacity=256) as eng:
        table = _table(eng)
        try:
            rows = _add(table, urls)
            asked = urls[::-1] + ["https://shop.example/none", urls[3]]
            want = rows[::-1] + [-1, rows[3]]
            assert table.find_many(asked).tolist() == want  # more than one by one
            assert table.find_many(asked[:3] + ["https://x.example/"]).tolist() == \
                want[:3] + [-1]
            assert table.find_many([]).tolist() == []
        finally:
            table.drop()


def test_origins_are_every_urls_scheme_host_and_port(fresh: Callable[..., Any]) -> None:
    with fresh(capacity=64) as eng:
        table = _table(eng)
        try:
            assert table.origins() == frozenset()
            _add(table, AWKWARD[:4])
            assert table.origins() == {origin_of(u) for u in AWKWARD[:4]}
            _add(table, AWKWARD[4:])  # new rows are seen
            assert table.origins() == {origin_of(u) for u in AWKWARD}
        finally:
            table.drop()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["http", "https"]),
                          st.sampled_from(["a.example", "a.example.org", "a.examplf", "b.c"]),
                          st.sampled_from(["", ":8080", ":8"]),
                          st.sampled_from(["", "/", "/x", "?q", "/é", "#f"])),
                min_size=1, max_size=20, unique=True))
def test_origins_match_a_scan_of_the_urls(fresh: Callable[..., Any],
                                          parts: list[tuple[str, str, str, str]]) -> None:
    urls = [f"{s}://{h}{p}{rest}" for s, h, p, rest in parts]
    with fresh(capacity=64) as eng:
        table = _table(eng)
        try:
            _add(table, urls)
            assert table.origins() == {origin_of(u) for u in table.urls() if u}
        finally:
            table.drop()
