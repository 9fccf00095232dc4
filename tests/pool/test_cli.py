"""The ``lanes`` command line over a real pool: pool/--resume, stats, serve-metrics, prioritize,
demo and cleanup, each run as a subprocess."""

from __future__ import annotations

import signal
from pathlib import Path

from lanes_testlib import shm_path, unique_name
from pool_testlib import cli, files_of, make_pool, rendered, running, wait_for, write_csv

from engine import LanePolicy
from engine import checkpoint as ck

HOURLY = LanePolicy().lane_name(LanePolicy().lane_for("submitted", 3600))
HOURLY_LABEL = "submitted · 42–60 min"
"""How the tables name HOURLY: its provenance and the range of intervals its band holds."""
"""The lane of the 1 h pages the pools here render, under the default policy."""

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
        assert stats["rows"] == 50 and {ln["name"] for ln in stats["lanes"]} >= {HOURLY}
        pool_js = stats["pool"]
        assert pool_js["renders"] == 50 and pool_js["supervisor_running"] is True
        assert pool_js["elapsed_s"] > 0 and pool_js["renders_per_s"] > 0
        assert pool_js["time_scale"] == 1.0 and pool_js["pool_elapsed_s"] > 0
        for lane in stats["lanes"]:
            assert lane["next_due_ms"] is None or lane["next_due_ms"] > pool_js["now_ms"] - 1000
            assert {"backlog", "in_flight", "renders_per_s", "drain_s", "next_due_ms",
                    "next_due_in_s", "renders", "failures", "label"} <= set(lane)
            assert set(lane["latency"]) == {"ok", "failed"}
            assert lane["latency"]["failed"]["count"] == 0
        assert sum(ln["latency"]["ok"]["count"] for ln in stats["lanes"]) == 50
        assert all(isinstance(ln["latency"]["ok"]["p95_s"], float) for ln in stats["lanes"]
                   if ln["renders"])
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
        per_lane = families["lanes_pool_lane_render_duration_seconds"]
        counts = {(s.labels["lane"], s.labels["outcome"]): s.value for s in per_lane.samples
                  if s.name.endswith("_count")}
        assert sum(v for (_, o), v in counts.items() if o == "success") == 50
        assert sum(v for (_, o), v in counts.items() if o == "failure") == 0
        assert (HOURLY, "failure") in counts
        inf = [s.value for s in per_lane.samples if s.name.endswith("_bucket")
               and s.labels["le"] == "+Inf" and s.labels["outcome"] == "success"]
        assert sum(inf) == 50
        for metric in ("lanes_lane_due", "lanes_lane_queued", "lanes_lane_leased",
                       "lanes_lane_spilled", "lanes_lane_stale_skipped",
                       "lanes_lane_lease_refused", "lanes_pool_failures"):
            assert metric in families, metric
        # Series keep the stable id; the words are one info series per lane beside them.
        info = {s.labels["lane"]: s.labels for s in families["lanes_lane_info"].samples}
        assert info[HOURLY]["ttl"] == "42–60 min"
        assert info[HOURLY]["label"] == "submitted · 42–60 min"
        assert info["urgent"]["ttl"] == "" and info["cold"]["label"] == "cold"
    finally:
        pool.shutdown()


def test_stats_shows_progress_per_lane_and_ends_quietly_on_a_closed_pipe(log: Path) -> None:
    import re
    import subprocess
    import sys

    name = unique_name()
    pool = make_pool(name, 40, "pool_renders:record", workers=1)
    try:
        pool.start()
        wait_for(lambda: pool.board.totals()["renders"] >= 40)
        p = cli("stats", name)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and err == "", err
        lines = out.splitlines()
        assert "supervisor pid" in out and re.search(r"up (< )?\d+ s", out)
        assert re.search(r"40 renders \([\d.]+/s over the run\)", out)
        header = next(ln for ln in lines if ln.startswith("lane "))
        for col in ("queued", "backlog", "in flight", "renders/s", "drains in", "next due",
                    "ok p50/95/99", "failed p50/95/99"):
            assert col in header, col
        row = next(ln for ln in lines if ln.startswith(HOURLY_LABEL))
        assert re.search(r"in 1\.0 h \(\d\d:\d\d\)", row) and re.search(r" ms| s\b", row)
        assert "/b" not in out  # no band number in a table
        assert not re.search(r"\d{10,}", out.replace(name, ""))  # no raw epoch ms anywhere
        # ``lanes stats NAME | head -1``: the reader leaves early; no traceback, no noise.
        sh = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m engine stats"
                             f" {name} | head -1"], capture_output=True, text=True, timeout=60)
        assert sh.stdout == lines[0] + "\n" and sh.stderr == ""
        assert sh.returncode in (0, 141)
        closed = cli("stats", name)  # a pipe closed before a byte is written: EPIPE for sure
        assert closed.stdout is not None
        closed.stdout.close()
        assert closed.wait(timeout=60) == 141
        assert closed.stderr is not None and closed.stderr.read() == ""
    finally:
        pool.shutdown()


def test_stats_of_a_bare_engine_shows_the_engine_columns(tmp_path: Path) -> None:
    import json
    import time

    from engine import Engine

    name = unique_name()
    now = int(time.time() * 1000)
    with Engine.create(name, 16) as eng:
        try:
            eng.add_many([now - 60_000, now + 2 * 3_600_000], 3600, "submitted")
            p = cli("stats", name)
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert "(no pool)" in out and "stale skipped" in out and "next due" in out
            assert "in 2.0 h (" in out and str(now + 2 * 3_600_000) not in out
            assert HOURLY_LABEL in out and "/b" not in out
            js = cli("stats", name, "--json")
            out, err = js.communicate(timeout=60)
            lane = next(ln for ln in json.loads(out)["lanes"] if ln["name"] == HOURLY)
            assert lane["next_due_ms"] == now + 2 * 3_600_000 and lane["queued"] == 2
            assert lane["label"] == HOURLY_LABEL  # --json: the number, the id and the words
        finally:
            eng.unlink()


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
    assert HOURLY_LABEL in out and HOURLY not in out
    # the loop, in real renders: served, missed and discovered, recached
    assert "Googlebot asks for /p/0: 200, served" in out and "Widget 0" in out
    assert "never a 404; discovered..." in out and "rendered and served as a snapshot" in out
    assert "Googlebot gets the new price" in out and "the loop stopped" not in out


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


def _run(*args: str) -> tuple[int, str, str]:
    p = cli(*args)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def test_cli_messages_say_what_to_do(tmp_path: Path) -> None:
    from engine import Engine

    name = unique_name()
    code, _, err = _run("pool", name, "--resume", "--command", "true {url}")
    assert code == 2 and "--resume needs --checkpoint FILE" in err and "--corpus" not in err
    empty = tmp_path / "empty.csv"
    empty.write_text("url,interval_s\n")
    code, _, err = _run("pool", name, "--corpus", str(empty), "--command", "true {url}")
    assert code == 2 and f"the corpus is empty: {empty}" in err
    code, _, err = _run("pool", name, "--corpus", str(write_csv(tmp_path, 3)),
                        "--command", "curl -w '%{http_code}' {url}")
    assert code == 2 and "{{http_code}}" in err and "Traceback" not in err
    with Engine.create(name, 10):  # what a crashed pool leaves behind
        code, _, err = _run("pool", name, "--corpus", str(write_csv(tmp_path, 3)),
                            "--command", "true {url}")
        assert code == 2 and "--resume --checkpoint" in err and f"lanes cleanup {name}" in err
    assert files_of(name) == []
    code, out, _ = _run("pool", "--help")
    assert code == 0 and "(default: 16)" in out and "(default: 30.0)" in out


def test_lanes_add_refuses_without_a_pool(tmp_path: Path) -> None:
    code, _, err = _run("add", unique_name(), "--corpus", str(write_csv(tmp_path, 3)))
    assert code == 2 and "lanes add:" in err and "Traceback" not in err


def test_lanes_pool_fit_policy_runs_the_policy_fitted_to_the_corpus(log: Path,
                                                                    tmp_path: Path) -> None:
    import numpy as np

    from engine import Engine, LanePolicy

    name = unique_name()
    intervals = [1800, 5 * 3600, 7 * 3600, 86400, 3 * 86400, 7 * 86400]
    csv = tmp_path / "shop.csv"
    csv.write_text("url,interval_s,provenance\n" + "".join(
        f"https://shop.example/{k}/{i},{iv},{'discovered' if k == 5 else 'submitted'}\n"
        for k, iv in enumerate(intervals) for i in range(20)))
    p = cli("pool", name, "--corpus", str(csv), "--render", "pool_renders:slow", "--workers",
            "1", "--fit-policy", "--plain")
    try:
        wait_for(lambda: len(rendered(log)) >= 2)
        with Engine.attach(name) as eng:
            want = LanePolicy.fitted(np.repeat(intervals, 20),
                                     ["submitted"] * 100 + ["discovered"] * 20)
            assert eng.policy == want and eng.policy.lane_count == 64
            assert eng.policy.weights["submitted/b0"] == 4.0  # the 30 min pages
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert files_of(name) == []


def test_lanes_pool_fit_policy_refuses_what_it_cannot_fit(tmp_path: Path) -> None:
    name = unique_name()
    code, _, err = _run("pool", name, "--corpus", str(write_csv(tmp_path, 3)), "--fit-policy",
                        "--no-lanes", "--command", "true {url}")
    assert code == 2 and "--fit-policy fits the lanes' weights" in err
    code, _, err = _run("pool", name, "--resume", "--checkpoint", str(tmp_path / "ck.npz"),
                        "--fit-policy", "--command", "true {url}")
    assert code == 2 and "--fit-policy needs --corpus" in err
    assert files_of(name) == []
