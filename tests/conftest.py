"""Fixtures: a fresh engine per test (on every backend in the contract modules), the pool tests'
render log, and a session check that no test segment is left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from lanes_testlib import TEN_LANES, dispose, leftover_segments, unique_name

settings.register_profile(
    "lanes",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=False,
)
settings.load_profile("lanes")


# -- one contract, every backend (docs/design.md §14) ------------------------------------------
#
# A module marked ``pytestmark = pytest.mark.contract`` runs each of its tests that takes an
# engine (``eng``, ``make_engine``, ``fresh``, or ``backend`` itself) once per backend, with ids
# ``[shm]`` and ``[redis]``; a test there about shared-memory mechanics only is marked
# ``@pytest.mark.shm_only("why")`` and runs as ``[shm]``; one about what one pass over the whole
# queue grants is marked ``@pytest.mark.one_queue("why")`` and never runs as ``[redis-sharded]``.
# Elsewhere ``backend`` is "shm".

BACKENDS = ("shm", "redis", "redis-sharded")
"""``redis-sharded`` is a queue over ``SHARDS`` shards (docs/redis.md "Shards")."""
SHARDS = 3
FUZZ_MODULES = {"test_fuzz_inputs"}
"""Argument fuzzing over shards repeats what it does on one Redis queue (the sharded engine
checks its arguments with the same ``engine.checks`` before it sends anything) at four times
the cost, so it runs as ``[redis-sharded]`` only with ``RL_CONTRACT_SHARDED=1``."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract: the module's engine tests run once per backend "
                                       "(shm, redis)")
    config.addinivalue_line("markers", "shm_only(why): in a contract module, a test about the "
                                       "shared-memory engine's own mechanics; runs as [shm] only")
    config.addinivalue_line("markers", "one_queue(why): in a contract module, a test of what one "
                                       "pass over the whole queue grants, which a queue over "
                                       "shards does not promise; not run as [redis-sharded]")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("contract") is None:
        return
    only = metafunc.definition.get_closest_marker("shm_only")
    if only is not None and not (only.args and isinstance(only.args[0], str)):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: shm_only needs its reason")
    whole = metafunc.definition.get_closest_marker("one_queue")
    if whole is not None and not (whole.args and isinstance(whole.args[0], str)):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: one_queue needs its reason")
    fuzz = metafunc.module.__name__.rpartition(".")[2] in FUZZ_MODULES
    backends = [b for b in BACKENDS if b != "redis-sharded" or (
        whole is None and (not fuzz or os.environ.get("RL_CONTRACT_SHARDED")))]
    metafunc.parametrize("backend", ["shm"] if only else backends, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """"shm" or "redis": the backend this test runs on (see ``contract`` above)."""
    return str(getattr(request, "param", "shm"))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """One redis-server for the session (unix socket, temp dir), started on first use, stopped
    and removed at the end. Never skipped: ``make test`` installs redis-server."""
    from redis_server import RedisServer

    srv = RedisServer().start()
    yield srv
    srv.stop()
    assert srv.proc is not None and srv.proc.poll() is not None
    assert not os.path.exists(srv.dir)


def _opener(request: pytest.FixtureRequest, backend: str) -> Callable[..., tuple[Any, str]]:
    """``open(policy, capacity, **kw) -> (engine, name)`` on ``backend``: a new segment, or a
    new queue on the session's server (bounded to ``capacity`` rows like a segment)."""
    from engine import Engine

    if backend == "shm":
        def open_shm(policy: Any, capacity: int, **kw: Any) -> tuple[Any, str]:
            name = unique_name()
            return Engine.create(name, capacity, TEN_LANES if policy is None else policy,
                                 **kw), name

        return open_shm
    assert backend in ("redis", "redis-sharded"), backend
    url = request.getfixturevalue("redis_server").url
    shards = SHARDS if backend == "redis-sharded" else None

    def open_redis(policy: Any, capacity: int, **kw: Any) -> tuple[Any, str]:
        name = unique_name()
        return Engine.connect(url, name, TEN_LANES if policy is None else policy, create=True,
                              capacity=capacity, shards=shards, **kw), name

    return open_redis


@pytest.fixture
def make_engine(request: pytest.FixtureRequest, backend: str) -> Iterator[Callable[..., Any]]:
    """A factory: ``make_engine(policy=None, capacity=4096, **kw)``; every engine is disposed
    (a segment unlinked, a Redis queue dropped). No policy: ``TEN_LANES``, the layout the
    suites name lanes of."""
    open_engine = _opener(request, backend)
    made: list[tuple[Any, str]] = []

    def make(policy: Any = None, capacity: int = 4096, **kw: Any) -> Any:
        eng, name = open_engine(policy, capacity, **kw)
        made.append((eng, name))
        return eng

    yield make
    for eng, name in made:
        dispose(eng, name)


@pytest.fixture
def eng(make_engine: Callable[..., Any]) -> Any:
    """An engine with the default policy and room for 4096 rows."""
    return make_engine()


@pytest.fixture
def fresh(request: pytest.FixtureRequest, backend: str) -> Callable[..., Any]:
    """``with fresh(policy=None, capacity=4096, **kw) as eng:``, lanes_testlib.fresh_engine on
    this test's backend: one engine per hypothesis example, disposed at the block's end."""
    open_engine = _opener(request, backend)

    @contextlib.contextmanager
    def fresh_on_backend(policy: Any = None, capacity: int = 4096, **kw: Any) -> Iterator[Any]:
        eng, name = open_engine(policy, capacity, **kw)
        try:
            yield eng
        finally:
            dispose(eng, name)

    return fresh_on_backend


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the render callables of pool_renders.py append ``<pid> <url>`` lines to."""
    path = tmp_path / "renders.log"
    monkeypatch.setenv("RL_TEST_RENDER_LOG", str(path))
    return path


@pytest.fixture(scope="session", autouse=True)
def no_segment_left_behind() -> Iterator[None]:
    """No ``rl-test-*`` segment of this session is left in /dev/shm.

    Only this session's names are judged and removed: another run of the suite may be live on
    the same machine, and its segments are not ours to delete."""
    yield
    left = leftover_segments()
    for path in left:  # clean up, then fail loudly
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    assert left == [], f"test segments left in /dev/shm: {left}"


@pytest.fixture(scope="session", autouse=True)
def third_party_tools_without_the_sanitizer(tmp_path_factory: pytest.TempPathFactory
                                            ) -> Iterator[None]:
    """Under ``make test-sanitize`` the ASan runtime is preloaded into every process, so that
    our instrumented C core can run in an uninstrumented interpreter. curl and wget, which the
    render tests run, hang under it; they get wrappers (first on PATH, so a render's argv[0] and
    its messages stay ``curl``/``wget``) that drop the preload before running the real tool."""
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        yield
        return
    shims = tmp_path_factory.mktemp("unsanitized-tools")
    for tool in ("curl", "wget"):
        real = shutil.which(tool)
        if real is not None:
            path = shims / tool
            path.write_text(f'#!/bin/sh\nunset LD_PRELOAD\nexec {real} "$@"\n')
            path.chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{shims}{os.pathsep}{old}"
    try:
        yield
    finally:
        os.environ["PATH"] = old
