"""Shared helpers for the pool, CLI, checkpoint and pool-file tests.

Like lanes_testlib, no pytest import: the ``log`` fixture that points the render callables of
pool_renders.py at a file lives in conftest.py.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from lanes_testlib import shm_path

from engine.pool import Pool, PoolOptions
from engine.pool.render import RenderSpec

LIB = os.path.dirname(os.path.abspath(__file__))


def rendered(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    return [(int(pid), url) for pid, url in (line.split() for line in log.read_text().splitlines())]


def corpus(n: int, now: int | None = None) -> dict[str, Any]:
    now = int(time.time() * 1000) if now is None else now
    return {"urls": [f"https://shop.example/p/{i}" for i in range(n)],
            "due_ms": now - np.arange(n) * 1000, "interval_s": 3600,
            "provenance": ["submitted", "discovered"] * (n // 2) + ["submitted"] * (n % 2)}


def make_pool(name: str, n: int, render: str, urls: list[str] | None = None,
              **options: Any) -> Pool:
    c = corpus(n)
    env = {k: v for k, v in os.environ.items() if k == "RL_TEST_RENDER_LOG"}
    return Pool.create(name, urls or c["urls"], c["due_ms"], c["interval_s"], c["provenance"],
                       RenderSpec(callable=render), PoolOptions(env=env, **options))


def running(pids: set[int]) -> set[int]:
    """The pids that still run (a zombie waiting for its parent does not count)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def kill_host(pid: int) -> None:
    """SIGKILL pool process ``pid`` and everything under it at one instant, as a host that dies
    whole. Its workers lead process groups of their own (so that what they start dies with
    them), so a kill of the pool's group alone would leave them: the whole tree is stopped
    first, so that no process sees another die before it dies itself, then killed."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in tree:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass


def files_of(name: str) -> list[str]:
    """The engine's segment and every file a pool keeps beside it (URL tables, board, failure
    log and its WAL, host gate, routes) that exist."""
    return sorted(glob.glob(shm_path(name)) + glob.glob(shm_path(name) + ".*"))


def until_all(log: Path, n: int) -> Any:
    return lambda: len({u for _, u in rendered(log)}) >= n


def cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": LIB + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "engine", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@contextlib.contextmanager
def serving(*args: str) -> Iterator[str]:
    """``lanes serve ARGS`` on a free loopback port; yields its base URL (no trailing slash);
    stopped with SIGTERM and checked to exit 0 at the end."""
    p = cli("serve", *args, "--port", "0")
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("lanes serve:"), line + (p.stderr.read() if p.stderr else "")
        yield line.split()[-1].rstrip("/")
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err


def write_csv(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "corpus.csv"
    lines = ["url,interval_s,provenance"] + [f"https://shop.example/p/{i},3600,submitted"
                                             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
