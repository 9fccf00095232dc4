"""The design's constraints (docs/design.md §7, §8), reproduced on this engine.

    .venv/bin/python bench/bench_constraints.py [--smoke] [--out FILE]

(a) Floors under reschedules. The background measured an unfloored seek degrade 0.073 -> 5.60 ms
    over 40,000 reschedules while a floored one stayed flat. Here: claim(16) passes, each row
    completed to now + interval at once, 40,000 reschedules with no merge in between (the ring
    holds them all; the merge advice is ignored on purpose), so every reschedule leaves a stale
    index entry at the front of its lane. Ratio = median µs per pass over the last 2,000
    reschedules / over the first 2,000. The engine has three defences against that pile-up:
    the floor, the per-lane skip hint, and tombstones (a completion marks the old entry, and a
    pass crosses a run of them in one step). The seek variants (bench/seek_variants.py) switch
    them off one at a time, so what each buys is measured, not assumed.
(b) Lanes interleaved in one index vs one index per lane: the same rows, 16 per pass drawn from
    every lane — one ten-lane engine with global-EDF remainder (the pass opens every lane) vs
    nine one-lane engines (lanes disabled) claimed in turn for 16 in all.
(c) One-sided seek with the upper bound checked in code (the product) vs a two-sided range
    (a second binary search for the lane's last due entry), with and without the skip hint.
(d) What the remainder costs: claim(16) on one engine (every lane due) under the default floors
    with remainder lane-order, edf, lateness (weights given) and the default (lateness with the
    weights derived from the bands) (lateness weighs the lane heads of every lane for every
    grant), interleaved pass block by pass block on the same rows; ratio per round, to
    lane-order's block of that round. The goal: lateness and the default <= 1.2x lane-order.
(e) What a fitted policy costs (``LanePolicy.fitted``: 64 lanes, weights fitted to the rows):
    claim(16) under it against lane order over the same bands and floors, interleaved the same
    way, on rows whose intervals spread over about 20 lanes of each provenance and on rows of
    the shape of each corpus of the simulator; the default beside its own lane order there.
(f) The production shape (issue 38): 1.6M rows, intervals 30 min / 1 h / 8 h / 30 h / 48 h, 46 %
    discovered, every row overdue, 128 rows held in flight by another worker (another owner,
    claims of 64, 1 h lease); bands 1 h / 6 h / 24 h, floors discovered 0.10 and cold 0.02.
    claim(16), each followed by complete_many (untimed), under lane order, the lateness
    remainder with its derived weights (``LanePolicy``'s default weighing) and edf, an engine
    each, built anew every round in an order that turns (where a segment lands in memory moves
    its claims' time), block by block in turn each round; every claim timed on its own, the
    figure is the median of a round's claims, and the ratio is per round to lane order's block
    of that round.

``--only a,f`` runs the named parts.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np
from common import (
    BENCH_POLICY,
    BUDGET,
    DAY_MS,
    NOW,
    PRODUCTION,
    corpus,
    corpus_lanes,
    drop,
    figure,
    finish,
    new_engine,
    parse_args,
    production_rows,
)
from seek_variants import NO_SKIP, NO_TOMB, TWO_SIDED, UNFLOORED, Handle

from engine import Engine, LanePolicy
from engine.shm.segment import ffi, lib
from engine.sim import build_corpus, corpus_config

FULL = {"rows": 1_600_000, "reschedules": 40_000, "bucket": 2_000, "runs": 3,
        "b_rounds": 5, "b_passes": 2000, "c_rounds": 5, "c_passes": 2000,
        "d_rounds": 31, "d_passes": 500, "f_rounds": 12, "f_claims": 250, "f_held": 128}
SMOKE = {"rows": 20_000, "reschedules": 2_000, "bucket": 400, "runs": 1,
         "b_rounds": 2, "b_passes": 50, "c_rounds": 2, "c_passes": 50,
         "d_rounds": 2, "d_passes": 50, "f_rounds": 2, "f_claims": 50, "f_held": 128}

SEEKS = [  # (id, label, flags)
    ("product", "floor + skip hint + tombstones (the product)", 0),
    ("floor_only", "floor alone (no skip hint, no tombstones)", NO_SKIP | NO_TOMB),
    ("unfloored", "unfloored (no floor, no skip hint, no tombstones)",
     UNFLOORED | NO_SKIP | NO_TOMB),
    ("hint_only", "skip hint alone (no floor, no tombstones)", UNFLOORED | NO_TOMB),
    ("tombs_only", "tombstones alone (no floor, no skip hint)", UNFLOORED | NO_SKIP),
]


def reschedule_run(n: int, flags: int, reschedules: int, bucket: int) -> dict[str, float]:
    eng = new_engine("floor", n)
    h = Handle(eng.name)
    try:
        h.flags(flags)
        times: list[int] = []
        grants: list[int] = []
        done = stalled = 0
        clock = time.perf_counter_ns
        while done < reschedules and stalled < 50:
            t0 = clock()
            got = h.claim(BUDGET, NOW)
            times.append(clock() - t0)
            grants.append(got)
            h.complete(got, NOW)
            done += got
            stalled = stalled + 1 if got == 0 else 0
        cum = np.cumsum(grants)
        # the first bucket leaves out 10 warm-up passes (cold caches, the first floor raises)
        first = [t for i, (t, c) in enumerate(zip(times, cum, strict=True))
                 if c <= bucket and i >= 10]
        if stalled:  # every lane stranded behind stale entries: time the passes that grant 0
            last, lastg = times[-stalled:], grants[-stalled:]
        else:
            last = [t for t, c in zip(times, cum, strict=True) if c > reschedules - bucket]
            lastg = [g for g, c in zip(grants, cum, strict=True) if c > reschedules - bucket]
        st = eng.stats(NOW)
        return {"first_us": statistics.median(first) / 1000,
                "last_us": statistics.median(last) / 1000,
                "last_grants": statistics.mean(lastg),
                "done": float(done),
                "pending": st["ring"]["pending"],
                "gen": st["index"]["generation"]}
    finally:
        h.close()
        drop(eng)


def floors(c: dict[str, Any]) -> list[dict[str, Any]]:
    figs = []
    res: dict[str, list[dict[str, float]]] = {sid: [] for sid, _, _ in SEEKS}
    for _ in range(c["runs"]):  # alternate variants within a run
        for sid, _, flags in SEEKS:
            res[sid].append(reschedule_run(c["rows"], flags, c["reschedules"], c["bucket"]))
    gens = {r["gen"] for rs in res.values() for r in rs}
    note = (f"no merge during the run (index generations seen: {sorted(gens)}); "
            f"{max(r['pending'] for rs in res.values() for r in rs):,} writes left in the ring")
    k = f"{c['reschedules'] // 1000}k"
    for sid, label, _ in SEEKS:
        rs = res[sid]
        figs.append(figure(f"constraints.floor.{sid}.first_us", f"(a) {label}: µs per pass, "
                           "first reschedules", "µs", [r["first_us"] for r in rs]))
        figs.append(figure(f"constraints.floor.{sid}.last_us", f"(a) {label}: µs per pass, "
                           f"after {k} reschedules", "µs", [r["last_us"] for r in rs]))
        figs.append(figure(f"constraints.floor.{sid}.ratio", f"(a) {label}: after {k} / first",
                           "x", [r["last_us"] / r["first_us"] for r in rs], note=note))
        figs.append(figure(f"constraints.floor.{sid}.grants", f"(a) {label}: rows granted per "
                           f"pass at the end", "rows", [r["last_grants"] for r in rs],
                           better="higher"))
        figs.append(figure(f"constraints.floor.{sid}.reschedules", f"(a) {label}: reschedules "
                           "done (fewer: every lane stalled)", "rows",
                           [r["done"] for r in rs], better="higher"))
    return figs


def _bare_cycle(engines: list[Any], budgets: list[int], passes: int) -> float:
    """µs per 16 rows: `passes` times, claim budgets[i] from engines[i] for every i (bare cffi
    calls), then complete them (untimed)."""
    hs = [(e._seg.handle, e._seg.owner) for e in engines]
    outs = [ffi.new("int64_t[]", 4 * b) for b in budgets]
    ok = ffi.new("uint8_t[]", max(budgets))
    advice = ffi.new("uint32_t *")
    clock = time.perf_counter_ns
    t = 0
    for _ in range(passes):
        got = []
        t0 = clock()
        for (h, o), b, out in zip(hs, budgets, outs, strict=True):
            got.append(lib.rl_claim(h, o, b, NOW, 600_000, 140, out, advice))
        t += clock() - t0
        for (h, o), b, out, g, e in zip(hs, budgets, outs, got, engines, strict=True):
            lib.rl_complete_many(h, o, g, out, out + 3 * b, ffi.NULL, NOW, ok, advice)
            if advice[0]:
                e.compact()
    return t / passes / 1000


def interleaving(c: dict[str, Any]) -> list[dict[str, Any]]:
    n = c["rows"]
    due, interval, prov, failures = corpus(n)
    lanes = corpus_lanes(interval, prov, failures)
    present = sorted(set(lanes.tolist()))
    split = [BUDGET // len(present) + (1 if i < BUDGET % len(present) else 0)
             for i in range(len(present))]
    one_vals, sep_vals = [], []
    bytes_one = bytes_sep = 0
    for _ in range(c["b_rounds"]):
        one = new_engine("one", n, LanePolicy(remainder="edf"),
                         rows=(due, interval, prov, failures))
        sep = []
        try:
            for lane in present:
                m = lanes == lane
                sep.append(new_engine("sep", int(m.sum()), LanePolicy(lanes_enabled=False),
                                      rows=(due[m], interval[m], prov[m], failures[m])))
            bytes_one = one.stats(NOW)["bytes"]
            bytes_sep = sum(e.stats(NOW)["bytes"] for e in sep)
            one_vals.append(_bare_cycle([one], [BUDGET], c["b_passes"]))
            sep_vals.append(_bare_cycle(sep, split, c["b_passes"]))
        finally:
            drop(one)
            for e in sep:
                drop(e)
    return [
        figure("constraints.lanes.interleaved_us", f"(b) one {len(present)}-lane index, claim(16) "
               "opening every lane: µs per 16 rows (bare)", "µs", one_vals),
        figure("constraints.lanes.separate_us", f"(b) {len(present)} one-lane indexes claimed in "
               "turn: µs per 16 rows (bare)", "µs", sep_vals),
        figure("constraints.lanes.separate_over_interleaved",
               "(b) separate / interleaved, time per 16 rows", "x",
               [s / o for s, o in zip(sep_vals, one_vals, strict=True)]),
        figure("constraints.lanes.bytes_ratio", "(b) shared memory, separate / interleaved", "x",
               [bytes_sep / bytes_one]),
    ]


def sidedness(c: dict[str, Any]) -> list[dict[str, Any]]:
    variants = [("one_sided", "one-sided seek (the product)", 0),
                ("two_sided", "two-sided range", TWO_SIDED),
                ("one_sided_seek", "one-sided, binary seek every pass (no skip hint)", NO_SKIP),
                ("two_sided_seek", "two-sided, binary seek every pass (no skip hint)",
                 NO_SKIP | TWO_SIDED)]
    vals: dict[str, list[float]] = {v: [] for v, _, _ in variants}
    eng = new_engine("sided", c["rows"])
    h = Handle(eng.name)
    clock = time.perf_counter_ns
    try:
        for _ in range(c["c_rounds"]):
            for vid, _, flags in variants:
                h.flags(flags)
                t = 0
                for _ in range(c["c_passes"]):
                    t0 = clock()
                    got = h.claim(BUDGET, NOW)
                    t += clock() - t0
                    h.complete(got, NOW)
                    if h.advice[0]:
                        h.compact()
                vals[vid].append(t / c["c_passes"] / 1000)
    finally:
        h.close()
        drop(eng)
    figs = [figure(f"constraints.sided.{vid}_us", f"(c) {label}: µs per claim(16)", "µs",
                   vals[vid]) for vid, label, _ in variants]
    figs.append(figure("constraints.sided.two_over_one", "(c) two-sided / one-sided", "x",
                       [t / o for t, o in zip(vals["two_sided"], vals["one_sided"], strict=True)]))
    figs.append(figure("constraints.sided.two_over_one_seek",
                       "(c) two-sided / one-sided, seeking every pass", "x",
                       [t / o for t, o in zip(vals["two_sided_seek"], vals["one_sided_seek"],
                                            strict=True)]))
    return figs


REMAINDER_POLICIES = [  # over BENCH_POLICY's ten lanes (the engine (d) fills)
    ("lane_order", replace(BENCH_POLICY, remainder="lane-order")),
    ("edf", replace(BENCH_POLICY, remainder="edf")),
    ("lateness", replace(BENCH_POLICY, weights={"submitted/b0": 4.0, "submitted/b1": 1.5,
                                                "submitted/b2": 1.5})),
    ("bands", BENCH_POLICY),
]


def remainders(c: dict[str, Any]) -> list[dict[str, Any]]:
    vals: dict[str, list[float]] = {rid: [] for rid, _ in REMAINDER_POLICIES}
    eng = new_engine("remainder", c["rows"])
    try:
        for k in range(c["d_rounds"]):
            order = REMAINDER_POLICIES if k % 2 == 0 else REMAINDER_POLICIES[::-1]
            for rid, policy in order:
                eng.set_policy(policy)
                vals[rid].append(_bare_cycle([eng], [BUDGET], c["d_passes"]))
    finally:
        drop(eng)
    figs = [figure(f"constraints.remainder.{rid}_us", f"(d) remainder {rid}: µs "
                   "per claim(16) (bare)", "µs", vals[rid]) for rid, _ in REMAINDER_POLICIES]
    for rid in ("edf", "lateness", "bands"):
        figs.append(figure(f"constraints.remainder.{rid}_over_lane_order",
                           f"(d) remainder {rid} / lane-order, same round", "x",
                           [t / o for t, o in zip(vals[rid], vals["lane_order"], strict=True)]))
    return figs


def _shape(name: str, n: int) -> tuple[Any, Any, Any, Any]:
    """``n`` rows, every one due, with the intervals and provenance of a corpus shape: ``spread``
    (intervals log-uniform from 30 min to 14 days, about 20 lanes of each provenance in use) or
    a corpus of the simulator (engine.sim.CORPORA) scaled to ``n`` rows."""
    rng = np.random.default_rng(11)
    if name == "spread":
        interval = np.exp(rng.uniform(np.log(1800), np.log(14 * 86400), n)).astype(np.int64)
        prov = rng.integers(0, 2, n)
    else:
        config = corpus_config(name)
        config = replace(config, scale=n / sum(c.rows for c in config.classes))
        built = build_corpus(config)
        interval, prov = built.interval_s, built.provenance
        n = len(interval)
    due = NOW - rng.integers(3 * DAY_MS, 30 * DAY_MS, n)
    return due, interval, prov, np.where(rng.random(n) < 0.02, 5, 0)


def fitted(c: dict[str, Any]) -> list[dict[str, Any]]:
    """(e) claim(16) under ``LanePolicy.fitted`` (64 lanes) against lane order over the same
    bands and floors, and ``LanePolicy()`` against its own lane order, on rows of each shape
    (``_shape``), every lane due, interleaved round by round on one engine each."""
    figs: list[dict[str, Any]] = []
    for shape in ("spread", "default", "shop", "news", "docs"):
        rows = _shape(shape, c["rows"])
        fit = LanePolicy.fitted(rows[1], rows[2])
        pairs = {"fitted": (fit, replace(fit, remainder="lane-order"))}
        if shape != "spread":
            pairs["default"] = (LanePolicy(), LanePolicy(remainder="lane-order"))
        for rid, (policy, order) in pairs.items():
            vals: dict[str, list[float]] = {"policy": [], "order": []}
            eng = new_engine(f"fit-{shape}", len(rows[0]), policy, rows=rows)
            try:
                for k in range(c["d_rounds"]):
                    for which in (("policy", "order") if k % 2 == 0 else ("order", "policy")):
                        eng.set_policy(policy if which == "policy" else order)
                        vals[which].append(_bare_cycle([eng], [BUDGET], c["d_passes"]))
            finally:
                drop(eng)
            figs.append(figure(f"constraints.fitted.{shape}.{rid}_us", f"(e) {shape}: {rid},"
                               " µs per claim(16) (bare)", "µs", vals["policy"]))
            figs.append(figure(f"constraints.fitted.{shape}.{rid}_over_lane_order",
                               f"(e) {shape}: {rid} / lane order over its bands (goal"
                               " <= 1.2)", "x", [t / o for t, o in zip(
                                   vals["policy"], vals["order"], strict=True)]))
    return figs


PRODUCTION_POLICIES = [  # (id, label, policy): the same bands and floors, three remainders
    ("lane_order", "lane order", replace(PRODUCTION, remainder="lane-order")),
    ("lateness", "lateness (LanePolicy()'s weighing)", PRODUCTION),
    ("edf", "edf", replace(PRODUCTION, remainder="edf")),
]


def _claim_times(eng: Any, claims: int) -> list[int]:
    """ns of each of ``claims`` bare claim(16) calls; each batch completed after, untimed."""
    h, o = eng._seg.handle, eng._seg.owner
    out = ffi.new("int64_t[]", 4 * BUDGET)
    ok = ffi.new("uint8_t[]", BUDGET)
    advice = ffi.new("uint32_t *")
    clock = time.perf_counter_ns
    times = []
    for _ in range(claims):
        t0 = clock()
        got = lib.rl_claim(h, o, BUDGET, NOW, 600_000, 140, out, advice)
        times.append(clock() - t0)
        lib.rl_complete_many(h, o, got, out, out + 3 * BUDGET, ffi.NULL, NOW, ok, advice)
        if advice[0]:
            eng.compact()
    return times


def _production_engines(rows: Any, held: int, k: int) -> tuple[dict[str, Engine], list[Engine]]:
    """Round ``k``'s engines, one per remainder, each with ``held`` rows held in flight by
    another owner and past its first passes (weights derived, floors raised). They are built in
    an order that turns with ``k``: where a segment lands in memory moves its claims' time, even
    between engines of one process under one remainder, so each remainder takes each place in
    turn rather than one place for the whole run."""
    engines: dict[str, Engine] = {}
    others: list[Engine] = []
    try:
        for i in range(len(PRODUCTION_POLICIES)):
            pid, _, policy = PRODUCTION_POLICIES[(i + k) % len(PRODUCTION_POLICIES)]
            eng = engines[pid] = new_engine(f"production-{i}", len(rows[0]), policy, rows=rows)
            other = Engine.attach(eng.name)  # another worker: its own owner, holding batches
            others.append(other)
            got = 0
            while got < held:
                n = len(other.claim(budget=min(64, held - got), now_ms=NOW, lease_ms=3_600_000))
                if n == 0:
                    raise RuntimeError(f"the holding claims stalled at {got} rows")
                got += n
            _claim_times(eng, 100)
    except BaseException:
        _drop_engines(engines, others)
        raise
    return engines, others


def _drop_engines(engines: dict[str, Engine], others: list[Engine]) -> None:
    for other in others:
        other.close()
    for eng in engines.values():
        drop(eng)


def production(c: dict[str, Any]) -> list[dict[str, Any]]:
    """(f) claim(16) in the production shape under three remainders, side by side: an engine
    each (a remainder leaves the lanes' heads where its own order left them, so blocks of
    another remainder on the same rows would time that one's state), new ones every round
    (_production_engines), taking turns block by block within the round."""
    rows = production_rows(c["rows"])
    vals: dict[str, list[float]] = {pid: [] for pid, _, _ in PRODUCTION_POLICIES}
    for k in range(c["f_rounds"]):
        engines, others = _production_engines(rows, c["f_held"], k)
        try:
            order = PRODUCTION_POLICIES if k % 2 == 0 else PRODUCTION_POLICIES[::-1]
            for pid, _, _ in order:
                vals[pid].append(statistics.median(_claim_times(engines[pid], c["f_claims"]))
                                 / 1000)
        finally:
            _drop_engines(engines, others)
    note = (f"{c['rows']:,} rows, {c['f_held']} held in flight by another owner; medians of"
            f" {c['f_claims']} claims a round, {c['f_rounds']} rounds, new engines each round")
    figs = [figure(f"constraints.production.{pid}_us", f"(f) production shape, {label}: µs per"
                   " claim(16) (bare, median)", "µs", vals[pid], note=note)
            for pid, label, _ in PRODUCTION_POLICIES]
    for pid, label, _ in PRODUCTION_POLICIES[1:]:
        figs.append(figure(f"constraints.production.{pid}_over_lane_order",
                           f"(f) production shape, {label} / lane order, same round", "x",
                           [t / o for t, o in zip(vals[pid], vals["lane_order"], strict=True)]))
    return figs


PARTS = {"a": floors, "b": interleaving, "c": sidedness, "d": remainders, "e": fitted,
         "f": production}


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument(
        "--only", default=",".join(PARTS), help="parts to run, e.g. d,f (default: all)"))
    started = time.perf_counter()
    c = SMOKE if args.smoke else FULL
    parts = args.only.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--only names unknown parts {unknown} (known: {', '.join(PARTS)})")
    figs = [f for p in PARTS if p in parts for f in PARTS[p](c)]
    finish("bench_constraints", args, figs, started)


if __name__ == "__main__":
    main()
