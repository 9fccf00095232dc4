"""The URL of every row of a Redis queue over shards: :class:`ShardedUrls`, a ``RowUrls`` over
one ``RedisUrls`` per shard.

Each shard keeps the URLs of its own rows beside its queue, under its hash tag, so a worker
that claimed a batch on a shard reads its URLs from the same primary, and a URL with its row is
added in one FCALL there (``lanes_add_urls``). A URL belongs to the shard of its hash (CRC-32
of its UTF-8 bytes, modulo the shard count): every host adding the same corpus sends each URL
to the same shard, where the known ones are left alone. The routes a pool started with are
kept with shard 0.

``ShardedEngine.row_urls`` gives the map of a queue over shards, ``engine.redis.restore``
makes one from a pool's checkpoint. This module imports no engine: the engines import it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from ..api import IntArray, RowUrls, Scoped, UrlsAdded
from ..checks import check_mode
from ..errors import EngineValueError
from .codec import now_arg
from .urls import Queue, RedisUrls, checked_rows


class Shards(Protocol):
    """What the URL map reads of a queue over shards (a ``ShardedEngine``)."""

    @property
    def name(self) -> str: ...
    @property
    def shards(self) -> Sequence[Queue]: ...


def shard_of(urls: list[bytes], n: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The shard of each URL (CRC-32 of its UTF-8 bytes, modulo ``n``)."""
    return np.fromiter((zlib.crc32(u) % n for u in urls), np.int64, len(urls))


class ShardedUrls:
    """Row id <-> URL of the sharded queue ``eng`` (which this object uses, never closes)."""

    def __init__(self, eng: Shards) -> None:
        self.engine = eng
        self.name = eng.name
        self.parts = [RedisUrls(shard) for shard in eng.shards]
        self._n = len(self.parts)

    # -- writing ---------------------------------------------------------------------------------

    def add(self, urls: Sequence[str], due_ms: Any, interval_s: Any, provenance: Any = "submitted",
            failures: Any = None, now_ms: int | None = None) -> UrlsAdded:
        """``RedisUrls.add``, each URL on its shard: every URL and row checked before anything
        is sent, then each shard's part in atomic chunks."""
        encoded, blob = checked_rows(urls, due_ms, interval_s, provenance, failures)
        now = now_arg(now_ms)
        rows = np.empty(len(encoded), np.int64)
        new = np.zeros(len(encoded), np.bool_)
        unparked = 0
        shard = shard_of(encoded, self._n)
        for k in np.unique(shard).tolist():
            pos = np.flatnonzero(shard == k)
            got = self.parts[k].add_checked([encoded[i] for i in pos], blob[pos], now)
            rows[pos], new[pos] = got.rows * self._n + k, got.new
            unparked += got.unparked
        return UrlsAdded(rows, new, unparked)

    def store_routes(self, text: str) -> None:
        self.parts[0].store_routes(text)

    def routes(self) -> str | None:
        return self.parts[0].routes()

    def drop(self) -> None:
        """Delete every shard's URL keys and the routes."""
        for part in self.parts:
            part.drop()

    def find_prefix(self, prefix: str) -> tuple[IntArray, list[str]]:
        """``RedisUrls.find_prefix`` of every shard, its rows as this table numbers them."""
        rows, urls = [], []
        for k, part in enumerate(self.parts):
            local, found = part.find_prefix(prefix)
            rows.append(local * self._n + k)
            urls += found
        return np.concatenate(rows), urls

    def prioritize_prefix(self, prefix: str, mode: str = "rush", now_ms: int | None = None
                          ) -> Scoped:
        """``RedisUrls.prioritize_prefix`` on every shard, the shards in parallel (each has
        its own connection; on several servers they work at once)."""
        check_mode(mode)
        now_arg(now_ms)
        with ThreadPoolExecutor(self._n, thread_name_prefix="lanes-scope") as ex:
            parts = list(ex.map(lambda p: p.prioritize_prefix(prefix, mode, now_ms), self.parts))
        return Scoped(sum(p.matched for p in parts), sum(p.done for p in parts))

    # -- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def __getitem__(self, row: int) -> str:
        return self.many([row])[0]

    def many(self, rows: Sequence[int]) -> list[str]:
        """The URLs of ``rows``, one round trip per shard they span."""
        r = np.asarray(rows, np.int64).reshape(-1)
        if len(r) and int(r.min()) < 0:
            raise EngineValueError(f"row {int(r.min())} does not exist")
        out = [""] * len(r)
        shard = r % self._n
        for k in np.unique(shard).tolist():
            pos = np.flatnonzero(shard == k)
            for i, url in zip(pos.tolist(), self.parts[k].many((r[pos] // self._n).tolist()),
                              strict=True):
                out[i] = url
        return out

    def urls(self) -> list[str]:
        """Every URL at its row id (``urls()[row]``); an id no shard has given yet (shards
        fill unevenly) holds ""."""
        per = [part.urls() for part in self.parts]
        out = [""] * max((len(p) - 1) * self._n + k + 1 for k, p in enumerate(per))
        for k, part in enumerate(per):
            out[k::self._n] = part + [""] * (len(out[k::self._n]) - len(part))
        return out

    def find(self, url: str) -> int:
        """The row of ``url``; ``EngineValueError`` if the queue does not hold it."""
        k = int(shard_of([url.encode()], self._n)[0])
        return self.parts[k].find(url) * self._n + k

    def find_many(self, urls: Sequence[str]) -> IntArray:
        """The row of each of ``urls`` (-1 where none), one ``find_many`` per shard."""
        out = np.full(len(urls), -1, np.int64)
        shard = shard_of([u.encode() for u in urls], self._n)
        for k in np.unique(shard).tolist():
            pos = np.flatnonzero(shard == k)
            local = self.parts[k].find_many([urls[i] for i in pos.tolist()])
            out[pos] = np.where(local >= 0, local * self._n + k, -1)
        return out

    def origins(self) -> frozenset[str]:
        return frozenset().union(*(part.origins() for part in self.parts))

    def refresh(self) -> None:
        """Nothing to map: every read goes to the server."""

    def close(self) -> None:
        """Nothing of its own to close (the engine's connections are the caller's)."""

    def statistics(self) -> dict[str, Any]:
        return {"queue": self.name, "urls": len(self), "shards": self._n,
                "routes": self.routes() is not None}


_: type[RowUrls] = ShardedUrls
