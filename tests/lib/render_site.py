"""A local site of JavaScript pages for the browser render's tests and benchmark (stdlib HTTP on
127.0.0.1, a free port). Each page stands for one case a real render farm meets:

``/js/N``        content inserted by JavaScript after a fetch (``/api/N``) and a timer, a JSON-LD
                 block, an inline script, an image (blocked by default: ``/img/N.png`` counted)
``/ready/N``     ``window.prerenderReady`` false until a timer, with a request still open when it
                 turns true (so only the flag can make it ready)
``/meta404``     ``<meta name="prerender-status-code" content="404">``
``/redirect``    a 301 to ``/js/9``
``/hang``        a fetch that is never answered
``/busy``        a busy loop after DOMContentLoaded
``/crash``       allocates until its tab's renderer dies
``/slow/N``      content inserted after ``delay_ms`` (the benchmark's 300 ms pages)
``/gone``        a plain 404
``/probe``       what a page's JavaScript can tell of its browser, written into the DOM as JSON
                 (``<pre id="probe">``): where Chromium's headless shell and full Chromium differ
``/product/N``   a shop's product page: "Loading…" until its price comes from ``/price/N``, then
                 ``#price`` and a description; while N is in ``broken_prices`` that API answers
                 500 and the page stays a "Loading…" shell (what a content check must catch)
``/late``        ``#late`` inserted 1.5 s after load with no request open (only a ``wait_for``
                 waits for it)
``/echo``        the request headers its document came with (``<pre id="sent">``), and what its
                 JavaScript sees of the User-Agent and cookies (``<pre id="seen">``)

``SiteServer.headers_of(path)`` gives the headers of the last request for a path.

``SiteServer.hits(path)`` counts the requests for a path; leaving the ``with`` block stops the
server, answers what was left hanging and joins every thread.
"""

from __future__ import annotations

import html
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from http_testlib import LocalSite, SiteHttpServer

JSON_LD = '{"@context": "https://schema.org", "@type": "Product", "name": "Widget N"}'

_JS_PAGE = """<!doctype html>
<html><head><title>page {n}</title>
<script type="application/ld+json">{ld}</script>
<script>
document.addEventListener('DOMContentLoaded', () => {{
  fetch('/api/{n}').then(r => r.json()).then(data => setTimeout(() => {{
    const div = document.createElement('div');
    div.id = 'content';
    div.textContent = 'JS content ' + data.n + ': ' + data.word;
    document.body.appendChild(div);
  }}, 100));
}});
</script></head>
<body><h1>static {n}</h1><img src="/img/{n}.png"></body></html>
"""

_READY_PAGE = """<!doctype html>
<html><head><script>
window.prerenderReady = false;
fetch('/never');  // open for ever: only the flag can make this page ready
setTimeout(() => {{
  document.body.insertAdjacentHTML('beforeend', '<p id="ready">ready {n}</p>');
  window.prerenderReady = true;
}}, 300);
</script></head><body></body></html>
"""

_META_404 = """<!doctype html><html><head>
<meta name="prerender-status-code" content="404"></head>
<body><p>no such product</p></body></html>"""

_HANG = """<!doctype html><html><body><script>
fetch('/never').then(r => r.text());
</script><p>waiting</p></body></html>"""

_BUSY = """<!doctype html><html><body><p>busy</p><script>
document.addEventListener('DOMContentLoaded', () => setTimeout(() => {{ for (;;) {{}} }}, 50));
</script></body></html>"""

_CRASH = """<!doctype html><html><body><p>allocating</p><script>
const keep = [];
for (;;) keep.push(new Array(1 << 20).fill(keep.length + 0.5));  // until the renderer dies
</script></body></html>"""

_SLOW = """<!doctype html><html><head><script>
setTimeout(() => {{
  document.body.insertAdjacentHTML('beforeend', '<p id="content">slow {n} done</p>');
}}, {delay});
</script></head><body><h1>slow {n}</h1></body></html>"""

# Each fact is one a site could branch on (user-agent sniffing, a responsive layout, a
# "real browser" check). The page waits for nothing: it is ready at once. Not the outer window
# size nor document.hasFocus(): on full Chromium the one, on either binary the other, changes
# from run to run. It has a phone's viewport tag, as a mobile site has (a desktop ignores it).
_PROBE = """<!doctype html><html><head>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><pre id="probe"></pre><script>
document.getElementById('probe').textContent = JSON.stringify({{
  userAgent: navigator.userAgent, platform: navigator.platform, languages: navigator.languages,
  webdriver: navigator.webdriver, cores: navigator.hardwareConcurrency,
  plugins: navigator.plugins.length, mimeTypes: navigator.mimeTypes.length,
  windowChrome: typeof window.chrome,
  visibility: document.visibilityState, innerWidth: innerWidth, innerHeight: innerHeight,
  screen: [screen.width, screen.height],
  devicePixelRatio: devicePixelRatio, timeZone: Intl.DateTimeFormat().resolvedOptions().timeZone,
  coarsePointer: matchMedia('(pointer: coarse)').matches,
  hover: matchMedia('(hover: hover)').matches,
  dark: matchMedia('(prefers-color-scheme: dark)').matches,
  notification: typeof Notification === 'undefined' ? null : Notification.permission,
}});
</script></body></html>"""


_PRODUCT = """<!doctype html><html><head><title>product {n}</title><script>
document.addEventListener('DOMContentLoaded', () => {{
  fetch('/price/{n}')
    .then(r => {{ if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); }})
    .then(p => {{
      document.getElementById('status').remove();
      document.body.insertAdjacentHTML('beforeend', '<span id="price">' + p.price + ' EUR</span>'
        + '<p id="description">' + 'Widget {n}, hand made, sturdy and light. '.repeat(8) + '</p>');
    }}).catch(() => {{}});  // as many shops do: the spinner stays
}});
</script></head><body><h1>product {n}</h1><div id="status">Loading…</div></body></html>"""

_LATE = """<!doctype html><html><body><p>early</p><script>
setTimeout(() => document.body.insertAdjacentHTML('beforeend', '<p id="late">late</p>'), 1500);
</script></body></html>"""

_ECHO = """<!doctype html><html><body><pre id="sent">{sent}</pre><pre id="seen"></pre><script>
fetch('/api/7').then(() => {{
  document.getElementById('seen').textContent = JSON.stringify(
    {{userAgent: navigator.userAgent, cookies: document.cookie}});
}});
</script></body></html>"""


class SiteServer(LocalSite):
    """The site above on a free loopback port."""

    def __init__(self, delay_ms: int = 300) -> None:
        super().__init__()
        self.delay_ms = delay_ms
        self._lock = threading.Lock()
        self._hits: Counter[str] = Counter()
        self._headers: dict[str, dict[str, str]] = {}
        self.broken_prices: set[int] = set()

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits[path]

    def headers_of(self, path: str) -> dict[str, str]:
        """The headers of the last request for ``path`` (names lowercased)."""
        with self._lock:
            return dict(self._headers.get(path, {}))

    def _count(self, path: str, headers: dict[str, str]) -> None:
        with self._lock:
            self._hits[path] += 1
            self._headers[path] = headers

    def page(self, path: str) -> tuple[int, str, dict[str, str]]:
        """(status, body, extra headers) for ``path``."""
        head, _, tail = path.lstrip("/").partition("/")
        if head == "product" and tail.isdigit():
            return 200, _PRODUCT.format(n=tail), {}
        if head == "price" and tail.isdigit():
            if int(tail) in self.broken_prices:
                return 500, '{"error": "backend down"}', {"Content-Type": "application/json"}
            return 200, f'{{"price": {int(tail) + 0.99}}}', {"Content-Type": "application/json"}
        if head == "echo" and not tail:
            sent = html.escape(json.dumps(self.headers_of("/echo"), sort_keys=True))
            return 200, _ECHO.format(sent=sent), {}
        if head == "js" and tail.isdigit():
            return 200, _JS_PAGE.format(n=tail, ld=JSON_LD), {}
        if head == "ready" and tail.isdigit():
            return 200, _READY_PAGE.format(n=tail), {}
        if head == "slow" and tail.isdigit():
            return 200, _SLOW.format(n=tail, delay=self.delay_ms), {}
        if head == "api" and tail.isdigit():
            return 200, f'{{"n": {tail}, "word": "fetched"}}', {"Content-Type": "application/json"}
        fixed = {"meta404": _META_404, "hang": _HANG, "busy": _BUSY.format(), "late": _LATE,
                 "crash": _CRASH.format(), "probe": _PROBE.format()}
        if head in fixed and not tail:
            return 200, fixed[head], {}
        if head == "redirect":
            return 301, "", {"Location": "/js/9"}
        return 404, "<html><body>not found</body></html>", {}


class _Handler(BaseHTTPRequestHandler):
    server: SiteHttpServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        site = self.server.site
        path = urlsplit(self.path).path
        site._count(path, {k.lower(): v for k, v in self.headers.items()})
        if path == "/never":
            site.closing.wait(300)  # never answered while the site runs
            return
        status, body, headers = site.page(path)
        payload = body.encode()
        self.send_response(status)
        headers.setdefault("Content-Type", "text/html; charset=utf-8")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


SiteServer.handler = _Handler
