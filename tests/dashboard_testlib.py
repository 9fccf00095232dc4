"""Helpers of the dashboard tests: a real pool through ``lanes pool`` against a local site,
with good, failing and hostile URLs, and a dashboard server over it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pool_testlib import cli, wait_for
from site_server import SiteServer

from engine import Engine
from engine.errors import SegmentMissing
from engine.pool.board import Board
from engine.pool.failures import FailureLog

GOOD = [f"/p/{i}" for i in range(40)]
FAILING = ["/broken/1", "/broken/2"]
HOSTILE = "/p/<script>alert(1)</script>"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corpus_csv(tmp: Path, site: SiteServer) -> Path:
    """Good pages (every 60 s), two that always fail and a URL with a ``<script>`` in it."""
    base = site.url()
    lines = ["url,interval_s,provenance"]
    lines += [f"{base}{p},60,{'submitted' if i % 3 else 'discovered'}"
              for i, p in enumerate(GOOD)]
    lines += [f"{base}{p},3600,submitted" for p in FAILING]
    lines.append(f'"{base}{HOSTILE}",3600,submitted')
    path = tmp / "corpus.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def site() -> SiteServer:
    return SiteServer(GOOD, delay_ms=(30, 120), failing=FAILING)  # HOSTILE: a 404


@contextlib.contextmanager
def pool_cli(name: str, csv: Path, *more: str, workers: int = 2) -> Iterator[subprocess.Popen[str]]:
    """``lanes pool NAME`` rendering with curl (a 500 fails, transiently), in its own session;
    stopped with SIGINT and waited for at the end."""
    p = cli("pool", name, "--corpus", str(csv), "--command",
            "curl -fsS --max-time 5 -o /dev/null {url}", "--workers", str(workers),
            "--batch", "2", "--lease", "5", "--grace", "5", "--plain", *more,
            start_new_session=True)
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def wait_for_pool(name: str, local: str | None = None, redis: str | None = None,
                  failures: int = 1) -> None:
    """Until the pool's board exists and shows ``failures`` failed renders."""
    def ready() -> bool:
        try:
            board = Board.attach(local or name)
        except SegmentMissing:
            return False
        try:
            return bool(board.totals()["failures"] >= failures)
        finally:
            board.close()
    wait_for(ready, timeout=60)


def failure_entry(name: str, url_part: str) -> Any:
    log = FailureLog.attach(name)
    try:
        return next((e for e in log.entries() if url_part in e.url), None)
    finally:
        log.close()


def engine_of(name: str, redis: str | None = None) -> Any:
    return Engine.attach(name) if redis is None else Engine.connect(redis, name)


def wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


class OpenParts:
    """The parts of pool ``name`` (what a server's pool source opens), for an app in-process."""

    def __init__(self, name: str, redis: str | None = None, local: str | None = None) -> None:
        self.name, self.redis, self.local = name, redis, local or name
        self.engine = engine_of(name, redis)
        self._urls: Any = None
        self._board: Board | None = None
        self._log: FailureLog | None = None

    def urls(self) -> Any:
        if self._urls is None:
            if self.redis is None:
                from engine.pool.urls import UrlTable

                self._urls = UrlTable.attach(self.name)
            else:
                from engine.redis.urls import RedisUrls

                self._urls = RedisUrls(self.engine)
        return self._urls

    def board(self) -> Board | None:
        if self._board is None:
            try:
                self._board = Board.attach(self.local)
            except SegmentMissing:
                return None
        return self._board

    def failures(self) -> FailureLog | None:
        if self._log is None:
            try:
                self._log = FailureLog.attach(self.local)
            except SegmentMissing:
                return None
        return self._log

    def routes(self) -> Any:
        from engine.pool.grow import stored_routes

        return stored_routes(self.name, None if self.redis is None else self.urls())

    def close(self) -> None:
        for part in (self._urls, self._board, self._log, self.engine):
            if part is not None:
                part.close()


class ThreadServer:
    """An aiohttp app with the dashboard of ``parts``, served on a loopback port from a thread
    of its own (its own event loop); ``close()`` stops it and joins the thread."""

    def __init__(self, parts: Any, read_only: bool = False) -> None:
        import asyncio
        import threading

        from aiohttp import web

        from engine.serve.dashboard import add_routes

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = web.Application()
        add_routes(app, parts, read_only=read_only)
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app)
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            self._loop.run_until_complete(site.start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="dashboard-test-server")
        self._thread.start()
        assert started.wait(30), "the dashboard never started"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        assert not self._thread.is_alive()


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def browser(user_data: Path) -> Iterator[Any]:
    """Debian's Chromium under Playwright, with a fresh profile; closed (and gone) at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(user_data), executable_path="/usr/bin/chromium", headless=True,
            args=CHROMIUM_FLAGS)  # the fresh profile: user_data, passed as --user-data-dir
        try:
            yield ctx
        finally:
            ctx.close()
