"""Served staleness from a snapshot store: the figures per lane and per route, and where they
are shown (``lanes stats --store``, its JSON and Prometheus forms, the live view)."""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lanes_testlib import TEN_LANES, unique_name
from pool_testlib import make_pool

from engine.corpus.routes import Routes
from engine.pool.grow import store_routes
from engine.report.staleness import NO_ROUTE, staleness
from engine.report.view import LiveView
from engine.shm.engine import Engine, wall_ms
from engine.shm.urls import UrlTable
from engine.store import SnapshotStore

HOUR_MS = 3_600_000
NOW = wall_ms()


def fill(store: SnapshotStore) -> None:
    """Lane 1: ten products 0.1 .. 1.0 intervals old; lane 9: one category, 3 intervals old."""
    for i in range(1, 11):
        store.put(f"https://shop.example/p/{i}", f"<p>{i}</p>", status=200, location=None,
                  interval_s=3600, lane=1, render_ms=10.0, rendered_at_ms=NOW - i * HOUR_MS // 10)
    store.put("https://shop.example/c/shoes", "<p>c</p>", status=200, location=None,
              interval_s=600, lane=9, render_ms=10.0, rendered_at_ms=NOW - 1_800_000)
    p1 = store.get("https://shop.example/p/1")
    c = store.get("https://shop.example/c/shoes")
    assert p1 is not None and c is not None
    store.log_hits([(NOW - 1000, p1.id, 1, 0.25, True, 0), (NOW - 900, p1.id, 1, 0.75, True, 0),
                    (NOW - 800, c.id, 9, 3.0, False, 0),
                    (NOW - 2 * HOUR_MS, p1.id, 1, 9.0, True, 0)])  # before the window


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    global NOW
    NOW = wall_ms()  # the ages checked are from now, not from the module's import
    with SnapshotStore.open(tmp_path / "store") as s:
        fill(s)
        yield s


@pytest.fixture
def routes(tmp_path: Path) -> Routes:
    f = tmp_path / "routes.toml"
    f.write_text('[[route]]\nname = "product"\nmatch = "https://shop.example/p/*"\n'
                 'interval = "1h"\n')
    return Routes.load(f)


def quantiles(row: str) -> list[float]:
    """The snapshot p50 / p95 / max of a printed staleness row (its first cell, a lane's
    label, may hold spaces: the columns are two apart)."""
    cells = row.split("  ", 1)[1].split()
    return [float(cells[1]), float(cells[3]), float(cells[5])]


def by_key(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {g["key"]: g for g in groups}


def test_snapshot_and_served_figures_per_lane(store: SnapshotStore) -> None:
    f = staleness(store, NOW)
    lanes = by_key(f["lanes"])
    snap = lanes["1"]["snapshot"]
    assert snap["count"] == 10 and snap["max"] == pytest.approx(1.0)
    assert snap["p50"] == pytest.approx(0.55) and snap["p95"] == pytest.approx(0.955)
    assert lanes["9"]["snapshot"]["max"] == pytest.approx(3.0)
    served = lanes["1"]["served"]  # the hit two hours ago is past the window
    assert served["count"] == 2 and served["p50"] == pytest.approx(0.5)
    assert served["max"] == pytest.approx(0.75)
    assert lanes["9"]["served"]["count"] == 0 and lanes["9"]["refused"] == 1
    assert f["all"]["snapshot"]["count"] == 11 and f["all"]["refused"] == 1
    assert "routes" not in f


def test_figures_per_route_match_the_urls_now(store: SnapshotStore, routes: Routes) -> None:
    f = staleness(store, NOW, routes, lane_name=lambda i: f"lane-{i}")
    per_route = by_key(f["routes"])
    assert set(per_route) == {"product", NO_ROUTE}
    assert per_route["product"]["snapshot"]["count"] == 10
    assert per_route["product"]["served"]["count"] == 2
    assert per_route[NO_ROUTE]["refused"] == 1
    assert set(by_key(f["lanes"])) == {"lane-1", "lane-9"}


def test_an_empty_store_has_no_figures(tmp_path: Path) -> None:
    with SnapshotStore.open(tmp_path / "empty") as s:
        f = staleness(s, NOW)
    assert f["lanes"] == [] and f["all"]["snapshot"] == {"count": 0, "p50": None, "p95": None,
                                                         "max": None}


def run_stats(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    from engine.cli import main

    before = signal.getsignal(signal.SIGTERM)
    try:
        status = main(["stats", *args])
    finally:
        signal.signal(signal.SIGTERM, before)
    out, err = capsys.readouterr()
    assert status == 0, err
    return out


@pytest.fixture
def engine_name(routes: Routes) -> Iterator[str]:
    name = unique_name()
    eng = Engine.create(name, 64, TEN_LANES)  # lanes 1 and 9 named as the suites name them
    table = UrlTable.create(name, [], eng)  # a pool's routes are kept with its URLs
    store_routes(table, routes)
    try:
        yield name
    finally:
        table.drop()
        eng.unlink()


def test_lanes_stats_with_a_store_shows_staleness_per_lane_and_route(
        store: SnapshotStore, engine_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_stats(capsys, engine_name, "--store", store.directory, "--json")
    f = json.loads(out)["staleness"]
    lanes = by_key(f["lanes"])
    assert set(lanes) == {"submitted/b0", "cold"}  # lane 1 and lane 9, by name
    assert lanes["submitted/b0"]["served"]["max"] == pytest.approx(0.75)
    assert by_key(f["routes"])["product"]["snapshot"]["count"] == 10
    out = run_stats(capsys, engine_name, "--store", store.directory, "--plain")
    assert "served staleness per lane" in out and "served staleness per route" in out
    row = next(line for line in out.splitlines() if line.startswith("product"))
    assert row.split()[1] == "10" and quantiles(row) == pytest.approx([0.55, 0.955, 1.0],
                                                                       abs=0.02)


def test_lanes_stats_prometheus_with_a_store_has_route_figures(
        store: SnapshotStore, engine_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    out = run_stats(capsys, engine_name, "--store", store.directory, "--prometheus")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(out) for s in f.samples}
    assert samples[("lanes_route_snapshots", (("route", "product"),))] == 10
    assert samples[("lanes_served_age_over_interval",
                    (("lane", "submitted/b0"), ("quantile", "0.5")))] == pytest.approx(0.5)
    assert samples[("lanes_refused_stale_hits", (("lane", "cold"),))] == 1
    assert ("lanes_lane_queued", (("lane", "cold"),)) in samples
    assert not any(n.startswith("lanes_variant_") for n, _ in samples)  # no route names one


def test_stats_show_staleness_per_variant_where_a_route_names_two(
        store: SnapshotStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The products rendered as desktop (their plain URLs) and mobile (``URL mobile``, one
    interval old each): a variant column in the JSON, a table and a metric label; the lanes and
    routes count both. Without a route naming variants none of them shows (above)."""
    f = tmp_path / "variants.toml"
    f.write_text('[[route]]\nname = "product"\nmatch = "https://shop.example/p/*"\n'
                 'interval = "1h"\nvariants = ["desktop", "mobile"]\n')
    for i in range(1, 6):
        store.put(f"https://shop.example/p/{i} mobile", f"<p>{i} phone</p>", status=200,
                  location=None, interval_s=3600, lane=1, render_ms=10.0,
                  rendered_at_ms=NOW - HOUR_MS)
    phone = store.get("https://shop.example/p/1 mobile")
    assert phone is not None
    store.log_hits([(NOW - 500, phone.id, 1, 1.0, True, 0)])
    routes = Routes.load(f)
    per = by_key(staleness(store, NOW, routes)["variants"])
    assert set(per) == {"desktop", "mobile", "(none)"}  # the category has no variant
    assert (per["mobile"]["snapshot"]["count"], per["mobile"]["snapshot"]["max"]) == (5, 1.0)
    assert per["mobile"]["served"]["count"] == 1 and per["desktop"]["served"]["count"] == 2
    assert per["desktop"]["snapshot"]["count"] == 10 and per["(none)"]["refused"] == 1
    name = unique_name()
    eng = Engine.create(name, 64, TEN_LANES)
    table = UrlTable.create(name, [], eng)
    store_routes(table, routes)
    try:
        out = run_stats(capsys, name, "--store", store.directory, "--plain")
        assert "served staleness per variant" in out
        row = next(line for line in out.splitlines() if line.startswith("mobile"))
        assert row.split()[1] == "5"
        out = run_stats(capsys, name, "--store", store.directory, "--prometheus")
    finally:
        table.drop()
        eng.unlink()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(out) for s in fam.samples}
    assert samples[("lanes_variant_snapshots", (("variant", "mobile"),))] == 5
    assert samples[("lanes_variant_served_hits", (("variant", "desktop"),))] == 2
    assert samples[("lanes_route_snapshots", (("route", "product"),))] == 15


def test_the_live_view_shows_served_staleness(store: SnapshotStore) -> None:
    name = unique_name()
    pool = make_pool(name, 3, "pool_renders:record", workers=1)
    try:
        out = io.StringIO()
        view = LiveView(out=out, force_plain=True, store=store.directory)
        view.update(pool)
        view.close()
    finally:
        pool.close()
    text = out.getvalue()
    assert "served staleness per lane" in text and "11 snapshots" in text
    table = text[text.index("served staleness per lane"):]
    # Lane 1 by its label: the pool runs LanePolicy() (submitted, the first band).
    row = next(line for line in table.splitlines() if line.startswith("submitted · ≤ 30 min"))
    assert quantiles(row) == pytest.approx([0.55, 0.955, 1.0], abs=0.02)
