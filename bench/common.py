"""What every benchmark shares: the corpus, timing rounds, figure records, the machine, cleanup.

A benchmark here is a script that measures and prints; none of them is a timed test. Each one
writes its figures as JSON (``--out``); ``bench/run_all.py`` runs them all, judges the figures
against the README's targets and writes ``bench/results/latest.json``. Every script takes
``--smoke`` (tiny sizes, seconds), which is what CI runs.

A figure is a dict: ``id``, ``label``, ``unit``, ``better`` ("lower"/"higher"), and either the
measurement (``median``, ``min``, ``max``, ``runs``, ``values``) or ``skipped`` with the reason
(with ``stalled`` set when the reason is that the engine granted nothing).
A ratio between two systems is always computed from measurements taken in the same run.
"""

from __future__ import annotations

import argparse
import atexit
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine import STRIDE, Engine, LanePolicy  # noqa: E402
from engine.policy import CLASSIC_FLOORS, COARSE_BANDS, band_weights  # noqa: E402
from engine.shm.segment import Segment  # noqa: E402

NOW = 1_800_000_000_000
DAY_MS = 86_400_000
BUDGET = 16
BENCH_POLICY = LanePolicy(ttl_bands=COARSE_BANDS, min_share=CLASSIC_FLOORS,
                          weights=band_weights(COARSE_BANDS))
"""The benchmarks' layout, the one their figures have always been measured on (the default
before it weighed its lanes by their intervals): ten lanes over the bands 1 h / 6 h / 24 h, so
the peers (bench_python_peers, bench_servers) model the same lanes. The default itself,
``LanePolicy()``, is measured by bench_constraints (e) on rows of each corpus's shape."""
LANES = 10  # BENCH_POLICY's lane count: urgent, submitted/b0..b3, discovered/b0..b3, cold
PRODUCTION_INTERVALS = (1800, 3600, 8 * 3600, 30 * 3600, 48 * 3600)
PRODUCTION = LanePolicy(ttl_bands=COARSE_BANDS, min_share=CLASSIC_FLOORS)
"""The production deployment's layout (issue 38, bench_constraints (f)): bands 1 h / 6 h / 24 h,
floors 0.10 discovered and 0.02 cold, the default's lateness remainder with weights derived
from the intervals each lane holds."""

# ---------------------------------------------------------------------------------- corpus ----


def corpus(n: int, seed: int = 7, overdue_days: tuple[int, int] = (3, 30)) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n rows spread over the default policy's lanes, due `overdue_days` ago (all due at NOW
    by default). A negative lower bound puts part of the corpus in the future."""
    rng = np.random.default_rng(seed)
    due = NOW - rng.integers(overdue_days[0] * DAY_MS, overdue_days[1] * DAY_MS, n)
    interval = rng.choice(np.array([1800, 3600 * 4, 3600 * 12, 3600 * 48]), n)
    prov = rng.integers(0, 2, n)
    failures = np.where(rng.random(n) < 0.02, 5, 0)
    return due, interval, prov, failures


def production_rows(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows of the production shape: every one overdue by 3 to 30 days, intervals drawn
    from PRODUCTION_INTERVALS (so the two busiest lanes each hold 30 min and 1 h rows), 46 %
    discovered, 2 % failed into the cold lane."""
    rng = np.random.default_rng(38)
    interval = rng.choice(np.array(PRODUCTION_INTERVALS, np.int64), n)
    prov = (rng.random(n) < 0.46).astype(np.int64)  # 1: discovered
    due = NOW - rng.integers(3 * DAY_MS, 30 * DAY_MS, n)
    return due, interval, prov, np.where(rng.random(n) < 0.02, 5, 0)


SHAPES = ("bench", "production")
_shape = ["bench"]


def use_shape(shape: str) -> None:
    """What new_engine fills an engine with when not told: ``bench`` (the corpus over
    BENCH_POLICY's ten lanes) or ``production`` (production_rows under PRODUCTION)."""
    if shape not in SHAPES:
        raise SystemExit(f"--shape: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    _shape[0] = shape


def corpus_lanes(interval: np.ndarray, prov: np.ndarray, failures: np.ndarray,
                 policy: LanePolicy | None = None) -> np.ndarray:
    """The lane the engine derives for each row (the corpus has only a few distinct inputs)."""
    policy = policy or BENCH_POLICY
    lanes = np.empty(len(interval), np.int64)
    combo = np.stack([interval, prov, failures], axis=1)
    uniq, inverse = np.unique(combo, axis=0, return_inverse=True)
    names = ("submitted", "discovered")
    table = np.array([policy.lane_for(names[p], int(i), int(f)) for i, p, f in uniq], np.int64)
    lanes[:] = table[inverse.ravel()]
    return lanes


def corpus_keys(n: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """The corpus as engine keys (lane * 2**42 + due_ms) with each row's interval in ms, for the
    peers that keep their own sorted structure."""
    due, interval, prov, failures = corpus(n, seed)
    lanes = corpus_lanes(interval, prov, failures)
    return lanes * STRIDE + due, interval * 1000


# ---------------------------------------------------------------------- engines and cleanup ----

_segments: dict[str, int] = {}  # name -> pid of the creator


def seg_name(tag: str) -> str:
    return f"rl-bench-{tag}-{os.getpid()}-{len(_segments)}"


def new_engine(tag: str, n: int, policy: LanePolicy | None = None, rows: Any = None,
               capacity: int | None = None) -> Engine:
    """A fresh engine filled with the shape's rows (use_shape; or `rows` = (due, interval, prov,
    failures)) under its policy (or `policy`), merged; its segment is unlinked at exit even on
    Ctrl-C or an exception."""
    name = seg_name(tag)
    production = _shape[0] == "production"
    eng = Engine.create(name, capacity=capacity or n,
                        policy=policy or (PRODUCTION if production else BENCH_POLICY))
    _segments[name] = os.getpid()
    try:
        if rows is None:
            rows = production_rows(n) if production else corpus(n)
        if len(rows[0]):
            eng.add_many(*rows)
        eng.compact()
    except BaseException:
        drop(eng)
        raise
    return eng


def drop(eng: Engine) -> None:
    """Close and unlink an engine made by new_engine."""
    name = eng.name
    eng.close()
    if _segments.pop(name, None) is not None:
        try:
            Segment.unlink(name)
        except Exception:
            pass


_cleanups: list[Callable[[], None]] = []


def on_exit(fn: Callable[[], None]) -> None:
    """Run `fn` when this process exits (normally, by exception, Ctrl-C or SIGTERM)."""
    _cleanups.append(fn)


def _cleanup() -> None:
    me = os.getpid()
    while _cleanups:
        try:
            _cleanups.pop()()
        except Exception as exc:  # keep cleaning
            print(f"cleanup: {exc}", file=sys.stderr)
    for name, pid in list(_segments.items()):
        if pid == me:
            try:
                Segment.unlink(name)
            except Exception:
                pass
            _segments.pop(name, None)


atexit.register(_cleanup)


def _on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds finally blocks, then atexit


signal.signal(signal.SIGTERM, _on_term)

# ------------------------------------------------------------------------------ measuring ----


def figure(fid: str, label: str, unit: str, values: Sequence[float], better: str = "lower",
           note: str = "") -> dict[str, Any]:
    vals = [float(v) for v in values]
    return {"id": fid, "label": label, "unit": unit, "better": better,
            "median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "runs": len(vals), "values": vals, "note": note}


def skipped(fid: str, label: str, reason: str, unit: str = "") -> dict[str, Any]:
    return {"id": fid, "label": label, "unit": unit, "skipped": reason}


def stalled(fid: str, label: str, reason: str, unit: str = "") -> dict[str, Any]:
    """A figure the engine gave no measurement for: its claims granted nothing while due rows
    were queued. Shaped like a skipped figure (no median), so no table reads it as fast."""
    return {**skipped(fid, label, reason, unit), "stalled": True}


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-run ratios a/b of two series measured side by side (run i of a beside run i of b)."""
    return [x / y for x, y in zip(a, b, strict=True) if y > 0]


def timed_ns() -> int:
    return time.perf_counter_ns()


def _child_memory() -> dict[str, float]:
    """Peak resident set (VmHWM) and the pages this process alone holds (USS), in MiB."""
    hwm = 0.0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        uss = psutil.Process().memory_full_info().uss / 2**20
    except Exception:
        uss = float("nan")
    return {"peak_rss_mib": hwm, "uss_mib": uss}


def run_clients(procs: int, seconds: float, setup: Callable[[int], Any],
                step: Callable[[Any], int], teardown: Callable[[Any], None] | None = None,
                quota: int | None = None) -> dict[str, Any]:
    """Fork `procs` workers. Each calls setup(i) -> state, waits for the others, then calls
    step(state) (one claim + complete cycle, returning rows done) for `seconds`, or until it
    has done `quota` rows: pass half the corpus over `procs`, so that a fast system is timed on
    a backlog that is still there, not on an empty queue (completions go to now + interval).

    Returns rows/s summed over workers, per worker, and each worker's memory. A worker that
    fails makes this raise; none is left running.
    """
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ready = ctx.Barrier(procs + 1)

    def work(i: int) -> None:
        try:
            state = setup(i)
            ready.wait(60)
            done = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while True:
                for _ in range(20):
                    done += step(state)
                if time.perf_counter() >= deadline or (quota and done >= quota):
                    break
            secs = time.perf_counter() - t0
            mem = _child_memory()
            if teardown:
                teardown(state)
            q.put(("ok", done, secs, mem))
        except BaseException as exc:  # report, never hang the parent
            q.put(("error", repr(exc), 0.0, {}))
            try:
                ready.abort()
            except Exception:
                pass

    ps = [ctx.Process(target=work, args=(i,), daemon=True) for i in range(procs)]
    for p in ps:
        p.start()
    try:
        try:
            ready.wait(120)
        except threading.BrokenBarrierError:
            pass  # a worker failed before the start: every worker reports, the error below
        results = [q.get(timeout=seconds + 120) for _ in ps]
    finally:
        for p in ps:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    # the worker that failed first, not the others it stopped at the barrier
    errors = sorted((r[1] for r in results if r[0] != "ok"), key=lambda e: "BrokenBarrier" in e)
    if errors:
        raise RuntimeError(f"worker failed: {errors[0]}")
    per = [done / secs for _, done, secs, _ in results]
    return {"total": sum(per), "per_proc": statistics.mean(per),
            "peak_rss_mib": max(r[3]["peak_rss_mib"] for r in results),
            "uss_mib": max(r[3]["uss_mib"] for r in results)}


# ------------------------------------------------------------------------------- machine ----


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("Hypervisor vendor:"):
                cpu += f" ({line.split(':', 1)[1].strip()} guest)"
    except (OSError, subprocess.SubprocessError):
        pass
    vm = psutil.virtual_memory()
    return {
        "cpu": cpu,
        "cores": psutil.cpu_count(logical=True),
        "memory_gib": round(vm.total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit(),
    }


def commit() -> str:
    """The commit the figures were measured on, ``-dirty`` when tracked files differ from it,
    so a saved run names the code it measured."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=5, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.strip() + ("-dirty" if dirty.strip() else "")


# --------------------------------------------------------------------------------- scripts ----


def parse_args(doc: str | None, extra: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds (CI)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    if extra:
        extra(ap)  # a script's own options
    return ap.parse_args()


def finish(script: str, args: argparse.Namespace, figures: list[dict[str, Any]],
           started: float) -> None:
    """Print the figures and write them as JSON."""
    for f in figures:
        print(describe(f))
    doc = {"script": script, "smoke": bool(args.smoke), "machine": machine(),
           "seconds": round(time.perf_counter() - started, 1), "figures": figures}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))


def fmt(value: float, unit: str = "") -> str:
    if unit in ("rows/s", "claims/s"):
        return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.1f} k"
    if unit == "x":
        return f"{value:.2f}" if value < 10 else f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def describe(f: dict[str, Any]) -> str:
    if "skipped" in f:
        return f"{f['label']}: {'STALLED' if f.get('stalled') else 'SKIPPED'} ({f['skipped']})"
    u = f["unit"]
    rng = f" [{fmt(f['min'], u)} .. {fmt(f['max'], u)}, {f['runs']} runs]" if f["runs"] > 1 else ""
    return f"{f['label']}: {fmt(f['median'], u)} {u}{rng}"


class Slot:
    """An engine of n rows kept for one purpose, rebuilt (and `prepare`d again) before its due
    backlog runs low; `prepare` sets up the state a part needs (rows held, say)."""

    def __init__(self, tag: str, n: int, prepare: Callable[[Engine], Any] | None = None) -> None:
        self.tag, self.n, self.prepare = tag, n, prepare
        self.eng: Engine | None = None
        self.taken = 0
        self.state: Any = None

    def get(self, rows_needed: int) -> Engine:
        if self.eng is None or self.taken + rows_needed > self.n // 2:
            self.close()
            self.eng = new_engine(self.tag, self.n)
            self.taken = 0
            self.state = self.prepare(self.eng) if self.prepare else None
        self.taken += rows_needed
        return self.eng

    def close(self) -> None:
        if self.eng is not None:
            drop(self.eng)
            self.eng = None
