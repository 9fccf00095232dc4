"""The public engine: writes, claims, statistics and verification over one shared segment.

Every method validates its whole input in Python first (clear ``EngineValueError`` /
``EngineTypeError``, nothing changed), then makes one call into the C core. The C core checks
ranges again, so a caller that bypasses this layer still cannot corrupt the segment.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .errors import EngineError, EngineTypeError, EngineValueError, SegmentExists
from .keys import STRIDE, as_int64_array, check_due_array, check_due_ms, ndim_of
from .policy import MAX_INTERVAL_S, PROVENANCES, LanePolicy
from .segment import (
    OWNER_ALIVE,
    OWNER_DEAD,
    Segment,
    _fork_generation,
    check,
    ffi,
    is_running,
    lib,
    owner_state,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DEFAULT_LEASE_MS = 30_000
DEFAULT_WINDOW = 140
MAX_BUDGET = 1 << 16
ARENA = 1 << 13  # int64 values per claim-result arena
_U64 = (1 << 64) - 1
_PROVENANCE_CODE = {name: code for code, name in enumerate(PROVENANCES)}

_PROBLEMS = {
    lib.RL_V_BELOW_FLOOR: "live row below its lane's floor",
    lib.RL_V_NOT_FINDABLE: "queued row in neither the index nor the recent-write ring",
    lib.RL_V_INDEX_ORDER: "index out of order",
    lib.RL_V_INDEX_ROW: "index entry points at no row",
    lib.RL_V_UNKNOWN_OWNER: "lease held by an unknown owner",
    lib.RL_V_BAD_KEY: "row key names a lane past the layout",
    lib.RL_V_LANE_START: "lane start table disagrees with the index",
    lib.RL_V_HEADER: "header sizes disagree",
    lib.RL_V_RING_MIN: "recent write below its lane's ring minimum",
}


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _int(value: object, what: str, lo: int, hi: int) -> int:
    """One integer in [lo, hi]; bools, floats and None are refused, not coerced."""
    if value is None:
        raise EngineValueError(f"{what} is absent (None)")
    if isinstance(value, (bool, np.bool_, np.timedelta64, np.datetime64)) or not isinstance(
            value, numbers.Integral):
        raise EngineTypeError(f"{what} must be an integer, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise EngineValueError(f"{what} must be in [{lo}, {hi}], got {v}")
    return v


class Claim(NamedTuple):
    row: int
    lane: int
    due_ms: int
    token: int


class Claims:
    """The rows one claim pass leased: four int64 arrays of the same length.

    They are views of the part of an arena the C pass filled (rows, lanes, due_ms, tokens,
    ``budget`` apart from ``offset``), made when asked for. ``rows`` and ``tokens`` are kept
    once made (until the batch is completed), so ``Engine.complete_many(batch.rows,
    batch.tokens)`` of the latest batch can recognise them and hand the C core their arena
    address instead of converting them. No later claim writes there.
    """

    __slots__ = ("_buf", "_o", "_n", "_b", "_rows", "_tokens")

    def __init__(self, buf: IntArray, offset: int, n: int, budget: int) -> None:
        self._buf = buf
        self._o = offset
        self._n = n
        self._b = budget
        self._rows: IntArray | None = None
        self._tokens: IntArray | None = None

    def _field(self, k: int) -> IntArray:
        start = self._o + k * self._b
        return self._buf[start: start + self._n]

    @property
    def rows(self) -> IntArray:
        v = self._rows
        if v is None:
            v = self._rows = self._buf[self._o: self._o + self._n]
        return v

    @property
    def lanes(self) -> IntArray:
        return self._field(1)

    @property
    def due_ms(self) -> IntArray:
        return self._field(2)

    @property
    def tokens(self) -> IntArray:
        v = self._tokens
        if v is None:
            v = self._tokens = self._field(3)
        return v

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Claim]:
        fields = [self._field(k).tolist() for k in range(4)]
        for i in range(self._n):
            yield Claim(fields[0][i], fields[1][i], fields[2][i], fields[3][i])

    def __repr__(self) -> str:
        return f"Claims(n={self._n}, rows={self.rows.tolist()})"


class Engine:
    """A claim engine over one named shared-memory segment (see the package README)."""

    def __init__(self, seg: Segment, creator_pid: int | None) -> None:
        self._seg = seg
        self._creator_pid = creator_pid
        self._out_row = ffi.new("int64_t[1]")
        self._advice = ffi.new("uint32_t *")
        # Claim results (and complete_many's ok flags) are carved from arenas, so the hot calls
        # allocate no numpy array of their own: each result keeps its arena alive, and a full
        # arena is replaced, never reused.
        self._arena: IntArray = np.empty(0, np.int64)
        self._arena_ptr: Any = ffi.NULL
        self._arena_off = 0
        self._arena_len = 0
        self._ok_arena: BoolArray = np.empty(0, np.bool_)
        self._ok_ptr: Any = ffi.NULL
        self._ok_off = 0
        # The request block of the hot calls (csrc/lanes.h rl_req): handle and owner, bound for
        # this process (`_bound` = the fork generation it was bound in), and the last budget,
        # lease and window, rewritten only when a call asks for others.
        self._req: Any = ffi.new("rl_req *")
        self._bound = -1
        self._rb = self._rl = self._rw = 0
        self._last: Claims | None = None  # the latest claim, for complete_many's fast path

    # -- lifetime ------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, capacity: int, policy: LanePolicy | None = None, *,
               ring_capacity: int | None = None, exist_ok: bool = False) -> Engine:
        """Create the segment and own it (this process unlinks it on ``close``/``unlink``).

        ``exist_ok=True`` takes over a segment of that name left by a crashed owner instead of
        failing: it attaches, reclaims dead owners' leases, and becomes the owner.
        """
        name = _name(name)
        capacity = _int(capacity, "capacity", 1, (1 << 31))
        if policy is None:
            policy = LanePolicy()
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        ring = min(1 << 18, max(64, capacity)) if ring_capacity is None else _int(
            ring_capacity, "ring_capacity", 1, 1 << 28)
        try:
            seg = Segment.create(name, capacity, ring, policy, wall_ms())
        except SegmentExists:
            if not exist_ok:
                raise
            eng = cls(Segment.attach(name, 5.0), os.getpid())
            eng.reap()
            return eng
        return cls(seg, os.getpid())

    @classmethod
    def attach(cls, name: str, timeout: float = 5.0) -> Engine:
        """Attach to an existing segment; never unlinks it. ``LayoutMismatch`` if not ours."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                math.isfinite(timeout) and timeout >= 0):
            raise EngineValueError("timeout must be a finite number of seconds >= 0")
        return cls(Segment.attach(_name(name), float(timeout)), None)

    @property
    def name(self) -> str:
        return self._seg.name

    @property
    def is_owner(self) -> bool:
        return self._creator_pid == os.getpid()

    def close(self) -> None:
        """Unmap this process's view (ending its leases). The segment stays: see ``unlink``."""
        self._seg.close()

    def unlink(self) -> None:
        """Remove the segment's name (open mappings stay valid until closed). Owner's job."""
        Segment.unlink(self.name)
        self._creator_pid = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close, and unlink if this process created the segment."""
        owner = self.is_owner
        self.close()
        if owner:
            try:
                self.unlink()
            except EngineError:
                pass  # already removed (lanes cleanup, or an explicit unlink)

    def __del__(self) -> None:
        seg = getattr(self, "_seg", None)
        if seg is not None:
            seg.close()  # unmaps; never unlinks

    # -- checkpoints (engine/checkpoint.py) ------------------------------------------------------

    def save(self, path: str | os.PathLike[str], urls: Any = None) -> int:
        """Write the whole schedule to ``path`` atomically (temp file + rename); returns the rows
        saved. ``urls`` (row id -> URL), if given, is saved with it. Leases are not saved."""
        from . import checkpoint

        return checkpoint.save(self, path, urls)

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str, capacity: int | None = None,
             policy: LanePolicy | None = None) -> Engine:
        """Create engine ``name`` holding a saved schedule (row ids renumbered from 0 in saved
        order); the saved capacity and policy unless given."""
        from . import checkpoint

        ck = checkpoint.read(path)
        cap = max(ck.capacity, len(ck), 1) if capacity is None else capacity
        eng = cls.create(name, cap, ck.policy if policy is None else policy)
        try:
            checkpoint.restore(ck, eng)
        except BaseException:
            eng.close()
            eng.unlink()
            raise
        return eng

    # -- small helpers ---------------------------------------------------------------------------

    @property
    def _h(self) -> Any:
        return self._seg.handle

    def _rows_used(self) -> int:
        return int(self._seg.info().rows_used)

    def _row(self, row: object) -> int:
        r = _int(row, "row", 0, (1 << 31))
        if r >= self._rows_used():
            raise EngineValueError(f"row {r} does not exist")
        return r

    @staticmethod
    def _now(now_ms: object) -> int:
        if now_ms is None:
            return time.time_ns() // 1_000_000
        if type(now_ms) is int and 0 <= now_ms < STRIDE:
            return now_ms
        return check_due_ms(now_ms, "now_ms")

    @staticmethod
    def _token(token: object) -> int:
        """A token is an opaque 64-bit value carried as int64 (it may be negative)."""
        return _int(token, "token", -(1 << 63), (1 << 63) - 1)

    def _hot(self) -> tuple[Any, int]:
        """The C handle and this process's owner id, by attribute reads on the hot path."""
        seg = self._seg
        if seg._handle is None or seg._owner_gen != _fork_generation[0]:
            return seg.handle, seg.owner  # raises EngineClosed / registers after a fork
        return seg._handle, seg._owner

    def _bind(self) -> None:
        """Point the request block at this process's handle and owner (raises if closed)."""
        h, owner = self._hot()
        self._req.s = h
        self._req.owner = owner
        self._bound = _fork_generation[0]

    def _after(self, advice: int) -> None:
        """Act on what the C core advised: merge the ring, or repair after a dead owner."""
        if advice & lib.RL_ADVISE_REAP:
            self._repair()
        if advice & lib.RL_ADVISE_COMPACT:
            status = lib.rl_compact(self._h, self._seg.owner, 0)
            if status != lib.RL_E_BUSY:
                check(status, "compact")

    def _repair(self) -> int:
        out = ffi.new("uint32_t *")
        status = lib.rl_repair(self._h, self._seg.owner, out)
        if status == lib.RL_E_BUSY:
            return 0
        check(status, "repair")
        return int(out[0])

    # -- writes ----------------------------------------------------------------------------------

    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int:
        """Queue one row; returns its row id."""
        due = check_due_ms(due_ms)
        interval = _int(interval_s, "interval_s", 1, MAX_INTERVAL_S)
        prov = _provenance_code(provenance)
        fails = _int(failures, "failures", 0, 255)
        d, i, p, f = (ffi.new("int64_t[1]", [v]) for v in (due, interval, prov, fails))
        self._advice[0] = 0
        check(lib.rl_add_many(self._h, self._seg.owner, 1, d, i, p, f, self._out_row,
                              self._advice), "add")
        self._after(self._advice[0])
        return int(self._out_row[0])

    def add_many(self, due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                 failures: Any = None) -> IntArray:
        """Queue many rows at once; every element is checked before any row is written."""
        due = check_due_array(due_ms)
        n = len(due)
        interval = _broadcast(interval_s, n, "interval_s", 1, MAX_INTERVAL_S)
        prov = _provenance_array(provenance, n)
        fails = np.zeros(n, np.int64) if failures is None else _broadcast(
            failures, n, "failures", 0, 255)
        out = np.empty(n, np.int64)
        if n == 0:
            return out
        self._advice[0] = 0
        check(lib.rl_add_many(self._h, self._seg.owner, n, _ptr(due), _ptr(interval), _ptr(prov),
                              _ptr(fails), _ptr(out), self._advice), "add_many")
        self._after(self._advice[0])
        return out

    def complete(self, row: int, token: int, next_due_ms: int | None = None,
                 now_ms: int | None = None) -> None:
        """End the lease and reschedule (default ``now + interval``). ``LeaseLost`` if stale."""
        ok = self.complete_many([self._row(row)], [self._token(token)],
                                None if next_due_ms is None else [check_due_ms(next_due_ms,
                                                                               "next_due_ms")],
                                now_ms)
        if not ok[0]:
            check(lib.RL_E_LEASE, f"complete row {row}")

    def complete_many(self, rows: Any, tokens: Any, next_due_ms: Any = None,
                      now_ms: int | None = None) -> BoolArray:
        """Complete a batch in one call; returns which leases were still held (and completed)."""
        last = self._last
        if (last is not None and rows is last._rows and tokens is last._tokens
                and rows is not None and next_due_ms is None and last._buf is self._arena):
            # The arrays of the latest claim, unchanged objects: their arena address is known,
            # so they go to the C core without conversion (it checks every row id as before).
            if type(now_ms) is int and 0 <= now_ms < STRIDE:
                now = now_ms
            else:
                now = self._now(now_ms)
            n = last._n
            if n == 0:
                return np.zeros(0, np.bool_)
            if self._bound != _fork_generation[0] or self._seg._handle is None:
                self._bind()
            off = self._ok_slot(n)
            p = self._arena_ptr + last._o
            v = _complete_req(self._req, n, p, p + 3 * last._b, now, self._ok_ptr + off)
            # Done with them: drop the cached views, so they are freed with the caller's
            # temporaries here rather than when the next claim replaces this batch.
            self._last = last._rows = last._tokens = None
            if v >> 32:
                if v < 0:
                    if v == lib.RL_E_RANGE:
                        raise EngineValueError("rows holds a row id that does not exist")
                    check(v, "complete_many")
                self._after(v >> 32)
            return self._ok_arena[off: off + n]
        r, t = _int64_vector(rows, "rows"), _int64_vector(tokens, "tokens")
        if len(r) != len(t):
            raise EngineValueError(f"rows ({len(r)}) and tokens ({len(t)}) differ in length")
        # Row ids and next due times are range-checked by the C core, all of them before it
        # changes anything (RL_E_RANGE); a token that is not a live lease just reports False.
        nxt = ffi.NULL
        if next_due_ms is not None:
            nd = check_due_array(next_due_ms, "next_due_ms")
            if len(nd) != len(r):
                raise EngineValueError("next_due_ms and rows differ in length")
            nxt = _ptr(nd)
        now = self._now(now_ms)
        ok = np.zeros(len(r), np.bool_)
        if len(r) == 0:
            return ok
        self._advice[0] = 0
        h, owner = self._hot()
        status = lib.rl_complete_many(h, owner, len(r), _ptr(r), _ptr(t), nxt, now,
                                      ffi.from_buffer("uint8_t[]", ok), self._advice)
        if status < 0:
            if status == lib.RL_E_RANGE:
                raise EngineValueError("rows holds a row id that does not exist")
            check(status, "complete_many")
        if self._advice[0]:
            self._after(self._advice[0])
        return ok

    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None) -> None:
        """Count a failure, derive the lane again (cold after ``cold_after``), back off."""
        r, t = self._row(row), self._token(token)
        retry = -1 if retry_at_ms is None else check_due_ms(retry_at_ms, "retry_at_ms")
        now = self._now(now_ms)
        self._advice[0] = 0
        check(lib.rl_fail(self._h, self._seg.owner, r, t & _U64, retry, now, self._advice),
              f"fail row {r}")
        self._after(self._advice[0])

    def release(self, row: int, token: int) -> None:
        """Give the row back unrendered; its schedule is unchanged."""
        r, t = self._row(row), self._token(token)
        check(lib.rl_release(self._h, self._seg.owner, r, t & _U64), f"release row {r}")

    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int:
        """Extend a lease (a long render); returns the new token, the old one is now stale."""
        r, t = self._row(row), self._token(token)
        lease = _int(lease_ms, "lease_ms", 1, STRIDE - 1)
        out = ffi.new("int64_t *")
        check(lib.rl_renew(self._h, self._seg.owner, r, t & _U64, self._now(now_ms), lease,
                           ffi.cast("uint64_t *", out)), f"renew row {r}")
        return int(out[0])

    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None:
        """``"rush"``: urgent lane, due now. ``"wait"``: own lane, due now."""
        r = self._row(row)
        if not isinstance(mode, str) or mode not in ("rush", "wait"):
            raise EngineValueError(f"mode must be 'rush' or 'wait', got {mode!r}")
        now = self._now(now_ms)
        self._advice[0] = 0
        check(lib.rl_prioritize(self._h, self._seg.owner, r, 1 if mode == "rush" else 0, now,
                                self._advice), f"prioritize row {r} (removed?)")
        self._after(self._advice[0])

    def remove(self, row: int) -> None:
        r = self._row(row)
        check(lib.rl_remove(self._h, self._seg.owner, r, ffi.NULL), f"remove row {r} (removed?)")

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, budget: int = 16, now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
              window: int = DEFAULT_WINDOW) -> Claims:
        """Lease up to ``budget`` due rows across lanes, as the policy shares them."""
        now, b = self._claim_setup(budget, now_ms, lease_ms, window)
        off = self._claim_slot(b)
        v = _claim_req(self._req, now, off)
        return self._claimed(v, off, b, "claim")

    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = 16,
                           now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                           window: int = DEFAULT_WINDOW) -> tuple[BoolArray, Claims]:
        """``complete_many(rows, tokens)`` then ``claim(budget, ...)`` at the same ``now_ms``, in
        one call into the C core: a worker's whole cycle with one crossing. Returns what
        ``complete_many`` and ``claim`` return, as ``(ok, batch)``. Every argument is checked
        before anything changes: bad input raises and neither completes nor claims."""
        now, b = self._claim_setup(budget, now_ms, lease_ms, window)
        last = self._last
        if (last is not None and rows is last._rows and tokens is last._tokens
                and rows is not None and last._buf is self._arena):
            n = last._n
            rp = self._arena_ptr + last._o
            tp = rp + 3 * last._b
            self._last = last._rows = last._tokens = None
        else:
            r, t = _int64_vector(rows, "rows"), _int64_vector(tokens, "tokens")
            if len(r) != len(t):
                raise EngineValueError(f"rows ({len(r)}) and tokens ({len(t)}) differ in length")
            n = len(r)
            rp, tp = (_ptr(r), _ptr(t)) if n else (ffi.NULL, ffi.NULL)
        ok_off = self._ok_slot(n)
        off = self._claim_slot(b)  # after the rows' pointers: a new arena keeps the old alive
        v = _complete_claim_req(self._req, n, rp, tp, now, self._ok_ptr + ok_off, off)
        if v == lib.RL_E_RANGE:
            self._ok_off, self._arena_off = ok_off, off
            raise EngineValueError("rows holds a row id that does not exist")
        batch = self._claimed(v, off, b, "complete_and_claim")
        return self._ok_arena[ok_off: ok_off + n], batch

    def _claim_setup(self, budget: object, now_ms: object, lease_ms: object,
                     window: object) -> tuple[int, int]:
        """Check a claim's arguments and put them in the request block; returns (now, budget).

        The hot path: plain ints in range pass by type checks alone; anything else takes the
        full validation (and its clear error)."""
        b = budget if type(budget) is int and 0 < budget <= MAX_BUDGET else _int(
            budget, "budget", 1, MAX_BUDGET)
        lease = lease_ms if type(lease_ms) is int and 0 < lease_ms < STRIDE else _int(
            lease_ms, "lease_ms", 1, STRIDE - 1)
        win = window if type(window) is int and 0 < window <= 1 << 30 else _int(
            window, "window", 1, 1 << 30)
        if now_ms is None:
            now = time.time_ns() // 1_000_000
        elif type(now_ms) is int and 0 <= now_ms < STRIDE:
            now = now_ms
        else:
            now = check_due_ms(now_ms, "now_ms")
        if self._bound != _fork_generation[0] or self._seg._handle is None:
            self._bind()
        if b != self._rb or lease != self._rl or win != self._rw:
            req = self._req
            req.budget, req.lease_ms, req.window = b, lease, win
            self._rb, self._rl, self._rw = b, lease, win
        return now, b

    def _claim_slot(self, b: int) -> int:
        """Reserve room for ``b`` results in the claim arena; returns its offset."""
        off = self._arena_off
        if off + 4 * b > self._arena_len:
            self._arena = np.empty(max(ARENA, 4 * b), np.int64)
            self._arena_ptr = self._req.arena = ffi.from_buffer("int64_t[]", self._arena)
            self._arena_len = len(self._arena)
            off = 0
        self._arena_off = off + 4 * b
        return off

    def _ok_slot(self, n: int) -> int:
        """Reserve room for ``n`` completion flags in the ok arena; returns its offset."""
        off = self._ok_off
        if off + n > len(self._ok_arena):
            self._ok_arena = np.zeros(max(ARENA, n), np.bool_)
            self._ok_ptr = ffi.from_buffer("uint8_t[]", self._ok_arena)
            off = 0
        self._ok_off = off + n
        return off

    def _claimed(self, v: int, off: int, b: int, what: str) -> Claims:
        """The Claims of a C result ``count | advice << 32`` (or a negative status)."""
        if v >> 32:  # advice in the high half, or a negative status
            if v < 0:
                self._arena_off = off
                check(v, what)
            self._after(v >> 32)
        c = self._last = Claims(self._arena, off, v & 0xFFFFFFFF, b)
        return c

    # -- reading ---------------------------------------------------------------------------------

    def describe(self, row: int, now_ms: int | None = None) -> dict[str, Any]:
        """Everything the row table holds about one row (true due time, never a raw key)."""
        r = self._row(row)
        out = ffi.new("rl_row_info *")
        check(lib.rl_row_info_get(self._h, r, self._now(now_ms), out))
        queued = bool(out.queued)
        return {
            "row": r,
            "queued": queued,
            "due_ms": int(out.due_ms) if queued else None,
            "lane": int(out.lane) if queued else None,
            "interval_s": int(out.interval_s),
            "failures": int(out.failures),
            "provenance": PROVENANCES[out.provenance],
            "urgent": bool(out.urgent),
            "leased": out.lease_expiry_ms >= 0,
            "lease_expiry_ms": int(out.lease_expiry_ms) if out.lease_expiry_ms >= 0 else None,
        }

    def due_ms(self, row: int) -> int | None:
        """The row's true due time (None once removed)."""
        due: int | None = self.describe(row)["due_ms"]
        return due

    def lane(self, row: int) -> int | None:
        lane: int | None = self.describe(row)["lane"]
        return lane

    def lane_name(self, lane: int) -> str:
        return self.policy.lane_name(_int(lane, "lane", 0, lib.RL_MAX_LANES - 1))

    def floor_minute(self, lane: int) -> int:
        """The lane's claim floor in minutes since the epoch; 0 means no floor."""
        return int(self._lane_stats(wall_ms())[_int(lane, "lane", 0, lib.RL_MAX_LANES - 1)]
                   .floor_word >> 32)

    @property
    def policy(self) -> LanePolicy:
        return self._seg.policy()

    def set_policy(self, policy: LanePolicy) -> None:
        """Change the policy live for every attached process; no row is rewritten."""
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        self._seg.set_policy(policy)

    def _lane_stats(self, now: int) -> Any:
        lanes = ffi.new("rl_lane_stats[]", lib.RL_MAX_LANES)
        check(lib.rl_stats(self._h, now, lanes))
        return lanes

    def stats(self, now_ms: int | None = None) -> dict[str, Any]:
        now = self._now(now_ms)
        info = self._seg.info()
        policy = self.policy
        lanes = self._lane_stats(now)
        credits = ffi.new("int64_t[]", lib.RL_CLASSES)
        check(lib.rl_credit_get(self._h, credits))
        shown = [i for i in range(lib.RL_MAX_LANES)
                 if i < policy.lane_count or lanes[i].queued or lanes[i].granted]
        return {
            "name": self.name,
            "layout_version": int(info.layout_version),
            "capacity": int(info.row_capacity),
            "rows": int(info.rows_used),
            "queued": sum(int(lanes[i].queued) for i in range(lib.RL_MAX_LANES)),
            "bytes": int(info.total_bytes),
            "index": {"entries": int(info.index_count), "generation": int(info.index_gen)},
            "ring": {"capacity": int(info.ring_capacity),
                     "pending": int(info.ring_tail - info.ring_head)},
            "credits": {c: int(credits[i]) / lib.RL_ONE
                        for i, c in enumerate(("urgent", "submitted", "discovered", "cold"))},
            "lanes": [
                {
                    "lane": i,
                    "name": policy.lane_name(i),
                    "floor_minute": int(lanes[i].floor_word >> 32),
                    "queued": int(lanes[i].queued),
                    "due": int(lanes[i].due),
                    "leased": int(lanes[i].leased),
                    "granted": int(lanes[i].granted),
                    "spilled": int(lanes[i].spilled),
                    "stale_skipped": int(lanes[i].stale_skipped),
                    "lease_refused": int(lanes[i].lease_refused),
                }
                for i in shown
            ],
        }

    def verify(self) -> list[str]:
        """Walk the segment; one line per broken invariant (empty when all hold)."""
        cap = 64
        out = ffi.new("rl_problem[]", cap)
        found = ffi.new("uint32_t *")
        check(lib.rl_verify(self._h, out, cap, found))
        problems = []
        for i in range(min(int(found[0]), cap)):
            p = out[i]
            what = _PROBLEMS.get(p.code, f"problem {p.code}")
            problems.append(f"{what}: row {p.row}, lane {p.lane}, detail {p.detail}")
        if found[0] > cap:
            problems.append(f"... and {found[0] - cap} more")
        return problems

    check = verify

    # -- maintenance -----------------------------------------------------------------------------

    def compact(self, full: bool = False) -> None:
        """Merge recent writes into the sorted index now (``full``: rebuild from the row table)."""
        if not isinstance(full, bool):
            raise EngineTypeError(f"full must be a bool, got {full!r}")
        owner = self._seg.owner
        while (status := lib.rl_compact(self._h, owner, 1 if full else 0)) == lib.RL_E_BUSY:
            time.sleep(0.001)
        check(status, "compact")

    def restamp(self, limit: int = 5000) -> dict[str, Any]:
        """Re-encode up to ``limit`` rows written with lanes disabled into their lanes."""
        lim = _int(limit, "limit", 1, 10_000_000)
        done, left = ffi.new("uint32_t *"), ffi.new("uint32_t *")
        check(lib.rl_restamp(self._h, self._seg.owner, lim, done, left),
              "restamp (refused while lanes are enabled)")
        return {"restamped": int(done[0]), "done": not left[0]}

    def reap(self) -> int:
        """Find owners whose process is gone (pid + start time), reclaim their leases at once.

        Returns how many dead owners were found. Claim passes notice dead lease holders by
        themselves; this also catches processes that died holding no lease mid-write.
        """
        dead = 0
        for owner, pid, start, word in self._seg.owners():
            state = owner_state(word)
            if state != OWNER_ALIVE:
                dead += state == OWNER_DEAD
                continue
            if not is_running(pid, start):
                check(lib.rl_owner_mark_dead(self._h, owner, word))
                dead += 1
        if dead:
            self._repair()
        return dead

    def __repr__(self) -> str:
        state = "closed" if self._seg._handle is None else "open"
        return f"<Engine {self.name!r} {state}>"


# -- argument helpers ---------------------------------------------------------------------------


def _name(name: object) -> str:
    if not isinstance(name, str):
        raise EngineTypeError("name must be a str")
    if not name or len(name) > 200 or "/" in name or "\0" in name:
        raise EngineValueError(f"bad segment name {name!r}: 1-200 characters, no '/'")
    return name


_claim_req = lib.rl_claim_req  # module-level names: one lookup less on the hot calls
_complete_req = lib.rl_complete_req
_complete_claim_req = lib.rl_complete_claim_req


def _ptr(arr: IntArray) -> Any:
    return ffi.from_buffer("int64_t[]", arr)


def _int64_vector(values: Any, what: str) -> IntArray:
    """Pass a 1-d contiguous int64 array through untouched (a Claims field); copy the rest."""
    if (type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1
            and values.flags.c_contiguous):
        return values
    return as_int64_array(values, what)


def _broadcast(values: Any, n: int, what: str, lo: int, hi: int) -> IntArray:
    """A scalar or an n-array of integers in [lo, hi], as an int64 n-array (checked even when
    n is 0, so an empty batch cannot smuggle a bad scalar through)."""
    if ndim_of(values, what) == 0:
        return np.full(n, _int(values, what, lo, hi), np.int64)
    arr = as_int64_array(values, what)
    if len(arr) != n:
        raise EngineValueError(f"{what} has {len(arr)} elements, due_ms has {n}")
    if len(arr) and (arr.min() < lo or arr.max() > hi):
        raise EngineValueError(f"{what} must lie in [{lo}, {hi}]")
    return np.ascontiguousarray(arr)


def _provenance_code(value: object) -> int:
    if isinstance(value, str):
        if value not in _PROVENANCE_CODE:
            raise EngineValueError(f"unknown provenance {value!r} (known: {PROVENANCES})")
        return _PROVENANCE_CODE[value]
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
            value, (bool, np.bool_, np.timedelta64)):
        if int(value) not in (0, 1):
            raise EngineValueError(f"provenance code must be 0 or 1, got {value}")
        return int(value)
    raise EngineTypeError(f"provenance must be 'submitted', 'discovered', 0 or 1, got {value!r}")


def _provenance_array(values: Any, n: int) -> IntArray:
    if isinstance(values, str) or ndim_of(values, "provenance") == 0:
        return np.full(n, _provenance_code(values), np.int64)
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError, TypeError):
        raise EngineValueError("provenance must be a flat array") from None
    if arr.ndim != 1 or len(arr) != n:
        raise EngineValueError(f"provenance must have {n} elements")
    if arr.dtype.kind in "UO":
        codes = np.full(n, -1, np.int64)
        for name, code in _PROVENANCE_CODE.items():
            codes[arr == name] = code
        if (codes < 0).any():
            i = int(np.argmax(codes < 0))
            raise EngineValueError(f"provenance[{i}] = {arr[i]!r} is not one of {PROVENANCES}")
        return codes
    if arr.dtype.kind in "iu":
        codes = arr.astype(np.int64)
        if ((codes != 0) & (codes != 1)).any():
            raise EngineValueError("provenance codes must be 0 (submitted) or 1 (discovered)")
        return codes
    raise EngineTypeError(f"provenance must be strings or 0/1 codes, got dtype {arr.dtype}")
