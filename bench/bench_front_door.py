"""`lanes serve` under hostile traffic: memory after floods, slowloris, a normal client meanwhile.

    .venv/bin/python bench/bench_front_door.py [--smoke] [--out FILE] [--runs N]

Each part starts a fresh `lanes serve --store DIR` (one process, the defaults an operator gets)
and reads its RSS from /proc (psutil):

* **bad URLs**: BAD distinct ~8 KB URLs that are no URL (``/https://flood.example:99999/<i>/a…``,
  each a 400) on keep-alive connections; RSS after ÷ RSS at start (goal: ≤ start + 32 MiB);
* **decompressed answers**: BIG pages of 20 MB of HTML (a few tens of KB gzipped) fetched by
  a client that takes no gzip, each one twice; RSS after ≤ the answer budget (64 MiB) + 32 MiB
  over RSS at start;
* **slowloris**: SLOW connections from 127.0.0.2 that send half their headers and then one
  byte a second; the time until the server has closed every one of them (goal ≤ 15 s) and,
  meanwhile, a normal client on 127.0.0.1 asking for a snapshot every 20 ms: its p99
  (goal ≤ 50 ms).

The snapshot req/s with the front door in place against the tree before it is
``bench_serve.py --before DIR`` (same run, same client).
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import figure, finish, on_exit, parse_args

from engine.store import SnapshotStore

FULL = {"bad": 100_000, "big": 20, "slow": 1000, "runs": 3}
SMOKE = {"bad": 2_000, "big": 3, "slow": 100, "runs": 1}
MIB = 1 << 20
GOOD = "https://bench.example/p/1"


def start(store: Path) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--store", str(store),
                          "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, start_new_session=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("lanes serve:"):
        p.kill()
        raise SystemExit(f"lanes serve did not start: {line}")
    return p, int(line.rstrip().rstrip("/").rsplit(":", 1)[1])


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def rss(p: subprocess.Popen[str]) -> float:
    return float(psutil.Process(p.pid).memory_info().rss)


def read_one(s: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One answer off a keep-alive connection (Content-Length framed): status and body."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        chunk = s.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    buf[:] = rest[length:]
    return int(head.split(b" ", 2)[1]), rest[:length]


def bad_urls(store: Path, n: int) -> tuple[float, float]:
    p, port = start(store)
    try:
        before = rss(p)
        tail = "a" * 8000
        buf = bytearray()
        s = socket.create_connection(("127.0.0.1", port))
        for i in range(n):
            if i % 1000 == 0:  # a new connection now and then, as many clients would
                s.close()
                s = socket.create_connection(("127.0.0.1", port))
                buf.clear()
            s.sendall(f"GET /https://flood.example:99999/{i}/{tail} HTTP/1.1\r\nHost: x\r\n\r\n"
                      .encode())
            status, _ = read_one(s, buf)
            assert status == 400, status
        s.close()
        return before, rss(p)
    finally:
        stop(p)


def big_answers(store: Path, urls: list[str]) -> tuple[float, float]:
    p, port = start(store)
    try:
        before = rss(p)
        buf = bytearray()
        with socket.create_connection(("127.0.0.1", port)) as s:
            for url in urls * 2:
                s.sendall(f"GET /{url} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n"
                          .encode())
                status, body = read_one(s, buf)
                assert status == 200 and len(body) >= 20 * 10**6, (status, len(body))
        return before, rss(p)
    finally:
        stop(p)


def slowloris(store: Path, n: int) -> tuple[float, list[float], int]:
    """(seconds until every slow connection was closed, a normal client's latencies in ms,
    slow connections the server refused at once)."""
    p, port = start(store)
    sel = selectors.DefaultSelector()
    try:
        slow = []
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            slow.append(s)
        started = time.monotonic()
        for s in slow:
            sel.register(s, selectors.EVENT_READ)
        time.sleep(0.2)
        for s in slow:
            try:
                s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass
        open_ = set(slow)
        refused = 0
        latencies: list[float] = []
        next_byte = time.monotonic() + 1
        next_probe = time.monotonic()
        while open_ and time.monotonic() - started < 60:
            for key, _ in sel.select(timeout=0.01):
                s = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(4096)  # type: ignore[attr-defined]
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 429"):
                    refused += 1
                if not data or data.startswith(b"HTTP/1.1"):
                    sel.unregister(s)
                    s.close()  # type: ignore[attr-defined]
                    open_.discard(s)  # type: ignore[arg-type]
            now = time.monotonic()
            if now >= next_byte:
                for s in list(open_):
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
                next_byte = now + 1
            if now >= next_probe:
                t = time.perf_counter()
                with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                    c.sendall(f"GET /{GOOD} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Accept-Encoding: gzip\r\n\r\n".encode())
                    status, _ = read_one(c, bytearray())
                assert status == 200
                latencies.append((time.perf_counter() - t) * 1000)
                next_probe = now + 0.02
        took = time.monotonic() - started
        for s in open_:
            s.close()
        return (took if not open_ else float("inf")), latencies, refused
    finally:
        sel.close()
        stop(p)


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--runs", type=int))
    started = time.perf_counter()
    cfg = dict(SMOKE if args.smoke else FULL)
    runs = args.runs or cfg["runs"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-door-"))
    on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True))
    store = tmp / "store"
    big = "<p>" + "lanes serve " * (20 * 10**6 // 12 + 1) + "</p>"
    urls = [f"https://bench.example/big/{i}" for i in range(cfg["big"])]
    with SnapshotStore.open(store) as s:
        s.put(GOOD, "<p>good</p>", status=200, location=None, interval_s=3600, lane=1,
              render_ms=1.0)
        for u in urls:
            s.put(u, big, status=200, location=None, interval_s=3600, lane=1, render_ms=1.0)
    del big
    out: dict[str, list[float]] = {k: [] for k in ("bad_mib", "big_mib", "slow_s", "p99",
                                                      "p50", "refused")}
    for r in range(runs):
        before, after = bad_urls(store, cfg["bad"])
        out["bad_mib"].append((after - before) / MIB)
        before, after = big_answers(store, urls)
        out["big_mib"].append((after - before) / MIB)
        took, lat, refused = slowloris(store, cfg["slow"])
        out["slow_s"].append(took)
        out["p99"].append(statistics.quantiles(lat, n=100)[98] if len(lat) >= 2 else lat[0])
        out["p50"].append(statistics.median(lat))
        out["refused"].append(refused)
        print(f"  run {r + 1}: bad URLs +{out['bad_mib'][-1]:.1f} MiB, big answers"
              f" +{out['big_mib'][-1]:.1f} MiB, slowloris closed in {took:.1f} s"
              f" ({refused} refused at once), normal p99 {out['p99'][-1]:.1f} ms", flush=True)
    n = f"{cfg['bad']:,} distinct 8 KB bad URLs"
    finish("bench_front_door", args, [
        figure("door.bad_urls_rss_growth_mib", f"RSS growth after {n}", "MiB", out["bad_mib"],
               note="goal <= 32 MiB"),
        figure("door.big_answers_rss_growth_mib", f"RSS growth after {2 * cfg['big']}"
               " decompressed 20 MB answers", "MiB", out["big_mib"],
               note="goal <= 64 MiB (the answer budget) + 32 MiB"),
        figure("door.slowloris_all_closed_s", f"{cfg['slow']:,} slowloris connections: all"
               " closed after", "s", out["slow_s"], note="goal <= 15 s"),
        figure("door.slowloris_normal_p99_ms", "a normal request meanwhile: p99", "ms",
               out["p99"], note="goal <= 50 ms"),
        figure("door.slowloris_normal_p50_ms", "a normal request meanwhile: p50", "ms",
               out["p50"]),
        figure("door.slowloris_refused_at_once", "slowloris connections refused at once"
               " (per-client cap)", "connections", out["refused"]),
    ], started)


if __name__ == "__main__":
    if os.geteuid() != 0 and sys.platform != "linux":
        raise SystemExit("needs Linux (127.0.0.2 as a second loopback client)")
    main()
