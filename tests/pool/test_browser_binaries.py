"""Chromium's headless shell (the default) against full Chromium: the same pages rendered by both
give the same snapshot, and what differs (what a page's JavaScript can tell of its browser) is
exactly what docs/design.md lists. Both binaries run the worker's own render (``Chromium`` and
``Tab``, in this process), on the browser tests' site (render_site.py) and on the pages of the
real site's sitemaps (tests/data/site, served by site_server.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import render_site
from render_site import JSON_LD
from site_server import SiteServer as SitemapSite

from engine.corpus.read import read_corpora
from engine.pool import browser
from engine.pool.browser import DEFAULT_CHROMIUM, HEADLESS_SHELL, BrowserSpec, Chromium
from engine.pool.page import PageFailed, Tab

DATA_SITE = Path(__file__).resolve().parents[1] / "data" / "site"
BINARIES = (HEADLESS_SHELL, DEFAULT_CHROMIUM)
SITE_PAGES = ("/js/1", "/js/2", "/js/3", "/ready/1", "/ready/2", "/meta404", "/redirect",
              "/gone", "/slow/1", "/slow/2")
TABS = 4


@pytest.fixture(scope="module")
def site() -> Iterator[render_site.SiteServer]:
    with render_site.SiteServer(delay_ms=300) as s:
        yield s


@pytest.fixture(scope="module")
def data_site() -> Iterator[tuple[SitemapSite, list[str]]]:
    """The pages of tests/data/site's sitemaps (their paths, each answered 200, and one 404)."""
    corpus = read_corpora([DATA_SITE / "sitemap.xml", DATA_SITE / "sitemap_index.xml"],
                          base_url="http://site.test/")
    paths = sorted({re.sub(r"^https?://[^/]+", "", u) or "/" for u in corpus.urls})[:12]
    with SitemapSite(paths, delay_ms=(0, 20)) as s:
        yield s, [*paths, "/no/such/page/"]


async def _render_all(binary: str, urls: list[str]) -> dict[str, Any]:
    """url -> (html, status, location) or (the failure's type, its message), and the seconds
    each took; ``TABS`` pages at once in one browser, as a worker renders them."""
    spec = BrowserSpec("unused", chromium=binary)
    chromium = Chromium(spec)
    out: dict[str, Any] = {}
    took: dict[str, float] = {}
    gate = asyncio.Semaphore(TABS)
    try:
        await chromium.start()
        assert chromium.cdp is not None

        async def one(url: str) -> None:
            async with gate:
                assert chromium.cdp is not None
                tab = Tab(chromium.cdp, spec.rules())
                t0 = time.monotonic()
                try:
                    snap = await asyncio.wait_for(tab.render(url), 30)
                    out[url] = (snap.html, snap.status, snap.location)
                except PageFailed as e:
                    out[url] = (type(e).__name__, str(e))
                finally:
                    took[url] = time.monotonic() - t0
                    await tab.dispose()

        await asyncio.gather(*(one(u) for u in urls))
    finally:
        await chromium.close()
        _gone(chromium.profile)
    return {"snapshots": out, "took": took}


def _gone(profile: str, settle_s: float = 3.0) -> None:
    """No process of the browser run on ``profile`` is left (its crash handler included)."""
    deadline = time.monotonic() + settle_s
    while True:
        left = []
        for p in psutil.process_iter(["cmdline"]):
            if any(profile in a for a in (p.info["cmdline"] or [])):
                left.append(p)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == [], f"processes of {profile} left behind: {[p.pid for p in left]}"


def _both(urls: list[str]) -> dict[str, dict[str, Any]]:
    return {b: asyncio.run(_render_all(b, urls)) for b in BINARIES}


def test_both_binaries_give_the_same_snapshot_of_every_test_page(
        site: render_site.SiteServer, data_site: tuple[SitemapSite, list[str]]) -> None:
    plain, plain_paths = data_site
    urls = [site.url(p) for p in SITE_PAGES] + [plain.url() + p for p in plain_paths]
    got = _both(urls)
    shell, full = (got[b]["snapshots"] for b in BINARIES)
    assert shell.keys() == full.keys() == set(urls)
    differ = [u for u in urls if shell[u] != full[u]]
    assert differ == [], {u: (shell[u], full[u]) for u in differ}
    # ... and the same is what the browser tests expect of it, not two equal failures.
    for n in (1, 2, 3):
        html, status, _ = shell[site.url(f"/js/{n}")]
        assert f"JS content {n}: fetched" in html and JSON_LD in html and status == 200
    for n in (1, 2):
        html, status, _ = shell[site.url(f"/ready/{n}")]
        assert f"ready {n}" in html and status == 200
        for b in BINARIES:  # the flag turned true after 300 ms, with a request still open
            assert got[b]["took"][site.url(f"/ready/{n}")] >= 0.3
    assert shell[site.url("/meta404")][1] == 404
    assert shell[site.url("/redirect")] == ("", 301, "/js/9")
    assert shell[site.url("/gone")][1] == 404
    assert "slow 1 done" in shell[site.url("/slow/1")][0]
    for p in plain_paths[:-1]:
        assert shell[plain.url() + p] == (f"<html><head></head><body>{p} 200\n</body></html>",
                                          200, None)
    assert shell[plain.url() + "/no/such/page/"][1] == 404


FULL_VERSION = re.compile(r"HeadlessChrome/(\d+)\.\d+\.\d+\.\d+ ")


def test_what_a_page_can_tell_of_its_browser_differs_only_as_documented(
        site: render_site.SiteServer) -> None:
    url = site.url("/probe")
    got = _both([url])
    probes = {}
    for b in BINARIES:
        html, status, _ = got[b]["snapshots"][url]
        assert status == 200
        text = re.search(r'<pre id="probe">(.*?)</pre>', html, re.S)
        assert text is not None, html
        probes[b] = json.loads(text.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    shell, full = probes[HEADLESS_SHELL], probes[DEFAULT_CHROMIUM]
    differ = sorted(k for k in shell if shell[k] != full[k])
    # docs/design.md, "The headless shell": each of these, and nothing else.
    assert differ == ["innerHeight", "innerWidth", "languages", "mimeTypes", "notification",
                      "plugins", "userAgent", "windowChrome"]
    # The shell reports its full version; full Chromium the reduced user agent (x.0.0.0).
    shell_ua, full_ua = FULL_VERSION.search(shell["userAgent"]), FULL_VERSION.search(
        full["userAgent"])
    assert shell_ua is not None and full_ua is not None
    assert shell_ua.group(1) == full_ua.group(1) and full["userAgent"].count(".0.0.0 ") == 1
    assert not shell["userAgent"].count(".0.0.0 ")
    # The shell's viewport is its whole 800x600 window; full Chromium's window has a frame.
    assert (shell["innerWidth"], shell["innerHeight"]) == (800, 600) == tuple(shell["screen"])
    assert full["innerWidth"] < 800 and full["innerHeight"] < 600
    assert shell["languages"] == ["en-US"] and full["languages"][0] == "en-US"
    assert (shell["plugins"], shell["mimeTypes"]) == (0, 0)
    assert full["plugins"] > 0 and full["mimeTypes"] > 0
    assert (shell["windowChrome"], full["windowChrome"]) == ("undefined", "object")
    assert (shell["notification"], full["notification"]) == ("denied", "default")  # no prompt
    # What stays: no mobile emulation, the same machine, webdriver set in both.
    assert shell["coarsePointer"] is False and shell["webdriver"] is True


def test_the_shell_is_the_default_and_full_chromium_the_fallback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert BrowserSpec("s").chromium == HEADLESS_SHELL  # make tools installs it
    assert browser.describe_chromium(HEADLESS_SHELL) == (
        f"browser: Chromium's headless shell ({HEADLESS_SHELL})")
    assert browser.describe_chromium(DEFAULT_CHROMIUM) == f"browser: {DEFAULT_CHROMIUM}"
    assert "a script that forks it" in browser.describe_chromium(
        "/usr/bin/chromium-headless-shell")
    monkeypatch.setattr(browser, "HEADLESS_SHELL", str(tmp_path / "not-installed"))
    assert BrowserSpec("s").chromium == DEFAULT_CHROMIUM
    assert BrowserSpec("s", chromium=HEADLESS_SHELL).chromium == HEADLESS_SHELL  # given: kept
    assert "chromium-headless-shell is not installed" in browser.describe_chromium(
        DEFAULT_CHROMIUM)
