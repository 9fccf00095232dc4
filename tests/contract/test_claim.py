"""The claim pass (docs/design.md §7): lanes, per-lane floors, spill, stale entries, EDF inside a
lane."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import DAY, HOUR, MINUTE, NOW, ten_lanes

from engine import STRIDE, encode
from engine.errors import EngineError, EngineTypeError, EngineValueError
from engine.policy import lateness_quantum

ONE_PASS = "what one pass over the whole queue grants (over shards a pass sees one shard)"

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

PRODUCT_INTERVAL = 48 * 3600
HOME_INTERVAL = 3600


def _minute(due_ms: int) -> int:
    return due_ms // MINUTE


def _headline(eng):
    products = [
        eng.add(NOW - 3 * DAY - i * MINUTE, PRODUCT_INTERVAL, provenance="submitted")
        for i in range(60)
    ]
    home = eng.add(NOW - 2 * HOUR, HOME_INTERVAL, provenance="submitted")
    return products, home


# -- the headline -------------------------------------------------------------------------------


@pytest.mark.one_queue(ONE_PASS)
@pytest.mark.parametrize("compacted", [False, True], ids=["recent-writes", "indexed"])
@pytest.mark.parametrize("window", [1, 140])
def test_deep_backlog_in_slow_lane_does_not_hide_fast_lane(make_engine, compacted, window):
    eng = make_engine()
    products, home = _headline(eng)
    assert eng.lane(home) == 1
    assert {eng.lane(p) for p in products} == {4}
    if compacted:
        eng.compact()
    c = eng.claim(budget=1, now_ms=NOW, window=window)
    assert c.rows.tolist() == [home]
    assert c.lanes.tolist() == [1]
    assert c.due_ms.tolist() == [NOW - 2 * HOUR]
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_without_lanes_the_deep_backlog_hides_the_homepage(make_engine):
    eng = make_engine(ten_lanes(lanes_enabled=False))
    products, home = _headline(eng)
    assert eng.lane(home) == 0
    assert {eng.lane(p) for p in products} == {0}
    c = eng.claim(budget=1, now_ms=NOW)
    assert len(c) == 1
    assert int(c.rows[0]) in products
    assert int(c.due_ms[0]) == NOW - 3 * DAY - 59 * MINUTE  # the oldest: plain EDF
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_edf_serves_global_due_order_across_lanes(make_engine):
    eng = make_engine(ten_lanes(remainder="edf"))
    products, home = _headline(eng)
    c = eng.claim(budget=1, now_ms=NOW)
    assert c.rows.tolist() == [products[59]]
    assert c.lanes.tolist() == [4]  # the true lane is kept, only the order is global
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_lateness_serves_the_lane_head_latest_relative_to_its_interval(make_engine):
    """The headline again: the homepage is 2 intervals late, the oldest product 3 days of 2, so
    1.5 intervals: the homepage first, then products in due order. Only the choice between lane
    heads changes; inside a lane the order stays EDF."""
    eng = make_engine(ten_lanes(remainder="lateness"))
    products, home = _headline(eng)
    c = eng.claim(budget=3, now_ms=NOW)
    assert c.rows.tolist() == [home, products[59], products[58]]
    assert c.lanes.tolist() == [1, 4, 4]
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_lateness_weights_scale_a_lane_head_lateness(make_engine):
    """Weight 0.5 on the homepage band makes its 2 intervals count as 1, below the products'
    1.5: products first. Weight 1000 on the product band keeps it ahead of a homepage 10 h late."""
    eng = make_engine(ten_lanes(remainder="lateness", weights={"submitted/b0": 0.5}))
    products, home = _headline(eng)
    c = eng.claim(budget=1, now_ms=NOW)
    assert c.rows.tolist() == [products[59]]
    eng.set_policy(ten_lanes(remainder="lateness", weights={"submitted/b3": 1000.0}))
    late_home = eng.add(NOW - 10 * HOUR, HOME_INTERVAL)
    c = eng.claim(budget=2, now_ms=NOW)
    assert c.rows.tolist() == [products[58], products[57]]
    eng.set_policy(ten_lanes(remainder="lateness"))
    c = eng.claim(budget=2, now_ms=NOW)
    assert c.rows.tolist() == [late_home, home]  # 10, then 2 intervals late; products 1.5
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_lateness_ignores_rows_not_yet_due_and_breaks_ties_by_lane(make_engine):
    """A row due in the future is no candidate however short its interval; equal lateness goes
    to the lower lane, and a row due this very millisecond (lateness 0) is still granted."""
    eng = make_engine(ten_lanes(remainder="lateness", min_share={}))
    eng.add(NOW + MINUTE, HOME_INTERVAL)
    product = eng.add(NOW - DAY, PRODUCT_INTERVAL)                 # 0.5 intervals late, lane 4
    catalog = eng.add(NOW - 6 * HOUR, 12 * 3600)                   # 0.5 intervals late, lane 3
    now_row = eng.add(NOW, 7200)                                   # 0 late, lane 2
    c = eng.claim(budget=5, now_ms=NOW)
    assert c.rows.tolist() == [catalog, product, now_row]
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_lateness_opens_a_lone_lane_before_taking_from_it(make_engine):
    """With a single lane left and no runner-up, the pass opens that lane before granting: the
    process's cursor for the lane is a past pass's, here another engine's, whose rows are not
    this engine's (it granted a row past this engine's capacity)."""
    first = make_engine(ten_lanes(), capacity=512)
    first.add_many(np.full(300, NOW - DAY), np.full(300, PRODUCT_INTERVAL))
    homes = [first.add(NOW - HOUR, HOME_INTERVAL) for _ in range(5)]
    assert first.claim(budget=3, now_ms=NOW).rows.tolist() == homes[:3]  # the 4th is peeked
    second = make_engine(ten_lanes(min_share={}), capacity=16)
    rows = [second.add(NOW - k * MINUTE, HOME_INTERVAL) for k in range(3)]
    c = second.claim(budget=4, now_ms=NOW)
    assert c.rows.tolist() == rows[::-1]
    assert second.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_lateness_weighs_heads_in_quanta_of_a_64th_ties_to_the_lower_lane(make_engine):
    """Heads are compared by weight x lateness / interval in quanta of a 64th (a double's exponent
    and top six mantissa bits: engine.policy.lateness_quantum), ties to the lower lane, on every
    backend. Weight 1 (65536 in fixed point) and a 1 h interval: 225 x 2^14 ms late weighs
    exactly 2^26, a quantum's first value. A head 1/128 later is in that quantum and waits for
    the lower lane's; one 1/64 later is in the next quantum and goes first from the higher lane."""
    eng = make_engine(ten_lanes(remainder="lateness", min_share={}, weights={}))
    late = 225 << 14
    assert late * 65536 // 3600 == 1 << 26
    lower = eng.add(NOW - late, 3600, provenance="submitted")
    tied = eng.add(NOW - (late + late // 128), 3600, provenance="discovered")
    assert eng.lane(lower) < eng.lane(tied)
    assert eng.claim(budget=2, now_ms=NOW).rows.tolist() == [lower, tied]
    lower = eng.add(NOW - late, 3600, provenance="submitted")
    later = eng.add(NOW - (late + late // 64), 3600, provenance="discovered")
    assert eng.claim(budget=2, now_ms=NOW).rows.tolist() == [later, lower]
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_remainder_edf_weighs_heads_by_lateness_alone_in_the_same_quanta(make_engine):
    """edf is the lateness remainder with every lane weighing 1 and every interval 1 s: heads are
    compared by now - due in quanta of a 64th, ties to the lower lane. 2^26 ms late is a
    quantum's first value: a head 1/128 later waits for the lower lane's, 1/64 later goes first.
    Intervals play no part: the later head's is 48 times the other's."""
    eng = make_engine(ten_lanes(remainder="edf", min_share={}))
    late = 1 << 26
    lower = eng.add(NOW - late, 1800, provenance="submitted")
    tied = eng.add(NOW - (late + late // 128), 1800, provenance="discovered")
    assert eng.claim(budget=2, now_ms=NOW).rows.tolist() == [lower, tied]
    lower = eng.add(NOW - late, 1800, provenance="submitted")
    later = eng.add(NOW - (late + late // 64), 48 * 1800, provenance="discovered")
    assert eng.lane(lower) < eng.lane(later)
    assert eng.claim(budget=2, now_ms=NOW).rows.tolist() == [later, lower]
    assert eng.verify() == []


# -- claim results ------------------------------------------------------------------------------


def test_claims_expose_parallel_int64_arrays_and_iterate_as_records(eng):
    rows = [eng.add(NOW - i * MINUTE, 600) for i in range(5)]
    c = eng.claim(budget=3, now_ms=NOW)
    assert len(c) == 3
    for arr in (c.rows, c.lanes, c.due_ms, c.tokens):
        assert isinstance(arr, np.ndarray)
        assert arr.dtype == np.int64
        assert arr.shape == (3,)
    items = list(c)
    assert [x.row for x in items] == c.rows.tolist()
    assert [x.lane for x in items] == c.lanes.tolist()
    assert [x.due_ms for x in items] == c.due_ms.tolist()
    assert [x.token for x in items] == c.tokens.tolist()
    assert set(c.rows.tolist()) <= set(rows)
    for x in items:
        assert eng.due_ms(x.row) == x.due_ms  # the true due time, not a key
        assert x.due_ms < STRIDE
        assert eng.lane(x.row) == x.lane
    assert len(set(c.tokens.tolist())) == 3
    assert eng.verify() == []


def test_a_row_is_not_claimed_before_it_is_due(eng):
    row = eng.add(NOW + 5 * MINUTE, 600)
    assert len(eng.claim(budget=4, now_ms=NOW)) == 0
    assert len(eng.claim(budget=4, now_ms=NOW + 5 * MINUTE - 1)) == 0
    c = eng.claim(budget=4, now_ms=NOW + 5 * MINUTE)
    assert c.rows.tolist() == [row]
    assert eng.verify() == []


def test_claim_without_now_uses_the_wall_clock(eng):
    import time

    wall = time.time_ns() // 1_000_000
    past = eng.add(wall - HOUR, 600)
    eng.add(wall + DAY, 600)
    c = eng.claim(budget=5)
    assert c.rows.tolist() == [past]
    d = eng.describe(past)
    assert wall + 30_000 - 5_000 <= d["lease_expiry_ms"] <= wall + 30_000 + 60_000
    assert eng.verify() == []


def test_a_claimed_row_is_not_claimed_again_while_leased(eng):
    rows = [eng.add(NOW - MINUTE, 600) for _ in range(3)]
    first = eng.claim(budget=10, now_ms=NOW, lease_ms=60_000)
    assert sorted(first.rows.tolist()) == sorted(rows)
    assert len(eng.claim(budget=10, now_ms=NOW + 59_000)) == 0
    assert eng.verify() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(budget=-1),
        dict(budget=1.5),
        dict(budget=None),
        dict(budget=1, now_ms=math.nan),
        dict(budget=1, now_ms=-5),
        dict(budget=1, now_ms=encode(1, NOW)),
        dict(budget=1, lease_ms=-5),
        dict(budget=1, window=-1),
    ],
    ids=repr,
)
def test_bad_claim_arguments_are_rejected_and_change_nothing(eng, kwargs):
    row = eng.add(NOW - MINUTE, 600)
    kwargs.setdefault("now_ms", NOW)
    with pytest.raises(EngineError) as info:
        eng.claim(**kwargs)
    assert isinstance(info.value, (ValueError, TypeError))
    assert eng.describe(row)["leased"] is False
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [row]
    assert eng.verify() == []


# -- EDF inside a lane, and the disabled / edf orders -------------------------------------------


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=25)
@given(
    offsets=st.lists(st.integers(-5 * DAY, 2 * HOUR), min_size=1, max_size=40),
    budgets=st.lists(st.integers(1, 8), min_size=1, max_size=20),
    compacted=st.booleans(),
)
def test_rows_of_one_lane_are_claimed_in_due_order(fresh, offsets, budgets, compacted):
    with fresh(capacity=128) as eng:
        rows = {eng.add(NOW + off, 600): NOW + off for off in offsets}
        assert {eng.lane(r) for r in rows} == {1}
        if compacted:
            eng.compact()
        due_now = sorted(d for d in rows.values() if d <= NOW)
        got: list[int] = []
        for budget in budgets:
            c = eng.claim(budget=budget, now_ms=NOW, lease_ms=DAY)
            dues = c.due_ms.tolist()
            assert dues == sorted(dues)
            assert all(d <= NOW for d in dues)
            got += dues
        assert got == due_now[: len(got)]  # exactly the earliest, in order
        assert len(got) == min(len(due_now), sum(budgets))
        assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=20)
@given(
    spec=st.lists(
        st.tuples(
            st.integers(-3 * DAY, 0),
            st.sampled_from([60, 7200, 43200, 172800]),
            st.sampled_from(["submitted", "discovered"]),
            st.integers(0, 5),
        ),
        min_size=1,
        max_size=40,
    ),
    budget=st.integers(1, 50),
)
def test_lanes_disabled_behaves_as_one_edf_queue(fresh, spec, budget):
    with fresh(ten_lanes(lanes_enabled=False), capacity=128) as eng:
        for off, interval, prov, failures in spec:
            eng.add(NOW + off, interval, provenance=prov, failures=failures)
        c = eng.claim(budget=budget, now_ms=NOW)
        assert set(c.lanes.tolist()) <= {0}
        expected = sorted(NOW + s[0] for s in spec)[:budget]
        assert c.due_ms.tolist() == expected
        assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=20)
@given(
    spec=st.lists(
        st.tuples(
            st.integers(-3 * DAY, 0),
            st.sampled_from([60, 7200, 43200, 172800]),
            st.sampled_from(["submitted", "discovered"]),
        ),
        min_size=1,
        max_size=40,
    ),
    budget=st.integers(1, 50),
)
def test_remainder_edf_grants_the_globally_earliest_rows_to_a_quantum(fresh, spec, budget):
    """edf grants the most overdue rows across lanes, told apart to a quantum of a 64th of how
    overdue (``lateness_quantum`` of weight 1 and interval 1 s): no row left behind is in a
    higher quantum than any row granted."""
    with fresh(ten_lanes(remainder="edf", min_share={}), capacity=128) as eng:
        for off, interval, prov in spec:
            eng.add(NOW + off, interval, provenance=prov)
        c = eng.claim(budget=budget, now_ms=NOW)
        granted = c.due_ms.tolist()
        left = sorted(NOW + s[0] for s in spec)
        for due in granted:
            left.remove(due)
        assert len(granted) == min(budget, len(spec))
        quantum = [lateness_quantum(1, NOW - due, 1) for due in granted]
        assert all(lateness_quantum(1, NOW - due, 1) <= min(quantum) for due in left)
        assert eng.verify() == []


# -- floors -------------------------------------------------------------------------------------


@pytest.mark.one_queue(ONE_PASS)
def test_wedged_lane_does_not_strand_another_lane(make_engine):
    eng = make_engine(ten_lanes(cold_after=255))
    wedged_due = NOW - 3 * DAY
    wedged = eng.add(wedged_due, HOME_INTERVAL)  # lane 1, always fails at the same due time
    others = [eng.add(NOW - DAY - i * MINUTE, PRODUCT_INTERVAL) for i in range(10)]
    assert eng.lane(wedged) == 1 and {eng.lane(r) for r in others} == {4}
    eng.compact()
    served: list[int] = []
    for i in range(15):
        now = NOW + i * 1000
        c = eng.claim(budget=2, now_ms=now, lease_ms=HOUR)
        assert wedged in c.rows.tolist()  # lane order: the fast lane first, every time
        for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
            if row == wedged:
                eng.fail(row, tok, retry_at_ms=wedged_due, now_ms=now)
            else:
                served.append(row)
                eng.complete(row, tok, next_due_ms=NOW + 30 * DAY, now_ms=now)
        assert eng.verify() == []
    assert sorted(served) == sorted(others)
    assert eng.due_ms(wedged) == wedged_due
    assert eng.lane(wedged) == 1
    assert eng.floor_minute(1) <= _minute(wedged_due)
    # the wedged row pins only its own lane's floor
    assert eng.floor_minute(4) >= _minute(NOW - DAY - 9 * MINUTE) > _minute(wedged_due)
    assert eng.verify() == []


@pytest.mark.shm_only("floors as stored words: Redis has none and reports its earliest ready row "
                      "(docs/redis.md, Why no floors)")
def test_floor_rises_past_rows_in_flight_and_their_return_lowers_it(eng):
    """A granted row is taken out of the index until its lease ends, so it holds no floor; what
    ends the lease (release, expiry) puts it back and lowers the floor to it again."""
    dues = [NOW - 3 * HOUR, NOW - 2 * HOUR, NOW - HOUR]
    rows = [eng.add(d, HOME_INTERVAL) for d in dues]
    eng.compact()
    assert eng.floor_minute(1) == 0
    first = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert first.rows.tolist() == [rows[0]]
    second = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert second.rows.tolist() == [rows[1]]
    eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)  # takes rows[2]
    assert len(eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)) == 0  # all in flight
    assert eng.floor_minute(1) == _minute(dues[2])  # past the two rows in flight below it
    assert eng.stats(NOW)["in_flight"] == 3
    assert eng.verify() == []

    eng.release(rows[1], int(second.tokens[0]))  # back due, below the floor: lowers it
    assert eng.floor_minute(1) == _minute(dues[1])
    assert eng.verify() == []
    c = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert c.rows.tolist() == [rows[1]]
    assert len(eng.claim(budget=3, now_ms=NOW + DAY - 1, lease_ms=DAY)) == 0
    # every lease lapses at NOW + DAY: the first pass then finds all three, in due order
    c = eng.claim(budget=3, now_ms=NOW + DAY, lease_ms=DAY)
    assert c.rows.tolist() == rows
    assert eng.floor_minute(1) <= _minute(dues[0])
    assert eng.verify() == []


def test_floor_is_lowered_by_a_write_below_it(eng):
    rows = [eng.add(NOW - HOUR + i * MINUTE, HOME_INTERVAL) for i in range(5)]
    eng.compact()
    c = eng.claim(budget=5, now_ms=NOW, lease_ms=DAY)
    for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
        eng.complete(row, tok, next_due_ms=NOW + DAY, now_ms=NOW)
    eng.claim(budget=5, now_ms=NOW, lease_ms=DAY)
    raised = eng.floor_minute(1)
    assert raised >= _minute(NOW - HOUR)
    low_due = NOW - 5 * HOUR
    late = eng.add(low_due, HOME_INTERVAL)
    assert 0 < eng.floor_minute(1) <= _minute(low_due)
    assert eng.verify() == []
    c = eng.claim(budget=5, now_ms=NOW)
    assert c.rows.tolist() == [late]
    assert set(rows).isdisjoint(c.rows.tolist())
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_floor_is_lowered_by_a_reschedule_below_it(make_engine):
    # lane order: its pass proposes the floor past the row it grants in that same pass
    eng = make_engine(ten_lanes(remainder="lane-order"))
    a = eng.add(NOW - HOUR, HOME_INTERVAL)
    b = eng.add(NOW - 30 * MINUTE, HOME_INTERVAL)
    eng.compact()
    c = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert c.rows.tolist() == [a]
    eng.complete(a, int(c.tokens[0]), next_due_ms=NOW + DAY, now_ms=NOW)
    c2 = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert c2.rows.tolist() == [b]
    assert eng.floor_minute(1) >= _minute(NOW - 30 * MINUTE)
    # b fails and retries far below the floor: the floor must come down to it
    eng.fail(b, int(c2.tokens[0]), retry_at_ms=NOW - 10 * HOUR, now_ms=NOW)
    assert eng.floor_minute(1) <= _minute(NOW - 10 * HOUR)
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [b]
    assert eng.verify() == []


@pytest.mark.shm_only("floors as stored words: Redis has none and reports its earliest ready row "
                      "(docs/redis.md, Why no floors)")
def test_floor_of_zero_stays_zero_when_lowered(eng):
    for lane_interval in (HOME_INTERVAL, PRODUCT_INTERVAL):
        eng.add(NOW - HOUR, lane_interval)
        eng.add(NOW + HOUR, lane_interval)
    assert eng.floor_minute(1) == 0
    assert eng.floor_minute(4) == 0  # "lowering" 0 to a minute would raise it
    eng.add(NOW + 2 * HOUR, HOME_INTERVAL)
    eng.add(NOW - 2 * HOUR, PRODUCT_INTERVAL)
    assert eng.floor_minute(1) == 0
    assert all(eng.floor_minute(lane) == 0 for lane in range(10))
    assert eng.verify() == []


def test_floor_minute_of_a_bad_lane_is_rejected(eng):
    with pytest.raises(EngineValueError):
        eng.floor_minute(-1)
    with pytest.raises(EngineValueError):
        eng.floor_minute(10_000)


# -- spill and stale entries --------------------------------------------------------------------


def test_reading_into_the_next_lane_ends_the_lane_and_counts_no_spill(eng):
    fast = [eng.add(NOW - HOUR - i, HOME_INTERVAL) for i in range(2)]  # lane 1
    slow = [eng.add(NOW - DAY - i, 7200) for i in range(3)]  # lane 2
    eng.compact()
    c = eng.claim(budget=10, now_ms=NOW, lease_ms=DAY)
    assert sorted(c.rows.tolist()) == sorted(fast + slow)
    by_row = dict(zip(c.rows.tolist(), c.lanes.tolist(), strict=True))
    assert all(by_row[r] == 1 for r in fast)
    assert all(by_row[r] == 2 for r in slow)  # lane 1's seek read them but did not grant them
    lanes = eng.stats(now_ms=NOW)["lanes"]
    assert [ln["spilled"] for ln in lanes] == [0] * len(lanes)  # an empty lane's end is no spill
    assert lanes[1]["granted"] == 2
    assert lanes[2]["granted"] == 3
    c = eng.claim(budget=10, now_ms=NOW, lease_ms=DAY)  # passes over empty lanes: still none
    assert len(c) == 0
    assert [ln["spilled"] for ln in eng.stats(now_ms=NOW)["lanes"]] == [0] * len(lanes)
    assert eng.verify() == []


@pytest.mark.shm_only("the spill counter: a ZSET seek reads nothing past its range (Redis: 0)")
def test_due_entries_past_the_window_are_counted_as_spilled(eng):
    rows = [eng.add(NOW - HOUR - i, HOME_INTERVAL) for i in range(30)]  # lane 1, all due
    later = [eng.add(NOW + HOUR + i, HOME_INTERVAL) for i in range(5)]  # lane 1, not due
    eng.compact()
    c = eng.claim(budget=30, now_ms=NOW, lease_ms=DAY, window=10)
    assert len(c) == 10
    lane = eng.stats(now_ms=NOW)["lanes"][1]
    assert lane["spilled"] == 20  # the due ones the window left; not the 5 that are not due
    c = eng.claim(budget=30, now_ms=NOW, lease_ms=DAY, window=10)
    assert len(c) == 10
    assert eng.stats(now_ms=NOW)["lanes"][1]["spilled"] == 30  # + the 10 left this time
    assert set(rows) | set(later) >= set(c.rows.tolist())
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_window_caps_what_one_lane_grants_in_one_pass(eng):
    rows = [eng.add(NOW - HOUR - i, HOME_INTERVAL) for i in range(30)]  # lane 1, all due
    eng.compact()
    first = eng.claim(budget=30, now_ms=NOW, lease_ms=DAY, window=10)
    assert first.due_ms.tolist() == sorted(eng.due_ms(r) for r in rows)[:10]
    second = eng.claim(budget=30, now_ms=NOW, lease_ms=DAY, window=10)
    assert second.due_ms.tolist() == sorted(eng.due_ms(r) for r in rows)[10:20]
    assert eng.verify() == []


@pytest.mark.shm_only("stale index entries: a ZSET rewrites a row's score in place, there are none")
def test_stale_index_entries_are_skipped_and_counted(eng):
    rows = [eng.add(NOW - HOUR + i * MINUTE, HOME_INTERVAL) for i in range(5)]
    eng.compact()
    c = eng.claim(budget=5, now_ms=NOW, lease_ms=DAY)
    assert sorted(c.rows.tolist()) == sorted(rows)
    for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
        eng.complete(row, tok, now_ms=NOW)  # next due: now + 1 h, the old entries go stale
    for row in rows:
        assert eng.due_ms(row) == NOW + HOUR
    before = eng.stats(now_ms=NOW)["lanes"][1]["stale_skipped"]
    again = eng.claim(budget=5, now_ms=NOW)  # before any compaction
    assert len(again) == 0
    assert eng.stats(now_ms=NOW)["lanes"][1]["stale_skipped"] > before
    later = eng.claim(budget=5, now_ms=NOW + HOUR)
    assert sorted(later.rows.tolist()) == sorted(rows)
    assert eng.verify() == []


def test_stale_entries_sharing_the_floor_minute_do_not_stall_a_lane(eng):
    """300 rows due within one minute, drained one at a time like a worker pool does: the
    completed rows' index entries all sit in the floor's minute, so the floor cannot step past
    them; the lane must still serve every due row (compacting, or reading on), not go quiet
    after one window (140) of stale entries. Invariant 8: a due row is eventually claimed."""
    base = NOW - HOUR  # minute-aligned
    rows = [eng.add(base + i, HOME_INTERVAL) for i in range(300)]
    assert len({_minute(eng.due_ms(r)) for r in rows}) == 1
    eng.compact()
    served = []
    for k in range(300):
        c = eng.claim(budget=1, now_ms=NOW + k, lease_ms=HOUR)
        assert len(c) == 1, f"lane 1 went quiet after {k} grants with {300 - k} rows due"
        served.append(int(c.rows[0]))
        eng.complete(int(c.rows[0]), int(c.tokens[0]), next_due_ms=NOW + DAY, now_ms=NOW + k)
    assert sorted(served) == sorted(rows)
    assert eng.verify() == []


def test_granted_counters_add_up_to_the_rows_claimed(eng):
    for i in range(12):
        eng.add(NOW - i * MINUTE, (600, 7200, 43200)[i % 3], provenance="submitted")
    total = 0
    for budget in (1, 2, 3, 4):
        total += len(eng.claim(budget=budget, now_ms=NOW, lease_ms=DAY))
    assert total == 10
    lanes = eng.stats(now_ms=NOW)["lanes"]
    assert sum(ln["granted"] for ln in lanes) == 10
    assert sum(ln["leased"] for ln in lanes) == 10
    assert eng.verify() == []


def test_a_permanent_failure_goes_cold_at_once_and_a_transient_one_does_not(eng):
    cold = eng.policy.lane_count - 1
    a = eng.add(NOW - HOUR, HOME_INTERVAL)
    b = eng.add(NOW - HOUR, HOME_INTERVAL)
    c = eng.claim(budget=2, now_ms=NOW, lease_ms=DAY)
    tok = dict(zip(c.rows.tolist(), c.tokens.tolist(), strict=True))
    eng.fail(a, tok[a], now_ms=NOW, permanent=True)
    eng.fail(b, tok[b], now_ms=NOW)
    assert eng.lane(a) == cold and eng.describe(a)["failures"] == eng.policy.cold_after
    assert eng.lane(b) == 1 and eng.describe(b)["failures"] == 1
    with pytest.raises(EngineTypeError):
        eng.fail(b, tok[b], now_ms=NOW, permanent=1)  # checked before the token
    assert eng.verify() == []
