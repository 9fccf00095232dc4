"""The engine on Redis: the same API as ``engine.Engine``, one queue shared by hosts.

Why a second backend: a shared-memory segment serves the workers of one machine. Past one host
the queue lives in Redis, and a user switches with one line (``Engine.connect(url, name)``).

How it stays correct: every write and every claim pass is one ``FCALL`` into the Lua library
``lanes.lua`` (loaded with ``FUNCTION LOAD``, so it is persisted and replicated with the data),
which Redis runs atomically. The library states the data model; docs/redis.md explains it.
This module only checks arguments (all of them, before anything is sent), packs them, and
turns replies and error codes into the package's types and exceptions. Reads that need no
logic (``describe``, ``verify``, ``save``) are plain commands in one MULTI/EXEC, so they see
one consistent state.

Time is the server's (``TIME`` inside the function) unless ``now_ms`` is given.

Connections: ``self._r`` is a plain client of the one server that holds the queue. On a
Redis Cluster that is the primary serving the queue's slot (every key carries the hash tag
``{name}``), found through a ``RedisCluster`` kept for the topology only; FCALLs go straight
to that node, so one code path serves both and redis-py never asks the server for an FCALL's
keys. A call first gets a connected connection (retried with back-off: nothing was sent
yet), then sends; a connection lost after sending makes the outcome unknown, and a write is
then never replayed (``OutcomeUnknown``, docs/redis.md "Lost connections").
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from importlib import resources
from types import TracebackType
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import redis as redis_py
import redis.exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from .. import _hot
from ..engine import (
    DEFAULT_LEASE_MS,
    DEFAULT_WINDOW,
    MAX_BUDGET,
    Claim,
    _broadcast,
    _int,
    _int64_vector,
    _provenance_array,
    _provenance_code,
    wall_ms,
)
from ..errors import (
    CapacityError,
    EngineClosed,
    EngineError,
    EngineTypeError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    NotAllowed,
    OutcomeUnknown,
    SegmentMissing,
)
from ..keys import STRIDE, check_due_array, check_due_ms, is_number
from ..policy import (
    CLASSES,
    MAX_INTERVAL_S,
    ONE,
    PROVENANCES,
    REMAINDERS,
    LanePolicy,
    share_fp,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

LIBRARY = "render_lanes"
LIBRARY_VERSION = "9"
"""Bump with any change to lanes.lua (its VERSION): a server holding another version is
refused, or replaced when the caller allows it (``create=True`` or ``upgrade=True``)."""
LAYOUT_VERSION = 4
"""The data model of a queue's keys (lanes.lua LAYOUT): bump when a record or key changes.
Layout 4: one lease entry per claimed batch (member: the batch id, its first token; score: the
expiry); a row's key lives in ready or, in flight, in its holder entry
(``token:batch:n:expiry:key:owner``), its token only there, and a lapsed lease's entry stays
until the row is granted again; a batch in flight has a record ``b<batch>`` in holder
(``count:members``); members are zero-padded row ids (``member``); the record holds interval,
failures and flags. A queue of layout 1 (20-byte records), 2 (unpadded members, or 20-byte
records) or 3 (a lease entry per row, ``token:key:owner``) is refused."""
MIN_REDIS = (7, 0)
RECORD = 6
"""Bytes per row in the row table (lanes.lua REC)."""
MAX_ROWS = (512 * 1024 * 1024) // RECORD
"""The row table is one string, and a Redis string holds at most 512 MiB."""
MAX_LANES = 64
"""Lanes a policy can make (2 * 30 bands + 4): stats look at this many."""
TOKEN_LIMIT = 1 << 53
"""Tokens are below this (a Lua number is exact there): any other value is never a live lease."""
ADD_CHUNK = 10_000
"""Rows per FCALL of add_many: a big batch never blocks the server for long."""
_ADD_ROW = np.dtype([("due", "<u8"), ("interval", "<u4"), ("prov", "u1"), ("failures", "u1")])

_LOST = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
"""What a lost or refused connection raises (redis-py wraps most socket errors, not all)."""
MOVED_RETRIES = 3
"""A Cluster slot that moved: re-read the topology and send again this many times (a MOVED
reply means the node did not run the call, so sending again is safe)."""

_ERRORS: dict[str, type[EngineError]] = {
    "LEASE": LeaseLost,
    "RANGE": EngineValueError,
    "VALUE": EngineValueError,
    "NOTALLOWED": NotAllowed,
    "CAPACITY": CapacityError,
    "MISSING": SegmentMissing,
    "LAYOUT": LayoutMismatch,
    "VERSION": LayoutMismatch,
}


def member(row: int) -> str:
    """Row ``row`` as a member of the ready ZSET and the holder hash (lanes.lua MEMBER):
    8 zero-padded digits, so equal scores order by row id, as the shared-memory engine serves
    rows due at the same millisecond."""
    return f"{row:08d}"


def _batch(rows: list[int], tokens: list[int]) -> tuple[str, str]:
    """A batch as lanes.lua's ``rows_tokens`` takes it: the rows' members (``member``) joined,
    and the tokens, each with the ':' that ends it in a holder entry, joined (one that can
    never be live as 0, see ``_live_token``). Two arguments instead of two per row: redis-py
    packs each argument in Python, the server converts each into a Lua string, and both cost
    more than one join here and one split there."""
    return ("".join([f"{row:08d}" for row in rows]),
            "".join([f"{token}:" if 0 < token < TOKEN_LIMIT else "0:" for token in tokens]))


def library_source() -> str:
    return resources.files(__package__).joinpath("lanes.lua").read_text()


def redact(url: str) -> str:
    """The URL without its password, in the authority or in the query as redis-py also
    takes it (``unix:///path?password=...``): safe to put in an error message or a log."""
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return "<unparsable URL>"
    in_query = any(k.lower() == "password" for k, _ in query)
    if parts.password is None and not in_query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"{parts.username or ''}:***@{host}"
    text = f"{parts.scheme}://{netloc}{parts.path}"  # urlunsplit would drop unix:// 's "//"
    if query:
        text += "?" + "&".join(f"{k}=***" if k.lower() == "password"
                               else urllib.parse.urlencode({k: v}) for k, v in query)
    return text


def queue_keys(name: str) -> tuple[str, str, str, str, str]:
    """The five keys of queue ``name`` in the order every function takes them. One hash tag,
    so a queue is one Cluster slot."""
    tag = f"lanes:{{{name}}}:"
    return f"{tag}ready", f"{tag}lease", f"{tag}rows", f"{tag}meta", f"{tag}holder"


def _back_off(deadline: float, delay: float) -> float:
    """Sleep before the next attempt, never past ``deadline`` (so the last attempt is made at
    the deadline); returns the next delay (doubling, at most 1 s), or -1 once the deadline
    has passed: then the caller gives up."""
    left = deadline - time.monotonic()
    if left <= 0:
        return -1.0
    time.sleep(min(delay, left))
    return min(delay * 2, 1.0)


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise EngineTypeError("name must be a str")
    if not name or len(name) > 200 or any(c in name for c in "{}\0\r\n"):
        raise EngineValueError(f"bad queue name {name!r}: 1-200 characters, no braces")
    return name


def _policy_args(policy: LanePolicy) -> list[Any]:
    """The policy as lanes.lua reads it (fixed-point shares, the remainder's index in
    REMAINDERS, the lane weights in ONE fixed point or "" when all are 1), then as JSON for
    ``policy``."""
    shares = [share_fp(policy.min_share.get(c, 0.0)) for c in ("submitted", "discovered", "cold")]
    weights = (",".join(map(str, policy.lane_weights_fp(policy.lane_count)))
               if policy.weights else "")
    return [int(policy.lanes_enabled), ",".join(str(b) for b in policy.ttl_bands),
            policy.cold_after, share_fp(policy.urgent_max_share), *shares,
            REMAINDERS.index(policy.remainder), weights,
            json.dumps(_policy_dict(policy), sort_keys=True)]


def _policy_dict(policy: LanePolicy) -> dict[str, Any]:
    return {"ttl_bands": list(policy.ttl_bands), "cold_after": policy.cold_after,
            "urgent_max_share": policy.urgent_max_share, "min_share": dict(policy.min_share),
            "remainder": policy.remainder, "lanes_enabled": policy.lanes_enabled,
            "weights": dict(policy.weights)}


def _policy_from(text: bytes | str) -> LanePolicy:
    d = json.loads(text)
    return LanePolicy(**{**d, "ttl_bands": tuple(d["ttl_bands"])})


def _live_token(token: int) -> int:
    """A token as sent: one that can never be live is sent as 0 (never a lease)."""
    return token if 0 < token < TOKEN_LIMIT else 0


class RedisClaims:
    """The rows one claim pass leased, as ``engine.Claims``: four int64 arrays of one length,
    ``rows``, ``lanes``, ``due_ms`` and ``tokens``; ``len()``; iteration yields ``Claim``."""

    __slots__ = ("rows", "lanes", "due_ms", "tokens")

    def __init__(self, rows: IntArray, lanes: IntArray, due_ms: IntArray,
                 tokens: IntArray) -> None:
        self.rows, self.lanes, self.due_ms, self.tokens = rows, lanes, due_ms, tokens

    @classmethod
    def _from_reply(cls, reply: bytes) -> RedisClaims:
        """The batch as lanes.lua's ``batch_reply`` sends it: the first token, the keys, the
        members joined, space separated (empty: no row). The i-th row's token is first + i."""
        if not reply:
            empty = np.zeros(0, np.int64)
            return cls(empty, empty.copy(), empty.copy(), empty.copy())
        parts = reply.split(b" ")
        keys = np.array(parts[1:-1], np.int64)
        rows = np.frombuffer(parts[-1], "S8").astype(np.int64)
        if len(rows) != len(keys):
            raise EngineError(f"a claim's reply holds {len(rows)} rows and {len(keys)} keys")
        return cls(rows, keys // STRIDE, keys % STRIDE,
                   np.arange(int(parts[0]), int(parts[0]) + len(rows), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Claim]:
        cols = zip(self.rows.tolist(), self.lanes.tolist(), self.due_ms.tolist(),
                   self.tokens.tolist(), strict=True)
        for row, lane, due, token in cols:
            yield Claim(row, lane, due, token)

    def __repr__(self) -> str:
        return f"RedisClaims(n={len(self)}, rows={self.rows.tolist()})"


class RedisEngine:
    """A claim queue in Redis with the API of ``engine.Engine`` (see docs/redis.md).

    Made by :meth:`connect` (or ``Engine.connect``). The queue outlives the object: ``close``
    drops the connection, ``drop`` deletes the queue's keys.
    """

    def __init__(self, client: Any, url: str, name: str) -> None:
        self._r: Any = client  # a plain client of the server (or Cluster node) holding the queue
        self._cluster: Any = None  # the RedisCluster the node was found through, or None
        self._url = url
        self._name = name
        self._keys = queue_keys(name)
        self._owner_pid = -1
        self._owner = ""
        self._created = False  # this object's connect made the queue
        self._timeout = 10.0  # how long reads retry a lost connection (seconds)

    # -- lifetime ------------------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str, name: str, policy: LanePolicy | None = None,
                create: bool = False, *, capacity: int | None = None, upgrade: bool = False,
                timeout: float = 10.0, cluster: bool | None = None) -> RedisEngine:
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
        to the primary serving the queue's slot.
        """
        if not isinstance(url, str):
            raise EngineTypeError("url must be a str")
        name = _check_name(name)
        if policy is not None and not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        for flag, what in ((create, "create"), (upgrade, "upgrade")):
            if not isinstance(flag, bool):
                raise EngineTypeError(f"{what} must be a bool, got {flag!r}")
        cap = MAX_ROWS if capacity is None else _int(capacity, "capacity", 1, MAX_ROWS)
        if not is_number(timeout) or not 0 <= timeout < 86_400:
            raise EngineValueError("timeout must be a number of seconds in [0, 86400)")
        if cluster is not None and not isinstance(cluster, bool):
            raise EngineTypeError(f"cluster must be a bool or None, got {cluster!r}")
        try:
            # redis-py never replays a command by itself: a write whose reply was lost may have
            # been applied (see _fcall). Reads are retried here, writes are not.
            client = redis_py.Redis.from_url(url, retry=Retry(NoBackoff(), 0))
        except ValueError as e:
            raise EngineValueError(f"bad Redis URL {redact(url)}: {e}") from None
        eng = cls(client, url, name)
        eng._timeout = float(timeout)
        try:
            eng._reach(float(timeout))
            eng._check_server()
            if cluster is None:
                cluster = eng._is_cluster_node()
            if cluster:
                eng._join_cluster()
            eng._ensure_library(replace=create or upgrade)
            eng._ensure_queue(policy, create, cap)
        except BaseException:
            eng.close()
            raise
        return eng

    # -- Redis Cluster ---------------------------------------------------------------------------

    def _is_cluster_node(self) -> bool:
        info = self._call_plain(self._r.info, "cluster")
        return bool(int(info.get("cluster_enabled", 0)))

    def _join_cluster(self) -> None:
        """Read the cluster's topology through the node at the URL and bind ``self._r`` to the
        primary serving the queue's slot."""
        if not self._is_cluster_node():
            raise EngineError(f"Redis at {redact(self._url)} is not a cluster node "
                              "(connect with cluster=False or None)")
        try:
            self._cluster = RedisCluster.from_url(self._url, retry=Retry(NoBackoff(), 0))
        except (redis_errors.RedisError, ValueError, OSError) as e:
            raise EngineError(f"cannot read the cluster at {redact(self._url)}: {e}") from None
        self._route()

    def _route(self) -> None:
        """(Re)bind ``self._r`` to the primary that serves the queue's slot now."""
        node = self._cluster.get_node_from_key(self._keys[0])
        client = node.redis_connection
        # redis-py's node clients may retry by themselves; ours never replay a write.
        client.connection_pool.set_retry(Retry(NoBackoff(), 0))
        self._r = client

    def _reroute(self) -> None:
        """The slot moved or its node is gone: read the topology again (from any node)."""
        self._cluster.nodes_manager.initialize()
        self._route()

    def _primaries(self) -> list[Any]:
        """A client per primary: every node the function library must be on."""
        if self._cluster is None:
            return [self._r]
        return [n.redis_connection for n in self._cluster.get_primaries()]

    def _reach(self, timeout: float) -> None:
        """PING until it answers, backing off, for at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                self._r.ping()
                return
            except redis_errors.AuthenticationError as e:  # a ConnectionError: caught first
                raise self._refused(e) from None
            except _LOST as e:
                delay = _back_off(deadline, delay)
                if delay < 0:
                    raise EngineError(f"cannot reach Redis at {redact(self._url)} "
                                      f"(tried for {timeout:g} s): {e}") from None

    def _refused(self, e: Exception) -> EngineError:
        return EngineError(f"Redis at {redact(self._url)} refused the credentials: {e}")

    def _check_server(self) -> None:
        version = str(self._call_plain(self._r.info, "server").get("redis_version", "0"))
        try:
            major_minor = tuple(int(p) for p in version.split(".")[:2])
        except ValueError:
            major_minor = (0, 0)
        if major_minor < MIN_REDIS:
            raise EngineError(
                f"Redis at {redact(self._url)} is version {version}: render-lanes needs Redis "
                f">= {MIN_REDIS[0]}.{MIN_REDIS[1]} (Functions: FUNCTION LOAD / FCALL)")

    def _server_library_version(self, client: Any = None) -> str | None:
        try:
            reply = (client or self._r).fcall_ro("lanes_version", 0)
        except redis_errors.ResponseError as e:
            if "function not found" in str(e).lower():
                return None
            raise self._error(e, "lanes_version") from None
        return str(reply[0].decode() if isinstance(reply[0], bytes) else reply[0])

    def _ensure_library(self, replace: bool) -> None:
        """The library of this version on every primary (one server, or each Cluster primary:
        a function runs on the node that holds its keys, and FUNCTION LOAD is per node)."""
        for client in self._primaries():
            self._load_library(client, replace)

    def _load_library(self, client: Any, replace: bool) -> None:
        have = self._call_plain(self._server_library_version, client)
        if have == LIBRARY_VERSION:
            return
        if have is not None and not replace:
            raise LayoutMismatch(
                f"Redis at {redact(self._url)} holds function library {LIBRARY} version {have}; "
                f"this client needs version {LIBRARY_VERSION}. Connect with upgrade=True (or "
                "create=True) to replace it: clients of the other version then get errors.")
        try:
            client.function_load(library_source(), replace=have is not None)
        except redis_errors.ResponseError as e:
            if "already exists" not in str(e):  # another client loaded it meanwhile
                raise EngineError(f"FUNCTION LOAD failed at {redact(self._url)}: {e}") from None
            if self._server_library_version(client) != LIBRARY_VERSION:
                raise LayoutMismatch(f"{LIBRARY} changed under us at {redact(self._url)}") \
                    from None

    def _ensure_queue(self, policy: LanePolicy | None, create: bool, capacity: int) -> None:
        if create:
            p = LanePolicy() if policy is None else policy
            self._created = bool(self._fcall("lanes_create", *_policy_args(p), capacity,
                                             wall_ms()))
        layout, stored = self._call_plain(self._r.hmget, self._keys[3], "layout", "policy")
        if layout is None:
            raise SegmentMissing(f"no queue {self._name!r} at {redact(self._url)} "
                                 "(connect with create=True to make it)")
        if int(layout) != LAYOUT_VERSION:
            raise LayoutMismatch(f"queue {self._name!r} has layout {int(layout)}, this client "
                                 f"reads layout {LAYOUT_VERSION}")
        if policy is not None and _policy_from(stored) != policy:
            raise EngineValueError(f"queue {self._name!r} exists with another policy; change it "
                                   "with set_policy")

    @property
    def name(self) -> str:
        return self._name

    @property
    def url(self) -> str:
        """The server's URL, without its password."""
        return redact(self._url)

    @property
    def keys(self) -> tuple[str, str, str, str, str]:
        """The queue's keys: ready, lease, rows, meta, holder."""
        return self._keys

    @property
    def owner(self) -> str:
        """This process's lease-owner id, ``host:pid:start_ms`` (a new one after a fork)."""
        pid = os.getpid()
        if pid != self._owner_pid:
            import psutil

            start = int(psutil.Process(pid).create_time() * 1000)
            self._owner = f"{socket.gethostname()}:{pid}:{start}"
            self._owner_pid = pid
        return self._owner

    def close(self) -> None:
        """Drop the connection. The queue stays on the server (see ``drop``)."""
        if self._cluster is not None:
            self._cluster.close()  # and with it the node clients
            self._cluster = None
        elif self._r is not None:
            self._r.close()
        self._r = None

    def drop(self) -> None:
        """Delete the queue's keys from the server: every row, lease and counter."""
        self._call_plain(lambda: self._live().delete(*self._keys))

    unlink = drop

    def __enter__(self) -> RedisEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the connection (the queue is kept: it belongs to the server, not to us)."""
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._r is None else "open"
        return f"<RedisEngine {self._name!r} at {self.url} {state}>"

    # -- calls -----------------------------------------------------------------------------------

    def _live(self) -> Any:
        if self._r is None:
            raise EngineClosed(f"RedisEngine {self._name!r} is closed")
        return self._r

    def _error(self, e: redis_errors.ResponseError, what: str) -> EngineError:
        text = str(e)
        code = text.split(" ", 1)[0]
        if code in _ERRORS:
            return _ERRORS[code](f"{what}: {text.split(' ', 1)[-1]}")
        if isinstance(e, redis_errors.NoPermissionError):
            return EngineError(
                f"{what} at {redact(self._url)}: {text} (an ACL user of this queue needs the key "
                f"pattern ~lanes:{{{self.name}}}:* and the commands docs/redis.md lists under "
                "'ACL users')")
        if "function not found" in text.lower():
            return LayoutMismatch(f"{what}: the {LIBRARY} library is gone from "
                                  f"{redact(self._url)} (reconnect to load it)")
        return EngineError(f"{what} at {redact(self._url)}: {text}")

    def _call_plain(self, fn: Any, *args: Any) -> Any:
        """A read (or an idempotent command): retried on a lost connection, backing off, for
        ``timeout`` seconds, then ``EngineError`` naming the URL. ``fn`` is looked up again
        after a Cluster slot moved when it is a method of ``self._r``."""
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        moved = 0
        while True:
            try:
                return fn(*args)
            except _LOST as e:
                delay = _back_off(deadline, delay)
                if delay < 0:
                    raise EngineError(f"lost Redis at {redact(self._url)} (retried for "
                                      f"{self._timeout:g} s): {e}") from None
                fn = self._after_lost(fn)
            except redis_errors.ResponseError as e:
                if self._moved(e) and moved < MOVED_RETRIES:
                    moved += 1
                    fn = self._rebind(fn)
                    continue
                raise self._error(e, getattr(fn, "__name__", "call")) from None

    def _moved(self, e: redis_errors.ResponseError) -> bool:
        if self._cluster is None or not isinstance(e, redis_errors.MovedError):
            return False
        self._reroute()
        return True

    def _rebind(self, fn: Any) -> Any:
        """``fn`` on the current node client if it was a method of the previous one."""
        owner = getattr(fn, "__self__", None)
        if owner is not None and owner is not self._r and hasattr(owner, "connection_pool"):
            return getattr(self._r, fn.__name__)
        return fn

    def _after_lost(self, fn: Any) -> Any:
        """After a lost connection on a Cluster, the slot may have a new primary."""
        if self._cluster is not None:
            try:
                self._reroute()
            except _LOST + (redis_errors.RedisError,):
                return fn  # the topology is unreadable too: try again after the back-off
            return self._rebind(fn)
        return fn

    def _connection(self) -> tuple[Any, Any]:
        """(pool, a connected connection taken from it): the caller gives it back. Connecting
        sends nothing, so it is retried with back-off for ``timeout`` seconds."""
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while True:
            pool = self._live().connection_pool
            try:
                conn = pool.get_connection()
            except redis_errors.AuthenticationError as e:
                raise self._refused(e) from None
            except _LOST as e:
                delay = _back_off(deadline, delay)
                if delay < 0:
                    raise EngineError(f"lost Redis at {redact(self._url)}: cannot reconnect "
                                      f"(tried for {self._timeout:g} s): {e}") from None
                self._after_lost(None)
                continue
            return pool, conn

    def _fcall(self, fn: str, *args: Any, extra_keys: tuple[str, ...] = ()) -> Any:
        """One FCALL of lanes.lua with the queue's keys (then ``extra_keys``, each with the
        queue's hash tag); errors mapped to ours.

        Never replayed once sent: a write whose reply was lost may have been applied (a
        replayed add would add twice, a replayed claim would lease rows nobody holds). A
        connection lost after sending raises ``OutcomeUnknown``; what a worker does then is
        in docs/redis.md. Connecting (before anything is sent) is retried, see
        ``_connection``; a MOVED reply (the node did not run it) is sent again to the new
        primary of the slot."""
        keys = (*self._keys, *extra_keys)
        for _ in range(MOVED_RETRIES + 1):
            # Sent and read on the connection _connection checked out, with redis-py's own
            # send_command / read_response (the parser maps error replies to ResponseError,
            # MOVED to MovedError): one pool round, where Redis.fcall would take a second one.
            pool, conn = self._connection()
            try:
                conn.send_command("FCALL", fn, len(keys), *keys, LIBRARY_VERSION, *args)
                return conn.read_response()
            except _LOST as e:
                conn.disconnect()
                raise OutcomeUnknown(f"lost Redis at {redact(self._url)} during {fn}: {e}; "
                                     "it may or may not have been applied") from None
            except redis_errors.ResponseError as e:
                if not self._moved(e):
                    raise self._error(e, fn) from None
            except BaseException:
                conn.disconnect()  # a reply half read (an interrupt): never reuse the socket
                raise
            finally:
                pool.release(conn)
        raise EngineError(f"{fn}: the queue's slot kept moving at {redact(self._url)}")

    @staticmethod
    def _now(now_ms: object) -> int | str:
        """``now_ms`` checked, or "" for the server's clock."""
        return "" if now_ms is None else check_due_ms(now_ms, "now_ms")

    @staticmethod
    def _row(row: object) -> int:
        return _int(row, "row", 0, MAX_ROWS - 1)

    @staticmethod
    def _token(token: object) -> int:
        return _live_token(_int(token, "token", -(1 << 63), (1 << 63) - 1))

    @staticmethod
    def _rows_tokens(rows: Any, tokens: Any) -> tuple[list[int], list[int]]:
        """Rows and tokens checked, as lists (what ``_batch`` formats; a batch is small, and
        list min/max cost less than numpy's on it)."""
        r = _int64_vector(rows, "rows").tolist()
        t = _int64_vector(tokens, "tokens").tolist()
        if len(r) != len(t):
            raise EngineValueError(f"rows ({len(r)}) and tokens ({len(t)}) differ in length")
        if r and (min(r) < 0 or max(r) >= MAX_ROWS):
            raise EngineValueError(f"rows must lie in [0, {MAX_ROWS})")
        return r, t

    @staticmethod
    def _claim_args(budget: object, lease_ms: object, window: object) -> tuple[int, int, int]:
        return (_int(budget, "budget", 1, MAX_BUDGET), _int(lease_ms, "lease_ms", 1, STRIDE - 1),
                _int(window, "window", 1, _hot.MAX_WINDOW))

    # -- writes ----------------------------------------------------------------------------------

    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int:
        """Queue one row; returns its row id."""
        return int(self.add_many([check_due_ms(due_ms)], _int(interval_s, "interval_s", 1,
                                                              MAX_INTERVAL_S),
                                 _provenance_code(provenance),
                                 _int(failures, "failures", 0, 255))[0])

    def add_many(self, due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                 failures: Any = None) -> IntArray:
        """Queue many rows; every element is checked before any row is sent. Rows go in chunks
        of ``ADD_CHUNK`` per FCALL (each chunk takes consecutive row ids)."""
        blob = packed_rows(due_ms, interval_s, provenance, failures)
        n = len(blob)
        out = np.empty(n, np.int64)
        for start in range(0, n, ADD_CHUNK):
            stop = min(n, start + ADD_CHUNK)
            first = int(self._fcall("lanes_add", blob[start:stop].tobytes()))
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
        r, t = self._rows_tokens(rows, tokens)
        tail: list[Any] = [0]
        if next_due_ms is not None:
            nd = check_due_array(next_due_ms, "next_due_ms")
            if len(nd) != len(r):
                raise EngineValueError("next_due_ms and rows differ in length")
            tail = [1, *nd.tolist()]
        now = self._now(now_ms)
        if len(r) == 0:
            return np.zeros(0, np.bool_)
        ok = self._fcall("lanes_complete", now, *_batch(r, t), *tail)
        return np.array(ok, dtype=np.bool_)

    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None, permanent: bool = False) -> None:
        """Count a failure, derive the lane again (cold after ``cold_after``; ``permanent``
        counts ``cold_after`` failures at least), and back off: 30 s doubling per failure,
        capped at the row's interval, unless ``retry_at_ms``."""
        if not isinstance(permanent, bool):
            raise EngineTypeError(f"permanent must be a bool, got {permanent!r}")
        r, t = self._row(row), self._token(token)
        retry = -1 if retry_at_ms is None else check_due_ms(retry_at_ms, "retry_at_ms")
        self._fcall("lanes_fail", self._now(now_ms), r, t, retry, int(permanent))

    def release(self, row: int, token: int, now_ms: int | None = None) -> None:
        """Give the row back unrendered; its schedule is unchanged. ``LeaseLost`` if stale.
        (``now_ms`` is accepted for symmetry with the other writes; a token's validity does not
        depend on the time: it holds until the row is granted again or the lease ends.)"""
        r, t = self._row(row), self._token(token)
        if not self.release_many([r], [t], now_ms)[0]:
            raise LeaseLost(f"release row {r}: the token is stale")

    def release_many(self, rows: Any, tokens: Any, now_ms: int | None = None) -> BoolArray:
        """``release`` of a batch in one FCALL: which tokens were live leases."""
        r, t = self._rows_tokens(rows, tokens)
        now = self._now(now_ms)
        if len(r) == 0:
            return np.zeros(0, np.bool_)
        ok = self._fcall("lanes_release", now, *_batch(r, t))
        return np.array(ok, dtype=np.bool_)

    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int:
        """Extend a lease to ``now + lease_ms``; returns the new token (the old one is stale)."""
        r, t = self._row(row), self._token(token)
        lease = _int(lease_ms, "lease_ms", 1, STRIDE - 1)
        return int(self._fcall("lanes_renew", self._now(now_ms), r, t, lease, self.owner))

    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None:
        """``"rush"``: urgent lane, due now. ``"wait"``: own lane, due now."""
        r = self._row(row)
        if not isinstance(mode, str) or mode not in ("rush", "wait"):
            raise EngineValueError(f"mode must be 'rush' or 'wait', got {mode!r}")
        self._fcall("lanes_prioritize", self._now(now_ms), r, int(mode == "rush"))

    def reclassify(self, row: int, provenance: str | int) -> None:
        """Change the row's provenance: its lane is derived again, its due time, failures and
        urgency kept; a lease on it goes on (its key waits in the holder entry)."""
        self._fcall("lanes_reclassify", self._row(row), _provenance_code(provenance))

    def remove(self, row: int) -> None:
        """Take the row out for good; a lease on it becomes stale."""
        self._fcall("lanes_remove", self._row(row))

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, budget: int = _hot.DEFAULT_BUDGET, now_ms: int | None = None,
              lease_ms: int = DEFAULT_LEASE_MS, window: int = DEFAULT_WINDOW) -> RedisClaims:
        """One claim pass, one FCALL: put lapsed leases back, then lease up to ``budget`` due
        rows as the policy shares them (``engine.policy.reference_pass``)."""
        b, lease, win = self._claim_args(budget, lease_ms, window)
        now = self._now(now_ms)
        return RedisClaims._from_reply(self._fcall("lanes_claim", now, b, lease, win,
                                                   self.owner))

    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = _hot.DEFAULT_BUDGET,
                           now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                           window: int = DEFAULT_WINDOW) -> tuple[BoolArray, RedisClaims]:
        """A worker's cycle in one round trip: ``complete_many(rows, tokens)`` then ``claim``.
        Returns (which tokens were live, the new batch)."""
        r, t = self._rows_tokens(rows, tokens)
        b, lease, win = self._claim_args(budget, lease_ms, window)
        now = self._now(now_ms)
        reply = self._fcall("lanes_complete_claim", now, b, lease, win, self.owner,
                            *_batch(r, t))
        return np.frombuffer(reply[1], np.uint8).astype(np.bool_), RedisClaims._from_reply(
            reply[0])

    # -- reading ---------------------------------------------------------------------------------

    def _snapshot(self, *commands: tuple[str, tuple[Any, ...]]) -> list[Any]:
        """Run read commands in one MULTI/EXEC (one consistent state)."""
        def run() -> list[Any]:
            pipe = self._live().pipeline(transaction=True)
            for cmd, args in commands:
                getattr(pipe, cmd)(*args)
            return list(pipe.execute())

        result: list[Any] = self._call_plain(run)
        return result

    def describe(self, row: int, now_ms: int | None = None) -> dict[str, Any]:
        """Everything the row table holds about one row (true due time, never a raw key)."""
        r = self._row(row)
        ready, _lease, rows, meta, holder = self._keys
        used, rec, key, held, t = self._snapshot(
            ("hget", (meta, "next_row")), ("getrange", (rows, r * RECORD, r * RECORD + RECORD - 1)),
            ("zscore", (ready, member(r))), ("hget", (holder, member(r))), ("time", ()))
        if used is None:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        if r >= int(used):
            raise EngineValueError(f"row {r} does not exist")
        now = int(t[0]) * 1000 + int(t[1]) // 1000 if now_ms is None else check_due_ms(now_ms)
        f = _records(rec)
        live = bool(f["flags"][0] & 4)
        h = _holding(held) if held is not None else None
        expiry: int | None = None
        if h is not None and key is None:  # in flight; in ready, the entry is a lapsed lease's
            key, expiry = h.key, h.expiry
        lane, due = (int(key) // STRIDE, int(key) % STRIDE) if live and key is not None \
            else (None, None)
        leased = live and expiry is not None and expiry > now
        owner = h.owner if h is not None else None
        return {
            "row": r,
            "queued": live,
            "due_ms": due,
            "lane": lane,
            "interval_s": int(f["interval"][0]),
            "failures": int(f["failures"][0]),
            "provenance": PROVENANCES[int(f["flags"][0]) & 1],
            "urgent": bool(f["flags"][0] & 2),
            "leased": leased,
            "lease_expiry_ms": expiry if leased else None,
            "owner": owner if leased else None,
        }

    def due_ms(self, row: int) -> int | None:
        """The row's true due time (None once removed)."""
        due: int | None = self.describe(row)["due_ms"]
        return due

    def lane(self, row: int) -> int | None:
        lane: int | None = self.describe(row)["lane"]
        return lane

    def lane_name(self, lane: int) -> str:
        checked = _int(lane, "lane", 0, MAX_LANES - 1)
        return self.policy.lane_name(checked)

    @property
    def policy(self) -> LanePolicy:
        stored = self._call_plain(self._live().hget, self._keys[3], "policy")
        if stored is None:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        return _policy_from(stored)

    def set_policy(self, policy: LanePolicy) -> None:
        """Change the policy live for every client; no row is rewritten."""
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        self._fcall("lanes_set_policy", *_policy_args(policy))

    def floor_minute(self, lane: int) -> int:
        """The minute of the lane's earliest queued (ready) row; 0 when it has none."""
        lane = _int(lane, "lane", 0, MAX_LANES - 1)
        return int(self._stats(None)[1][lane]["floor_minute"])

    def stats(self, now_ms: int | None = None) -> dict[str, Any]:
        """``Engine.stats`` where the keys mean something here: per lane ``floor_minute`` is
        the minute of its earliest ready row (a ZSET holds no stale entries, so there is no
        floor to keep); ``spilled``, ``stale_skipped`` and ``lease_refused`` are always 0.
        ``owners`` counts live leases per owner id."""
        return self._stats(now_ms)[0]

    def _stats(self, now_ms: object) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(stats, every lane's entry up to MAX_LANES)."""
        now = self._now(now_ms)
        meta_all, reply = self._snapshot(
            ("hgetall", (self._keys[3],)),
            ("fcall_ro", ("lanes_stats", 5, *self._keys, LIBRARY_VERSION, now, MAX_LANES)))
        if not meta_all:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        if isinstance(reply, redis_errors.ResponseError):
            raise self._error(reply, "lanes_stats")
        meta = {k.decode(): v.decode() for k, v in meta_all.items()}
        policy = _policy_from(meta["policy"])
        at, per, flight = int(reply[0]), reply[1], reply[2]
        lanes = [{"lane": i, "name": policy.lane_name(i),
                  "floor_minute": per[3 * i + 2] // 60_000 if per[3 * i + 2] >= 0 else 0,
                  "queued": per[3 * i], "due": per[3 * i + 1], "leased": 0, "in_flight": 0,
                  "granted": int(meta.get(f"g{i}", 0)), "spilled": 0, "stale_skipped": 0,
                  "lease_refused": 0} for i in range(MAX_LANES)]
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
        return {
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
        }, lanes

    def verify(self) -> list[str]:
        """Read the whole queue in one MULTI/EXEC; one line per broken invariant (empty when
        all hold): every live row is in exactly one of ready and a batch in lease (in flight:
        its holder entry names a batch in lease), a removed row in neither; a row in flight
        has its batch's expiry and is listed in its batch's record, every batch in lease has a
        record counting its rows in flight (at least one) and every record a batch in lease (a
        row in ready may keep the entry of a lapsed lease nobody was granted since), a removed
        row no entry; tokens are below the token counter and unique; every key's lane is one
        a policy can make."""
        meta_all, table, ready, lease, holder = self._snapshot(*self._dump_commands())
        if not meta_all:
            return [f"queue {self._name!r} does not exist"]
        meta = {k.decode(): v.decode() for k, v in meta_all.items()}
        n, counter, table = int(meta["next_row"]), int(meta["token"]), table or b""
        problems: list[str] = []
        if len(table) < n * RECORD:
            return [f"row table holds {len(table) // RECORD} records, next_row is {n}"]
        f = _records(table[:n * RECORD])
        live = (f["flags"] & 4) != 0
        lanes: list[int] = []
        in_ready = np.zeros(n, np.int64)
        in_lease = np.zeros(n, np.int64)
        for m, score in ready:
            row = int(m)
            if not 0 <= row < n:
                problems.append(f"ready holds row {row}, past next_row {n}")
                continue
            in_ready[row] += 1
            lanes.append(int(score) // STRIDE)
        batches = {m.decode(): int(expiry) for m, expiry in lease}
        records, held = _split_holder(holder)
        flying = dict.fromkeys(batches, 0)
        tokens = np.zeros(n, np.int64)
        for row, h in held.items():
            if not 0 <= row < n:
                problems.append(f"holder holds row {row}, past next_row {n}")
                continue
            tokens[row] = h.token
            if h.batch not in batches:  # a lapsed lease's entry (row back in ready): key void
                continue
            in_lease[row] += 1
            flying[h.batch] += 1
            lanes.append(h.key // STRIDE)
            if h.expiry != batches[h.batch]:
                problems.append(f"row {row}: expiry {h.expiry}, its batch {h.batch}'s is "
                                f"{batches[h.batch]}")
            if row not in records.get(h.batch, (0, []))[1]:
                problems.append(f"row {row}: not in the record of its batch {h.batch}")
        for batch, count in flying.items():
            if batch not in records:
                problems.append(f"batch {batch}: in lease without a record")
            elif records[batch][0] != count:
                problems.append(f"batch {batch}: its record counts {records[batch][0]} rows in "
                                f"flight, {count} are")
            if count == 0:
                problems.append(f"batch {batch}: in lease with no row in flight")
        for batch in records.keys() - batches.keys():
            problems.append(f"batch {batch}: a record without a lease entry")
        has_holder = np.zeros(n, np.bool_)
        has_holder[[row for row in held if 0 <= row < n]] = True
        for row in np.flatnonzero(live & (in_ready + in_lease != 1)).tolist():
            problems.append(f"live row {row} is in {int(in_ready[row])} ready and "
                            f"{int(in_lease[row])} lease entries")
        for row in np.flatnonzero(~live & (in_ready + in_lease != 0)).tolist():
            problems.append(f"removed row {row} is still queued")
        for row in np.flatnonzero(~live & has_holder).tolist():
            problems.append(f"removed row {row} holds token {int(tokens[row])}")
        for row in np.flatnonzero(has_holder & (tokens == 0)).tolist():
            problems.append(f"row {row}: its holder entry holds no token")
        for row in np.flatnonzero(tokens > counter).tolist():
            problems.append(f"row {row}: token {int(tokens[row])} past the counter {counter}")
        issued = tokens[tokens != 0]
        if len(np.unique(issued)) != len(issued):
            problems.append("a token is held by two rows")
        if any(lane >= MAX_LANES for lane in lanes):
            problems.append("a row's lane is past the 64 a policy can make")
        return problems

    check = verify

    def _dump_commands(self) -> list[tuple[str, tuple[Any, ...]]]:
        ready, lease, rows, meta, holder = self._keys
        return [("hgetall", (meta,)), ("get", (rows,)),
                ("zrange", (ready, 0, -1, False, True)), ("zrange", (lease, 0, -1, False, True)),
                ("hgetall", (holder,))]

    # -- maintenance -----------------------------------------------------------------------------

    def restamp(self, limit: int = 5000) -> dict[str, Any]:
        """Re-encode up to ``limit`` rows written with lanes disabled into their lanes; refused
        (``NotAllowed``) while lanes are enabled."""
        lim = _int(limit, "limit", 1, 10_000_000)
        done, finished = self._fcall("lanes_restamp", lim)
        return {"restamped": int(done), "done": bool(finished)}

    def compact(self, full: bool = False) -> None:
        """Nothing to merge: a ZSET is always in order (kept for API parity). Refused, as every
        call is, on a closed engine."""
        if not isinstance(full, bool):
            raise EngineTypeError(f"full must be a bool, got {full!r}")
        self._live()

    # -- checkpoints (engine/checkpoint.py's format) ----------------------------------------------

    def export_rows(self) -> tuple[IntArray, dict[str, IntArray]]:
        """(row ids, columns) of every queued row, read in one transaction: the columns of
        ``checkpoint.snapshot`` (due_ms, interval_s, failures, provenance, urgent, lane)."""
        ready, _lease, rows_key, meta, holder = self._keys
        meta_all, table, queued, held = self._snapshot(
            ("hgetall", (meta,)), ("get", (rows_key,)), ("zrange", (ready, 0, -1, False, True)),
            ("hgetall", (holder,)))
        if not meta_all:
            raise SegmentMissing(f"queue {self._name!r} is gone")
        n = int(meta_all[b"next_row"])
        f = _records((table or b"")[:n * RECORD])
        rows = np.flatnonzero(f["flags"] & 4)
        key = np.zeros(n, np.int64)  # a live row's key: its holder entry's, or its ready score
        for row, h in _split_holder(held)[1].items():  # (in ready, a lapsed lease's entry)
            key[row] = h.key
        for m, score in queued:
            key[int(m)] = int(score)
        cols = {"due_ms": key % STRIDE, "interval_s": f["interval"], "failures": f["failures"],
                "provenance": f["flags"] & 1, "urgent": (f["flags"] >> 1) & 1,
                "lane": key // STRIDE}
        return rows, {c: np.ascontiguousarray(v[rows], np.int64) for c, v in cols.items()}

    def save(self, path: str | os.PathLike[str], urls: Any = None,
             extra: dict[str, Any] | None = None) -> int:
        """Write the queue's schedule to ``path`` in engine/checkpoint.py's format, atomically
        (read with ``checkpoint.read``, restored by ``load`` or ``Engine.load``); returns the
        rows saved. ``urls`` (row id -> URL), if given, is saved with it. Leases are not."""
        from .. import checkpoint

        return checkpoint.save(cast(Any, self), path, urls, extra)

    @classmethod
    def load(cls, path: str | os.PathLike[str], url: str, name: str,
             policy: LanePolicy | None = None, capacity: int | None = None) -> RedisEngine:
        """Create queue ``name`` at ``url`` holding a checkpoint (row ids renumbered from 0 in
        saved order); the saved policy unless given. The queue must not exist yet; nothing is
        left behind if the restore fails."""
        from .. import checkpoint

        ck = checkpoint.read(path)
        if capacity is not None and _int(capacity, "capacity", 1, MAX_ROWS) < len(ck):
            raise EngineValueError(f"capacity {capacity} is below the {len(ck)} rows of the "
                                   "checkpoint")
        eng = cls.connect(url, name, ck.policy if policy is None else policy, create=True,
                          capacity=capacity)
        if not eng._created:
            eng.close()
            raise EngineValueError(f"queue {name!r} already exists at {redact(url)}: load "
                                   "restores into a new queue only")
        try:
            checkpoint.restore(ck, cast(Any, eng))
        except BaseException:
            eng.drop()
            eng.close()
            raise
        return eng


    # -- pools on several hosts (engine/pool, docs/redis.md "Pools on several hosts") -----------

    def reap(self) -> int:
        """Put back at once the leases of owners on this host whose process is gone (an owner id
        is ``host:pid:start_ms``: pid and start time tell a live process from a reused pid), as
        ``Engine.reap`` does on shared memory. Returns how many dead owners were found.

        Owners on other hosts are not judged: no host can see another's processes, so their
        rows come back when their leases expire."""
        from ..segment import is_running

        host = socket.gethostname()
        holders = _split_holder(self._call_plain(self._live().hgetall, self._keys[4]))[1]
        dead = []
        for owner in sorted({h.owner for h in holders.values()}):
            parts = owner.rsplit(":", 2)
            if len(parts) != 3 or parts[0] != host or not (parts[1].isdigit()
                                                          and parts[2].isdigit()):
                continue
            if owner != self.owner and not is_running(int(parts[1]), int(parts[2])):
                dead.append(owner)
        if dead:
            self._fcall("lanes_reap", *dead)
        return len(dead)


_RECORD_DTYPE = np.dtype([("interval", ">u4"), ("failures", "u1"), ("flags", "u1")])
assert _RECORD_DTYPE.itemsize == RECORD


def _records(raw: bytes) -> dict[str, npt.NDArray[np.int64]]:
    """Columns of packed row records (lanes.lua REC, big endian) as int64 arrays."""
    a = np.frombuffer(raw, _RECORD_DTYPE)
    return {c: a[c].astype(np.int64) for c in ("interval", "failures", "flags")}


class Held(NamedTuple):
    """A row's holder entry, ``token:batch:n:expiry:key:owner`` (lanes.lua holder_value)."""

    token: int
    batch: str
    """The lease entry (member of ``lease``) of the batch the row was granted in."""
    size: int
    expiry: int
    key: int
    owner: str


def _holding(value: bytes | str) -> Held:
    text = value.decode() if isinstance(value, bytes) else str(value)
    token, batch, size, expiry, key, owner = text.split(":", 5)
    return Held(int(token), batch, int(size), int(expiry), int(key), owner)


def _split_holder(fields: dict[bytes, bytes]) -> tuple[dict[str, tuple[int, list[int]]],
                                                       dict[int, Held]]:
    """The holder hash read whole, as (batch -> (count, rows) of the batches' records
    ``b<batch>`` = ``count:members``, row -> its entry)."""
    records: dict[str, tuple[int, list[int]]] = {}
    held: dict[int, Held] = {}
    for k, v in fields.items():
        name = k.decode()
        if name.startswith("b"):
            count, _, members = v.decode().partition(":")
            records[name[1:]] = (int(count), [int(members[i:i + 8])
                                              for i in range(0, len(members), 8)])
        else:
            held[int(name)] = _holding(v)
    return records, held


def packed_rows(due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                failures: Any = None) -> npt.NDArray[np.uint8]:
    """Rows checked (every element, before anything is sent) and packed as lanes.lua's
    ``lanes_add`` takes them: one 12-byte row ``<I6I4BB`` per row, an (n, 12) uint8 array."""
    due = check_due_array(due_ms)
    n = len(due)
    packed = np.empty(n, _ADD_ROW)
    packed["due"] = due
    packed["interval"] = _broadcast(interval_s, n, "interval_s", 1, MAX_INTERVAL_S)
    packed["prov"] = _provenance_array(provenance, n)
    packed["failures"] = 0 if failures is None else _broadcast(failures, n, "failures", 0, 255)
    raw = packed.view(np.uint8).reshape(n, _ADD_ROW.itemsize)
    return np.ascontiguousarray(np.concatenate([raw[:, :6], raw[:, 8:]], axis=1))
