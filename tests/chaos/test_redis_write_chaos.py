"""A client killed in the middle of a multi-chunk write to a Redis queue (``lanes add --redis``
of a big URL file; the restore of a pool checkpoint into a new queue) leaves whole chunks: each
chunk's URLs and rows went in one FCALL, so after SIGKILL every chunk is there in full or not at
all, every URL has its row and every row its URL, and adding the corpus again adds the rest. On
a real redis-server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from chaos_lib import ROOT
from lanes_testlib import unique_name
from pool_testlib import write_csv
from redis_server import RedisServer

from engine import Engine, checkpoint
from engine.redis.engine import RedisEngine
from engine.redis.urls import URL_CHUNK, RedisUrls

N = 30 * URL_CHUNK


def _kill_midway(args: list[str], landed: Callable[[], int]) -> int:
    """Run ``args`` and SIGKILL it once ``landed()`` (URLs in the queue) is above zero; the
    count seen at the kill."""
    child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    try:
        while (seen := landed()) == 0 and child.poll() is None:
            assert time.monotonic() < deadline, "the client added nothing in a minute"
            time.sleep(0.002)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.stderr is not None
        child.stderr.close()
    return seen


def _whole_chunks(eng: RedisEngine, urls: list[str]) -> int:
    """Every chunk of ``urls`` (in order, URL_CHUNK each) is in the queue in full or not at all,
    with its rows, and nothing else is; returns the URLs in the queue."""
    table = RedisUrls(eng)
    n = len(table)
    assert n % URL_CHUNK == 0 or n == len(urls), n
    assert eng.stats()["rows"] == n  # never a row without its URL, nor a URL without its row
    in_queue = table.urls()  # raises if a row below the last has no URL
    assert in_queue == urls[:n]  # whole chunks, in order: each chunk was one FCALL
    rows = [table.find(u) for u in urls[:n]]
    assert rows == list(range(n))
    assert all(eng.describe(r)["queued"] for r in rows[:: URL_CHUNK // 4])
    return n


def test_a_killed_lanes_add_leaves_whole_chunks_and_adding_again_adds_the_rest(
        tmp_path: Path) -> None:
    corpus = write_csv(tmp_path, N)
    urls = [f"https://shop.example/p/{i}" for i in range(N)]
    name = unique_name()
    with RedisServer() as server:
        eng = RedisEngine.connect(server.url, name, create=True)
        try:
            table = RedisUrls(eng)
            lanes_add = [sys.executable, "-m", "engine", "add", name, "--redis", server.url,
                         "--corpus", str(corpus)]
            seen = _kill_midway(lanes_add, lambda: len(table))
            got = _whole_chunks(eng, urls)
            assert 0 < seen <= got < N, (seen, got)  # killed midway: some chunks, not all
            done = subprocess.run(lanes_add, cwd=ROOT, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            assert f"{N - got} new URL(s) added" in done.stdout
            assert _whole_chunks(eng, urls) == N
            assert eng.verify() == []
        finally:
            RedisUrls(eng).drop()
            eng.drop()
            eng.close()


def test_a_killed_restore_leaves_whole_chunks(tmp_path: Path) -> None:
    urls = [f"https://shop.example/r/{i}" for i in range(N)]
    path = str(tmp_path / "pool.ckpt")
    with Engine.create(unique_name(), N) as shm:
        shm.add_many(np.full(N, 1_000_000), 3600)
        checkpoint.save(shm, path, urls)
    name = unique_name()
    with RedisServer() as server:
        code = ("import sys; from engine import checkpoint\n"
                "from engine.redis.restore import restore\n"
                "restore(checkpoint.read(sys.argv[1]), sys.argv[2], sys.argv[3])\n")
        probe: list[RedisEngine] = []

        def landed() -> int:
            if not probe:
                try:
                    probe.append(RedisEngine.connect(server.url, name))
                except Exception:  # noqa: BLE001 - not made yet
                    return 0
            return len(RedisUrls(probe[0]))

        seen = _kill_midway([sys.executable, "-c", code, path, server.url, name], landed)
        eng = probe[0]
        try:
            got = _whole_chunks(eng, urls)
            assert 0 < seen <= got < N, (seen, got)
            assert eng.verify() == []
        finally:
            RedisUrls(eng).drop()
            eng.drop()
            eng.close()
