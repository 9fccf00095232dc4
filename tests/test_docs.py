"""Every cross-reference resolves: a "§N" names a section its doc has, and a file or a dotted
module name in the docs, the README or a comment is in the repo. Every figure the README and
the docs quote is in a saved run under bench/results/. The README stays short, design.md within
40 KB and docs/ within 150 KB, and the docs hold no history (commit hashes, "used to")."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import json
import re
import subprocess
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 12 * 1024
DESIGN_LIMIT = 40 * 1000
DOCS_LIMIT = 150 * 1000

FILE_NAME = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)*[\w-]+\.(?:md|py|pyi|c|h|lua|pml|sh|toml))\b")
"""A name of a file of the kinds the repo is made of (data files in examples are left out: a
corpus named ``urls.csv`` in a usage line is the reader's, not ours)."""
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
NAMED = re.compile(
    r"(?P<doc>(?:[\w-]+/)*[\w-]+\.md)\)?\W{0,3}(?P<refs>§\d+(?:\.\d+)?"
    r"(?:\s*(?:,|and|–|-|to|or)\s*§\d+(?:\.\d+)?)*)")
"""A doc name and the sections cited right after it: ``design.md §5, §14`` or
``design.md §14–§15``."""


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return tuple(out)


def _sources() -> list[Path]:
    kinds = (".md", ".py", ".pyi", ".c", ".h", ".lua", ".pml", ".sh", ".toml")
    return [ROOT / p for p in tracked() if p.endswith(kinds) and (ROOT / p).exists()]


def _python_text(source: str) -> str:
    """The comments and docstrings of a Python file: its prose."""
    parts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    for node in ast.walk(tree):  # attribute docstrings: a string statement after an assignment
        body = getattr(node, "body", None)
        if isinstance(body, list):
            parts += [s.value.value for s in body[1:] if isinstance(s, ast.Expr)
                      and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)]
    return "\n".join(parts)


def _c_text(source: str) -> str:
    return "\n".join(re.findall(r"/\*.*?\*/|//[^\n]*", source, re.S))


def _lua_text(source: str) -> str:
    return "\n".join(re.findall(r"--\[\[.*?\]\]|--[^\n]*", source, re.S))


def prose(path: Path) -> str:
    """What a reader reads in ``path``: a doc whole, the comments of code."""
    text = path.read_text()
    if path.suffix == ".py":
        return _python_text(text)
    if path.suffix in (".c", ".h", ".pml"):
        return _c_text(text)
    if path.suffix == ".lua":
        return _lua_text(text)
    if path.suffix in (".sh", ".toml"):
        return "\n".join(re.findall(r"#[^\n]*", text))
    return text


def resolve(name: str, near: Path) -> Path | None:
    """The tracked file ``name`` means, seen from ``near``: a path relative to it or to the
    root, or a tracked path that ends in it."""
    for base in (near.parent, ROOT, ROOT / "docs"):
        candidate = (base / name).resolve()
        if candidate.is_file() and str(candidate.relative_to(ROOT)) in tracked():
            return candidate
    ends = [p for p in tracked() if p == name or p.endswith("/" + name)]
    return ROOT / ends[0] if ends else None


def sections(doc: Path) -> set[str]:
    """The numbered headings of a doc (``## 8. Floors`` is "8", ``### 8.2 ...`` is "8.2")."""
    return set(re.findall(r"^#+\s+(\d+(?:\.\d+)*)\.?\s", doc.read_text(), re.M))


def dangling_sections(path: Path) -> list[str]:
    text = prose(path)
    bad: list[str] = []
    cited: set[int] = set()
    for m in NAMED.finditer(text):
        doc = resolve(m["doc"], path)
        numbers = SECTION.findall(m["refs"])
        cited.update(range(m.start("refs"), m.end("refs")))
        if doc is None:
            bad.append(f"{m['doc']} (no such doc) {m['refs']}")
            continue
        have = sections(doc)
        bad += [f"{m['doc']} §{n}" for n in numbers if n not in have]
    for m in SECTION.finditer(text):
        if m.start() in cited:
            continue
        if path.suffix != ".md":
            bad.append(f"§{m[1]} names no doc")
        elif m[1] not in sections(path):
            bad.append(f"§{m[1]} (this doc)")
    return bad


def _system_header(name: str) -> bool:
    """A C header of the system (``linux/futex.h``), named beside the code that follows it."""
    return name.endswith(".h") and (Path("/usr/include") / name).is_file()


def missing_files(path: Path) -> list[str]:
    return sorted({m[1] for m in FILE_NAME.finditer(prose(path))
                   if resolve(m[1], path) is None and not _system_header(m[1])})


SOURCES = _sources()
IDS = [str(p.relative_to(ROOT)) for p in SOURCES]


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_every_section_reference_names_a_section_of_its_doc(path: Path) -> None:
    assert dangling_sections(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_every_file_named_in_docs_and_comments_is_in_the_repo(path: Path) -> None:
    assert missing_files(path) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "design.md"
    assert {"2", "8", "14"} <= sections(doc)
    note = ROOT / "tests" / "x.py"  # as if it were a test module here
    assert resolve("design.md", note) == doc and resolve("redis/engine.py", note) is not None
    assert resolve("API.md", note) is None and resolve("DESIGN.md", note) is None
    fake = tmp_path / "note.md"
    fake.write_text("See docs/design.md §8 and §99, API.md, design.md §3, §14–§15; here §1.\n")
    problems = dangling_sections(fake)
    assert problems == ["docs/design.md §99", "§1 (this doc)"], problems
    assert missing_files(fake) == ["API.md"]


def test_the_readme_stays_short() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/"


def test_the_docs_read_in_one_sitting() -> None:
    """design.md says what is, each mechanism with why and its test, in at most 40 KB; all of
    docs/ stays under 150 KB (measurements belong in figures.md, history in git)."""
    design = len((ROOT / "docs" / "design.md").read_bytes())
    assert design <= DESIGN_LIMIT, f"docs/design.md is {design} bytes"
    docs = sum(len((ROOT / p).read_bytes()) for p in tracked()
               if p.startswith("docs/") and p.endswith(".md"))
    assert docs <= DOCS_LIMIT, f"docs/*.md are {docs} bytes"


HISTORY = re.compile(r"used to|before this change|`[0-9a-f]{7,12}`")


def test_docs_describe_what_is_not_its_history() -> None:
    """No commit hashes and no "used to" in the docs: history stays in git."""
    found = {p: HISTORY.findall((ROOT / p).read_text()) for p in tracked()
             if (p.startswith("docs/") and p.endswith(".md")) or p == "README.md"}
    assert {p: f for p, f in found.items() if f} == {}


DOTTED = re.compile(r"(?<![\w/.-])engine(?:\.[A-Za-z_]\w*)+")
"""A dotted name in the package: ``engine.report.metrics``, ``engine.policy.reference_pass``."""
FILE_SUFFIXES = {"py", "pyi", "md", "c", "h", "lua", "toml", "sh", "json", "so", "txt", "pml"}


@cache
def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def dotted_name_problem(name: str) -> str | None:
    """Why ``name`` names nothing in the package (None: it names a module, or an attribute of
    the longest module it starts with)."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:  # ``engine.py``: a file name, checked as one
        return None
    k = len(parts)
    while k > 1 and not _module_exists(".".join(parts[:k])):
        k -= 1
    if k == len(parts):
        return None
    module = importlib.import_module(".".join(parts[:k]))
    if hasattr(module, parts[k]):
        return None
    return f"{name} ({'.'.join(parts[:k])} has no {parts[k]})"


def missing_dotted_names(path: Path) -> list[str]:
    found = {m[0].rstrip(".") for m in DOTTED.finditer(prose(path))}
    return sorted(p for p in map(dotted_name_problem, found) if p)


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_every_dotted_module_name_in_docs_and_comments_exists(path: Path) -> None:
    assert missing_dotted_names(path) == []


def test_the_dotted_name_check_catches_a_moved_module() -> None:
    assert dotted_name_problem("engine.report.metrics") is None
    assert dotted_name_problem("engine.policy.reference_pass") is None
    assert dotted_name_problem("engine.Engine") is None
    assert dotted_name_problem("engine.board") == "engine.board (engine has no board)"
    assert dotted_name_problem("engine.policy.no_such_thing") is not None


# ------------------------------------------------------------------ figures from saved runs ----

RESULTS = ROOT / "bench" / "results"
UNITS = {  # how a figure's unit is written in prose -> (the unit saved, scale)
    "×": ("x", 1.0), "µs": ("µs", 1.0), "M rows/s": ("rows/s", 1e6), "M/s": ("rows/s", 1e6),
    "k rows/s": ("rows/s", 1e3), "bytes": ("bytes", 1.0), "MiB": ("MiB", 1.0),
}
NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
FIGURE = re.compile(rf"(?<![\w.≤≥<>=~≈^*-])(?P<a>{NUMBER})(?:\s?[–-]\s?(?P<b>{NUMBER}))?\s?"
                    rf"(?P<unit>{_UNIT})(?!\w)")
"""A measured figure in prose: ``1.24 µs``, ``4.52 M rows/s``, ``1.10–1.40×``. A number after
≤, ≥, <, > or ≈ is a target or a bound, not a measurement (``≤ 1.7 µs``), and one after ^ or
* an exponent (``2^29 bytes``)."""
RANGE = re.compile(rf"\[(?P<a>{NUMBER})\s?[–-]\s?(?P<b>{NUMBER})\]")
"""The range after a figure: ``1.24 µs [1.20–1.46]``, in the figure's unit."""


def saved_values() -> dict[str, list[float]]:
    """Every value of every saved run under bench/results (medians, ranges, each run's), by
    unit."""
    out: dict[str, list[float]] = {}
    for name in tracked():
        if not (name.startswith("bench/results/") and name.endswith(".json")):
            continue
        doc = json.loads((ROOT / name).read_text())
        if not isinstance(doc, dict):
            continue  # a script's raw output (a list of samples), not a run of figures
        for f in doc.get("figures", []):
            if "median" in f:
                vals = [f["median"], f["min"], f["max"], *f.get("values", [])]
                out.setdefault(f["unit"], []).extend(float(v) for v in vals)
    return out


def _found(text: str, unit: str, saved: dict[str, list[float]]) -> bool:
    saved_unit, scale = UNITS[unit]
    value = float(text.replace(",", ""))
    half = 0.5 * 10 ** -len(text.partition(".")[2]) + 1e-9  # as rounded to its printed digits
    return any(abs(v / scale - value) <= half for v in saved.get(saved_unit, []))


def unsaved_figures(text: str, saved: dict[str, list[float]]) -> list[str]:
    bad = []
    for m in FIGURE.finditer(text):
        if text[:m.start()].rstrip()[-1:] in ("≤", "≥", "<", ">", "≈", "~", "="):
            continue  # a target or a bound
        unit = m["unit"]
        numbers = [m["a"], *([m["b"]] if m["b"] else [])]
        rest = text[m.end():m.end() + 40]
        r = RANGE.match(rest.lstrip(" ("))
        if r:
            numbers += [r["a"], r["b"]]
        bad += [f"{n} {unit} ({m[0]!r})" for n in numbers if not _found(n, unit, saved)]
    return bad


DOCS = ["README.md", *(p for p in tracked() if p.startswith("docs/") and p.endswith(".md"))]


@pytest.mark.parametrize("doc", DOCS)
def test_every_quoted_figure_is_in_a_saved_run(doc: str) -> None:
    """A figure the README or a doc quotes (a number of ×, µs, rows/s, bytes or MiB) is one a
    benchmark saved (bench/results/latest.json from ``make bench``, sim.json from
    bench/bench_sim.py), as printed there: a figure written by hand or left from an overwritten
    run fails here."""
    problems = unsaved_figures((ROOT / doc).read_text(), saved_values())
    assert problems == [], f"{doc}: figures found in no saved run under bench/results/"


def test_the_figure_check_catches_a_figure_no_run_saved() -> None:
    saved = {"µs": [1.2371, 1.2, 1.46], "x": [3.3537], "rows/s": [4.52e6]}
    assert unsaved_figures("1.24 µs [1.20–1.46], 3.35× and 4.52 M rows/s; ≤ 1.7 µs", saved) == []
    assert unsaved_figures("0.91 µs, 3.5×", saved) == ["0.91 µs ('0.91 µs')", "3.5 × ('3.5×')"]
    assert unsaved_figures("1.24 µs [1.20–1.50]", saved) == ["1.50 µs ('1.24 µs')"]
