"""The snapshot store: the latest rendered HTML of every URL, gzipped, with its metadata.

Why it exists: the pool keeps snapshots fresh and ``lanes serve`` hands them to bots, in other
processes, at other times; the store is what they share. It knows URLs, not engine rows, so it
outlives a pool (and a checkpoint's renumbering) and serves a pool of either backend.

Layout of a store directory (every directory 0700, every file 0600)::

    store.sqlite (+ -wal, -shm)        metadata, one row per URL; the hit log
    snapshots/ab/cd/<sha256(url)>.<h>.gz   the snapshot, gzipped; <h>: its HTML's sha256, 16 hex

How a snapshot is written so that a SIGKILL at any instant leaves no torn one
------------------------------------------------------------------------------

A snapshot's file name carries its content hash, so a file under its final name is always whole
and always the HTML its name says. :meth:`SnapshotStore.put`:

1. writes the gzip to a temporary file beside its final name (``O_EXCL``, 0600), fsyncs it,
   renames it to the final name and fsyncs the directory: a kill before the rename leaves a
   temporary file (swept later), never a final name with part of a snapshot;
2. in one SQLite transaction (``BEGIN IMMEDIATE``, ``synchronous=FULL``: a commit is on disk
   before the file it replaces is removed) points the URL's row at the new hash, after checking
   the file is still there under the write lock;
3. in a second transaction removes the file of the hash it replaced, if the row does not point
   at it again. A kill between 2 and 3 leaves an orphan, never a row without its file.

Removing a file only under the write lock, and only if no row points at it, is what makes two
writers of one URL safe (renders are at least once): a writer that checked its file exists and
committed cannot have it removed by another writer's step 3. A render whose HTML has the stored
hash rewrites nothing: its row's rendered-at and counters move, and it is counted "unchanged".
Gzip is written with a zero mtime, so the same HTML always makes the same bytes.

The hit log (``hits``) is what ``lanes serve`` appends, in batches, with each hit's age ÷
interval; it keeps the last ``api.HIT_WINDOW_MS`` of them, ``HIT_CAP`` at most. Every SQLite
connection belongs to the process that opened it: a store is opened in each process after a
fork (using one across a fork raises :class:`StoreError`; the inherited connection is
abandoned, never closed, so the parent's locks stay).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import secrets
import shutil
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np
import psutil

from ..checks import wall_ms
from ..corpus.variant_rows import all_keys
from ..errors import EngineClosed, EngineTypeError, StoreError
from . import api
from .api import Outcome, Snapshot, StoreSpec
from .checks import checked_meta, html_bytes

APPLICATION_ID: Final = 0x524C_5331  # "RLS1": a database that is not a store is refused
SCHEMA_VERSION: Final = 2  # PRAGMA user_version; bump when a table changes (and migrate)
DATABASE: Final = "store.sqlite"
FILES: Final = "snapshots"
BUSY_TIMEOUT_S: Final = 10.0

_OURS: Final = frozenset({DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", FILES})
_TMP: Final = ".tmp-"

_SCHEMA_2: Final = """
CREATE TABLE IF NOT EXISTS bot_hits (  -- requests per crawler family since the store was made
    bot INTEGER PRIMARY KEY,
    requests INTEGER NOT NULL,      -- on the snapshot routes, whatever the answer
    origin INTEGER NOT NULL         -- of which the origin's answer was relayed
);
"""
_MIGRATE_1_2: Final = "ALTER TABLE hits ADD COLUMN bot INTEGER NOT NULL DEFAULT -1;" + _SCHEMA_2
"""A version-1 store (no crawler families) becomes version 2 when it is first opened."""

_SCHEMA: Final = f"""
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
CREATE TABLE snapshots (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE,
    status INTEGER NOT NULL,        -- the rendered HTTP status
    location TEXT NULL,             -- a 3xx's Location
    rendered_at_ms INTEGER NOT NULL,-- wall clock, ms since the epoch
    interval_s INTEGER NOT NULL,    -- the URL's refresh interval when rendered
    lane INTEGER NOT NULL,          -- the engine lane it was rendered from
    bytes INTEGER NOT NULL,         -- HTML bytes
    gz_bytes INTEGER NOT NULL,      -- bytes on disk
    hash TEXT NOT NULL,             -- sha256 of the HTML, hex
    render_ms REAL NOT NULL,        -- wall time of the render
    renders INTEGER NOT NULL,       -- puts of this URL
    unchanged INTEGER NOT NULL      -- of which the HTML was the stored one
);
CREATE TABLE hits (
    at_ms INTEGER NOT NULL,
    snapshot INTEGER NOT NULL,      -- snapshots.id
    lane INTEGER NOT NULL,
    age_over_interval REAL NOT NULL,
    served INTEGER NOT NULL,        -- 0: refused as staler than --max-stale
    bot INTEGER NOT NULL DEFAULT -1 -- the crawler family (engine.serve.crawlers), -1: unknown
);
CREATE INDEX hits_by_time ON hits (at_ms);
""" + _SCHEMA_2


_COLUMNS: Final = ("id, url, status, location, rendered_at_ms, interval_s, lane, bytes,"
                   " gz_bytes, hash, render_ms, renders, unchanged")

_UPSERT: Final = """
INSERT INTO snapshots (url, status, location, rendered_at_ms, interval_s, lane, bytes, gz_bytes,
                       hash, render_ms, renders, unchanged)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)
ON CONFLICT (url) DO UPDATE SET
    status = excluded.status, location = excluded.location,
    rendered_at_ms = excluded.rendered_at_ms, interval_s = excluded.interval_s,
    lane = excluded.lane, bytes = excluded.bytes, gz_bytes = excluded.gz_bytes,
    hash = excluded.hash, render_ms = excluded.render_ms, renders = renders + 1,
    unchanged = unchanged + excluded.unchanged
"""

def _snapshot(row: Sequence[Any], path: str, gz: bytes) -> Snapshot:
    (id_, url, status, location, at_ms, interval_s, lane, size, gz_size, digest, render_ms,
     renders, unchanged) = row
    return Snapshot(id_, url, status, location, at_ms, interval_s, lane, size, gz_size, digest,
                    render_ms, renders, unchanged, path, gz)


class SnapshotStore:
    """A snapshot store directory, opened in this process (see the module docstring); the
    default :class:`~engine.store.api.Store`."""

    remote = False  # a read is a SQLite query and a file: the event loop may wait on it

    def __init__(self, directory: str, conn: sqlite3.Connection) -> None:
        self.directory = directory
        self.spec = StoreSpec(directory)
        self.files = os.path.join(directory, FILES)
        self._conn: sqlite3.Connection | None = conn
        self._pid = os.getpid()
        self._lock = threading.Lock()  # one connection, several threads (the server's)
        self.written = 0
        self.unchanged = 0
        self.created = False  # whether the open that made this object made the store

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, create: bool = True) -> SnapshotStore:
        """The store in ``directory``, made there (and the directory with it) when ``create``.

        :class:`StoreError` if the directory cannot be written, holds something that is not a
        store, or (``create=False``) holds no store; a directory made by a call that fails is
        removed again.
        """
        path = os.path.abspath(os.fspath(directory))
        made = _make_directories(path) if create else None
        created = False
        try:
            if not os.path.isdir(path):
                raise StoreError(f"no snapshot store at {path}"
                                 + (": it is not a directory" if os.path.exists(path) else ""))
            database = os.path.join(path, DATABASE)
            if not os.path.exists(database):
                foreign = sorted(set(os.listdir(path)) - _OURS)
                if foreign:
                    raise StoreError(f"{path} is not a snapshot store: it holds "
                                     + ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5
                                                                 else ""))
                if not create:
                    raise StoreError(f"no snapshot store at {path}")
                _create_database(database)
                created = True
                os.chmod(path, 0o700)  # a directory that existed keeps no looser mode
            _mkdir(os.path.join(path, FILES))
            _probe(os.path.join(path, FILES))
            store = cls(path, _connect(database))
            store.created = created
            return store
        except OSError as e:
            _remove(made)
            raise StoreError(f"cannot open the snapshot store {path}: {e.strerror or e}"
                             ) from None
        except BaseException:
            _remove(made)
            raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            elif self._conn is not None:
                _ABANDONED.append(self._conn)  # another process's locks: never finalised here
            self._conn = None

    @property
    def address(self) -> str:
        return self.directory

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------------------

    def put(self, url: str, html: bytes | str, *, status: int, location: str | None,
            interval_s: int, lane: int, render_ms: float,
            rendered_at_ms: int | None = None) -> Outcome:
        """Store ``html`` as ``url``'s snapshot: ``"written"``, or ``"unchanged"`` when it is
        the HTML already stored (then only the metadata moves)."""
        data = html_bytes(html)
        values = checked_meta(url, status, location, interval_s, lane, render_ms,
                               wall_ms() if rendered_at_ms is None else rendered_at_ms)
        digest = hashlib.sha256(data).hexdigest()
        final = self.path_of(url, digest)
        gz: bytes | None = None
        for _attempt in range(5):
            wrote = False
            if not os.path.exists(final):
                if gz is None:
                    gz = gzip.compress(data, compresslevel=6, mtime=0)
                self._write_file(final, gz)
                wrote = True
            replaced = self._commit(url, digest, final, values, len(data), wrote)
            if replaced is None:
                continue  # the file went with a concurrent writer's cleanup: write it again
            outcome: Outcome = "written" if wrote or replaced != digest else "unchanged"
            if replaced and replaced != digest:
                self._remove_unless_current([(url, replaced)])
            if outcome == "written":
                self.written += 1
            else:
                self.unchanged += 1
            return outcome
        raise StoreError(f"{self.directory}: could not write the snapshot of {url!r}: its file"
                         " kept being removed by concurrent writers")

    def _commit(self, url: str, digest: str, final: str, values: tuple[Any, ...], size: int,
                wrote: bool) -> str | None:
        """Point ``url``'s row at ``digest``; the hash it held ("" for a new URL), or None when
        ``final`` vanished before the write lock was taken."""
        status, location, at_ms, interval_s, lane, render_ms = values
        with self._transaction("store a snapshot") as db:
            row = db.execute("SELECT hash FROM snapshots WHERE url = ?", (url,)).fetchone()
            if not os.path.exists(final):
                return None
            old = "" if row is None else str(row[0])
            same = int(old == digest and not wrote)
            db.execute(_UPSERT, (url, status, location, at_ms, interval_s, lane, size,
                                 os.stat(final).st_size, digest, render_ms, same))
        return old

    def clear(self, urls: Sequence[str]) -> int:
        """Drop the snapshots of ``urls`` (those it has; the rest are ignored), every variant's
        of each (``variant_rows.keys_of``): how many went.

        Crash-safe as :meth:`put` is: the rows go in one transaction, then each file under the
        write lock unless a concurrent render put the URL back on it; a kill in between leaves
        orphan files (swept), never a row without its file."""
        if isinstance(urls, str) or not all(isinstance(u, str) for u in urls):
            raise EngineTypeError("clear takes a sequence of URL strings")
        urls = all_keys(urls)
        gone: list[tuple[str, str]] = []
        for start in range(0, len(urls), 10_000):  # a transaction of bounded size
            batch = list(urls[start:start + 10_000])
            with self._transaction("clear snapshots") as db:
                for url in batch:
                    row = db.execute("DELETE FROM snapshots WHERE url = ? RETURNING hash",
                                     (url,)).fetchone()
                    if row is not None:
                        gone.append((url, str(row[0])))
        for start in range(0, len(gone), 10_000):
            self._remove_unless_current(gone[start:start + 10_000])
        return len(gone)

    def _remove_unless_current(self, files: Sequence[tuple[str, str]]) -> None:
        """Remove the files of these (url, replaced HTML's hash), under the write lock, each
        unless its URL points at it again (module docstring)."""
        with self._transaction("remove a replaced snapshot") as db:
            for url, digest in files:
                row = db.execute("SELECT hash FROM snapshots WHERE url = ?", (url,)).fetchone()
                if row is None or row[0] != digest:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path_of(url, digest))

    def _write_file(self, final: str, gz: bytes) -> None:
        """``gz`` under ``final``, whole or not at all: temp file, fsync, rename, fsync dir."""
        where = os.path.dirname(final)
        _mkdir(os.path.dirname(where))
        _mkdir(where)
        tmp = os.path.join(where, f"{_TMP}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(gz)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            _fsync_directory(where)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"cannot write a snapshot in {where}: {e.strerror or e}") from None

    # -- reading ------------------------------------------------------------------------------

    def get(self, url: str, known: Snapshot | None = None) -> Snapshot | None:
        """``url``'s latest snapshot, or None if it was never rendered. When ``known`` (an
        earlier answer for ``url``) holds the same HTML, its body is reused, not read again."""
        if not isinstance(url, str):
            raise EngineTypeError(f"a URL is a str, got {type(url).__name__}")
        for _attempt in range(5):
            with self._sql("read a snapshot") as db:
                row = db.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE url = ?",
                                 (url,)).fetchone()
            if row is None:
                return None
            path = self.path_of(url, row[9])
            if known is not None and known.url == url and known.hash == row[9]:
                return _snapshot(row, path, known.gz)
            try:
                with open(path, "rb") as f:
                    gz = f.read()
            except FileNotFoundError:
                continue  # replaced between the row and the file: read the row again
            return _snapshot(row, path, gz)
        raise StoreError(f"{self.directory}: the snapshot file of {url!r} is missing")

    def path_of(self, url: str, digest: str) -> str:
        """The file of ``url``'s snapshot whose HTML hashes to ``digest``."""
        h = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()
        return os.path.join(self.files, h[:2], h[2:4], f"{h}.{digest[:16]}.gz")

    def ages(self) -> list[tuple[str, int, int, int]]:
        """Every snapshot's ``(url, lane, rendered_at_ms, interval_s)``."""
        with self._sql("list snapshots") as db:
            return db.execute("SELECT url, lane, rendered_at_ms, interval_s FROM snapshots"
                              ).fetchall()

    def ratios(self, now_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every snapshot's ``(id, lane, age ÷ interval at now_ms)``, as three arrays (the ratio
        computed by SQLite; about a second per million snapshots)."""
        with self._sql("list snapshot ages") as db:
            rows = db.execute("SELECT id, lane, max(0, ? - rendered_at_ms) / 1000.0 / interval_s"
                              " FROM snapshots", (int(now_ms),)).fetchall()
        a = np.array(rows, dtype=np.float64).reshape(-1, 3)
        return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2]

    def urls_after(self, last_id: int) -> list[tuple[int, str]]:
        """``(id, url)`` of the snapshots whose id is above ``last_id`` (a URL keeps its id)."""
        with self._sql("list snapshot URLs") as db:
            return db.execute("SELECT id, url FROM snapshots WHERE id > ? ORDER BY id",
                              (int(last_id),)).fetchall()

    # -- the hit log --------------------------------------------------------------------------

    def log_hits(self, hits: Sequence[tuple[int, int, int, float, bool, int]],
                 requests: dict[int, tuple[int, int]] | None = None) -> None:
        """Append ``(at_ms, snapshot id, lane, age ÷ interval, served, crawler family)`` hits
        and add ``requests`` (family -> (requests, of which relayed from the origin)) to the
        per-crawler counts, in one transaction; forget hits older than ``api.HIT_WINDOW_MS`` or
        past ``HIT_CAP``."""
        if requests:
            with self._transaction("count requests") as db:
                db.executemany("INSERT INTO bot_hits VALUES (?, ?, ?) ON CONFLICT (bot) DO"
                               " UPDATE SET requests = requests + excluded.requests,"
                               " origin = origin + excluded.origin",
                               [(b, n, o) for b, (n, o) in requests.items()])
        if not hits:
            return
        newest = max(h[0] for h in hits)
        with self._transaction("log hits") as db:
            db.executemany("INSERT INTO hits VALUES (?, ?, ?, ?, ?, ?)",
                           [(a, s, ln, r, int(ok), b) for a, s, ln, r, ok, b in hits])
            db.execute("DELETE FROM hits WHERE at_ms < ?", (newest - api.HIT_WINDOW_MS,))
            db.execute("DELETE FROM hits WHERE rowid <= (SELECT max(rowid) FROM hits) - ?",
                       (api.HIT_CAP,))

    def hits(self, since_ms: int) -> list[tuple[str, int, float, bool]]:
        """The hits logged since ``since_ms``: ``(url, lane, age ÷ interval, served)``."""
        with self._sql("read hits") as db:
            got = db.execute("SELECT s.url, h.lane, h.age_over_interval, h.served FROM hits h"
                             " JOIN snapshots s ON s.id = h.snapshot WHERE h.at_ms >= ?",
                             (since_ms,)).fetchall()
        return [(u, ln, r, bool(ok)) for u, ln, r, ok in got]

    def bot_requests(self) -> dict[int, tuple[int, int]]:
        """Crawler family -> (requests, of which the origin's answer), since the store began."""
        with self._sql("read the requests per crawler") as db:
            rows = db.execute("SELECT bot, requests, origin FROM bot_hits").fetchall()
        return {int(b): (int(n), int(o)) for b, n, o in rows}

    def bot_ratios(self, since_ms: int) -> dict[int, tuple[int, float, int]]:
        """Crawler family -> (snapshot hits, mean age ÷ interval of those served, refused as
        too stale) since ``since_ms``."""
        with self._sql("read hits per crawler") as db:
            rows = db.execute("SELECT bot, count(*), avg(CASE WHEN served THEN"
                              " age_over_interval END), sum(1 - served) FROM hits"
                              " WHERE at_ms >= ? GROUP BY bot", (int(since_ms),)).fetchall()
        return {int(b): (int(n), float(m) if m is not None else float("nan"), int(r))
                for b, n, m, r in rows}

    def hit_ratios(self, since_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
        """The hits logged since ``since_ms`` as arrays: snapshot id, lane, age ÷ interval,
        served (bool)."""
        with self._sql("read hits") as db:
            rows = db.execute("SELECT snapshot, lane, age_over_interval, served FROM hits"
                              " WHERE at_ms >= ?", (int(since_ms),)).fetchall()
        a = np.array(rows, dtype=np.float64).reshape(-1, 4)
        return (a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2],
                a[:, 3].astype(bool))

    # -- upkeep -------------------------------------------------------------------------------

    def sweep(self) -> dict[str, int]:
        """Remove what killed writers left: temporary files of dead processes, and files no
        row points at. Safe beside live writers: the orphans are confirmed, and removed, under
        the write lock."""
        removed = {"temporary": 0, "orphans": 0}
        candidates = []
        current = self._current_files()
        for where, _dirs, names in os.walk(self.files):
            for name in names:
                path = os.path.join(where, name)
                if not name.startswith(_TMP):
                    if path not in current:
                        candidates.append(path)
                    continue
                pid = name[len(_TMP):].split("-", 1)[0]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        removed["temporary"] += 1
        if candidates:
            with self._transaction("sweep orphans"):
                current = self._current_files(locked=True)
                for path in candidates:
                    if path not in current:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                            removed["orphans"] += 1
        return removed

    def gc(self, grace_s: float) -> dict[str, int]:
        """:meth:`sweep`: a file no row names is removed under the write lock, so no grace
        is needed here (``grace_s`` is for stores whose writers take no common lock)."""
        return self.sweep()

    def _current_files(self, locked: bool = False) -> set[str]:
        """The file of every row (``locked``: inside a transaction, on its connection)."""
        query = "SELECT url, hash FROM snapshots"
        if locked:
            assert self._conn is not None
            rows = self._conn.execute(query).fetchall()
        else:
            with self._sql("list snapshot files") as db:
                rows = db.execute(query).fetchall()
        return {self.path_of(u, h) for u, h in rows}

    def statistics(self) -> dict[str, Any]:
        """What the store holds, and this process's puts."""
        with self._sql("count snapshots") as db:
            n, size, gz, renders, unchanged = db.execute(
                "SELECT count(*), total(bytes), total(gz_bytes), total(renders),"
                " total(unchanged) FROM snapshots").fetchone()
            hits = db.execute("SELECT count(*) FROM hits").fetchone()[0]
        return {"directory": self.directory, "snapshots": int(n), "bytes": int(size),
                "gz_bytes": int(gz), "renders": int(renders), "unchanged": int(unchanged),
                "hits": int(hits), "written_here": self.written,
                "unchanged_here": self.unchanged}

    # -- the connection -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _sql(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise EngineClosed(f"the snapshot store {self.directory} is closed")
            if self._pid != os.getpid():
                raise StoreError(f"the snapshot store {self.directory} was opened in process"
                                 f" {self._pid}: open it in each process, after the fork")
            try:
                yield self._conn
            except sqlite3.Error as e:
                raise StoreError(f"{self.directory}: cannot {what}: {e}") from None

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._sql(what) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


# -- files and directories --------------------------------------------------------------------

def _make_directories(path: str) -> str | None:
    """Make ``path`` and its missing parents (0700); the topmost one made, or None."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    try:
        for d in reversed(missing):
            _mkdir(d)
    except OSError as e:
        _remove(missing[-1])
        raise StoreError(f"cannot make the snapshot store {path}: {e.strerror or e}") from None
    return missing[-1] if missing else None


def _mkdir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # whatever the umask
    _fsync_directory(os.path.dirname(path))


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(made: str | None) -> None:
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def _probe(directory: str) -> None:
    """Write and remove a file: ``os.access`` says nothing true for root or read-only mounts."""
    probe = os.path.join(directory, f"{_TMP}{os.getpid()}-probe-{secrets.token_hex(4)}")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.unlink(probe)


def _create_database(database: str) -> None:
    """The database with its schema, built under a temporary name and linked into place (an
    opener never sees it half-made; a concurrent creator's is kept, never replaced)."""
    tmp = f"{os.path.dirname(database)}/{_TMP}{os.getpid()}-{secrets.token_hex(4)}.sqlite"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # its -wal/-shm too
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.executescript(_SCHEMA)
            conn.execute("PRAGMA journal_mode = WAL")  # kept in the file
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):
            os.link(tmp, database)
        _fsync_directory(os.path.dirname(database))
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp + suffix)


def _migrate(conn: sqlite3.Connection) -> int:
    """A version-1 store made version 2, once, under the write lock (another opener may have
    done it meanwhile); the version it is at."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] == 1:
            for statement in _MIGRATE_1_2.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def _connect(database: str) -> sqlite3.Connection:
    uri = f"file:{urllib.parse.quote(database)}?mode=rw"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)  # the store's lock serialises threads
    except sqlite3.Error as e:
        raise StoreError(f"cannot open {database}: {e}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # A commit is on disk before the file it replaced is removed (module docstring).
        conn.execute("PRAGMA synchronous = FULL")
        app, version = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                        for p in ("application_id", "user_version"))
        if (app, version) == (APPLICATION_ID, 1):
            version = _migrate(conn)
        if (app, version) != (APPLICATION_ID, SCHEMA_VERSION):
            raise StoreError(f"{database} is not a version-{SCHEMA_VERSION} snapshot store"
                             f" (application_id {app:#x}, user_version {version})")
        conn.execute("BEGIN IMMEDIATE")  # refused at once when the database is read-only
        conn.execute("ROLLBACK")
    except sqlite3.Error as e:
        conn.close()
        raise StoreError(f"{database} cannot be used as a snapshot store: {e}") from None
    except BaseException:
        conn.close()
        raise
    return conn


_ABANDONED: list[sqlite3.Connection] = []  # inherited across a fork: never closed there
