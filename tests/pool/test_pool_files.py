"""The pool's files beside its engine segment: the URL table and the board."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from lanes_testlib import shm_path, unique_name

from engine import EngineError, EngineValueError
from engine import checkpoint as ck
from engine.pool.board import Board
from engine.shm.urls import UrlTable


def test_url_table_round_trip_find_and_refusals() -> None:
    name = unique_name()
    urls = [f"https://é.example/{i}?x={i * 7}" for i in range(1000)]
    table = UrlTable.create(name, urls)
    try:
        other = UrlTable.attach(name)
        assert other.urls() == urls and other[999] == urls[999] and len(other) == 1000
        assert other.find(urls[123]) == 123 and other.find(urls[0]) == 0
        with pytest.raises(EngineValueError):
            other.find("https://é.example/1")  # a prefix of others, not a URL of the table
        with pytest.raises(EngineValueError):
            other[1000]
        other.close()
        with pytest.raises(EngineError):
            UrlTable.create(name, urls)  # never replaced
    finally:
        table.close()
        UrlTable.unlink(name)
    with pytest.raises(EngineValueError):
        UrlTable.encode(["ok", ""])


def test_url_table_grows_by_further_files_that_readers_find_when_asked() -> None:
    name = unique_name()
    table = UrlTable.create(name, ["https://a.example/0", "https://a.example/1"])
    reader = UrlTable.attach(name)  # attached before the table grows, like a running worker
    try:
        UrlTable.append(name, 2, ["https://a.example/2", "https://a.example/3"])
        UrlTable.append(name, 5, ["https://a.example/5"])  # a gap: row 4 is not published
        assert reader[3] == "https://a.example/3" and len(reader) == 4  # found on the miss
        with pytest.raises(EngineValueError, match="row 5 has no URL"):
            reader[5]
        assert reader.find("https://a.example/2") == 2
        assert UrlTable.remove_part(name, 5)
        with pytest.raises(EngineError):
            UrlTable.append(name, 2, ["https://a.example/x"])  # never replaced
        assert UrlTable.attach(name).urls() == [f"https://a.example/{i}" for i in range(4)]
    finally:
        reader.close()
        table.close()
        assert UrlTable.unlink(name)
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(name)]



def test_board_refuses_foreign_files() -> None:
    name = unique_name()
    with open(shm_path(name) + ".pool", "wb") as f:
        f.write(os.urandom(4096))
    try:
        with pytest.raises(EngineError, match="not a render-lanes pool board"):
            Board.attach(name)
    finally:
        Board.unlink(name)


def test_damaged_boards_and_checkpoints_get_clear_errors(tmp_path: Path) -> None:
    name = unique_name()
    with open(shm_path(name) + ".pool", "wb") as f:
        f.write(b"x" * 130)
    try:
        with pytest.raises(EngineError, match="not a render-lanes pool board"):
            Board.attach(name)
    finally:
        Board.unlink(name)
    npy = tmp_path / "a.npy"
    np.save(npy, np.arange(3))
    with pytest.raises(EngineValueError, match="not a checkpoint"):
        ck.read(npy)
    bad = tmp_path / "b.npz"
    np.savez(bad, meta=np.frombuffer(b"[1, 2]", np.uint8))
    with pytest.raises(EngineValueError, match="not a version"):
        ck.read(bad)


def test_a_board_of_another_layout_version_is_refused() -> None:
    from engine.errors import LayoutMismatch
    from engine.pool.board import H_VERSION, HEADER, VERSION, Clock

    name = unique_name()
    board = Board.create(name, 2, Clock.wall(), os.getpid(), 0)
    try:
        assert VERSION == 4
        board._header[H_VERSION] = 3  # a board written before the fine latency buckets
        with pytest.raises(LayoutMismatch, match="layout v3; this engine reads v4"):
            Board.attach(name)
        board._header[H_VERSION] = VERSION
        Board.attach(name).close()
        # Per lane and outcome 114 latency buckets: 1 + 14 coarse buckets x 8 steps + 1 over.
        assert os.path.getsize(Board.path(name)) == (HEADER + 2 * (7 + 16 + 64 + 64
                                                                  + 64 * 2 * 114 + 128 + 2)) * 8
    finally:
        board.close()
        Board.unlink(name)


def test_record_render_counts_latency_per_lane_and_outcome() -> None:
    from engine.pool.board import (
        FAILED,
        LATENCY_BOUNDS,
        LATENCY_BUCKETS,
        OK,
        Clock,
        coarse,
        record_render,
    )

    name = unique_name()
    board = Board.create(name, 2, Clock.wall(), os.getpid(), 0)
    try:
        record_render(board.slot(0), 3, 0.2, 1.5, True)      # (0.1, 0.25]: bucket 7
        record_render(board.slot(1), 3, 0.2, 1.0, True)
        record_render(board.slot(1), 3, 0.001, 1.0, False)   # on a bound: bucket 0
        record_render(board.slot(0), 5, 100.0, 1.0, False)   # past 60 s: the overflow bucket
        t = board.totals()
        assert t["renders"] == 2 and t["failures"] == 2
        assert t["duration_buckets"][7] == 2 and t["lane_renders"][3] == 2
        h = t["lane_hist"]  # the fine per-lane buckets, 8 to each coarse one past the first
        assert h.shape == (64, 2, LATENCY_BUCKETS) and int(h.sum()) == 4
        fine = int(np.searchsorted(LATENCY_BOUNDS, 0.2))
        assert LATENCY_BOUNDS[fine - 1] < 0.2 <= LATENCY_BOUNDS[fine] and fine in range(49, 57)
        assert h[3, OK, fine] == 2 and h[3, FAILED, 0] == 1 and h[5, FAILED, -1] == 1
        c = coarse(h)
        assert c[3, OK, 7] == 2 and c[3, FAILED, 0] == 1 and c[5, FAILED, 15] == 1
        assert t["lane_duration_s"][3, OK] == pytest.approx(0.4)
        assert t["lane_duration_s"][5, FAILED] == pytest.approx(100.0)
        assert t["lane_age_sum"][3] == pytest.approx(2.5)
    finally:
        board.close()
        Board.unlink(name)
