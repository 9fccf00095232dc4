"""The origin's own answer, relayed, for a page the server has no snapshot of to give.

Why this module exists: stock prerender middleware (prerender-node, an nginx bot map) relays
whatever status this server answers to the crawler, and falls through to the origin only when
the server cannot be reached. So a 404 for a page never rendered, cleared (``clear-and-wait``)
or too stale (``--max-stale``) would tell a search engine that a page the site has is gone.
Instead, for a URL on one of the pool's hosts, the server fetches the page from the origin
itself and relays status, the headers that matter and body, marked
``X-Lanes-Snapshot: origin``: the crawler gets what it would get without prerendering.

Bounded, since a crawler, or anyone posing as one, chooses the URL: only URLs on the pool's own
hosts are fetched (never an address a client names); at most ``Relay.per_host`` fetches run at
once per host (the next is answered 503 with ``Retry-After``), each within ``timeout_s`` and
``max_bytes`` (else 502/504), redirects relayed, never followed. The fetch says it is a relay:
its User-Agent is the crawler's with `` Prerender (lanes serve)`` appended and it sends
``X-Prerender: 1``, which the usual middleware rules read as "do not prerender this one", so a
relay never loops back here. Every outcome is counted (``statistics``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp import web

from ..corpus.urlnorm import origin_of
from ..errors import EngineError
from .door import SECURITY_HEADERS

RELAYED_HEADERS: Final = ("Content-Type", "Location", "Cache-Control", "Expires",
                          "Last-Modified", "ETag", "Content-Language", "Link", "X-Robots-Tag",
                          "Retry-After")
RELAY_MARK: Final = "Prerender (lanes serve)"
HOSTS_EVERY_S: Final = 10.0


@dataclass
class Relay:
    """Fetches from the pool's hosts (``hosts``: called on the pool's thread, cached
    ``HOSTS_EVERY_S``) and relays them."""

    hosts: Callable[[], Awaitable[frozenset[str]]]
    timeout_s: float = 10.0
    max_bytes: int = 10 << 20
    per_host: int = 8
    counts: Counter[str] = field(default_factory=Counter)
    _known: frozenset[str] = frozenset()
    _looked: float = -1e9
    _busy: dict[str, int] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    async def covers(self, url: str) -> bool:
        """Whether ``url`` is on one of the pool's hosts."""
        now = asyncio.get_running_loop().time()
        if now - self._looked > HOSTS_EVERY_S:
            self._looked = now
            self._known = await self.hosts()
        return origin_of(url) in self._known

    def statistics(self) -> dict[str, int]:
        return dict(self.counts)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def relay(self, request: web.Request, url: str, why: str) -> web.StreamResponse:
        """The origin's answer for ``url`` (``why``: missing, cleared or stale)."""
        host = origin_of(url)
        if self._busy.get(host, 0) >= self.per_host:
            self.counts["busy"] += 1
            return _refusal(503, f"the origin {host} is busy with other relays", why)
        self._busy[host] = self._busy.get(host, 0) + 1
        try:
            return await self._fetch(request, url, why)
        finally:
            self._busy[host] -= 1
            if not self._busy[host]:
                del self._busy[host]

    async def _fetch(self, request: web.Request, url: str, why: str) -> web.StreamResponse:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar())
        agent = request.headers.get("User-Agent", "")
        headers = {"User-Agent": f"{agent} {RELAY_MARK}".strip(), "X-Prerender": "1",
                   "Accept": request.headers.get("Accept", "text/html,*/*;q=0.8"),
                   "Accept-Encoding": "gzip, deflate"}
        if "Accept-Language" in request.headers:
            headers["Accept-Language"] = request.headers["Accept-Language"]
        try:
            async with self._session.get(url, headers=headers, allow_redirects=False,
                                         max_line_size=16384, max_field_size=16384) as r:
                pieces, size = [], 0
                while size <= self.max_bytes:
                    piece = await r.content.read(self.max_bytes + 1 - size)
                    if not piece:
                        break
                    pieces.append(piece)
                    size += len(piece)
                body = b"".join(pieces)
                if size > self.max_bytes:
                    self.counts["too_large"] += 1
                    return _refusal(502, f"the origin's answer is over {self.max_bytes} bytes",
                                    why)
                kept = {k: v for k in RELAYED_HEADERS if (v := r.headers.get(k)) is not None}
                status = r.status
        except TimeoutError:
            self.counts["timeout"] += 1
            return _refusal(504, f"the origin did not answer within {self.timeout_s:g} s", why)
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self.counts["unreachable"] += 1
            return _refusal(503, f"the origin cannot be reached: {type(e).__name__}", why)
        self.counts[f"{status // 100}xx"] += 1
        return web.Response(status=status, body=body, headers={
            **kept, **SECURITY_HEADERS, "X-Lanes-Snapshot": "origin", "X-Lanes-Miss": why,
            "Content-Security-Policy": "sandbox"})


def _refusal(status: int, text: str, why: str) -> web.Response:
    """An answer when the origin's cannot be had: a status that says "try later", never one
    that says "gone"."""
    return web.Response(status=status, text=text + "\n", headers={
        **SECURITY_HEADERS, "Retry-After": "30", "X-Lanes-Snapshot": "origin",
        "X-Lanes-Miss": why})


def relay_for(source: Any, timeout_s: float = 10.0, per_host: int = 8) -> Relay:
    """A relay over the pool of ``source`` (a ``PoolSource``): its hosts are those of its URL
    table (``RowUrls.origins``), read on the source's thread."""

    def hosts() -> frozenset[str]:
        try:
            table = source.urls()
        except EngineError:  # a pool without a URL table (rows added by hand): no hosts
            return frozenset()
        known: frozenset[str] = table.origins()
        return known

    async def read() -> frozenset[str]:
        found: frozenset[str] = await source.call(hosts)
        return found

    return Relay(read, timeout_s=timeout_s, per_host=per_host)
