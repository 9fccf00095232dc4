"""Peers a team would otherwise deploy: Redis and PostgreSQL, beside the engine, in the same run.

    .venv/bin/python bench/bench_servers.py [--smoke] [--out FILE]

Each server is started by this script for this run only — Redis on a unix socket in a temp
dir with no persistence, PostgreSQL as a throwaway cluster in a temp dir (run as `nobody`, as
it refuses root) on a unix socket — and stopped and removed afterwards, also on Ctrl-C. A server
that cannot be started is reported as skipped with the reason; nothing is ever estimated.

Same corpus (200k rows, the engine's keys over the default policy's lanes), same worker cycle
(claim up to 16 due rows with a lease, complete them rescheduled to now + interval), 1 and 2
client processes, rows/s summed over the clients; the engine runs the same cycle in the same
run and every ratio is engine / peer from side-by-side runs.

* Redis, lanes: one sorted set scored by the engine key (exact: keys stay below 2**53), a Lua
  script per claim with the engine's semantics — lanes in order, per-lane floor (a hash;
  the seek starts there and rises to the first row seen, a leased row holding it), window 140,
  leases with expiry and a token per row; a second script completes with a token check. Shares
  are not modelled (lane order only).
* Redis, ZPOPMIN: the textbook composite-score queue: ZPOPMIN 16, then ZADD them back at their
  new scores. No leases: a client that dies loses its rows.
* PostgreSQL: table with an index on (lane, due); claim = one UPDATE ... WHERE id IN (SELECT ...
  ORDER BY lane, due LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING, setting the lease and bumping
  the token (one transaction); complete = one UPDATE over the batch checking each token.
  Cluster settings favour the server: fsync, synchronous_commit and full_page_writes off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    BUDGET,
    LANES,
    NOW,
    corpus_keys,
    drop,
    figure,
    finish,
    new_engine,
    on_exit,
    parse_args,
    ratios,
    run_clients,
    skipped,
)

from engine import STRIDE, Engine

FULL = {"rows": 200_000, "runs": 3, "seconds": 1.0, "procs": (1, 2)}
SMOKE = {"rows": 5_000, "runs": 1, "seconds": 0.15, "procs": (1, 2)}
LEASE_MS = 600_000
WINDOW = 140


class Unavailable(Exception):
    """The peer cannot run here; the message says why."""


# ----------------------------------------------------------------------------------- Redis ----

CLAIM_LUA = """
-- KEYS: queue (zset row -> key), lease (hash row -> expiry ms), tok (hash row -> token),
--       floor (hash lane -> key); ARGV: budget, now, lease_ms, window, lanes, stride
local budget, now, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window, lanes, stride = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
local n = 0
for lane = 0, lanes - 1 do
  if n >= budget then break end
  local base = lane * stride
  local fl = redis.call('HGET', KEYS[4], lane) or string.format('%.0f', base)
  local cands = redis.call('ZRANGEBYSCORE', KEYS[1], fl, string.format('%.0f', base + now),
                           'WITHSCORES', 'LIMIT', 0, window)
  if #cands > 0 then redis.call('HSET', KEYS[4], lane, cands[2]) end  -- first row holds it
  for i = 1, #cands, 2 do
    local row = cands[i]
    local exp = tonumber(redis.call('HGET', KEYS[2], row) or '0')
    if exp < now then
      redis.call('HSET', KEYS[2], row, now + lease_ms)
      out[#out + 1] = row
      out[#out + 1] = redis.call('HINCRBY', KEYS[3], row, 1)
      n = n + 1
      if n >= budget then break end
    end
  end
end
return out
"""

COMPLETE_LUA = """
-- KEYS: queue, lease, tok, floor, interval (hash row -> ms); ARGV: now, stride, row, token, ...
local now, stride = tonumber(ARGV[1]), tonumber(ARGV[2])
local done = 0
for i = 3, #ARGV, 2 do
  local row, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[3], row) == token then
    local key = tonumber(redis.call('ZSCORE', KEYS[1], row))
    local lane = math.floor(key / stride)
    local nk = lane * stride + now + tonumber(redis.call('HGET', KEYS[5], row))
    redis.call('ZADD', KEYS[1], string.format('%.0f', nk), row)
    redis.call('HDEL', KEYS[2], row)
    redis.call('HINCRBY', KEYS[3], row, 1)
    local fl = redis.call('HGET', KEYS[4], lane)  -- a write below the floor lowers it
    if fl and nk < tonumber(fl) then
      redis.call('HSET', KEYS[4], lane, string.format('%.0f', nk))
    end
    done = done + 1
  end
end
return done
"""
RKEYS = ["q", "lease", "tok", "floor", "interval"]


class RedisServer:
    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            raise Unavailable("redis-server is not installed (make bench installs Debian's "
                              "redis-server when it can)")
        self.dir = tempfile.mkdtemp(prefix="rl-bench-redis-")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            [exe, "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        on_exit(self.stop)
        import redis
        deadline = time.time() + 10
        while True:
            try:
                redis.Redis(unix_socket_path=self.sock).ping()
                break
            except Exception as exc:
                if self.proc.poll() is not None or time.time() > deadline:
                    log = Path(self.dir, "redis.log")
                    tail = log.read_text()[-300:] if log.exists() else ""
                    self.stop()
                    raise Unavailable(f"redis-server did not start: {exc} {tail}") from None
                time.sleep(0.05)
        self.version = redis.Redis(unix_socket_path=self.sock).info()["redis_version"]

    def client(self) -> Any:
        import redis
        return redis.Redis(unix_socket_path=self.sock)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_load(r: Any, keys: np.ndarray, interval: np.ndarray) -> None:
    r.flushall()
    for lo in range(0, len(keys), 20_000):
        hi = min(len(keys), lo + 20_000)
        r.zadd("q", {str(i): float(keys[i]) for i in range(lo, hi)})
        r.zadd("pq", {str(i): float(keys[i]) for i in range(lo, hi)})
        r.hset("interval", mapping={str(i): int(interval[i]) for i in range(lo, hi)})


def run_redis_lua(srv: RedisServer, keys: np.ndarray, interval: np.ndarray, procs: int,
                  seconds: float) -> float:
    r = srv.client()
    redis_load(r, keys, interval)
    claim_sha = r.script_load(CLAIM_LUA)
    complete_sha = r.script_load(COMPLETE_LUA)

    def step(r: Any) -> int:
        got = r.evalsha(claim_sha, 4, *RKEYS[:4], BUDGET, NOW, LEASE_MS, WINDOW, LANES, STRIDE)
        if not got:
            return 0
        return int(r.evalsha(complete_sha, 5, *RKEYS, NOW, STRIDE, *got))

    return float(run_clients(procs, seconds, lambda i: srv.client(), step,
                             quota=len(keys) // (2 * procs))["total"])


def run_redis_zpopmin(srv: RedisServer, keys: np.ndarray, interval: np.ndarray, procs: int,
                      seconds: float) -> float:
    r = srv.client()
    redis_load(r, keys, interval)
    iv = interval.tolist()

    def step(r: Any) -> int:
        got = r.zpopmin("pq", BUDGET)
        if not got:
            return 0
        back = {}
        for member, score in got:
            row = int(member)
            back[member] = float((int(score) // STRIDE) * STRIDE + NOW + iv[row])
        r.zadd("pq", back)
        return len(got)

    return float(run_clients(procs, seconds, lambda i: srv.client(), step,
                             quota=len(keys) // (2 * procs))["total"])


# ------------------------------------------------------------------------------ PostgreSQL ----

def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        if shutil.which("initdb"):
            return Path(shutil.which("initdb")).parent  # type: ignore[arg-type]
        raise Unavailable("PostgreSQL server binaries not found (make bench installs Debian's "
                          "postgresql when it can)")
    return found[-1].parent


class PostgresServer:
    def __init__(self) -> None:
        bindir = _pg_bin()
        self.dir = tempfile.mkdtemp(prefix="rl-bench-pg-")
        self.data = os.path.join(self.dir, "data")
        self.pg_ctl = str(bindir / "pg_ctl")
        self.started = False
        as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            runuser = shutil.which("runuser")
            if not runuser:
                raise Unavailable("running as root and runuser is missing, so PostgreSQL "
                                  "cannot be started as an unprivileged user")
            os.chown(self.dir, 65534, 65534)  # nobody
            os.chmod(self.dir, 0o700)
            as_user = [runuser, "-u", "nobody", "--"]
        self.as_user = as_user
        on_exit(self.stop)
        opts = ("-c listen_addresses='' -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c shared_buffers=256MB -c max_connections=20 "
                f"-k {self.dir}")
        try:
            self._run([str(bindir / "initdb"), "-D", self.data, "-U", "bench", "--auth=trust",
                       "-E", "UTF8", "--no-sync"])
            self._run([self.pg_ctl, "-D", self.data, "-o", opts, "-l",
                       os.path.join(self.dir, "log"), "-w", "-t", "30", "start"])
            self.started = True
        except subprocess.CalledProcessError as exc:
            msg = (exc.stderr or b"").decode(errors="replace").strip()[-300:]
            log = Path(self.dir, "log")
            if log.exists():
                msg += " " + log.read_text(errors="replace")[-300:]
            self.stop()
            raise Unavailable(f"PostgreSQL did not start: {msg}") from None
        with self.connect() as c:
            self.version = c.execute("show server_version").fetchone()[0]

    def _run(self, cmd: list[str]) -> None:
        subprocess.run(self.as_user + cmd, check=True, capture_output=True, timeout=120,
                       cwd=self.dir)

    def connect(self) -> Any:
        import psycopg
        return psycopg.connect(host=self.dir, user="bench", dbname="postgres", autocommit=True,
                               prepare_threshold=0)

    def stop(self) -> None:
        if self.started:
            try:
                self._run([self.pg_ctl, "-D", self.data, "-m", "immediate", "-w", "stop"])
            except Exception as exc:
                print(f"pg_ctl stop: {exc}")
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


PG_CLAIM = """
UPDATE jobs j SET lease_until = %(now)s + %(lease)s, token = j.token + 1
FROM (SELECT id FROM jobs WHERE due <= %(now)s AND lease_until < %(now)s
      ORDER BY lane, due LIMIT %(budget)s FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id
RETURNING j.id, j.token
"""
PG_COMPLETE = """
UPDATE jobs j SET due = %(now)s + j.interval_ms, lease_until = 0, token = j.token + 1
FROM unnest(%(ids)s::int[], %(toks)s::bigint[]) AS t(id, tok)
WHERE j.id = t.id AND j.token = t.tok
"""


def pg_load(srv: PostgresServer, keys: np.ndarray, interval: np.ndarray) -> None:
    with srv.connect() as c:
        c.execute("DROP TABLE IF EXISTS jobs")
        c.execute("CREATE TABLE jobs (id int PRIMARY KEY, lane int NOT NULL, due bigint NOT NULL,"
                  " interval_ms bigint NOT NULL, lease_until bigint NOT NULL DEFAULT 0,"
                  " token bigint NOT NULL DEFAULT 0)")
        lanes, due = keys // STRIDE, keys % STRIDE
        with c.cursor() as cur, cur.copy("COPY jobs (id, lane, due, interval_ms) FROM STDIN") as cp:
            for i in range(len(keys)):
                cp.write_row((i, int(lanes[i]), int(due[i]), int(interval[i])))
        c.execute("CREATE INDEX jobs_lane_due ON jobs (lane, due)")
        c.execute("VACUUM ANALYZE jobs")


def run_postgres(srv: PostgresServer, keys: np.ndarray, interval: np.ndarray, procs: int,
                 seconds: float) -> float:
    pg_load(srv, keys, interval)
    params = {"now": NOW, "lease": LEASE_MS, "budget": BUDGET}

    def step(c: Any) -> int:
        got = c.execute(PG_CLAIM, params).fetchall()
        if not got:
            return 0
        ids = [g[0] for g in got]
        toks = [g[1] for g in got]
        return int(c.execute(PG_COMPLETE, {"now": NOW, "ids": ids, "toks": toks}).rowcount)

    return float(run_clients(procs, seconds, lambda i: srv.connect(), step,
                             lambda c: c.close(), quota=len(keys) // (2 * procs))["total"])


# ----------------------------------------------------------------------------------- main ----

def run_engine(n: int, procs: int, seconds: float) -> float:
    eng = new_engine("srv", n)
    name = eng.name
    try:
        def step(e: Engine) -> int:
            b = e.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)
            return int(e.complete_many(b.rows, b.tokens, now_ms=NOW).sum()) if len(b) else 0

        return float(run_clients(procs, seconds, lambda i: Engine.attach(name), step,
                                 lambda e: e.close(), quota=n // (2 * procs))["total"])
    finally:
        drop(eng)


def _round_trips(call: Any, rounds: int = 5, each: int = 200) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(each):
            call()
        out.append((time.perf_counter() - t0) / each * 1e6)
    return out


def main() -> None:
    args = parse_args(__doc__)
    started = time.perf_counter()
    c = SMOKE if args.smoke else FULL
    keys, interval = corpus_keys(c["rows"])
    peers: dict[str, Any] = {}
    why: dict[str, str] = {}
    for pid, cls in (("redis", RedisServer), ("postgres", PostgresServer)):
        try:
            peers[pid] = cls()
            print(f"{pid}: started ({peers[pid].version})", flush=True)
        except Unavailable as exc:
            why[pid] = str(exc)
            print(f"{pid}: SKIPPED: {exc}", flush=True)
    rtt: dict[str, list[float]] = {}  # what one round trip costs on this machine, for context
    if "redis" in peers:
        rtt["redis"] = _round_trips(peers["redis"].client().ping)
    if "postgres" in peers:
        with peers["postgres"].connect() as conn:
            rtt["postgres"] = _round_trips(lambda: conn.execute("SELECT 1").fetchone())
    systems = [("engine", lambda p, s: run_engine(c["rows"], p, s))]
    if "redis" in peers:
        systems += [("redis_lua", lambda p, s: run_redis_lua(peers["redis"], keys, interval, p, s)),
                    ("redis_zpopmin",
                     lambda p, s: run_redis_zpopmin(peers["redis"], keys, interval, p, s))]
    if "postgres" in peers:
        systems += [("postgres", lambda p, s: run_postgres(peers["postgres"], keys, interval,
                                                           p, s))]
    res: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(c["runs"]):
            for p in c["procs"]:
                for sid, fn in systems:
                    res.setdefault((sid, p), []).append(fn(p, c["seconds"]))
    finally:
        for srv in peers.values():
            srv.stop()
    names = {"engine": "render-lanes", "redis_lua": "Redis Lua claim (lanes, floors, leases)",
             "redis_zpopmin": "Redis ZPOPMIN (no leases)",
             "postgres": "PostgreSQL FOR UPDATE SKIP LOCKED"}
    owner = {"redis_lua": "redis", "redis_zpopmin": "redis", "postgres": "postgres"}
    rows = f"{c['rows'] // 1000}k"
    figs = []
    for p in c["procs"]:
        for sid in names:
            fid = f"servers.{sid}.p{p}"
            label = f"{names[sid]}, {p} client, {rows} rows: claim(16) + complete"
            if sid != "engine" and owner[sid] in why:
                figs.append(skipped(fid, label, why[owner[sid]], "rows/s"))
                figs.append(skipped(f"servers.ratio_{sid}.p{p}", f"render-lanes / {names[sid]},"
                                    f" {p} client", why[owner[sid]], "x"))
                continue
            note = "" if sid == "engine" else f"server {peers[owner[sid]].version}"
            figs.append(figure(fid, label, "rows/s", res[(sid, p)], better="higher", note=note))
            if sid != "engine":
                figs.append(figure(f"servers.ratio_{sid}.p{p}",
                                   f"render-lanes / {names[sid]}, {p} client", "x",
                                   ratios(res[("engine", p)], res[(sid, p)]), better="higher"))
    for pid, what in (("redis", "Redis PING"), ("postgres", "PostgreSQL SELECT 1")):
        if pid in why:
            figs.append(skipped(f"servers.{pid}_round_trip_us", f"{what} round trip", why[pid],
                                "µs"))
        else:
            figs.append(figure(f"servers.{pid}_round_trip_us", f"{what} round trip, 1 client "
                               "(context: each claim + complete is two)", "µs", rtt[pid]))
    finish("bench_servers", args, figs, started)


if __name__ == "__main__":
    main()
