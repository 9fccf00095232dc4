"""What the dashboard costs: its API's answer time on a big pool, and a page left open.

One pool (``lanes pool``, 2 workers, a render that burns ~2 ms of CPU, so the workers compete
with the server for the machine's cores) over a corpus of ``rows`` URLs, all due, and one
``lanes serve`` over it. In that one run:

* the API's answer time: ``GET /api/overview`` (the live table and next due per lane, a row
  export shared by every viewer at most every few seconds) and ``GET /api/failures``, one
  request every 100 ms, p50 / p95 / max; beside it what one ``lanes stats NAME --json`` costs
  (the process, wall time) and one ``pool_report`` inside a process (the same figures, no
  start-up);
* the pool's renders per second in windows with the overview open in Chromium (it asks for
  its live part every second and for the charts every five) and without it, alternated, so
  both see the same machine, with the server's own CPU in each window: medians and ranges.

    .venv/bin/python bench/bench_dashboard.py [--smoke] [--out FILE] [--rows N]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, figure, finish, on_exit, parse_args

from engine import Engine
from engine.errors import SegmentMissing
from engine.pool.board import Board
from engine.report.view import pool_report

FULL = {"rows": 1_000_000, "requests": 300, "window_s": 10.0, "rounds": 5}
SMOKE = {"rows": 20_000, "requests": 20, "window_s": 2.0, "rounds": 1}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def busy(url: str, claim: Any) -> None:
    """A render that takes ~2 ms of CPU (the pool's workers import it by name); one URL in a
    hundred fails, so the failure list is long."""
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    if url.endswith("00"):
        raise RuntimeError(f"{url}: upstream timed out")


def _lanes(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT)])}
    return subprocess.Popen([sys.executable, "-m", "engine", *args], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, **kw)


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(cond: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def _board_up(name: str) -> bool:
    try:
        Board.attach(name).close()
        return True
    except SegmentMissing:
        return False


@contextlib.contextmanager
def pool_and_server(rows: int, tmp: Path) -> Iterator[tuple[str, str, int]]:
    """A pool over ``rows`` due URLs and a dashboard over it."""
    name = f"rl-bench-dash-{os.getpid()}"
    csv = tmp / "corpus.csv"
    with open(csv, "w") as f:
        f.write("url,interval_s,provenance\n")
        for i in range(rows):
            f.write(f"https://shop.example/p/{i},{3600 if i % 3 else 86400},"
                    f"{'submitted' if i % 4 else 'discovered'}\n")
    routes = tmp / "routes.toml"
    routes.write_text('[[route]]\nname = "even"\nregex = ".*[02468]"\ninterval = "1h"\n\n'
                      '[[route]]\nname = "products"\nmatch = "https://shop.example/p/*"\n'
                      'interval = "1d"\n')
    pool = _lanes("pool", name, "--corpus", str(csv), "--render", "bench_dashboard:busy",
                  "--workers", "2", "--batch", "16", "--plain", "--routes", str(routes))
    on_exit(lambda: _stop(pool))
    try:
        _wait(lambda: pool.poll() is None and _board_up(name), "the pool never started")
        port = _free_port()
        server = _lanes("serve", name, "--port", str(port))
        try:
            url = f"http://127.0.0.1:{port}"
            _wait(lambda: _answers(url + "/api/policy"), "the server never answered", 60)
            yield name, url, server.pid
        finally:
            _stop(server)
    finally:
        _stop(pool)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
        return True
    except OSError:
        return False


def answer_times(url: str, n: int) -> list[float]:
    """Milliseconds per GET of ``url``, one request every 100 ms."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            json.load(r)
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
    return out


def stats_costs(name: str, runs: int) -> tuple[list[float], list[float]]:
    """Milliseconds of one ``lanes stats NAME --json`` (a process) and of one ``pool_report``
    in this process."""
    cli, inside = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = _lanes("stats", name, "--json")
        p.communicate(timeout=120)
        cli.append((time.perf_counter() - t0) * 1000)
        eng, board = Engine.attach(name), Board.attach(name)
        try:
            t0 = time.perf_counter()
            pool_report(eng, board)
            inside.append((time.perf_counter() - t0) * 1000)
        finally:
            board.close()
            eng.close()
    return cli, inside


def renders_per_s(name: str, seconds: float, server: psutil.Process) -> tuple[float, float]:
    """The pool's renders per second over ``seconds``, and the server's CPU meanwhile (% of
    one core)."""
    board = Board.attach(name)
    try:
        t0, n0, c0 = time.perf_counter(), board.totals()["renders"], _cpu(server)
        time.sleep(seconds)
        dt = time.perf_counter() - t0
        return (board.totals()["renders"] - n0) / dt, 100 * (_cpu(server) - c0) / dt
    finally:
        board.close()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def open_page_cost(name: str, url: str, server_pid: int, window_s: float, rounds: int,
                   tmp: Path) -> dict[str, list[float]]:
    """Renders/s and the server's CPU without and with the overview open, alternated
    ``rounds`` times."""
    from playwright.sync_api import sync_playwright

    server = psutil.Process(server_pid)
    out: dict[str, list[float]] = {k: [] for k in ("closed", "open", "cpu_closed", "cpu_open")}
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp / "profile"), executable_path="/usr/bin/chromium", headless=True,
            args=CHROMIUM_FLAGS)
        try:
            for _ in range(rounds):
                rate, cpu = renders_per_s(name, window_s, server)
                out["closed"].append(rate)
                out["cpu_closed"].append(cpu)
                page = ctx.new_page()
                page.goto(url + "/")
                rate, cpu = renders_per_s(name, window_s, server)
                out["open"].append(rate)
                out["cpu_open"].append(cpu)
                page.close()
        finally:
            ctx.close()
    return out


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else values[0]


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--rows", type=int))
    started = time.perf_counter()
    c = dict(SMOKE if args.smoke else FULL)
    if args.rows:
        c["rows"] = args.rows
    rows = f"{c['rows'] // 1000}k rows"
    figs = []
    with tempfile.TemporaryDirectory(prefix="rl-bench-dash-") as d, \
            pool_and_server(c["rows"], Path(d)) as (name, url, server_pid):
        time.sleep(3)  # the server's first samples
        for path in ("/api/overview", "/api/failures", "/api/routes"):
            times = answer_times(url + path, c["requests"])
            figs.append({**figure(f"dashboard.answer_ms{path.replace('/', '.')}",
                                  f"GET {path}, {rows}, one request / 100 ms (p95 "
                                  f"{p95(times):.1f} ms)", "ms", times), "p95": p95(times)})
        cli, inside = stats_costs(name, 3 if args.smoke else 5)
        figs.append(figure("dashboard.lanes_stats_ms", f"one `lanes stats --json`, {rows}"
                           " (a process)", "ms", cli))
        figs.append(figure("dashboard.pool_report_ms", f"one pool_report, {rows} (in a process)",
                           "ms", inside))
        cost = open_page_cost(name, url, server_pid, c["window_s"], c["rounds"], Path(d))
        for key, what in (("closed", "no dashboard open"),
                          ("open", "the overview open in Chromium")):
            figs.append(figure(f"dashboard.renders_per_s.{key}", f"pool renders/s, {rows},"
                               f" {what}", "renders/s", cost[key], better="higher"))
            figs.append(figure(f"dashboard.server_cpu.{key}", f"lanes serve's CPU, {rows},"
                               f" {what}", "% of a core", cost[f"cpu_{key}"]))
    finish("bench_dashboard", args, figs, started)


if __name__ == "__main__":
    main()
