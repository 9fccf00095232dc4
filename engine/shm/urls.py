"""The URL of every row, readable by name from any process: ``/dev/shm/<engine>.urls``.

The engine schedules row ids; a render needs the row's URL. The pool writes the table once when
it fills the engine (row ``r`` has URL ``urls[r]``) and every worker maps it read-only, whatever
its start method, so no URL is pickled to a worker and a worker restarted by the supervisor
finds them all at once.

A pool's corpus can grow while it runs (``lanes add``): new rows get their URLs in a further
file, ``/dev/shm/<engine>.urls.<first row>``, written whole before the rows are added to the
engine, so a worker that claims a new row finds its URL by looking for the next file. Every
file is immutable once published. Two adders (``lanes add``, the supervisor's corpus refresh)
are serialised by a lock on the first file, so the new rows' ids follow the table's last row.

Layout of each file: a 32-byte header (magic, version, row count, blob length), the start
offset of each URL (int64, n + 1 entries), then the URLs as UTF-8 joined by ``\\n`` with a
``\\n`` before the first, so that finding a URL is one ``bytes.find`` of ``\\n<url>\\n``.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from .. import shmfile
from ..api import BoolArray, IntArray, QueueEngine, RowUrls, Scoped, UrlsAdded
from ..checks import check_mode
from ..corpus.urlnorm import origin_of
from ..errors import (
    CapacityError,
    EngineError,
    EngineValueError,
    LayoutMismatch,
    SegmentMissing,
)
from ..keys import PARKED_MS

SUFFIX = "urls"
ROUTES_SUFFIX = "routes"
_MAGIC = b"RLURLS01"
_HEADER = struct.Struct("<8sQQQ")  # magic, version, rows, blob bytes
FIND_EACH = 32
"""``find_many`` looks up to this many URLs one by one; more read the table once."""


class _Part:
    """One published file: the URLs of rows ``[first, first + len)``."""

    def __init__(self, buf: mmap.mmap | bytes, name: str | None = None) -> None:
        if len(buf) < _HEADER.size:
            raise LayoutMismatch("URL table too small")
        magic, version, n, blob_len = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC or version != 1:
            raise LayoutMismatch("not a render-lanes URL table (or another version)")
        off_end = _HEADER.size + 8 * (n + 1)
        if len(buf) != off_end + blob_len:
            raise LayoutMismatch("URL table size disagrees with its header")
        self.name = name
        self._buf = buf
        self._offsets = np.frombuffer(buf, np.int64, n + 1, _HEADER.size)
        self._start = off_end
        self._blob = memoryview(buf)[off_end:]
        self._origins: frozenset[str] | None = None

    @staticmethod
    def encode(urls: Sequence[str]) -> bytes:
        """The table's bytes for ``urls`` (row ``r`` is ``urls[r]``)."""
        parts = []
        for i, u in enumerate(urls):
            if not isinstance(u, str) or not u or "\n" in u or "\r" in u:
                raise EngineValueError(f"urls[{i}] = {u!r} is not a one-line, non-empty string")
            try:
                parts.append(u.encode())
            except UnicodeEncodeError:
                raise EngineValueError(f"urls[{i}] = {u!r} cannot be written as UTF-8") from None
        blob = b"\n" + b"\n".join(parts) + b"\n"
        lengths = np.fromiter((len(p) + 1 for p in parts), np.int64, len(parts))
        offsets = np.empty(len(parts) + 1, np.int64)
        offsets[0] = 1
        np.cumsum(lengths, out=offsets[1:])
        offsets[1:] += 1
        return _HEADER.pack(_MAGIC, 1, len(parts), len(blob)) + offsets.tobytes() + blob

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, row: int) -> str:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1]) - 1
        return bytes(self._blob[start:end]).decode()

    def urls(self) -> list[str]:
        return bytes(self._blob[1:-1]).decode().split("\n") if len(self) else []

    def origins(self) -> frozenset[str]:
        """The origins of this file's URLs, found once (a file never changes)."""
        if self._origins is None:
            self._origins = frozenset(origin_of(u) for u in self.urls())
        return self._origins

    def find(self, needle: bytes) -> int:
        """The index of ``needle`` (``\\n<url>\\n``) in this file, or -1."""
        at = self._buf.find(needle, self._start) - self._start
        return int(np.searchsorted(self._offsets, at + 1)) if at >= 0 else -1

    def close(self) -> None:
        self._offsets = np.empty(1, np.int64)
        self._blob.release()
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()


class Rows(QueueEngine, Protocol):
    """What adding URLs reads of the engine beside the table (an ``Engine``, which imports this
    module): the row ids it gave, and which of them a repair took back."""

    def rows_used(self) -> int: ...
    def taken_back(self, rows: IntArray) -> BoolArray: ...


class UrlTable:
    """Row id -> URL, shared read-only by every process of a pool: the first file, and the files
    ``append`` published since (looked for again when a row past the known ones is asked for).
    ``add`` needs the engine whose rows these are (``Engine.row_urls`` gives it)."""

    def __init__(self, name: str, engine: Rows | None = None) -> None:
        self.name = name
        self.engine = engine
        self._parts: list[_Part] = []
        self._first: list[int] = []
        self._rows = 0
        self.refresh()
        if not self._parts:
            raise SegmentMissing(f"no URL table {shmfile.path_of(name, SUFFIX)}")

    encode = staticmethod(_Part.encode)

    @classmethod
    def create(cls, name: str, urls: Sequence[str], engine: Rows | None = None) -> UrlTable:
        shmfile.create(name, SUFFIX, _Part.encode(urls))
        return cls(name, engine)

    @classmethod
    def attach(cls, name: str, engine: Rows | None = None) -> UrlTable:
        return cls(name, engine)

    @staticmethod
    def append(name: str, first_row: int, urls: Sequence[str]) -> str:
        """Publish the URLs of rows ``first_row ..`` as a further file; returns its path. The
        caller adds the rows to the engine after this returns, and removes the file if that
        fails (``remove_part``)."""
        if first_row < 0:
            raise EngineValueError(f"a further URL file starts at a row >= 0, got {first_row}")
        shmfile.create(name, f"{SUFFIX}.{first_row}", _Part.encode(urls))
        return shmfile.path_of(name, f"{SUFFIX}.{first_row}")

    @staticmethod
    def remove_part(name: str, first_row: int) -> bool:
        return shmfile.unlink(name, f"{SUFFIX}.{first_row}")

    def store_routes(self, text: str) -> None:
        """Keep the routes (``Routes.to_json``) a pool was started with, beside the table."""
        shmfile.create(self.name, ROUTES_SUFFIX, text.encode())

    def routes(self) -> str | None:
        """The stored routes JSON, or None."""
        try:
            buf = shmfile.attach(self.name, ROUTES_SUFFIX, min_size=2)
        except SegmentMissing:
            return None
        try:
            return bytes(buf).decode()
        finally:
            buf.close()

    @staticmethod
    def unlink_routes(name: str) -> bool:
        return shmfile.unlink(name, ROUTES_SUFFIX)

    def drop(self) -> None:
        """Remove the table's files and the routes (the engine's segment is the caller's)."""
        self.close()
        self.unlink(self.name)
        self.unlink_routes(self.name)

    @staticmethod
    def unlink(name: str) -> bool:
        """Remove the table's files (the first and every further one); False if none was there."""
        removed = [shmfile.unlink(name, f"{SUFFIX}.{first}") for first in _further(name)]
        return shmfile.unlink(name, SUFFIX) or any(removed)

    def add(self, urls: Sequence[str], due_ms: Any, interval_s: Any, provenance: Any = "submitted",
            failures: Any = None, now_ms: int | None = None) -> UrlsAdded:
        """Queue a row for each URL the table lacks, its URLs published as a further file
        before the rows are added; a known URL is left alone unless its row is parked (after
        ``--max-failures``), which is made due now: adding it again is how an operator says
        "try it again". ``CapacityError`` when the new rows do not fit."""
        eng = self._engine("add")
        with self._adding():
            self.refresh()
            rows_used = eng.rows_used()  # row ids, those a repair took back included
            table = self.urls()
            if len(table) > rows_used and self.remove_part(self.name, rows_used):
                # An adder killed after publishing its URLs and before reserving their rows
                # (its lock is ours now): its URL file goes, as a failed add's does.
                table = table[:rows_used]
            if rows_used != len(table):
                raise EngineError(f"engine {self.name!r} has {rows_used} rows but {len(table)}"
                                  " URLs: rows were added outside the pool; refusing to add more")
            # A URL whose row a repair took back (its adder was killed between reserving the
            # rows and writing them) is added again, as a new row.
            void = eng.taken_back(np.arange(rows_used, dtype=np.int64))
            known = {u: r for r, u in enumerate(table) if not void[r]}
            rows = np.array([known.get(u, -1) for u in urls], np.int64)
            new = rows < 0
            unparked = _unpark(eng, rows[~new].tolist(), now_ms)
            if not new.any():
                return UrlsAdded(rows, new, unparked)
            pick = np.flatnonzero(new)
            free = int(eng.stats()["capacity"]) - rows_used
            if len(pick) > free:
                raise CapacityError(f"{len(pick)} new URLs, room for {free} (capacity"
                                    f" {rows_used + free}): stop the pool and --resume it with a"
                                    " larger --capacity")
            self.append(self.name, rows_used, [urls[int(i)] for i in pick])
            try:
                got = eng.add_many(_rows_of(due_ms, pick), _rows_of(interval_s, pick),
                                   _rows_of(provenance, pick), _rows_of(failures, pick))
            except BaseException:
                self.remove_part(self.name, rows_used)
                raise
            if not np.array_equal(got, np.arange(rows_used, rows_used + len(pick))):
                raise EngineError(f"engine {self.name!r} gave rows {got[:3].tolist()}... for the"
                                  f" URLs of rows {rows_used}..: rows were added outside the pool")
            rows[pick] = got
            return UrlsAdded(rows, new, unparked)

    def find_prefix(self, prefix: str) -> tuple[IntArray, list[str]]:
        """The rows whose URL starts with ``prefix``, and their URLs: one pass over the mapped
        table."""
        table = self.urls()
        rows = [r for r, u in enumerate(table) if u.startswith(prefix)]
        return np.asarray(rows, np.int64), [table[r] for r in rows]

    def prioritize_prefix(self, prefix: str, mode: str = "rush", now_ms: int | None = None
                          ) -> Scoped:
        """``prioritize_many`` of the rows ``find_prefix`` finds (one call of the engine)."""
        eng = self._engine("prioritize")
        check_mode(mode)
        rows, _ = self.find_prefix(prefix)
        return Scoped(len(rows), eng.prioritize_many(rows, mode, now_ms))

    def _engine(self, to: str) -> Rows:
        if self.engine is None:
            raise EngineValueError(f"URL table {self.name!r} was opened without its engine:"
                                   f" open it with the engine's row_urls() to {to}")
        return self.engine

    @contextlib.contextmanager
    def _adding(self) -> Iterator[None]:
        """One adder at a time per table (a lock on its first file, dropped if the adder
        dies)."""
        path = shmfile.path_of(self.name, SUFFIX)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SegmentMissing(f"no pool runs over {self.name!r} (no {path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def refresh(self) -> None:
        """Map the files published since the last look, in row order, up to the first gap."""
        if not self._parts:
            try:
                self._add(_Part(shmfile.attach(self.name, SUFFIX, min_size=_HEADER.size),
                                self.name))
            except SegmentMissing:
                return
        for first in _further(self.name):
            if first < self._rows:
                continue
            if first > self._rows:
                break  # a file being written (or left by a failed add): not ours yet
            try:
                part = _Part(shmfile.attach(self.name, f"{SUFFIX}.{first}",
                                            min_size=_HEADER.size), self.name)
            except SegmentMissing:
                break  # removed by a failed add meanwhile
            self._add(part)

    def _add(self, part: _Part) -> None:
        self._parts.append(part)
        self._first.append(self._rows)
        self._rows += len(part)

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, row: int) -> str:
        if not 0 <= row < self._rows:
            self.refresh()
            if not 0 <= row < self._rows:
                raise EngineValueError(f"row {row} has no URL (the table holds {self._rows})")
        i = bisect.bisect_right(self._first, row) - 1
        return self._parts[i][row - self._first[i]]

    def many(self, rows: Sequence[int]) -> list[str]:
        """The URLs of ``rows`` (a claimed batch), as ``[row]`` gives each."""
        return [self[int(r)] for r in rows]

    def __iter__(self) -> Iterator[str]:
        return (self[r] for r in range(len(self)))

    def urls(self) -> list[str]:
        """Every URL, row order, including files published since the last look."""
        self.refresh()
        return [u for part in self._parts for u in part.urls()]

    def find(self, url: str) -> int:
        """The row of ``url``; ``EngineValueError`` if the table does not hold it."""
        try:
            needle = b"\n" + url.encode() + b"\n"
        except UnicodeEncodeError:
            raise EngineValueError(f"{url!r} is not a URL this table can hold") from None
        if "\n" not in url:
            self.refresh()
            for first, part in zip(self._first, self._parts, strict=True):
                at = part.find(needle)
                if at >= 0:
                    return first + at
        raise EngineValueError(f"no row has URL {url!r}")

    def find_many(self, urls: Sequence[str]) -> IntArray:
        """The row of each of ``urls``, -1 where the table holds none: a few looked for one by
        one (each ``find`` is a pass over the mapped table), more through one pass."""
        if len(urls) <= FIND_EACH:
            return np.array([self._find_or_none(u) for u in urls], np.int64).reshape(-1)
        index = {u: r for r, u in enumerate(self.urls())}
        return np.fromiter((index.get(u, -1) for u in urls), np.int64, len(urls))

    def _find_or_none(self, url: str) -> int:
        try:
            return self.find(url)
        except EngineValueError:
            return -1

    def origins(self) -> frozenset[str]:
        """``scheme://host[:port]`` of every URL, each file's read once."""
        self.refresh()
        return frozenset().union(*(part.origins() for part in self._parts))

    def close(self) -> None:
        for part in self._parts:
            part.close()
        self._parts, self._first, self._rows = [], [], 0


def _rows_of(col: Any, pick: IntArray) -> Any:
    """The picked entries of one column of an add (a scalar, or None, stands for every row)."""
    return col if col is None or np.ndim(col) == 0 else np.asarray(col)[pick]


def _unpark(eng: QueueEngine, rows: list[int], now_ms: int | None) -> int:
    """Make the parked ones among ``rows`` due now; returns how many."""
    if not rows:
        return 0
    queued, cols = eng.export_rows()
    parked = set(queued[cols["due_ms"] == PARKED_MS].tolist())
    n = 0
    for row in rows:
        if row in parked:
            eng.prioritize(row, "wait", now_ms)
            n += 1
    return n


def _further(name: str) -> list[int]:
    """First rows of the further URL files of ``name``, ascending (temporary files skipped)."""
    prefix = f"{name}.{SUFFIX}."
    try:
        entries = os.listdir(shmfile.SHM_DIR)
    except OSError:
        return []
    return sorted(int(e[len(prefix):]) for e in entries
                  if e.startswith(prefix) and e[len(prefix):].isdigit())


_: type[RowUrls] = UrlTable
