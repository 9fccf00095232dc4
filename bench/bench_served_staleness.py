"""Served and snapshot age ÷ TTL per lane and per route class, in a capacity-deficit run on real
renders, beside the simulator's prediction for the same corpus and capacity.

    .venv/bin/python bench/bench_served_staleness.py [--smoke] [--longest S] [--deficit X]
        [--windows N] [--rate R] [--out F]

1. **Capacity.** ``lanes pool --browser --workers 2 --tabs 4`` renders a pile of fresh pages of
   the local site (tests/lib/render_site.py, ``/slow/N``: content inserted by a 300 ms timer)
   into a fresh store; renders per second after the first wave (bench_browser's measure).
2. **The corpus**, sized from it: the simulator's default corpus (``engine.sim.DEFAULT_CLASSES``:
   homepages, catalog, products submitted, pages discovered by crawlers) with each class's share
   of the demand kept and its interval scaled into seconds (home L/8, catalog 3L/8, product and
   discovery L, L = ``--longest``), rows chosen so that the demand (sum of 1/interval) is
   ``--deficit`` times the capacity just measured. A routes file names the classes.
3. **The deficit run.** The same pool (``--routes``, lane policy ``LanePolicy()``) renders the
   corpus into a store while ``lanes serve --store DIR`` answers a client asking for snapshots
   at ``--rate`` requests/s, Poisson arrivals (so the hits sample time uniformly), weighted by
   class: a class uniformly, then a URL of it uniformly, so every class gets a quarter of the
   hits. A warm-up of ``--warmup`` longest intervals, then ``--windows`` windows of
   ``--window`` longest intervals each, measured apart.
4. **Per window**, from the store (``engine.report.staleness``' figures): every snapshot's age ÷
   interval, sampled every 2 s (p50 / p95 / max); the served age ÷ interval of the window's hits
   in the hit log; each render's age at render (time since the URL's previous render, as the
   simulator measures it), found by watching every URL's rendered-at; the render rate.
5. **The simulator** (``engine.sim``, policy ``default`` = ``LanePolicy()``) on the same rows,
   intervals and provenance, at capacity = the window's render rate ÷ demand, rescheduling as
   the pool does (``completion``: due = completion + interval), no failures, no rushes, ticks of
   1 s and renders of the pool's mean render time. Its figure is the mean age ÷ TTL at render.

How the two figures relate. A page rendered at t0 < t1 < ... with gaps G_j = t_j - t_(j-1)
holds, at a hit at time t inside gap j, a snapshot of age t - t_(j-1). Hits arriving as a
Poisson process independent of the renders see time uniformly (PASTA): gap j is hit in
proportion to its length G_j, and inside it the age is uniform on [0, G_j). So the mean served
age is  sum(G_j^2 / 2) / sum(G_j) = E[G^2] / (2 E[G]) = E[G] (1 + CV^2) / 2,  with E over the
renders and CV the gaps' coefficient of variation. The age at render is G_j itself, so

    mean served age ÷ TTL = (mean age at render ÷ TTL) x (1 + CV^2) / 2,

exactly half on a steady cadence (CV = 0), more when gaps vary. The snapshot reading is the same
backward age sampled at fixed times instead of at hits, so its mean is the same; with constant
gaps its p50 is half the age at render and its p95 0.95 of it. ``lanes serve`` checks the store
at most once a second, so a new render is served up to a second late: that adds about half a
second to every served age (0.025 of a 20 s interval). The script checks the identity against
the run's own gaps (``E[G^2]/(2 E[G] T)`` beside the served mean) and sets the simulator's mean
÷ 2 beside the served mean.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import ROOT, figure, finish, parse_args

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from bench_browser import lanes_rate  # noqa: E402
from browser_testlib import MARK, PoolRun, marked  # noqa: E402
from render_site import SiteServer  # noqa: E402

from engine import LanePolicy  # noqa: E402
from engine.checks import wall_ms  # noqa: E402
from engine.report.staleness import figures  # noqa: E402
from engine.sim import DEFAULT_CLASSES, load_config, policy_spec, run_many  # noqa: E402
from engine.store import SnapshotStore  # noqa: E402

FULL = {"longest": 160, "warmup": 3.0, "window": 2.0, "windows": 3, "rate": 20.0,
        "capacity_pages": 80}
SMOKE = {"longest": 16, "warmup": 1.0, "window": 1.0, "windows": 1, "rate": 20.0,
         "capacity_pages": 24}
SCALE = {"home": 1 / 8, "catalog": 3 / 8, "product": 1.0, "discovery": 1.0}
"""Each class's interval as a fraction of the longest (the product's 1 h, 6-12 h, 48 h, 48 h
squeezed into one order of magnitude, so a few minutes reach a steady state)."""
SAMPLE_S = 2.0
MIN_ROWS = 3
"""A class has at least this many URLs (a site has a few homepages, not one)."""
DELAY_MS = 300


@dataclass(frozen=True)
class ScaledClass:
    """A route class of the run: ``rows`` URLs of one interval (seconds) and provenance."""

    name: str
    rows: int
    interval_s: int
    provenance: str

    @property
    def demand(self) -> float:
        return self.rows / self.interval_s


def size_corpus(capacity: float, deficit: float, longest: int) -> list[ScaledClass]:
    """The default corpus's classes at ``deficit`` x ``capacity`` renders/s, each keeping its
    share of the default corpus's demand."""
    demand = {c.name: c.demand_per_h() for c in DEFAULT_CLASSES}
    total = sum(demand.values())
    out = []
    for c in DEFAULT_CLASSES:
        iv = max(1, round(longest * SCALE[c.name]))
        rows = max(MIN_ROWS, round(demand[c.name] / total * deficit * capacity * iv))
        out.append(ScaledClass(c.name, rows, iv, c.provenance))
    return out


def write_inputs(tmp: Path, site: SiteServer, classes: list[ScaledClass]
                 ) -> tuple[Path, Path, dict[str, list[str]]]:
    """The pool's corpus CSV and routes TOML, and the URLs of each class (``/slow/N?class``:
    every class renders the same 300 ms page)."""
    urls: dict[str, list[str]] = {}
    n = 0
    for k in classes:
        urls[k.name] = [site.url(f"/slow/{n + i}?{k.name}") for i in range(k.rows)]
        n += k.rows
    corpus = tmp / "corpus.csv"
    with corpus.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["url", "interval_s", "provenance"])
        for k in classes:
            w.writerows([u, k.interval_s, k.provenance] for u in urls[k.name])
    routes = tmp / "routes.toml"
    routes.write_text("".join(
        f'[[route]]\nname = "{k.name}"\nmatch = "{site.url("/slow/")}*[?]{k.name}"\n'
        f'interval = {k.interval_s}\nprovenance = "{k.provenance}"\n\n' for k in classes))
    return corpus, routes, urls


# -- the client ---------------------------------------------------------------------------------


class Client:
    """Asks ``lanes serve`` for snapshots at ``rate`` per second, Poisson arrivals, a class
    uniformly then a URL of it uniformly; in a thread of its own, until stopped."""

    def __init__(self, base: str, urls: dict[str, list[str]], rate: float, seed: int = 5) -> None:
        self.base, self.urls, self.rate = base, urls, rate
        self.rng = random.Random(seed)
        self.status: dict[int, int] = defaultdict(int)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True,
                                        name="staleness-client")

    def start(self) -> Client:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        import aiohttp

        classes = list(self.urls)
        tasks: set[asyncio.Task[None]] = set()
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            next_at = time.monotonic()
            while not self._stop.is_set():
                next_at += self.rng.expovariate(self.rate)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                url = self.rng.choice(self.urls[self.rng.choice(classes)])
                if len(tasks) < 64:  # a server that cannot keep up is not queued for ever
                    task = asyncio.create_task(self._ask(http, url))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _ask(self, http: Any, url: str) -> None:
        q = urllib.parse.quote(url, safe="")
        try:
            async with http.get(f"{self.base}/render?url={q}") as r:
                await r.read()
                self.status[r.status] += 1
        except Exception:  # noqa: BLE001 - counted, the run goes on
            self.errors += 1


# -- lanes serve --------------------------------------------------------------------------------


class Serve:
    """``lanes serve --store DIR`` on a free port, its output in a file (never a full pipe),
    marked like the pool's processes so that none is left behind."""

    def __init__(self, store: Path, tmp: Path) -> None:
        self.mark = uuid.uuid4().hex
        self.log = tmp / "serve.out"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "engine", "serve", "--store", str(store), "--port", "0"],
                stdout=out, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, MARK: self.mark})
        self.base = self._address()

    def _address(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            first = self.log.read_text().partition("\n")[0]
            if first.startswith("lanes serve:") and first.endswith("/"):
                return first.split()[-1].rstrip("/")
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"lanes serve did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in marked(self.mark):
            p.kill()


# -- reading the store --------------------------------------------------------------------------


def reading(values: list[float] | np.ndarray) -> dict[str, Any]:
    """p50 / p95 / max (``engine.report.staleness.figures``) and the mean."""
    a = np.asarray(values, dtype=np.float64)
    return {**figures(a), "mean": round(float(a.mean()), 4) if len(a) else None}


@dataclass
class Watcher:
    """Watches every URL's rendered-at in the store: each change is a render, whose age at
    render is the time since the URL's previous one; every ``SAMPLE_S`` it also samples every
    snapshot's age ÷ interval."""

    store: SnapshotStore
    class_of: dict[str, str]
    policy: LanePolicy = field(default_factory=LanePolicy)
    last: dict[str, int] = field(default_factory=dict)
    renders: list[tuple[int, str, str, int, int]] = field(default_factory=list)
    """(rendered at, class, lane name, gap ms (0: the URL's first render), interval s)"""
    samples: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    """(sampled at, class of each snapshot, lane of each, age ÷ interval of each)"""
    url_of: dict[int, str] = field(default_factory=dict)

    def poll(self) -> None:
        now = wall_ms()
        rows = self.store.ages()
        classes, lanes, ratios = [], [], []
        for url, lane, at, interval_s in rows:
            k, name = self.class_of[url], self.policy.lane_name(lane)
            prev = self.last.get(url)
            if prev != at:
                self.renders.append((at, k, name, 0 if prev is None else at - prev, interval_s))
                self.last[url] = at
            classes.append(k)
            lanes.append(name)
            ratios.append(max(0, now - at) / 1000 / interval_s)
        self.samples.append((now, np.array(classes), np.array(lanes), np.array(ratios)))

    def run_until(self, end_ms: int, pool: PoolRun) -> None:
        while True:
            if pool.proc.poll() is not None:
                raise RuntimeError(f"the pool exited {pool.proc.returncode}:"
                                   f" {pool.stderr()[-3000:]}")
            self.poll()
            left = (end_ms - wall_ms()) / 1000
            if left <= 0:
                return
            time.sleep(min(SAMPLE_S, left))

    def window(self, start: int, end: int) -> dict[str, Any]:
        """Every reading of the window ``[start, end)``, per class and per lane; the hits are
        read now (call it at ``end``), those since ``start``."""
        ids, hit_lanes, hit_ratio, served = self.store.hit_ratios(start)
        for i, url in self.store.urls_after(max(self.url_of, default=0)):
            self.url_of[i] = url
        hit_class = [self.class_of[self.url_of[int(i)]] for i in ids]
        hit_lane = [self.policy.lane_name(int(ln)) for ln in hit_lanes]
        snaps = [s for s in self.samples if start <= s[0] < end]
        renders = [r for r in self.renders if start <= r[0] < end and r[3]]
        out: dict[str, Any] = {"seconds": (end - start) / 1000, "renders": len(
            [r for r in self.renders if start <= r[0] < end]), "hits": int(served.sum()),
            "refused": int((~served).sum()), "unrendered": len(self.class_of) - len(self.last)}
        for axis, pick, hit_keys in (("classes", 1, hit_class), ("lanes", 2, hit_lane)):
            groups = {}
            for key in dict.fromkeys([*(r[pick] for r in renders), *hit_keys]):
                snap = [sample[3][sample[pick] == key] for sample in snaps]
                hits = hit_ratio[(np.array(hit_keys) == key) & served] if len(ids) else []
                groups[key] = _group([r for r in renders if r[pick] == key],
                                     np.concatenate(snap) if snap else [], hits)
            out[axis] = groups
        return out


def _group(renders: list[tuple[int, str, str, int, int]], snapshot: Any, hits: Any
           ) -> dict[str, Any]:
    """One class's or lane's readings in a window: its renders' mean age at render ÷ interval,
    the served mean those gaps imply, and the snapshot and served readings."""
    g = np.array([r[3] / 1000 / r[4] for r in renders])  # age at render ÷ interval
    return {"renders": len(renders),
            "render_age": round(float(g.mean()), 4) if len(g) else None,
            # E[G^2] / (2 E[G]), in intervals: the served mean these gaps imply
            "renewal": round(float((g ** 2).sum() / (2 * g.sum())), 4) if len(g) else None,
            "snapshot": reading(snapshot), "served": reading(hits)}


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Plan:
    longest: int
    warmup_s: float
    window_s: float
    windows: int
    rate: float


def deficit_run(site: SiteServer, tmp: Path, classes: list[ScaledClass], plan: Plan
                ) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """The pool, the server and the client on the corpus; every window's readings, the mean
    render time (s) of the snapshots at the end, and what the client got."""
    corpus, routes, urls = write_inputs(tmp, site, classes)
    class_of = {u: k for k, us in urls.items() for u in us}
    store_dir = tmp / "store"
    name = f"bench-staleness-{uuid.uuid4().hex[:8]}"
    with PoolRun(name, corpus, store_dir, "--tabs", "4", "--routes", str(routes),
                 workers=2) as pool:
        pool.wait_until(lambda: (store_dir / "store.sqlite").exists(), 120)
        t0 = wall_ms()
        serve = Serve(store_dir, tmp)
        client = Client(serve.base, urls, plan.rate).start()
        store = SnapshotStore.open(store_dir, create=False)
        try:
            watcher = Watcher(store, class_of)
            edges = [t0 + int(1000 * (plan.warmup_s + i * plan.window_s))
                     for i in range(plan.windows + 1)]
            watcher.run_until(edges[0], pool)
            print(f"  warm-up done: {len(watcher.last)} of {len(class_of)} URLs rendered,"
                  f" {len(watcher.renders)} renders", flush=True)
            windows = []
            for start, end in itertools.pairwise(edges):
                watcher.run_until(end, pool)
                windows.append(watcher.window(start, end))
                w = windows[-1]
                print(f"  window {len(windows)}: {w['renders'] / w['seconds']:.2f} renders/s,"
                      f" {w['hits']} hits ({w['refused']} refused), {w['unrendered']} URLs"
                      " not rendered yet", flush=True)
            render_s = statistics.mean(s.render_ms / 1000 for u in class_of
                                       if (s := store.get(u)) is not None)
        finally:
            client.stop()
            serve.stop()
            store.close()
        if pool.stop() != 0:
            raise RuntimeError(f"the pool did not stop cleanly: {pool.stderr()[-3000:]}")
        left = pool.left_behind()
    if left:
        raise RuntimeError(f"the pool left {len(left)} process(es) behind: {left}")
    return windows, render_s, {"status": dict(client.status), "errors": client.errors}


def sim_config_text(classes: list[ScaledClass], plan: Plan, render_s: float) -> str:
    """The simulator's corpus file: the same rows, intervals and provenance, the pool's way of
    rescheduling, no failures and no rushes, the run's windows."""
    head = (f"tick_s = 1\nrender_s = {max(1, round(render_s))}\nfail_rate = 0.0\n"
            f"broken_fraction = 0.0\nrush_every_h = 0.0\nrush_rows = 0\n"
            f'reschedule = "completion"\nclaimers = [4, 4]\n'
            f"backlog_h = {plan.longest / 3600!r}\nwarmup_h = {plan.warmup_s / 3600!r}\n"
            f"measure_h = {plan.window_s / 3600!r}\n\n")
    return head + "".join(
        f'[[classes]]\nname = "{k.name}"\nrows = {k.rows}\ninterval_h = {k.interval_s / 3600!r}'
        f'\nprovenance = "{k.provenance}"\n\n' for k in classes)


def predict(path: Path, capacities: list[float]) -> list[dict[str, float | None]]:
    """The simulator's mean age ÷ TTL at render per class, at each capacity (policy default:
    ``LanePolicy()``), as ``lanes sim --corpus FILE --policies default --capacities ...``."""
    config = load_config(str(path))
    results = run_many(config, [policy_spec("default", config)], capacities)
    return [{k: c.mean_age_over_ttl for k, c in r.classes.items()} for r in results]


# -- the report ---------------------------------------------------------------------------------


def _cell(values: list[float | None], digits: int = 2) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    mid = f"{statistics.median(got):.{digits}f}"
    if len(got) == 1 or min(got) == max(got):
        return mid
    return f"{mid} [{min(got):.{digits}f}-{max(got):.{digits}f}]"


def _class_rows(classes: list[ScaledClass], windows: list[dict[str, Any]],
                sims: list[dict[str, float | None]]) -> list[list[str]]:
    rows = []
    for k in classes:
        per = [w["classes"].get(k.name, {}) for w in windows]
        real = [g.get("render_age") for g in per]
        sim = [s.get(k.name) for s in sims]
        served = [g["served"]["mean"] if g else None for g in per]
        rows.append([
            f"{k.name} ({k.interval_s} s, {k.rows})",
            _cell([(r - 1) * k.interval_s if r else None for r in real], 1), _cell(real),
            _cell(sim),
            _cell([r / s if r and s else None for r, s in zip(real, sim, strict=True)]),
            _cell(served), _cell([s / 2 if s else None for s in sim]),
            _cell([g.get("renewal") for g in per]),
            _cell([v / r if v and r else None for v, r in zip(served, real, strict=True)]),
            " / ".join(_cell([g["served"][q] if g else None for g in per]) for q in
                       ("p50", "p95", "max")),
            " / ".join(_cell([g["snapshot"][q] if g else None for g in per]) for q in
                       ("p50", "p95", "max"))])
    return rows


def _lane_rows(windows: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for lane in dict.fromkeys(k for w in windows for k in w["lanes"]):
        per = [w["lanes"].get(lane) for w in windows]
        rows.append([lane, _cell([g["render_age"] if g else None for g in per]),
                     _cell([g["served"]["mean"] if g else None for g in per]),
                     " / ".join(_cell([g["served"][q] if g else None for g in per])
                                for q in ("p50", "p95", "max")),
                     " / ".join(_cell([g["snapshot"][q] if g else None for g in per])
                                for q in ("p50", "p95", "max")),
                     _cell([float(g["served"]["count"]) if g else None for g in per], 0)])
    return rows


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip()
             for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(classes: list[ScaledClass], windows: list[dict[str, Any]],
           sims: list[dict[str, float | None]]) -> str:
    by_class = table(["class (interval, rows)", "lag s", "age at render: real", "sim",
                      "real/sim",
                      "served mean", "sim/2", "from gaps", "served/render",
                      "served p50 / p95 / max", "snapshot p50 / p95 / max"],
                     _class_rows(classes, windows, sims))
    by_lane = table(["lane", "age at render", "served mean", "served p50 / p95 / max",
                     "snapshot p50 / p95 / max", "hits"], _lane_rows(windows))
    return (f"age ÷ TTL per route class; median [range] over {len(windows)} window(s)\n"
            f"{by_class}\n\nper lane (LanePolicy(): every interval here is under its first"
            f" band, 1 h)\n{by_lane}")


def make_figures(classes: list[ScaledClass], windows: list[dict[str, Any]],
                 sims: list[dict[str, float | None]], capacity: float,
                 demand: float) -> list[dict[str, Any]]:
    rates = [w["renders"] / w["seconds"] for w in windows]
    out = [figure("staleness.capacity", "capacity: lanes pool --browser, 2 workers x 4 tabs",
                  "renders/s", [capacity], "higher"),
           figure("staleness.run_rate", "renders/s in the deficit run", "renders/s", rates,
                  "higher"),
           figure("staleness.capacity_fraction", "render rate ÷ demand (the sim's capacity)",
                  "x", [r / demand for r in rates], "higher", note="corpus: " + ", ".join(
                      f"{k.name} {k.rows} x {k.interval_s} s {k.provenance}" for k in classes))]
    for k in classes:
        per = [w["classes"].get(k.name) for w in windows]
        series = {
            "render_age_real": [g["render_age"] if g else None for g in per],
            "render_age_sim": [s.get(k.name) for s in sims],
            "served_mean": [g["served"]["mean"] if g else None for g in per],
            "served_p50": [g["served"]["p50"] if g else None for g in per],
            "served_p95": [g["served"]["p95"] if g else None for g in per],
            "snapshot_p50": [g["snapshot"]["p50"] if g else None for g in per],
            "snapshot_p95": [g["snapshot"]["p95"] if g else None for g in per],
            "snapshot_max": [g["snapshot"]["max"] if g else None for g in per]}
        series["real_over_sim"] = [r / s if r and s else None for r, s in zip(
            series["render_age_real"], series["render_age_sim"], strict=True)]
        series["served_over_render"] = [v / r if v and r else None for v, r in zip(
            series["served_mean"], series["render_age_real"], strict=True)]
        for key, vals in series.items():
            got = [v for v in vals if v is not None]
            if got:
                out.append(figure(f"staleness.{k.name}.{key}", f"{k.name}: {key.replace('_', ' ')}"
                                  " (÷ TTL)", "x", got))
    return out


def _options(ap: Any) -> None:
    ap.add_argument("--longest", type=int, help="the longest interval, s (default 160)")
    ap.add_argument("--deficit", type=float, default=1.75,
                    help="demand ÷ the measured capacity (default 1.75)")
    ap.add_argument("--warmup", type=float, help="warm-up, in longest intervals (default 3)")
    ap.add_argument("--window", type=float, help="each window, in longest intervals (default 2)")
    ap.add_argument("--windows", type=int, help="windows measured (default 3)")
    ap.add_argument("--rate", type=float, help="client requests/s (default 20)")


def main() -> None:
    started = time.perf_counter()
    args = parse_args(__doc__, _options)
    base = SMOKE if args.smoke else FULL
    pick = {k: base[k] if getattr(args, k, None) is None else getattr(args, k) for k in base
            if k != "capacity_pages"}
    plan = Plan(int(pick["longest"]), pick["warmup"] * pick["longest"],
                pick["window"] * pick["longest"], int(pick["windows"]), float(pick["rate"]))
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-staleness-"))
    try:
        with SiteServer(delay_ms=DELAY_MS) as site:
            pages = [site.url(f"/slow/{n}?capacity") for n in range(int(base["capacity_pages"]))]
            capacity = lanes_rate(site, pages, tmp)
            classes = size_corpus(capacity, args.deficit, plan.longest)
            demand = sum(k.demand for k in classes)
            print(f"capacity {capacity:.2f} renders/s; corpus {sum(k.rows for k in classes)}"
                  f" rows, demand {demand:.2f} renders/s ({demand / capacity:.2f}x):"
                  + ", ".join(f" {k.name} {k.rows} x {k.interval_s} s" for k in classes)
                  + f"; warm-up {plan.warmup_s:g} s, {plan.windows} x {plan.window_s:g} s",
                  flush=True)
            windows, render_s, client = deficit_run(site, tmp, classes, plan)
        sim_path = tmp / "sim.toml"
        sim_path.write_text(sim_config_text(classes, plan, render_s))
        caps = [w["renders"] / w["seconds"] / demand for w in windows]
        sims = predict(sim_path, caps)
        print(f"client: {client}; mean render {render_s:.2f} s; the simulator's corpus"
              f" (lanes sim --corpus FILE --policies default --capacities"
              f" {','.join(f'{c:.3f}' for c in caps)}):\n{sim_path.read_text()}")
        print(report(classes, windows, sims))
        figures = make_figures(classes, windows, sims, capacity, demand)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish("bench_served_staleness", args, figures, started)


if __name__ == "__main__":
    main()
