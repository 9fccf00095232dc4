"""What a prioritize asks of a large pool besides a prefix scope, per backend: its hosts, a list
of URLs, a ``route:NAME`` scope.

    .venv/bin/python bench/bench_lookups.py [--smoke] [--out FILE] [--runs N]

A pool at rest of ROWS rows (half under ``/catalog/``, half under ``/p/``) and
:func:`engine.serve.recache.prioritize` called as the server's pool thread calls it, with a new
``Pool`` each time (as after rows were added: a server reads the hosts again then), mode
``wait``:

* ``one``: one listed URL (the hosts checked, the row found);
* ``list``: 10,000 listed URLs (the most a request may list);
* ``route``: ``route:catalog`` over half the rows, no route before it starting alike;
* ``shadowed``: the same route behind one (``/catalog/1*``) that takes some of its pages.

The script uses only what the stop before it had too, so the same file runs on that tree
(``PYTHONPATH=TREE``) for the figures before.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from common import ROOT, figure, finish, parse_args

import engine
from engine import factory
from engine.checks import wall_ms
from engine.corpus.routes import Route, Routes
from engine.serve.recache import Ask, Pool, prioritize

FULL = {"rows": 1_000_000, "runs": 3}
SMOKE = {"rows": 20_000, "runs": 1}
DAY_S = 86_400
OWN = Routes((Route("catalog", "https://shop.example/catalog/*", False, DAY_S),
              Route("product", "https://shop.example/p/*", False, DAY_S)))
SHADOWED = Routes((Route("sale", "https://shop.example/catalog/1*", False, DAY_S),
                   *OWN.routes))


def _urls(n: int) -> list[str]:
    return [f"https://shop.example/{'catalog' if i % 2 else 'p'}/{i}" for i in range(n)]


def _timed(eng: Any, table: Any, n: int, runs: int) -> dict[str, list[float]]:
    urls = _urls(n)
    listed = urls[:: max(1, n // 10_000)][:10_000]
    asks: dict[str, tuple[Routes | None, Callable[[], Ask]]] = {
        "one": (None, lambda: Ask.listed([urls[n // 3]], "wait")),
        "list": (None, lambda: Ask.listed(listed, "wait")),
        "route": (OWN, lambda: Ask.scoped("route:catalog", "wait")),
        "shadowed": (SHADOWED, lambda: Ask.scoped("route:catalog", "wait")),
    }
    out: dict[str, list[float]] = {k: [] for k in asks}
    for _ in range(runs):
        for key, (routes, ask) in asks.items():
            t = time.perf_counter()
            got = prioritize(Pool(eng, table, routes, None), ask())
            out[key].append(time.perf_counter() - t)
            assert got["matched"] > 0, (key, got)
    return out


def on_shm(n: int, runs: int) -> dict[str, list[float]]:
    name = f"bench-lookups-{n}"
    eng = engine.open(name, create=True, capacity=n + 16)
    try:
        eng.add_many(np.full(n, wall_ms() + 3_600_000), np.full(n, DAY_S), "submitted")
        table = factory.publish_urls(eng, _urls(n))
        try:
            return _timed(eng, table, n, runs)
        finally:
            table.drop()
    finally:
        eng.unlink()


def on_redis(n: int, runs: int) -> dict[str, list[float]]:
    from redis_server import RedisServer

    with RedisServer() as srv:
        eng = engine.open("bench-lookups", srv.url, create=True, capacity=n + 16)
        try:
            table = eng.row_urls()
            urls = _urls(n)
            for start in range(0, n, 10_000):
                part = urls[start:start + 10_000]
                table.add(part, np.full(len(part), wall_ms() + 3_600_000),
                          np.full(len(part), DAY_S), "submitted")
            return _timed(eng, table, n, runs)
        finally:
            eng.row_urls().drop()
            eng.drop()


LABELS = {"one": "one listed URL", "list": "10,000 listed URLs",
          "route": "route:catalog (half the rows; no route before it starts alike)",
          "shadowed": "route:catalog behind a route taking some of its pages"}


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--runs", type=int))
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    runs, n = args.runs or cfg["runs"], cfg["rows"]
    sys.path.insert(0, str(ROOT / "tests" / "lib"))
    from redis_server import find_server

    figures = []
    backends = {"shm": on_shm(n, runs)}
    if find_server() is not None:
        backends["redis"] = on_redis(n, runs)
    for backend, got in backends.items():
        for key, label in LABELS.items():
            figures.append(figure(f"lookups.{backend}.{key}_s", f"{backend}, {n:,} rows: {label}",
                                  "s", got[key]))
    finish("bench_lookups", args, figures, started)


if __name__ == "__main__":
    main()
