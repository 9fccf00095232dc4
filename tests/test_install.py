"""A base install works: the wheel, installed with no extra in a fresh venv (numpy, cffi and
psutil only), runs ``lanes --help``, every subcommand's ``--help`` and a small ``lanes sim``,
and a command that needs an extra says which one to install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = ["numpy", "cffi", "psutil"]  # pyproject.toml's dependencies


def _run(*cmd: str | Path, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ``lanes`` of a fresh venv holding the wheel and the base dependencies only."""
    where = tmp_path_factory.mktemp("install")
    # The tree as git sees it (tracked, and new files not ignored), built outside the checkout:
    # pip builds in the source tree, which must keep no build/ of this test's.
    files = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                 cwd=ROOT).stdout.split("\0")
    source = where / "source"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(*pip, "wheel", "--no-deps", "-q", "-w", where / "dist", source)
    wheel = next((where / "dist").glob("render_lanes-*.whl"))
    venv = where / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(*pip, "--python", python, "install", "-q", *BASE)
    _run(*pip, "--python", python, "install", "-q", "--no-deps", wheel)
    yield venv / "bin" / "lanes"


def _lanes(lanes: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Run from elsewhere than the checkout, so that the installed package is the one imported.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(lanes), *args], capture_output=True, text=True, timeout=300,
                          cwd=lanes.parent, env=env)


def test_the_base_install_lacks_every_extra(lanes: Path) -> None:
    python = lanes.parent / "python"
    code = ("import importlib.util as u, engine, sys; print(engine.__file__);"
            "print([m for m in ('aiohttp', 'redis', 'rich', 'jinja2', 'defusedxml',"
            " 'prometheus_client', 'matplotlib', 'playwright', 'boto3') if u.find_spec(m)])")
    out = _run(python, "-c", code, cwd=lanes.parent).stdout.splitlines()
    assert out[0].startswith(str(lanes.parent.parent)) and out[1] == "[]", out


def test_lanes_and_every_subcommand_print_their_help(lanes: Path) -> None:
    top = _lanes(lanes, "--help")
    assert top.returncode == 0, top.stderr
    commands = re.search(r"\{([a-z,-]+)\}", top.stdout)
    assert commands is not None, top.stdout
    names = commands.group(1).split(",")
    assert {"demo", "sim", "pool", "stats", "check", "serve"} <= set(names)
    for name in names:
        done = _lanes(lanes, name, "--help")
        assert done.returncode == 0 and f"usage: lanes {name}" in done.stdout, (name, done.stderr)


def test_a_small_simulation_runs(lanes: Path) -> None:
    done = _lanes(lanes, "sim", "--policies", "default,today", "--capacities", "1",
                  "--scale", "0.02", "--warmup-h", "2", "--measure-h", "4", "--jobs", "1",
                  "--json")
    assert done.returncode == 0, done.stderr
    assert '"policy": "today"' in done.stdout


def test_a_command_that_needs_an_extra_names_it(lanes: Path) -> None:
    done = _lanes(lanes, "serve", "some-pool")
    assert done.returncode == 2
    assert "pip install 'render-lanes[serve]'" in done.stderr, done.stderr
    done = _lanes(lanes, "stats", "some-pool", "--redis", "redis://127.0.0.1:1")
    assert done.returncode == 2
    assert "pip install 'render-lanes[redis]'" in done.stderr, done.stderr
    done = _lanes(lanes, "store", "gc", "s3://lanes-x/p", "--redis", "redis://127.0.0.1:1")
    assert done.returncode == 2
    assert "pip install 'render-lanes[s3]'" in done.stderr, done.stderr
