"""``lanes demo``: a forked render pool over a synthetic corpus, capacity below demand, live.

The corpus is a render service's (docs/design.md §1): homepages (1 h TTL), catalog pages (6-12
h), product pages (48 h) from sitemaps, and crawler-discovered pages (48 h), all starting with a
backlog of up to a day. The pool runs on a clock sped up so that a minute of the demo covers
hours of the corpus, and its capacity (workers / simulated render time) is set to about two
thirds of the corpus's demand: the regime where lanes matter. The render is simulated (a short
sleep; a few pages always fail and drift to the cold lane). A live per-lane view runs meanwhile;
at the end a summary shows what each class of page got: with lanes, homepages stay near one TTL
old while the 48 h backlog absorbs the deficit.

It opens with the headline case on the real engine in virtual time (lanes off against on),
and ends with the loop in real renders (:mod:`engine.demo_loop`): a page rendered in Chromium,
served to a crawler, missed and discovered, recached.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np

from . import factory
from .api import Claim
from .checks import wall_ms
from .policy import LanePolicy
from .pool import Pool, PoolOptions
from .pool.render import RenderSpec
from .report.view import LiveView, print_summary

HOUR_MS = 3_600_000
NOW = 1_800_000_000_000

# (class, count, interval range in hours, provenance, backlog: due up to this many hours ago)
CORPUS = (("home", 150, (1, 1), "submitted", 2),
          ("catalog", 1500, (6, 12), "submitted", 12),
          ("product", 12_000, (48, 48), "submitted", 48),
          ("discovered", 10_000, (48, 48), "discovered", 48))
RENDER_S = 0.008          # mean simulated render time (real seconds)
LOAD = 1.5                # demand / capacity
BROKEN_EVERY = 997        # about one page in a thousand always fails


def corpus(seed: int = 7, now_ms: int | None = None) -> dict[str, Any]:
    """The synthetic corpus: URLs, due times, intervals, provenance and class per row."""
    rng = np.random.default_rng(seed)
    now = wall_ms() if now_ms is None else now_ms
    urls: list[str] = []
    cols: dict[str, list[Any]] = {"due_ms": [], "interval_s": [], "provenance": [], "cls": []}
    for name, count, (lo, hi), prov, backlog_h in CORPUS:
        hours = rng.integers(lo, hi + 1, count)
        cols["interval_s"].append(hours * 3600)
        cols["due_ms"].append(now - rng.integers(0, backlog_h * HOUR_MS, count))
        cols["provenance"].append(np.full(count, 0 if prov == "submitted" else 1))
        cols["cls"].append(np.full(count, name))
        for i in range(count):
            broken = "/broken" if (len(urls) + 1) % BROKEN_EVERY == 0 else ""
            urls.append(f"https://shop.example/{name}{broken}/{i}")
    out: dict[str, Any] = {k: np.concatenate(v) for k, v in cols.items()}
    out["urls"] = urls
    return out


def demand_per_s(interval_s: Any) -> float:
    """Renders per second of pool time the corpus needs to stay fresh: sum of 1 / interval."""
    return float(np.sum(1.0 / np.asarray(interval_s, np.float64)))


def simulated_render(url: str, claim: Claim) -> None:
    """Sleep like a render would (0.5x to 1.5x the mean, fixed per URL); broken pages fail."""
    if "/broken/" in url:
        raise RuntimeError(f"render of {url} failed")
    h = int.from_bytes(hashlib.blake2b(url.encode(), digest_size=2).digest(), "little")
    time.sleep(RENDER_S * (0.5 + h / 65535))


def _headline(policy: LanePolicy, name: str) -> str:
    with factory.open(name, create=True, capacity=256, policy=policy) as eng:
        products = eng.add_many(np.full(60, NOW - 72 * HOUR_MS), 48 * 3600, "submitted")
        home = eng.add(NOW - 2 * HOUR_MS, 3600, "submitted")
        position = next(k for k in range(1, len(products) + 2)
                        if int(eng.claim(budget=1, now_ms=NOW).rows[0]) == home)
    label = "lanes on " if policy.lanes_enabled else "lanes off"
    return (f"  {label}: the homepage is granted by claim #{position} of 61"
            f" ({'first' if position == 1 else 'behind the whole product backlog'})")


def run(seconds: float | None = None, workers: int = 2, plain: bool = False) -> int:
    """The demo; returns the process exit status."""
    seconds = 45.0 if seconds is None else seconds
    tag = f"lanes-demo-{os.getpid()}"
    print("render-lanes demo\n\nThe headline case (60 product pages 3 days overdue, 48 h TTL; one"
          " homepage 2 h overdue, 1 h TTL), claim(budget=1) until the homepage comes:")
    print(_headline(LanePolicy(lanes_enabled=False), tag + "-off"))
    print(_headline(LanePolicy(), tag + "-on"))

    c = corpus()
    capacity = workers / RENDER_S                       # renders per real second
    scale = LOAD * capacity / demand_per_s(c["interval_s"])  # pool seconds per real second
    print(f"\nA forked pool: {workers} workers, simulated renders of ~{RENDER_S * 1000:.0f} ms,"
          f" {len(c['urls'])} pages; demand is {LOAD:g}x capacity. The clock runs x{scale:.0f},"
          f" so {seconds:g} s cover {seconds * scale / 3600:.1f} h of the corpus.\n")
    pool = Pool.create(tag, c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="engine.demo:simulated_render"),
                       PoolOptions(workers=workers, batch=8, lease_s=5.0, grace_s=5.0,
                                   time_scale=scale))
    view = LiveView(force_plain=plain, plain_every_s=max(1.0, seconds / 6))
    policy = pool.engine.policy  # the summary's lane names; the engine is closed after the run
    try:
        summary = pool.run(seconds=seconds, on_tick=view.update)
    finally:
        view.close()
    print_summary(summary, policy)
    from .demo_loop import run_loop

    looped = run_loop(tag + "-loop")
    left = [f for f in os.listdir("/dev/shm") if f.startswith(tag)]
    print(f"\nleft behind: {', '.join(left) if left else 'nothing'} (segment, URL table and board"
          " removed; every worker joined)")
    return 0 if not summary["problems"] and not left and looped == 0 else 1
