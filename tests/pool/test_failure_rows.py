"""What the dashboard and ``lanes failures`` build on: park requests in the failure log, the
failing rows as the engine sees them, and each worker's slot on the board."""

from __future__ import annotations

import os
import time

import pytest
from lanes_testlib import unique_name

from engine import Engine
from engine.errors import EngineValueError
from engine.keys import PARKED_MS
from engine.pool import failures as failures_module
from engine.pool.board import F_CURRENT_ROW, F_PID, F_STARTS, Board, Clock
from engine.pool.failures import FailureEntry, FailureLog, failure_rows


def test_park_requests_are_kept_per_row_until_cancelled() -> None:
    name = unique_name()
    log = FailureLog.create(name)
    try:
        assert log.parking() == set()
        log.request_park([3, 5, 5])
        log.request_park([7])
        assert log.parking() == {3, 5, 7}
        assert log.parking([5, 6]) == {5}
        log.cancel_park([5, 99])
        assert log.parking() == {3, 7}
        log.cancel_park([])
        with pytest.raises(EngineValueError):
            log.request_park(["3"])  # type: ignore[list-item]
        assert log.parking() == {3, 7}  # a refused request changes nothing
    finally:
        log.close()
        FailureLog.unlink(name)


def test_failure_rows_read_the_same_through_describe_and_through_one_export(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time() * 1000)
    eng = Engine.create(unique_name(), capacity=1000)
    try:
        for i in range(300):
            eng.add(now + i * 1000, 3600, "submitted" if i % 2 else "discovered")
        eng.remove(5)
        batch = eng.claim(budget=1, now_ms=now + 10_000)
        eng.fail(batch.rows[0], batch.tokens[0], retry_at_ms=PARKED_MS, now_ms=now + 10_000)
        entries = [FailureEntry(i, f"https://shop.example/{i}", 1, now, now + i, "500",
                                "exit", i % 3 == 0, 500) for i in range(300)]
        many = failure_rows(eng, entries, now)  # 300 rows: one export
        monkeypatch.setattr(failures_module, "DESCRIBE_AT_MOST", 10_000)
        each = failure_rows(eng, entries, now)  # one describe per row
        assert many == each
        by_row = {r["row"]: r for r in many}
        assert by_row[5]["next_retry"] == "removed" and by_row[5]["lane"] is None
        parked = by_row[int(batch.rows[0])]
        assert parked["kind"] == "parked" and parked["next_retry_ms"] == PARKED_MS
        assert by_row[3]["kind"] == "permanent" and by_row[4]["kind"] == "transient"
        lane = eng.describe(4)["lane"]
        assert {r["row"] for r in failure_rows(eng, entries, now, lane=lane)} == {
            r for r in range(300) if eng.describe(r)["lane"] == lane}
        assert len(failure_rows(eng, entries, now, limit=7)) == 7
    finally:
        eng.close()
        eng.unlink()


def test_the_board_tells_each_worker_s_current_row_and_restarts() -> None:
    name = unique_name()
    board = Board.create(name, 2, Clock.wall(), os.getpid(), 0)
    try:
        slot = board.slot(1)
        slot[F_PID], slot[F_STARTS], slot[F_CURRENT_ROW] = 4242, 3, 17 + 1
        del slot  # a view of the mapping: the board cannot close under it
        workers = board.workers()
        assert workers[0] == {"slot": 0, "pid": 0, "row": None, "renders": 0, "failures": 0,
                              "restarts": 0}
        assert workers[1]["pid"] == 4242 and workers[1]["row"] == 17
        assert workers[1]["restarts"] == 2
        assert board.totals()["lane_duration_s"].shape == (64, 2)
    finally:
        board.close()
        Board.unlink(name)
