"""A site that serves sitemaps, for the tests of sitemaps over HTTP: a stdlib server on
127.0.0.1 whose answers the test sets (and changes while a pool runs), including the ways a
real site fails: a 500, a redirect loop, an endpoint that never answers, a body that never
ends, a gzip bomb::

    with SitemapServer() as site:
        site.put("/sitemap.xml", urlset_text)                 # plain
        site.put("/posts.xml.gz", gzip.compress(data))        # a .gz file
        site.put("/pages.xml", data, gzip_encoding=True)     # Content-Encoding: gzip
        site.hang("/slow.xml"); site.endless("/big.xml"); site.drip("/trickle.xml")
        read_corpus(site.url("/sitemap.xml"))

Leaving the ``with`` block releases every waiting answer, stops the server and joins every
thread it started.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from http_testlib import LocalSite, SiteHttpServer

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(*urls: str) -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{SITEMAP_NS}">\n'
            + "".join(f"  <url><loc>{u}</loc></url>\n" for u in urls) + "</urlset>\n")


def sitemapindex(*locs: str) -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{SITEMAP_NS}">\n'
            + "".join(f"  <sitemap><loc>{u}</loc></sitemap>\n" for u in locs)
            + "</sitemapindex>\n")


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the answer
    mode: str = "whole"  # "whole", "hang" (never answers), "endless" (a body that never
    # ends), "drip" (a byte every 0.2 s: each read is quick, the whole never comes)


class SitemapServer(LocalSite):
    """Answers what ``put`` and friends set (404 for the rest); counts requests per path."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._answers: dict[str, Answer] = {}
        self._hits: dict[str, int] = {}

    # -- what it serves --------------------------------------------------------------------------

    def put(self, path: str, body: str | bytes, *, status: int = 200, gzip_encoding: bool = False,
            headers: dict[str, str] | None = None, delay_s: float = 0.0) -> None:
        data = body.encode() if isinstance(body, str) else body
        extra = dict(headers or {})
        if gzip_encoding:
            data = gzip.compress(data)
            extra["Content-Encoding"] = "gzip"
        with self._lock:
            self._answers[path] = Answer(status, data, extra, delay_s=delay_s)

    def redirect(self, path: str, to: str, status: int = 302) -> None:
        with self._lock:
            self._answers[path] = Answer(status, b"", {"Location": to})

    def hang(self, path: str) -> None:
        """Accept the request and never answer (until the server closes)."""
        with self._lock:
            self._answers[path] = Answer(mode="hang")

    def endless(self, path: str) -> None:
        """200 with no Content-Length and a body that never ends."""
        with self._lock:
            self._answers[path] = Answer(mode="endless")

    def drip(self, path: str) -> None:
        """200, then the body a byte every 0.2 s, for ever (until the server closes)."""
        with self._lock:
            self._answers[path] = Answer(mode="drip")

    def remove(self, path: str) -> None:
        with self._lock:
            self._answers.pop(path, None)

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits.get(path, 0)

    def _take(self, path: str) -> Answer | None:
        with self._lock:
            self._hits[path] = self._hits.get(path, 0) + 1
            return self._answers.get(path)

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


class _Handler(BaseHTTPRequestHandler):
    server: SiteHttpServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        site = self.server.site
        answer = site._take(urlsplit(self.path).path)
        if answer is None:
            answer = Answer(404, b"not here\n")
        if answer.mode == "hang":
            site.closing.wait()
            return
        if site.closing.wait(answer.delay_s):
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/xml")
        for k, v in answer.headers.items():
            self.send_header(k, v)
        if answer.mode == "drip":
            self.end_headers()
            self.wfile.write(b"<")
            while not site.closing.wait(0.2):
                self.wfile.write(b" ")
                self.wfile.flush()
            return
        if answer.mode == "endless":
            self.end_headers()
            chunk = b"<!-- " + b"x" * 65_000 + b" -->\n"
            while not site.closing.is_set():
                self.wfile.write(chunk)  # BrokenPipeError once the client has had enough
            return
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


SitemapServer.handler = _Handler
