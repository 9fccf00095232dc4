"""Two hosts in network namespaces (tests/lib/netns.py), each running a browser pool over one
Redis queue and a ``lanes serve``, both on one shared store (moto's S3 server and the
redis-server in the root namespace): every URL is served from both hosts with one digest,
whichever host rendered it."""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from netns import Hosts, unavailable
from redis_server import RedisServer, free_port
from s3_server import S3Server

from engine.store import StoreSpec, open_store
from engine.store.s3 import ObjectStore

LIB = str(Path(__file__).resolve().parent.parent / "lib")
PAGES = 8
needs_netns = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"<html><body><h1>page {self.path}</h1></body></html>".encode()
        self.send_response(200 if self.path.startswith("/p/") else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def lanes(hosts: Hosts, k: int, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": LIB + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(hosts.command(k, [sys.executable, "-m", "engine", *args]), env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def get(address: str, port: int, url: str, token: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(address, port, timeout=10)
    try:
        conn.request("GET", f"/render?url={urllib.parse.quote(url, safe='')}",
                     headers={"Authorization": f"Bearer {token}"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _out, err = proc.communicate()
    return err


@needs_netns
def test_every_url_is_served_from_both_hosts_with_one_digest(tmp_path: Path) -> None:
    with Hosts(2) as hosts:
        root = hosts.server_address(0)
        for k in range(2):  # each host reaches the root namespace's services over its link
            subprocess.run(["ip", "-n", hosts.names[k], "route", "add",
                            f"10.{hosts.net}.0.0/16", "dev", hosts.links[k] + "h"], check=True)
        site = ThreadingHTTPServer((root, 0), _Page)
        threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        urls = [f"http://{root}:{site.server_address[1]}/p/{i}" for i in range(PAGES)]
        corpus = tmp_path / "corpus.csv"
        corpus.write_text("url,interval_s,provenance\n"
                          + "".join(f"{u},3600,submitted\n" for u in urls))
        procs: list[subprocess.Popen[str]] = []
        with RedisServer(port=free_port(), extra=("--bind", "127.0.0.1", root,
                                                  "--protected-mode", "no")) as redis, \
                S3Server(host=root) as s3:
            redis_url = f"redis://{root}:{redis.port}"
            spec = StoreSpec(f"s3://{s3.bucket}/farm-{secrets.token_hex(4)}", s3.endpoint,
                             redis_url)
            queue = f"rl-farm-{secrets.token_hex(4)}"
            store_args = ("--store", spec.address, "--store-endpoint", s3.endpoint,
                          "--redis", redis_url)
            ports = [free_port() for _ in range(2)]
            token = tmp_path / "token"  # a server bound past loopback needs one
            os.close(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            token.write_text(secrets.token_hex(32) + "\n")
            try:
                for k in range(2):
                    procs.append(lanes(hosts, k, "pool", queue, "--corpus", str(corpus),
                                       "--browser", "--tabs", "2", "--workers", "1",
                                       "--local-name", f"{queue}-{k}", "--plain", "--grace",
                                       "5", *store_args))
                    procs.append(lanes(hosts, k, "serve", *store_args, "--host",
                                       hosts.address(k), "--port", str(ports[k]),
                                       "--token-file", str(token)))
                store = open_store(spec, create=False)
                assert isinstance(store, ObjectStore)
                deadline = time.monotonic() + 90
                while len(store.ages()) < PAGES:
                    dead = [p for p in procs if p.poll() is not None]
                    assert not dead, stop(dead[0])
                    assert time.monotonic() < deadline, "the pools did not render every page"
                    time.sleep(0.2)
                for url in urls:
                    answers = [get(hosts.address(k), ports[k], url, token.read_text().strip())
                               for k in range(2)]
                    assert [a[0] for a in answers] == [200, 200], answers
                    assert answers[0][2] == answers[1][2] and b"<h1>page /p/" in answers[0][2]
                    assert answers[0][1]["etag"] == answers[1][1]["etag"]
                    snap = store.get(url)
                    assert snap is not None and snap.hash == hashlib.sha256(snap.gz).hexdigest()
                    assert snap.hash[:24] in answers[0][1]["etag"]
                store.pointers.drop()
                store.close()
            finally:
                errors = [stop(p) for p in procs]
                site.shutdown()
                site.server_close()
            assert all(p.returncode == 0 for p in procs), errors
