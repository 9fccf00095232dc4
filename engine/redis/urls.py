"""The URL of every row of a Redis queue, for render pools on several hosts.

Why in Redis: a pool on one host keeps its URLs in /dev/shm (``engine.shm.urls``), which no
other host can read. Pools on several hosts share one queue, and any host's worker may claim
any row, so the row -> URL map must live beside the queue: two more keys with the queue's hash
tag (one Cluster slot with it), ``lanes:{name}:urls`` (HASH row -> URL) and
``lanes:{name}:url_rows`` (HASH URL -> row). ``lanes:{name}:routes`` keeps the routes a pool
was started with, so ``lanes add --redis`` on any host applies them.

``lanes:{name}:url_index`` (ZSET, every score 0) holds each URL with its row, ``URL \\n row``
(the row as its 8-digit member), so the URLs are in byte order and those under a prefix are one
``ZRANGE ... BYLEX``: a scope of ``POST /api/prioritize`` is matched and prioritized on the
server, a page a call (``lanes_prioritize_prefix``), and no URL crosses the wire. A queue made
before the index gets it filled in (``index``) by the first scope that finds it short.

Rows and their URLs (in all three keys) are added together in one FCALL (``lanes_add_urls``),
so a row is never claimable without its URL, and a URL already known is left alone (a parked
one is made due now): adding the same corpus from every host is harmless, and a second host's
pool starts with the same command as the first. URLs are never removed or changed, so a scan
that runs while others add sees every URL that existed when it began (``urls``).

``RedisUrls`` is an ``engine.api.RowUrls``, as the shared-memory ``UrlTable`` is: ``[row]``,
``many(rows)`` (one HMGET per claimed batch), ``urls()`` in row order (for checkpoints),
``find(url)``, ``find_prefix`` and ``prioritize_prefix``, ``refresh()``, ``close()``,
``len()``.

``RedisEngine.row_urls`` gives the map of a queue; ``engine.redis.restore`` makes a new queue
from a pool's checkpoint, rows and URLs together. This module imports no engine: the engine
imports it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..api import IntArray, RowUrls, Scoped, UrlsAdded
from ..checks import check_mode
from ..corpus.urlnorm import origin_of
from ..errors import EngineError, EngineValueError
from .codec import member, now_arg, packed_rows, queue_keys
from .transport import Transport

URL_CHUNK = 1000
"""URLs per FCALL of ``add``: a big corpus never blocks the server for long (each chunk is
atomic; a failed add leaves whole chunks, and adding the corpus again adds the rest)."""
SCAN_COUNT = 10_000
"""Entries per HSCAN step of ``urls()`` and ``index()``."""
PREFIX_PAGE = 5000
"""URLs per FCALL of ``prioritize_prefix``: tens of milliseconds of the server each (every other
client waits that long: bench_recache); pages of 2,000 to 20,000 cost the server the same
instructions a row (callgrind), so the page is sized for the wait."""


def pool_keys(name: str) -> tuple[str, str, str, str]:
    """The keys a pool keeps beside queue ``name``: urls, url_rows, routes, url_index (same
    hash tag)."""
    return pool_keys_beside(queue_keys(name))


def pool_keys_beside(keys: tuple[str, ...]) -> tuple[str, str, str, str]:
    """The pool's keys beside a queue whose keys are ``keys`` (a shard's have their own tag)."""
    prefix = keys[0].removesuffix("ready")
    return f"{prefix}urls", f"{prefix}url_rows", f"{prefix}routes", f"{prefix}url_index"


def _checked_url(i: int, url: object) -> bytes:
    if not isinstance(url, str) or not url or "\n" in url or "\r" in url:
        raise EngineValueError(f"urls[{i}] = {url!r} is not a one-line, non-empty string")
    try:
        return url.encode()
    except UnicodeEncodeError:
        raise EngineValueError(f"urls[{i}] = {url!r} cannot be written as UTF-8") from None


def checked_rows(urls: Sequence[str], due_ms: Any, interval_s: Any, provenance: Any,
                 failures: Any) -> tuple[list[bytes], npt.NDArray[np.uint8]]:
    """Every URL and row of an add checked, before anything is sent: (the URLs as UTF-8, the
    rows packed as ``lanes_add_urls`` takes them)."""
    encoded = [_checked_url(i, u) for i, u in enumerate(urls)]
    blob = packed_rows(due_ms, interval_s, provenance, failures)
    if len(blob) != len(encoded):
        raise EngineValueError(f"{len(blob)} rows for {len(encoded)} URLs")
    return encoded, blob


class Queue(Protocol):
    """What the URL map reads of its queue (a ``RedisEngine``, which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def keys(self) -> tuple[str, str, str, str, str]: ...
    @property
    def transport(self) -> Transport: ...


class RedisUrls:
    """Row id <-> URL of the Redis queue ``eng`` (which this object uses, never closes)."""

    def __init__(self, eng: Queue) -> None:
        self.engine = eng
        self.name = eng.name
        self._urls, self._url_rows, self._routes, self._index = pool_keys_beside(eng.keys)

    def _plain(self, fn: str, *args: Any) -> Any:
        """A plain command (a read, or an idempotent write): retried on a lost connection."""
        return self.engine.transport.call(fn, lambda r: getattr(r, fn)(*args))

    # -- writing ---------------------------------------------------------------------------------

    def add(self, urls: Sequence[str], due_ms: Any, interval_s: Any, provenance: Any = "submitted",
            failures: Any = None, now_ms: int | None = None) -> UrlsAdded:
        """Queue a row for each URL not known yet (``urls[i]`` with ``due_ms[i]``...); known
        URLs are left alone, except parked rows, made due now. Every URL and row is checked
        before anything is sent; each chunk of ``URL_CHUNK`` is one atomic FCALL."""
        return self.add_checked(*checked_rows(urls, due_ms, interval_s, provenance, failures),
                                now_arg(now_ms))

    def add_checked(self, encoded: list[bytes], blob: npt.NDArray[np.uint8],
                    now: int | str) -> UrlsAdded:
        """``add`` of URLs and rows already checked (``checked_rows``), ``now`` as sent."""
        rows = np.empty(len(encoded), np.int64)
        states = np.empty(len(encoded), np.int64)
        for start in range(0, len(encoded), URL_CHUNK):
            stop = min(len(encoded), start + URL_CHUNK)
            got, state = self.engine.transport.fcall(
                "lanes_add_urls", now, blob[start:stop].tobytes(), *encoded[start:stop],
                extra_keys=(self._urls, self._url_rows, self._index))
            rows[start:stop], states[start:stop] = got, state
        return UrlsAdded(rows, states == 1, int((states == 2).sum()))

    def store_routes(self, text: str) -> None:
        """Keep the routes (``Routes.to_json``) a pool was started with; the last one wins."""
        self._plain("set", self._routes, text)

    def routes(self) -> str | None:
        """The stored routes JSON, or None."""
        text = self._plain("get", self._routes)
        return None if text is None else bytes(text).decode()

    def drop(self) -> None:
        """Delete the URL keys and the routes (``RedisEngine.drop`` deletes the queue's)."""
        self._plain("delete", self._urls, self._url_rows, self._routes, self._index)

    def prioritize_prefix(self, prefix: str, mode: str = "rush", now_ms: int | None = None
                          ) -> Scoped:
        """``prioritize_many`` of the rows whose URL starts with ``prefix``, on the server: a
        page of ``PREFIX_PAGE`` URLs of the index an FCALL, each page's rows checked before any
        changes. A URL added meanwhile may be in or not, as in a scan."""
        rush, now = int(check_mode(mode)), now_arg(now_ms)
        matched = done = 0
        after, filled = b"", False
        while True:
            got = self.engine.transport.fcall(
                "lanes_prioritize_prefix", now, rush, prefix, after, PREFIX_PAGE,
                extra_keys=(self._urls, self._index))
            if got[0] == -1:  # an index short of URLs (nothing changed): fill it in, once
                if filled:
                    raise EngineError(f"queue {self.name!r}: the URL index stays short of"
                                      " the table")
                self.index()
                filled = True
                continue
            matched, done, after = matched + int(got[0]), done + int(got[1]), bytes(got[2])
            if not after:
                return Scoped(matched, done)

    def find_prefix(self, prefix: str) -> tuple[IntArray, list[str]]:
        """The rows whose URL starts with ``prefix``, and their URLs: pages of the index
        (``ZRANGE ... BYLEX``), filled in first if it is short of the table."""
        if int(self._plain("zcard", self._index)) != len(self):
            self.index()

        def scan(client: Any) -> list[bytes]:
            out: list[bytes] = []
            low, high = b"[" + prefix.encode(), b"(" + prefix.encode() + b"\xff"
            while page := client.zrange(self._index, low, high, bylex=True, offset=0,
                                        num=SCAN_COUNT):
                out += page
                low = b"(" + page[-1]
            return out

        found = self.engine.transport.call("ZRANGE BYLEX", scan)
        rows = np.array([int(m[-8:]) for m in found], np.int64)
        return rows, [bytes(m[:-9]).decode() for m in found]

    def origins(self) -> frozenset[str]:
        """``scheme://host[:port]`` of every URL, read off the index by skipping: one
        ``ZRANGE ... BYLEX LIMIT 0 1`` per host (and per character following a host), never
        the URLs themselves."""
        if int(self._plain("zcard", self._index)) != len(self):
            self.index()

        def skip(client: Any) -> frozenset[str]:
            out: set[str] = set()
            low = b"-"
            while page := client.zrange(self._index, low, b"+", bylex=True, offset=0, num=1):
                entry = bytes(page[0])  # URL "\n" row
                origin = origin_of(entry[:-9].decode()).encode()
                out.add(origin.decode())
                # Past every entry that starts as this one does up to the byte after its origin
                # ("/", "?", ":", or the "\n" of a bare origin); UTF-8 never holds 0xff.
                low = b"(" + entry[:len(origin) + 1] + b"\xff"
            return frozenset(out)

        found: frozenset[str] = self.engine.transport.call("ZRANGE BYLEX", skip)
        return found

    def index(self) -> int:
        """Put every URL of the table in the index (``url_index``): a queue made before the
        index has none there. Each entry is a (row, URL) pair, fixed once added, so adding it
        again is harmless and this may run beside adders, or again after a crash midway.
        Returns how many entries the index has."""
        def fill(client: Any) -> int:
            pairs = client.hscan_iter(self._urls, count=SCAN_COUNT)
            while page := list(itertools.islice(pairs, URL_CHUNK)):
                client.zadd(self._index, {u + b"\n" + member(int(r)).encode(): 0
                                          for r, u in page})
            return int(client.zcard(self._index))

        return int(self.engine.transport.call("index URLs", fill))

    # -- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._plain("hlen", self._urls))

    def __getitem__(self, row: int) -> str:
        return self.many([row])[0]

    def many(self, rows: Sequence[int]) -> list[str]:
        """The URLs of ``rows``, in one round trip; ``EngineValueError`` if one has none."""
        if not len(rows):
            return []
        got = self._plain("hmget", self._urls, [int(r) for r in rows])
        missing = [int(r) for r, u in zip(rows, got, strict=True) if u is None]
        if missing:
            raise EngineValueError(f"row {missing[0]} has no URL in {self._urls} (added"
                                   " outside a pool?)")
        return [bytes(u).decode() for u in got]

    def urls(self) -> list[str]:
        """Every URL in row order (an HSCAN, so the server is never blocked for long).

        ``EngineError`` if a row below the last one has no URL (rows added outside a pool)."""
        def scan(client: Any) -> dict[int, str]:
            return {int(r): bytes(u).decode() for r, u in
                    client.hscan_iter(self._urls, count=SCAN_COUNT)}

        by_row = self.engine.transport.call("HSCAN", scan)
        out = [by_row.get(r, "") for r in range(len(by_row))]
        if len(by_row) and max(by_row) != len(by_row) - 1:
            gap = next(r for r in range(len(by_row)) if r not in by_row)
            raise EngineError(f"queue {self.name!r}: row {gap} has no URL (rows were added"
                              " outside a pool)")
        return out

    def find(self, url: str) -> int:
        """The row of ``url``; ``EngineValueError`` if the queue does not hold it."""
        row = self._plain("hget", self._url_rows, url)
        if row is None:
            raise EngineValueError(f"no row has URL {url!r}")
        return int(row)

    def find_many(self, urls: Sequence[str]) -> IntArray:
        """The row of each of ``urls``, -1 where the queue holds none: ``HMGET`` of
        ``URL_CHUNK`` a round trip."""
        out = np.full(len(urls), -1, np.int64)
        for start in range(0, len(urls), URL_CHUNK):
            got = self._plain("hmget", self._url_rows, list(urls[start:start + URL_CHUNK]))
            for i, row in enumerate(got, start):
                if row is not None:
                    out[i] = int(row)
        return out

    def refresh(self) -> None:
        """Nothing to map: every read goes to the server."""

    def close(self) -> None:
        """Nothing of its own to close (the engine's connection is the caller's)."""

    def statistics(self) -> dict[str, Any]:
        return {"queue": self.name, "urls": len(self), "url_key": self._urls,
                "routes": self.routes() is not None}


_: type[RowUrls] = RedisUrls
