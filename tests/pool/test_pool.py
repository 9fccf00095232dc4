"""The forked render pool end to end: real workers, real signals, real checkpoints."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from lanes_testlib import unique_name
from pool_testlib import corpus, files_of, make_pool, rendered, running, until_all

from engine import Engine, EngineError, EngineValueError, LanePolicy
from engine import checkpoint as ck
from engine.pool import Pool, PoolOptions, clear_stale
from engine.pool.render import RenderSpec
from engine.shm.urls import UrlTable


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_row_of_a_corpus_renders_once_under_each_start_method(log: Path,
                                                                    method: str) -> None:
    name = unique_name()
    pool = make_pool(name, 40, "pool_renders:record", workers=2, start_method=method,
                     grace_s=5.0)
    summary = pool.run(seconds=60, until=until_all(log, 40))
    seen = Counter(u for _, u in rendered(log))
    assert set(seen) == {f"https://shop.example/p/{i}" for i in range(40)}
    assert max(seen.values()) == 1  # due again only after an hour
    assert summary["renders"] == 40 and summary["failures"] == 0
    assert summary["problems"] == [] and summary["killed_at_shutdown"] == 0
    assert all(lane["leased"] == 0 for lane in summary["lanes"])
    assert len({pid for pid, _ in rendered(log)} - {os.getpid()}) >= 1
    assert files_of(name) == []
    assert running({pid for pid, _ in rendered(log)}) == set()


def test_a_worker_killed_mid_render_has_its_row_rendered_by_another(log: Path) -> None:
    name = unique_name()
    urls = corpus(12)["urls"]
    slow = urls[5]
    urls[5] += "/slow"  # hangs on its first render
    pool = make_pool(name, 12, "pool_renders:slow_first", urls, workers=2, grace_s=5.0)
    marker = Path(str(log) + ".slow")
    killed: list[int] = []

    def tick(p: Pool) -> None:
        if marker.exists() and not killed and marker.read_text():
            killed.append(int(marker.read_text()))
            os.kill(killed[0], signal.SIGKILL)

    summary = pool.run(seconds=60, on_tick=tick, until=lambda: bool(killed) and until_all(
        log, 12)() and pool.board.totals()["restarts"] >= 1)
    renders = rendered(log)
    assert killed, "the slow render never started"
    assert [pid for pid, u in renders if u == slow + "/slow"] and all(
        pid != killed[0] for pid, u in renders if u == slow + "/slow")
    assert len({u for _, u in renders}) == 12
    assert summary["restarts"] >= 1 and summary["problems"] == []
    assert files_of(name) == []


def test_long_renders_renew_their_leases_and_are_not_rendered_twice(log: Path) -> None:
    name = unique_name()
    pool = make_pool(name, 6, "pool_renders:slow", workers=2, lease_s=0.02, batch=3)
    summary = pool.run(seconds=30, until=until_all(log, 6))
    seen = Counter(u for _, u in rendered(log))
    assert len(seen) == 6 and max(seen.values()) == 1
    assert summary["renewed"] > 0 and summary["lease_lost"] == 0
    assert summary["renders"] == 6


def test_failing_renders_back_off_and_drift_to_the_cold_lane(log: Path) -> None:
    name = unique_name()
    # Lease and back-off run on a clock 10^5 times real speed, so rows fail again and again.
    c = corpus(4)
    pool = Pool.create(name, c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable="pool_renders:always_fails"),
                       PoolOptions(workers=1, time_scale=1e5))
    snap: list[Any] = []

    def enough() -> bool:
        _, cols = ck.snapshot(pool.engine)
        snap[:] = [cols]
        return bool((cols["failures"] >= 3).all())

    summary = pool.run(seconds=30, until=enough)
    assert (snap[0]["failures"] >= 3).all()
    assert summary["failures"] >= 12 and summary["renders"] == 0
    cold = [ln for ln in summary["lanes"] if ln["name"] == "cold"]
    assert cold and cold[0]["queued"] == 4


def test_command_renders_pass_the_url_as_one_argument(tmp_path: Path) -> None:
    out = tmp_path / "cmd.log"
    name = unique_name()
    c = corpus(5)
    c["urls"][2] = "https://shop.example/p/2?q=a;touch%20x&b=$(id)"
    cmd = f"/bin/sh -c 'printf \"%s\\n\" \"$0\" >> {out}' {{url}}"
    pool = Pool.create(name, c["urls"], c["due_ms"], 3600, "submitted",
                       RenderSpec(command=cmd, timeout_s=10), PoolOptions(workers=2))
    pool.run(seconds=30, until=lambda: out.exists() and len(out.read_text().splitlines()) >= 5)
    assert sorted(out.read_text().splitlines()) == sorted(c["urls"])
    assert not (tmp_path / "x").exists()


def test_command_failures_and_timeouts_count_as_failures(tmp_path: Path) -> None:
    name = unique_name()
    c = corpus(3)
    pool = Pool.create(name, c["urls"], c["due_ms"], 3600, "submitted",
                       RenderSpec(command="sleep 5 {url}", timeout_s=0.05),
                       PoolOptions(workers=1, grace_s=5))
    summary = pool.run(seconds=30, until=lambda: pool.board.totals()["failures"] >= 3)
    assert summary["failures"] >= 3 and summary["renders"] == 0


def test_sigterm_stops_claiming_releases_checkpoints_and_leaves_nothing(
        log: Path, tmp_path: Path) -> None:
    name = unique_name()
    path = tmp_path / "ck.npz"
    pool = make_pool(name, 200, "pool_renders:slow", workers=2, batch=8, checkpoint=str(path),
                     grace_s=10.0)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    summary = pool.run(seconds=60)
    assert summary["stop_signal"] == "SIGTERM"
    assert summary["killed_at_shutdown"] == 0
    assert all(lane["leased"] == 0 for lane in summary["lanes"])
    assert summary["renders"] + summary["released"] >= 1 and summary["problems"] == []
    saved = ck.read(path)
    assert len(saved) == 200 and sorted(saved.urls or []) == sorted(corpus(200)["urls"])
    assert files_of(name) == []
    assert running({pid for pid, _ in rendered(log)}) == set()


def test_a_second_signal_cuts_the_grace_period_short(log: Path) -> None:
    name = unique_name()
    pool = make_pool(name, 20, "pool_renders:hang", workers=2, batch=1, grace_s=120.0)
    for at in (1.0, 2.5):  # the second arrives while the pool waits for its hung renders
        threading.Timer(at, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    summary = pool.run(seconds=300)
    assert time.monotonic() - t0 < 60  # far less than the 120 s of grace
    assert summary["stop_signal"] == "SIGTERM" and summary["killed_at_shutdown"] == 2
    assert all(lane["leased"] == 0 for lane in summary["lanes"]) and summary["problems"] == []
    assert files_of(name) == []
    assert running({pid for pid, _ in rendered(log)}) == set()


def test_resume_keeps_every_row_due_time_and_url(log: Path, tmp_path: Path) -> None:
    name, other = unique_name(), unique_name()
    path = tmp_path / "ck.npz"
    pool = make_pool(name, 30, "pool_renders:record", workers=1, checkpoint=str(path))
    pool.engine.prioritize(7, "rush", now_ms=1_700_000_000_000)
    before_rows, before = ck.snapshot(pool.engine)
    urls = pool.urls.urls()
    pool.checkpoint()
    resumed = Pool.resume(other, str(path), RenderSpec(callable="pool_renders:record"),
                          PoolOptions(workers=1))
    try:
        rows, after = ck.snapshot(resumed.engine)
        assert len(rows) == 30
        for col in before:
            assert np.array_equal(before[col], after[col]), col
        assert resumed.urls.urls() == [urls[r] for r in before_rows]
        assert resumed.engine.describe(7)["lane"] == 0
        assert resumed.engine.policy == pool.engine.policy
    finally:
        resumed.close()
        pool.close()
    assert files_of(name) == files_of(other) == []


def test_clear_stale_refuses_a_running_pool_and_a_foreign_engine(log: Path) -> None:
    name = unique_name()
    pool = make_pool(name, 3, "pool_renders:record", workers=1)
    try:
        with pytest.raises(EngineError, match="running"):
            clear_stale(name)
    finally:
        pool.close()
    with Engine.create(name, 8):
        with pytest.raises(EngineError, match="not a pool"):
            clear_stale(name)
    assert clear_stale(name) is False


@pytest.mark.parametrize("kw, match", [
    ({"workers": 0}, "workers"), ({"batch": 10**6}, "batch"), ({"lease_s": 0}, "lease_s"),
    ({"start_method": "thread"}, "start_method"), ({"grace_s": -1}, "grace_s"),
    ({"time_scale": float("nan")}, "time_scale")])
def test_bad_pool_options_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(EngineValueError, match=match):
        PoolOptions(**kw)


@pytest.mark.parametrize("kw, match", [
    ({}, "not both"), ({"callable": "x:y", "command": "echo {url}"}, "not both"),
    ({"callable": "nosuchmodule_xyz:f"}, "cannot import"), ({"callable": "os:nope"}, "no 'nope'"),
    ({"callable": "os.path"}, "module:function"), ({"callable": "os:sep"}, "not callable"),
    ({"command": "echo hello"}, "never uses"), ({"command": "echo {nope}"}, "bad render"),
    ({"command": "echo 'unclosed {url}"}, "bad render"),
    ({"command": "echo {url}", "timeout_s": 0}, "timeout"),
    ({"command": "echo {url}", "timeout_s": float("inf")}, "timeout"),
    ({"command": "echo {url}", "timeout_s": 1e300}, "timeout"),
    ({"callable": ":f"}, "not a module name"), ({"callable": ".x:f"}, "not a module name")])
def test_bad_render_specs_are_refused_before_any_worker_starts(kw: dict[str, Any],
                                                               match: str) -> None:
    with pytest.raises(EngineError, match=match):
        RenderSpec(**kw)


def test_pool_create_refuses_bad_corpora_and_leaves_nothing() -> None:
    name = unique_name()
    spec = RenderSpec(callable="pool_renders:record")
    with pytest.raises(EngineValueError, match="empty"):
        Pool.create(name, [], [], 3600, "submitted", spec)
    with pytest.raises(EngineError):
        Pool.create(name, ["https://a.example/1"], [None], 3600, "submitted", spec)
    with pytest.raises(EngineValueError, match="one-line"):
        Pool.create(name, ["https://a.example/\n1"], [1], 3600, "submitted", spec)
    assert files_of(name) == []


def test_a_render_command_does_not_outlive_a_worker_killed_at_shutdown(tmp_path: Path) -> None:
    name = unique_name()
    marker = f"rl-hang-{name}"
    c = corpus(2)
    pool = Pool.create(name, c["urls"], c["due_ms"], 3600, "submitted",
                       RenderSpec(command=f"/bin/sh -c 'sleep 30; : {marker}' {{url}}",
                                  timeout_s=60), PoolOptions(workers=1, grace_s=0.3))
    summary = pool.run(seconds=1.0)
    assert summary["killed_at_shutdown"] == 1
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"])
            if any(marker in part for part in (p.info["cmdline"] or []))]
    assert left == []
    assert files_of(name) == []


def test_pool_setup_refuses_what_would_fail_later() -> None:
    name = unique_name()
    with pytest.raises(EngineValueError, match="checkpoint directory"):
        PoolOptions(checkpoint="/nonexistent-dir-xyz/ck.npz")
    with pytest.raises(EngineValueError, match="due_ms has 1 entries for 2 URLs"):
        Pool.create(name, ["https://a.example/1", "https://a.example/2"], [1], 3600,
                    "submitted", RenderSpec(callable="pool_renders:record"))
    with pytest.raises(EngineValueError, match="UTF-8"):
        UrlTable.encode(["https://a.example/\ud800"])
    assert files_of(name) == []


def test_the_summary_shows_every_lane_with_anything_in_it(capsys: Any) -> None:
    from engine.pool.board import FAILED, LANES, LATENCY_BUCKETS, OK
    from engine.report.view import print_summary

    def lane(i: int, name: str, queued: int = 0, granted: int = 0, renders: int = 0) -> Any:
        return {"lane": i, "name": name, "queued": queued, "due": 0, "granted": granted,
                "renders": renders, "mean_age_over_ttl": 1.0 if renders else None}

    hist = np.zeros((LANES, 2, LATENCY_BUCKETS), np.int64)
    hist[1, OK, 7] = 4
    hist[4, FAILED, 3] = 2
    summary = {"renders": 4, "failures": 2, "released": 0, "lease_lost": 0, "restarts": 0,
               "problems": [], "lane_hist": hist, "lane_duration_s": np.zeros((LANES, 2)),
               "lanes": [lane(0, "urgent"), lane(1, "submitted/b0", 3, 4, 4),
                         lane(2, "submitted/b1", granted=5),  # granted, then resumed: nothing
                         lane(3, "submitted/b2", queued=1), lane(4, "submitted/b3"),
                         lane(5, "discovered/b0")]}
    print_summary(summary, LanePolicy())
    out = capsys.readouterr().out
    rows = [re.split(r"\s{2,}", ln) for ln in out.splitlines()[4:]]  # labels hold one space
    # Each lane by the range of intervals it holds under the policy's bands, never "b3".
    assert {r[0] for r in rows} == {"submitted · ≤ 30 min", "submitted · 30–42 min",
                                    "submitted · 42–60 min", "submitted · 1–1.4 h"}
    assert "/b" not in out
    row = next(r for r in rows if r[0] == "submitted · 1–1.4 h")
    assert row[5] == "2" and "ms" in row[-1]  # its failures and their latency
    assert not re.search(r"\d{10,}", out)
