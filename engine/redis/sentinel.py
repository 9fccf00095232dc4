"""Redis Sentinel URLs: a queue on a standalone primary that Sentinel fails over to a replica.

``redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[?db=N&...]`` names the
Sentinels (any of them answers) and the master's service name; the credentials and the other
query parameters (``db``, ``socket_timeout``, ...) are the master's, as redis-py's ``redis://``
URL takes them, except ``sentinel_password`` (and ``sentinel_username``), which the Sentinels
get. The client is redis-py's ``Sentinel.master_for``: every new connection asks a Sentinel for
the current master's address, so after a failover the next connection reaches the promoted
replica. A connection to a master that was demoted meanwhile gets a READONLY reply, which
redis-py turns into a lost connection ("The previous master is now a slave").
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

SCHEME = "redis+sentinel"
DEMOTED = "The previous master is now a slave"
"""redis-py's message for a READONLY reply on a master connection: the command was refused,
not run, and the next connection asks the Sentinels again."""


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(SCHEME + "://")


def split_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any],
                                           dict[str, Any]]:
    """(the Sentinels' addresses, the master's service name, the master's connection options,
    the Sentinels' options); ``ValueError`` for a malformed URL."""
    rest = url[len(SCHEME) + 3:]
    authority, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    creds, at, hosts = authority.rpartition("@")
    master = urllib.parse.unquote(path.strip("/"))
    if not master or "/" in master:
        raise ValueError("name the master's service after the hosts: "
                         "redis+sentinel://host:port[,host:port]/MASTER")
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Sentinel must be host:port, got {item!r}")
        sentinels.append((host.strip("[]"), int(port)))
    params = urllib.parse.parse_qsl(query, keep_blank_values=True)
    own = {k: v for k, v in params if k in ("sentinel_password", "sentinel_username")}
    theirs = urllib.parse.urlencode([(k, v) for k, v in params if k not in own])
    # The master's options exactly as redis-py reads a redis:// URL (credentials, db, timeouts).
    options: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call]
        f"redis://{creds}{at}localhost/?{theirs}")
    options.pop("host", None)
    options.pop("port", None)
    sentinel_options = {k.removeprefix("sentinel_"): v for k, v in own.items()}
    return sentinels, master, options, sentinel_options


def sentinel_client(url: str, retry: Retry) -> Any:
    """A client of the master that the Sentinels of ``url`` name now, and after a failover."""
    sentinels, master, options, sentinel_options = split_sentinel_url(url)
    timeout = options.get("socket_timeout")
    # Typed Any: redis-py 8.1 dropped the annotations of Sentinel (an untyped call for mypy)
    make: Any = Sentinel
    sentinel = make(sentinels, sentinel_kwargs={"socket_timeout": timeout or 1.0,
                                                "retry": retry, **sentinel_options})
    return sentinel.master_for(master, retry=retry, **options)
