"""Prioritize by scope: how long `POST /api/prioritize` takes over a large pool, per backend.

    .venv/bin/python bench/bench_recache.py [--smoke] [--out FILE] [--runs N]

A pool at rest of ROWS rows (half under ``/catalog/``), its URL table published as a pool does,
and :func:`engine.serve.recache.prioritize` called as the server's pool thread calls it, for a
scope over half the rows and one over all of them, mode ``wait`` (a re-run finds the rows due
already, which costs the same). Shared memory at ROWS rows (goal: 1,000,000 rows within 2 s);
Redis (a redis-server this script starts on a unix socket) at REDIS_ROWS rows, since its
``prioritize_many`` is one FCALL a row: the figure says what a row costs there.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT, figure, finish, on_exit, parse_args, skipped

import engine
from engine import factory
from engine.checks import wall_ms
from engine.serve.recache import Ask, Pool, prioritize

FULL = {"rows": 1_000_000, "redis_rows": 100_000, "runs": 3}
SMOKE = {"rows": 20_000, "redis_rows": 2_000, "runs": 1}
SCOPES = {"half": "https://shop.example/catalog/*", "all": "https://shop.example/*"}


def _urls(n: int) -> list[str]:
    return [f"https://shop.example/{'catalog' if i % 2 else 'p'}/{i}" for i in range(n)]


def _timed(eng: object, table: object, runs: int) -> dict[str, list[float]]:
    pool = Pool(eng, table, None, None)
    out: dict[str, list[float]] = {k: [] for k in SCOPES}
    for _ in range(runs):
        for key, scope in SCOPES.items():
            t = time.perf_counter()
            prioritize(pool, Ask.scoped(scope, "wait"))
            out[key].append(time.perf_counter() - t)
    return out


def on_shm(n: int, runs: int) -> dict[str, list[float]]:
    name = f"bench-recache-{n}"
    eng = engine.open(name, create=True, capacity=n + 16)
    try:
        eng.add_many(np.full(n, wall_ms() + 3_600_000), np.full(n, 86_400), "submitted")
        table = factory.publish_urls(eng, _urls(n))
        try:
            return _timed(eng, table, runs)
        finally:
            table.drop()
    finally:
        eng.unlink()


def on_redis(n: int, runs: int) -> dict[str, list[float]]:
    sys.path.insert(0, str(ROOT / "tests" / "lib"))
    from redis_server import RedisServer

    with RedisServer() as srv:
        eng = engine.open("bench-recache", srv.url, create=True, capacity=n + 16)
        try:
            table = eng.row_urls()
            urls = _urls(n)
            for start in range(0, n, 10_000):
                part = urls[start:start + 10_000]
                table.add(part, np.full(len(part), wall_ms() + 3_600_000),
                          np.full(len(part), 86_400), "submitted")
            return _timed(eng, table, runs)
        finally:
            eng.drop()


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--runs", type=int))
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    runs = args.runs or cfg["runs"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-recache-"))
    on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
    figures = []
    shm = on_shm(cfg["rows"], runs)
    for key, values in shm.items():
        rows = cfg["rows"] // (2 if key == "half" else 1)
        figures.append(figure(f"recache.shm.scope_{key}_s", f"shared memory: a scope over"
                              f" {rows:,} of {cfg['rows']:,} rows", "s", values,
                              note="goal: 1,000,000 rows within 2 s"))
    if shutil.which("redis-server") is None:
        figures.append(skipped("recache.redis.scope_all_s", "Redis: a scope", "no redis-server"))
    else:
        red = on_redis(cfg["redis_rows"], runs)
        for key, values in red.items():
            rows = cfg["redis_rows"] // (2 if key == "half" else 1)
            figures.append(figure(f"recache.redis.scope_{key}_s", f"Redis: a scope over"
                                  f" {rows:,} of {cfg['redis_rows']:,} rows", "s", values))
    finish("bench_recache", args, figures, started)


if __name__ == "__main__":
    main()
