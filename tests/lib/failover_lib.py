"""A primary SIGKILLed under running pools: the runner and what it measures.

Shared by ``tests/redis/test_redis_failover.py``, ``tests/chaos/test_failover_chaos.py`` (the
CI forms) and ``bench/bench_failover.py`` (several kills, medians and ranges). No pytest import.

How it works
------------
* A *target* is a Redis deployment that can lose its primary: :class:`SentinelTarget` (a
  standalone primary, its replica, three Sentinels; the URL is ``redis+sentinel://``) or
  :class:`ClusterTarget` (a cluster with one replica per primary; the URL names a node that is
  never killed). ``fail_over`` SIGKILLs the primary serving the queue and waits until its
  replica serves it; ``rejoin`` restarts the killed server as the new primary's replica, as an
  operator (or an orchestrator) would, and waits until it is in sync.
* ``pools`` pools, ``lanes pool QUEUE --redis URL --corpus FILE [--wait-replicas N]``, real
  processes, render with :func:`render`: it sleeps ``RL_FAILOVER_RENDER_MS`` and appends
  ``<unix time> <pid> <row>`` to the log. Every row's interval is an hour, so in a run each row
  is rendered once, and a second render of a row is a render the failover made again: its
  complete was lost (acknowledged on the old primary and never replicated, or sent when the
  primary died), or its worker died of an ``OutcomeUnknown`` before completing.
* A *probe* (a thread of the runner, its own queue on the same primary, the same URL) adds one
  URL, claims one row and completes it with a due date years ahead, in a loop, and notes every
  write the server acknowledged, the outcomes it never learned, and each call's latency.
* Each kill: the pools and the probe run ``before_s``; the primary is killed; the replica takes
  over; the killed server rejoins; they run ``after_s`` more (longer than a lease, so rows
  whose lease was lost come back). Then the pools stop (SIGTERM) and the checks run.

What it reports (:class:`FailoverResult`)
-----------------------------------------
* ``failover_s``: per kill, from the SIGKILL until the replica serves the queue.
* ``stalls``: per kill, the longest time no pool started a render, from the kill on;
  ``probe_stalls``: the longest time the probe had no acknowledged call.
* ``rerenders``: renders beyond a row's first (``rerenders_per_kill``: those that began between
  a kill and the next).
* ``lost``, ``verify``, ``drain_dups``, ``stranded``: ``redis_chaos_lib.final_checks`` on the
  pools' queue (every corpus row queued, its URL mapped both ways, ``verify()`` empty, a drain
  returns every row once).
* ``acked_adds_lost`` / ``acked_completes_lost``: probe writes the server acknowledged that the
  new primary does not hold (the add's URL is unknown; the completed row is not due years
  ahead), of ``acked_adds`` / ``acked_completes``; ``unknown``: calls that raised
  ``OutcomeUnknown`` (lost connection, or fewer replicas than asked acknowledged in time).
* ``claim_ms`` / ``complete_ms`` / ``add_ms``: the probe's call latencies before the first kill
  (p50, p99).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

LIB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LIB))
try:
    import engine  # noqa: F401
except ImportError:  # the package may be built in place rather than installed
    sys.path.insert(0, ROOT)

from pool_testlib import kill_host  # noqa: E402
from redis_chaos_lib import RedisChaosResult, final_checks  # noqa: E402
from redis_server import LocalCluster, RedisServer, SentinelGroup  # noqa: E402

from engine import Engine  # noqa: E402
from engine.errors import EngineError, OutcomeUnknown  # noqa: E402
from engine.pool.supervisor import remove_local_files  # noqa: E402
from engine.redis.codec import queue_keys  # noqa: E402
from engine.redis.urls import RedisUrls, pool_keys  # noqa: E402

HOUR_S = 3600
FAR_MS = 10 * 365 * 86_400_000  # a completed probe row is due this far ahead


def render(url: str, claim: Any) -> None:
    """Sleep ``RL_FAILOVER_RENDER_MS``; log ``<unix time> <pid> <row>`` (one write per line)."""
    t = time.time()
    time.sleep(float(os.environ.get("RL_FAILOVER_RENDER_MS", "10")) / 1000)
    fd = os.open(os.environ["RL_TEST_RENDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{t:.6f} {os.getpid()} {claim.row}\n".encode())
    finally:
        os.close(fd)


# ============================================================================== targets =====


class Target(Protocol):
    url: str

    def start(self) -> Target: ...
    def stop(self) -> None: ...
    def probe_name(self, queue: str) -> str: ...
    def fail_over(self, queue: str) -> RedisServer: ...
    def rejoin(self, node: RedisServer) -> None: ...


class SentinelTarget:
    """A standalone primary and its replica under three Sentinels."""

    def __init__(self) -> None:
        self.group = SentinelGroup(service=f"rl-{uuid.uuid4().hex[:8]}")
        self.url = self.group.url

    def start(self) -> SentinelTarget:
        self.group.start()
        return self

    def stop(self) -> None:
        self.group.stop()

    def probe_name(self, queue: str) -> str:
        return f"{queue}-probe"

    def fail_over(self, queue: str) -> RedisServer:
        return self.group.fail_over()[0]

    def rejoin(self, node: RedisServer) -> None:
        self.group.rejoin(node)


class ClusterTarget:
    """Three primaries with ``replicas`` replicas each; cluster-node-timeout
    ``node_timeout_ms``."""

    def __init__(self, node_timeout_ms: int = 1000, replicas: int = 1) -> None:
        self.cluster = LocalCluster(3, replicas=replicas, node_timeout_ms=node_timeout_ms)
        self.url = ""

    def start(self) -> ClusterTarget:
        self.cluster.start()
        return self

    def stop(self) -> None:
        self.cluster.stop()

    def home(self, queue: str) -> int:
        return self.cluster.node_of(queue_keys(queue)[0])

    def probe_name(self, queue: str) -> str:
        """A probe queue on the same primary as ``queue``; sets ``url`` to a node of another
        primary (the pools' URL must reach a live node when a worker connects)."""
        home = self.home(queue)
        other = next(n for n in self.cluster.nodes
                     if n.port != home and self.cluster.role(n) == "master")
        self.url = other.url
        for i in range(10_000):
            name = f"{queue}-probe{i}"
            if self.home(name) == home:
                return name
        raise LookupError("no probe queue name on the queue's primary")

    def fail_over(self, queue: str) -> RedisServer:
        return self.cluster.fail_over(queue_keys(queue)[0])[0]

    def rejoin(self, node: RedisServer) -> None:
        self.cluster.rejoin(node)


# ================================================================================ probe =====


@dataclass
class ProbeCounts:
    adds: dict[str, int] = field(default_factory=dict)      # acknowledged: URL -> row
    completes: list[str] = field(default_factory=list)       # acknowledged: the row's URL
    unknown: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latency: dict[str, list[float]] = field(default_factory=lambda: {
        "add": [], "claim": [], "complete": []})
    acked_at: list[float] = field(default_factory=list)       # monotonic time of each ack


class Probe(threading.Thread):
    """Add one URL, claim one row, complete it years ahead; again, until stopped."""

    def __init__(self, url: str, name: str, wait_replicas: int) -> None:
        super().__init__(name="failover-probe", daemon=True)
        self.eng = Engine.connect(url, name, create=True, wait_replicas=wait_replicas)
        self.urls = RedisUrls(self.eng)
        self.counts = ProbeCounts()
        self.timing = True  # latencies are kept until the first kill
        self.halt = threading.Event()

    def _timed(self, what: str, call: Any, *args: Any, **kw: Any) -> Any:
        c = self.counts
        t0 = time.perf_counter()
        try:
            out = call(*args, **kw)
        except OutcomeUnknown:
            c.unknown[what] += 1
            raise
        except EngineError:
            c.errors[what] += 1
            raise
        if self.timing:
            c.latency[what].append((time.perf_counter() - t0) * 1000)
        c.acked_at.append(time.monotonic())
        return out

    def run(self) -> None:
        c, i = self.counts, 0
        by_row: dict[int, str] = {}
        while not self.halt.is_set():
            i += 1
            url = f"https://probe.example/{i}"
            try:
                got = self._timed("add", self.urls.add, [url], [0], HOUR_S)
                by_row[int(got.rows[0])] = url
                c.adds[url] = int(got.rows[0])
                batch = self._timed("claim", self.eng.claim, 1, lease_ms=60_000)
                if len(batch):
                    row, token = int(batch.rows[0]), int(batch.tokens[0])
                    due = int(time.time() * 1000) + FAR_MS  # this host's clock is the server's
                    self._timed("complete", self.eng.complete, row, token, next_due_ms=due)
                    if row in by_row:
                        c.completes.append(by_row[row])
            except EngineError:
                time.sleep(0.005)  # counted; the next round reconnects

    def _now(self) -> int:
        sec, usec = self.eng.transport.live().time()
        return int(sec) * 1000 + int(usec) // 1000

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)

    def check(self, res: FailoverResult) -> None:
        """What the new primary lost of the acknowledged writes; then drop the probe queue."""
        c = self.counts
        eng = self.eng
        client = eng.transport.live()
        _, url_rows, *_ = pool_keys(eng.name)
        urls = list(c.adds)
        rows: dict[str, int] = {}
        for k in range(0, len(urls), 1000):
            part = urls[k:k + 1000]
            for u, r in zip(part, client.hmget(url_rows, part), strict=True):
                if r is not None:
                    rows[u] = int(r)
        res.acked_adds += len(urls)
        res.acked_adds_lost += len(urls) - len(rows)
        res.acked_completes += len(c.completes)
        far = self._now() + FAR_MS // 2
        ids, cols = eng.export_rows()  # one read: the due time of every row
        due = dict(zip(ids.tolist(), cols["due_ms"].tolist(), strict=True))
        res.acked_completes_lost += sum(1 for u in c.completes
                                        if u not in rows or due.get(rows[u], 0) < far)
        for what, n in c.unknown.items():
            res.unknown[what] = res.unknown.get(what, 0) + n
        for what, n in c.errors.items():
            res.probe_errors[what] = res.probe_errors.get(what, 0) + n
        for what, xs in c.latency.items():
            if xs:
                res.latency_ms[what] = (float(np.percentile(xs, 50)),
                                        float(np.percentile(xs, 99)))
        self.urls.drop()
        eng.drop()
        eng.close()


# =============================================================================== runner =====


@dataclass
class FailoverConfig:
    pools: int = 2
    workers: int = 2                  # per pool
    batch: int = 4
    lease_s: float = 1.5
    rows: int = 3000                  # more than the pools render in a run: no row twice
    render_ms: float = 10.0
    kills: int = 1
    before_s: float = 1.0             # of running before each kill
    after_s: float = 2.0              # of running after the killed server rejoined (> lease)
    wait_replicas: int = 0


@dataclass
class FailoverResult:
    kills: int = 0
    failover_s: list[float] = field(default_factory=list)   # kill -> replica serves
    stalls: list[float] = field(default_factory=list)       # per kill, seconds
    probe_stalls: list[float] = field(default_factory=list)
    renders: int = 0
    rerenders: int = 0
    rerenders_per_kill: list[int] = field(default_factory=list)  # from one kill to the next
    acked_adds: int = 0
    acked_adds_lost: int = 0
    acked_completes: int = 0
    acked_completes_lost: int = 0
    unknown: dict[str, int] = field(default_factory=dict)
    probe_errors: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    checks: RedisChaosResult = field(default_factory=RedisChaosResult)
    pool_errors: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """What must be zero or empty whatever the replication: the pools' rows (added before
        the kill, so replicated) all there, the queue sound, the pools clean."""
        c = self.checks
        out = [f"{k} = {getattr(c, k)}" for k in ("lost", "drain_dups", "stranded")
               if getattr(c, k)]
        out += [f"{k}: {getattr(c, k)[:5]}" for k in ("verify", "verify_after_drain")
                if getattr(c, k)]
        out += self.pool_errors
        if self.renders == 0:
            out.append("nothing was rendered")
        return out

    def summary(self) -> str:
        lat = " ".join(f"{k}_ms(p50,p99)={v[0]:.2f},{v[1]:.2f}"
                       for k, v in self.latency_ms.items())
        return (f"kills={self.kills} failover_s={_r(self.failover_s)} stall_s={_r(self.stalls)}"
                f" probe_stall_s={_r(self.probe_stalls)} renders={self.renders}"
                f" rerenders={self.rerenders} rows={self.checks.rows} lost={self.checks.lost}"
                f" acked_adds_lost={self.acked_adds_lost}/{self.acked_adds}"
                f" acked_completes_lost={self.acked_completes_lost}/{self.acked_completes}"
                f" unknown={self.unknown} errors={self.probe_errors} {lat};"
                f" problems: {self.problems() or 'none'}")


def _r(xs: list[float]) -> list[float]:
    return [round(x, 2) for x in xs]


class FailoverRun:
    """One run against ``target`` (started), queue ``queue`` (fresh); files in ``workdir``."""

    def __init__(self, cfg: FailoverConfig, target: Target, queue: str, workdir: str) -> None:
        self.cfg, self.target, self.queue, self.dir = cfg, target, queue, workdir
        self.log = os.path.join(workdir, "renders.log")
        self.res = FailoverResult()
        self.procs: list[tuple[subprocess.Popen[bytes], str, str]] = []
        self.suffix = uuid.uuid4().hex[:8]
        self.added: list[str] = []
        """URLs a ``disrupt`` added (acknowledged) beside the corpus: checked as kept too."""

    def _corpus(self) -> tuple[str, list[str]]:
        urls = [f"https://shop{i % 5}.example/p/{i}" for i in range(self.cfg.rows)]
        path = os.path.join(self.dir, "corpus.csv")
        with open(path, "w") as f:
            f.write("url,interval_s,provenance\n")
            f.writelines(f"{u},{HOUR_S},submitted\n" for u in urls)
        return path, urls

    def _start_pool(self, i: int, corpus: str) -> None:
        c = self.cfg
        local = f"rl-fo-{self.suffix}-{i}"
        out = os.path.join(self.dir, f"pool-{i}.out")
        env = {**os.environ, "RL_TEST_RENDER_LOG": self.log,
               "RL_FAILOVER_RENDER_MS": str(c.render_ms),
               "PYTHONPATH": os.pathsep.join(p for p in (LIB, ROOT,
                                                         os.environ.get("PYTHONPATH", "")) if p)}
        args = [sys.executable, "-m", "engine", "pool", self.queue, "--redis", self.target.url,
                "--corpus", corpus, "--local-name", local, "--render", "failover_lib:render",
                "--workers", str(c.workers), "--batch", str(c.batch), "--lease", str(c.lease_s),
                "--grace", "3", "--plain", "--wait-replicas", str(c.wait_replicas)]
        with open(out, "wb") as f:
            proc = subprocess.Popen(args, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((proc, local, out))

    def _renders(self) -> list[tuple[float, int]]:
        """(start time, row) of every render logged."""
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [(float(p[0]), int(p[2])) for p in (line.split() for line in f) if
                    len(p) == 3]

    def run(self, disrupt: Callable[[], None] | None = None) -> FailoverResult:
        """Pools, probe, ``kills`` times: the primary killed, failed over, rejoined (or
        ``disrupt()`` instead); then the checks."""
        c = self.cfg
        corpus, urls = self._corpus()
        probe: Probe | None = None
        kills: list[tuple[float, float]] = []  # (unix time, monotonic time) of each kill
        try:
            probe_name = self.target.probe_name(self.queue)
            for i in range(c.pools):  # the same command on every host: one creates the queue
                self._start_pool(i, corpus)
            self._until_all_render()
            probe = Probe(self.target.url, probe_name, c.wait_replicas)
            probe.start()
            for _ in range(c.kills):
                time.sleep(c.before_s)
                probe.timing = False
                kills.append((time.time(), time.monotonic()))
                t0 = time.monotonic()
                if disrupt is not None:
                    disrupt()
                    self.res.failover_s.append(time.monotonic() - t0)
                else:
                    killed = self.target.fail_over(self.queue)
                    self.res.failover_s.append(time.monotonic() - t0)
                    self.target.rejoin(killed)
                self.res.kills += 1
                time.sleep(c.after_s)
            probe.stop()
            self._stop_pools()
            self._measure(kills, probe)
            with Engine.connect(self.target.url, self.queue) as eng:
                final_checks(eng, urls + self.added, {row for _, row in self._renders()},
                             self.res.checks)
                RedisUrls(eng).drop()
                eng.drop()
            probe.check(self.res)
            probe = None
        finally:
            if probe is not None:
                probe.stop()
                probe.eng.close()
            self._cleanup()
        return self.res

    def _until_all_render(self, timeout: float = 60) -> None:
        """Every pool is up (its banner printed, so a SIGTERM stops it cleanly) and a render
        was logged."""
        deadline = time.monotonic() + timeout
        while not (self._renders() and all("SIGTERM stop it" in self._out(i)
                                           for i in range(len(self.procs)))):
            for i, (proc, local, _) in enumerate(self.procs):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pool {local} did not start: {self._out(i)}")
            time.sleep(0.05)

    def _measure(self, kills: list[tuple[float, float]], probe: Probe) -> None:
        renders = self._renders()
        self.res.renders = len(renders)
        seen: set[int] = set()
        again: list[float] = []  # the start of every render but a row's first
        for t, row in sorted(renders):
            if row in seen:
                again.append(t)
            seen.add(row)
        self.res.rerenders = len(again)
        edges = [wall for wall, _ in kills]
        self.res.rerenders_per_kill = [
            sum(1 for t in again if lo <= t < hi) for lo, hi in zip(edges, [*edges[1:], np.inf],
                                                                   strict=True)]
        starts = np.sort(np.array([t for t, _ in renders]))
        acks = np.sort(np.array(probe.counts.acked_at))
        for i, (wall, mono) in enumerate(kills):
            last = i + 1 == len(kills)
            self.res.stalls.append(_longest_gap(starts, wall, np.inf if last else
                                                kills[i + 1][0]))
            self.res.probe_stalls.append(_longest_gap(acks, mono, np.inf if last else
                                                      kills[i + 1][1]))

    def _out(self, i: int) -> str:
        try:
            with open(self.procs[i][2], errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _stop_pools(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for i, (proc, local, _) in enumerate(self.procs):
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_host(proc.pid)
                rc = proc.wait()
            if rc != 0:
                self.res.pool_errors.append(f"pool {local} exited {rc}: {self._out(i)[-2000:]}")

    def _cleanup(self) -> None:
        for proc, local, _ in self.procs:
            if proc.poll() is None:
                kill_host(proc.pid)
                proc.wait()
            remove_local_files(local)


def _longest_gap(times: Any, since: float, until: float) -> float:
    """The longest time without an event (``times``, sorted) from ``since`` on, before
    ``until`` (the next kill); up to the last such event."""
    after = times[(times >= since) & (times < until)]
    points = np.concatenate(([since], after))
    return float(np.max(np.diff(points))) if len(points) > 1 else float("inf")
