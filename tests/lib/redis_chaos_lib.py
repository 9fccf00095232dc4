"""Chaos across "hosts" on one Redis queue: the runner and the lease-log oracle.

Shared by ``tests/chaos/test_redis_chaos.py`` (the CI form, seconds per seed) and
``bench/chaos_long.py --redis`` (the long form). No pytest import.

How it works
------------
* ``pools`` pools, each ``lanes pool QUEUE --redis URL --local-name L ...`` in a session of
  its own (its own process group, as a machine of its own would be), render with
  ``pool_renders:chaos``, which appends to one lease log, per render, an ``S`` line as it starts
  and an ``E`` line as it ends: the pool (supervisor pid), the worker pid, row, token, the
  server's clock and the lease the queue holds for the row at that moment (token and expiry,
  read from Redis in one MULTI/EXEC). Rows have intervals of a few seconds, so every row comes
  back due again and again, and leases are short (1 s by default).
* The runner, at random moments (exponential gaps, the first three actions one of each kind):
  SIGKILLs one worker (its supervisor replaces it and reaps its leases), SIGSTOPs one worker for
  1.5-3 leases and then SIGCONTs it (a stalled process: its leases lapse, others take its rows,
  and when it wakes it renders rows it no longer holds), and SIGKILLs a whole pool with
  ``kill_host`` (a host gone), restarting it a moment later under the same local name (a
  replacement host: with ``--corpus`` or joining without it, in turn). ``lanes add --redis``
  grows the queue while they run.
* Then a calm: stopped workers are woken, killed pools restarted, and the pools run until every
  row has been rendered at least once (30 s at most). Then the pools are stopped with SIGTERM
  (their summaries give the leases each reported lost) and the oracle runs (:func:`oracle`).

The oracle
----------
Every time is the server's (``TIME``), the clock the queue itself reads. A token is reserved as
``max(counter, server ms * 1024) + 1``, so ``token >> 10`` is at least the server time of the
grant: with the ``S`` line's time, an upper bound of when the render's lease was granted.

A render's lease is *valid* from its grant until it expires, its owner ends it (complete, fail,
release: always after the render's ``E`` line) or its owner dies (SIGKILL: the runner notes the
time before it signals). It was observed *live* at an ``S``/``E`` line that found the row's
lease held by the render's own worker (its owner id; the renewer gives it new tokens) with an
expiry in the future; from such an observation it was valid at least until
``min(expiry seen, E time, death)``. The checks:

* **overlap**: for each row, in token order, no render's grant (upper bound) comes before the
  valid-until (lower bound) of an earlier token's lease: no two valid leases of a row overlap.
* **one render per lease**: no (row, token) is rendered twice; tokens of a row never repeat.
* **early loss**: a live worker never finds its lease gone (another owner or none) before the
  expiry it saw at its start: nobody ended or took it while it was valid. A stale token's
  ``complete`` accepted by mistake would delete the current holder's lease: caught here.
* **lost leases are reported**: a render that ends with its lease superseded must not be
  completed; the worker's ``complete_many`` / ``fail`` / renewer report it as a lost lease
  (``LeaseLost``, the pool's ``lease_lost`` counter, printed in its summary as "N leases lost").
  For each pool stopped cleanly, its superseded renders by workers never killed are at most its
  ``lease_lost``.
* after every pool stopped: ``verify()`` empty; nothing lost (every row queued, ``rows`` =
  URLs added, every URL mapped to its row both ways); every URL rendered at least once; a drain
  (a claim with a far-future ``now_ms`` and year-long leases, holding what it takes) returns
  every row exactly once, and ``verify()`` holds after it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

LIB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LIB))
try:
    import engine  # noqa: F401
except ImportError:  # the package may be built in place rather than installed
    sys.path.insert(0, ROOT)

from pool_testlib import kill_host  # noqa: E402

from engine import Engine  # noqa: E402
from engine.pool.supervisor import remove_local_files  # noqa: E402
from engine.redis.urls import RedisUrls, pool_keys  # noqa: E402

YEAR_MS = 365 * 86_400_000
TOL_MS = 1  # the server clock's granularity, as the oracle reads it
NEVER = 1 << 62


@dataclass
class RedisChaosConfig:
    seconds: float = 15.0              # of chaos, after the first pool renders
    pools: int = 3
    workers: int = 2                   # per pool
    batch: int = 4
    lease_s: float = 1.0
    rows: int = 120                    # in the corpus every pool starts with
    intervals: tuple[int, ...] = (2, 3, 4)
    adds: int = 1                      # `lanes add --redis` runs while the pools run
    add_rows: int = 30                 # new URLs per add
    act_every: float = 0.7             # mean seconds between chaos actions
    weights: tuple[float, float, float] = (3.0, 2.0, 1.0)  # kill worker, stop worker, kill pool
    stop_leases: tuple[float, float] = (1.5, 3.0)          # a stop lasts this many leases
    restart_after: tuple[float, float] = (0.3, 1.5)        # seconds until a killed pool restarts
    seed: int = 0


@dataclass
class RedisChaosResult:
    seed: int = 0
    seconds: float = 0.0
    renders: int = 0                   # S lines
    rows: int = 0
    workers_killed: int = 0
    workers_stopped: int = 0
    pools_killed: int = 0
    pools_started: int = 0
    adds: int = 0
    superseded: int = 0                # renders that ended under a lease not theirs
    superseded_checked: int = 0        # ... of pools stopped cleanly, by workers never killed
    lease_lost_reported: int = 0       # by the pools stopped cleanly
    overlaps: int = 0
    early_lost: int = 0
    twice: int = 0                     # a (row, token) rendered twice
    unreported: int = 0                # superseded renders beyond a pool's lease_lost
    never_rendered: int = 0
    lost: int = 0                      # rows not queued, or whose URL mapping is wrong
    drained: int = 0
    drain_dups: int = 0
    stranded: int = 0                  # queued rows the drain never returned
    pool_errors: list[str] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)
    verify_after_drain: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    examples: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def problems(self) -> list[str]:
        """Everything that must be zero or empty for the run to pass."""
        out = [f"{k} = {getattr(self, k)}" for k in (
            "overlaps", "early_lost", "twice", "unreported", "never_rendered", "lost",
            "drain_dups", "stranded") if getattr(self, k)]
        for k in ("pool_errors", "verify", "verify_after_drain", "log_errors"):
            if getattr(self, k):
                out.append(f"{k}: {getattr(self, k)[:5]}")
        if self.renders == 0:
            out.append("nothing was rendered")
        return out

    def summary(self) -> str:
        counts = " ".join(f"{k}={getattr(self, k)}" for k in (
            "renders", "rows", "workers_killed", "workers_stopped", "pools_killed",
            "pools_started", "adds", "superseded", "superseded_checked", "lease_lost_reported",
            "drained"))
        ex = {k: v[:3] for k, v in self.examples.items() if v}
        return (f"redis chaos seed {self.seed} ({self.seconds:.1f} s): {counts}; problems:"
                f" {self.problems() or 'none'}" + (f"; examples {ex}" if ex else ""))


def server_ms(eng: Engine | Any) -> int:
    sec, usec = eng.transport.live().time()
    return int(sec) * 1000 + int(usec) // 1000


# =============================================================================== runner =====


@dataclass
class _PoolRun:
    slot: int
    local: str
    proc: subprocess.Popen[bytes]
    out: str
    killed_ms: int | None = None


class RedisChaos:
    """One chaos run against queue ``queue`` (which must not exist) at Redis ``url``; its logs
    and corpora go to ``workdir``."""

    def __init__(self, cfg: RedisChaosConfig, url: str, queue: str, workdir: str) -> None:
        self.cfg, self.url, self.queue, self.dir = cfg, url, queue, workdir
        self.rng = random.Random(cfg.seed)
        self.log = os.path.join(workdir, "leases.log")
        self.res = RedisChaosResult(seed=cfg.seed)
        self.urls: list[str] = []
        self.runs: list[_PoolRun] = []          # every pool ever started
        self.live: dict[int, _PoolRun] = {}     # slot -> its running pool
        self.kill_ms: dict[int, int] = {}       # worker pid -> server ms before its SIGKILL
        self.pool_kill_ms: dict[int, int] = {}  # supervisor pid -> server ms before its kill
        self.stopped: dict[int, float] = {}     # SIGSTOPped pid -> monotonic time of its SIGCONT
        self.restarts: dict[int, float] = {}    # slot -> monotonic time of its restart
        self.seen: set[int] = set()             # every process of every pool
        self.suffix = f"{os.getpid()}-{cfg.seed % 100_000}"
        self.adding: list[tuple[subprocess.Popen[str], int]] = []  # `lanes add` processes
        self._eng: Engine | Any = None

    # -- pools --------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (LIB, ROOT, os.environ.get("PYTHONPATH", "")) if p),
                "RL_TEST_REDIS": self.url, "RL_TEST_QUEUE": self.queue,
                "RL_TEST_RENDER_LOG": self.log}

    def _csv(self, name: str, urls: list[str]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("url,interval_s,provenance\n")
            for u in urls:
                f.write(f"{u},{self.rng.choice(self.cfg.intervals)},"
                        f"{self.rng.choice(('submitted', 'discovered'))}\n")
        return path

    def _start(self, slot: int, corpus: bool) -> None:
        c = self.cfg
        local = f"rl-chaos-{self.suffix}-{slot}"
        out = os.path.join(self.dir, f"pool-{slot}-{len(self.runs)}.out")
        args = [sys.executable, "-m", "engine", "pool", self.queue, "--redis", self.url,
                *(["--corpus", self.corpus] if corpus else []), "--local-name", local,
                "--render", "pool_renders:chaos", "--workers", str(c.workers), "--batch",
                str(c.batch), "--lease", str(c.lease_s), "--grace", "5", "--plain"]
        with open(out, "wb") as f:
            proc = subprocess.Popen(args, env=self._env(), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        run = _PoolRun(slot, local, proc, out)
        self.runs.append(run)
        self.live[slot] = run
        self.seen.add(proc.pid)
        self.res.pools_started += 1

    def _workers(self, run: _PoolRun) -> list[int]:
        try:
            pids = [p.pid for p in psutil.Process(run.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.seen.update(pids)
        return pids

    # -- chaos actions --------------------------------------------------------------------------

    def _kill_worker(self) -> bool:
        run = self.rng.choice(list(self.live.values()))
        pids = self._workers(run)
        if not pids:
            return False
        pid = self.rng.choice(pids)
        self.kill_ms[pid] = server_ms(self._eng)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.stopped.pop(pid, None)
        self.res.workers_killed += 1
        return True

    def _stop_worker(self) -> bool:
        run = self.rng.choice(list(self.live.values()))
        pids = [p for p in self._workers(run) if p not in self.stopped]
        if not pids:
            return False
        pid = self.rng.choice(pids)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        self.stopped[pid] = time.monotonic() + self.cfg.lease_s * self.rng.uniform(
            *self.cfg.stop_leases)
        self.res.workers_stopped += 1
        return True

    def _kill_pool(self) -> bool:
        run = self.live.pop(self.rng.choice(list(self.live)))
        pids = self._workers(run)
        run.killed_ms = self.pool_kill_ms[run.proc.pid] = server_ms(self._eng)
        kill_host(run.proc.pid)  # if it died by itself, the loop notes a pool error
        run.proc.wait()
        for pid in pids:
            self.stopped.pop(pid, None)
        self.restarts[run.slot] = time.monotonic() + self.rng.uniform(*self.cfg.restart_after)
        self.res.pools_killed += 1
        return True

    def _add(self, i: int) -> None:
        """``lanes add --redis`` from a process of its own, while the chaos goes on."""
        extra = [f"https://add{i}.example/p/{k}" for k in range(self.cfg.add_rows)]
        path = self._csv(f"add-{i}.csv", extra)
        p = subprocess.Popen([sys.executable, "-m", "engine", "add", self.queue, "--redis",
                              self.url, "--corpus", path], env=self._env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.adding.append((p, len(extra)))
        self.urls += extra
        self.res.adds += 1

    def _added(self) -> None:
        for p, n in self.adding:
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0 or f"{n} new URL(s) added" not in out:
                self.res.pool_errors.append(f"lanes add: rc {p.returncode}: {out}")
        self.adding.clear()

    def _tick(self, now: float) -> None:
        for pid, at in list(self.stopped.items()):
            if now >= at:
                del self.stopped[pid]
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for slot, at in list(self.restarts.items()):
            if now >= at:
                del self.restarts[slot]
                # a replacement host: the same command as the first, or joining as it is
                self._start(slot, corpus=self.res.pools_started % 2 == 0)

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> RedisChaosResult:
        c, rng = self.cfg, self.rng
        self.urls = [f"https://shop{i % 7}.example/p/{i}" for i in range(c.rows)]
        self.corpus = self._csv("corpus.csv", self.urls)
        t_start = time.monotonic()
        try:
            self._start(0, corpus=True)  # the first creates the queue; the rest join it
            deadline = time.monotonic() + 60
            while not (os.path.exists(self.log) and os.path.getsize(self.log) > 0):
                if self.live[0].proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the first pool did not render: {self._out(self.live[0])}")
                time.sleep(0.05)
            self._eng = Engine.connect(self.url, self.queue)
            for slot in range(1, c.pools):
                self._start(slot, corpus=slot % 2 == 0)
            kinds = ["worker", "stop", "pool"]
            rng.shuffle(kinds)  # the first three actions: one of each
            begin = time.monotonic()
            end = begin + c.seconds
            adds_at = sorted(begin + c.seconds * rng.uniform(0.2, 0.6) for _ in range(c.adds))
            next_act = begin + rng.expovariate(1 / c.act_every)
            while (now := time.monotonic()) < end:
                self._tick(now)
                if adds_at and now >= adds_at[0]:
                    adds_at.pop(0)
                    self._add(self.res.adds)
                elif now >= next_act and self.live:
                    kind = kinds.pop(0) if kinds else rng.choices(
                        ["worker", "stop", "pool"], c.weights)[0]
                    done = {"worker": self._kill_worker, "stop": self._stop_worker,
                            "pool": self._kill_pool}[kind]()
                    if not done and kind in ("worker", "stop"):
                        kinds.insert(0, kind)  # no worker up yet: try again next time
                    next_act = time.monotonic() + rng.expovariate(1 / c.act_every)
                for run in self.live.values():
                    if run.proc.poll() is not None and run.killed_ms is None:
                        self.res.pool_errors.append(f"pool {run.local} exited by itself:"
                                                    f" {self._out(run)[-2000:]}")
                        run.killed_ms = -1
                time.sleep(0.02)
            self._added()
            self._calm()
            self.res.seconds = time.monotonic() - t_start
            self._stop_all()
            return oracle(self)
        finally:
            self._cleanup()

    def _wake_stopped(self) -> None:
        for pid in list(self.stopped):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped.clear()

    def _calm(self, timeout: float = 30.0) -> None:
        """The chaos is over: wake the stopped, restart the killed, and let the pools run until
        every row has been rendered at least once (nothing starved), or ``timeout``."""
        self._wake_stopped()
        for slot in list(self.restarts):
            del self.restarts[slot]
            self._start(slot, corpus=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log) as f:
                seen = {line.split(maxsplit=4)[3] for line in f if line.startswith("S ")}
            if len(seen) >= len(self.urls):
                return
            time.sleep(0.1)

    def _out(self, run: _PoolRun) -> str:
        try:
            with open(run.out, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _stop_all(self) -> None:
        """Wake the stopped, SIGTERM every pool still running (a clean stop), read its
        summary; remove the local files of pools killed and not restarted yet."""
        self._wake_stopped()
        self.restarts.clear()
        for run in self.live.values():
            # A pool just restarted may still be starting: SIGTERM before its handlers are in
            # place would end it as Python does, not as a pool stops. Workers mean it runs.
            deadline = time.monotonic() + 60
            while not self._workers(run) and run.proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            run.proc.send_signal(signal.SIGTERM)
        for run in self.live.values():
            try:
                run.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_host(run.proc.pid)
                run.proc.wait()
                self.res.pool_errors.append(f"pool {run.local} did not stop on SIGTERM")
                continue
            text = self._out(run)
            lost = re.search(r"(\d+) leases lost", text)
            if run.proc.returncode != 0 or lost is None or "invariants: hold" not in text:
                self.res.pool_errors.append(f"pool {run.local} ended with {run.proc.returncode}:"
                                            f" {text[-2000:]}")
        for run in self.runs:
            if run.slot not in self.live or self.live[run.slot] is not run:
                remove_local_files(run.local)  # a host killed whole leaves them (lanes cleanup)

    def _cleanup(self) -> None:
        """Whatever happened: no pool process, stopped process or local file is left."""
        for p, _ in self.adding:
            if p.poll() is None:
                p.kill()
            p.communicate()
        for pid in list(self.stopped):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for run in self.runs:
            if run.proc.poll() is None:
                kill_host(run.proc.pid)
                run.proc.wait()
            remove_local_files(run.local)
        for pid in self.seen:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE and os.getsid(pid) in {
                        r.proc.pid for r in self.runs}:
                    p.kill()
            except (psutil.Error, ProcessLookupError):
                pass
        if self._eng is not None:
            self._eng.close()



# =============================================================================== oracle =====


@dataclass
class Render:
    """One render as the lease log tells it. ``*_holder`` is the pid of the owner of the lease
    the queue held for the row at that line (None: no lease): the render's own worker while
    its lease lasts (a renewal gives it a new token, so the owner, not the token, says whose
    lease it is: a worker renders its rows one after another, so it cannot hold the row under
    another lease meanwhile)."""

    pool: int
    pid: int
    row: int
    token: int
    start: int                           # server ms at the S line
    start_holder: int | None
    start_expiry: int | None
    end: int | None = None               # server ms at the E line (None: killed mid-render)
    end_holder: int | None = None
    end_expiry: int | None = None

    @property
    def grant_at_most(self) -> int:
        return min(self.token >> 10, self.start)

    def valid_until_at_least(self, death: int) -> int:
        """A lower bound of the end of this render's lease (-1 if it was never seen live)."""
        owner_end = NEVER if self.end is None else self.end
        best = -1
        for t, holder, expiry in ((self.start, self.start_holder, self.start_expiry),
                                  (self.end, self.end_holder, self.end_expiry)):
            if t is not None and holder == self.pid and expiry is not None and expiry > t:
                best = max(best, min(expiry, owner_end, death))
        return best

    @property
    def superseded(self) -> bool:
        """It ended with the row's lease not its worker's: it must not be completed."""
        return self.end is not None and self.end_holder != self.pid


def _opt(v: str) -> int | None:
    return None if v == "-" else int(v)


def read_log(path: str, errors: list[str]) -> list[Render]:
    by_lease: dict[tuple[int, int], Render] = {}
    out: list[Render] = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            try:
                tag, pool, pid, row, token, t, _held, holder, expiry = p[:9]
                key = (int(row), int(token))
                if tag == "S" and len(p) == 9:
                    r = Render(int(pool), int(pid), *key, int(t), _opt(holder), _opt(expiry))
                    if key in by_lease:
                        errors.append(f"line {n}: lease {key} rendered twice")
                    by_lease[key] = r
                    out.append(r)
                elif tag == "E" and key in by_lease and by_lease[key].end is None \
                        and by_lease[key].pid == int(pid) and p[9:] in (["ok"], ["fail"]):
                    r = by_lease[key]
                    r.end, r.end_holder, r.end_expiry = int(t), _opt(holder), _opt(expiry)
                else:
                    errors.append(f"line {n}: {line.strip()!r} has no render to end")
            except (ValueError, IndexError):
                errors.append(f"line {n}: cannot read {line.strip()!r}")
    return out


def check_leases(renders: list[Render], kill_ms: dict[int, int], pool_kill_ms: dict[int, int],
                 res: RedisChaosResult) -> None:
    """The lease-log oracle over the renders (see the module's docstring)."""
    ex = res.examples
    by_row: dict[int, list[Render]] = defaultdict(list)
    for r in renders:
        by_row[r.row].append(r)
    for row, rs in by_row.items():
        rs.sort(key=lambda r: r.token)
        tokens = Counter(r.token for r in rs)
        res.twice += sum(n - 1 for n in tokens.values())
        until, holder, done = -1, None, 0  # over the leases of the earlier tokens
        for i, r in enumerate(rs):
            if i and rs[i - 1].token != r.token:
                for e in rs[done:i]:
                    death = min(kill_ms.get(e.pid, NEVER), pool_kill_ms.get(e.pool, NEVER))
                    if (v := e.valid_until_at_least(death)) > until:
                        until, holder = v, e
                done = i
            if r.grant_at_most < until - TOL_MS:
                res.overlaps += 1
                ex["overlap"].append({"row": row, "earlier": holder, "later": r,
                                      "valid_until_at_least": until})
    for r in renders:
        # live at its start, alive and rendering at its end, its lease gone before the expiry
        # seen at the start: someone ended or took a valid lease
        if (r.start_holder == r.pid and r.start_expiry is not None and r.superseded
                and r.end is not None and r.end < r.start_expiry - TOL_MS):
            res.early_lost += 1
            ex["early_lost"].append(r)


def oracle(chaos: RedisChaos) -> RedisChaosResult:
    res, eng = chaos.res, chaos._eng
    renders = read_log(chaos.log, res.log_errors)
    res.renders = len(renders)
    chaos.seen.update(pid for r in renders for pid in (r.pid, r.pool))
    check_leases(renders, chaos.kill_ms, chaos.pool_kill_ms, res)

    # Superseded renders are never completed: each is a lost lease its pool reports.
    killed = set(chaos.kill_ms)
    for run in chaos.runs:
        if run.killed_ms is not None:
            continue
        text = chaos._out(run)
        found = re.search(r"(\d+) leases lost", text)
        reported = int(found.group(1)) if found else 0
        res.lease_lost_reported += reported
        mine = [r for r in renders if r.pool == run.proc.pid and r.superseded
                and r.pid not in killed]
        res.superseded_checked += len(mine)
        if len(mine) > reported:
            res.unreported += len(mine) - reported
            res.examples["unreported"].append({"pool": run.local, "reported": reported,
                                               "superseded": mine[:3]})
    res.superseded = sum(r.superseded for r in renders)

    final_checks(eng, chaos.urls, {r.row for r in renders}, res)
    return res


def final_checks(eng: Any, expected_urls: list[str], rendered_rows: set[int],
                 res: RedisChaosResult) -> None:
    """With every pool stopped: verify, nothing lost, every row rendered, the drain."""
    res.verify = eng.verify()
    n = res.rows = int(eng.stats()["rows"])
    rows, _cols = eng.export_rows()
    queued = np.zeros(n, bool)
    queued[rows] = True
    urls_key, url_rows_key, _, index_key = pool_keys(eng.name)
    client = eng.transport.live()
    by_row = {int(k): bytes(v).decode() for k, v in client.hgetall(urls_key).items()}
    by_url = {bytes(k).decode(): int(v) for k, v in client.hgetall(url_rows_key).items()}
    indexed = {bytes(m).decode() for m in client.zrange(index_key, 0, -1)}
    if indexed != {f"{u}\n{r:08d}" for r, u in by_row.items()}:  # kept in step by each add
        res.lost += 1
        res.examples["lost"].append(f"the URL index holds {len(indexed)} entries for"
                                    f" {len(by_row)} URLs, or others")
    if n != len(expected_urls) or set(by_row.values()) != set(expected_urls):
        res.lost += abs(n - len(expected_urls)) or 1
        res.examples["lost"].append(f"{n} rows for {len(expected_urls)} URLs")
    for r in range(n):
        url = by_row.get(r)
        if not queued[r] or url is None or by_url.get(url) != r:
            res.lost += 1
            res.examples["lost"].append(eng.describe(r))
    assert len(RedisUrls(eng)) == len(by_row)
    res.never_rendered = len(set(range(n)) - rendered_rows)
    if res.never_rendered:
        res.examples["never_rendered"].append(sorted(set(range(n)) - rendered_rows)[:5])

    far = server_ms(eng) + 10 * YEAR_MS
    seen = np.zeros(n, np.int64)
    empty = 0
    while empty < 3:
        c = eng.claim(budget=4096, now_ms=far, lease_ms=YEAR_MS)
        if not len(c):
            empty += 1
            continue
        empty = 0
        np.add.at(seen, c.rows, 1)
    res.drained = int(seen.sum())
    res.drain_dups = int((seen > 1).sum())
    res.stranded = int((queued & (seen == 0)).sum())
    res.verify_after_drain = eng.verify()
