"""The shared snapshot store (S3 API + pointers in Redis) beside the local directory store.

    .venv/bin/python bench/bench_store.py [--smoke] [--out FILE]

Real parts, all on this machine: moto's S3 API server and a redis-server this script starts,
``lanes serve`` processes, wrk, and (for a render's wall time) a ``lanes pool --browser`` over
a local site. Figures:

* **hot req/s, shared ÷ local**: ``lanes serve --store s3://...`` and ``lanes serve --store
  DIR`` over the same PAGES pages, wrk with 32 connections, rounds alternating, the ratio taken
  per round (goal ≥ 0.8×);
* **cold fetch p99**: the first request for a page just rendered elsewhere (a put from this
  process, then one GET through the server: its pointer read and its blob fetched), per round;
* **upload cost per render**: a put into the shared store (gzip, hash, upload, pointer) of each
  page a real browser pool rendered, ÷ that render's wall time as the pool recorded it (goal
  ≤ 5 %), and the same for an unchanged render (nothing uploaded);
* **Redis bytes per URL**: ``MEMORY USAGE`` of the pointer hash ÷ its URLs (URL included);
* **served age ÷ TTL on one host** with 2 and 3 hosts rendering: one queue (shared memory, in
  virtual time) rendering every URL once per interval, each render done by a host drawn at
  random into its own directory store ("local") or into the one shared store ("shared");
  host 0's store read after every render. The model: N − 0.5 with local stores, 0.5 shared.

wrk, the servers and the stores share the machine's cores (and other work on it), so the
figures are ratios of runs taken side by side in one run; ranges are over the rounds.
"""

from __future__ import annotations

import hashlib
import http.client
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from bench_serve import Unavailable, page, run_wrk, wrk_script
from common import ROOT, figure, finish, on_exit, parse_args, ratios, skipped

sys.path.insert(0, str(ROOT / "tests" / "lib"))
from redis_server import RedisServer  # noqa: E402
from s3_server import S3Server  # noqa: E402

import engine  # noqa: E402
from engine.store import SnapshotStore, StoreSpec, open_store  # noqa: E402
from engine.store.s3 import ObjectStore  # noqa: E402

FULL = {"pages": 200, "runs": 3, "seconds": 8.0, "warmup": 2.0, "cold": 100, "renders": 12,
        "pointers": 10_000, "urls": 20, "intervals": 40, "seeds": 3}
SMOKE = {"pages": 10, "runs": 1, "seconds": 1.0, "warmup": 0.0, "cold": 5, "renders": 0,
         "pointers": 200, "urls": 4, "intervals": 8, "seeds": 1}
"""Smoke sizes (CI): no browser render (its wall time is measured at full size only)."""
META: dict[str, Any] = {"status": 200, "location": None, "interval_s": 3600, "lane": 1,
                        "render_ms": 100.0}


class Serve:
    """``lanes serve`` over one store, started and stopped."""

    def __init__(self, *store_args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", *store_args,
                                      "--port", "0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("lanes serve:"):
            self.stop()
            raise Unavailable(f"lanes serve did not start: {line}")
        self.base = line.split()[-1].rstrip("/")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.communicate(timeout=30)


def get_ms(base: str, url: str) -> float:
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        t = time.perf_counter()
        conn.request("GET", f"/{url}", headers={"Accept-Encoding": "gzip"})
        r = conn.getresponse()
        r.read()
        spent = (time.perf_counter() - t) * 1000
        if r.status != 200:
            raise Unavailable(f"{url}: {r.status}")
        return spent
    finally:
        conn.close()


def hot_and_cold(cfg: dict[str, Any], local: SnapshotStore, shared: ObjectStore,
                 tmp: Path) -> list[dict[str, Any]]:
    urls = [f"https://bench.example/p/{i}" for i in range(cfg["pages"])]
    for i, url in enumerate(urls):
        for store in (local, shared):
            store.put(url, page(i), **META)
    servers = {"local": Serve("--store", local.address),
               "shared": Serve("--store", shared.address, "--store-endpoint",
                               str(shared.spec.endpoint), "--redis", str(shared.spec.redis))}
    try:
        script = tmp / "paths.lua"
        wrk_script(script, [f"/{u}" for u in urls])
        rps: dict[str, list[float]] = {k: [] for k in servers}
        cold: dict[str, list[float]] = {k: [] for k in servers}
        for run in range(cfg["runs"]):
            for kind, server in servers.items():
                if cfg["warmup"]:
                    run_wrk(server.base, script, cfg["warmup"])
                rps[kind].append(run_wrk(server.base, script, cfg["seconds"])[0])
            for kind, server in servers.items():  # a page rendered elsewhere, then its first hit
                store = local if kind == "local" else shared
                spent = []
                for i in range(cfg["cold"]):
                    url = f"https://bench.example/cold/{run}/{i}"
                    store.put(url, page(10_000 + i), **META)
                    spent.append(get_ms(server.base, url))
                cold[kind].append(float(np.percentile(spent, 99)))
    finally:
        for server in servers.values():
            server.stop()
    return [
        figure("store.hot_rps.local", f"hot snapshot req/s, local store ({cfg['pages']} pages)",
               "req/s", rps["local"], better="higher"),
        figure("store.hot_rps.shared", "hot snapshot req/s, shared store", "req/s",
               rps["shared"], better="higher"),
        figure("store.hot_rps.shared_over_local", "hot snapshot req/s, shared ÷ local", "x",
               ratios(rps["shared"], rps["local"]), better="higher", note="goal: >= 0.8x"),
        figure("store.cold_p99_ms.shared", "cold fetch p99 (first hit after a render"
               " elsewhere), shared store", "ms", cold["shared"]),
        figure("store.cold_p99_ms.local", "cold fetch p99, local store", "ms", cold["local"]),
    ]


class _Site(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = page(int(self.path.rpartition("/")[2] or 0)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def rendered(cfg: dict[str, Any], tmp: Path) -> list[tuple[str, bytes, float]]:
    """``(url, html, render wall ms)`` of pages a real ``lanes pool --browser`` rendered."""
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{site.server_address[1]}/p/{i}" for i in range(cfg["renders"])]
    corpus = tmp / "corpus.csv"
    corpus.write_text("url,interval_s,provenance\n" + "".join(f"{u},3600,submitted\n"
                                                              for u in urls))
    directory = tmp / "rendered"
    name = f"bench-store-{secrets.token_hex(4)}"
    pool = subprocess.Popen([sys.executable, "-m", "engine", "pool", name, "--corpus",
                             str(corpus), "--browser", "--tabs", "1", "--workers", "1",
                             "--store", str(directory), "--plain", "--grace", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with SnapshotStore.open(directory) as s:
                if len(s.ages()) >= len(urls):
                    break
            if pool.poll() is not None or time.monotonic() > deadline:
                raise Unavailable(f"the browser pool did not render: {pool.communicate()[1]}")
            time.sleep(0.3)
    finally:
        if pool.poll() is None:
            pool.send_signal(signal.SIGTERM)
            pool.communicate(timeout=60)
        site.shutdown()
        site.server_close()
    with SnapshotStore.open(directory) as s:
        out = []
        for url in urls:
            snap = s.get(url)
            assert snap is not None
            out.append((url, snap.html(), snap.render_ms))
    return out


def upload_cost(cfg: dict[str, Any], tmp: Path, spec: StoreSpec) -> list[dict[str, Any]]:
    if not cfg["renders"]:
        return [skipped("store.upload_over_render", "upload cost ÷ render wall time",
                        "smoke: the browser render is measured at full size (make bench)")]
    try:
        pages = rendered(cfg, tmp)
    except (Unavailable, OSError) as e:
        return [skipped("store.upload_over_render", "upload cost ÷ render wall time", str(e))]
    written, unchanged, renders = [], [], []
    with open_store(spec) as shared:
        for url, html, render_ms in pages:
            t = time.perf_counter()
            assert shared.put(url, html, **META) == "written"
            written.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            assert shared.put(url, html, **META) == "unchanged"
            unchanged.append((time.perf_counter() - t) * 1000)
            renders.append(render_ms)
    return [
        figure("store.render_ms", "a render's wall time (headless Chromium, lanes pool)", "ms",
               renders),
        figure("store.put_ms.shared", "a put into the shared store (gzip, hash, upload,"
               " pointer)", "ms", written),
        figure("store.upload_over_render", "upload cost ÷ the render's wall time", "x",
               ratios(written, renders), note="goal: <= 0.05"),
        figure("store.unchanged_over_render", "an unchanged render's put ÷ its wall time"
               " (nothing uploaded)", "x", ratios(unchanged, renders)),
    ]


def pointer_bytes(cfg: dict[str, Any], shared: ObjectStore) -> dict[str, Any]:
    """Pointers written as a put writes them (the blob's upload left out: it is S3's)."""
    n = cfg["pointers"]
    digest = hashlib.sha256(b"x").hexdigest()
    now = int(time.time() * 1000)
    for i in range(n):
        shared.pointers.write(f"https://shop.example/product/{i:07d}", digest, True,
                              (now, 200, None, 86_400, 3, 40_960, 9_812, 812.5))
    used, held = shared.pointers.memory()
    assert held == n
    return figure("store.redis_bytes_per_url", f"Redis bytes per URL for the pointers ({n:,}"
                  " URLs of 36 characters, URL included)", "bytes", [used / n])


def served_age(cfg: dict[str, Any], hosts: int, shared: bool, seed: int, tmp: Path,
               spec: StoreSpec) -> float:
    """Mean age ÷ TTL of what host 0's store holds, read after every render past a warm-up:
    one queue renders every URL once an interval (virtual time), each render by a host drawn
    at random, into its own store or the shared one."""
    rng = random.Random(seed)
    k, interval = cfg["urls"], 3600
    step_ms = interval * 1000 // k
    name = f"bench-age-{secrets.token_hex(4)}"
    eng = engine.open(name, create=True, capacity=k + 16)
    stores = ([open_store(spec)] if shared else
              [SnapshotStore.open(tmp / f"{name}-host{h}") for h in range(hosts)])
    try:
        urls = [f"https://shop.example/p/{i}" for i in range(k)]
        rows = eng.add_many(np.arange(k, dtype=np.int64) * step_ms + step_ms, np.full(k, interval),
                            "submitted")
        seen, now = [], 0
        # A host's copy is as old as the time since that host last drew the URL: the longest
        # gaps are the rarest, so local stores need a long run (the shared store does not).
        intervals = cfg["intervals"] if not shared else max(4, cfg["intervals"] // 4)
        for tick in range(intervals * k):
            now = (tick + 1) * step_ms
            batch = eng.claim(budget=1, now_ms=now)
            for c in batch:
                host = rng.randrange(hosts)
                store = stores[0] if shared else stores[host]
                i = int(np.flatnonzero(rows == c.row)[0])
                store.put(urls[i], f"<p>{urls[i]} at {now}</p>", rendered_at_ms=now, **META)
                eng.complete(c.row, c.token, now_ms=now)
            if tick >= intervals * k // 4:  # past the warm-up (host 0 holds nearly every URL)
                _ids, _lanes, ratio = stores[0].ratios(now)
                seen.append(float(ratio.mean()))
        return statistics.fmean(seen)
    finally:
        for s in stores:
            if isinstance(s, ObjectStore):
                s.pointers.drop()
            s.close()
        eng.unlink()


def staleness(cfg: dict[str, Any], tmp: Path, make_spec: Any) -> list[dict[str, Any]]:
    out = []
    for hosts in (2, 3):
        for shared in (False, True):
            values = [served_age(cfg, hosts, shared, seed, tmp, make_spec())
                      for seed in range(cfg["seeds"])]
            kind = "shared" if shared else "local"
            model = 0.5 if shared else hosts - 0.5
            out.append(figure(f"store.age_over_ttl.h{hosts}.{kind}", f"served age ÷ TTL on one"
                              f" host, {hosts} hosts rendering, {kind} store{'s' * (not shared)}"
                              f" (model {model})", "x", values, note=f"model: {model}"))
    return out


def main() -> None:
    args = parse_args(__doc__)
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
    if shutil.which("wrk") is None:
        finish("bench_store", args, [skipped("store.hot_rps.shared_over_local", "hot req/s",
                                             "wrk is not installed (apt-get install wrk)")],
               started)
        return
    with RedisServer(prefix="rl-bench-") as redis, S3Server(bucket="lanes-bench") as s3:
        def make_spec() -> StoreSpec:
            return StoreSpec(f"s3://lanes-bench/b-{secrets.token_hex(4)}", s3.endpoint,
                             redis.url)

        figures: list[dict[str, Any]] = []
        with SnapshotStore.open(tmp / "local") as local, open_store(make_spec()) as shared:
            assert isinstance(shared, ObjectStore)
            try:
                figures += hot_and_cold(cfg, local, shared, tmp)
            except Unavailable as e:
                figures.append(skipped("store.hot_rps.shared_over_local", "hot req/s", str(e)))
            shared.pointers.drop()
        figures += upload_cost(cfg, tmp, make_spec())
        with open_store(make_spec()) as shared:
            assert isinstance(shared, ObjectStore)
            figures.append(pointer_bytes(cfg, shared))
            shared.pointers.drop()
        figures += staleness(cfg, tmp, make_spec)
    finish("bench_store", args, figures, started)


if __name__ == "__main__":
    main()
