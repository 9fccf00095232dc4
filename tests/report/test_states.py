"""Lane states (engine/report/states.py): "waiting" for a lane whose turn has not come, with
when its head should be served; "stalled" only when due rows got nothing for a whole window
while the pool had a worker to spare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lanes_testlib import unique_name

from engine import Engine, LanePolicy, checkpoint
from engine.report import progress
from engine.report.states import STALL_WINDOW_S, ahead_of_heads, lane_state, stalled
from engine.report.view import lane_cells, lane_figures

NOW = 1_800_000_000_000
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Look:
    t: float
    renders: Any
    backlog: Any
    idle: bool


def _looks(n: int, every_s: float, renders: list[int], backlog: list[int], idle: bool = True
           ) -> list[Look]:
    return [Look(i * every_s, np.array(renders), np.array(backlog), idle) for i in range(n)]


def test_due_rows_unserved_for_a_whole_window_with_an_idle_worker_are_stalled() -> None:
    looks = _looks(31, 2.0, [5, 5], [0, 434])  # 60 s, lane 1 due throughout, never served
    assert stalled(looks) == {1}


def test_a_lane_is_not_stalled_before_a_whole_window_was_watched() -> None:
    assert stalled(_looks(29, 2.0, [5, 5], [0, 434])) == set()  # 56 s
    assert stalled(_looks(1, 2.0, [5, 5], [0, 434])) == set()


def test_a_busy_pool_makes_an_unserved_lane_wait_not_stall() -> None:
    looks = _looks(31, 2.0, [5, 5], [0, 434])
    looks[10] = Look(looks[10].t, looks[10].renders, looks[10].backlog, idle=False)
    assert stalled(looks) == set()


def test_a_render_or_an_empty_moment_in_the_window_clears_a_lane() -> None:
    looks = _looks(31, 2.0, [5, 5], [434, 434])
    looks[-1] = Look(looks[-1].t, np.array([6, 5]), looks[-1].backlog, True)  # lane 0 served
    looks[7] = Look(looks[7].t, looks[7].renders, np.array([434, 0]), True)  # lane 1 drained
    assert stalled(looks) == set()
    # Only the last window counts: a stall that ended long ago is forgotten.
    older = _looks(60, 2.0, [5, 5], [0, 434])
    assert stalled(older) == {1}
    assert stalled(older, window_s=STALL_WINDOW_S * 3) == set()  # not watched that long


@pytest.mark.parametrize(("backlog", "per_s", "is_stalled", "state"), [
    (0, None, False, "idle"), (0, 0.0, True, "idle"), (10, 2.5, False, "draining"),
    (10, 0.0, False, "waiting"), (10, None, False, "waiting"), (10, 0.0, True, "stalled")])
def test_a_lane_state_reads_its_figures(backlog: int, per_s: float | None, is_stalled: bool,
                                        state: str) -> None:
    assert lane_state(backlog, per_s, is_stalled) == state


def _cols(due_ms: list[int], interval_s: list[int], lane: list[int]) -> dict[str, np.ndarray]:
    return {"due_ms": np.array(due_ms, np.int64), "interval_s": np.array(interval_s, np.int64),
            "lane": np.array(lane, np.int64)}


def test_the_rows_ahead_of_a_lane_s_head_follow_the_remainder() -> None:
    # Lane 1: hourly pages 1 h late (lateness 1.0); lane 2: daily pages 2 h late (1/12).
    cols = _cols([NOW - HOUR_MS] * 3 + [NOW - 2 * HOUR_MS] * 2 + [NOW + HOUR_MS],
                 [3600] * 3 + [86400] * 3, [1, 1, 1, 2, 2, 2])
    assert ahead_of_heads(cols, NOW, "lateness") == {1: 0, 2: 3}
    assert ahead_of_heads(cols, NOW, "edf") == {1: 2, 2: 0}
    assert ahead_of_heads(cols, NOW, "lane-order") == {1: 0, 2: 3}
    assert ahead_of_heads(_cols([NOW + 1], [60], [1]), NOW, "lateness") == {}


def test_a_lane_waiting_its_turn_under_lateness_says_when_its_head_is_due_a_render() -> None:
    """The issue's case: a lane with rows due, 0 renders/s, while other lanes are later: shown
    as waiting with an estimate, not as stalled; on a real engine's rows."""
    policy = LanePolicy(ttl_bands=(3600, 86400), remainder="lateness")
    with Engine.create(unique_name(), 1024, policy=policy) as eng:
        eng.add_many([NOW - HOUR_MS] * 40, 3600, "submitted")  # hourly, 1 interval late
        eng.add_many([NOW - 2 * HOUR_MS] * 20, 86400, "submitted")  # daily, 1/12 late
        look = progress.look_ahead(eng, NOW)
        stats = eng.stats(now_ms=NOW)
        hourly, daily = policy.lane_for("submitted", 3600), policy.lane_for("submitted", 86400)
        assert look.ahead == {hourly: 0, daily: 40}
        totals = _totals()
        per_s = {hourly: 4.0, daily: 0.0}
        figures = {f["lane"]: f for f in lane_figures(stats, totals, look, per_s, NOW, policy)}
        assert figures[daily]["state"] == "waiting" and not figures[daily]["stalled"]
        assert figures[daily]["head_in_s"] == pytest.approx(10.0)  # 40 rows at 4 renders/s
        assert lane_cells(figures[daily], NOW, None)[5] == "waiting, head in ~10 s"
        assert figures[hourly]["state"] == "draining"
        watched = lane_figures(stats, totals, look, per_s, NOW, policy, stalled={daily})
        assert lane_cells(next(f for f in watched if f["lane"] == daily), NOW, None)[5] == (
            "stalled")
        _, cols = checkpoint.snapshot(eng)
        assert len(cols["due_ms"]) == 60


def _totals() -> dict[str, Any]:
    from engine.pool.board import LANES, LATENCY_BUCKETS

    return {"lane_hist": np.zeros((LANES, 2, LATENCY_BUCKETS), np.int64),
            "lane_renders": np.zeros(LANES, np.int64), "lane_age_sum": np.zeros(LANES),
            "lane_duration_s": np.zeros((LANES, 2))}


@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.sampled_from([-500, -20, 0]),
                                                                     st.integers(-10_000, 10_000)),
                          st.integers(1, 5_000)), min_size=1, max_size=60),
       st.sampled_from(["lateness", "edf", "lane-order"]))
def test_the_rows_ahead_match_a_row_by_row_count(rows: list[tuple[int, int, int]],
                                                 remainder: str) -> None:
    lane, offset, interval = (list(x) for x in zip(*rows, strict=True))
    cols = _cols([NOW + o for o in offset], interval, lane)
    weights = [1.0, 4.0, 1.5, 1.0, 2.0]
    got = ahead_of_heads(cols, NOW, remainder, weights)
    due = [i for i in range(len(rows)) if offset[i] <= 0]

    def key(i: int) -> float:
        late = float(-offset[i])
        if remainder == "lateness":
            return late / interval[i] * (weights[lane[i]] if lane[i] < len(weights) else 1.0)
        return late if remainder == "edf" else -float(lane[i])

    expected = {}
    for ln in {lane[i] for i in due}:
        mine = [i for i in due if lane[i] == ln]
        first = min(offset[i] for i in mine)  # its earliest due; a tie: the largest key
        head = max(key(i) for i in mine if offset[i] == first)
        expected[ln] = sum(1 for i in due if lane[i] != ln and key(i) > head)
    assert got == expected
