"""The engine on shared memory (``Engine``): :class:`engine.api.QueueEngine` over one segment in
/dev/shm that the processes of one machine map, every claim pass and write a call into the C
core (csrc/, built as ``engine._core`` and ``engine._hot``).

Three modules: ``engine`` (the API: checks arguments, calls the core), ``segment`` (one mapped
segment: create, attach, the core's error codes, the owner of each process) and ``urls`` (a
pool's URL table, files in /dev/shm beside the segment).
"""

from .engine import Claims, Engine

__all__ = ["Claims", "Engine"]
