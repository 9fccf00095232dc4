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


ROUTES = """
[[route]]
name = "pages"
match = "http://127.0.0.1:*/p/*"
interval = "60s"

[[route]]
name = "broken"
match = "http://127.0.0.1:*/broken/*"
interval = "1h"
"""


def routes_toml(tmp: Path) -> Path:
    path = tmp / "routes.toml"
    path.write_text(ROUTES)
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


def fill_store(directory: Path, urls: list[str], lane: int) -> None:
    """Snapshots of ``urls`` in a store at ``directory``, rendered half an interval ago."""
    from engine.store import SnapshotStore

    now = int(time.time() * 1000)
    with SnapshotStore.open(directory) as store:
        for url in urls:
            store.put(url, f"<html><body>{url}</body></html>", status=200, location=None,
                      interval_s=60, lane=lane, render_ms=40.0, rendered_at_ms=now - 30_000)


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
