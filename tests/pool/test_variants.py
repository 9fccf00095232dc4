"""Two variants of a page, end to end: ``lanes pool --browser`` (real Chromium) renders a route
with ``variants = ["desktop", "mobile"]`` into a row and a snapshot per variant, each page as
its device (the probe page writes the viewport it saw into its HTML), and ``lanes serve`` gives
Googlebot Smartphone the mobile snapshot, desktop Googlebot the desktop one, either the other
while its own is missing, with ``Vary: User-Agent`` where a URL has variants."""

from __future__ import annotations

import gzip
import json
import re
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from browser_testlib import PoolRun, stored, write_corpus
from lanes_testlib import shm_path
from pool_testlib import serving
from render_site import SiteServer

from engine.shm.engine import Engine
from engine.store import SnapshotStore

GOOGLEBOT_SMARTPHONE = ("Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P)"
                        " AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.6778.204 Mobile"
                        " Safari/537.36 (compatible; Googlebot/2.1;"
                        " +http://www.google.com/bot.html)")
GOOGLEBOT_DESKTOP = ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible;"
                     " Googlebot/2.1; +http://www.google.com/bot.html) Chrome/131.0.6778.204"
                     " Safari/537.36")
BINGBOT_MOBILE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 7_0 like Mac OS X) AppleWebKit/537.51.1"
                  " (KHTML, like Gecko) Version/7.0 Mobile/11A465 Safari/9537.53 (compatible;"
                  " bingbot/2.0; +http://www.bing.com/bingbot.htm)")


def get(base: str, url: str, agent: str) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(f"{base}/render?url={urllib.parse.quote(url, safe='')}",
                                 headers={"User-Agent": agent, "Accept-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.getheaders()}, \
                gzip.decompress(r.read()).decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, ""


def width(html: str) -> int:
    m = re.search(r'<pre id="probe">(.*?)</pre>', html, re.S)
    assert m is not None, html[:500]
    return int(json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))["innerWidth"])


def test_a_pool_renders_each_variant_and_serve_answers_each_crawler_with_its_own(
        tmp_path: Path) -> None:
    name = f"rl-variants-{uuid.uuid4().hex[:10]}"
    store = tmp_path / "store"
    with SiteServer(delay_ms=100) as site:
        urls = [site.url("/probe"), site.url("/probe?second")]
        keys = urls + [f"{u} mobile" for u in urls]
        routes = tmp_path / "routes.toml"
        routes.write_text(f'[[route]]\nname = "site"\nmatch = "{site.url()}/*"\n'
                          'interval = "1d"\nvariants = ["desktop", "mobile"]\n')
        with PoolRun(name, write_corpus(tmp_path / "c.csv", urls), store,
                     "--routes", str(routes), "--tabs", "2") as run:
            run.wait_until(lambda: set(keys) <= stored(store, keys).keys(), 90)
            eng = Engine.attach(name)
            try:  # a row per (URL, variant), each counted
                assert eng.stats()["rows"] == len(keys)
            finally:
                eng.close()
            assert run.stop() == 0
            assert run.left_behind() == []
    assert not Path(shm_path(name)).exists()
    snaps = stored(store, keys)
    assert {k: width(snaps[k].html().decode()) for k in keys} == {
        **{u: 1024 for u in urls}, **{f"{u} mobile": 412 for u in urls}}
    # A URL with one of its variants only, and one with none (put as a pool would).
    only_mobile, plain = "https://shop.example/only-mobile", "https://shop.example/plain"
    with SnapshotStore.open(str(store)) as s:
        for key, html in ((f"{only_mobile} mobile", "<p>phone page</p>"),
                          (plain, "<p>one page</p>")):
            s.put(key, html, status=200, location=None, interval_s=3600, lane=1,
                  render_ms=5.0)
    with serving("--store", str(store)) as base:
        for agent, want in ((GOOGLEBOT_SMARTPHONE, 412), (BINGBOT_MOBILE, 412),
                            (GOOGLEBOT_DESKTOP, 1024)):
            for _ in range(2):  # the second from the answers kept in memory
                status, h, html = get(base, urls[0], agent)
                assert (status, width(html)) == (200, want), agent
                assert h["vary"] == "Accept-Encoding, User-Agent"
        for agent in (GOOGLEBOT_SMARTPHONE, GOOGLEBOT_DESKTOP):  # the other while one is missing
            status, h, html = get(base, only_mobile, agent)
            assert (status, html, h["vary"]) == (200, "<p>phone page</p>",
                                                 "Accept-Encoding, User-Agent")
            status, h, html = get(base, plain, agent)  # no variants: as it always was
            assert (status, html, h["vary"]) == (200, "<p>one page</p>", "Accept-Encoding")
        status, h, _ = get(base, "https://shop.example/never", GOOGLEBOT_SMARTPHONE)
        assert (status, h["x-lanes-snapshot"]) == (404, "missing")


def test_a_variant_rows_page_names_its_variant_and_links_its_other_row(tmp_path: Path) -> None:
    """The dashboard's URL page of a row of a two-variant route says which variant it renders
    and leads to the same page's other row."""
    import numpy as np

    from engine.corpus.routes import Routes
    from engine.pool import Pool, PoolOptions
    from engine.pool.render import RenderSpec

    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nname = "p"\nmatch = "https://shop.example/p/*"\n'
                      'interval = "1h"\nvariants = ["desktop", "mobile"]\n')
    urls = ["https://shop.example/p/1", "https://shop.example/about"]
    name = f"rl-variants-{uuid.uuid4().hex[:10]}"
    pool = Pool.create(name, urls, np.full(2, 1_800_000_000_000), np.full(2, 3600),
                       np.zeros(2, np.uint8), RenderSpec(command="true {url}"),
                       PoolOptions(workers=1), capacity=16, routes=Routes.load(routes))
    try:
        with serving(name) as base:
            def page(key: str) -> str:
                with urllib.request.urlopen(
                        f"{base}/url?url={urllib.parse.quote(key, safe='')}", timeout=10) as r:
                    return str(r.read().decode())

            mobile = page(f"{urls[0]} mobile")
            assert "<dt>variant</dt><dd>mobile · its <a href=\"/url?url=https%3A//shop.example" \
                   "/p/1\">desktop</a> row</dd>" in mobile
            assert "<dt>variant</dt><dd>desktop · its <a" in page(urls[0])
            assert "<dt>variant</dt>" not in page(urls[1])  # a route without variants
    finally:
        pool.close()
    assert not Path(shm_path(name)).exists()
