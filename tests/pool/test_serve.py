"""``lanes serve`` end to end through the CLI, on free loopback ports: the snapshot endpoint
(status, Age, ETag/304, gzip, 404, 3xx, max-stale, the hit log), tokens and login, CSRF,
read-only, the dashboard hook and bad starts."""

from __future__ import annotations

import email.utils
import gzip
import http.client
import os
import signal
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from front_door_testlib import cookies
from lanes_testlib import unique_name
from pool_testlib import cli, serving, wait_for

from engine.shm.engine import Engine, wall_ms
from engine.store import SnapshotStore

HOUR_S = 3600
NOW = wall_ms()
PAGES: dict[str, dict[str, Any]] = {
    "https://shop.example/p/1?color=red": {"html": "<html><body>fresh 1</body></html>",
                                           "status": 200, "age_s": 125, "lane": 1},
    "https://shop.example/gone": {"html": "<html><body>not here</body></html>", "status": 404,
                                  "age_s": 10, "lane": 3},
    "https://shop.example/old": {"html": "<html>moved</html>", "status": 301, "age_s": 10,
                                 "location": "https://shop.example/new", "lane": 2},
    "https://shop.example/stale": {"html": "<p>stale</p>", "status": 200,
                                   "age_s": int(2.5 * HOUR_S), "lane": 4},
    "https://shop.example/aging": {"html": "<p>aging</p>", "status": 200,
                                   "age_s": int(1.5 * HOUR_S), "lane": 4},
}


def fill(directory: Path) -> None:
    """Render ``PAGES`` into a store at ``directory``, their ages counted from now (``NOW``)."""
    global NOW
    NOW = wall_ms()
    with SnapshotStore.open(directory) as s:
        for url, p in PAGES.items():
            s.put(url, p["html"], status=p["status"], location=p.get("location"),
                  interval_s=HOUR_S, lane=p["lane"], render_ms=50.0,
                  rendered_at_ms=NOW - p["age_s"] * 1000)


def request(base: str, path: str, method: str = "GET", headers: dict[str, str] | None = None,
            body: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request, redirects not followed; header names lowercased."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def age_now(age_s: int) -> float:
    """The age now of a page filled in as ``age_s`` old by the last ``fill``."""
    return age_s + (wall_ms() - NOW) / 1000


def render_path(url: str) -> str:
    return "/render?url=" + urllib.parse.quote(url, safe="")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("serve") / "store"
    fill(d)
    return d


@pytest.fixture(scope="module")
def server(store_dir: Path) -> Iterator[str]:
    with serving("--store", str(store_dir), "--max-stale", "2") as base:
        yield base


# -- the snapshot endpoint ----------------------------------------------------------------------

def test_a_snapshot_answers_with_its_status_age_and_last_modified(server: str) -> None:
    url = "https://shop.example/p/1?color=red"
    status, h, body = request(server, render_path(url))
    assert status == 200 and body == PAGES[url]["html"].encode()
    assert abs(int(h["age"]) - age_now(125)) <= 2
    rendered = email.utils.parsedate_to_datetime(h["last-modified"]).timestamp()
    assert abs(rendered - (NOW / 1000 - 125)) <= 1
    assert h["content-type"].startswith("text/html") and h["x-lanes-snapshot"] == "served"
    assert float(h["x-lanes-age-over-interval"]) == pytest.approx(125 / HOUR_S, abs=0.01)


def test_the_prerender_style_path_serves_the_same_snapshot(server: str) -> None:
    a = request(server, render_path("https://shop.example/p/1?color=red"))
    b = request(server, "/https://SHOP.example:443/p/1?color=red")  # normalised like the corpus
    c = request(server, "/https:/shop.example/p/1?color=red")  # slashes merged by a proxy
    assert a[0] == b[0] == c[0] == 200 and a[2] == b[2] == c[2]
    assert a[1]["etag"] == b[1]["etag"]


def test_etag_gives_304_on_if_none_match(server: str) -> None:
    path = render_path("https://shop.example/p/1?color=red")
    _, h, _ = request(server, path)
    status, h2, body = request(server, path, headers={"If-None-Match": h["etag"]})
    assert status == 304 and body == b"" and h2["etag"] == h["etag"] and "age" in h2
    other = request(server, path, headers={"If-None-Match": 'W/"something-else"'})
    assert other[0] == 200


def test_gzip_is_the_stored_file_when_accepted_and_decompressed_otherwise(
        server: str, store_dir: Path) -> None:
    url = "https://shop.example/p/1?color=red"
    with SnapshotStore.open(store_dir, create=False) as s:
        snap = s.get(url)
    assert snap is not None
    status, h, body = request(server, render_path(url), headers={"Accept-Encoding": "gzip, br"})
    assert status == 200 and h["content-encoding"] == "gzip"
    assert body == Path(snap.path).read_bytes() and gzip.decompress(body) == snap.html()
    assert "accept-encoding" in h["vary"].lower()
    for refused in ("identity", "gzip;q=0", ""):
        status, h, body = request(server, render_path(url),
                                  headers={"Accept-Encoding": refused})
        assert status == 200 and "content-encoding" not in h and body == snap.html()


def test_a_redirect_keeps_its_status_and_location(server: str) -> None:
    status, h, body = request(server, "/https://shop.example/old")
    assert status == 301 and h["location"] == "https://shop.example/new"
    assert body == b"<html>moved</html>"


def test_a_rendered_404_is_served_and_a_url_never_rendered_is_missing(server: str) -> None:
    status, h, body = request(server, "/https://shop.example/gone")
    assert status == 404 and h["x-lanes-snapshot"] == "served" and b"not here" in body
    status, h, body = request(server, render_path("https://shop.example/never"))
    assert status == 404 and h["x-lanes-snapshot"] == "missing"


def test_a_snapshot_past_max_stale_is_refused_with_503(server: str) -> None:
    status, h, body = request(server, "/https://shop.example/stale")
    assert status == 503 and h["x-lanes-snapshot"] == "stale" and "retry-after" in h
    assert b"stale" in body and b"--max-stale 2" in body
    status, h, _ = request(server, "/https://shop.example/aging")  # 1.5 intervals: served
    assert status == 200 and abs(int(h["age"]) - age_now(5400)) <= 2


def test_head_answers_without_a_body(server: str) -> None:
    status, h, body = request(server, "/https://shop.example/old", method="HEAD")
    assert status == 301 and body == b"" and h["location"] == "https://shop.example/new"


@pytest.mark.parametrize("path", ["/render", "/render?url=ftp://x/y", "/render?url=not%20a%20url"])
def test_a_bad_url_is_a_400(server: str, path: str) -> None:
    assert request(server, path)[0] == 400


def test_each_hit_is_logged_with_its_age_over_interval(server: str, store_dir: Path) -> None:
    since = wall_ms()
    assert request(server, "/https://shop.example/aging")[0] == 200
    assert request(server, "/https://shop.example/stale")[0] == 503
    with SnapshotStore.open(store_dir, create=False) as s:
        wait_for(lambda: len(s.hits(since)) >= 2, timeout=10)
        hits = {(u, ok): (lane, r) for u, lane, r, ok in s.hits(since)}
    lane, ratio = hits[("https://shop.example/aging", True)]
    assert lane == 4 and ratio == pytest.approx(1.5, abs=0.01)
    assert hits[("https://shop.example/stale", False)][1] == pytest.approx(2.5, abs=0.01)


def test_metrics_show_snapshot_and_served_staleness_per_lane(server: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    request(server, "/https://shop.example/aging")
    time.sleep(1.5)  # one flush of the hit log
    status, _, body = request(server, "/metrics")
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples[("lanes_snapshots", (("lane", "4"),))] == 2
    snap_max = samples[("lanes_snapshot_age_over_interval", (("lane", "4"), ("quantile", "1")))]
    assert snap_max == pytest.approx(2.5, abs=0.01)
    served = samples[("lanes_served_age_over_interval", (("lane", "4"), ("quantile", "1")))]
    assert served == pytest.approx(1.5, abs=0.02)


# -- starting: what is refused, and says why ----------------------------------------------------

def refused_start(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``lanes serve ARGS`` run in this process: it must refuse (status 2) before binding."""
    from engine.cli import main

    before = signal.getsignal(signal.SIGTERM)
    try:
        status = main(["serve", *args, "--port", "0"])
    finally:
        signal.signal(signal.SIGTERM, before)
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (out, err)
    return err


def test_a_non_loopback_address_without_a_token_refuses_to_start(
        store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_start(capsys, "--store", str(store_dir), "--host", "0.0.0.0")
    assert "refusing to bind 0.0.0.0" in err and "--token-file" in err


def test_an_unwritable_store_is_a_clear_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = (f"/sys/lanes-serve-test-{os.getpid()}" if os.geteuid() == 0
              else str(tmp_path / "ro" / "store"))
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
    err = refused_start(capsys, "--store", target)
    assert "snapshot store" in err and "cannot" in err
    assert not os.path.exists(target)


@pytest.mark.parametrize("args, why", [
    ((), "nothing to serve"),
    (("--max-stale", "2"), "nothing to serve"),
    (("--store", "{store}", "--max-stale", "0"), "--max-stale F needs"),
    (("--store", "{store}", "--token-file", "{missing}"), "No such file"),
    (("--store", "{store}", "--token-file", "{open}"), "readable by others"),
    (("--store", "{store}", "--token-file", "{short}"), "at least 32"),
])
def test_bad_options_refuse_to_start(tmp_path: Path, store_dir: Path, args: tuple[str, ...],
                                     why: str, capsys: pytest.CaptureFixture[str]) -> None:
    files = {"missing": tmp_path / "none", "open": tmp_path / "open", "short": tmp_path / "short"}
    files["open"].write_text("x" * 32 + "\n")
    files["open"].chmod(0o644)
    files["short"].write_text("short\n")
    files["short"].chmod(0o600)
    given = [a.format(store=store_dir, **files) for a in args]
    assert why in refused_start(capsys, *given)


# -- tokens, login, CSRF, read-only -------------------------------------------------------------

TOKEN = "t0ken-for-the-serve-tests-0123456789"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def cookie_header(jar: dict[str, str]) -> str:
    return "; ".join(f"{k}={v}" for k, v in jar.items())


def test_with_a_token_requests_without_it_are_refused(store_dir: Path, token_file: Path) -> None:
    with serving("--store", str(store_dir), "--token-file", str(token_file)) as base:
        path = "/https://shop.example/old"
        assert request(base, path)[0] == 401
        assert request(base, "/metrics")[0] == 401
        assert request(base, path, headers={"Authorization": "Bearer wrong-token-wrong"})[0] == 401
        assert request(base, path, headers={"Authorization": f"Bearer {TOKEN}"})[0] == 301
        assert request(base, path, headers={"X-Prerender-Token": TOKEN})[0] == 301
        # the prerender header opens the snapshot routes only
        assert request(base, "/metrics", headers={"X-Prerender-Token": TOKEN})[0] == 401
        assert request(base, "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        status, h, _ = request(base, "/metrics?x=1", headers={"Accept": "text/html"})
        where = urllib.parse.urlsplit(h["location"])
        assert status == 303 and where.path == "/login"
        assert urllib.parse.parse_qs(where.query) == {"next": ["/metrics?x=1"]}
        assert request(base, "/healthz")[0] == 200


def test_login_sets_a_session_cookie_that_opens_the_server(store_dir: Path,
                                                           token_file: Path) -> None:
    with serving("--store", str(store_dir), "--token-file", str(token_file)) as base:
        status, h, page = request(base, "/login?next=%2Fmetrics")
        assert status == 200 and b'name="csrf"' in page
        jar = cookies(h)
        csrf = jar["lanes_csrf"]
        assert f'value="{csrf}"'.encode() in page
        form = "application/x-www-form-urlencoded"

        def login(token: str, with_csrf: bool = True) -> tuple[int, dict[str, str], bytes]:
            fields = {"token": token, "next": "/metrics", **({"csrf": csrf} if with_csrf else {})}
            return request(base, "/login", "POST", body=urllib.parse.urlencode(fields),
                           headers={"Content-Type": form, "Cookie": cookie_header(jar)})

        assert login(TOKEN, with_csrf=False)[0] == 403
        evil = urllib.parse.quote('/"><script>alert(1)</script>', safe="")
        _, _, page = request(base, f"/login?next={evil}")
        assert b"<script>" not in page and b"&lt;script&gt;" in page
        _, _, page = request(base, "/login?next=https%3A%2F%2Felsewhere.example%2F")
        assert b'name="next" value="/"' in page  # never another site
        status, _, page = login("not-the-token-at-all")
        assert status == 401 and b"Wrong token" in page
        status, h, _ = login(TOKEN)
        assert status == 303 and h["location"] == "/metrics"
        session = cookies(h)["lanes_session"]
        flags = h["set-cookie"].lower()
        assert "httponly" in flags and "samesite=strict" in flags
        assert request(base, "/metrics", headers={"Cookie": f"lanes_session={session}"})[0] == 200
        forged = session.split(".")[0] + ".0123456789abcdef0123456789abcdef"
        assert request(base, "/metrics", headers={"Cookie": f"lanes_session={forged}"})[0] == 401


def test_every_post_needs_the_csrf_token(store_dir: Path) -> None:
    with serving("--store", str(store_dir)) as base:
        _, h, _ = request(base, "/")
        csrf = cookies(h)["lanes_csrf"]
        assert request(base, "/metrics", "POST")[0] == 403
        assert request(base, "/metrics", "POST", headers={"Cookie": f"lanes_csrf={csrf}"})[0] == 403
        assert request(base, "/metrics", "POST", headers={
            "Cookie": f"lanes_csrf={csrf}",  # one character off (a token ending in 0 passed)
            "X-CSRF-Token": csrf[:-1] + ("1" if csrf.endswith("0") else "0")})[0] == 403
        # with the token the POST reaches the router (which has no POST /metrics)
        assert request(base, "/metrics", "POST", headers={
            "Cookie": f"lanes_csrf={csrf}", "X-CSRF-Token": csrf})[0] == 405


def test_read_only_refuses_every_post(store_dir: Path) -> None:
    with serving("--store", str(store_dir), "--read-only") as base:
        _, h, _ = request(base, "/")
        csrf = cookies(h)["lanes_csrf"]
        status, _, body = request(base, "/metrics", "POST", headers={
            "Cookie": f"lanes_csrf={csrf}", "X-CSRF-Token": csrf})
        assert status == 403 and b"read-only" in body
        assert request(base, "/https://shop.example/old")[0] == 301  # reading still works
    with pytest.raises(OSError):  # stopped (SIGTERM, exit 0: serving checks it), port freed
        request(base, "/healthz")


def test_snapshot_answers_never_set_cookies(server: str) -> None:
    _, h, _ = request(server, "/https://shop.example/old")
    assert "set-cookie" not in h


# -- with a pool: the dashboard hook and its metrics --------------------------------------------

def test_with_a_name_the_dashboard_and_pool_metrics_are_served(store_dir: Path) -> None:
    name = unique_name()
    eng = Engine.create(name, 64)
    try:
        eng.add(NOW, 3600)
        with serving(name, "--store", str(store_dir)) as base:
            status, h, page = request(base, "/")
            assert status == 200 and name.encode() in page
            assert h["x-frame-options"] == "DENY"
            _, _, metrics = request(base, "/metrics")
            assert b"lanes_lane_queued" in metrics and b"lanes_snapshots" in metrics
    finally:
        eng.unlink()


def test_serve_metrics_is_an_alias_of_serve(store_dir: Path) -> None:
    name = unique_name()
    eng = Engine.create(name, 64)
    try:
        p = cli("serve-metrics", name, "--port", "0")
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.startswith(f"serving metrics of {name!r} on http://127.0.0.1:"), line
            u = urllib.parse.urlsplit(line.split()[-1])
            status, _, body = request(f"http://{u.netloc}/", u.path)
            assert status == 200 and b"lanes_rows" in body
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
        assert p.returncode == 0
    finally:
        eng.unlink()


def test_a_new_render_is_served_within_the_revalidation_time(tmp_path: Path) -> None:
    from engine.serve.snapshots import REVALIDATE_S

    directory = tmp_path / "store"
    url = "https://shop.example/p/9"
    with SnapshotStore.open(directory) as s:
        s.put(url, "<p>first</p>", status=200, location=None, interval_s=60, lane=1,
              render_ms=1.0)
        with serving("--store", str(directory)) as base:
            _, h1, body = request(base, f"/{url}")
            assert body == b"<p>first</p>"
            s.put(url, "<p>second</p>", status=200, location=None, interval_s=60, lane=1,
                  render_ms=1.0)
            deadline = time.monotonic() + REVALIDATE_S + 5
            while request(base, f"/{url}")[2] != b"<p>second</p>":
                assert time.monotonic() < deadline, "the new render was never served"
                time.sleep(0.1)
            _, h2, _ = request(base, f"/{url}")
            assert h2["etag"] != h1["etag"]


def test_processes_share_the_port_and_stop_together(store_dir: Path) -> None:
    import psutil

    p = cli("serve", "--store", str(store_dir), "--port", "0", "--processes", "2")
    try:
        assert p.stdout is not None
        base = p.stdout.readline().split()[-1]
        wait_for(lambda: len(psutil.Process(p.pid).children()) == 1, timeout=20)
        child = psutil.Process(p.pid).children()[0]
        port = urllib.parse.urlsplit(base).port
        wait_for(lambda: any(c.laddr.port == port and c.status == "LISTEN"
                             for c in child.net_connections()), timeout=20)
        for _ in range(40):  # new connections, spread by the kernel over both
            assert request(base, "/https://shop.example/old")[0] == 301
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    assert p.returncode == 0
    assert not child.is_running()


def test_a_pool_on_redis_is_served_too(store_dir: Path, redis_server: Any) -> None:
    from lanes_testlib import dispose

    name = unique_name()
    eng = Engine.connect(redis_server.url, name, create=True, capacity=64)
    try:
        eng.add(NOW, 3600)
        with serving(name, "--redis", redis_server.url, "--store", str(store_dir)) as base:
            status, _, page = request(base, "/")
            assert status == 200 and name.encode() in page and b"1 rows" in page
            _, _, metrics = request(base, "/metrics")
            assert b"lanes_lane_queued" in metrics and b"lanes_snapshots" in metrics
            assert request(base, "/https://shop.example/old")[0] == 301
    finally:
        dispose(eng, name)


def test_serving_a_directory_without_a_store_says_it_made_an_empty_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli import main

    before = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["serve", "--store", str(tmp_path / "typo"), "--port", "0",
                     "--seconds", "0.2"]) == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    out, err = capsys.readouterr()
    assert "made an empty one" in err and out.startswith("lanes serve: snapshots")
    with SnapshotStore.open(tmp_path / "typo", create=False) as s:
        assert s.statistics()["snapshots"] == 0
