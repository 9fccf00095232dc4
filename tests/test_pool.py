"""The forked render pool end to end: real workers, real signals, real checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from lanes_testlib import shm_path, unique_name

from engine import Engine, EngineError, EngineValueError, LanePolicy
from engine import checkpoint as ck
from engine.pool import Pool, PoolOptions, clear_stale
from engine.pool.board import Board
from engine.pool.render import RenderSpec
from engine.pool.urls import UrlTable

TESTS = os.path.dirname(__file__)
HOUR_MS = 3_600_000


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "renders.log"
    monkeypatch.setenv("RL_TEST_RENDER_LOG", str(path))
    return path


def rendered(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    return [(int(pid), url) for pid, url in (line.split() for line in log.read_text().splitlines())]


def corpus(n: int, now: int | None = None) -> dict[str, Any]:
    now = int(time.time() * 1000) if now is None else now
    return {"urls": [f"https://shop.example/p/{i}" for i in range(n)],
            "due_ms": now - np.arange(n) * 1000, "interval_s": 3600,
            "provenance": ["submitted", "discovered"] * (n // 2) + ["submitted"] * (n % 2)}


def make_pool(name: str, n: int, render: str, urls: list[str] | None = None,
              **options: Any) -> Pool:
    c = corpus(n)
    env = {k: v for k, v in os.environ.items() if k == "RL_TEST_RENDER_LOG"}
    return Pool.create(name, urls or c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable=render), PoolOptions(env=env, **options))


def running(pids: set[int]) -> set[int]:
    """The pids that still run (a zombie waiting for its parent does not count)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def files_of(name: str) -> list[str]:
    return [p for p in (shm_path(name), shm_path(name) + ".urls", shm_path(name) + ".pool")
            if os.path.exists(p)]


def until_all(log: Path, n: int) -> Any:
    return lambda: len({u for _, u in rendered(log)}) >= n


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


def cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "engine", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def write_csv(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "corpus.csv"
    lines = ["url,interval_s,provenance"] + [f"https://shop.example/p/{i},3600,submitted"
                                             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_lanes_pool_sigterm_and_a_killed_supervisor_resume(log: Path, tmp_path: Path) -> None:
    name = unique_name()
    path = tmp_path / "ck.npz"
    csv = write_csv(tmp_path, 300)
    args = ("pool", name, "--corpus", str(csv), "--render", "pool_renders:slow", "--workers",
            "2", "--checkpoint", str(path), "--checkpoint-every", "0.2", "--plain")
    # A supervisor killed outright: its workers leave by themselves, its files stay.
    p = cli(*args)
    wait_for(lambda: path.exists() and len(rendered(log)) >= 4)
    workers = {pid for pid, _ in rendered(log)}
    p.kill()
    p.communicate()
    wait_for(lambda: not running(workers), timeout=10)
    assert shm_path(name) in files_of(name)
    # --resume clears what the dead supervisor left and continues from its checkpoint.
    before = len(rendered(log))
    p = cli(*args[:2], *args[4:], "--resume")
    wait_for(lambda: len(rendered(log)) >= before + 8)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "invariants: hold" in out
    assert files_of(name) == []
    saved = ck.read(path)
    assert len(saved) == 300 and len(set(saved.urls or [])) == 300
    assert running({pid for pid, _ in rendered(log)}) == set()


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


def test_stats_json_and_prometheus_parse_while_a_pool_runs(log: Path) -> None:
    import json

    from prometheus_client.parser import text_string_to_metric_families

    name = unique_name()
    pool = make_pool(name, 50, "pool_renders:record", workers=1)
    try:
        pool.start()
        wait_for(lambda: pool.board.totals()["renders"] >= 50)
        js = cli("stats", name, "--json")
        out, err = js.communicate(timeout=60)
        assert js.returncode == 0, err
        stats = json.loads(out)
        assert stats["rows"] == 50 and {ln["name"] for ln in stats["lanes"]} >= {"submitted/b0"}
        pr = cli("stats", name, "--prometheus")
        out, err = pr.communicate(timeout=60)
        assert pr.returncode == 0, err
        families = {f.name: f for f in text_string_to_metric_families(out)}
        granted = {s.labels["lane"]: s.value for s in families["lanes_lane_granted"].samples
                   if s.name.endswith("_total")}
        assert sum(granted.values()) >= 50
        assert families["lanes_pool_renders"].samples[0].value == 50
        hist = families["lanes_pool_render_duration_seconds"]
        count = [s.value for s in hist.samples if s.name.endswith("_count")]
        assert count == [50.0]
        for metric in ("lanes_lane_due", "lanes_lane_queued", "lanes_lane_leased",
                       "lanes_lane_spilled", "lanes_lane_stale_skipped",
                       "lanes_lane_lease_refused", "lanes_pool_failures"):
            assert metric in families, metric
    finally:
        pool.shutdown()


def test_serve_metrics_on_loopback_and_prioritize_by_url(log: Path) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    name = unique_name()
    pool = make_pool(name, 5, "pool_renders:record", workers=1)
    try:
        p = cli("serve-metrics", name, "--port", "0", "--seconds", "20")
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "http://127.0.0.1:" in line, line + (p.stderr.read() if p.stderr else "")
        url = line.split()[-1]
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert any(f.name == "lanes_lane_queued" for f in text_string_to_metric_families(body))
        p.kill()
        p.communicate()
        pr = cli("prioritize", name, "--url", "https://shop.example/p/3", "--mode", "rush")
        out, err = pr.communicate(timeout=60)
        assert pr.returncode == 0, err
        assert pool.engine.describe(3)["lane"] == 0
        bad = cli("prioritize", name, "--url", "https://nowhere.example/")
        out, err = bad.communicate(timeout=60)
        assert bad.returncode == 2 and "no row has URL" in err
    finally:
        pool.close()


def test_lanes_demo_runs_and_prints_its_summary() -> None:
    p = cli("demo", "--seconds", "5")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "granted by claim #1 of 61" in out and "behind the whole product backlog" in out
    assert "invariants: hold" in out and "left behind: nothing" in out
    assert "submitted/b0" in out


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


def test_board_refuses_foreign_files() -> None:
    name = unique_name()
    with open(shm_path(name) + ".pool", "wb") as f:
        f.write(os.urandom(4096))
    try:
        with pytest.raises(EngineError, match="not a render-lanes pool board"):
            Board.attach(name)
    finally:
        Board.unlink(name)


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


def test_lanes_cleanup_refuses_a_running_pool_unless_forced(log: Path) -> None:
    name = unique_name()
    pool = make_pool(name, 3, "pool_renders:record", workers=1)
    try:
        p = cli("cleanup", name)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and "is running" in err
        assert shm_path(name) in files_of(name)
    finally:
        pool.close()


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
