"""The shape of the package: imports point one way, the Redis backend stands without the C core,
and no function in engine/ runs past 100 lines."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "engine"
MAX_FUNCTION_LINES = 100


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports when it runs: at module level and inside
    functions alike (an import only for the type checker, under ``if TYPE_CHECKING:``, runs
    never and is left out)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{module}.{alias.name}"
                resolve(full if full in known else module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.JoinedStr):  # engine/__init__'s lazy backends
                for value in ("engine.shm", "engine.redis"):
                    resolve(value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    compiled = {f"{_module_name(p.parent / '__init__.py')}.{p.name.split('.')[0]}"
                for p in PACKAGE.rglob("*.pyi")}  # the C modules, each with its stub
    known = set(modules) | compiled
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_module_of_the_package_imports_its_way_back_to_itself() -> None:
    """Function-level imports count: the package is a graph without a circle (the package's
    __init__ imports its parts; no part imports it)."""
    graph = _graph()
    assert "engine.redis.transport" in graph and "engine.api" in graph  # the walk sees them
    assert _cycles(graph) == []
    assert not [m for m, deps in graph.items() if "engine" in deps], "a module imports __init__"


def test_the_contract_imports_no_backend_and_the_backends_meet_only_in_the_package() -> None:
    graph = _graph()
    assert _reaches(graph, "engine.api") == set()
    redis_side = _reaches(graph, "engine.redis.engine") | _reaches(graph, "engine.redis.urls")
    assert not redis_side & {"engine.shm", "engine.shm.engine", "engine.shm.segment", "engine._core", "engine._hot"}
    assert "engine.checkpoint" in redis_side and "engine.checks" in redis_side
    assert not _reaches(graph, "engine.checkpoint") & {"engine.shm.engine", "engine.redis.engine",
                                                       "engine.shm.segment"}


BLOCKED_IMPORT = textwrap.dedent("""
    import sys

    BLOCKED = ("engine._core", "engine._hot", "engine.shm", "engine.shm.engine", "engine.shm.segment")

    class Refuse:
        # Stands for a tree where the C core never built: importing it fails.
        def find_spec(self, name, path=None, target=None):
            if name in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Refuse())

    import engine.redis
    from engine.redis.urls import RedisUrls

    url, name = sys.argv[1], sys.argv[2]
    eng = engine.redis.RedisEngine.connect(url, name, create=True, capacity=100)
    try:
        rows = eng.add_many([1_000, 2_000, 3_000], 60)
        batch = eng.claim(budget=2, now_ms=10_000)
        assert batch.rows.tolist() == rows[:2].tolist(), batch
        assert eng.complete_many(batch.rows, batch.tokens, now_ms=10_000).all()
        assert eng.verify() == [], eng.verify()
        assert eng.stats(now_ms=10_000)["queued"] == 3
        assert len(RedisUrls(eng)) == 0
        try:
            engine.Engine
        except ImportError:
            pass
        else:
            raise AssertionError("the shared-memory engine imported past the block")
    finally:
        eng.drop()
        eng.close()
    loaded = sorted(m for m in BLOCKED if m in sys.modules)
    assert not loaded, loaded
    print("ok")
""")


def test_the_redis_backend_runs_where_the_c_core_cannot_be_imported(redis_server) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, redis_server.url,
                           "layout-no-core"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}",
             node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_python_function_in_the_package_runs_past_100_lines(path: Path) -> None:
    long = [(where, n) for where, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert not long, f"split these (lines): {long}"
