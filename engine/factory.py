"""The one place that names a backend: a queue opened by name, on this machine's shared memory
or, given a URL, on Redis (``engine.open``). Everything above the backends (the pool, the
commands, ``lanes serve``) opens its engine here and then speaks only the contract
(``engine.api``): rows, claims, ``verify_walk``/``repair``, ``row_urls`` and their ``add``.

Each backend is imported when it is asked for: the shared-memory one needs the C core built,
the Redis one needs redis-py (an extra), and a program using one must not need the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import EngineValueError, SegmentMissing

if TYPE_CHECKING:
    from .api import QueueEngine, RowUrls
    from .checkpoint import Checkpoint
    from .policy import LanePolicy


def open(name: str, url: str | None = None, *, create: bool = False,  # noqa: A001
         capacity: int | None = None, policy: LanePolicy | None = None,
         shards: int | None = None, **options: Any) -> QueueEngine:
    """Queue ``name``: the shared-memory segment of that name, or with ``url`` the queue at that
    Redis server (``Engine.connect``). ``create``: make it (on shared memory a new segment of
    ``capacity`` rows, refused when the name is taken; on Redis only when missing).
    ``shards``: a Redis queue over that many shards."""
    if url is None:
        from .shm import Engine

        if shards is not None or options:
            raise EngineValueError(f"{'shards' if shards is not None else sorted(options)}: for"
                                   " a queue on Redis (give its URL)")
        if not create:
            return Engine.attach(name)
        if capacity is None:
            raise EngineValueError("a new shared-memory engine needs its capacity")
        return Engine.create(name, capacity, policy)
    from .redis.shards import connect

    if capacity is not None:
        options["capacity"] = capacity
    return connect(url, name, policy, create, shards=shards, **options)


def restore(ck: Checkpoint, name: str, url: str | None = None, *, capacity: int | None = None,
            policy: LanePolicy | None = None, shards: int | None = None,
            ) -> tuple[QueueEngine, RowUrls | None]:
    """A new queue ``name`` holding checkpoint ``ck``'s rows (renumbered from 0 in saved order),
    and on Redis its URLs beside them; on shared memory the URLs are the caller's to publish
    (``publish_urls``), with the pool's other files."""
    if url is None:
        from .shm import Engine

        if shards is not None:
            raise EngineValueError("shards are for a queue on Redis (give its URL)")
        return Engine.from_checkpoint(ck, name, capacity=capacity, policy=policy), None
    from .redis.restore import restore as restore_redis

    return restore_redis(ck, url, name, policy, capacity, shards)


def publish_urls(eng: QueueEngine, urls: list[str]) -> RowUrls:
    """The URL table of a shared-memory engine whose rows ``0..len(urls)-1`` were just added,
    published beside its segment (a Redis queue adds its URLs with its rows: ``RowUrls.add``)."""
    from .shm import Engine
    from .shm.urls import UrlTable

    if not isinstance(eng, Engine):
        raise EngineValueError(f"URLs are published beside a shared-memory engine, not"
                               f" {type(eng).__name__}: add them with row_urls().add")
    return UrlTable.create(eng.name, urls, eng)


def unlink(name: str, missing_ok: bool = True) -> bool:
    """Remove shared-memory engine ``name``'s segment; False if there was none (with
    ``missing_ok``; else ``SegmentMissing``)."""
    from .shm.segment import Segment

    try:
        Segment.unlink(name)
    except SegmentMissing:
        if not missing_ok:
            raise
        return False
    return True


def unlink_urls(name: str) -> bool:
    """Remove the URL table beside shared-memory engine ``name``; False if there was none."""
    from .shm.urls import UrlTable

    return UrlTable.unlink(name)


def unlink_routes(name: str) -> bool:
    """Remove the routes kept beside shared-memory engine ``name``; False if there were none."""
    from .shm.urls import UrlTable

    return UrlTable.unlink_routes(name)


def with_wait(url: str, replicas: int) -> str:
    """Redis URL ``url`` asking every write to wait for ``replicas`` replicas (``--wait-replicas``):
    the URL carries it to every process that connects with it."""
    from .redis.transport import with_wait as redis_with_wait

    return redis_with_wait(url, replicas)
