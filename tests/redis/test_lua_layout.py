"""The Lua library's files: one per registered function, helpers named where they are used, no
function over 100 lines, and one deterministic ``FUNCTION LOAD`` payload that Redis loads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from engine.redis import LIBRARY, library_source
from engine.redis.library import LibraryFilesError, LuaFile, assemble, lua_files

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "engine" / "redis" / "lua"
MAX_LINES = 100

_TOKEN = re.compile(r"""
    (?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\] | --[^\n]*)
  | (?P<string>\[(?P<seq>=*)\[.*?\](?P=seq)\] | '(?:\\.|[^'\\\n])*' | "(?:\\.|[^"\\\n])*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d[\w.]*)
  | (?P<op>==|~=|<=|>=|\.\.\.|\.\.|\S)
  | (?P<space>\s+)
""", re.S | re.X)


class Token(NamedTuple):
    kind: str
    text: str
    line: int


def tokens(text: str) -> Iterator[Token]:
    """Lua's tokens, comments and strings as one token each (so a keyword in them is none)."""
    line, at = 1, 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        assert m, f"cannot tokenize at line {line}: {text[at:at + 40]!r}"
        kind = m.lastgroup or ""
        if kind not in ("space", "comment"):
            yield Token(kind, m.group(), line)
        line += m.group().count("\n")
        at = m.end()


class Function(NamedTuple):
    name: str
    first: int
    last: int


def functions(text: str) -> list[Function]:
    """Every function of a chunk with its first and last line, by block matching: ``function``,
    ``do`` (of ``for`` and ``while`` too), ``if`` and ``repeat`` open a block, ``end`` and
    ``until`` close one."""
    out: list[Function] = []
    stack: list[tuple[str, int, str]] = []
    toks = [t for t in tokens(text)]
    for i, t in enumerate(toks):
        if t.kind != "name":
            continue
        if t.text in ("function", "do", "if", "repeat"):
            name = toks[i + 1].text if t.text == "function" and toks[i + 1].kind == "name" \
                else "<anonymous>"
            stack.append((t.text, t.line, name))
        elif t.text in ("end", "until"):
            opener, first, name = stack.pop()
            if opener == "function":
                out.append(Function(name, first, t.line))
    assert not stack, f"unclosed blocks: {stack}"
    return out


def top_level_locals(text: str) -> set[str]:
    """The names a chunk declares with ``local`` outside any block."""
    names: set[str] = set()
    depth = 0
    toks = list(tokens(text))
    for i, t in enumerate(toks):
        if t.kind != "name":
            continue
        if t.text in ("function", "do", "if", "repeat"):
            depth += 1
        elif t.text in ("end", "until"):
            depth -= 1
        elif t.text == "local" and depth == 0:
            j = i + 1
            if toks[j].text == "function":
                names.add(toks[j + 1].text)
                continue
            while toks[j].kind == "name":
                names.add(toks[j].text)
                if toks[j + 1].text != ",":
                    break
                j += 2
    return names


def used_names(text: str) -> set[str]:
    """Names a chunk reads as variables (not fields: ``t.x``, ``t:x``, ``{x = ...}``)."""
    toks = list(tokens(text))
    used: set[str] = set()
    for i, t in enumerate(toks):
        if t.kind != "name":
            continue
        prev = toks[i - 1].text if i else ""
        after = toks[i + 1].text if i + 1 < len(toks) else ""
        if prev in (".", ":") or (prev in ("{", ",") and after == "="):
            continue
        used.add(t.text)
    return used


def all_files() -> list[LuaFile]:
    files = lua_files()
    return files["includes"] + files["queue"] + files["pool"]


def test_no_lua_function_is_over_100_lines() -> None:
    found = 0
    for f in all_files():
        for fn in functions(f.text):
            found += 1
            length = fn.last - fn.first + 1
            assert length <= MAX_LINES, f"{f.name}: {fn.name} is {length} lines (line {fn.first})"
    assert found > 80  # the scanner sees the library's functions (about 90 of them)


def test_the_function_scanner_counts_a_function_to_its_own_end() -> None:
    text = ("local function a(x)\n  if x then\n    for i = 1, 2 do x = i end\n  end\n"
            "  table.sort(x, function(p, q) return p < q end)\n  return '--[[ end'\nend\n"
            "--[[ function end ]]\nlocal function b()\n  repeat local y = 1 until y\nend\n")
    assert functions(text) == [Function("<anonymous>", 5, 5), Function("a", 1, 7),
                               Function("b", 9, 11)]


def test_each_file_includes_every_helper_it_uses() -> None:
    """Redis compiles the payload as one chunk, so a helper used without its include would
    still be in scope, by luck of the order or through another include: each file names every
    include it reads from itself, and no other."""
    includes = {f.name.removeprefix("includes/").removesuffix(".lua"): f
                for f in lua_files()["includes"]}
    owner: dict[str, str] = {}
    for name, f in includes.items():
        for local in top_level_locals(f.text):
            assert local not in owner, f"{local} is declared by {owner.get(local)} and {name}"
            owner[local] = name
    for f in all_files():
        own = top_level_locals(f.text)
        used = {owner[name] for name in used_names(f.text) - own if name in owner}
        for name in sorted(used_names(f.text) - own):
            if name in owner:
                assert owner[name] in f.includes, (
                    f"{f.name} uses {name} of includes/{owner[name]}.lua without including it")
        assert not set(f.includes) - used, f"{f.name} includes {set(f.includes) - used} unused"


def test_library_source_is_deterministic_and_in_dependency_order() -> None:
    payload = library_source()
    assert payload == library_source()
    assert payload.startswith(f"#!lua name={LIBRARY}\n")
    at = {}
    for f in all_files():
        marker = f"-- lua/{f.name}\n"
        assert payload.count(marker) == 1, f"{f.name} is in the payload {payload.count(marker)}x"
        at[f.name] = payload.index(marker)
    for f in all_files():
        for name in f.includes:
            assert at[f"includes/{name}.lua"] < at[f.name], f"{f.name} comes before {name}"
    assert '--- @include' not in payload


def test_each_registered_function_has_a_file_of_its_own() -> None:
    registered = re.findall(r"^register\('([a-z_]+)'", library_source(), re.M)
    assert len(registered) == len(set(registered)) >= 16
    files = {p.stem: p for p in [*LUA.glob("*.lua"), *LUA.glob("pool/*.lua")]}
    assert sorted(registered) == sorted(files)
    for name, path in files.items():
        text = path.read_text()
        head = text[:text.index("]]")]
        assert head.startswith(f"--[[ {name}: "), f"{path.name} opens with no header"
        assert "KEYS:" in head and "ARGV:" in head, f"{path.name}'s header lists no KEYS/ARGV"
        assert re.findall(r"^register\('([a-z_]+)'", text, re.M) == [name]
    assert files["lanes_add_urls"].parent.name == "pool"


def test_the_claim_pass_steps_carry_the_names_of_the_c_pass() -> None:
    text = (LUA / "includes" / "claim_pass.lua").read_text()
    names = {fn.name for fn in functions(text)}
    steps = {"accrue", "urgent_cap", "floors", "remainder_edf", "remainder_lateness", "commit"}
    assert steps <= names
    c = (ROOT / "csrc" / "claim.c").read_text()
    for step in ("remainder_lateness", "credit_accrue"):
        assert re.search(rf"^static \w+ {step}\(", c, re.M), step
    # C's edf is remainder_lateness with every lane weighing 1, every interval 1 s (P.unit)
    assert re.search(r"P\.unit = p->remainder == RL_REMAINDER_EDF;", c)
    for step in steps:  # the header's table maps every step
        assert re.search(rf"^  \S.*\b{step}\b", text, re.M), step


def _files(**texts: str) -> dict[str, list[LuaFile]]:
    parts: dict[str, list[LuaFile]] = {"includes": [], "queue": [], "pool": []}
    for name, text in sorted(texts.items()):
        part = "includes" if name.startswith("inc_") else "queue"
        path = f"includes/{name[4:]}.lua" if part == "includes" else f"{name}.lua"
        parts[part].append(LuaFile(path, text))
    return parts


FN = "--[[ lanes_x: x. KEYS: none. ARGV: none. ]]\n{inc}local function f_x() end\n" \
     "register('lanes_x', f_x)\n"


@pytest.mark.parametrize(("files", "error"), [
    (_files(lanes_x=FN.format(inc='--- @include "gone"\n')), "no lua/includes/gone.lua"),
    (_files(lanes_x=FN.format(inc='--- @include "a"\n--- @include "a"\n'),
            inc_a="local A = 1\n"), "includes 'a' twice"),
    (_files(lanes_x=FN.format(inc='--- @include "a"\n'), inc_a='--- @include "b"\n',
            inc_b='--- @include "a"\n'), "cycle: a -> b -> a"),
    (_files(lanes_x=FN.format(inc=""), inc_a="local A = 1\n"), "a included by no function"),
    (_files(lanes_x=FN.format(inc='--- @include "a"\n'), inc_a="register('lanes_a', f)\n"),
     "an include registers nothing"),
    (_files(lanes_y=FN.format(inc="")), "must register 'lanes_y' alone"),
])
def test_assemble_refuses_files_that_make_no_library(files: dict[str, list[LuaFile]],
                                                     error: str) -> None:
    with pytest.raises(LibraryFilesError, match=re.escape(error)):
        assemble(files)


def test_assemble_puts_an_include_once_after_the_includes_it_names() -> None:
    files = _files(lanes_x=FN.format(inc='--- @include "b"\n--- @include "a"\n'),
                   inc_a='--- @include "b"\nlocal A = B\n', inc_b="local B = 1\n")
    payload = assemble(files)
    assert payload == assemble(files)
    order = re.findall(r"^-- lua/(\S+)$", payload, re.M)
    assert order == ["includes/b.lua", "includes/a.lua", "lanes_x.lua"]


def test_redis_loads_the_payload_with_every_function_of_the_files(redis_server: Any) -> None:
    r = redis_server.client(decode_responses=True)
    r.function_load(library_source(), replace=True)
    (lib,) = r.function_list(library=LIBRARY)  # RESP2: flat name, value lists
    lib = dict(zip(lib[::2], lib[1::2], strict=True))
    names = {dict(zip(f[::2], f[1::2], strict=True))["name"] for f in lib["functions"]}
    assert names == {p.stem for p in [*LUA.glob("*.lua"), *LUA.glob("pool/*.lua")]}
