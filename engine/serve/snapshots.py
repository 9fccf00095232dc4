"""The prerender endpoint: ``GET /render?url=URL`` and ``GET /{URL}`` answer with a snapshot.

Why it is built this way: prerender middleware (prerender-node and its kin) asks a service for
``<service>/<full URL>`` and relays the answer, status and headers, to the crawler. So an answer
here is what the crawler gets, and must say honestly how old it is:

* a rendered URL answers with its **rendered status** (``Location`` kept for a 3xx), the stored
  HTML, ``Age`` (whole seconds since it was rendered), ``Last-Modified``, a weak ``ETag`` (the
  HTML's hash and the status: 304 on ``If-None-Match``), and the stored gzip as it is when the
  client accepts gzip (decompressed otherwise);
* a URL never rendered is **404**;
* a snapshot older than ``--max-stale F`` × its interval is **503** with ``Retry-After``: stock
  prerender-node relays every status it gets (it calls ``next()``, i.e. falls through to the
  origin, only when the service cannot be reached, or when an ``afterRender`` hook cancels the
  render), so the status a crawler may see must be one that says "try later", never "gone";
  and middleware set to fall through on 503 (an ``afterRender`` that cancels on it, or nginx's
  ``proxy_intercept_errors`` with ``error_page 503``) serves the origin instead.

Every answer carries ``X-Lanes-Snapshot: served | stale | missing``, so a middleware can tell a
rendered 404 (``served``) from a URL never rendered (``missing``).

Nothing here waits on the pool: a snapshot is read from the local store. The answers of hot
URLs are kept in memory, their fixed headers built once, and checked against the store at most
every ``REVALIDATE_S`` (a new render is served within that); a check that finds the same HTML
reads no file. Each hit is noted in memory with its age ÷ interval and written to the store's
hit log in batches, from a thread with its own connection, every ``FLUSH_S``.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from ..checks import wall_ms
from ..errors import EngineError
from ..store import Snapshot, SnapshotStore
from ..urlnorm import normalize_url
from .auth import SECURITY_HEADERS, SNAPSHOT_ROUTE

FLUSH_S: Final = 1.0
MAX_PENDING: Final = 100_000
"""Hits waiting for the hit log beyond this are dropped (and counted): a store that cannot keep
up must cost the log, never the server's memory."""

log = logging.getLogger(__name__)

REVALIDATE_S: Final = 1.0
CACHE_BYTES: Final = 64 << 20
"""The answers kept in memory, gzip and (once asked for) plain HTML counted, least recently
used dropped first."""

_SANDBOX: Final = "sandbox"  # a snapshot opened in a browser runs in no origin: not the server's


class HitLog:
    """Hits noted by the event loop, written to the store's hit log by a thread of its own."""

    def __init__(self, directory: str) -> None:
        self._store = SnapshotStore.open(directory, create=False)
        self._pending: list[tuple[int, int, int, float, bool]] = []
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lanes-serve-hits")
        self.noted = 0
        self.written = 0
        self.dropped = 0  # noted past MAX_PENDING, or lost with a batch the store refused
        self._task: asyncio.Task[None] | None = None

    def note(self, snap: Snapshot, at_ms: int, ratio: float, served: bool) -> None:
        self.noted += 1
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append((at_ms, snap.id, snap.lane, ratio, served))

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
        if batch:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._write, batch)

    def _write(self, batch: list[tuple[int, int, int, float, bool]]) -> None:
        try:
            self._store.log_hits(batch)
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

    def __init__(self, store: SnapshotStore, hits: HitLog, max_stale: float | None) -> None:
        self.store = store
        self.hits = hits
        self.max_stale = max_stale
        self._cache: OrderedDict[str, _Answer] = OrderedDict()
        self._bytes = 0  # gzip bytes held by _cache

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/render", self.by_query, name=f"{SNAPSHOT_ROUTE}-query")
        app.router.add_get(r"/{target:https?:/.*}", self.by_path, name=f"{SNAPSHOT_ROUTE}-path")

    async def by_query(self, request: web.Request) -> web.StreamResponse:
        url = request.query.get("url")
        if not url:
            return _plain(400, "give the page as /render?url=URL", "missing")
        return self.answer(request, url)

    async def by_path(self, request: web.Request) -> web.StreamResponse:
        target = request.raw_path[1:]  # the URL as sent, query included, escapes kept
        scheme, _, rest = target.partition(":")
        return self.answer(request, f"{scheme}://{rest.lstrip('/')}")  # "https:/x": a proxy
        # merged the slashes

    def answer(self, request: web.Request, url: str) -> web.StreamResponse:
        key = _normal(url)
        if isinstance(key, Exception):
            return _plain(400, f"not an absolute http(s) URL: {key}", "missing")
        found = self._answer(key)
        if found is None:
            return _plain(404, f"never rendered: {key}", "missing")
        snap = found.snap
        now = wall_ms()
        ratio = snap.age_over_interval(now)
        served = self.max_stale is None or ratio <= self.max_stale
        self.hits.note(snap, now, ratio, served)
        if not served:
            return _plain(503, f"the snapshot of {key} is {ratio:.2f} x its interval old, past"
                          f" --max-stale {self.max_stale}", "stale",
                          {"Retry-After": str(min(snap.interval_s, 3600))})
        headers = {**found.fixed, "Age": str(snap.age_s(now)),
                   "X-Lanes-Age-Over-Interval": f"{ratio:.3f}"}
        if _matches(request.headers.get("If-None-Match"), found.etag):
            del headers["Content-Type"]
            return web.Response(status=304, headers=headers)
        if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
            headers["Content-Encoding"] = "gzip"
            return web.Response(status=snap.status, body=snap.gz, headers=headers)
        return web.Response(status=snap.status, body=found.plain(), headers=headers)

    def _answer(self, key: str) -> _Answer | None:
        """``key``'s answer from memory, checked against the store if it is older than
        ``REVALIDATE_S``; None when ``key`` was never rendered."""
        now = time.monotonic()
        cache = self._cache
        found = cache.get(key)
        if found is not None and now - found.checked <= REVALIDATE_S:
            cache.move_to_end(key)
            return found
        snap = self.store.get(key, None if found is None else found.snap)
        if found is not None and snap == found.snap:
            found.checked = now
            cache.move_to_end(key)
            return found
        if found is not None:
            self._drop(key)
        if snap is None:
            return None
        found = cache[key] = _Answer.of(snap, now)
        self._bytes += len(snap.gz)
        while self._bytes > CACHE_BYTES and len(cache) > 1:
            self._drop(next(iter(cache)))
        return found

    def _drop(self, key: str) -> None:
        self._bytes -= len(self._cache.pop(key).snap.gz)


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

    def plain(self) -> bytes:
        """The HTML, decompressed once (not counted in ``CACHE_BYTES``: most clients take
        gzip)."""
        if self.html is None:
            self.html = self.snap.html()
        return self.html


@functools.lru_cache(maxsize=1 << 16)
def _normal(url: str) -> str | Exception:
    """A requested URL in the store's spelling, or why it is none (kept: bots repeat)."""
    try:
        return normalize_url(url)
    except EngineError as e:
        return e.with_traceback(None)  # kept without the frames it was raised in


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
    """Whether gzip is acceptable: named (or ``*``) without ``q=0``."""
    for part in accept_encoding.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        if coding in ("gzip", "x-gzip", "*"):
            q = next((p[2:] for p in params if p.startswith("q=")), "1")
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False
