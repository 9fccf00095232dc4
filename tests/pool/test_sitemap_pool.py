"""A pool that follows its site, through the command line in real processes: `lanes pool
--corpus http://.../sitemap.xml` renders what the sitemap lists; an unreachable, failing,
hanging or malformed sitemap URL is a clear error and leaves nothing behind (no segment, no
pool file), and `lanes add` from such a URL adds nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lanes_testlib import unique_name
from pool_testlib import cli, files_of
from redis_server import fresh_queue
from sitemap_server import SitemapServer, sitemapindex, urlset

from engine import Engine
from engine.redis.urls import RedisUrls
from engine.shm.urls import UrlTable

PAGES = [f"/p/{i}" for i in range(6)]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    p = cli(*args)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _wait(what: str, done: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _serve_pages(site: SitemapServer, paths: list[str]) -> list[str]:
    for path in paths:
        site.put(path, "<html><body>page</body></html>")
    return [site.url(p) for p in paths]


def test_a_pool_renders_the_pages_of_a_sitemap_index_fetched_over_http() -> None:
    name = unique_name()
    with SitemapServer() as site:
        urls = _serve_pages(site, PAGES)
        site.put("/sitemap_index.xml", sitemapindex("/a.xml", "/b.xml.gz",
                                                    "https://elsewhere.test/c.xml"))
        site.put("/a.xml", urlset(*urls[:3]))
        site.put("/b.xml.gz", urlset(*urls[3:]), gzip_encoding=True)
        pool = cli("pool", name, "--corpus", site.url("/sitemap_index.xml"),
                   "--command", "curl -fsS -o /dev/null {url}", "--workers", "2", "--plain")
        try:
            _wait("every page", lambda: all(site.hits(p) >= 1 for p in PAGES))
        finally:
            pool.send_signal(signal.SIGTERM)
            out, err = pool.communicate(timeout=60)
    assert pool.returncode == 0, err
    assert f"{len(PAGES)} pages" in out and "invariants: hold" in out
    assert "1 sitemap(s) on another host skipped" in err
    assert files_of(name) == []


@pytest.mark.parametrize(("setup", "message"), [
    (lambda s: s.put("/sitemap.xml", "no", status=500), "cannot fetch: HTTP 500"),
    (lambda s: s.hang("/sitemap.xml"), "cannot fetch: no answer within 1 s"),
    (lambda s: s.endless("/sitemap.xml"), "larger than 52428800 bytes"),
    (lambda s: s.put("/sitemap.xml", "<html>\n<p>hi</html>"), ":1: root element <html>"),
    (lambda s: s.put("/sitemap.xml", sitemapindex("/gone.xml")), "/gone.xml: cannot fetch: HTTP"
                                                                 " 404"),
], ids=["500", "hang", "endless", "malformed", "missing-child"])
def test_a_bad_sitemap_url_is_a_clear_error_and_nothing_is_created(setup: object,
                                                                    message: str) -> None:
    name = unique_name()
    with SitemapServer() as site:
        setup(site)  # type: ignore[operator]
        url = site.url("/sitemap.xml")
        r = _run("pool", name, "--corpus", url, "--command", "true {url}",
                 "--fetch-timeout", "1")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("lanes pool: ") and message in r.stderr and url in r.stderr
    assert files_of(name) == []


def test_an_unreachable_sitemap_url_is_a_clear_error_and_nothing_is_created() -> None:
    name = unique_name()
    with SitemapServer() as site:
        url = site.url("/sitemap.xml")  # nothing listens there once the server is gone
    r = _run("pool", name, "--corpus", url, "--command", "true {url}")
    assert r.returncode == 2
    assert f"lanes pool: {url}: cannot fetch: cannot connect" in r.stderr
    assert files_of(name) == []


def test_lanes_add_from_a_failing_sitemap_url_adds_nothing() -> None:
    name = unique_name()
    with SitemapServer() as site:
        urls = _serve_pages(site, PAGES[:2])
        site.put("/sitemap.xml", urlset(*urls))
        site.put("/more.xml", sitemapindex("/ok.xml", "/broken.xml"))
        site.put("/ok.xml", urlset(site.url("/new/1")))
        site.put("/broken.xml", "<urlset>", status=503)
        pool = cli("pool", name, "--corpus", site.url("/sitemap.xml"), "--command",
                   "true {url}", "--workers", "1", "--plain")
        try:
            _wait("the pool", lambda: len(files_of(name)) >= 3)
            _wait("its URLs", lambda: _rows(name) == 2)
            r = _run("add", name, "--corpus", site.url("/more.xml"))
            assert r.returncode == 2 and "/broken.xml: cannot fetch: HTTP 503" in r.stderr
            assert _rows(name) == 2
            table = UrlTable.attach(name)
            try:
                assert table.urls() == urls
            finally:
                table.close()
            site.put("/broken.xml", urlset(site.url("/new/2")))
            r = _run("add", name, "--corpus", site.url("/more.xml"))
            assert r.returncode == 0 and "2 new URL(s) added" in r.stdout, r.stderr
        finally:
            pool.send_signal(signal.SIGTERM)
            _, err = pool.communicate(timeout=60)
    assert pool.returncode == 0, err
    assert files_of(name) == []


def _rows(name: str) -> int:
    try:
        eng = Engine.attach(name)
    except Exception:
        return -1
    try:
        return int(eng.stats()["rows"])
    finally:
        eng.close()


def _provenance(name: str, url: str) -> str:
    eng, table = Engine.attach(name), UrlTable.attach(name)
    try:
        return str(eng.describe(table.find(url))["provenance"])
    finally:
        table.close()
        eng.close()


def _queued_per_provenance(name: str) -> dict[str, int]:
    r = _run("stats", name, "--json")
    assert r.returncode == 0, r.stderr
    out = {"submitted": 0, "discovered": 0}
    for lane in json.loads(r.stdout)["lanes"]:
        for prov in out:
            if lane["name"].startswith(prov):
                out[prov] += lane["queued"]
    return out


def test_a_refreshed_corpus_follows_the_site(tmp_path: Path) -> None:
    """--refresh-corpus 2s over a sitemap URL and a file: a new URL is added and rendered, a
    URL gone from every sitemap turns discovered and back to submitted when it returns, a
    failed fetch changes nothing, and an edited file is read again."""
    name = unique_name()
    local = tmp_path / "sitemap.xml"
    with SitemapServer() as site:
        urls = _serve_pages(site, [*PAGES, "/p/new", "/p/file"])
        site.put("/sitemap.xml", sitemapindex("/a.xml", "/b.xml"))
        site.put("/a.xml", urlset(*urls[:3]))
        site.put("/b.xml", urlset(*urls[3:6]))
        local.write_text(urlset(urls[0]))
        pool = cli("pool", name, "--corpus", site.url("/sitemap.xml"), "--corpus", str(local),
                   "--refresh-corpus", "2s", "--fetch-timeout", "2",
                   "--command", "curl -fsS -o /dev/null {url}", "--workers", "1", "--plain")
        try:
            _wait("every page", lambda: all(site.hits(p) >= 1 for p in PAGES))
            assert _queued_per_provenance(name) == {"submitted": 6, "discovered": 0}
            # /p/2 leaves the site's sitemaps, /p/new joins them.
            site.put("/a.xml", urlset(urls[0], urls[1], urls[6]))
            _wait("the new page rendered", lambda: site.hits("/p/new") >= 1)
            _wait("the page gone discovered", lambda: _provenance(name, urls[2]) == "discovered")
            assert _queued_per_provenance(name) == {"submitted": 6, "discovered": 1}
            # A refresh that fails changes nothing: /p/3../p/5 stay submitted.
            site.put("/b.xml", "down", status=503)
            _wait("a failed refresh", lambda: site.hits("/b.xml") >= 4)
            time.sleep(0.5)
            assert _queued_per_provenance(name) == {"submitted": 6, "discovered": 1}
            # The page comes back; the site recovers; the file gains a page.
            site.put("/a.xml", urlset(*urls[:3], urls[6]))
            site.put("/b.xml", urlset(*urls[3:6]))
            local.write_text(urlset(urls[0], urls[7]))
            _wait("the page submitted again", lambda: _provenance(name, urls[2]) == "submitted")
            _wait("the file's new page rendered", lambda: site.hits("/p/file") >= 1)
            assert _queued_per_provenance(name) == {"submitted": 8, "discovered": 0}
        finally:
            pool.send_signal(signal.SIGTERM)
            out, err = pool.communicate(timeout=60)
    assert pool.returncode == 0, err
    assert "corpus refresh: " in err and "1 new URL(s) added" in err
    assert "1 now discovered (left every sitemap)" in err and "1 submitted again" in err
    assert "corpus refresh failed, nothing changed (next in 2 s)" in err
    assert "/b.xml: cannot fetch: HTTP 503" in err
    assert "invariants: hold" in out
    assert files_of(name) == []


def test_refresh_corpus_needs_a_corpus_and_a_period(tmp_path: Path) -> None:
    name = unique_name()
    r = _run("pool", name, "--resume", "--checkpoint", str(tmp_path / "ck.npz"),
             "--refresh-corpus", "1h", "--command", "true {url}")
    assert r.returncode == 2 and "--refresh-corpus needs --corpus" in r.stderr
    # A bad period is a usage error before anything is read (the other spellings:
    # test_refresh.py::test_parse_duration_takes_a_whole_number_and_a_unit).
    r = _run("pool", name, "--corpus", "x.csv", "--refresh-corpus", "1w",
             "--command", "true {url}")
    assert r.returncode == 2 and "argument --refresh-corpus: a period is a whole number" in \
        r.stderr, r.stderr
    assert files_of(name) == []


@pytest.fixture
def queue(redis_server: Any) -> Iterator[str]:
    yield from fresh_queue(redis_server, "sitemap-")


def test_a_pool_on_redis_follows_its_sitemap_too(redis_server: Any, queue: str) -> None:
    with SitemapServer() as site:
        urls = _serve_pages(site, [*PAGES[:3], "/p/new"])
        site.put("/sitemap.xml", urlset(*urls[:3]))
        pool = cli("pool", queue, "--redis", redis_server.url, "--corpus",
                   site.url("/sitemap.xml"), "--refresh-corpus", "2s", "--fetch-timeout", "2",
                   "--command", "curl -fsS -o /dev/null {url}", "--workers", "1", "--plain")
        try:
            _wait("every page", lambda: all(site.hits(p) >= 1 for p in PAGES[:3]))
            site.put("/sitemap.xml", urlset(urls[0], urls[2], urls[3]))
            _wait("the new page rendered", lambda: site.hits("/p/new") >= 1)
            eng = Engine.connect(redis_server.url, queue)
            try:
                table = RedisUrls(eng)

                def provenance(url: str) -> str:
                    return str(eng.describe(table.find(url))["provenance"])

                _wait("the page gone discovered", lambda: provenance(urls[1]) == "discovered")
                assert [provenance(u) for u in urls] == ["submitted", "discovered", "submitted",
                                                         "submitted"]
                assert eng.verify() == []
            finally:
                eng.close()
        finally:
            pool.send_signal(signal.SIGTERM)
            out, err = pool.communicate(timeout=60)
    assert pool.returncode == 0, err
    assert "1 new URL(s) added, 1 now discovered" in err and "invariants: hold" in out
    assert files_of(queue) == []
