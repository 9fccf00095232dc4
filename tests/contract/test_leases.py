"""Leases and fencing tokens (docs/design.md §5, §14): complete / fail / release / renew /
prioritize / remove, and a stale token changing nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import DAY, HOUR, MINUTE, NOW, ten_lanes

from engine import LeaseLost
from engine.errors import EngineError, EngineValueError
from engine.policy import COLD_BACKOFF_DOUBLINGS

ONE_PASS = "what one pass over the whole queue grants (over shards a pass sees one shard)"

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

DESCRIBE_KEYS = {"row", "due_ms", "lane", "interval_s", "failures", "provenance", "queued",
                 "leased", "lease_expiry_ms", "urgent"}


def _claim_one(eng, now=NOW, lease_ms=30_000):
    c = eng.claim(budget=1, now_ms=now, lease_ms=lease_ms)
    assert len(c) == 1
    return int(c.rows[0]), int(c.tokens[0])


def test_describe_reports_the_documented_fields(eng):
    row = eng.add(NOW - MINUTE, 7200, provenance="discovered", failures=1)
    d = eng.describe(row)
    assert set(d) >= DESCRIBE_KEYS
    assert d["row"] == row
    assert d["due_ms"] == NOW - MINUTE
    assert d["lane"] == ten_lanes().lane_for("discovered", 7200, 1) == 6
    assert d["interval_s"] == 7200
    assert d["failures"] == 1
    assert d["provenance"] == "discovered"
    assert d["queued"] is True
    assert d["leased"] is False
    assert d["lease_expiry_ms"] is None
    assert d["urgent"] is False
    _, _ = _claim_one(eng, lease_ms=45_000)
    d = eng.describe(row)
    assert d["leased"] is True
    assert d["lease_expiry_ms"] == NOW + 45_000
    assert d["due_ms"] == NOW - MINUTE  # claiming does not move the due time


def test_stale_token_raises_lease_lost_and_changes_nothing(eng):
    row = eng.add(NOW - MINUTE, 3600)
    _, old = _claim_one(eng, lease_ms=1000)
    # the lease expires; someone claims the row again
    r2, new = _claim_one(eng, now=NOW + 1001, lease_ms=60_000)
    assert r2 == row and new != old
    before = eng.describe(row)
    for attempt in (
        lambda: eng.complete(row, old, now_ms=NOW + 2000),
        lambda: eng.complete(row, old, next_due_ms=NOW + DAY, now_ms=NOW + 2000),
        lambda: eng.fail(row, old, now_ms=NOW + 2000),
        lambda: eng.fail(row, old, retry_at_ms=NOW, now_ms=NOW + 2000),
        lambda: eng.release(row, old),
        lambda: eng.renew(row, old, lease_ms=600_000, now_ms=NOW + 2000),
    ):
        with pytest.raises(LeaseLost):
            attempt()
        assert eng.describe(row) == before
    assert isinstance(LeaseLost("x"), EngineError)
    eng.complete(row, new, now_ms=NOW + 2000)  # the current holder is unaffected
    assert eng.due_ms(row) == NOW + 2000 + 3600 * 1000
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
@pytest.mark.parametrize("op", ["complete", "fail", "release", "renew"])
def test_a_lapsed_lease_nobody_claimed_again_can_still_be_ended_by_its_holder(eng, op):
    """Stale means the lease expired *and someone else claimed the row* (docs/design.md §5): until
    then the holder's token works, even after a claim pass that granted other rows."""
    row = eng.add(NOW - MINUTE, 3600, provenance="discovered")  # lane 5
    _, tok = _claim_one(eng, lease_ms=1000)
    first = eng.add(NOW - DAY, 600)  # lane 1: the next pass grants it, not the lapsed row
    assert eng.claim(budget=1, now_ms=NOW + 5000).rows.tolist() == [first]
    assert eng.describe(row, now_ms=NOW + 5000)["leased"] is False
    if op == "complete":
        eng.complete(row, tok, now_ms=NOW + 5000)
        assert eng.due_ms(row) == NOW + 5000 + 3600 * 1000
    elif op == "fail":
        eng.fail(row, tok, retry_at_ms=NOW + HOUR, now_ms=NOW + 5000)
        assert eng.describe(row)["failures"] == 1 and eng.due_ms(row) == NOW + HOUR
    elif op == "release":
        eng.release(row, tok)
        assert eng.due_ms(row) == NOW - MINUTE
    else:
        new = eng.renew(row, tok, lease_ms=60_000, now_ms=NOW + 5000)
        assert new != tok
        assert eng.describe(row, now_ms=NOW + 5000)["lease_expiry_ms"] == NOW + 65_000
        assert len(eng.claim(budget=5, now_ms=NOW + 6000)) == 0  # held again
        with pytest.raises(LeaseLost):
            eng.complete(row, tok, now_ms=NOW + 6000)
        tok = new
    assert eng.verify() == []
    if op != "renew":  # the lease has ended: the token is spent
        with pytest.raises(LeaseLost):
            eng.release(row, tok)
    assert eng.verify() == []


def test_a_token_is_spent_by_complete(eng):
    row = eng.add(NOW - MINUTE, 3600)
    _, tok = _claim_one(eng)
    eng.complete(row, tok, now_ms=NOW)
    after = eng.describe(row)
    with pytest.raises(LeaseLost):
        eng.complete(row, tok, now_ms=NOW)
    with pytest.raises(LeaseLost):
        eng.release(row, tok)
    assert eng.describe(row) == after
    assert eng.verify() == []


def test_a_made_up_token_is_refused(eng):
    row = eng.add(NOW - MINUTE, 3600)
    _, tok = _claim_one(eng)
    before = eng.describe(row)
    for bad in (tok + 1, tok - 1, 0, 12345):
        with pytest.raises(LeaseLost):
            eng.complete(row, bad, now_ms=NOW)
    assert eng.describe(row) == before
    assert eng.verify() == []


def test_expired_lease_is_claimable(eng):
    row = eng.add(NOW - MINUTE, 3600)
    _, tok = _claim_one(eng, lease_ms=10_000)
    assert len(eng.claim(budget=5, now_ms=NOW + 9_999)) == 0
    r2, tok2 = _claim_one(eng, now=NOW + 10_001, lease_ms=10_000)
    assert r2 == row and tok2 != tok
    assert eng.describe(row)["lease_expiry_ms"] == NOW + 20_001
    assert eng.verify() == []


def test_complete_reschedules_at_now_plus_interval_and_releases(eng):
    row = eng.add(NOW - HOUR, 7200)
    lane = eng.lane(row)
    _, tok = _claim_one(eng)
    eng.complete(row, tok, now_ms=NOW + 5)
    d = eng.describe(row)
    assert d["due_ms"] == NOW + 5 + 7200 * 1000
    assert d["leased"] is False and d["queued"] is True
    assert d["lane"] == lane
    assert len(eng.claim(budget=5, now_ms=NOW + HOUR)) == 0
    assert eng.claim(budget=5, now_ms=NOW + 5 + 7200 * 1000).rows.tolist() == [row]
    assert eng.verify() == []


def test_complete_with_explicit_next_due(eng):
    row = eng.add(NOW - HOUR, 7200)
    _, tok = _claim_one(eng)
    eng.complete(row, tok, next_due_ms=NOW + 123_456, now_ms=NOW)
    assert eng.due_ms(row) == NOW + 123_456
    assert eng.verify() == []


@pytest.mark.parametrize("bad", [None, float("nan"), -1, 2**42, 2**42 * 3 + 5])
def test_complete_with_bad_next_due_is_rejected_and_keeps_the_lease(eng, bad):
    row = eng.add(NOW - HOUR, 7200)
    _, tok = _claim_one(eng)
    before = eng.describe(row)
    if bad is None:
        eng.complete(row, tok, next_due_ms=bad, now_ms=NOW)  # None means the default
        assert eng.due_ms(row) == NOW + 7200 * 1000
        return
    with pytest.raises(EngineValueError):
        eng.complete(row, tok, next_due_ms=bad, now_ms=NOW)
    assert eng.describe(row) == before
    eng.complete(row, tok, now_ms=NOW)  # the token still works
    assert eng.verify() == []


def test_release_gives_back_with_schedule_unchanged(eng):
    row = eng.add(NOW - HOUR, 7200, provenance="discovered")
    before = eng.describe(row)
    _, tok = _claim_one(eng)
    eng.release(row, tok)
    d = eng.describe(row)
    assert d["due_ms"] == before["due_ms"]
    assert d["lane"] == before["lane"]
    assert d["failures"] == before["failures"]
    assert d["leased"] is False
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [row]  # claimable again at once
    assert eng.verify() == []


def test_fail_counts_backs_off_and_goes_cold_after_cold_after(eng):
    row = eng.add(NOW - HOUR, 3600)
    assert eng.lane(row) == 1
    _, tok = _claim_one(eng)
    eng.fail(row, tok, now_ms=NOW)
    d = eng.describe(row)
    assert d["failures"] == 1
    assert d["lane"] == 1
    assert d["leased"] is False
    assert d["due_ms"] > NOW  # a back-off, not an immediate retry
    assert len(eng.claim(budget=1, now_ms=NOW)) == 0

    now = d["due_ms"]
    for expected_failures in (2, 3):
        r, tok = _claim_one(eng, now=now)
        assert r == row
        eng.fail(row, tok, retry_at_ms=now + MINUTE, now_ms=now)
        d = eng.describe(row)
        assert d["failures"] == expected_failures
        assert d["due_ms"] == now + MINUTE  # retry_at is the true due time
        now += MINUTE
    assert d["lane"] == 9  # cold after cold_after = 3 failures
    assert eng.lane_name(d["lane"]) == "cold"
    assert eng.verify() == []


def test_back_off_grows_with_failures(make_engine):
    eng = make_engine(ten_lanes(cold_after=10))
    row = eng.add(NOW - HOUR, 3600)
    waits = []
    now = NOW
    for _ in range(3):
        r, tok = _claim_one(eng, now=now)
        assert r == row
        eng.fail(row, tok, now_ms=now)
        due = eng.due_ms(row)
        waits.append(due - now)
        now = due
    assert all(w > 0 for w in waits)
    assert waits == sorted(waits)
    assert eng.verify() == []


def test_a_cold_row_backs_off_its_interval_doubling_up_to_eight(make_engine):
    """30 s doubling, capped at the interval, until the row is cold; in the cold lane (a row
    that keeps failing), its interval, doubling per further failure up to 8 intervals
    (COLD_BACKOFF_DOUBLINGS), so the cold floor does not retry it each time a short back-off
    ends; with lanes disabled there is no cold lane and the cap stays the interval. The same on
    both backends, and as LanePolicy.backoff_ms says."""
    policy = ten_lanes(cold_after=3)
    eng = make_engine(policy)
    row = eng.add(NOW - HOUR, 60)
    waits, now = [], NOW
    for failures in range(1, 9):
        r, tok = _claim_one(eng, now=now)
        assert r == row
        eng.fail(row, tok, now_ms=now)
        waits.append(eng.due_ms(row) - now)
        assert waits[-1] == policy.backoff_ms(failures, 60)
        now += waits[-1]
    assert waits == [30_000, 60_000, 60_000, 120_000, 240_000, 480_000, 480_000, 480_000]
    assert 480_000 == 60_000 << COLD_BACKOFF_DOUBLINGS
    assert eng.describe(row)["lane"] == 9  # cold
    assert eng.verify() == []
    # a permanent failure is cold at once: tried again an interval later, not 2 min later
    eng = make_engine(policy)
    row = eng.add(NOW - HOUR, 600)
    r, tok = _claim_one(eng, now=NOW)
    eng.fail(row, tok, now_ms=NOW, permanent=True)
    assert eng.due_ms(row) - NOW == 600_000
    # lanes disabled: one queue, no cold lane, the back-off never past the interval
    off = ten_lanes(cold_after=3, lanes_enabled=False)
    eng = make_engine(off)
    row = eng.add(NOW - HOUR, 60)
    waits, now = [], NOW
    for failures in range(1, 7):
        r, tok = _claim_one(eng, now=now)
        eng.fail(row, tok, now_ms=now)
        waits.append(eng.due_ms(row) - now)
        assert waits[-1] == off.backoff_ms(failures, 60)
        now += waits[-1]
    assert waits == [30_000, 60_000, 60_000, 60_000, 60_000, 60_000]
    assert eng.describe(row)["lane"] == 0
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_prioritize_rush_moves_to_urgent_due_now(eng):
    row = eng.add(NOW + DAY, 172800, provenance="discovered")
    others = [eng.add(NOW - HOUR - i, 600) for i in range(10)]
    eng.prioritize(row, "rush", now_ms=NOW)
    d = eng.describe(row)
    assert d["lane"] == 0 and eng.lane_name(0) == "urgent"
    assert d["due_ms"] == NOW
    assert d["urgent"] is True
    c = eng.claim(budget=10, now_ms=NOW)  # urgent first: its share of 10 covers one row
    assert int(c.rows[0]) == row
    assert int(c.lanes[0]) == 0
    assert set(c.rows.tolist()[1:]) <= set(others)
    assert eng.verify() == []


def test_prioritize_wait_keeps_the_lane_and_makes_it_due_now(eng):
    row = eng.add(NOW + DAY, 172800, provenance="discovered")
    lane = eng.lane(row)
    assert lane == 8
    eng.prioritize(row, "wait", now_ms=NOW)
    d = eng.describe(row)
    assert d["lane"] == lane
    assert d["due_ms"] == NOW
    assert d["urgent"] is False
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [row]
    assert eng.verify() == []


def test_prioritize_many_is_prioritize_on_each_row_and_skips_removed_ones(eng):
    rows = [eng.add(NOW + DAY + i, 172800, provenance="discovered") for i in range(6)]
    eng.remove(rows[2])
    assert eng.prioritize_many(np.array(rows), "rush", now_ms=NOW) == 5
    for r in rows[:2] + rows[3:]:
        d = eng.describe(r)
        assert d["lane"] == 0 and d["due_ms"] == NOW and d["urgent"] is True
    assert eng.prioritize_many(np.array(rows[:2]), "wait", now_ms=NOW + 1) == 2
    assert [eng.describe(r)["due_ms"] for r in rows[:2]] == [NOW + 1, NOW + 1]
    assert eng.prioritize_many(np.array([], np.int64), "rush", now_ms=NOW) == 0
    before = [eng.describe(r) for r in rows[3:]]
    for bad in (np.array([rows[3], 10**6]), np.array([-1])):
        with pytest.raises(EngineError):
            eng.prioritize_many(bad, "rush", now_ms=NOW)
    with pytest.raises(EngineError):
        eng.prioritize_many(np.array(rows[3:]), "later", now_ms=NOW)
    assert [eng.describe(r) for r in rows[3:]] == before  # a refused call changed nothing
    assert eng.verify() == []


def test_prioritize_with_unknown_mode_is_rejected(eng):
    row = eng.add(NOW + DAY, 3600)
    before = eng.describe(row)
    for mode in ("now", "", None, 1):
        with pytest.raises(EngineError):
            eng.prioritize(row, mode, now_ms=NOW)
    assert eng.describe(row) == before


def test_remove_takes_the_row_out_of_the_queue(eng):
    keep = eng.add(NOW - HOUR, 3600)
    gone = eng.add(NOW - 2 * HOUR, 3600)
    eng.compact()
    eng.remove(gone)
    assert eng.describe(gone)["queued"] is False
    assert eng.claim(budget=10, now_ms=NOW).rows.tolist() == [keep]
    assert eng.verify() == []


def test_remove_wins_over_the_lease_holder(eng):
    row = eng.add(NOW - HOUR, 3600)
    _, tok = _claim_one(eng, lease_ms=HOUR)
    eng.remove(row)
    assert eng.describe(row)["queued"] is False
    try:
        eng.complete(row, tok, now_ms=NOW)
    except LeaseLost:
        pass
    assert eng.describe(row)["queued"] is False  # the holder's write does not resurrect it
    assert len(eng.claim(budget=10, now_ms=NOW + 10 * DAY)) == 0
    assert eng.verify() == []


@pytest.mark.parametrize("bad_row", [-1, 10**9, 1.5, None, 100, True])
def test_row_ids_out_of_range_are_rejected(eng, bad_row):
    eng.add(NOW, 3600)
    with pytest.raises(EngineError) as info:
        eng.describe(bad_row)
    assert isinstance(info.value, (ValueError, TypeError))
    with pytest.raises(EngineError):
        eng.remove(bad_row)
    with pytest.raises(EngineError):
        eng.prioritize(bad_row, "rush", now_ms=NOW)
    with pytest.raises(EngineError):
        eng.complete(bad_row, 1, now_ms=NOW)
    assert eng.verify() == []


def test_complete_many_returns_a_mask_and_skips_stale_tokens(eng):
    rows = [eng.add(NOW - HOUR - i, 3600) for i in range(5)]
    c = eng.claim(budget=5, now_ms=NOW, lease_ms=DAY)
    assert sorted(c.rows.tolist()) == sorted(rows)
    stale_row = int(c.rows[2])
    eng.complete(stale_row, int(c.tokens[2]), next_due_ms=NOW + 7 * DAY, now_ms=NOW)
    stale_before = eng.describe(stale_row)
    ok = eng.complete_many(c.rows, c.tokens, now_ms=NOW + 10)
    assert isinstance(ok, np.ndarray) and ok.dtype == np.bool_
    assert ok.tolist() == [True, True, False, True, True]
    assert eng.describe(stale_row) == stale_before
    for i, row in enumerate(c.rows.tolist()):
        if i != 2:
            d = eng.describe(row)
            assert d["leased"] is False
            assert d["due_ms"] == NOW + 10 + 3600 * 1000
    assert eng.verify() == []


def test_complete_many_with_explicit_next_due(eng):
    for i in range(4):
        eng.add(NOW - HOUR - i, 3600)
    c = eng.claim(budget=4, now_ms=NOW, lease_ms=DAY)
    nxt = np.array([NOW + i * MINUTE for i in range(1, 5)], dtype=np.int64)
    ok = eng.complete_many(c.rows, c.tokens, next_due_ms=nxt, now_ms=NOW)
    assert ok.all()
    assert [eng.due_ms(int(r)) for r in c.rows] == nxt.tolist()
    assert eng.verify() == []


@pytest.mark.parametrize("case", ["short_tokens", "float_rows", "nan_next", "neg_next",
                                  "row_range", "two_d"])
def test_complete_many_bad_input_raises_before_anything_changes(eng, case):
    for i in range(4):
        eng.add(NOW - HOUR - i, 3600)
    c = eng.claim(budget=4, now_ms=NOW, lease_ms=DAY)
    before = [eng.describe(int(r)) for r in c.rows]
    rows, toks, nxt = c.rows.copy(), c.tokens.copy(), None
    if case == "short_tokens":
        toks = toks[:3]
    elif case == "float_rows":
        rows = rows.astype(np.float64) + 0.5
    elif case == "nan_next":
        nxt = np.array([NOW, NOW, np.nan, NOW])
    elif case == "neg_next":
        nxt = np.array([NOW, NOW, NOW, -1])
    elif case == "row_range":
        rows[3] = 10**8
    elif case == "two_d":
        rows, toks = rows.reshape(2, 2), toks.reshape(2, 2)
    with pytest.raises(EngineError) as info:
        eng.complete_many(rows, toks, next_due_ms=nxt, now_ms=NOW)
    assert isinstance(info.value, (ValueError, TypeError))
    assert [eng.describe(int(r)) for r in c.rows] == before
    assert eng.complete_many(c.rows, c.tokens, now_ms=NOW).all()
    assert eng.verify() == []


def test_renew_extends_the_lease_and_retires_the_old_token(eng):
    row = eng.add(NOW - HOUR, 3600)
    _, tok = _claim_one(eng, lease_ms=30_000)
    new = eng.renew(row, tok, lease_ms=60_000, now_ms=NOW + 20_000)
    assert isinstance(new, int) and new != tok
    assert eng.describe(row)["lease_expiry_ms"] == NOW + 80_000
    # past the first expiry, inside the renewed one: nobody else gets the row
    assert len(eng.claim(budget=1, now_ms=NOW + 30_001)) == 0
    with pytest.raises(LeaseLost):
        eng.complete(row, tok, now_ms=NOW + 30_001)
    eng.complete(row, new, now_ms=NOW + 30_001)
    assert eng.describe(row)["leased"] is False
    assert eng.verify() == []


@pytest.mark.parametrize("lease_ms", [0, -1, 1.5, None])
def test_renew_rejects_a_bad_lease_length_and_keeps_the_lease(eng, lease_ms):
    row = eng.add(NOW - HOUR, 3600)
    _, tok = _claim_one(eng, lease_ms=30_000)
    before = eng.describe(row)
    with pytest.raises(EngineError) as info:
        eng.renew(row, tok, lease_ms=lease_ms, now_ms=NOW)
    assert isinstance(info.value, (ValueError, TypeError))
    assert eng.describe(row) == before
    eng.release(row, tok)


def test_renew_after_the_lease_was_taken_over_is_refused(eng):
    row = eng.add(NOW - HOUR, 3600)
    _, tok = _claim_one(eng, lease_ms=1_000)
    _, tok2 = _claim_one(eng, now=NOW + 5_000, lease_ms=60_000)
    before = eng.describe(row)
    with pytest.raises(LeaseLost):
        eng.renew(row, tok, lease_ms=60_000, now_ms=NOW + 6_000)
    assert eng.describe(row) == before
    eng.release(row, tok2)
    assert eng.verify() == []


@settings(max_examples=25)
@given(ops=st.lists(st.sampled_from(["complete", "fail", "release", "renew", "stale"]),
                    min_size=1, max_size=25))
def test_at_most_one_live_lease_per_row(fresh, ops):
    """Whatever the holder does, exactly one token is ever valid and a claim never doubles up."""
    with fresh(ten_lanes(cold_after=255), capacity=16) as eng:
        row = eng.add(NOW - HOUR, 60)
        now = NOW
        dead_tokens: list[int] = []
        for op in ops:
            c = eng.claim(budget=4, now_ms=now, lease_ms=1_000)
            if len(c) == 0:  # not due yet: move time to its due time
                now = max(now, eng.due_ms(row)) + 1
                c = eng.claim(budget=4, now_ms=now, lease_ms=1_000)
            assert c.rows.tolist() == [row]
            tok = int(c.tokens[0])
            assert tok not in dead_tokens
            assert len(eng.claim(budget=4, now_ms=now, lease_ms=1_000)) == 0
            for dead in dead_tokens[-3:]:
                with pytest.raises(LeaseLost):
                    eng.release(row, dead)
            if op == "complete":
                eng.complete(row, tok, now_ms=now)
            elif op == "fail":
                eng.fail(row, tok, retry_at_ms=now, now_ms=now)
            elif op == "release":
                eng.release(row, tok)
            elif op == "renew":
                tok2 = eng.renew(row, tok, lease_ms=1_000, now_ms=now)
                dead_tokens.append(tok)
                tok = tok2
                eng.release(row, tok)
            else:  # let it expire: the next claim takes it over
                now += 1_001
            dead_tokens.append(tok)
            assert eng.verify() == []


def test_prioritize_many_of_rows_far_apart_and_named_twice_is_prioritize_on_each(eng):
    """Rows spread over the table, some alone in their stretch of it and some close together
    (on Redis read one by one, and as one span), and a row named twice (counted twice, as a
    loop of prioritize counts it)."""
    rows = eng.add_many(np.full(2100, NOW + DAY), np.full(2100, 7200)).tolist()
    picked = [rows[0], rows[1050], rows[2099], rows[0], *rows[1100:1105]]
    before = eng.describe(rows[1])
    assert eng.prioritize_many(np.array(picked), "rush", now_ms=NOW) == 9
    for r in set(picked):
        d = eng.describe(r)
        assert d["lane"] == 0 and d["due_ms"] == NOW and d["urgent"] is True
    assert eng.describe(rows[1]) == before
    once = [r for i, r in enumerate(picked) if i != 3]
    assert eng.prioritize_many(np.array(once), "wait", now_ms=NOW + 1) == 8
    assert all(eng.describe(r)["urgent"] is False and eng.describe(r)["due_ms"] == NOW + 1
               for r in picked)
    assert eng.verify() == []
