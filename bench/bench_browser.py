"""The browser render against the ways a site operator would otherwise render, on one machine.

All render the same local site of 300 ms JavaScript pages (tests/lib/render_site.py, ``/slow/N``:
content inserted by a 300 ms timer), with Debian's Chromium and the same flags, 8 pages at once:

* **lanes**: ``lanes pool --browser --workers 2 --tabs 4`` into a fresh store;
* **(a) playwright**: a bare Playwright loop, 8 concurrent pages in one browser, each in a fresh
  context, ready at ``networkidle`` (500 ms without a request: the readiness rule ``lanes``
  uses), then ``page.content()`` — the ceiling;
* **(b) dump-dom**: ``chromium --headless --dump-dom URL`` started once per page, 8 at a time;
* **(c) prerender**: the npm package ``prerender``, installed into a temporary directory with
  the machine's npm and run with ``chromeLocation`` and the same flags, asked for the same pages
  by 8 concurrent clients. If it cannot be installed or run here, the figure says why.

Renders per second count the pages after the browser is up (a browser's start is not a render):
for lanes, from the store's render times; for the others, from the first request. Each is
repeated (``--reps``); medians and ranges. Then the RSS of one worker's browser process tree
after 100 and after 2,000 renders (``--rss-renders``) of a pool re-rendering 40 pages.

    .venv/bin/python bench/bench_browser.py [--smoke] [--pages N] [--reps R] [--out F]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, figure, finish, parse_args, ratios, skipped

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from browser_testlib import stored, write_corpus  # noqa: E402
from render_site import SiteServer  # noqa: E402

from engine.pool.browser import CHROMIUM_FLAGS, DEFAULT_CHROMIUM  # noqa: E402

CONCURRENCY = 8
FLAGS = [f for f in CHROMIUM_FLAGS if not f.startswith("--remote-debugging-port")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- lanes ---------------------------------------------------------------------------------------


def lanes_rate(site: SiteServer, urls: list[str], tmp: Path) -> float:
    store = tmp / f"store-{uuid.uuid4().hex[:6]}"
    corpus = write_corpus(tmp / "c.csv", urls)
    name = f"bench-browser-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pool", name, "--browser",
                             "--store", str(store), "--corpus", str(corpus), "--workers", "2",
                             "--tabs", str(CONCURRENCY // 2), "--plain"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30 + 2 * len(urls)
        while len(stored(store, urls)) < len(urls):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lanes pool stopped or stalled: {proc.stderr.read()[-2000:]}"
                                   if proc.stderr else "lanes pool stopped")
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    snaps = stored(store, urls)
    assert all("done" in s.html().decode() for s in snaps.values()), "a page without content"
    # From the moment the first pages were done (browsers up) to the last; the first wave of 8
    # renders is the browsers' warm-up and is not counted.
    ends = sorted(s.rendered_at_ms for s in snaps.values())
    return (len(ends) - CONCURRENCY) / ((ends[-1] - ends[CONCURRENCY - 1]) / 1000)


# -- (a) bare playwright -------------------------------------------------------------------------


async def _playwright(urls: list[str]) -> float:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=FLAGS)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for u in urls:
            queue.put_nowait(u)
        done: list[float] = []

        async def loop() -> None:
            while not queue.empty():
                url = queue.get_nowait()
                ctx = await browser.new_context()
                page = await ctx.new_page()  # no route(): these pages fetch nothing to block
                await page.goto(url, wait_until="networkidle")
                html = await page.content()
                assert "done" in html
                await ctx.close()
                done.append(time.perf_counter())

        # The same warm-up as lanes: the first wave is not counted.
        await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
        await browser.close()
    done.sort()
    return (len(done) - CONCURRENCY) / (done[-1] - done[CONCURRENCY - 1])


# -- (b) chromium --dump-dom per page ------------------------------------------------------------


def _dump_dom(url: str) -> bool:
    profile = tempfile.mkdtemp(prefix="bench-dumpdom-")
    try:
        out = subprocess.run([DEFAULT_CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                              "--dump-dom", url], capture_output=True, text=True, timeout=60)
        return "done" in out.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def dump_dom_rate(urls: list[str]) -> tuple[float, int]:
    """Renders per second and how many dumps held the 300 ms content (it fires after load)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        got = list(pool.map(_dump_dom, urls))
    t1 = time.perf_counter()
    return len(urls) / (t1 - t0), sum(got)


# -- (c) prerender -------------------------------------------------------------------------------

_PRERENDER_JS = """
const prerender = require('prerender');
const server = prerender({
  port: %(port)d, chromeLocation: %(chromium)s, chromeFlags: %(flags)s,
  browserDebuggingPort: %(debug)d, pageLoadTimeout: 20000, waitAfterLastRequest: 500,
  logRequests: false,
});
server.use(prerender.blockResources());  // what lanes does by default, too
server.use(prerender.removeScriptTags());
server.start();
"""


def install_prerender(tmp: Path) -> Path | str:
    """The directory prerender is installed into, or why it cannot be."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return "no node/npm on this machine"
    where = tmp / "prerender"
    where.mkdir()
    got = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "prerender"],
                         cwd=where, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"})
    if got.returncode != 0:
        return f"npm install prerender failed: {(got.stderr or got.stdout).strip()[-300:]}"
    return where


async def _prerender_clients(port: int, urls: list[str]) -> float:
    import aiohttp

    queue: asyncio.Queue[str] = asyncio.Queue()
    for u in urls:
        queue.put_nowait(u)
    done: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def loop() -> None:
            while not queue.empty():
                url = queue.get_nowait()
                async with http.get(f"http://127.0.0.1:{port}/render?url={url}") as r:
                    body = await r.text()
                    assert r.status == 200 and "done" in body, (r.status, body[:200])
                done.append(time.perf_counter())

        await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
    done.sort()
    return (len(done) - CONCURRENCY) / (done[-1] - done[CONCURRENCY - 1])


def _answers(port: int, url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/render?url={url}", timeout=30) as r:
            return int(r.status) == 200
    except OSError:
        return False


def prerender_rate(where: Path, urls: list[str], tmp: Path) -> float:
    port, debug = _free_port(), _free_port()
    flags = [*FLAGS, f"--remote-debugging-port={debug}",
             f"--user-data-dir={tempfile.mkdtemp(prefix='bench-prerender-', dir=tmp)}"]
    script = where / "server.js"
    script.write_text(_PRERENDER_JS % {"port": port, "chromium": json.dumps(DEFAULT_CHROMIUM),
                                       "flags": json.dumps(flags), "debug": debug})
    proc = subprocess.Popen(["node", str(script)], cwd=where, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _answers(port, urls[0]):  # 503 until its browser is up
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prerender did not start (exit {proc.poll()})")
            time.sleep(0.5)
        return asyncio.run(_prerender_clients(port, urls))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # node and the Chromium it started
        proc.wait()


# -- RSS over many renders -----------------------------------------------------------------------


def _tree_rss(root: psutil.Process) -> int:
    """The RSS of ``root``'s descendants (a renderer may end while they are summed)."""
    total = 0
    for p in root.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _browser_rss(worker: psutil.Process, samples: int = 5) -> float:
    """The median RSS (MiB) of ``worker``'s browser tree over ``samples`` readings 0.3 s apart,
    each taken while a browser is up: a reading during a recycle (the old browser gone, the
    next not started) would measure nothing."""
    got: list[float] = []
    deadline = time.monotonic() + 60
    while len(got) < samples and time.monotonic() < deadline:
        kids = worker.children()
        if any("chromium" in k.name() for k in kids if k.is_running()):
            got.append(_tree_rss(worker) / 2**20)
        time.sleep(0.3)
    if not got:
        raise RuntimeError("the worker had no browser for a minute")
    return statistics.median(got)


def rss_over_renders(site: SiteServer, tmp: Path, marks: tuple[int, ...]) -> list[float]:
    """The RSS (MiB) of one worker's browser tree when the pool has done each of ``marks``
    renders (counted at the site: one /api/N fetch per /js/N render)."""
    pages = range(5000, 5040)
    urls = [site.url(f"/js/{n}") for n in pages]
    corpus = write_corpus(tmp / "rss.csv", urls, interval_s=1)
    name = f"bench-rss-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pool", name, "--browser",
                             "--store", str(tmp / "rss-store"), "--corpus", str(corpus),
                             "--workers", "2", "--tabs", "4", "--plain"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        start = sum(site.hits(f"/api/{n}") for n in pages)
        for mark in marks:
            while sum(site.hits(f"/api/{n}") for n in pages) - start < mark:
                if proc.poll() is not None:
                    raise RuntimeError("the pool stopped")
                time.sleep(0.5)
            worker = psutil.Process(proc.pid).children()[0]
            out.append(_browser_rss(worker))
            print(f"  rss after {mark} renders: {out[-1]:.0f} MiB", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return out


def _rate_figures(got: dict[str, list[float]], whole: int, where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    out.append(figure("browser.lanes", "lanes pool --browser, 2 workers x 4 tabs",
                          "renders/s", got["lanes"], "higher"))
    out.append(figure("browser.playwright", "(a) bare Playwright, 8 pages at once",
                          "renders/s", got["playwright"], "higher"))
    out.append(figure("browser.dumpdom", "(b) chromium --dump-dom per page, 8 at once",
                          "renders/s", got["dumpdom"], "higher",
                          note=f"{whole} of its last run's dumps held the 300 ms content"))
    out.append(figure("browser.vs_playwright", "lanes / (a) Playwright (goal >= 0.8)",
                          "x", ratios(got["lanes"], got["playwright"]), "higher"))
    out.append(figure("browser.vs_dumpdom", "lanes / (b) dump-dom (goal >= 4)",
                          "x", ratios(got["lanes"], got["dumpdom"]), "higher"))
    if got["prerender"]:
        out.append(figure("browser.prerender", "(c) prerender, 8 clients",
                              "renders/s", got["prerender"], "higher"))
        out.append(figure("browser.vs_prerender", "lanes / (c) prerender (goal > 1)",
                              "x", ratios(got["lanes"], got["prerender"]), "higher"))
    else:
        out.append(skipped("browser.prerender", "(c) prerender", where))
    return out


def main() -> None:
    started = time.perf_counter()
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--pages", type=int, default=160),
        ap.add_argument("--reps", type=int, default=3),
        ap.add_argument("--rss-renders", type=int, default=2000),
        ap.add_argument("--rss-only", action="store_true", help="only the RSS figures")))
    pages, reps, rss_n = (24, 1, 200) if args.smoke else (args.pages, args.reps, args.rss_renders)
    reps = 0 if args.rss_only else reps
    tmp = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    figures: list[dict[str, Any]] = []
    try:
        with SiteServer(delay_ms=300) as site:
            where = install_prerender(tmp) if reps else "not run (--rss-only)"
            if isinstance(where, str):
                print(f"prerender: {where}", flush=True)
            got: dict[str, list[float]] = {"lanes": [], "playwright": [], "dumpdom": [],
                                           "prerender": []}
            whole = 0
            for rep in range(reps):
                # Fresh URLs per system and repetition: nothing is cached anywhere.
                def urls(tag: str, rep: int = rep) -> list[str]:
                    return [site.url(f"/slow/{n}?{tag}{rep}") for n in range(pages)]

                got["lanes"].append(lanes_rate(site, urls("l"), tmp))
                got["playwright"].append(asyncio.run(_playwright(urls("p"))))
                rate, whole = dump_dom_rate(urls("d")[:max(CONCURRENCY, pages // 4)])
                got["dumpdom"].append(rate)
                if not isinstance(where, str):
                    try:
                        got["prerender"].append(prerender_rate(where, urls("r"), tmp))
                    except Exception as e:  # noqa: BLE001 - reported, never faked
                        where = f"prerender did not run: {type(e).__name__}: {e}"
                        print(where, flush=True)
                print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f}/s" for k, v in got.items()
                                                 if len(v) > rep), flush=True)
            if reps:
                figures += _rate_figures(got, whole, str(where))
            rss = rss_over_renders(site, tmp, (100, rss_n))
            figures.append(figure("browser.rss_100", "worker browser tree RSS after 100 renders",
                                  "MiB", [rss[0]]))
            figures.append(figure("browser.rss_late", f"... after {rss_n} renders", "MiB",
                                  [rss[1]]))
            figures.append(figure("browser.rss_growth", f"RSS after {rss_n} / after 100 (goal <="
                                  " 1.5)", "x", [rss[1] / rss[0]]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish("bench_browser", args, figures, started)


if __name__ == "__main__":
    main()
