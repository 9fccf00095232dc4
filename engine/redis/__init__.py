"""The engine on Redis (``RedisEngine``): the API of ``engine.Engine`` for a queue shared by
many hosts, every write and claim pass one FCALL into the Lua library render_lanes (its files
in lua/, made into one payload by ``library.py``).

Needs redis-py (the ``test`` and ``bench`` extras install it) and a Redis >= 7 server. See
docs/redis.md.
"""

from .engine import (
    LIBRARY,
    LIBRARY_VERSION,
    MAX_ROWS,
    RedisClaims,
    RedisEngine,
    queue_keys,
    redact,
)
from .library import library_source

__all__ = ["LIBRARY", "LIBRARY_VERSION", "MAX_ROWS", "RedisClaims", "RedisEngine",
           "library_source", "queue_keys", "redact"]
