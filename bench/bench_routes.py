"""Rules per route, measured through ``lanes pool --browser --routes`` on the browser tests' site
(tests/lib/render_site.py), the render's default binary, 2 workers × 4 tabs.

* **The content check.** ``/product/N`` pages take their price from an API call inside the
  page; one page in ten (N divisible by 10) has that call answer 500, and stays a "Loading…"
  shell. The same pages are rendered twice in one repetition, by a pool whose route requires
  ``#price`` and no "Loading…" and by one with no rule: the share of broken pages kept out of
  the store by the check (expected 100 %), the share the pool without it stores (what the check
  is for), and renders per second of each (snapshots stored per second: a failed check is not
  counted, so the ratio slightly overstates what the check costs).

* **Variants.** The same fresh ``/js/N`` pages (a fetch and a timer, JSON-LD) rendered by a
  pool whose route says ``variants = ["desktop"]`` and by one that says ``["mobile"]`` (a
  Nexus 5X: 412 × 732 at 2.625, touch), in alternating order: renders per second of each and
  the cost of a mobile render ÷ a desktop one (desktop renders/s ÷ mobile renders/s, per
  repetition), plus the CPU-seconds per render of each pool's whole process tree.
* **Two variants** (``--only two``): the same fresh ``/js/N`` pages rendered by a pool whose
  route says ``variants = ["desktop", "mobile"]`` (two rows, two renders a page) and by one
  that says ``["desktop"]``, alternating: renders per second of each (snapshots stored, both
  variants counted) and their ratio, two ÷ one, per repetition.
* **The marks** (``--before TREE``, a checkout of the code before them, e.g. ``git archive
  main``): every render now carries a marked User-Agent and ``X-Prerender: 1`` on its document
  request (one more DevTools round trip a page); renders/s of this tree ÷ that tree's, routes
  without rules, same pages, alternating.

Each repetition uses fresh URLs (a query string), so nothing is cached; medians and ranges over
``--reps``. The machine may be shared: the ratios are from runs side by side.

    .venv/bin/python bench/bench_routes.py [--smoke] [--pages N] [--reps R] [--before TREE]
        [--out F]
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import ROOT, figure, finish, parse_args, ratios

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from browser_testlib import stored, write_corpus  # noqa: E402
from render_site import SiteServer  # noqa: E402

WORKERS, TABS = 2, 4
BROKEN_EVERY = 10
CHECK = 'require = { selectors = ["#price"], absent = ["Loading…"] }\n'


def pool_run(site: SiteServer, urls: list[str], tmp: Path, route: str, done: Any,
             tree: Path | None = None, keys: list[str] | None = None
             ) -> tuple[float, dict[str, Any], str]:
    """Run a pool over ``urls`` with one route (``route``: its rule lines) until ``done(store,
    stderr)``; renders/s after the first wave, the snapshots and the pool's stderr. ``tree``:
    run that checkout's code instead of this one's (with this tree's built core). ``keys``:
    the snapshots to look for (default ``urls``; a variant's ``URL mobile`` too)."""
    keys = urls if keys is None else keys
    store = tmp / f"store-{uuid.uuid4().hex[:6]}"
    routes = tmp / f"routes-{uuid.uuid4().hex[:6]}.toml"
    routes.write_text(f'[[route]]\nname = "site"\nmatch = "{site.url()}/*"\ninterval = "1d"\n'
                      f"{route}")
    name = f"bench-routes-{uuid.uuid4().hex[:8]}"
    err = tmp / f"{name}.err"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with open(err, "w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "pool", name, "--browser", "--store", str(store),
             "--corpus", str(write_corpus(tmp / "c.csv", urls)), "--routes", str(routes),
             "--workers", str(WORKERS), "--tabs", str(TABS), "--plain"],
            stdout=subprocess.DEVNULL, stderr=errf, text=True, env=env, cwd=tree or ROOT)
        t0 = time.monotonic()
        try:
            while not done(stored(store, keys), err.read_text()):
                if proc.poll() is not None or time.monotonic() > t0 + 60 + 2 * len(urls):
                    raise RuntimeError(f"lanes pool stopped or stalled: "
                                       f"{err.read_text()[-2000:]}")
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    snaps = stored(store, keys)
    ends = sorted(s.rendered_at_ms for s in snaps.values())
    first = WORKERS * TABS  # the first wave is the browsers' warm-up
    rate = (len(ends) - first) / max(1e-3, (ends[-1] - ends[first - 1]) / 1000)
    return rate, snaps, err.read_text()


def content_check(site: SiteServer, tmp: Path, pages: int, rep: int) -> dict[str, float]:
    def urls(tag: str) -> list[str]:
        return [site.url(f"/product/{n}?{tag}{rep}") for n in range(1, pages + 1)]

    site.broken_prices.update(n for n in range(1, pages + 1) if n % BROKEN_EVERY == 0)
    out: dict[str, float] = {}
    for tag, route in (("c", CHECK), ("n", "")):
        all_urls = urls(tag)
        broken = [u for u in all_urls if int(u.split("/")[-1].split("?")[0]) % BROKEN_EVERY == 0]
        good = [u for u in all_urls if u not in broken]

        def done(snaps: dict[str, Any], err: str, good: list[str] = good,
                 broken: list[str] = broken, checked: bool = bool(route)) -> bool:
            if not set(good) <= snaps.keys():
                return False
            if checked:  # every broken page rendered (and failed) at least once
                return all(f"{u} (row" in err for u in broken)
            return set(broken) <= snaps.keys()

        rate, snaps, err = pool_run(site, all_urls, tmp, route, done)
        assert all("EUR" in snaps[u].html().decode() for u in good), "a good page without price"
        kept_out = sum(u not in snaps for u in broken) / len(broken)
        if route:
            assert all(f"{u} (row" in err and "content check: #price missing" in err
                       for u in broken)
        out[f"{tag}.kept_out"], out[f"{tag}.rate"] = kept_out, rate
    site.broken_prices.clear()
    return out


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _all_stored(urls: list[str]) -> Any:
    return lambda snaps, err: set(urls) <= snaps.keys()


def variants(site: SiteServer, tmp: Path, pages: int, rep: int) -> dict[str, float]:
    """Desktop and mobile on the same fresh pages, in alternating order."""
    out: dict[str, float] = {}
    order = ("desktop", "mobile") if rep % 2 == 0 else ("mobile", "desktop")
    for v in order:
        urls = [site.url(f"/js/{n}?{v[0]}{rep}") for n in range(pages)]
        cpu = _children_cpu_s()
        rate, snaps, _ = pool_run(site, urls, tmp, f'variants = ["{v}"]\n', _all_stored(urls))
        time.sleep(1.5)  # Chromium's crash handler outlives its browser by up to a second
        out[f"{v}.cpu"] = (_children_cpu_s() - cpu) / pages
        assert all("JS content" in s.html().decode() for s in snaps.values())
        out[f"{v}.rate"] = rate
    return out


def two_variants(site: SiteServer, tmp: Path, pages: int, rep: int) -> dict[str, float]:
    """Desktop and mobile against desktop alone, same fresh pages, in alternating order."""
    out: dict[str, float] = {}
    order = (("two", '["desktop", "mobile"]'), ("one", '["desktop"]'))
    for tag, names in order if rep % 2 == 0 else order[::-1]:
        urls = [site.url(f"/js/{n}?{tag}{rep}") for n in range(pages)]
        keys = urls + [f"{u} mobile" for u in urls] if tag == "two" else urls
        rate, snaps, _ = pool_run(site, urls, tmp, f"variants = {names}\n", _all_stored(keys),
                                  keys=keys)
        time.sleep(1.5)  # Chromium's crash handler outlives its browser by up to a second
        assert all("JS content" in s.html().decode() for s in snaps.values())
        out[f"{tag}.rate"] = rate
    return out


def marks(site: SiteServer, tmp: Path, pages: int, rep: int, before: Path) -> dict[str, float]:
    """This tree and the one before the marks, routes without rules, alternating."""
    out: dict[str, float] = {}
    trees = (("now", None), ("before", before))
    for tag, tree in trees if rep % 2 == 0 else trees[::-1]:
        urls = [site.url(f"/js/{n}?{tag}{rep}") for n in range(pages)]
        out[f"{tag}.rate"], _, _ = pool_run(site, urls, tmp, "", _all_stored(urls), tree)
    return out


def main() -> None:
    started = time.perf_counter()
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--pages", type=int, default=100),
        ap.add_argument("--reps", type=int, default=3),
        ap.add_argument("--before", type=Path, help="a checkout of the code before the marks"),
        ap.add_argument("--only", choices=("check", "variants", "two", "marks"),
                       action="append")))
    pages, reps = (20, 1) if args.smoke else (args.pages, args.reps)
    tmp = Path(tempfile.mkdtemp(prefix="bench-routes-"))
    parts = args.only or ["check", "variants"] + (["marks"] if args.before else [])
    runs: list[dict[str, float]] = []
    try:
        with SiteServer(delay_ms=300) as site:
            for rep in range(reps):
                got: dict[str, float] = {}
                if "check" in parts:
                    got.update(content_check(site, tmp, pages, rep))
                if "variants" in parts:
                    got.update(variants(site, tmp, pages, rep))
                if "two" in parts:
                    got.update(two_variants(site, tmp, pages, rep))
                if "marks" in parts:
                    assert args.before is not None, "--only marks needs --before TREE"
                    got.update(marks(site, tmp, pages, rep, args.before))
                runs.append(got)
                print(f"rep {rep}: " + ", ".join(f"{k} {v:.3g}" for k, v in got.items()),
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    col = {k: [r[k] for r in runs] for k in runs[0]}
    figures = []
    if "check" in parts:
        figures += check_figures(col, pages)
    if "variants" in parts:
        figures += [
            figure("routes.desktop.rate", "renders/s, desktop variant", "renders/s",
                   col["desktop.rate"], better="higher"),
            figure("routes.mobile.rate", "renders/s, mobile variant", "renders/s",
                   col["mobile.rate"], better="higher"),
            figure("routes.mobile.cost", "cost of a mobile render / a desktop render (desktop"
                   " renders/s / mobile renders/s, same repetition)", "x",
                   ratios(col["desktop.rate"], col["mobile.rate"])),
            figure("routes.desktop.cpu", "CPU-s per render, desktop (the pool's process"
                   " tree)", "CPU-s", col["desktop.cpu"]),
            figure("routes.mobile.cpu", "CPU-s per render, mobile", "CPU-s", col["mobile.cpu"]),
        ]
    if "two" in parts:
        figures += [
            figure("routes.two.rate", "renders/s, two variants (desktop, mobile)",
                   "renders/s", col["two.rate"], better="higher"),
            figure("routes.one.rate", "renders/s, one variant (desktop)", "renders/s",
                   col["one.rate"], better="higher"),
            figure("routes.two.ratio", "renders/s with two variants / one, same repetition",
                   "x", ratios(col["two.rate"], col["one.rate"]), better="higher"),
        ]
    if "marks" in parts:
        figures += [
            figure("routes.marks.rate", "renders/s with the marks (this tree)", "renders/s",
                   col["now.rate"], better="higher"),
            figure("routes.before.rate", f"renders/s before them ({args.before})",
                   "renders/s", col["before.rate"], better="higher"),
            figure("routes.marks.ratio", "renders/s with the marks / before, same repetition",
                   "x", ratios(col["now.rate"], col["before.rate"]), better="higher"),
        ]
    finish("bench_routes", args, figures, started)


def check_figures(col: dict[str, list[float]], pages: int) -> list[dict[str, Any]]:
    broken = pages // BROKEN_EVERY
    return [
        figure("routes.check.kept_out", f"broken pages (1 in {BROKEN_EVERY}, {broken} of"
               f" {pages}) kept out of the store by the content check (expected 100 %)", "%",
               [100 * v for v in col["c.kept_out"]], better="higher"),
        figure("routes.nocheck.kept_out", "... kept out by a pool without the check", "%",
               [100 * v for v in col["n.kept_out"]], better="higher"),
        figure("routes.check.rate", "renders/s with the content check", "renders/s",
               col["c.rate"], better="higher"),
        figure("routes.nocheck.rate", "renders/s without it", "renders/s", col["n.rate"],
               better="higher"),
        figure("routes.check.cost", "renders/s with the check / without, same repetition",
               "x", ratios(col["c.rate"], col["n.rate"]), better="higher"),
    ]


if __name__ == "__main__":
    main()
