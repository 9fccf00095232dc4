"""The engine on Redis (``RedisEngine``): :class:`engine.api.QueueEngine` for a queue shared by
many hosts, every write and claim pass one FCALL into the Lua library render_lanes (its files in
lua/, made into one payload by ``library.py``).

Three modules: ``engine`` (the API: checks arguments, calls the library), ``transport`` (the
connection and its one retry rule), ``codec`` (the queue's layout: keys, records, arguments,
replies, ``verify``). A queue over N shards is ``shards.ShardedEngine``, N ``RedisEngine``s
under one name (``catalog``: its record; ``shard_urls``: its rows' URLs). Needs redis-py (the
``test`` and ``bench`` extras install it) and a Redis >= 7 server; neither the shared-memory
engine nor the C core. See docs/redis.md.
"""

from .codec import LIBRARY, LIBRARY_VERSION, MAX_ROWS, RedisClaims, queue_keys
from .engine import RedisEngine
from .library import library_source
from .shards import ShardedEngine
from .transport import redact

__all__ = ["LIBRARY", "LIBRARY_VERSION", "MAX_ROWS", "RedisClaims", "RedisEngine",
           "ShardedEngine", "library_source", "queue_keys", "redact"]
