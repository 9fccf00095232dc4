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
import pytest
from front_door_testlib import Served, get
from http_testlib import LocalSite
from lanes_testlib import dispose, unique_name

from engine.engine import Engine, wall_ms
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
    """A pool at rest over ``site``'s pages; the store holds snapshots of ``rendered`` (path
    -> age in seconds)."""
    from engine.pool.urls import UrlTable

    base = f"http://127.0.0.1:{site.port}"
    urls = [base + p for p in ("/p/1", "/p/2", "/p/3", "/moved", "/slow", "/big")]
    name = unique_name()
    eng = Engine.create(name, 64)
    try:
        eng.add_many(np.full(len(urls), wall_ms()), np.full(len(urls), HOUR_S), "submitted")
        UrlTable.create(name, urls).close()
        store = tmp_path / "store"
        with SnapshotStore.open(store) as s:
            for path, age in rendered.items():
                s.put(base + path, f"<p>snapshot {path}</p>", status=200, location=None,
                      interval_s=HOUR_S, lane=1, render_ms=1.0,
                      rendered_at_ms=wall_ms() - age * 1000)
        yield name, store
    finally:
        UrlTable.unlink(name)
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
    from engine.pool.board import Board, Clock

    with Origin() as site, pool_over(site, tmp_path, {"/p/1": 10}) as (name, store):
        Board.create(name, 1, Clock.wall(), 0, 0).close()
        try:
            with Served(name, "--store", str(store)) as srv:
                url = f"http://127.0.0.1:{site.port}/p/1"
                assert get(srv.port, f"/{url}")[1]["x-lanes-snapshot"] == "served"
                status, _, out = get(srv.port, "/api/prioritize", {
                    "Content-Type": "application/json"}, method="POST",
                    body=json.dumps({"url": url, "mode": "clear-and-wait"}).encode())
                assert status == 200 and json.loads(out)["cleared"] == 1
                status, h, body = get(srv.port, f"/{url}")
                assert status == 200 and body == b"<p>origin one</p>"
                assert h["x-lanes-snapshot"] == "origin" and h["cache-control"] == "max-age=60"
        finally:
            Board.unlink(name)


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
