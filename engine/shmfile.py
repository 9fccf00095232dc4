"""Small named shared files beside an engine's segment: ``/dev/shm/<engine>.<suffix>``.

The pool keeps two such files next to the engine's segment: the URL table (written once, then
read by every worker) and the pool board (per-worker counters and the stop flag). Both must be
reachable by name from a process started by fork, spawn or forkserver, or from an unrelated
``lanes`` command, and must never be unlinked by an attacher, so they are plain files in the
shared-memory filesystem opened by path, not ``multiprocessing.shared_memory`` objects (whose
resource tracker unlinks them when an attaching process exits, on Python 3.11/3.12).

A file is written under a temporary name and renamed into place, so a reader never sees a
half-written one.
"""

from __future__ import annotations

import mmap
import os

from .errors import EngineValueError, LayoutMismatch, SegmentExists, SegmentMissing

SHM_DIR = "/dev/shm"


def path_of(name: str, suffix: str) -> str:
    return os.path.join(SHM_DIR, f"{name}.{suffix}")


def create(name: str, suffix: str, data: bytes | bytearray | memoryview,
           size: int | None = None) -> None:
    """Publish ``data`` (zero-padded to ``size``) as ``<name>.<suffix>``; refuse to replace."""
    final = path_of(name, suffix)
    if os.path.exists(final):
        raise SegmentExists(f"{final} exists (another pool, or one that crashed: lanes cleanup)")
    tmp = f"{final}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if size is not None and size > len(data):
                f.truncate(size)
            f.flush()
            # Pages reserved now: a write to a hole of a full tmpfs would be SIGBUS later.
            os.posix_fallocate(f.fileno(), 0, max(size or 0, len(data), 1))
        os.link(tmp, final)  # fails if someone published the name meanwhile: never replaced
    except FileExistsError:
        raise SegmentExists(f"{final} exists") from None
    finally:
        os.unlink(tmp)


def attach(name: str, suffix: str, writable: bool = False, min_size: int = 8) -> mmap.mmap:
    """Map ``<name>.<suffix>``; ``SegmentMissing`` if absent, ``LayoutMismatch`` if tiny."""
    path = path_of(name, suffix)
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise SegmentMissing(f"no {path}") from None
    try:
        size = os.fstat(fd).st_size
        if size < min_size:
            raise LayoutMismatch(f"{path} is {size} bytes, too small to be ours")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)


def unlink(name: str, suffix: str) -> bool:
    """Remove ``<name>.<suffix>``; False if it was not there."""
    if "/" in name or "/" in suffix:
        raise EngineValueError(f"bad name {name!r}.{suffix!r}")
    try:
        os.unlink(path_of(name, suffix))
    except FileNotFoundError:
        return False
    return True
