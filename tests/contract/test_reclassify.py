"""``reclassify(row, provenance)``, on every backend: the one write that changes a row's
provenance (a page that left every sitemap becomes discovered, and submitted again when it
comes back). The lane is derived again; due time, failures, urgency and a lease in progress
stay; the same provenance again changes nothing; bad input changes nothing."""

from __future__ import annotations

import pytest
from lanes_testlib import HOUR, MINUTE, NOW, snapshot

from engine import LanePolicy
from engine.errors import EngineError, EngineTypeError, EngineValueError

pytestmark = pytest.mark.contract  # each test once per backend (tests/conftest.py)


def test_a_row_moves_to_its_new_provenances_lane_keeping_its_schedule(eng):
    row = eng.add(NOW - 5 * MINUTE, 7200, "submitted")
    before = eng.describe(row, now_ms=NOW)
    eng.reclassify(row, "discovered")
    after = eng.describe(row, now_ms=NOW)
    assert after["provenance"] == "discovered"
    assert eng.lane_name(after["lane"]).startswith("discovered")
    assert {k: after[k] for k in ("due_ms", "interval_s", "failures", "urgent", "queued")} == {
        k: before[k] for k in ("due_ms", "interval_s", "failures", "urgent", "queued")}
    eng.reclassify(row, "discovered")  # again: nothing changes
    assert eng.describe(row, now_ms=NOW) == after
    eng.reclassify(row, 0)  # back in a sitemap: codes work as names do
    assert eng.describe(row, now_ms=NOW) == before
    assert eng.verify() == []


def test_a_claim_grants_the_row_from_its_new_lane(eng):
    row = eng.add(NOW - HOUR, 7200, "submitted")
    eng.reclassify(row, "discovered")
    batch = eng.claim(4, now_ms=NOW)
    assert batch.rows.tolist() == [row]
    assert eng.lane_name(int(batch.lanes[0])).startswith("discovered")


def test_a_leased_row_keeps_its_lease_and_completes_into_its_new_lane(eng):
    row = eng.add(NOW - HOUR, 600, "discovered")
    c = next(iter(eng.claim(1, now_ms=NOW, lease_ms=MINUTE)))
    eng.reclassify(row, "submitted")
    info = eng.describe(row, now_ms=NOW)
    assert info["leased"] and info["provenance"] == "submitted"
    assert len(eng.claim(4, now_ms=NOW + 1000)) == 0  # still held: nobody else gets it
    eng.complete(row, c.token, now_ms=NOW + 2000)
    info = eng.describe(row, now_ms=NOW + 2000)
    assert info["provenance"] == "submitted" and info["due_ms"] == NOW + 2000 + 600_000
    assert eng.lane_name(info["lane"]).startswith("submitted/")
    assert eng.verify() == []


def test_a_released_row_goes_back_in_its_new_lane(eng):
    row = eng.add(NOW - HOUR, 600, "submitted")
    c = next(iter(eng.claim(1, now_ms=NOW, lease_ms=MINUTE)))
    eng.reclassify(row, "discovered")
    eng.release(row, c.token)
    again = eng.claim(1, now_ms=NOW + 1000)
    assert again.rows.tolist() == [row]
    assert eng.lane_name(int(again.lanes[0])).startswith("discovered")
    assert eng.verify() == []


def test_failures_and_urgency_are_kept(eng):
    policy = LanePolicy()
    failing = eng.add(NOW - HOUR, 600, "submitted", failures=policy.cold_after)
    rushed = eng.add(NOW + HOUR, 600, "submitted")
    eng.prioritize(rushed, "rush", now_ms=NOW)
    eng.reclassify(failing, "discovered")
    eng.reclassify(rushed, "discovered")
    f, r = eng.describe(failing, now_ms=NOW), eng.describe(rushed, now_ms=NOW)
    assert eng.lane_name(f["lane"]) == "cold" and f["failures"] == policy.cold_after
    assert f["provenance"] == "discovered"
    assert r["urgent"] and eng.lane_name(r["lane"]) == "urgent"
    assert r["provenance"] == "discovered" and r["due_ms"] == NOW
    eng.prioritize(rushed, "wait", now_ms=NOW)  # the rush over: its own lane is discovered's
    assert eng.lane_name(eng.describe(rushed, now_ms=NOW)["lane"]).startswith("discovered")


def test_bad_input_is_refused_and_changes_nothing(eng):
    rows = [eng.add(NOW, 600, "submitted"), eng.add(NOW, 600, "discovered")]
    eng.remove(rows[1])
    before = snapshot(eng, rows)
    for args, error in [((rows[0], "crawled"), EngineValueError),
                        ((rows[0], 2), EngineValueError),
                        ((rows[0], None), EngineTypeError),
                        ((rows[0], 1.0), EngineTypeError),
                        ((10_000, "discovered"), EngineError),
                        ((-1, "discovered"), EngineError),
                        ((rows[1], "submitted"), EngineValueError)]:
        with pytest.raises(error):
            eng.reclassify(*args)
    assert snapshot(eng, rows) == before
    assert eng.verify() == []
