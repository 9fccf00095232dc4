"""Lanes by names a person reads: the provenance and the TTL range, not the band number.

The engine names a lane by its place in the layout (``submitted/b2``): stable, short, what
``--lane``, the policy's weights and the metrics' ``lane`` label use. An operator needs what the
lane holds, so every table, page and summary shows its label instead: ``submitted · 30–42 min``
(the pages whose refresh interval lies in that band), ``discovered · 1.1–1.6 d``, ``urgent``,
``cold``. The band number stays where a program reads it (``--json``: ``lane`` and ``name``,
with ``label`` beside them).
"""

from __future__ import annotations

from ..policy import LanePolicy
from .words import format_range


def ttl_range(policy: LanePolicy, lane: int) -> str | None:
    """The range of refresh intervals ``lane`` holds under ``policy`` ("30–42 min", "≤ 30
    min", "> 483 d"); None for the urgent and cold lanes, and when one band holds every
    interval (no bands, or lanes disabled)."""
    cls = policy.class_of(lane)
    bands = policy.ttl_bands
    if cls not in ("submitted", "discovered") or not bands or not policy.lanes_enabled:
        return None
    band = lane - 1 if cls == "submitted" else lane - 1 - policy.bands_per_class
    # band_of puts an interval equal to a boundary in the lower band: (lo, hi].
    lo = bands[band - 1] if band > 0 else None
    hi = bands[band] if band < len(bands) else None
    return format_range(lo, hi)


def lane_label(policy: LanePolicy, lane: int) -> str:
    """``submitted · 30–42 min``; ``urgent``, ``cold`` and a lane past the layout by name."""
    if lane >= policy.cold_lane or lane == 0:
        return policy.lane_name(lane)
    span = ttl_range(policy, lane)
    cls = policy.class_of(lane)
    return cls if span is None else f"{cls} · {span}"


def labels(policy: LanePolicy, lane_total: int | None = None) -> dict[str, str]:
    """{engine name: label} of lanes ``0 .. lane_total - 1`` (default: the policy's layout)."""
    total = policy.lane_count if lane_total is None else lane_total
    return {policy.lane_name(i): lane_label(policy, i) for i in range(total)}


def label_of(policy: LanePolicy, name: str) -> str:
    """The label of a lane known by its engine name (a name past the layout: itself)."""
    return labels(policy).get(name, name)
