"""The dashboard in real Chromium (Playwright) against a real pool run by ``lanes pool``.

The pool renders a local site with curl: forty good pages, two that answer 500 (transient
failures, retried after a back-off) and one whose URL holds a ``<script>`` (a 404: permanent).
Each backend runs the same tests: the engine in shared memory, and a queue on a real
redis-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dashboard_testlib import (
    GOOD,
    HOSTILE,
    browser,
    corpus_csv,
    engine_of,
    failure_entry,
    fill_store,
    pool_cli,
    routes_toml,
    site,
    wait_for_pool,
)
from lanes_testlib import unique_name
from pool_testlib import cli, serving, wait_for
from redis_server import RedisServer

from engine.keys import PARKED_MS

SHOTS = os.environ.get("LANES_SHOTS_DIR")
"""Where to keep a copy of the screenshots (one folder per backend), to look at them after the
run; they are always in the test's temp dir. docs/shots/shm/ holds the ones docs/dashboard.md
shows: ``LANES_SHOTS_DIR=docs/shots pytest tests/pool/test_dashboard.py -k shm``."""
SHOT_COLOURS = 64
"""A kept screenshot is a palette PNG of this many colours (Pillow's median cut): the pages are
flat colours and text, so it reads the same at a third of the bytes."""
PAGES = (("overview", "/"), ("failures", "/failures"), ("routes", "/routes"),
         ("policy", "/policy"), ("prioritize", "/prioritize"))
WIDTHS = (1280, 390)


TOKEN = "dashboard-test-token-0123456789-abcdefghij"


@dataclass
class Setup:
    name: str  # the queue
    local: str  # this host's pool files
    redis: str | None
    url: str  # the dashboard (with a store on shared memory)
    read_only_url: str
    token_url: str  # a token-protected server
    tmp: Path
    browser: Any
    site: str  # the site the pool renders

    def pool_args(self) -> tuple[str, ...]:
        return ("--redis", self.redis, "--local-name", self.local) if self.redis else ()


@pytest.fixture(scope="module", params=["shm", "redis"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp(f"dashboard-{request.param}")
    name = unique_name()
    local = unique_name() if request.param == "redis" else name
    with contextlib.ExitStack() as stack:
        redis = None
        if request.param == "redis":
            redis = stack.enter_context(RedisServer()).url
        s = stack.enter_context(site())
        csv = corpus_csv(tmp, s)
        more = ("--redis", redis, "--local-name", local) if redis else ()
        stack.enter_context(pool_cli(name, csv, *more, "--routes", str(routes_toml(tmp))))
        wait_for_pool(name, local, redis, failures=3)
        store = tmp / "store"  # snapshots, as a pool with --browser --store leaves them
        fill_store(store, [f"{s.url()}{p}" for p in GOOD[:10]], lane=1)
        with_store = ("--store", str(store))
        url = stack.enter_context(serving(name, *more, *with_store))
        read_only = stack.enter_context(serving(name, *more, "--read-only"))
        token_file = tmp / "token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        token = stack.enter_context(serving(name, *more, "--token-file", str(token_file)))
        ctx = stack.enter_context(browser(tmp / "profile"))
        yield Setup(name, local, redis, url, read_only, token, tmp, ctx, s.url())
        if redis is not None:
            from engine.redis.urls import RedisUrls

            eng = engine_of(name, redis)
            RedisUrls(eng).drop()
            eng.close()


class Watched:
    """A page with its console errors, uncaught exceptions, dialogs and requests recorded."""

    def __init__(self, ctx: Any, width: int = 1280) -> None:
        self.page = ctx.new_page()
        self.page.set_viewport_size({"width": width, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", self._dialog)
        self.answer: Any = lambda dialog: dialog.dismiss()

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        self.answer(dialog)

    def close(self) -> None:
        self.page.close()


UNNAMED_CONTROLS = """() => Array.from(document.querySelectorAll(
    'a, button, input:not([type=hidden]), select, textarea, [tabindex]'))
  .filter(el => {
    const own = (el.getAttribute('aria-label') || el.textContent || '').trim();
    const labelled = el.labels && el.labels.length > 0;
    const by = el.getAttribute('aria-labelledby');
    return !(own || labelled || (by && document.getElementById(by)));
  }).map(el => el.outerHTML.slice(0, 80))"""
"""Every control with no accessible name: its text, a label, aria-label or aria-labelledby."""

WIDE_TABLES = """() => Array.from(document.querySelectorAll('table'))
  .filter(t => t.getBoundingClientRect().right > window.innerWidth + 0.5
               || t.scrollWidth > t.parentElement.clientWidth + 0.5)
  .map(t => t.id + ': ' + Math.round(t.scrollWidth) + ' px')"""
"""Every table wider than the page or than the box it sits in (a table that needs a sideways
scroll to be read)."""


def _failing(s: Setup, part: str) -> Any:
    entry = failure_entry(s.local, part)
    assert entry is not None, f"no failure of {part} yet"
    return entry


def test_every_page_loads_with_no_console_error_and_no_request_elsewhere(setup: Setup
                                                                          ) -> None:
    s = setup
    row = _failing(s, "/broken/1").row
    shots = s.tmp / "shots"
    shots.mkdir(exist_ok=True)
    for width in WIDTHS:
        w = Watched(s.browser, width)
        try:
            for page, path in (*PAGES, ("url", f"/url?row={row}")):
                w.page.goto(s.url + path)
                if page == "overview":  # its charts drawn, over a few samples
                    w.page.wait_for_selector(".chart .uplot", timeout=15_000)
                w.page.screenshot(path=shots / f"{page}-{width}.png", full_page=True)
                assert w.page.evaluate(UNNAMED_CONTROLS) == [], page
                assert w.page.evaluate("document.documentElement.scrollWidth") <= width, (
                    f"{page} is wider than {width} px")
                assert w.page.evaluate(WIDE_TABLES) == [], f"{page} at {width} px"
        finally:
            w.close()
        assert w.errors == []
        assert w.requests and all(u.startswith(s.url + "/") for u in w.requests), w.requests
    for png in shots.iterdir():
        keep_shot(png, s)


AXIS_ROOM = """async (top) => {
  // Every series set to ``top`` and drawn: how many pixels each y axis has left once its widest
  // tick label, the tick and the gap are drawn (negative: a label is cut), with its ticks and
  // its unit. Drawn again if the page's own refresh replaced the data before it was read.
  const ctx = document.createElement("canvas").getContext("2d");
  const charts = Array.from(window.lanesCharts.values());
  for (let tries = 0; tries < 5; tries++) {
    charts.forEach((c) => c.plot.setData(
      [c.plot.data[0]].concat(c.plot.data.slice(1).map((s) => s.map(() => top)))));
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    if (charts.every((c) => c.plot.data[1][0] === top)) break;
  }
  return charts.map((c) => {
    const y = c.plot.axes[1];
    ctx.font = y.font[0];
    const widest = Math.max(...y._values.map((v) => ctx.measureText(v).width));
    return {room: y._size - y.ticks.size - y.gap - widest, label: y.label, ticks: y._values,
            top: c.plot.data[1][0]};
  });
}"""


def test_each_chart_axis_fits_its_numbers_and_names_its_unit(setup: Setup) -> None:
    """A y axis is as wide as its widest tick, from a fraction to tens of millions (10,000
    once read "0,000": the axis was too narrow), and every axis says its unit."""
    w = Watched(setup.browser)
    try:
        w.page.goto(setup.url + "/")
        w.page.wait_for_function("() => window.lanesCharts && window.lanesCharts.size === 3",
                                 timeout=15_000)
        for top, unit in ((0.4, ""), (950, ""), (12_345, "k"), (1_234_567, "M"),
                          (98_765_432, "M")):
            axes = w.page.evaluate(AXIS_ROOM, top)
            assert [a["top"] for a in axes] == [top] * 3, axes
            assert all(a["room"] >= 0 for a in axes), (top, axes)
            assert all(a["ticks"][-1].endswith(unit) for a in axes), (top, axes)
            assert {a["label"] for a in axes} == {"renders / s", "rows due", "age ÷ TTL"}
    finally:
        w.close()
    assert w.errors == []


def keep_shot(png: Path, s: Setup) -> None:
    """A copy of screenshot ``png`` under $LANES_SHOTS_DIR/{shm,redis}, when that is set."""
    if SHOTS:
        from PIL import Image

        folder = Path(SHOTS) / ("redis" if s.redis else "shm")
        folder.mkdir(parents=True, exist_ok=True)
        with Image.open(png) as shot:
            shot.convert("RGB").quantize(SHOT_COLOURS).save(folder / png.name, optimize=True)


def test_the_lane_table_changes_without_a_reload(setup: Setup) -> None:
    w = Watched(setup.browser)
    try:
        w.page.goto(setup.url + "/")
        w.page.evaluate("window.notReloaded = true")
        first = w.page.inner_text("#live")
        w.page.wait_for_function(
            "text => document.getElementById('live').innerText !== text", arg=first,
            timeout=15_000)
        assert w.page.evaluate("window.notReloaded") is True
        assert w.page.locator("#lanes tbody tr").count() >= 2
        # Lanes by what they hold (the pool's pages every 60 s: the first band), no band number.
        lanes = w.page.inner_text("#lanes tbody")
        assert "submitted · ≤ 30 min" in lanes and "/b" not in lanes
    finally:
        w.close()
    assert w.errors == []


def test_retry_makes_the_pool_try_a_failing_url_again_within_seconds(setup: Setup) -> None:
    s = setup
    eng = engine_of(s.name, s.redis)
    try:
        def back_off_ms() -> int:
            return int(eng.describe(_failing(s, "/broken/1").row)["due_ms"]
                       - time.time() * 1000)

        # A back-off long enough to tell a retry from it (the next failure backs off longer).
        wait_for(lambda: back_off_ms() > 10_000, timeout=90)
        before = _failing(s, "/broken/1")
        left_ms = back_off_ms()
    finally:
        eng.close()
    w = Watched(s.browser)
    try:
        w.page.goto(s.url + "/failures?q=broken/1")
        clicked = time.monotonic()
        w.page.get_by_role("button", name=f"Retry {before.url}", exact=True).click()
        w.page.wait_for_selector(".flash")
        wait_for(lambda: _failing(s, "/broken/1").last_ms > before.last_ms,
                 timeout=left_ms / 1000)
        took = time.monotonic() - clicked
        assert "retrying 1 of 1" in w.page.inner_text(".flash")
    finally:
        w.close()
    assert took * 1000 < left_ms, (took, left_ms)  # retried before its back-off would have


def test_park_parks_it(setup: Setup) -> None:
    s = setup
    entry = _failing(s, "/broken/2")
    w = Watched(s.browser)
    try:
        w.page.goto(s.url + "/failures?q=broken/2")
        w.page.get_by_role("button", name=f"Park {entry.url}", exact=True).click()
        eng = engine_of(s.name, s.redis)
        try:
            wait_for(lambda: eng.describe(entry.row)["due_ms"] == PARKED_MS, timeout=5)
        finally:
            eng.close()

        def listed() -> bool:  # the failure list is shared for a couple of seconds
            w.page.goto(s.url + "/failures?kind=parked")
            return entry.url in w.page.inner_text("#failures")

        wait_for(listed, timeout=10)
    finally:
        w.close()
    assert w.errors == []


def test_retry_all_matching_asks_first_and_acts_on_every_match(setup: Setup) -> None:
    s = setup
    w = Watched(s.browser)
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss() if len(asked) == 1 else dialog.accept()

    w.answer = answer
    try:
        w.page.goto(s.url + "/failures?q=broken")
        w.page.get_by_role("button", name="Retry all matching").click()  # dismissed
        assert len(asked) == 1 and "2 matching" in asked[0]
        assert w.page.locator(".flash").count() == 0
        w.page.get_by_role("button", name="Retry all matching").click()
        w.page.wait_for_selector(".flash")
        assert "retrying 2 of 2" in w.page.inner_text(".flash")
        # An action only ever sends the browser back to a page of this server.
        csrf = w.page.get_attribute("meta[name=csrf-token]", "content")
        for back in ("//evil.example/", "/\\evil.example/", "https://evil.example/"):
            answer = w.page.request.post(s.url + "/failures/retry", max_redirects=0, form={
                "csrf": csrf or "", "row": str(_failing(s, "/broken/1").row), "back": back})
            assert answer.status == 303
            assert answer.headers["location"].startswith("/failures?done="), back
    finally:
        w.close()


def test_a_policy_edit_takes_effect_and_a_bad_value_shows_the_engine_s_error(setup: Setup
                                                                             ) -> None:
    s = setup
    eng = engine_of(s.name, s.redis)
    w = Watched(s.browser)
    try:
        w.page.goto(s.url + "/policy")
        # The split as one bar: the urgent cap, each floor, the remainder by recent grants.
        legend = w.page.inner_text("#split-now")
        assert "urgent cap 20.0 %" in legend and "discovered floor 10.0 %" in legend
        shares = [float(v) for v in re.findall(r"([\d.]+) %", legend)]
        assert sum(shares) == pytest.approx(100, abs=0.5) and "/b" not in legend
        w.page.get_by_label("Urgent cap").fill("0.3")
        w.page.get_by_label("discovered floor").fill("0.15")
        w.page.get_by_role("button", name="Preview the change").click()
        changes = w.page.inner_text("#changes")  # shown before anything changes
        assert re.search(r"urgent cap\s+0\.2\s+0\.3", changes), changes
        assert re.search(r"discovered floor\s+0\.1\s+0\.15", changes), changes
        assert "remainder share" in changes and "urgent cap 30.0 %" in w.page.inner_text(
            "#split-after")
        assert eng.policy.urgent_max_share == 0.2  # a preview applies nothing
        shot = s.tmp / "shots" / "policy-preview-1280.png"
        w.page.screenshot(path=shot, full_page=True)
        keep_shot(shot, s)
        w.page.get_by_role("button", name="Apply the policy").click()  # the values kept
        w.page.wait_for_selector(".flash")
        assert eng.policy.urgent_max_share == 0.3
        assert eng.policy.min_share["discovered"] == 0.15
        w.page.get_by_label("Urgent cap").fill("1.5")
        w.page.get_by_role("button", name="Apply the policy").click()
        error = w.page.get_by_role("alert").inner_text()
        assert "urgent_max_share must lie in [0, 1], got 1.5" in error
        assert w.page.get_by_label("Urgent cap").input_value() == "1.5"  # kept to correct
        assert eng.policy.urgent_max_share == 0.3  # nothing changed
        w.page.goto(s.url + "/policy")  # derived weights, shown as the next pass takes them
        assert w.page.get_by_label("Weights").input_value() == "intervals"
        w.page.get_by_label("Weights").select_option("given")  # fixed: the values shown
        w.page.get_by_role("button", name="Apply the policy").click()
        w.page.wait_for_selector(".flash")
        fixed = eng.policy.weights
        assert isinstance(fixed, dict) and max(fixed.values()) >= 4.0  # the shortest pages' lane
        w.page.goto(s.url + "/policy")
        field = w.page.locator("input[name^='weight.']").first
        lane = (field.get_attribute("name") or "").removeprefix("weight.")
        field.fill("heavy")
        w.page.get_by_role("button", name="Apply the policy").click()
        assert f"weights['{lane}'] must be a number" in w.page.get_by_role("alert").inner_text()
        assert eng.policy.weights == fixed  # nothing changed
        w.page.goto(s.url + "/policy")
        w.page.get_by_label("Weights").select_option("intervals")
        w.page.get_by_label("Urgent cap").fill("0.2")
        w.page.get_by_label("discovered floor").fill("0.1")
        w.page.get_by_role("button", name="Apply the policy").click()
        w.page.wait_for_selector(".flash")
        assert eng.policy.urgent_max_share == 0.2 and eng.policy.weights == "intervals"
    finally:
        w.close()
        eng.close()


def _prioritize(w: Watched, base: str, urls: str = "", scope: str = "", mode: str = "rush",
                add: bool = False) -> str:
    """Fill the prioritize form, send it, and return the summary it shows once answered."""
    w.page.goto(base + "/prioritize")
    w.page.get_by_label("URLs, one a line").fill(urls)
    w.page.get_by_label("or a scope").fill(scope)
    w.page.get_by_label("Mode").select_option(mode)
    w.page.get_by_label("add listed URLs the pool does not know").set_checked(add)
    w.page.get_by_role("button", name="Prioritize").click()
    w.page.wait_for_function(
        "() => document.getElementById('prioritize-summary').innerText !== 'Asking…'"
        " && !document.getElementById('prioritize-answer').hidden", timeout=15_000)
    return w.page.inner_text("#prioritize-summary")


def test_the_prioritize_form_posts_json_and_shows_the_answer(setup: Setup) -> None:
    """The dashboard's form asks POST /api/prioritize (a URL, a list, a scope; each mode) and
    shows its answer; a bad scope is refused with the server's reason and changes nothing."""
    s = setup
    first, listed = s.site + GOOD[7], [s.site + GOOD[8], s.site + GOOD[9]]
    unknown = s.site + "/not/in/the/corpus"
    w = Watched(s.browser)
    eng = engine_of(s.name, s.redis)
    try:
        assert _prioritize(w, s.url, urls=first, mode="clear-and-wait") == (
            "matched 1, added 0, unknown 0, cleared 1")  # its snapshot, from fill_store
        answer = json.loads(w.page.inner_text("#prioritize-answer"))
        assert answer["mode"] == "clear-and-wait" and answer["matched"] == 1
        assert _prioritize(w, s.url, urls="\n".join([*listed, unknown])) == (
            "matched 2, added 0, unknown 1, cleared 0")
        assert json.loads(w.page.inner_text("#prioritize-answer"))["unknown"] == [unknown]
        shot = s.tmp / "shots" / "prioritize-answered-1280.png"
        w.page.screenshot(path=shot, full_page=True)
        keep_shot(shot, s)
        # /p/2 and /p/20 to /p/29, one of them with a snapshot.
        assert _prioritize(w, s.url, scope=s.site + "/p/2*", mode="clear-and-rush") == (
            "matched 11, added 0, unknown 0, cleared 1")
        assert w.errors == []
        before = eng.stats()["rows"]
        refused = _prioritize(w, s.url, scope=s.site + "/p/", add=True)
        assert refused.startswith("Refused (400), nothing changed: scope")
        assert "must be a URL prefix ending in *" in refused
        assert w.page.locator("#prioritize-summary.error").count() == 1
        refused = _prioritize(w, s.url, scope="route:nosuch", mode="clear-and-wait")
        assert refused == ("Refused (400), nothing changed: no route 'nosuch': the pool's"
                           " routes are pages, broken")
        assert eng.stats()["rows"] == before
    finally:
        eng.close()
        w.close()
    # Chromium logs each refused request itself; the page's script raised nothing.
    assert w.errors == ["Failed to load resource: the server responded with a status of 400"
                        " (Bad Request)"] * 2
    w = Watched(s.browser)
    try:
        w.page.goto(s.read_only_url + "/prioritize")
        assert w.page.get_by_role("button", name="Prioritize").count() == 0
        assert w.page.locator("#prioritize fieldset[disabled]").count() == 1
        # The script would send JSON: the read-only server refuses that too.
        status = w.page.evaluate("""url => fetch('/api/prioritize', {method: 'POST',
            headers: {'Content-Type': 'application/json'}, body: JSON.stringify({url})})
            .then(r => r.status)""", first)
        assert status == 403
    finally:
        w.close()


def test_a_url_holding_a_script_is_shown_as_text(setup: Setup) -> None:
    w = Watched(setup.browser)
    try:
        for path in ("/failures", f"/url?url={urllib.parse.quote(_hostile(setup))}"):
            w.page.goto(setup.url + path)
            assert w.page.get_by_text(HOSTILE, exact=False).count() >= 1
            assert w.page.locator("script").count() == 2  # ours: uPlot and the dashboard's
            assert w.page.evaluate("typeof window.alert") == "function"
        # A filter no form offers is refused in words, and those words are text too.
        answer = w.page.goto(setup.url + "/failures?kind=" + urllib.parse.quote(
            "<script>alert(2)</script>"))
        assert answer is not None and answer.status == 400
        assert "kind must be one of" in w.page.get_by_role("alert").inner_text()
        assert w.page.locator("script").count() == 2
        w.errors = [e for e in w.errors if "400 (Bad Request)" not in e]
        assert w.dialogs == []
    finally:
        w.close()
    assert w.errors == []


def _hostile(s: Setup) -> str:
    return _failing(s, "<script>").url


def test_read_only_shows_no_action_and_refuses_posts(setup: Setup) -> None:
    s = setup
    w = Watched(s.browser)
    try:
        for _, path in (*PAGES, ("failures", "/failures?q=broken")):
            w.page.goto(s.read_only_url + path)
            assert w.page.locator("form[method=post] button").count() == 0
            assert w.page.get_by_role("button", name="Retry").count() == 0
        assert w.page.locator("text=read-only").count() == 1
    finally:
        w.close()
    for path, body in (("/api/retry", b"row=1"), ("/api/park", b"row=1"),
                       ("/api/policy", b"urgent_max_share=0.5"), ("/failures/retry", b"row=1"),
                       ("/policy", b"urgent_max_share=0.5"),
                       ("/api/prioritize", b"url=https://x.example/")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(s.read_only_url + path, data=body),
                                   timeout=10)
        assert refused.value.code in (403, 405), path
    eng = engine_of(s.name, s.redis)
    try:
        assert eng.policy.urgent_max_share == 0.2
    finally:
        eng.close()


def test_the_json_api_agrees_with_lanes_stats_json(setup: Setup) -> None:
    s = setup
    more = s.pool_args()
    looks: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def agree() -> bool:
        """The two looks see the rows in the same lanes (a failing row moves between lanes
        now and then, and the API's look is up to a sample old)."""
        p = cli("stats", s.name, "--json", *more)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        with urllib.request.urlopen(s.url + "/api/overview", timeout=10) as r:
            looks.append((json.loads(out), json.load(r)))
        stats, api = looks[-1]
        return ({ln["name"]: ln["queued"] for ln in api["lanes"]}
                == {ln["name"]: ln["queued"] for ln in stats["lanes"]})

    wait_for(agree, timeout=60)
    stats, api = looks[-1]
    for key in ("rows", "capacity", "queued"):
        assert api[key] == stats[key], key
    assert [ln["name"] for ln in api["lanes"]] == [ln["name"] for ln in stats["lanes"]]
    assert len(api["workers"]) == 2 and all(w["pid"] > 0 and w["restarts"] == 0
                                              for w in api["workers"])
    a, b = api["pool"], stats["pool"]
    assert a["supervisor_pid"] == b["supervisor_pid"] and a["workers"] == b["workers"]
    # Counters move between the two looks, a sample (2 s) apart at most: a few renders.
    assert abs(b["renders"] - a["renders"]) <= 40
    for lane_a, lane_b in zip(api["lanes"], stats["lanes"], strict=True):
        assert abs(lane_a["latency"]["ok"]["count"] - lane_b["latency"]["ok"]["count"]) <= 40
    with urllib.request.urlopen(s.url + "/api/routes", timeout=10) as r:
        routes = json.load(r)["routes"]
    fixed = ("route", "pattern", "interval_s", "rows")  # due and failing move with time
    assert [[r[k] for k in fixed] for r in routes] == [[r[k] for k in fixed]
                                                       for r in stats["routes"]]
    assert [r["route"] for r in routes] == ["pages", "broken"]
    with urllib.request.urlopen(s.url + "/api/failures?q=broken", timeout=10) as r:
        failures = json.load(r)
    p = cli("failures", s.name, "--json", *more)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    cli_rows = {r["url"]: r for r in json.loads(out) if "broken" in r["url"]}
    assert {r["url"] for r in failures["rows"]} == set(cli_rows)
    for r in failures["rows"]:
        assert r["lane"] == cli_rows[r["url"]]["lane"]
        assert r["last_error"] == cli_rows[r["url"]]["last_error"]


def test_a_token_protected_server_refuses_without_the_token(setup: Setup) -> None:
    s = setup
    for path in ("/api/overview", "/failures", "/static/dashboard.js"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(s.token_url + path, timeout=10)
        assert refused.value.code == 401, path
    bearer = urllib.request.Request(s.token_url + "/api/overview",
                                    headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(bearer, timeout=10) as r:
        assert json.load(r)["name"] == s.name
    w = Watched(s.browser)
    try:
        w.page.goto(s.token_url + "/failures")
        assert urllib.parse.urlsplit(w.page.url).path == "/login"
        assert w.page.locator("#failures").count() == 0
        w.page.get_by_label("Token").fill(TOKEN)
        w.page.get_by_role("button", name="Log in").click()
        w.page.wait_for_selector("#failures")
        assert urllib.parse.urlsplit(w.page.url).path == "/failures"
    finally:
        w.close()


def test_a_url_page_links_its_snapshot_and_the_overview_shows_served_staleness(
        setup: Setup) -> None:
    s = setup
    url = s.site + GOOD[3]
    w = Watched(s.browser)
    try:
        w.page.goto(s.url + "/url?url=" + urllib.parse.quote(url, safe=""))
        link = w.page.get_by_role("link", name="open the snapshot")
        assert "× its interval old" in w.page.inner_text("main")
        shot = s.tmp / "shots" / "url-with-snapshot-1280.png"
        w.page.screenshot(path=shot, full_page=True)
        keep_shot(shot, s)
        assert w.errors == []
        link.click()
        w.page.wait_for_load_state("networkidle")
        assert url.encode() in w.page.content().encode()  # the snapshot, served by the server
        # The snapshot is the site's page, not the dashboard's: Chromium asks this server for
        # its /favicon.ico, which only the site could answer.
        w.errors.clear()
        w.page.goto(s.url + "/")
        header = "served age/TTL"
        w.page.wait_for_function(
            "h => document.querySelector('#lanes thead').innerText.includes(h)", arg=header)
        row = w.page.locator("#lanes tbody tr", has_text="submitted · ≤ 30 min")
        wait_for(lambda: row.locator("td").last.inner_text() != "-", timeout=20)
    finally:
        w.close()
    assert w.errors == []


def test_a_restarted_worker_shows_its_new_pid_and_its_restart(setup: Setup) -> None:
    def workers() -> list[dict[str, Any]]:
        with urllib.request.urlopen(setup.url + "/api/overview", timeout=10) as r:
            got: list[dict[str, Any]] = json.load(r)["workers"]
        return got

    first = workers()[0]
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: workers()[0]["restarts"] == first["restarts"] + 1, timeout=30)
    again = workers()[0]
    assert again["pid"] not in (0, first["pid"])
    w = Watched(setup.browser)
    try:
        w.page.goto(setup.url + "/")
        cells = w.page.locator("#workers tbody tr").first.locator("th, td").all_inner_texts()
        assert cells[0] == str(again["pid"]) and cells[-1] == str(again["restarts"])
    finally:
        w.close()


def test_a_policy_form_keeps_derived_weights_unless_told_and_refuses_another_mode() -> None:
    """``policy_from_form``: a form (or an API client) that does not name ``weights`` keeps the
    policy's derived weights; ``given`` fixes the weights the form sends; any other mode is
    refused with the engine's kind of error, and nothing is built."""
    from engine import EngineValueError, LanePolicy
    from engine.serve.api import policy_from_form

    live = LanePolicy()
    assert policy_from_form(live, {"urgent_max_share": "0.3"}).weights == "intervals"
    fixed = policy_from_form(live, {"urgent_max_share": "0.2", "weights": "given",
                                    "weight.submitted/b0": "2"})
    assert fixed.weights == {"submitted/b0": 2.0}
    assert policy_from_form(fixed, {"urgent_max_share": "0.2"}).weights == {}
    with pytest.raises(EngineValueError, match="weights must be 'intervals' or 'given'"):
        policy_from_form(live, {"urgent_max_share": "0.2", "weights": "by-hand"})
