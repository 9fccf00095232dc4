"""The browser render against the ways a site operator would otherwise render, on one machine,
each on both of Debian's Chromium binaries: the headless shell (``chromium-headless-shell``,
lanes' default) and full Chromium (``chromium``, what prerender's users run today).

All render the same local site of 300 ms JavaScript pages (tests/lib/render_site.py, ``/slow/N``:
content inserted by a 300 ms timer), with the same flags, 8 pages at once:

* **lanes**: ``lanes pool --browser --workers 2 --tabs 4 --chromium BINARY`` into a fresh store;
* **(a) playwright**: a bare Playwright loop (``executable_path=BINARY``), 8 concurrent pages in
  one browser, each in a fresh context, ready at ``networkidle`` (500 ms without a request: the
  readiness rule ``lanes`` uses), then ``page.content()`` — the ceiling;
* **(b) dump-dom**: ``BINARY --headless --dump-dom URL`` started cold once per page, 8 at a time;
* **(c) prerender**: the npm package ``prerender``, installed once under ``bench/.peers/`` with the
  machine's npm and run with ``chromeLocation: BINARY`` and the same flags, asked for the same
  pages by 8 concurrent clients. If it cannot be installed or run here, the figure says why.

Renders per second count the pages after the browser is up (a browser's start is not a render):
for lanes, from the store's render times; for the others, from the first request. CPU-seconds
per render are counted two ways over each system's whole run (its start included): the
machine's busy time from ``/proc/stat`` (every process on the machine, so an upper bound on a
shared one), and the system's own process tree from the kernel's accounting of reaped children
(``getrusage``; this script is the child subreaper of all it starts and reaps the Chromium
processes orphaned onto it, so none is lost to init; its own CPU is included, since Playwright's
client runs in it). The two binaries and the systems
alternate within each repetition (``--reps``); medians and ranges, and ratios from runs side
by side. Then, for each binary, the RSS of one worker's browser process tree after 100 and
after 2,000 renders (``--rss-renders``) of a pool re-rendering 40 pages.

    .venv/bin/python bench/bench_browser.py [--smoke] [--pages N] [--reps R] [--out F]
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, figure, finish, parse_args, ratios, skipped

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from browser_testlib import stored, write_corpus  # noqa: E402
from render_site import SiteServer  # noqa: E402

from engine.pool.browser import CHROMIUM_FLAGS, DEFAULT_CHROMIUM, HEADLESS_SHELL  # noqa: E402

CONCURRENCY = 8
FLAGS = [f for f in CHROMIUM_FLAGS if not f.startswith("--remote-debugging-port")]
BINARIES = {"shell": HEADLESS_SHELL, "full": DEFAULT_CHROMIUM}
PEERS_DIR = ROOT / "bench" / ".peers"


@dataclass
class Run:
    """One system's run: its rate, and the CPU it took per page."""

    rate: float
    cpu_machine: float  # /proc/stat busy CPU-s per page, the whole machine
    cpu_tree: float  # its own process tree's CPU-s per page (rusage, orphans reaped here)


def _busy_s() -> float:
    """The machine's busy CPU time so far, in seconds (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Reaper:
    """Makes this process the child subreaper of everything it starts, and reaps the Chromium
    processes orphaned onto it, so the kernel adds their CPU time to ours: a browser's zygote
    and renderers, its crash handler (double-forked away), and prerender's Chromium after its
    node is killed would otherwise end as init's children, uncounted."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def sweep(self) -> None:
        # Only dead Chromium processes: the children this script waits for itself are others
        # (a --dump-dom taken here too is harmless: subprocess.run then reads exit status 0).
        for p in psutil.Process().children():
            try:
                if p.status() == psutil.STATUS_ZOMBIE and p.name().startswith("chrom"):
                    os.waitpid(p.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.sweep()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _tree_s() -> float:
    """CPU-s of this process (Playwright's client runs in it) and of its reaped descendants."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def measured(reaper: Reaper, pages: int, go: Callable[..., float], *args: Any) -> Run:
    """``go(*args)`` (it returns renders/s), and the CPU it took per page. The tree's figure
    waits out its crash handlers (they exit within a second of their browser)."""
    busy, own = _busy_s(), _tree_s()
    rate = go(*args)
    machine = (_busy_s() - busy) / pages
    time.sleep(1.5)
    reaper.sweep()
    return Run(rate, machine, (_tree_s() - own) / pages)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- lanes ---------------------------------------------------------------------------------------


def lanes_rate(site: SiteServer, urls: list[str], tmp: Path, binary: str) -> float:
    store = tmp / f"store-{uuid.uuid4().hex[:6]}"
    corpus = write_corpus(tmp / "c.csv", urls)
    name = f"bench-browser-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pool", name, "--browser",
                             "--store", str(store), "--corpus", str(corpus), "--workers", "2",
                             "--tabs", str(CONCURRENCY // 2), "--plain", "--chromium", binary],
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


async def _playwright(urls: list[str], binary: str) -> float:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=binary, args=FLAGS)
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


def _run_playwright(urls: list[str], binary: str) -> float:
    return asyncio.run(_playwright(urls, binary))


# -- (b) chromium --dump-dom per page ------------------------------------------------------------


def _dump_dom(url: str, binary: str) -> bool:
    profile = tempfile.mkdtemp(prefix="bench-dumpdom-")
    try:
        out = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}",
                              "--dump-dom", url], capture_output=True, text=True, timeout=60)
        return "done" in out.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def dump_dom_rate(urls: list[str], binary: str, held: list[int]) -> float:
    """Renders per second; how many dumps held the 300 ms content (it fires after load) is
    appended to ``held``."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        got = list(pool.map(lambda u: _dump_dom(u, binary), urls))
    t1 = time.perf_counter()
    held.append(sum(got))
    return len(urls) / (t1 - t0)


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


def install_prerender() -> Path | str:
    """The directory prerender is installed in (``bench/.peers/prerender``, once), or why it
    cannot be."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return "no node/npm on this machine"
    where = PEERS_DIR / "prerender"
    if (where / "node_modules" / "prerender" / "package.json").exists():
        return where
    where.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "prerender"],
                         cwd=where, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"})
    if got.returncode != 0:
        return f"npm install prerender failed: {(got.stderr or got.stdout).strip()[-300:]}"
    return where


def prerender_version(where: Path) -> str:
    return str(json.loads((where / "node_modules" / "prerender" / "package.json").read_text())
               ["version"])


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


def prerender_rate(where: Path, urls: list[str], tmp: Path, binary: str) -> float:
    port, debug = _free_port(), _free_port()
    flags = [*FLAGS, f"--remote-debugging-port={debug}",
             f"--user-data-dir={tempfile.mkdtemp(prefix='bench-prerender-', dir=tmp)}"]
    script = tmp / "prerender-server.js"
    script.write_text(_PRERENDER_JS % {"port": port, "chromium": json.dumps(binary),
                                       "flags": json.dumps(flags), "debug": debug})
    proc = subprocess.Popen(["node", str(script)], cwd=where, stdout=subprocess.DEVNULL,
                            env={**os.environ, "NODE_PATH": str(where / "node_modules")},
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


def rss_over_renders(site: SiteServer, tmp: Path, marks: tuple[int, ...], binary: str,
                     first: int) -> list[float]:
    """The RSS (MiB) of one worker's browser tree when the pool has done each of ``marks``
    renders (counted at the site: one /api/N fetch per /js/N render, pages ``first`` on)."""
    pages = range(first, first + 40)
    urls = [site.url(f"/js/{n}") for n in pages]
    corpus = write_corpus(tmp / f"rss-{first}.csv", urls, interval_s=1)
    name = f"bench-rss-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pool", name, "--browser",
                             "--store", str(tmp / f"rss-store-{first}"), "--corpus", str(corpus),
                             "--workers", "2", "--tabs", "4", "--plain", "--chromium", binary],
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
            print(f"  {binary}: rss after {mark} renders: {out[-1]:.0f} MiB", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return out


SYSTEMS = {"lanes": "lanes pool --browser, 2 workers x 4 tabs",
           "playwright": "(a) bare Playwright, 8 pages at once",
           "dumpdom": "(b) cold --dump-dom per page, 8 at once",
           "prerender": "(c) prerender, 8 clients"}
PEERS = ("playwright", "dumpdom", "prerender")


def _rate_figures(got: dict[tuple[str, str], list[Run]], whole: dict[str, int],
                  where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rate = {k: [r.rate for r in v] for k, v in got.items()}
    for b in BINARIES:
        for sys_, label in SYSTEMS.items():
            runs = got[(sys_, b)]
            if not runs:
                out.append(skipped(f"browser.{b}.{sys_}", f"[{b}] {label}", where))
                continue
            note = (f"{whole[b]} of its last run's dumps held the 300 ms content"
                    if sys_ == "dumpdom" else "")
            out.append(figure(f"browser.{b}.{sys_}", f"[{b}] {label}", "renders/s",
                              rate[(sys_, b)], "higher", note=note))
            out.append(figure(f"browser.{b}.{sys_}.cpu_machine", f"[{b}] {sys_}: machine busy"
                              " CPU-s per render (/proc/stat)", "s", [r.cpu_machine for r in runs]))
            out.append(figure(f"browser.{b}.{sys_}.cpu_tree", f"[{b}] {sys_}: its own tree's"
                              " CPU-s per render (rusage)", "s", [r.cpu_tree for r in runs]))
        for peer in PEERS:
            if rate[(peer, b)]:
                out.append(figure(f"browser.{b}.vs_{peer}", f"[{b}] lanes / {peer}, same binary",
                                  "x", ratios(rate[("lanes", b)], rate[(peer, b)]), "higher"))
        # Per repetition, lanes over the fastest peer of that repetition (goal >= 1.0).
        best = [max(rate[(p, b)][i] for p in PEERS if len(rate[(p, b)]) > i)
                for i in range(len(rate[("lanes", b)]))]
        out.append(figure(f"browser.{b}.vs_best_peer", f"[{b}] lanes / the best peer, same"
                          " binary (goal >= 1.0)", "x", ratios(rate[("lanes", b)], best),
                          "higher"))
    out.append(figure("browser.lanes_shell_vs_full", "lanes on the shell / lanes on full Chromium",
                      "x", ratios(rate[("lanes", "shell")], rate[("lanes", "full")]), "higher"))
    if rate[("prerender", "full")]:
        out.append(figure("browser.shell_vs_prerender_full", "lanes on the shell / prerender on"
                          " full Chromium (goal >= 2.5)", "x",
                          ratios(rate[("lanes", "shell")], rate[("prerender", "full")]),
                          "higher"))
    return out


def main() -> None:
    started = time.perf_counter()
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--pages", type=int, default=160),
        ap.add_argument("--reps", type=int, default=3),
        ap.add_argument("--rss-renders", type=int, default=2000),
        ap.add_argument("--rss-only", action="store_true", help="only the RSS figures"),
        ap.add_argument("--no-rss", action="store_true", help="no RSS figures")))
    pages, reps, rss_n = (24, 1, 200) if args.smoke else (args.pages, args.reps, args.rss_renders)
    reps = 0 if args.rss_only else reps
    tmp = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    figures: list[dict[str, Any]] = []
    reaper = Reaper()
    try:
        with SiteServer(delay_ms=300) as site:
            where = install_prerender() if reps else "not run (--rss-only)"
            if isinstance(where, str):
                print(f"prerender: {where}", flush=True)
            else:
                print(f"prerender {prerender_version(where)} in {where}", flush=True)
            got: dict[tuple[str, str], list[Run]] = {(s, b): [] for s in SYSTEMS
                                                     for b in BINARIES}
            whole = dict.fromkeys(BINARIES, 0)
            for rep in range(reps):
                # The binaries alternate, and which goes first alternates by repetition.
                order = list(BINARIES) if rep % 2 == 0 else list(BINARIES)[::-1]
                for b in order:
                    binary = BINARIES[b]

                    # Fresh URLs per system, binary and repetition: nothing is cached anywhere.
                    def urls(tag: str, rep: int = rep, b: str = b) -> list[str]:
                        return [site.url(f"/slow/{n}?{tag}{b}{rep}") for n in range(pages)]

                    got[("lanes", b)].append(measured(reaper, pages, lanes_rate, site,
                                                      urls("l"), tmp, binary))
                    got[("playwright", b)].append(measured(reaper, pages, _run_playwright,
                                                           urls("p"), binary))
                    dumps = urls("d")[:max(CONCURRENCY, pages // 4)]
                    held: list[int] = []
                    got[("dumpdom", b)].append(measured(reaper, len(dumps), dump_dom_rate,
                                                        dumps, binary, held))
                    whole[b] = held[-1]
                    if not isinstance(where, str):
                        try:
                            got[("prerender", b)].append(measured(
                                reaper, pages, prerender_rate, where, urls("r"), tmp, binary))
                        except Exception as e:  # noqa: BLE001 - reported, never faked
                            where = f"prerender did not run: {type(e).__name__}: {e}"
                            print(where, flush=True)
                    print(f"rep {rep} [{b}]: " + ", ".join(
                        f"{s} {v[-1].rate:.2f}/s {v[-1].cpu_machine:.3f}/{v[-1].cpu_tree:.3f}"
                        " CPU-s" for (s, bb), v in got.items() if bb == b and len(v) > rep),
                        flush=True)
            if reps:
                figures += _rate_figures(got, whole, str(where))
            if not args.no_rss:
                for i, (b, binary) in enumerate(BINARIES.items()):
                    rss = rss_over_renders(site, tmp, (100, rss_n), binary, 5000 + 100 * i)
                    figures.append(figure(f"browser.{b}.rss_100", f"[{b}] worker browser tree"
                                          " RSS after 100 renders", "MiB", [rss[0]]))
                    figures.append(figure(f"browser.{b}.rss_late", f"[{b}] ... after {rss_n}"
                                          " renders", "MiB", [rss[1]]))
                    figures.append(figure(f"browser.{b}.rss_growth", f"[{b}] RSS after {rss_n} /"
                                          " after 100 (goal <= 1.5)", "x", [rss[1] / rss[0]]))
    finally:
        reaper.close()
        shutil.rmtree(tmp, ignore_errors=True)
    finish("bench_browser", args, figures, started)


if __name__ == "__main__":
    main()
