"""bench_constraints (or ``--script``) on two trees taken in turns: this one and another checkout
(``--before``, with its own .venv built), so a change to the claim pass is timed side by side on
a busy machine.

    .venv/bin/python bench/bench_trees.py --before /work/main [--script bench_inflight]
        [--only d,e,f] [--runs 6] [--out FILE] [--script-args "--shape production"]

Each run is the script with ``--only PARTS`` (and ``--script-args``) in a process of its own,
under each tree's interpreter and from each tree's directory; the trees alternate, the first
flipped every run. Every figure is reported per tree (``.before``, ``.after``) as the median of
the runs' medians, with their range.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import figure, finish, parse_args

HERE = Path(__file__).resolve().parent


def one_run(tree: Path, script: str, only: str, smoke: bool, extra: list[str]) -> dict[str, dict]:
    """The figures of one run of ``script`` on ``tree``, by id."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [str(tree / ".venv" / "bin" / "python"), f"bench/{script}.py", "--only",
               only, "--out", str(out)] + (["--smoke"] if smoke else []) + extra
        subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL)
        return {f["id"]: f for f in json.loads(out.read_text())["figures"] if "median" in f}


def commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    def extra(ap):  # type: ignore[no-untyped-def]
        ap.add_argument("--before", type=Path, required=True, help="the other tree (built)")
        ap.add_argument("--script", default="bench_constraints", help="the benchmark (default"
                        " bench_constraints; it must take --only)")
        ap.add_argument("--only", default="d,e,f", help="its parts (default d,e,f)")
        ap.add_argument("--runs", type=int, default=6, help="runs per tree (default 6)")
        ap.add_argument("--script-args", default="", help="more arguments for the script, as"
                        " one string (both trees' scripts must take them)")

    args = parse_args(__doc__, extra)
    started = time.perf_counter()
    trees = {"before": args.before.resolve(), "after": HERE.parent}
    for side, tree in trees.items():
        if not (tree / ".venv" / "bin" / "python").exists():
            sys.exit(f"{side} tree {tree} has no .venv: run `make .venv/.installed` there")
        if not (tree / "bench" / f"{args.script}.py").exists():
            sys.exit(f"{side} tree {tree} has no bench/{args.script}.py")
    runs: dict[str, list[dict[str, dict]]] = {"before": [], "after": []}
    for k in range(1 if args.smoke else args.runs):
        for side in (("before", "after") if k % 2 == 0 else ("after", "before")):
            runs[side].append(one_run(trees[side], args.script, args.only, args.smoke,
                                      shlex.split(args.script_args)))
    names = {side: commit(tree) for side, tree in trees.items()}
    figs = []
    for fid, f in runs["after"][0].items():
        for side in ("before", "after"):
            vals = [r[fid]["median"] for r in runs[side] if fid in r]
            if vals:
                figs.append(figure(f"{fid}.{side}", f"{f['label']} ({names[side]}): the median"
                                   " of each run's median", f["unit"], vals, f["better"]))
    finish(f"bench_trees {args.script} --only {args.only} {args.script_args}: {names['before']}"
           f" (before) and {names['after']} (after) alternated", args, figs, started)


if __name__ == "__main__":
    main()
