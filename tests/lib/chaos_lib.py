"""Multi-process chaos against one engine, in real time: the workers, the killer, the oracle.

Shared by ``tests/chaos/test_chaos.py`` (the CI form, ~20 s) and ``bench/chaos_long.py`` (the long
form, millions of claims). No pytest import: forked children run this code.

How it works
------------
* A supervisor creates the engine, queues ``rows`` rows due now, and forks ``workers`` worker
  processes (``os.fork``). Half of them keep the fork-inherited ``Engine`` (which registers the
  child as a new lease owner on first use), half ``Engine.attach`` by name.
* Each worker loops in real time (``now_ms=None``) with short leases: claim a batch, sometimes
  hold it (now and then past the lease), sometimes renew one lease, then end each lease with
  ``complete_many`` / ``complete`` / ``fail`` / ``release`` (or abandon it); between batches it
  adds rows, prioritizes rows, rarely removes one or forces a compaction.
* Every lease event goes to the worker's own append-only log, one line per event, written with
  one ``os.write`` on an ``O_APPEND`` descriptor (no user-space buffer), so a SIGKILLed worker's
  log is intact up to its last event.
* About once per ``kill_every`` seconds the supervisor SIGKILLs a random worker, reaps it
  (``waitpid``), sometimes calls ``eng.reap()`` / changes the policy live, and forks a
  replacement. At the end the workers are told to stop (a shared byte), joined, and any
  straggler is SIGKILLed and reaped.
* The oracle then reads the logs and the engine (see :func:`oracle`).

Log format (times are ``time.time_ns() // 10**6``, the clock the engine itself reads)::

    S <pid> <t> <inherit|attach>              worker started
    C <t0> <t1> <lease_ms> <row>:<tok> ...    claim granted these leases (t0 before, t1 after)
    K <t0> <t1> <row>:<ok> ...                complete / complete_many ended them (ok 1/0)
    F <t0> <t1> <row> <tok> <ok>              fail
    R <t0> <t1> <row> <tok> <ok>              release
    N <t0> <t1> <lease_ms> <row> <tok> <new>  renew (new = '-' when LeaseLost)
    a <n>    /  A <row> ...                   add intent / rows added (A alone: refused)
    P <t> <row> <mode> <ok>                   prioritize (ok 0: the row was removed)
    x <row>  /  X <row> <ok>                  remove intent / done (ok 0: already removed)
    Z <t>                                     compact
    Q <t>                                     clean stop
    ! <traceback>                             unexpected exception (the worker exits 3)

A lease is *successful* when its end (K/F/R) reports ok. Its interval is [t1 of the claim, t0 of
the end]: inside the interval during which the engine really held it for this worker (the
grant happens before t1, the end's CAS after t0), so two successful intervals of one row can
only overlap if the engine granted the row twice at once. Beyond the overlap of two successful
leases the oracle also counts *intrusions* (any grant of a row, even to a worker killed later,
inside a successful lease of it) and *early losses* (LeaseLost on a lease that could not yet have
expired, of a row nobody tried to remove: fencing then saved the row, but the engine handed out
a live lease). Both must be zero, like overlaps, lost and stranded rows.
"""

from __future__ import annotations

import array
import mmap
import os
import random
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import engine  # noqa: F401
except ImportError:  # the package may be built in place rather than installed
    import sys

    sys.path.insert(0, ROOT)

from engine import CapacityError, Engine, LanePolicy, LeaseLost  # noqa: E402
from engine.errors import EngineValueError  # noqa: E402

YEAR_MS = 365 * 86_400_000
TOL_MS = 2  # clock granularity tolerated by the oracle (ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Lanes of this policy are spread by intervals of a few seconds, so rows completed in real time
# come back within seconds and every lane (bands, discovered, cold, urgent) sees traffic.
CHAOS_BANDS = (2, 4, 8)
POLICIES = (
    LanePolicy(ttl_bands=CHAOS_BANDS, cold_after=3, urgent_max_share=0.2,
               min_share={"discovered": 0.10, "cold": 0.02}),
    LanePolicy(ttl_bands=CHAOS_BANDS, cold_after=3, urgent_max_share=0.5,
               min_share={"discovered": 0.2, "cold": 0.1}, remainder="edf"),
    LanePolicy(ttl_bands=CHAOS_BANDS, cold_after=3, urgent_max_share=0.05, min_share={}),
)
INTERVALS = (1, 2, 3, 4, 6, 8, 12)


@dataclass
class ChaosConfig:
    seconds: float | None = 20.0       # stop after this long (None: only the claim target)
    claims: int | None = None          # ... or once the engine granted this many leases
    max_seconds: float = 3600.0        # hard stop whatever the target
    workers: int = 4
    rows: int = 3000                   # rows queued before the workers start
    capacity: int = 1 << 16
    kill_every: float = 1.0            # mean seconds between SIGKILLs (0: never)
    reap_share: float = 0.5            # after a kill, call eng.reap() this often
    policy_every: int = 4              # every n-th kill also changes the policy live (0: never)
    seed: int = 0
    # worker behaviour
    lease_ms: tuple[int, int] = (200, 500)
    budgets: tuple[int, ...] = (1, 2, 4, 8, 16)
    p_hold: float = 0.3                # hold a batch for up to hold_ms before ending it
    hold_ms: int = 60
    p_overrun: float = 0.02            # hold a batch past its lease (LeaseLost territory)
    p_renew: float = 0.05
    p_abandon: float = 0.01            # per lease: never end it (it expires)
    p_fail: float = 0.1                # per lease
    p_release: float = 0.1             # per lease; the rest completes
    p_single: float = 0.2              # end a batch's completions one by one with complete()
    p_add: float = 0.02                # per loop
    add_max: int = 8
    p_prioritize: float = 0.02
    p_remove: float = 0.002
    p_compact: float = 0.002
    idle_sleep_ms: float = 2.0
    # the oracle's drain keeps every row it takes (long leases, nothing completed), so rows in
    # flight pile up in every lane while it runs (docs/design.md §9)
    drain_hold: bool = False


@dataclass
class ChaosResult:
    name: str = ""
    seconds: float = 0.0
    claims: int = 0                    # leases granted (rows), from the logs
    claim_calls: int = 0               # claim calls that granted something
    engine_granted: int = 0            # the engine's own grant counters
    ended_ok: dict[str, int] = field(default_factory=dict)
    lease_lost: int = 0
    early_lost: int = 0                # LeaseLost before the lease could have expired
    open_at_end: int = 0               # leases never ended (killed / abandoned)
    workers_started: int = 0
    pids: list[int] = field(default_factory=list)  # every worker forked
    workers_killed: int = 0
    stragglers: int = 0                # SIGKILLed at the end because they did not stop
    crashed: int = 0                   # workers that exited on an unexpected exception
    crash_logs: list[str] = field(default_factory=list)
    reaped_during: int = 0
    reaped_at_end: int = 0
    policy_changes: int = 0
    overlaps: int = 0                  # successful leases overlapping another of the same row
    intrusions: int = 0                # grants made inside a successful lease of that row
    batch_dups: int = 0                # a row granted twice in one claim batch
    log_errors: int = 0                # log lines the oracle could not account for
    rows: int = 0
    added_logged: int = 0
    removed: int = 0
    duplicated: int = 0                # row ids handed out twice / rows nobody added
    lost: int = 0                      # rows neither queued nor removed
    resurrected: int = 0               # rows removed (confirmed) yet queued again
    verify: list[str] = field(default_factory=list)
    verify_after_drain: list[str] = field(default_factory=list)
    drained: int = 0
    drain_dups: int = 0
    drain_phantoms: int = 0            # drained rows that were not queued
    stranded: int = 0                  # queued rows the drain never returned
    drain_lane_max: int = 0            # drain_hold: most rows of one lane the drain held at once
    examples: dict[str, list[Any]] = field(default_factory=dict)

    def summary(self) -> str:
        d = asdict(self)
        d.pop("crash_logs")
        d.pop("pids")
        ex = d.pop("examples")
        lines = [f"chaos {self.name}: {self.seconds:.1f} s"]
        lines += [f"  {k:<20} {v}" for k, v in d.items() if k not in ("name", "seconds")]
        for k, v in ex.items():
            if v:
                lines.append(f"  example {k}: {v[:5]}")
        return "\n".join(lines)

    def problems(self) -> list[str]:
        """Everything that must be zero/empty for the run to pass."""
        out = []
        for k in ("overlaps", "intrusions", "early_lost", "batch_dups", "lost", "duplicated",
                  "stranded", "drain_dups", "drain_phantoms", "crashed", "log_errors"):
            if getattr(self, k):
                out.append(f"{k} = {getattr(self, k)}")
        if self.verify:
            out.append(f"verify: {self.verify}")
        if self.verify_after_drain:
            out.append(f"verify after drain: {self.verify_after_drain}")
        return out


# =============================================================================== worker =====


class _Log:
    """One line per event, one write(2) per line on an O_APPEND descriptor: nothing is buffered
    in the process, so SIGKILL loses at most the event being written."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


def _side_write(eng: Engine, log: _Log, rng: random.Random, cfg: ChaosConfig, known: int,
                u: float, p_side: tuple[float, ...]) -> int:
    """One write between batches (add, prioritize, remove or compact, as ``u`` falls in
    ``p_side``); returns the row ids known to exist afterwards."""
    rnd, randint = rng.random, rng.randint
    if u < p_side[0]:
        k = randint(1, cfg.add_max)
        t = now_ms()
        due = [t - randint(0, 5000) if rnd() < 0.7 else t + randint(0, 5000) for _ in range(k)]
        ivl = [rng.choice(INTERVALS) for _ in range(k)]
        prov = [randint(0, 1) for _ in range(k)]
        log(f"a {k}")
        try:
            new = eng.add_many(np.array(due, np.int64), np.array(ivl, np.int64),
                               np.array(prov, np.int64)).tolist()
        except CapacityError:
            new = []
        log("A " + " ".join(map(str, new)) if new else "A")
        return max(known, new[-1] + 1) if new else known
    if u < p_side[1]:
        row = rng.randrange(known)
        mode = "rush" if rnd() < 0.7 else "wait"
        try:
            eng.prioritize(row, mode)
            ok = 1
        except EngineValueError:
            ok = 0  # removed
        log(f"P {now_ms()} {row} {mode} {ok}")
    elif u < p_side[2]:
        row = rng.randrange(known)
        log(f"x {row}")
        try:
            eng.remove(row)
            ok = 1
        except EngineValueError:
            ok = 0
        log(f"X {row} {ok}")
    else:
        eng.compact()
        log(f"Z {now_ms()}")
    return known


def _end_batch(eng: Engine, log: _Log, rng: random.Random, cfg: ChaosConfig, rows: list[int],
               toks: list[int], p_end: tuple[float, ...]) -> None:
    """End each lease of a batch: abandon, fail, release, or complete (one by one, or all in
    one ``complete_many``)."""
    rnd, randint = rng.random, rng.randint
    done_r: list[int] = []
    done_t: list[int] = []
    for r, k in zip(rows, toks, strict=True):
        v = rnd()
        if v < p_end[0]:
            continue  # abandoned: the lease expires
        if v < p_end[1]:
            e0 = now_ms()
            try:
                eng.fail(r, k, retry_at_ms=None if rnd() < 0.5 else e0 + randint(0, 3000))
                ok = 1
            except LeaseLost:
                ok = 0
            log(f"F {e0} {now_ms()} {r} {k} {ok}")
        elif v < p_end[2]:
            e0 = now_ms()
            try:
                eng.release(r, k)
                ok = 1
            except LeaseLost:
                ok = 0
            log(f"R {e0} {now_ms()} {r} {k} {ok}")
        else:
            done_r.append(r)
            done_t.append(k)
    if not done_r:
        return
    if rnd() < cfg.p_single:
        for r, k in zip(done_r, done_t, strict=True):
            e0 = now_ms()
            try:
                eng.complete(r, k)
                ok = 1
            except LeaseLost:
                ok = 0
            log(f"K {e0} {now_ms()} {r}:{ok}")
    else:
        nxt = None
        if rnd() < 0.3:
            nxt = [now_ms() + randint(0, 3000) for _ in done_r]
        e0 = now_ms()
        oks = eng.complete_many(done_r, done_t, next_due_ms=nxt).tolist()
        e1 = now_ms()
        log(f"K {e0} {e1} "
            + " ".join([f"{r}:{int(o)}" for r, o in zip(done_r, oks, strict=True)]))


def worker_main(eng: Engine, name: str, attach: bool, log_path: str, seed: int,
                cfg: ChaosConfig, stop: mmap.mmap, initial_rows: int) -> None:
    """The body of one forked worker; returns on a clean stop (the caller ``os._exit``s)."""
    log = _Log(log_path)
    log(f"S {os.getpid()} {now_ms()} {'attach' if attach else 'inherit'}")
    rng = random.Random(seed)
    if attach:
        eng = Engine.attach(name)
    known = initial_rows  # row ids below this exist (plus the ones this worker added)
    rnd, randint = rng.random, rng.randint
    lo, hi = cfg.lease_ms
    p_end = cfg.p_abandon, cfg.p_abandon + cfg.p_fail, cfg.p_abandon + cfg.p_fail + cfg.p_release
    p_side = (cfg.p_add, cfg.p_add + cfg.p_prioritize,
              cfg.p_add + cfg.p_prioritize + cfg.p_remove,
              cfg.p_add + cfg.p_prioritize + cfg.p_remove + cfg.p_compact)
    idle = cfg.idle_sleep_ms / 1000
    # workers differ: some render nothing (pure claim/complete churn), some hold batches longer
    pace = rng.choice((0.0, 0.5, 1.0, 2.0))
    p_overrun, p_hold = cfg.p_overrun * pace, cfg.p_hold * pace
    try:
        while not stop[0]:
            u = rnd()
            if u < p_side[3]:
                known = _side_write(eng, log, rng, cfg, known, u, p_side)
                continue

            lease = randint(lo, hi)
            t0 = now_ms()
            c = eng.claim(budget=rng.choice(cfg.budgets), lease_ms=lease)
            t1 = now_ms()
            n = len(c)
            if n == 0:
                time.sleep(idle)
                continue
            rows, toks = c.rows.tolist(), c.tokens.tolist()
            log(f"C {t0} {t1} {lease} "
                + " ".join([f"{r}:{k}" for r, k in zip(rows, toks, strict=True)]))

            u = rnd()
            if u < p_overrun:
                time.sleep(lease * (1.0 + 0.5 * rnd()) / 1000)
            elif u < p_overrun + p_hold:
                time.sleep(cfg.hold_ms * rnd() / 1000)
            if rnd() < cfg.p_renew:
                i = rng.randrange(n)
                lease2 = randint(lo, hi)
                r0 = now_ms()
                try:
                    new_tok: int | None = eng.renew(rows[i], toks[i], lease_ms=lease2)
                except LeaseLost:
                    new_tok = None
                log(f"N {r0} {now_ms()} {lease2} {rows[i]} {toks[i]} "
                    f"{'-' if new_tok is None else new_tok}")
                if new_tok is None:
                    del rows[i], toks[i]
                else:
                    toks[i] = new_tok

            _end_batch(eng, log, rng, cfg, rows, toks, p_end)
        log(f"Q {now_ms()}")
        if attach:
            eng.close()  # ends this owner's leases and frees its slot
    except BaseException:
        log("! " + traceback.format_exc().replace("\n", " | "))
        raise


# =========================================================================== supervisor =====


class _Worker:
    __slots__ = ("pid", "log", "index")

    def __init__(self, pid: int, log: str, index: int) -> None:
        self.pid, self.log, self.index = pid, log, index


def _fork_worker(eng: Engine, name: str, index: int, log_dir: str, cfg: ChaosConfig,
                 stop: mmap.mmap, initial_rows: int) -> _Worker:
    log = os.path.join(log_dir, f"worker-{index:05d}.log")
    attach = index % 2 == 1
    seed = cfg.seed * 1_000_003 + index
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller (pytest, the bench script)
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            worker_main(eng, name, attach, log, seed, cfg, stop, initial_rows)
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    return _Worker(pid, log, index)


def _granted(eng: Engine) -> int:
    return sum(lane["granted"] for lane in eng.stats()["lanes"])


def _wait(pid: int, timeout: float) -> int | None:
    """waitpid with a timeout; the exit status, or None if still running."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if got == pid:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def run_chaos(cfg: ChaosConfig, log_dir: str, name: str,
              progress: Callable[[str], None] | None = None) -> ChaosResult:
    """Create engine ``name``, run the chaos, stop everything, run the oracle, unlink."""
    res = ChaosResult(name=name)
    rng = random.Random(cfg.seed)
    os.makedirs(log_dir, exist_ok=True)
    eng = Engine.create(name, cfg.capacity, POLICIES[0])
    workers: dict[int, _Worker] = {}
    try:
        t = now_ms()
        nrng = np.random.default_rng(cfg.seed)
        eng.add_many(t - nrng.integers(0, 10_000, cfg.rows),
                     nrng.choice(np.array(INTERVALS, np.int64), cfg.rows),
                     nrng.integers(0, 2, cfg.rows),
                     np.where(nrng.random(cfg.rows) < 0.05, 3, 0))
        eng.compact()
        stop = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: seen by every forked worker
        next_index = 0

        def spawn() -> None:
            nonlocal next_index
            w = _fork_worker(eng, name, next_index, log_dir, cfg, stop, cfg.rows)
            next_index += 1
            workers[w.pid] = w
            res.pids.append(w.pid)
            res.workers_started += 1

        def exited(w: _Worker, status: int) -> None:
            del workers[w.pid]
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL) and \
                    os.waitstatus_to_exitcode(status) != 0:
                res.crashed += 1
                res.crash_logs.append(_tail(w.log))

        for _ in range(cfg.workers):
            spawn()
        start = time.monotonic()
        next_kill = start + cfg.kill_every * rng.uniform(0.5, 1.5) if cfg.kill_every else None
        next_check = start
        granted = 0
        while True:
            now = time.monotonic()
            if now - start >= cfg.max_seconds:
                break
            if cfg.seconds is not None and now - start >= cfg.seconds:
                break
            if cfg.claims is not None and now >= next_check:
                granted = _granted(eng)
                next_check = now + 0.5
                if granted >= cfg.claims:
                    break
            for w in list(workers.values()):  # a worker that exited by itself: crashed
                got, status = os.waitpid(w.pid, os.WNOHANG)
                if got == w.pid:
                    exited(w, status)
                    spawn()
            if next_kill is not None and now >= next_kill:
                victim = rng.choice(list(workers.values()))
                try:
                    os.kill(victim.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                gone = _wait(victim.pid, 10.0)
                assert gone is not None, f"SIGKILLed worker {victim.pid} did not die"
                exited(victim, gone)
                res.workers_killed += 1
                if rng.random() < cfg.reap_share:
                    res.reaped_during += eng.reap()
                if cfg.policy_every and res.workers_killed % cfg.policy_every == 0:
                    eng.set_policy(POLICIES[(res.policy_changes + 1) % len(POLICIES)])
                    res.policy_changes += 1
                spawn()
                next_kill = now + cfg.kill_every * rng.uniform(0.5, 1.5)
                if progress and res.workers_killed % 10 == 0:
                    progress(f"{now - start:7.1f} s  killed {res.workers_killed:5d}  "
                             f"granted {granted or _granted(eng):,}")
            time.sleep(0.01)
        res.seconds = time.monotonic() - start
        stop[0] = 1
        _join_all(workers, res, exited)
        if progress:
            progress(f"stopped after {res.seconds:.1f} s; running the oracle")
        oracle(eng, log_dir, res, cfg.rows, drain_hold=cfg.drain_hold)
    finally:
        for w in list(workers.values()):  # only on an error above: leave no process behind
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait(w.pid, 10.0)
        try:
            eng.close()
        finally:
            eng.unlink()
    return res


def _join_all(workers: dict[int, _Worker], res: ChaosResult,
              exited: Callable[[_Worker, int], None]) -> None:
    """Wait for every worker told to stop; SIGKILL a straggler."""
    for w in list(workers.values()):
        gone = _wait(w.pid, 10.0)
        if gone is None:
            res.stragglers += 1
            os.kill(w.pid, signal.SIGKILL)
            gone = _wait(w.pid, 10.0)
            assert gone is not None, f"worker {w.pid} survived SIGKILL"
        exited(w, gone)


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            return path + ":\n" + "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"{path}: {e}"


def children_alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are still children of this process (zombies included)."""
    wanted = set(pids)
    return [pid for pid in _child_pids() if pid in wanted]


def _child_pids() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            found.append(int(entry))
    return found


# =============================================================================== oracle =====


@dataclass
class LeaseLogs:
    """What the workers' logs say, gathered by :func:`read_logs` for the checks below."""

    g_row: array.array[int] = field(default_factory=lambda: array.array("q"))  # grants
    g_t0: array.array[int] = field(default_factory=lambda: array.array("q"))
    g_t1: array.array[int] = field(default_factory=lambda: array.array("q"))
    s_row: array.array[int] = field(default_factory=lambda: array.array("q"))  # successful
    s_start: array.array[int] = field(default_factory=lambda: array.array("q"))
    s_end: array.array[int] = field(default_factory=lambda: array.array("q"))
    lost_cands: list[tuple[int, int, int]] = field(default_factory=list)  # (row, t1, expiry lb)
    ended: dict[str, int] = field(default_factory=lambda: {"complete": 0, "fail": 0,
                                                           "release": 0})
    added: list[int] = field(default_factory=list)
    pending_adds: int = 0
    remove_intents: set[int] = field(default_factory=set)
    removed_ok: set[int] = field(default_factory=set)

    def succeeded(self, row: int, start: int, end: int) -> None:
        self.s_row.append(row)
        self.s_start.append(start)
        self.s_end.append(end)


def oracle(eng: Engine, log_dir: str, res: ChaosResult, initial_rows: int,
           drain_hold: bool = False) -> ChaosResult:
    """Check the logs and the engine once every worker is gone.

    1. No two successful leases of a row overlap (beyond ``TOL_MS``); no grant of a row (to
       anyone, even a worker killed later) falls inside a successful lease of that row; no
       lease is lost before it could have expired (unless its row was being removed).
    2. No row is lost or duplicated: row ids are handed out once, every row is queued unless
       removed.
    3. ``eng.reap()`` then ``eng.verify() == []``.
    4. A drain far in the future returns every queued row exactly once. With ``drain_hold`` it
       keeps every row it takes (a lease of a year, nothing completed), so by its end every
       queued row is in flight at once.
    """
    res.examples = {k: [] for k in (
        "overlap", "intrusion", "early_lost", "lost", "stranded", "drain_dup", "log_error",
        "resurrected", "duplicated")}
    logs = read_logs(log_dir, res)
    res.ended_ok = logs.ended
    check_overlaps(logs, res)
    check_early_losses(logs, res)
    res.reaped_at_end = eng.reap()
    res.verify = eng.verify()
    queued = check_row_ids(eng, logs, res, initial_rows)
    got = drain_check(eng, queued, drain_hold, res.examples)
    res.drained, res.drain_dups = got["drained"], got["drain_dups"]
    res.drain_phantoms, res.stranded = got["drain_phantoms"], got["stranded"]
    res.drain_lane_max = got.get("drain_lane_max", 0)
    res.log_errors += got["refused"]
    res.verify_after_drain = eng.verify()
    return res


def _log_error(res: ChaosResult, what: str) -> None:
    res.log_errors += 1
    if len(res.examples["log_error"]) < 5:
        res.examples["log_error"].append(what)


def read_logs(log_dir: str, res: ChaosResult) -> LeaseLogs:
    """Every worker's log, in file order; counts claims and leases still open at the end."""
    logs = LeaseLogs()
    for fname in sorted(os.listdir(log_dir)):
        if not fname.endswith(".log"):
            continue
        with open(os.path.join(log_dir, fname), "rb") as f:
            lines = f.read().split(b"\n")
        if lines:
            lines.pop()  # "" after the last newline, or a line torn by SIGKILL mid-write
        # row -> [tok, claim t1, expiry lower bound]; a worker holds a row at most once at a
        # time (a re-claim of a row it abandoned supersedes the old lease)
        held: dict[int, list[int]] = {}
        add_open = 0
        for raw in lines:
            p = raw.split()
            if not p:
                continue
            if p[0] == b"a":
                add_open = int(p[1])
            elif p[0] == b"A":
                logs.added.extend(int(v) for v in p[1:])
                add_open = 0
            elif not _lease_line(p, held, logs, res) and not _other_line(p, logs):
                _log_error(res, f"{fname}: unknown line {raw[:80]!r}")
        logs.pending_adds += add_open
        res.open_at_end += len(held)
    return logs


def _other_line(p: list[bytes], logs: LeaseLogs) -> bool:
    """Removals and the lines that need no accounting; False for a line not understood."""
    if p[0] == b"x":
        logs.remove_intents.add(int(p[1]))
    elif p[0] == b"X":
        if p[2] == b"1":
            logs.removed_ok.add(int(p[1]))
    elif p[0] not in (b"S", b"P", b"Z", b"Q", b"!"):  # "!": counted as a crash already
        return False
    return True


def _lease_line(p: list[bytes], held: dict[int, list[int]], logs: LeaseLogs,
                res: ChaosResult) -> bool:
    """One claim, end or renewal line into ``logs``; False when the line is none of these."""
    tag = p[0]
    if tag == b"C":
        t0, t1, lease = int(p[1]), int(p[2]), int(p[3])
        res.claim_calls += 1
        in_batch: set[int] = set()
        for item in p[4:]:
            r_s, k_s = item.split(b":")
            r = int(r_s)
            res.batch_dups += r in in_batch
            in_batch.add(r)
            logs.g_row.append(r)
            logs.g_t0.append(t0)
            logs.g_t1.append(t1)
            held[r] = [int(k_s), t1, t0 + lease]
        res.claims += len(p) - 4
    elif tag == b"K":
        e0, e1 = int(p[1]), int(p[2])
        for item in p[3:]:
            r_s, ok_s = item.split(b":")
            _lease_end(int(r_s), None, ok_s == b"1", "complete", e0, e1, held, logs, res)
    elif tag in (b"F", b"R"):
        _lease_end(int(p[3]), int(p[4]), p[5] == b"1", "fail" if tag == b"F" else "release",
                   int(p[1]), int(p[2]), held, logs, res)
    elif tag == b"N":
        r0, r1, lease, r, k = (int(v) for v in p[1:6])
        h = held.get(r)
        if h is None or h[0] != k:
            _log_error(res, f"renew of a lease not held: {b' '.join(p)!r}")
        elif p[6] == b"-":
            del held[r]
            res.lease_lost += 1
            logs.lost_cands.append((r, r1, h[2]))
        else:
            h[0] = int(p[6])
            h[2] = max(h[2], r0 + lease)
    else:
        return False
    return True


def _lease_end(r: int, tok: int | None, ok: bool, how: str, e0: int, e1: int,
               held: dict[int, list[int]], logs: LeaseLogs, res: ChaosResult) -> None:
    h = held.pop(r, None)
    if h is None or (tok is not None and h[0] != tok):
        _log_error(res, f"end of a lease not held: row {r} ({how})")
    elif ok:
        logs.ended[how] += 1
        logs.succeeded(r, h[1], e0)
    else:
        res.lease_lost += 1
        logs.lost_cands.append((r, e1, h[2]))


def check_overlaps(logs: LeaseLogs, res: ChaosResult) -> None:
    """No two successful leases of a row overlap; no grant of a row falls inside one."""
    if not len(logs.s_row):
        return
    ex = res.examples
    sr, ss, se = (np.frombuffer(a, np.int64) for a in (logs.s_row, logs.s_start, logs.s_end))
    gr, g0, g1 = (np.frombuffer(a, np.int64) for a in (logs.g_row, logs.g_t0, logs.g_t1))
    base = min(int(ss.min()), int(g0.min())) - 1000
    shift = np.int64(1 << 32)
    key = sr * shift + (ss - base)
    order = np.argsort(key, kind="stable")
    sr, ss, se, key = sr[order], ss[order], se[order], key[order]
    end_key = sr * shift + (se - base)
    run_max = np.maximum.accumulate(end_key)
    # sorted by start, interval i overlaps the earlier ones by min(its end, their
    # latest end) - its start (a row's previous rows' ends sort below its starts)
    over = np.nonzero(np.minimum(end_key[1:], run_max[:-1]) - key[1:] > TOL_MS)[0] + 1
    res.overlaps = int(len(over))
    for i in over[:5].tolist():
        a = int(np.nonzero(end_key[: i] == run_max[i - 1])[0][-1])
        ex["overlap"].append({"row": int(sr[i]), "a": (int(ss[a]), int(se[a])),
                              "b": (int(ss[i]), int(se[i]))})
    # a grant of the row strictly inside a successful lease of it
    j = np.searchsorted(key, gr * shift + (g0 - base) - TOL_MS, side="left") - 1
    valid = j >= 0
    jj = np.where(valid, j, 0)
    hit = valid & (sr[jj] == gr) & (se[jj] - TOL_MS > g1) & (ss[jj] + TOL_MS < g0)
    res.intrusions = int(hit.sum())
    for i in np.nonzero(hit)[0][:5].tolist():
        k = int(jj[i])
        ex["intrusion"].append({"row": int(gr[i]), "lease": (int(ss[k]), int(se[k])),
                                "grant": (int(g0[i]), int(g1[i]))})


def check_early_losses(logs: LeaseLogs, res: ChaosResult) -> None:
    """No LeaseLost before the lease could have expired, unless its row was being removed."""
    for r, e1, exp_lb in logs.lost_cands:
        if e1 < exp_lb - TOL_MS and r not in logs.remove_intents:
            res.early_lost += 1
            if len(res.examples["early_lost"]) < 5:
                res.examples["early_lost"].append({"row": r, "end_t1": e1,
                                                   "expiry_at_least": exp_lb})


def check_row_ids(eng: Engine, logs: LeaseLogs, res: ChaosResult,
                  initial_rows: int) -> npt.NDArray[np.bool_]:
    """Row ids handed out once; every row queued unless removed; returns which are queued."""
    ex = res.examples
    stats = eng.stats()
    res.engine_granted = sum(lane["granted"] for lane in stats["lanes"])
    n = res.rows = row_ids_used(eng)
    res.added_logged = len(logs.added)
    res.removed = len(logs.removed_ok)
    # row ids: the supervisor's are [0, initial_rows), the workers' each logged once, in
    # range; rows nobody logged can only be those of an add cut short by SIGKILL
    added = logs.added
    counts = np.bincount(np.array(added, np.int64)) if added else np.zeros(0, np.int64)
    twice = np.nonzero(counts > 1)[0].tolist()
    outside = [r for r in added if not initial_rows <= r < n]
    unlogged = n - initial_rows - len(set(added))
    phantom = max(0, unlogged - logs.pending_adds) + max(0, -unlogged)
    res.duplicated = len(twice) + len(outside) + phantom
    ex["duplicated"] = twice[:5] + outside[:5] + ([f"{phantom} rows nobody added"]
                                                   if phantom else [])
    words = row_words(eng, n)
    returned = (words & VOID_BIT) != 0
    queued = np.array([eng.describe(r)["queued"] for r in range(n)], bool)
    for r in np.nonzero(~queued & ~returned)[0].tolist():
        if r not in logs.remove_intents:
            res.lost += 1
            if len(ex["lost"]) < 5:
                ex["lost"].append(eng.describe(r))
    for r in np.nonzero(queued)[0].tolist():
        if r in logs.removed_ok:
            res.resurrected += 1
            if len(ex["resurrected"]) < 5:
                ex["resurrected"].append(r)
    return queued


# The row word's bits a test may read (csrc/layout.h): a reserved row its writer never wrote
# holds exactly KEY_NONE; one a reaper took back after its writer died is KEY_NONE | VOID.
KEY_NONE = (1 << 49) - 1
VOID_BIT = 1 << 60


def row_ids_used(eng: Engine) -> int:
    """Row ids handed out so far (``stats()["rows"]`` leaves out the ones taken back)."""
    return int(eng._seg.info().rows_used)


def row_words(eng: Engine, n: int) -> npt.NDArray[np.uint64]:
    """The row words of rows [0, n), raw."""
    from engine.shm.segment import ffi, lib

    words = np.zeros(max(n, 1), np.uint64)
    leases = np.zeros(max(n, 1), np.uint64)
    if n:
        assert lib.rl_rows_dump(eng._seg.handle, 0, n, ffi.from_buffer("uint64_t[]", words),
                                ffi.from_buffer("uint64_t[]", leases)) == 0
    return words[:n]


def drain_check(eng: Engine, queued: npt.NDArray[np.bool_], hold: bool = False,
                examples: dict[str, list[Any]] | None = None) -> dict[str, int]:
    """Claim far in the future until nothing comes: every queued row must come exactly once
    (``hold``: keep every lease, so all are in flight at once). Returns the counts."""
    n = len(queued)
    far = now_ms() + 10 * YEAR_MS
    beyond_due = far + 20 * YEAR_MS
    assert beyond_due < 1 << 42
    seen = np.zeros(n, np.int64)
    empty = refused = 0
    while empty < 5:
        c = eng.claim(budget=4096, now_ms=far, lease_ms=YEAR_MS if hold else 60_000)
        if len(c) == 0:
            empty += 1
            continue
        empty = 0
        np.add.at(seen, c.rows, 1)
        if not hold:
            done = eng.complete_many(c.rows, c.tokens, next_due_ms=np.full(len(c), beyond_due),
                                     now_ms=far)
            refused += int((~done).sum())
    out = {"drained": int(seen.sum()), "drain_dups": int((seen > 1).sum()),
           "drain_phantoms": int(((seen > 0) & ~queued).sum()), "refused": refused}
    strand = np.nonzero(queued & (seen == 0))[0]
    out["stranded"] = int(len(strand))
    if hold:
        out["drain_lane_max"] = max(lane["leased"] for lane in eng.stats(now_ms=far)["lanes"])
    if examples is not None:
        examples["stranded"] = [eng.describe(int(r)) for r in strand[:5]]
        examples["drain_dup"] = np.nonzero(seen > 1)[0][:5].tolist()
    return out
