"""A row word names its interval by a class, a slot of its lane's interval table (csrc/layout.h,
``rl_iv_class``): a lateness pass weighs a head by the interval its word's class names, not by the
intervals array, a cache line of its own (csrc/claim.c, ``head_interval``). These tests hold
what the class must be after every write that stores a key, that a lane of more intervals than
slots is still weighed by each row's own, and that verify() reports a class naming another
interval. The differential suites (tests/contract/test_shares.py, tests/test_stateful.py) hold
the pass against ``reference_pass`` over random intervals, many to a lane."""

from __future__ import annotations

import struct

import numpy as np
from chaos_lib import row_words
from lanes_testlib import HOUR, NOW, attach_raw, fresh_engine, lane_bounds, ten_lanes

from engine.policy import reference_pass

CLS_SHIFT = 62  # RL_WORD_CLS_SHIFT
OFF_ROWS = 40 + 2 * 8  # rl_header's off_rows: the third of its region offsets
EQUAL = ten_lanes(weights={})  # bands 1 h / 6 h / 24 h, every lane weighing 1
# Five intervals of one band, (1 h, 6 h]: more than a lane's three slots.
BAND = [7200, 10800, 14400, 18000, 21600]


def _classes(eng, rows) -> list[int]:
    words = row_words(eng, eng.rows_used())
    return [int(words[int(r)]) >> CLS_SHIFT for r in rows]


def test_the_first_three_intervals_of_a_lane_take_its_slots_the_rest_none():
    with fresh_engine(EQUAL, capacity=64) as eng:
        rows = [eng.add(NOW - HOUR, iv) for iv in BAND + BAND]
        assert len({eng.lane(r) for r in rows}) == 1
        assert _classes(eng, rows) == [1, 2, 3, 0, 0] * 2  # in the order they were first written
        other = eng.add(NOW - HOUR, 21600, provenance="discovered")  # another lane's table
        assert eng.lane(other) != eng.lane(rows[0])
        assert _classes(eng, [other]) == [1]
        assert eng.verify() == []


def test_every_write_that_moves_a_row_gives_it_its_new_lanes_class():
    """complete, fail, prioritize, reclassify and restamp store a key, perhaps of another lane:
    the class is that lane's, never the old lane's carried over."""
    with fresh_engine(EQUAL, capacity=64) as eng:
        eng.add(NOW - HOUR, 10800, provenance="discovered")  # slot 1 of the discovered lane
        row = eng.add(NOW - 2 * HOUR, 7200, provenance="discovered")
        assert _classes(eng, [row]) == [2]
        eng.reclassify(row, "submitted")  # the submitted lane: its first slot
        assert _classes(eng, [row]) == [1]
        eng.prioritize(row, "rush", now_ms=NOW)  # urgent
        assert eng.lane(row) == 0 and _classes(eng, [row]) == [1]
        granted = {}
        for _ in range(4):  # the urgent cap may hold it back a pass
            c = eng.claim(budget=2, now_ms=NOW + 1000, lease_ms=HOUR)
            granted.update(zip(c.rows.tolist(), c.tokens.tolist(), strict=True))
        assert _classes(eng, [row]) == [1]  # FLIGHT keeps it
        token = granted[row]
        eng.fail(row, token, now_ms=NOW, permanent=True)  # the cold lane
        assert eng.lane(row) == 9 and _classes(eng, [row]) == [1]
        assert eng.verify() == []
    with fresh_engine(ten_lanes(lanes_enabled=False), capacity=64) as eng:
        rows = [eng.add(NOW - HOUR, iv) for iv in (600, 7200, 86400, 172800)]
        assert _classes(eng, rows) == [1, 2, 3, 0]  # all in lane 0
        assert eng.restamp()["done"]
        assert len({eng.lane(r) for r in rows}) == 4
        assert _classes(eng, rows) == [1, 1, 1, 1]  # each the first of its new lane
        assert eng.verify() == []


def test_a_lane_of_more_intervals_than_slots_weighs_each_head_by_its_own():
    """The lateness pass grants what the reference grants when heads of classless rows (the
    fourth and fifth interval of a lane) and of classed rows take turns: rows of the five
    intervals in one lane, against a lane of one interval, heads crossing each other."""
    with fresh_engine(EQUAL, capacity=512) as eng:
        rng = np.random.default_rng(7)
        queued = {}
        for _ in range(120):
            iv = int(rng.choice(BAND))
            late = float(rng.uniform(0.5, 4.0))
            due = NOW - int(late * iv * 1000)
            queued[eng.add(due, iv)] = (due, iv)
        for k in range(60):
            due = NOW - int((0.5 + k / 17) * 7200 * 1000)
            queued[eng.add(due, 7200, provenance="discovered")] = (due, 7200)
        eng.compact()
        lanes = EQUAL.lane_count
        credits: dict[str, int] = {}
        while queued:
            heads = sorted((eng.lane(r), due, r, iv) for r, (due, iv) in queued.items())
            due_lists = [[d for ln, d, _, _ in heads if ln == lane] for lane in range(lanes)]
            ivs = [[i for ln, _, _, i in heads if ln == lane] for lane in range(lanes)]
            expected, credits = reference_pass(EQUAL, 7, due_lists, credits, now=NOW,
                                               intervals=ivs, bounds=lane_bounds(eng))
            c = eng.claim(budget=7, now_ms=NOW, lease_ms=100 * HOUR)
            assert [c.lanes.tolist().count(ln) for ln in range(lanes)] == expected
            for r in c.rows.tolist():
                del queued[r]
        assert eng.verify() == []


def test_verify_reports_a_class_that_names_another_interval():
    with fresh_engine(EQUAL, capacity=64) as eng:
        eng.add(NOW - HOUR, 10800)
        row = eng.add(NOW - HOUR, 7200)
        assert _classes(eng, [row]) == [2] and eng.verify() == []
        shm = attach_raw(eng.stats()["name"])
        try:
            (rows_at,) = struct.unpack_from("<Q", shm.buf, OFF_ROWS)
            at = rows_at + 16 * row
            (word,) = struct.unpack_from("<Q", shm.buf, at)
            for forged in (1, 3):  # 10800's slot, and a free one
                struct.pack_into("<Q", shm.buf, at, word & ~(3 << CLS_SHIFT) | forged << CLS_SHIFT)
                problems = eng.verify()
                assert len(problems) == 1 and "interval class" in problems[0], problems
            struct.pack_into("<Q", shm.buf, at, word)
        finally:
            shm.close()
        assert eng.verify() == []
