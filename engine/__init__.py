"""render-lanes: a shared-memory, multi-process claim engine for render queues.

The package reads as the data flows: ``keys`` (the sort key) -> ``policy`` (lanes and shares)
-> ``segment`` (the shared memory and the C core) -> ``engine`` (writes, claims, stats); the
CLI and the demo sit on top.
"""

from typing import TYPE_CHECKING, Any

from .engine import Claim, Claims, Engine
from .errors import (
    AttachTimeout,
    CapacityError,
    CorpusError,
    EngineClosed,
    EngineError,
    EngineTypeError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    NotAllowed,
    OutcomeUnknown,
    SegmentExists,
    SegmentMissing,
)
from .keys import STRIDE, due_ms_of, encode, lane_of
from .policy import LanePolicy

if TYPE_CHECKING:
    from .redis import RedisEngine


def __getattr__(name: str) -> Any:
    # RedisEngine needs redis-py (an extra): imported only when asked for.
    if name == "RedisEngine":
        from .redis import RedisEngine

        return RedisEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "STRIDE", "AttachTimeout", "CapacityError", "Claim", "Claims", "CorpusError", "Engine",
    "EngineClosed",
    "EngineError", "EngineTypeError", "EngineValueError", "LanePolicy", "LayoutMismatch",
    "LeaseLost", "NotAllowed", "OutcomeUnknown", "RedisEngine", "SegmentExists",
    "SegmentMissing", "due_ms_of", "encode", "lane_of",
]
