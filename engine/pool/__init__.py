"""The render pool on top of the engine: a supervisor forking N workers (``supervisor``), the
render call (``render``), the board of per-worker counters (``board``, over ``engine.shmfile``),
the Prometheus metrics (``metrics``) and the live view (``view``).

Imports flow one way: the core (the backends ``engine.shm`` and ``engine.redis``, ``keys``,
``policy``, ``checkpoint``) and the corpus readers (``engine.corpus``) know nothing of the pool;
the pool imports them; the command line (``engine.cli``, ``demo``) imports both.
"""

from .supervisor import Pool, PoolOptions, clear_stale, supervisor_running

__all__ = ["Pool", "PoolOptions", "clear_stale", "supervisor_running"]
