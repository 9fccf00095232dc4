"""`lanes serve` beside nginx serving the same snapshot files: req/s and p99 with wrk.

    .venv/bin/python bench/bench_serve.py [--smoke] [--out FILE] [--runs N] [--seconds S]

Same snapshots, same client, same run: a store of PAGES snapshots (HTML of about 40 KB each,
gzipped in the store as rendered pages are), and wrk (Debian's) with 32 connections asking for
them in turn with ``Accept-Encoding: gzip``, so both servers send the stored gzip as it is.

* ``lanes serve --store DIR`` answers ``GET /{URL}`` (the prerender-style route) with one
  process and with ``--processes 2`` (SO_REUSEPORT);
* a bare aiohttp handler sending the same bytes from memory (the floor of any aiohttp server:
  what `lanes serve` adds is the distance to it);
* nginx (Debian's), started by this script with its own config in a temp dir, serves the same
  files by path (``Content-Encoding: gzip`` added, access log off, sendfile on) with one worker
  and with two. It does less than ``lanes serve`` per request (no URL lookup, no Age, no hit
  log): it is the ceiling of "send these bytes".

Systems run alternated, RUNS rounds, each round WARMUP seconds then SECONDS measured; medians
and ranges over the rounds. wrk runs on the same 2 cores as the server, so every figure is
"server and client on one small machine". Every server is checked (status, encoding, bytes)
before it is measured, and stopped and removed afterwards, also on Ctrl-C; a server or client
that cannot run here is reported as skipped with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import figure, finish, on_exit, parse_args, ratios, skipped

from engine.store import SnapshotStore

FULL = {"pages": 1000, "runs": 3, "seconds": 10.0, "warmup": 2.0}
SMOKE = {"pages": 50, "runs": 1, "seconds": 1.0, "warmup": 1.0}
CONNECTIONS = 32
HTML_KB = 40
WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt"
         " ut labore et dolore magna aliqua shoes boots size price stock colour").split()


class Unavailable(Exception):
    """A server or the client cannot run here; the message says why."""


def page(i: int) -> str:
    rng = random.Random(i)
    items = "".join(f"<li class=\"item\"><a href=\"/p/{rng.randrange(10**6)}\">"
                    + " ".join(rng.choice(WORDS) for _ in range(12)) + "</a></li>"
                    for _ in range(HTML_KB * 1024 // 110))
    return (f"<!doctype html><html><head><title>Product {i}</title></head><body><h1>Product"
            f" {i}</h1><ul>{items}</ul></body></html>")


def fill_store(directory: Path, pages: int) -> list[tuple[str, str]]:
    """``(url, path of its file under snapshots/)`` of every page stored."""
    out = []
    with SnapshotStore.open(directory) as store:
        for i in range(pages):
            url = f"https://bench.example/p/{i}"
            store.put(url, page(i), status=200, location=None, interval_s=3600, lane=1,
                      render_ms=100.0)
            snap = store.get(url)
            assert snap is not None
            out.append((url, os.path.relpath(snap.path, store.files)))
    return out


def wrk_script(path: Path, paths: list[str]) -> None:
    listed = ",".join(f'"{p}"' for p in paths)
    path.write_text(f"""paths = {{{listed}}}
i = math.random(#paths)
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i], {{["Accept-Encoding"] = "gzip"}})
end
""")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def run_wrk(base: str, script: Path, seconds: float) -> tuple[float, float]:
    """(requests/s, p99 ms) of one wrk run; Unavailable if any answer was not 2xx/3xx."""
    out = subprocess.run(["wrk", "-t2", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s",
                          "--latency",
                          "-s", str(script), base], capture_output=True, text=True,
                         timeout=seconds + 60)
    if out.returncode != 0:
        raise Unavailable(f"wrk failed: {(out.stderr + out.stdout).strip()[:200]}")
    if "Non-2xx or 3xx" in out.stdout or "Socket errors" in out.stdout:
        raise Unavailable("errors during the run: " + " ".join(
            line.strip() for line in out.stdout.splitlines()
            if "Non-2xx" in line or "Socket errors" in line))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1))  # type: ignore
    value, unit = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", out.stdout).groups()  # type: ignore
    return rps, float(value) * _UNITS[unit]


class Server:
    """A server under test: ``start()`` returns its base URL; ``paths`` its request paths."""

    name: str
    label: str
    paths: list[str]

    def start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class LanesServe(Server):
    def __init__(self, store: Path, pages: list[tuple[str, str]], processes: int,
                 source: Path | None = None) -> None:
        self.store, self.processes, self.source = store, processes, source
        self.name = f"lanes_p{processes}" + ("_before" if source else "")
        self.label = (f"lanes serve, {processes} process{'es' if processes > 1 else ''}"
                      + (f" (from {source})" if source else ""))
        self.paths = [f"/{url}" for url, _ in pages]
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        env = dict(os.environ)
        if self.source is not None:  # another tree of the package, with its built core
            env["PYTHONPATH"] = str(self.source)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--store", str(self.store), "--port", "0",
             *(["--processes", str(self.processes)] if self.processes > 1 else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env=env, cwd=self.source)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("lanes serve:"):
            self.stop()
            raise Unavailable(f"lanes serve did not start: {line}")
        return line.split()[-1].rstrip("/")

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        self.proc = None


FLOOR = """
import sys
from aiohttp import web

bodies = {}

async def send(request):
    # the least an aiohttp handler can do: look the bytes up and send them
    return web.Response(body=bodies[request.path], headers={
        "Content-Encoding": "gzip", "Content-Type": "text/html; charset=utf-8"})

for line in open(sys.argv[1]):
    path, file = line.rstrip("\\n").split(" ", 1)
    bodies[path] = open(file, "rb").read()
app = web.Application()
app.router.add_get("/{tail:.*}", send)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
"""


class AiohttpFloor(Server):
    """A bare aiohttp handler sending the same bytes from memory: what any aiohttp server
    costs per request, so the distance between it and `lanes serve` is what `lanes serve`
    itself costs."""

    def __init__(self, store: Path, pages: list[tuple[str, str]], tmp: Path) -> None:
        self.name, self.label = "aiohttp_floor", "bare aiohttp handler, 1 process"
        self.paths = [f"/{url}" for url, _ in pages]
        self.index = tmp / "floor.txt"
        self.index.write_text("".join(f"{p} {store / 'snapshots' / rel}\n"
                                      for p, (_, rel) in zip(self.paths, pages, strict=True)))
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", FLOOR, str(self.index), str(port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        _wait_until_up(base + self.paths[0], self.proc, "the aiohttp floor")
        return base

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        self.proc = None


NGINX_CONF = """worker_processes {workers};
{user}
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        default_type text/html;
        location / {{ add_header Content-Encoding gzip; add_header Vary Accept-Encoding; }}
    }}
}}
"""


class Nginx(Server):
    def __init__(self, store: Path, pages: list[tuple[str, str]], workers: int,
                 tmp: Path) -> None:
        self.store, self.workers, self.tmp = store, workers, tmp / f"nginx{workers}"
        self.name = f"nginx_w{workers}"
        self.label = f"nginx, {workers} worker{'s' if workers > 1 else ''}"
        self.paths = [f"/{rel}" for _, rel in pages]
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise Unavailable("nginx is not installed (apt-get install nginx)")
        self.tmp.mkdir(exist_ok=True)
        port = _free_port()
        conf = self.tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(
            workers=self.workers, tmp=self.tmp, port=port, root=self.store / "snapshots",
            user="user root;" if os.geteuid() == 0 else ""))  # the store is 0700, root's
        self.proc = subprocess.Popen([nginx, "-p", str(self.tmp), "-c", str(conf), "-e",
                                      str(self.tmp / "error.log")], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        _wait_until_up(base + self.paths[0], self.proc, "nginx")
        return base

    def stop(self) -> None:
        _stop(self.proc, signal.SIGQUIT)  # graceful: workers finish, master exits
        self.proc = None


def _stop(proc: subprocess.Popen[str] | None, sig: int) -> None:
    """Stop a server started in its own session: ``sig``, then SIGKILL to its whole group."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_up(url: str, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"{what} exited: {proc.communicate()[1].strip()[:300]}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise Unavailable(f"{what} did not answer within 20 s")


FILL_BEFORE = """
import gzip, json, sys
from engine.store import SnapshotStore
with SnapshotStore.open(sys.argv[1]) as store:
    for url, path in json.load(open(sys.argv[2])):
        store.put(url, gzip.decompress(open(path, "rb").read()), status=200, location=None,
                  interval_s=3600, lane=1, render_ms=100.0)
"""


def check(base: str, server: Server, store: Path, pages: list[tuple[str, str]]) -> None:
    """Both servers send the stored gzip, byte for byte, with status 200."""
    for (_, rel), path in list(zip(pages, server.paths, strict=True))[:3]:
        req = urllib.request.Request(base + path, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            if r.status != 200 or r.headers.get("Content-Encoding") != "gzip":
                raise Unavailable(f"{server.label}: {r.status}, {r.headers}")
        want = (store / "snapshots" / rel).read_bytes()
        if hashlib.sha256(body).digest() != hashlib.sha256(want).digest():
            raise Unavailable(f"{server.label} sent other bytes than the stored file")


def main() -> None:
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--runs", type=int), ap.add_argument("--seconds", type=float),
        ap.add_argument("--before", type=Path, metavar="DIR",
                        help="also run `lanes serve` (1 process) from this copy of the package"
                             " (a tree holding engine/ with its built core): a before/after in"
                             " the same run"),
        ap.add_argument("--systems", nargs="+", metavar="NAME",
                        help="run only these (lanes_p1, lanes_p1_before, aiohttp_floor,"
                             " nginx_w1, lanes_p2, nginx_w2)")))
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    cfg["runs"] = args.runs or cfg["runs"]
    cfg["seconds"] = args.seconds or cfg["seconds"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
    store = tmp / "store"
    pages = fill_store(store, cfg["pages"])
    servers: list[Server] = [LanesServe(store, pages, 1), AiohttpFloor(store, pages, tmp),
                             Nginx(store, pages, 1, tmp), LanesServe(store, pages, 2),
                             Nginx(store, pages, 2, tmp)]
    if args.before is not None:
        # The other tree writes its own store (its schema may be another version) with the same
        # pages, read back from this store's files: the same files by the same names.
        before_store = tmp / "store-before"
        listing = tmp / "pages.json"
        listing.write_text(json.dumps([[url, str(store / "snapshots" / rel)]
                                       for url, rel in pages]))
        subprocess.run([sys.executable, "-c", FILL_BEFORE, str(before_store), str(listing)],
                       check=True, cwd=args.before.resolve(),
                       env={**os.environ, "PYTHONPATH": str(args.before.resolve())})
        servers.insert(1, LanesServe(before_store, pages, 1, args.before.resolve()))
    if args.systems:
        servers = [s for s in servers if s.name in args.systems]
    for s in servers:
        on_exit(s.stop)
    results: dict[str, dict[str, list[float]]] = {s.name: {"rps": [], "p99": []}
                                                  for s in servers}
    broken: dict[str, str] = {}
    if shutil.which("wrk") is None:
        broken = {s.name: "wrk is not installed (apt-get install wrk)" for s in servers}
    for _round in range(cfg["runs"]):
        for s in servers:
            if s.name in broken:
                continue
            try:
                base = s.start()
                try:
                    check(base, s, store, pages)
                    script = tmp / f"{s.name}.lua"
                    wrk_script(script, s.paths)
                    run_wrk(base, script, cfg["warmup"])
                    rps, p99 = run_wrk(base, script, cfg["seconds"])
                finally:
                    s.stop()
            except Unavailable as e:
                broken[s.name] = str(e)
                continue
            results[s.name]["rps"].append(rps)
            results[s.name]["p99"].append(p99)
            print(f"  {s.label}: {rps:,.0f} req/s, p99 {p99:.2f} ms", flush=True)
    finish("bench_serve", args, figures(servers, results, broken, cfg), started)


def figures(servers: list[Server], results: dict[str, dict[str, list[float]]],
            broken: dict[str, str], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    note = (f"{CONNECTIONS} connections, {cfg['pages']} snapshots of ~{HTML_KB} KB HTML sent"
            f" gzipped, {cfg['seconds']} s per run")
    out = []
    for s in servers:
        if s.name in broken:
            out.append(skipped(f"serve.rps.{s.name}", f"{s.label}: req/s", broken[s.name]))
            continue
        r = results[s.name]
        out.append(figure(f"serve.rps.{s.name}", f"{s.label}: req/s", "req/s", r["rps"],
                          better="higher", note=note))
        out.append(figure(f"serve.p99_ms.{s.name}", f"{s.label}: p99", "ms", r["p99"],
                          note=note))
    for lanes, nginx in (("lanes_p1", "nginx_w1"), ("lanes_p2", "nginx_w2"),
                         ("lanes_p1", "aiohttp_floor"), ("lanes_p1", "lanes_p1_before")):
        a, b = results.get(lanes, {}).get("rps", []), results.get(nginx, {}).get("rps", [])
        if a and b:
            out.append(figure(f"serve.ratio_rps.{lanes}_over_{nginx}",
                              f"req/s, {lanes} / {nginx} (same rounds)", "x", ratios(a, b),
                              better="higher"))
    return out


if __name__ == "__main__":
    main()
