"""Run every benchmark, print one table, write bench/results/latest.json (``make bench``).

    .venv/bin/python bench/run_all.py [--smoke] [--results DIR] [--only NAME ...]

Each benchmark runs as its own process (a crash or a leak in one cannot colour the next) and
writes its figures to DIR/<name>.json; this script joins them, judges each figure that has a
target (the README's) and writes DIR/latest.json: every figure with median, min, max and runs, its
target and whether it is met, and the machine it ran on. A peer that could not be started is
listed as skipped with its reason. ``--smoke`` is the tiny form CI runs; its sizes differ from
the targets' so nothing is judged.

Every claim figure (µs, a claim in its id or label) is also compared with the same figure in
the last committed results (``git show HEAD:bench/results/latest.json``, else the file as it was
before this run): one slower by more than the noise, the larger of this run's spread and that
run's (max - min over median), is flagged (``regressions`` in latest.json, and printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import commit, describe, fmt, machine

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_engine", "bench_inflight", "bench_constraints", "bench_python_peers",
           "bench_servers", "bench_redis", "bench_sim", "bench_store"]

# figure id -> (comparison, value, how the README states the target)
TARGETS: dict[str, tuple[str, float, str]] = {
    "engine.claim_us.b16.n1600000": ("<=", 1.7, "≤ 1.7 µs"),
    "engine.cycle_rows_s.p1.per_proc": (">=", 2e6, "≥ 2 M rows/s per process"),
    "engine.cycle_rows_s.p2.per_proc": (">=", 2e6, "≥ 2 M rows/s per process"),
    # (8 processes on this machine's 2 cores is an oversubscription figure: the targets set the
    # per-process target for 1 and 2 processes only)
    "servers.ratio_redis_lua.p1": (">=", 100, "≥ 100×"),
    "servers.ratio_redis_lua.p2": (">=", 100, "≥ 100×"),
    "servers.ratio_postgres.p1": (">=", 300, "≥ 300×"),
    "servers.ratio_postgres.p2": (">=", 300, "≥ 300×"),
    "constraints.floor.product.ratio": ("<=", 1.2, "≤ 1.2× (floored)"),
    "constraints.floor.floor_only.ratio": ("<=", 1.2, "≤ 1.2× (floored)"),
    "constraints.floor.unfloored.ratio": (">=", 10, "≥ 10× (unfloored)"),
    "constraints.remainder.lateness_over_lane_order": ("<=", 1.2, "≤ 1.2× lane-order"),
    "constraints.remainder.bands_over_lane_order": ("<=", 1.2, "≤ 1.2× lane-order"),
    # issue 38: LanePolicy() within 1.15x lane order on every corpus shape and the production
    # shape, edf within 1.3x there
    **{f"constraints.fitted.{shape}.default_over_lane_order": ("<=", 1.15, "≤ 1.15× lane-order")
       for shape in ("default", "shop", "news", "docs")},
    "constraints.production.lateness_over_lane_order": ("<=", 1.15, "≤ 1.15× lane-order"),
    "constraints.production.edf_over_lane_order": ("<=", 1.3, "≤ 1.3× lane-order"),
    "engine.bytes_per_row.n1600000": ("<=", 48, "≤ 48 bytes"),
    "engine.bytes_per_row.n16000000": ("<=", 48, "≤ 48 bytes"),
    "engine.merge_ms.n1600000": ("<=", 20, "≤ 20 ms"),
    # the Redis backend, on both transports
    **{f"redis.{t}.{k}": v for t in ("unix", "tcp") for k, v in {
        "ratio_zpopmin.p1": (">=", 1, "≥ 1× ZPOPMIN"),
        "ratio_lua.p1": (">=", 2, "≥ 2× naive Lua"),
        "claim_vs_ping": ("<=", 1.5, "≤ 1.5× PING"),
    }.items()},
    "redis.bytes_per_row.n1000000": ("<=", 160, "≤ 160 bytes"),
    # the shared snapshot store (issue 34)
    "store.hot_rps.shared_over_local": (">=", 0.8, "≥ 0.8× the local store"),
    "store.upload_over_render": ("<=", 0.05, "≤ 5 % of a render's wall time"),
}


def judge(f: dict[str, Any]) -> None:
    t = TARGETS.get(f["id"])
    if not t:
        return
    op, value, text = t
    f["target"] = text
    if "skipped" in f:
        f["met"] = None
        return
    f["met"] = f["median"] <= value if op == "<=" else f["median"] >= value


def committed_results(results: Path) -> dict[str, Any] | None:
    """The results of the last commit (bench/results/latest.json at HEAD), else the file as it
    is before this run overwrites it, else None."""
    path = results / "latest.json"
    try:
        rel = path.resolve().relative_to(HERE.parent)
        text = subprocess.run(["git", "show", f"HEAD:{rel.as_posix()}"], cwd=HERE.parent,
                              capture_output=True, text=True, check=True).stdout
    except (ValueError, OSError, subprocess.CalledProcessError):
        if not path.exists():
            return None
        text = path.read_text()
    try:
        doc: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        return None
    return None if doc.get("smoke") else doc


def is_claim_figure(f: dict[str, Any]) -> bool:
    return f.get("unit") == "µs" and ("claim" in f["id"] or "claim" in f["label"])


def regressions(figs: list[dict[str, Any]], before: dict[str, Any] | None
                ) -> list[dict[str, Any]]:
    """The claim figures slower than in ``before`` by more than the noise: the larger relative
    spread ((max - min) / median) of the two runs, so a figure that moves within what repeats
    of it move by is not flagged, and one measured once is judged by the other run's spread."""
    if not before:
        return []
    old = {f["id"]: f for f in before.get("figures", []) if "median" in f}
    out = []
    for f in figs:
        b = old.get(f["id"])
        if not b or "median" not in f or not is_claim_figure(f) or b["median"] <= 0:
            continue
        noise = max((f["max"] - f["min"]) / f["median"] if f["median"] > 0 else 0.0,
                    (b["max"] - b["min"]) / b["median"])
        slower = f["median"] / b["median"] - 1
        if slower > noise:
            out.append({"id": f["id"], "label": f["label"], "median": f["median"],
                        "before": b["median"], "slower": round(slower, 4),
                        "noise": round(noise, 4)})
    return out


def table(figs: list[dict[str, Any]]) -> str:
    rows = [("figure", "median", "range (runs)", "unit", "target", "met")]
    for f in figs:
        if "skipped" in f:
            rows.append((f["label"], "stalled" if f.get("stalled") else "skipped",
                         f["skipped"][:60], f.get("unit", ""),
                         f.get("target", ""), "—" if "target" in f else ""))
            continue
        u = f["unit"]
        rng = (f"{fmt(f['min'], u)} – {fmt(f['max'], u)} ({f['runs']})" if f["runs"] > 1
               else "(1)")
        met = "" if "met" not in f else ("yes" if f["met"] else "MISSED")
        rows.append((f["label"], fmt(f["median"], u), rng, u, f.get("target", ""), met))
    widths = [min(90, max(len(r[i]) for r in rows)) for i in range(6)]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) if i in (1, 2) else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=False))).rstrip())
        if k == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def markdown(figs: list[dict[str, Any]]) -> str:
    """The table as Markdown, for the README's Figures section."""
    out = ["| figure | median | range (runs) | target | met |", "|---|---:|---:|---|---|"]
    for f in figs:
        if "skipped" in f:
            what = "**stalled**" if f.get("stalled") else "skipped"
            out.append(f"| {f['label']} | {what} | {f['skipped']} | {f.get('target', '')} | — |")
            continue
        u = f["unit"]
        unit = "×" if u == "x" else u
        rng = f"{fmt(f['min'], u)} – {fmt(f['max'], u)} ({f['runs']})" if f["runs"] > 1 else "(1)"
        met = "" if "met" not in f else ("met" if f["met"] else "**missed**")
        out.append(f"| {f['label']} | {fmt(f['median'], u)} {unit} | {rng} | "
                   f"{f.get('target', '')} | {met} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--only", nargs="*", choices=SCRIPTS)
    args = ap.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    before = None if args.smoke else committed_results(args.results)
    started = time.time()
    load_before = [round(x, 2) for x in os.getloadavg()]
    docs: dict[str, Any] = {}
    failed = []
    for name in args.only or SCRIPTS:
        out = args.results / f"{name}.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(HERE / f"{name}.py"), "--out", str(out)]
        if args.smoke:
            cmd.append("--smoke")
        print(f"== {name}", flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=HERE.parent).returncode
        if rc != 0 or not out.exists():
            failed.append(f"{name} (exit {rc})")
            continue
        docs[name] = json.loads(out.read_text())
        print(f"   ({time.time() - t0:.0f} s)", flush=True)
    figs = [f for d in docs.values() for f in d["figures"]]
    if not args.smoke:  # smoke sizes are not the targets' sizes
        for f in figs:
            judge(f)
    result = {
        "command": "make bench" + (" (smoke)" if args.smoke else ""),
        "smoke": args.smoke,
        "date": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
        "commit": commit(),
        "seconds": round(time.time() - started),
        "machine": machine(),
        "load_avg_before": load_before,
        "scripts": {k: {"seconds": d["seconds"]} for k, d in docs.items()},
        "failed": failed,
        "compared_with": before.get("date") if before else None,
        "regressions": regressions(figs, before),
        "figures": figs,
    }
    (args.results / "latest.json").write_text(json.dumps(result, indent=1))
    (args.results / "latest.md").write_text(markdown(figs))
    m = result["machine"]
    print()
    print(f"render-lanes benchmark, {result['date']}, commit {result['commit']}, {m['cpu']}, "
          f"{m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, Python {m['python']}; load"
          f" before {load_before}, after {m['load_avg']}; {result['seconds']} s")
    print(table(figs))
    missed = [f for f in figs if f.get("met") is False]
    if missed:
        print("\nmissed targets:")
        for f in missed:
            print(f"  {describe(f)} — target {f['target']}")
    if result["regressions"]:
        print(f"\nclaim figures slower than in the last committed results "
              f"({result['compared_with']}) by more than the noise:")
        for r in result["regressions"]:
            print(f"  {r['label']}: {fmt(r['median'], 'µs')} µs against {fmt(r['before'], 'µs')}"
                  f" µs (+{r['slower']:.1%}, noise {r['noise']:.1%})")
    elif before:
        print(f"\nno claim figure slower than in the last committed results "
              f"({result['compared_with']}) by more than the noise")
    print(f"\nwritten: {args.results / 'latest.json'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
