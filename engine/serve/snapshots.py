"""The prerender endpoint: ``GET /render?url=URL`` and ``GET /{URL}`` answer with a snapshot.

Why it is built this way: prerender middleware (prerender-node and its kin) asks a service for
``<service>/<full URL>`` and relays the answer, status and headers, to the crawler. So an answer
here is what the crawler gets, and must say honestly how old it is:

* a rendered URL answers with its **rendered status** (``Location`` kept for a 3xx), the stored
  HTML, ``Age`` (whole seconds since it was rendered), ``Last-Modified``, a weak ``ETag`` (the
  HTML's hash and the status: 304 on ``If-None-Match``), and the stored gzip as it is when the
  client accepts gzip (decompressed otherwise);
* a URL with no snapshot (never rendered, or cleared), or whose snapshot is older than
  ``--max-stale F`` × its interval, is answered with **the origin's own answer** when the
  server knows the pool and the URL is on one of its hosts (:mod:`engine.serve.origin`): stock
  prerender-node relays every status it gets, so a crawler must never be told "gone" for a
  page the site has;
* without a pool, or for a URL on no host of the pool, a URL never rendered is **404** and a
  too-stale snapshot **503** with ``Retry-After`` (a status that says "try later").

A URL whose route renders it as two variants has two snapshots (``engine.corpus.variant_rows``):
a crawler on a phone (:func:`engine.serve.crawlers.wants_mobile`) gets the mobile one, any other
the desktop one, either the other one while its own is missing, with ``Vary: User-Agent``.

Every answer carries ``X-Lanes-Snapshot: served | stale | missing | origin``, so a middleware
can tell a rendered 404 (``served``) from a URL never rendered (``missing``).

Nothing here waits on the pool: a snapshot is read from the store. The answers of hot URLs are
kept in memory, their fixed headers built once, and checked against the store at most every
``REVALIDATE_S`` (a new render, on any host of a shared store, is served within that); a check
that finds the same HTML reads no body. A shared store's reads wait on the network, so they run
on threads (``REMOTE_READS``), never on the event loop.

When a body cannot be fetched (the object service is down, a blob is missing) the last copy
held here is served, with its own ETag and its true Age, and the store is asked again at the
next revalidation: a whole page whose age is told honestly is what a crawler can use, and an
error would cost the page its ranking for nothing. With no copy here the answer is 503 with
``Retry-After`` (``X-Lanes-Snapshot: unavailable``). A body is only ever sent whole: the shared
store checks every blob against its digest before it is kept.

Each hit is noted in memory with its age ÷ interval and written to the store's hit log in
batches, from a thread with its own connection, every ``FLUSH_S`` (a shared store's hit log is
in Redis: every host's hits count together).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from ..checks import wall_ms
from ..corpus import variant_rows
from ..corpus.urlnorm import normalize_url
from ..errors import EngineError
from ..store import open_store
from ..store.api import Snapshot, Store, StoreSpec
from . import crawlers
from .discover import Discovery
from .door import SECURITY_HEADERS, SNAPSHOT_ROUTE
from .origin import Relay

FLUSH_S: Final = 1.0
MAX_PENDING: Final = 100_000
"""Hits waiting for the hit log beyond this are dropped (and counted): a store that cannot keep
up must cost the log, never the server's memory."""

log = logging.getLogger(__name__)

REVALIDATE_S: Final = 1.0
REMOTE_READS: Final = 8
"""Threads reading a shared store at once, per server process."""
RETRY_AFTER_S: Final = 5
CACHE_BYTES: Final = 64 << 20
"""The answers kept in memory, gzip and (once asked for) plain HTML counted, least recently
used dropped first."""
PLAIN_KEPT: Final = 1 << 20
"""A page whose HTML is larger than this is sent to a client that takes no gzip decompressed
piece by piece (``STREAM_PIECE`` at a time), never whole in memory: a 20 MB page gzips to a few
KB, so without this a few such requests would hold many times the answer budget."""
STREAM_PIECE: Final = 256 << 10
RENDER_POLL_S: Final = 0.1
ABSENT_KEPT: Final = 20_000
"""Variant keys remembered as missing, at most (then forgotten at once, as ``_Spellings``):
about 4 MB at 200 bytes an entry, what a flood of distinct URLs can make this hold."""
NORMAL_BYTES: Final = 4 << 20
"""The requested spellings of URLs whose store spelling is kept (bots repeat URLs; only good
ones are kept, counted by their length, so a flood of distinct bad URLs costs nothing)."""

_SANDBOX: Final = "sandbox"  # a snapshot opened in a browser runs in no origin: not the server's


class HitLog:
    """Hits noted by the event loop, written to the store's hit log by a thread of its own."""

    def __init__(self, spec: StoreSpec) -> None:
        self._store = open_store(spec, create=False)
        self._pending: list[tuple[int, int, int, float, bool, int]] = []
        self._requests: dict[int, list[int]] = {}  # crawler family -> [requests, origin]
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lanes-serve-hits")
        self.noted = 0
        self.written = 0
        self.dropped = 0  # noted past MAX_PENDING, or lost with a batch the store refused
        self._task: asyncio.Task[None] | None = None

    def request(self, bot: int, origin: bool) -> None:
        """A request on the snapshot routes by crawler family ``bot``, whatever its answer
        (``origin``: the origin's answer was relayed)."""
        counts = self._requests.get(bot)
        if counts is None:
            counts = self._requests[bot] = [0, 0]
        counts[0] += 1
        counts[1] += origin

    def note(self, snap: Snapshot, at_ms: int, ratio: float, served: bool, bot: int) -> None:
        self.noted += 1
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append((at_ms, snap.id, snap.lane, ratio, served, bot))

    def statistics(self) -> dict[str, int]:
        return {"noted": self.noted, "written": self.written, "dropped": self.dropped,
                "pending": len(self._pending)}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        requests = {b: (n, o) for b, (n, o) in self._requests.items()}
        self._requests = {}
        if batch or requests:
            # Shielded: the flush task cancelled at close must not cancel a write still
            # queued on the thread (its batch would be lost); shutdown waits for it.
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(
                self._thread, self._write, batch, requests))

    def _write(self, batch: list[tuple[int, int, int, float, bool, int]],
               requests: dict[int, tuple[int, int]]) -> None:
        try:
            self._store.log_hits(batch, requests)
            self.written += len(batch)
        except EngineError as e:  # a busy or vanished store costs the log, not the server
            self.dropped += len(batch)
            log.warning("lanes serve: %d hit(s) not logged: %s", len(batch), e)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
        self._thread.shutdown(wait=True)
        self._store.close()


class SnapshotRoutes:
    """The two snapshot routes over ``store``; ``max_stale`` None serves every age."""

    def __init__(self, store: Store, hits: HitLog, max_stale: float | None,
                 relay: Relay | None = None, discovery: Discovery | None = None,
                 render_on_miss: float = 0.0) -> None:
        self.store = store
        self.hits = hits
        self.max_stale = max_stale
        self.relay = relay  # with a pool: its origin answers where no snapshot may
        self.discovery = discovery  # with --discover: a miss on the pool's hosts is offered
        self.render_on_miss = render_on_miss  # seconds a miss waits for its rushed render
        self._cache: OrderedDict[str, _Answer] = OrderedDict()
        self._bytes = 0  # bytes held by _cache: every answer's gzip, and its HTML once made
        self._normal = _Spellings(NORMAL_BYTES)
        self._reads = (ThreadPoolExecutor(REMOTE_READS, thread_name_prefix="lanes-serve-reads")
                       if store.remote else None)
        self._reading: dict[str, asyncio.Future[_Answer | None]] = {}  # keys being read
        self._absent: dict[str, float] = {}  # variant key -> monotonic time it was missing
        self.unavailable = 0  # reads that failed: answered from the copy here, or 503

    def close(self) -> None:
        if self._reads is not None:
            self._reads.shutdown(wait=True)

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/render", self.by_query, name=f"{SNAPSHOT_ROUTE}-query")
        app.router.add_get(r"/{target:https?:/.*}", self.by_path, name=f"{SNAPSHOT_ROUTE}-path")

    async def by_query(self, request: web.Request) -> web.StreamResponse:
        url = request.query.get("url")
        if not url:
            return _plain(400, "give the page as /render?url=URL", "missing")
        return await self.answer(request, url)

    async def by_path(self, request: web.Request) -> web.StreamResponse:
        target = request.raw_path  # the URL as sent, query included, escapes kept
        if not target.startswith("/"):  # absolute form (RFC 9112 3.2.2): drop scheme://host
            target = "/" + target.partition("://")[2].partition("/")[2]
        target = target[1:]
        scheme, _, rest = target.partition(":")
        return await self.answer(request, f"{scheme}://{rest.lstrip('/')}")  # "https:/x": a proxy
        # merged the slashes

    async def answer(self, request: web.Request, url: str) -> web.StreamResponse:
        bot = crawlers.family(request.headers.get("User-Agent"))
        key = self._normal.get(url)
        if key is None:
            try:
                key = self._normal.put(url, normalize_url(url))
            except EngineError as e:
                self.hits.request(bot, False)
                return _plain(400, f"not an absolute http(s) URL: {_short(str(e))}", "missing")
        try:
            found, varies = await self._chosen(key, crawlers.wants_mobile(
                request.headers.get("User-Agent")))
        except EngineError as e:
            self.hits.request(bot, False)
            log.warning("lanes serve: %s", e)
            return _plain(503, f"the snapshot of {_short(key)} cannot be read now",
                          "unavailable", {"Retry-After": str(RETRY_AFTER_S)})
        if found is None:
            missed = await self._missed(request, key)
            if not isinstance(missed, _Answer):
                self.hits.request(bot, missed.headers.get("X-Lanes-Snapshot") == "origin")
                return missed
            found, varies = missed, False
        snap = found.snap
        now = wall_ms()
        ratio = snap.age_over_interval(now)
        served = self.max_stale is None or ratio <= self.max_stale
        self.hits.note(snap, now, ratio, served, bot)
        if not served:
            relayed = self.relay is not None and await self.relay.covers(key)
            self.hits.request(bot, relayed)
            if relayed:
                assert self.relay is not None
                return await self.relay.relay(request, key, "stale")
            return _plain(503, f"the snapshot of {_short(key)} is {ratio:.2f} x its interval"
                          f" old, past --max-stale {self.max_stale}", "stale",
                          {"Retry-After": str(min(snap.interval_s, 3600))})
        self.hits.request(bot, False)
        headers = {**found.fixed, "Age": str(snap.age_s(now)),
                   "X-Lanes-Age-Over-Interval": f"{ratio:.3f}"}
        if varies:
            headers["Vary"] = "Accept-Encoding, User-Agent"
        if _matches(request.headers.get("If-None-Match"), found.etag):
            del headers["Content-Type"]
            return web.Response(status=304, headers=headers)
        if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
            headers["Content-Encoding"] = "gzip"
            return web.Response(status=snap.status, body=snap.gz, headers=headers)
        if snap.html_bytes > PLAIN_KEPT:
            return await _inflated(request, snap, headers)
        html, made = found.plain()
        if made:
            self._bytes += len(html)
            self._evict()
        return web.Response(status=snap.status, body=html, headers=headers)

    async def _chosen(self, url: str, mobile: bool) -> tuple[_Answer | None, bool]:
        """The answer for a crawler on a phone (``mobile``) or not: the URL's mobile variant or
        its plain URL (desktop, or its route's only render), the other when that one is
        missing; and whether the URL has a variant (the answer then carries ``Vary:
        User-Agent``). Most URLs have no variant and every request asks, so a variant key's
        miss is kept for ``REVALIDATE_S`` like an answer."""
        variant_key = variant_rows.mobile_key(url)
        now = time.monotonic()
        missed = self._absent.get(variant_key)
        variant = None
        if missed is None or now - missed > REVALIDATE_S:
            variant = await self._answer(variant_key)
            if variant is None:
                if len(self._absent) >= ABSENT_KEPT:
                    self._absent.clear()
                self._absent[variant_key] = now
            else:
                self._absent.pop(variant_key, None)
        if mobile and variant is not None:
            return variant, True
        plain = await self._answer(url)
        return (plain if plain is not None else variant), variant is not None

    async def _missed(self, request: web.Request, key: str) -> _Answer | web.StreamResponse:
        """A URL with no snapshot: its snapshot after all (``--render-on-miss``), or the
        answer: the origin's on the pool's hosts, else 404."""
        if self.relay is None or not await self.relay.covers(key):
            return _plain(404, f"never rendered: {_short(key)}", "missing")
        if self.discovery is not None:
            found = await self._discover(key)
            if found is not None:
                return found
        return await self.relay.relay(request, key, "missing")

    async def _discover(self, key: str) -> _Answer | None:
        """Offer a miss for discovery; with ``--render-on-miss S``, rush it and wait up to S
        seconds for its snapshot (stored under its discovery spelling)."""
        assert self.discovery is not None
        spelled = self.discovery.offer(key, rush=self.render_on_miss > 0)
        if spelled is None or self.render_on_miss <= 0:
            return None
        await self.discovery.flush()
        deadline = time.monotonic() + self.render_on_miss
        while time.monotonic() < deadline:
            await asyncio.sleep(RENDER_POLL_S)
            found = None
            with contextlib.suppress(EngineError):  # not readable yet: look again
                found = await self._answer(spelled)
            if found is not None:
                return found
        return None

    async def _answer(self, key: str) -> _Answer | None:
        """``key``'s answer from memory, checked against the store if it is older than
        ``REVALIDATE_S``; None when ``key`` was never rendered. A read that fails keeps the
        answer held here (module docstring), or raises when there is none.

        A shared store is read on a thread, once per key at a time: the requests for a key
        that arrive while it is being read wait for that one read (a hot page asked for by
        many crawlers at once costs one pointer read a second, and one fetch when it
        changed), so what is served is never older than ``REVALIDATE_S`` on any host."""
        now = time.monotonic()
        found = self._cache.get(key)
        if found is not None and now - found.checked <= REVALIDATE_S:
            self._cache.move_to_end(key)
            return found
        if self._reads is None:
            return self._kept(key, found, self._read(key, found), now)
        pending = self._reading.get(key)
        if pending is None:
            pending = self._reading[key] = asyncio.ensure_future(self._read_remote(key, found,
                                                                                   now))
        return await asyncio.shield(pending)

    async def _read_remote(self, key: str, found: _Answer | None, now: float) -> _Answer | None:
        try:
            snap = await asyncio.get_running_loop().run_in_executor(
                self._reads, self._read, key, found)
            return self._kept(key, found, snap, now)
        finally:
            del self._reading[key]

    def _read(self, key: str, found: _Answer | None) -> Snapshot | None | EngineError:
        try:
            return self.store.get(key, None if found is None else found.snap)
        except EngineError as e:
            return e

    def _kept(self, key: str, found: _Answer | None, snap: Snapshot | None | EngineError,
              now: float) -> _Answer | None:
        """The answer for what the store said, kept here; a failed read keeps ``found`` (the
        copy held here) or raises."""
        if isinstance(snap, EngineError):
            self.unavailable += 1
            if found is None:
                raise snap
            log.warning("lanes serve: %s: %s; serving the copy held here", _short(key), snap)
            found.checked = now
            return found
        cache = self._cache
        found = cache.get(key)  # the cache may have moved while a remote read was out
        if found is not None and snap == found.snap:
            found.checked = now
            return found
        if found is not None:
            self._drop(key)
        if snap is None:
            return None
        found = cache[key] = _Answer.of(snap, now)
        self._bytes += found.size()
        self._evict()
        return found

    def forget(self, urls: Sequence[str]) -> None:
        """Drop the answers of ``urls``, every variant's (store spellings; none named: every
        answer)."""
        if not urls:
            self._absent.clear()
        for key in variant_rows.all_keys(urls) or list(self._cache):
            self._absent.pop(key, None)
            if key in self._cache:
                self._drop(key)

    def _evict(self) -> None:
        """Least recently used answers out until the rest fit ``CACHE_BYTES`` (the newest
        stays even alone: it is being sent)."""
        while self._bytes > CACHE_BYTES and len(self._cache) > 1:
            self._drop(next(iter(self._cache)))

    def _drop(self, key: str) -> None:
        self._bytes -= self._cache.pop(key).size()


@dataclass
class _Answer:
    """A snapshot ready to send: the headers that do not change with time, and its bodies."""

    snap: Snapshot
    checked: float  # time.monotonic() of the last look at the store
    etag: str
    fixed: dict[str, str]
    html: bytes | None = None

    @classmethod
    def of(cls, snap: Snapshot, now: float) -> _Answer:
        etag = f'W/"{snap.hash[:24]}-{snap.status}"'
        fixed = {**SECURITY_HEADERS, "ETag": etag, "Vary": "Accept-Encoding",
                 "Last-Modified": email.utils.formatdate(snap.rendered_at_ms / 1000,
                                                         usegmt=True),
                 "Content-Security-Policy": _SANDBOX, "X-Lanes-Snapshot": "served",
                 "Content-Type": "text/html; charset=utf-8"}
        if snap.location is not None and 300 <= snap.status < 400:
            fixed["Location"] = snap.location
        return cls(snap, now, etag, fixed)

    def plain(self) -> tuple[bytes, bool]:
        """The HTML, decompressed once and kept; and whether this call made it (its bytes are
        then added to what the cache holds)."""
        if self.html is None:
            self.html = self.snap.html()
            return self.html, True
        return self.html, False

    def size(self) -> int:
        return len(self.snap.gz) + (0 if self.html is None else len(self.html))


class _Spellings:
    """Requested URL -> its store spelling, emptied when it would hold more than ``budget``
    characters (keys and values counted). Emptied whole rather than least recently used: a
    lookup is then one dict read, on the path of every snapshot answer, and bots repeat the
    URLs they ask for, so it fills again at once with those."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._map: dict[str, str] = {}
        self._chars = 0

    def get(self, url: str) -> str | None:
        return self._map.get(url)

    def put(self, url: str, key: str) -> str:
        size = len(url) + len(key)
        if size > self.budget // 64:
            return key  # a very long URL is normalized each time rather than kept
        if self._chars + size > self.budget:
            self._map.clear()
            self._chars = 0
        self._map[url] = key
        self._chars += size
        return key


async def _inflated(request: web.Request, snap: Snapshot,
                    headers: dict[str, str]) -> web.StreamResponse:
    """``snap``'s HTML decompressed as it is sent: at most ``STREAM_PIECE`` of it in memory."""
    response = web.StreamResponse(status=snap.status, headers=headers)
    response.content_length = snap.html_bytes
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    inflate = zlib.decompressobj(wbits=31)  # gzip framing
    data = snap.gz
    try:
        while data and not inflate.eof:
            piece = inflate.decompress(data, STREAM_PIECE)
            data = inflate.unconsumed_tail
            await response.write(piece)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away mid-answer: nothing is owed to it
    return response


def _short(text: str, limit: int = 200) -> str:
    """A reason quoted back to a client, cut: a refusal never echoes 8 KB of its input."""
    return text if len(text) <= limit else text[:limit] + "..."


def _plain(status: int, text: str, state: str,
           extra: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text + "\n",
                        headers={**SECURITY_HEADERS, "X-Lanes-Snapshot": state, **(extra or {})})


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Weak comparison (RFC 9110 13.1.2): ``W/`` is ignored on both sides."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    mine = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == mine for tag in if_none_match.split(","))


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether gzip is acceptable: named (or ``*``) without ``q=0`` (the answers to the few
    headers clients send are kept, at most ``_GZIP_KEPT`` of them)."""
    known = _GZIP_SEEN.get(accept_encoding)
    if known is None:
        known = _parse_gzip(accept_encoding)
        if len(_GZIP_SEEN) >= _GZIP_KEPT:
            _GZIP_SEEN.clear()
        if len(accept_encoding) <= 256:
            _GZIP_SEEN[accept_encoding] = known
    return known


_GZIP_SEEN: dict[str, bool] = {}
_GZIP_KEPT: Final = 256


def _parse_gzip(accept_encoding: str) -> bool:
    for part in accept_encoding.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        if coding in ("gzip", "x-gzip", "*"):
            q = next((p[2:] for p in params if p.startswith("q=")), "1")
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False
