"""A corpus that grows: URLs added to a running pool (``lanes add``) or to a resumed one.

New URLs become new rows: their URLs are published first (a further URL file, see ``urls``),
then the rows are added to the engine, so a worker never claims a row whose URL it cannot
find. Known URLs are left alone, except a row parked after ``--max-failures``: adding its URL
again is how an operator says "try it again", so it is made due now (``prioritize(.., "wait")``).
Two adders are serialised by a lock on the pool's board file (a corpus refresh in the
supervisor is one more adder), so the new rows' ids follow the table's last row.

The pool's routes (``--routes``) are kept beside its files (``<name>.routes``), so rows added
later get the intervals the pool started with.

On Redis (pools on several hosts) the URLs and the routes live with the queue, and one FCALL
adds the new URLs and their rows together (``RedisUrls.add``): no lock, no file, the same
rules (known URLs left alone, parked ones made due), from any host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import checkpoint, shmfile
from ..errors import CapacityError, EngineError, SegmentMissing
from ..keys import PARKED_MS
from ..shm.engine import Engine
from ..shm.urls import UrlTable
from .board import Board
from .ingest import Corpus
from .routes import Routes

if TYPE_CHECKING:
    from ..redis.shard_urls import ShardedUrls
    from ..redis.urls import RedisUrls

ROUTES_SUFFIX = "routes"


@dataclass(frozen=True)
class Added:
    """What adding a corpus did."""

    added: int
    known: int
    unparked: int
    first_row: int | None


def store_routes(name: str, routes: Routes | None) -> None:
    """Keep a pool's routes beside its files (nothing when it has none)."""
    if routes is not None:
        shmfile.create(name, ROUTES_SUFFIX, routes.to_json().encode())


def stored_routes(name: str, urls: RedisUrls | ShardedUrls | None = None) -> Routes | None:
    """The routes pool ``name`` was started with, or None; on Redis (``urls`` given), those
    stored with the queue."""
    if urls is not None:
        text = urls.routes()
        return None if text is None else Routes.from_json(text)
    try:
        buf = shmfile.attach(name, ROUTES_SUFFIX, min_size=2)
    except SegmentMissing:
        return None
    try:
        return Routes.from_json(bytes(buf).decode())
    finally:
        buf.close()


def unlink_routes(name: str) -> bool:
    return shmfile.unlink(name, ROUTES_SUFFIX)


@contextlib.contextmanager
def _adding(name: str) -> Iterator[None]:
    """One adder at a time per pool (a lock on the board file, dropped if the adder dies)."""
    try:
        fd = os.open(Board.path(name), os.O_RDONLY)
    except FileNotFoundError:
        raise SegmentMissing(f"no pool runs over {name!r} (no {Board.path(name)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_corpus(eng: Any, urls: Any, corpus: Corpus) -> Added:
    """Add ``corpus``'s new URLs to the pool over ``eng`` (whose URL table is ``urls``: a
    ``UrlTable``, or on Redis the queue's ``RedisUrls``)."""
    if not isinstance(eng, Engine):
        return add_to_redis(urls, corpus.urls, corpus.due_ms, corpus.interval_s,
                            corpus.provenance)
    with _adding(eng.name):
        urls.refresh()
        rows_used = eng._rows_used()  # row ids, those a repair took back included
        table = urls.urls()
        if len(table) > rows_used and UrlTable.remove_part(eng.name, rows_used):
            # An adder killed after publishing its URLs and before reserving their rows (its
            # lock is ours now): its URL file goes, as a failed add's does.
            table = table[:rows_used]
        if rows_used != len(table):
            raise EngineError(f"engine {eng.name!r} has {rows_used} rows but {len(table)} URLs:"
                              " rows were added outside the pool; refusing to add more")
        # A URL whose row a repair took back (its adder was killed between reserving the rows
        # and writing them) is added again, as a new row.
        void = eng._taken_back(np.arange(rows_used, dtype=np.int64))
        known = {u: r for r, u in enumerate(table) if not void[r]}
        new = [i for i, u in enumerate(corpus.urls) if u not in known]
        again = [known[u] for u in corpus.urls if u in known]
        unparked = _unpark(eng, again)
        if not new:
            return Added(0, len(again), unparked, None)
        free = int(eng.stats()["capacity"]) - rows_used
        if len(new) > free:
            raise CapacityError(f"{len(new)} new URLs, room for {free} (capacity"
                                f" {rows_used + free}): stop the pool and --resume it with a"
                                " larger --capacity")
        pick = np.asarray(new, np.int64)
        UrlTable.append(eng.name, rows_used, [corpus.urls[i] for i in new])
        try:
            rows = eng.add_many(corpus.due_ms[pick], corpus.interval_s[pick],
                                corpus.provenance[pick])
        except BaseException:
            UrlTable.remove_part(eng.name, rows_used)
            raise
        if not np.array_equal(rows, np.arange(rows_used, rows_used + len(new))):
            raise EngineError(f"engine {eng.name!r} gave rows {rows[:3].tolist()}... for the"
                              f" URLs of rows {rows_used}..: rows were added outside the pool")
        return Added(len(new), len(again), unparked, rows_used)


def add_to_redis(urls: RedisUrls | ShardedUrls, new_urls: list[str], due_ms: Any, interval_s: Any,
                 provenance: Any, failures: Any = None) -> Added:
    """Add the URLs not known yet to a Redis queue, with their rows (``RedisUrls.add``).
    ``first_row`` is set when the new rows are consecutive (another host adding meanwhile may
    interleave its own)."""
    got = urls.add(new_urls, due_ms, interval_s, provenance, failures)
    new = np.sort(got.rows[got.new])
    dense = len(new) > 0 and int(new[-1] - new[0]) == len(new) - 1
    return Added(got.added, got.known, got.unparked, int(new[0]) if dense else None)


def _unpark(eng: Engine, rows: list[int]) -> int:
    """Make the parked ones among ``rows`` due now; returns how many."""
    if not rows:
        return 0
    queued, cols = checkpoint.snapshot(eng)
    parked = set(queued[cols["due_ms"] == PARKED_MS].tolist())
    n = 0
    for row in rows:
        if row in parked:
            eng.prioritize(row, "wait")
            n += 1
    return n
