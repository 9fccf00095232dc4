"""The hot worker calls: ``claim``, ``complete_many`` and ``complete_and_claim`` (one crossing per
cycle), C methods of the engine's base class (csrc/hot.c), and the fast path ``complete_many``
takes for the arrays of the latest claim. Each must do exactly what the plain calls do: the same
grants, the same completions, the same counters, and the same refusals of bad input with nothing
changed; their own argument parsing must behave as a Python function's."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest
from lanes_testlib import HOUR, MINUTE, NOW, snapshot

from engine import Claims, Engine, LanePolicy
from engine.api import DEFAULT_LEASE_MS, DEFAULT_WINDOW
from engine.errors import EngineClosed, EngineError, EngineTypeError, EngineValueError

ONE_PASS = "what one pass over the whole queue grants (over shards a pass sees one shard)"

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

ROWS = 300


def _fill(eng) -> np.ndarray:
    rng = np.random.default_rng(11)
    due = NOW - rng.integers(MINUTE, 40 * HOUR, ROWS)
    interval = rng.choice(np.array([600, 7200, 43200, 172800]), ROWS)
    prov = rng.integers(0, 2, ROWS)
    failures = np.where(rng.random(ROWS) < 0.1, 5, 0)
    rows = eng.add_many(due, interval, prov, failures)
    eng.compact()
    return rows


def _counters(eng) -> list[tuple[int, ...]]:
    s = eng.stats(NOW)
    return [(ln["lane"], ln["floor_minute"], ln["queued"], ln["due"], ln["leased"], ln["granted"],
             ln["spilled"], ln["stale_skipped"], ln["lease_refused"]) for ln in s["lanes"]]


def _batch(c) -> list[tuple[int, int, int]]:
    return list(zip(c.rows.tolist(), c.lanes.tolist(), c.due_ms.tolist(), strict=True))


@pytest.mark.one_queue(ONE_PASS)
@pytest.mark.parametrize("budget", [1, 5, 16])
def test_complete_and_claim_grants_and_counts_exactly_as_complete_many_then_claim(fresh, budget):
    policy = LanePolicy(min_share={"discovered": 0.25, "cold": 0.05})
    with fresh(policy) as a, fresh(policy) as b:
        rows_a, rows_b = _fill(a), _fill(b)
        assert rows_a.tolist() == rows_b.tolist()
        ca = a.claim(budget=budget, now_ms=NOW)
        cb = b.claim(budget=budget, now_ms=NOW)
        for step in range(40):
            now = NOW + step * 1000
            ok_a = a.complete_many(ca.rows, ca.tokens, now_ms=now)
            ca = a.claim(budget=budget, now_ms=now)
            ok_b, cb = b.complete_and_claim(cb.rows, cb.tokens, budget=budget, now_ms=now)
            assert ok_a.tolist() == ok_b.tolist() and ok_b.all()
            assert _batch(ca) == _batch(cb)
            assert len(ca) == len(cb) and [c.row for c in cb] == cb.rows.tolist()
        assert _counters(a) == _counters(b)
        assert a.stats(NOW)["credits"] == b.stats(NOW)["credits"]
        assert a.verify() == [] and b.verify() == []


def test_complete_and_claim_takes_plain_arrays_and_reports_stale_tokens(fresh):
    with fresh() as eng:
        _fill(eng)
        c = eng.claim(budget=4, now_ms=NOW)
        rows, tokens = c.rows.tolist(), c.tokens.tolist()
        tokens[1] ^= 1  # not the lease any more: reported, not completed
        ok, nxt = eng.complete_and_claim(rows, tokens, budget=3, now_ms=NOW)
        assert ok.tolist() == [True, False, True, True]
        assert len(nxt) == 3 and rows[1] not in nxt.rows.tolist()
        assert eng.describe(rows[1])["leased"] and not eng.describe(rows[0])["leased"]
        ok, more = eng.complete_and_claim([], [], budget=2, now_ms=NOW)  # nothing to complete
        assert ok.tolist() == [] and len(more) == 2
        assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_complete_many_of_a_claims_arrays_equals_completing_copies(fresh):
    with fresh() as a, fresh() as b:
        _fill(a), _fill(b)
        for step in range(30):
            now = NOW + step * 1000
            ca, cb = a.claim(budget=7, now_ms=now), b.claim(budget=7, now_ms=now)
            assert _batch(ca) == _batch(cb)
            ok_a = a.complete_many(ca.rows, ca.tokens, now_ms=now)  # the fast path
            ok_b = b.complete_many(cb.rows.copy(), cb.tokens.copy(), now_ms=now)
            assert ok_a.tolist() == ok_b.tolist() and ok_a.dtype == np.bool_
            # the same arrays again: the leases are gone, reported as such, nothing changes
            assert not a.complete_many(ca.rows, ca.tokens, now_ms=now).any()
            assert ca.rows.tolist() == cb.rows.tolist()  # the batch stays readable
        assert _counters(a) == _counters(b)
        assert a.verify() == []


@pytest.mark.parametrize("kwargs", [
    {"budget": 0}, {"budget": -1}, {"budget": 1.5}, {"budget": None}, {"budget": True},
    {"budget": 2**40}, {"lease_ms": 0}, {"lease_ms": "1"}, {"window": 0}, {"window": 2.0},
    {"now_ms": float("nan")}, {"now_ms": -1}, {"now_ms": 2**42},
])
def test_bad_claim_arguments_complete_nothing_and_claim_nothing(fresh, kwargs):
    with fresh() as eng:
        rows = _fill(eng)
        c = eng.claim(budget=4, now_ms=NOW)
        before, counters = snapshot(eng, rows), _counters(eng)
        with pytest.raises(EngineError):
            eng.complete_and_claim(c.rows, c.tokens, **kwargs)
        assert snapshot(eng, rows) == before and _counters(eng) == counters
        assert eng.complete_many(c.rows, c.tokens, now_ms=NOW).all()  # still held


@pytest.mark.parametrize("rows_tokens", [
    ([ROWS + 5], [1]), ([0, 1], [1]), ([[0]], [[1]]), (["a"], [1]), ([0.5], [1]),
    ([None], [1]), ([0], [2**64]), ([-1], [1]),
])
def test_bad_rows_or_tokens_complete_nothing_and_claim_nothing(fresh, rows_tokens):
    with fresh() as eng:
        rows = _fill(eng)
        c = eng.claim(budget=4, now_ms=NOW)
        before, counters = snapshot(eng, rows), _counters(eng)
        bad_rows, bad_tokens = rows_tokens
        with pytest.raises(EngineError):
            eng.complete_and_claim(bad_rows, bad_tokens, budget=4, now_ms=NOW)
        assert snapshot(eng, rows) == before and _counters(eng) == counters
        # a batch with one row id past the table: refused whole, the good rows stay leased
        with pytest.raises(EngineValueError):
            eng.complete_and_claim(c.rows.tolist() + [ROWS + 1], c.tokens.tolist() + [1],
                                   budget=4, now_ms=NOW)
        assert snapshot(eng, rows) == before and _counters(eng) == counters


def test_a_closed_engine_refuses_complete_and_claim(fresh):
    with fresh() as eng:
        _fill(eng)
        c = eng.claim(budget=2, now_ms=NOW)
        eng.close()
        with pytest.raises(EngineClosed):
            eng.complete_and_claim(c.rows, c.tokens, now_ms=NOW)
        with pytest.raises(EngineClosed):
            eng.complete_and_claim([0], [1], now_ms=NOW)
        with pytest.raises(EngineClosed):
            eng.complete_many(c.rows, c.tokens, now_ms=NOW)


def test_a_refused_complete_and_claim_does_not_break_completing_the_previous_batch(fresh):
    # The refusal may have replaced the claim arena; the earlier batch's arrays must still be
    # completed as themselves, not read from the new arena.
    with fresh() as eng:
        _fill(eng)
        batch = eng.claim(4, now_ms=NOW)
        assert len(batch) == 4
        rows, tokens = batch.rows, batch.tokens
        with pytest.raises(EngineValueError):
            eng.complete_and_claim([10**6], [0], budget=4096, now_ms=NOW)
        ok = eng.complete_many(rows, tokens, now_ms=NOW)
        assert ok.all()
        assert eng.verify() == []


@pytest.mark.shm_only("the C base class's methods (csrc/hot.c); RedisEngine's are Python functions")
def test_the_hot_calls_show_their_signatures_and_defaults(backend):
    sig = inspect.signature(Engine.claim)
    assert [(p.name, p.default) for p in list(sig.parameters.values())[1:]] == [
        ("budget", 16), ("now_ms", None), ("lease_ms", DEFAULT_LEASE_MS),
        ("window", DEFAULT_WINDOW)]
    assert list(inspect.signature(Engine.complete_many).parameters)[1:] == [
        "rows", "tokens", "next_due_ms", "now_ms"]
    assert list(inspect.signature(Engine.complete_and_claim).parameters)[1:] == [
        "rows", "tokens", "budget", "now_ms", "lease_ms", "window"]
    assert "Lease up to" in (Engine.claim.__doc__ or "")


def test_the_hot_calls_parse_arguments_as_a_python_function_would(fresh):
    with fresh() as eng:
        rows = _fill(eng)
        before, counters = snapshot(eng, rows), _counters(eng)
        for call in (lambda: eng.claim(4, NOW, 1000, 140, 5),
                     lambda: eng.claim(budget=4, bogus=1),
                     lambda: eng.claim(4, budget=4),
                     lambda: eng.complete_many([0]),
                     lambda: eng.complete_many(tokens=[1]),
                     lambda: eng.complete_many([0], [1], None, NOW, 7),
                     lambda: eng.complete_and_claim([], [], 4, NOW, 1000, 140, 0),
                     lambda: eng.complete_and_claim(rows=[], budget=1)):
            with pytest.raises(TypeError):
                call()
        assert snapshot(eng, rows) == before and _counters(eng) == counters
        # positional, keyword and mixed spellings are one call
        a = eng.claim(2, NOW, 60_000, 140)
        b = eng.claim(window=140, lease_ms=60_000, now_ms=NOW, budget=2)
        c = eng.claim(2, lease_ms=60_000, now_ms=NOW)
        assert len(a) == len(b) == len(c) == 2
        assert set(a.rows.tolist()).isdisjoint(b.rows.tolist() + c.rows.tolist())
        assert eng.describe(int(a.rows[0]))["lease_expiry_ms"] == NOW + 60_000
        ok = eng.complete_many(tokens=a.tokens, rows=a.rows, now_ms=NOW)
        assert ok.all()
        # numpy integers take the checked path and are accepted as the ints they are
        d = eng.claim(np.int64(3), now_ms=np.int64(NOW), lease_ms=np.int32(1000))
        assert len(d) == 3
        with pytest.raises(EngineTypeError):
            eng.claim(True, now_ms=NOW)
        assert eng.verify() == []


@pytest.mark.shm_only("Claims are views of the C claim arena; RedisClaims are plain arrays")
def test_claims_are_made_only_by_the_engine(fresh):
    with pytest.raises(TypeError):
        Claims()
    with fresh() as eng:
        _fill(eng)
        c = eng.claim(3, now_ms=NOW)
        assert isinstance(c, Claims) and len(c) == 3 and bool(c)
        assert c.rows is c.rows and c.tokens is c.tokens  # kept, so complete_many knows them
        assert c.lanes.tolist() == [x.lane for x in c] and "Claims(n=3" in repr(c)
        with pytest.raises(AttributeError):
            c._o = 0  # the arena offsets are not the caller's to move


def test_a_batch_edited_before_completion_is_checked_like_any_input(fresh):
    with fresh() as eng:
        rows = _fill(eng)
        c = eng.claim(4, now_ms=NOW)
        before, counters = snapshot(eng, rows), _counters(eng)
        r, t = c.rows, c.tokens
        r[0] = ROWS + 7  # the latest batch's own arrays, edited in place
        with pytest.raises(EngineValueError):
            eng.complete_many(r, t, now_ms=NOW)
        assert snapshot(eng, rows) == before and _counters(eng) == counters
        good = eng.claim(2, now_ms=NOW)
        t2 = good.tokens
        t2[0] ^= 1  # a token that is not the lease: reported, not completed
        assert eng.complete_many(good.rows, t2, now_ms=NOW).tolist() == [False, True]
        assert eng.verify() == []


def test_old_batches_complete_after_their_arena_was_replaced(fresh):
    with fresh() as eng:
        _fill(eng)
        batches = [eng.claim(1, now_ms=NOW, lease_ms=10 * 60_000) for _ in range(ROWS)]
        held = [b for b in batches if len(b)]
        assert len(held) > 100
        # the first batches' arena was replaced long ago (an arena holds 2048 one-row slots at
        # most); each completes as itself, in any order
        for b in reversed(held):
            assert eng.complete_many(b.rows, b.tokens, now_ms=NOW).tolist() == [True]
        assert all(not eng.describe(int(b.rows[0]))["leased"] for b in held)
        assert eng.verify() == []


def test_big_batches_stay_exact(fresh):
    with fresh() as eng:
        rows = _fill(eng)
        c = eng.claim(1024, now_ms=NOW)
        assert len(c) == len(set(c.rows.tolist())) > 256
        ok, nxt = eng.complete_and_claim(c.rows, c.tokens, budget=512, now_ms=NOW)
        assert ok.all() and len(ok) == len(c)
        assert eng.complete_many(nxt.rows, nxt.tokens, now_ms=NOW).all()
        assert all(not eng.describe(int(r))["leased"] for r in rows)
        assert eng.verify() == []


@pytest.mark.shm_only("a segment forgotten after a fork; a RedisEngine has no segment")
def test_a_forgotten_segment_is_refused_not_used(fresh):
    with fresh() as eng:
        _fill(eng)
        c = eng.claim(2, now_ms=NOW)
        eng._seg.forget()  # what a forked child does with a copy it must not use
        for call in (lambda: eng.claim(2, now_ms=NOW),
                     lambda: eng.complete_many(c.rows, c.tokens, now_ms=NOW),
                     lambda: eng.complete_and_claim([], [], now_ms=NOW)):
            with pytest.raises(EngineClosed):
                call()


def test_threads_sharing_one_engine_never_share_a_lease(fresh):
    # Each thread asks for its own budget and lease, so a call reading another's request would
    # show up as a wrong size or expiry; threads replace the arenas under each other.
    with fresh() as eng:
        rows = _fill(eng)
        held: dict[int, int] = {}
        errors: list[str] = []
        lock = threading.Lock()

        def worker(budget: int, lease: int) -> None:
            for step in range(60):
                c = eng.claim(budget, now_ms=NOW, lease_ms=lease)
                if len(c) > budget:
                    errors.append(f"{len(c)} rows for budget {budget}")
                with lock:
                    for r in c.rows.tolist():
                        if r in held:
                            errors.append(f"row {r} granted twice")
                        held[r] = budget
                for r in c.rows.tolist()[:1]:
                    if eng.describe(r)["lease_expiry_ms"] != NOW + lease:
                        errors.append(f"row {r}: lease of another thread's request")
                with lock:
                    for r in c.rows.tolist():
                        del held[r]
                # half of them through the general path, which runs the core without the GIL,
                # so two threads can mark tombstones under one owner's hazard at once
                if budget % 2:
                    ok = eng.complete_many(c.rows.copy(), c.tokens.copy(), now_ms=NOW + step)
                else:
                    ok = eng.complete_many(c.rows, c.tokens, now_ms=NOW + step)
                if not ok.all():
                    errors.append("a lease was lost")

        threads = [threading.Thread(target=worker, args=(b, 1000 * (i + 1)))
                   for i, b in enumerate((1, 3, 300, 7))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert all(not eng.describe(int(r))["leased"] for r in rows)
        assert eng.verify() == []
