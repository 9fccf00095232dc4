"""The ``lanes`` command line (also ``python -m engine``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .engine import Engine
from .errors import EngineError
from .segment import Segment


def _stats(args: argparse.Namespace) -> int:
    eng = Engine.attach(args.name)
    try:
        stats = eng.stats()
    finally:
        eng.close()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{stats['name']}: {stats['rows']} rows ({stats['queued']} queued) of"
          f" {stats['capacity']}, layout v{stats['layout_version']}")
    cols = ("lane", "name", "floor_minute", "queued", "due", "leased", "granted", "spilled",
            "stale_skipped", "lease_refused")
    print("  ".join(f"{c:>13}" for c in cols))
    for lane in stats["lanes"]:
        print("  ".join(f"{lane[c]!s:>13}" for c in cols))
    return 0


def _check(args: argparse.Namespace) -> int:
    eng = Engine.attach(args.name)
    try:
        problems = eng.verify()
    finally:
        eng.close()
    for p in problems:
        print(p)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _cleanup(args: argparse.Namespace) -> int:
    Segment.unlink(args.name)
    print(f"removed /dev/shm/{args.name}")
    return 0


def _restamp(args: argparse.Namespace) -> int:
    eng = Engine.attach(args.name)
    try:
        print(json.dumps(eng.restamp(args.limit)))
    finally:
        eng.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lanes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="show lanes at work")
    p.add_argument("--seconds", type=float, default=None)
    p.set_defaults(fn=_demo)
    p = sub.add_parser("stats", help="per-lane statistics of an engine")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_stats)
    p = sub.add_parser("check", help="verify every invariant of an engine")
    p.add_argument("name")
    p.set_defaults(fn=_check)
    p = sub.add_parser("cleanup", help="remove a segment left by a crashed owner")
    p.add_argument("name")
    p.set_defaults(fn=_cleanup)
    p = sub.add_parser("restamp", help="move rows written with lanes off into their lanes")
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=5000)
    p.set_defaults(fn=_restamp)
    args: Any = parser.parse_args(argv)
    try:
        status: int = args.fn(args)
    except EngineError as exc:
        print(f"lanes {args.command}: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
