"""The exception hierarchy every backend raises (the C core's status codes map onto it in
``engine.shm.segment``, the Redis library's error codes in ``engine.redis.transport``).
"""

from __future__ import annotations


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


class MissingExtra(EngineError):
    """A command needs a package that one of the optional extras installs, and this install
    lacks it: the message names the extra."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"needs {module}, which the {extra!r} extra installs:"
                         f" pip install 'render-lanes[{extra}]'")
        self.module, self.extra = module, extra
