"""A miss never tells a crawler that a page is gone: for a URL on the pool's hosts with no
snapshot (never rendered, cleared) or a too-stale one, ``lanes serve`` relays the origin's own
answer (``X-Lanes-Snapshot: origin``), bounded in time, size and concurrency; a URL on no host
of the pool stays a plain 404."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
from front_door_testlib import Served, get
from http_testlib import LocalSite
from lanes_testlib import dispose, unique_name

from engine.checks import wall_ms
from engine.store import SnapshotStore

HOUR_S = 3600


class Origin(LocalSite):
    """The site itself: ``pages`` path -> (status, body, extra headers); every request is
    recorded with its headers; ``/slow`` answers after ``slow_s``."""

    pages: dict[str, tuple[int, bytes, dict[str, str]]]

    class handler(BaseHTTPRequestHandler):  # noqa: N801
        protocol_version = "HTTP/1.1"
        server: Any

        def do_GET(self) -> None:  # noqa: N802
            site: Origin = self.server.site
            with site.lock:
                site.seen.append((self.path, dict(self.headers)))
            if self.path == "/slow":
                site.closing.wait(site.slow_s)
            status, body, extra = site.pages.get(self.path, (404, b"<p>no such page</p>", {}))
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.slow_s = 30.0
        self.pages = {"/p/1": (200, b"<p>origin one</p>", {"Cache-Control": "max-age=60"}),
                      "/p/2": (200, b"<p>origin two</p>", {}),
                      "/moved": (301, b"", {"Location": "/p/1"}),
                      "/big": (200, b"x" * (11 << 20), {})}


@contextlib.contextmanager
def pool_over(site: Origin, tmp_path: Path, rendered: dict[str, int]) -> Iterator[tuple[str,
                                                                                      Path]]:
    """A pool at rest over ``site``'s pages (rows, URL table); the store holds snapshots of
    ``rendered`` (path -> age in seconds)."""
    import engine
    from engine import factory

    base = f"http://127.0.0.1:{site.port}"
    urls = [base + p for p in ("/p/1", "/p/2", "/p/3", "/moved", "/slow", "/big")]
    name = unique_name()
    eng = engine.open(name, create=True, capacity=64)
    factory.publish_urls(eng, []).close()  # as a shared-memory pool does, then grown
    table = eng.row_urls()
    try:
        table.add(urls, np.full(len(urls), wall_ms()), np.full(len(urls), HOUR_S), "submitted")
        store = tmp_path / "store"
        with SnapshotStore.open(store) as s:
            for path, age in rendered.items():
                s.put(base + path, f"<p>snapshot {path}</p>", status=200, location=None,
                      interval_s=HOUR_S, lane=1, render_ms=1.0,
                      rendered_at_ms=wall_ms() - age * 1000)
        yield name, store
    finally:
        table.drop()
        dispose(eng, name)


def test_a_miss_on_the_pools_hosts_gets_the_origins_answer(tmp_path: Path) -> None:
    with Origin() as site, pool_over(site, tmp_path, {"/p/1": 10, "/p/2": 3 * HOUR_S}) as (
            name, store), Served(name, "--store", str(store), "--max-stale", "2") as srv:
        base = f"http://127.0.0.1:{site.port}"
        bot = {"User-Agent": "Mozilla/5.0 (compatible; Googlebot/2.1)"}
        status, h, body = get(srv.port, f"/{base}/p/1", bot)
        assert status == 200 and h["x-lanes-snapshot"] == "served" and b"snapshot" in body
        # never rendered: the origin's answer, headers that matter kept
        status, h, body = get(srv.port, f"/{base}/p/3", bot)  # the origin has no /p/3
        assert status == 404 and h["x-lanes-snapshot"] == "origin" and body == \
            b"<p>no such page</p>"  # the origin's own 404: the page really is gone
        status, h, body = get(srv.port, f"/render?url={base}/moved", bot)
        assert status == 301 and h["location"] == "/p/1" and h["x-lanes-snapshot"] == "origin"
        # too stale: the origin's fresh page, not a 503
        status, h, body = get(srv.port, f"/{base}/p/2", bot)
        assert status == 200 and body == b"<p>origin two</p>" and h["x-lanes-miss"] == "stale"
        # the relay says what it is, so middleware does not send it back here
        path, headers = site.seen[-1]
        assert path == "/p/2" and headers["X-Prerender"] == "1"
        assert headers["User-Agent"].startswith("Mozilla/5.0 (compatible; Googlebot/2.1)")
        assert "Prerender" in headers["User-Agent"]
        # a URL on no host of the pool: fetched from nowhere
        before = len(site.seen)
        status, h, _ = get(srv.port, "/https://elsewhere.example/p/1", bot)
        assert status == 404 and h["x-lanes-snapshot"] == "missing"
        assert len(site.seen) == before


def test_a_cleared_snapshot_is_answered_from_the_origin_at_once(tmp_path: Path) -> None:
    with Origin() as site, pool_over(site, tmp_path, {"/p/1": 10}) as (name, store), \
            Served(name, "--store", str(store)) as srv:
        url = f"http://127.0.0.1:{site.port}/p/1"
        assert get(srv.port, f"/{url}")[1]["x-lanes-snapshot"] == "served"
        status, _, out = get(srv.port, "/api/prioritize", {
            "Content-Type": "application/json"}, method="POST",
            body=json.dumps({"url": url, "mode": "clear-and-wait"}).encode())
        assert status == 200 and json.loads(out)["cleared"] == 1
        status, h, body = get(srv.port, f"/{url}")
        assert status == 200 and body == b"<p>origin one</p>"
        assert h["x-lanes-snapshot"] == "origin" and h["cache-control"] == "max-age=60"


def test_origin_fetches_are_bounded(tmp_path: Path) -> None:
    with Origin() as site, pool_over(site, tmp_path, {}) as (name, store), \
            Served(name, "--store", str(store), "--origin-timeout", "1",
                   "--origin-per-host", "2") as srv:
        base = f"http://127.0.0.1:{site.port}"
        started = time.monotonic()
        status, h, _ = get(srv.port, f"/{base}/slow")
        assert status == 504 and "retry-after" in h
        assert time.monotonic() - started < 5
        status, h, _ = get(srv.port, f"/{base}/big")  # 11 MB: over the 10 MB cap
        assert status == 502 and h["x-lanes-snapshot"] == "origin"
        results: list[int] = []

        def slow() -> None:
            results.append(get(srv.port, f"/{base}/slow")[0])

        threads = [threading.Thread(target=slow) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        status, h, body = get(srv.port, f"/{base}/p/1")  # a third at once on the host
        assert status == 503 and b"busy" in body and h["x-lanes-snapshot"] == "origin"
        for t in threads:
            t.join()
        assert results == [504, 504]
        assert get(srv.port, f"/{base}/p/1")[0] == 200  # the host is free again


def test_an_unreachable_origin_is_a_503_never_a_404(tmp_path: Path) -> None:
    site = Origin().start()
    port = site.port
    with pool_over(site, tmp_path, {}) as (name, store):
        site.close()  # the origin goes away
        with Served(name, "--store", str(store)) as srv:
            status, h, _ = get(srv.port, f"/http://127.0.0.1:{port}/p/1")
            assert status == 503 and h["retry-after"] and h["x-lanes-snapshot"] == "origin"


AGENTS = {
    "googlebot": "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36"
                 " (KHTML, like Gecko) Chrome/41.0.2272.96 Mobile Safari/537.36 (compatible;"
                 " Googlebot/2.1; +http://www.google.com/bot.html)",
    "bingbot": "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
    "gptbot": "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.1;"
              " +https://openai.com/gptbot)",
    "claudebot": "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0;"
                 " +claudebot@anthropic.com)",
    "perplexitybot": "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible;"
                     " PerplexityBot/1.0; +https://perplexity.ai/perplexitybot)",
    "ai-other": "CCBot/2.0 (https://commoncrawl.org/faq/)",
    "other-bot": "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
    "human": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)"
             " Chrome/150.0.0.0 Safari/537.36",
}


def test_crawler_families_come_from_the_maintained_list() -> None:
    from engine.serve.crawlers import FAMILIES, family

    for name, agent in AGENTS.items():
        assert FAMILIES[family(agent)] == name, (name, agent)
    assert FAMILIES[family(None)] == "other-bot" and FAMILIES[family("")] == "other-bot"
    assert family("x" * 100_000) in range(len(FAMILIES))  # cut, classified, kept bounded


def test_each_hit_records_its_crawler_and_metrics_report_freshness_per_crawler(
        tmp_path: Path) -> None:
    with Origin() as site, pool_over(site, tmp_path, {"/p/1": 900, "/p/2": 1800}) as (
            name, store), Served(name, "--store", str(store)) as srv:
        base = f"http://127.0.0.1:{site.port}"
        for _ in range(3):
            assert get(srv.port, f"/{base}/p/1", {"User-Agent": AGENTS["googlebot"]})[0] == 200
        assert get(srv.port, f"/{base}/p/2", {"User-Agent": AGENTS["gptbot"]})[0] == 200
        assert get(srv.port, f"/{base}/p/3", {"User-Agent": AGENTS["gptbot"]})[1][
            "x-lanes-snapshot"] == "origin"
        assert get(srv.port, f"/{base}/p/1", {"User-Agent": AGENTS["human"]})[0] == 200

        def metric(line: str) -> float | None:
            text = get(srv.port, "/metrics")[2].decode()
            for row in text.splitlines():
                if row.startswith(line + " "):
                    return float(row.split()[-1])
            return None

        deadline = time.monotonic() + 20  # hits are written once a second, figures cached 10 s
        while metric('lanes_bot_hits_total{bot="gptbot"}') != 2.0:
            assert time.monotonic() < deadline, get(srv.port, "/metrics")[2].decode()[-2000:]
            time.sleep(0.5)
        assert metric('lanes_bot_hits_total{bot="googlebot"}') == 3.0
        assert metric('lanes_bot_origin_hits_total{bot="gptbot"}') == 1.0
        assert metric('lanes_bot_hits_total{bot="human"}') == 1.0
        assert metric('lanes_bot_served_hits{bot="googlebot"}') == 3.0
        age = metric('lanes_bot_served_age_over_interval{bot="gptbot"}')
        assert age is not None and 0.5 <= age < 0.6  # /p/2 is half an hour of its hour old
        status, _, page = get(srv.port, "/")
        assert status == 200 and b"What each crawler got" in page and b"gptbot" in page


def test_a_version_1_store_is_migrated_when_opened(tmp_path: Path) -> None:
    import sqlite3

    from engine.store import SCHEMA_VERSION

    with SnapshotStore.open(tmp_path / "s") as s:
        s.put("https://a.example/", "<p>a</p>", status=200, location=None, interval_s=60,
              lane=1, render_ms=1.0)
    db = sqlite3.connect(tmp_path / "s" / "store.sqlite")
    db.executescript("DROP TABLE bot_hits; ALTER TABLE hits DROP COLUMN bot;"
                     " PRAGMA user_version = 1;")
    db.close()
    with SnapshotStore.open(tmp_path / "s", create=False) as s:
        snap = s.get("https://a.example/")
        assert snap is not None
        s.log_hits([(wall_ms(), snap.id, 1, 0.5, True, 2)], {2: (1, 0)})
        assert s.bot_requests() == {2: (1, 0)}
    db = sqlite3.connect(tmp_path / "s" / "store.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    db.close()


def test_discovery_on_miss_adds_normalised_pages_within_its_rate(tmp_path: Path) -> None:
    import engine

    with Origin() as site, pool_over(site, tmp_path, {"/p/1": 10}) as (name, store):
        with Served(name, "--store", str(store), "--discover", "--discover-rate", "3") as srv:
            base = f"http://127.0.0.1:{site.port}"
            asked = [f"/{base}/new/1?utm_source=mail&b=2&a=1&gclid=x#top",
                     f"/{base}/new/1?a=1&b=2", f"/{base}/new/2", f"/{base}/new/3",
                     f"/{base}/new/4", f"/{base}/new/5", "/https://elsewhere.example/x"]
            for path in asked:
                assert get(srv.port, path)[0] in (404, 200)  # the origin's or missing
            eng = engine.open(name)
            try:
                deadline = time.monotonic() + 15
                while int(eng.stats()["rows"]) < 9:
                    assert time.monotonic() < deadline, eng.stats()["rows"]
                    time.sleep(0.2)
                time.sleep(1.5)
                added = eng.row_urls().urls()[6:]
                assert added == [f"{base}/new/1?a=1&b=2", f"{base}/new/2", f"{base}/new/3"]
                assert all(eng.lane_name(int(eng.lane(r))).startswith("discovered")
                           for r in range(6, 9))
            finally:
                eng.close()
            text = get(srv.port, "/metrics")[2].decode()
            assert 'lanes_serve_discovery_total{outcome="added"} 3.0' in text
            assert 'lanes_serve_discovery_total{outcome="refused_rate"} 2.0' in text
            assert 'lanes_serve_origin_answers_total{outcome="4xx"}' in text


def test_discovery_spelling_drops_tracking_and_keeps_what_the_route_says() -> None:
    from engine.corpus.routes import Route
    from engine.serve.discover import discovery_url

    url = "https://Shop.example/p/1?utm_campaign=x&z=1&page=2&fbclid=abc&a=%7e#frag"
    assert discovery_url(url, None) == "https://shop.example/p/1?a=~&page=2&z=1"
    keep_page = Route("p", "https://shop.example/p/*", False, 3600, query=("page",))
    assert discovery_url(url, keep_page) == "https://shop.example/p/1?page=2"
    assert discovery_url(url, Route("p", "*", False, 3600, query=())) == \
        "https://shop.example/p/1"


def test_render_on_miss_rushes_the_page_and_waits_for_its_snapshot(tmp_path: Path) -> None:
    import engine

    with Origin() as site, pool_over(site, tmp_path, {}) as (name, store), \
            Served(name, "--store", str(store), "--discover", "--render-on-miss", "6") as srv:
        base = f"http://127.0.0.1:{site.port}"
        url = f"{base}/new/9"
        answers: list[tuple[int, dict[str, str], bytes]] = []
        asker = threading.Thread(target=lambda: answers.append(
            get(srv.port, f"/{url}?utm_source=x")))
        started = time.monotonic()
        asker.start()
        eng = engine.open(name)
        try:  # the pool's part, played here: the page is added, urgent; then rendered
            table = eng.row_urls()
            deadline = time.monotonic() + 10
            while int(eng.stats()["rows"]) < 7:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            row = table.find(url)
            assert eng.lane(row) == 0 and eng.lane_name(0) == "urgent"
        finally:
            eng.close()
        with SnapshotStore.open(store, create=False) as s:
            s.put(url, "<p>rendered on miss</p>", status=200, location=None, interval_s=HOUR_S,
                  lane=0, render_ms=1.0)
        asker.join(timeout=20)
        status, h, body = answers[0]
        assert status == 200 and h["x-lanes-snapshot"] == "served"
        assert body == b"<p>rendered on miss</p>" and time.monotonic() - started < 6.5
        # nothing renders it: after the wait, the origin's answer
        started = time.monotonic()
        status, h, _ = get(srv.port, f"/{base}/new/10")
        assert h["x-lanes-snapshot"] == "origin" and 5.9 < time.monotonic() - started < 20
