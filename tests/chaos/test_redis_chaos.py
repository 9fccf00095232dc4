"""Chaos across "hosts" on Redis: two or three ``lanes pool --redis`` pools, each in
its own process group as a machine of its own, share one queue on a real redis-server; workers
are SIGKILLed and SIGSTOPped, whole pools killed and replaced, the queue grown with ``lanes
add``, at random; then the lease-log oracle, nothing lost, a drain (tests/lib/redis_chaos_lib.py).

Three runs, each with a seed of its own, printed and in every failure message;
``RL_REDIS_CHAOS_SEED`` repeats the runner's choices (not the timing) in one run,
``RL_REDIS_CHAOS_SECONDS`` sets the chaos's length (default 10 s per run). The long form is
``bench/chaos_long.py --redis``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pool_testlib import files_of, running
from redis_chaos_lib import (
    NEVER,
    RedisChaos,
    RedisChaosConfig,
    RedisChaosResult,
    check_leases,
    final_checks,
    read_log,
)
from redis_server import RedisServer, fresh_queue, module_server

from engine import Engine
from engine.redis.urls import RedisUrls

SECONDS = float(os.environ.get("RL_REDIS_CHAOS_SECONDS", "10"))
RUNS = 1 if os.environ.get("RL_REDIS_CHAOS_SEED") else 3


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from module_server()


@pytest.fixture
def queue(server: RedisServer) -> Iterator[str]:
    yield from fresh_queue(server, "rl-chaos-")


@pytest.mark.parametrize("run", range(RUNS))
def test_pools_on_several_hosts_survive_kills_stops_and_growth(
        server: RedisServer, queue: str, tmp_path: Path, run: int) -> None:
    seed = int(os.environ.get("RL_REDIS_CHAOS_SEED") or int.from_bytes(os.urandom(4), "little"))
    cfg = RedisChaosConfig(seconds=SECONDS, pools=3, seed=seed)
    chaos = RedisChaos(cfg, server.url, queue, str(tmp_path))
    res = chaos.run()
    print()
    print(res.summary())
    why = f"seed {seed} (RL_REDIS_CHAOS_SEED={seed} repeats it): {res.summary()}"
    assert res.problems() == [], why
    assert res.workers_killed >= 1 and res.workers_stopped >= 1 and res.pools_killed >= 1, why
    assert res.adds >= 1 and res.rows == cfg.rows + cfg.adds * cfg.add_rows, why
    assert res.drained == res.rows, why
    assert running(chaos.seen) == set(), why
    assert all(files_of(run.local) == [] for run in chaos.runs), why


# -- the oracle is not blind ---------------------------------------------------------------------


def _line(tag: str, pool: int, pid: int, row: int, token: int, t: int, holder: int | None,
          expiry: int | None, tail: str = "") -> str:
    """A lease-log line; the lease seen is held by pid ``holder`` (None: no lease)."""
    held = "- -" if holder is None else f"{token} {holder}"
    seen = "-" if expiry is None else str(expiry)
    return f"{tag} {pool} {pid} {row} {token} {t} {held} {seen}{tail}\n"


def test_the_oracle_sees_overlaps_early_losses_and_double_renders(tmp_path: Path) -> None:
    """Hand-written logs: row 1 granted to a second worker while the first's lease was live
    (an overlap, and an early loss); row 2's lease gone under its live holder (an early loss,
    as a stale token's accepted complete would cause); row 3 rendered twice under one token;
    legal: row 4 taken after its first worker died (killed at 1_100, before its expiry), row 5
    taken once its stalled holder's lease had expired, the holder rendering on (superseded),
    row 7 renewed by its worker (a new token, the same owner), then taken after its end."""
    t = 1_000
    tok = {k: (t + 10 * k) << 10 for k in range(12)}
    log = tmp_path / "leases.log"
    log.write_text("".join([
        _line("S", 9, 100, 1, tok[0], t, 100, t + 1000),
        _line("S", 8, 200, 1, tok[5], t + 50, 200, t + 1050),       # inside the first: overlap
        _line("E", 9, 100, 1, tok[0], t + 60, 200, t + 1050, " ok"),
        _line("S", 9, 100, 2, tok[1], t, 100, t + 1000),
        _line("E", 9, 100, 2, tok[1], t + 40, None, None, " ok"),   # gone before 2_000
        _line("S", 9, 101, 3, tok[2], t, 101, t + 1000),
        _line("S", 9, 101, 3, tok[2], t + 5, 101, t + 1000),
        _line("S", 9, 102, 4, tok[3], t, 102, t + 1000),            # killed mid-render
        _line("S", 8, 201, 4, tok[11], t + 110, 201, t + 1110),
        _line("S", 9, 103, 5, tok[4], t, 103, t + 1000),            # stalled past its lease
        _line("S", 8, 202, 5, (t + 1001) << 10, t + 1001, 202, t + 2001),
        _line("E", 9, 103, 5, tok[4], t + 1500, 202, t + 2001, " ok"),
        _line("E", 9, 104, 6, tok[6], t, 104, t + 1000, " ok"),     # ends nothing begun
        _line("S", 9, 105, 7, tok[7], t, 105, t + 1000),
        _line("E", 9, 105, 7, tok[7], t + 500, 105, t + 1400, " ok"),  # renewed meanwhile
        _line("S", 8, 203, 7, (t + 510) << 10, t + 510, 203, t + 1510),
    ]))
    errors: list[str] = []
    renders = read_log(str(log), errors)
    assert len(errors) == 2 and "twice" in errors[0] and "no render" in errors[1]
    res = RedisChaosResult()
    check_leases(renders, {102: t + 100}, {}, res)
    assert res.overlaps == 1 and res.examples["overlap"][0]["row"] == 1
    assert res.early_lost == 2 and {r.row for r in res.examples["early_lost"]} == {1, 2}
    assert res.twice == 1
    stalled = next(r for r in renders if r.row == 5 and r.pid == 103)
    assert stalled.superseded and stalled.valid_until_at_least(NEVER) == t + 1000
    renewed = next(r for r in renders if r.row == 7 and r.pid == 105)
    assert not renewed.superseded and renewed.valid_until_at_least(NEVER) == t + 500
    # Without the kill, row 4's second grant would be inside the first lease.
    again = RedisChaosResult()
    check_leases(renders, {}, {}, again)
    assert again.overlaps == 2


def test_the_final_checks_see_a_lost_row_a_lost_url_and_an_unrendered_row(
        server: RedisServer, queue: str) -> None:
    eng = Engine.connect(server.url, queue, create=True)
    try:
        urls = [f"https://shop.example/p/{i}" for i in range(6)]
        RedisUrls(eng).add(urls, [0] * 6, 60)
        eng.claim(2, lease_ms=60_000)  # in flight: the drain takes them all the same
        res = RedisChaosResult()
        final_checks(eng, urls, set(range(6)), res)
        assert res.problems() == ["nothing was rendered"] and res.drained == 6
        eng.drop()
        eng.close()
        eng = Engine.connect(server.url, queue, create=True)
        table = RedisUrls(eng)
        table.drop()
        table.add(urls, [0] * 6, 60)
        eng.remove(4)
        eng.transport.live().hset(f"lanes:{{{queue}}}:url_rows", urls[1], 3)  # a URL mapped astray
        eng.transport.live().zremrangebyrank(f"lanes:{{{queue}}}:url_index", 0, 0)  # one unindexed
        res = RedisChaosResult()
        final_checks(eng, urls, {0, 1, 2, 3, 4}, res)
        assert res.lost == 3 and res.never_rendered == 1  # row 1 (its URL astray), row 4, index
        assert res.drained == 5 and res.stranded == 0 and res.drain_dups == 0
    finally:
        eng.close()
