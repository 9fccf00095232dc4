"""Each URL's pointer, and the hit log, of a shared store: in the pool's Redis, where every host
sees a write at once.

Why Redis: the queue of a farm already lives there, so a pointer costs one more field in a
server every host reaches, and a host that serves reads it in one round trip (``HGET``). Object
storage keeps the bodies (:mod:`engine.store.s3`); listing it to find a URL's latest body would
cost a request per URL and see writes late.

Keys (one hash tag, so a Redis Cluster keeps them in one slot)::

    lanes:store:{BUCKET/PREFIX}:pointers   hash  URL -> JSON array (POINTER_FIELDS)
    lanes:store:{BUCKET/PREFIX}:ids        string, the last id given to a URL
    lanes:store:{BUCKET/PREFIX}:hits       sorted set, score at_ms: "id,lane,ratio,served,bot,uniq"
    lanes:store:{BUCKET/PREFIX}:bots       hash  "BOT:n" / "BOT:o" -> requests / relayed

A pointer is set by one script (``SET_POINTER``) that compares and sets in one step, so it can
be sent again after a lost connection or a failover (``Transport.call`` retries it): a replay
of the same render is ``SAME`` and changes nothing, a render older than the pointer's is
``OLDER`` and changes nothing (renders are at least once: a slow one must not bring an old page
back), and a render whose body the pointer does not name yet is ``UPLOAD`` until the caller has
made that body durable. With ``?wait_replicas=N`` in the Redis URL a pointer is acknowledged
only once N replicas have it (``WAIT``), so a failover cannot lose it; fewer is a
:class:`~engine.errors.StoreError` and the render is retried.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np

from ..errors import EngineError, StoreError
from ..redis.transport import Transport
from . import api

POINTER_FIELDS: Final = ("id", "digest", "status", "location", "rendered_at_ms", "interval_s",
                         "lane", "html_bytes", "gz_bytes", "render_ms", "renders", "unchanged")
TIMEOUT_S: Final = 10.0
"""How long a lost Redis is retried before a call fails (a failover takes a few seconds)."""

SET_POINTER: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local p = raw and cjson.decode(raw)
local at = tonumber(ARGV[4])
if ARGV[3] ~= '1' and (not p or p[2] ~= ARGV[2]) then return {'UPLOAD', ''} end
if p and p[5] > at then return {'OLDER', p[2]} end
if p and p[5] == at and p[2] == ARGV[2] then return {'SAME', p[2]} end
local id, renders, unchanged = 0, 1, 0
if p then
  id, renders = p[1], p[11] + 1
  unchanged = p[12] + ((p[2] == ARGV[2]) and 1 or 0)
else
  id = redis.call('INCR', KEYS[2])
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({id, ARGV[2], tonumber(ARGV[5]), ARGV[6], at,
  tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]),
  tonumber(ARGV[11]), renders, unchanged}))
return {'SET', p and p[2] or ''}
"""
"""KEYS: pointers, ids. ARGV: url, digest, uploaded (1: the body is durable), rendered_at_ms,
status, location ("" for none), interval_s, lane, html bytes, gz bytes, render_ms. Replies
``{verdict, the digest the pointer held}``."""


def decode(raw: bytes | str) -> list[Any]:
    """A pointer's JSON array (``POINTER_FIELDS``), its location None when it has none."""
    p: list[Any] = json.loads(raw)
    if not p[3]:
        p[3] = None
    return p


class Pointers:
    """The pointers and hit log of the store ``name`` (``BUCKET/PREFIX``) in the Redis at
    ``url``; safe to share between threads (redis-py's pool), opened after a fork."""

    def __init__(self, url: str, name: str) -> None:
        base = f"lanes:store:{{{name}}}:"
        self.key, self.ids, self.hit_key, self.bots = (base + k for k in (
            "pointers", "ids", "hits", "bots"))
        self.transport = Transport(url, f"store {name}", (self.key,), "", TIMEOUT_S)
        self._uniq = f"{os.getpid():x}{secrets.token_hex(3)}"
        self._noted = 0

    def close(self) -> None:
        self.transport.close()

    def _call(self, what: str, command: Any) -> Any:
        try:
            return self.transport.call(what, command)
        except StoreError:
            raise
        except EngineError as e:
            raise StoreError(f"cannot {what}: {e}") from None

    # -- pointers -------------------------------------------------------------------------------

    def get(self, url: str) -> list[Any] | None:
        raw = self._call("read a pointer", lambda c: c.hget(self.key, url))
        return None if raw is None else decode(raw)

    def write(self, url: str, digest: str, uploaded: bool, meta: Sequence[Any]) -> tuple[str, str]:
        """Run ``SET_POINTER``: (verdict, the digest the pointer held). ``meta``: rendered at,
        status, location, interval, lane, html bytes, gz bytes, render ms."""
        at, status, location, *rest = meta
        args = (url, digest, int(uploaded), at, status, location or "", *rest)
        t = self.transport
        wait = t.wait_replicas

        def run(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.eval(SET_POINTER, 2, self.key, self.ids, *args)
            if wait:
                pipe.execute_command("WAIT", wait, t.wait_ms)
            return pipe.execute()

        replies = self._call("write a pointer", run)
        verdict, held = (v.decode() if isinstance(v, bytes) else str(v) for v in replies[0])
        if wait and verdict in ("SET", "SAME") and int(replies[1]) < wait:
            raise StoreError(f"the pointer of {url!r} reached {int(replies[1])} of {wait}"
                             f" replica(s) of {t.where}: a failover may lose it, so it is not"
                             " acknowledged (the render is retried)")
        return verdict, held

    def delete(self, urls: Sequence[str]) -> int:
        if not urls:
            return 0
        return int(self._call("clear pointers", lambda c: c.hdel(self.key, *urls)))

    def scan(self) -> Iterator[tuple[str, list[Any]]]:
        """Every (url, pointer), read in batches (HSCAN: a large store never blocks Redis)."""
        rows = self._call("list pointers", lambda c: list(c.hscan_iter(self.key, count=1000)))
        for url, raw in rows:
            yield url.decode("utf-8", "surrogateescape"), decode(raw)

    def digests(self) -> set[str]:
        return {p[1] for _u, p in self.scan()}

    def memory(self) -> tuple[int, int]:
        """(bytes Redis holds for the pointers, how many): ``MEMORY USAGE`` of the hash."""
        used, n = self._call("measure the pointers", lambda c: (
            c.memory_usage(self.key, samples=0), c.hlen(self.key)))
        return int(used or 0), int(n)

    # -- the hit log ----------------------------------------------------------------------------

    def log_hits(self, hits: Sequence[tuple[int, int, int, float, bool, int]],
                 requests: dict[int, tuple[int, int]] | None = None) -> None:
        entries: dict[str, int] = {}
        for at, sid, lane, ratio, served, bot in hits:
            self._noted += 1
            entries[f"{sid},{lane},{ratio!r},{int(served)},{bot},{self._uniq}{self._noted:x}"
                    ] = int(at)
        newest = max(entries.values(), default=0)

        def run(client: Any) -> Any:
            pipe = client.pipeline(transaction=True)
            for bot, (n, o) in (requests or {}).items():
                pipe.hincrby(self.bots, f"{bot}:n", n)
                pipe.hincrby(self.bots, f"{bot}:o", o)
            if entries:
                pipe.zadd(self.hit_key, entries)
                pipe.zremrangebyscore(self.hit_key, "-inf", f"({newest - api.HIT_WINDOW_MS}")
                pipe.zremrangebyrank(self.hit_key, 0, -api.HIT_CAP - 1)
            return pipe.execute()

        # Not replayed on a lost connection by hand: a hit log entry counted twice is better
        # than a server that stalls; Transport.call retries only what did not reach Redis.
        self._call("log hits", run)

    def hit_rows(self, since_ms: int) -> np.ndarray:
        """The hits since ``since_ms`` as rows of (id, lane, ratio, served, bot), float64."""
        got = self._call("read hits", lambda c: c.zrangebyscore(self.hit_key, int(since_ms),
                                                                  "+inf"))
        rows = [tuple(float(x) for x in m.split(b",")[:5]) for m in got]
        return np.array(rows, dtype=np.float64).reshape(-1, 5)

    def bot_requests(self) -> dict[int, tuple[int, int]]:
        raw = self._call("read the requests per crawler", lambda c: c.hgetall(self.bots))
        out: dict[int, list[int]] = {}
        for field, value in raw.items():
            bot, _, kind = field.decode().partition(":")
            out.setdefault(int(bot), [0, 0])[kind == "o"] = int(value)
        return {b: (n, o) for b, (n, o) in out.items()}

    def count_hits(self) -> int:
        return int(self._call("count hits", lambda c: c.zcard(self.hit_key)))

    def drop(self) -> None:
        """Delete every key of the store (tests, and a store migrated away)."""
        self._call("drop the store's keys", lambda c: c.delete(self.key, self.ids, self.hit_key,
                                                               self.bots))
