"""The server's instructions for a Redis scope, this tree's Lua library beside another commit's.

    .venv/bin/python bench/profile_recache.py [--before REV] [--rows N] [--out FILE]

On a shared machine the wall time and even the CPU seconds of a scope move by half from run to
run (bench_recache); the instructions the server executes do not. So a redis-server runs under
valgrind's callgrind with instrumentation off, a pool of ``--rows`` rows is added (the URLs of
bench_recache), and for each library (this tree's, then ``--before``'s, then this tree's again:
the two of this tree agree within 1 %) one scope over all rows warms it, then one more
is counted (``callgrind_control -i on`` around it). Caches and memory stalls are not counted:
this says what the Lua and the commands cost, not how the skiplist's misses move.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_recache import SCOPE, _fill
from common import ROOT, figure, finish, parse_args, ratios, skipped

import engine
from engine.redis import library

BEFORE = "8a61236"
"""The default ``--before``: the tree before the records were read per bucket (issue 33)."""


def payload_at(rev: str) -> str:
    """The library as commit ``rev`` had it, its VERSION made this tree's (so this client may
    call it: the functions' arguments have not changed)."""
    def text(name: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:engine/redis/lua/{name}"], cwd=ROOT,
                              check=True, capture_output=True, text=True).stdout

    files = {part: [library.LuaFile(f.name, text(f.name)) for f in fs]
             for part, fs in library.lua_files().items()}
    files["includes"] = [library.LuaFile(f.name, _with_version(f.text))
                         if f.name == "includes/base.lua" else f for f in files["includes"]]
    return library.assemble(files)


def _with_version(text: str) -> str:
    from engine.redis.codec import LIBRARY_VERSION

    start = text.index("local VERSION = '") + len("local VERSION = '")
    return text[:start] + LIBRARY_VERSION + text[text.index("'", start):]


def main() -> None:
    def extra(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--before", default=BEFORE)
        ap.add_argument("--rows", type=int)

    args = parse_args(__doc__, extra)
    started = time.perf_counter()
    n = args.rows or (20_000 if args.smoke else 200_000)
    if not (shutil.which("valgrind") and shutil.which("redis-server")):
        finish("profile_recache", args, [skipped("recache.instructions.after", "a scope's"
                                                 " instructions", "no valgrind or redis-server")],
               started)
        return
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    sock = work / "redis.sock"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={work}/cg.out", "redis-server", "--unixsocket", str(sock),
         "--port", "0", "--save", "", "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("redis-server under valgrind never opened its socket")
            time.sleep(0.2)
        time.sleep(1)
        eng = engine.open("bench-recache", f"unix://{sock}", create=True, capacity=n + 16)
        table = eng.row_urls()
        _fill(table, n, 0)
        client = eng.transport.live()
        payloads = {"after": library.library_source(), "before": payload_at(args.before)}
        counted: dict[str, list[float]] = {"after": [], "before": []}
        for k, which in enumerate(["after", "before", "after"]):
            client.execute_command("FUNCTION", "LOAD", "REPLACE", payloads[which])
            got = table.prioritize_prefix(SCOPE[:-1], "wait")  # warm, and checked
            assert got.matched == n and got.done == n, got
            control = ["callgrind_control", str(server.pid)]
            subprocess.run([*control, "-z"], check=True, capture_output=True)
            subprocess.run([*control, "-i", "on"], check=True, capture_output=True)
            table.prioritize_prefix(SCOPE[:-1], "wait")
            subprocess.run([*control, "-i", "off"], check=True, capture_output=True)
            subprocess.run([*control, "-d", f"run{k}"], check=True, capture_output=True)
            dump = max(work.glob("cg.out*"), key=os.path.getmtime)
            totals = next(line for line in dump.read_text().splitlines()
                          if line.startswith("totals:"))
            counted[which].append(int(totals.split()[1]) / n)
        table.drop()
        eng.drop()
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    rev = subprocess.run(["git", "rev-parse", "--short=12", args.before], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.strip()
    figures = [
        figure("recache.instructions.after", f"Redis: the server's instructions a row for a"
               f" scope over all {n:,} rows, this tree's library (callgrind)", "instructions",
               counted["after"]),
        figure("recache.instructions.before", f"the same with the library of {rev}",
               "instructions", counted["before"]),
        figure("recache.instructions.after_over_before", "this tree ÷ before, same server",
               "x", ratios(counted["after"], counted["before"] * 2)),
    ]
    finish("profile_recache", args, figures, started)


if __name__ == "__main__":
    sys.exit(main())
