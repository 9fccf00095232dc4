"""The second act of ``lanes demo``: the loop, with real renders.

A newcomer should see a page rendered in Chromium, served to a crawler, missed, discovered and
recached, not only a synthetic queue. So this act starts, all on loopback and in a temp dir:

* a small shop whose pages put their content in with JavaScript (:class:`_Shop`, a thread);
* ``lanes pool NAME --browser --store DIR`` over its pages (a process group of its own);
* ``lanes serve NAME --store DIR --discover``, whose dashboard address is printed;

then asks as Googlebot for a rendered page (the snapshot, with the content JavaScript put in),
for a page no sitemap listed (the shop's own answer; discovered, rendered, then a snapshot),
changes a price at the shop and posts a recache (the new price reaches the crawler, timed), and
stops everything. Without Chromium or the ``serve`` extra the act is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
PAGES = 6
PAGE = """<!doctype html><html><head><title>Product {i}</title></head><body>
<h1 id="name">Loading...</h1><p id="price"></p>
<script>setTimeout(() => {{ document.getElementById("name").textContent = "Widget {i}";
document.getElementById("price").textContent = "price: {price} EUR"; }}, 200);</script>
</body></html>"""


class _Shop(ThreadingHTTPServer):
    """The origin: ``/p/N`` for any N (a page whose name and price JavaScript puts in)."""

    daemon_threads = True
    prices: dict[int, int]


class _Page(BaseHTTPRequestHandler):
    server: _Shop

    def do_GET(self) -> None:  # noqa: N802
        m = re.fullmatch(r"/p/(\d{1,6})", self.path)
        if m is None:
            self.send_error(404)
            return
        i = int(m.group(1))
        body = PAGE.format(i=i, price=self.server.prices.get(i, 10 + i)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _lanes(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "engine", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _first_line(p: subprocess.Popen[str], what: str) -> str:
    """The first line ``p`` prints (what it says once it has started), the rest drained so a
    full pipe never stops it; a clear error if it exits first."""
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.strip():
        raise RuntimeError(f"{what} exited with status {p.wait()} before it started")
    threading.Thread(target=p.stdout.read, daemon=True).start()
    return line


def _stop(p: subprocess.Popen[str] | None) -> None:
    if p is None or p.poll() is not None:
        return
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _get(url: str, agent: str = GOOGLEBOT) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, headers={"User-Agent": agent})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def _until(what: str, cond: Any, timeout: float = 60.0) -> float:
    """Seconds until ``cond()`` held; RuntimeError naming ``what`` after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def _missing() -> str | None:
    """Why the act cannot run here, or None."""
    try:
        import aiohttp  # noqa: F401
        import jinja2  # noqa: F401
    except ImportError:
        return "it needs the serve extra (pip install 'render-lanes[serve]')"
    from .pool.browser import find_chromium

    if not os.access(find_chromium(), os.X_OK):
        return ("Chromium is not installed (apt-get install chromium-headless-shell): the"
                " loop renders in a real browser")
    return None


def run_loop(name: str) -> int:
    """The act; 0 when every step showed what it should."""
    why = _missing()
    if why is not None:
        print(f"\nThe loop (render, serve, discover, recache) is skipped: {why}.")
        return 0
    tmp = tempfile.mkdtemp(prefix="lanes-demo-")
    shop = _Shop(("127.0.0.1", 0), _Page)
    shop.prices = {}
    threading.Thread(target=shop.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    site = f"http://127.0.0.1:{shop.server_address[1]}"
    pool = serve = None
    try:
        corpus = os.path.join(tmp, "pages.csv")
        with open(corpus, "w") as f:
            f.write("url,interval_s,provenance\n")
            f.writelines(f"{site}/p/{i},3600,submitted\n" for i in range(PAGES))
        store = os.path.join(tmp, "store")
        print(f"\nThe loop, with real renders: a shop at {site} whose pages JavaScript fills"
              f" in, {PAGES} of them in a sitemap.")
        pool = _lanes("pool", name, "--corpus", corpus, "--browser", "--tabs", "2",
                      "--workers", "1", "--store", store, "--seconds", "600")
        _first_line(pool, "lanes pool")  # the queue is made: lanes serve NAME needs it
        serve = _lanes("serve", name, "--store", store, "--discover", "--port", "0")
        base = _first_line(serve, "lanes serve").split()[-1].rstrip("/")
        print(f"lanes serve: the dashboard at {base}/ while this act runs")
        took = _until("the first renders", lambda: _served(f"{base}/{site}/p/0", "Widget 0"))
        status, h, body = _get(f"{base}/{site}/p/0")
        print(f"  Googlebot asks for /p/0: {status}, {h.get('X-Lanes-Snapshot')}, Age"
              f" {h.get('Age')} s: {_text(body)!r} (rendered within {took:.1f} s)")
        status, h, body = _get(f"{base}/{site}/p/{PAGES + 1}")
        print(f"  Googlebot asks for /p/{PAGES + 1}, in no sitemap: {status} from the"
              f" {h.get('X-Lanes-Snapshot')} ({_text(body)!r}), never a 404; discovered...")
        took = _until("the discovered page", lambda: _served(f"{base}/{site}/p/{PAGES + 1}",
                                                             f"Widget {PAGES + 1}"))
        print(f"  ...rendered and served as a snapshot {took:.1f} s later:"
              f" {_text(_get(f'{base}/{site}/p/{PAGES + 1}')[2])!r}")
        shop.prices[1] = 99
        req = urllib.request.Request(f"{base}/recache", method="POST", data=json.dumps(
            {"prerenderToken": "", "url": f"{site}/p/1"}).encode(),
            headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=15) as r:
            answer = json.loads(r.read())
        _until("the recache", lambda: _served(f"{base}/{site}/p/1", "99 EUR"))
        print(f"  the shop changes /p/1's price to 99 and posts a recache ({answer['matched']}"
              f" page rushed): Googlebot gets the new price {time.monotonic() - t0:.1f} s"
              " later")
        return 0
    except (RuntimeError, OSError, ValueError) as e:
        print(f"  the loop stopped: {e}")
        return 1
    finally:
        _stop(serve)
        _stop(pool)
        shop.shutdown()
        shop.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


def _served(url: str, text: str) -> bool:
    """Whether ``url`` is answered with a snapshot whose text (scripts aside) holds ``text``."""
    _, headers, body = _get(url)
    return headers.get("X-Lanes-Snapshot") == "served" and text in _text(body)


def _text(html: str) -> str:
    """What a page says, tags dropped."""
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    return " ".join(text.split())[:80]
