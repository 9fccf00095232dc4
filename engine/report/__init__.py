"""What an operator reads: the numbers of an engine, a pool's board and a snapshot store turned
into words, tables and metrics, the same for ``lanes stats``, the live view, ``/metrics`` and the
dashboard of ``lanes serve``.

* ``progress``: quantiles, durations, due times and rates in words, and the per-lane "next due";
* ``view``: the per-lane figures of a pool and the terminal tables (the live view, ``lanes stats``);
* ``staleness``: the served staleness of a snapshot store, per lane and per route;
* ``metrics``: the Prometheus families.

Imports flow one way: the report reads the engine, the pool's board and the store and changes
none of them; ``engine.cli``, ``engine.demo`` and ``engine.serve`` import it.
"""
