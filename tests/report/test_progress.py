"""The arithmetic of progress (engine/report/progress.py): quantiles from bucket counts, durations,
due times, rates and drain times as a person reads them, and the next due row per lane."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import checkpoint as ck
from engine.policy import LanePolicy
from engine.pool.board import DURATION_BUCKETS, LATENCY_BOUNDS, LATENCY_BUCKETS, coarse
from engine.report import progress, words

NB = len(DURATION_BUCKETS) + 1
NOW = 1_800_000_000_000
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def _counts(**at: int) -> list[int]:
    """Bucket counts with ``b<i>=n`` set."""
    c = [0] * NB
    for k, n in at.items():
        c[int(k[1:])] = n
    return c


# -- quantiles ---------------------------------------------------------------------------------


def _q(counts: list[int], q: float) -> float | None:
    """``quantile`` over the coarse ``DURATION_BUCKETS`` (the arithmetic is the same)."""
    return progress.quantile(counts, q, DURATION_BUCKETS)


def test_a_quantile_interpolates_linearly_inside_its_bucket() -> None:
    # 10 renders in (0.1, 0.25]: the median is half-way through the bucket.
    assert _q(_counts(b7=10), 0.5) == pytest.approx(0.175)
    # 10 in the first bucket, 10 in (0.5, 1.0]: p50 is the top of the first, p75 half-way.
    c = _counts(b0=10, b9=10)
    assert _q(c, 0.5) == pytest.approx(0.001)
    assert _q(c, 0.75) == pytest.approx(0.75)


def test_a_quantile_in_the_first_bucket_is_its_bound_and_reads_under_it() -> None:
    """Nothing below the first bound is measured: the renders the issue saw as
    "0.50/0.95/0.99 ms" (interpolated from 0) read "< 1 ms"."""
    qs = progress.quantiles(_fine(b0=30))
    assert qs == (LATENCY_BOUNDS[0],) * 3
    assert progress.format_latency(qs) == "< 1/< 1/< 1 ms"
    assert progress.format_latency(progress.quantiles(_fine(b0=60, b20=40))).startswith("< 1/")


def _fine(**at: int) -> list[int]:
    c = [0] * LATENCY_BUCKETS
    for k, n in at.items():
        c[int(k[1:])] = n
    return c


@given(st.lists(st.floats(0.0012, 59.0), min_size=20, max_size=400),
       st.sampled_from(progress.QUANTILES))
def test_a_quantile_of_the_fine_histogram_is_within_its_bucket_of_the_truth(
        durations: list[float], q: float) -> None:
    """What the pool records (a render's duration in ``LATENCY_BOUNDS``' bucket) gives back a
    quantile no further from the sample's own than one bucket's width (15 % at most)."""
    counts = np.bincount(np.searchsorted(LATENCY_BOUNDS, durations), minlength=LATENCY_BUCKETS)
    got = progress.quantile(counts, q)
    assert got is not None
    truth = sorted(durations)[max(0, math.ceil(q * len(durations)) - 1)]  # the rank-th render
    assert truth / 1.15 <= got <= truth * 1.15, (got, truth)


def test_the_fine_buckets_add_up_to_the_prometheus_buckets() -> None:
    durations = [0.0005, 0.001, 0.0011, 0.2, 0.25, 0.26, 9.9, 10.0, 29.0, 61.0]
    fine = np.bincount(np.searchsorted(LATENCY_BOUNDS, durations), minlength=LATENCY_BUCKETS)
    expected = np.bincount(np.searchsorted(DURATION_BUCKETS, durations), minlength=NB)
    assert coarse(fine).tolist() == expected.tolist()
    assert set(DURATION_BUCKETS) <= set(LATENCY_BOUNDS)


def test_an_empty_histogram_has_no_quantile_and_the_overflow_bucket_has_no_bound() -> None:
    assert progress.quantiles([0] * NB, bounds=DURATION_BUCKETS) == (None, None, None)
    p50, p95, p99 = progress.quantiles(_counts(b5=90, b15=10), bounds=DURATION_BUCKETS)
    assert p50 is not None and p50 <= 0.05 and p95 == p99 == math.inf
    assert progress.format_latency((p50, p95, p99)) == f"{p50:.2f}/> 60/> 60 s"
    with pytest.raises(ValueError):
        _q([1, 2], 0.5)
    with pytest.raises(ValueError):
        _q(_counts(b0=1), 1.5)


@given(st.lists(st.integers(0, 10**9), min_size=NB, max_size=NB))
def test_quantiles_are_ordered_and_lie_within_the_buckets(counts: list[int]) -> None:
    p50, p95, p99 = progress.quantiles(counts, bounds=DURATION_BUCKETS)
    if sum(counts) == 0:
        assert (p50, p95, p99) == (None, None, None)
        return
    assert p50 is not None and p95 is not None and p99 is not None
    assert 0.0 <= p50 <= p95 <= p99
    for p in (p50, p95, p99):
        assert p <= DURATION_BUCKETS[-1] or p == math.inf
    first = next(i for i, n in enumerate(counts) if n)
    last = max(i for i, n in enumerate(counts) if n)
    lo = 0.0 if first == 0 else DURATION_BUCKETS[first - 1]
    hi = math.inf if last == NB - 1 else DURATION_BUCKETS[last]
    assert lo <= p50 and p99 <= hi


@pytest.mark.parametrize("qs, cell", [
    ((0.21, 0.8, 1.94), "0.21/0.80/1.9 s"), ((0.0042, 0.012, 0.038), "4.2/12/38 ms"),
    ((12.0, 31.0, 58.2), "12/31/58 s"), ((None, None, None), "-"),
    ((0.5, 0.9, math.inf), "0.50/0.90/> 60 s")])
def test_latency_cells_read_as_three_numbers_and_a_unit(qs: Any, cell: str) -> None:
    assert progress.format_latency(qs) == cell


# -- durations, due times, rates ---------------------------------------------------------------


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (0.2, "< 1 s"), (45, "45 s"), (59.4, "59 s"), (59.6, "1 min"), (720, "12 min"),
    (3599, "1.0 h"), (3.2 * 3600, "3.2 h"), (23.9 * 3600, "23.9 h"), (2.1 * 86400, "2.1 d"),
    (-90, "-2 min"), (math.inf, "forever")])
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert words.format_duration(seconds) == text


def test_due_times_are_relative_with_the_local_clock_or_date_never_epoch_ms() -> None:
    assert words.format_due(None, NOW) == "-"
    assert words.format_due(NOW, NOW) == "now" == words.format_due(NOW + 400, NOW)
    assert words.format_due(NOW - 3 * MIN, NOW) == "3 min ago"
    assert words.format_due(NOW - 5 * DAY, NOW) == "5.0 d ago"
    assert re.fullmatch(r"in 3\.0 h \(\d\d:\d\d\)", words.format_due(NOW + 3 * HOUR, NOW))
    assert re.fullmatch(r"in 12 min \(\d\d:\d\d\)", words.format_due(NOW + 12 * MIN, NOW))
    assert re.fullmatch(r"in 2\.0 d \([A-Z][a-z]{2} \d\d( \d{4})?\)",
                        words.format_due(NOW + 2 * DAY, NOW))
    assert re.fullmatch(r"in 400\.0 d \([A-Z][a-z]{2} \d\d \d{4}\)",
                        words.format_due(NOW + 400 * DAY, NOW))
    for due in (NOW - HOUR, NOW + HOUR, NOW + 30 * DAY):
        assert str(due) not in words.format_due(due, NOW)
        assert not re.search(r"\d{7,}", words.format_due(due, NOW))


def test_rates_and_drain_times() -> None:
    assert words.rate(150, 100, 10.0) == 5.0
    assert words.rate(100, 100, 0.0) is None
    assert [words.format_rate(r) for r in (None, 0, 0.42, 12.3, 25_000)] == [
        "-", "0", "0.4", "12", "25.0k"]
    assert words.eta_seconds(0, 0.0) == 0.0
    assert words.eta_seconds(100, 4.0) == 25.0
    assert words.eta_seconds(100, 0.0) == math.inf
    assert words.eta_seconds(100, None) is None
    assert words.format_eta(0, 3.0) == "-"
    assert words.format_eta(100, None) == "-"
    assert words.format_eta(100, 0.0) == "not at this rate"  # not "stalled": states.py says
    assert words.format_eta(720, 1.0) == "12 min"


def test_elapsed_names_pool_time_only_when_the_clock_is_scaled() -> None:
    assert words.format_elapsed(720, 720, 1.0) == "up 12 min"
    assert words.format_elapsed(60, 60 * 500, 500.0) == "up 1 min (pool time 8.3 h, x500)"


# -- next due per lane -------------------------------------------------------------------------


def _brute_next_due(eng: Any, now: int) -> dict[int, int | None]:
    rows, cols = ck.snapshot(eng)
    out: dict[int, int | None] = {ln["lane"]: None for ln in eng.stats(now_ms=now)["lanes"]}
    for r, due in zip(rows.tolist(), cols["due_ms"].tolist(), strict=True):
        if due > now:
            lane = eng.describe(r)["lane"]
            if out.get(lane) is None or due < out[lane]:  # type: ignore[operator]
                out[lane] = due
    return out


def _fill(eng: Any, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    eng.add_many(NOW + rng.integers(-HOUR, 3 * DAY, n), rng.choice([60, 3600, 7200, 90000], n),
                 rng.integers(0, 2, n))


def test_the_row_export_gives_the_lane_each_row_sits_in(make_engine: Any) -> None:
    eng = make_engine(LanePolicy(cold_after=1))
    _fill(eng, 400, 1)
    for c in eng.claim(50, now_ms=NOW + 4 * DAY):  # failures and a rush: cold and urgent rows
        eng.fail(c.row, c.token, now_ms=NOW + 4 * DAY)
    eng.prioritize(60, "rush", now_ms=NOW)
    rows, cols = ck.snapshot(eng)
    assert cols["lane"].tolist() == [eng.describe(r)["lane"] for r in rows.tolist()]
    assert {0, eng.policy.cold_lane} <= set(cols["lane"].tolist())


def test_next_due_is_the_earliest_row_not_yet_due_in_each_lane(make_engine: Any) -> None:
    eng = make_engine()
    _fill(eng, 2000, 2)
    got = progress.next_due(eng, NOW)
    assert got == _brute_next_due(eng, NOW)
    assert all(due is None or due > NOW for due in got.values())
    assert progress.next_due(eng, NOW + 10 * DAY) == dict.fromkeys(got)  # nothing left ahead


def test_next_due_stays_exact_when_rows_sit_in_lanes_an_older_policy_chose(
        make_engine: Any) -> None:
    eng = make_engine(LanePolicy(lanes_enabled=False))
    _fill(eng, 500, 3)
    eng.set_policy(LanePolicy())  # the rows stay in lane 0 until rewritten
    got = progress.next_due(eng, NOW)
    assert got == _brute_next_due(eng, NOW)
    assert got[0] is not None
