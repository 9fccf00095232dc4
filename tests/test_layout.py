"""The shape of the package: imports point one way (no circle, type-checking imports
included), only the factory names a backend, the Redis backend stands without the C core, no
function (Python, C, Lua) runs past 80 lines, and engine/ repeats few blocks."""

from __future__ import annotations

import ast
import io
import keyword
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "engine"
MAX_FUNCTION_LINES = 80
BACKENDS = ("engine.shm", "engine.redis")
MAY_NAME_A_BACKEND = {"engine", "engine.factory", "engine.store.pointers"}
"""The factory, and the package's __init__, which exports ``Engine`` and ``RedisEngine`` (each
imported when first asked for); and the shared store's pointers, which live in the queue's
Redis and go through its transport (one retry rule for every Redis call)."""
STORE_BACKENDS = ("engine.store.local", "engine.store.s3", "engine.store.pointers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports: at module level, inside functions and
    under ``if TYPE_CHECKING:`` alike (a circle the type checker sees is a circle a reader
    has to hold in mind)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
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
    """Function-level and type-checking imports count: the package is a graph without a circle
    (the package's __init__ imports its parts; no part imports it)."""
    graph = _graph()
    assert "engine.redis.transport" in graph and "engine.api" in graph  # the walk sees them
    assert _cycles(graph) == []
    assert not [m for m, deps in graph.items() if "engine" in deps], "a module imports __init__"


def _is_backend(module: str) -> bool:
    return any(module == b or module.startswith(b + ".") for b in BACKENDS)


def test_only_the_factory_names_a_backend() -> None:
    """Above the backends everything speaks the contract: no module outside engine/shm/ and
    engine/redis/ imports either, but the factory (``engine.open``) and the package's
    exports."""
    graph = _graph()
    assert {"engine.shm", "engine.redis.shards"} <= graph["engine.factory"]
    naming = {m: sorted(d for d in deps if _is_backend(d)) for m, deps in graph.items()
              if not _is_backend(m) and m not in MAY_NAME_A_BACKEND}
    assert {m: deps for m, deps in naming.items() if deps} == {}


def test_only_the_store_package_names_a_store_backend() -> None:
    """The pool, the server and the CLI open a store with ``engine.store.open_store`` and speak
    ``engine.store.api.Store``; the store contract imports no store backend."""
    graph = _graph()
    assert set(STORE_BACKENDS) <= set(graph), "a store backend moved: update STORE_BACKENDS"
    naming = {m: sorted(d for d in deps if d in STORE_BACKENDS) for m, deps in graph.items()
              if not (m == "engine.store" or m.startswith("engine.store."))}
    assert {m: deps for m, deps in naming.items() if deps} == {}
    assert not _reaches(graph, "engine.store.api") & set(STORE_BACKENDS)


def test_the_corpus_readers_stand_below_the_pool_and_url_spelling_is_a_leaf() -> None:
    """``engine.corpus`` reads files and sitemaps for the pool, the server and the command line,
    so it imports none of them and no backend; ``lanes serve`` spells a URL with
    ``engine.corpus.urlnorm`` alone, without the readers and their XML parser."""
    graph = _graph()
    corpus = [m for m in graph if m.startswith("engine.corpus.")]
    assert {"engine.corpus.read", "engine.corpus.sitemaps", "engine.corpus.urlnorm"} <= set(corpus)
    above = ("engine.pool", "engine.serve", "engine.cli", "engine.shm", "engine.redis")
    reached = set().union(*(_reaches(graph, m) for m in corpus))
    assert sorted(m for m in reached if m.startswith(above)) == []
    assert _reaches(graph, "engine.corpus.urlnorm") <= {"engine.errors"}
    assert "engine.corpus.sitemaps" not in _reaches(graph, "engine.serve.snapshots")


def test_the_contract_imports_no_backend_and_the_backends_meet_only_in_the_package() -> None:
    graph = _graph()
    assert not [m for m in _reaches(graph, "engine.api") if _is_backend(m)]
    redis_side = _reaches(graph, "engine.redis.engine") | _reaches(graph, "engine.redis.urls")
    assert not [m for m in redis_side if m.startswith("engine.shm")]
    assert not redis_side & {"engine._core", "engine._hot"}
    assert "engine.checkpoint" in redis_side and "engine.checks" in redis_side
    assert not _reaches(graph, "engine.checkpoint") & {"engine.shm.engine", "engine.redis.engine",
                                                       "engine.shm.segment"}


BLOCKED_IMPORT = textwrap.dedent("""
    import sys

    BLOCKED = ("engine._core", "engine._hot", "engine.shm", "engine.shm.engine",
               "engine.shm.segment")

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


def _python_functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(f"{path.relative_to(ROOT)}:{node.name}",
             node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


_C_HEAD = re.compile(r"^(?!typedef|struct|enum|union|#)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;]*$")


def _c_functions(path: Path) -> list[tuple[str, int]]:
    """Definitions at the left margin (the project's style: the return type on the name's
    line, the body closed by a ``}`` in column 0)."""
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        head = _C_HEAD.match(lines[i])
        j = i
        while head and j < len(lines) and "{" not in lines[j] and not lines[j].endswith(";"):
            j += 1
        if head and j < len(lines) and lines[j].rstrip().endswith("{"):
            end = next(k for k in range(j + 1, len(lines)) if lines[k].startswith("}"))
            out.append((f"{path.relative_to(ROOT)}:{head.group(1)}", end - i + 1))
            i = end
        i += 1
    return out


_LUA_HEAD = re.compile(r"^(?:local\s+)?function\s+([\w.:]+)\s*\(")


def _lua_functions(path: Path) -> list[tuple[str, int]]:
    lines, out = path.read_text().splitlines(), []
    for i, line in enumerate(lines):
        head = _LUA_HEAD.match(line)
        if head:
            end = next(k for k in range(i + 1, len(lines)) if re.match(r"^end\b", lines[k]))
            out.append((f"{path.relative_to(ROOT)}:{head.group(1)}", end - i + 1))
    return out


def _all_functions() -> dict[str, int]:
    found: list[tuple[str, int]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += _python_functions(path)
    for path in sorted((ROOT / "csrc").glob("*.[ch]")):
        found += _c_functions(path)
    for path in sorted(PACKAGE.rglob("*.lua")):
        found += _lua_functions(path)
    return dict(found)


LONG_FUNCTIONS = {
    # The claim pass and its hot path (csrc/), and the simulator's loop: each reads as one
    # pass; split them and this list shrinks. A function here may not grow; a new one may not
    # join.
    "csrc/claim.c:rl_claim": 86,
    "csrc/hot.c:hot_complete_and_claim": 85,
    "engine/sim.py:_loop": 86,
}


def test_the_function_walk_sees_the_three_languages() -> None:
    names = _all_functions()
    assert "csrc/claim.c:rl_claim" in names and "engine/redis/lua/includes/queue.lua:" not in names
    assert any(n.startswith("engine/redis/lua/") for n in names)
    assert "engine/api.py:__len__" in names


def test_no_function_runs_past_80_lines_but_the_listed_ones_which_only_shrink() -> None:
    long = {n: lines for n, lines in _all_functions().items() if lines > MAX_FUNCTION_LINES}
    new = {n: lines for n, lines in long.items() if n not in LONG_FUNCTIONS}
    assert not new, f"split these (lines): {new}"
    grown = {n: (lines, LONG_FUNCTIONS[n]) for n, lines in long.items()
             if lines > LONG_FUNCTIONS[n]}
    assert not grown, f"grew past their listed length (now, listed): {grown}"
    done = sorted(set(LONG_FUNCTIONS) - set(long))
    assert not done, f"no longer past {MAX_FUNCTION_LINES} lines: take them off the list: {done}"


MAX_REPEATS = 5
BLOCK = 6


def _shapes(path: Path) -> list[tuple[int, str]]:
    """Each line of code as its tokens, strings and numbers folded (the same line with other
    values has the same shape); imports, docstrings, comments and lone punctuation left out."""
    text = path.read_text()
    skip: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            skip.update(range(node.lineno, node.end_lineno + 1))  # type: ignore[operator]
    per_line: dict[int, list[str]] = defaultdict(list)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        word = {tokenize.NUMBER: "0", tokenize.STRING: "S"}.get(tok.type, tok.string)
        if tok.type not in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP):
            word = "S"  # the parts of an f-string
        per_line[tok.start[0]].append(word)
    out = []
    for line, words in sorted(per_line.items()):
        bare = [w for w in words if w not in ("S", "0") and not keyword.iskeyword(w)]
        if line not in skip and any(re.search(r"\w", w) for w in bare):
            out.append((line, " ".join(words)))
    return out


def _repeats() -> list[tuple[str, str]]:
    """Pairs of places in engine/ that share a run of ``BLOCK`` lines of one shape (runs of a
    pair that overlap are one repeat)."""
    where: dict[tuple[str, ...], list[tuple[str, int, int]]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _shapes(path)
        for i in range(len(lines) - BLOCK + 1):
            key = tuple(shape for _, shape in lines[i:i + BLOCK])
            where[key].append((str(path.relative_to(ROOT)), lines[i][0], lines[i + BLOCK - 1][0]))
    runs: dict[tuple[str, str], list[tuple[int, int, int, int]]] = defaultdict(list)
    for places in where.values():
        for a, (fa, a0, a1) in enumerate(places):
            for fb, b0, b1 in places[a + 1:]:
                if fa == fb and b0 <= a1:
                    continue  # one place overlapping itself
                spans = runs[(fa, fb)]
                if not any(a0 <= s[1] + 1 and s[0] <= a0 and b0 <= s[3] + 1 and s[2] <= b0
                           for s in spans):
                    spans.append((a0, a1, b0, b1))
                else:
                    k = next(i for i, s in enumerate(spans) if a0 <= s[1] + 1 and s[0] <= a0)
                    s = spans[k]
                    spans[k] = (s[0], max(s[1], a1), s[2], max(s[3], b1))
    return [(f"{fa}:{s[0]}-{s[1]}", f"{fb}:{s[2]}-{s[3]}")
            for (fa, fb), spans in sorted(runs.items()) for s in spans]


def test_engine_repeats_at_most_five_blocks_of_six_lines() -> None:
    """One function where two places need the same logic: a run of six lines that stands
    again elsewhere in engine/ (the same code but for its strings and numbers) is a repeat,
    and five is the most the package may hold."""
    repeats = _repeats()
    assert len(repeats) <= MAX_REPEATS, "\n".join(f"{a} ~ {b}" for a, b in repeats)
