"""The policy page's bar and preview (engine/serve/api.py): the capacity of a claim pass split
into the urgent cap, the floors and the remainder by recent grants; what an edit changes."""

from __future__ import annotations

import pytest

from engine import LanePolicy
from engine.errors import EngineValueError
from engine.serve.api import policy_changes, policy_dict, policy_from_form, split


def test_the_bar_is_the_cap_the_floors_and_the_remainder_by_recent_grants() -> None:
    p = LanePolicy(ttl_bands=(3600, 86400), urgent_max_share=0.2,
                   min_share={"discovered": 0.1, "cold": 0.02})
    hourly, daily = p.lane_for("submitted", 3600), p.lane_for("submitted", 86400)
    bar = split(p, {0: 50.0, hourly: 30.0, daily: 10.0})  # the urgent lane's are its cap's
    assert [(s["what"], round(s["share"], 4)) for s in bar] == [
        ("urgent cap", 0.2), ("discovered floor", 0.1), ("cold floor", 0.02),
        ("submitted · ≤ 1 h", 0.51), ("submitted · 1–24 h", 0.17)]
    assert sum(s["share"] for s in bar) == pytest.approx(1.0)
    assert bar[-1]["x"] + bar[-1]["width"] == pytest.approx(1000.0)
    idle = split(p, {})
    assert idle[-1]["what"] == "remainder (nothing granted lately)"
    assert idle[-1]["share"] == pytest.approx(0.68)


def test_a_preview_lists_what_differs_and_refuses_what_the_engine_would() -> None:
    now = LanePolicy()
    after = policy_from_form(now, {"urgent_max_share": "0.3", "min_share.discovered": "0.15",
                                   "min_share.cold": "0.005", "remainder": "lateness"})
    changes = policy_changes(policy_dict(now), policy_dict(after))
    assert ("urgent cap", "0.2", "0.3") in changes
    assert ("discovered floor", "0.1", "0.15") in changes
    assert [c[0] for c in changes] == ["urgent cap", "discovered floor", "remainder share"]
    assert policy_changes(policy_dict(now), policy_dict(now)) == []
    with pytest.raises(EngineValueError, match="urgent_max_share"):
        policy_from_form(now, {"urgent_max_share": "1.5"})
