"""Lane layout and policy validation (docs/design.md §3), and sanity of the reference allocator."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW, TEN_LANES, ten_lanes

from engine import EngineError, LanePolicy
from engine.errors import EngineTypeError, EngineValueError
from engine.policy import (
    FINE_BANDS,
    FIRST_BAND_WEIGHT,
    INTERVALS,
    ONE,
    lateness_quantum,
    reference_pass,
    spread_weight_fp,
)

DEFAULT_NAMES = [
    "urgent",
    "submitted/b0", "submitted/b1", "submitted/b2", "submitted/b3",
    "discovered/b0", "discovered/b1", "discovered/b2", "discovered/b3",
    "cold",
]


# -- bands ----------------------------------------------------------------------------------


def test_the_suites_layout_has_ten_lanes_with_the_documented_names():
    p = TEN_LANES
    assert p.ttl_bands == (3600, 21600, 86400)
    assert p.lane_count == 10
    assert p.cold_lane == 9
    assert [p.lane_name(lane) for lane in range(10)] == DEFAULT_NAMES
    assert dict(p.min_share) == {"discovered": 0.10, "cold": 0.02}
    assert p.remainder == "lateness"
    assert dict(p.weights) == {f"{prov}/b{band}": w for prov in ("submitted", "discovered")
                               for band, w in enumerate((4.0, 1.5651, 1.4142))}


def test_the_default_policy_has_fine_bands_and_weights_derived_from_the_intervals():
    p = LanePolicy()
    assert p.ttl_bands == FINE_BANDS and len(FINE_BANDS) == 30
    assert all(b / a == pytest.approx(2 ** 0.5, rel=1e-3)
               for a, b in zip(FINE_BANDS, FINE_BANDS[1:], strict=False))
    assert p.lane_count == 64 and p.cold_lane == 63
    assert p.lane_name(1) == "submitted/b0" and p.lane_name(32) == "discovered/b0"
    assert p.cold_after == 3
    assert p.urgent_max_share == pytest.approx(0.2)
    assert dict(p.min_share) == {"discovered": 0.10, "cold": 0.005}
    assert p.remainder == "lateness" and p.weights == INTERVALS and p.live_weights
    assert p.lanes_enabled is True
    assert LanePolicy.from_dict(p.to_dict()) == p and p.to_dict()["weights"] == INTERVALS
    with pytest.raises(EngineValueError, match="weights must be"):
        LanePolicy(weights="band")


def test_derived_weights_follow_each_lane_s_spread_and_the_shortest_interval():
    """``interval_weights_fp``: a band lane that held rows weighs its spread, four times that
    when it holds the shortest interval of the band lanes; urgent, cold and unused lanes 1."""
    p = LanePolicy()
    bounds = [(0, 0)] * 64
    bounds[0] = (60, 60)  # urgent: not weighed, and not the shortest
    bounds[3] = (3600, 3600)  # submitted 1 h: the shortest of the band lanes
    bounds[3 + 31] = (3600, 5000)  # discovered, same band: shortest too, and spread
    bounds[10] = (20000, 28000)
    bounds[63] = (30, 30)  # cold: not weighed
    w = p.lane_weights_fp(64, bounds)
    assert w[3] == FIRST_BAND_WEIGHT * ONE
    assert w[34] == FIRST_BAND_WEIGHT * spread_weight_fp(3600, 5000)
    assert w[10] == spread_weight_fp(20000, 28000) == round((28000 / 20000) ** (3 / 16) * ONE)
    assert w[0] == w[63] == w[5] == ONE
    with pytest.raises(EngineValueError, match="interval bounds"):
        p.lane_weights_fp(64)


def test_unsorted_duplicated_band_list_is_normalised():
    p = ten_lanes(ttl_bands=[86400, 3600, 21600, 3600, 86400.0])
    assert p.ttl_bands == (3600, 21600, 86400)
    assert p == TEN_LANES
    assert hash(p) == hash(TEN_LANES)
    assert hash(LanePolicy(ttl_bands=[86400, 3600])) == hash(LanePolicy(ttl_bands=(3600, 86400)))


def test_empty_band_list_means_one_band():
    p = ten_lanes(ttl_bands=[])
    assert p.ttl_bands == ()
    assert p.lane_count == 4
    assert [p.lane_name(lane) for lane in range(4)] == [
        "urgent", "submitted/b0", "discovered/b0", "cold"]
    assert p.lane_for("submitted", 10) == 1
    assert p.lane_for("submitted", 10**7) == 1
    assert p.lane_for("discovered", 10**7) == 2
    assert p.lane_for("discovered", 5, failures=3) == 3


@given(st.lists(st.integers(1, 10**7), max_size=40))
def test_band_lists_normalise_to_sorted_unique_positive_seconds(bands):
    unique = sorted(set(bands))
    if len(unique) > 30:
        with pytest.raises(EngineValueError):
            ten_lanes(ttl_bands=bands)
        return
    p = ten_lanes(ttl_bands=bands)
    assert p.ttl_bands == tuple(unique)
    assert p.lane_count == 2 * (len(unique) + 1) + 2
    assert ten_lanes(ttl_bands=list(reversed(bands)) + bands).ttl_bands == tuple(unique)


@pytest.mark.parametrize("bands", [[0], [-3600], [3600, math.nan], [math.inf], [1.5]], ids=repr)
def test_non_positive_or_fractional_bands_are_rejected(bands):
    with pytest.raises(EngineValueError):
        ten_lanes(ttl_bands=bands)


@pytest.mark.parametrize("bands", ["3600", [None], ["3600"], [True], 3600], ids=repr)
def test_non_numeric_bands_are_rejected(bands):
    with pytest.raises(EngineTypeError):
        ten_lanes(ttl_bands=bands)


# -- validation -------------------------------------------------------------------------------


BAD_VALUES = [
    dict(urgent_max_share=-0.01),
    dict(urgent_max_share=1.01),
    dict(urgent_max_share=math.nan),
    dict(urgent_max_share=math.inf),
    dict(min_share={"discovered": -0.1}),
    dict(min_share={"discovered": 1.5}),
    dict(min_share={"cold": math.nan}),
    dict(urgent_max_share=0.5, min_share={"discovered": 0.3, "cold": 0.3}),
    dict(urgent_max_share=0.0, min_share={"submitted": 0.6, "discovered": 0.41}),
    dict(min_share={"urgent": 0.1}),
    dict(min_share={"vip": 0.1}),
    dict(min_share={"Discovered": 0.1}),
    dict(remainder="random"),
    dict(remainder="EDF"),
    dict(cold_after=0),
    dict(cold_after=-1),
    dict(cold_after=256),
    dict(remainder="Lateness"),
    dict(weights={"submitted/b9": 2.0}),
    dict(weights={"submitted": 2.0}),
    dict(weights={"home": 2.0}),
    dict(weights={"submitted/b0": 0.0}),
    dict(weights={"submitted/b0": -1.0}),
    dict(weights={"submitted/b0": math.nan}),
    dict(weights={"submitted/b0": math.inf}),
    dict(weights={"submitted/b0": 0.0009}),
    dict(weights={"cold": 1000.5}),
    dict(weights={"cold": 10**400}),
    dict(ttl_bands=(3600,), weights={"submitted/b2": 2.0}),  # a lane of other bands
]


@pytest.mark.parametrize("kwargs", BAD_VALUES, ids=repr)
def test_bad_policy_values_are_rejected(kwargs):
    with pytest.raises(EngineValueError):
        ten_lanes(**kwargs)


BAD_TYPES = [
    dict(lanes_enabled=1),
    dict(lanes_enabled="yes"),
    dict(lanes_enabled=None),
    dict(cold_after=True),
    dict(cold_after=3.0),
    dict(urgent_max_share="0.2"),
    dict(urgent_max_share=True),
    dict(min_share=[("discovered", 0.1)]),
    dict(min_share={"discovered": "0.1"}),
    dict(weights=[("submitted/b0", 2.0)]),
    dict(weights={"submitted/b0": "2"}),
    dict(weights={"submitted/b0": None}),
]


@pytest.mark.parametrize("kwargs", BAD_TYPES, ids=repr)
def test_bad_policy_types_are_rejected(kwargs):
    with pytest.raises(EngineTypeError):
        ten_lanes(**kwargs)


def test_policy_errors_are_engine_errors():
    with pytest.raises(EngineError):
        ten_lanes(urgent_max_share=2)
    with pytest.raises(ValueError):
        ten_lanes(urgent_max_share=2)
    with pytest.raises(TypeError):
        ten_lanes(lanes_enabled=0)


def test_shares_summing_to_exactly_one_are_accepted():
    p = ten_lanes(urgent_max_share=0.5, min_share={"discovered": 0.3, "cold": 0.2})
    assert p.urgent_max_share + sum(p.min_share.values()) == pytest.approx(1.0)
    assert ten_lanes(urgent_max_share=1.0, min_share={}).urgent_max_share == 1.0


# -- lane derivation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prov, interval, failures, lane",
    [
        ("submitted", 60, 0, 1),
        ("submitted", 3600, 0, 1),  # a band boundary belongs to the shorter band
        ("submitted", 3601, 0, 2),
        ("submitted", 21600, 0, 2),
        ("submitted", 86400, 0, 3),
        ("submitted", 172800, 0, 4),
        ("discovered", 60, 0, 5),
        ("discovered", 7200, 0, 6),
        ("discovered", 43200, 0, 7),
        ("discovered", 172800, 0, 8),
        ("submitted", 3600, 2, 1),
        ("submitted", 3600, 3, 9),
        ("discovered", 172800, 200, 9),
    ],
)
def test_lane_for_default_layout(prov, interval, failures, lane):
    p = TEN_LANES
    assert p.lane_for(prov, interval, failures) == lane


def test_lane_for_intent_and_suppression_and_disabled_lanes():
    p = TEN_LANES
    assert p.lane_for("discovered", 172800, 5, urgent=True) == 0
    assert p.lane_for("submitted", 60, 0, suppressed=True) == 9
    off = ten_lanes(lanes_enabled=False)
    for prov in ("submitted", "discovered"):
        for interval in (60, 7200, 10**6):
            assert off.lane_for(prov, interval, 10) == 0
    with pytest.raises(EngineValueError):
        p.lane_for("crawled", 60)
    with pytest.raises(EngineValueError):
        off.lane_for("crawled", 60)


def test_class_of_every_default_lane():
    p = TEN_LANES
    assert [p.class_of(lane) for lane in range(10)] == (
        ["urgent"] + ["submitted"] * 4 + ["discovered"] * 4 + ["cold"])
    assert p.class_of(40) == "cold"  # a lane left by a wider layout counts as cold


@settings(max_examples=200)
@given(
    bands=st.lists(st.integers(1, 10**6), max_size=8),
    prov=st.sampled_from(["submitted", "discovered"]),
    interval=st.integers(1, 10**7),
    failures=st.integers(0, 255),
    cold_after=st.integers(1, 255),
)
def test_lane_for_stays_in_layout_and_matches_class(bands, prov, interval, failures, cold_after):
    p = ten_lanes(ttl_bands=bands, cold_after=cold_after)
    lane = p.lane_for(prov, interval, failures)
    assert 1 <= lane < p.lane_count
    if failures >= cold_after:
        assert lane == p.cold_lane
        assert p.class_of(lane) == "cold"
    else:
        assert p.class_of(lane) == prov
        assert p.lane_name(lane).startswith(prov + "/b")
        # longer intervals never land in a faster lane
        assert p.lane_for(prov, interval + 1, failures) >= lane


# -- the reference allocator -------------------------------------------------------------------


def _run_reference(policy, budgets, due):
    credits: dict[str, int] = {}
    left = [sorted(d) for d in due]
    total = [0] * len(due)
    for budget in budgets:
        grants, credits = reference_pass(policy, budget, left, credits, now=NOW)
        for lane, g in enumerate(grants):
            assert 0 <= g <= len(left[lane])
            del left[lane][:g]
            total[lane] += g
        assert sum(grants) <= budget
    return total, credits


LANE_ORDER = ten_lanes(remainder="lane-order")
"""The floors with the rest in lane order: the reference's floor and credit rules, apart from
the lateness remainder's order."""
STRICT = ten_lanes(urgent_max_share=1.0, min_share={}, remainder="lane-order")
"""Strict priority: no floors, urgent uncapped, the rest in lane order."""


def test_reference_urgent_cap_holds_when_nothing_else_is_due():
    due = [[i for i in range(200)]] + [[] for _ in range(9)]
    total, _ = _run_reference(LANE_ORDER, [1] * 100, due)
    assert 18 <= total[0] <= 22
    assert sum(total) == total[0]


def test_reference_uncapped_urgent_takes_everything():
    due = [[i for i in range(200)]] + [[] for _ in range(9)]
    total, _ = _run_reference(STRICT, [1] * 100, due)
    assert total[0] == 100


def test_reference_floor_is_a_minimum_with_budget_one_and_sixty_four():
    due = [[] for _ in range(10)]
    due[1] = list(range(1000))
    due[5] = list(range(1000))
    one, _ = _run_reference(LANE_ORDER, [1] * 320, due)
    many, _ = _run_reference(LANE_ORDER, [64] * 5, due)
    assert sum(one) == sum(many) == 320
    for total in (one, many):
        assert 0.08 <= total[5] / 320 <= 0.12
    assert abs(one[5] - many[5]) <= 4


def test_reference_unused_floor_is_released_to_the_remainder():
    due = [[] for _ in range(10)]
    due[1] = list(range(100))
    grants, credits = reference_pass(LANE_ORDER, 10, due, {})
    assert grants[1] == 10
    assert credits["discovered"] == 0  # an idle class banks nothing
    assert credits["cold"] == 0


def test_reference_idle_class_banks_no_credit():
    due = [[] for _ in range(10)]
    due[1] = list(range(1000))
    total, credits = _run_reference(LANE_ORDER, [1] * 200, due)
    assert total[1] == 200
    due = [[] for _ in range(10)]
    due[1] = list(range(1000))
    due[5] = list(range(1000))
    grants, _ = reference_pass(LANE_ORDER, 10, due, credits)
    assert 1 <= grants[5] <= 2


def test_reference_lanes_disabled_is_one_queue_without_shares():
    due = [list(range(50))] + [[] for _ in range(9)]
    grants, _ = reference_pass(ten_lanes(lanes_enabled=False), 30, due, {})
    assert grants[0] == 30


@settings(max_examples=150)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=10, max_size=10),
    budget=st.integers(1, 100),
    remainder=st.sampled_from(["lane-order", "edf"]),
)
def test_reference_grants_the_whole_budget_when_no_urgent_row_is_due(sizes, budget, remainder):
    sizes[0] = 0
    due = [list(range(n)) for n in sizes]
    grants, credits = reference_pass(ten_lanes(remainder=remainder), budget, due, {}, now=NOW)
    assert sum(grants) == min(budget, sum(sizes))
    assert all(0 <= c < 3 * budget * ONE + ONE for c in credits.values())


# -- remainder="lateness" ----------------------------------------------------------------------


def test_lane_weights_name_lanes_of_the_layout_and_default_to_one():
    p = ten_lanes(remainder="lateness", weights={"cold": 0.5, "submitted/b0": 4, "urgent": 1.0})
    assert p.weights == {"submitted/b0": 4.0, "cold": 0.5}  # lane order; 1.0 is the default
    assert p == ten_lanes(remainder="lateness", weights={"submitted/b0": 4.0, "cold": 0.5})
    assert hash(p) == hash(ten_lanes(remainder="lateness",
                                      weights={"submitted/b0": 4.0, "cold": 0.5}))
    assert p != ten_lanes(remainder="lateness", weights={"submitted/b0": 4.0})
    fp = p.lane_weights_fp(12)
    assert fp[1] == 4 * ONE and fp[9] == ONE // 2 and fp[2] == ONE and fp[11] == ONE
    assert ten_lanes(ttl_bands=()).lane_names() == [
        "urgent", "submitted/b0", "discovered/b0", "cold"]


def test_reference_lateness_needs_now_and_intervals_shaped_as_due():
    p = ten_lanes(remainder="lateness")
    due = [[], [NOW - 2 * 3600_000]] + [[]] * 8
    with pytest.raises(EngineValueError):
        reference_pass(p, 1, due, {})
    with pytest.raises(EngineValueError):
        reference_pass(p, 1, due, {}, now=NOW, intervals=[[]] * 10)
    grants, _ = reference_pass(p, 1, due, {}, now=NOW, intervals=[[], [3600]] + [[]] * 8)
    assert grants[1] == 1
    with pytest.raises(EngineValueError):  # edf weighs heads by now - due too
        reference_pass(ten_lanes(remainder="edf"), 1, due, {})


@settings(max_examples=200)
@given(
    heads=st.lists(st.tuples(st.integers(0, 10 * 86_400_000), st.integers(0, 2**32 - 1),
                             st.sampled_from([0.001, 0.5, 1.0, 3.0, 1000.0])),
                   min_size=9, max_size=9),
)
def test_reference_lateness_takes_the_head_with_the_highest_weighted_relative_lateness(heads):
    """One grant, no floors: it goes to the lane whose head maximises weight * late / interval
    (an interval of 0 counts as 1 s) in quanta of a 64th: frexp's exponent and the top six bits
    of its mantissa, the lowest such lane on a tie. So no head is more than a 64th later than
    the one granted (exact rationals, past the doubles' roundings), and any that is later is
    in a higher lane."""
    from fractions import Fraction

    names = TEN_LANES.lane_names()
    p = ten_lanes(remainder="lateness", min_share={},
                   weights={names[lane + 1]: w for lane, (_, _, w) in enumerate(heads)})
    due = [[]] + [[NOW - late] for late, _, _ in heads]
    intervals = [[]] + [[iv] for _, iv, _ in heads]
    grants, _ = reference_pass(p, 1, due, {}, now=NOW, intervals=intervals)
    fp = p.lane_weights_fp(10)

    def quantum(v: float) -> float:
        m, e = math.frexp(v)
        return e * 64 + math.floor((m - 0.5) * 128) if v > 0 else -math.inf

    q = [quantum(float(fp[lane + 1]) * float(late) / max(1, iv))
         for lane, (late, iv, _) in enumerate(heads)]
    best = q.index(max(q)) + 1
    assert grants == [1 if lane == best else 0 for lane in range(10)]
    score = [Fraction(fp[lane + 1] * late, max(1, iv)) for lane, (late, iv, _) in enumerate(heads)]
    won = score[best - 1] * (1 + Fraction(1, 2**40))  # past the doubles' roundings
    assert all(s * 64 <= won * 65 for s in score)
    assert all(lane + 1 > best for lane, s in enumerate(score) if s > won)
    # quanta=False (engine.sim's exact anchor): the highest exactly, the lowest lane on a tie
    grants, _ = reference_pass(p, 1, due, {}, now=NOW, intervals=intervals, quanta=False)
    exact = score.index(max(score)) + 1
    assert grants == [1 if lane == exact else 0 for lane in range(10)]


@pytest.mark.parametrize(("args", "error"), [
    ((1.0, 10, 60), EngineTypeError), ((1, 10.5, 60), EngineTypeError),
    ((1, 10, True), EngineTypeError), ((None, 10, 60), EngineValueError),
    ((-1, 10, 60), EngineValueError), ((1 << 26, 10, 60), EngineValueError),
    ((1, 10, 1 << 32), EngineValueError), ((1, 10, -1), EngineValueError),
])
def test_lateness_quantum_refuses_what_no_head_can_hold(args, error):
    with pytest.raises(error):
        lateness_quantum(*args)


def test_lateness_quantum_orders_heads_and_counts_a_head_not_yet_late_as_zero():
    assert lateness_quantum(ONE, -5, 60) == lateness_quantum(ONE, 0, 60) == 0
    assert lateness_quantum(ONE, 10, 0) == lateness_quantum(ONE, 10, 1)  # an interval of 0: 1 s
    # 2**26 is a quantum's first value: a 128th more shares it, a 64th more is the next one
    assert lateness_quantum(1, 1 << 26, 1) == lateness_quantum(1, (1 << 26) + (1 << 19), 1)
    assert lateness_quantum(1, (1 << 26) + (1 << 20), 1) == lateness_quantum(1, 1 << 26, 1) + 1


def test_reference_pass_refuses_a_quanta_that_is_not_a_bool():
    with pytest.raises(EngineTypeError):
        reference_pass(ten_lanes(), 1, [[NOW]] + [[]] * 9, {}, now=NOW,
                       intervals=[[60]] + [[]] * 9, quanta="no")


@pytest.mark.parametrize(("failures", "interval_s", "error"), [
    (0, 60, EngineValueError), (256, 60, EngineValueError), (1, 0, EngineValueError),
    (1, 1 << 32, EngineValueError), (1.0, 60, EngineTypeError), (True, 60, EngineTypeError),
    (None, 60, EngineValueError),
])
def test_backoff_ms_refuses_what_no_row_can_hold(failures, interval_s, error):
    with pytest.raises(error):
        LanePolicy().backoff_ms(failures, interval_s)
