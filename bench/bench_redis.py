"""The Redis backend (engine.RedisEngine) beside its peers and the shared-memory engine, in one
run, on a unix socket and on loopback TCP (docs/redis.md, "Figures").

    .venv/bin/python bench/bench_redis.py [--smoke] [--out FILE]

One redis-server (tests/lib/redis_server.py: temp dir, no persistence) listens on both. Per
transport and per run, 1, 2 and 4 client processes, rows/s summed over them:

* RedisEngine: a worker's cycle is ``complete_and_claim`` (complete the batch held, claim up
  to 16 due rows with a lease), one FCALL, on a queue made from the corpus of
  bench/common.py;
* the two Redis peers of bench/bench_servers.py, the same corpus and cycle: the naive Lua
  claim (lanes, floors, leases; two scripts per cycle) and ZPOPMIN (no leases);
* the shared-memory engine with the same cycle (no transport: run once per run);

then a PING round trip against a claim of 16 (p50 each, sampled alternately) with the
server's own time for the claim (SLOWLOG), and Redis ``used_memory`` per row after adding 1M
rows (bench/bench_redis_memory.py; the row holds no URL). The ratios the issue sets as goals
are figures with targets in bench/run_all.py.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from bench_redis_memory import per_row
from bench_servers import LEASE_MS, run_redis_lua, run_redis_zpopmin
from common import (
    BUDGET,
    NOW,
    ROOT,
    corpus,
    corpus_keys,
    drop,
    figure,
    finish,
    new_engine,
    on_exit,
    parse_args,
    ratios,
    run_clients,
)

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from redis_server import RedisServer, free_port  # noqa: E402

from engine import Engine, RedisEngine  # noqa: E402

FULL = {"rows": 100_000, "runs": 3, "seconds": 0.5, "procs": (1, 2, 4),
        "samples": 2000, "memory_rows": 1_000_000}
SMOKE = {"rows": 4_000, "runs": 1, "seconds": 0.1, "procs": (1, 2),
         "samples": 100, "memory_rows": 20_000}
TRANSPORTS = ("unix", "tcp")
QUEUE = "bench"


class Endpoint:
    """The server as one transport sees it: what bench_servers' peers call (``client()``) and
    the URL RedisEngine connects to."""

    def __init__(self, srv: RedisServer, transport: str) -> None:
        self.srv, self.tcp = srv, transport == "tcp"
        self.url = f"redis://127.0.0.1:{srv.port}" if self.tcp else srv.unix_url

    def client(self) -> Any:
        return self.srv.client(tcp=self.tcp)


def cycle(state: list[Any]) -> int:
    """One worker cycle on either engine: complete the batch held and claim the next."""
    eng, held = state
    ok, state[1] = eng.complete_and_claim(held.rows, held.tokens, budget=BUDGET, now_ms=NOW,
                                          lease_ms=LEASE_MS)
    return int(ok.sum())


def _first(eng: Any) -> list[Any]:
    return [eng, eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)]


def fill_queue(ep: Endpoint, n: int) -> None:
    """A fresh queue holding the corpus (the peers' FLUSHALL took the last one)."""
    ep.client().flushall()
    with RedisEngine.connect(ep.url, QUEUE, create=True) as eng:
        eng.add_many(*corpus(n))


def run_redis_engine(ep: Endpoint, n: int, procs: int, seconds: float) -> float:
    fill_queue(ep, n)
    return float(run_clients(procs, seconds, lambda i: _first(RedisEngine.connect(ep.url, QUEUE)),
                             cycle, lambda s: s[0].close(), quota=n // (2 * procs))["total"])


def run_shm_engine(n: int, procs: int, seconds: float) -> float:
    eng = new_engine("redis-side", n)
    name = eng.name
    try:
        return float(run_clients(procs, seconds, lambda i: _first(Engine.attach(name)), cycle,
                                 lambda s: s[0].close(), quota=n // (2 * procs))["total"])
    finally:
        drop(eng)


def latency(ep: Endpoint, n: int, samples: int) -> dict[str, float]:
    """p50 of a PING and of a claim of 16 (sampled alternately, so both see the same machine),
    and the server's own median time for the claim (SLOWLOG, everything logged)."""
    fill_queue(ep, n)
    r = ep.client()
    eng = RedisEngine.connect(ep.url, QUEUE)
    pings, claims = [], []
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", samples + 100)
    r.slowlog_reset()
    for k in range(samples):
        t0 = time.perf_counter_ns()
        r.ping()
        t1 = time.perf_counter_ns()
        got = eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)
        t2 = time.perf_counter_ns()
        pings.append((t1 - t0) / 1e3)
        claims.append((t2 - t1) / 1e3)
        if len(got) < BUDGET and k < samples - 1:
            raise RuntimeError("the queue ran dry: raise rows or lower samples")
    server = [e["duration"] for e in r.slowlog_get(samples + 100)
              if e["command"].startswith(b"FCALL lanes_claim")]
    r.config_set("slowlog-log-slower-than", 10_000)
    eng.close()
    return {"ping": statistics.median(pings), "claim": statistics.median(claims),
            "server": statistics.median(server) if server else float("nan")}


def main() -> None:
    args = parse_args(__doc__)
    started = time.perf_counter()
    c = SMOKE if args.smoke else FULL
    n = c["rows"]
    keys, interval = corpus_keys(n)
    srv = RedisServer(port=free_port(), prefix="rl-bench-redis-").start()
    on_exit(srv.stop)
    version = srv.client().info("server")["redis_version"]  # type: ignore[attr-defined]
    print(f"redis {version}: unix socket {srv.socket}, tcp 127.0.0.1:{srv.port}", flush=True)
    res: dict[tuple[str, str, int], list[float]] = {}
    lat: dict[tuple[str, str], list[float]] = {}
    try:
        for run in range(c["runs"]):
            for p in c["procs"]:
                res.setdefault(("shm", "engine", p), []).append(run_shm_engine(n, p, c["seconds"]))
                for t in TRANSPORTS:
                    ep = Endpoint(srv, t)
                    for sid, fn in (("engine", run_redis_engine),
                                    ("lua", lambda e, n, p, s: run_redis_lua(e, keys, interval,
                                                                             p, s)),
                                    ("zpopmin", lambda e, n, p, s: run_redis_zpopmin(
                                        e, keys, interval, p, s))):
                        res.setdefault((t, sid, p), []).append(fn(ep, n, p, c["seconds"]))
            for t in TRANSPORTS:
                got = latency(Endpoint(srv, t), n, c["samples"])
                for k, v in got.items():
                    lat.setdefault((t, k), []).append(v)
            print(f"run {run + 1}/{c['runs']} done ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    finally:
        srv.stop()
    size = f"{n // 1000}k rows"
    names = {"engine": "RedisEngine complete_and_claim", "lua": "Redis naive Lua claim",
             "zpopmin": "Redis ZPOPMIN (no leases)"}
    figs = []
    for p in c["procs"]:
        figs.append(figure(f"redis.shm.engine.p{p}", f"shared-memory engine complete_and_claim, "
                           f"{p} client, {size}", "rows/s", res[("shm", "engine", p)],
                           better="higher"))
        for t in TRANSPORTS:
            for sid, label in names.items():
                figs.append(figure(f"redis.{t}.{sid}.p{p}", f"{label}, {t}, {p} client, {size}",
                                   "rows/s", res[(t, sid, p)], better="higher",
                                   note=f"server {version}"))
            eng = res[(t, "engine", p)]
            figs.append(figure(f"redis.{t}.ratio_zpopmin.p{p}", f"RedisEngine / ZPOPMIN, {t}, "
                               f"{p} client", "x", ratios(eng, res[(t, "zpopmin", p)]),
                               better="higher"))
            figs.append(figure(f"redis.{t}.ratio_lua.p{p}", f"RedisEngine / naive Lua claim, "
                               f"{t}, {p} client", "x", ratios(eng, res[(t, "lua", p)]),
                               better="higher"))
    for t in TRANSPORTS:
        figs.append(figure(f"redis.{t}.ping_p50_us", f"PING round trip p50, {t}", "µs",
                           lat[(t, "ping")]))
        figs.append(figure(f"redis.{t}.claim_p50_us", f"RedisEngine claim(16) p50, {t}", "µs",
                           lat[(t, "claim")]))
        figs.append(figure(f"redis.{t}.claim_server_us", f"  of which the server (SLOWLOG), {t}",
                           "µs", lat[(t, "server")]))
        figs.append(figure(f"redis.{t}.claim_vs_ping", f"claim p50 / PING p50, {t}", "x",
                           ratios(lat[(t, "claim")], lat[(t, "ping")])))
    mem = c["memory_rows"]
    figs.append(figure(f"redis.bytes_per_row.n{mem}", f"Redis used_memory per row, "
                       f"{mem:,} rows (no URL)", "bytes", [per_row(mem)]))
    finish("bench_redis", args, figs, started)


if __name__ == "__main__":
    main()
