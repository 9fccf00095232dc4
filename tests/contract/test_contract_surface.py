"""The contract's surface is the same on every backend (engine/api.py, docs/design.md §1): the
signatures both backends share, the defaults that live in one place, the capabilities each
declares, and the checkpoint calls both take alike."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from lanes_testlib import DAY, MINUTE, NOW, dispose, is_redis, unique_name

from engine import Engine, EngineValueError, LanePolicy, LeaseLost, api, checkpoint
from engine.api import QueueEngine

pytestmark = pytest.mark.contract

SHARED = [name for name, value in vars(QueueEngine).items()
          if not name.startswith("_") and callable(value)]


def test_every_call_of_the_contract_has_the_contracts_signature(backend: str, eng: Any) -> None:
    assert {"add", "claim", "complete_and_claim", "release_many", "export_rows", "save"} <= set(
        SHARED)
    for name in SHARED:
        # ``self`` aside: the C base class's methods take it positional-only
        want = list(inspect.signature(getattr(QueueEngine, name)).parameters.values())[1:]
        got = list(inspect.signature(getattr(type(eng), name)).parameters.values())[1:]
        assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in want], name


def test_the_claim_defaults_are_the_contracts(backend: str, eng: Any) -> None:
    defaults = {p.name: p.default for p in inspect.signature(type(eng).claim).parameters.values()}
    assert (defaults["budget"], defaults["lease_ms"], defaults["window"]) == (
        api.DEFAULT_BUDGET, api.DEFAULT_LEASE_MS, api.DEFAULT_WINDOW)
    eng.add_many([NOW - MINUTE] * 40, 3600)
    assert len(eng.claim(now_ms=NOW)) == api.DEFAULT_BUDGET
    with pytest.raises(EngineValueError):
        eng.claim(budget=api.MAX_BUDGET + 1, now_ms=NOW)
    with pytest.raises(EngineValueError):
        eng.claim(window=api.MAX_WINDOW + 1, now_ms=NOW)


def test_release_takes_now_ms_and_checks_it_on_every_backend(eng: Any) -> None:
    row = eng.add(NOW - MINUTE, 3600)
    c = eng.claim(budget=1, now_ms=NOW)
    before = eng.describe(row, now_ms=NOW)
    for bad in (-1, float("nan"), 2**42):
        with pytest.raises(EngineValueError):
            eng.release(row, int(c.tokens[0]), now_ms=bad)
        with pytest.raises(EngineValueError):
            eng.release_many(c.rows, c.tokens, now_ms=bad)
        assert eng.describe(row, now_ms=NOW) == before
    eng.release(row, int(c.tokens[0]), now_ms=NOW)
    assert eng.describe(row, now_ms=NOW)["leased"] is False
    with pytest.raises(LeaseLost):
        eng.release(row, int(c.tokens[0]), now_ms=NOW)


def test_capabilities_are_declared_and_compact_is_safe_everywhere(backend: str, eng: Any) -> None:
    assert eng.supports_compact is (backend == "shm")
    assert eng.spans_hosts is (backend != "shm")
    rows = eng.add_many([NOW - DAY, NOW - MINUTE, NOW + DAY], 3600)
    eng.compact()
    eng.compact(full=True)
    assert [eng.due_ms(int(r)) for r in rows] == [NOW - DAY, NOW - MINUTE, NOW + DAY]
    assert eng.verify() == []


def test_save_keeps_extra_and_load_takes_capacity_and_policy_by_keyword(
        backend: str, eng: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    eng.add_many([NOW - DAY, NOW - MINUTE], [600, 7200], ["submitted", "discovered"])
    path = tmp_path / "q.npz"
    assert eng.save(path, extra={"why": "a test"}) == 2
    ck = checkpoint.read(path)
    assert ck.extra == {"why": "a test"} and ck.policy == eng.policy
    policy = LanePolicy(urgent_max_share=0.1)
    name = unique_name()
    if is_redis(eng):
        url = request.getfixturevalue("redis_server").url
        with pytest.raises(TypeError):
            type(eng).load(path, url, name, 100)  # capacity is keyword-only
        shards = {"shards": eng.catalog.shards} if backend == "redis-sharded" else {}
        back = type(eng).load(path, url, name, capacity=100, policy=policy, **shards)
    else:
        with pytest.raises(TypeError):
            Engine.load(path, name, 100)  # capacity is keyword-only
        back = Engine.load(path, name, capacity=100, policy=policy)
    try:
        assert back.policy == policy and back.stats()["capacity"] == 100
        assert [back.due_ms(r) for r in range(2)] == [NOW - DAY, NOW - MINUTE]
        assert back.verify() == []
    finally:
        dispose(back, name)


def test_engine_open_gives_a_queue_by_name_on_either_backend(
        backend: str, eng: Any, request: pytest.FixtureRequest) -> None:
    """``engine.open(name, url=None)``: the factory, the one place that names a backend."""
    import engine

    url = None if backend == "shm" else request.getfixturevalue("redis_server").url
    other = engine.open(eng.name, url)
    try:
        assert type(other) is type(eng)
        row = eng.add(NOW, 60)
        assert other.due_ms(row) == NOW
    finally:
        other.close()
    with pytest.raises(EngineValueError):
        engine.open(unique_name(), shards=2)  # shards are a Redis queue's
    assert "open" not in engine.__all__  # a star import keeps the builtin
