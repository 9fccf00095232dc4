"""A Redis queue made from a pool's checkpoint, rows and URLs together (``lanes pool --resume
--redis``), whichever backend wrote it: a queue moves from one host's shared memory to Redis,
and back with ``lanes pool --resume`` on shared memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..checkpoint import Checkpoint
from ..checks import check_int
from ..errors import EngineError, EngineValueError, SegmentExists, SegmentMissing
from ..policy import LanePolicy
from .catalog import MAX_SHARDS
from .codec import MAX_ROWS
from .engine import RedisEngine
from .shard_urls import ShardedUrls
from .shards import ShardedEngine
from .transport import redact
from .urls import RedisUrls


def restore(ck: Checkpoint, url: str, name: str, policy: LanePolicy | None = None,
            capacity: int | None = None, shards: int | None = None,
            ) -> tuple[RedisEngine | ShardedEngine, RedisUrls | ShardedUrls]:
    """:func:`restore_one` into a new queue over ``shards`` shards (None or 1: one queue)."""
    if shards is None or check_int(shards, "shards", 1, MAX_SHARDS) == 1:
        return restore_one(ck, url, name, policy, capacity)
    return restore_one(ck, url, name, policy, capacity,
                       connect=functools.partial(ShardedEngine.connect, shards=shards))


def restore_one(ck: Checkpoint, url: str, name: str, policy: LanePolicy | None = None,
                capacity: int | None = None, *,
                connect: Callable[..., Any] = RedisEngine.connect) -> tuple[Any, Any]:
    """A new queue ``name`` at ``url`` holding a pool checkpoint's rows and their URLs, row ids
    renumbered from 0 in saved order (as ``Engine.from_checkpoint`` does on shared memory); the
    saved policy unless given, no bound on rows unless ``capacity``.

    Refused with ``SegmentExists`` when the queue, or URL keys of an earlier one, exist: a Redis
    queue outlives its pools, so the way on is to join it, or to resume into another name. Rows
    and URLs go in together (``RedisUrls.add``: a row is never claimable without its URL);
    if the restore fails the new queue is deleted again. ``connect`` opens the queue
    (``restore`` passes that of a queue over shards)."""
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
    table = eng.row_urls()
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
