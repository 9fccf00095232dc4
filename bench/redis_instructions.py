"""What one worker cycle costs the server in instructions, counted by valgrind (callgrind): a
figure the machine's load does not move, where the wall-clock figures of bench_redis.py and
redis_calls.py swing by 2x on a shared 2-core VM (docs/redis.md "Figures").

    .venv/bin/python bench/redis_instructions.py [--rows N] [--cycles N] [--checkout DIR]
        [--remainder R | --remainders] [--shape production] [--out FILE]

One redis-server runs under ``valgrind --tool=callgrind --instr-atstart=no``; the queue is
filled and warmed up uninstrumented, then instrumentation is switched on (``callgrind_control
-i on``) for ``--cycles`` cycles of ``complete_and_claim`` of 16 and off again. Prints the
server's instructions per cycle (``processCommand`` inclusive, divided by the commands
counted, times the commands of a cycle: the command with its lookup and reply, for the FCALL
its redis.calls and the Lua VM; reading the socket and parsing the request are not in it) and
the top functions by inclusive count. ``--peer zpopmin`` counts bench_servers.py's ZPOPMIN
peer's cycle (ZPOPMIN 16 + ZADD 16) the same way. ``--checkout`` counts the engine of another
checkout (e.g. the main branch), with this bench's corpus. ``--remainders`` counts the default
policy with each remainder in turn (a server each) and prints each over lane order;
``--shape production`` fills the queue with bench_constraints (f)'s rows and policy instead
(its bands and floors, 128 rows held in flight); ``--out`` saves the counts as JSON. Needs
valgrind; about 10 s a count.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if "--checkout" in sys.argv:  # before common.py puts this checkout first on the path
    sys.path.insert(0, sys.argv[sys.argv.index("--checkout") + 1])
    import engine  # noqa: F401  (common.py's `from engine import` then finds this one)
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "lib"))

from common import BUDGET, NOW, corpus, figure  # noqa: E402
from redis_server import RedisServer, find_server  # noqa: E402

from engine import STRIDE, LanePolicy, RedisEngine  # noqa: E402
from engine.policy import REMAINDERS  # noqa: E402

LEASE_MS = 60_000


def engine_cycles(srv: RedisServer, rows: int, remainder: str | None = None,
                  fitted: bool = False, shape: str = "bench") -> tuple[Callable[[], None], int]:
    """(one worker cycle of RedisEngine, commands per cycle), the queue filled and warm; the
    default policy, or the default with another ``remainder``; ``fitted``: the policy
    ``LanePolicy.fitted`` to the corpus (64 lanes), with ``remainder`` when given; ``shape``
    "production": bench_constraints (f)'s rows and policy, 128 rows held in flight."""
    rows_in = corpus(rows)
    policy = LanePolicy()
    if shape == "production":
        import bench_constraints as bc

        rows_in, policy = bc.production_rows(rows), bc.PRODUCTION
    if fitted:
        policy = LanePolicy.fitted(rows_in[1], rows_in[2])
    if remainder is not None:
        policy = dataclasses.replace(policy, remainder=remainder)
    eng = RedisEngine.connect(srv.url, "calls", policy, create=True, timeout=60)
    eng.add_many(*rows_in)
    if shape == "production":  # other workers' batches: on Redis they leave ready while held
        for _ in range(2):
            eng.claim(budget=64, now_ms=NOW, lease_ms=100 * LEASE_MS)
    held = [eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)]

    def cycle() -> None:
        _, held[0] = eng.complete_and_claim(held[0].rows, held[0].tokens, budget=BUDGET,
                                            now_ms=NOW, lease_ms=LEASE_MS)
    return cycle, 1


def zpopmin_cycles(srv: RedisServer, rows: int) -> tuple[Callable[[], None], int]:
    """bench_servers.py's ZPOPMIN peer (no leases): ZPOPMIN 16, then ZADD them back."""
    from bench_servers import redis_load
    from common import corpus_keys

    keys, interval = corpus_keys(rows)
    r = srv.client()
    redis_load(r, keys, interval)
    iv = interval.tolist()

    def cycle() -> None:
        got = r.zpopmin("pq", BUDGET)
        r.zadd("pq", {m: float((int(s) // STRIDE) * STRIDE + NOW + iv[int(m)]) for m, s in got})
    return cycle, 2


Cycles = Callable[[RedisServer, int], tuple[Callable[[], None], float]]
"""(server, rows) -> (one cycle, the server's commands per cycle), the queue filled and warm."""


def measure(rows: int, cycles: int, peer: str = "engine",
            make: Cycles | None = None) -> dict[str, object]:
    """Instructions per cycle of ``make`` (default: the engine's, or the ``peer``'s)."""
    with tempfile.TemporaryDirectory(prefix="rl-callgrind-") as tmp:
        wrapper = Path(tmp) / "redis-server"
        wrapper.write_text("#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
                           f"--callgrind-out-file={tmp}/out.%p {find_server()} \"$@\"\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        srv = RedisServer(binary=str(wrapper), prefix="rl-callgrind-srv-").start()
        try:
            make = make or (engine_cycles if peer == "engine" else zpopmin_cycles)
            cycle, per_cycle = make(srv, rows)
            for _ in range(50):  # warm up
                cycle()
            pid = str(srv.proc.pid)
            subprocess.run(["callgrind_control", "-i", "on", pid], check=True,
                           capture_output=True)
            for _ in range(cycles):
                cycle()
            subprocess.run(["callgrind_control", "-i", "off", pid], check=True,
                           capture_output=True)
            subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        finally:
            srv.stop()
        dumps = [p for p in glob.glob(f"{tmp}/out.*") if os.path.getsize(p) and
                 "totals: 0\n" not in Path(p).read_text(errors="replace")]
        tree = subprocess.run(["callgrind_annotate", "--tree=caller", "--inclusive=yes", *dumps],
                              capture_output=True, text=True).stdout
        top = subprocess.run(["callgrind_annotate", "--inclusive=yes", *dumps],
                             capture_output=True, text=True).stdout
    # "N (p%)  < ???:processInputBuffer (Kx)" right above "N (p%)  *  ???:processCommand": K
    # commands were counted (callgrind_control acts when the server next wakes up, so not
    # always all), N instructions in them: the command, its lookup, ACL check and reply
    lines = tree.splitlines()
    at = next(i for i, ln in enumerate(lines) if re.search(r"\*\s+\S*:processCommand ", ln))
    calls = int(re.search(r"\(([\d,]+)x\)", lines[at - 1]).group(1).replace(",", ""))
    inclusive = int(lines[at].split()[0].replace(",", ""))
    wanted = ("Command ", "scriptCall", "parseReply", "lua_pushlstring", "strtod ", "printf_fp ",
              "realloc ", "lpFind ")
    shown = [ln.strip() for ln in top.splitlines() if any(w in ln for w in wanted)]
    return {"commands": calls, "instructions_per_cycle": round(inclusive * per_cycle / calls),
            "top": shown[:16]}


def engine_at() -> str:
    import engine.redis.engine as mod

    return f"library version {mod.LIBRARY_VERSION} ({Path(mod.__file__).parents[2]})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--checkout", help="count the engine of this checkout instead")
    ap.add_argument("--remainder", choices=REMAINDERS, default=None,
                    help="the engine's policy: the default with this remainder")
    ap.add_argument("--fitted", action="store_true",
                    help="the policy LanePolicy.fitted to the corpus (with --remainder if given)")
    ap.add_argument("--remainders", action="store_true",
                    help="count the policy with each remainder in turn, each over lane order")
    ap.add_argument("--shape", choices=("bench", "production"), default="bench",
                    help="production: bench_constraints (f)'s rows and policy")
    ap.add_argument("--peer", choices=("engine", "zpopmin"), default="engine",
                    help="zpopmin: count bench_servers.py's ZPOPMIN peer instead")
    ap.add_argument("--out", type=Path, help="save the counts here (JSON)")
    a = ap.parse_args()
    started = time.time()
    runs = REMAINDERS if a.remainders else (a.remainder,)
    counts: dict[str, int] = {}
    for rem in runs:
        make = functools.partial(engine_cycles, remainder=rem, fitted=a.fitted, shape=a.shape) \
            if a.peer == "engine" else None
        got = measure(a.rows, a.cycles, a.peer, make)
        what = engine_at() if a.peer == "engine" else "the ZPOPMIN peer"
        counts[rem or "policy"] = got["instructions_per_cycle"]  # type: ignore[assignment]
        print(f"{what}, remainder {rem or 'of the policy'}: server instructions per cycle of 16:"
              f" {got['instructions_per_cycle']:,} (over {got['commands']} commands)")
        for line in [] if a.remainders else got["top"]:  # type: ignore[attr-defined]
            print("  ", line)
    over = {r: c / counts["lane-order"] for r, c in counts.items()} if "lane-order" in counts \
        else {}
    for r, x in over.items():
        print(f"{r}: {x:.2f}x lane order")
    if a.out:
        checkout = Path(a.checkout) if a.checkout else HERE.parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                                capture_output=True, text=True).stdout.strip()
        note = f"{a.shape} shape, {a.rows:,} rows, {a.cycles} cycles counted; {engine_at()}"
        figs = [figure(f"redis_instructions.{a.shape}.{r}", f"server instructions a cycle of 16,"
                       f" remainder {r}", "instructions", [c], note=note)
                for r, c in counts.items()]
        figs += [figure(f"redis_instructions.{a.shape}.{r}_over_lane_order",
                        f"server instructions a cycle of 16, remainder {r} / lane order", "x",
                        [x], note=note) for r, x in over.items() if r != "lane-order"]
        a.out.write_text(json.dumps({
            "script": "redis_instructions", "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": commit or None, "seconds": round(time.time() - started),
            "figures": figs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
