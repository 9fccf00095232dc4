"""The pool against a real (local) site, as a new user runs it: `lanes pool` over the mirrored
sitemaps of tests/data/site (a Hugo multilingual index, a Yoast index with root-relative and
gzipped children, `image:`/`xhtml:` namespaces, a duplicate `<loc>`, blank lines before
`<?xml`, no `<changefreq>`, root-relative `<loc>`s resolved by `--base-url`) with its routes
file, curl renders against a stdlib server that is slow (20-200 ms) and 404s a third of the
pages, a per-host cap, `lanes add` growing the corpus while it runs, `lanes failures`,
`lanes stats` and a SIGTERM. Everything through the command line, in real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from lanes_testlib import unique_name
from pool_testlib import cli, files_of
from site_server import SiteServer

from engine.corpus.read import read_corpora
from engine.corpus.routes import Routes

SITE = Path(__file__).resolve().parents[1] / "data" / "site"
ESCAPE = Path(__file__).resolve().parents[1] / "data" / "escape"
CORPUS = [SITE / "sitemap.xml", SITE / "sitemap_index.xml", SITE / "blog" / "sitemap.xml"]
BASE = "http://site.test/"
GROWN = [f"http://other.test/new/{i}/" for i in range(4)]



def _wait(what: str, done: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    p = cli(*args)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_a_pool_renders_a_real_site_politely_and_says_why_pages_fail(tmp_path: Path) -> None:
    corpus = read_corpora(CORPUS, base_url=BASE, routes=Routes.load(SITE / "routes.toml"))
    urls = corpus.urls
    missing = set(urls[::3])  # a third of the pages are gone: 404
    paths = {urlsplit(u).path for u in urls if u not in missing}
    paths |= {urlsplit(u).path for u in GROWN}
    grown = tmp_path / "grown.csv"
    grown.write_text("url,interval_s\n" + "".join(f"{u},3600\n" for u in [*GROWN, urls[1]]))
    name = unique_name()
    with SiteServer(paths, delay_ms=(20, 200), seed=1) as site:
        pool = cli("pool", name, *(a for f in CORPUS for a in ("--corpus", str(f))),
                   "--base-url", BASE, "--routes", str(SITE / "routes.toml"),
                   "--command", f"curl -fsS --connect-to ::127.0.0.1:{site.port} -o /dev/null"
                                " {url}",
                   "--workers", "4", "--per-host", "2", "--batch", "4", "--plain",
                   "--checkpoint", str(tmp_path / "ck.npz"))
        try:
            def served(host: str) -> Counter[str]:
                return Counter(r.path for r in site.requests() if r.host == host)

            everything = {urlsplit(u).path for u in urls}
            _wait("every page of the site", lambda: set(served("site.test")) >= everything)
            added = _run("add", name, "--corpus", str(grown))
            assert added.returncode == 0, added.stderr
            assert f"{len(GROWN)} new URL(s) added" in added.stdout and "1 known" in added.stdout
            _wait("the grown corpus", lambda: set(served("other.test")) >= {
                urlsplit(u).path for u in GROWN})
            failures = _run("failures", name, "--json", "--limit", "100")
            stats = _run("stats", name, "--plain")
            cold = _run("failures", name, "--lane", "cold")
        finally:
            pool.send_signal(signal.SIGTERM)
            out, err = pool.communicate(timeout=60)
        hosts = site.hosts()

    assert pool.returncode == 0, err
    # Every existing page rendered exactly once (next due hours away); each 404 tried once.
    for host, pages in (("site.test", {urlsplit(u).path for u in urls}),
                        ("other.test", {urlsplit(u).path for u in GROWN})):
        assert set(served(host)) == pages and max(served(host).values()) == 1
    # Polite: never more than 2 renders in flight to one host, and the cap was reached.
    assert hosts["site.test"] == 2 and hosts["other.test"] <= 2
    # Failures carry their reasons: logged, listed, and permanent (a 404 goes cold at once);
    # a discovered page that answered 404 left the queue instead, logged.
    discovered = {u for u, p in zip(urls, corpus.provenance, strict=True) if p == 1}
    assert missing & discovered and missing - discovered  # the site has both kinds
    listed = {f["url"]: f for f in json.loads(failures.stdout)}
    assert set(listed) == missing - discovered
    for url, f in listed.items():
        assert "returned error: 404" in f["last_error"] and f["permanent"] and f["lane"] == "cold"
        assert f"{url} (row " in err and "404" in err
    for url in missing & discovered:
        assert f"{url} (row " in err and "discovered) answered 404: removed from the queue" in err
    assert all(u in cold.stdout for u in missing - discovered)
    # Untidy input accepted with a count; the routes shown per route.
    assert "1 duplicate URL(s) dropped" in err
    for route in ("home", "language home", "product", "blog post", "(no route)"):
        assert route in stats.stdout
    assert "invariants: hold" in out and files_of(name) == []


@pytest.mark.parametrize("index", sorted(p.name for p in ESCAPE.glob("*.xml")))
def test_an_index_pointing_outside_its_directory_is_refused_and_nothing_is_created(
        index: str) -> None:
    name = unique_name()
    r = _run("pool", name, "--corpus", str(ESCAPE / index), "--command", "true {url}")
    assert r.returncode == 2
    assert f"{ESCAPE / index}:4:" in r.stderr  # the file and the line of the <loc>
    assert files_of(name) == []


def test_delay_ms_spaces_the_renders_to_one_host_across_workers(tmp_path: Path) -> None:
    urls = [f"http://site.test/d/{i}/" for i in range(8)]
    csv = tmp_path / "c.csv"
    csv.write_text("url,interval_s\n" + "".join(f"{u},3600\n" for u in urls))
    name = unique_name()
    with SiteServer({urlsplit(u).path for u in urls}, delay_ms=(1, 5)) as site:
        pool = cli("pool", name, "--corpus", str(csv), "--workers", "4", "--delay-ms", "150",
                   "--command", f"curl -fsS --connect-to ::127.0.0.1:{site.port} -o /dev/null"
                                " {url}", "--plain")
        try:
            _wait("every page", lambda: len(site.requests()) >= len(urls))
        finally:
            pool.send_signal(signal.SIGTERM)
            _, err = pool.communicate(timeout=60)
        starts = sorted(r.start_s for r in site.requests())
    assert pool.returncode == 0, err
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # The gate spaces the starts of renders by 150 ms; the server sees them after curl's own
    # start-up, which varies by a few ms (tens on a loaded machine). Four workers without the
    # delay would arrive together.
    assert len(starts) == len(urls) and min(gaps) >= 0.05
    assert starts[-1] - starts[0] >= 0.9 * 0.150 * (len(urls) - 1)
    assert files_of(name) == []
