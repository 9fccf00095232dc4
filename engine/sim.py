"""The lane simulator: policies x capacities -> age / TTL per route class, on the real engine.

Why a simulator and why on the real engine: the argument for lanes (``background/``) rests on a
simulation table, and an operator needs the same table for their own corpus before changing a
policy in production. A separate model of the scheduler would show what the model does; this
module drives :class:`engine.Engine` itself in virtual time (``now_ms`` on every call), so the
figures are those of the claim pass, the share credits, the floors and the leases that ship.

The discrete-event loop, one tick of virtual time at a time:

1. batches whose render finished are completed (``complete_many``) or failed (``fail``): a few
   rows always fail and drift to the cold lane, the rest fail at random with ``fail_rate``;
2. now and then an operator rushes a handful of rows (``prioritize(row, "rush")``);
3. render capacity, a fraction of demand (demand = sum of 1/interval over the corpus), accrues
   as tokens; several claimers with different budgets, each on its own attached handle (its
   own lease owner, as a forked worker would be), take turns claiming until the tick's tokens
   are spent or nothing more is due.

What is measured, per route class, over the window after the warm-up: the age of a page's
content when it is replaced (time since its last successful render) divided by its interval,
so 1.0x is "rendered exactly on time". Mean and p99 are over the renders in the window; the max
age also counts the rows still waiting at the end, because a starved class renders nothing and
would otherwise show no age at all. A class whose renders in the window are under 10 % of the
renders its rows need to stay on time there is STARVED (``STARVED_BELOW``). The windows cover
the corpus's longest interval ``STEADY_INTERVALS`` times each by default; shorter ones are
reported as not steady. The worst class is set against ``bound``, the least any policy can
reach with the shortest-interval class held on time.
Rows that always fail are left out of the ages (they never render; no policy can help them).

``rerank`` is a claimer policy, not an engine feature: it claims a window with lanes disabled,
keeps the ``budget`` rows latest relative to their interval and releases the rest through the
engine, which is what an earlier, rejected design did. ``exact`` is the design the seed's pull
request closed in favour of lanes, run in memory without the engine (``_ExactQueue``): every due
row scored by its relative lateness, the highest claimed first, under the default's urgent cap
and floors: the anchor the banded default is measured against.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields, replace
from multiprocessing import get_all_start_methods, get_context
from typing import Any

import numpy as np
import numpy.typing as npt

from . import factory
from .api import QueueEngine
from .checks import is_int, is_number
from .errors import EngineError, EngineTypeError, EngineValueError
from .policy import (
    CLASSIC_FLOORS,
    COARSE_BANDS,
    FINE_BANDS,
    PROVENANCES,
    LanePolicy,
    band_weights,
    normalize_bands,
    reference_pass,
)
from .report.lanes import labels

HOUR_MS = 3_600_000
T0 = 1_800_000_000_000
"""Virtual start time (ms since the epoch); any value inside the key horizon would do."""

STARVED_BELOW = 0.10
"""A class is STARVED when its renders in the measured window are fewer than this fraction of
the renders its rows need to stay on time there (the window over each row's interval, summed
over the class's rows that can succeed)."""

STEADY_INTERVALS = 3.0
"""Warm-up and measuring windows each cover the corpus's longest interval this many times by
default; a run with shorter windows is reported as not steady."""

POLICIES: tuple[str, ...] = ("default", "today", "rerank", "strict", "fixed", "floors",
                             "lateness", "fitted", "exact")
CAPACITIES: tuple[float, ...] = (1.0, 0.75, 0.5)
RESCHEDULES: tuple[str, ...] = ("cadence", "completion")

LATENESS_WEIGHTS: Mapping[str, float] = {
    "submitted/b0": 4.0, "submitted/b1": 1.5, "submitted/b2": 1.5}
"""The ``lateness`` policy's lane weights (docs/simulator.md): the one-hour band weighs 4, so a
homepage is served before it is 10 % late while the rest are a whole interval late (held at
1.0x for ~1 % of the capacity), and the sub-day bands 1.5, because EDF inside a lane whose
intervals vary 2x (6-12 h) ranks its head by due time, not by relative lateness, and the lane
lags the others by about that much without it. Measured best of the sweep's grid."""

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


# -- the corpus and the run's parameters --------------------------------------------------------


@dataclass(frozen=True)
class RouteClass:
    """A route class of the corpus: ``rows`` pages with intervals drawn uniformly from
    ``[interval_h[0], interval_h[1]]`` hours, all of one provenance."""

    name: str
    rows: int
    interval_h: tuple[float, float]
    provenance: str = "submitted"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise EngineValueError(f"route class name must be a non-empty string: {self.name!r}")
        if not is_int(self.rows) or self.rows < 1:
            raise EngineValueError(f"class {self.name!r}: rows must be an integer >= 1, "
                                   f"got {self.rows!r}")
        iv = self.interval_h
        if is_number(iv):
            iv = (iv, iv)
        if (not isinstance(iv, (tuple, list)) or len(iv) != 2
                or not all(is_number(v) and math.isfinite(v) and 0 < v <= 24 * 365 for v in iv)
                or iv[0] > iv[1]):
            raise EngineValueError(f"class {self.name!r}: interval_h must be hours in (0, 8760],"
                                   f" one number or [min, max], got {self.interval_h!r}")
        object.__setattr__(self, "interval_h", (float(iv[0]), float(iv[1])))
        if self.provenance not in PROVENANCES:
            raise EngineValueError(f"class {self.name!r}: provenance must be one of "
                                   f"{PROVENANCES}, got {self.provenance!r}")

    @property
    def label(self) -> str:
        lo, hi = self.interval_h
        return f"{self.name} ({_hours(lo)}" + ("" if lo == hi else f"–{_hours(hi)}") + " h)"

    def demand_per_h(self) -> float:
        """Renders per hour this class needs to stay on time: rows x mean(1/interval)."""
        lo, hi = self.interval_h
        mean_rate = 1 / lo if lo == hi else math.log(hi / lo) / (hi - lo)
        return self.rows * mean_rate


DEFAULT_CLASSES: tuple[RouteClass, ...] = (
    # A production deployment's 814k rows scaled down about 16x, proportions kept:
    # a few homepages, catalog pages, a large product catalogue submitted through sitemaps, and
    # crawler-discovered pages sized so they are ~46 % of the overdue queue at the start.
    RouteClass("home", 15, (1.0, 1.0), "submitted"),
    RouteClass("catalog", 1400, (6.0, 12.0), "submitted"),
    RouteClass("product", 24000, (48.0, 48.0), "submitted"),
    RouteClass("discovery", 28000, (48.0, 48.0), "discovered"),
)


@dataclass(frozen=True)
class Corpus:
    """A named corpus ``lanes sim --corpus NAME`` runs: route classes plus any other settings
    (a file of overrides can do the same)."""

    about: str
    classes: tuple[RouteClass, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)


CORPORA: Mapping[str, Corpus] = {
    "default": Corpus("a shop modelled on the production deployment", DEFAULT_CLASSES),
    "shop": Corpus(
        "a marketplace: half-hour front pages, deals every few hours, daily categories, weekly"
        " products, discovered search and review pages", (
            RouteClass("front", 20, (0.5, 0.5)),
            RouteClass("deals", 400, (2.0, 4.0)),
            RouteClass("category", 3000, (12.0, 24.0)),
            RouteClass("product", 30000, (72.0, 168.0)),
            RouteClass("search", 20000, (24.0, 72.0), "discovered"),
            RouteClass("reviews", 15000, (168.0, 168.0), "discovered"))),
    "news": Corpus(
        "a news site: half-hour homepages, section fronts of a few hours, daily articles, a"
        " weekly archive, tag pages found by crawlers", (
            RouteClass("home", 12, (0.5, 0.5)),
            RouteClass("sections", 300, (2.0, 6.0)),
            RouteClass("articles", 6000, (24.0, 24.0)),
            RouteClass("archive", 40000, (168.0, 168.0)),
            RouteClass("tags", 25000, (48.0, 168.0), "discovered"))),
    "docs": Corpus(
        "a documentation site: landing pages every 6 h, daily guides, an API reference of 2-7"
        " days, old versions every two weeks, community pages found by crawlers", (
            RouteClass("landing", 8, (6.0, 6.0)),
            RouteClass("guides", 1500, (24.0, 24.0)),
            RouteClass("reference", 20000, (48.0, 168.0)),
            RouteClass("versions", 25000, (336.0, 336.0)),
            RouteClass("community", 12000, (72.0, 336.0), "discovered")),
        {"tick_s": 300}),
}
"""The corpora ``--corpus NAME`` knows, each of another shape: which class has the shortest
interval, how wide a band's intervals are, how much of the demand is discovered."""


@dataclass(frozen=True)
class SimConfig:
    """Every parameter of a run; all can be overridden from the CLI or a TOML/JSON file."""

    classes: tuple[RouteClass, ...] = DEFAULT_CLASSES
    scale: float = 1.0
    """Multiplies every class's row count (the tests run the same corpus at a fraction)."""
    backlog_h: float = 2.5
    """Standing lag at the start: due times spread over ``[t0 - backlog_h, t0 + interval)``."""
    warmup_h: float | None = None
    """Virtual hours before measuring; None: ``STEADY_INTERVALS`` x the longest interval."""
    measure_h: float | None = None
    """Virtual hours measured; None: ``STEADY_INTERVALS`` x the longest interval."""
    tick_s: int = 60
    render_s: int = 60
    """Time from claim to completion; the row stays leased (out of the index meanwhile)."""
    fail_rate: float = 0.005
    broken_fraction: float = 0.002
    """Rows that always fail: after ``cold_after`` failures they live in the cold lane."""
    rush_every_h: float = 2.0
    rush_rows: int = 10
    claimers: tuple[int, ...] = (4, 16, 64)
    rerank_window: int = 32
    """Rows a ``rerank`` claimer reads per claim. Production reads 140 of an overdue queue of
    ~520k rows; 32 of this corpus's few thousand is already far more generous to rerank."""
    reschedule: str = "cadence"
    """``cadence``: the next due time is the row's next slot (due + k x interval, missed slots
    skipped), so a late page keeps its cadence; ``completion``: now + interval (the engine's
    default), so a late page asks for fewer renders and a backlog drains by itself."""
    seed: int = 1
    ttl_bands: tuple[int, ...] | None = None
    """The band layout of every simulated policy, in seconds; None: ``LanePolicy``'s default."""

    def __post_init__(self) -> None:
        if not isinstance(self.classes, tuple) or not self.classes:
            raise EngineValueError("the corpus needs at least one route class")
        if not all(isinstance(c, RouteClass) for c in self.classes):
            raise EngineTypeError("classes must be RouteClass values")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise EngineValueError(f"route class names must be unique: {names}")
        _positive(self.scale, "scale")
        if self.measure_h is not None:
            _positive(self.measure_h, "measure_h")
        _at_least(self.backlog_h, "backlog_h", 0.0)
        if self.warmup_h is not None:
            _at_least(self.warmup_h, "warmup_h", 0.0)
        if self.ttl_bands is not None:
            object.__setattr__(self, "ttl_bands", normalize_bands(self.ttl_bands))
        _at_least(self.rush_every_h, "rush_every_h", 0.0)
        _whole(self.tick_s, "tick_s", 1, 86_400)
        _whole(self.render_s, "render_s", 0, 86_400)
        _whole(self.rush_rows, "rush_rows", 0, 1_000_000)
        _whole(self.rerank_window, "rerank_window", 1, 65_536)
        _whole(self.seed, "seed", 0, 2**63 - 1)
        for name in ("fail_rate", "broken_fraction"):
            v = getattr(self, name)
            _at_least(v, name, 0.0)
            if v >= 1:
                raise EngineValueError(f"{name} must be below 1, got {v!r}")
        if self.reschedule not in RESCHEDULES:
            raise EngineValueError(f"reschedule must be one of {RESCHEDULES}, "
                                   f"got {self.reschedule!r}")
        if not isinstance(self.claimers, tuple) or not self.claimers:
            raise EngineValueError("claimers must be a non-empty list of claim budgets")
        for b in self.claimers:
            _whole(b, "claim budget", 1, 65_536)
        if sum(self.rows_of(c) for c in self.classes) > 50_000_000:
            raise EngineValueError("the corpus is over 50M rows; lower scale or rows")

    def rows_of(self, cls: RouteClass) -> int:
        return max(1, round(cls.rows * self.scale))

    @property
    def longest_interval_h(self) -> float:
        return max(c.interval_h[1] for c in self.classes)

    @property
    def windows_h(self) -> tuple[float, float]:
        """Warm-up and measuring window in hours, the defaults resolved against this corpus."""
        auto = STEADY_INTERVALS * self.longest_interval_h
        return (auto if self.warmup_h is None else self.warmup_h,
                auto if self.measure_h is None else self.measure_h)

    @property
    def steady(self) -> bool:
        """Whether both windows cover the longest interval ``STEADY_INTERVALS`` times: the
        longest-interval rows have then been rendered several times before and while measuring,
        whatever the capacity."""
        need = STEADY_INTERVALS * self.longest_interval_h
        return all(w >= need - 1e-9 for w in self.windows_h)

    def policy(self, **fields: Any) -> LanePolicy:
        """A ``LanePolicy`` over this run's band layout (the default's when none is given)."""
        bands: dict[str, Any] = {} if self.ttl_bands is None else {"ttl_bands": self.ttl_bands}
        return LanePolicy(**bands, **fields)

    def preset(self, **fields: Any) -> LanePolicy:
        """A named preset's ``LanePolicy``: over this run's band layout, or the bands they were
        defined on (``COARSE_BANDS``), with the floors they were defined with
        (``CLASSIC_FLOORS``) unless ``fields`` gives others."""
        fields.setdefault("min_share", CLASSIC_FLOORS)
        return LanePolicy(ttl_bands=COARSE_BANDS if self.ttl_bands is None else self.ttl_bands,
                          **fields)


def corpus_config(name: str, **changes: Any) -> SimConfig:
    """The config of a named corpus (``CORPORA``), with ``changes`` on top."""
    if name not in CORPORA:
        raise EngineValueError(f"unknown corpus {name!r} (known: {', '.join(CORPORA)})")
    corpus = CORPORA[name]
    return replace(SimConfig(classes=corpus.classes), **{**corpus.settings, **changes})


def class_demand(config: SimConfig) -> dict[str, float]:
    """Renders per hour each class needs to stay on time, at the config's scale."""
    return {c.name: c.demand_per_h() * config.rows_of(c) / c.rows for c in config.classes}


def bound(config: SimConfig, capacity: float) -> float:
    """The least worst-class mean age / TTL any policy can reach at ``capacity``, holding the
    shortest-interval class on time: the others share what it leaves, ``(D - d_s) / (c D -
    d_s)`` (a class served at rate ``r`` against demand ``d`` renders each page every
    ``interval * d / r``); 1.0 at or above demand."""
    demand = class_demand(config)
    shortest = min(config.classes, key=lambda c: c.interval_h[0]).name
    total, short = sum(demand.values()), demand[shortest]
    left = capacity * total - short
    if left <= 0:
        return math.inf
    return max(1.0, (total - short) / left)


def _hours(v: float) -> str:
    return f"{v:g}"


def _positive(v: object, what: str) -> None:
    _at_least(v, what, 0.0)
    if v == 0:
        raise EngineValueError(f"{what} must be > 0, got {v!r}")


def _at_least(v: object, what: str, lo: float) -> None:
    if not is_number(v):
        raise EngineTypeError(f"{what} must be a number, got {v!r}")
    if not math.isfinite(v) or v < lo:
        raise EngineValueError(f"{what} must be a finite number >= {lo:g}, got {v!r}")


def _whole(v: object, what: str, lo: int, hi: int) -> None:
    if not is_int(v):
        raise EngineTypeError(f"{what} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise EngineValueError(f"{what} must be in [{lo}, {hi}], got {v}")


# -- policies -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySpec:
    """A named engine policy plus how the simulated claimers use it."""

    name: str
    policy: LanePolicy
    rerank: bool = False
    exact: bool = False
    """Claimed from ``_ExactQueue`` (``policy``: its four classes' shares), not the engine."""


def provenance_demand(config: SimConfig) -> dict[str, float]:
    out = dict.fromkeys(PROVENANCES, 0.0)
    for c in config.classes:
        out[c.provenance] += c.demand_per_h() * config.rows_of(c) / c.rows
    return out


def policy_spec(name: str, config: SimConfig) -> PolicySpec:
    """The policies it knows, over the run's band layout. ``default`` is ``LanePolicy()``;
    the presets (``CLASSIC``) keep the bands and floors the default had before it weighed its
    lanes by their intervals (``SimConfig.preset``), so they read as they did: ``floors`` is
    the urgent cap and floors with the rest in lane order; ``fixed`` splits
    what the urgent cap and the cold share leave between submitted and discovered by their
    demand, so every class has a share and the shares sum to 1."""
    if name == "default":
        return PolicySpec(name, config.policy())
    if name == "today":
        return PolicySpec(name, config.preset(lanes_enabled=False))
    if name == "rerank":
        return PolicySpec(name, config.preset(lanes_enabled=False), rerank=True)
    if name == "strict":
        return PolicySpec(name, config.preset(urgent_max_share=1.0, min_share={},
                                              remainder="lane-order", weights={}))
    if name == "fixed":
        cold = CLASSIC_FLOORS["cold"]
        left = 1.0 - LanePolicy().urgent_max_share - cold
        demand = provenance_demand(config)
        total = sum(demand.values()) or 1.0
        discovered = round(left * demand["discovered"] / total, 4)
        return PolicySpec(name, config.preset(remainder="lane-order", weights={}, min_share={
            "submitted": round(left - discovered, 4), "discovered": discovered, "cold": cold}))
    if name == "floors":
        return PolicySpec(name, config.preset(remainder="lane-order", weights={}))
    if name == "lateness":
        names = set(config.preset().lane_names())
        return PolicySpec(name, config.preset(remainder="lateness", weights={
            k: v for k, v in LATENESS_WEIGHTS.items() if k in names}))
    if name == "exact":
        default = config.policy()
        return PolicySpec(name, LanePolicy(
            ttl_bands=(), weights={}, cold_after=default.cold_after,
            urgent_max_share=default.urgent_max_share, min_share=default.min_share), exact=True)
    if name == "fitted":
        corpus = build_corpus(config)
        bands = FINE_BANDS if config.ttl_bands is None else config.ttl_bands
        return PolicySpec(name, LanePolicy.fitted(corpus.interval_s, corpus.provenance, bands))
    raise EngineValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


# -- one run ------------------------------------------------------------------------------------


@dataclass
class ClassResult:
    mean_age_over_ttl: float | None
    p99_age_over_ttl: float | None
    max_age_hours: float
    renders: int
    starved: bool
    demand_fraction: float
    """Renders in the window over the renders needed to stay on time (not in the JSON)."""


@dataclass
class SimResult:
    policy: str
    capacity: float
    renders: int
    classes: dict[str, ClassResult]
    attempts: int = 0
    lag_hours: float = 0.0
    """Mean lateness (claim time minus due time) of the renders in the window: the lag."""
    overdue_at_start: dict[str, int] = field(default_factory=dict)
    lag_by_hour: list[float] = field(default_factory=list)
    """Mean lateness of the renders of each virtual hour from the start (warm-up included)."""
    seconds: float = 0.0
    broken_attempts: int = 0
    """Attempts in the window on rows that always fail: what a policy spends on them is what its
    renders fall short of another's by (docs/simulator.md; not in the JSON)."""

    def to_json(self) -> dict[str, Any]:
        """The object ``lanes sim --json`` prints."""
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "renders": self.renders,
            "classes": {
                name: {k: _round(getattr(c, k)) for k in (
                    "mean_age_over_ttl", "p99_age_over_ttl", "max_age_hours", "renders",
                    "starved")}
                for name, c in self.classes.items()},
        }


def _round(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


@dataclass
class _Corpus:
    cls: npt.NDArray[np.int16]
    interval_s: I64
    provenance: npt.NDArray[np.int64]
    due_ms: I64
    broken: npt.NDArray[np.bool_]


def build_corpus(config: SimConfig) -> _Corpus:
    """The corpus with its standing backlog: each row's due time uniform over one interval
    starting ``backlog_h`` before the start, as a queue running ``backlog_h`` behind its
    cadence leaves it; its content was rendered one interval before that due time."""
    rng = np.random.default_rng(config.seed)
    parts: list[tuple[int, I64, int]] = []
    for k, c in enumerate(config.classes):
        n = config.rows_of(c)
        lo, hi = (int(round(v * 3600)) for v in c.interval_h)
        iv = np.full(n, lo, np.int64) if lo == hi else rng.integers(lo, hi + 1, n)
        parts.append((k, iv.astype(np.int64), PROVENANCES.index(c.provenance)))
    cls = np.concatenate([np.full(len(iv), k, np.int16) for k, iv, _ in parts])
    interval = np.concatenate([iv for _, iv, _ in parts])
    prov = np.concatenate([np.full(len(iv), p, np.int64) for _, iv, p in parts])
    backlog_ms = int(config.backlog_h * HOUR_MS)
    due = T0 - backlog_ms + (rng.random(len(interval)) * interval * 1000).astype(np.int64)
    broken = rng.random(len(interval)) < config.broken_fraction
    return _Corpus(cls, interval, prov, due, broken)


@dataclass
class _Batch:
    rows: I64
    tokens: I64
    due_ms: I64


class _ExactQueue:
    """The ``exact`` policy: the calls the simulation makes of the engine, in memory. A claim
    scores every due row not in flight by its relative lateness, (now - due) / interval, and
    grants the highest first, with no lanes and no bands, under the urgent cap and floors of
    ``policy`` (its four lanes are the four classes: urgent, submitted, discovered, cold). The
    shares are the engine's own: ``reference_pass`` over the four classes, each class's due rows
    given as one lane ranked by lateness rather than due time (only the ``budget`` highest of
    each can be granted, so only those are ranked), so its lateness remainder, weighing the
    classes' heads exactly (``quanta=False``), takes the rows in the order of their lateness
    across every class. Writes
    do what the engine's do to a row's schedule: a completion sets the due time given (the
    failures and the rush cleared), a failure backs off as ``LanePolicy.backoff_ms`` says, and
    a rush makes the row urgent and due now."""

    def __init__(self, corpus: _Corpus, policy: LanePolicy) -> None:
        self.policy = policy
        self.due = corpus.due_ms.copy()
        self.interval_s = corpus.interval_s
        self.provenance = corpus.provenance
        self.failures = np.zeros(len(self.due), np.int64)
        self.urgent = np.zeros(len(self.due), np.bool_)
        self.in_flight = np.zeros(len(self.due), np.bool_)
        self.credits: dict[str, int] = {}

    def claim(self, budget: int, now_ms: int, lease_ms: int) -> _Batch:
        due = np.flatnonzero((self.due <= now_ms) & ~self.in_flight)
        cls = np.where(self.urgent[due], 0, np.where(
            self.failures[due] >= self.policy.cold_after, 3, 1 + self.provenance[due]))
        score = (now_ms - self.due[due]) / np.maximum(self.interval_s[due], 1)
        ranked = []
        for k in range(4):
            mine = np.flatnonzero(cls == k)
            if len(mine) > budget:
                mine = mine[np.argpartition(-score[mine], budget - 1)[:budget]]
            ranked.append(due[mine[np.lexsort((due[mine], -score[mine]))]])
        grants, self.credits = reference_pass(
            self.policy, budget, [self.due[r].tolist() for r in ranked], self.credits,
            now=now_ms, intervals=[self.interval_s[r].tolist() for r in ranked], quanta=False)
        rows = np.concatenate([r[:g] for r, g in zip(ranked, grants, strict=True)])
        self.in_flight[rows] = True
        return _Batch(rows, np.zeros(len(rows), np.int64), self.due[rows].copy())

    def complete_many(self, rows: I64, tokens: I64, next_due: I64 | None, now_ms: int) -> None:
        self.due[rows] = (now_ms + self.interval_s[rows] * 1000) if next_due is None else next_due
        self.failures[rows] = 0
        self.urgent[rows] = False
        self.in_flight[rows] = False

    def release_many(self, rows: I64, tokens: I64) -> None:
        self.in_flight[rows] = False

    def fail(self, row: int, token: int, now_ms: int) -> None:
        f = self.failures[row] = min(255, int(self.failures[row]) + 1)
        self.due[row] = now_ms + self.policy.backoff_ms(f, int(self.interval_s[row]))
        self.urgent[row] = False
        self.in_flight[row] = False

    def prioritize(self, row: int, how: str, now_ms: int) -> None:
        self.due[row] = now_ms
        self.urgent[row] = True

    def verify(self) -> list[str]:
        return []


class _Claimer:
    """One simulated worker: its own attached handle (its own lease owner) and claim budget."""

    def __init__(self, eng: QueueEngine | _ExactQueue, budget: int) -> None:
        self.eng = eng
        self.budget = budget


class _Metrics:
    """Ages of replaced content per route class, collected batch by batch in the window, and the
    attempts there: all of them, and those on rows that always fail."""

    def __init__(self, corpus: _Corpus, n_classes: int, hours: int) -> None:
        self.cls = corpus.cls
        self.interval_ms = corpus.interval_s * 1000
        # Content age is measured from the last successful render; before the run, a row was
        # last rendered one interval before its due time.
        self.last_ok = corpus.due_ms - self.interval_ms
        self.n = n_classes
        self.ages: list[I64] = []
        self.rows: list[I64] = []
        self.late: list[I64] = []
        self.lag_sum = np.zeros(hours)
        self.lag_n = np.zeros(hours)
        self.broken = corpus.broken
        self.attempts = self.broken_attempts = 0

    def attempted(self, rows: I64, measuring: bool) -> None:
        if measuring:
            self.attempts += len(rows)
            self.broken_attempts += int(np.count_nonzero(self.broken[rows]))

    def rendered(self, rows: I64, now: int, late: I64, measuring: bool) -> None:
        hour = (now - T0) // HOUR_MS
        if hour < len(self.lag_sum):
            self.lag_sum[hour] += float(late.sum())
            self.lag_n[hour] += len(late)
        if measuring:
            self.ages.append(now - self.last_ok[rows])
            self.rows.append(rows)
            self.late.append(late)
        self.last_ok[rows] = now


def run_one(config: SimConfig, spec: PolicySpec, capacity: float) -> SimResult:
    """Simulate one policy at one capacity on a fresh engine; the segment is always removed."""
    _positive(capacity, "capacity")
    started = time.perf_counter()
    corpus = build_corpus(config)
    n = len(corpus.cls)
    if spec.exact:
        queue = _ExactQueue(corpus, spec.policy)
        return _loop(config, spec, capacity, corpus, queue,
                     [_Claimer(queue, b) for b in config.claimers], started)
    name = f"lanes-sim-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    with factory.open(name, create=True, capacity=n, policy=spec.policy) as eng:
        handles = [factory.open(name) for _ in config.claimers]
        try:
            eng.add_many(corpus.due_ms, corpus.interval_s, corpus.provenance)
            eng.compact()
            claimers = [_Claimer(h, b) for h, b in zip(handles, config.claimers, strict=True)]
            return _loop(config, spec, capacity, corpus, eng, claimers, started)
        finally:
            for h in handles:
                h.close()


def _loop(config: SimConfig, spec: PolicySpec, capacity: float, corpus: _Corpus,
          eng: QueueEngine | _ExactQueue, claimers: list[_Claimer], started: float) -> SimResult:
    rng = np.random.default_rng(config.seed + 1)
    tick = config.tick_s * 1000
    render_ms = config.render_s * 1000
    lease_ms = render_ms + 10 * tick  # never expires in flight: a lost lease is not a topic here
    demand_per_ms = float(np.sum(1.0 / corpus.interval_s)) / 1000
    rate = capacity * demand_per_ms * tick  # tokens (renders) per tick
    warmup_h, measure_h = config.windows_h
    start_measure = T0 + int(warmup_h * HOUR_MS)
    end = start_measure + int(measure_h * HOUR_MS)
    rush_every = int(config.rush_every_h * HOUR_MS)
    next_rush = T0 + rush_every if rush_every and config.rush_rows else end
    metrics = _Metrics(corpus, len(config.classes), math.ceil((end - T0) / HOUR_MS))
    broken = corpus.broken
    in_flight = np.zeros(len(corpus.cls), np.bool_)
    healthy = np.flatnonzero(~broken)
    pending: deque[tuple[int, _Claimer, I64, I64, I64]] = deque()
    cadence = config.reschedule == "cadence"
    interval_ms = corpus.interval_s * 1000
    overdue = np.bincount(corpus.cls[corpus.due_ms < T0], minlength=len(config.classes))
    tokens = 0.0
    turn = 0
    interval_s = corpus.interval_s

    now = T0
    while now < end:
        measuring = now >= start_measure
        while pending and pending[0][0] + render_ms <= now:
            claimed, c, rows, toks, dues = pending.popleft()
            in_flight[rows] = False
            bad = broken[rows]
            if config.fail_rate:
                bad = bad | (rng.random(len(rows)) < config.fail_rate)
            if bad.any():
                for r, t in zip(rows[bad].tolist(), toks[bad].tolist(), strict=True):
                    c.eng.fail(r, t, now_ms=now)
                rows, toks, dues = rows[~bad], toks[~bad], dues[~bad]
            if len(rows):
                nxt = None
                if cadence:
                    iv = interval_ms[rows]
                    nxt = dues + ((now - dues) // iv + 1) * iv
                c.eng.complete_many(rows, toks, nxt, now_ms=now)
                metrics.rendered(rows, now, claimed - dues, measuring)
        if now >= next_rush:
            picks = rng.choice(healthy, size=min(config.rush_rows, len(healthy)), replace=False)
            for r in picks[~in_flight[picks]].tolist():
                eng.prioritize(r, "rush", now_ms=now)
            next_rush += rush_every
        tokens += rate
        while tokens >= 1:
            c = claimers[turn % len(claimers)]
            turn += 1
            want = min(c.budget, int(tokens))
            if spec.rerank:
                batch = c.eng.claim(budget=max(want, config.rerank_window), now_ms=now,
                                    lease_ms=lease_ms)
                rows, toks, dues = batch.rows, batch.tokens, batch.due_ms
                if len(rows) > want:
                    # Relative lateness, the comparator lanes replaced: it can only
                    # reorder what the EDF prefix already holds.
                    late = (now - dues) / interval_s[rows]
                    order = np.argsort(-late, kind="stable")
                    c.eng.release_many(rows[order[want:]], toks[order[want:]])
                    keep = order[:want]
                    rows, toks, dues = rows[keep], toks[keep], dues[keep]
            else:
                batch = c.eng.claim(budget=want, now_ms=now, lease_ms=lease_ms)
                rows, toks, dues = batch.rows, batch.tokens, batch.due_ms
            got = len(rows)
            if got:
                in_flight[rows] = True
                pending.append((now, c, rows, toks, dues))
                metrics.attempted(rows, measuring)
            tokens -= got
            if got < want:
                # Nothing more is due (or only urgent rows beyond their cap): the rest of this
                # tick's capacity stays idle, as a real pool's would.
                tokens -= math.floor(tokens)
                break
        now += tick
    problems = eng.verify()
    if problems:
        raise EngineError(f"simulation left the engine inconsistent: {problems[:3]}")
    return _summarise(config, spec, capacity, corpus, metrics, now, overdue, started)


def _summarise(config: SimConfig, spec: PolicySpec, capacity: float, corpus: _Corpus,
               metrics: _Metrics, end: int, overdue: I64, started: float) -> SimResult:
    window_ms = config.windows_h[1] * HOUR_MS
    ages = np.concatenate(metrics.ages) if metrics.ages else np.zeros(0, np.int64)
    rows = np.concatenate(metrics.rows) if metrics.rows else np.zeros(0, np.int64)
    ratio = ages / metrics.interval_ms[rows]
    cls_of = corpus.cls[rows]
    waiting_age = end - metrics.last_ok
    out: dict[str, ClassResult] = {}
    for k, c in enumerate(config.classes):
        mine = ratio[cls_of == k]
        members = (corpus.cls == k) & ~corpus.broken
        demand = float(np.sum(window_ms / metrics.interval_ms[members]))
        got = len(mine)
        fraction = got / demand if demand else 1.0
        max_age = max(float(ages[cls_of == k].max()) if got else 0.0,
                      float(waiting_age[members].max()) if members.any() else 0.0)
        out[c.name] = ClassResult(
            mean_age_over_ttl=float(mine.mean()) if got else None,
            p99_age_over_ttl=float(np.percentile(mine, 99)) if got else None,
            max_age_hours=max_age / HOUR_MS,
            renders=got,
            starved=fraction < STARVED_BELOW,
            demand_fraction=fraction,
        )
    late = np.concatenate(metrics.late) if metrics.late else np.zeros(0, np.int64)
    lag = float(late.mean()) / HOUR_MS if len(late) else 0.0
    return SimResult(
        policy=spec.name, capacity=capacity, renders=len(ages), classes=out,
        attempts=metrics.attempts, broken_attempts=metrics.broken_attempts, lag_hours=lag,
        lag_by_hour=[round(float(s) / n / HOUR_MS, 3) if n else 0.0
                     for s, n in zip(metrics.lag_sum, metrics.lag_n, strict=True)],
        overdue_at_start={c.name: int(overdue[k]) for k, c in enumerate(config.classes)},
        seconds=time.perf_counter() - started)


# -- many runs ----------------------------------------------------------------------------------


def _job(args: tuple[SimConfig, PolicySpec, float]) -> SimResult:
    return run_one(*args)


def run_many(config: SimConfig, specs: Sequence[PolicySpec], capacities: Sequence[float],
             jobs: int | None = None) -> list[SimResult]:
    """Every policy at every capacity, in that order; ``jobs`` processes (default: one per
    core, at most one per run). Each run has its own segment, so they share nothing. The
    processes come from a fork server, which imports a calling script as multiprocessing's
    spawn does: a script calling this needs the usual ``if __name__ == "__main__":`` guard."""
    for cap in capacities:
        _positive(cap, "capacity")
    work = [(config, spec, cap) for cap in capacities for spec in specs]
    jobs = min(len(work), os.cpu_count() or 1) if jobs is None else jobs
    _whole(jobs, "jobs", 1, 1024)
    if jobs == 1 or len(work) == 1:
        return [_job(w) for w in work]
    # A fork server, started clean, forks the workers: this process is never forked itself.
    # It has threads Python does not count (numpy's OpenBLAS pool, a sanitizer's), and a fork
    # while one of them holds a lock leaves the child waiting on it forever: the sanitized suite
    # hung in a worker's first malloc, on AddressSanitizer's allocator lock copied held, with
    # threading.active_count() == 1 in the parent. Fork only where there is no fork server.
    methods = get_all_start_methods()
    method = "forkserver" if "forkserver" in methods else "fork" if "fork" in methods \
        else "spawn"
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context(method)) as pool:
        return list(pool.map(_job, work))


def simulate(config: SimConfig | None = None, policies: Sequence[str] = POLICIES,
             capacities: Sequence[float] = CAPACITIES, jobs: int | None = None
             ) -> list[SimResult]:
    """The policy table on the real engine: named policies x capacities."""
    config = config or SimConfig()
    specs = [policy_spec(p, config) for p in policies]
    return run_many(config, specs, capacities, jobs)


# -- the sweep ----------------------------------------------------------------------------------

SWEEP_DISCOVERED: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)
SWEEP_REMAINDERS: tuple[str, ...] = ("lane-order", "edf", "lateness")
SWEEP_BANDS: tuple[tuple[int, ...], ...] = ((3600, 21600, 86400), (3600,), ())
SWEEP_HOME_WEIGHTS: tuple[float, ...] = (1.0, 4.0)
"""Weights the sweep tries, under ``remainder="lateness"``, on the first submitted band (when
the bands split one off) and on the sub-day bands between it and the last."""
SWEEP_MID_WEIGHTS: tuple[float, ...] = (1.0, 1.5)


def sweep_weights(bands: tuple[int, ...]) -> list[dict[str, float]]:
    """The lane weights the sweep tries with ``bands`` (see SWEEP_HOME_WEIGHTS), and the
    default's, derived from the bands."""
    if not bands:
        return [{}]
    mids = [f"submitted/b{i}" for i in range(1, len(bands))]
    out: list[dict[str, float]] = []
    for home, mid in itertools.product(SWEEP_HOME_WEIGHTS, SWEEP_MID_WEIGHTS if mids else (1.0,)):
        out.append({"submitted/b0": home, **dict.fromkeys(mids, mid)})
    return [*out, band_weights(bands)]


def worst_class(result: SimResult) -> float:
    """The objective of the sweep: the worst class's mean age / TTL (inf if any starved)."""
    if any(c.starved or c.mean_age_over_ttl is None for c in result.classes.values()):
        return math.inf
    return max(c.mean_age_over_ttl or 0.0 for c in result.classes.values())


def sweep_specs(discovered: Iterable[float] = SWEEP_DISCOVERED,
                remainders: Iterable[str] = SWEEP_REMAINDERS,
                bands: Iterable[tuple[int, ...]] = SWEEP_BANDS) -> list[PolicySpec]:
    """The grid: the discovered floor, how the remainder is served, the TTL bands and, for
    ``lateness``, the lane weights (sweep_weights); the urgent cap and the cold floor stay at
    the product default."""
    default = LanePolicy()
    out = []
    for d, rem, b in itertools.product(discovered, remainders, bands):
        shares = {"discovered": d, "cold": default.min_share.get("cold", 0.02)}
        label = "/".join(f"{x // 3600}h" for x in b) or "none"
        name = f"discovered={d:g} remainder={rem} bands={label}"
        named = labels(LanePolicy(ttl_bands=b))  # "submitted · ≤ 1 h x4", not "b0x4"
        for w in sweep_weights(b) if rem == "lateness" else [{}]:
            heavier = [f"{named.get(k, k)} x{v:g}" for k, v in w.items() if v != 1.0]
            suffix = f" weights {', '.join(heavier)}" if heavier else ""
            out.append(PolicySpec(name + suffix, LanePolicy(
                ttl_bands=b, min_share=shares, remainder=rem, weights=w)))
    return out


def sweep(config: SimConfig | None = None, capacity: float = 0.5,
          specs: Sequence[PolicySpec] | None = None, jobs: int | None = None
          ) -> list[tuple[float, SimResult]]:
    """Search policy settings for the lowest worst-class age / TTL at ``capacity`` without
    starving any class; best first (a setting that starves a class scores inf)."""
    config = config or SimConfig()
    results = run_many(config, specs or sweep_specs(), [capacity], jobs)
    return sorted(((worst_class(r), r) for r in results), key=lambda x: x[0])


# -- output -------------------------------------------------------------------------------------


def _cell(c: ClassResult) -> str:
    if c.mean_age_over_ttl is None:
        return f"STARVED (0 renders, max {c.max_age_hours:.0f} h)"
    text = (f"{c.mean_age_over_ttl:.2f}x p99 {c.p99_age_over_ttl or 0:.2f}"
            f" max {c.max_age_hours:.0f}h")
    return text + (" STARVED" if c.starved else "")


def format_table(results: Sequence[SimResult], config: SimConfig) -> str:
    """Mean age / TTL per class (p99, max age in hours), renders and lag."""
    labels = {c.name: c.label for c in config.classes}
    names = [c.name for c in config.classes]
    head = ["capacity", "policy", *(labels[n] for n in names), "renders", "lag", "worst/bound"]
    rows = [[f"{r.capacity:.0%}", r.policy, *(_cell(r.classes[n]) for n in names),
             str(r.renders), f"{r.lag_hours:.1f}h",
             f"{worst_class(r) / bound(config, r.capacity):.3f}"] for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
             for line in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe(config: SimConfig) -> str:
    n = sum(config.rows_of(c) for c in config.classes)
    demand = sum(c.demand_per_h() * config.rows_of(c) / c.rows for c in config.classes)
    warmup_h, measure_h = config.windows_h
    return (f"corpus {n:,} rows, demand {demand:,.0f} renders/h; start {config.backlog_h:g} h"
            f" behind; warm-up {warmup_h:g} h, measured {measure_h:g} h; tick"
            f" {config.tick_s}s, render {config.render_s}s, {config.fail_rate:.1%} failures,"
            f" {config.broken_fraction:.1%} rows always fail; claimers {list(config.claimers)};"
            f" reschedule {config.reschedule}; seed {config.seed}")


def steadiness(config: SimConfig) -> str:
    """One line on whether the windows reach a steady state (``SimConfig.steady``)."""
    warmup_h, measure_h = config.windows_h
    longest = config.longest_interval_h
    text = (f"warm-up {warmup_h:g} h and measuring {measure_h:g} h cover the longest interval"
            f" ({longest:g} h) {warmup_h / longest:.1f} and {measure_h / longest:.1f} times")
    if config.steady:
        return f"steady: {text}"
    return (f"NOT STEADY: {text}; {STEADY_INTERVALS:g} each are needed before the longest-"
            "interval pages reach their steady state")


STARVED_RULE = (f"a class is starved when its renders in the measured window are under"
                f" {STARVED_BELOW:.0%} of the renders its rows need to stay on time there (the"
                f" window over each row's interval, summed over its rows that can succeed)")


def to_json(results: Sequence[SimResult], config: SimConfig | None = None) -> dict[str, Any]:
    """The object ``lanes sim --json`` prints; with ``config``, also how starved is judged and
    whether the run is steady."""
    out: dict[str, Any] = {"results": [r.to_json() for r in results]}
    if config is not None:
        warmup_h, measure_h = config.windows_h
        out["starved"] = {"below_demand_fraction": STARVED_BELOW, "rule": STARVED_RULE}
        out["steady"] = {"steady": config.steady, "warmup_h": warmup_h, "measure_h": measure_h,
                         "longest_interval_h": config.longest_interval_h,
                         "intervals_needed": STEADY_INTERVALS}
    return out


def plot(results: Sequence[SimResult], config: SimConfig, path: str) -> None:
    """One panel per capacity, classes on the x axis, a bar per policy, log scale; a starved
    class gets a hatched bar at its value (or none when it rendered nothing) and a label."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise EngineError("--plot needs matplotlib: pip install 'render-lanes[plot]'") from None
    caps = list(dict.fromkeys(r.capacity for r in results))
    policies = list(dict.fromkeys(r.policy for r in results))
    names = [c.name for c in config.classes]
    by = {(r.capacity, r.policy): r for r in results}
    fig, axes = plt.subplots(1, len(caps), figsize=(5.2 * len(caps), 4.4), sharey=True,
                             squeeze=False)
    width = 0.8 / max(1, len(policies))
    for ax, cap in zip(axes[0], caps, strict=True):
        for k, pol in enumerate(policies):
            r = by.get((cap, pol))
            if r is None:
                continue
            xs = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(names))]
            vals = [r.classes[n].mean_age_over_ttl or math.nan for n in names]
            bars = ax.bar(xs, vals, width, label=pol, color=f"C{k}")
            for bar, n, x, v in zip(bars, names, xs, vals, strict=True):
                if r.classes[n].starved:
                    bar.set_hatch("//")
                    ax.annotate("STARVED", (x, v if math.isfinite(v) else 1.0), rotation=90,
                                ha="center", va="bottom", fontsize=7, color=f"C{k}")
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xticks(range(len(names)), [c.label for c in config.classes], fontsize=8)
        ax.set_title(f"capacity {cap:.0%} of demand")
    axes[0][0].set_ylabel("mean age / TTL at render (log)")
    handles = [Patch(color=f"C{k}", label=pol) for k, pol in enumerate(policies)]
    axes[0][-1].legend(handles=handles, fontsize=8)
    fig.suptitle("render-lanes simulator: age / TTL per route class (hatched: STARVED)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise EngineValueError(f"cannot write plot {path!r}: {exc}") from None
    finally:
        plt.close(fig)


# -- configuration from a file and the command line ---------------------------------------------


_FIELDS = {f.name for f in fields(SimConfig)}


def config_from_mapping(data: Mapping[str, Any], base: SimConfig | None = None) -> SimConfig:
    """A config from parsed TOML/JSON: top-level keys are ``SimConfig`` fields; ``classes`` is a
    list of tables with ``name``, ``rows``, ``interval_h`` (hours or [min, max]), ``provenance``."""
    base = base or SimConfig()
    if not isinstance(data, Mapping):
        raise EngineValueError("the corpus file must hold a table/object at the top level")
    unknown = set(data) - _FIELDS
    if unknown:
        raise EngineValueError(f"unknown setting(s) {sorted(unknown)} (known: {sorted(_FIELDS)})")
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key == "classes":
            if not isinstance(value, list) or not value:
                raise EngineValueError("classes must be a non-empty list of tables")
            classes = []
            for item in value:
                if not isinstance(item, Mapping):
                    raise EngineValueError(f"each class must be a table, got {item!r}")
                extra = set(item) - {"name", "rows", "interval_h", "provenance"}
                if extra or not {"name", "rows", "interval_h"} <= set(item):
                    raise EngineValueError(
                        f"class {item.get('name', '?')!r} needs name, rows, interval_h and may"
                        f" have provenance; unknown: {sorted(extra)}")
                iv = item["interval_h"]
                classes.append(RouteClass(item["name"], item["rows"],
                                          tuple(iv) if isinstance(iv, list) else iv,
                                          item.get("provenance", "submitted")))
            changes["classes"] = tuple(classes)
        elif key == "claimers":
            if not isinstance(value, list):
                raise EngineValueError("claimers must be a list of claim budgets")
            changes["claimers"] = tuple(value)
        else:
            changes[key] = value
    try:
        return replace(base, **changes)
    except TypeError as exc:  # a value of a type the dataclass cannot take
        raise EngineTypeError(str(exc)) from None


def load_config(path: str, base: SimConfig | None = None) -> SimConfig:
    """Read a TOML (``.toml``) or JSON file of overrides."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise EngineValueError(f"cannot read corpus file {path!r}: {exc.strerror}") from None
    try:
        if path.endswith(".json"):
            data = json.loads(raw)
        else:
            data = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineValueError(f"malformed corpus file {path!r}: {exc}") from None
    return config_from_mapping(data, base)


def _floats(text: str, what: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = float(part[:-1]) / 100 if part.endswith("%") else float(part)
        except ValueError:
            raise EngineValueError(f"{what}: {part!r} is not a number") from None
        out.append(v)
    return out


def _capacities(text: str) -> list[float]:
    caps = _floats(text, "--capacities")
    for c in caps:
        if not math.isfinite(c) or c <= 0:
            raise EngineValueError(f"capacity must be > 0 (a fraction of demand), got {c:g}")
    return caps


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``lanes sim`` options (engine/cli.py only mounts them)."""
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, from {', '.join(POLICIES)} (default: all)")
    p.add_argument("--capacities", default="1,0.75,0.5",
                   help="comma-separated fractions of demand, or percentages (default: 1,0.75,0.5)")
    p.add_argument("--corpus", metavar="NAME|FILE",
                   help=f"a named corpus ({', '.join(CORPORA)}) or a TOML or JSON file of"
                        " overrides (classes, ...)")
    p.add_argument("--ttl-bands", metavar="HOURS",
                   help="comma-separated band boundaries in hours for every policy"
                        " (default: LanePolicy's)")
    p.add_argument("--seed", type=int, help="random seed (corpus, failures, rushes)")
    p.add_argument("--scale", type=float, help="multiply every class's row count")
    for name, kind, text in (
            ("backlog_h", float, "hours behind cadence at the start"),
            ("warmup_h", float, "virtual hours before measuring (default: 3 x the longest"
                                " interval)"),
            ("measure_h", float, "virtual hours measured (default: 3 x the longest interval)"),
            ("tick_s", int, "virtual seconds per tick"),
            ("render_s", int, "virtual seconds from claim to completion"),
            ("fail_rate", float, "fraction of renders that fail at random"),
            ("broken_fraction", float, "fraction of rows that always fail"),
            ("rush_every_h", float, "hours between operator rushes (0: none)"),
            ("rush_rows", int, "rows per rush"),
            ("rerank_window", int, "rows a rerank claimer reads per claim")):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)
    p.add_argument("--claimers", help="comma-separated claim budgets, one claimer each")
    p.add_argument("--reschedule", choices=RESCHEDULES)
    p.add_argument("--jobs", type=int, help="processes (default: one per core)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs matplotlib)")
    p.add_argument("--sweep", action="store_true",
                   help="search shares, remainder, bands and lane weights for the best"
                        " worst-class age/TTL")
    p.add_argument("--sweep-capacity", type=float, default=0.5)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    if not args.corpus:
        config = SimConfig()
    elif args.corpus in CORPORA:
        config = corpus_config(args.corpus)
    else:
        config = load_config(args.corpus)
    changes: dict[str, Any] = {}
    for name in ("seed", "scale", "backlog_h", "warmup_h", "measure_h", "tick_s", "render_s",
                 "fail_rate", "broken_fraction", "rush_every_h", "rush_rows", "rerank_window",
                 "reschedule"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if getattr(args, "ttl_bands", None):
        hours = _floats(args.ttl_bands, "--ttl-bands")
        if not all(math.isfinite(h) and h > 0 for h in hours):
            raise EngineValueError(f"--ttl-bands must be hours > 0, got {args.ttl_bands}")
        changes["ttl_bands"] = tuple(round(h * 3600) for h in hours)
    if args.claimers:
        budgets = _floats(args.claimers, "--claimers")
        if any(b != int(b) for b in budgets):
            raise EngineValueError(f"--claimers must be whole claim budgets, got {args.claimers}")
        changes["claimers"] = tuple(int(b) for b in budgets)
    return replace(config, **changes)


def run_cli(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """``lanes sim``: bad input raises an ``EngineError`` (the CLI prints it, exit status 2)."""
    config = config_from_args(args)
    started = time.perf_counter()
    if args.sweep:
        if not args.sweep_capacity > 0:
            raise EngineValueError(f"--sweep-capacity must be > 0, got {args.sweep_capacity}")
        ranked = sweep(config, args.sweep_capacity, jobs=args.jobs)
        if args.json:
            out(json.dumps({"capacity": args.sweep_capacity, "results": [
                {"setting": r.policy, "worst_mean_age_over_ttl": None if math.isinf(w) else w,
                 **r.to_json()} for w, r in ranked]}, indent=2))
            return 0
        out(describe(config))
        out(format_table([r for _, r in ranked], config))
        best_score, best = ranked[0]
        if math.isinf(best_score):
            out("every setting starved a class")
        else:
            out(f"best at {args.sweep_capacity:.0%}: {best.policy} (worst class mean age/TTL"
                f" {best_score:.2f}x; {time.perf_counter() - started:.1f}s)")
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    specs = [policy_spec(p, config) for p in policies]
    results = run_many(config, specs, _capacities(args.capacities), args.jobs)
    if args.plot:
        plot(results, config, args.plot)
    if args.json:
        out(json.dumps(to_json(results, config), indent=2))
        return 0
    out(describe(config))
    out(steadiness(config))
    out(format_table(results, config))
    out(f"{len(results)} runs in {time.perf_counter() - started:.1f}s"
        + (f"; plot written to {args.plot}" if args.plot else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.sim``: the same as ``lanes sim``."""
    parser = argparse.ArgumentParser(prog="lanes sim", description=__doc__.split("\n")[0])
    add_arguments(parser)
    try:
        return run_cli(parser.parse_args(argv))
    except EngineError as exc:
        print(f"lanes sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
