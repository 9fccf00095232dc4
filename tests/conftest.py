"""Fixtures: a fresh engine per test, the pool tests' render log, and a session check that no test
segment is left behind."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from lanes_testlib import dispose, leftover_segments, unique_name

settings.register_profile(
    "lanes",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=False,
)
settings.load_profile("lanes")


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Any]]:
    """A factory: ``make_engine(policy=None, capacity=4096, **kw)``; every engine is disposed."""
    from engine import Engine

    made: list[tuple[Any, str]] = []

    def make(policy: Any = None, capacity: int = 4096, **kw: Any) -> Any:
        name = unique_name()
        eng = Engine.create(name, capacity, policy, **kw)
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
