"""The URL of every row, readable by name from any process: ``/dev/shm/<engine>.urls``.

The engine schedules row ids; a render needs the row's URL. The pool writes the table once when
it fills the engine (row ``r`` has URL ``urls[r]``) and every worker maps it read-only, whatever
its start method, so no URL is pickled to a worker and a worker restarted by the supervisor
finds them all at once.

Layout: a 32-byte header (magic, version, row count, blob length), the start offset of each
URL (int64, n + 1 entries), then the URLs as UTF-8 joined by ``\\n`` with a ``\\n`` before the
first, so that finding a URL is one ``bytes.find`` of ``\\n<url>\\n``.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import EngineValueError, LayoutMismatch
from . import shmfile

SUFFIX = "urls"
_MAGIC = b"RLURLS01"
_HEADER = struct.Struct("<8sQQQ")  # magic, version, rows, blob bytes


class UrlTable:
    """Row id -> URL, shared read-only by every process of a pool."""

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

    @classmethod
    def create(cls, name: str, urls: Sequence[str]) -> UrlTable:
        shmfile.create(name, SUFFIX, cls.encode(urls))
        return cls.attach(name)

    @classmethod
    def attach(cls, name: str) -> UrlTable:
        return cls(shmfile.attach(name, SUFFIX, min_size=_HEADER.size), name)

    @staticmethod
    def unlink(name: str) -> bool:
        return shmfile.unlink(name, SUFFIX)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, row: int) -> str:
        if not 0 <= row < len(self):
            raise EngineValueError(f"row {row} has no URL (the table holds {len(self)})")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1]) - 1
        return bytes(self._blob[start:end]).decode()

    def __iter__(self) -> Iterator[str]:
        return (self[r] for r in range(len(self)))

    def urls(self) -> list[str]:
        return bytes(self._blob[1:-1]).decode().split("\n") if len(self) else []

    def find(self, url: str) -> int:
        """The row of ``url``; ``EngineValueError`` if the table does not hold it."""
        try:
            needle = b"\n" + url.encode() + b"\n"
        except UnicodeEncodeError:
            raise EngineValueError(f"{url!r} is not a URL this table can hold") from None
        at = self._buf.find(needle, self._start) - self._start if "\n" not in url else -1
        if at < 0:
            raise EngineValueError(f"no row has URL {url!r}")
        return int(np.searchsorted(self._offsets, at + 1))

    def close(self) -> None:
        self._offsets = np.empty(1, np.int64)
        self._blob.release()
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
