"""The URL of every row of a Redis queue, for render pools on several hosts.

Why in Redis: a pool on one host keeps its URLs in /dev/shm (``engine.shm.urls``), which no
other host can read. Pools on several hosts share one queue, and any host's worker may claim
any row, so the row -> URL map must live beside the queue: two more keys with the queue's hash
tag (one Cluster slot with it), ``lanes:{name}:urls`` (HASH row -> URL) and
``lanes:{name}:url_rows`` (HASH URL -> row). ``lanes:{name}:routes`` keeps the routes a pool
was started with, so ``lanes add --redis`` on any host applies them.

Rows and their URLs are added together in one FCALL (``lanes_add_urls``), so a row is never
claimable without its URL, and a URL already known is left alone (a parked one is made due
now): adding the same corpus from every host is harmless, and a second host's pool starts with
the same command as the first. URLs are never removed or changed, so a scan that runs while
others add sees every URL that existed when it began (``urls``).

``RedisUrls`` is an ``engine.api.RowUrls``, as the shared-memory ``UrlTable`` is: ``[row]``,
``many(rows)`` (one HMGET per claimed batch), ``urls()`` in row order (for checkpoints),
``find(url)``, ``refresh()``, ``close()``, ``len()``.

``restore`` makes a new queue from a pool's checkpoint, rows and URLs together (``lanes pool
--resume --redis``), whichever backend wrote it: a queue moves from one host's shared memory to
Redis, and back with ``lanes pool --resume`` on shared memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..api import RowUrls
from ..checkpoint import Checkpoint
from ..errors import EngineError, EngineValueError, SegmentExists, SegmentMissing
from ..policy import LanePolicy
from .codec import MAX_ROWS, now_arg, packed_rows, queue_keys
from .engine import RedisEngine
from .transport import redact

URL_CHUNK = 1000
"""URLs per FCALL of ``add``: a big corpus never blocks the server for long (each chunk is
atomic; a failed add leaves whole chunks, and adding the corpus again adds the rest)."""
SCAN_COUNT = 10_000
"""Entries per HSCAN step of ``urls()``."""


def pool_keys(name: str) -> tuple[str, str, str]:
    """The keys a pool keeps beside queue ``name``: urls, url_rows, routes (same hash tag)."""
    return pool_keys_beside(queue_keys(name))


def pool_keys_beside(keys: tuple[str, ...]) -> tuple[str, str, str]:
    """The pool's keys beside a queue whose keys are ``keys`` (a shard's have their own tag)."""
    prefix = keys[0].removesuffix("ready")
    return f"{prefix}urls", f"{prefix}url_rows", f"{prefix}routes"


@dataclass(frozen=True)
class UrlsAdded:
    """What ``RedisUrls.add`` did, per URL given: its row and whether it was new."""

    rows: npt.NDArray[np.int64]
    new: npt.NDArray[np.bool_]
    unparked: int

    @property
    def added(self) -> int:
        return int(self.new.sum())

    @property
    def known(self) -> int:
        return len(self.new) - self.added


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


class RedisUrls:
    """Row id <-> URL of the Redis queue ``eng`` (which this object uses, never closes)."""

    def __init__(self, eng: RedisEngine) -> None:
        self.engine = eng
        self.name = eng.name
        self._urls, self._url_rows, self._routes = pool_keys_beside(eng.keys)

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
                extra_keys=(self._urls, self._url_rows))
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
        self._plain("delete", self._urls, self._url_rows, self._routes)

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

    def refresh(self) -> None:
        """Nothing to map: every read goes to the server."""

    def close(self) -> None:
        """Nothing of its own to close (the engine's connection is the caller's)."""

    def statistics(self) -> dict[str, Any]:
        return {"queue": self.name, "urls": len(self), "url_key": self._urls,
                "routes": self.routes() is not None}


def restore(ck: Checkpoint, url: str, name: str, policy: LanePolicy | None = None,
            capacity: int | None = None, *, connect: Callable[..., Any] = RedisEngine.connect,
            table_of: Callable[[Any], Any] = RedisUrls) -> tuple[Any, Any]:
    """A new queue ``name`` at ``url`` holding a pool checkpoint's rows and their URLs, row ids
    renumbered from 0 in saved order (as ``Engine.from_checkpoint`` does on shared memory); the
    saved policy unless given, no bound on rows unless ``capacity``.

    Refused with ``SegmentExists`` when the queue, or URL keys of an earlier one, exist: a Redis
    queue outlives its pools, so the way on is to join it, or to resume into another name. Rows
    and URLs go in together (``RedisUrls.add``: a row is never claimable without its URL);
    if the restore fails the new queue is deleted again. ``connect`` and ``table_of`` open the
    queue and its URL map (``engine.redis.shard_urls.restore`` passes those of a queue over
    shards)."""
    if ck.urls is None:
        raise EngineValueError(f"the checkpoint of {ck.name!r} holds no URLs: not a pool"
                               " checkpoint")
    if capacity is not None and not (isinstance(capacity, int) and len(ck) <= capacity
                                     <= MAX_ROWS):
        raise EngineValueError(f"capacity {capacity!r} must be an int in [{len(ck)}, {MAX_ROWS}]"
                               f" (the checkpoint holds {len(ck)} rows)")
    taken = SegmentExists(
        f"queue {name!r} already exists at {redact(url)}: a queue on Redis outlives its pools,"
        f" so join it as it is (`lanes pool {name} --redis URL` without --resume), resume into"
        " a new queue name, or delete this queue first if the checkpoint is to replace it")
    try:
        connect(url, name).close()
    except SegmentMissing:
        pass
    else:
        raise taken
    eng = connect(url, name, ck.policy if policy is None else policy, create=True,
                  capacity=capacity)
    table = table_of(eng)
    if not eng.created:  # another host made it meanwhile
        eng.close()
        raise taken
    left = len(table)
    if left:
        eng.drop()
        eng.close()
        raise SegmentExists(f"queue {name!r} at {redact(url)} is gone but the URL keys of an"
                            f" earlier queue of that name remain ({left} URLs): delete them,"
                            " or resume into a new queue name")
    try:
        got = table.add(ck.urls, ck.due_ms, ck.interval_s, ck.provenance, ck.failures)
        if got.added != len(ck) or eng.stats()["rows"] != len(ck):
            raise EngineError(f"queue {name!r}: rows were added by someone else during the"
                              " restore")
        for i in np.flatnonzero(ck.urgent):
            # A rush puts the row in the urgent lane due at `now_ms`: at its saved due time.
            eng.prioritize(int(got.rows[i]), "rush", now_ms=int(ck.due_ms[i]))
    except BaseException:
        table.drop()
        eng.drop()
        eng.close()
        raise
    return eng, table


_: type[RowUrls] = RedisUrls
