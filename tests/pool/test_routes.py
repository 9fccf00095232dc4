"""Routes (engine/corpus/routes.py): per-route intervals from a TOML file, first match wins, on
the normalised URL; resolution route > stored > default; every bad file refused naming where."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW

from engine import CorpusError, EngineValueError
from engine.corpus.read import read_corpora, read_corpus
from engine.corpus.routes import Route, Routes
from engine.corpus.sitemaps import CHANGEFREQ_INTERVALS, MISSING_CHANGEFREQ
from engine.errors import EngineTypeError
from engine.policy import MAX_INTERVAL_S

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "data" / "site"
SHOP = ROOT / "examples" / "routes-shop.toml"
HOUR, DAY = 3600, 86_400


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, prefix: str, *fragments: str) -> None:
    with pytest.raises(CorpusError) as info:
        Routes.load(path)
    msg = str(info.value)
    assert msg.startswith(prefix), msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_the_shop_example_loads_with_its_three_routes() -> None:
    routes = Routes.load(SHOP)
    assert routes.names() == ["home", "category", "product"]
    assert [r.interval_s for r in routes.routes] == [HOUR, 6 * HOUR, 48 * HOUR]
    assert [r.is_regex for r in routes.routes] == [False, True, False]
    assert routes.routes[1].provenance == 0 and routes.routes[0].provenance is None
    got = routes.match(["https://shop.example/", "https://shop.example/c/kettles/",
                        "https://shop.example/c/kettles", "https://shop.example/c/kettles/page/2/",
                        "https://shop.example/p/kettle-9", "https://shop.example/about",
                        "https://shop.example"])
    assert got.dtype == np.int16
    assert got.tolist() == [0, 1, 1, -1, 2, -1, -1]


def test_the_first_matching_route_wins_and_globs_span_slashes() -> None:
    routes = Routes((Route("deep", "https://s.test/p/*/reviews", False, 60),
                     Route("any p", "https://s.test/p/*", False, 120),
                     Route("also p", r"https://s\.test/p/.*", True, 180)))
    assert routes.match(["https://s.test/p/a/b/reviews", "https://s.test/p/a/b",
                         "https://s.test/q"]).tolist() == [0, 1, -1]


def test_a_regex_must_match_the_whole_url() -> None:
    routes = Routes((Route("c", r"https://s\.test/c/[^/]+/?", True, 60),))
    assert routes.match(["https://s.test/c/x/", "https://s.test/c/x/y", "xhttps://s.test/c/x",
                         "https://s.test/c/x/?page=2"]).tolist() == [0, -1, -1, -1]


def test_routes_that_cannot_share_one_regex_match_the_same_one_at_a_time() -> None:
    urls = ["https://s.test/aa/x", "https://s.test/ab/x", "https://S.test/zz", "https://s.test/"]
    plain = Routes((Route("same", r"https://s\.test/(a)a/.*", True, 60),
                    Route("ci", r"(?i:https://s\.test/zz)", True, 60),
                    Route("root", "https://s.test/", False, 60)))
    backref = Routes((Route("same", r"https://s\.test/(a)\1/.*", True, 60),) + plain.routes[1:])
    flag = Routes((Route("same", r"https://s\.test/(a)a/.*", True, 60),
                   Route("ci", r"(?i)https://s\.test/zz", True, 60), plain.routes[2]))
    assert plain._matcher.combined is not None
    assert backref._matcher.combined is None and flag._matcher.combined is None
    want = [0, -1, 1, 2]
    assert plain.match(urls).tolist() == backref.match(urls).tolist() == want
    assert flag.match(urls).tolist() == want


def test_apply_resolves_route_over_stored_and_keeps_the_stored_elsewhere() -> None:
    routes = Routes((Route("a", "https://s.test/a*", False, 60, 1),
                     Route("b", "https://s.test/b*", False, 90)))
    urls = ["https://s.test/a1", "https://s.test/b1", "https://s.test/c1"]
    interval, prov = np.array([1000, 2000, 3000]), np.array([0, 1, 0], np.uint8)
    new_interval, new_prov, ids = routes.apply(urls, interval, prov)
    assert new_interval.tolist() == [60, 90, 3000]
    assert new_prov.tolist() == [1, 1, 0] and new_prov.dtype == np.uint8
    assert ids.tolist() == [0, 1, -1]
    assert interval.tolist() == [1000, 2000, 3000] and prov.tolist() == [0, 1, 0]  # untouched
    with pytest.raises(EngineValueError, match="interval_s has 2 elements"):
        routes.apply(urls, interval[:2], prov)
    empty = Routes(())
    assert empty.match(urls).tolist() == [-1, -1, -1]
    assert empty.apply(urls, interval, prov)[0].tolist() == [1000, 2000, 3000]


def test_a_corpus_read_with_routes_resolves_route_over_stored_over_default() -> None:
    routes = Routes.load(SITE / "routes.toml")
    c = read_corpora([SITE / "sitemap.xml", SITE / "sitemap_index.xml"], now_ms=NOW,
                     routes=routes)
    by_url = {u: (int(i), int(p), int(r)) for u, i, p, r in
              zip(c.urls, c.interval_s, c.provenance, c.route, strict=True)}
    default = CHANGEFREQ_INTERVALS[MISSING_CHANGEFREQ]
    assert by_url["http://site.test/"] == (HOUR, 0, 0)  # route over the default
    assert by_url["http://site.test/en/"] == (2 * HOUR, 0, 1)  # route over hourly
    assert by_url["http://site.test/p/kettle/"] == (2 * DAY, 0, 2)  # route over daily
    assert by_url["http://site.test/blog/hello-world/"] == (6 * HOUR, 1, 3)  # and provenance
    assert by_url["http://site.test/en/about/"] == (30 * DAY, 0, -1)  # stored: monthly
    assert by_url["http://site.test/contact/"] == (default, 0, -1)  # default
    assert c.route.dtype == np.int16 and not c.route.flags.writeable
    assert c.statistics()["route"] == {-1: 9, 0: 1, 1: 2, 2: 2, 3: 2}
    assert "routed     7" in c.describe()
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.route.tolist() == c.route.tolist()
    assert back.duplicates == c.duplicates == 1 and back.duplicate_note == c.duplicate_note
    plain = read_corpora([SITE / "sitemap.xml", SITE / "sitemap_index.xml"], now_ms=NOW)
    assert plain.route.tolist() == [-1] * len(plain) and plain != c
    with pytest.raises(EngineTypeError):
        read_corpus(SITE / "sitemap.xml", now_ms=NOW, routes="routes.toml")  # type: ignore[arg-type]


def test_routes_round_trip_through_json_and_pickle() -> None:
    routes = Routes.load(SITE / "routes.toml")
    assert Routes.from_json(routes.to_json()) == routes
    assert pickle.loads(pickle.dumps(routes)) == routes
    for bad in ["", "[]", '{"routes": [{"name": "x"}]}', '{"routes": [], "more": 1}',
                '{"routes": [{"name": "x", "pattern": "*", "is_regex": false, "interval_s": 0,'
                ' "provenance": null}]}',
                '{"routes": [{"name": "x", "pattern": "*", "is_regex": false, "interval_s": 5,'
                ' "provenance": "crawled"}]}']:
        with pytest.raises(CorpusError, match="^routes JSON"):
            Routes.from_json(bad)


@pytest.mark.parametrize(("value", "seconds"), [
    ('"90s"', 90), ('"15m"', 900), ('"6h"', 6 * HOUR), ('"2d"', 2 * DAY), ("3600", 3600),
    ('" 1h "', HOUR), (str(MAX_INTERVAL_S), MAX_INTERVAL_S)])
def test_intervals_are_written_with_a_unit_or_in_seconds(tmp_path: Path, value: str,
                                                         seconds: int) -> None:
    p = write(tmp_path / "r.toml", f'[[route]]\nname = "a"\nmatch = "*"\ninterval = {value}\n')
    assert Routes.load(p).routes[0].interval_s == seconds


ROUTE_A = '[[route]]\nname = "a"\nmatch = "https://s.test/*"\ninterval = "1h"\n'


@pytest.mark.parametrize(("body", "prefix", "fragments"), [
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = "0s"\n', ':1: route 1 ("a"): ',
     ["interval", "[1, "]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = 1.5\n', ':1: route 1 ("a"): ', ["interval"]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = true\n', ':1: route 1 ("a"): ', ["interval"]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = "5w"\n', ':1: route 1 ("a"): ', ["'5w'"]),
    (f'[[route]]\nname = "a"\nmatch = "*"\ninterval = {MAX_INTERVAL_S + 1}\n',
     ':1: route 1 ("a"): ', ["interval"]),
    (ROUTE_A + '\n[[route]]\nname = "b"\nregex = "https://(unclosed"\ninterval = "1h"\n',
     ':6: route 2 ("b"): ', ["does not compile", "unclosed"]),
    (ROUTE_A + '\n[[route]]\nname = "c"\nmatch = "*"\nregex = ".*"\ninterval = "1h"\n',
     ':6: route 2 ("c"): ', ["exactly one of 'match'"]),
    ('[[route]]\nname = "a"\ninterval = "1h"\n', ':1: route 1 ("a"): ', ["exactly one of"]),
    ('[[route]]\nmatch = "*"\ninterval = "1h"\n', ":1: route 1: ", ["missing key 'name'"]),
    ('[[route]]\nname = "a"\nmatch = "*"\n', ':1: route 1 ("a"): ', ["missing key 'interval'"]),
    ('[[route]]\nname = ""\nmatch = "*"\ninterval = 60\n', ':1: route 1 (""): ', ["name"]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = 60\nfreq = 1\n', ':1: route 1 ("a"): ',
     ["unknown key 'freq'", "known: name"]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = 60\nprovenance = "crawled"\n',
     ':1: route 1 ("a"): ', ["provenance must be one of submitted, discovered"]),
    (ROUTE_A + ROUTE_A, ': route 2 ("a"): ', ["already used by route 1", "unique"]),
    ('[[route]]\nname = "a"\nmatch = "*"\ninterval = \n', ":4: not valid TOML", ["column"]),
    ('route = 1\n', ": 'route' must be an array of tables", []),
    ('', ": no [[route]] tables", []),
    ('[routes]\nname = "a"\n', ": unknown top-level key 'routes'", []),
])
def test_a_bad_routes_file_is_refused_naming_file_line_and_route(
        tmp_path: Path, body: str, prefix: str, fragments: list[str]) -> None:
    p = write(tmp_path / "routes.toml", body)
    refused(p, f"{p}{prefix}", *fragments)


def test_a_missing_or_undecodable_routes_file_is_a_corpus_error(tmp_path: Path) -> None:
    refused(tmp_path / "nope.toml", f"{tmp_path / 'nope.toml'}: cannot open")
    p = tmp_path / "bad.toml"
    p.write_bytes(b'[[route]]\nname = "\xff"\n')
    refused(p, f"{p}: not valid UTF-8")


def test_route_and_routes_check_their_fields() -> None:
    bad: list[tuple[Any, ...]] = [("", "*", False, 60), ("a", "", False, 60), ("a", "*", 1, 60),
                                  ("a", "*", False, 0), ("a", "*", False, 60, 2),
                                  ("a", "(", True, 60)]
    for args in bad:
        with pytest.raises((EngineValueError, EngineTypeError)):
            Route(*args)
    with pytest.raises(EngineValueError, match="unique"):
        Routes((Route("a", "*", False, 60), Route("a", "x*", False, 60)))
    with pytest.raises(EngineTypeError):
        Routes(("not a route",))  # type: ignore[arg-type]
    with pytest.raises(EngineTypeError):
        Routes(()).match("https://s.test/")


SMALL_URLS = st.lists(st.from_regex(r"https://s\.test/[a-c]{0,3}(/[a-c]{0,2}){0,2}",
                                    fullmatch=True), max_size=30)


def small_routes(pattern: str) -> st.SearchStrategy[Routes]:
    """Routes over ``SMALL_URLS``: globs of ``pattern``'s shape, each also as its regex."""
    import fnmatch

    def build(patterns: list[tuple[str, bool]]) -> Routes:
        return Routes(tuple(Route(f"r{i}", fnmatch.translate(p) if as_regex else p, as_regex,
                                  60) for i, (p, as_regex) in enumerate(patterns)))

    return st.lists(st.tuples(st.from_regex(pattern, fullmatch=True), st.booleans()),
                    min_size=1, max_size=6).map(build)


@settings(max_examples=100)
@given(urls=SMALL_URLS, routes=small_routes(r"https://s\.test/[a-c*?/]{0,5}"))
def test_the_combined_matcher_agrees_with_trying_each_route_in_order(
        urls: list[str], routes: Routes) -> None:
    import re

    want = [next((i for i, r in enumerate(routes.routes) if re.fullmatch(r.regex, u)), -1)
            for u in urls]
    assert routes.match(urls).tolist() == want


# Regex pieces a route is written with: literals, escapes, classes, repeats, groups, anchors.
_PIECES = ["a", "b/", r"\.", r"\?", ".", "[ab]", "a*", "b+", "a?", "(a|b)", "a{2}", r"\d",
           "(?:ab)", "$", "|", "x", r"\\"]


@settings(max_examples=300)
@given(st.lists(st.sampled_from(_PIECES), max_size=6), st.booleans(), st.data())
def test_every_url_a_route_matches_starts_with_its_prefix(
        pieces: list[str], anchored: bool, data: st.DataObject) -> None:
    """``Route.prefix`` is where a ``route:NAME`` scope looks in the sorted URL index: a URL
    it matches outside the prefix would be missed."""
    import re

    pattern = ("^" if anchored else "") + "https://s" + "".join(pieces)
    try:
        re.compile(pattern)
    except re.error:
        return
    route = Route("r", pattern, True, 60)
    url = data.draw(st.from_regex(pattern, fullmatch=True))
    assert url.startswith(route.prefix), (pattern, route.prefix, url)
    glob = data.draw(st.from_regex(r"https://s\.test/[a-c*?/\[\]]{0,5}", fullmatch=True))
    as_glob = Route("g", glob, False, 60)
    url = data.draw(st.from_regex(as_glob.regex, fullmatch=True))
    assert url.startswith(as_glob.prefix), (glob, as_glob.prefix, url)


@settings(max_examples=200)
@given(urls=SMALL_URLS, routes=small_routes(r"https://s\.test/[a-c*?/]{0,4}\*?"))
def test_a_routes_own_prefix_holds_exactly_the_urls_it_is_first_to_match(
        urls: list[str], routes: Routes) -> None:
    """Where ``own_prefix`` gives a prefix, a ``route:NAME`` scope is that prefix's scope."""
    ids = routes.match(urls).tolist()
    for i in range(len(routes.routes)):
        own = routes.own_prefix(i)
        if own is not None:
            assert [u for u, r in zip(urls, ids, strict=True) if r == i] == \
                [u for u in urls if u.startswith(own)]


def test_matching_a_large_corpus_is_one_pass(tmp_path: Any) -> None:
    routes = Routes.load(SHOP)
    urls = [f"https://shop.example/{k}/{i}" for i in range(20_000) for k in ("p", "c", "x")]
    ids = routes.match(urls)
    assert np.bincount(ids + 1).tolist() == [20_000, 0, 20_000, 20_000]
