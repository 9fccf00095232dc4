"""Helpers for the browser render's tests and benchmark: a pool run through the CLI whose every
descendant carries a marker in its environment, so the processes it leaves behind (Chromium's
included, whatever their parent or group) can be found on a machine where other browsers run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from engine.store import SnapshotStore

LIB = os.path.dirname(__file__)
MARK = "LANES_BROWSER_TEST_RUN"


def marked(mark: str) -> list[psutil.Process]:
    """The live processes (zombies aside) whose environment carries ``mark``."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def write_corpus(path: Path, urls: list[str], interval_s: int = 3600) -> Path:
    path.write_text("url,interval_s,provenance\n"
                    + "".join(f"{u},{interval_s},submitted\n" for u in urls))
    return path


class PoolRun:
    """``lanes pool NAME --browser ...`` in the background; its stderr lines kept with the
    monotonic time each arrived."""

    def __init__(self, name: str, corpus: Path, store: Path, *extra: str,
                 workers: int = 1) -> None:
        self.mark = uuid.uuid4().hex
        self.name, self.store = name, store
        env = {**os.environ, MARK: self.mark,
               "PYTHONPATH": LIB + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "pool", name, "--browser", "--store", str(store),
             "--corpus", str(corpus), "--workers", str(workers), "--plain", "--grace", "5",
             *extra], env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first_line_with(self, text: str) -> float | None:
        return next((t for t, line in self.lines if text in line), None)

    def workers(self) -> list[psutil.Process]:
        """The pool's worker processes (the supervisor's Python children)."""
        try:
            kids = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        return [k for k in kids if "python" in k.name().lower()]

    def wait_until(self, cond: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"the pool exited {self.proc.returncode}:\n{self.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; the pool said:\n{self.stderr()[-4000:]}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait; every process of the run must be gone then."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)
        return code

    def left_behind(self, settle_s: float = 3.0) -> list[psutil.Process]:
        """What of this run still runs (a moment allowed for the kernel to finish kills)."""
        deadline = time.monotonic() + settle_s
        while (left := marked(self.mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def __enter__(self) -> PoolRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop()
        for p in marked(self.mark):  # never leave a test's processes to the next one
            try:
                p.kill()
            except psutil.Error:
                pass


def stored(store: Path, urls: list[str]) -> dict[str, Any]:
    """url -> its snapshot, for those of ``urls`` the store has (no store yet: none)."""
    if not (store / "store.sqlite").exists():
        return {}
    s = SnapshotStore.open(str(store), create=False)
    try:
        return {u: snap for u in urls if (snap := s.get(u)) is not None}
    finally:
        s.close()
