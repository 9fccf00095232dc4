"""Shared helpers for the render-lanes test suite (no pytest import: child processes load it).

Everything a spawned or forkserver child needs lives here at module level so that it pickles by
reference; conftest.py re-exports the fixtures' building blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

LIB = os.path.dirname(os.path.abspath(__file__))
"""tests/lib: the helpers, on the path of every test module and of the processes they start."""
ROOT = os.path.dirname(os.path.dirname(LIB))
if ROOT not in sys.path:
    # The package may be built in place rather than installed into the venv.
    try:
        import engine  # noqa: F401
    except ImportError:
        sys.path.insert(0, ROOT)

def _ten_lanes() -> Any:
    from engine.policy import CLASSIC_FLOORS, COARSE_BANDS, LanePolicy, band_weights

    return LanePolicy(ttl_bands=COARSE_BANDS, min_share=CLASSIC_FLOORS,
                      weights=band_weights(COARSE_BANDS))


TEN_LANES = _ten_lanes()
"""The layout the suites name lanes of, the default before it weighed its lanes by their
intervals: bands 1 h / 6 h / 24 h (lanes 1-4 submitted, 5-8 discovered, 9 cold), floors 0.10
and 0.02, the lateness remainder with weights from the bands. An engine a test makes without a
policy has it; the tests of ``LanePolicy()`` itself name it (tests/shm/test_default_policy.py,
test_the_default_grants_what_the_reference_grants)."""



def ten_lanes(**fields: Any) -> Any:
    """``TEN_LANES`` with ``fields`` changed (a ``LanePolicy`` over the suites' layout; other
    ``ttl_bands`` take their own band weights unless ``weights`` are given)."""
    from engine.policy import band_weights

    if "ttl_bands" in fields:
        fields.setdefault("weights", band_weights(fields["ttl_bands"]))
    return dataclasses.replace(TEN_LANES, **fields)


NOW = 1_800_000_000_000
"""The fixed virtual time base of every test (ms since the epoch)."""

MINUTE = 60_000
HOUR = 3_600_000
DAY = 24 * HOUR
PREFIX = "rl-test-"
SESSION = uuid.uuid4().hex[:6]
"""Per test session, so concurrent runs of the suite never judge or remove each other's segments."""
SHM_DIR = "/dev/shm"

# Intervals (s) that land in each band of the default ttl_bands (3600, 21600, 86400).
BAND_INTERVALS = (600, 7200, 43200, 172800)
# The interval of the rows add_to_lane puts in each of the default policy's ten lanes.
LANE_INTERVALS = (600, *BAND_INTERVALS, *BAND_INTERVALS, 600)


# A claim pass looks for dead owners at most this often (csrc/sweep.c, OWNERS_CHECK_NS), so a
# killed owner's rows are claimable by the first pass this long after its death (well within
# the promised second) with no supervisor, and at once after reap().
OWNERS_CHECK_S = 0.1


def past_owner_check() -> None:
    """Sleep until the next claim pass is due to check the owners table."""
    time.sleep(OWNERS_CHECK_S * 1.5)


def unique_name() -> str:
    return f"{PREFIX}{SESSION}-{uuid.uuid4().hex[:12]}"


def attach_raw(name: str) -> Any:
    """A test's own mapping of segment ``name`` (a ``SharedMemory``), to read or forge its bytes.
    Python 3.11 registers an attached segment with the resource tracker, which would unlink it
    at exit: the test does not own it."""
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory

    shm = SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def leftover_segments(session: str | None = SESSION) -> list[str]:
    """Test segments in /dev/shm: this session's, or with ``session=None`` every run's."""
    pattern = PREFIX + (f"{session}-*" if session else "*")
    return sorted(glob.glob(os.path.join(SHM_DIR, pattern)))


def dispose(eng: Any, name: str) -> None:
    """Close and unlink ``eng`` whatever state it is in (a Redis queue is dropped, through a new
    connection if the test closed its own); never raises."""
    from engine.errors import EngineError

    if is_redis(eng) and eng.transport.client is None:
        with contextlib.suppress(EngineError, OSError):
            eng = type(eng).connect(eng.transport.url, eng.name)
    with contextlib.suppress(EngineError, OSError):
        eng.unlink()
    with contextlib.suppress(EngineError, OSError):
        eng.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(shm_path(name))


def is_redis(eng: Any) -> bool:
    """Whether ``eng`` is a RedisEngine, or one over shards (without importing redis-py for the
    shm-only tests)."""
    return type(eng).__name__ in ("RedisEngine", "ShardedEngine")


def address(eng: Any) -> tuple[str, ...]:
    """Where another process finds ``eng`` (picklable): ``("shm", name)`` or
    ``("redis", url, name)``; :func:`another_handle` opens it."""
    return ("redis", eng.transport.url, eng.name) if is_redis(eng) else ("shm", eng.name)


def another_handle(eng_or_address: Any) -> Any:
    """A second handle on the same engine, as another process would open it: ``attach`` of the
    segment, or a new connection to the Redis queue. The caller closes it."""
    from engine import Engine

    where = eng_or_address if isinstance(eng_or_address, tuple) else address(eng_or_address)
    if where[0] == "redis":
        return Engine.connect(where[1], where[2])
    return Engine.attach(where[1])


@contextlib.contextmanager
def fresh_engine(policy: Any = None, capacity: int = 4096, **kw: Any) -> Iterator[Any]:
    """A new engine on a unique segment, always closed and unlinked afterwards."""
    from engine import Engine

    name = unique_name()
    eng = Engine.create(name, capacity, TEN_LANES if policy is None else policy, **kw)
    try:
        yield eng
    finally:
        dispose(eng, name)


def lane_bounds(eng: Any) -> list[tuple[int, int]]:
    """Each lane's interval bounds as the engine keeps them (``stats()``), for ``reference_pass``
    of a policy whose weights are derived from them: (iv_min, iv_max) for lanes 0 .. 63."""
    out = [(0, 0)] * 64
    for ln in eng.stats()["lanes"]:
        out[ln["lane"]] = (ln["iv_min"], ln["iv_max"])
    return out


def add_to_lane(eng: Any, lane: int, due: int) -> int:
    """A row in ``lane`` (0 urgent, 1-4 submitted bands, 5-8 discovered bands, 9 cold) due at
    ``due``, on either backend."""
    if lane == 0:
        row: int = eng.add(NOW + DAY, 600)
        eng.prioritize(row, "rush", now_ms=due)
        return row
    if lane == 9:
        return int(eng.add(due, 600, provenance="submitted", failures=3))
    prov = "submitted" if lane <= 4 else "discovered"
    return int(eng.add(due, BAND_INTERVALS[(lane - 1) % 4], provenance=prov))


def lane_counts(claims: Any, lanes: int) -> list[int]:
    counts = [0] * lanes
    for lane in claims.lanes.tolist():
        counts[int(lane)] += 1
    return counts


def snapshot(eng: Any, rows: Any) -> list[dict[str, Any]]:
    return [eng.describe(int(r)) for r in rows]


# -- child-process bodies (multiprocessing targets must be importable module attributes) -------


def _report(q: Any, fn: Any) -> None:
    try:
        q.put(("ok", fn()))
    except BaseException:  # report everything: the parent asserts on it
        q.put(("error", traceback.format_exc()))


def child_attach_claim(name: str, now_ms: int, budget: int, q: Any) -> None:
    def body() -> dict[str, Any]:
        from engine import Engine

        eng = Engine.attach(name)
        c = eng.claim(budget=budget, now_ms=now_ms, lease_ms=600_000)
        out = {"rows": c.rows.tolist(), "tokens": c.tokens.tolist(), "pid": os.getpid()}
        eng.close()
        return out

    _report(q, body)


def child_attach_add(name: str, due_ms: int, interval_s: int, q: Any) -> None:
    def body() -> int:
        from engine import Engine

        eng = Engine.attach(name)
        row = int(eng.add(due_ms, interval_s, provenance="submitted"))
        eng.close()
        return row

    _report(q, body)


def child_set_policy(name: str, remainder: str, q: Any) -> None:
    def body() -> str:
        from engine import Engine, LanePolicy

        eng = Engine.attach(name)
        eng.set_policy(LanePolicy(remainder=remainder))
        got = eng.policy.remainder
        eng.close()
        return got

    _report(q, body)


def child_claim_and_hold(name: str, now_ms: int, q: Any) -> None:
    """Claim one row with a 10-minute lease, report it, then wait to be killed."""
    try:
        from engine import Engine

        eng = Engine.attach(name)
        c = eng.claim(budget=1, now_ms=now_ms, lease_ms=600_000)
        q.put(("ok", {"rows": c.rows.tolist(), "tokens": c.tokens.tolist()}))
    except BaseException:
        q.put(("error", traceback.format_exc()))
        return
    time.sleep(600)


def get_result(q: Any, timeout: float = 60.0) -> Any:
    status, value = q.get(timeout=timeout)
    assert status == "ok", f"child failed:\n{value}"
    return value


def child_claim_loop(name: str, now_ms: int, budget: int, idle_rounds: int, q: Any) -> None:
    """Claim and complete (far into the future) until ``idle_rounds`` claims come back empty."""

    def body() -> list[int]:
        from engine import Engine

        eng = Engine.attach(name)
        got: list[int] = []
        idle = 0
        while idle < idle_rounds:
            c = eng.claim(budget=budget, now_ms=now_ms, lease_ms=3_600_000)
            if len(c) == 0:
                idle += 1
                time.sleep(0.001)
                continue
            idle = 0
            got += c.rows.tolist()
            # render, then reschedule
            for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                eng.complete(row, tok, next_due_ms=now_ms + 30 * DAY, now_ms=now_ms)
        eng.close()
        return got

    _report(q, body)


def child_add_singly(name: str, now_ms: int, n: int, seed: int, q: Any) -> None:
    """Add ``n`` rows one call each, due at random minutes of the last 2000, all in one lane."""

    def body() -> list[int]:
        import random

        from engine import Engine

        rng = random.Random(seed)
        eng = Engine.attach(name)
        rows = [eng.add(now_ms - rng.randint(1, 2000) * MINUTE, 7200) for _ in range(n)]
        eng.close()
        return rows

    _report(q, body)


def child_claim_until(name: str, now_ms: int, stop: Any, q: Any) -> None:
    """Claim two rows at a time and complete them (far into the future) until ``stop`` is set."""

    def body() -> list[int]:
        from engine import Engine

        eng = Engine.attach(name)
        got: list[int] = []
        while not stop.is_set():
            c = eng.claim(budget=2, now_ms=now_ms, lease_ms=3_600_000)
            got += c.rows.tolist()
            if len(c):
                eng.complete_many(c.rows, c.tokens, next_due_ms=[now_ms + 30 * DAY] * len(c),
                                  now_ms=now_ms)
        eng.close()
        return got

    _report(q, body)


def child_add_batches(name: str, now_ms: int, batches: int, size: int, seed: int | None,
                      q: Any) -> None:
    """Add ``batches`` x ``size`` rows, due ever earlier (``seed`` None: every write lowers the
    floor) or at random minutes of the last 2000 (some just above a claimer's floor)."""

    def body() -> list[int]:
        import random

        import numpy as np

        from engine import Engine

        rng = random.Random(seed)
        eng = Engine.attach(name)
        rows: list[int] = []
        for b in range(batches):
            if seed is None:
                offsets = [1000 + (b * size + i) * MINUTE for i in range(size)]
            else:
                offsets = [rng.randint(0, 2000) * MINUTE + rng.randint(0, 999)
                           for _ in range(size)]
            due = np.array([now_ms - off for off in offsets], dtype=np.int64)
            interval = np.full(size, (600, 7200, 172800)[b % 3], dtype=np.int64)
            prov = np.full(size, b % 2, dtype=np.int64)
            rows += eng.add_many(due, interval, prov).tolist()
        eng.close()
        return rows

    _report(q, body)


def child_churn(name: str, seed: int, q: Any) -> None:
    """Claim, complete, fail, release, rush, add and compact as fast as possible, forever: the
    parent kills this process at a random instant (fault injection)."""
    import random

    from engine import Engine
    from engine.errors import LeaseLost

    rng = random.Random(seed)
    try:
        eng = Engine.attach(name)
        eng.claim(budget=1, now_ms=NOW - 30 * DAY)  # register as an owner before reporting
        q.put(("ok", os.getpid()))
    except BaseException:
        q.put(("error", traceback.format_exc()))
        return
    k = 0
    while True:
        k += 1
        now = NOW + k
        c = eng.claim(budget=rng.randint(1, 8), now_ms=now,
                      lease_ms=rng.choice([1, 50, 600_000]))
        for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
            r = rng.random()
            try:
                if r < 0.4:
                    eng.complete(row, tok, next_due_ms=NOW - rng.randint(0, 3 * DAY), now_ms=now)
                elif r < 0.55:
                    eng.fail(row, tok, retry_at_ms=NOW - rng.randint(0, DAY), now_ms=now)
                elif r < 0.7:
                    eng.release(row, tok)
                elif r < 0.75:
                    eng.renew(row, tok, lease_ms=600_000, now_ms=now)
                # else: keep the lease (it may expire, or die with this process)
            except LeaseLost:
                pass  # a 1 ms lease was taken over: that is the point
        r = rng.random()
        if r < 0.05:
            eng.add(NOW - rng.randint(0, 3 * DAY), rng.choice([60, 7200, 172800]),
                    provenance=rng.choice(["submitted", "discovered"]))
        elif r < 0.07:
            used = eng.stats()["rows"]
            eng.prioritize(rng.randrange(used), "rush", now_ms=NOW - rng.randint(0, HOUR))
        elif r < 0.08:
            eng.compact()


def child_worker_lanes(where: tuple[str, ...], now_ms: int, calls: int, budget: int,
                       q: Any) -> None:
    """A worker on the engine at ``where`` (:func:`address`): ``calls`` claims of ``budget``,
    each grant completed far in the future; reports the lane of every grant."""

    def body() -> list[int]:
        eng = another_handle(where)
        lanes: list[int] = []
        for k in range(calls):
            c = eng.claim(budget=budget, now_ms=now_ms + k, lease_ms=3_600_000)
            lanes += c.lanes.tolist()
            for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                eng.complete(row, tok, next_due_ms=now_ms + 30 * DAY, now_ms=now_ms + k)
        eng.close()
        return lanes

    _report(q, body)


def share_policies(remainders: Any = ("lane-order", "edf", "lateness"), **fixed: Any) -> Any:
    """A hypothesis strategy of share policies over ``TEN_LANES``' layout: floors and an urgent
    cap that together fit in 1, any of ``remainders``, lane weights given or derived from the
    intervals (``INTERVALS``) now and then, lanes mostly on. ``fixed`` holds strategies for other
    LanePolicy fields."""
    from hypothesis import strategies as st

    from engine.policy import INTERVALS

    @st.composite
    def build(draw: Any) -> Any:
        shares = {}
        for cls, choices in (("submitted", (0.0, 0.2)), ("discovered", (0.0, 0.1, 0.3)),
                             ("cold", (0.0, 0.02, 0.1))):
            v = draw(st.sampled_from(choices))
            if v:
                shares[cls] = v
        room = 1.0 - sum(shares.values())
        urgent = draw(st.sampled_from([u for u in (0.0, 0.1, 0.2, 0.5, 1.0) if u <= room + 1e-9]))
        policy = ten_lanes(
            urgent_max_share=urgent,
            min_share=shares,
            remainder=draw(st.sampled_from(list(remainders))),
            lanes_enabled=draw(st.sampled_from([True, True, True, False])),
            **{name: draw(strategy) for name, strategy in fixed.items()},
        )
        names = policy.lane_names()
        weights = draw(st.one_of(
            st.just(INTERVALS),  # derived from the lanes' intervals, as LanePolicy()'s
            st.dictionaries(st.sampled_from(names),
                            st.sampled_from([0.001, 0.5, 1.0, 1.5, 4.0, 1000.0]), max_size=3)))
        return dataclasses.replace(policy, weights=weights) if weights else policy

    return build()
