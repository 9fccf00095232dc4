"""A local "real site" for the pool's end-to-end tests: a quiet stdlib HTTP server on 127.0.0.1.

The pool's politeness (``--per-host``, ``--delay-ms``) can only be judged from the site's side:
how many requests to one host were in flight at once, and when each started. This server
answers the paths it is given (200), 404s the rest and 500s the ones told to fail, after a
delay drawn per request from a seeded range, and counts, per ``Host`` header as the client sent
it, the requests in flight now and the most ever in flight. Addressing it as ``127.0.0.1`` and
as ``localhost`` (one port) gives two hosts, so a per-host cap is testable on one server::

    with SiteServer({"/a", "/b"}, delay_ms=(20, 200), seed=1) as site:
        fetch(site.url("127.0.0.1") + "/a"); fetch(site.url("localhost") + "/b")
        site.max_in_flight(site.host("localhost"))   # -> 1

Leaving the ``with`` block stops the server and joins every thread it started.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from http_testlib import LocalSite, SiteHttpServer


@dataclass(frozen=True)
class Request:
    """One request as the site saw it (times from ``time.monotonic()``)."""

    path: str
    host: str  # the Host header as sent ("127.0.0.1:<port>"), "" if none
    status: int
    start_s: float
    end_s: float
    delay_s: float = 0.0  # the delay drawn for it (slept before answering)


class SiteServer(LocalSite):
    """The site: ``paths`` exist (query strings ignored), ``failing`` answer 500, others 404."""

    def __init__(self, paths: Iterable[str], delay_ms: tuple[float, float] = (20, 200),
                 seed: int = 0, failing: Iterable[str] = ()) -> None:
        super().__init__()
        lo, hi = delay_ms
        if not 0 <= lo <= hi:
            raise ValueError(f"delay_ms must be (lo, hi) with 0 <= lo <= hi, not {delay_ms}")
        self.paths = frozenset(paths)
        self.failing = frozenset(failing)
        self.delay_ms = (lo, hi)
        self.seed = seed
        self._lock = threading.Lock()
        self._now: dict[str, int] = {}  # Host header -> requests in flight now
        self._max: dict[str, int] = {}  # Host header -> most ever in flight
        self._total_now = 0
        self._total_max = 0
        self._seen: dict[str, int] = {}  # path -> requests so far (the delay's seed)
        self._requests: list[Request] = []
        self.errors = 0  # connections that broke (a client gone mid-answer): counted, not logged

    def on_error(self) -> None:
        with self._lock:
            self.errors += 1

    # -- addressing ------------------------------------------------------------------------------

    def url(self, host_alias: str = "127.0.0.1") -> str:
        """The base URL (no trailing slash) under a name that resolves to 127.0.0.1."""
        return f"http://{host_alias}:{self.port}"

    def host(self, host_alias: str = "127.0.0.1") -> str:
        """The Host header a client sends for ``url(host_alias)``: the key of the counts."""
        return f"{host_alias}:{self.port}"

    # -- what it saw -----------------------------------------------------------------------------

    def in_flight(self, host: str | None = None) -> int:
        """Requests in flight now to ``host`` (a ``host()``), or to any host."""
        with self._lock:
            return self._total_now if host is None else self._now.get(host, 0)

    def max_in_flight(self, host: str | None = None) -> int:
        """The most requests ever in flight at once to ``host``, or to the whole site."""
        with self._lock:
            return self._total_max if host is None else self._max.get(host, 0)

    def requests(self) -> list[Request]:
        """Every finished request so far, in the order they finished."""
        with self._lock:
            return list(self._requests)

    def hosts(self) -> dict[str, int]:
        """Host header -> the most requests ever in flight to it."""
        with self._lock:
            return dict(self._max)

    # -- inside ----------------------------------------------------------------------------------

    def _begin(self, host: str, path: str) -> float:
        """Count the request in; its delay (s), drawn from the seed, the path and its count."""
        with self._lock:
            now = self._now[host] = self._now.get(host, 0) + 1
            self._max[host] = max(self._max.get(host, 0), now)
            self._total_now += 1
            self._total_max = max(self._total_max, self._total_now)
            n = self._seen[path] = self._seen.get(path, 0) + 1
        # Seeded per (path, n): the same draws whatever order the threads run in.
        return random.Random(f"{self.seed}:{path}:{n}").uniform(*self.delay_ms) / 1000

    def _end(self, request: Request) -> None:
        with self._lock:
            self._now[request.host] -= 1
            self._total_now -= 1
            self._requests.append(request)

    def _status(self, path: str) -> int:
        if path in self.failing:
            return 500
        return 200 if path in self.paths else 404


class _Handler(BaseHTTPRequestHandler):
    server: SiteHttpServer
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers at close

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        site = self.server.site
        host = self.headers.get("Host", "")
        path = urlsplit(self.path).path
        status = site._status(path)
        start = time.monotonic()
        delay = site._begin(host, path)
        ended = False
        try:
            time.sleep(delay)
            payload = f"<html><body>{path} {status}</body></html>\n".encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            # Counted out before the client can have the whole answer: one that sends its next
            # request on the last byte was counted twice in flight while this thread caught up.
            site._end(Request(path, host, status, start, time.monotonic(), delay))
            ended = True
            self.end_headers()
            if body:
                self.wfile.write(payload)
        finally:
            if not ended:
                site._end(Request(path, host, status, start, time.monotonic(), delay))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


SiteServer.handler = _Handler
