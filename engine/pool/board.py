"""The pool board: per-worker render counters, the pool's clock and its stop flag, shared by name.

The engine counts claims per lane; only the workers know how renders went (how long they took,
which failed, how stale each page was when it was rendered). Each worker owns one slot of this
board and is its only writer, so no atomics are needed: an aligned 8-byte store is never torn,
and readers (the supervisor's live view, ``lanes stats --prometheus``, ``lanes serve-metrics``)
sum the slots. The supervisor writes the header: its pid, the clock, the stop flag.

It lives in ``/dev/shm/<engine>.pool`` (see ``shmfile``), so it is reachable under every start
method and from unrelated processes, and is removed with the engine's segment.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import shmfile
from ..errors import EngineValueError, LayoutMismatch

SUFFIX = "pool"
LANES = 64
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the render-duration histogram; one more bucket holds the rest."""
LATENCY_STEPS = 8
"""The per-lane histograms split each ``DURATION_BUCKETS`` bucket past the first into this many
log-even steps, so a quantile read from them is a measurement (its bucket is at most 15 %
wide, 10 -> 30 s in steps of x1.147) and not a guess inside a bucket 2.5 times wide; the coarse
buckets Prometheus sees are exact sums of the fine ones (``coarse``)."""


def _fine_bounds(bounds: tuple[float, ...], steps: int) -> tuple[float, ...]:
    out = [bounds[0]]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out += [lo * (hi / lo) ** (j / steps) for j in range(1, steps)] + [hi]  # hi exact
    return tuple(out)


LATENCY_BOUNDS = _fine_bounds(DURATION_BUCKETS, LATENCY_STEPS)
"""Upper bounds (seconds) of the per-lane latency histograms (``lane_hist``)."""
LATENCY_BUCKETS = len(LATENCY_BOUNDS) + 1
_ROLLUP = (np.searchsorted(DURATION_BUCKETS, (*LATENCY_BOUNDS, np.inf))[:, None]
           == np.arange(len(DURATION_BUCKETS) + 1)).astype(np.int64)
"""[fine bucket, coarse bucket]: 1 where the fine one lies in the coarse one."""


def coarse(counts: Any) -> Any:
    """Fine latency counts (last axis ``LATENCY_BUCKETS``) summed into ``DURATION_BUCKETS``'."""
    return np.asarray(counts, dtype=np.int64) @ _ROLLUP


# Header words (int64).
_MAGIC = 0x314452414F424C52  # "RLBOARD1"
VERSION = 4
"""The board's layout version: bump it whenever a header word or a slot field moves or grows,
so a reader of another version is refused (``LayoutMismatch``) instead of misreading counters."""
H_MAGIC, H_VERSION, H_SLOTS, H_FIELDS, H_PID, H_START_MS, H_STOP, H_RESTARTS = range(8)
H_ORIGIN_MS, H_WALL_ORIGIN_MS, H_SCALE_MICRO, H_CHECKPOINTS, H_CHECKPOINT_MS = range(8, 13)
HEADER = 16

# Slot fields (int64), one row per worker slot.
F_PID, F_RENDERS, F_FAILURES, F_RELEASED, F_LEASE_LOST, F_DURATION_US, F_RENEWED = range(7)
F_BUCKETS = 7
F_LANE_RENDERS = F_BUCKETS + len(DURATION_BUCKETS) + 1
F_LANE_AGE_MILLI = F_LANE_RENDERS + LANES  # sum of age / TTL, in thousandths
BUCKETS = len(DURATION_BUCKETS) + 1
OK, FAILED = 0, 1
"""The outcome axis of the per-lane histograms."""
F_LANE_HIST = F_LANE_AGE_MILLI + LANES  # [lane][outcome][bucket] render counts
F_LANE_DURATION_US = F_LANE_HIST + LANES * 2 * LATENCY_BUCKETS  # [lane][outcome] duration sum
F_CURRENT_ROW = F_LANE_DURATION_US + LANES * 2  # the row being rendered, plus 1 (0: none)
F_STARTS = F_CURRENT_ROW + 1  # worker processes started in this slot (the first one included)
FIELDS = F_STARTS + 1

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Clock:
    """The pool's time: wall time, or wall time sped up ``scale`` times from ``origin_ms``.

    ``lanes demo`` runs at several hundred times real speed, so that a 60 s run covers hours
    of a corpus whose TTLs are hours; a production pool runs at scale 1 on the wall clock.
    """

    origin_ms: int
    wall_origin_ms: int
    scale: float = 1.0

    @classmethod
    def wall(cls, scale: float = 1.0, origin_ms: int | None = None) -> Clock:
        now = time.time_ns() // 1_000_000
        return cls(now if origin_ms is None else origin_ms, now, scale)

    def now_ms(self) -> int:
        wall = time.time_ns() // 1_000_000
        return self.origin_ms + int((wall - self.wall_origin_ms) * self.scale)

    def virtual_ms(self, real_ms: float) -> int:
        """A real duration (a lease, a timeout) in the pool's time."""
        return max(1, int(real_ms * self.scale))


class Board:
    """A view of ``/dev/shm/<engine>.pool``."""

    def __init__(self, buf: mmap.mmap, name: str) -> None:
        if len(buf) % 8:
            buf.close()
            raise LayoutMismatch(f"{name}.{SUFFIX} is not a render-lanes pool board")
        words = np.frombuffer(buf, np.int64)
        if len(words) < HEADER or words[H_MAGIC] != _MAGIC:
            raise LayoutMismatch(f"{name}.{SUFFIX} is not a render-lanes pool board")
        if words[H_VERSION] != VERSION:
            raise LayoutMismatch(f"{name}.{SUFFIX} is a pool board of layout v"
                                 f"{int(words[H_VERSION])}; this engine reads v{VERSION}")
        slots, fields = int(words[H_SLOTS]), int(words[H_FIELDS])
        if fields != FIELDS or len(words) != HEADER + slots * fields:
            raise LayoutMismatch(f"{name}.{SUFFIX} has another layout")
        self.name = name
        self._buf = buf
        self._header = words[:HEADER]
        self._slots = words[HEADER:].reshape(slots, fields)

    @classmethod
    def create(cls, name: str, slots: int, clock: Clock, pid: int, start_ms: int) -> Board:
        if not 1 <= slots <= 4096:
            raise EngineValueError(f"slots must lie in [1, 4096], got {slots}")
        header = np.zeros(HEADER, np.int64)
        header[[H_MAGIC, H_VERSION, H_SLOTS, H_FIELDS, H_PID, H_START_MS]] = (
            _MAGIC, VERSION, slots, FIELDS, pid, start_ms)
        header[[H_ORIGIN_MS, H_WALL_ORIGIN_MS, H_SCALE_MICRO]] = (
            clock.origin_ms, clock.wall_origin_ms, round(clock.scale * 1e6))
        shmfile.create(name, SUFFIX, header.tobytes(), (HEADER + slots * FIELDS) * 8)
        return cls.attach(name)

    @classmethod
    def attach(cls, name: str) -> Board:
        return cls(shmfile.attach(name, SUFFIX, writable=True, min_size=HEADER * 8), name)

    @staticmethod
    def unlink(name: str) -> bool:
        return shmfile.unlink(name, SUFFIX)

    @staticmethod
    def path(name: str) -> str:
        return shmfile.path_of(name, SUFFIX)

    def close(self) -> None:
        del self._header, self._slots
        try:
            self._buf.close()
        except BufferError:
            pass  # a slot handed out is still referenced: the map goes with its last view

    # -- the supervisor's words ------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        h = self._header
        return Clock(int(h[H_ORIGIN_MS]), int(h[H_WALL_ORIGIN_MS]), int(h[H_SCALE_MICRO]) / 1e6)

    @property
    def supervisor(self) -> tuple[int, int]:
        """(pid, process start time in ms) of the supervisor that created the board."""
        return int(self._header[H_PID]), int(self._header[H_START_MS])

    @property
    def stopping(self) -> bool:
        return bool(self._header[H_STOP])

    def request_stop(self) -> None:
        self._header[H_STOP] = 1

    def note_restart(self) -> None:
        self._header[H_RESTARTS] += 1

    def note_checkpoint(self, at_ms: int) -> None:
        self._header[H_CHECKPOINTS] += 1
        self._header[H_CHECKPOINT_MS] = at_ms

    # -- a worker's slot -------------------------------------------------------------------------

    @property
    def slots(self) -> int:
        return len(self._slots)

    def slot(self, i: int) -> Int64Array:
        """Worker ``i``'s row of counters (its only writer is that worker)."""
        row: Int64Array = self._slots[i]
        return row

    # -- reading ---------------------------------------------------------------------------------

    def totals(self) -> dict[str, Any]:
        """Counters summed over every slot (a consistent-enough snapshot: each word is whole).

        ``lane_hist[lane, outcome]`` counts renders per ``LATENCY_BOUNDS`` bucket (the last
        one: slower than every bound), ``outcome`` being ``OK`` or ``FAILED``;
        ``lane_duration_s[lane, outcome]`` is the sum of those renders' durations.
        """
        s = self._slots.sum(axis=0)
        h = self._header
        return {
            "renders": int(s[F_RENDERS]),
            "failures": int(s[F_FAILURES]),
            "released": int(s[F_RELEASED]),
            "lease_lost": int(s[F_LEASE_LOST]),
            "renewed": int(s[F_RENEWED]),
            "duration_s": int(s[F_DURATION_US]) / 1e6,
            "duration_buckets": [int(v) for v in s[F_BUCKETS:F_LANE_RENDERS]],
            "lane_renders": s[F_LANE_RENDERS:F_LANE_AGE_MILLI].copy(),
            "lane_age_sum": s[F_LANE_AGE_MILLI:F_LANE_HIST] / 1000.0,
            "lane_hist": s[F_LANE_HIST:F_LANE_DURATION_US].reshape(LANES, 2,
                                                                   LATENCY_BUCKETS).copy(),
            "lane_duration_s": s[F_LANE_DURATION_US:F_CURRENT_ROW].reshape(LANES, 2) / 1e6,
            "restarts": int(h[H_RESTARTS]),
            "checkpoints": int(h[H_CHECKPOINTS]),
            "checkpoint_ms": int(h[H_CHECKPOINT_MS]),
        }


    def workers(self) -> list[dict[str, int | None]]:
        """Per slot: its worker's pid (0 before the first start), the row it is rendering (None
        between renders), its renders and failures, and how often its process was restarted."""
        return [{"slot": i, "pid": int(s[F_PID]),
                 "row": int(s[F_CURRENT_ROW]) - 1 if s[F_CURRENT_ROW] else None,
                 "renders": int(s[F_RENDERS]), "failures": int(s[F_FAILURES]),
                 "restarts": max(0, int(s[F_STARTS]) - 1)}
                for i, s in enumerate(self._slots)]


def record_render(slot: Int64Array, lane: int, seconds: float, age_over_ttl: float,
                  ok: bool) -> None:
    """Count one finished render in a worker's slot."""
    bucket = int(np.searchsorted(DURATION_BUCKETS, seconds))
    slot[F_RENDERS if ok else F_FAILURES] += 1
    slot[F_DURATION_US] += int(seconds * 1e6)
    slot[F_BUCKETS + bucket] += 1
    if not 0 <= lane < LANES:
        return
    cell = lane * 2 + (OK if ok else FAILED)
    fine = int(np.searchsorted(LATENCY_BOUNDS, seconds))
    slot[F_LANE_HIST + cell * LATENCY_BUCKETS + fine] += 1
    slot[F_LANE_DURATION_US + cell] += int(seconds * 1e6)
    if ok:
        slot[F_LANE_RENDERS + lane] += 1
        slot[F_LANE_AGE_MILLI + lane] += int(age_over_ttl * 1000)
