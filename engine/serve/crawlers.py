"""Which crawler asked: the family of a request's User-Agent, for per-crawler freshness.

Why this module exists: what an operator wants to know is how fresh the pages Googlebot, or an
AI crawler, got were. Telling bots from people is a list that changes every month, so it comes
from a maintained one (the ``crawler-user-agents`` package: some 1,500 patterns with tags); only
the grouping into the families shown here is ours (:data:`NAMED`, then the list's
``ai-crawler`` tag, then any other crawler). Matching a User-Agent against the whole list costs
about a millisecond, so each distinct User-Agent is classified once and kept (bots send few of
them): at most ``KEPT`` of them, each cut to ``KEPT_CHARS``, so a flood of invented ones costs
bounded memory.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from typing import Any, Final

import crawleruseragents  # type: ignore[import-untyped]

FAMILIES: Final = ("googlebot", "bingbot", "gptbot", "claudebot", "perplexitybot", "ai-other",
                   "other-bot", "human")
"""Metric labels and hit-log codes (the index): append only, never reorder."""
NAMED: Final = {
    "googlebot": ("Googlebot",),
    "bingbot": ("bingbot",),
    "gptbot": ("GPTBot", "ChatGPT-User", "OAI-SearchBot"),
    "claudebot": ("laude", "anthropic-ai"),  # ClaudeBot, Claude-User, Claude-SearchBot, ...
    "perplexitybot": ("Perplexity",),
}
KEPT: Final = 4096
KEPT_CHARS: Final = 512
HUMAN: Final = FAMILIES.index("human")


@functools.lru_cache(maxsize=KEPT)
def _family(agent: str) -> int:
    matched = crawleruseragents.matching_crawlers(agent)
    if not matched:
        return HUMAN
    entries = [crawleruseragents.CRAWLER_USER_AGENTS_DATA[i] for i in matched]
    for name, marks in NAMED.items():
        if any(mark in e["pattern"] for e in entries for mark in marks):
            return FAMILIES.index(name)
    if any("ai-crawler" in e.get("tags", ()) for e in entries):
        return FAMILIES.index("ai-other")
    return FAMILIES.index("other-bot")


def family(agent: str | None) -> int:
    """The :data:`FAMILIES` index of a User-Agent (none at all: ``other-bot``, since people's
    browsers always send one)."""
    if not agent:
        return _OTHER
    return _family(agent[:KEPT_CHARS])


_OTHER: Final = FAMILIES.index("other-bot")


def wants_mobile(agent: str | None) -> bool:
    """Whether a User-Agent is a phone's, to be served a page's mobile variant: Googlebot
    Smartphone, bingbot's and other crawlers' mobile agents, a person's phone. The crawler list
    names no device, so this is the rule MDN gives ("Mobi" anywhere in the User-Agent), which
    each of them carries ("Mobile Safari/", "Mobile/15E148", "Googlebot-Mobile")."""
    return agent is not None and "Mobi" in agent


def figures(store: Any, now_ms: int) -> list[dict[str, Any]]:
    """Per crawler family that made a request: requests since the store began (of which
    relayed from the origin), snapshot hits over the last hour, the mean age ÷ interval of
    those served, and those refused as too stale."""
    from ..store import HIT_WINDOW_MS

    requests = store.bot_requests()
    ratios = store.bot_ratios(now_ms - HIT_WINDOW_MS)
    out = []
    for code, name in enumerate(FAMILIES):
        n, origin = requests.get(code, (0, 0))
        hits, mean, refused = ratios.get(code, (0, math.nan, 0))
        if n or hits:
            out.append({"bot": name, "requests": n, "origin": origin, "hits_last_hour": hits,
                        "served_age_over_interval": None if math.isnan(mean) else mean,
                        "refused_stale": refused})
    return out


class Collector:
    """``/metrics`` per crawler family: ``lanes_bot_hits_total{bot}`` (requests on the
    snapshot routes since the store began, every server process and host that shares the
    store counted), ``lanes_bot_origin_hits_total{bot}``, and over the last hour
    ``lanes_bot_served_hits{bot}`` and ``lanes_bot_served_age_over_interval{bot}``."""

    EVERY_S: Final = 10.0

    def __init__(self, store: Any) -> None:
        self.store = store
        self._last: tuple[float, list[dict[str, Any]]] | None = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client import core

        from ..checks import wall_ms

        now = time.monotonic()
        if self._last is None or now - self._last[0] > self.EVERY_S:
            self._last = (now, figures(self.store, wall_ms()))
        rows = self._last[1]
        hits = core.CounterMetricFamily("lanes_bot_hits", "requests on the snapshot routes"
                                        " per crawler family", labels=["bot"])
        origin = core.CounterMetricFamily("lanes_bot_origin_hits", "of those, answered with"
                                          " the origin's own response", labels=["bot"])
        served = core.GaugeMetricFamily("lanes_bot_served_hits", "snapshot hits over the last"
                                        " hour per crawler family", labels=["bot"])
        age = core.GaugeMetricFamily("lanes_bot_served_age_over_interval", "mean age /"
                                     " interval of the snapshots served to each crawler"
                                     " family over the last hour", labels=["bot"])
        for row in rows:
            hits.add_metric([row["bot"]], row["requests"])
            origin.add_metric([row["bot"]], row["origin"])
            served.add_metric([row["bot"]], row["hits_last_hour"])
            if row["served_age_over_interval"] is not None:
                age.add_metric([row["bot"]], row["served_age_over_interval"])
        yield from (hits, origin, served, age)
