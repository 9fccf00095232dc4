"""The last error of each failing row, shared by every process of a pool.

The engine counts a row's failures (its back-off needs the count) but keeps no words: "7
failures" cannot tell a 404 from a typo in the render command. Workers record each failed
render here, keyed by engine row, and ``lanes failures NAME`` (an unrelated process) lists the
failing URLs with their count and last error (the next retry is the engine's: ``describe``'s
``due_ms`` of the row); a render that succeeds clears its row's entry.

Why SQLite, and how it is used
------------------------------

Reasons are text of any length, a row's entry is read-modify-written by whichever worker failed
it last, and any writer may be SIGKILLed at any instant. A fixed-layout shared file (like the
board) would need its own variable-length store and crash recovery; SQLite in WAL mode has both,
lets readers run beside one writer, and releases the lock of a killed writer (fcntl locks die
with their process; a half-written transaction in the WAL is never committed). So:

* The database is ``/dev/shm/<name>.failures`` (beside the pool's other files,
  ``shmfile.path_of``), with its ``-wal`` and ``-shm`` files beside it; :meth:`FailureLog.unlink`
  removes all three. :meth:`FailureLog.create` builds it under a temporary name and links it
  into place, so an attacher never sees it without its schema, and never replaces one.
* ``synchronous=NORMAL``: in WAL mode a commit then survives the death of the process (the only
  crash a pool must survive) but maybe not a power cut, and a file in /dev/shm does not survive
  a reboot anyway. The data is advisory: the schedule never depends on it, and the supervisor's
  checkpoints carry it across restarts (:meth:`FailureLog.export`, keyed by URL because rows are
  renumbered on resume, and :meth:`FailureLog.import_`).
* Every call is one short transaction; ``busy_timeout`` is ``BUSY_TIMEOUT_S``. A successful
  batch's :meth:`FailureLog.clear` reads first and takes the write lock only when one of its
  rows has an entry, so the common case (nothing failed) never queues behind a writer.
* One connection per process, opened on first use. A connection must never cross a fork: the
  child would share the parent's file locks and SQLite's per-process lock bookkeeping. Before
  ``os.fork`` (multiprocessing's fork too) every log closes its connection under its lock
  (``os.register_at_fork``), so parent and child reopen afresh; a fork that skips Python's
  hooks is caught by the pid kept beside the connection, and the inherited connection is
  abandoned unclosed (closing it would drop file locks the parent still holds).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import sqlite3
import threading
import urllib.parse
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import shmfile
from ..checks import is_int
from ..errors import (
    EngineClosed,
    EngineError,
    EngineValueError,
    LayoutMismatch,
    SegmentExists,
    SegmentMissing,
)
from ..keys import PARKED_MS
from ..report.lanes import lane_label
from ..report.words import format_due
from .board import Clock
from .render import KINDS, Failure

SUFFIX = "failures"
APPLICATION_ID = 0x524C_4631  # "RLF1": a database that is not ours is refused on attach
SCHEMA_VERSION = 2  # PRAGMA user_version; bump when a table changes
BUSY_TIMEOUT_S = 5.0

_SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
CREATE TABLE failures (
    row INTEGER PRIMARY KEY,   -- engine row id
    url TEXT NOT NULL,
    failures INTEGER NOT NULL, -- failed renders of this URL at this row since its last success
    first_ms INTEGER NOT NULL, -- the first of them (wall clock, ms)
    last_ms INTEGER NOT NULL,  -- the latest
    reason TEXT NOT NULL,      -- Failure.reason of the latest
    kind TEXT NOT NULL,
    permanent INTEGER NOT NULL,
    http_status INTEGER NULL
);
CREATE INDEX failures_by_last ON failures (last_ms);  -- newest first, without a sort
CREATE TABLE parking (
    row INTEGER PRIMARY KEY    -- to be parked by the worker that claims it next, unrendered
);
"""

_COLUMNS = "row, url, failures, first_ms, last_ms, reason, kind, permanent, http_status"

_RECORD = f"""
INSERT INTO failures ({_COLUMNS}) VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?)
ON CONFLICT (row) DO UPDATE SET
    failures = CASE WHEN url = excluded.url THEN failures + 1 ELSE 1 END,
    first_ms = CASE WHEN url = excluded.url THEN first_ms ELSE excluded.first_ms END,
    url = excluded.url, last_ms = excluded.last_ms, reason = excluded.reason,
    kind = excluded.kind, permanent = excluded.permanent, http_status = excluded.http_status
RETURNING failures
"""

_RESTORE = f"""
INSERT INTO failures ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (row) DO UPDATE SET
    url = excluded.url, failures = excluded.failures, first_ms = excluded.first_ms,
    last_ms = excluded.last_ms, reason = excluded.reason, kind = excluded.kind,
    permanent = excluded.permanent, http_status = excluded.http_status
"""

_IN_ROWS = "row IN (SELECT value FROM json_each(?))"  # any number of rows, one statement

EXPORT_FIELDS = ("url", "failures", "first_ms", "last_ms", "reason", "kind", "permanent",
                 "http_status")
"""The fields of each tuple :meth:`FailureLog.export` returns (plain JSON-able values)."""



@dataclass(frozen=True)
class FailureEntry:
    """One failing row: how often it failed since it last rendered, and the latest reason."""

    row: int
    url: str
    failures: int
    first_ms: int
    last_ms: int
    reason: str
    kind: str
    permanent: bool
    http_status: int | None


class FailureLog:
    """The failure database of pool ``name``; use :meth:`create` or :meth:`attach`.

    Usable from any thread (calls are serialised by a lock) and across forks (see the module
    docstring); :meth:`close` ends this process's use of it.
    """

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0  # the process that opened _conn
        self._opens = 0
        self._closed = False
        _LIVE.add(self)

    # -- the file -------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str) -> FailureLog:
        """A new, empty database for pool ``name``; ``SegmentExists`` if one is there."""
        path = _path(name)
        if os.path.exists(path):
            raise SegmentExists(f"{path} exists (another pool, or one that crashed: lanes"
                                " cleanup)")
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            # 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database
            # file's mode, so the URLs and errors in all three are the pool's user's alone
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")  # kept in the file: every opener uses it
                conn.executescript(_SCHEMA)
            finally:
                conn.close()  # the last connection: its -wal and -shm go
            # A -wal left by a database of this name that was removed alone would be replayed
            # into the new one: it belongs to no one now. (Two creators racing here could take
            # each other's; the pool creates its engine segment of the same name first, and
            # only one creator gets past that.)
            for suffix in (f"{SUFFIX}-wal", f"{SUFFIX}-shm"):
                shmfile.unlink(name, suffix)
            os.link(tmp, path)  # fails if someone published the name meanwhile: never replaced
        except FileExistsError:
            raise SegmentExists(f"{path} exists") from None
        except sqlite3.Error as e:
            raise EngineError(f"cannot create {path}: {e}") from None
        finally:
            for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        return cls(name, path)

    @classmethod
    def attach(cls, name: str) -> FailureLog:
        """The database of pool ``name``; ``SegmentMissing`` if absent, ``LayoutMismatch`` if
        the file is not one."""
        path = _path(name)
        if not os.path.exists(path):
            raise SegmentMissing(f"no {path}")
        log = cls(name, path)
        with log._lock:
            log._db()  # check it now, not at the first record
        return log

    @staticmethod
    def unlink(name: str) -> bool:
        """Remove the database of pool ``name`` and its -wal and -shm files; False if the
        database was not there."""
        _path(name)  # checks the name
        found = shmfile.unlink(name, SUFFIX)
        for suffix in (f"{SUFFIX}-wal", f"{SUFFIX}-shm"):
            shmfile.unlink(name, suffix)
        return found

    def close(self) -> None:
        """Close this process's connection; the log is unusable afterwards."""
        with self._lock:
            self._drop()
            self._closed = True

    def __enter__(self) -> FailureLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def record(self, row: int, url: str, failure: Failure, at_ms: int) -> int:
        """A render of ``url`` at ``row`` failed at ``at_ms``: count it, keep its reason.
        Returns how many renders of it failed since it last rendered (this one included).

        The count restarts at 1 when the row now holds another URL."""
        if not (is_int(row) and row >= 0 and is_int(at_ms) and isinstance(url, str)
                and isinstance(failure, Failure)):
            raise EngineValueError(f"record needs a row >= 0, a URL, a Failure and an int time,"
                                   f" got {row!r}, {url!r}, {failure!r}, {at_ms!r}")
        with self._sql("record a failure") as db:
            (count,) = db.execute(_RECORD, (row, url, at_ms, at_ms, failure.reason,
                                            failure.kind, int(failure.permanent),
                                            failure.http_status)).fetchone()
        return int(count)

    def clear(self, rows: Sequence[int]) -> None:
        """``rows`` rendered fine: their entries go. Cheap when none of them has one."""
        ids = _row_list(rows)
        if ids == "[]":
            return
        with self._sql("clear rows") as db:
            found = db.execute(f"SELECT row FROM failures WHERE {_IN_ROWS}", (ids,)).fetchall()
            if found:
                db.execute(f"DELETE FROM failures WHERE {_IN_ROWS}",
                           (json.dumps([r for (r,) in found]),))

    def import_(self, entries: Sequence[Sequence[Any]], row_of_url: Mapping[str, int]) -> int:
        """Restore :meth:`export`'s entries under the rows their URLs have now; entries of URLs
        not in ``row_of_url`` (no longer queued) are dropped. Returns how many were restored.

        One transaction: all or nothing. A malformed entry is an ``EngineValueError``."""
        params = []
        for entry in entries:
            e = _checked_entry(entry)
            row = row_of_url.get(e[0])
            if row is not None:
                params.append((operator.index(row), *e))
        with self._sql("import failures") as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(_RESTORE, params)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return len(params)

    def request_park(self, rows: Sequence[int]) -> None:
        """Ask the pool to park ``rows``: parking takes a lease, so the worker that next claims
        one of them parks it instead of rendering it (it asks :meth:`parking` per batch)."""
        ids = _row_list(rows)
        with self._sql("request a park") as db:
            db.execute("INSERT OR IGNORE INTO parking SELECT value FROM json_each(?)", (ids,))

    def cancel_park(self, rows: Sequence[int]) -> None:
        """Forget the park requests of ``rows`` (a retry was asked for, or the park is done)."""
        ids = _row_list(rows)
        if ids == "[]":
            return
        with self._sql("cancel a park") as db:
            db.execute(f"DELETE FROM parking WHERE {_IN_ROWS}", (ids,))

    def parking(self, rows: Sequence[int] | None = None) -> set[int]:
        """Of ``rows`` (of every row if None), those with a park request."""
        sql, params = "SELECT row FROM parking", []
        if rows is not None:
            sql += f" WHERE {_IN_ROWS}"
            params.append(_row_list(rows))
        with self._sql("read park requests") as db:
            return {r for (r,) in db.execute(sql, params).fetchall()}

    # -- reading --------------------------------------------------------------------------------

    def entries(self, rows: Sequence[int] | None = None,
                limit: int | None = None) -> list[FailureEntry]:
        """The entries (of ``rows`` only, if given), newest ``last_ms`` first, at most
        ``limit``."""
        if limit is not None and not (is_int(limit) and limit >= 0):
            raise EngineValueError(f"limit must be an int >= 0, got {limit!r}")
        sql = f"SELECT {_COLUMNS} FROM failures"
        params: list[Any] = []
        if rows is not None:
            sql += f" WHERE {_IN_ROWS}"
            params.append(_row_list(rows))
        sql += " ORDER BY last_ms DESC, row"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._sql("read failures") as db:
            got = db.execute(sql, params).fetchall()
        return [FailureEntry(r, u, n, f, last, why, kind, bool(p), h)
                for r, u, n, f, last, why, kind, p, h in got]

    def export(self) -> list[tuple[Any, ...]]:
        """Every entry as a tuple of ``EXPORT_FIELDS`` (by URL, not row: rows are renumbered on
        resume), in row order, for a checkpoint."""
        with self._sql("export failures") as db:
            got = db.execute(f"SELECT {', '.join(EXPORT_FIELDS)} FROM failures ORDER BY row"
                             ).fetchall()
        return [(u, n, f, last, why, kind, bool(p), h) for u, n, f, last, why, kind, p, h in got]

    def statistics(self) -> dict[str, Any]:
        """What the log holds and the state of this process's connection."""
        with self._sql("count failures") as db:
            n, permanent = db.execute("SELECT count(*), total(permanent) FROM failures"
                                      ).fetchone()
            return {"path": self.path, "entries": int(n), "permanent": int(permanent),
                    "connection_pid": self._pid, "opens": self._opens}

    # -- the connection -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _sql(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db()
            except sqlite3.Error as e:
                if "not a database" in str(e):
                    raise LayoutMismatch(f"{self.path} is not a failure log: {e}") from None
                raise EngineError(f"{self.path}: cannot {what}: {e}") from None

    def _db(self) -> sqlite3.Connection:
        """This process's connection, opened on first use (the lock is held)."""
        if self._closed:
            raise EngineClosed(f"failure log {self.name!r} is closed")
        if self._conn is None or self._pid != os.getpid():
            self._drop()
            self._conn = _connect(self.path)
            self._pid, self._opens = os.getpid(), self._opens + 1
        return self._conn

    def _drop(self) -> None:
        """Forget the connection (the lock is held); close it only if this process opened it."""
        if self._conn is None:
            return
        if self._pid == os.getpid():
            self._conn.close()
        else:
            _ABANDONED.append(self._conn)  # never finalised here: see the module docstring
        self._conn, self._pid = None, 0


DESCRIBE_AT_MOST = 256
"""``failure_rows`` asks the engine about each row up to this many rows (a round trip each on
Redis); past it, it reads every row's schedule in one export instead."""


def failure_rows(eng: Any, entries: Sequence[FailureEntry], now_ms: int,
                 lane: int | None = None, limit: int | None = None,
                 clock: Clock | None = None) -> list[dict[str, Any]]:
    """``entries`` with what the engine says of their rows now (lane, next try; ``kind``:
    ``parked``, ``permanent`` or ``transient``), in lane ``lane`` only if given, at most
    ``limit``: the rows of ``lanes failures --json`` and of the dashboard (``lane``: the
    engine's name, ``lane_label``: the name people read).

    Two clocks meet here: a failure is logged at the wall clock (``now_ms``), a row is due on
    the pool's (``clock``, the board's; the demo's runs hundreds of times faster). The next try
    is said on the pool's clock, and named so when that is not the wall's."""
    pool_now = now_ms if clock is None else clock.now_ms()
    on_pool_time = clock is not None and clock.scale != 1.0
    where = _lanes_and_dues(eng, [e.row for e in entries], pool_now)
    policy = eng.policy
    rows: list[dict[str, Any]] = []
    for e in entries:
        if limit is not None and len(rows) >= limit:
            break
        row_lane, due = where.get(e.row, (None, None))
        if lane is not None and row_lane != lane:
            continue
        retry = ("removed" if due is None else "parked (rush or re-add)"
                 if due == PARKED_MS else format_due(due, pool_now)
                 + (" (pool time)" if on_pool_time else ""))
        rows.append({"row": e.row, "url": e.url, "failures": e.failures,
                     "lane": None if row_lane is None else eng.lane_name(row_lane),
                     "lane_label": None if row_lane is None else lane_label(policy, row_lane),
                     "last_error": e.reason, "permanent": e.permanent,
                     "kind": "parked" if due == PARKED_MS else "permanent" if e.permanent
                     else "transient",
                     "first_failed_ms": e.first_ms, "last_failed_ms": e.last_ms,
                     "next_retry_ms": due, "next_retry": retry})
    return rows


def _lanes_and_dues(eng: Any, rows: list[int], now_ms: int) -> dict[int, tuple[int, int]]:
    """{row: (lane, due_ms)} of those of ``rows`` still queued."""
    if len(rows) <= DESCRIBE_AT_MOST:
        out = {}
        for r in rows:
            info = eng.describe(r, now_ms=now_ms)
            if info["due_ms"] is not None:
                out[r] = (info["lane"], info["due_ms"])
        return out
    import numpy as np

    from ..checkpoint import snapshot

    queued, cols = snapshot(eng)  # row ids ascending
    wanted = np.asarray(rows, np.int64)
    at = np.minimum(np.searchsorted(queued, wanted), max(0, len(queued) - 1))
    found = (queued[at] == wanted) if len(queued) else np.zeros(len(wanted), bool)
    return {int(r): (int(cols["lane"][i]), int(cols["due_ms"][i]))
            for r, i, ok in zip(wanted.tolist(), at.tolist(), found.tolist(), strict=True) if ok}


def _path(name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name:
        raise EngineValueError(f"bad pool name {name!r}")
    return shmfile.path_of(name, SUFFIX)


def _connect(path: str) -> sqlite3.Connection:
    # mode=rw: never create a database that was removed meanwhile.
    uri = f"file:{urllib.parse.quote(path)}?mode=rw"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)  # our lock serialises the threads
    except sqlite3.OperationalError as e:
        raise SegmentMissing(f"cannot open {path}: {e}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA synchronous = NORMAL")  # not kept in the file: set per connection
        app, version = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                        for p in ("application_id", "user_version"))
        if (app, version) != (APPLICATION_ID, SCHEMA_VERSION):
            raise LayoutMismatch(f"{path} is not a version-{SCHEMA_VERSION} failure log"
                                 f" (application_id {app:#x}, user_version {version})")
    except sqlite3.DatabaseError as e:
        conn.close()
        raise LayoutMismatch(f"{path} is not a failure log: {e}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _row_list(rows: Sequence[int]) -> str:
    """``rows`` as a JSON array for ``json_each`` (ints only: numpy ints are converted)."""
    try:
        ids = [operator.index(r) for r in rows]
    except TypeError:
        raise EngineValueError("rows must be integers") from None
    return json.dumps(ids)


def _checked_entry(entry: Sequence[Any]) -> tuple[Any, ...]:
    try:
        url, n, first, last, reason, kind, permanent, http = entry
    except (TypeError, ValueError):
        raise EngineValueError(f"damaged failure entry {entry!r}: want {EXPORT_FIELDS}") from None
    if not (isinstance(url, str) and all(is_int(v) for v in (n, first, last)) and n >= 1
            and isinstance(reason, str) and kind in KINDS and isinstance(permanent, (bool, int))
            and (http is None or is_int(http))):
        raise EngineValueError(f"damaged failure entry {entry!r}: want {EXPORT_FIELDS}")
    return (url, n, first, last, reason, kind, int(permanent), http)


# -- fork: no connection crosses it -------------------------------------------------------------

_LIVE: weakref.WeakSet[FailureLog] = weakref.WeakSet()
_HELD: list[FailureLog] = []  # locked from before a fork until after it, in both processes
_ABANDONED: list[sqlite3.Connection] = []  # inherited without Python's fork hooks; never closed


def _before_fork() -> None:
    for log in list(_LIVE):
        log._lock.acquire()  # no other thread is inside a call, or reopens, until the fork is done
        _HELD.append(log)
        log._drop()


def _after_fork() -> None:
    while _HELD:
        _HELD.pop()._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                    after_in_child=_after_fork)
