"""The hot worker calls: ``complete_and_claim`` (one crossing per cycle) and the fast path that
``complete_many`` takes for the arrays of the latest claim. Each must do exactly what the plain
calls do: the same grants, the same completions, the same counters, and the same refusals of bad
input with nothing changed."""

from __future__ import annotations

import numpy as np
import pytest
from lanes_testlib import HOUR, MINUTE, NOW, fresh_engine, snapshot

from engine import LanePolicy
from engine.errors import EngineClosed, EngineError, EngineValueError

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


@pytest.mark.parametrize("budget", [1, 5, 16])
def test_complete_and_claim_grants_and_counts_exactly_as_complete_many_then_claim(budget):
    policy = LanePolicy(min_share={"discovered": 0.25, "cold": 0.05})
    with fresh_engine(policy) as a, fresh_engine(policy) as b:
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


def test_complete_and_claim_takes_plain_arrays_and_reports_stale_tokens():
    with fresh_engine() as eng:
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


def test_complete_many_of_a_claims_arrays_equals_completing_copies():
    with fresh_engine() as a, fresh_engine() as b:
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
def test_bad_claim_arguments_complete_nothing_and_claim_nothing(kwargs):
    with fresh_engine() as eng:
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
def test_bad_rows_or_tokens_complete_nothing_and_claim_nothing(rows_tokens):
    with fresh_engine() as eng:
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


def test_a_closed_engine_refuses_complete_and_claim():
    with fresh_engine() as eng:
        _fill(eng)
        c = eng.claim(budget=2, now_ms=NOW)
        eng.close()
        with pytest.raises(EngineClosed):
            eng.complete_and_claim(c.rows, c.tokens, now_ms=NOW)
        with pytest.raises(EngineClosed):
            eng.complete_and_claim([0], [1], now_ms=NOW)
        with pytest.raises(EngineClosed):
            eng.complete_many(c.rows, c.tokens, now_ms=NOW)


def test_a_refused_complete_and_claim_does_not_break_completing_the_previous_batch():
    # The refusal may have replaced the claim arena; the earlier batch's arrays must still be
    # completed as themselves, not read from the new arena.
    with fresh_engine() as eng:
        _fill(eng)
        batch = eng.claim(4, now_ms=NOW)
        assert len(batch) == 4
        rows, tokens = batch.rows, batch.tokens
        with pytest.raises(EngineValueError):
            eng.complete_and_claim([10**6], [0], budget=4096, now_ms=NOW)
        ok = eng.complete_many(rows, tokens, now_ms=NOW)
        assert ok.all()
        assert eng.verify() == []
