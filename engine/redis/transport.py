"""The connection of a Redis queue: one server, the master Sentinel names (``redis+sentinel://``,
:mod:`engine.redis.sentinel`), or the Cluster primary serving the queue's slot.

Every command goes through one of three calls, and one retry rule (:meth:`Transport.retrying`)
serves them all: a lost connection, and a reply that says the command was not run and may
succeed later (``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``, ``MASTERDOWN``, a master demoted to
a replica; ``ASK`` for a read), is retried with back-off (50 ms doubling, at most 1 s apart;
a heartbeat's at most TTL/32 apart, ``max_delay``) until ``timeout`` seconds have passed,
then ``EngineError`` names the URL, never its password.

* :meth:`Transport.call` -- a read, or a command that is safe to repeat: retried whole.
* :meth:`Transport.fcall` -- a function of the library: retried only while nothing was sent
  or the server said it did not run it. A connection lost after sending makes the outcome
  unknown, and a write is then never replayed (``OutcomeUnknown``, docs/redis.md "Lost
  connections"): a replayed add would add twice, a replayed claim would lease rows nobody
  holds. With ``wait_replicas`` N each FCALL is followed, in the same round trip, by
  ``WAIT N timeout`` (a function cannot block on WAIT itself); fewer replicas than N
  acknowledging in time is ``OutcomeUnknown`` too: applied on the primary, maybe lost in a
  failover (docs/redis.md "Failover").
* :meth:`Transport.snapshot` -- reads in one MULTI/EXEC, so they see one consistent state.

On a Redis Cluster every key of a queue carries the hash tag ``{name}``, so a queue is one
slot; the client is a plain one of the primary serving it, found through a ``RedisCluster``
kept for the topology only. A MOVED reply (the node did not run the call) reads the topology
again and sends again, at most ``MOVED_RETRIES`` times. While the slot migrates, an FCALL
answered ``ASK`` (its keys moved already) is sent to the importing node after ``ASKING``, in
one round trip; a ``TRYAGAIN`` (the keys are split between the two nodes) backs off.
"""

from __future__ import annotations

import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import redis as redis_py
import redis.exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ..errors import (
    CapacityError,
    EngineClosed,
    EngineError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    NotAllowed,
    OutcomeUnknown,
    SegmentMissing,
)
from . import sentinel

T = TypeVar("T")

LOST = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
"""What a lost or refused connection raises (redis-py wraps most socket errors, not all)."""
NOT_RUN: tuple[type[Exception], ...] = (redis_errors.TryAgainError, redis_errors.ClusterDownError,
           redis_errors.MasterDownError, redis_errors.ReadOnlyError, redis_errors.AskError)
"""Replies that say the command was not run and may succeed later (for a read, ``ASK`` is
waited out: the migration ends with the slot's new owner, reached through MOVED). MOVED, an
AskError to redis-py, is not among them: it is followed at once."""
NOT_RUN_LOST = (redis_errors.BusyLoadingError,)
"""Lost-connection errors that are replies (the command was not run): ``LOADING``."""
MOVED_RETRIES = 3
"""A Cluster slot that moved: re-read the topology and send again this many times (a MOVED
reply means the node did not run the call, so sending again is safe)."""
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0

ERRORS: dict[str, type[EngineError]] = {
    "LEASE": LeaseLost,
    "RANGE": EngineValueError,
    "VALUE": EngineValueError,
    "NOTALLOWED": NotAllowed,
    "CAPACITY": CapacityError,
    "MISSING": SegmentMissing,
    "LAYOUT": LayoutMismatch,
    "VERSION": LayoutMismatch,
}
"""The library's error codes (the first word of an error reply) as our exceptions."""


def redact(url: str) -> str:
    """The URL without its password, in the authority or in the query as redis-py also
    takes it (``unix:///path?password=...``): safe to put in an error message or a log."""
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return "<unparsable URL>"
    in_query = any(k.lower().endswith("password") for k, _ in query)  # sentinel_password too
    if parts.password is None and not in_query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        hosts = netloc.rpartition("@")[2]  # verbatim: a Sentinel URL lists several
        netloc = f"{parts.username or ''}:***@{hosts}"
    text = f"{parts.scheme}://{netloc}{parts.path}"  # urlunsplit would drop unix:// 's "//"
    if query:
        text += "?" + "&".join(f"{k}=***" if k.lower().endswith("password")
                               else urllib.parse.urlencode({k: v}) for k, v in query)
    return text


def durability(url: str) -> tuple[str, int, int]:
    """(``url`` without our own query parameters, ``wait_replicas``, ``wait_timeout_ms``):
    ``?wait_replicas=N&wait_timeout_ms=T`` make every write wait for N replicas, T ms at most
    (default 1000), so a pool's workers, which connect by URL, all wait alike."""
    base, mark, query = url.partition("?")
    params = urllib.parse.parse_qsl(query, keep_blank_values=True)
    own = dict(p for p in params if p[0] in ("wait_replicas", "wait_timeout_ms"))
    rest = urllib.parse.urlencode([p for p in params if p[0] not in own])
    try:
        replicas, ms = int(own.get("wait_replicas", 0)), int(own.get("wait_timeout_ms", 1000))
    except ValueError:
        raise ValueError("wait_replicas and wait_timeout_ms must be integers") from None
    if not 0 <= replicas <= 100 or not 1 <= ms <= 3_600_000:
        raise ValueError("wait_replicas must be in [0, 100], wait_timeout_ms in [1, 3600000]")
    return base + (mark if rest else "") + rest, replicas, ms


def with_wait(url: str, replicas: int) -> str:
    """``url`` asking every write to wait for ``replicas`` replicas (``--wait-replicas``)."""
    base, mark, query = url.partition("?")
    params = [p for p in urllib.parse.parse_qsl(query, keep_blank_values=True)
              if p[0] != "wait_replicas"]
    return f"{base}?{urllib.parse.urlencode([*params, ('wait_replicas', str(replicas))])}"


def _never_replay() -> Retry:
    """redis-py's own retry policy for our clients: none. A write whose reply was lost may have
    been applied, so only this module decides what is sent again."""
    return Retry(NoBackoff(), 0)


class Transport:
    """The connection to the server holding queue ``name`` (whose keys are ``keys``)."""

    def __init__(self, url: str, name: str, keys: tuple[str, ...], version: str,
                 timeout: float, wait_replicas: int | None = None) -> None:
        self.url = url
        self.name = name
        self.keys = keys
        self.version = version
        """The library version every FCALL sends first: the library refuses another."""
        self.timeout = timeout
        try:
            plain, in_url, self.wait_ms = durability(url)
            self.wait_replicas = in_url if wait_replicas is None else wait_replicas
            if sentinel.is_sentinel_url(plain):
                self.client: Any = sentinel.sentinel_client(plain, _never_replay())
            else:
                self.client = redis_py.Redis.from_url(plain, retry=_never_replay())
        except ValueError as e:
            raise EngineValueError(f"bad Redis URL {redact(url)}: {e}") from None
        self.cluster: Any = None
        """The RedisCluster the node was found through, or None on a standalone server."""
        self._plain_url = plain
        self.retried: Counter[str] = Counter()
        """Replies retried because the command was not run (TryAgainError, AskError...), and
        ``ASK`` followed to the importing node (``asking``), by kind: how often a failover or
        a slot migration made this client wait."""

    @property
    def where(self) -> str:
        return f"Redis at {redact(self.url)}"

    def live(self) -> Any:
        """The client; ``EngineClosed`` once closed."""
        if self.client is None:
            raise EngineClosed(f"RedisEngine {self.name!r} is closed")
        return self.client

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()  # and with it the node clients
            self.cluster = None
        elif self.client is not None:
            self.client.close()
        self.client = None

    # -- the one retry rule ----------------------------------------------------------------------

    def retrying(self, attempt: Callable[[], T], failed: str = "lost",
                 timeout: float | None = None, max_delay: float = MAX_DELAY_S) -> T:
        """``attempt()`` until it neither loses the connection nor is told "not run, try later"
        (``NOT_RUN``), backing off (at most ``max_delay`` seconds apart), for ``timeout``
        seconds (default: the transport's); then ``EngineError``: "``failed`` Redis at URL".
        Wrong credentials are never retried."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        delay = min(FIRST_DELAY_S, max_delay)
        while True:
            try:
                return attempt()
            except redis_errors.AuthenticationError as e:  # a ConnectionError: caught first
                raise EngineError(f"{self.where} refused the credentials: {e}") from None
            except LOST + NOT_RUN as e:
                if isinstance(e, redis_errors.MovedError):  # an AskError: followed at once
                    raise
                self.retried[type(e).__name__] += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"{failed} {self.where} (tried for {limit:g} s): {e}") \
                        from None
                time.sleep(min(delay, left))  # the last attempt is made at the deadline
                delay = min(delay * 2, max_delay)
                self._after_lost()

    def _after_lost(self) -> None:
        """After a lost connection on a Cluster, the slot may have a new primary."""
        if self.cluster is not None:
            try:
                self.reroute()
            except LOST + (redis_errors.RedisError,):
                pass  # the topology is unreadable too: try again after the back-off

    # -- the three calls -------------------------------------------------------------------------

    def call(self, what: str, command: Callable[[Any], T]) -> T:
        """``command(client)``, a read or a command safe to repeat, retried on a lost
        connection (see ``retrying``) and after a moved slot; errors mapped to ours."""
        moved = 0
        while True:
            try:
                return self.retrying(lambda: command(self.live()))
            except redis_errors.ResponseError as e:
                if moved < MOVED_RETRIES and self._moved(e):
                    moved += 1
                    continue
                raise self.error(e, what) from None

    def snapshot(self, *commands: tuple[str, tuple[Any, ...]]) -> list[Any]:
        """Run read commands in one MULTI/EXEC (one consistent state)."""
        def run(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=True)
            for cmd, args in commands:
                getattr(pipe, cmd)(*args)
            return list(pipe.execute())

        return self.call("a read", run)

    def fcall(self, fn: str, *args: Any, extra_keys: tuple[str, ...] = (),
              max_delay: float = MAX_DELAY_S) -> Any:
        """One FCALL of the library with the queue's keys (then ``extra_keys``, each with the
        queue's hash tag); never replayed once it may have run (see the module's note).
        ``max_delay``: the longest back-off between tries (a heartbeat's is short: it must
        land soon after a stall ends)."""
        keys = (*self.keys, *extra_keys)
        command = ("FCALL", fn, len(keys), *keys, self.version, *args)
        moved = 0
        while True:
            try:
                return self.retrying(lambda: self._fcall_once(fn, command),
                                     max_delay=max_delay)
            except redis_errors.ResponseError as e:
                if moved < MOVED_RETRIES and self._moved(e):
                    moved += 1
                    continue
                raise self.error(e, fn) from None

    def _fcall_once(self, fn: str, command: tuple[Any, ...]) -> Any:
        """Send ``command`` once (after an ``ASK``, once more to the importing node) and read
        its reply; a reply that says it did not run is raised for ``retrying``."""
        pool, conn = self._checkout(self.live().connection_pool)
        try:
            return self._exchange(conn, fn, command)
        except redis_errors.AskError as e:
            if isinstance(e, redis_errors.MovedError):
                raise
            target = self._asked(e)
            self.retried["asking"] += 1
        finally:
            pool.release(conn)
        pool, conn = self._checkout(target.connection_pool)
        try:
            return self._exchange(conn, fn, command, asking=True)
        finally:
            pool.release(conn)

    def _exchange(self, conn: Any, fn: str, command: tuple[Any, ...],
                  asking: bool = False) -> Any:
        """One round trip on ``conn``: [ASKING,] the FCALL [, WAIT]; the FCALL's reply.
        Sent and read with redis-py's own send / read_response (the parser maps error replies
        to ResponseError, MOVED to MovedError): one pool round, where Redis.fcall would take a
        second one."""
        wait = self.wait_replicas > 0
        commands = [*([("ASKING",)] if asking else []), command,
                    *([("WAIT", self.wait_replicas, self.wait_ms)] if wait else [])]
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            if asking:
                conn.read_response()
            try:
                reply, refused = conn.read_response(), None
            except redis_errors.ResponseError as e:
                reply, refused = None, e
            acked = int(conn.read_response()) if wait else 0
        except NOT_RUN_LOST:
            conn.disconnect()
            raise  # LOADING: not run, retried
        except LOST as e:
            conn.disconnect()
            if sentinel.DEMOTED in str(e):
                raise  # READONLY: not run; the next connection asks the Sentinels again
            raise OutcomeUnknown(f"lost {self.where} during {fn}: {e}; it may or may not "
                                 "have been applied") from None
        except BaseException:
            conn.disconnect()  # a reply half read (an interrupt): never reuse the socket
            raise
        if refused is not None:
            raise refused
        if wait and acked < self.wait_replicas:
            raise OutcomeUnknown(
                f"{fn} was applied at {self.where} but only {acked} of {self.wait_replicas} "
                f"replica(s) acknowledged it within {self.wait_ms} ms: a failover now may lose "
                "it (docs/redis.md, Failover)")
        return reply

    def _checkout(self, pool: Any) -> tuple[Any, Any]:
        """(pool, a connected connection taken from it): the caller gives it back."""
        return pool, pool.get_connection()

    def _asked(self, e: redis_errors.AskError) -> Any:
        """The client of the node an ``ASK`` names (importing the queue's slot)."""
        node = self.cluster.get_node(host=e.host, port=e.port) if self.cluster else None
        if node is None:  # a node we do not know yet: the topology changed
            self._after_lost()
            raise redis_errors.TryAgainError(f"ASK to an unknown node {e.host}:{e.port}")
        node.redis_connection.connection_pool.set_retry(_never_replay())
        return node.redis_connection

    def error(self, e: redis_errors.ResponseError, what: str) -> EngineError:
        """An error reply as our exception (a library code, an ACL refusal, a lost library)."""
        text = str(e)
        code = text.split(" ", 1)[0]
        if code in ERRORS:
            return ERRORS[code](f"{what}: {text.split(' ', 1)[-1]}")
        if isinstance(e, redis_errors.NoPermissionError):
            return EngineError(
                f"{what} at {redact(self.url)}: {text} (an ACL user of this queue needs the key "
                f"pattern ~lanes:{{{self.name}}}:* and the commands docs/redis.md lists under "
                "'ACL users')")
        if "function not found" in text.lower():
            return LayoutMismatch(f"{what}: the function library is gone from "
                                  f"{redact(self.url)} (reconnect to load it)")
        return EngineError(f"{what} at {redact(self.url)}: {text}")

    # -- Redis Cluster ---------------------------------------------------------------------------

    def is_cluster_node(self) -> bool:
        info = self.call("INFO cluster", lambda r: r.info("cluster"))
        return bool(int(info.get("cluster_enabled", 0)))

    def join_cluster(self) -> None:
        """Read the cluster's topology through the node at the URL and bind the client to the
        primary serving the queue's slot."""
        if not self.is_cluster_node():
            raise EngineError(f"{self.where} is not a cluster node (connect with cluster=False "
                              "or None)")
        try:  # a node down (a failover under way) is waited out as any lost connection
            self.cluster = self.retrying(lambda: RedisCluster.from_url(
                self._plain_url, retry=_never_replay()), "cannot read the cluster through")
        except (redis_errors.RedisError, ValueError, OSError) as e:
            raise EngineError(f"cannot read the cluster at {redact(self.url)}: {e}") from None
        self._route()

    def _route(self) -> None:
        """(Re)bind the client to the primary that serves the queue's slot now."""
        node = self.cluster.get_node_from_key(self.keys[0])
        client = node.redis_connection
        client.connection_pool.set_retry(_never_replay())
        self.client = client

    def reroute(self) -> None:
        """The slot moved or its node is gone: read the topology again (from any node)."""
        self.cluster.nodes_manager.initialize()
        self._route()

    def _moved(self, e: redis_errors.ResponseError) -> bool:
        if self.cluster is None or not isinstance(e, redis_errors.MovedError):
            return False
        self.reroute()
        return True

    def primaries(self) -> list[Any]:
        """A client per primary: every node the function library must be on."""
        if self.cluster is None:
            return [self.live()]
        return [n.redis_connection for n in self.cluster.get_primaries()]
