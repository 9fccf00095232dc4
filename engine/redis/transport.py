"""The connection of a Redis queue: one server, or the Cluster primary serving the queue's slot.

Every command goes through one of three calls, and one retry rule (:meth:`Transport.retrying`)
serves them all: a lost connection is retried with back-off (50 ms doubling, at most 1 s
apart) until ``timeout`` seconds have passed, then ``EngineError`` names the URL, never its
password.

* :meth:`Transport.call` -- a read, or a command that is safe to repeat: retried whole.
* :meth:`Transport.fcall` -- a function of the library: only getting a connected connection
  is retried (nothing was sent yet). A connection lost after sending makes the outcome unknown,
  and a write is then never replayed (``OutcomeUnknown``, docs/redis.md "Lost connections"):
  a replayed add would add twice, a replayed claim would lease rows nobody holds.
* :meth:`Transport.snapshot` -- reads in one MULTI/EXEC, so they see one consistent state.

On a Redis Cluster every key of a queue carries the hash tag ``{name}``, so a queue is one
slot; the client is a plain one of the primary serving it, found through a ``RedisCluster``
kept for the topology only. A MOVED reply (the node did not run the call) reads the topology
again and sends again, at most ``MOVED_RETRIES`` times.
"""

from __future__ import annotations

import time
import urllib.parse
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

T = TypeVar("T")

LOST = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
"""What a lost or refused connection raises (redis-py wraps most socket errors, not all)."""
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


def _never_replay() -> Retry:
    """redis-py's own retry policy for our clients: none. A write whose reply was lost may have
    been applied, so only this module decides what is sent again."""
    return Retry(NoBackoff(), 0)


class Transport:
    """The connection to the server holding queue ``name`` (whose keys are ``keys``)."""

    def __init__(self, url: str, name: str, keys: tuple[str, ...], version: str,
                 timeout: float) -> None:
        self.url = url
        self.name = name
        self.keys = keys
        self.version = version
        """The library version every FCALL sends first: the library refuses another."""
        self.timeout = timeout
        try:
            self.client: Any = redis_py.Redis.from_url(url, retry=_never_replay())
        except ValueError as e:
            raise EngineValueError(f"bad Redis URL {redact(url)}: {e}") from None
        self.cluster: Any = None
        """The RedisCluster the node was found through, or None on a standalone server."""

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
                 timeout: float | None = None) -> T:
        """``attempt()`` until it does not lose the connection, backing off, for ``timeout``
        seconds (default: the transport's); then ``EngineError``: "``failed`` Redis at URL".
        Wrong credentials are never retried."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        delay = FIRST_DELAY_S
        while True:
            try:
                return attempt()
            except redis_errors.AuthenticationError as e:  # a ConnectionError: caught first
                raise EngineError(f"{self.where} refused the credentials: {e}") from None
            except LOST as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"{failed} {self.where} (tried for {limit:g} s): {e}") \
                        from None
                time.sleep(min(delay, left))  # the last attempt is made at the deadline
                delay = min(delay * 2, MAX_DELAY_S)
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

    def fcall(self, fn: str, *args: Any, extra_keys: tuple[str, ...] = ()) -> Any:
        """One FCALL of the library with the queue's keys (then ``extra_keys``, each with the
        queue's hash tag); never replayed once sent (see the module's note)."""
        keys = (*self.keys, *extra_keys)
        for _ in range(MOVED_RETRIES + 1):
            # Sent and read on the connection checked out here, with redis-py's own
            # send_command / read_response (the parser maps error replies to ResponseError,
            # MOVED to MovedError): one pool round, where Redis.fcall would take a second one.
            pool, conn = self.retrying(self._checkout)
            try:
                conn.send_command("FCALL", fn, len(keys), *keys, self.version, *args)
                return conn.read_response()
            except LOST as e:
                conn.disconnect()
                raise OutcomeUnknown(f"lost {self.where} during {fn}: {e}; it may or may not "
                                     "have been applied") from None
            except redis_errors.ResponseError as e:
                if not self._moved(e):
                    raise self.error(e, fn) from None
            except BaseException:
                conn.disconnect()  # a reply half read (an interrupt): never reuse the socket
                raise
            finally:
                pool.release(conn)
        raise EngineError(f"{fn}: the queue's slot kept moving at {redact(self.url)}")

    def _checkout(self) -> tuple[Any, Any]:
        """(pool, a connected connection taken from it): the caller gives it back."""
        pool = self.live().connection_pool
        return pool, pool.get_connection()

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
        try:
            self.cluster = RedisCluster.from_url(self.url, retry=_never_replay())
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
