"""The ``lanes`` command line over a real pool: pool/--resume, stats, serve-metrics, prioritize,
demo and cleanup, each run as a subprocess."""

from __future__ import annotations

import signal
from pathlib import Path

from lanes_testlib import shm_path, unique_name
from pool_testlib import cli, files_of, make_pool, rendered, running, wait_for, write_csv

from engine import checkpoint as ck


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
