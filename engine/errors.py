"""The exception hierarchy and the one table that maps the C core's status codes onto it.

Nothing else in the package invents an error for a C status: :func:`raise_for` is the only
translation, so a new code in ``csrc/lanes.h`` needs one line here.
"""

from __future__ import annotations

from typing import NoReturn

from ._core import lib


class EngineError(Exception):
    """Base of every error render-lanes raises on purpose."""


class EngineValueError(EngineError, ValueError):
    """A bad value: absent or out-of-range due time, unknown provenance, bad share, ..."""


class CorpusError(EngineValueError):
    """A corpus file (CSV, JSONL, sitemap) is unreadable, malformed, unsafe or holds a bad row.

    The message names the file and, where there is one, the 1-based line: ``path:line: what``.
    """


class EngineTypeError(EngineError, TypeError):
    """A value of the wrong type (a float row id, a string array where integers belong, ...)."""


class LayoutMismatch(EngineError):
    """The named segment is not an engine of this layout: foreign, truncated or other version."""


class LeaseLost(EngineError):
    """The fencing token is stale: the lease expired and was re-claimed, or already ended."""


class CapacityError(EngineError):
    """The segment has no room left (rows, or owner slots)."""


class OutcomeUnknown(EngineError):
    """A write reached a Redis connection that was lost before its reply: it may or may not
    have been applied (docs/redis.md, "Lost connections"). Never replayed by the engine."""


class EngineClosed(EngineError):
    """The engine was closed in this process."""


class AttachTimeout(EngineError, TimeoutError):
    """The segment exists but its creator never published the ready flag."""


class SegmentExists(EngineError, FileExistsError):
    """``Engine.create`` found a segment of that name (see ``exist_ok``, ``lanes cleanup``)."""


class SegmentMissing(EngineError, FileNotFoundError):
    """No segment of that name exists."""


class StoreError(EngineError):
    """A snapshot store cannot be opened or written: the directory is unwritable, is not a
    store (or another version of one), or the store was opened in another process."""


class NotAllowed(EngineError):
    """The operation is refused in the current state (restamp while lanes are enabled, ...)."""


# Status codes from csrc/lanes.h, by their names there (a renumbered code cannot drift).
_TABLE: dict[int, tuple[type[EngineError], str]] = {
    lib.RL_E_LAYOUT: (LayoutMismatch, "segment layout does not match"),
    lib.RL_E_LEASE: (LeaseLost, "lease lost: the token is stale"),
    lib.RL_E_CAPACITY: (CapacityError, "capacity exhausted"),
    lib.RL_E_VALUE: (EngineValueError, "bad argument"),
    lib.RL_E_RANGE: (EngineValueError,
                    "out of range (a row id that does not exist, or a value past its limit)"),
    lib.RL_E_SYS: (EngineError, "system call failed"),
    lib.RL_E_TIMEOUT: (AttachTimeout, "timed out waiting for the segment"),
    lib.RL_E_EXISTS: (SegmentExists, "segment already exists"),
    lib.RL_E_NOTFOUND: (SegmentMissing, "no such segment"),
    lib.RL_E_NOTALLOWED: (NotAllowed, "not allowed now"),
    lib.RL_E_BUSY: (EngineError, "busy"),
}


def raise_for(status: int, context: str = "") -> NoReturn:
    """Raise the exception mapped to a negative C status, with ``context`` in the message."""
    cls, text = _TABLE.get(status, (EngineError, f"unknown status {status}"))
    raise cls(f"{context}: {text}" if context else text)
