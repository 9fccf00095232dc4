"""Discovery on miss: a page crawlers ask for that the pool does not know joins the queue.

Why this module exists: in production nearly half the backlog is *discovered*, pages no sitemap
lists that crawlers find by links. ``lanes serve NAME --store DIR --discover`` adds a URL that
missed (no snapshot) on one of the pool's hosts as ``discovered``, with its route's interval.

A crawler, or anyone posing as one, chooses the URL, so discovery is bounded and refuses more
than it takes, counting every refusal (:attr:`Discovery.counts`, ``/metrics``):

* **one spelling**: the URL is normalised before anything (:func:`discovery_url`): host
  lowercased, fragment dropped, tracking parameters (``utm_*``, ``gclid``, ``fbclid``, ...)
  dropped, the rest sorted and escaped one way by w3lib's ``canonicalize_url``; a route may list
  the parameters that matter (``query = ["page"]``: the rest dropped) or none (``query = []``);
* **routes**: a URL no route matches (when the pool has routes) or a route with
  ``discover = false`` is never added;
* **rate**: at most ``rate`` new URLs per host per minute (``--discover-rate``);
* **cap**: nothing is added while the pool holds ``max_rows`` discovered rows or more
  (``--discover-max``);
* **memory**: the URLs waiting to be added are at most ``PENDING``, and the URLs recently
  offered (a URL missed again while waiting is not counted twice) at most ``SEEN``.

Offers are collected on the event loop and added in a batch once a second on the pool source's
thread (``add_corpus``: known URLs are left alone, so a URL already queued is not added twice).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
from w3lib.url import canonicalize_url

from ..corpus import variant_rows
from ..corpus.model import Corpus
from ..corpus.routes import Route, Routes
from ..corpus.urlnorm import normalize_url, origin_of
from ..errors import EngineError

TRACKING: Final = re.compile(
    r"utm_[a-z0-9_]*|gclid|gclsrc|gbraid|wbraid|dclid|fbclid|msclkid|yclid|twclid|ttclid|igshid"
    r"|mc_cid|mc_eid|_ga|_gl|_hsenc|_hsmi|mkt_tok|oly_anon_id|oly_enc_id|vero_id|rb_clickid"
    r"|s_cid|li_fat_id|ref_src|spm", re.IGNORECASE)
"""Query parameters that say how a visitor arrived, never what the page is."""
PENDING: Final = 10_000
SEEN: Final = 65_536
EVERY_S: Final = 1.0
DEFAULT_INTERVAL_S: Final = 86_400
"""The interval of a discovered page when the pool has no routes."""


def discovery_url(url: str, route: Route | None) -> str:
    """``url`` in the one spelling a discovered page gets (see the module docstring)."""
    parts = urlsplit(url)
    keep = None if route is None else route.query
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if not TRACKING.fullmatch(k) and (keep is None or k in keep)]
    bare = urlunsplit((parts.scheme, parts.netloc.lower(), parts.path or "/",
                       urlencode(pairs), ""))
    return normalize_url(canonicalize_url(bare, keep_fragments=False))


@dataclass
class Discovery:
    """Offers of missed URLs, bounded, added in batches through ``add`` (on the pool's
    thread: ``add(urls, routes) -> counts``) by :meth:`run`."""

    source: Any  # the PoolSource
    rate: int = 60
    max_rows: int = 100_000
    counts: Counter[str] = field(default_factory=Counter)
    _pending: dict[str, None] = field(default_factory=dict)
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _minute: dict[str, tuple[int, int]] = field(default_factory=dict)  # host -> (minute, n)
    _rush: set[str] = field(default_factory=set)  # spellings to make urgent once added
    _task: asyncio.Task[None] | None = None

    def offer(self, url: str, rush: bool = False) -> str | None:
        """A miss for ``url`` (normalised, on one of the pool's hosts): queue it if allowed,
        and with ``rush`` make it urgent once added (``--render-on-miss``); its discovery
        spelling, or None when it is refused. Counted by that spelling (tracking dropped), so
        ``?utm_source=a`` and ``?utm_source=b`` are one page and use the rate once."""
        try:
            url = discovery_url(url, None)
        except EngineError:
            self.counts["refused_invalid"] += 1
            return None
        if rush:
            self._rush.add(url)
        if url in self._seen or url in self._pending:
            return url
        self._seen[url] = None
        while len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        host = origin_of(url)
        minute = int(time.monotonic() // 60)
        at, n = self._minute.get(host, (minute, 0))
        if at != minute:
            n = 0
            if len(self._minute) > 1024:  # hosts are the pool's own: a few; keep it bounded
                self._minute.clear()
        if n >= self.rate:
            self.counts["refused_rate"] += 1
            self._rush.discard(url)
            return None
        if len(self._pending) >= PENDING:
            self.counts["refused_pending"] += 1
            self._rush.discard(url)
            return None
        self._minute[host] = (minute, n + 1)
        self._pending[url] = None
        return url

    def statistics(self) -> dict[str, int]:
        return {**self.counts, "pending": len(self._pending)}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(EVERY_S)
            await self.flush()

    async def flush(self) -> None:
        batch, self._pending = list(self._pending), {}
        rush, self._rush = sorted(self._rush), set()
        if batch or rush:
            try:
                self.counts.update(await self.source.call(self._add, batch, rush))
            except EngineError as e:
                self.counts["failed"] += len(batch)
                self.counts[f"failed: {str(e)[:80]}"] = 1  # the last reason, for statistics

    def _add(self, offered: Sequence[str], rush: Sequence[str] = ()) -> Counter[str]:
        """On the pool's thread: the offered URLs that pass the routes and the cap, added; then
        the pages of ``rush`` the pool holds made urgent."""
        from ..pool.grow import add_corpus

        out: Counter[str] = Counter()
        eng = self.source.engine
        discovered = sum(int(ln["queued"]) + int(ln.get("leased", 0))
                         for ln in eng.stats()["lanes"]
                         if str(ln["name"]).startswith("discovered"))
        room = self.max_rows - discovered
        routes: Routes | None = self.source.routes()
        chosen: dict[str, int] = {}  # spelling -> interval
        for url in offered:
            route = None
            if routes is not None and routes.routes:
                found = int(routes.match([url])[0])
                if found < 0:
                    out["refused_no_route"] += 1
                    continue
                route = routes.routes[found]
                if not route.discover:
                    out["refused_route"] += 1
                    continue
            try:
                spelled = discovery_url(url, route)
            except EngineError:
                out["refused_invalid"] += 1
                continue
            if spelled not in chosen and len(chosen) >= room:
                out["refused_cap"] += 1
                continue
            chosen[spelled] = DEFAULT_INTERVAL_S if route is None else route.interval_s
        if chosen:
            n = len(chosen)
            now = int(time.time() * 1000)
            corpus = Corpus(list(chosen), np.array(list(chosen.values()), np.int64),
                            np.ones(n, np.uint8), np.full(n, now, np.int64))
            added = add_corpus(eng, self.source.urls(), corpus, routes)
            out["added"] += added.added
            out["known"] += added.known
        if rush:
            table = self.source.urls()
            # each row of its variants; none if refused above (a route, the cap)
            rows = [r for each in variant_rows.rows_of(table, rush) for r in each]
            out["rushed"] += eng.prioritize_many(np.array(rows, np.int64), "rush")
        return out
