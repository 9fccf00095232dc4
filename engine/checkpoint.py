"""Checkpoints: the whole schedule of an engine in one file, written atomically.

The segment lives in memory; a pool that is stopped, or whose machine reboots, must not lose
its schedule. A checkpoint holds every queued row's due time, interval, provenance, failure
count and urgent flag, the policy in force and, when the pool gives them, the rows' URLs. Leases
are not kept: a lease belongs to a process that will not exist after a restore, so a leased row
comes back due at its scheduled time and is claimed again.

Written to a temporary file in the same directory, flushed to disk, then renamed over the old
checkpoint, so a crash at any moment leaves either the old checkpoint or the new one. A restore
adds the rows in their saved order; removed rows are not kept, so row ids are renumbered
densely from 0 (the saved URLs are renumbered with them).

Format: an uncompressed numpy ``.npz`` (no pickles; ``allow_pickle=False`` on read).
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .api import IntArray, QueueEngine
from .errors import EngineError, EngineValueError
from .keys import STRIDE
from .policy import MAX_INTERVAL_S, LanePolicy

FORMAT = "render-lanes-checkpoint"
VERSION = 1
_COLUMNS = ("due_ms", "interval_s", "failures", "provenance", "urgent")
EXPORTED = (*_COLUMNS, "lane")
"""The columns of ``QueueEngine.export_rows``: the saved ones and each row's lane (which a
checkpoint does not keep: a restore derives it again)."""


@dataclass(frozen=True)
class Checkpoint:
    """A saved schedule: parallel columns over the queued rows, in row order."""

    name: str
    saved_at_ms: int
    capacity: int
    policy: LanePolicy
    due_ms: IntArray
    interval_s: IntArray
    failures: IntArray
    provenance: IntArray
    urgent: IntArray
    urls: list[str] | None
    extra: dict[str, Any] = field(default_factory=dict)
    """What the pool keeps beside the schedule (JSON: e.g. each failing URL's last error)."""

    def __len__(self) -> int:
        return len(self.due_ms)


def snapshot(eng: QueueEngine) -> tuple[IntArray, dict[str, IntArray]]:
    """(row ids, columns ``EXPORTED``) of every queued row of ``eng``, read in one pass (one
    transaction on Redis)."""
    return eng.export_rows()


def save(eng: QueueEngine, path: str | os.PathLike[str],
         urls: Sequence[str] | Callable[[], Sequence[str]] | None = None,
         extra: dict[str, Any] | None = None) -> int:
    """Write ``eng``'s schedule to ``path`` atomically; returns the number of rows saved.

    ``urls``, if given, maps row id to URL (``urls[row]``) and is saved beside the rows; a
    callable is called after the rows are read, so that rows added meanwhile (by ``lanes add``,
    or a pool on another host) are never saved without their URL: URLs are published before,
    or with, their rows. ``extra`` (JSON-serialisable) is saved as is and read back as
    ``Checkpoint.extra``.
    """
    rows, cols = snapshot(eng)
    if callable(urls):
        urls = urls()
    return write(path, eng.name, rows, cols, eng.stats()["capacity"], eng.policy, urls, extra)


def write(path: str | os.PathLike[str], name: str, rows: IntArray, cols: dict[str, IntArray],
          capacity: int, policy: LanePolicy, urls: Sequence[str] | None = None,
          extra: dict[str, Any] | None = None) -> int:
    """Write rows ``rows`` (their ``cols``, as ``snapshot`` gives them) of a queue named
    ``name`` to ``path``: to a temporary file in the same directory, fsynced, renamed over the
    old one, and the directory fsynced, so a crash leaves the old checkpoint or the new one."""
    path = os.fspath(path)
    arrays: dict[str, Any] = {c: cols[c] for c in _COLUMNS}
    if urls is not None:
        if len(rows) and int(rows[-1]) >= len(urls):
            raise EngineValueError(f"urls holds {len(urls)} entries, row {int(rows[-1])} is queued")
        blob = "\n".join(urls[int(r)] for r in rows).encode()
        arrays["urls"] = np.frombuffer(blob, np.uint8)
    meta = {"format": FORMAT, "version": VERSION, "name": name,
            "saved_at_ms": time.time_ns() // 1_000_000, "rows": len(rows),
            "capacity": int(capacity), "policy": policy.to_dict(), "has_urls": urls is not None}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    if extra:
        arrays["extra"] = np.frombuffer(json.dumps(extra).encode(), np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        # 0600, as every file of a pool: the URLs are nobody else's to read
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)
    return len(rows)


def read(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and check a checkpoint; ``EngineValueError`` naming what is wrong."""
    path = os.fspath(path)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise EngineValueError(f"{path} is not a checkpoint (not an .npz archive)")
        with z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise EngineValueError(f"no checkpoint at {path}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise EngineValueError(f"{path} is not a readable checkpoint: {e}") from None
    try:
        meta = json.loads(bytes(data["meta"]).decode())
        if not isinstance(meta, dict) or (meta.get("format"), meta.get("version")) != (
                FORMAT, VERSION):
            raise EngineValueError(f"{path}: not a version-{VERSION} render-lanes checkpoint")
        n = int(meta["rows"])
        cols = {c: np.ascontiguousarray(data[c], np.int64) for c in _COLUMNS}
        policy = LanePolicy.from_dict(meta["policy"])
        urls = bytes(data["urls"]).decode().split("\n") if meta["has_urls"] and n else (
            [] if meta["has_urls"] else None)
        extra = json.loads(bytes(data["extra"]).decode()) if "extra" in data else {}
        if not isinstance(extra, dict):
            raise ValueError("extra is not a JSON object")
    except EngineError:
        raise
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
        raise EngineValueError(f"{path}: damaged checkpoint ({e!r})") from None
    if any(len(v) != n for v in cols.values()) or (urls is not None and len(urls) != n):
        raise EngineValueError(f"{path}: damaged checkpoint (columns disagree with {n} rows)")
    bad = ((cols["due_ms"] < 0) | (cols["due_ms"] >= STRIDE) | (cols["interval_s"] < 1)
           | (cols["interval_s"] > MAX_INTERVAL_S) | (cols["failures"] < 0)
           | (cols["failures"] > 255) | ((cols["provenance"] | cols["urgent"]) & ~1 != 0))
    if bad.any():
        raise EngineValueError(f"{path}: damaged checkpoint (row {int(np.argmax(bad))} out of"
                               " range)")
    return Checkpoint(name=str(meta["name"]), saved_at_ms=int(meta["saved_at_ms"]),
                      capacity=int(meta["capacity"]), policy=policy, urls=urls, extra=extra,
                      **cols)


def restore(ck: Checkpoint, eng: QueueEngine) -> IntArray:
    """Add a checkpoint's rows to ``eng`` (in saved order); returns their new row ids."""
    rows = eng.add_many(ck.due_ms, ck.interval_s, ck.provenance, ck.failures)
    for i in np.flatnonzero(ck.urgent):
        # A rush puts the row in the urgent lane due at `now_ms`: at its saved due time.
        eng.prioritize(int(rows[i]), "rush", now_ms=int(ck.due_ms[i]))
    return rows
