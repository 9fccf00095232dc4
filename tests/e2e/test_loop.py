"""The loop end to end, with real parts: a local JavaScript site behind real nginx (its own bot
map, ``nginx.conf.in``) and behind the stock prerender-node middleware in an Express app
(``node/app.js``, no hooks); ``lanes pool NAME --browser --store`` renders the site's pages
through both front doors in headless Chromium and ``lanes serve NAME --store --discover``
answers the crawlers. Through each front door:

* a crawler gets the snapshot, with the content JavaScript inserted; a person gets the site;
* a page never rendered gets the origin's own answer (never a 404), is discovered, rendered,
  then served as a snapshot;
* after ``clear-and-wait`` the crawler gets the origin's answer at once (and the normal cadence
  refills the snapshot);
* after the site changes a page, a CMS-style ``POST /recache`` (prerender.io's API) brings the
  new content to the crawler: how long that took is printed (docs/serve.md quotes it).

Nothing is left running: nginx, node, the pool and its browsers, the server are stopped in
``finally`` blocks and the pool's processes are looked for afterwards.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser_testlib import PoolRun, stored, write_corpus
from front_door_testlib import Served
from lanes_testlib import unique_name
from pool_testlib import files_of
from render_site import SiteServer

HERE = Path(__file__).resolve().parent
NODE_APP = HERE / "node"
TOKEN = "e2e-loop-token-0123456789-abcdefghijklmnop"
GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
GPTBOT = ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; "
          "+https://openai.com/gptbot)")
PERSON = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
CORPUS = ("/js/1", "/js/2")  # rendered from the start; /js/5 is found by discovery
ROUNDS = 3  # recaches timed


class Site(SiteServer):
    """The JavaScript site, whose pages' fetched word (``/api/N``, inserted by the page's
    script) the test can change, as an editor publishing a page would."""

    def __init__(self) -> None:
        super().__init__()
        self.words: dict[str, str] = {}

    def page(self, path: str) -> tuple[int, str, dict[str, str]]:
        status, body, headers = super().page(path)
        head, _, n = path.lstrip("/").partition("/")
        if head == "api" and n in self.words:
            body = body.replace('"fetched"', json.dumps(self.words[n]))
        return status, body, headers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds until ``cond`` held (polled every 50 ms)."""
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop(p: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@contextlib.contextmanager
def nginx(workdir: Path, origin: int, lanes: int) -> Iterator[int]:
    """nginx with ``nginx.conf.in`` on a free port; its port."""
    port = free_port()
    workdir.mkdir()
    conf = (HERE / "nginx.conf.in").read_text()
    for key, value in (("@DIR@", str(workdir)), ("@LISTEN@", f"127.0.0.1:{port}"),
                       ("@ORIGIN@", f"127.0.0.1:{origin}"), ("@LANES@", f"127.0.0.1:{lanes}"),
                       ("@TOKEN@", TOKEN)):
        conf = conf.replace(key, value)
    (workdir / "nginx.conf").write_text(conf)
    p = subprocess.Popen([shutil.which("nginx") or "nginx", "-p", str(workdir), "-e", "stderr",
                          "-c", str(workdir / "nginx.conf")], text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until("nginx", lambda: listening(port) or p.poll() is not None)
        assert p.poll() is None, p.communicate()[1]
        yield port
    finally:
        code = stop(p, signal.SIGQUIT)  # graceful: the master waits for its worker
        err = p.communicate()[1]
        assert code == 0, err
        assert "[emerg]" not in err and "[alert]" not in err, err


@contextlib.contextmanager
def express(origin: int, lanes: int) -> Iterator[int]:
    """``node node/app.js``: prerender-node pointed at lanes serve, the site behind; its port."""
    if not (NODE_APP / "node_modules" / "prerender-node").is_dir():
        pytest.fail(f"no node_modules in {NODE_APP}: `make tools` runs npm install there")
    env = {**os.environ, "PRERENDER_SERVICE_URL": f"http://127.0.0.1:{lanes}/",
           "ORIGIN": f"http://127.0.0.1:{origin}", "PRERENDER_TOKEN": TOKEN, "PORT": "0"}
    p = subprocess.Popen([shutil.which("node") or "node", "app.js"], cwd=NODE_APP, env=env,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("listening on "), line + p.communicate(timeout=5)[1]
        yield int(line.split()[-1])
    finally:
        code = stop(p)
        err = p.communicate()[1]
        assert code == 0, err


def fetch(url: str, agent: str, token: str | None = None, host: str | None = None
          ) -> tuple[int, dict[str, str], str]:
    """GET ``url`` as ``agent`` (with ``Host: host`` when given): status, headers (names
    lowercased), body."""
    parts = urlsplit(url)
    c = http.client.HTTPConnection(parts.netloc, timeout=30)
    headers = {"User-Agent": agent, "Accept": "text/html", "Host": host or parts.netloc}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        c.request("GET", parts.path, headers=headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        c.close()


def post(port: int, path: str, body: object, token: str | None = None) -> dict[str, object]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        c.request("POST", path, body=json.dumps(body), headers=headers)
        r = c.getresponse()
        answer = r.read().decode()
        assert r.status == 200, (r.status, answer)
        out: dict[str, object] = json.loads(answer)
        return out
    finally:
        c.close()


def snapshot_of(url: str, agent: str = GOOGLEBOT) -> str | None:
    """The body of a snapshot served for ``url``, or None when something else answered."""
    status, headers, body = fetch(url, agent)
    return body if status == 200 and headers.get("x-lanes-snapshot") == "served" else None


def until_served(url: str, content: str, timeout: float = 30.0) -> float:
    """Seconds until a crawler asking for ``url`` gets a snapshot whose JavaScript inserted
    ``content``."""
    marker = f'<div id="content">{content}</div>'
    return wait_until(f"{marker} served for {url}",
                      lambda: marker in (snapshot_of(url) or ""), timeout)


def is_the_site(answer: tuple[int, dict[str, str], str], n: int) -> bool:
    """The site's own page ``/js/n``: its HTML as sent, the script not run."""
    status, _, body = answer
    return status == 200 and f"<h1>static {n}</h1>" in body and '<div id="content">' not in body


def check_the_loop(front: str, b: str, lanes: int) -> None:
    """Through the front door at ``b``: snapshot to crawlers, the site to people, a miss
    relayed then discovered and served, a clear answered by the origin at once."""
    # a crawler gets the snapshot, with what JavaScript inserted; a person the site
    for agent in (GOOGLEBOT, GPTBOT):
        body = snapshot_of(b + "/js/1", agent)
        assert body is not None and '<div id="content">JS content 1: fetched</div>' in body, \
            (front, agent)
    answer = fetch(b + "/js/1", PERSON)
    assert is_the_site(answer, 1) and "x-lanes-snapshot" not in answer[1], front

    # never rendered: the origin's answer (relayed by lanes serve, not nginx's fall back),
    # then discovered, rendered and served
    status, headers, body = answer = fetch(b + "/js/5", GOOGLEBOT)
    assert is_the_site(answer, 5) and headers["x-lanes-snapshot"] == "origin", (
        front, status, body)
    took = until_served(b + "/js/5", "JS content 5: fetched")
    print(f"{front}: a missed page served as a snapshot {took:.2f} s after the miss")

    # clear-and-wait: the origin answers at once, the normal cadence refills it
    out = post(lanes, "/api/prioritize", {"url": b + "/js/2", "mode": "clear-and-wait"}, TOKEN)
    assert out["cleared"] == 1 and out["matched"] == 1, out
    assert is_the_site(fetch(b + "/js/2", GOOGLEBOT), 2), front
    until_served(b + "/js/2", "JS content 2: fetched")


def time_recaches(site: Site, base: dict[str, str], lanes: int, store: Path) -> None:
    """The site changes page 1 and its CMS asks for a recache, as it would of prerender.io,
    ``ROUNDS`` times: the seconds until each front door's crawler gets the new content."""
    took_s: dict[str, list[float]] = {front: [] for front in base}
    render_ms: list[float] = []
    pages = [b + "/js/1" for b in base.values()]
    for edition in range(1, ROUNDS + 1):
        old = site.words.get("1", "fetched")
        site.words["1"] = new = f"edition {edition}"
        assert all(f"JS content 1: {old}" in (snapshot_of(u) or "") for u in pages)  # until
        asked = time.monotonic()
        out = post(lanes, "/recache", {"prerenderToken": TOKEN, "urls": pages})
        assert out["matched"] == 2 and out["mode"] == "rush", out
        for front, b in base.items():
            until_served(b + "/js/1", f"JS content 1: {new}")
            took_s[front].append(time.monotonic() - asked)
        render_ms.extend(snap.render_ms for snap in stored(store, pages).values())
    for front, took in took_s.items():
        print(f"{front}: POST /recache of 2 pages to the new content served to the crawler: "
              f"median {statistics.median(took):.2f} s, [{min(took):.2f} .. {max(took):.2f}] "
              f"over {ROUNDS} rounds: " + " ".join(f"{t:.2f}" for t in took))
    print(f"a render of the page: median {statistics.median(render_ms):.0f} ms, "
          f"[{min(render_ms):.0f} .. {max(render_ms):.0f}]")


def test_the_loop_through_nginx_and_prerender_node(tmp_path: Path) -> None:
    started = time.monotonic()
    store = tmp_path / "store"
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    lanes = free_port()
    with contextlib.ExitStack() as stack:
        site = stack.enter_context(Site())
        fronts = {"nginx": stack.enter_context(nginx(tmp_path / "nginx", site.port, lanes)),
                  "prerender-node": stack.enter_context(express(site.port, lanes))}
        base = {k: f"http://127.0.0.1:{port}" for k, port in fronts.items()}
        urls = [b + p for b in base.values() for p in CORPUS]
        pool = stack.enter_context(PoolRun(unique_name(), write_corpus(
            tmp_path / "corpus.csv", urls), store))
        pool.wait_until(lambda: len(stored(store, urls)) == len(urls), 60)
        with Served(pool.name, "--store", str(store), "--discover", "--token-file", str(token),
                    port=lanes) as srv:
            print(f"\nset up in {time.monotonic() - started:.1f} s")
            for front, b in base.items():
                check_the_loop(front, b, srv.port)
            # nginx's own rule: a host lanes serve does not render (404 missing) gets the site
            answer = fetch(base["nginx"] + "/js/3", GOOGLEBOT,
                           host=f"localhost:{fronts['nginx']}")
            assert is_the_site(answer, 3) and "x-lanes-snapshot" not in answer[1], answer
            time_recaches(site, base, srv.port, store)
            metrics = fetch(f"http://127.0.0.1:{srv.port}/metrics", PERSON, token=TOKEN)[2]
            assert 'lanes_serve_discovery_total{outcome="added"} 2' in metrics, metrics
        # lanes serve stopped: nginx's fall back gives crawlers the site; prerender-node passes
        # the connection error to Express (next(err)), whose default handler answers 500: "come
        # back later", never "gone"
        answer = fetch(base["nginx"] + "/js/1", GOOGLEBOT)
        assert is_the_site(answer, 1) and "x-lanes-snapshot" not in answer[1], answer
        status, _, body = fetch(base["prerender-node"] + "/js/1", GOOGLEBOT)
        assert status == 500 and "ECONNREFUSED" in body, (status, body)
    assert not pool.left_behind(), "the pool left processes behind"
    assert pool.proc.returncode == 0, pool.stderr()[-4000:]
    assert files_of(pool.name) == []  # its segment and the files beside it: removed
    print(f"the whole run: {time.monotonic() - started:.1f} s")
