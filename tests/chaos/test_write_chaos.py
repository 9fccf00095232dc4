"""A write killed midway leaves no mark that outlives a repair: every write path (add, add_many,
complete(_many), fail, release(_many), prioritize, remove, set_policy, restamp) SIGKILLed at
random instants, then the oracle of ``write_chaos_lib`` from a fresh process; and ``lanes
check`` telling a dead writer's marks from broken invariants, and repairing them.

``RL_WRITE_CHAOS_KILLS`` sets the kills per kind (default 10: the whole file stays under a minute).
The long form is ``bench/chaos_writes.py``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from chaos_lib import KEY_NONE, ROOT, row_ids_used, row_words
from lanes_testlib import shm_path, unique_name
from write_chaos_lib import WriteChaosConfig, run_write_chaos

from engine import Engine

KILLS = int(os.environ.get("RL_WRITE_CHAOS_KILLS", "10"))


def test_every_write_path_killed_midway_loses_nothing_and_leaves_no_mark(tmp_path: Path) -> None:
    name = unique_name()
    seed = int(os.environ.get("RL_CHAOS_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    cfg = WriteChaosConfig(kills=KILLS, kill_ms=(5, 40), rows=5000, capacity=1 << 19, seed=seed)
    res = run_write_chaos(cfg, str(tmp_path), name)
    print(f"\nseed {seed}\n{res.summary()}")
    assert sum(res.kills.values()) == KILLS * len(cfg.kinds)
    assert res.acked.get("writes", 0) > 0
    assert res.problems() == [], res.summary()
    assert res.rows == res.queued + res.removed
    assert not os.path.exists(shm_path(name)) and not os.path.exists(shm_path(name + "-r"))


def _lanes(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def _add_seconds(name: str) -> float:
    """How long the big add of ``_kill_a_big_add`` takes here, now (into a scratch engine): the
    kills are spread over it, however fast or loaded the machine."""
    with Engine.create(name, 1 << 20, ring_capacity=4096) as scratch:
        t0 = time.perf_counter()
        scratch.add_many(np.arange(400_000) + 1000, 60)
        took = time.perf_counter() - t0
    return took


def _kill_a_big_add(name: str, rng: random.Random, window_s: float) -> bool:
    """An attached process adds a batch larger than the ring (published by a full rebuild, so
    the add spends long between its stores and its publication) and is SIGKILLed midway: at a
    random instant of the ``window_s`` the add takes. True when the add had ended first."""
    code = ("import sys, numpy as np; from engine import Engine\n"
            "e = Engine.attach(sys.argv[1]); e.add_many(np.full(10, 1000), 60)\n"
            "print('ready', flush=True)\n"
            "e.add_many(np.arange(400_000) + 1000, 60)\n"
            "print('done', flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    time.sleep(rng.uniform(0.0, window_s))
    child.send_signal(signal.SIGKILL)
    child.wait()
    done = "done" in child.stdout.read()
    child.stdout.close()
    return done


def test_lanes_check_tells_dead_writers_marks_from_violations_and_repairs_them() -> None:
    """A killed add leaves rows stored and not yet published, or reserved and never written:
    ``lanes check`` names them as a dead writer's (exit 3, not 1), ``--repair`` finishes or
    takes them back and says so (exit 0), after which rows == queued and verify() is empty.
    Each try has an engine of its own (an add that ended first would use up a shared one's
    capacity), and a kill that came after the add ended shortens the window of the next."""
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    seen: set[str] = set()
    window_s = _add_seconds(unique_name())
    for _ in range(30):
        name = unique_name()
        with Engine.create(name, 1 << 20, ring_capacity=4096) as eng:
            if _kill_a_big_add(name, rng, window_s):
                window_s *= 0.7
            walk = eng.verify_walk()
            assert walk.problems == []
            if not walk.marks:
                continue
            seen.update(m.split(":")[0] for m in walk.marks if not m.startswith("..."))
            check = _lanes("check", name)
            assert check.returncode == 3, check.stdout + check.stderr
            assert "dead writer: row" in check.stdout and "lanes check --repair" in check.stdout
            repair = _lanes("check", "--repair", name)
            assert repair.returncode == 0, repair.stdout + repair.stderr
            assert re.match(f"repaired {walk.unpublished + walk.abandoned} mark[(]s[)] of [1-9]"
                            f"[0-9]* dead writer[(]s[)]: {walk.unpublished} unpublished row[(]s[)]"
                            f" indexed, {walk.abandoned} reserved row", repair.stdout), \
                repair.stdout
            assert repair.stdout.rstrip().endswith("ok")
            stats = eng.stats()
            assert stats["rows"] == stats["queued"] and eng.verify() == []
            assert not (row_words(eng, row_ids_used(eng)) == KEY_NONE).any()
            got = eng.claim(budget=10, now_ms=2_000_000_000_000).rows.tolist()
            # the repaired index serves the queued rows: a full batch, each row once
            assert len(got) == min(10, stats["queued"]) and len(set(got)) == len(got)
            np.testing.assert_array_equal(eng.add_many([5], 60), [row_ids_used(eng) - 1])
            break
    assert seen, "no kill landed inside an add: the test proved nothing"


def test_a_killed_lanes_add_leaves_every_url_with_its_row(tmp_path: Path) -> None:
    """``lanes add`` publishes its URL file, then adds the rows: SIGKILLed anywhere, the next
    ``lanes add`` of the same corpus leaves every URL of it with a queued row, and the URL
    table and the engine's row ids agree."""
    from pool_testlib import make_pool, write_csv

    from engine.shm.urls import UrlTable

    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    name = unique_name()
    corpus = write_csv(tmp_path, 25_000)
    lanes_add = [sys.executable, "-m", "engine", "add", name, "--corpus", str(corpus)]
    with make_pool(name, 10, "pool_renders:record") as pool:
        for _ in range(3):
            child = subprocess.Popen(lanes_add, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.3, 1.0))
            child.send_signal(signal.SIGKILL)
            child.wait()
            done = _lanes("add", name, "--corpus", str(corpus))
            assert done.returncode == 0, done.stderr
            eng = pool.engine
            eng.reap()
            table = UrlTable.attach(name)
            try:
                urls = table.urls()
            finally:
                table.close()
            assert len(urls) == row_ids_used(eng)
            queued = {u for r, u in enumerate(urls) if eng.describe(r)["queued"]}
            wanted = {f"https://shop.example/p/{i}" for i in range(25_000)}
            assert wanted <= queued and eng.verify() == []
