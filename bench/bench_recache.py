"""Prioritize by scope: how long `POST /api/prioritize` takes over a large pool, per backend.

    .venv/bin/python bench/bench_recache.py [--smoke] [--out FILE] [--runs N]

A pool at rest of ROWS rows, a new one each run: its rows added as a pool adds them, daily, due
at times spread over the next day as a pool's are once it has rendered for a day, its URL table
published or added as a pool does. Then :func:`engine.serve.recache.prioritize` called as the
server's pool thread calls it, for a scope over all rows, mode ``wait``, twice: the pool at rest
(every row moved from wherever its due time put it), then a re-run (every row found due
already, side by side in ``ready``). Goal: 1,000,000 rows within 2 s on both backends.

On Redis (a redis-server this script starts on a unix socket) the scope is matched and made due
on the server (``lanes_prioritize_prefix`` over the URL index); side by side in each run, the
same scope the way a clear mode takes it, every URL read over the wire first
(``find_prefix``, then ``prioritize_many``), and their ratio; and the server's CPU seconds for
the scope at rest (main thread, ``INFO cpu``), which a loaded machine inflates less than the
wall time, with the shares of it in ZADD and in reading the records, and the scope's median and
longest FCALL (``SLOWLOG``: how long every other client waited). Then the floor: the same
pool put back at rest, and only the moves the scope makes in ``ready`` sent as plain ``ZADD
XX`` commands, a page at a time in the scope's order, timed and in server CPU. Then the scope
over all rows on a queue over 3 shards of a local Redis Cluster, the shards worked in parallel,
with each primary's CPU seconds for it (the slowest one's is what the scope would take were
each on a core of its own; this machine has 2). Also the memory of the URL index (``MEMORY
USAGE``) per row, beside that of the two URL hashes. The server's instructions for a scope,
which a loaded machine does not move: ``profile_recache.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from common import ROOT, figure, finish, parse_args, ratios, skipped

import engine
from engine import factory
from engine.api import IntArray
from engine.checks import wall_ms
from engine.keys import STRIDE
from engine.redis.urls import PREFIX_PAGE, pool_keys
from engine.serve.recache import Ask, Pool, prioritize

FULL = {"rows": 1_000_000, "runs": 3}
SMOKE = {"rows": 20_000, "runs": 1}
SHARDS = 3
"""Shards of the sharded run: a local Redis Cluster needs 3 primaries."""
SCOPE = "https://shop.example/*"
"""The scope timed: every row."""
RUNS = ("rest", "rerun")
"""The scope over all rows on a pool at rest, then again on the same pool."""


def _urls(n: int) -> list[str]:
    return [f"https://shop.example/{'catalog' if i % 2 else 'p'}/{i}" for i in range(n)]


def _timed(fresh: Callable[[], tuple[Any, Any, Callable[[], None]]], runs: int,
           probe: Callable[[Any], Probe] | None = None,
           slowest: Callable[[Any], list[float]] | None = None,
           nodes_cpu: Callable[[], list[float]] | None = None) -> dict[str, list[float]]:
    """Seconds of the scope over all rows per run, on a pool at rest (``fresh``: a new engine,
    its table and what drops them) and re-run. With ``probe`` (Redis), for the scope at rest
    also the server's CPU seconds (what it takes of a core, whatever else the machine runs), the
    shares of its FCALLs' time spent in ZADD (moving the rows in ready) and in reading the
    records, the median and longest FCALL of the scope (``slowest``: the milliseconds of each
    since the last call, from SLOWLOG: how long the server held every other client at once),
    and that scope read over the wire after the re-run, then the moves alone (``_moves_alone``).
    With ``nodes_cpu`` (shards), the most and the total CPU seconds of the scope at rest over the
    servers."""
    extra = ["wire", "cpu", "zadd", "read", "fcall_ms", "fcall_max_ms", "floor",
             "floor_cpu"] if probe else []
    extra += ["node_max_cpu", "nodes_cpu"] if nodes_cpu else []
    out: dict[str, list[float]] = {k: [] for k in [*RUNS, *extra]}
    for _ in range(runs):
        eng, table, drop = fresh()
        try:
            pool = Pool(eng, table, None, None)
            rest = _ready(eng) if probe is not None else []
            for key in RUNS:
                if slowest is not None and key == "rest":
                    slowest(eng)  # emptied: what it holds next is this scope's
                before = probe(eng) if probe is not None else Probe(0, 0, 0, 0)
                was = nodes_cpu() if nodes_cpu is not None else []
                t = time.perf_counter()
                got = prioritize(pool, Ask.scoped(SCOPE, "wait"))
                out[key].append(time.perf_counter() - t)
                assert got["matched"] == len(table), got
                if nodes_cpu is not None and key == "rest":
                    took = [b - a for a, b in zip(was, nodes_cpu(), strict=True)]
                    out["node_max_cpu"].append(max(took))
                    out["nodes_cpu"].append(sum(took))
                if probe is not None and key == "rest":
                    after = probe(eng)
                    fcalls = max(1.0, after.fcall_us - before.fcall_us)
                    out["cpu"].append(after.cpu_s - before.cpu_s)
                    out["zadd"].append((after.zadd_us - before.zadd_us) / fcalls)
                    out["read"].append((after.read_us - before.read_us) / fcalls)
                    if slowest is not None:
                        each = slowest(eng)
                        out["fcall_ms"].append(float(np.median(each)))
                        out["fcall_max_ms"].append(max(each))
            if probe is not None:
                t = time.perf_counter()
                rows, _ = table.find_prefix(SCOPE[:-1])
                eng.prioritize_many(rows, "wait")
                out["wire"].append(time.perf_counter() - t)
                floor = _moves_alone(eng, table, rest, probe)
                out["floor"].append(floor[0])
                out["floor_cpu"].append(floor[1])
        finally:
            drop()
    return out


def _ready(eng: Any) -> list[tuple[bytes, float]]:
    """Every (member, score) of a Redis queue's ``ready``."""
    return [(bytes(m), float(k)) for m, k in
            eng.transport.live().zrange(eng.keys[0], 0, -1, withscores=True)]


def _moves_alone(eng: Any, table: Any, rest: list[tuple[bytes, float]],
                 probe: Callable[[Any], Probe]) -> tuple[float, float]:
    """The floor of a scope over all rows at rest on one server: ``ready`` put back as it was
    at rest (``rest``, untimed), then each row moved where mode ``wait`` moves it (its own lane,
    due now) by plain ``ZADD XX`` commands of PREFIX_PAGE rows, in the scope's order (its URLs'
    byte order), and nothing else. Seconds, and the server's CPU seconds."""
    client, ready = eng.transport.live(), eng.keys[0]
    for i in range(0, len(rest), PREFIX_PAGE):
        client.zadd(ready, dict(rest[i:i + PREFIX_PAGE]), xx=True)
    lane = {m: int(k) // STRIDE for m, k in rest}
    members = [bytes(m)[-8:] for m in client.zrange(pool_keys(eng.name)[3], b"-", b"+",
                                                    bylex=True)]
    assert len(members) == len(rest) == len(table)
    now = wall_ms()
    before, t = probe(eng), time.perf_counter()
    for i in range(0, len(members), PREFIX_PAGE):
        client.zadd(ready, {m: lane[m] * STRIDE + now
                            for m in members[i:i + PREFIX_PAGE]}, xx=True)
    return time.perf_counter() - t, probe(eng).cpu_s - before.cpu_s


class Probe(NamedTuple):
    """A Redis server's counters: main-thread CPU seconds, and the microseconds spent in ZADD
    (within the functions too), in the reads of records (GETRANGE, BITFIELD_RO) and in FCALL
    (``INFO cpu``, ``INFO commandstats``)."""

    cpu_s: float
    zadd_us: float
    read_us: float
    fcall_us: float


def _dues(n: int, seed: int) -> IntArray:
    """Due times of a pool at rest: its rows rendered through a day, each due a day later."""
    return wall_ms() + np.random.default_rng(seed).integers(60_000, 86_400_000, n)


def on_shm(n: int, runs: int) -> dict[str, list[float]]:
    name, seed = f"bench-recache-{n}", iter(range(runs))

    def fresh() -> tuple[Any, Any, Callable[[], None]]:
        eng = engine.open(name, create=True, capacity=n + 16)
        eng.add_many(_dues(n, next(seed)), np.full(n, 86_400), "submitted")
        table = factory.publish_urls(eng, _urls(n))

        def drop() -> None:
            table.drop()
            eng.unlink()
        return eng, table, drop

    return _timed(fresh, runs)


def on_redis(n: int, runs: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    sys.path.insert(0, str(ROOT / "tests" / "lib"))
    from redis_server import RedisServer

    memory: dict[str, float] = {}
    with RedisServer() as srv:
        seed = iter(range(runs))

        def fresh() -> tuple[Any, Any, Callable[[], None]]:
            eng = engine.open("bench-recache", srv.url, create=True, capacity=n + 16)
            table = eng.row_urls()
            _fill(table, n, next(seed))
            if not memory:
                client, by_key = eng.transport.live(), pool_keys(eng.name)
                memory.update({what: int(client.memory_usage(key, samples=0)) / n
                               for what, key in (("index", by_key[3]), ("urls", by_key[0]),
                                                 ("url_rows", by_key[1]))})

            def drop() -> None:
                table.drop()
                eng.drop()
            return eng, table, drop

        def probe(eng: Any) -> Probe:
            client = eng.transport.live()
            cpu, calls = client.info("cpu"), client.info("commandstats")

            def usec(cmd: str) -> float:
                return float(calls.get(f"cmdstat_{cmd}", {}).get("usec", 0))

            return Probe(float(cpu["used_cpu_user_main_thread"]
                               + cpu["used_cpu_sys_main_thread"]), usec("zadd"),
                         usec("getrange") + usec("bitfield_ro"), usec("fcall"))

        # Every FCALL into the slow log (up to 1,024 kept: a scope of 1,000,000 rows makes
        # 201), read and emptied after each scope.
        client = srv.client()
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 1024)

        def slowest(eng: Any) -> list[float]:
            client = eng.transport.live()
            got = [e["duration"] / 1000 for e in client.slowlog_get(1024)
                   if bytes(e["command"]).startswith(b"FCALL lanes_prioritize_prefix")]
            client.slowlog_reset()
            return got or [0.0]

        return _timed(fresh, runs, probe, slowest), memory


def _fill(table: Any, n: int, seed: int) -> None:
    """Add the ROWS URLs as a pool adds them, daily, due as a pool at rest is (``_dues``)."""
    urls, dues = _urls(n), _dues(n, seed)
    for start in range(0, n, 10_000):
        part = urls[start:start + 10_000]
        table.add(part, dues[start:start + 10_000], np.full(len(part), 86_400), "submitted")


def on_shards(n: int, runs: int) -> dict[str, list[float]]:
    """Seconds of the scope over all rows (at rest, then re-run) on a queue over SHARDS shards,
    each on its own primary of a local Redis Cluster: the shards are worked in parallel from
    the client."""
    sys.path.insert(0, str(ROOT / "tests" / "lib"))
    from redis_server import LocalCluster

    with LocalCluster(SHARDS) as cluster:
        seed = iter(range(runs))

        def fresh() -> tuple[Any, Any, Callable[[], None]]:
            # A bound per shard; the URLs' hashes fill the shards a little unevenly.
            eng = engine.open("bench-recache", cluster.url, create=True, capacity=2 * n,
                              shards=SHARDS)
            table = eng.row_urls()
            _fill(table, n, next(seed))

            def drop() -> None:
                table.drop()
                eng.drop()
            return eng, table, drop

        def nodes_cpu() -> list[float]:
            cpus = [node.client().info("cpu") for node in cluster.nodes]
            return [float(c["used_cpu_user_main_thread"] + c["used_cpu_sys_main_thread"])
                    for c in cpus]

        return _timed(fresh, runs, nodes_cpu=nodes_cpu)


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--runs", type=int))
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    runs, n = args.runs or cfg["runs"], cfg["rows"]
    goal = "goal: 1,000,000 rows within 2 s"
    figures = []
    rest = f"a scope over all {n:,} rows of a pool at rest"
    again = f"the same scope again (its {n:,} rows due already)"
    shm = on_shm(n, runs)
    figures.append(figure("recache.shm.scope_all_s", f"shared memory: {rest}", "s", shm["rest"],
                          note=goal))
    figures.append(figure("recache.shm.scope_rerun_s", f"shared memory: {again}", "s",
                          shm["rerun"]))
    sys.path.insert(0, str(ROOT / "tests" / "lib"))
    from redis_server import find_server

    if find_server() is None:
        figures.append(skipped("recache.redis.scope_all_s", "Redis: a scope", "no redis-server"))
    else:
        red, memory = on_redis(n, runs)
        figures.append(figure("recache.redis.scope_all_s", f"Redis: {rest}, matched on the"
                              " server", "s", red["rest"], note=goal))
        figures.append(figure("recache.redis.scope_rerun_s", f"Redis: {again}", "s",
                              red["rerun"]))
        figures.append(figure("recache.redis.scope_all_server_cpu_s", f"Redis: the server's"
                              f" CPU seconds for {rest}", "s", red["cpu"],
                              note=goal + " (the wall time on a quiet machine)"))
        figures.append(figure("recache.redis.scope_all_zadd_share", "Redis: the share of the"
                              " scope's FCALL time spent in ZADD (the rest: the Lua that reads"
                              " the pages and the records)", "x", red["zadd"]))
        figures.append(figure("recache.redis.scope_all_read_share", "Redis: the share of the"
                              " scope's FCALL time spent reading the rows' records (GETRANGE,"
                              " BITFIELD_RO)", "x", red["read"]))
        figures.append(figure("recache.redis.scope_all_fcall_median_ms", "Redis: the scope's"
                              f" FCALLs ({PREFIX_PAGE:,} URLs each), median", "ms",
                              red["fcall_ms"]))
        figures.append(figure("recache.redis.scope_all_fcall_max_ms", "Redis: the scope's"
                              " longest FCALL (the server held every other client that long)",
                              "ms", red["fcall_max_ms"]))
        figures.append(figure("recache.redis.moves_alone_s", f"Redis: the floor of {rest}: only"
                              " its moves in ready, as plain ZADD XX commands from the client",
                              "s", red["floor"]))
        figures.append(figure("recache.redis.moves_alone_server_cpu_s", "Redis: the server's CPU"
                              " seconds for those moves alone", "s", red["floor_cpu"]))
        figures.append(figure("recache.redis.moves_alone_over_scope_cpu", "Redis: the server's"
                              " CPU for the moves alone ÷ for the scope at rest, same run", "x",
                              ratios(red["floor_cpu"], red["cpu"]), better="higher"))
        figures.append(figure("recache.redis.wire_all_s", f"Redis: the scope over all {n:,}"
                              " rows due already with every URL read over the wire"
                              " (find_prefix, then prioritize_many)", "s", red["wire"]))
        figures.append(figure("recache.redis.wire_over_server", "Redis: URLs over the wire ÷"
                              " matched on the server, same rows due already, same run", "x",
                              ratios(red["wire"], red["rerun"]), better="higher"))
        figures.append(figure("recache.redis_over_shm.scope_all", "a scope over all rows at"
                              " rest: Redis ÷ shared memory", "x",
                              ratios(red["rest"], shm["rest"])))
        sharded = on_shards(n, runs)
        figures.append(figure("recache.redis_sharded.scope_all_s", f"Redis over {SHARDS} shards"
                              f" (a local cluster, {SHARDS} primaries): {rest}, the shards in"
                              " parallel", "s", sharded["rest"], note=goal))
        figures.append(figure("recache.redis_sharded.scope_all_node_max_cpu_s", f"Redis over"
                              f" {SHARDS} shards: the busiest primary's CPU seconds for {rest}",
                              "s", sharded["node_max_cpu"], note=goal + " (the wall time with"
                              " each primary on a core of its own)"))
        figures.append(figure("recache.redis_sharded.scope_all_nodes_cpu_s", f"Redis over"
                              f" {SHARDS} shards: the primaries' CPU seconds in all for {rest}",
                              "s", sharded["nodes_cpu"]))
        figures.append(figure("recache.redis_sharded.scope_rerun_s", f"Redis over {SHARDS}"
                              f" shards: {again}", "s", sharded["rerun"]))
        figures.append(figure("recache.redis_sharded_over_shm.scope_all", f"a scope over all"
                              f" rows at rest: Redis over {SHARDS} shards ÷ shared memory", "x",
                              ratios(sharded["rest"], shm["rest"])))
        for what, per_row in memory.items():
            figures.append(figure(f"recache.redis.{what}_bytes_per_row", f"Redis: MEMORY USAGE"
                                  f" of the {what} key ÷ rows", "bytes", [per_row]))
    finish("bench_recache", args, figures, started)


if __name__ == "__main__":
    main()
