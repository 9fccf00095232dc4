"""render-lanes: a shared-memory, multi-process claim engine for render queues.

The package reads as the data flows: ``keys`` (the sort key) -> ``policy`` (lanes and shares)
-> ``segment`` (the shared memory and the C core) -> ``engine`` (writes, claims, stats); the
CLI and the demo sit on top.
"""

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
    SegmentExists,
    SegmentMissing,
)
from .keys import STRIDE, due_ms_of, encode, lane_of
from .policy import LanePolicy

__all__ = [
    "STRIDE", "AttachTimeout", "CapacityError", "Claim", "Claims", "CorpusError", "Engine",
    "EngineClosed",
    "EngineError", "EngineTypeError", "EngineValueError", "LanePolicy", "LayoutMismatch",
    "LeaseLost", "NotAllowed", "SegmentExists", "SegmentMissing", "due_ms_of", "encode",
    "lane_of",
]
