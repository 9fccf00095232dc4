"""The front door of ``lanes serve`` under hostile traffic (docs/serve.md, "Security"), against a
running server over raw sockets: every odd request gets a 4xx with a reason and never a 500 or a
traceback; rejected URLs cost no memory; slow clients are cut off; a foreign Host never reaches
the dashboard; redirects stay on the server; guessing is throttled per client; sessions end.

The long form of the property test runs under ``make test-slow`` (``slow`` marker)."""

from __future__ import annotations

import asyncio
import os
import stat
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from front_door_testlib import Served, connect, cookies, exchange, get, read_answer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes_testlib import unique_name
from pool_testlib import cli

from engine import Engine
from engine.checks import wall_ms
from engine.serve.auth import MIN_TOKEN, Auth
from engine.serve.door import SECURITY_HEADERS, Throttle
from engine.store import SnapshotStore

TOKEN = "front-door-token-0123456789-abcdefghijklmnop"
GOOD = "https://shop.example/p/1"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("door") / "store"
    with SnapshotStore.open(d) as s:
        s.put(GOOD, "<html><body>one</body></html>", status=200, location=None,
              interval_s=3600, lane=1, render_ms=5.0)
        s.put("https://shop.example/old", "<p>moved</p>", status=301,
              location="https://shop.example/new", interval_s=3600, lane=1, render_ms=5.0)
    return d


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    name = unique_name()
    eng = Engine.create(name, 64)
    try:
        eng.add(wall_ms(), 3600)
        yield name
    finally:
        eng.unlink()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1 << 20)


# -- memory: rejected URLs and decompressed answers --------------------------------------------

def test_a_flood_of_distinct_bad_urls_costs_no_memory(store: Path) -> None:
    with Served("--store", str(store)) as srv:
        tail = "a" * 8000
        with connect(srv.port) as s:  # one keep-alive connection: the cost is the server's
            def bad(i: int) -> tuple[int, dict[str, str], bytes]:
                s.sendall(f"GET /https://flood.example:99999/{i}/{tail} HTTP/1.1\r\n"
                          f"Host: 127.0.0.1\r\n\r\n".encode())
                return read_answer(s)

            for i in range(300):  # warm up: allocator arenas, caches of fixed size
                bad(i)
            before = rss_mib(srv.pid)
            for i in range(300, 3300):
                status, h, body = bad(i)
                assert status == 400 and len(body) < 400, (status, body[:100])
                assert h["x-content-type-options"] == "nosniff"
            grown = rss_mib(srv.pid) - before
        # 3,000 URLs of 8 KB grew the server by ~128 MiB when each kept its error
        assert grown < 16, f"the server grew {grown:.1f} MiB on 3,000 rejected URLs"
        assert get(srv.port, f"/{GOOD}")[0] == 200


def test_decompressed_answers_count_in_the_answer_budget(tmp_path: Path) -> None:
    from aiohttp.test_utils import make_mocked_request

    from engine.serve import snapshots

    big = "<p>" + "lanes " * 150_000 + "</p>"  # 900 KB of HTML: kept decompressed
    with SnapshotStore.open(tmp_path / "s") as s:
        urls = [f"https://shop.example/big/{i}" for i in range(6)]
        for u in urls:
            s.put(u, big, status=200, location=None, interval_s=60, lane=1, render_ms=1.0)
        hits = snapshots.HitLog(str(tmp_path / "s"))
        try:
            routes = snapshots.SnapshotRoutes(s, hits, None)
            budget = 3 * len(big) + 3 * len(s.get(urls[0]).gz)  # type: ignore[union-attr]
            old, snapshots.CACHE_BYTES = snapshots.CACHE_BYTES, budget  # type: ignore[misc]
            try:
                for u in urls:
                    r = asyncio.run(routes.answer(make_mocked_request("GET", "/", headers={}),
                                                  u))
                    assert len(r.body) == len(big)  # type: ignore[arg-type]
                    assert routes._bytes <= budget + len(big)
                assert routes._bytes <= budget
                assert routes._bytes == sum(a.size() for a in routes._cache.values())
            finally:
                snapshots.CACHE_BYTES = old  # type: ignore[misc]
        finally:
            hits._thread.shutdown()
            hits._store.close()


def test_a_large_page_is_sent_decompressed_piece_by_piece(tmp_path: Path) -> None:
    from engine.serve.snapshots import PLAIN_KEPT

    html = ("<p>" + "lanes serve " * (3 * PLAIN_KEPT // 12) + "</p>").encode()
    with SnapshotStore.open(tmp_path / "s") as s:
        s.put(GOOD, html.decode(), status=200, location=None, interval_s=60, lane=1,
              render_ms=1.0)
    with Served("--store", str(tmp_path / "s")) as srv:
        status, h, body = get(srv.port, f"/{GOOD}", {"Accept-Encoding": "identity"})
        assert status == 200 and body == html and int(h["content-length"]) == len(html)
        status, h, body = get(srv.port, f"/{GOOD}", {"Accept-Encoding": "identity"},
                              method="HEAD")
        assert status == 200 and body == b"" and h["etag"]
        status, h, body = get(srv.port, f"/{GOOD}", {"Accept-Encoding": "gzip"})
        assert status == 200 and h["content-encoding"] == "gzip" and len(body) < len(html)


# -- names, redirects, odd input ---------------------------------------------------------------

def test_a_foreign_host_never_reaches_the_dashboard(pool: str, store: Path) -> None:
    with Served(pool, "--store", str(store), "--allowed-host", "lanes.example") as srv:
        for host in ("attacker.example", f"attacker.example:{srv.port}", "127.0.0.1.evil.io",
                     ""):
            for path in ("/", "/failures", "/api/overview", "/metrics", "/policy"):
                status, h, body = get(srv.port, path, {"Host": host})
                assert status == 421 and b"--allowed-host" in body, (host, path, status)
                assert "set-cookie" not in h  # no CSRF token handed out
            # nor an action, even with a cookie and a token of its own
            status, _, _ = get(srv.port, "/api/retry", {"Host": host, "Content-Type": FORM,
                                                       "Cookie": "lanes_csrf=x.y",
                                                       "X-CSRF-Token": "x.y"},
                               method="POST", body=b"row=0")
            assert status == 421
        for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "LANES.example.",
                     "lanes.example:443"):
            assert get(srv.port, "/failures", {"Host": host})[0] == 200, host
        # the snapshot routes and /healthz answer any Host: middleware sends its own
        assert get(srv.port, f"/{GOOD}", {"Host": "www.shop.example"})[0] == 200
        assert get(srv.port, "/healthz", {"Host": "lb.internal"})[0] == 200


def test_redirects_only_ever_go_to_a_page_of_this_server(pool: str, token_file: Path) -> None:
    with Served(pool, "--token-file", str(token_file)) as srv:
        for nxt in ("/%09/evil.example", "/%0a/evil.example", "/%0d%0a/evil.example",
                    "//evil.example", "/\\evil.example", "https://evil.example/",
                    "/%5Cevil.example"):
            status, h, page = get(srv.port, f"/login?next={nxt}")
            assert status == 200 and b'name="next" value="/"' in page, (nxt, page)
            jar = cookies(h)
            body = urllib.parse.urlencode({"token": TOKEN, "csrf": jar["lanes_csrf"],
                                           "next": urllib.parse.unquote(nxt)}).encode()
            status, h, _ = get(srv.port, "/login", {"Content-Type": FORM, "Cookie":
                                                    f"lanes_csrf={jar['lanes_csrf']}"},
                               method="POST", body=body)
            assert status == 303 and h["location"] == "/", (nxt, h.get("location"))
            session = cookies(h)["lanes_session"]
            auth = {"Content-Type": FORM, "Cookie": f"lanes_csrf={jar['lanes_csrf']};"
                                                    f" lanes_session={session}"}
            body = urllib.parse.urlencode({"csrf": jar["lanes_csrf"], "row": "0",
                                           "back": urllib.parse.unquote(nxt)}).encode()
            status, h, _ = get(srv.port, "/failures/retry", auth, method="POST", body=body)
            assert status == 303 and h["location"].startswith("/failures?done="), h
        status, h, _ = get(srv.port, "/login", {"Content-Type": FORM, "Cookie": f"lanes_csrf="
                           f"{jar['lanes_csrf']}"}, method="POST", body=urllib.parse.urlencode(
                               {"token": TOKEN, "csrf": jar["lanes_csrf"],
                                "next": "/failures?q=a%20b"}).encode())
        assert h["location"] == "/failures?q=a%20b"  # a path of this server is kept whole


ODD_COOKIES = ["lanes_session=9999999999.é", "lanes_session=²9.abc", "lanes_csrf=a.é",
               "lanes_session=9999999999.0123456789abcdef.é", "lanes_csrf=é.é",
               "lanes_session=" + "9" * 400 + ".a.b", "lanes_csrf=.", "lanes_session=..."]


def test_odd_cookies_and_tokens_are_wrong_credentials_never_errors(
        pool: str, store: Path, token_file: Path) -> None:
    for args in ((pool, "--store", str(store)),
                 (pool, "--store", str(store), "--token-file", str(token_file))):
        with Served(*args) as srv:
            for cookie in ODD_COOKIES:
                for path in ("/healthz", "/failures", f"/{GOOD}"):
                    status, h, _ = get(srv.port, path, {"Cookie": cookie})
                    assert status < 500, (cookie, path, status)
                    assert h["x-frame-options"] == "DENY"
                status, _, _ = get(srv.port, "/api/retry", {"Cookie": cookie, "Content-Type":
                                   FORM, "X-CSRF-Token": cookie.split("=", 1)[1]},
                                   method="POST", body=b"row=0")
                assert status == 403 if len(args) == 3 else status in (401, 403)
            for path in ("/healthz", "/no-such-page", f"/{GOOD}"):  # aiohttp's check once 500'd
                raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                status, h, _ = exchange(srv.port, raw + b"Expect: \x80\xff\r\n\r\n")
                assert status == 417 and h["x-content-type-options"] == "nosniff"
            raw = (b"GET /" + GOOD.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   b"Authorization: Bearer \xff\xfe-token\r\nCookie: lanes_csrf=\xff.\xff\r\n"
                   b"X-CSRF-Token: \xff\r\n\r\n")
            status, _, _ = exchange(srv.port, raw)
            assert status == (200 if len(args) == 3 else 401)
    # the server's log was checked by Served: no traceback


def test_an_absolute_form_target_serves_the_snapshot(store: Path) -> None:
    with Served("--store", str(store)) as srv:
        raw = (f"GET http://127.0.0.1:{srv.port}/https://shop.example/old HTTP/1.1\r\n"
               "Host: 127.0.0.1\r\nConnection: close\r\n\r\n").encode()
        status, h, _ = exchange(srv.port, raw)
        assert status == 301 and h["location"] == "https://shop.example/new"


def test_every_answer_has_the_security_headers_and_pages_are_not_cached(
        pool: str, store: Path) -> None:
    with Served(pool, "--store", str(store)) as srv:
        answers = {
            "404": get(srv.port, "/no-such-page"),
            "405": get(srv.port, "/api/retry"),
            "page": get(srv.port, "/failures"),
            "api": get(srv.port, "/api/overview"),
            "400": get(srv.port, "/https://shop.example:99999/"),
        }
        _, h, _ = get(srv.port, "/")
        csrf = cookies(h)["lanes_csrf"]
        answers["413"] = get(srv.port, "/api/retry", {"Content-Type": FORM, "X-CSRF-Token": csrf,
                                                      "Cookie": f"lanes_csrf={csrf}"},
                             method="POST", body=b"row=0&" + b"x" * (1 << 21))
        for what, (status, headers, _) in answers.items():
            if what.isdigit():
                assert status == int(what), (what, status)
            for k, v in SECURITY_HEADERS.items():
                assert headers.get(k.lower()) == v, (what, k)
        # a request line aiohttp cannot parse is answered by aiohttp alone, before routing
        assert get(srv.port, "/https://bad host/")[0] == 400
        for what in ("page", "api", "404"):
            assert answers[what][1]["cache-control"] == "no-store", what
        status, h, _ = get(srv.port, f"/{GOOD}")
        assert status == 200 and "cache-control" not in h and "etag" in h


# -- time: headers, bodies, idle connections, connections per client ---------------------------

def test_slow_clients_are_cut_off_and_others_still_served(store: Path) -> None:
    with Served("--store", str(store), "--header-timeout", "1", "--idle-timeout", "2",
                "--body-timeout", "1", "--max-connections-per-client", "8") as srv:
        half = connect(srv.port, "127.0.0.2")
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # half its headers, never more
        trickle = connect(srv.port, "127.0.0.2")
        started = time.monotonic()
        closed_at = None
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaa\r\n\r\n":
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic() - started
                break
            time.sleep(0.2)
        assert closed_at is not None and closed_at < 4, closed_at
        trickle.close()
        status, _, body = read_answer(half)
        assert status == 408 and b"headers" in body
        half.close()
        # more connections than the cap: the extra ones are refused at once
        held = [connect(srv.port, "127.0.0.2") for _ in range(8)]
        status, h, _ = exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                "127.0.0.2")
        assert status == 429 and "retry-after" in h
        assert get(srv.port, "/healthz")[0] == 200  # another client is served meanwhile
        for s in held:
            s.close()
        # a body that never comes
        with connect(srv.port) as s:
            s.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                      b"Content-Type: application/x-www-form-urlencoded\r\n\r\ntoken=")
            status, _, body = read_answer(s, "POST")
            assert status == 408 and b"body" in body
        # an idle keep-alive connection is closed after --idle-timeout
        with connect(srv.port) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s)[0] == 200
            s.settimeout(10)
            started = time.monotonic()
            assert s.recv(100) == b""  # closed by the server
            assert 1.0 < time.monotonic() - started < 6
    # a trickled request was cut off while whole requests were answered


# -- guessing, tokens, sessions, proxies -------------------------------------------------------

def test_wrong_tokens_are_throttled_per_client(store: Path, token_file: Path) -> None:
    with Served("--store", str(store), "--token-file", str(token_file)) as srv:
        wrong = {"Authorization": "Bearer " + "w" * 40}
        statuses = [get(srv.port, "/metrics", wrong, "127.0.0.3")[0]
                    for _ in range(Throttle.FREE + 3)]
        assert statuses[:Throttle.FREE] == [401] * Throttle.FREE
        assert 429 in statuses[Throttle.FREE:], statuses
        status, h, _ = get(srv.port, "/metrics", {"Authorization": f"Bearer {TOKEN}"},
                           "127.0.0.3")
        assert status == 429 and int(h["retry-after"]) >= 1  # even the right one, for now
        started = time.monotonic()
        status, _, _ = get(srv.port, "/metrics", {"Authorization": f"Bearer {TOKEN}"},
                           "127.0.0.4")
        assert status == 200 and time.monotonic() - started < 2  # another client: not slowed
        for _ in range(Throttle.FREE + 1):  # the login form counts too
            _, h, _ = get(srv.port, "/login", source="127.0.0.5")
            csrf = cookies(h)["lanes_csrf"]
            status, _, _ = get(srv.port, "/login", {"Content-Type": FORM, "Cookie":
                                                    f"lanes_csrf={csrf}"}, "127.0.0.5", "POST",
                               urllib.parse.urlencode({"token": "x" * 40, "csrf": csrf}).encode())
        assert status == 429


def test_behind_a_trusted_proxy_the_client_and_scheme_are_its_word(
        pool: str, token_file: Path) -> None:
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}

    def login(port: int, headers: dict[str, str], source: str | None = None
              ) -> tuple[int, dict[str, str]]:
        _, h, _ = get(port, "/login", headers, source)
        csrf = cookies(h)["lanes_csrf"]
        status, h, _ = get(port, "/login", {**headers, "Content-Type": FORM, "Cookie":
                                            f"lanes_csrf={csrf}"}, source, "POST",
                           urllib.parse.urlencode({"token": TOKEN, "csrf": csrf}).encode())
        return status, h

    with Served(pool, "--token-file", str(token_file)) as srv:
        status, h = login(srv.port, proxied)
        assert status == 303 and "secure" not in h["set-cookie"].lower()  # not trusted: ignored
    with Served(pool, "--token-file", str(token_file), "--trust-proxy", "127.0.0.0/30",
                "--max-connections-per-client", "2") as srv:
        status, h = login(srv.port, proxied)
        assert status == 303 and "secure" in h["set-cookie"].lower()
        assert "secure" not in login(srv.port, {}, "127.0.0.1")[1]["set-cookie"].lower()
        # throttled by the client the proxy names, not the proxy
        wrong = {"Authorization": "Bearer " + "w" * 40}
        for _ in range(Throttle.FREE + 2):
            status, _, _ = get(srv.port, "/metrics", {**wrong, "X-Forwarded-For": "198.51.100.9"})
        assert status == 429
        ok = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "198.51.100.10"}
        assert get(srv.port, "/metrics", ok)[0] == 200
        # the trusted proxy is not held to the per-client connection cap
        held = [connect(srv.port) for _ in range(4)]
        assert get(srv.port, "/healthz")[0] == 200
        for s in held:
            s.close()
        # an untrusted peer's forwarded headers are not believed (127.0.0.5 is outside /30)
        for _ in range(Throttle.FREE + 2):
            status, _, _ = get(srv.port, "/metrics", {**wrong, "X-Forwarded-For": "192.0.2.1"},
                               "127.0.0.5")
        assert status == 429
        assert get(srv.port, "/metrics", {**ok, "X-Forwarded-For": "192.0.2.2"},
                   "127.0.0.5")[0] == 429


def test_logout_and_a_changed_token_file_end_sessions(pool: str, token_file: Path) -> None:
    with Served(pool, "--token-file", str(token_file), "--processes", "2") as srv:
        def session() -> str:
            _, h, _ = get(srv.port, "/login")
            csrf = cookies(h)["lanes_csrf"]
            _, h, _ = get(srv.port, "/login", {"Content-Type": FORM, "Cookie":
                                               f"lanes_csrf={csrf}"}, method="POST",
                          body=urllib.parse.urlencode({"token": TOKEN, "csrf": csrf}).encode())
            return f"lanes_session={cookies(h)['lanes_session']}; lanes_csrf={csrf}"

        jar = session()
        for _ in range(6):  # both processes (the kernel spreads connections) accept it
            assert get(srv.port, "/metrics", {"Cookie": jar})[0] == 200
        csrf = jar.rsplit("=", 1)[1]
        status, _, _ = get(srv.port, "/logout", {"Cookie": jar, "Content-Type": FORM},
                           method="POST", body=f"csrf={csrf}".encode())
        assert status == 303
        for _ in range(6):  # ended in every process, not only the one that logged it out
            assert get(srv.port, "/metrics", {"Cookie": jar})[0] == 401
        other = session()
        assert get(srv.port, "/metrics", {"Cookie": other})[0] == 200
        token_file.write_text("another-token-" + "z" * 40 + "\n")
        deadline = time.monotonic() + 10
        while get(srv.port, "/metrics", {"Cookie": other})[0] != 401:
            assert time.monotonic() < deadline, "the old session outlived its token"
            time.sleep(0.2)
        assert get(srv.port, "/metrics", {"Authorization": "Bearer another-token-" + "z" * 40}
                   )[0] == 200
        assert "every session has ended" in srv.log


def test_lanes_token_writes_a_private_random_token(tmp_path: Path) -> None:
    path = tmp_path / "tok"
    p = cli("token", str(path))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    token = path.read_text().strip()
    assert len(token) >= 43 and stat.S_IMODE(path.stat().st_mode) == 0o600
    p = cli("token", str(path))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--replace" in err and path.read_text().strip() == token
    p = cli("token", str(path), "--replace")
    assert p.wait(timeout=60) == 0 and path.read_text().strip() != token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["short", "fifo", "non-ascii"])
def test_a_bad_token_file_refuses_the_start_at_once(tmp_path: Path, store: Path,
                                                    kind: str) -> None:
    path = tmp_path / "tok"
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_text(("x" * (MIN_TOKEN - 1) if kind == "short" else "é" * 40) + "\n")
        path.chmod(0o600)
    p = cli("serve", "--store", str(store), "--port", "0", "--token-file", str(path))
    _, err = p.communicate(timeout=30)  # a FIFO once hung the start here
    assert p.returncode == 2
    assert {"short": "at least 32", "fifo": "not a regular file",
            "non-ascii": "ASCII"}[kind] in err


def test_a_store_made_in_an_existing_directory_is_private(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    SnapshotStore.open(d).close()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_sessions_and_csrf_tokens_refuse_odd_values_in_process() -> None:
    auth = Auth(TOKEN)
    good = auth.new_session()
    assert auth.valid_session(good)
    for value in [*(c.split("=", 1)[1] for c in ODD_COOKIES), good + "x", good[:-1],
                  "\udcff.\udcff.\udcff", None, ""]:
        assert not auth.valid_session(value) and not auth.valid_csrf(value)
    assert not auth.valid_token("\udcff" * 40) and auth.valid_token(TOKEN)


# -- any request at all ------------------------------------------------------------------------

METHODS = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "G\x00T",
                           "TRACE", "CONNECT", "get"])
TARGETS = st.one_of(
    st.sampled_from(["/", "/failures", "/api/overview", "/api/retry", "/api/policy", "/login",
                     "/logout", "/metrics", "/healthz", "/render?url=", "/url?url=", "/policy",
                     "/static/style.css", "/static/../../etc/passwd", "*", "/failures/retry"]),
    st.builds(lambda s: "/" + s, st.text(max_size=60)),
    st.builds(lambda s: "/https://" + s, st.text(max_size=80)),
    st.builds(lambda s: "/render?url=" + s, st.text(max_size=80)),
    st.builds(lambda s: "http://h/" + s, st.text(max_size=40)),
)
HEADER_NAMES = st.one_of(st.sampled_from(["Host", "Cookie", "Authorization", "X-CSRF-Token",
                                          "X-Prerender-Token", "Content-Type", "Accept",
                                          "Accept-Encoding", "If-None-Match", "X-Forwarded-For",
                                          "X-Forwarded-Proto", "Transfer-Encoding",
                                          "Content-Length", "Expect", "Connection", "Range"]),
                         st.text(min_size=1, max_size=20))
HEADER_VALUES = st.one_of(
    st.binary(max_size=80),
    st.sampled_from([b"lanes_session=9999999999.\xc3\xa9", b"lanes_csrf=a.\xc3\xa9", b"chunked",
                     b"Bearer \xff", b"-1", b"99999999999999999999", b"gzip;q=nan", b"*",
                     b"multipart/form-data; boundary=x", b"application/json", b"100-continue",
                     b"application/x-www-form-urlencoded", b"attacker.example", b"bytes=0-"]))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(METHODS)
    target = draw(TARGETS)
    headers = draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=8))
    body = draw(st.binary(max_size=200))
    head = f"{method} {target} HTTP/1.1\r\n".encode("utf-8", "surrogatepass")
    for name, value in headers:
        head += name.encode("utf-8", "surrogatepass") + b": " + value + b"\r\n"
    if body and not any(n.lower() in ("content-length", "transfer-encoding") for n, _ in headers):
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"Connection: close\r\n\r\n" + body


def hostile_property(srv: Served, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def any_request_gets_an_answer_under_500(data: bytes) -> None:
        try:
            status, _, _ = exchange(srv.port, data, timeout=15,
                                    method="HEAD" if data.startswith(b"HEAD ") else "GET")
        except TimeoutError:
            raise AssertionError(f"no answer within 15 s to {data!r}") from None
        except OSError:
            status = None  # closed without an answer (a request too broken to parse)
        assert status is None or status < 500, (status, data)
        assert get(srv.port, "/healthz")[0] == 200

    any_request_gets_an_answer_under_500()


@pytest.fixture(scope="module")
def hostile_server(pool: str, store: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Served]:
    f = tmp_path_factory.mktemp("hostile") / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    with Served(pool, "--store", str(store), "--token-file", str(f), "--header-timeout",
                "2", "--body-timeout", "2") as srv:
        yield srv


@pytest.mark.parametrize("tokened", [False, True])
def test_any_request_bytes_get_an_answer_under_500_and_log_no_traceback(
        pool: str, store: Path, hostile_server: Served, tokened: bool) -> None:
    if tokened:
        hostile_property(hostile_server, 120)
    else:
        with Served(pool, "--store", str(store), "--header-timeout", "2",
                    "--body-timeout", "2") as srv:
            hostile_property(srv, 120)
    assert "Traceback" not in hostile_server.log


@pytest.mark.slow
def test_any_request_bytes_long_form(pool: str, store: Path) -> None:
    with Served(pool, "--store", str(store), "--header-timeout", "2",
                "--body-timeout", "2") as srv:
        hostile_property(srv, 4000)
