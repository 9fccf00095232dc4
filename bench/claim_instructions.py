"""Instructions inside rl_claim per claim(16), counted by callgrind: a noise-free complement to
bench_constraints (f)'s timings on a shared machine.

    .venv/bin/python bench/claim_instructions.py [--rows N] [--claims N] [--misses] [--out FILE]

For each remainder of bench_constraints (f) (lane order, the lateness remainder with its derived
weights, edf), a process of its own fills an engine with rows of the production shape, has
another owner hold 128 of them, makes 20 claims, then ``--claims`` bare claim(16) calls, each
followed by complete_many, under ``valgrind --tool=callgrind --toggle-collect=rl_claim`` (only
instructions inside rl_claim and what it calls are counted). Prints instructions per claim and
each remainder over lane order; with ``--out``, also each step's share (the instructions of
each function of the pass, inlined code counted in its caller, from callgrind_annotate).
``--misses`` also simulates the caches and branch prediction, and saves per claim (and per
function) the code lines missed in L1i (the pass starts cold there: Python runs between claims),
data misses in L1d and in a 32 MB last level, and mispredicted branches: where time goes that
instructions do not show. Caches are set to this machine's (valgrind misreads its L3). Needs
valgrind.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POLICIES = ("lane_order", "lateness", "edf")


def child(policy: str, rows: int, claims: int) -> None:
    import bench_constraints as bc
    from common import NOW, drop, new_engine

    from engine import Engine

    spec = {pid: p for pid, _, p in bc.PRODUCTION_POLICIES}[policy]
    data = bc.production_rows(rows)
    eng = new_engine("instructions", len(data[0]), spec, rows=data)
    other = Engine.attach(eng.name)
    try:
        held = 0
        while held < 128:
            held += len(other.claim(budget=64, now_ms=NOW, lease_ms=3_600_000))
        bc._claim_times(eng, 20 + claims)
    finally:
        other.close()
        drop(eng)


# --misses: callgrind's simulated caches (L1i, L1d as this EPYC's; LL its 32 MB L3) and branches
MISS_ARGS = ["--cache-sim=yes", "--branch-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64",
             "--LL=33554432,16,64"]
MISS_EVENTS = ("I1mr", "D1mr", "DLmr", "Bcm")


def steps(cg_out: str, per: int, event: str = "Ir") -> dict[str, float]:
    """`event` (instructions unless told) a claim in each function of rl_claim's pass (self, not
    inclusive), as ``file:function`` (functions inlined into another counted in it, by the file
    they are in)."""
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--show-percs=no",
                           f"--show={event}", cg_out],
                          capture_output=True, text=True, check=True).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(\S+:[\w.]+)", line)
        if m and "PROGRAM TOTALS" not in line:
            name = m.group(2).rsplit("/", 1)[-1] if "csrc/" not in m.group(2) else \
                "csrc/" + m.group(2).split("csrc/", 1)[1]
            out[name] = out.get(name, 0) + int(m.group(1).replace(",", "")) / per
    least = 10 if event == "Ir" else 0.1
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= least}


def count(policy: str, rows: int, claims: int, profile: dict[str, dict[str, Any]],
          misses: dict[str, dict[str, Any]] | None = None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=rl_claim",
               f"--callgrind-out-file={tmp}/cg.out"] + (MISS_ARGS if misses is not None else []) \
            + [sys.executable, __file__, "--child", policy, "--rows", str(rows), "--claims",
               str(claims)]
        res = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, check=True)
        events = re.search(r"Events\s*: ([\w ]+)", res.stderr)
        m = re.search(r"Collected : ([\d ]+)", res.stderr)
        if not m or not events:
            raise RuntimeError(f"callgrind printed no count:\n{res.stderr[-2000:]}")
        per = 20 + claims
        total = dict(zip(events.group(1).split(), map(int, m.group(1).split()), strict=False))
        profile[policy] = steps(f"{tmp}/cg.out", per)
        if misses is not None:
            misses[policy] = {e: {"per_claim": round(total[e] / per, 1),
                                  "steps": steps(f"{tmp}/cg.out", per, e)} for e in MISS_EVENTS}
        return total["Ir"]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--claims", type=int, default=2500)
    ap.add_argument("--misses", action="store_true", help="simulate caches and branches too")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=POLICIES)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.rows, args.claims)
        return
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed")
    started = time.time()
    profile: dict[str, dict[str, Any]] = {}
    misses: dict[str, dict[str, Any]] | None = {} if args.misses else None
    per = {p: count(p, args.rows, args.claims, profile, misses) / (20 + args.claims)
           for p in POLICIES}
    for p in POLICIES:
        print(f"{p}: {per[p]:,.0f} instructions a claim(16), {per[p] / per['lane_order']:.2f}x"
              " lane order" + ("" if misses is None else ", " + ", ".join(
                  f"{e} {misses[p][e]['per_claim']}" for e in MISS_EVENTS)))
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                                capture_output=True, text=True).stdout.strip()
        args.out.write_text(json.dumps({
            "script": "claim_instructions", "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": commit, "rows": args.rows, "claims": args.claims,
            "seconds": round(time.time() - started),
            "instructions_per_claim": per,
            "over_lane_order": {p: per[p] / per["lane_order"] for p in POLICIES},
            "steps_per_claim": profile} | ({} if misses is None else {
                "caches": dict(zip(("I1", "D1", "LL"), MISS_ARGS[2:], strict=True)),
                "misses_per_claim": misses}), indent=1))


if __name__ == "__main__":
    main()
