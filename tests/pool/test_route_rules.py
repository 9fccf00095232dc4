"""Rules per route (engine/corpus/rules.py): bad input refused when the routes file loads, naming
the route and its line; and what each rule does to a render, in real Chromium (the worker's own
``Chromium`` and ``Tab``, in this process) against the browser tests' site (render_site.py):
headers and the prerender marks on the document request only, cookies, ``wait_for``, blocking
per route, and the content check."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from browser_testlib import PoolRun, stored, write_corpus
from lanes_testlib import shm_path
from pool_testlib import cli
from render_site import SiteServer

from engine.corpus.routes import Routes
from engine.corpus.rules import NO_RULES, VARIANT_NAMES, RouteRules, rules_from
from engine.errors import CorpusError
from engine.pool.browser import BrowserSpec, Chromium, check_selectors
from engine.pool.page import RENDER_MARK, ContentCheckFailed, PageFailed, Snapshot, Tab
from engine.pool.render import classify
from engine.pool.variants import VARIANTS


@pytest.fixture(scope="module")
def site() -> Iterator[SiteServer]:
    with SiteServer(delay_ms=300) as s:
        yield s


def routes_file(tmp_path: Path, body: str, match: str = "http://127.0.0.1:*/*",
                interval: str = "1d") -> Path:
    """A routes file whose second route holds ``body`` (so its line is not the first)."""
    path = tmp_path / "routes.toml"
    path.write_text('[[route]]\nname = "home"\nmatch = "https://shop.example/"\ninterval = "1h"\n'
                    f'\n[[route]]\nname = "product"\nmatch = "{match}"\n'
                    f'interval = "{interval}"\n{body}\n')
    return path


# -- refused when the routes file loads -----------------------------------------------------------


@pytest.mark.parametrize("body, why", [
    ('headers = { "X-Flag" = "a\\r\\nSet-Cookie: admin=1" }', "holds CR (a header injection)"),
    ('headers = { "X-Flag" = "a\\nb" }', "holds LF (a header injection)"),
    ('headers = { "X Flag" = "a" }', "is not an HTTP token"),
    ('headers = { "Host" = "evil.example" }', "is the browser's own to set"),
    ('headers = { "Cookie" = "a=b" }', "give cookies as cookies"),
    ('cookies = { sid = { value = "1", domain = "evil.example" } }',
     "is another host than the route's (shop.example)"),
    ('cookies = { sid = { value = "1", domain = "example" } }', None),  # the parent: allowed
    ('cookies = { sid = "a;b" }', "is not a cookie value"),
    ('wait_for = "js:   "', "needs an expression"),
    ('wait_for = ""', "must be a non-empty string"),
    ('require = { selectors = ["#price"], minimum = 3 }', "require: unknown key 'minimum'"),
    ('require = {}', "require asks for nothing"),
    ('require = { min_text = -1 }', "require.min_text must be a whole number"),
    ('page_timeout = "2h"', "page_timeout must be like"),
    ('block_types = ["Images"]', "unknown resource type 'Images'"),
    ('block_hosts = ["ads.example/x"]', "is not a host name"),
    ('keep_scripts = "yes"', "keep_scripts must be true or false"),
    ('wait_for_it = "#x"', "unknown key 'wait_for_it'"),
    ('variants = ["tablet"]', "unknown variant 'tablet' (known: mobile, desktop)"),
    ('variants = ["mobile", "mobile"]', "variants names one twice"),
    ('variants = "mobile"', "variants must be a list"),
    ('variants = ["desktop", "mobile", "desktop"]', "variants names one twice"),
    ('variants = ["desktop", "mobile"]', None),  # a row and a snapshot per variant
])
def test_bad_rules_are_refused_at_load_naming_the_route_and_its_line(
        tmp_path: Path, body: str, why: str | None) -> None:
    path = routes_file(tmp_path, body, match="https://shop.example/p/*")
    if why is None:
        Routes.load(path)
        return
    with pytest.raises(CorpusError) as e:
        Routes.load(path)
    assert str(e.value).startswith(f'{path}:6: route 2 ("product"): ')
    assert why in str(e.value)


def test_a_cookie_domain_needs_a_route_whose_host_is_fixed(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="fixes no host; leave the domain out"):
        Routes.load(routes_file(tmp_path, 'cookies = { s = { value = "1", domain = "a.b" } }',
                                match="https://*/p/*"))
    regex = tmp_path / "regex.toml"
    regex.write_text('[[route]]\nname = "c"\nregex = "https://shop\\\\.example/c/.+"\n'
                     'interval = "1h"\ncookies = { s = { value = "1", domain = "shop.example" }'
                     " }\n")
    assert Routes.load(regex).routes[0].rules.cookies[0].domain == "shop.example"


def test_the_example_routes_file_loads_and_its_rules_survive_the_stored_json() -> None:
    routes = Routes.load(Path(__file__).resolve().parents[2] / "examples" / "routes-shop.toml")
    product = next(r for r in routes.routes if r.name == "product")
    assert product.rules.require is not None and product.rules.wait_for is not None
    assert product.rules.variants == ("desktop", "mobile")
    again = Routes.from_json(routes.to_json())
    assert again == routes and [r.rules for r in again.routes] == [r.rules
                                                                  for r in routes.routes]


def test_a_selector_chromium_rejects_is_refused_naming_the_route_and_its_line(
        tmp_path: Path) -> None:
    path = routes_file(tmp_path, 'wait_for = "#price"\n'
                                 'require = { selectors = ["div > p", "##price"] }')
    routes = Routes.load(path)  # the TOML is fine; Chromium is who says what a selector is
    with pytest.raises(CorpusError) as e:
        check_selectors(BrowserSpec("unused"), routes)
    assert str(e.value).startswith(f"{path}:6: route 2 (\"product\"): '##price' is not a"
                                   " selector Chromium accepts: SyntaxError")
    ok = Routes.load(routes_file(tmp_path, 'wait_for = "main :is(h1, h2):has(+ p)"'))
    check_selectors(BrowserSpec("unused"), ok)  # CSS a parser of our own might not know


def test_lanes_pool_refuses_such_a_selector_before_it_makes_anything(tmp_path: Path) -> None:
    name = f"rl-rules-{uuid.uuid4().hex[:10]}"
    path = routes_file(tmp_path, 'wait_for = "div >"')
    store = tmp_path / "store"
    p = cli("pool", name, "--browser", "--store", str(store), "--routes", str(path),
            "--corpus", str(write_corpus(tmp_path / "c.csv", ["http://127.0.0.1:9/p/1"])))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert f"{path}:6: route 2 (\"product\"): 'div >' is not a selector Chromium accepts:" in err
    assert not store.exists() and not os.path.exists(shm_path(name))


def test_a_render_command_refuses_a_route_of_two_variants_before_it_makes_anything(
        tmp_path: Path) -> None:
    """Only the browser renders a variant: a command would get 'URL mobile' as its URL."""
    name = f"rl-rules-{uuid.uuid4().hex[:10]}"
    path = routes_file(tmp_path, 'variants = ["desktop", "mobile"]')
    p = cli("pool", name, "--command", "true {url}", "--routes", str(path),
            "--corpus", str(write_corpus(tmp_path / "c.csv", ["http://127.0.0.1:9/p/1"])))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert "route(s) product name two variants, which only --browser renders" in err
    assert not os.path.exists(shm_path(name))


# -- what each rule does to a render ---------------------------------------------------------------


async def _render(urls: list[str], rules: RouteRules, timeout_s: float = 20
                  ) -> dict[str, Snapshot | PageFailed]:
    spec = BrowserSpec("unused")
    chromium = Chromium(spec)
    out: dict[str, Snapshot | PageFailed] = {}
    try:
        await chromium.start()
        assert chromium.cdp is not None
        for url in urls:
            tab = Tab(chromium.cdp, spec.rules(rules), chromium.user_agent)
            try:
                out[url] = await asyncio.wait_for(tab.render(url), timeout_s)
            except PageFailed as e:
                out[url] = e
            except TimeoutError:
                out[url] = PageFailed(tab.why_not_ready(timeout_s))
            finally:
                await tab.dispose()
    finally:
        await chromium.close()
        _gone(chromium.profile)
    return out


def _gone(profile: str) -> None:
    deadline = time.monotonic() + 3
    while True:
        left = [p for p in psutil.process_iter(["cmdline"])
                if any(profile in a for a in (p.info["cmdline"] or []))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == [], f"processes of {profile} left behind"


def render(urls: list[str], rules: RouteRules = NO_RULES, timeout_s: float = 20
           ) -> dict[str, Any]:
    return asyncio.run(_render(urls, rules, timeout_s))


def pre(html: str, id_: str) -> Any:
    m = re.search(rf'<pre id="{id_}">(.*?)</pre>', html, re.S)
    assert m is not None, html
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_a_render_says_it_is_a_prerender_on_its_document_request_only(site: SiteServer) -> None:
    snap = render([site.url("/echo")])[site.url("/echo")]
    assert isinstance(snap, Snapshot)
    sent = pre(snap.html, "sent")
    assert sent["x-prerender"] == "1"
    # Chromium's own User-Agent, marked: what prerender-node and nginx bot maps skip.
    assert re.fullmatch(r"Mozilla/5\.0 .*HeadlessChrome/[0-9.]+ .*" + re.escape(RENDER_MARK),
                        sent["user-agent"]), sent["user-agent"]
    assert pre(snap.html, "seen")["userAgent"] == sent["user-agent"]
    api = site.headers_of("/api/7")  # the page's own fetch: the mark, no extra header
    assert api["user-agent"] == sent["user-agent"] and "x-prerender" not in api


def test_a_routes_headers_and_cookies_reach_the_page_and_may_replace_the_marks(
        site: SiteServer) -> None:
    rules = rules_from({"headers": {"X-Prerender": "yes", "Accept-Language": "fr-CH",
                                    "User-Agent": "ShopAudit/1.0"},
                        "cookies": {"consent": "yes", "ab": "b-side"}}, None)
    snap = render([site.url("/echo")], rules)[site.url("/echo")]
    assert isinstance(snap, Snapshot)
    sent, seen = pre(snap.html, "sent"), pre(snap.html, "seen")
    assert (sent["x-prerender"], sent["accept-language"], sent["user-agent"]) == (
        "yes", "fr-CH", "ShopAudit/1.0")
    assert sorted(sent["cookie"].split("; ")) == ["ab=b-side", "consent=yes"]
    assert seen == {"userAgent": "ShopAudit/1.0", "cookies": "consent=yes; ab=b-side"}
    assert "accept-language" not in site.headers_of("/api/7") or \
        site.headers_of("/api/7")["accept-language"] != "fr-CH"


def test_wait_for_waits_for_its_selector_or_expression_and_says_so_when_it_never_holds(
        site: SiteServer) -> None:
    late = site.url("/late")
    plain = render([late])[late]  # the network is quiet at once: snapshot before #late
    assert isinstance(plain, Snapshot) and 'id="late"' not in plain.html
    for wait_for in ("#late", "js:document.querySelectorAll('p').length >= 2"):
        got = render([late], rules_from({"wait_for": wait_for}, None))[late]
        assert isinstance(got, Snapshot) and 'id="late"' in got.html, wait_for
    never = render([late], rules_from({"wait_for": "#never"}, None), timeout_s=3)[late]
    assert str(never) == "the page did not settle within 3 s: wait_for '#never' never held"
    threw = render([late], rules_from({"wait_for": "js:window.cart.ready"}, None),
                   timeout_s=3)[late]
    assert str(threw).endswith("wait_for 'js:window.cart.ready' never held (it threw"
                               " TypeError: Cannot read properties of undefined (reading"
                               " 'ready'))")
    broken = render([late], rules_from({"wait_for": "js:)("}, None))[late]
    assert isinstance(broken, PageFailed) and "wait_for 'js:)(': SyntaxError" in str(broken)


def test_every_variant_a_route_may_name_is_defined() -> None:
    assert tuple(VARIANTS) == VARIANT_NAMES


def test_a_variant_renders_the_page_as_its_device(site: SiteServer) -> None:
    url = site.url("/probe")
    probes = {}
    for variant in ("mobile", "desktop"):
        snap = render([url], rules_from({"variants": [variant]}, None))[url]
        assert isinstance(snap, Snapshot)
        probes[variant] = pre(snap.html, "probe")
    mobile, desktop = probes["mobile"], probes["desktop"]
    assert (mobile["innerWidth"], mobile["devicePixelRatio"], mobile["coarsePointer"],
            mobile["hover"]) == (412, 2.625, True, False)
    # (No hover on either: a headless browser has no mouse, and touch emulation takes none.)
    assert (desktop["innerWidth"], desktop["devicePixelRatio"], desktop["coarsePointer"],
            desktop["hover"]) == (1024, 1, False, False)
    assert "Android" in mobile["userAgent"] and " Mobile Safari/" in mobile["userAgent"]
    assert desktop["userAgent"].startswith("Mozilla/5.0 (X11; Linux x86_64) ")
    for p in probes.values():  # the device's User-Agent, marked; never Googlebot's name
        assert p["userAgent"].endswith(f" {RENDER_MARK}") and "Googlebot" not in p["userAgent"]
    # What the page's own requests carry is the same User-Agent.
    assert site.headers_of("/probe")["user-agent"] == desktop["userAgent"]


def test_a_route_may_unblock_what_the_pool_blocks(site: SiteServer) -> None:
    url = site.url("/js/41")
    render([url])
    assert site.hits("/img/41.png") == 0
    render([url], rules_from({"block_types": []}, None))
    assert site.hits("/img/41.png") == 1


def test_the_content_check_fails_a_loading_shell_with_its_reason(site: SiteServer) -> None:
    site.broken_prices.add(61)
    urls = [site.url("/product/60"), site.url("/product/61"), site.url("/meta404")]
    rules = rules_from({"require": {"selectors": ["#price", "h1"], "min_text": 200,
                                    "absent": ["Loading…"]}}, None)
    got = render(urls, rules)
    good, shell, gone = (got[u] for u in urls)
    assert isinstance(good, Snapshot) and "60.99 EUR" in good.html
    assert isinstance(shell, ContentCheckFailed)
    failure = classify(shell)
    assert failure.reason == ('content check: #price missing; 19 characters of text, under'
                              ' min_text 200; "Loading…" present')
    assert not failure.permanent  # the API may answer next time: retried with the backoff
    assert isinstance(gone, Snapshot) and gone.status == 404  # a 404 is not checked: kept as 404


# -- the content check in a pool ------------------------------------------------------------------


def test_a_page_failing_its_content_check_never_replaces_its_last_good_snapshot(
        site: SiteServer, tmp_path: Path) -> None:
    """``lanes pool --browser --routes``: a page whose API fails from the start stores nothing;
    one that breaks after a good render keeps that render; both are failures with the reason,
    listed by ``lanes failures``, retried (the route's 2 s interval caps the backoff) and stored
    once their API answers again."""
    name = f"rl-rules-{uuid.uuid4().hex[:10]}"
    first, later, fine = (site.url(f"/product/{n}") for n in (71, 72, 73))
    site.broken_prices.add(71)
    path = routes_file(tmp_path, 'require = { selectors = ["#price"], absent = ["Loading…"] }',
                       interval="2s")
    store = tmp_path / "store"
    corpus = write_corpus(tmp_path / "c.csv", [first, later, fine])
    try:
        with PoolRun(name, corpus, store, "--routes", str(path), "--tabs", "3") as run:
            run.wait_until(lambda: {later, fine} <= stored(store, [later]).keys()
                           | stored(store, [fine]).keys(), 60)
            good = stored(store, [later])[later]
            site.broken_prices.add(72)
            run.wait_until(lambda: run.stderr().count("product/72 (row") >= 2, 60)

            def failing() -> dict[str, Any]:
                p = cli("failures", name, "--json")
                out, err = p.communicate(timeout=60)
                assert p.returncode == 0, err
                return {r["url"]: r for r in json.loads(out)}

            run.wait_until(lambda: failing().get(first, {}).get("failures", 0) >= 2, 60)
            listed = failing()
            assert set(listed) == {first, later}
            for url in (first, later):
                assert listed[url]["last_error"] == ('content check: #price missing;'
                                                     ' "Loading…" present')
            assert first not in stored(store, [first])  # the first render stored nothing
            kept = stored(store, [later])[later]  # the last good one is still what is served
            assert (kept.hash, kept.rendered_at_ms) == (good.hash, good.rendered_at_ms)
            assert "72.99 EUR" in kept.html().decode()
            site.broken_prices.clear()
            run.wait_until(lambda: first in stored(store, [first]), 60)
            run.wait_until(lambda: stored(store, [later])[later].rendered_at_ms
                           > good.rendered_at_ms, 60)
            assert run.stop() == 0
            assert run.left_behind() == []
    finally:
        site.broken_prices.clear()
    assert "72.99 EUR" in stored(store, [later])[later].html().decode()
    assert not os.path.exists(shm_path(name))
