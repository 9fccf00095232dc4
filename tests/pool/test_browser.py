"""The browser render end to end: ``lanes pool NAME --browser`` in real Chromium against a local
site of JavaScript pages (render_site.py). Every test ends with no process of its run left,
Chromium's included (browser_testlib.marked)."""

from __future__ import annotations

import os
import random
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from browser_testlib import PoolRun, stored, write_corpus
from lanes_testlib import shm_path
from render_site import JSON_LD, SiteServer

from engine.pool import clear_stale
from engine.pool.browser import HEADLESS_SHELL


@pytest.fixture(scope="module")
def site() -> Iterator[SiteServer]:
    with SiteServer(delay_ms=300) as s:
        yield s


@pytest.fixture
def name() -> str:
    return f"rl-browser-{uuid.uuid4().hex[:10]}"


def scripts_in(html: str) -> list[str]:
    return re.findall(r"<script[^>]*>", html)


def test_snapshots_hold_the_js_content_and_the_json_ld_and_no_other_script(
        site: SiteServer, tmp_path: Path, name: str) -> None:
    urls = [site.url(p) for p in ("/js/1", "/js/2", "/ready/1", "/redirect", "/meta404")]
    store = tmp_path / "store"
    img_before = site.hits("/img/1.png") + site.hits("/img/2.png")
    with PoolRun(name, write_corpus(tmp_path / "c.csv", urls), store, "--tabs", "3") as run:
        run.wait_until(lambda: len(stored(store, urls)) == len(urls), 60)
        assert run.stop() == 0
        assert run.left_behind() == []
    snaps = stored(store, urls)
    for n in (1, 2):
        html = snaps[site.url(f"/js/{n}")].html().decode()
        assert f"JS content {n}: fetched" in html  # after a fetch and a timer
        assert JSON_LD in html
        assert scripts_in(html) == ['<script type="application/ld+json">']
        assert snaps[site.url(f"/js/{n}")].status == 200
    assert site.hits("/img/1.png") + site.hits("/img/2.png") == img_before  # images blocked
    ready = snaps[site.url("/ready/1")]
    assert "ready 1" in ready.html().decode() and ready.status == 200  # the flag, not the network
    assert (snaps[site.url("/redirect")].status, snaps[site.url("/redirect")].location) == (
        301, "/js/9")
    gone = snaps[site.url("/meta404")]
    assert gone.status == 404 and "no such product" in gone.html().decode()  # kept, with 404
    assert re.search(r"meta404 \(row \d+\) failed: PageStatus: HTTP 404 \(snapshot kept\);"
                     r" permanent", run.stderr())
    # The default browser (make tools installs it), named at start.
    assert f"browser: Chromium's headless shell ({HEADLESS_SHELL})" in run.stderr()
    assert not os.path.exists(shm_path(name))


def test_keep_scripts_keeps_them(site: SiteServer, tmp_path: Path, name: str) -> None:
    url = site.url("/js/3")
    store = tmp_path / "store"
    with PoolRun(name, write_corpus(tmp_path / "c.csv", [url]), store, "--keep-scripts") as run:
        run.wait_until(lambda: url in stored(store, [url]), 60)
        assert run.stop() == 0
        assert run.left_behind() == []
    html = stored(store, [url])[url].html().decode()
    assert len(scripts_in(html)) == 2 and "JS content 3" in html


def test_hung_busy_and_crashing_pages_fail_with_their_reason_while_others_render(
        site: SiteServer, tmp_path: Path, name: str) -> None:
    bad = [site.url(p) for p in ("/hang", "/busy", "/crash")]
    good = [site.url(f"/js/{n}") for n in range(100, 124)]
    store = tmp_path / "store"
    corpus = write_corpus(tmp_path / "c.csv", bad + good)
    with PoolRun(name, corpus, store, "--tabs", "6", "--page-timeout", "10",
                 "--batch", "6") as run:
        run.wait_until(lambda: len(stored(store, good)) == len(good), 90)
        run.wait_until(lambda: run.first_line_with("/busy") is not None
                       and run.first_line_with("/hang") is not None, 30)
        assert run.stop() == 0
        assert run.left_behind() == []
    err = run.stderr()
    assert re.search(r"/hang \(row \d+\) failed: PageTimeout: the page did not settle within"
                     r" 10 s( \(DOMContentLoaded never came\))?: 1 request\(s\) still open:"
                     r" http://127\.0\.0\.1:\d+/never; retry", err)
    assert re.search(r"/busy \(row \d+\) failed: PageTimeout: the page did not settle within"
                     r" 10 s: its JavaScript did not answer \(a busy loop\?\); retry", err)
    assert re.search(r"/crash \(row \d+\) failed: PageCrashed: the page crashed", err)
    assert stored(store, bad) == {}  # no snapshot of a page that did not render
    # The other tabs kept rendering while the hung ones waited for their timeout: good pages
    # were stored before the first hung page failed (the busy loop and the allocation take
    # both cores of a small machine meanwhile, hence not many).
    first_hang = min(t for t in (run.first_line_with("/hang"), run.first_line_with("/busy"))
                     if t is not None)
    snaps = stored(store, good)
    wall_of_first_hang = time.time() - (time.monotonic() - first_hang)
    early = [s for s in snaps.values() if s.rendered_at_ms / 1000 < wall_of_first_hang]
    assert len(early) >= 5, (len(early), err[-2000:])


def _kill_workers_for(run: PoolRun, seconds: float, every_s: float, rng: random.Random) -> int:
    """SIGKILL one worker every ``every_s``; after each kill, its browser must be gone at once."""
    kills = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every_s)
        workers = run.workers()
        if not workers:
            continue
        victim = rng.choice(workers)
        pgid = victim.pid
        victim.kill()
        kills += 1
        deadline = time.monotonic() + 3
        while _group(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _group(pgid) == [], "the killed worker's browser outlived it"
    return kills


def _group(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def _sigkill_run(site: SiteServer, tmp_path: Path, name: str, seconds: float, pages: int) -> None:
    urls = [site.url(f"/slow/{n}") for n in range(pages)]
    store = tmp_path / "store"
    corpus = write_corpus(tmp_path / "c.csv", urls, interval_s=5)  # rendered again and again
    with PoolRun(name, corpus, store, "--tabs", "4", "--workers", "2", "--lease", "5",
                 "--page-timeout", "10", workers=2) as run:
        run.wait_until(lambda: len(run.workers()) == 2, 30)
        kills = _kill_workers_for(run, seconds, 3.0, random.Random(7))
        run.wait_until(lambda: len(stored(store, urls)) == len(urls), 60)
        assert run.stop() == 0
        assert run.left_behind() == []
    assert kills >= seconds // 3 - 1
    for url, snap in stored(store, urls).items():
        n = url.rsplit("/", 1)[1]
        assert f"slow {n} done" in snap.html().decode()  # whole: gzip checks its CRC too
    leftovers = [p for p in (store / "snapshots").rglob("*") if p.name.startswith(".tmp-")]
    assert all(p.is_file() for p in leftovers)  # at most temp files, never a torn snapshot


def test_sigkilled_workers_leave_no_browser_and_no_torn_snapshot(
        site: SiteServer, tmp_path: Path, name: str) -> None:
    _sigkill_run(site, tmp_path, name, seconds=16, pages=40)


@pytest.mark.slow
def test_sigkilled_workers_for_a_minute_leave_no_browser_and_no_torn_snapshot(
        site: SiteServer, tmp_path: Path, name: str) -> None:
    _sigkill_run(site, tmp_path, name, seconds=60, pages=120)


def test_a_pool_killed_whole_leaves_no_browser(site: SiteServer, tmp_path: Path,
                                               name: str) -> None:
    urls = [site.url(f"/slow/{n}?whole") for n in range(40)]
    store = tmp_path / "store"
    try:
        with PoolRun(name, write_corpus(tmp_path / "c.csv", urls), store, "--tabs", "4",
                     workers=2) as run:
            run.wait_until(lambda: len(stored(store, urls)) >= 4, 60)
            pythons = [run.proc.pid, *(w.pid for w in run.workers())]
            for sig in (signal.SIGSTOP, signal.SIGKILL):  # supervisor and workers at once,
                for pid in pythons:  # their browsers untouched: nobody left to kill a group
                    os.kill(pid, sig)
            run.proc.wait(10)
            assert run.left_behind(settle_s=5) == []
    finally:
        clear_stale(name)  # what a supervisor killed whole leaves in /dev/shm


def _browser_rss_mb(run: PoolRun) -> float:
    total = 0
    for w in run.workers():
        try:
            for p in w.children(recursive=True):
                total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def test_browser_rss_stays_bounded_over_many_renders(
        site: SiteServer, tmp_path: Path, name: str) -> None:
    urls = [site.url(f"/js/{n}") for n in range(200, 220)]
    store = tmp_path / "store"
    corpus = write_corpus(tmp_path / "c.csv", urls, interval_s=1)
    with PoolRun(name, corpus, store, "--tabs", "4", "--recycle-after", "80") as run:
        hits = lambda: sum(site.hits(f"/api/{n}") for n in range(200, 220))  # noqa: E731
        start = hits()
        run.wait_until(lambda: hits() - start >= 40, 60)
        first = _browser_rss_mb(run)
        samples = []
        deadline = time.monotonic() + 180
        while hits() - start < 200:
            assert run.proc.poll() is None and time.monotonic() < deadline, run.stderr()
            samples.append(_browser_rss_mb(run))
            time.sleep(0.5)
        assert run.stop() == 0
        assert run.left_behind() == []
    assert first > 0
    assert max(samples) <= 1.5 * first + 150, (first, samples)  # +150 MiB: a tab's renderer
    assert "JS content 200" in stored(store, urls[:1])[urls[0]].html().decode()


def test_a_missing_chromium_is_refused_before_anything_is_made(
        tmp_path: Path, name: str) -> None:
    store = tmp_path / "store"
    corpus = write_corpus(tmp_path / "c.csv", ["http://127.0.0.1:9/x"])
    run = PoolRun(name, corpus, store, "--chromium", str(tmp_path / "no-such-chromium"))
    assert run.proc.wait(60) == 2
    run.stop()
    assert "Chromium not found at" in run.stderr() and "--chromium PATH" in run.stderr()
    assert not store.exists()
    assert not os.path.exists(shm_path(name)) and not os.path.exists(shm_path(name) + ".pool")
    assert run.left_behind() == []
