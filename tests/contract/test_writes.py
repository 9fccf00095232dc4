"""Writes (docs/design.md §5, §15): validation that leaves the engine unchanged, capacity, live
policy changes that rewrite no row, restamp, compaction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import DAY, HOUR, MINUTE, NOW, another_handle, snapshot, ten_lanes

from engine import STRIDE, CapacityError, encode
from engine.errors import EngineError, EngineTypeError, EngineValueError, NotAllowed

ONE_PASS = "what one pass over the whole queue grants (over shards a pass sees one shard)"

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)

N = 8


def _good_arrays():
    due = np.array([NOW - i * MINUTE for i in range(N)], dtype=np.int64)
    interval = np.array([600, 7200, 43200, 172800] * 2, dtype=np.int64)
    prov = np.array(["submitted", "discovered"] * 4)
    failures = np.zeros(N, dtype=np.int64)
    return due, interval, prov, failures


# -- add ----------------------------------------------------------------------------------------


def test_add_many_returns_row_ids_and_derives_lanes(eng):
    due, interval, prov, failures = _good_arrays()
    failures[7] = 3
    rows = eng.add_many(due, interval, prov, failures)
    assert isinstance(rows, np.ndarray) and rows.dtype.kind in "iu"
    assert len(set(rows.tolist())) == N
    p = ten_lanes()
    for i, row in enumerate(rows.tolist()):
        d = eng.describe(row)
        assert d["due_ms"] == due[i]
        assert d["interval_s"] == interval[i]
        assert d["provenance"] == prov[i]
        assert d["failures"] == failures[i]
        assert d["lane"] == p.lane_for(str(prov[i]), int(interval[i]), int(failures[i]))
    assert eng.stats()["rows"] == N
    assert eng.verify() == []


def test_add_many_accepts_provenance_codes_and_no_failures(eng):
    due, interval, _, _ = _good_arrays()
    codes = np.array([0, 1] * 4, dtype=np.int64)
    rows = eng.add_many(due, interval, codes)
    assert [eng.describe(r)["provenance"] for r in rows.tolist()] == ["submitted", "discovered"] * 4
    assert all(eng.describe(r)["failures"] == 0 for r in rows.tolist())
    assert eng.verify() == []


def _bad_case(case):
    due, interval, prov, failures = _good_arrays()
    if case == "nan_due":
        due = due.astype(np.float64)
        due[5] = np.nan
    elif case == "inf_due":
        due = due.astype(np.float64)
        due[0] = np.inf
    elif case == "none_in_object_due":
        due = due.astype(object)
        due[3] = None
    elif case == "negative_due":
        due[7] = -1
    elif case == "beyond_horizon_due":
        due[0] = STRIDE
    elif case == "raw_key_due":
        due[2] = encode(3, NOW)
    elif case == "fractional_due":
        due = due.astype(np.float64)
        due[1] += 0.5
    elif case == "string_due":
        due = due.astype(str)
    elif case == "unknown_provenance":
        prov = prov.copy()
        prov[4] = "crawled"
    elif case == "bad_provenance_code":
        prov = np.array([0, 1, 0, 1, 2, 0, 1, 0])
    elif case == "short_interval":
        interval = interval[:-1]
    elif case == "long_provenance":
        prov = np.concatenate([prov, prov[:1]])
    elif case == "short_failures":
        failures = failures[:3]
    elif case == "nan_interval":
        interval = interval.astype(np.float64)
        interval[6] = np.nan
    elif case == "negative_interval":
        interval[6] = -3600
    elif case == "negative_failures":
        failures[2] = -1
    elif case == "two_d_due":
        due = due.reshape(2, 4)
    elif case == "float_row_like_due":  # whole floats are fine, 1.25 is not
        due = due.astype(np.float64) + 0.25
    else:
        raise AssertionError(case)
    return due, interval, prov, failures


BAD_CASES = ["nan_due", "inf_due", "none_in_object_due", "negative_due", "beyond_horizon_due",
             "raw_key_due", "fractional_due", "string_due", "unknown_provenance",
             "bad_provenance_code", "short_interval", "long_provenance", "short_failures",
             "nan_interval", "negative_interval", "negative_failures", "two_d_due",
             "float_row_like_due"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_add_many_with_one_bad_element_raises_and_changes_nothing(eng, case):
    existing = eng.add(NOW - HOUR, 3600)
    before_rows = eng.stats()["rows"]
    before = eng.describe(existing)
    due, interval, prov, failures = _bad_case(case)
    with pytest.raises(EngineError) as info:
        eng.add_many(due, interval, prov, failures)
    assert isinstance(info.value, (EngineValueError, EngineTypeError))
    assert eng.stats()["rows"] == before_rows
    assert eng.describe(existing) == before
    c = eng.claim(budget=50, now_ms=NOW)
    assert c.rows.tolist() == [existing]  # nothing half-added is claimable
    assert eng.verify() == []


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((None, 3600), {}),
        ((math.nan, 3600), {}),
        ((math.inf, 3600), {}),
        ((-1, 3600), {}),
        ((STRIDE, 3600), {}),
        ((encode(1, NOW), 3600), {}),
        ((NOW + 0.5, 3600), {}),
        (("1800000000000", 3600), {}),
        ((NOW, None), {}),
        ((NOW, math.nan), {}),
        ((NOW, -5), {}),
        ((NOW, 3600), {"provenance": "crawled"}),
        ((NOW, 3600), {"provenance": None}),
        ((NOW, 3600), {"failures": -1}),
    ],
    ids=repr,
)
def test_add_rejects_bad_scalars_and_changes_nothing(eng, args, kwargs):
    with pytest.raises(EngineError) as info:
        eng.add(*args, **kwargs)
    assert isinstance(info.value, (ValueError, TypeError))
    assert eng.stats()["rows"] == 0
    assert len(eng.claim(budget=10, now_ms=NOW + DAY)) == 0
    assert eng.verify() == []


def test_absent_due_never_becomes_due_since_1970(eng):
    """A None due time must never reach the queue as 0 (it would drag the floor to unbounded)."""
    good = eng.add(NOW - HOUR, 3600)
    with pytest.raises(EngineValueError):
        eng.add(None, 3600)
    with pytest.raises(EngineValueError):
        eng.add_many(np.array([NOW, None], dtype=object), np.array([60, 60]),
                     np.array(["submitted", "submitted"]))
    c = eng.claim(budget=10, now_ms=NOW)
    assert c.rows.tolist() == [good]
    assert all(d > 0 for d in c.due_ms.tolist())


@settings(max_examples=20)
@given(
    spec=st.lists(
        st.tuples(
            st.integers(0, STRIDE - 1),
            st.integers(1, 10**7),
            st.sampled_from(["submitted", "discovered"]),
            st.integers(0, 10),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_add_many_stores_every_due_time_exactly(fresh, spec):
    with fresh(capacity=64) as eng:
        due = np.array([s[0] for s in spec], dtype=np.int64)
        interval = np.array([s[1] for s in spec], dtype=np.int64)
        prov = np.array([s[2] for s in spec])
        failures = np.array([s[3] for s in spec], dtype=np.int64)
        rows = eng.add_many(due, interval, prov, failures)
        p = eng.policy
        for i, row in enumerate(rows.tolist()):
            assert eng.due_ms(row) == spec[i][0]
            assert eng.lane(row) == p.lane_for(spec[i][2], spec[i][1], spec[i][3])
        assert eng.verify() == []


def test_capacity_error_when_full_and_nothing_changes(make_engine):
    eng = make_engine(capacity=8)
    assert eng.stats()["capacity"] == 8
    rows = [eng.add(NOW - i, 3600) for i in range(7)]
    due, interval, prov, _ = _good_arrays()
    with pytest.raises(CapacityError):
        eng.add_many(due[:3], interval[:3], prov[:3])
    assert eng.stats()["rows"] == 7
    last = eng.add(NOW - 100, 3600)
    with pytest.raises(CapacityError):
        eng.add(NOW, 3600)
    assert eng.stats()["rows"] == 8
    c = eng.claim(budget=20, now_ms=NOW)
    assert sorted(c.rows.tolist()) == sorted(rows + [last])
    assert eng.verify() == []


# -- the policy, live ------------------------------------------------------------------------------


def _headline(eng):
    products = [eng.add(NOW - 3 * DAY - i * MINUTE, 48 * 3600) for i in range(60)]
    home = eng.add(NOW - 2 * HOUR, 3600)
    return products, home


@pytest.mark.one_queue(ONE_PASS)
def test_set_policy_from_an_attached_handle_changes_the_next_claim_and_rewrites_no_row(eng):
    products, home = _headline(eng)
    rows = products + [home]
    other = another_handle(eng)
    try:
        before = snapshot(eng, rows)
        floors = [eng.floor_minute(lane) for lane in range(10)]
        other.set_policy(ten_lanes(remainder="edf"))
        assert snapshot(eng, rows) == before  # no row rewritten
        assert [eng.floor_minute(lane) for lane in range(10)] == floors
        assert eng.policy.remainder == "edf"
        assert other.policy.remainder == "edf"
        c = eng.claim(budget=1, now_ms=NOW)
        assert c.rows.tolist() == [products[59]]  # the oldest now, not the homepage
        other.set_policy(ten_lanes())
        c = eng.claim(budget=1, now_ms=NOW)
        assert c.rows.tolist() == [home]
        assert eng.policy == ten_lanes()
    finally:
        other.close()
    assert eng.verify() == []


def test_set_policy_round_trips_its_values(eng):
    p = ten_lanes(ttl_bands=(600, 7200), cold_after=5, urgent_max_share=0.3,
                   min_share={"discovered": 0.25, "submitted": 0.05}, remainder="edf")
    eng.set_policy(p)
    got = eng.policy
    assert got.ttl_bands == (600, 7200)
    assert got.cold_after == 5
    assert got.urgent_max_share == pytest.approx(0.3, abs=1e-4)
    assert set(got.min_share) == {"discovered", "submitted"}
    assert got.min_share["discovered"] == pytest.approx(0.25, abs=1e-4)
    assert got.min_share["submitted"] == pytest.approx(0.05, abs=1e-4)
    assert got.remainder == "edf"
    assert got.lanes_enabled is True


def test_set_policy_rejects_a_non_policy(eng):
    before = eng.policy
    with pytest.raises(EngineError):
        eng.set_policy({"urgent_max_share": 0.2})
    assert eng.policy == before  # refused, and nothing changed


def test_changed_bands_apply_to_a_row_on_its_next_write_only(eng):
    row = eng.add(NOW - HOUR, 7200)  # band 1 of (3600, 21600, 86400): lane 2
    assert eng.lane(row) == 2
    before = eng.describe(row)
    eng.set_policy(ten_lanes(ttl_bands=(10_000,)))  # 7200 s is now band 0: lane 1
    assert eng.describe(row) == before  # no sweep
    c = eng.claim(budget=1, now_ms=NOW)
    assert c.rows.tolist() == [row]
    eng.complete(row, int(c.tokens[0]), now_ms=NOW)
    assert eng.lane(row) == 1  # re-derived by the write
    assert eng.verify() == []


def test_narrowing_the_bands_leaves_no_row_behind(eng):
    spec = [("submitted", 60, 0), ("submitted", 172800, 0), ("discovered", 60, 0),
            ("discovered", 172800, 0), ("submitted", 60, 5)]
    rows = [eng.add(NOW - HOUR - i * MINUTE, iv, provenance=prov, failures=f)
            for i, (prov, iv, f) in enumerate(spec)]
    assert [eng.lane(r) for r in rows] == [1, 4, 5, 8, 9]
    narrow = ten_lanes(ttl_bands=[])  # 4 lanes: rows now sit in lanes past the layout
    eng.set_policy(narrow)
    assert [eng.lane(r) for r in rows] == [1, 4, 5, 8, 9]  # no sweep
    s = eng.stats(now_ms=NOW)
    assert sum(ln["queued"] for ln in s["lanes"]) == len(rows)  # none hidden from stats
    c = eng.claim(budget=10, now_ms=NOW)
    assert sorted(c.rows.tolist()) == sorted(rows)  # none stranded
    assert eng.verify() == []
    for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
        eng.complete(row, tok, now_ms=NOW)
    for row in rows:  # each row took its lane under the new layout on its write
        d = eng.describe(row)
        assert d["lane"] == narrow.lane_for(d["provenance"], d["interval_s"], d["failures"])
        assert d["lane"] < narrow.lane_count
    assert eng.verify() == []


# -- restamp ------------------------------------------------------------------------------------


@settings(max_examples=15)
@given(
    spec=st.lists(
        st.tuples(
            st.integers(-5 * DAY, 5 * DAY),
            st.sampled_from([60, 3600, 7200, 43200, 172800]),
            st.sampled_from(["submitted", "discovered"]),
            st.integers(0, 4),
        ),
        min_size=1,
        max_size=40,
    ),
    limit=st.integers(1, 12),
)
def test_restamp_preserves_every_due_time_and_reports_done_only_at_the_end(fresh, spec, limit):
    with fresh(ten_lanes(lanes_enabled=False), capacity=64) as eng:
        rows = [eng.add(NOW + off, iv, provenance=prov, failures=f) for off, iv, prov, f in spec]
        assert {eng.lane(r) for r in rows} == {0}
        dues = [eng.due_ms(r) for r in rows]
        assert dues == [NOW + s[0] for s in spec]
        total, calls = 0, 0
        while True:
            calls += 1
            assert calls <= -(-len(rows) // limit) + 1, "restamp takes more batches than needed"
            out = eng.restamp(limit=limit)
            assert set(out) >= {"restamped", "done"}
            assert 0 <= out["restamped"] <= limit
            total += out["restamped"]
            assert [eng.due_ms(r) for r in rows] == dues  # never a due time changed
            if out["done"]:
                break
        assert total == len(rows)
        again = eng.restamp(limit=limit)
        assert again["restamped"] == 0 and again["done"] is True
        enabled = ten_lanes()
        for r, (_, iv, prov, f) in zip(rows, spec, strict=True):
            assert eng.lane(r) == enabled.lane_for(prov, iv, f)
        assert eng.verify() == []
        eng.set_policy(enabled)
        assert [eng.due_ms(r) for r in rows] == dues
        assert eng.verify() == []


def test_restamp_keeps_an_operator_rush_urgent(make_engine):
    eng = make_engine(ten_lanes(lanes_enabled=False))
    rows = [eng.add(NOW - i * MINUTE, 172800) for i in range(5)]
    eng.prioritize(rows[2], "rush", now_ms=NOW - 5)
    while not eng.restamp(limit=2)["done"]:
        pass
    assert [eng.lane(r) for r in rows] == [4, 4, 0, 4, 4]
    assert eng.describe(rows[2])["urgent"] is True
    assert eng.due_ms(rows[2]) == NOW - 5
    assert eng.verify() == []


def test_restamp_refuses_while_lanes_are_enabled(eng):
    rows = [eng.add(NOW - i, 3600) for i in range(5)]
    before = snapshot(eng, rows)
    with pytest.raises(NotAllowed):
        eng.restamp(limit=10)
    assert isinstance(NotAllowed("x"), EngineError)
    assert snapshot(eng, rows) == before


def test_restamped_rows_stay_claimable(make_engine):
    eng = make_engine(ten_lanes(lanes_enabled=False))
    rows = [eng.add(NOW - HOUR - i * MINUTE, (600, 172800)[i % 2]) for i in range(20)]
    eng.compact()
    while not eng.restamp(limit=7)["done"]:
        pass
    eng.set_policy(ten_lanes())
    c = eng.claim(budget=100, now_ms=NOW)
    assert sorted(c.rows.tolist()) == sorted(rows)
    assert set(c.lanes.tolist()) == {1, 4}
    assert eng.verify() == []


# -- compaction ---------------------------------------------------------------------------------


def test_compact_keeps_everything_claimable(eng):
    rows = [eng.add(NOW - HOUR - i * MINUTE, (600, 7200, 43200, 172800)[i % 4],
                    provenance=("submitted", "discovered")[i % 2]) for i in range(40)]
    c = eng.claim(budget=10, now_ms=NOW, lease_ms=10 * DAY)
    done = c.rows.tolist()
    for row, tok in zip(c.rows.tolist()[:5], c.tokens.tolist()[:5], strict=True):
        eng.complete(row, tok, next_due_ms=NOW + DAY, now_ms=NOW)
    removed = [r for r in rows if r not in done][:3]
    for r in removed:
        eng.remove(r)
    assert eng.verify() == []
    eng.compact()
    assert eng.verify() == []
    eng.compact()  # idempotent
    assert eng.verify() == []
    left = set(rows) - set(done) - set(removed)
    c2 = eng.claim(budget=100, now_ms=NOW, lease_ms=10 * DAY)
    assert set(c2.rows.tolist()) == left
    c3 = eng.claim(budget=100, now_ms=NOW + DAY)  # the five completed rows fall due again
    assert set(c3.rows.tolist()) == set(c.rows.tolist()[:5])
    assert eng.verify() == []


@pytest.mark.shm_only("the recent-write ring and its merge: Redis writes go straight to a ZSET")
def test_many_writes_overflow_the_recent_write_area_safely(make_engine):
    eng = make_engine(capacity=2048, ring_capacity=64)
    rows = eng.add_many(np.array([NOW - HOUR - i for i in range(500)], dtype=np.int64),
                        np.full(500, 600, dtype=np.int64), np.zeros(500, dtype=np.int64))
    assert eng.verify() == []
    seen: set[int] = set()
    for k in range(20):
        c = eng.claim(budget=50, now_ms=NOW + k, lease_ms=DAY)
        seen.update(c.rows.tolist())
        for row, tok in zip(c.rows.tolist(), c.tokens.tolist(), strict=True):
            eng.complete(row, tok, next_due_ms=NOW + 2 * DAY + row, now_ms=NOW + k)
        assert eng.verify() == []
    assert seen == set(rows.tolist())
