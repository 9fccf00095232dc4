"""render-lanes: a multi-process claim engine for render queues, on shared memory or on Redis.

The package reads as the data flows: ``keys`` (the sort key) -> ``policy`` (lanes and shares)
-> ``api`` (the contract every backend implements) -> the backends: ``shm`` (one shared-memory
segment and the C core) and ``redis`` (a queue in Redis shared by many hosts). The render pool,
the CLI and the simulator sit on top and reach an engine through ``api.QueueEngine``.

Both backends are exported here, each imported when it is first asked for: the shared-memory
one needs the C core built, the Redis one needs redis-py (an extra), and a program using one
must not need the other.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .api import Claim, ClaimBatch, QueueEngine, RowUrls, UrlsAdded, VerifyWalk
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
    MissingExtra,
    NotAllowed,
    OutcomeUnknown,
    SegmentExists,
    SegmentMissing,
)
from .factory import open as open  # noqa: A004  (engine.open; not in __all__: see below)
from .keys import STRIDE, due_ms_of, encode, lane_of
from .policy import LanePolicy

if TYPE_CHECKING:
    from .redis import RedisEngine, ShardedEngine
    from .shm import Claims, Engine

_BACKENDS = {"Engine": "shm", "Claims": "shm", "RedisEngine": "redis",
             "ShardedEngine": "redis"}


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        module = importlib.import_module(f"{__name__}.{_BACKENDS[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


# engine.open (the factory) is left out: a star import must not hide the builtin open.
__all__ = [
    "STRIDE", "AttachTimeout", "CapacityError", "Claim", "ClaimBatch", "Claims", "CorpusError",
    "Engine", "EngineClosed", "EngineError", "EngineTypeError", "EngineValueError",
    "LanePolicy", "LayoutMismatch", "LeaseLost", "MissingExtra", "NotAllowed", "OutcomeUnknown",
    "QueueEngine", "RedisEngine", "RowUrls", "SegmentExists", "SegmentMissing", "ShardedEngine",
    "UrlsAdded", "VerifyWalk",
    "due_ms_of", "encode", "lane_of",
]
