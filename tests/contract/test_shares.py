"""Fairness between lanes (docs/design.md §3, §10): floors are minimums, the urgent cap holds, and
the C pass grants exactly what the reference allocator ``engine.policy.reference_pass`` says."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import (
    DAY,
    HOUR,
    LANE_INTERVALS,
    MINUTE,
    NOW,
    add_to_lane,
    another_handle,
    lane_bounds,
    lane_counts,
    share_policies,
    ten_lanes,
)

from engine import LanePolicy
from engine.policy import CLASSIC_FLOORS, COARSE_BANDS, reference_pass

ONE_PASS = "what one pass over the whole queue grants (over shards a pass sees one shard)"
SHORT_PASS = ("a cap or floor of one pass (over shards a short pass moves on to the next"
              " shard, whose pass has a cap and floors of its own)")

LANE_ORDER = ten_lanes(remainder="lane-order")
"""The floors with the rest in lane order: what a floor guarantees, apart from the lateness
remainder's order (which serves a floor class beyond its floor when it is the latest)."""
STRICT = ten_lanes(urgent_max_share=1.0, min_share={}, remainder="lane-order")
"""Strict priority: no floors, urgent uncapped, the rest in lane order."""

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)


def _fill(eng, submitted=0, discovered=0, cold=0, urgent=0):
    """Rows all due before NOW: submitted in lane 1, discovered in lane 5, cold in lane 9.

    Due times are a minute apart so that a lane's floor can follow the drain (the stall of a
    lane on stale entries sharing one minute has its own test in test_claim.py)."""
    rows = defaultdict(list)
    for i in range(submitted):
        rows[1].append(eng.add(NOW - HOUR - i * MINUTE, 600, provenance="submitted"))
    for i in range(discovered):
        rows[5].append(eng.add(NOW - DAY - i * MINUTE, 600, provenance="discovered"))
    for i in range(cold):
        rows[9].append(eng.add(NOW - 2 * DAY - i * MINUTE, 600, provenance="submitted",
                               failures=3))
    for i in range(urgent):
        row = eng.add(NOW + DAY + i, 600, provenance="submitted")
        eng.prioritize(row, "rush", now_ms=NOW - 1000 - i)
        rows[0].append(row)
    for lane, rs in rows.items():
        assert {eng.lane(r) for r in rs} == {lane}
    return rows


def _drain(eng, budget, calls, complete=True, handles=None):
    """Claim ``calls`` times (completing every grant, like a worker) and count grants per lane."""
    counts = [0] * 10
    handles = handles or [eng]
    for k in range(calls):
        h = handles[k % len(handles)]
        now = NOW + k
        c = h.claim(budget=budget, now_ms=now, lease_ms=HOUR)
        for lane, n in enumerate(lane_counts(c, 10)):
            counts[lane] += n
        if complete:
            for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                h.complete(row, tok, next_due_ms=NOW + 30 * DAY, now_ms=now)
    return counts


def _discovered_share(fresh, budget, calls):
    with fresh(LANE_ORDER, capacity=1024) as eng:
        _fill(eng, submitted=400, discovered=100)
        eng.compact()
        counts = _drain(eng, budget, calls)
        assert sum(counts) == budget * calls  # no capacity left idle
        assert eng.verify() == []
        return counts[5] / sum(counts)


@pytest.mark.one_queue(SHORT_PASS)
def test_discovered_floor_is_a_minimum_with_budget_one_and_sixty_four(fresh):
    one = _discovered_share(fresh, 1, 320)
    many = _discovered_share(fresh, 64, 5)
    assert 0.08 <= one <= 0.12, one
    assert 0.08 <= many <= 0.12, many
    assert abs(one - many) <= 0.02, (one, many)


def test_floor_shares_are_accounted_across_processes_handles(fresh):
    with fresh(LANE_ORDER, capacity=1024) as eng:
        _fill(eng, submitted=400, discovered=100)
        other = another_handle(eng)
        try:
            counts = _drain(eng, 1, 300, handles=[eng, other])
        finally:
            other.close()
        assert 0.08 <= counts[5] / 300 <= 0.12, counts
        assert eng.verify() == []


def test_floor_shares_hold_across_concurrent_worker_processes(fresh):
    import multiprocessing as mp

    from lanes_testlib import address, child_worker_lanes, get_result

    with fresh(LANE_ORDER, capacity=2048) as eng:
        _fill(eng, submitted=900, discovered=300)
        ctx = mp.get_context("fork")
        queues = [ctx.Queue() for _ in range(3)]
        procs = [ctx.Process(target=child_worker_lanes, args=(address(eng), NOW, 200, 1, q))
                 for q in queues]
        for p in procs:
            p.start()
        try:
            lanes = [lane for q in queues for lane in get_result(q, timeout=120)]
        finally:
            for p in procs:
                p.join(60)
        assert all(p.exitcode == 0 for p in procs)
        assert len(lanes) == 600  # one grant per call: no call came back empty
        share = lanes.count(5) / len(lanes)
        assert 0.07 <= share <= 0.13, share
        assert eng.verify() == []


def test_cold_floor_gets_its_two_percent(fresh):
    with fresh(LANE_ORDER, capacity=1024) as eng:
        _fill(eng, submitted=400, cold=50)
        counts = _drain(eng, 1, 300)
        assert 4 <= counts[9] <= 8, counts
        assert counts[1] + counts[9] == 300
        assert eng.verify() == []


def test_without_floors_strict_priority_starves_the_tail(fresh):
    with fresh(STRICT, capacity=1024) as eng:
        _fill(eng, submitted=200, discovered=50)
        counts = _drain(eng, 4, 40)
        assert counts[5] == 0
        assert counts[1] == 160
        assert eng.verify() == []


def test_unused_floor_is_released_to_the_remainder_in_the_same_pass(fresh):
    with fresh(capacity=1024) as eng:
        _fill(eng, submitted=200)
        for _ in range(5):
            c = eng.claim(budget=10, now_ms=NOW, lease_ms=HOUR)
            assert len(c) == 10  # discovered and cold have nothing due: their floors are not held
            assert set(c.lanes.tolist()) == {1}
        assert eng.verify() == []


def test_an_idle_class_banks_no_credit(fresh):
    with fresh(LANE_ORDER, capacity=1024) as eng:
        _fill(eng, submitted=300)
        counts = _drain(eng, 1, 100)
        assert counts[1] == 100
        disc = [eng.add(NOW - DAY - i * MINUTE, 600, provenance="discovered") for i in range(50)]
        c = eng.claim(budget=10, now_ms=NOW + 1000, lease_ms=HOUR)
        got = lane_counts(c, 10)
        assert len(c) == 10
        assert 1 <= got[5] <= 2, got  # its floor, not an hour of banked credit
        assert set(c.rows[c.lanes == 5].tolist()) <= set(disc)
        assert eng.verify() == []


@pytest.mark.one_queue(SHORT_PASS)
def test_urgent_cap_holds_when_nothing_else_is_due(fresh):
    with fresh(capacity=1024) as eng:
        rows = _fill(eng, urgent=40)
        counts = _drain(eng, 1, 100, complete=False)
        assert 18 <= counts[0] <= 22, counts
        assert sum(counts) == counts[0]
        leased = sum(eng.describe(r)["leased"] for r in rows[0])
        assert leased == counts[0]
        assert eng.verify() == []


def test_urgent_cap_holds_with_other_lanes_due_and_capacity_goes_to_them(fresh):
    with fresh(capacity=1024) as eng:
        _fill(eng, submitted=200, urgent=60)
        counts = _drain(eng, 1, 100)
        assert 18 <= counts[0] <= 22, counts
        assert sum(counts) == 100
        assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
def test_uncapped_urgent_drains_first(fresh):
    with fresh(STRICT, capacity=1024) as eng:
        _fill(eng, submitted=50, urgent=30)
        c = eng.claim(budget=40, now_ms=NOW, lease_ms=HOUR)
        got = lane_counts(c, 10)
        assert got[0] == 30 and got[1] == 10
        assert eng.verify() == []


# -- the C pass against the reference allocator -------------------------------------------------


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=40, deadline=None)
@given(
    policy=share_policies(),
    rows=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5 * DAY)), max_size=120),
    budgets=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    compacted=st.booleans(),
)
def test_claim_pass_grants_what_the_reference_allocator_grants(fresh, policy, rows, budgets,
                                                              compacted):
    with fresh(policy, capacity=256) as eng:
        # lane -> row -> due
        remaining: dict[int, dict[int, int]] = {lane: {} for lane in range(10)}
        for target, age in rows:
            due = NOW - age
            row = add_to_lane(eng, target, due)
            lane = target if policy.lanes_enabled else 0
            assert eng.lane(row) == lane
            assert eng.due_ms(row) == due
            remaining[lane][row] = due
        if compacted:
            eng.compact()
        credits: dict[str, int] = {}
        for budget in budgets:
            due_lists = [sorted(remaining[lane].values()) for lane in range(10)]
            intervals = [[LANE_INTERVALS[lane]] * len(due_lists[lane]) for lane in range(10)]
            expected, credits = reference_pass(policy, budget, due_lists, credits, now=NOW,
                                               intervals=intervals, bounds=lane_bounds(eng))
            c = eng.claim(budget=budget, now_ms=NOW, lease_ms=DAY)
            assert lane_counts(c, 10) == expected, (budget, due_lists)
            for lane in range(10):
                pairs = zip(c.due_ms.tolist(), c.lanes.tolist(), strict=True)
                got = sorted(d for d, ln in pairs if ln == lane)
                assert got == due_lists[lane][: expected[lane]]  # EDF inside the lane
            for row, lane in zip(c.rows.tolist(), c.lanes.tolist(), strict=True):
                assert row in remaining[lane]
                del remaining[lane][row]
        assert eng.verify() == []


def test_uncapped_urgent_lane_accrues_no_credit(fresh):
    """urgent_max_share=1.0 means no cap: urgent is served first and no credit is kept for it
    (a sign slip once accrued 2**32 - 1 grants of credit per call)."""
    with fresh(ten_lanes(urgent_max_share=1.0, min_share={}), capacity=256) as eng:
        rows = eng.add_many(np.full(20, NOW - HOUR), 3600)
        for r in rows[:10]:
            eng.prioritize(int(r), "rush", now_ms=NOW)
        granted = [len(eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR)) for _ in range(5)]
        assert granted == [1] * 5
        assert eng.stats(NOW)["credits"] == {"urgent": 0.0, "submitted": 0.0,
                                              "discovered": 0.0, "cold": 0.0}
        assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=40, deadline=None)
@given(
    weights=st.dictionaries(st.sampled_from(ten_lanes().lane_names()),
                            st.sampled_from([0.001, 0.5, 2.0, 4.0, 1000.0]), max_size=4),
    rows=st.lists(st.tuples(st.sampled_from(["submitted", "discovered"]),
                            st.integers(1, 4 * DAY // 1000), st.integers(0, 5 * DAY),
                            st.sampled_from([0, 0, 3])), min_size=1, max_size=80),
    budgets=st.lists(st.integers(1, 24), min_size=1, max_size=8),
    step=st.sampled_from([0, MINUTE, HOUR]),
)
def test_lateness_grants_what_the_reference_grants_as_floors_rise(fresh, weights, rows, budgets,
                                                                  step):
    """remainder="lateness" over rows of any interval, pass after pass with the clock moving:
    the floors the passes raise and the lowest interval each lane has seen let the C pass leave
    lanes unopened, which must never change a choice of the reference."""
    policy = ten_lanes(remainder="lateness", weights=weights)
    with fresh(policy, capacity=256) as eng:
        _claims_agree_with_the_reference(eng, policy, rows, budgets, step)


def _claims_agree_with_the_reference(eng, policy, rows, budgets, step):
    """Add ``rows`` (provenance, interval, age, failures), then claim ``budgets`` pass after pass
    with the clock moving ``step``: each pass grants per lane what ``reference_pass`` grants."""
    lanes = policy.lane_count
    queued: dict[int, tuple[int, int, int]] = {}  # row -> (lane, due, interval)
    for prov, interval, age, failures in rows:
        row = eng.add(NOW - age, interval, provenance=prov, failures=failures)
        queued[row] = (eng.lane(row), NOW - age, interval)
    eng.compact()
    credits: dict[str, int] = {}
    now = NOW
    for budget in budgets:
        now += step
        heads = sorted((lane, due, row, iv) for row, (lane, due, iv) in queued.items())
        due_lists = [[d for ln, d, _, _ in heads if ln == lane] for lane in range(lanes)]
        intervals = [[i for ln, _, _, i in heads if ln == lane] for lane in range(lanes)]
        expected, credits = reference_pass(policy, budget, due_lists, credits, now=now,
                                           intervals=intervals, bounds=lane_bounds(eng))
        c = eng.claim(budget=budget, now_ms=now, lease_ms=30 * DAY)
        assert lane_counts(c, lanes) == expected, (budget, due_lists, intervals)
        for row in c.rows.tolist():
            del queued[row]
    assert eng.verify() == []


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(["submitted", "discovered"]),
                            st.sampled_from([1800, 3600, 8 * 3600, 30 * 3600, 48 * 3600]),
                            st.integers(0, 30 * DAY), st.sampled_from([0, 0, 0, 0, 3])),
                  min_size=1, max_size=120),
    budgets=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    step=st.sampled_from([0, MINUTE, HOUR]),
)
def test_the_production_shape_grants_what_the_reference_grants(fresh, rows, budgets, step):
    """The production shape (bench_constraints (f)): intervals of 30 min, 1 h, 8 h, 30 h and
    48 h under the bands 1 h / 6 h / 24 h, so the submitted and the discovered lane of the first
    band hold rows of two intervals and take turns (the C pass's duel, without its heap), with
    the floors 0.10 / 0.02 and the weights derived from the rows."""
    policy = LanePolicy(ttl_bands=COARSE_BANDS, min_share=CLASSIC_FLOORS)
    with fresh(policy, capacity=256) as eng:
        _claims_agree_with_the_reference(eng, policy, rows, budgets, step)


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(["submitted", "discovered"]),
                            st.integers(60, 30 * DAY // 1000), st.integers(0, 5 * DAY),
                            st.sampled_from([0, 0, 0, 3])), min_size=1, max_size=80),
    budgets=st.lists(st.integers(1, 24), min_size=1, max_size=8),
    step=st.sampled_from([0, MINUTE, HOUR]),
)
def test_a_fitted_policy_grants_what_the_reference_grants(fresh, rows, budgets, step):
    """``LanePolicy.fitted`` (64 lanes, weights fitted to the rows' intervals) is given weights
    to the engine: the C pass, the Lua pass and the reference agree on it as on any other."""
    policy = LanePolicy.fitted(np.array([iv for _, iv, _, _ in rows]),
                               [p for p, _, _, _ in rows])
    assert policy.lane_count == 64
    with fresh(policy, capacity=256) as eng:
        _claims_agree_with_the_reference(eng, policy, rows, budgets, step)


@pytest.mark.one_queue(ONE_PASS)
@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(["submitted", "discovered"]),
                            st.sampled_from([600, 1800, 7200, 30 * 3600, 9 * 86400, 200 * 86400]),
                            st.integers(0, 5 * DAY), st.sampled_from([0, 0, 0, 3])),
                  min_size=1, max_size=80),
    budgets=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    step=st.sampled_from([0, MINUTE, HOUR]),
)
def test_the_default_policy_grants_what_the_reference_grants(fresh, rows, budgets, step):
    """``LanePolicy()`` itself: 64 lanes of which the rows use a few, far apart (the Lua pass
    finds each with one seek past the empty ones), the floors taking from a lane the remainder
    then weighs past what they took."""
    with fresh(LanePolicy(), capacity=256) as eng:
        _claims_agree_with_the_reference(eng, LanePolicy(), rows, budgets, step)


@pytest.mark.one_queue(ONE_PASS)
def _weighed(eng) -> dict[str, tuple[int, int]]:
    """The lanes the derived weights weigh: those written into since the bands took effect."""
    return {ln["name"]: (ln["iv_min"], ln["iv_max"]) for ln in eng.stats(now_ms=NOW)["lanes"]
            if ln["iv_max"]}


@pytest.mark.one_queue("the order of one claim pass over the whole queue (over shards a pass"
                       " sees one shard)")
def test_a_running_engine_moves_to_the_default_with_set_policy_rewriting_no_row(fresh):
    """An engine running the lane-order floors (the policy a deployment made before the
    lateness default) moves to ``LanePolicy()`` live: a worker's next claim on its own handle
    follows the new order, and no row is rewritten (every row reads back the same). The rows
    stay in their lane numbers until their next write; the derived weights weigh a lane by the
    rows written into it since the bands took effect, so none at first."""
    with fresh(LANE_ORDER, capacity=1024) as eng:
        catalog = [eng.add(NOW - HOUR - k * MINUTE, 12 * 3600) for k in range(20)]  # ~0.1 late
        product = [eng.add(NOW - 47 * HOUR - k * MINUTE, 48 * 3600) for k in range(20)]  # ~1
        eng.add_many(np.full(200, NOW + DAY), np.full(200, 6 * 3600))  # not due: rows at rest
        eng.compact()
        worker = another_handle(eng)
        try:
            c = worker.claim(budget=2, now_ms=NOW)
            assert c.rows.tolist() == catalog[::-1][:2]  # lane order: catalog (lane 3) first
            for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                worker.release(row, tok)
            rows = range(eng.stats(now_ms=NOW)["rows"])
            before = [eng.describe(r, now_ms=NOW) for r in rows]
            eng.set_policy(LanePolicy())
            assert [eng.describe(r, now_ms=NOW) for r in rows] == before
            assert worker.policy == LanePolicy()
            assert _weighed(eng) == {}  # the old layout's rows weigh no lane of the new one
            c = worker.claim(budget=2, now_ms=NOW)
            assert c.rows.tolist() == product[::-1][:2]  # the latest relative to its interval
            for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
                worker.complete(row, tok, now_ms=NOW)  # written again: into the new layout
            new = LanePolicy()
            assert _weighed(eng) == {new.lane_name(new.lane_for("submitted", 48 * 3600)):
                                     (48 * 3600, 48 * 3600)}
            eng.set_policy(dataclasses.replace(new, urgent_max_share=0.1))  # the same lanes
            assert len(_weighed(eng)) == 1
        finally:
            worker.close()
        assert eng.verify() == []
