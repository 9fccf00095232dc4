"""Render callables for the pool tests, importable by module name under every start method.

Each appends ``<pid> <url>`` to the file named by ``RL_TEST_RENDER_LOG`` (inherited by workers
through the environment), one ``write`` per line, so lines from several workers never mix.
"""

from __future__ import annotations

import os
import time
from typing import Any


def _log(url: str) -> None:
    fd = os.open(os.environ["RL_TEST_RENDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{os.getpid()} {url}\n".encode())
    finally:
        os.close(fd)


def record(url: str, claim: Any) -> None:
    time.sleep(0.001)
    _log(url)


def slow_first(url: str, claim: Any) -> None:
    """The first render of a URL ending in ``/slow`` hangs (until SIGKILLed); later ones pass."""
    marker = os.environ["RL_TEST_RENDER_LOG"] + ".slow"
    if url.endswith("/slow") and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
    _log(url)


def always_fails(url: str, claim: Any) -> None:
    raise RuntimeError(f"cannot render {url}")


def slow(url: str, claim: Any) -> None:
    time.sleep(0.05)
    _log(url)


def hang(url: str, claim: Any) -> None:
    """Log the URL, then hang (a render that only a kill ends)."""
    _log(url)
    time.sleep(3600)


class Gone(Exception):
    """What a render raises for a page that no longer exists (named permanent by the tests)."""


def gone_or_flaky(url: str, claim: Any) -> None:
    """``.../gone/...`` raises Gone, ``.../flaky/...`` a RuntimeError; the rest render."""
    if "/gone/" in url:
        raise Gone(f"{url} is gone")
    if "/flaky/" in url:
        raise RuntimeError(f"{url} timed out upstream")
    _log(url)


_QUEUE: list[Any] = []  # this process's connection for leased(), made on first use


def leased(url: str, claim: Any) -> None:
    """Log the lease this render runs under, as the Redis queue ``RL_TEST_QUEUE`` at
    ``RL_TEST_REDIS`` holds it, to ``RL_TEST_RENDER_LOG.leases``: ``<pid> <row> <token>
    <start ms> <lease expiry ms> <url>``; then render slowly (50 ms) and log as ``record``."""
    start = time.time_ns() // 1_000_000
    if not _QUEUE:
        from engine import Engine

        _QUEUE.append(Engine.connect(os.environ["RL_TEST_REDIS"], os.environ["RL_TEST_QUEUE"]))
    expiry = _QUEUE[0].describe(claim.row)["lease_expiry_ms"]
    line = f"{os.getpid()} {claim.row} {claim.token} {start} {expiry} {url}\n"
    fd = os.open(os.environ["RL_TEST_RENDER_LOG"] + ".leases",
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(0.05)
    _log(url)
