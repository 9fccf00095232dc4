"""Checkpoints: atomic saves, damaged files refused, restores that would not fit refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from lanes_testlib import unique_name

from engine import Engine, EngineValueError, LanePolicy
from engine import checkpoint as ck
from engine.pool import Pool
from engine.pool.render import RenderSpec


def test_checkpoints_are_atomic_and_damaged_ones_are_refused(tmp_path: Path) -> None:
    name = unique_name()
    path = tmp_path / "ck.npz"
    with Engine.create(name, 64, LanePolicy(ttl_bands=(600,))) as eng:
        eng.add_many(1_800_000_000_000 + np.arange(10), 3600, "discovered", failures=5)
        assert eng.save(path) == 10
        first = path.read_bytes()
        eng.add(1_800_000_000_000, 60)
        assert eng.save(path) == 11
    assert not [p for p in os.listdir(tmp_path) if p != "ck.npz"]  # no temp file left
    with Engine.load(path, name) as back:
        assert back.stats()["rows"] == 11 and back.policy.ttl_bands == (600,)
        assert back.describe(0)["failures"] == 5 and back.lane(0) == back.policy.lane_count - 1
    path.write_bytes(first[: len(first) // 2])
    with pytest.raises(EngineValueError, match="checkpoint"):
        ck.read(path)
    with pytest.raises(EngineValueError, match="no checkpoint"):
        ck.read(tmp_path / "missing.npz")
    np.savez(path, meta=np.frombuffer(b'{"format": "x"}', np.uint8))
    with pytest.raises(EngineValueError, match="not a version"):
        ck.read(path)


def test_a_checkpoint_restored_into_too_small_a_capacity_is_refused_by_load_and_resume(tmp_path):
    """Engine.load and Pool.resume restore through one function with one capacity rule: a
    capacity below the rows saved is a clear error and leaves no segment, never silently
    raised."""
    from lanes_testlib import leftover_segments, unique_name

    path = str(tmp_path / "small.npz")
    with Engine.create(unique_name(), capacity=64) as eng:
        for i in range(10):
            eng.add(1_800_000_000_000 + i, 3600)
        eng.save(path, urls=[f"https://example.test/{i}" for i in range(10)])
    before = leftover_segments()
    with pytest.raises(EngineValueError, match="below the 10 rows"):
        Engine.load(path, unique_name(), capacity=5)
    with pytest.raises(EngineValueError, match="below the 10 rows"):
        Pool.resume(unique_name(), path, RenderSpec(command="true {url}"), capacity=5)
    assert leftover_segments() == before
