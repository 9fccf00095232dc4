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


_LOOK: list[Any] = []  # this process's (client, keys) for chaos(), made on first use


def _lease_now(row: int) -> tuple[int, str]:
    """(server ms, '<token> <owner pid> <expiry>' of the lease row ``row`` has now, '- - -'
    when none: a renewal gives the same owner a new token), read
    from the Redis queue ``RL_TEST_QUEUE`` at ``RL_TEST_REDIS`` in one MULTI/EXEC."""
    if not _LOOK:
        import redis

        from engine.redis.engine import queue_keys

        _LOOK.append((redis.Redis.from_url(os.environ["RL_TEST_REDIS"]),
                      queue_keys(os.environ["RL_TEST_QUEUE"])))
    client, (_ready, lease, _rows, _meta, holder) = _LOOK[0]
    m = f"{row:08d}"
    pipe = client.pipeline(transaction=True)
    pipe.hget(holder, m)
    pipe.zrange(lease, 0, -1, withscores=True)
    pipe.time()
    held, batches, (sec, usec) = pipe.execute()
    t = int(sec) * 1000 + int(usec) // 1000
    if held is None:
        return t, "- - -"
    # token:batch:n:expiry:key:owner, owner = host:pid:start_ms; the lease is the batch's entry
    token, batch, _n, _expiry, _key, owner = held.decode().split(":", 5)
    expiry = {m.decode(): int(score) for m, score in batches}.get(batch)
    return t, f"{token} {owner.rsplit(':', 2)[1]} {'-' if expiry is None else expiry}"


def chaos(url: str, claim: Any) -> None:
    """The render of the Redis chaos test (tests/lib/redis_chaos_lib.py): log to
    ``RL_TEST_RENDER_LOG`` ``S <pool pid> <pid> <row> <token> <server ms> <held token> <held
    by pid> <expiry>`` (the lease the queue holds for the row as the render starts), render
    for 5-60 ms, fail one render in 20, then log ``E ... ok|fail`` with the lease as it ends.
    A SIGKILL between the two leaves the ``S`` line alone."""
    import random

    def line(tag: str, tail: str = "") -> None:
        t, held = _lease_now(claim.row)
        text = f"{tag} {os.getppid()} {os.getpid()} {claim.row} {claim.token} {t} {held}{tail}\n"
        fd = os.open(os.environ["RL_TEST_RENDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    line("S")
    time.sleep(random.uniform(0.005, 0.06))
    ok = random.random() >= 0.05
    line("E", " ok" if ok else " fail")
    if not ok:
        raise RuntimeError(f"{url}: chaos says this render fails")


def partition(url: str, claim: Any) -> None:
    """The render of the partition tests (tests/lib/partition_lib.py): append ``<pool pid>
    <pid> <row> <token> <wall ms>`` to ``RL_TEST_RENDER_LOG`` as it starts, then take
    ``RL_TEST_RENDER_S`` seconds. It touches no network: a host cut off renders on."""
    line = (f"{os.getppid()} {os.getpid()} {claim.row} {claim.token} "
            f"{time.time_ns() // 1_000_000}\n")
    fd = os.open(os.environ["RL_TEST_RENDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(float(os.environ.get("RL_TEST_RENDER_S", "0.1")))


class HttpGone(Exception):
    """A client library's error for a page the site answered 404 (``status_code``, as
    ``requests`` and ``httpx`` carry it)."""

    status_code = 404


def answers_404(url: str, claim: Any) -> None:
    """``.../gone/...`` answers 404; the rest render."""
    if "/gone/" in url:
        raise HttpGone(f"{url}: 404 Not Found")
    _log(url)
