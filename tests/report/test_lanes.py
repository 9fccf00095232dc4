"""Lanes by names a person reads (engine/report/lanes.py): the provenance and the range of
refresh intervals, in the units people use, never a band number."""

from __future__ import annotations

import pytest

from engine import LanePolicy
from engine.report.lanes import label_of, labels, lane_label, ttl_range
from engine.report.words import format_range

DAY = 86_400


@pytest.mark.parametrize(("lo", "hi", "said"), [
    (1800, 2546, "30–42 min"),
    (2546, 3600, "42–60 min"),
    (3600, 5091, "1–1.4 h"),
    (int(1.1 * DAY), int(1.6 * DAY), "1.1–1.6 d"),
    (None, 1800, "≤ 30 min"),
    (None, 3600, "≤ 1 h"),
    (41_706_855, None, "> 483 d"),
    (3600, 3700, "1–1.03 h"),  # digits enough to keep the ends apart
    (20, 45, "20–45 s"),
    (None, None, "any"),
])
def test_a_range_of_intervals_reads_in_one_unit(lo: int | None, hi: int | None,
                                                 said: str) -> None:
    assert format_range(lo, hi) == said


def test_every_lane_of_the_default_policy_has_a_name_without_a_band_number() -> None:
    p = LanePolicy()
    named = labels(p)
    assert len(named) == p.lane_count and len(set(named.values())) == p.lane_count
    assert named["urgent"] == "urgent" and named["cold"] == "cold"
    assert named["submitted/b1"] == "submitted · 30–42 min"
    assert named["discovered/b30"] == "discovered · > 483 d"
    assert not [v for v in named.values() if "/b" in v]


def test_a_lane_holds_the_intervals_its_label_says() -> None:
    """band_of puts an interval equal to a boundary in the lower band: the label's upper end
    is inclusive, its lower end exclusive."""
    p = LanePolicy(ttl_bands=(3600, 6 * 3600, DAY))
    assert lane_label(p, p.lane_for("submitted", 3600)) == "submitted · ≤ 1 h"
    assert lane_label(p, p.lane_for("submitted", 3601)) == "submitted · 1–6 h"
    assert lane_label(p, p.lane_for("discovered", DAY)) == "discovered · 6–24 h"
    assert lane_label(p, p.lane_for("discovered", DAY + 1)) == "discovered · > 1 d"
    assert lane_label(p, p.lane_for("submitted", 60, failures=p.cold_after)) == "cold"


def test_one_band_or_no_lanes_names_the_provenance_alone() -> None:
    assert ttl_range(LanePolicy(ttl_bands=()), 1) is None
    assert lane_label(LanePolicy(ttl_bands=()), 1) == "submitted"
    assert lane_label(LanePolicy(lanes_enabled=False), 0) == "urgent"


def test_a_name_past_the_layout_stays_itself() -> None:
    p = LanePolicy(ttl_bands=(3600,))
    assert label_of(p, "submitted/b0") == "submitted · ≤ 1 h"
    assert label_of(p, "lane40") == "lane40"
