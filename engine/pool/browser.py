"""The built-in browser render: one headless Chromium per worker, several pages at once.

Why it is built this way
------------------------

The render farms this replaces (prerender, Rendertron, chrome-prerender) share four failures:
zombie Chrome processes, memory that grows until the OOM killer, errors after a browser restart
or under load, and pages that hang. Each has a cause this module removes:

* **Zombies.** Chromium is started by the worker itself (``subprocess``, no new session), so it
  lives in the worker's process group (the worker makes itself a group leader at start). The
  supervisor kills that group the moment it finds the worker dead, and a worker leaving on its
  own closes its browser and then kills what is left of the tree. That is why the driver is raw
  DevTools over a websocket (``cdp``) and not Playwright: Playwright launches Chromium
  ``detached`` (a new process group, so a group kill misses it) behind a Node driver process
  of its own. Chromium also gets SIGKILL from the kernel when its worker dies (a parent-death
  signal), for when nobody is left to kill the group: a pool killed whole, supervisor and
  workers at once.
* **Memory.** The browser is recycled after ``recycle_after`` renders and whenever its process
  tree's RSS passes ``rss_limit_mb``; every page gets a fresh context (disposed after, which ends
  its renderer), and a page's JavaScript heap is capped (``js_heap_mb``), so one page that
  allocates without end crashes its own tab, not the host.
* **Restarts under load.** A recycle drains: no new page starts, the pages in flight finish, the
  browser is closed and a new one started before the next claim. Nothing is asked of a browser
  that is going away.
* **Hangs.** Every page runs under ``page_timeout_s``, enforced by the worker's event loop, never
  by the page; a busy loop in one tab holds only that tab's renderer, and disposing its context
  kills it. A browser that stops answering is replaced.

A worker renders ``tabs`` pages at once: it claims as many rows as it has free tabs, starts a
render for each and, as each finishes, completes or fails its row at once, then claims again,
so a slow page never holds back the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from ..checks import is_int, is_number
from ..corpus import variant_rows
from ..corpus.routes import Routes
from ..corpus.rules import NO_RULES, RESOURCE_TYPES, RouteRules
from ..corpus.variant_rows import plain_variant
from ..errors import CorpusError, EngineError, EngineValueError
from ..store.api import StoreSpec
from .cdp import Cdp
from .page import (
    PRERENDER_HEADER,
    BrowserBroken,
    PageFailed,
    PageRules,
    PageStatus,
    PageTimeout,
    Snapshot,
    Tab,
)
from .render import Failure, classify
from .variants import VARIANTS

if TYPE_CHECKING:
    from ..api import Claim

HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"
"""Debian's ``chromium-headless-shell``: the old headless mode as a binary of its own (what
Puppeteer runs for ``headless: "shell"``), the same Blink and V8 as ``chromium`` without the
browser's UI layers: the same snapshots for about a quarter of the CPU a render (docs/design.md,
"The headless shell"). The binary itself, not ``/usr/bin/chromium-headless-shell``: that is a
``sh`` script which forks it instead of exec'ing it, so the parent-death signal (``_LAUNCHER``)
would go to the script and a pool killed whole would leave the browser running."""
_SHELL_SCRIPT = "/usr/bin/chromium-headless-shell"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
"""Full Chromium (its launcher script execs the binary): used when the shell is not installed."""
# Chromium's crash handler double-forks into a session of its own, out of the worker's group; it
# exits within a second of its browser's death (it watches its client), which the tests check.
# (--disable-crashpad-for-testing would keep it from starting, but Chromium 150 then aborts
# every navigation.)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-extensions",
                  "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
                  "--disable-dev-shm-usage", "--remote-debugging-port=0")
BLOCKED_TYPES = ("Image", "Media", "Font")
"""CDP resource types never fetched: a snapshot is HTML, and these are most of a page's bytes."""
BLOCKED_HOSTS = ("google-analytics.com", "googletagmanager.com", "doubleclick.net",
                 "googlesyndication.com", "googleadservices.com", "adservice.google.com",
                 "facebook.net", "connect.facebook.net", "hotjar.com", "segment.io",
                 "segment.com", "mixpanel.com", "scorecardresearch.com", "quantserve.com",
                 "criteo.com", "criteo.net", "taboola.com", "outbrain.com", "nr-data.net",
                 "clarity.ms", "amplitude.com", "fullstory.com", "adnxs.com", "bat.bing.com")
"""Analytics and ad hosts (and their subdomains) never fetched: they cost time, count visits
that never happened, and change nothing a crawler should see."""
_LAUNCHER = ("setpriv", "--pdeathsig", "KILL") if shutil.which("setpriv") else ()
"""Chromium gets SIGKILL when its worker dies, however it dies (util-linux's setpriv sets the
parent-death signal, which survives the exec): the supervisor kills the worker's group too, but
a pool whose supervisor and workers are killed at one instant has no supervisor left to."""
START_S = 30.0
"""How long Chromium may take to open its DevTools port."""
RSS_EVERY_S = 1.0
"""How often the browser tree's RSS is measured (psutil walks the tree)."""


class ChromiumMissing(EngineValueError):
    """The Chromium binary to render with does not exist or cannot be run."""


class BrowserFailed(EngineError):
    """Chromium did not start, or died at once."""


@dataclass(frozen=True)
class BrowserSpec:
    """A browser render, as text (picklable, like ``RenderSpec``). Checked when made, in the
    supervisor, so a missing Chromium is refused before any worker starts."""

    store: str | StoreSpec
    """The snapshot store (a directory, or a spec: ``engine.store.open_store`` opens it)."""
    chromium: str | None = None
    """The browser binary; ``None``: the headless shell when installed, else full Chromium."""
    tabs: int = 4
    page_timeout_s: float = 20.0
    recycle_after: int = 500
    rss_limit_mb: int = 2048
    js_heap_mb: int = 512
    keep_scripts: bool = False
    block_types: tuple[str, ...] = BLOCKED_TYPES
    block_hosts: tuple[str, ...] = BLOCKED_HOSTS
    settle_ms: int = 500
    routes: str | None = None
    """The pool's routes (``Routes.to_json``): their rules override the settings above per
    page."""

    def __post_init__(self) -> None:
        for what, v, lo, hi in (("tabs", self.tabs, 1, 64),
                                ("recycle_after", self.recycle_after, 1, 10**9),
                                ("rss_limit_mb", self.rss_limit_mb, 64, 10**6),
                                ("js_heap_mb", self.js_heap_mb, 16, 10**6),
                                ("settle_ms", self.settle_ms, 0, 60_000)):
            if not is_int(v) or not lo <= v <= hi:
                raise EngineValueError(f"{what} must be an int in [{lo}, {hi}], got {v!r}")
        if not is_number(self.page_timeout_s) or not 0.1 <= self.page_timeout_s <= 3600:
            raise EngineValueError(f"page timeout must lie in [0.1, 3600] s, got"
                                   f" {self.page_timeout_s!r}")
        bad = [t for t in self.block_types if t not in RESOURCE_TYPES]
        if bad:
            raise EngineValueError(f"unknown resource type {bad[0]!r} to block (one of"
                                   f" {', '.join(RESOURCE_TYPES)})")
        bad = [h for h in self.block_hosts
               if not isinstance(h, str) or not h or any(c in h for c in "/*: ")]
        if bad:
            raise EngineValueError(f"blocked host {bad[0]!r} is not a host name")
        if not isinstance(self.store, (str, StoreSpec)) or not self.store:
            raise EngineValueError("the browser render needs a snapshot store (--store DIR)")
        object.__setattr__(self, "block_types", tuple(self.block_types))
        object.__setattr__(self, "block_hosts", tuple(h.lower() for h in self.block_hosts))
        if self.routes is not None:
            Routes.from_json(self.routes)  # refused here, in the supervisor, if it is bad
        if self.chromium is None:
            object.__setattr__(self, "chromium", find_chromium())
        check_chromium(self.chromium)

    def classify(self, exc: BaseException) -> Failure:
        """Why a page failed: an HTTP 4xx (but 408, 429) is permanent, the rest transient."""
        return classify(exc)

    def rules(self, route: RouteRules = NO_RULES, variant: str | None = None) -> PageRules:
        """How a page of ``route`` renders as ``variant`` (one of the route's; None: its plain
        URL's, ``variant_rows.plain_variant``): the route's rules where it has them, else the
        pool's. Its headers go on top of ``X-Prerender: 1`` (and may replace it)."""
        if variant is None:
            variant = plain_variant(route.variants)
        given = {k.lower() for k, _ in route.headers}
        headers = [h for h in (PRERENDER_HEADER,) if h[0].lower() not in given]
        return PageRules(
            self.settle_ms,
            self.keep_scripts if route.keep_scripts is None else route.keep_scripts,
            self.block_types if route.block_types is None else route.block_types,
            self.block_hosts if route.block_hosts is None else route.block_hosts,
            route.wait_for, (*headers, *route.headers), route.cookies, route.require,
            None if variant is None else VARIANTS[variant])

    def page_timeout(self, route: RouteRules = NO_RULES) -> float:
        return self.page_timeout_s if route.page_timeout_s is None else route.page_timeout_s


def _runnable(path: object) -> bool:
    return isinstance(path, str) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_chromium() -> str:
    """The browser to render with when none is given: the headless shell when it is installed,
    else full Chromium (checked by ``check_chromium`` like any other path)."""
    return HEADLESS_SHELL if _runnable(HEADLESS_SHELL) else DEFAULT_CHROMIUM


def check_chromium(path: object) -> None:
    """``ChromiumMissing`` unless ``path`` is an executable file."""
    if not _runnable(path):
        raise ChromiumMissing(f"Chromium not found at {path!r} (not an executable file): install"
                              f" it (apt-get install chromium-headless-shell) or give"
                              f" --chromium PATH")


def describe_chromium(path: str) -> str:
    """One line for the pool's start: which browser renders, and the lever when it is not the
    shell."""
    if os.path.realpath(path) == _SHELL_SCRIPT:
        return (f"browser: Chromium's headless shell through {path}, a script that forks it: a"
                f" pool killed whole may leave it running (give --chromium {HEADLESS_SHELL})")
    if os.path.basename(path).startswith("chromium-headless-shell"):
        return f"browser: Chromium's headless shell ({path})"
    hint = (" (chromium-headless-shell is not installed: it renders the same pages for about a"
            " quarter of the CPU)" if path == DEFAULT_CHROMIUM and not _runnable(HEADLESS_SHELL)
            else "")
    return f"browser: {path}{hint}"


def check_selectors(spec: BrowserSpec, routes: Routes) -> None:
    """Refuse, naming the route and its line, a selector of the routes' rules that Chromium
    would reject (``CorpusError``): asked of the browser that will render them, in one blank
    page, before the pool makes anything."""
    asked = [(r, s) for r in routes.routes for s in r.rules.selectors()]
    if not asked:
        return
    errors = asyncio.run(_selector_errors(spec, sorted({s for _, s in asked})))
    for route, selector in asked:
        if selector in errors:
            raise CorpusError(f"{route.place or route.name}: {selector!r} is not a selector"
                              f" Chromium accepts: {errors[selector]}")


async def _selector_errors(spec: BrowserSpec, selectors: list[str]) -> dict[str, str]:
    chromium = Chromium(spec)
    try:
        await chromium.start()
        cdp = chromium.cdp
        assert cdp is not None
        target = (await cdp.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await cdp.call("Target.attachToTarget", {"targetId": target,
                                                             "flatten": True}))["sessionId"]
        errors = {}
        for selector in selectors:
            got = await cdp.call("Runtime.evaluate", {
                "expression": f"document.querySelector({json.dumps(selector)}), 0"}, session)
            if "exceptionDetails" in got:
                text = got["exceptionDetails"].get("exception", {}).get("description", "")
                errors[selector] = text.split("\n")[0] or "refused"
        return errors
    finally:
        await chromium.close()


# -- the browser process -----------------------------------------------------------------------


class Chromium:
    """One headless Chromium in this process's group, with its own profile directory."""

    def __init__(self, spec: BrowserSpec) -> None:
        self.spec = spec
        self.profile = tempfile.mkdtemp(prefix="lanes-chromium-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.cdp: Cdp | None = None
        self.renders = 0  # pages started in this browser
        self.user_agent = ""  # the browser's own, as it would send it
        self._rss_at = 0.0
        self._rss_mb = 0.0

    async def start(self) -> Chromium:
        assert self.spec.chromium is not None  # resolved when the spec was made
        argv = [*_LAUNCHER, self.spec.chromium, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                f"--js-flags=--max-old-space-size={self.spec.js_heap_mb}", "about:blank"]
        # A preload meant for this interpreter (the sanitized core's ASan runtime) is not the
        # browser's: it would load into every Chromium process.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + START_S
        while True:
            if self.proc.poll() is not None:
                raise BrowserFailed(f"{self.spec.chromium} exited {self.proc.returncode} at"
                                    " start")
            with contextlib.suppress(OSError, ValueError):
                port, path = open(port_file).read().split("\n")[:2]
                if port and path:
                    break
            if time.monotonic() > deadline:
                raise BrowserFailed(f"{self.spec.chromium} opened no DevTools port in"
                                    f" {START_S:g} s")
            await asyncio.sleep(0.02)
        self.cdp = await Cdp.connect(f"ws://127.0.0.1:{int(port)}{path.strip()}")
        self.user_agent = (await self.cdp.call("Browser.getVersion"))["userAgent"]
        return self

    def rss_mb(self, fresh: bool = False) -> float:
        """The RSS of the browser's process tree, in MiB (measured at most every second)."""
        now = time.monotonic()
        if self.proc is None or (not fresh and now - self._rss_at < RSS_EVERY_S):
            return self._rss_mb
        total = 0
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
        self._rss_at, self._rss_mb = now, total / 2**20
        return self._rss_mb

    def worn_out(self) -> bool:
        return (self.renders >= self.spec.recycle_after
                or self.rss_mb() > self.spec.rss_limit_mb)

    async def close(self) -> None:
        """Ask the browser to quit, then kill whatever of its tree is left; remove its profile."""
        tree: list[psutil.Process] = []
        if self.proc is not None:
            with contextlib.suppress(psutil.Error):
                tree = psutil.Process(self.proc.pid).children(recursive=True)
        if self.cdp is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cdp.call("Browser.close"), 2.0)
            await self.cdp.close()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.proc.wait, 3.0)
            self.proc.kill()
            self.proc.wait()
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# -- the tabs of a worker ----------------------------------------------------------------------


@dataclass
class _Job:
    claim: Claim
    url: str
    started: Any  # the worker's note of the render's start
    ticket: Any  # the host gate's ticket, or None


class ClaimSpec(Protocol):
    """The worker's claim settings the tabs read."""

    @property
    def batch(self) -> int: ...
    @property
    def idle_s(self) -> float: ...


class TabWorker(Protocol):
    """What the tabs ask of their worker (``engine.pool.worker.Worker``, which calls
    :func:`run_tabs`): claims, the host gate, and the accounting of each render. ``begin``'s
    value is the worker's own, handed back to ``account``."""

    @property
    def spec(self) -> ClaimSpec: ...
    def leaving(self) -> bool: ...
    def claim(self, budget: int) -> tuple[list[Claim], list[str]]: ...
    def enter_gate(self, url: str) -> Any: ...
    def leave_gate(self, ticket: Any) -> None: ...
    def begin(self, c: Claim) -> Any: ...
    def account(self, c: Claim, url: str, started: Any, exc: BaseException | None) -> bool: ...
    def give_back(self, rows: list[int], at_stop: bool = False) -> None: ...
    def complete(self, done: list[int]) -> None: ...


def run_tabs(worker: TabWorker, spec: BrowserSpec) -> None:
    """A worker's loop with the browser render (until the worker is leaving)."""
    asyncio.run(_Tabs(worker, spec).run())


class _Tabs:
    """Up to ``tabs`` renders in flight in one browser; claims as tabs free up."""

    def __init__(self, worker: TabWorker, spec: BrowserSpec) -> None:
        self.worker, self.spec = worker, spec
        self.routes = None if spec.routes is None else Routes.from_json(spec.routes)
        self.page_rules: dict[tuple[RouteRules, str | None], PageRules] = {}
        self.jobs: dict[asyncio.Task[Snapshot], _Job] = {}
        self.browser: Chromium | None = None

    async def run(self) -> None:
        from ..store import open_store

        self.store = open_store(self.spec.store)
        try:
            await self._loop()
        finally:
            for task in self.jobs:
                task.cancel()
            await asyncio.gather(*self.jobs, return_exceptions=True)
            for job in self.jobs.values():
                self.worker.leave_gate(job.ticket)
            if self.browser is not None:
                await self.browser.close()
            self.store.close()

    async def _loop(self) -> None:
        w = self.worker
        while True:
            leaving = w.leaving()
            if leaving and not self.jobs:
                return
            if self.browser is not None and not self.jobs and (
                    self.browser.worn_out() or self.browser.cdp is None
                    or self.browser.cdp.closed):
                await self.browser.close()  # drained: recycle
                self.browser = None
            if not leaving and (self.browser is None or not self.browser.worn_out()):
                await self._fill()
            if not self.jobs:
                await asyncio.sleep(w.spec.idle_s)
                continue
            done, _ = await asyncio.wait(self.jobs, timeout=RSS_EVERY_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            rendered = [self._finish(task) for task in done]
            w.complete([row for row in rendered if row is not None])

    async def _fill(self) -> None:
        free = self.spec.tabs - len(self.jobs)
        if free <= 0:
            return
        batch, urls = self.worker.claim(min(free, self.worker.spec.batch))
        if not len(batch):
            return
        if self.browser is None:
            self.browser = await Chromium(self.spec).start()
        later = []
        for c, url in zip(batch, urls, strict=True):
            ticket = self.worker.enter_gate(url)
            if ticket is False:
                later.append(c.row)
                continue
            self.browser.renders += 1
            job = _Job(c, url, self.worker.begin(c), ticket)
            self.jobs[asyncio.get_running_loop().create_task(self._render(job))] = job
        self.worker.give_back(later)

    def _rules(self, route: RouteRules, variant: str | None) -> PageRules:
        """The page rules of a route's pages as one variant, made once per pair."""
        if (route, variant) not in self.page_rules:
            self.page_rules[route, variant] = self.spec.rules(route, variant)
        return self.page_rules[route, variant]

    async def _render(self, job: _Job) -> Snapshot:
        """Render the row ``job`` claimed: its URL, as the variant its key names (a plain URL:
        its route's first, ``variant_rows``)."""
        assert self.browser is not None and self.browser.cdp is not None
        url, variant = variant_rows.split(job.url)
        route = NO_RULES if self.routes is None else self.routes.rules_for(url)
        tab = Tab(self.browser.cdp, self._rules(route, variant), self.browser.user_agent)
        timeout = self.spec.page_timeout(route)
        try:
            snap = await asyncio.wait_for(tab.render(url), timeout)
        except TimeoutError:
            await self._dispose(tab, keep_error=True)
            raise PageTimeout(tab.why_not_ready(timeout)) from None
        except BaseException:
            await self._dispose(tab, keep_error=True)
            raise
        await self._dispose(tab, keep_error=False)
        return snap

    async def _dispose(self, tab: Tab, keep_error: bool) -> None:
        """Close a tab's context; a browser that cannot is replaced once drained. A render that
        failed already keeps its own reason (``keep_error``)."""
        assert self.browser is not None
        try:
            await tab.dispose()
        except BrowserBroken:
            self.browser.renders = self.spec.recycle_after
            if not keep_error:
                raise

    def _finish(self, task: asyncio.Task[Snapshot]) -> int | None:
        """Store a finished render and account for it; its row if it is to be completed."""
        job = self.jobs.pop(task)
        self.worker.leave_gate(job.ticket)
        exc: BaseException | None = task.exception()
        if exc is None:
            try:
                self._store(job, task.result())
            except EngineError as e:
                exc = e
        if isinstance(exc, BrowserBroken) and self.browser is not None:
            self.browser.renders = self.spec.recycle_after
        if exc is not None and not isinstance(exc, (PageFailed, EngineError)):
            raise exc  # a bug here, not a page's fault
        return job.claim.row if self.worker.account(job.claim, job.url, job.started, exc) \
            else None

    def _store(self, job: _Job, snap: Snapshot) -> None:
        """Write the snapshot (a 4xx's too, to be served with its status); a 4xx or 5xx is then
        raised as the render's failure."""
        status = snap.status
        if status < 500:
            took_ms = (time.perf_counter() - job.started.t0) * 1000
            # An unchanged page rewrites nothing; the store counts it ("unchanged").
            self.store.put(job.url, snap.html, status=status, location=snap.location,
                           interval_s=job.started.interval_s, lane=job.claim.lane,
                           render_ms=took_ms)
        if status >= 400:
            raise PageStatus(f"HTTP {status}" + (" (snapshot kept)" if status < 500 else ""),
                             status)
