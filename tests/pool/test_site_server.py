"""The local site of the pool's end-to-end tests (tests/lib/site_server.py) tells the truth: it
answers what exists, 404s the rest, counts requests in flight per Host header exactly, and
leaves no thread or open port behind."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from site_server import SiteServer

# No proxy from the environment: the site is on this machine.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def test_it_serves_existing_paths_and_404s_the_rest() -> None:
    with SiteServer({"/a", "/b/c"}, delay_ms=(20, 40), failing={"/broken"}) as site:
        base, host = site.url(), site.host()
        assert fetch(base + "/a")[0] == 200
        status, body = fetch(base + "/b/c?x=1")  # the query is not part of the path
        assert status == 200 and b"/b/c" in body
        assert fetch(base + "/nope")[0] == 404
        assert fetch(base + "/broken")[0] == 500
        seen = site.requests()
    assert [(r.path, r.status) for r in seen] == [
        ("/a", 200), ("/b/c", 200), ("/nope", 404), ("/broken", 500)]
    assert {r.host for r in seen} == {host}
    assert all(0.02 <= r.delay_s <= 0.04 for r in seen)  # drawn from the range
    assert all(r.end_s - r.start_s >= r.delay_s for r in seen)  # and served
    assert site.errors == 0


def test_it_counts_requests_in_flight_per_host_under_concurrent_clients() -> None:
    per_host = 4
    with SiteServer({"/p"}, delay_ms=(300, 400), seed=7) as site:
        start = threading.Barrier(2 * per_host)
        statuses: list[int] = []

        def client(alias: str) -> None:
            start.wait(30)
            statuses.append(fetch(site.url(alias) + "/p")[0])

        threads = [threading.Thread(target=client, args=(alias,))
                   for alias in ("127.0.0.1", "localhost") for _ in range(per_host)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hosts = (site.host("127.0.0.1"), site.host("localhost"))
        assert statuses == [200] * 2 * per_host
        assert site.hosts() == dict.fromkeys(hosts, per_host)  # two hosts on one port
        assert site.max_in_flight() == 2 * per_host
        assert site.in_flight() == 0 and site.in_flight(hosts[0]) == 0
        assert sorted(r.host for r in site.requests()) == sorted(hosts * per_host)


def test_requests_one_after_another_are_never_counted_as_overlapping() -> None:
    with SiteServer({"/p"}, delay_ms=(5, 10)) as site:
        for _ in range(5):
            assert fetch(site.url("localhost") + "/p")[0] == 200
        assert site.max_in_flight(site.host("localhost")) == 1
        assert site.max_in_flight(site.host("127.0.0.1")) == 0


def test_the_delays_are_drawn_from_the_seed() -> None:
    def durations(seed: int) -> list[float]:
        with SiteServer({"/p"}, delay_ms=(10, 150), seed=seed) as site:
            for _ in range(4):
                fetch(site.url() + "/p")
        # read after the close, which joins the request threads: each has logged its request
        seen = site.requests()
        assert all(r.end_s - r.start_s >= r.delay_s for r in seen)  # each delay was served
        return [r.delay_s for r in seen]

    a, b = durations(3), durations(3)
    assert a == b and len(a) == 4 and all(0.01 <= x <= 0.15 for x in a)
    assert durations(4) != a  # another seed, other delays


def test_it_shuts_down_cleanly_leaving_no_thread_and_no_listener() -> None:
    before = set(threading.enumerate())
    site = SiteServer({"/a"}, delay_ms=(50, 60))
    with site:
        base = site.url()
        # A request in hand at shutdown is finished, not cut off.
        t = threading.Thread(target=lambda: fetch(base + "/a"))
        t.start()
        while site.in_flight() == 0:
            threading.Event().wait(0.005)
    t.join()
    assert set(threading.enumerate()) == before
    assert [r.status for r in site.requests()] == [200]
    site.close()  # twice is fine
    with pytest.raises(urllib.error.URLError):
        fetch(base + "/a")
    with pytest.raises(RuntimeError):
        site.url()
