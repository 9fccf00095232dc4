"""Prioritize by URL, list or scope (``POST /api/prioritize``, prerender's ``POST /recache``,
``lanes prioritize``) on both backends, against a running ``lanes serve`` over a pool at rest:
the modes (rush, wait, clear-and-rush, clear-and-wait), adding unknown pages, and bad input
refused with the reason and nothing changed."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from front_door_testlib import Served, get
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import dispose, unique_name
from pool_testlib import cli

from engine.checks import wall_ms
from engine.corpus.routes import Route, Routes
from engine.store import SnapshotStore

HOUR_S = 3600
CATALOG = [f"https://shop.example/catalog/{i}" for i in range(12)]
PRODUCTS = [f"https://shop.example/p/{i}" for i in range(20)]
URLS = CATALOG + PRODUCTS
ROUTES = Routes((Route("catalog", "https://shop.example/catalog/*", False, 6 * HOUR_S),
                 Route("product", "https://shop.example/p/*", False, 24 * HOUR_S)))
TOKEN = "recache-test-token-0123456789-abcdefghijkl"


@dataclass
class Pool:
    name: str
    redis: str | None
    store: Path
    eng: Any

    def args(self) -> tuple[str, ...]:
        return (self.name, "--store", str(self.store)) + (
            ("--redis", self.redis) if self.redis else ())

    def state(self) -> list[tuple[int, int | None]]:
        """(lane, due_ms) of every row."""
        n = int(self.eng.stats()["rows"])
        return [(int(self.eng.lane(r)), self.eng.due_ms(r)) for r in range(n)]


@pytest.fixture(params=["shm", "redis"])
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pool]:
    """A pool at rest: URLS as rows (all due in an hour) with their URL table and routes, as
    a pool keeps them, and a store holding a snapshot of every page."""
    import engine
    from engine import factory

    name = unique_name()
    due = np.full(len(URLS), wall_ms() + HOUR_S * 1000, np.int64)
    interval, prov, _ = ROUTES.apply(URLS, np.full(len(URLS), HOUR_S), np.zeros(len(URLS)))
    redis = None if request.param == "shm" else request.getfixturevalue("redis_server").url
    with contextlib.ExitStack() as stack:
        eng = engine.open(name, redis, create=True, capacity=256)
        stack.callback(dispose, eng, name)
        if redis is None:  # a shared-memory pool publishes its (here empty) table first
            factory.publish_urls(eng, []).close()
        urls = eng.row_urls()
        stack.callback(urls.drop)
        urls.add(URLS, due, interval, prov)
        urls.store_routes(ROUTES.to_json())
        store = tmp_path / "store"
        with SnapshotStore.open(store) as s:
            for u in URLS:
                s.put(u, f"<p>{u}</p>", status=200, location=None, interval_s=HOUR_S, lane=1,
                      render_ms=1.0)
        yield Pool(name, redis, store, eng)


def post(port: int, path: str, body: object, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, answer = get(port, path, {"Content-Type": "application/json", **(headers or {})},
                            method="POST", body=raw)
    try:
        return status, json.loads(answer)
    except ValueError:
        return status, {"text": answer.decode(errors="replace")}


def answered_by(port: int, url: str) -> str:
    """``served`` (a snapshot) or ``origin`` (none: the origin's answer, here unreachable)."""
    return get(port, f"/{url}")[1]["x-lanes-snapshot"]


def test_rush_a_url_keeps_its_snapshot_and_makes_it_urgent(pool: Pool) -> None:
    with Served(*pool.args()) as srv:
        before = pool.state()
        status, out = post(srv.port, "/api/prioritize", {"url": "https://SHOP.example/p/3"})
        assert status == 200 and out == {"matched": 1, "added": 0, "unknown": [],
                                         "unknown_count": 0, "cleared": 0, "mode": "rush"}
        row = URLS.index("https://shop.example/p/3")
        after = pool.state()
        assert after[row][0] == 0 and after[row][1] <= wall_ms()  # urgent, due now
        assert [s for i, s in enumerate(after) if i != row] == [
            s for i, s in enumerate(before) if i != row]  # nothing else moved
        assert answered_by(srv.port, URLS[row]) == "served"  # served until the new one lands


def test_a_scope_by_prefix_or_route_rushes_every_page_in_it(pool: Pool) -> None:
    with Served(*pool.args()) as srv:
        status, out = post(srv.port, "/api/prioritize",
                           {"scope": "https://shop.example/catalog/*"})
        assert status == 200 and out["matched"] == len(CATALOG)
        state = pool.state()
        assert all(state[URLS.index(u)][0] == 0 for u in CATALOG)
        assert all(state[URLS.index(u)][0] != 0 for u in PRODUCTS)
        status, out = post(srv.port, "/api/prioritize", {"scope": "route:product",
                                                         "mode": "wait"})
        assert status == 200 and out["matched"] == len(PRODUCTS)
        now = wall_ms()
        state = pool.state()
        assert all(state[URLS.index(u)][0] != 0 and state[URLS.index(u)][1] <= now
                   for u in PRODUCTS)  # own lane, due now
        status, out = post(srv.port, "/api/prioritize", {"scope": "https://shop.example/none/*"})
        assert status == 200 and out["matched"] == 0  # a scope that matches nothing


@pytest.mark.parametrize("pattern, is_regex", [
    ("https://shop.example/p/*", False),         # looked for under its prefix
    (r"https://shop\.example/p/\d+", True),
    ("*/p/*", False),                            # opens with a wildcard: the whole table
])
def test_a_route_scope_is_the_rows_whose_first_matching_route_it_is(
        pool: Pool, pattern: str, is_regex: bool) -> None:
    """An earlier route takes /p/1 and /p/1x from ``product``: its scope leaves them alone."""
    from engine.serve.recache import Ask, prioritize
    from engine.serve.recache import Pool as Target

    routes = Routes((Route("sale", "https://shop.example/p/1*", False, HOUR_S),
                     Route("product", pattern, is_regex, 24 * HOUR_S),
                     Route("catalog", "https://shop.example/catalog/*", False, 6 * HOUR_S)))
    product = [u for u in PRODUCTS if not u.removeprefix("https://shop.example/p/")
               .startswith("1")]
    with contextlib.closing(pool.eng.row_urls()) as table:
        target = Target(pool.eng, table, routes, None)
        out = prioritize(target, Ask.scoped("route:product"))
        assert out["matched"] == len(product) == 9
        state = pool.state()
        assert sorted(u for u in URLS if state[URLS.index(u)][0] == 0) == sorted(product)
        assert prioritize(target, Ask.scoped("route:sale"))["matched"] == len(PRODUCTS) - 9
        # catalog starts where no route before it does: a prefix scope (on Redis, its server)
        assert (routes.own_prefix(2) is None) is (pattern == "*/p/*")
        assert prioritize(target, Ask.scoped("route:catalog"))["matched"] == len(CATALOG)


def test_clear_modes_drop_the_snapshot_at_once(pool: Pool) -> None:
    with Served(*pool.args()) as srv:
        gone, rushed = PRODUCTS[0], PRODUCTS[1]
        status, out = post(srv.port, "/api/prioritize", {"url": gone, "mode": "clear-and-wait"})
        assert status == 200 and out["cleared"] == 1 and out["matched"] == 1
        assert answered_by(srv.port, gone) == "origin"  # at once: not after the cache's second
        state = pool.state()
        assert state[URLS.index(gone)][0] != 0 and state[URLS.index(gone)][1] <= wall_ms()
        status, out = post(srv.port, "/api/prioritize", {"urls": [rushed],
                                                         "mode": "clear-and-rush"})
        assert status == 200 and out["cleared"] == 1
        assert answered_by(srv.port, rushed) == "origin"
        assert pool.state()[URLS.index(rushed)][0] == 0
        status, out = post(srv.port, "/api/prioritize", {"scope": "route:catalog",
                                                         "mode": "clear-and-wait"})
        assert out["cleared"] == len(CATALOG)
        assert all(answered_by(srv.port, u) == "origin" for u in CATALOG)
        assert answered_by(srv.port, PRODUCTS[5]) == "served"
    with SnapshotStore.open(pool.store, create=False) as s:
        assert s.statistics()["snapshots"] == len(URLS) - 2 - len(CATALOG)
        assert s.sweep()["orphans"] == 0  # the clears left no file behind


def test_unknown_pages_are_reported_or_added_on_the_pools_hosts(pool: Pool) -> None:
    new = ["https://shop.example/p/new-1", "https://shop.example/catalog/new-2"]
    with Served(*pool.args()) as srv:
        status, out = post(srv.port, "/api/prioritize", {"urls": [PRODUCTS[0], *new]})
        assert status == 200 and out["matched"] == 1 and out["unknown"] == new
        assert int(pool.eng.stats()["rows"]) == len(URLS)
        status, out = post(srv.port, "/api/prioritize", {"urls": new, "add": True})
        assert status == 200 and out["added"] == 2 and out["unknown"] == [], out
        state = pool.state()
        assert len(state) == len(URLS) + 2 and state[-1][0] == 0 and state[-2][0] == 0
        status, out = post(srv.port, "/api/prioritize", {"urls": new})
        assert status == 200 and out["matched"] == 2 and out["added"] == 0  # known now


BAD: list[tuple[object, str]] = [
    ({"url": "not a url"}, "url"),
    ({"urls": ["https://shop.example/p/1", "ftp://shop.example/x"]}, "urls[1]"),
    ({"urls": [f"https://shop.example/p/{i}" for i in range(10_001)]}, "at most 10,000"),
    ({"url": "https://shop.example/p/1", "mode": "later"}, "mode must be one of"),
    ({"url": "https://elsewhere.example/p/1"}, "hosts the pool does not render"),
    ({"url": "https://elsewhere.example/p/1", "add": True}, "hosts the pool does not render"),
    ({"scope": "https://elsewhere.example/*"}, "renders no page"),
    ({"scope": "https://shop.example/p/"}, "ending in *"),
    ({"scope": "route:nope"}, "no route"),
    ({"url": "https://shop.example/p/1", "scope": "route:product"}, "exactly one"),
    ({"url": "https://shop.example/p/1", "add": "yes"}, "add must be"),
    ({"urls": []}, "non-empty"),
    ({"url": "https://shop.example/p/1", "colour": 1}, "unknown field"),
    ([1, 2], "JSON object"),
    (b"{not json", "not JSON"),
]


def test_bad_input_is_refused_with_the_reason_and_changes_nothing(pool: Pool) -> None:
    with Served(*pool.args()) as srv:
        before = pool.state()
        for body, why in BAD:
            status, out = post(srv.port, "/api/prioritize", body)
            assert status == 400 and why in out["error"], (body if not isinstance(body, dict)
                                                           else list(body), out)
        status, _ = post(srv.port, "/api/prioritize", b"url=x",
                         {"Content-Type": "application/x-www-form-urlencoded"})
        assert status in (403, 415)  # a form is no API call (and has no CSRF token)
        assert pool.state() == before
        assert all(answered_by(srv.port, u) == "served" for u in URLS[:3])


def test_a_tokened_or_read_only_server_refuses_without_the_right_to(pool: Pool,
                                                                    tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    url = PRODUCTS[7]
    with Served(*pool.args(), "--token-file", str(token)) as srv:
        assert post(srv.port, "/api/prioritize", {"url": url})[0] == 401
        status, out = post(srv.port, "/api/prioritize", {"url": url},
                           {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and out["matched"] == 1
        # prerender.io's recache API: the token in the body
        status, out = post(srv.port, "/recache", {"prerenderToken": TOKEN, "url": PRODUCTS[8]})
        assert status == 200 and out["matched"] == 1 and out["mode"] == "rush"
        status, out = post(srv.port, "/recache", {"prerenderToken": TOKEN,
                                                  "urls": PRODUCTS[9:12]})
        assert status == 200 and out["matched"] == 3
        assert post(srv.port, "/recache", {"prerenderToken": "w" * 40, "url": url})[0] == 401
        assert post(srv.port, "/recache", {"url": url})[0] == 401
        assert post(srv.port, "/recache", {"prerenderToken": TOKEN, "url": url,
                                           "mode": "clear-and-wait"})[0] == 400  # rush only
    state = pool.state()
    assert all(state[URLS.index(u)][0] == 0 for u in [url, *PRODUCTS[8:12]])
    with Served(*pool.args(), "--read-only") as srv:
        status, _ = post(srv.port, "/api/prioritize", {"url": PRODUCTS[13]})
        assert status == 403
        assert pool.state()[URLS.index(PRODUCTS[13])][0] != 0


def test_lanes_prioritize_takes_lists_and_scopes(pool: Pool, tmp_path: Path) -> None:
    more = ("--redis", pool.redis) if pool.redis else ()
    listed = tmp_path / "urls.txt"
    listed.write_text("\n".join(PRODUCTS[:4]) + "\n\n")
    p = cli("prioritize", pool.name, "--urls", str(listed), "--mode", "clear-and-rush",
            "--store", str(pool.store), *more)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out)["matched"] == 4 and json.loads(out)["cleared"] == 4
    p = cli("prioritize", pool.name, "--scope", "route:catalog", "--mode", "wait", *more)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and json.loads(out)["matched"] == len(CATALOG), err
    p = cli("prioritize", pool.name, "--scope", "https://shop.example/p/1*",
            "--mode", "clear-and-wait", *more)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--store" in err  # a clear needs the store: nothing done
    state = pool.state()
    assert all(state[URLS.index(u)][0] == 0 for u in PRODUCTS[:4])
    with SnapshotStore.open(pool.store, create=False) as s:
        assert s.get(PRODUCTS[0]) is None and s.get(PRODUCTS[10]) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(URLS + ["https://shop.example/p/x", "https://shop.example/"]),
                min_size=1, max_size=6), st.booleans())
def test_clear_removes_exactly_the_snapshots_named(urls: list[str], twice: bool) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d, SnapshotStore.open(Path(d) / "s") as s:
        for u in URLS:
            s.put(u, f"<p>{u}</p>", status=200, location=None, interval_s=60, lane=1,
                  render_ms=1.0)
        assert s.clear(urls) == len(set(urls) & set(URLS))
        if twice:
            assert s.clear(urls) == 0
        assert {u for u in URLS if s.get(u) is None} == set(urls) & set(URLS)
        files = sum(len(f) for _, _, f in os.walk(Path(d) / "s" / "snapshots"))
        assert files == len(set(URLS) - set(urls))  # no file left behind, none taken wrongly
