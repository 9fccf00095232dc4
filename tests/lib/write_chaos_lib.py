"""Every write path killed midway: a process loops on one kind of write and is SIGKILLed at a
random instant, over and over; an oracle then reads what it acknowledged and the engine.

Shared by ``tests/chaos/test_write_chaos.py`` (the CI form) and ``bench/chaos_writes.py`` (the long
form, and the before/after figures of a killed ``add_many`` loop). No pytest import: forked
children run this code.

Each victim is forked from the supervisor (it registers its own lease owner on first use) and
logs, one ``os.write`` per line on an ``O_APPEND`` descriptor, a JSON object per event: ``i``
before a write (its intent: what each row it touches will look like once it is done) and ``k``
after it returned (acknowledged). The supervisor kills it ``kill_ms`` after its first write (the
first use maps the engine's pages, which takes longer than that on a large engine), reaps it and
forks the next; kinds run one after another against one engine (``restamp`` against its own,
with lanes disabled, as the write requires).

The oracle (:func:`check_writes`), from a fresh process's view of the engine:

* ``verify()`` is empty (it reaps the dead writers' marks first);
* every acknowledged write is visible: a row's state is its last acknowledged write's, or one of
  the writes attempted after that (killed, so neither promised nor forbidden);
* no row is lost (queued unless a remove was attempted), stranded (the drain of
  ``chaos_lib.drain_check`` returns every queued row once) or counted but empty (a reserved row
  never written: ``stats()["rows"]`` equals queued + removed rows);
* after ``reap()`` no row is leased by a dead victim, and the policy is one a victim set (or
  the first).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from chaos_lib import (
    KEY_NONE,
    POLICIES,
    ROOT,
    VOID_BIT,
    drain_check,
    now_ms,
    row_ids_used,
    row_words,
)

from engine import CapacityError, Engine, LanePolicy, LeaseLost
from engine.errors import EngineValueError

KINDS = ("add", "add_many", "complete", "complete_many", "fail", "release", "release_many",
         "prioritize", "remove", "set_policy", "restamp")
ADD_BURST = 64  # adds between two log lines
PAST_MS = 86_400_000  # rewritten rows are made due a day ago, so the next claim finds them


@dataclass
class WriteChaosConfig:
    kinds: tuple[str, ...] = KINDS
    kills: int = 20                        # SIGKILLs per kind
    kill_ms: tuple[int, int] = (20, 120)   # a victim lives this long (ms)
    rows: int = 20_000                     # rows queued before the victims start
    capacity: int = 1 << 18
    batch: int = 8                         # rows per batch write (add_many, complete_many, ...)
    seed: int = 0


@dataclass
class WriteChaosResult:
    kills: dict[str, int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)   # acknowledged writes per kind
    rows: int = 0
    queued: int = 0
    removed: int = 0
    empty: int = 0                  # rows reserved but never written, nor taken back
    miscounted: int = 0             # stats()["rows"] - queued - removed - lost (empty rows)
    taken_back: int = 0             # reserved rows a repair took back (not in the rows)
    lost: int = 0                   # not queued, and no remove was attempted
    unseen: int = 0                 # an acknowledged write not visible
    leased: int = 0                 # rows still leased by a dead victim
    bad_policy: int = 0
    marks_before: int = 0           # verify() problems a fresh process saw before any reap
    verify: list[str] = field(default_factory=list)
    drain: dict[str, int] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)
    examples: dict[str, list[Any]] = field(default_factory=dict)

    def problems(self) -> list[str]:
        counts = ("empty", "miscounted", "lost", "unseen", "leased", "bad_policy")
        out = [f"{k} = {getattr(self, k)}" for k in counts if getattr(self, k)]
        out += [f"drain {k} = {v}" for k, v in self.drain.items() if k != "drained" and v]
        if self.verify:
            out.append(f"verify: {self.verify[:5]}")
        return out + [f"crashed: {c}" for c in self.crashed]

    def summary(self) -> str:
        return "\n".join([f"kills {self.kills}", f"acked {self.acked}",
                          f"rows {self.rows}, queued {self.queued}, removed {self.removed},"
                          f" empty {self.empty}, miscounted {self.miscounted},"
                          f" taken back {self.taken_back}, lost {self.lost},"
                          f" unseen {self.unseen},"
                          f" leased {self.leased}, bad policy {self.bad_policy}",
                          f"fresh verify before reap: {self.marks_before} problem(s);"
                          f" after: {len(self.verify)}", f"drain {self.drain}"]
                         + [f"example {k}: {v[:3]}" for k, v in self.examples.items() if v])


# =============================================================================== victims =====


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def __call__(self, tag: str, exp: dict[int, dict[str, Any]], **extra: Any) -> None:
        line = json.dumps({"t": tag, "exp": {str(r): e for r, e in exp.items()}, **extra})
        os.write(self.fd, (line + "\n").encode())


def _claimed(eng: Engine, n: int) -> Any:
    """Leases on up to ``n`` due rows (long leases: the victim dies holding some)."""
    return eng.claim(budget=n, lease_ms=600_000)


def _adds(eng: Engine, log: _Log, rng: random.Random, n: int, one: bool) -> None:
    """A burst of adds in a tight loop (arrays made beforehand), so a kill lands in the C call
    as often as it would in a plain add loop; one intent before, one acknowledgement after."""
    t = now_ms()
    due = np.array([t - rng.randint(0, 5000) for _ in range(n)], np.int64)
    ivl = np.array([rng.choice((1, 5, 60, 3600)) for _ in range(n)], np.int64)
    log("i", {}, add=n * ADD_BURST)
    got = []
    for _ in range(ADD_BURST):
        got.append([eng.add(int(due[0]), int(ivl[0]))] if one else eng.add_many(due, ivl))
    rows = np.concatenate(got).tolist()
    log("k", {r: {"queued": True, "due_ms": int(due[i % n])} for i, r in enumerate(rows)},
        add=n * ADD_BURST)


def _ends(eng: Engine, log: _Log, rng: random.Random, kind: str, n: int, seq: list[int]) -> None:
    """Claim a batch and end it with ``kind``; the new due times are unique marks."""
    c = _claimed(eng, n)
    if not len(c):
        return
    rows, toks, dues = c.rows.tolist(), c.tokens.tolist(), c.due_ms.tolist()
    base = now_ms() - PAST_MS
    marks = [base + seq[0] + i for i in range(len(rows))]
    seq[0] += len(rows)
    if kind in ("release", "release_many"):
        exp = {r: {"queued": True, "due_ms": d} for r, d in zip(rows, dues, strict=True)}
    else:
        exp = {r: {"queued": True, "due_ms": m} for r, m in zip(rows, marks, strict=True)}
    if kind in ("complete", "fail", "release"):
        rows, toks, marks = rows[:1], toks[:1], marks[:1]
        exp = {rows[0]: exp[rows[0]]}
    log("i", exp)
    if kind == "complete_many":
        ok = eng.complete_many(rows, toks, next_due_ms=marks).tolist()
    elif kind == "release_many":
        ok = eng.release_many(rows, toks).tolist()
    else:
        ok = [True]
        try:
            if kind == "complete":
                eng.complete(rows[0], toks[0], next_due_ms=marks[0])
            elif kind == "fail":
                eng.fail(rows[0], toks[0], retry_at_ms=marks[0])
            else:
                eng.release(rows[0], toks[0])
        except LeaseLost:
            ok = [False]
    log("k", {r: e for (r, e), good in zip(exp.items(), ok, strict=True) if good})


def _rows_touch(eng: Engine, log: _Log, rng: random.Random, kind: str, known: int) -> None:
    row = rng.randrange(known)
    if kind == "remove":
        exp: dict[str, Any] = {"queued": False}
    else:
        mode = rng.choice(("rush", "wait"))
        exp = {"queued": True, "urgent": mode == "rush"}
    log("i", {row: exp})
    try:
        if kind == "remove":
            eng.remove(row)
        else:
            eng.prioritize(row, "rush" if exp["urgent"] else "wait")
    except EngineValueError:
        log("k", {}, refused=row)  # removed already: nothing written
        return
    log("k", {row: exp})


def _ready(fd: int) -> int:
    """Tell the supervisor this victim is past its first write (once); the fd left, -1."""
    if fd >= 0:
        os.write(fd, b"r")
        os.close(fd)
    return -1


def victim_main(eng: Engine, kind: str, log_path: str, seed: int, batch: int, known: int,
                ready: int) -> None:
    """Loop on one kind of write until killed; a byte to ``ready`` after the first write (the
    first use of the engine registers this process and maps every page: not what is killed)."""
    log, rng, seq = _Log(log_path), random.Random(seed), [seed % 1_000_000 * 1000]
    while True:
        if kind in ("add", "add_many"):
            try:
                _adds(eng, log, rng, 1 if kind == "add" else batch, kind == "add")
            except CapacityError:
                # full: nothing more to add; the supervisor kills it once it is ready
                ready = _ready(ready)
                time.sleep(60)
        elif kind in ("complete", "complete_many", "fail", "release", "release_many"):
            _ends(eng, log, rng, kind, batch, seq)
        elif kind in ("prioritize", "remove"):
            _rows_touch(eng, log, rng, kind, known)
        elif kind == "set_policy":
            i = rng.randrange(len(POLICIES))
            log("i", {}, policy=i)
            eng.set_policy(POLICIES[i])
            log("k", {}, policy=i)
        elif kind == "restamp":
            eng.add_many(np.full(batch, now_ms() - 1000), rng.choice((5, 60, 3600)))
            eng.restamp(limit=rng.randint(1, 3 * batch))
        ready = _ready(ready)


# ============================================================================ supervisor =====


def _fork_victim(eng: Engine, kind: str, log_path: str, seed: int, cfg: WriteChaosConfig,
                 known: int) -> tuple[int, int]:
    """The victim's pid, and the pipe it says it is ready on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        os.close(r)
        try:
            victim_main(eng, kind, log_path, seed, cfg.batch, known, w)
        except BaseException as e:  # noqa: BLE001 - reported through the exit status and log
            os.write(os.open(log_path, os.O_WRONLY | os.O_APPEND), f"! {e!r}\n".encode())
            code = 3
        os._exit(code)
    os.close(w)
    return pid, r


def kill_loop(eng: Engine, kind: str, cfg: WriteChaosConfig, log_dir: str, rng: random.Random,
              res: WriteChaosResult, known: int) -> None:
    """Fork, let live ``kill_ms``, SIGKILL, reap; ``cfg.kills`` times for ``kind``."""
    for i in range(cfg.kills):
        log_path = os.path.join(log_dir, f"{kind}-{i:05d}.log")
        pid, ready = _fork_victim(eng, kind, log_path, rng.getrandbits(31), cfg, known)
        select.select([ready], [], [], 60.0)
        os.close(ready)
        time.sleep(rng.uniform(*cfg.kill_ms) / 1000)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            res.crashed.append(f"{log_path}: exit {os.waitstatus_to_exitcode(status)}")
    res.kills[kind] = res.kills.get(kind, 0) + cfg.kills


def fresh_verify(name: str, reap: bool = True) -> list[str]:
    """``verify()`` from a process that never touched the engine (``reap=False``: the raw walk a
    fresh process got before dead writers were repaired: how the problem was first seen)."""
    code = ("import json, sys; from engine import Engine\n"
            "e = Engine.attach(sys.argv[1])\n"
            "walk = getattr(e, 'verify_walk', None)\n"
            "w = walk() if (walk and sys.argv[2] == '0') else None\n"
            "raw = w.problems + w.marks if w else e.verify()\n"
            "print(json.dumps(raw)); e.close()\n")
    out = subprocess.run([sys.executable, "-c", code, name, "1" if reap else "0"], check=True,
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    return list(json.loads(out.stdout))


# ================================================================================ oracle =====


def read_events(log_dir: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every victim's events in the order they happened (victims ran one after another)."""
    events = []
    for kind in kinds:
        for fname in sorted(f for f in os.listdir(log_dir) if f.startswith(kind + "-")):
            with open(os.path.join(log_dir, fname), "rb") as f:
                lines = f.read().split(b"\n")
            for raw in lines[:-1]:  # the last: "" after a newline, or a line cut by SIGKILL
                if raw.startswith(b"{"):
                    events.append(json.loads(raw))
    return events


def _expected(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per row, the states it may be in: its last acknowledged write's, and those of the writes
    attempted after it (the first is None when nothing was acknowledged: any state)."""
    allowed: dict[int, list[dict[str, Any] | None]] = {}
    for ev in events:
        for r_s, exp in ev["exp"].items():
            r = int(r_s)
            if ev["t"] == "k":
                allowed[r] = [exp]
            else:
                allowed.setdefault(r, [None]).append(exp)
    return {r: [e for e in v if e is not None] for r, v in allowed.items() if v[0] is not None}


def _matches(desc: dict[str, Any], exp: dict[str, Any]) -> bool:
    return all(desc.get(k) == v for k, v in exp.items())


def check_acknowledged(eng: Engine, events: list[dict[str, Any]], res: WriteChaosResult) -> None:
    ex = res.examples.setdefault("unseen", [])
    for row, states in _expected(events).items():
        desc = eng.describe(row)
        if not any(_matches(desc, e) for e in states):
            res.unseen += 1
            if len(ex) < 5:
                ex.append({"row": row, "is": desc, "may be": states})


def check_rows(eng: Engine, events: list[dict[str, Any]], res: WriteChaosResult,
               now: int) -> npt.NDArray[np.bool_]:
    """No row counted but empty, lost, or leased by a dead victim; returns which are queued."""
    removing = {int(r) for ev in events for r, e in ev["exp"].items() if not e["queued"]}
    removing |= {ev["refused"] for ev in events if "refused" in ev}
    n = row_ids_used(eng)
    words = row_words(eng, n)
    stats = eng.stats(now_ms=now)
    rows, queued_n, removed, lost_n = int(stats["rows"]), int(stats["queued"]), 0, 0
    maybe_removed = np.zeros(n, bool)
    maybe_removed[sorted(r for r in removing if r < n)] = True
    never = (words == KEY_NONE) & ~maybe_removed
    res.empty += int(never.sum())
    res.examples.setdefault("empty", []).extend(np.nonzero(never)[0][:5].tolist())
    queued = np.zeros(n, bool)
    lost = res.examples.setdefault("lost", [])
    for r in range(n):
        d = eng.describe(r, now_ms=now)
        queued[r] = d["queued"]
        res.leased += d["leased"]
        if d["queued"] or never[r] or words[r] & VOID_BIT:
            continue
        if maybe_removed[r]:
            removed += 1
        else:
            lost_n += 1
            if len(lost) < 5:
                lost.append(d)
    res.rows, res.queued = res.rows + rows, res.queued + queued_n
    res.taken_back += n - rows
    res.removed, res.lost = res.removed + removed, res.lost + lost_n
    res.miscounted += rows - queued_n - removed - lost_n
    return queued


def check_policy(eng: Engine, events: list[dict[str, Any]], res: WriteChaosResult,
                 first: LanePolicy) -> None:
    allowed, sets = [first], [ev for ev in events if "policy" in ev]
    for ev in sets:
        allowed = [POLICIES[ev["policy"]]] if ev["t"] == "k" else allowed + [
            POLICIES[ev["policy"]]]
    res.bad_policy = int(eng.policy not in allowed)


def run_write_chaos(cfg: WriteChaosConfig, log_dir: str, name: str,
                    progress: Callable[[str], None] | None = None) -> WriteChaosResult:
    """Kill every kind of write ``cfg.kills`` times, then run the oracle."""
    rng, res = random.Random(cfg.seed), WriteChaosResult()
    main_kinds = tuple(k for k in cfg.kinds if k != "restamp")
    with Engine.create(name, cfg.capacity, POLICIES[0]) as eng:
        t = now_ms()
        eng.add_many(np.array([t - rng.randint(0, 60_000) for _ in range(cfg.rows)], np.int64),
                     np.array([rng.choice((5, 60, 3600)) for _ in range(cfg.rows)], np.int64))
        for kind in main_kinds:
            kill_loop(eng, kind, cfg, log_dir, rng, res, cfg.rows)
            if progress:
                progress(f"{kind}: {cfg.kills} kills")
        oracle_writes(eng, name, log_dir, main_kinds, res)
    if "restamp" in cfg.kinds:
        with Engine.create(name + "-r", cfg.capacity, LanePolicy(lanes_enabled=False)) as eng:
            eng.add_many(np.full(cfg.rows // 10, now_ms() - 1000), 60)
            kill_loop(eng, "restamp", cfg, log_dir, rng, res, cfg.rows // 10)
            oracle_writes(eng, name + "-r", log_dir, ("restamp",), res)
    return res


def oracle_writes(eng: Engine, name: str, log_dir: str, kinds: tuple[str, ...],
                  res: WriteChaosResult) -> None:
    events = read_events(log_dir, kinds)
    for ev in events:
        if ev["t"] == "k":
            res.acked["writes"] = res.acked.get("writes", 0) + 1
    res.marks_before += len(fresh_verify(name, reap=False))
    res.verify += fresh_verify(name)
    eng.reap()  # the dead victims' leases end now, not at their expiry
    now = now_ms()
    check_acknowledged(eng, events, res)
    queued = check_rows(eng, events, res, now)
    if "set_policy" in kinds:
        check_policy(eng, events, res, POLICIES[0])
    got = drain_check(eng, queued)
    for k, v in got.items():
        res.drain[k] = res.drain.get(k, 0) + v
