"""The public engine: writes, claims, statistics and verification over one shared segment.

Every method validates its whole input first (clear ``EngineValueError`` /
``EngineTypeError``, nothing changed), then makes one call into the C core: in Python here, or,
for the plain cases of the three hot calls, in C (csrc/hot.c, which falls back to the checks
here for anything else). The C core checks ranges again, so a caller that bypasses this layer
still cannot corrupt the segment.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .. import _hot, checkpoint
from ..api import (
    DEFAULT_LEASE_MS,
    BoolArray,
    Claim,
    ClaimBatch,
    IntArray,
    QueueEngine,
    Restamped,
    RowInfo,
    Stats,
    VerifyWalk,
)
from ..checks import (
    broadcast,
    check_bool,
    check_int,
    check_lease_ms,
    check_mode,
    check_now,
    check_token,
    choice_code,
    choice_codes,
    claim_args,
    is_number,
    rows_tokens,
    wall_ms,
)
from ..errors import EngineError, EngineTypeError, EngineValueError, SegmentExists
from ..keys import as_int64_array, check_due_array, check_due_ms
from ..policy import MAX_INTERVAL_S, PROVENANCES, LanePolicy
from ..process import is_running
from .segment import (
    OWNER_ALIVE,
    OWNER_DEAD,
    Segment,
    _fork_generation,
    check,
    ffi,
    lib,
    owner_state,
)
from .urls import UrlTable

if TYPE_CHECKING:
    from ..redis import RedisEngine
    from ..redis.shards import ShardedEngine

_U64 = (1 << 64) - 1
_WORD_VOID = 1 << 60  # a row word's "taken back" bit (csrc/layout.h)

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
    lib.RL_V_LEASE_UNCOVERED: "row in flight whose lease ends before lease_min (no sweep would "
                              "put it back)",
    lib.RL_V_IV_CLASS: "row word's interval class names a slot of its lane that holds another "
                       "interval",
}
# Crash marks: what a writer killed midway left, which a repair finishes or takes back (reap()).
_MARKS = {
    lib.RL_V_DEAD_WRITE: "row stored by a dead writer and not yet published (a repair indexes it)",
    lib.RL_V_ABANDONED: "row reserved by a dead writer and never written (a repair takes it back)",
}


class Claims(_hot.ClaimsBase):
    """The rows one claim pass leased: four int64 arrays of the same length, ``rows``,
    ``lanes``, ``due_ms`` and ``tokens`` (``len(batch)`` rows).

    They are views of an arena the C pass filled, made when asked for (csrc/hot.c). ``rows``
    and ``tokens`` are kept once made, until the batch is completed, so
    ``Engine.complete_many(batch.rows, batch.tokens)`` of the latest batch can recognise them
    and hand the C core their arena address instead of converting them. No later claim writes
    there. Only the engine makes them.
    """

    __slots__ = ()

    def __iter__(self) -> Iterator[Claim]:
        fields = [self.rows.tolist(), self.lanes.tolist(), self.due_ms.tolist(),
                  self.tokens.tolist()]
        for i in range(len(self)):
            yield Claim(fields[0][i], fields[1][i], fields[2][i], fields[3][i])

    def __repr__(self) -> str:
        return f"Claims(n={len(self)}, rows={self.rows.tolist()})"


class Engine(_hot.EngineBase):
    """A claim engine over one named shared-memory segment: :class:`engine.api.QueueEngine`
    for the processes of one machine.

    ``claim``, ``complete_many`` and ``complete_and_claim`` are methods of the C base class
    (csrc/hot.c): they take the common case in C and call the hooks below (``_claim_args``,
    ``_bind``, ``_after``, ``_refused``, ``_rows_tokens``, ``_complete_many_any``) for the rest.
    """

    supports_compact: ClassVar[bool] = True
    spans_hosts: ClassVar[bool] = False
    writes_whole: ClassVar[bool] = False

    def __init__(self, seg: Segment, creator_pid: int | None) -> None:
        self._seg = seg
        self._creator_pid = creator_pid
        self._out_row = ffi.new("int64_t[1]")
        self._advice = ffi.new("uint32_t *")
        # The hot calls' request block is the segment's (emptied when it closes); claim
        # results and complete_many's flags are carved from arenas the C base class keeps.
        self._set_request(seg.request, int(ffi.cast("uintptr_t", seg.request)))

    # -- lifetime ------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, capacity: int, policy: LanePolicy | None = None, *,
               ring_capacity: int | None = None, exist_ok: bool = False) -> Engine:
        """Create the segment and own it (this process unlinks it on ``close``/``unlink``).

        ``exist_ok=True`` takes over a segment of that name left by a crashed owner instead of
        failing: it attaches, reclaims dead owners' leases, and becomes the owner.
        """
        name = _name(name)
        capacity = check_int(capacity, "capacity", 1, (1 << 31))
        if policy is None:
            policy = LanePolicy()
        if not isinstance(policy, LanePolicy):
            raise EngineTypeError("policy must be a LanePolicy")
        ring = min(1 << 18, max(64, capacity)) if ring_capacity is None else check_int(
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
        if not is_number(timeout) or not (
                math.isfinite(timeout) and timeout >= 0):
            raise EngineValueError("timeout must be a finite number of seconds >= 0")
        return cls(Segment.attach(_name(name), float(timeout)), None)

    @staticmethod
    def connect(url: str, name: str, policy: LanePolicy | None = None,
                create: bool = False, shards: int | None = None,
                **options: Any) -> RedisEngine | ShardedEngine:
        """The same engine on a Redis server (``engine.redis.RedisEngine``, docs/redis.md):
        queue ``name`` at ``url``, made when missing if ``create``. Needs redis-py.

        ``shards``: a queue over that many shards (``engine.redis.shards.ShardedEngine``,
        docs/redis.md "Shards"), made so with ``create``; another count is refused. None: the
        queue as it is (a new one is one queue)."""
        # redis-py is an optional extra: the Redis backend is imported when it is asked for.
        from ..redis.shards import connect

        return connect(url, name, policy, create, shards=shards, **options)

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

    def save(self, path: str | os.PathLike[str], urls: Any = None,
             extra: dict[str, Any] | None = None) -> int:
        """Write the whole schedule to ``path`` atomically (temp file + rename); returns the rows
        saved. ``urls`` (row id -> URL) and ``extra`` (JSON), if given, are saved with it
        (``checkpoint.save``). Leases are not saved."""
        return checkpoint.save(self, path, urls, extra)

    def export_rows(self) -> tuple[IntArray, dict[str, IntArray]]:
        """(row ids, columns) of every queued row, read in one pass over the row table: the
        columns of ``checkpoint.snapshot``."""
        n = self.rows_used()
        cols = {c: np.empty(n, np.int64) for c in checkpoint.EXPORTED}
        if n:
            check(lib.rl_rows_export(self._h, 0, n, *(ffi.from_buffer("int64_t[]", cols[c])
                                                       for c in checkpoint.EXPORTED)),
                  "export rows")
        rows = np.flatnonzero(cols["due_ms"] >= 0)
        return rows, {c: v[rows] for c, v in cols.items()}

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str, *, capacity: int | None = None,
             policy: LanePolicy | None = None) -> Engine:
        """Create engine ``name`` holding a saved schedule (row ids renumbered from 0 in saved
        order); the saved capacity and policy unless given."""
        return cls.from_checkpoint(checkpoint.read(path), name, capacity=capacity, policy=policy)

    @classmethod
    def from_checkpoint(cls, ck: checkpoint.Checkpoint, name: str, *,
                        capacity: int | None = None, policy: LanePolicy | None = None) -> Engine:
        """A new engine ``name`` holding the checkpoint's rows (renumbered from 0 in saved
        order): the saved capacity and policy unless given. A capacity below the rows saved is
        refused, never silently raised. Nothing is left behind if the restore fails."""
        if capacity is not None and check_int(capacity, "capacity", 1, 1 << 31) < len(ck):
            raise EngineValueError(f"capacity {capacity} is below the {len(ck)} rows of the "
                                   "checkpoint")
        eng = cls.create(name, max(ck.capacity, len(ck), 1) if capacity is None else capacity,
                         ck.policy if policy is None else policy)
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

    def rows_used(self) -> int:
        """Row ids given so far, those a repair took back included."""
        return int(self._seg.info().rows_used)

    def taken_back(self, rows: IntArray) -> BoolArray:
        """Which of ``rows`` (existing ids) a repair took back: reserved by an add whose process
        died before writing them (csrc/writes.c), so they will never be queued."""
        out = np.zeros(len(rows), np.bool_)
        if len(rows):
            lo, hi = int(rows.min()), int(rows.max()) + 1
            words, leases = ffi.new("uint64_t[]", hi - lo), ffi.new("uint64_t[]", hi - lo)
            check(lib.rl_rows_dump(self._h, lo, hi - lo, words, leases))
            dumped = np.frombuffer(ffi.buffer(words), np.uint64)
            out[:] = (dumped[rows - lo] & np.uint64(_WORD_VOID)) != 0
        return out

    def _row(self, row: object) -> int:
        r = check_int(row, "row", 0, (1 << 31))
        if r >= self.rows_used():
            raise EngineValueError(f"row {r} does not exist")
        return r

    _now = staticmethod(check_now)
    _token = staticmethod(check_token)

    def _hot(self) -> tuple[Any, int]:
        """The C handle and this process's owner id, by attribute reads on the hot path."""
        seg = self._seg
        if seg._handle is None or seg._owner_gen != _fork_generation[0]:
            return seg.handle, seg.owner  # raises EngineClosed / registers after a fork
        return seg._handle, seg._owner

    def _bind(self) -> None:
        """Point the request block at this process's handle and owner (raises if closed).
        The C base class calls it in a new process (after a fork) and after a close."""
        h, owner = self._hot()
        req = self._seg.request
        req.s = h
        req.owner = owner

    def _refused(self, status: int, what: str) -> None:
        """Raise for a negative status of a hot call (from the C base class)."""
        check(status, what)

    def _after(self, advice: int) -> None:
        """Act on what the C core advised: merge the ring, or repair after a dead owner."""
        if advice & lib.RL_ADVISE_REAP:
            self._repair()
        if advice & lib.RL_ADVISE_COMPACT:
            status = lib.rl_compact(self._h, self._seg.owner, 0)
            if status != lib.RL_E_BUSY:
                check(status, "compact")

    def _repair(self, wait: bool = False) -> dict[str, int]:
        """Repair after dead owners (see ``reap``): what it did, or zeros if another process
        is repairing or merging right now (``wait``: then wait for it, up to 5 s)."""
        out = ffi.new("rl_repair_out *")
        deadline = time.monotonic() + 5.0
        while (status := lib.rl_repair_report(self._h, self._seg.owner, out)) == lib.RL_E_BUSY \
                and wait and time.monotonic() < deadline:
            time.sleep(0.001)
        if status != lib.RL_E_BUSY:
            check(status, "repair")
        return {"leases_reclaimed": int(out.reclaimed), "rows_taken_back": int(out.voided),
                "rows_waiting": int(out.waiting)}

    # -- writes ----------------------------------------------------------------------------------

    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int:
        """Queue one row; returns its row id."""
        due = check_due_ms(due_ms)
        interval = check_int(interval_s, "interval_s", 1, MAX_INTERVAL_S)
        prov = choice_code(provenance, PROVENANCES, "provenance")
        fails = check_int(failures, "failures", 0, 255)
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
        interval = broadcast(interval_s, n, "interval_s", 1, MAX_INTERVAL_S)
        prov = choice_codes(provenance, PROVENANCES, n, "provenance")
        fails = np.zeros(n, np.int64) if failures is None else broadcast(
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

    def _complete_many_any(self, rows: Any, tokens: Any, next_due_ms: Any,
                           now_ms: Any) -> BoolArray:
        """``complete_many`` of anything but the latest batch's own arrays (the C base class
        takes that case)."""
        r, t = rows_tokens(rows, tokens)
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
        check(status, "complete_many")
        if self._advice[0]:
            self._after(self._advice[0])
        return ok

    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None, permanent: bool = False) -> None:
        """Count a failure, derive the lane again (cold after ``cold_after``), back off.

        ``permanent`` (a failure that retrying will not heal, such as an HTTP 404) counts the row
        as failed ``cold_after`` times at least, so it goes to the cold lane at once."""
        check_bool(permanent, "permanent")
        r, t = self._row(row), self._token(token)
        retry = -1 if retry_at_ms is None else check_due_ms(retry_at_ms, "retry_at_ms")
        now = self._now(now_ms)
        self._advice[0] = 0
        check(lib.rl_fail(self._h, self._seg.owner, r, t & _U64, retry, now, int(permanent),
                          self._advice),
              f"fail row {r}")
        self._after(self._advice[0])

    def release(self, row: int, token: int, now_ms: int | None = None) -> None:
        """Give the row back unrendered; its schedule is unchanged. ``LeaseLost`` if stale.
        ``now_ms`` is checked and otherwise unused: a token holds until the row is granted
        again or the lease ends, whatever the time of the release."""
        if not self.release_many([self._row(row)], [self._token(token)], now_ms)[0]:
            check(lib.RL_E_LEASE, f"release row {row}")

    def release_many(self, rows: Any, tokens: Any, now_ms: int | None = None) -> BoolArray:
        """``release`` of a batch in one call: which tokens were live leases (a stale one
        changes nothing). Row ids are checked, all of them, before anything changes."""
        r, t = rows_tokens(rows, tokens)
        self._now(now_ms)
        ok = np.zeros(len(r), np.bool_)
        if len(r) == 0:
            return ok
        self._advice[0] = 0
        h, owner = self._hot()
        status = lib.rl_release_many(h, owner, len(r), _ptr(r), _ptr(t),
                                     ffi.from_buffer("uint8_t[]", ok), self._advice)
        check(status, "release_many")
        if self._advice[0]:
            self._after(self._advice[0])
        return ok

    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int:
        """Extend a lease (a long render); returns the new token, the old one is now stale."""
        r, t = self._row(row), self._token(token)
        lease = check_lease_ms(lease_ms)
        out = ffi.new("int64_t *")
        check(lib.rl_renew(self._h, self._seg.owner, r, t & _U64, self._now(now_ms), lease,
                           ffi.cast("uint64_t *", out)), f"renew row {r}")
        return int(out[0])

    def prioritize_many(self, rows: Any, mode: str = "rush", now_ms: int | None = None) -> int:
        """``prioritize`` each of ``rows`` (a removed one skipped): how many were. A scope of a
        million rows (``POST /api/prioritize``) checks its arguments once and calls the core
        directly for each row, acting on its advice (a merge of the ring) as it comes."""
        arr = as_int64_array(rows, "rows")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.rows_used()):
            raise EngineValueError(f"rows must lie in [0, {self.rows_used()})")
        rush = int(check_mode(mode))
        now = self._now(now_ms)
        h, owner, advice, fn = self._h, self._seg.owner, self._advice, lib.rl_prioritize
        done = 0
        for r in arr.tolist():
            advice[0] = 0
            status = fn(h, owner, r, rush, now, advice)
            if status >= 0:
                done += 1
            elif status != lib.RL_E_VALUE:  # the one status of a removed row
                check(status, f"prioritize row {r}")
            if advice[0]:
                self._after(advice[0])
        return done

    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None:
        """``"rush"``: urgent lane, due now. ``"wait"``: own lane, due now."""
        r = self._row(row)
        rush = check_mode(mode)
        now = self._now(now_ms)
        self._advice[0] = 0
        check(lib.rl_prioritize(self._h, self._seg.owner, r, int(rush), now,
                                self._advice), f"prioritize row {r} (removed?)")
        self._after(self._advice[0])

    def reclassify(self, row: int, provenance: str | int) -> None:
        """Change the row's provenance (``"submitted"``: its page is in a sitemap;
        ``"discovered"``: not): its lane is derived again, its due time, failures and urgency
        kept; a lease on it goes on. The same provenance again changes nothing."""
        r = self._row(row)
        code = choice_code(provenance, PROVENANCES, "provenance")
        self._advice[0] = 0
        check(lib.rl_reclassify(self._h, self._seg.owner, r, code, self._advice),
              f"reclassify row {r} (removed?)")
        self._after(self._advice[0])

    def remove(self, row: int) -> None:
        r = self._row(row)
        self._advice[0] = 0
        check(lib.rl_remove(self._h, self._seg.owner, r, self._advice),
              f"remove row {r} (removed?)")
        self._after(self._advice[0])

    # -- claims ----------------------------------------------------------------------------------

    def _claim_args(self, budget: object, now_ms: object, lease_ms: object,
                    window: object) -> tuple[int, int, int, int]:
        """A claim's arguments other than plain ints in range, checked (clear errors): returns
        (now, budget, lease_ms, window). The C base class calls it."""
        b, lease, win = claim_args(budget, lease_ms, window)
        return self._now(now_ms), b, lease, win

    # complete_and_claim's rows and tokens other than the latest batch's (the C base class
    # calls it): int64 arrays of one length.
    _rows_tokens = staticmethod(rows_tokens)

    # -- reading ---------------------------------------------------------------------------------

    def describe(self, row: int, now_ms: int | None = None) -> RowInfo:
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
        return self.policy.lane_name(check_int(lane, "lane", 0, lib.RL_MAX_LANES - 1))

    def floor_minute(self, lane: int) -> int:
        """The lane's claim floor in minutes since the epoch; 0 means no floor."""
        return int(self._lane_stats(wall_ms())[check_int(lane, "lane", 0, lib.RL_MAX_LANES - 1)]
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

    def stats(self, now_ms: int | None = None) -> Stats:
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
            "rows": int(info.rows_used) - int(info.rows_void),
            "queued": sum(int(lanes[i].queued) for i in range(lib.RL_MAX_LANES)),
            "in_flight": sum(int(lanes[i].in_flight) for i in range(lib.RL_MAX_LANES)),
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
                    "in_flight": int(lanes[i].in_flight),
                    "granted": int(lanes[i].granted),
                    "spilled": int(lanes[i].spilled),
                    "stale_skipped": int(lanes[i].stale_skipped),
                    "lease_refused": int(lanes[i].lease_refused),
                    "iv_min": int(lanes[i].iv_min),
                    "iv_max": int(lanes[i].iv_max),
                }
                for i in shown
            ],
        }

    def verify(self) -> list[str]:
        """Walk the segment; one line per broken invariant (empty when all hold).

        What writers killed midway left is not a broken invariant: when the walk finds such
        marks it reaps first (``reap``: the dead writers' writes finished or taken back), then
        walks again. ``lanes check`` reports the marks themselves."""
        walk = self.verify_walk()
        if walk.marks:
            self.repair()
            walk = self.verify_walk()
        return walk.problems + walk.marks

    def verify_walk(self) -> VerifyWalk:
        """One walk, changing nothing but the marking of owners found dead. Past 64 lines of
        a kind the rest are counted in a last line "... and N more"."""
        cap = 64
        while True:
            out = ffi.new("rl_problem[]", cap)
            found = ffi.new("uint32_t *")
            check(lib.rl_verify(self._h, out, cap, found))
            if found[0] <= cap or cap > 64:
                break
            cap = int(found[0]) + 64  # all of them: marks of one big add may be thousands
        walk = VerifyWalk([], [], 0, 0)
        hidden = {"problems": 0, "marks": 0}
        for i in range(min(int(found[0]), cap)):
            p = out[i]
            if p.code in _MARKS:
                walk.unpublished += p.code == lib.RL_V_DEAD_WRITE
                walk.abandoned += p.code == lib.RL_V_ABANDONED
                line, kind = f"{_MARKS[p.code]}: row {p.row}, owner {p.detail}", "marks"
            else:
                what = _PROBLEMS.get(p.code, f"problem {p.code}")
                line, kind = f"{what}: row {p.row}, lane {p.lane}, detail {p.detail}", "problems"
            into = getattr(walk, kind)
            if len(into) < 64:
                into.append(line)
            else:
                hidden[kind] += 1
        for kind, n in hidden.items():
            if n:
                getattr(walk, kind).append(f"... and {n} more")
        return walk

    check = verify

    # -- maintenance -----------------------------------------------------------------------------

    def compact(self, full: bool = False) -> None:
        """Merge recent writes into the sorted index now (``full``: rebuild from the row table)."""
        check_bool(full, "full")
        owner = self._seg.owner
        while (status := lib.rl_compact(self._h, owner, 1 if full else 0)) == lib.RL_E_BUSY:
            time.sleep(0.001)
        check(status, "compact")

    def restamp(self, limit: int = 5000) -> Restamped:
        """Re-encode up to ``limit`` rows written with lanes disabled into their lanes."""
        lim = check_int(limit, "limit", 1, 10_000_000)
        done, left = ffi.new("uint32_t *"), ffi.new("uint32_t *")
        check(lib.rl_restamp(self._h, self._seg.owner, lim, done, left),
              "restamp (refused while lanes are enabled)")
        return {"restamped": int(done[0]), "done": not left[0]}

    def reap(self) -> int:
        """Find owners whose process is gone (pid + start time), reclaim their leases at once,
        and finish or take back the writes they left half done.

        Returns how many dead owners were found. Claim passes notice dead lease holders by
        themselves; this also catches processes that died holding no lease mid-write.
        """
        return self._reap()["dead_owners"]

    def repair(self) -> dict[str, int]:
        """``reap``, repairing even when no dead owner is left (a mark an earlier repair left
        waiting); returns what it did (``lanes check --repair`` prints it)."""
        return self._reap(repair_anyway=True)

    def _reap(self, repair_anyway: bool = False) -> dict[str, int]:
        """``reap``, with what it did; ``repair_anyway``: as ``repair``."""
        dead = 0
        for owner, pid, start, word in self._seg.owners():
            state = owner_state(word)
            if state != OWNER_ALIVE:
                dead += state == OWNER_DEAD
                continue
            if not is_running(pid, start):
                check(lib.rl_owner_mark_dead(self._h, owner, word))
                dead += 1
        done = self._repair(wait=True) if dead or repair_anyway else {}
        return {"dead_owners": dead, **done}

    def row_urls(self) -> UrlTable:
        """The URL table a pool keeps beside the segment (``/dev/shm/<name>.urls``...), its
        ``add`` adding rows to this engine."""
        return UrlTable.attach(self.name, self)

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


def _address(fn: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, fn)))


_hot.setup(Claims, _address("rl_claim_req"), _address("rl_complete_req"),
           _address("rl_complete_claim_req"))


def _ptr(arr: IntArray) -> Any:
    return ffi.from_buffer("int64_t[]", arr)


_: type[QueueEngine] = Engine
_batch: type[ClaimBatch] = Claims
