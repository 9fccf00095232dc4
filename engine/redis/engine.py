"""The engine on Redis: :class:`engine.api.QueueEngine` for one queue shared by many hosts.

Why a second backend: a shared-memory segment serves the workers of one machine. Past one host
the queue lives in Redis, and a user switches with one line (``Engine.connect(url, name)``).

How it stays correct: every write and every claim pass is one ``FCALL`` into the Lua library
(loaded with ``FUNCTION LOAD``, so it is persisted and replicated with the data), which Redis
runs atomically. The library states the data model; docs/redis.md explains it. This module only
checks arguments (all of them, before anything is sent) and calls the library; packing
arguments and reading replies is :mod:`engine.redis.codec`'s, the connection (one server or a
Cluster's primary, retries, lost connections) :mod:`engine.redis.transport`'s. Reads that need
no logic (``describe``, ``verify``, ``save``) are plain commands in one MULTI/EXEC, so they see
one consistent state.

Time is the server's (``TIME`` inside the function) unless ``now_ms`` is given.
"""

from __future__ import annotations

import os
import socket
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
    check_lease_ms,
    check_mode,
    check_token,
    choice_code,
    claim_args,
    is_number,
    rows_tokens,
    wall_ms,
)
from ..errors import (
    EngineError,
    EngineTypeError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    SegmentMissing,
)
from ..keys import as_int64_array, check_due_array, check_due_ms
from ..policy import CLASSES, MAX_INTERVAL_S, ONE, PROVENANCES, LanePolicy
from ..process import host_owner_id, is_running
from . import codec
from .catalog import Catalog, catalog_key, refuse_count
from .codec import (
    LAYOUT_VERSION,
    LIBRARY,
    LIBRARY_VERSION,
    MAX_LANES,
    MAX_ROWS,
    RECORD,
    RedisClaims,
    batch_args,
    live_token,
    member,
    now_arg,
    packed_rows,
    policy_args,
    policy_from,
    queue_keys,
    split_holder,
)
from .library import library_source as library_source
from .scan import RECHECK, SCAN_COUNT, QueueScan
from .transport import NOT_RUN, Transport, redact
from .urls import RedisUrls

PRIORITIZE_BATCH = 2000
"""Rows per FCALL of ``prioritize_many``: a few milliseconds of the server each."""

MIN_REDIS = (7, 0)
ADD_CHUNK = 10_000
"""Rows per FCALL of add_many: a big batch never blocks the server for long."""
HEARTBEAT_TTL_MS = 2_500
"""How long an owner's heartbeat holds (2.5 beats of a pool's 1 s period): past it, the next
beat of any other owner puts the owner's leases back (docs/redis.md "Heartbeats")."""
HEARTBEAT_RETRY = 1 / 32
"""A heartbeat retries at most this fraction of its TTL apart, so that after a stall it lands
well before the calm its late beat starts is over (docs/redis.md "Heartbeats")."""


def add_one(eng: QueueEngine, due_ms: int, interval_s: int, provenance: str,
            failures: int) -> int:
    """``add``: one row checked, then added as ``add_many`` adds rows (either Redis engine)."""
    return int(eng.add_many([check_due_ms(due_ms)],
                            check_int(interval_s, "interval_s", 1, MAX_INTERVAL_S),
                            choice_code(provenance, PROVENANCES, "provenance"),
                            check_int(failures, "failures", 0, 255))[0])


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise EngineTypeError("name must be a str")
    if not name or len(name) > 200 or any(c in name for c in "{}\0\r\n"):
        raise EngineValueError(f"bad queue name {name!r}: 1-200 characters, no braces")
    return name


class RedisEngine:
    """A claim queue in Redis (see docs/redis.md).

    Made by :meth:`connect` (or ``Engine.connect``). The queue outlives the object: ``close``
    drops the connection, ``drop`` deletes the queue's keys.
    """

    supports_compact: ClassVar[bool] = False
    spans_hosts: ClassVar[bool] = True
    writes_whole: ClassVar[bool] = True

    def __init__(self, transport: Transport, name: str,
                 keys: tuple[str, str, str, str, str] | None = None) -> None:
        self.transport = transport
        """The connection to the server (or Cluster primary) holding the queue."""
        self._name = name
        self._keys = queue_keys(name) if keys is None else keys
        self._shard = keys is not None
        # the owners' heartbeats, under the queue's (or the shard's) hash tag
        self._beats = self._keys[0].rsplit(":", 1)[0] + ":beats"
        self.scan_count = SCAN_COUNT
        """Entries per SCAN step of ``verify`` and ``save`` (engine.redis.scan)."""
        self._owner_pid = -1
        self._owner = ""
        self.created = False
        """Whether this object's ``connect`` made the queue."""

    # -- lifetime ------------------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str, name: str, policy: LanePolicy | None = None,
                create: bool = False, *, capacity: int | None = None, upgrade: bool = False,
                timeout: float = 10.0, cluster: bool | None = None,
                wait_replicas: int | None = None,
                shard_keys: tuple[str, str, str, str, str] | None = None) -> RedisEngine:
        """Connect to queue ``name`` on the Redis server at ``url`` (any URL redis-py takes:
        ``redis://``, ``rediss://``, ``unix://``, with credentials).

        ``create=True`` creates the queue when it is missing (with ``policy``, default
        ``LanePolicy()``, and ``capacity`` rows at most, default ``MAX_ROWS``); without it a
        missing queue raises ``SegmentMissing``. A ``policy`` given for an existing queue must
        equal its policy (change it with ``set_policy``). The server must run Redis >= 7; if it
        holds another version of the function library, it is replaced only when ``create`` or
        ``upgrade`` is true, else ``LayoutMismatch``. Connection errors are retried with
        back-off for ``timeout`` seconds, then raise ``EngineError`` naming the URL (never its
        password).

        ``cluster``: ``None`` (default) asks the server (``INFO cluster``) and goes through
        Redis Cluster when it is a cluster node; ``True`` requires one, ``False`` treats the
        server as standalone. On a cluster the URL names any node (``redis://`` or
        ``rediss://``); the function library is loaded on every primary and each call goes
        to the primary serving the queue's slot. A ``redis+sentinel://`` URL names Sentinels
        and the master they fail over (docs/redis.md "Failover").

        ``wait_replicas``: every write waits until this many replicas have it (``WAIT``, at
        most ``wait_timeout_ms`` of the URL, default 1000) and raises ``OutcomeUnknown`` when
        fewer did; default: the URL's ``wait_replicas`` parameter, else 0 (no waiting).

        ``shard_keys``: the keys of one shard of a queue spread over shards (made by
        ``engine.redis.shards``, which checks the queue's shard record). Without it a queue
        that has such a record is refused with ``ShardsMismatch`` (``Engine.connect`` then
        opens it over its shards).
        """
        if not isinstance(url, str):
            raise EngineTypeError("url must be a str")
        name = _check_name(name)
        if policy is not None and not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        check_bool(create, "create")
        check_bool(upgrade, "upgrade")
        cap = MAX_ROWS if capacity is None else check_int(capacity, "capacity", 1, MAX_ROWS)
        if not is_number(timeout) or not 0 <= timeout < 86_400:
            raise EngineValueError("timeout must be a number of seconds in [0, 86400)")
        if cluster is not None and not isinstance(cluster, bool):
            raise EngineTypeError(f"cluster must be a bool or None, got {cluster!r}")
        if wait_replicas is not None:
            check_int(wait_replicas, "wait_replicas", 0, 100)
        keys = queue_keys(name) if shard_keys is None else shard_keys
        eng = cls(Transport(url, name, keys, LIBRARY_VERSION, float(timeout), wait_replicas),
                  name, shard_keys)
        try:
            t = eng.transport
            t.retrying(lambda: t.live().ping(), "cannot reach")
            eng._check_server()
            if cluster is None:
                cluster = t.is_cluster_node()
            if cluster:
                t.join_cluster()
            # FUNCTION LOAD is per node; a primary lost meanwhile (a failover under way) is
            # waited out, the topology read again, the promoted replica loaded instead
            t.retrying(lambda: eng._load_libraries(create or upgrade))
            eng._ensure_queue(policy, create, cap)
        except BaseException:
            eng.close()
            raise
        return eng

    def _check_server(self) -> None:
        t = self.transport
        version = str(t.call("INFO server", lambda r: r.info("server")).get("redis_version", "0"))
        try:
            major_minor = tuple(int(p) for p in version.split(".")[:2])
        except ValueError:
            major_minor = (0, 0)
        if major_minor < MIN_REDIS:
            raise EngineError(
                f"{t.where} is version {version}: render-lanes needs Redis "
                f">= {MIN_REDIS[0]}.{MIN_REDIS[1]} (Functions: FUNCTION LOAD / FCALL)")

    def _library_version(self, client: Any) -> str | None:
        try:
            reply = client.fcall_ro("lanes_version", 0)
        except redis_errors.ResponseError as e:
            if "function not found" in str(e).lower():
                return None
            if isinstance(e, NOT_RUN):
                raise  # CLUSTERDOWN during a failover...: waited out by the caller
            raise self.transport.error(e, "lanes_version") from None
        return str(reply[0].decode() if isinstance(reply[0], bytes) else reply[0])

    def _load_libraries(self, replace: bool) -> None:
        for client in self.transport.primaries():
            self._load_library(client, replace)

    def _load_library(self, client: Any, replace: bool) -> None:
        """The library of this version on the node of ``client``."""
        t = self.transport
        have = self._library_version(client)
        if have == LIBRARY_VERSION:
            return
        if have is not None and not replace:
            raise LayoutMismatch(
                f"{t.where} holds function library {LIBRARY} version {have}; this client needs "
                f"version {LIBRARY_VERSION}. Connect with upgrade=True (or create=True) to "
                "replace it: clients of the other version then get errors.")
        try:
            client.function_load(library_source(), replace=have is not None)
        except redis_errors.ResponseError as e:
            if "already exists" not in str(e):  # another client loaded it meanwhile
                raise EngineError(f"FUNCTION LOAD failed at {redact(t.url)}: {e}") from None
            if self._library_version(client) != LIBRARY_VERSION:
                raise LayoutMismatch(f"{LIBRARY} changed under us at {redact(t.url)}") \
                    from None

    def _ensure_queue(self, policy: LanePolicy | None, create: bool, capacity: int) -> None:
        t = self.transport
        if create:
            p = LanePolicy() if policy is None else policy
            self.created = bool(t.fcall("lanes_create", *policy_args(p), capacity, wall_ms()))
        layout, stored = t.call("HMGET", lambda r: r.hmget(self._keys[3], "layout", "policy"))
        record = None if self._shard else t.call("GET", lambda r: r.get(catalog_key(self._name)))
        if record is not None:
            raise refuse_count(self._name, Catalog.from_json(self._name, record).shards, 1)
        if layout is None:
            raise SegmentMissing(f"no queue {self._name!r} at {redact(t.url)} "
                                 "(connect with create=True to make it)")
        if int(layout) != LAYOUT_VERSION:
            raise LayoutMismatch(f"queue {self._name!r} has layout {int(layout)}, this client "
                                 f"reads layout {LAYOUT_VERSION}")
        if policy is not None and policy_from(stored) != policy:
            raise EngineValueError(f"queue {self._name!r} exists with another policy; change it "
                                   "with set_policy")

    @property
    def name(self) -> str:
        return self._name

    @property
    def url(self) -> str:
        """The server's URL, without its password."""
        return redact(self.transport.url)

    @property
    def keys(self) -> tuple[str, str, str, str, str]:
        """The queue's keys: ready, lease, rows, meta, holder."""
        return self._keys

    @property
    def owner(self) -> str:
        """This process's lease-owner id, ``host:pid:start_ms`` (a new one after a fork)."""
        pid = os.getpid()
        if pid != self._owner_pid:
            self._owner = host_owner_id(pid)
            self._owner_pid = pid
        return self._owner

    def close(self) -> None:
        """Drop the connection. The queue stays on the server (see ``drop``)."""
        self.transport.close()

    def drop(self) -> None:
        """Delete the queue's keys from the server: every row, lease and counter."""
        self.transport.call("DEL", lambda r: r.delete(*self._keys, self._beats))

    unlink = drop

    def __enter__(self) -> RedisEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the connection (the queue is kept: it belongs to the server, not to us)."""
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.transport.client is None else "open"
        return f"<RedisEngine {self._name!r} at {self.url} {state}>"

    # -- arguments -------------------------------------------------------------------------------

    @staticmethod
    def _row(row: object) -> int:
        return check_int(row, "row", 0, MAX_ROWS - 1)

    @staticmethod
    def _token(token: object) -> int:
        return live_token(check_token(token))

    @staticmethod
    def _batch_lists(rows: Any, tokens: Any) -> tuple[list[int], list[int]]:
        """Rows and tokens checked, as lists (what ``batch_args`` formats; a batch is small,
        and list min/max cost less than numpy's on it)."""
        r_arr, t_arr = rows_tokens(rows, tokens)
        r, t = r_arr.tolist(), t_arr.tolist()
        if r and (min(r) < 0 or max(r) >= MAX_ROWS):
            raise EngineValueError(f"rows must lie in [0, {MAX_ROWS})")
        return r, t

    # -- writes ----------------------------------------------------------------------------------

    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int:
        """Queue one row; returns its row id."""
        return add_one(self, due_ms, interval_s, provenance, failures)

    def add_many(self, due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                 failures: Any = None) -> IntArray:
        """Queue many rows; every element is checked before any row is sent. Rows go in chunks
        of ``ADD_CHUNK`` per FCALL (each chunk takes consecutive row ids)."""
        return self.add_packed(packed_rows(due_ms, interval_s, provenance, failures))

    def add_packed(self, blob: Any) -> IntArray:
        """``add_many`` of rows already checked and packed (``codec.packed_rows``)."""
        n = len(blob)
        out = np.empty(n, np.int64)
        for start in range(0, n, ADD_CHUNK):
            stop = min(n, start + ADD_CHUNK)
            first = int(self.transport.fcall("lanes_add", blob[start:stop].tobytes()))
            out[start:stop] = np.arange(first, first + stop - start)
        return out

    def complete(self, row: int, token: int, next_due_ms: int | None = None,
                 now_ms: int | None = None) -> None:
        """End the lease and reschedule (default ``now + interval``). ``LeaseLost`` if stale."""
        r, t = self._row(row), self._token(token)
        nxt = None if next_due_ms is None else [check_due_ms(next_due_ms, "next_due_ms")]
        if not self.complete_many([r], [t], nxt, now_ms)[0]:
            raise LeaseLost(f"complete row {r}: the token is stale")

    def complete_many(self, rows: Any, tokens: Any, next_due_ms: Any = None,
                      now_ms: int | None = None) -> BoolArray:
        """Complete a batch in one FCALL: which tokens were live leases (a stale one changes
        nothing). Row ids are checked, all of them, before anything changes."""
        r, t = self._batch_lists(rows, tokens)
        tail: list[Any] = [0]
        if next_due_ms is not None:
            nd = check_due_array(next_due_ms, "next_due_ms")
            if len(nd) != len(r):
                raise EngineValueError("next_due_ms and rows differ in length")
            tail = [1, *nd.tolist()]
        now = now_arg(now_ms)
        if len(r) == 0:
            return np.zeros(0, np.bool_)
        ok = self.transport.fcall("lanes_complete", now, *batch_args(r, t), *tail)
        return np.array(ok, dtype=np.bool_)

    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None, permanent: bool = False) -> None:
        """Count a failure, derive the lane again (cold after ``cold_after``; ``permanent``
        counts ``cold_after`` failures at least), and back off: 30 s doubling per failure,
        capped at the row's interval (in the cold lane, ``LanePolicy.backoff_ms``), unless
        ``retry_at_ms``."""
        check_bool(permanent, "permanent")
        r, t = self._row(row), self._token(token)
        retry = -1 if retry_at_ms is None else check_due_ms(retry_at_ms, "retry_at_ms")
        self.transport.fcall("lanes_fail", now_arg(now_ms), r, t, retry, int(permanent))

    def release(self, row: int, token: int, now_ms: int | None = None) -> None:
        """Give the row back unrendered; its schedule is unchanged. ``LeaseLost`` if stale."""
        r, t = self._row(row), self._token(token)
        if not self.release_many([r], [t], now_ms)[0]:
            raise LeaseLost(f"release row {r}: the token is stale")

    def release_many(self, rows: Any, tokens: Any, now_ms: int | None = None) -> BoolArray:
        """``release`` of a batch in one FCALL: which tokens were live leases."""
        r, t = self._batch_lists(rows, tokens)
        now = now_arg(now_ms)
        if len(r) == 0:
            return np.zeros(0, np.bool_)
        ok = self.transport.fcall("lanes_release", now, *batch_args(r, t))
        return np.array(ok, dtype=np.bool_)

    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int:
        """Extend a lease to ``now + lease_ms``; returns the new token (the old one is stale)."""
        r, t = self._row(row), self._token(token)
        lease = check_lease_ms(lease_ms)
        return int(self.transport.fcall("lanes_renew", now_arg(now_ms), r, t, lease,
                                        self.owner))

    def reclassify(self, row: int, provenance: str | int) -> None:
        """Change the row's provenance: its lane is derived again, its due time, failures and
        urgency kept; a lease on it goes on (its key waits in the holder entry)."""
        self.transport.fcall("lanes_reclassify", self._row(row),
                             choice_code(provenance, PROVENANCES, "provenance"))

    def prioritize_many(self, rows: Any, mode: str = "rush", now_ms: int | None = None) -> int:
        """``prioritize`` each row (a removed one skipped): how many were. One FCALL for each
        ``PRIORITIZE_BATCH`` rows, each checked by the server before any is changed."""
        arr = as_int64_array(rows, "rows")
        rush = int(check_mode(mode))
        now = now_arg(now_ms)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= MAX_ROWS):
            raise EngineValueError(f"rows must lie in [0, {MAX_ROWS})")
        done = 0
        for start in range(0, len(arr), PRIORITIZE_BATCH):
            blob, _ = batch_args(arr[start:start + PRIORITIZE_BATCH].tolist(), [])
            done += int(self.transport.fcall("lanes_prioritize_many", now, rush, blob))
        return done

    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None:
        """``"rush"``: urgent lane, due now. ``"wait"``: own lane, due now."""
        r = self._row(row)
        rush = check_mode(mode)
        self.transport.fcall("lanes_prioritize", now_arg(now_ms), r, int(rush))

    def remove(self, row: int) -> None:
        """Take the row out for good; a lease on it becomes stale."""
        self.transport.fcall("lanes_remove", self._row(row))

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, budget: int = DEFAULT_BUDGET, now_ms: int | None = None,
              lease_ms: int = DEFAULT_LEASE_MS, window: int = DEFAULT_WINDOW) -> RedisClaims:
        """One claim pass, one FCALL: put lapsed leases back, then lease up to ``budget`` due
        rows as the policy shares them (``engine.policy.reference_pass``)."""
        b, lease, win = claim_args(budget, lease_ms, window)
        now = now_arg(now_ms)
        return RedisClaims.from_reply(self.transport.fcall("lanes_claim", now, b, lease, win,
                                                           self.owner))

    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = DEFAULT_BUDGET,
                           now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                           window: int = DEFAULT_WINDOW) -> tuple[BoolArray, RedisClaims]:
        """A worker's cycle in one round trip: ``complete_many(rows, tokens)`` then ``claim``.
        Returns (which tokens were live, the new batch)."""
        r, t = self._batch_lists(rows, tokens)
        b, lease, win = claim_args(budget, lease_ms, window)
        now = now_arg(now_ms)
        reply = self.transport.fcall("lanes_complete_claim", now, b, lease, win, self.owner,
                                     *batch_args(r, t))
        return (np.frombuffer(reply[1], np.uint8).astype(np.bool_),
                RedisClaims.from_reply(reply[0]))

    # -- reading ---------------------------------------------------------------------------------

    def describe(self, row: int, now_ms: int | None = None) -> RowInfo:
        """Everything the row table holds about one row (true due time, never a raw key)."""
        r = self._row(row)
        ready, _lease, rows, meta, holder = self._keys
        used, rec, key, held, t = self.transport.snapshot(
            ("hget", (meta, "next_row")), ("getrange", (rows, r * RECORD, r * RECORD + RECORD - 1)),
            ("zscore", (ready, member(r))), ("hget", (holder, member(r))), ("time", ()))
        if used is None:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        if r >= int(used):
            raise EngineValueError(f"row {r} does not exist")
        now = int(t[0]) * 1000 + int(t[1]) // 1000 if now_ms is None else check_due_ms(now_ms)
        return codec.row_info(r, rec, key, held, now)

    def due_ms(self, row: int) -> int | None:
        """The row's true due time (None once removed)."""
        return self.describe(row)["due_ms"]

    def lane(self, row: int) -> int | None:
        return self.describe(row)["lane"]

    def lane_name(self, lane: int) -> str:
        checked = check_int(lane, "lane", 0, MAX_LANES - 1)
        return self.policy.lane_name(checked)

    @property
    def policy(self) -> LanePolicy:
        stored = self.transport.call("HGET", lambda r: r.hget(self._keys[3], "policy"))
        if stored is None:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        return policy_from(stored)

    def set_policy(self, policy: LanePolicy) -> None:
        """Change the policy live for every client; no row is rewritten."""
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        self.transport.fcall("lanes_set_policy", *policy_args(policy))

    def floor_minute(self, lane: int) -> int:
        """The minute of the lane's earliest queued (ready) row; 0 when it has none."""
        lane = check_int(lane, "lane", 0, MAX_LANES - 1)
        return int(self._stats(None)[1][lane]["floor_minute"])

    def stats(self, now_ms: int | None = None) -> Stats:
        """``Engine.stats`` where the keys mean something here: per lane ``floor_minute`` is
        the minute of its earliest ready row (a ZSET holds no stale entries, so there is no
        floor to keep); ``spilled``, ``stale_skipped`` and ``lease_refused`` are always 0.
        ``owners`` counts live leases per owner id."""
        return self._stats(now_ms)[0]

    def _stats(self, now_ms: object) -> tuple[Stats, list[LaneStats]]:
        """(stats, every lane's entry up to MAX_LANES)."""
        now = now_arg(now_ms)
        meta_all, reply = self.transport.snapshot(
            ("hgetall", (self._keys[3],)),
            ("fcall_ro", ("lanes_stats", 5, *self._keys, LIBRARY_VERSION, now, MAX_LANES)))
        if not meta_all:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        if isinstance(reply, redis_errors.ResponseError):
            raise self.transport.error(reply, "lanes_stats")
        meta = codec.text_map(meta_all)
        policy = policy_from(meta["policy"])
        at, per, flight = int(reply[0]), reply[1], reply[2]
        bounds = [codec.lane_bounds(meta.get(f"v{i}")) for i in range(MAX_LANES)]
        lanes = [LaneStats(lane=i, name=policy.lane_name(i),
                           floor_minute=per[3 * i + 2] // 60_000 if per[3 * i + 2] >= 0 else 0,
                           queued=per[3 * i], due=per[3 * i + 1], leased=0, in_flight=0,
                           granted=int(meta.get(f"g{i}", 0)), spilled=0, stale_skipped=0,
                           lease_refused=0, iv_min=bounds[i][0], iv_max=bounds[i][1])
                 for i in range(MAX_LANES)]
        owners: dict[str, int] = {}
        for k in range(0, len(flight), 5):
            _row, lane, due, expiry, owner = flight[k:k + 5]
            ln = lanes[lane]
            ln["queued"] += 1
            ln["due"] += due <= at
            ln["in_flight"] += 1
            if expiry > at:
                ln["leased"] += 1
                who = owner.decode() if isinstance(owner, bytes) else str(owner)
                owners[who] = owners.get(who, 0) + 1
        shown = [ln for ln in lanes if ln["lane"] < policy.lane_count or ln["queued"]
                 or ln["granted"]]
        stats: Stats = {
            "name": self._name,
            "backend": "redis",
            "url": self.url,
            "layout_version": int(meta["layout"]),
            "library_version": LIBRARY_VERSION,
            "capacity": int(meta["capacity"]),
            "rows": int(meta["next_row"]),
            "queued": sum(ln["queued"] for ln in lanes),
            "in_flight": sum(ln["in_flight"] for ln in lanes),
            "credits": {c: int(meta.get(f"c{i}", 0)) / ONE for i, c in enumerate(CLASSES)},
            "owners": owners,
            "lanes": shown,
        }
        return stats, lanes

    def dump(self) -> list[Any]:
        """Every key of the queue as it stands, read in one MULTI/EXEC: meta (HGETALL), the
        row table (GET), ready and lease (ZRANGE with scores), holder (HGETALL). For tests and
        small queues: the server builds each reply whole (``verify`` reads by chunks)."""
        ready, lease, rows, meta, holder = self._keys
        return self.transport.snapshot(
            ("hgetall", (meta,)), ("get", (rows,)), ("zrange", (ready, 0, -1, False, True)),
            ("zrange", (lease, 0, -1, False, True)), ("hgetall", (holder,)))

    def verify(self) -> list[str]:
        """One line per broken invariant (empty when all hold; ``codec.verify`` lists them).
        The queue is read by chunks (``engine.redis.scan``: memory bounded on both sides, no
        long block of the server); what the chunks show wrong is read again in one MULTI/EXEC
        and reported only if that snapshot confirms it (docs/redis.md "Big queues")."""
        scan = QueueScan(self.transport, self._keys, self.scan_count)
        parts = scan.parts()
        if parts is None:
            return [f"queue {self._name!r} does not exist"]
        if isinstance(parts, str):
            return [parts]
        problems, suspects = codec.verify(parts)
        if not problems:
            return []
        confirmed: dict[str, None] = {}  # in order, each line once
        look = sorted(suspects)
        for start in range(0, max(1, len(look)), RECHECK):
            again = scan.snapshot(look[start:start + RECHECK])
            if again is None:
                return [f"queue {self._name!r} does not exist"]
            confirmed.update(dict.fromkeys(codec.verify(again)[0]))
        return list(confirmed)

    check = verify

    def verify_walk(self) -> VerifyWalk:
        """``verify``: each write is one function call, applied whole or not at all, so no
        writer leaves a mark."""
        return VerifyWalk(self.verify(), [], 0, 0)

    # -- maintenance -----------------------------------------------------------------------------

    def restamp(self, limit: int = 5000) -> Restamped:
        """Re-encode up to ``limit`` rows written with lanes disabled into their lanes; refused
        (``NotAllowed``) while lanes are enabled."""
        lim = check_int(limit, "limit", 1, 10_000_000)
        done, finished = self.transport.fcall("lanes_restamp", lim)
        return {"restamped": int(done), "done": bool(finished)}

    def compact(self, full: bool = False) -> None:
        """Nothing to merge (``supports_compact`` is False): a ZSET is always in order.
        Refused, as every call is, on a closed engine."""
        check_bool(full, "full")
        self.transport.live()

    def reap(self) -> int:
        """Put back at once the leases of owners on this host whose process is gone (an owner id
        is ``host:pid:start_ms``: pid and start time tell a live process from a reused pid), as
        ``Engine.reap`` does on shared memory. Returns how many dead owners were found.

        Owners on other hosts are not judged (``spans_hosts``): no host can see another's
        processes, so their rows come back when their leases expire."""
        host = socket.gethostname()
        holders = split_holder(self.transport.call(
            "HGETALL", lambda r: r.hgetall(self._keys[4])))[1]
        dead = []
        for owner in sorted({h.owner for h in holders.values()}):
            parts = owner.rsplit(":", 2)
            if len(parts) != 3 or parts[0] != host or not (parts[1].isdigit()
                                                          and parts[2].isdigit()):
                continue
            if owner != self.owner and not is_running(int(parts[1]), int(parts[2])):
                dead.append(owner)
        if dead:
            self.transport.fcall("lanes_reap", *dead)
        return len(dead)

    def repair(self) -> dict[str, int]:
        """``reap``: no write is left half done on Redis, only the leases of dead owners."""
        return {"dead_owners": self.reap()}

    # -- the pool's URLs ---------------------------------------------------------------------------

    def row_urls(self) -> RedisUrls:
        """The row -> URL map kept beside the queue (``urls.RedisUrls``)."""
        return RedisUrls(self)

    def heartbeat(self, ttl_ms: int = HEARTBEAT_TTL_MS, now_ms: int | None = None
                  ) -> tuple[int, int]:
        """This owner is alive for ``ttl_ms`` more (``0``: it leaves, its heartbeat goes); and
        every owner whose heartbeat lapsed loses its leases, its rows put back claimable, its
        tokens stale (docs/redis.md "Heartbeats"). One FCALL. Returns (owners reaped, rows put
        back). Owners that never beat are never judged so: their leases lapse by expiry.
        A beat that arrives in the second half of its TTL judges no one, and starts a TTL in
        which no one is judged: the server, or the way to it, stalled."""
        ttl = check_int(ttl_ms, "ttl_ms", 0, 86_400_000)
        owners, rows = self.transport.fcall("lanes_heartbeat", now_arg(now_ms), self.owner, ttl,
                                            extra_keys=(self._beats,),
                                            max_delay=max(0.01, ttl * HEARTBEAT_RETRY / 1000))
        return int(owners), int(rows)

    # -- checkpoints (engine/checkpoint.py's format) ----------------------------------------------

    def export_rows(self) -> tuple[IntArray, dict[str, IntArray]]:
        """(row ids, columns) of every queued row: the columns of ``checkpoint.snapshot``,
        read by chunks (``engine.redis.scan``). Under writes, each row is read at some moment
        of the read, not all at one (docs/redis.md "Big queues" says what that gives)."""
        scan = QueueScan(self.transport, self._keys, self.scan_count)
        meta = scan.meta()
        if not meta:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        n = int(meta["next_row"])
        table = scan.table(n)
        if table is None:
            raise EngineError(f"queue {self._name!r}: its row table is shorter than next_row "
                              f"{n} (verify() says more)")
        return codec.exported_rows(table, scan.keys_of(n, (codec.flags(table) & codec.LIVE) != 0))

    def save(self, path: str | os.PathLike[str], urls: Any = None,
             extra: dict[str, Any] | None = None) -> int:
        """Write the queue's schedule to ``path`` in engine/checkpoint.py's format, atomically
        (read with ``checkpoint.read``, restored by ``load`` or ``Engine.load``); returns the
        rows saved. ``urls`` (row id -> URL) and ``extra``, if given, are saved with it.
        Leases are not. Read by chunks: under writes, docs/redis.md "Big queues" says exactly
        what the file holds."""
        return checkpoint.save(self, path, urls, extra)

    @classmethod
    def load(cls, path: str | os.PathLike[str], url: str, name: str, *,
             capacity: int | None = None, policy: LanePolicy | None = None) -> RedisEngine:
        """Create queue ``name`` at ``url`` holding a checkpoint (row ids renumbered from 0 in
        saved order); the saved policy unless given. The queue must not exist yet; nothing is
        left behind if the restore fails."""
        ck = checkpoint.read(path)
        if capacity is not None and check_int(capacity, "capacity", 1, MAX_ROWS) < len(ck):
            raise EngineValueError(f"capacity {capacity} is below the {len(ck)} rows of the "
                                   "checkpoint")
        eng = cls.connect(url, name, ck.policy if policy is None else policy, create=True,
                          capacity=capacity)
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


_: type[QueueEngine] = RedisEngine
