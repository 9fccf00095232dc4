"""Pools as hosts in network namespaces around one redis-server, and the partition oracle.

Shared by ``tests/redis/test_redis_partition.py``, ``tests/chaos/test_partition_chaos.py`` and
``bench/chaos_partition.py``. No pytest import.

``Partitioned`` makes ``hosts`` network namespaces (tests/lib/netns.py), a redis-server in the
root namespace listening on each host's link, and a queue of ``rows`` URLs, all due, each with
an interval of an hour, so that a row needs exactly one applied complete in a run and is never
due again. ``start(k)`` runs ``lanes pool --redis`` inside host ``k`` (a session of its own);
its render (``pool_renders:partition``) logs ``pid row token ms`` and sleeps. ``cut(k)`` and
``heal(k)`` take host ``k``'s link down and up; ``kill(k)`` SIGKILLs its pool whole.

The oracle (``problems``), after every pool was stopped with SIGTERM once nothing was due:

* nothing lost: ``verify()`` is empty, ``rows`` and ``queued`` are the URLs added, nothing in
  flight, and every row was rendered at least once and completed (due again an hour on);
* no completion applied twice: each pool's summary counts its renders R and the leases it
  found lost L (a renew refused, a complete refused); a render's complete is applied unless
  its lease was found lost, and a pool that stops idle releases nothing, so the completes
  applied are R - L per pool, or up to U more where a worker lost its connection after
  sending a complete (its log says "U complete(s) of unknown outcome": sent again, a refusal
  may mean the first was applied). Every row needs one, so summed over the pools
  R - L <= ``rows`` <= R - L + U: past ``rows`` means a row completed twice (a stale token's
  complete accepted);
* no (row, token) rendered twice (a row rendered again was granted again: a new token; a host
  cut off may start a render under its old token after the link heals, and that render's
  complete is refused); each pool stopped cleanly with its invariants holding.

A pool killed whole (``kill``) has no summary: its renders are not counted, so a run with a
kill checks ``applied <= rows`` from the survivors and the rest as above.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

LIB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LIB))
try:
    import engine  # noqa: F401
except ImportError:  # the package may be built in place rather than installed
    sys.path.insert(0, ROOT)

from netns import Hosts  # noqa: E402
from pool_testlib import kill_host, running  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402

from engine import Engine  # noqa: E402
from engine.errors import SegmentMissing  # noqa: E402
from engine.pool.supervisor import remove_local_files  # noqa: E402
from engine.redis.urls import RedisUrls  # noqa: E402

INTERVAL_S = 3600
_UNKNOWN = re.compile(r"(\d+) complete\(s\) of unknown outcome")
_SUMMARY = re.compile(r"(\d+) renders, (\d+) failures, (\d+) released at the stop, "
                      r"(\d+) leases lost")


@dataclass
class Render:
    pool: int  # the supervisor's pid (HostPool.proc.pid)
    pid: int
    row: int
    token: int
    ms: int


@dataclass
class HostPool:
    """One ``lanes pool`` inside host ``k``."""

    k: int
    local: str
    proc: subprocess.Popen[str]
    pids: set[int] = field(default_factory=set)
    out: str = ""
    summary: tuple[int, int, int, int] | None = None  # renders, failures, released, lost
    killed: bool = False


class Partitioned:
    """Hosts in network namespaces sharing one Redis queue (see the module's note)."""

    def __init__(self, hosts: int, rows: int, *, lease_s: float = 1.0, heartbeat_s: float = 1.0,
                 render_s: float = 0.2, workers: int = 2, batch: int = 2) -> None:
        self.n_hosts, self.rows = hosts, rows
        self.lease_s, self.heartbeat_s, self.render_s = lease_s, heartbeat_s, render_s
        self.workers, self.batch = workers, batch
        self.queue = f"rl-part-{uuid.uuid4().hex[:10]}"
        self.hosts = Hosts(hosts)
        self.server: RedisServer | None = None
        self.dir = ""
        self.pools: list[HostPool] = []
        self.cuts: list[tuple[int, int, int]] = []  # (host, cut ms, healed ms or 0)
        self.start_ms = 0

    # -- the set-up ------------------------------------------------------------------------------

    def __enter__(self) -> Partitioned:
        try:
            self.hosts.start()
            links = [self.hosts.server_address(k) for k in range(self.n_hosts)]
            self.server = RedisServer(port=free_port(), extra=(
                "--bind", "127.0.0.1", *links, "--protected-mode", "no")).start()
            self.dir = tempfile.mkdtemp(prefix="rl-part-")
            with open(self.csv, "w") as f:
                f.write("url,interval_s,provenance\n")
                f.writelines(f"https://shop.example/p/{i},{INTERVAL_S},submitted\n"
                             for i in range(self.rows))
            self.start_ms = time.time_ns() // 1_000_000
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def csv(self) -> str:
        return os.path.join(self.dir, "corpus.csv")

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "renders.log")

    def url(self, k: int) -> str:
        """The server as host ``k`` reaches it (over its link)."""
        assert self.server is not None and self.server.port is not None
        return f"redis://{self.hosts.server_address(k)}:{self.server.port}"

    def engine(self) -> Any:
        assert self.server is not None
        return Engine.connect(self.server.url, self.queue)

    def start(self, k: int) -> HostPool:
        """``lanes pool`` inside host ``k`` (the first one up creates the queue)."""
        local = f"rl-part-{uuid.uuid4().hex[:10]}"
        env = {**os.environ, "PYTHONPATH": LIB + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "RL_TEST_RENDER_LOG": self.log, "RL_TEST_RENDER_S": str(self.render_s)}
        argv = [sys.executable, "-m", "engine", "pool", self.queue, "--redis", self.url(k),
                "--corpus", self.csv, "--local-name", local, "--render", "pool_renders:partition",
                "--workers", str(self.workers), "--batch", str(self.batch), "--lease",
                str(self.lease_s), "--heartbeat", str(self.heartbeat_s), "--grace", "5",
                "--plain"]
        proc = subprocess.Popen(self.hosts.command(k, argv), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        pool = HostPool(k, local, proc)
        self.pools.append(pool)
        return pool

    # -- what happens to hosts -------------------------------------------------------------------

    def cut(self, k: int) -> None:
        self.hosts.cut(k)
        self.cuts.append((k, time.time_ns() // 1_000_000, 0))

    def heal(self, k: int) -> None:
        self.hosts.heal(k)
        for i, (host, at, healed) in enumerate(self.cuts):
            if host == k and not healed:
                self.cuts[i] = (host, at, time.time_ns() // 1_000_000)

    def kill(self, pool: HostPool) -> None:
        pool.pids |= process_tree(pool.proc.pid)
        kill_host(pool.proc.pid)
        pool.proc.wait()
        pool.killed = True

    # -- watching --------------------------------------------------------------------------------

    def renders(self) -> list[Render]:
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [Render(*map(int, line.split())) for line in f if line.count(" ") == 4]

    def rendered_by(self, pool: HostPool) -> list[Render]:
        return [r for r in self.renders() if r.pool == pool.proc.pid]

    def settled(self) -> bool:
        """Every row rendered, none due, none in flight (read from the root namespace)."""
        if len({r.row for r in self.renders()}) < self.rows:
            return False
        eng = self.engine()
        try:
            s = eng.stats()
        finally:
            eng.close()
        return s["in_flight"] == 0 and sum(ln["due"] for ln in s["lanes"]) == 0

    def wait(self, cond: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s; pools: "
                                   f"{[p.proc.poll() for p in self.pools]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM every live pool, read its summary."""
        live = [p for p in self.pools if not p.killed and p.proc.poll() is None]
        for p in live:
            p.pids |= process_tree(p.proc.pid)
            p.proc.send_signal(signal.SIGTERM)
        for p in self.pools:
            if p.killed:
                continue
            try:
                p.out, _ = p.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                kill_host(p.proc.pid)
                p.out, _ = p.proc.communicate()
            found = _SUMMARY.search(p.out)
            if found and p.proc.returncode == 0 and "invariants: hold" in p.out:
                p.summary = tuple(int(x) for x in found.groups())  # type: ignore[assignment]

    # -- the oracle ------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What the run broke (empty: nothing); call after ``stop``."""
        out = [f"pool in host {p.k} ended badly ({p.proc.returncode}): {p.out[-1500:]}"
               for p in self.pools if not p.killed and p.summary is None]
        renders = self.renders()
        out += self._final_state({r.row for r in renders})
        by_row: dict[int, list[Render]] = defaultdict(list)
        for r in renders:
            by_row[r.row].append(r)
        for row, rs in by_row.items():
            tokens = [r.token for r in rs]
            if len(set(tokens)) != len(tokens):
                out.append(f"row {row}: a lease rendered twice ({tokens})")
        applied = sum(s[0] - s[3] for p in self.pools if (s := p.summary) is not None)
        unknown = sum(int(n) for p in self.pools for n in _UNKNOWN.findall(p.out))
        released = sum(s[2] for p in self.pools if (s := p.summary) is not None)
        if released:
            out.append(f"{released} rows released at the stop: pools stopped while busy")
        killed = any(p.killed for p in self.pools)
        if applied > self.rows:
            out.append(f"{applied} completes applied for {self.rows} rows (renders minus "
                       "leases lost): a row completed twice")
        elif applied + unknown < self.rows and not killed:
            out.append(f"{applied} completes applied (and {unknown} of unknown outcome) for "
                       f"{self.rows} rows: renders or completes not counted")
        return out

    def _final_state(self, rendered: set[int]) -> list[str]:
        out = []
        eng = self.engine()
        try:
            out += [f"verify: {p}" for p in eng.verify()]
            s = eng.stats()
            if s["rows"] != self.rows or s["queued"] != self.rows or s["in_flight"]:
                out.append(f"rows {s['rows']}, queued {s['queued']}, in flight "
                           f"{s['in_flight']}: {self.rows} rows were added")
            if rendered != set(range(self.rows)):
                out.append(f"rows never rendered: {sorted(set(range(self.rows)) - rendered)}")
            soon = self.start_ms + INTERVAL_S * 1000 // 2
            late = [row for row in range(self.rows) if (eng.due_ms(row) or 0) < soon]
            if late:
                out.append(f"rows never completed (still due): {late[:20]}")
        finally:
            eng.close()
        return out

    # -- the clean-up ----------------------------------------------------------------------------

    def __exit__(self, *exc: object) -> None:
        for k in range(self.n_hosts):
            try:
                self.hosts.heal(k)
            except subprocess.CalledProcessError:
                pass  # never made, or gone with its namespace
        for p in self.pools:
            p.pids |= process_tree(p.proc.pid)
            if p.proc.poll() is None:
                kill_host(p.proc.pid)
                p.proc.communicate()
            remove_local_files(p.local)  # a pool killed whole leaves them
        try:
            if self.server is not None:
                with contextlib.suppress(SegmentMissing):  # the queue's keys, if it was made
                    eng = self.engine()
                    RedisUrls(eng).drop()
                    eng.drop()
                    eng.close()
                self.server.stop()
        finally:
            self.hosts.stop()
            if self.dir:
                for name in os.listdir(self.dir):
                    os.unlink(os.path.join(self.dir, name))
                os.rmdir(self.dir)
        left = running(set().union(*(p.pids for p in self.pools)))
        assert not left, f"processes left behind: {left}"


@dataclass
class ChaosResult:
    seed: int
    cuts: int = 0
    longest_cut_s: float = 0.0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # leases each pool found lost
    unknown: int = 0  # completes whose outcome stayed unknown (sent again)
    rendered_twice: int = 0

    def summary(self) -> str:
        return (f"seed {self.seed}: {self.cuts} cuts (longest {self.longest_cut_s:.1f} s) in "
                f"{self.seconds:.1f} s; leases lost per pool {self.lost}; {self.unknown} "
                f"completes of unknown outcome; {self.rendered_twice} rows rendered more than "
                f"once; problems: {self.problems or 'none'}")


def partition_chaos(run: Partitioned, seconds: float, seed: int) -> ChaosResult:
    """Every host runs a pool; for ``seconds``, at random moments (the first at once, then
    exponential gaps of a lease on average, two leases at most), a host still connected is cut
    off for 1-3 leases, then healed (two at most at once, so some host works on); then every
    link heals, the pools drain the queue and stop, and the oracle runs
    (``Partitioned.problems``). Give it rows enough to outlast the chaos."""
    import random

    rng = random.Random(seed)
    res = ChaosResult(seed)
    for k in range(run.n_hosts):
        run.start(k)
    run.wait(lambda: {r.pool for r in run.renders()} >= {p.proc.pid for p in run.pools}, 90)
    heal_at: dict[int, float] = {}
    t0 = time.monotonic()
    next_cut = t0 + 0.2  # the first cut at once: a short run has one at least
    gap = min(2 * run.lease_s, rng.expovariate(1 / run.lease_s))
    while time.monotonic() - t0 < seconds:
        now = time.monotonic()
        for k, at in list(heal_at.items()):
            if now >= at:
                run.heal(k)
                del heal_at[k]
        if now >= next_cut and len(heal_at) < min(2, run.n_hosts - 1):
            k = rng.choice([h for h in range(run.n_hosts) if h not in heal_at])
            span = rng.uniform(1, 3) * run.lease_s
            run.cut(k)
            heal_at[k] = now + span
            res.cuts += 1
            res.longest_cut_s = max(res.longest_cut_s, span)
            next_cut = now + gap
            gap = min(2 * run.lease_s, rng.expovariate(1 / run.lease_s))
        time.sleep(0.02)
    for k in heal_at:
        run.heal(k)
    res.seconds = time.monotonic() - t0
    run.wait(run.settled, max(120.0, run.rows / 10))
    run.stop()
    res.problems = run.problems()
    res.lost = [p.summary[3] if p.summary else -1 for p in run.pools]
    res.unknown = sum(int(n) for p in run.pools for n in _UNKNOWN.findall(p.out))
    counts: dict[int, int] = defaultdict(int)
    for r in run.renders():
        counts[r.row] += 1
    res.rendered_twice = sum(1 for n in counts.values() if n > 1)
    return res


def process_tree(pid: int) -> set[int]:
    """``pid`` and every process under it now."""
    import psutil

    try:
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def owners_of(run: Partitioned, pool: HostPool) -> set[str]:
    """The owner ids with live leases whose process belongs to ``pool``."""
    eng = run.engine()
    try:
        owners = eng.stats()["owners"]
    finally:
        eng.close()
    return {o for o in owners if int(o.rsplit(":", 2)[1]) in pool.pids}
