"""Every file a pool makes is readable by its user alone (0600): the engine segment, the URL
tables, the board, the routes, the failure log with its SQLite -wal and -shm, and the
checkpoint, with the usual umask 022 in force (which alone would leave them 0644)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from lanes_testlib import unique_name
from pool_testlib import files_of

from engine.corpus.routes import Route, Routes
from engine.pool import Pool, PoolOptions
from engine.pool.render import RenderSpec

URLS = [f"https://shop.example/{kind}/{i}" for kind in ("ok", "gone", "flaky") for i in range(4)]


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_every_file_a_pool_makes_is_0600(log: Path, tmp_path: Path, umask_022: None) -> None:
    name, checkpoint = unique_name(), tmp_path / "pool.ckpt"
    env = {k: v for k, v in os.environ.items() if k == "RL_TEST_RENDER_LOG"}
    render = RenderSpec(callable="pool_renders:gone_or_flaky", permanent_errors=("Gone",))
    n = len(URLS)
    routes = Routes((Route("ok", "https://shop.example/ok/*", False, 7200, None),))
    pool = Pool.create(name, URLS, np.full(n, int(time.time() * 1000) - 1000), np.full(n, 3600),
                       np.zeros(n, np.int64), render,
                       PoolOptions(workers=1, grace_s=5.0, env=env, checkpoint=str(checkpoint)),
                       routes=routes)
    with pool:
        pool.start()
        deadline = time.monotonic() + 30
        while len(pool.failures.entries()) < 8:
            assert time.monotonic() < deadline, "the renders did not fail in time"
            pool.supervise()
            time.sleep(0.05)
        pool.checkpoint()
        made = files_of(name) + [str(checkpoint)]
        suffixes = {os.path.basename(f)[len(name):] for f in made}
        assert {"", ".failures", ".failures-wal", ".failures-shm", ".routes"} <= suffixes, made
        assert checkpoint.exists()
        modes = {f: stat.S_IMODE(os.stat(f).st_mode) for f in made}
        assert {f: m for f, m in modes.items() if m != 0o600} == {}, {
            f: oct(m) for f, m in modes.items()}
        pool.board.request_stop()
        for p in pool._procs:
            p.join(10)
    assert files_of(name) == []
