"""``lanes demo``: the headline case of DESIGN.md §1, lanes off against lanes on.

A scripted scenario on the real engine in virtual time, until the forked pool lands: 60 product
pages (48 h interval) three days overdue and one homepage (1 h) two hours overdue. Without lanes
the claim serves the oldest due row first, so the homepage waits behind the whole backlog; with
lanes it is in the first claim. Then the urgent cap and the discovered floor at work.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np

from .engine import Engine
from .policy import LanePolicy

HOUR_MS = 3_600_000
NOW = 1_800_000_000_000


def _headline(policy: LanePolicy, name: str) -> list[str]:
    with Engine.create(name, capacity=256, policy=policy) as eng:
        products = eng.add_many(np.full(60, NOW - 72 * HOUR_MS), 48 * 3600, "submitted")
        home = eng.add(NOW - 2 * HOUR_MS, 3600, "submitted")
        position = None
        for k in range(1, len(products) + 2):
            batch = eng.claim(budget=1, now_ms=NOW)
            if int(batch.rows[0]) == home:
                position = k
                break
        assert not eng.verify()
    label = "lanes on " if policy.lanes_enabled else "lanes off"
    return [f"  {label}: homepage granted by claim #{position} of 61"
            f" ({'first' if position == 1 else 'behind the product backlog'})"]


def _shares(name: str) -> list[str]:
    lines = []
    with Engine.create(name, capacity=4096) as eng:
        eng.add_many(np.full(500, NOW - HOUR_MS), 3600, "submitted")
        eng.add_many(np.full(500, NOW - HOUR_MS), 48 * 3600, "discovered")
        grants: Counter[str] = Counter()
        for _ in range(400):
            for c in eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR_MS):
                grants[eng.policy.class_of(c.lane)] += 1
        total = sum(grants.values())
        lines.append(f"  submitted and discovered both due, 400 x claim(budget=1): discovered got "
                     f"{grants['discovered']}/{total} (min_share 0.10 is a floor)")
    with Engine.create(name + "-u", capacity=4096) as eng:
        rows = eng.add_many(np.full(300, NOW - HOUR_MS), 3600, "submitted")
        for r in rows:
            eng.prioritize(int(r), "rush", now_ms=NOW)
        granted = sum(len(eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR_MS)) for _ in range(100))
        lines.append(f"  only urgent rows due, 100 x claim(budget=1): {granted} granted"
                     " (urgent_max_share 0.2 caps drain share, idle capacity stays idle)")
    return lines


def run(seconds: float | None = None) -> int:
    """Print the scripted scenario; returns the process exit status."""
    tag = f"lanes-demo-{os.getpid()}"
    print("render-lanes demo: 60 product rows 3 days overdue (48 h TTL), 1 homepage 2 h overdue"
          " (1 h TTL)")
    out = _headline(LanePolicy(lanes_enabled=False), tag + "-off")
    out += _headline(LanePolicy(), tag + "-on")
    print("\n".join(out))
    print("fairness is policy applied at claim time:")
    print("\n".join(_shares(tag + "-shares")))
    return 0
