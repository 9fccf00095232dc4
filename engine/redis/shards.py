"""A Redis queue over N shards: :class:`ShardedEngine`, an :class:`engine.api.QueueEngine` over
N ``RedisEngine``s, each a whole queue under a hash tag of its own.

Why: a queue's keys share one hash tag, so one Cluster slot, so one primary: its memory and its
CPU are one node's. Spread over N tags that fall on different primaries (:func:`place`), one
logical queue holds N nodes' worth of rows, and N primaries run its claim passes.

How it stays correct: nothing spans shards. Each shard is a whole queue (lanes, policy,
leases, counters and, for a pool, its URLs), and every write and claim pass is one FCALL on one
shard, atomic there exactly as on a single queue. This module only routes:

* Row ids are ``local * N + shard``: the shard is ``row % N``, one modulo and no lookup, and
  ids stay dense (a fresh queue filled by one writer numbers its rows 0, 1, 2, ... as a single
  queue does, :func:`spread`), so what is indexed by row id (a checkpoint's URLs, a pool's
  lists) stays the size of the queue. A shard number in the high bits would map back as
  cheaply but make ids sparse: shard 1's first row would be 2**40.
* Tokens are ``local_token * N + shard``. Shards issue their tokens independently (from the
  server's clock), so two shards can issue the same local token; a token is sent to a shard
  only if that shard issued it, and is otherwise stale, as a foreign token is on one queue.
* Rows added with URLs (``shard_urls.ShardedUrls``) go to the shard of their URL's hash, so a
  URL is known to one shard only and is added there with its row in one FCALL; rows added
  without URLs fill the lowest free row ids (:func:`spread`), which keeps the shards level.
* A claim asks one shard. A client starts at a random shard, makes ``STAY`` passes there and
  goes on to the next; a pass that comes back short moves it on at once, and the rest of the
  budget is asked of the following shards in turn (each at most once per call). A worker's
  cycle (``complete_and_claim``) is then one FCALL on most cycles: it completes and claims on
  the shard it stays at. Each shard's pass shares its grants between lanes as the policy says,
  and every client spreads its passes evenly over the shards, so the union does too.

The shard count is fixed when the queue is made and recorded (``catalog``); ``shards=1`` is a
single queue with no record, the layout of ``RedisEngine``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import Iterator
from types import TracebackType
from typing import Any, ClassVar

import numpy as np
import redis.exceptions as redis_errors

from .. import checkpoint
from ..api import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_MS,
    DEFAULT_WINDOW,
    BoolArray,
    IntArray,
    LaneStats,
    QueueEngine,
    Restamped,
    RowInfo,
    Stats,
    VerifyWalk,
)
from ..checks import (
    check_bool,
    check_int,
    check_mode,
    check_token,
    claim_args,
    is_number,
    rows_tokens,
)
from ..errors import CapacityError, EngineError, EngineTypeError, EngineValueError, SegmentMissing
from ..keys import as_int64_array, check_due_array
from ..policy import LanePolicy
from .catalog import (
    MAX_SHARDS,
    SHARD_LAYOUT,
    Catalog,
    ShardsMismatch,
    catalog_key,
    refuse_count,
    shard_keys,
)
from .codec import LIBRARY_VERSION, MAX_ROWS, RedisClaims, now_arg, packed_rows, queue_keys
from .engine import HEARTBEAT_TTL_MS, RedisEngine, _check_name, add_one
from .shard_urls import ShardedUrls
from .transport import Transport, redact

STAY = 4
"""Claim passes a client makes on one shard before it goes on to the next (a short pass moves
it on at once): a worker's cycle completes and claims on one shard on most cycles."""
PLACE_TRIES = 10_000
"""Tags tried per shard to find one whose slot a given primary serves (about one in P does)."""


def connect(url: str, name: str, policy: LanePolicy | None = None, create: bool = False, *,
            shards: int | None = None, **options: Any) -> RedisEngine | ShardedEngine:
    """``Engine.connect``: queue ``name`` at ``url`` as it is (``shards=None``: one queue, or
    over the shards its record names), or over exactly ``shards`` shards (a queue with another
    count is refused with ``ShardsMismatch``, saying how to move). A queue made here has
    ``shards`` shards (None: 1)."""
    if shards is not None:
        check_int(shards, "shards", 1, MAX_SHARDS)
    if shards is not None and shards > 1:
        return ShardedEngine.connect(url, name, policy, create, shards=shards, **options)
    try:
        return RedisEngine.connect(url, name, policy, create, **options)
    except ShardsMismatch as e:
        if shards is not None:
            raise
        return ShardedEngine.connect(url, name, policy, create, shards=e.shards, **options)


def spread(levels: IntArray, room: IntArray, m: int) -> IntArray:
    """How many of ``m`` new rows each shard takes (at most its ``room``), so that they get the
    lowest free row ids: shard s's next id is ``levels[s] * N + s``. A shard that is behind
    catches up first; a full one is passed over. The caller checks ``m <= room.sum()``."""
    def below(level: int) -> IntArray:  # rows each shard takes to have its ids below level*N
        return np.minimum(room, np.maximum(0, level - levels))

    lo, hi = int(levels.min()), int(levels.max()) + m
    while lo < hi:  # the lowest level T with room for m rows below T * N
        mid = (lo + hi) // 2
        if int(below(mid).sum()) >= m:
            hi = mid
        else:
            lo = mid + 1
    take = below(lo - 1)
    last = np.flatnonzero((levels + take == lo - 1) & (take < room))  # level lo-1, by shard
    take[last[:m - int(take.sum())]] += 1
    return take


def place(name: str, n: int, cat: Transport) -> tuple[str, ...]:
    """The hash tags of a new queue's ``n`` shards: shard 0's is the name; on a Cluster each
    next one is picked so that its slot falls on the next primary (in node order) after shard
    0's, so N shards on N primaries use every one. Standalone, ``name#i``."""
    if cat.cluster is None:
        return (name, *(f"{name}#{i}" for i in range(1, n)))

    def owner(tag: str) -> str:
        return str(cat.cluster.get_node_from_key(shard_keys(name, tag)[0]).name)

    primaries = sorted(str(p.name) for p in cat.cluster.get_primaries())
    first = primaries.index(owner(name))
    tags = [name]
    for i in range(1, n):
        want = primaries[(first + i) % len(primaries)]
        tags.append(next((tag for k in range(PLACE_TRIES)
                          if owner(tag := f"{name}#{i}.{k}") == want), f"{name}#{i}"))
    return tuple(tags)


def _next_row_of(meta: str, client: Any) -> Any:
    return client.hget(meta, "next_row")


def _levels(meta: str, client: Any) -> Any:
    """A shard's (next_row, capacity) from its meta."""
    return client.hmget(meta, "next_row", "capacity")


def _made_alone(client: Any, *, record: str, text: str, meta: str) -> bool:
    """SET the record if absent, and only while no single queue of that name exists (WATCHed:
    a single queue made meanwhile aborts it). Whether it was set."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(meta)
            if pipe.exists(meta):
                return False
            pipe.multi()
            pipe.set(record, text, nx=True)
            return bool(pipe.execute()[0])
        except redis_errors.WatchError:
            return False


class ShardedEngine:
    """A claim queue in Redis over N shards (see the module's note and docs/redis.md "Shards").

    Made by :meth:`connect` (or ``Engine.connect(..., shards=N)``). ``shards`` are the
    ``RedisEngine`` of each shard, in shard order.
    """

    supports_compact: ClassVar[bool] = False
    spans_hosts: ClassVar[bool] = True
    writes_whole: ClassVar[bool] = True

    def __init__(self, name: str, catalog: Catalog, shards: list[RedisEngine],
                 record: Transport, created: bool) -> None:
        self._name = name
        self.catalog = catalog
        self.shards = shards
        self._n = len(shards)
        self._record = record
        self.created = created
        """Whether this object's ``connect`` made the queue."""
        self._cursor = random.randrange(self._n)
        self._cursor_pid = os.getpid()
        self._stayed = 0
        self._known = [0] * self._n
        """Per shard, rows it is known to hold (``_groups``)."""

    # -- lifetime ------------------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str, name: str, policy: LanePolicy | None = None,
                create: bool = False, *, shards: int | None = None,
                capacity: int | None = None, upgrade: bool = False, timeout: float = 10.0,
                cluster: bool | None = None, wait_replicas: int | None = None) -> ShardedEngine:
        """Queue ``name`` at ``url`` over its shards (``RedisEngine.connect`` says what every
        argument means). ``shards``: the count it must have (None: whatever its record says);
        with ``create``, a missing queue is made with that many (2 at least: one shard is a
        ``RedisEngine``), and ``capacity`` rows in all (split evenly; default ``MAX_ROWS`` a
        shard). A single queue, or a queue of another count, is refused (``ShardsMismatch``),
        saying how to move. ``wait_replicas`` holds for every shard's writes."""
        if not isinstance(url, str):
            raise EngineTypeError("url must be a str")
        name = _check_name(name)
        n = None if shards is None else check_int(shards, "shards", 2, MAX_SHARDS)
        check_bool(create, "create")
        if create and n is None:
            raise EngineValueError("create=True needs shards=N: how many shards to make")
        if capacity is not None:
            check_int(capacity, "capacity", n or 1, MAX_ROWS * (n or 1))
        if not is_number(timeout) or not 0 <= timeout < 86_400:
            raise EngineValueError("timeout must be a number of seconds in [0, 86400)")
        record = Transport(url, name, (catalog_key(name),), LIBRARY_VERSION, float(timeout))
        try:
            record.retrying(lambda: record.live().ping(), "cannot reach")
            if cluster if cluster is not None else record.is_cluster_node():
                record.join_cluster()
            cat, made = cls._catalog(record, name, n, create)
            engines = cls._open_shards(url, name, cat, policy, create, capacity,
                                       {"upgrade": upgrade, "timeout": timeout,
                                        "cluster": cluster, "wait_replicas": wait_replicas})
        except BaseException:
            record.close()
            raise
        return cls(name, cat, engines, record, made)

    @staticmethod
    def _catalog(record: Transport, name: str, n: int | None, create: bool) -> tuple[Catalog,
                                                                                     bool]:
        """(The queue's record, whether this call made it): read, checked against ``n``, or
        made when missing and ``create``."""
        key, meta = catalog_key(name), queue_keys(name)[3]
        for _ in range(3):
            text = record.call("GET", lambda r: r.get(key))
            if text is not None:
                cat = Catalog.from_json(name, text)
                if n is not None and cat.shards != n:
                    raise refuse_count(name, cat.shards, n)
                return cat, False
            if record.call("EXISTS", lambda r: r.exists(meta)):
                raise refuse_count(name, 1, n or 1)
            if not create or n is None:
                raise SegmentMissing(f"no queue {name!r} at {redact(record.url)} (connect with"
                                     " create=True and shards=N to make it)")
            cat = Catalog(SHARD_LAYOUT, place(name, n, record))
            text = cat.to_json()
            if record.call("SET", functools.partial(_made_alone, record=key, text=text,
                                                    meta=meta)):
                return cat, True
        raise EngineError(f"queue {name!r} kept changing while being made: connect again")

    @staticmethod
    def _open_shards(url: str, name: str, cat: Catalog, policy: LanePolicy | None,
                     create: bool, capacity: int | None, options: dict[str, Any],
                     ) -> list[RedisEngine]:
        n = cat.shards
        engines: list[RedisEngine] = []
        try:
            for i, tag in enumerate(cat.tags):
                cap = None if capacity is None else capacity // n + (i < capacity % n)
                engines.append(RedisEngine.connect(url, name, policy, create, capacity=cap,
                                                   shard_keys=shard_keys(name, tag), **options))
        except BaseException:
            for eng in engines:
                eng.close()
            raise
        return engines

    @property
    def name(self) -> str:
        return self._name

    @property
    def url(self) -> str:
        """The server's URL (the one connected to), without its password."""
        return self.shards[0].url

    @property
    def at(self) -> int:
        """The shard this client's next claim pass goes to."""
        return self._cursor

    @property
    def transport(self) -> Transport:
        """Shard 0's connection (its server holds the queue's record)."""
        return self.shards[0].transport

    @property
    def owner(self) -> str:
        """This process's lease-owner id, the same on every shard."""
        return self.shards[0].owner

    def close(self) -> None:
        """Drop the connections. The queue stays on the server (see ``drop``)."""
        for eng in self.shards:
            eng.close()
        self._record.close()

    def drop(self) -> None:
        """Delete every shard's keys and the queue's record."""
        for eng in self.shards:
            eng.drop()
        self._record.call("DEL", lambda r: r.delete(catalog_key(self._name)))

    unlink = drop

    def __enter__(self) -> ShardedEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.transport.client is None else "open"
        return f"<ShardedEngine {self._name!r} over {self._n} shards at {self.url} {state}>"

    # -- routing ---------------------------------------------------------------------------------

    def _row(self, row: object) -> int:
        return check_int(row, "row", 0, MAX_ROWS * self._n - 1)

    @contextlib.contextmanager
    def _shard(self, k: int, row: int | None = None) -> Iterator[RedisEngine]:
        """Shard ``k``, whose errors say which shard they come from (and the row in global
        ids: the shard's messages name its own)."""
        try:
            yield self.shards[k]
        except EngineError as e:
            where = f"shard {k} of {self._n}"
            if row is not None:
                where += f", whose row {row // self._n} is row {row}"
            e.args = (f"{e} [{where}]",)
            raise

    @contextlib.contextmanager
    def _holding(self, row: object) -> Iterator[tuple[RedisEngine, int, int]]:
        """(the shard of ``row``, the row's id there, the row's id checked)."""
        r = self._row(row)
        with self._shard(r % self._n, r) as eng:
            yield eng, r // self._n, r

    def _local_token(self, row: int, token: object) -> int:
        """A global token as shard ``row % N`` knows it: 0 (never live) if it did not issue it."""
        t = check_token(token)
        return t // self._n if t > 0 and t % self._n == row % self._n else 0

    def _groups(self, rows: Any, tokens: Any) -> list[tuple[int, IntArray, list[int],
                                                            list[int]]]:
        """A batch checked whole and cut by shard: (shard, the positions in the batch, its
        local rows, their local tokens), each shard once, in the batch's order within it.

        Every row must exist before any shard is written (a shard refuses only its own rows,
        after the shards before it have changed): checked against the rows each shard is
        known to hold, which only grow, so a batch of claimed rows costs no read."""
        r, t = rows_tokens(rows, tokens)
        if len(r) and (int(r.min()) < 0 or int(r.max()) >= MAX_ROWS * self._n):
            raise EngineValueError(f"rows must lie in [0, {MAX_ROWS * self._n})")
        shard = r % self._n
        local_t = np.where((t > 0) & (t % self._n == shard), t // self._n, 0)
        groups = []
        for k in np.unique(shard).tolist():
            pos = np.flatnonzero(shard == k)
            local = r[pos] // self._n
            top = int(local.max())
            if top >= self._known[k]:
                self._known[k] = self._next_row(k)
                if top >= self._known[k]:
                    raise EngineValueError(f"row {top * self._n + k} does not exist")
            groups.append((k, pos, local.tolist(), local_t[pos].tolist()))
        return groups

    def _next_row(self, k: int) -> int:
        """The rows shard ``k`` holds (its next row id)."""
        eng = self.shards[k]
        got = eng.transport.call("HGET", functools.partial(_next_row_of, eng.keys[3]))
        if got is None:
            raise SegmentMissing(f"queue {self._name!r} is gone (shard {k})")
        return int(got)

    def _global(self, k: int, c: RedisClaims) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        return c.rows * self._n + k, c.lanes, c.due_ms, c.tokens * self._n + k

    def _claims(self, parts: list[tuple[int, RedisClaims]]) -> RedisClaims:
        cols = [self._global(k, c) for k, c in parts]
        return RedisClaims(*(np.concatenate([c[i] for c in cols]) for i in range(4)))

    # -- writes ----------------------------------------------------------------------------------

    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int:
        """Queue one row (on the shard with the lowest free row id); returns its row id."""
        return add_one(self, due_ms, interval_s, provenance, failures)

    def add_many(self, due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                 failures: Any = None) -> IntArray:
        """Queue many rows, every element checked first; they take the lowest free row ids
        (``spread``), and no shard is written to unless every shard has room for its part."""
        blob = packed_rows(due_ms, interval_s, provenance, failures)
        m = len(blob)
        out = np.empty(m, np.int64)
        if m == 0:
            return out
        meta = [eng.transport.call("HMGET", functools.partial(_levels, eng.keys[3]))
                for eng in self.shards]
        if any(v is None for pair in meta for v in pair):
            raise SegmentMissing(f"queue {self._name!r} is gone")
        levels = np.array([int(a) for a, _ in meta], np.int64)
        room = np.array([int(b) for _, b in meta], np.int64) - levels
        if m > int(room.sum()):
            raise CapacityError(f"queue {self._name!r} has room for {int(room.sum())} rows"
                                f" ({', '.join(map(str, room.tolist()))} on its shards), not {m}")
        take = spread(levels, room, m)
        # the i-th lowest of the free ids goes to the i-th row, as one queue numbers them
        ids = np.sort(np.concatenate([(levels[k] + np.arange(take[k])) * self._n + k
                                      for k in range(self._n)]))
        for k in np.flatnonzero(take).tolist():
            pos = np.flatnonzero(ids % self._n == k)
            with self._shard(k) as eng:
                local = eng.add_packed(blob[pos])
            out[pos] = local * self._n + k
        return out

    def complete(self, row: int, token: int, next_due_ms: int | None = None,
                 now_ms: int | None = None) -> None:
        with self._holding(row) as (eng, local, r):
            eng.complete(local, self._local_token(r, token), next_due_ms, now_ms)

    def complete_many(self, rows: Any, tokens: Any, next_due_ms: Any = None,
                      now_ms: int | None = None) -> BoolArray:
        """Complete a batch, one FCALL per shard it spans: which tokens were live leases."""
        now_arg(now_ms)  # checked even when there are no rows
        groups = self._groups(rows, tokens)
        ok = np.zeros(sum(len(g[1]) for g in groups), np.bool_)
        nd = None if next_due_ms is None else check_due_array(next_due_ms, "next_due_ms")
        if nd is not None and len(nd) != len(ok):
            raise EngineValueError("next_due_ms and rows differ in length")
        for k, pos, lr, lt in groups:
            part = None if nd is None else nd[pos]
            with self._shard(k) as eng:
                ok[pos] = eng.complete_many(lr, lt, part, now_ms)
        return ok

    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None, permanent: bool = False) -> None:
        with self._holding(row) as (eng, local, r):
            eng.fail(local, self._local_token(r, token), retry_at_ms, now_ms, permanent)

    def release(self, row: int, token: int, now_ms: int | None = None) -> None:
        with self._holding(row) as (eng, local, r):
            eng.release(local, self._local_token(r, token), now_ms)

    def release_many(self, rows: Any, tokens: Any, now_ms: int | None = None) -> BoolArray:
        now_arg(now_ms)
        groups = self._groups(rows, tokens)
        ok = np.zeros(sum(len(g[1]) for g in groups), np.bool_)
        for k, pos, lr, lt in groups:
            with self._shard(k) as eng:
                ok[pos] = eng.release_many(lr, lt, now_ms)
        return ok

    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int:
        with self._holding(row) as (eng, local, r):
            return eng.renew(local, self._local_token(r, token), lease_ms, now_ms) * self._n \
                + r % self._n

    def prioritize_many(self, rows: Any, mode: str = "rush", now_ms: int | None = None) -> int:
        """``prioritize`` each row (a removed one skipped): how many were; one
        ``prioritize_many`` per shard the rows span."""
        check_mode(mode)
        now_arg(now_ms)
        r = as_int64_array(rows, "rows")
        done = 0
        for k, _pos, local, _tokens in self._groups(r, np.zeros(len(r), np.int64)):
            with self._shard(k) as eng:
                done += eng.prioritize_many(np.asarray(local, np.int64), mode, now_ms)
        return done

    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None:
        with self._holding(row) as (eng, local, _):
            eng.prioritize(local, mode, now_ms)

    def reclassify(self, row: int, provenance: str | int) -> None:
        with self._holding(row) as (eng, local, _):
            eng.reclassify(local, provenance)

    def remove(self, row: int) -> None:
        with self._holding(row) as (eng, local, _):
            eng.remove(local)

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, budget: int = DEFAULT_BUDGET, now_ms: int | None = None,
              lease_ms: int = DEFAULT_LEASE_MS, window: int = DEFAULT_WINDOW) -> RedisClaims:
        """Up to ``budget`` rows, one claim pass (one FCALL) on the shard this client is at,
        and on the next ones in turn while a pass comes back short."""
        b = claim_args(budget, lease_ms, window)[0]
        k = self._start()
        with self._shard(k) as eng:
            first = eng.claim(b, now_ms, lease_ms, window)
        return self._fill([(k, first)], b, now_ms, lease_ms, window)

    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = DEFAULT_BUDGET,
                           now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                           window: int = DEFAULT_WINDOW) -> tuple[BoolArray, RedisClaims]:
        """``complete_many`` then ``claim``: the rows of the shard this client is at are
        completed in the same FCALL as its claim pass, the others' in one FCALL per shard."""
        b = claim_args(budget, lease_ms, window)[0]
        now_arg(now_ms)
        groups = self._groups(rows, tokens)
        ok = np.zeros(sum(len(g[1]) for g in groups), np.bool_)
        k = self._start()
        here: tuple[Any, list[int], list[int]] = (np.zeros(0, np.int64), [], [])
        for s, pos, lr, lt in groups:
            if s == k:
                here = (pos, lr, lt)
            else:
                with self._shard(s) as eng:
                    ok[pos] = eng.complete_many(lr, lt, None, now_ms)
        with self._shard(k) as eng:
            done, first = eng.complete_and_claim(here[1], here[2], b, now_ms, lease_ms, window)
        ok[here[0]] = done
        return ok, self._fill([(k, first)], b, now_ms, lease_ms, window)

    def _start(self) -> int:
        """The shard this call's first pass goes to: a forked child draws its own, so that the
        children of one parent do not all start at the same shard."""
        if os.getpid() != self._cursor_pid:
            self._cursor, self._cursor_pid, self._stayed = (random.randrange(self._n),
                                                            os.getpid(), 0)
        return self._cursor

    def _fill(self, got: list[tuple[int, RedisClaims]], budget: int, now_ms: int | None,
              lease_ms: int, window: int) -> RedisClaims:
        """The rest of ``budget`` after the first pass (``got``), asked of the next shards in
        turn; then where this client claims next (see the module's note)."""
        left = budget - len(got[0][1])
        start = got[0][0]
        if left == 0:
            self._stayed += 1
            if self._stayed >= STAY:
                self._cursor, self._stayed = (start + 1) % self._n, 0
            return self._claims(got)
        last, short = start, True
        for i in range(1, self._n):
            last = (start + i) % self._n
            with self._shard(last) as eng:
                part = eng.claim(left, now_ms, lease_ms, window)
            got.append((last, part))
            left -= len(part)
            short = left > 0
            if not short:
                break
        self._cursor, self._stayed = (last + short) % self._n, 0
        return self._claims(got)

    # -- reading ---------------------------------------------------------------------------------

    def describe(self, row: int, now_ms: int | None = None) -> RowInfo:
        with self._holding(row) as (eng, local, r):
            info = eng.describe(local, now_ms)
        info["row"] = r
        return info

    def due_ms(self, row: int) -> int | None:
        return self.describe(row)["due_ms"]

    def lane(self, row: int) -> int | None:
        return self.describe(row)["lane"]

    def lane_name(self, lane: int) -> str:
        return self.shards[0].lane_name(lane)

    @property
    def policy(self) -> LanePolicy:
        return self.shards[0].policy

    def set_policy(self, policy: LanePolicy) -> None:
        """Change the policy on every shard (checked before any shard is written)."""
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        for k in range(self._n):
            with self._shard(k) as eng:
                eng.set_policy(policy)

    def floor_minute(self, lane: int) -> int:
        """The minute of the lane's earliest ready row on any shard; 0 when none has one."""
        minutes = []
        for k in range(self._n):
            with self._shard(k) as eng:
                minutes.append(eng.floor_minute(lane))
        return min((m for m in minutes if m), default=0)

    def stats(self, now_ms: int | None = None) -> Stats:
        """Every shard's ``RedisEngine.stats`` added up (a lane's floor minute is the earliest
        of its shards'), and ``shards``: per shard its tag, rows, queued and in flight."""
        parts = []
        for k in range(self._n):
            with self._shard(k) as eng:
                parts.append(eng.stats(now_ms))
        return merged_stats(parts, self.catalog.tags)

    def dump(self) -> list[Any]:
        """Every key of the queue as it stands: the record, then each shard's
        ``RedisEngine.dump`` (each read in one transaction)."""
        record = self._record.call("GET", lambda r: r.get(catalog_key(self._name)))
        return [record, *(eng.dump() for eng in self.shards)]

    def verify(self) -> list[str]:
        """Every shard's ``verify``, each line naming its shard, and the queue's record: it is
        readable, and names the shards this engine runs over."""
        text = self._record.call("GET", lambda r: r.get(catalog_key(self._name)))
        if text is None:
            problems = [f"queue {self._name!r} has no shard record {catalog_key(self._name)}"]
        elif Catalog.from_json(self._name, text) != self.catalog:
            problems = [f"queue {self._name!r}: its shard record changed since connect"]
        else:
            problems = []
        for k, eng in enumerate(self.shards):
            problems += [f"shard {k}: {line}" for line in eng.verify()]
        return problems

    check = verify

    def verify_walk(self) -> VerifyWalk:
        """``verify``: each write is one function call, applied whole or not at all, so no
        writer leaves a mark."""
        return VerifyWalk(self.verify(), [], 0, 0)

    # -- maintenance -----------------------------------------------------------------------------

    def restamp(self, limit: int = 5000) -> Restamped:
        """Up to ``limit`` rows restamped, shard after shard; done once every shard is."""
        left = check_int(limit, "limit", 1, 10_000_000)
        total, done = 0, True
        for k in range(self._n):
            if left == 0:
                return {"restamped": total, "done": False}
            with self._shard(k) as eng:
                got = eng.restamp(left)
            total, left, done = total + got["restamped"], left - got["restamped"], \
                done and got["done"]
        return {"restamped": total, "done": done}

    def compact(self, full: bool = False) -> None:
        """Nothing to merge on any shard; refused on a closed engine."""
        check_bool(full, "full")
        for eng in self.shards:
            eng.compact(full)

    def reap(self) -> int:
        """``RedisEngine.reap`` on every shard: the dead owners found, counted per shard."""
        found = 0
        for k in range(self._n):
            with self._shard(k) as eng:
                found += eng.reap()
        return found

    def repair(self) -> dict[str, int]:
        """``reap``: no write is left half done on Redis, only the leases of dead owners."""
        return {"dead_owners": self.reap()}

    # -- the pool's URLs ---------------------------------------------------------------------------

    def row_urls(self) -> ShardedUrls:
        """The row -> URL map kept beside the queue (``shard_urls.ShardedUrls``)."""
        return ShardedUrls(self)

    def heartbeat(self, ttl_ms: int = HEARTBEAT_TTL_MS, now_ms: int | None = None
                  ) -> tuple[int, int]:
        """``RedisEngine.heartbeat`` on every shard (each shard judges the owners of its own
        leases): this owner beats everywhere it may hold a lease. Returns (owners reaped, rows
        put back), summed over the shards."""
        owners = rows = 0
        for k in range(self._n):
            with self._shard(k) as eng:
                o, r = eng.heartbeat(ttl_ms, now_ms)
            owners, rows = owners + o, rows + r
        return owners, rows

    # -- checkpoints -----------------------------------------------------------------------------

    def export_rows(self) -> tuple[IntArray, dict[str, IntArray]]:
        """(row ids, columns) of every queued row, in row id order: each shard read by chunks
        (``RedisEngine.export_rows``), one shard after the other (docs/redis.md "Big queues"
        says what a save taken under writes holds)."""
        rows, cols = [], []
        for k in range(self._n):
            with self._shard(k) as eng:
                r, c = eng.export_rows()
            rows.append(r * self._n + k)
            cols.append(c)
        order = np.argsort(np.concatenate(rows), kind="stable")
        return (np.concatenate(rows)[order],
                {c: np.concatenate([p[c] for p in cols])[order] for c in cols[0]})

    def save(self, path: str | os.PathLike[str], urls: Any = None,
             extra: dict[str, Any] | None = None) -> int:
        """Write the queue's schedule to ``path`` (engine/checkpoint.py's format), as
        ``RedisEngine.save`` does."""
        return checkpoint.save(self, path, urls, extra)

    @classmethod
    def load(cls, path: str | os.PathLike[str], url: str, name: str, *, shards: int,
             capacity: int | None = None, policy: LanePolicy | None = None) -> ShardedEngine:
        """Create queue ``name`` at ``url`` over ``shards`` shards holding a checkpoint (which
        any backend wrote); row ids are renumbered from 0 in saved order, as a single queue's
        load does. The queue must not exist yet; nothing is left behind if the restore fails."""
        ck = checkpoint.read(path)
        if capacity is not None and check_int(capacity, "capacity", 1, MAX_ROWS * MAX_SHARDS) \
                < len(ck):
            raise EngineValueError(f"capacity {capacity} is below the {len(ck)} rows of the "
                                   "checkpoint")
        eng = cls.connect(url, name, ck.policy if policy is None else policy, create=True,
                          shards=shards, capacity=capacity)
        if not eng.created:
            eng.close()
            raise EngineValueError(f"queue {name!r} already exists at {redact(url)}: load "
                                   "restores into a new queue only")
        try:
            checkpoint.restore(ck, eng)
        except BaseException:
            eng.drop()
            eng.close()
            raise
        return eng


_COUNTS = ("queued", "due", "leased", "in_flight", "granted", "spilled", "stale_skipped",
           "lease_refused")


def merged_stats(parts: list[Stats], tags: tuple[str, ...]) -> Stats:
    """The stats of a queue from its shards' (in shard order)."""
    lanes: dict[int, LaneStats] = {}
    owners: dict[str, int] = {}
    for part in parts:
        for ln in part["lanes"]:
            have = lanes.setdefault(ln["lane"], LaneStats(
                lane=ln["lane"], name=ln["name"], floor_minute=0, queued=0, due=0, leased=0,
                in_flight=0, granted=0, spilled=0, stale_skipped=0, lease_refused=0,
                iv_min=0, iv_max=0))
            if ln["iv_max"]:
                have["iv_min"] = min(have["iv_min"] or ln["iv_min"], ln["iv_min"])
                have["iv_max"] = max(have["iv_max"], ln["iv_max"])
            if ln["floor_minute"] and (not have["floor_minute"]
                                       or ln["floor_minute"] < have["floor_minute"]):
                have["floor_minute"] = ln["floor_minute"]
            for f in _COUNTS:
                have[f] += ln[f]  # type: ignore[literal-required]
        for who, count in part.get("owners", {}).items():
            owners[who] = owners.get(who, 0) + count
    first = parts[0]
    stats: Stats = {
        "name": first["name"], "backend": "redis", "url": first.get("url", ""),
        "layout_version": first["layout_version"],
        "library_version": first.get("library_version", ""),
        "capacity": sum(p["capacity"] for p in parts), "rows": sum(p["rows"] for p in parts),
        "queued": sum(p["queued"] for p in parts),
        "in_flight": sum(p["in_flight"] for p in parts),
        "credits": {c: sum(p["credits"][c] for p in parts) for c in first["credits"]},
        "owners": owners,
        "lanes": [lanes[i] for i in sorted(lanes)],
        "shards": [{"shard": k, "tag": tag, "rows": p["rows"], "queued": p["queued"],
                    "in_flight": p["in_flight"], "capacity": p["capacity"]}
                   for k, (tag, p) in enumerate(zip(tags, parts, strict=True))],
    }
    return stats


_: type[QueueEngine] = ShardedEngine
