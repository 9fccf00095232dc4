"""The benchmark suite runs end to end in its smoke form and reports every figure it promises.

Not a timed test: no figure is compared with a target here. It checks that `bench/run_all.py
--smoke` runs each benchmark as a subprocess, that each writes its JSON with the figures the README
asks for (median, min, max, runs), that a server peer is either measured or skipped with a
reason — never silently absent — and that nothing is left behind (segments, servers, temp dirs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["bench_engine", "bench_inflight", "bench_constraints", "bench_python_peers",
           "bench_servers", "bench_redis", "bench_sim", "bench_store"]

# Figure ids each script must report, measured (or, for server peers, skipped with a reason).
EXPECTED = {
    "bench_engine": [f"engine.claim_us.b{b}.n10000" for b in (1, 16, 64)]
    + ["engine.claim_bare_us.b16.n10000", "engine.add_many_rows_s.n20000",
       "engine.merge_ms.n20000", "engine.rebuild_ms.n20000", "engine.bytes_per_row.n20000"]
    + [f"engine.cycle_rows_s.p{p}.{k}" for p in (1, 2, 8) for k in ("per_proc", "total")]
    + [f"engine.worker_peak_rss_mib.p{p}" for p in (1, 2, 8)],
    # smoke sizes: 20k rows, 0/16/256 rows in flight, 16 held per process; a stalled claim is
    # reported without a median, so a stall fails here as a missing measurement
    "bench_inflight": [f"inflight.claim_us.k{k}" for k in (0, 16, 256)]
    + [f"inflight.rows_per_claim.k{k}" for k in (0, 16, 256)]
    + [f"inflight.claim_ratio.k{k}" for k in (16, 256)]
    + ["inflight.pool.claim_us.held16", "inflight.pool.claim_ratio.held16"]
    + [f"inflight.pool.cycle_rows_s.p{p}.per_proc.held{h}" for p in (1, 2) for h in (0, 16)]
    + [f"inflight.pool.cycle_ratio.p{p}.held16" for p in (1, 2)]
    + [f"inflight.release.{k}" for k in ("after_release_us", "after_complete_us", "ratio",
                                          "after_release_many_us", "many_ratio",
                                          "after_complete_calls_us", "calls_ratio",
                                          "first_after_many_released_us",
                                          "many_released_us", "many_released_ratio")]
    + ["inflight.ring.first_claim_us", "inflight.ring.next_claims_us"]
    + [f"inflight.expiry.{k}_us" for k in ("base", "held", "lapsed", "next", "steady", "catchup")]
    + [f"inflight.expiry.{k}_ratio" for k in ("held", "lapsed", "next", "steady", "catchup")]
    + ["inflight.expiry.slowest_after_lapse_us", "inflight.expiry.slowest_held_us",
       "inflight.expiry.slowest_base_us"],
    "bench_constraints": [f"constraints.floor.{v}.{k}" for v in
                          ("product", "floor_only", "unfloored", "hint_only", "tombs_only")
                          for k in ("first_us", "last_us", "ratio", "grants")]
    + ["constraints.lanes.interleaved_us", "constraints.lanes.separate_us",
       "constraints.lanes.separate_over_interleaved", "constraints.sided.one_sided_us",
       "constraints.sided.two_sided_us", "constraints.sided.two_over_one"]
    + [f"constraints.production.{r}_us" for r in ("lane_order", "lateness", "edf")]
    + [f"constraints.production.{r}_over_lane_order" for r in ("lateness", "edf")],
    "bench_python_peers": [f"pypeers.{s}.p{p}" for s in ("engine", "numpy", "heapq")
                           for p in (1, 2)]
    + [f"pypeers.ratio_{s}.p{p}" for s in ("numpy", "heapq") for p in (1, 2)],
    "bench_servers": [f"servers.engine.p{p}" for p in (1, 2)],
    # the Redis backend starts its own redis-server (make test installs it): never skipped
    "bench_redis": [f"redis.shm.engine.p{p}" for p in (1, 2)]
    + [f"redis.{t}.{s}.p{p}" for t in ("unix", "tcp")
       for s in ("engine", "lua", "zpopmin", "ratio_zpopmin", "ratio_lua") for p in (1, 2)]
    + [f"redis.{t}.{k}" for t in ("unix", "tcp")
       for k in ("ping_p50_us", "claim_p50_us", "claim_server_us", "claim_vs_ping")]
    + ["redis.bytes_per_row.n20000"],
    "bench_sim": [f"sim.{p}.c{c}.home" for p in ("today", "default", "floors")
                  for c in (100, 75, 50)]
    + [f"sim.bound.c{c}" for c in (100, 75, 50)],
    # moto's S3 server and a redis-server it starts (make test installs both): never skipped;
    # the upload cost needs a browser render, measured at full size only
    "bench_store": [f"store.{k}" for k in (
        "hot_rps.local", "hot_rps.shared", "hot_rps.shared_over_local", "cold_p99_ms.shared",
        "cold_p99_ms.local", "redis_bytes_per_url")]
    + [f"store.age_over_ttl.h{h}.{k}" for h in (2, 3) for k in ("local", "shared")],
}
SERVER_PEERS = [f"servers.{s}.p{p}" for s in ("redis_lua", "redis_zpopmin", "postgres")
                for p in (1, 2)] + [f"servers.ratio_{s}.p{p}" for s in
                                    ("redis_lua", "redis_zpopmin", "postgres") for p in (1, 2)]


def _leftovers() -> tuple[set[str], set[int], set[str]]:
    shm = {p.name for p in Path("/dev/shm").glob("rl-bench-*")}
    servers = {p.pid for p in psutil.process_iter(["name", "cmdline"])
               if "rl-bench-" in " ".join(p.info["cmdline"] or [])}
    tmp = {p.name for p in Path("/tmp").glob("rl-bench-*")}
    return shm, servers, tmp


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    before = _leftovers()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), "--smoke",
                           "--results", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = _leftovers()
    for what, b, a in zip(("segments", "server processes", "temp dirs"), before, after,
                            strict=True):
        assert a <= b, f"the benchmark left {what} behind: {sorted(a - b)}"
    return out


def _figures(doc: dict) -> dict[str, dict]:
    return {f["id"]: f for f in doc["figures"]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_reports_its_figures(smoke: Path, script: str) -> None:
    doc = json.loads((smoke / f"{script}.json").read_text())
    assert doc["smoke"] is True
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["cpu"]
    figs = _figures(doc)
    missing = [fid for fid in EXPECTED[script] if fid not in figs]
    assert not missing, f"{script} did not report {missing}"
    for fid in EXPECTED[script]:
        f = figs[fid]
        assert "skipped" not in f, f"{fid} skipped: {f['skipped']}"
        assert f["runs"] >= 1 and f["min"] <= f["median"] <= f["max"], f
        assert f["median"] == f["median"] and f["median"] >= 0, f  # not NaN


def test_server_peers_are_measured_or_skipped_with_a_reason(smoke: Path) -> None:
    figs = _figures(json.loads((smoke / "bench_servers.json").read_text()))
    for fid in SERVER_PEERS:
        assert fid in figs, f"{fid} is silently absent"
        f = figs[fid]
        if "skipped" in f:
            assert len(f["skipped"].strip()) > 10, f"{fid} skipped without a reason"
        else:
            assert f["runs"] >= 1 and f["median"] > 0, f


def test_rows_per_claim_is_a_full_batch_at_smoke_sizes(smoke: Path) -> None:
    """At 20k rows nothing in flight may starve a claim: every claim(16) grants 16 rows."""
    figs = _figures(json.loads((smoke / "bench_inflight.json").read_text()))
    for k in (0, 16, 256):
        f = figs[f"inflight.rows_per_claim.k{k}"]
        assert f["min"] == 16, f


def test_run_all_joins_everything_into_latest_json(smoke: Path) -> None:
    doc = json.loads((smoke / "latest.json").read_text())
    assert doc["failed"] == [] and doc["smoke"] is True
    assert set(doc["scripts"]) == set(SCRIPTS)
    ids = {f["id"] for f in doc["figures"]}
    for script in SCRIPTS:
        assert set(EXPECTED[script]) <= ids
    assert doc["machine"]["memory_gib"] > 0 and doc["date"]


def test_bench_inflight_runs_on_the_production_shape(tmp_path: Path) -> None:
    """``--shape production`` (bench_constraints (f)'s rows and policy, lanes of two intervals,
    so the pass weighs heads by their row words' interval classes) reports every figure the
    ten-lane shape does, with no claim stalled and nothing left behind."""
    before = _leftovers()
    out = tmp_path / "inflight.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_inflight.py"), "--smoke",
                           "--shape", "production", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = _leftovers()
    assert all(a <= b for a, b in zip(after, before, strict=True)), (before, after)
    doc = json.loads(out.read_text())
    assert doc["script"] == "bench_inflight --shape production"
    figs = _figures(doc)
    for fid in EXPECTED["bench_inflight"]:
        assert fid in figs and "median" in figs[fid], fid
    for k in (0, 16, 256):
        assert figs[f"inflight.rows_per_claim.k{k}"]["min"] == 16
