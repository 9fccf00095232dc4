"""The Lua function library as the one ``FUNCTION LOAD`` payload, assembled from its files.

``lua/`` holds one file per registered function (``lanes_claim.lua`` registers ``lanes_claim``),
``lua/pool/`` the functions of the render pool on several hosts, and ``lua/includes/`` the
helpers they share. A file names each helper it uses, once, on a line of its own near its top::

    --- @include "leases"

Redis compiles a library as one chunk, so a helper's locals are in scope for everything after
it. The payload is the shebang line, then every include once, each after the includes it names
(depth first, in the order named, from the queue's functions by name and then the pool's), then
the queue's functions and the pool's, by name. The same files give the same payload, byte for
byte. A missing include, an include named twice by one file, a cycle, an include nobody names
and a function file that registers anything but its own name are refused with a clear error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from ..errors import EngineError

SHEBANG = "#!lua name=render_lanes"
"""The first line of the payload: the library's name (engine.py LIBRARY)."""

_INCLUDE = re.compile(r'^--- @include "([a-z0-9_]+)"$', re.MULTILINE)
_REGISTER = re.compile(r"^register\('([a-z0-9_]+)'", re.MULTILINE)


class LibraryFilesError(EngineError):
    """The Lua files do not make one library (a packaging defect, never a user's input)."""


@dataclass(frozen=True)
class LuaFile:
    name: str  # its path under lua/, e.g. "includes/leases.lua"
    text: str

    @property
    def includes(self) -> list[str]:
        named = _INCLUDE.findall(self.text)
        for include in named:
            if named.count(include) > 1:
                raise LibraryFilesError(f"{self.name} includes {include!r} twice")
        return named

    @property
    def registers(self) -> list[str]:
        return _REGISTER.findall(self.text)

    def body(self) -> str:
        """The text with its include lines left out (the payload resolves them), marked with
        its file name so that a line number in a Lua error can be traced back to a file."""
        text = _INCLUDE.sub("", self.text).replace("\n\n\n", "\n\n").strip("\n")
        return f"-- lua/{self.name}\n{text}\n"


def lua_files() -> dict[str, list[LuaFile]]:
    """The library's files by part: "includes", "queue" (lua/*.lua), "pool" (lua/pool/*.lua),
    each sorted by name."""
    root = resources.files(__package__).joinpath("lua")
    parts = {"queue": root, "pool": root.joinpath("pool"), "includes": root.joinpath("includes")}

    def read(folder: Traversable, prefix: str) -> list[LuaFile]:
        return [LuaFile(prefix + f.name, f.read_text(encoding="utf-8"))
                for f in sorted(folder.iterdir(), key=lambda f: f.name)
                if f.is_file() and f.name.endswith(".lua")]
    return {part: read(folder, "" if part == "queue" else part + "/")
            for part, folder in parts.items()}


def _check_registers(f: LuaFile) -> None:
    own = f.name.rsplit("/", 1)[-1].removesuffix(".lua")
    if f.registers != [own]:
        raise LibraryFilesError(f"{f.name} must register {own!r} alone; it registers "
                                f"{f.registers or 'nothing'}")


def _include_order(functions: list[LuaFile], includes: dict[str, LuaFile]) -> list[LuaFile]:
    """Every include the functions need, each after the includes it names (depth first)."""
    done: dict[str, LuaFile] = {}
    path: list[str] = []

    def visit(f: LuaFile) -> None:
        for name in f.includes:
            if name in done:
                continue
            if name in path:
                raise LibraryFilesError(f"includes form a cycle: {' -> '.join([*path, name])}")
            if name not in includes:
                raise LibraryFilesError(f"{f.name} includes {name!r}, and there is no "
                                        f"lua/includes/{name}.lua")
            path.append(name)
            visit(includes[name])
            path.pop()
            done[name] = includes[name]

    for f in functions:
        visit(f)
    unused = sorted(set(includes) - set(done))
    if unused:
        raise LibraryFilesError(f"lua/includes: {', '.join(unused)} included by no function")
    return list(done.values())


def assemble(files: dict[str, list[LuaFile]]) -> str:
    """The payload of ``files`` (as ``lua_files`` gives them), checked."""
    includes = {f.name.removeprefix("includes/").removesuffix(".lua"): f
                for f in files["includes"]}
    for f in files["includes"]:
        if f.registers:
            raise LibraryFilesError(f"{f.name} registers {f.registers}: an include registers "
                                    "nothing (a function has a file of its own)")
    functions = files["queue"] + files["pool"]
    for f in functions:
        _check_registers(f)
    ordered = _include_order(functions, includes)
    pool = "-- " + "-" * 60 + " the render pool on several hosts -----\n"
    return "\n".join([SHEBANG + "\n", *(f.body() for f in ordered),
                      *(f.body() for f in files["queue"]), pool,
                      *(f.body() for f in files["pool"])])


def library_source() -> str:
    """The library's ``FUNCTION LOAD`` payload (deterministic: the same files, the same bytes)."""
    return assemble(lua_files())
