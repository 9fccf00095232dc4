"""What a worker does with a claimed row: a Python callable or a shell command, given as text.

A render is named, not passed, so that a worker started by spawn or forkserver (which pickles
nothing but its arguments) and a worker restarted by the supervisor build the same one:
``"module:function"`` is imported in the worker and called with the row's URL and its
``Claim``; a command template (``curl -fsS {url} -o /dev/null``) is split like a shell line
once, and ``{url}`` (also ``{row}``, ``{lane}``) is filled into each argument, so a URL is one
argument and never reaches a shell. Raising, a non-zero exit status or a timeout is a failure.
"""

from __future__ import annotations

import importlib
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import Claim
from ..errors import EngineError, EngineTypeError, EngineValueError

RenderFn = Callable[[str, Claim], object]


class RenderFailed(EngineError):
    """A command render exited non-zero or timed out."""


def load_callable(spec: str) -> RenderFn:
    """Import ``"package.module:function"`` (a dotted attribute path after the colon)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise EngineValueError(f"render must look like 'module:function', got {spec!r}")
    module_name, attr = spec.split(":")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise EngineValueError(f"render {spec!r}: {module_name!r} is not a module name")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise EngineValueError(f"cannot import render module {module_name!r}: {e}") from None
    for part in attr.split("."):
        if not part.isidentifier() or not hasattr(obj, part):
            raise EngineValueError(f"render {spec!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EngineTypeError(f"render {spec!r} is not callable")
    return obj


@dataclass(frozen=True)
class CommandRender:
    """Run a command per row: ``{url}``, ``{row}`` and ``{lane}`` filled into its arguments."""

    template: str
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.template, str) or not self.template.strip():
            raise EngineValueError("the render command is empty")
        try:
            argv = shlex.split(self.template)
            filled = [a.format(url="u", row=0, lane=0) for a in argv]
        except (ValueError, KeyError, IndexError) as e:
            raise EngineValueError(f"bad render command {self.template!r}: {e!r}"
                                   " (fields: {url}, {row}, {lane})") from None
        if filled == argv or not any("{url}" in a for a in argv):
            raise EngineValueError(f"render command {self.template!r} never uses {{url}}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 86_400):
            raise EngineValueError(f"render timeout must lie in (0, 86400] s, got"
                                   f" {self.timeout_s!r}")

    def __call__(self, url: str, claim: Claim) -> None:
        argv = [a.format(url=url, row=claim.row, lane=claim.lane)
                for a in shlex.split(self.template)]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RenderFailed(f"{argv[0]} timed out after {self.timeout_s} s on {url}") from None
        except OSError as e:
            raise RenderFailed(f"cannot run {argv[0]}: {e}") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-200:]
            raise RenderFailed(f"{argv[0]} exited {done.returncode} on {url}: {tail}")


@dataclass(frozen=True)
class RenderSpec:
    """A render as text: exactly one of ``callable`` and ``command``. Picklable."""

    callable: str | None = None
    command: str | None = None
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if (self.callable is None) == (self.command is None):
            raise EngineValueError("give a render as module:function or as a command, not both")
        self.build()  # fail in the supervisor, before any worker starts

    def build(self) -> RenderFn:
        if self.command is not None:
            return CommandRender(self.command, self.timeout_s)
        assert self.callable is not None
        return load_callable(self.callable)
