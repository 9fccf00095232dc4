"""``LanePolicy.fitted``: the lateness remainder over fine bands with lane weights fitted to a
corpus's intervals (docs/design.md, "The fitted policy").

What it derives (the weights ``LanePolicy()`` derives in the engine at every pass), what it
refuses, and, in the simulator, the default's targets on every named corpus: nobody starved, the
shortest-interval class on time, the worst class within 1.05x the bound at 100 % and 1.15x at 75
and 50 %. The CI form runs each corpus at a tenth of its rows
and one seed; ``bench/bench_policy.py`` runs them at a quarter over three seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from lanes_testlib import fresh_engine

from engine import EngineValueError, LanePolicy
from engine.policy import FINE_BANDS, FIRST_BAND_WEIGHT, ONE, SPREAD_EXPONENT, spread_weight_fp
from engine.serve.api import policy_dict
from engine.sim import (
    CORPORA,
    bound,
    build_corpus,
    corpus_config,
    policy_spec,
    run_many,
    worst_class,
)

H = 3600


def test_fitted_weights_follow_the_spread_of_each_lane_and_the_shortest_interval():
    iv = np.array([1800, 1800, 6 * H, 6 * H, 17 * H, 22 * H, 3 * 24 * H, 1800])
    prov = ["submitted"] * 7 + ["discovered"]
    p = LanePolicy.fitted(iv, prov)
    assert p.ttl_bands == FINE_BANDS and p.lane_count == 64 and p.remainder == "lateness"
    name = {lane: p.lane_name(lane) for lane in range(p.lane_count)}
    # the shortest interval (30 min) is held by a submitted and a discovered lane: both x 4
    assert p.weights[name[p.lane_for("submitted", 1800)]] == FIRST_BAND_WEIGHT
    assert p.weights[name[p.lane_for("discovered", 1800)]] == FIRST_BAND_WEIGHT
    # 17 h and 22 h share a lane (FINE_BANDS has no boundary between them): it weighs its spread
    lane = p.lane_for("submitted", 17 * H)
    assert lane == p.lane_for("submitted", 22 * H)
    assert p.weights[name[lane]] == spread_weight_fp(17 * H, 22 * H) / ONE
    assert abs(p.weights[name[lane]] - (22 / 17) ** SPREAD_EXPONENT) < 1e-4
    # a lane of one interval weighs 1, so it is not named
    assert name[p.lane_for("submitted", 6 * H)] not in p.weights
    assert set(p.weights) == {name[p.lane_for("submitted", 1800)],
                              name[p.lane_for("discovered", 1800)], name[lane]}


def test_fitted_takes_other_bands_and_fields_and_round_trips():
    iv = np.array([H, 2 * H, 5 * H, 24 * H, 2 * 24 * H, 14 * 24 * H])
    p = LanePolicy.fitted(iv, "submitted", ttl_bands=(H, 6 * H, 24 * H), cold_after=5)
    assert p.ttl_bands == (H, 6 * H, 24 * H) and p.cold_after == 5
    assert p.weights == {"submitted/b0": FIRST_BAND_WEIGHT,
                         "submitted/b1": spread_weight_fp(2 * H, 5 * H) / ONE,
                         "submitted/b3": spread_weight_fp(2 * 24 * H, 14 * 24 * H) / ONE}
    assert LanePolicy.from_dict(p.to_dict()) == p


@pytest.mark.parametrize("interval_s, provenance, why", [
    (np.array([], np.int64), "submitted", "non-empty"),
    (np.array([1.5, 2.0]), "submitted", "whole seconds"),
    (np.array([0, 60]), "submitted", r"\[1, "),
    (np.array([60, 2**33]), "submitted", r"\[1, "),
    (np.array([[60, 60]]), "submitted", "1-D"),
    ("soon", "submitted", "whole seconds"),
    (np.array([60, 60]), "sitemap", "provenance"),
    (np.array([60, 60]), ["submitted"], "provenance"),
    (np.array([60, 60]), np.array([0, 2]), "provenance"),
])
def test_fitted_refuses_bad_input_with_a_clear_error(interval_s, provenance, why):
    with pytest.raises(EngineValueError, match=why):
        LanePolicy.fitted(interval_s, provenance)


def test_fitted_refuses_weights_or_another_remainder():
    with pytest.raises(EngineValueError, match="derives its weights"):
        LanePolicy.fitted(np.array([60]), weights={"cold": 2.0})
    with pytest.raises(EngineValueError, match="derives its weights"):
        LanePolicy.fitted(np.array([60]), remainder="edf")


def test_the_default_derives_in_the_engine_the_weights_fitted_to_its_rows():
    """``LanePolicy()`` (``weights="intervals"``) weighs each lane at every pass as
    ``LanePolicy.fitted`` weighs it for the rows the engine holds: the same numbers, from the
    bounds the engine keeps instead of the corpus."""
    config = corpus_config("docs", scale=0.02)
    corpus = build_corpus(config)
    fitted = LanePolicy.fitted(corpus.interval_s, corpus.provenance)
    with fresh_engine(LanePolicy(), capacity=len(corpus.interval_s)) as eng:
        eng.add_many(np.zeros(len(corpus.interval_s), np.int64), corpus.interval_s,
                     corpus.provenance)
        derived = policy_dict(eng.policy, eng.stats()["lanes"])["weights"]
    assert {k: v for k, v in derived.items() if v != 1.0} == {
        k: round(v, 4) for k, v in fitted.weights.items()}
    assert max(derived.values()) >= FIRST_BAND_WEIGHT  # the landing pages' lane


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_the_default_meets_the_targets_on_every_named_corpus(name):
    # one operator rush row per rush: ten rows every two hours would be most of the capacity
    # of a corpus this small, and the urgent cap would leave that capacity idle
    config = corpus_config(name, scale=0.1, rush_rows=1)
    short = min(config.classes, key=lambda c: c.interval_h[0]).name
    for r in run_many(config, [policy_spec("default", config)], (1.0, 0.75, 0.5), jobs=2):
        assert [n for n, c in r.classes.items() if c.starved] == [], (name, r.capacity)
        assert (r.classes[short].mean_age_over_ttl or 9.0) <= 1.10, (name, r.capacity)
        limit = 1.05 if r.capacity == 1.0 else 1.15
        assert worst_class(r) <= limit * bound(config, r.capacity), (
            name, r.capacity, worst_class(r) / bound(config, r.capacity))
