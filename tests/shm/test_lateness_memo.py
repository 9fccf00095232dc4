"""The lateness pass weighs a lane it does not open by the head this thread's last pass left it
(csrc/claim.c, ``HeadMemo``), and only while nothing was written ahead of that head: a pass
opens the lanes that may win, not every lane in use, and still grants exactly what the
reference pass grants (the differential and stateful suites hold that over random histories;
these tests hold the two cases a memo must not hide: a write ahead of a remembered head, and a
row put back ahead of it)."""

from __future__ import annotations

import numpy as np
import pytest
from lanes_testlib import HOUR, NOW, fresh_engine

from engine import LanePolicy, _core

LANES = 16
INTERVALS = [int(3600 * 2 ** (k / 2)) for k in range(LANES)]  # one per FINE_BANDS lane
EQUAL = LanePolicy(weights={})  # the default's bands and floors, every lane weighing 1
HELD = 2 * 24 * HOUR


def _equally_late(eng, per_lane: int) -> dict[int, list[int]]:
    """``per_lane`` rows in each of 16 submitted lanes, their heads equally late (3 intervals)
    and each next row 1/32 less late, past a quantum of the pass's weighing (a 64th at most;
    heads in one quantum go to the lower lane): grants go round the lanes."""
    rows = {}
    for iv in INTERVALS:
        late = 3 * (31 / 32) ** np.arange(per_lane)
        rows[iv] = eng.add_many(NOW - (late * iv * 1000).astype(np.int64), iv).tolist()
    eng.compact()
    return rows


def test_a_pass_opens_the_lanes_that_may_win_not_every_lane_in_use():
    """16 lanes as late as each other, claimed one row at a time with nothing written between
    passes: a pass reads the index of the lane its last grant came from and of the one that wins
    now, the others weighed by their remembered heads: 4.0 reads a pass. Without the memo every
    pass opened all 16 lanes: 14.2 reads a pass."""
    with fresh_engine(EQUAL, capacity=LANES * 200) as eng:
        _equally_late(eng, 200)
        eng.claim(budget=1, now_ms=NOW, lease_ms=HELD)  # opens every lane, remembers its head
        before = _core.lib.rl_index_reads()
        lanes = [eng.claim(budget=1, now_ms=NOW, lease_ms=HELD).lanes[0] for _ in range(64)]
        per_pass = (_core.lib.rl_index_reads() - before) / 64
        assert len(set(lanes)) == LANES  # round the lanes: each pass decides between all 16
        assert per_pass <= 6, per_pass
        assert eng.verify() == []


@pytest.mark.parametrize("how", ["added", "released"])
def test_a_row_written_ahead_of_a_remembered_head_is_granted_first(how):
    """A lane that did not win keeps its head remembered; a row then written ahead of that head
    (added, or released back to its place) must win the next pass, as the reference pass says:
    the lane's ring minimum below the remembered key voids the memo."""
    with fresh_engine(EQUAL, capacity=LANES * 200) as eng:
        rows = _equally_late(eng, 100)
        first = eng.claim(budget=4, now_ms=NOW, lease_ms=HELD)
        for _ in range(8):
            eng.claim(budget=4, now_ms=NOW, lease_ms=HELD)
        last = eng.claim(budget=1, now_ms=NOW, lease_ms=HELD)
        iv = next(iv for iv in INTERVALS if last.rows[0] not in rows[iv] and
                  int(first.rows[0]) not in rows[iv])  # a lane remembered, not the last winner
        if how == "added":
            want = int(eng.add_many(np.array([NOW - 10 * iv * 1000]), iv)[0])
        else:  # the pass's first grant: the latest row of all, behind its lane's head now
            assert first.lanes[0] != last.lanes[0]  # its lane did not win last: it has a memo
            want = int(first.rows[0])
            eng.release_many(first.rows[:1], first.tokens[:1], now_ms=NOW)
        got = eng.claim(budget=1, now_ms=NOW, lease_ms=HELD)
        assert got.rows.tolist() == [want]
        assert eng.verify() == []
