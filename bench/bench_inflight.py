"""Claims with rows in flight: claim cost while a pool holds leases,
after releases, with due writes in the ring, and when leases lapse.

    .venv/bin/python bench/bench_inflight.py [--smoke] [--out FILE] [--only PARTS]
        [--shape bench|production]

A render pool always holds rows: every worker has a batch leased while renders take seconds.
The other benchmarks complete each batch at once, so they run with one batch in flight; this
one holds rows first and then times claims beside them.

Corpus and definitions as in bench_engine.py: rows over the benchmarks' ten lanes (one interval
a lane), or with ``--shape production`` bench_constraints (f)'s rows and policy
(``LanePolicy()``; its busiest lanes hold two intervals, so a head's interval comes from its row
word), all overdue, window 140, budget 16, virtual time (``now_ms=``) so that leases lapse
exactly when the script says. "Rows in flight" are held by claims of budget 64 with a 1 h lease,
never completed, made before timing: the same claim calls a pool makes, so they sit where a
pool's batches sit, at the heads of the lanes. Latency is bench_engine's: claim(16) is timed,
complete_many of its batch is not (the median over rounds of the mean µs per claim in a round; a
merge the claim asks for runs inside the call and is timed with it); throughput is
bench_engine's claim(16) + complete_many rows/s, both timed, forked workers. Every ratio is
against a figure measured in the same rounds of the same run (0 in flight, or the comparison the
label names).

A claim that grants 0 rows while due rows are queued is a stall: its figure is reported as
STALLED with the count, never as a (fast) time. Parts: inflight (claim(16) with 0 .. 65,536
rows in flight), pool (the headline figures with a pool's 128 rows per process held), release
(a claim after release vs after complete_many; many released rows; many due writes in the
ring), expiry (leases lapsing together, and continually).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from bench_engine import size_label
from common import (
    BUDGET,
    NOW,
    SHAPES,
    Slot,
    drop,
    figure,
    finish,
    new_engine,
    parse_args,
    run_clients,
    stalled,
    use_shape,
)

from engine import Engine
from engine.shm.segment import ffi, lib

HOUR_MS = 3_600_000
HOLD_BUDGET = 64   # the claims that put rows in flight: a pool's batch size
WINDOW = 140       # the API's default window, passed to the bare call

FULL = {"n": 1_600_000, "inflight": (0, 128, 4_096, 65_536), "rounds": 5, "per_round": 2000,
        "round_s": 1.0, "procs": (1, 2), "pool_held": 128, "tp_runs": 3, "tp_seconds": 0.6,
        "shot_rounds": 9, "k_claims": 500, "released": 20_000, "ring_writes": 20_000,
        "lapse": 4_096, "lapse_lease_ms": 60_000, "steady_lease_ms": 256}
SMOKE = {"n": 20_000, "inflight": (0, 16, 256), "rounds": 2, "per_round": 50,
         "round_s": 0.2, "procs": (1, 2), "pool_held": 16, "tp_runs": 1, "tp_seconds": 0.1,
         "shot_rounds": 2, "k_claims": 50, "released": 1_000, "ring_writes": 1_000,
         "lapse": 256, "lapse_lease_ms": 60_000, "steady_lease_ms": 16}

# ------------------------------------------------------------------------------ measuring ----


@dataclass
class Sample:
    """One round of timed claims: mean µs per claim, claims made, rows granted, claims that
    granted nothing, the slowest claim (µs)."""
    us: float
    claims: int
    rows: int
    zero: int
    max_us: float = 0.0


def hold(eng: Engine, k: int, now: int, lease_ms: int = HOUR_MS) -> list[Any]:
    """Put k rows in flight the way a pool does: claims of budget 64 (the last one smaller),
    never completed. Stops early when a claim grants nothing (the old core's stall); returns the
    batches, so len(rows) may fall short of k."""
    batches, held = [], 0
    while held < k:
        b = eng.claim(budget=min(HOLD_BUDGET, k - held), now_ms=now, lease_ms=lease_ms)
        if len(b) == 0:
            break
        batches.append(b)
        held += len(b)
    return batches


def held_rows(batches: list[Any]) -> int:
    return sum(len(b) for b in batches)


def time_claims(eng: Engine, count: int, now: int | Callable[[int], int], max_s: float = 1e9,
                lease_ms: int = 30_000, after: str = "complete") -> Sample:
    """Time `count` claim(16) calls (at most `max_s` seconds of wall time); after each, its batch
    is completed (`after="complete"`), released row by row ("release") or kept ("keep"), untimed.
    `now` is a virtual time or a function of the claim's index."""
    clock = time.perf_counter_ns
    deadline = time.perf_counter() + max_s
    t = rows = zero = done = worst = 0
    at = now if callable(now) else (lambda _i: now)
    default_lease = lease_ms == 30_000  # then the very call bench_engine times
    while done < count:
        ms = at(done)
        if default_lease:
            t0 = clock()
            b = eng.claim(budget=BUDGET, now_ms=ms)
            dt = clock() - t0
        else:
            t0 = clock()
            b = eng.claim(budget=BUDGET, now_ms=ms, lease_ms=lease_ms)
            dt = clock() - t0
        t += dt
        worst = max(worst, dt)
        done += 1
        rows += len(b)
        if len(b) == 0:
            zero += 1
        elif after == "complete":
            eng.complete_many(b.rows, b.tokens, now_ms=ms)
        elif after == "release":
            for r, tok in zip(b.rows.tolist(), b.tokens.tolist(), strict=True):
                eng.release(r, tok)
        elif after == "release_many":
            eng.release_many(b.rows, b.tokens)
        elif after == "complete+calls":  # the control: as many Python calls as release() makes
            eng.complete_many(b.rows, b.tokens, now_ms=ms)
            for r in b.rows.tolist():
                eng.lane(r)
        if done % 16 == 0 and time.perf_counter() > deadline:
            break
    return Sample(t / done / 1000, done, rows, zero, worst / 1000)


class Bare:
    """claim(16) + complete_many through the bare cffi calls (as bench_engine's bare figure),
    which leave the advice to merge unacted on: with due writes in the ring, every pass then
    meets them, which is what shows a pass that reads the ring linearly."""

    def __init__(self, eng: Engine) -> None:
        self.eng = eng
        self.out = ffi.new("int64_t[]", 4 * BUDGET)
        self.ok = ffi.new("uint8_t[]", BUDGET)
        self.advice = ffi.new("uint32_t *")

    def run(self, count: int, now: int, merge: bool) -> Sample:
        h, owner = self.eng._seg.handle, self.eng._seg.owner
        out, ok, advice = self.out, self.ok, self.advice
        clock = time.perf_counter_ns
        t = rows = zero = 0
        for _ in range(count):
            t0 = clock()
            got = lib.rl_claim(h, owner, BUDGET, now, 30_000, WINDOW, out, advice)
            t += clock() - t0
            if got < 0:
                raise RuntimeError(f"rl_claim: status {got}")
            rows += got
            zero += got == 0
            lib.rl_complete_many(h, owner, got, out, out + 3 * BUDGET, ffi.NULL, now, ok, advice)
            if merge and advice[0]:
                self.eng.compact()
        return Sample(t / count / 1000, count, rows, zero)


def stall_reason(samples: list[Sample], held: int | None = None, wanted: int | None = None
                 ) -> str | None:
    """Why a series is no measurement (the engine granted nothing), or None."""
    claims = sum(s.claims for s in samples)
    zero = sum(s.zero for s in samples)
    parts = []
    if zero:
        us = float(np.median([s.us for s in samples]))
        parts.append(f"0 rows granted in {zero:,} of {claims:,} claims ({us:,.0f} µs a pass)")
    if wanted is not None and held is not None and held < wanted:
        parts.append(f"the holding claims stopped granting at {held:,} of {wanted:,} rows held")
    return "; ".join(parts) if parts else None


def latency(fid: str, label: str, samples: list[Sample], note: str = "",
            held: int | None = None, wanted: int | None = None) -> dict[str, Any]:
    """A µs-per-claim figure from rounds of samples, or a stall; records rows per claim."""
    why = stall_reason(samples, held, wanted)
    if why:
        return stalled(fid, label, why, "µs")
    f = figure(fid, label, "µs", [s.us for s in samples], note=note)
    per = sum(s.rows for s in samples) / max(1, sum(s.claims for s in samples))
    f["rows_per_claim"] = per
    if per < BUDGET:
        f["note"] = (note + "; " if note else "") + f"short grants: {per:.1f} rows per claim"
    return f


def ratio(fid: str, label: str, a: list[Sample], b: list[Sample],
          stalled_a: dict[str, Any] | None = None) -> dict[str, Any]:
    """a / b per round (measured side by side), or the stall of a."""
    if stalled_a is not None and "skipped" in stalled_a:
        return stalled(fid, label, stalled_a["skipped"], "x")
    return figure(fid, label, "x", [x.us / y.us for x, y in zip(a, b, strict=True)])


# ----------------------------------------------------------------------------------- parts ----


def part_inflight(c: dict[str, Any], figs: list[dict[str, Any]]) -> dict[int, list[Sample]]:
    """claim(16) + complete_many (claim timed) with k rows in flight, each k on an engine of its
    own that holds k rows for the whole part; the levels take turns within each round."""
    n = c["n"]
    slots = {k: Slot(f"in{k}", n, (lambda e, k=k: hold(e, k, NOW))) for k in c["inflight"]}
    res: dict[int, list[Sample]] = {k: [] for k in c["inflight"]}
    held: dict[int, int] = {}
    try:
        for _ in range(c["rounds"]):
            for k, slot in slots.items():
                eng = slot.get(c["per_round"] * BUDGET)
                held[k] = min(held.get(k, k), held_rows(slot.state))
                res[k].append(time_claims(eng, c["per_round"], NOW, c["round_s"]))
    finally:
        for slot in slots.values():
            slot.close()
    base = res[c["inflight"][0]]
    for k in c["inflight"]:
        f = latency(f"inflight.claim_us.k{k}",
                    f"claim(16) at {size_label(n)} rows, {k:,} rows in flight", res[k],
                    note=f"{held[k]:,} rows held", held=held[k], wanted=k)
        figs.append(f)
        if "skipped" not in f:
            figs.append(figure(f"inflight.rows_per_claim.k{k}",
                               f"rows granted per claim(16), {k:,} in flight", "rows",
                               [s.rows / s.claims for s in res[k]], better="higher"))
        if k:
            figs.append(ratio(f"inflight.claim_ratio.k{k}",
                              f"claim(16) with {k:,} in flight / with 0 in flight", res[k], base,
                              f))
    return res


def cycle(n: int, procs: int, seconds: float, held: int) -> dict[str, Any]:
    """bench_engine's claim(16) + complete_many throughput, each worker first holding `held`
    rows (claims of 64, 1 h lease, never completed) as a pool's worker holds its batch."""
    eng = new_engine("tp", n)
    name = eng.name
    try:
        def setup(i: int) -> Engine:
            e = Engine.attach(name)
            got = held_rows(hold(e, held, NOW))
            if got < held:
                raise RuntimeError(f"stalled: worker {i} could hold only {got} of {held} rows")
            return e

        def step(e: Engine) -> int:
            b = e.claim(budget=BUDGET, now_ms=NOW, lease_ms=600_000)
            return np.count_nonzero(e.complete_many(b.rows, b.tokens, now_ms=NOW)) if len(b) else 0

        try:
            return run_clients(procs, seconds, setup, step, lambda e: e.close(),
                               quota=n // (2 * procs))
        except RuntimeError as exc:  # a worker's holding claims stalled: no figure, not a crash
            if "stalled" not in str(exc):
                raise
            return {"stalled": str(exc).split("stalled: ", 1)[-1].rstrip("')\"")}
    finally:
        drop(eng)


def part_pool(c: dict[str, Any], figs: list[dict[str, Any]],
              lat: dict[int, list[Sample]] | None) -> None:
    """The headline figures (claim(16) latency; claim + complete_many rows/s per process, 1 and
    2 processes) re-measured with a pool's rows in flight: `pool_held` rows per process."""
    n, h = c["n"], c["pool_held"]
    reused = lat is not None and h in lat and 0 in lat
    if not reused:
        sub = dict(c, inflight=(0, h))
        lat = part_inflight(sub, [])
    assert lat is not None
    f = latency(f"inflight.pool.claim_us.held{h}",
                f"claim(16) at {size_label(n)} rows, a pool's {h:,} rows in flight", lat[h],
                note=f"same measurement as inflight.claim_us.k{h}" if reused else "")
    figs.append(f)
    figs.append(ratio(f"inflight.pool.claim_ratio.held{h}",
                      f"claim(16), {h:,} in flight / 0 in flight", lat[h], lat[0], f))
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for _ in range(c["tp_runs"]):  # alternate, so drift hits all alike
        for p in c["procs"]:
            for held in (0, h):
                runs.setdefault((p, held), []).append(cycle(n, p, c["tp_seconds"], held))
    def rate(fid: str, label: str, unit: str, r: list[dict[str, Any]],
             value: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
        stall = next((x["stalled"] for x in r if "stalled" in x), None)
        if stall:
            return stalled(fid, label, stall, unit)
        return figure(fid, label, unit, [value(x) for x in r], better="higher")

    for p in c["procs"]:
        for held in (0, h):
            what = f"{held:,} rows held per process" if held else "none held"
            figs.append(rate(f"inflight.pool.cycle_rows_s.p{p}.per_proc.held{held}",
                             f"claim(16) + complete_many, {p} proc, per process, {what}",
                             "rows/s", runs[(p, held)], lambda x: x["per_proc"]))
        figs.append(rate(f"inflight.pool.cycle_rows_s.p{p}.total.held{h}",
                         f"claim(16) + complete_many, {p} proc, total, {h:,} rows held per process",
                         "rows/s", runs[(p, h)], lambda x: x["total"]))
        pairs = [{**a, "ratio": a["per_proc"] / b["per_proc"]} if "stalled" not in a else a
                 for a, b in zip(runs[(p, h)], runs[(p, 0)], strict=True)]
        figs.append(rate(f"inflight.pool.cycle_ratio.p{p}.held{h}",
                         f"claim + complete_many rows/s, {p} proc, {h:,} held / none held", "x",
                         pairs, lambda x: x["ratio"]))


def part_release(c: dict[str, Any], figs: list[dict[str, Any]]) -> None:
    """(a) A claim after release() of the previous batch (its rows due again at once) beside a
    claim after complete_many of it, on one engine, in turns. (b) claim(16) + complete_many with
    20,000 released rows due at the lane heads. (c) With 20,000 due writes in the ring
    (prioritize(mode="wait")): the first claim after them through the API (it includes any merge
    the pass asks for), the claims after it, and the bare pass, which leaves the ring unmerged."""
    n, per, k = c["n"], c["per_round"], c["k_claims"]
    rel_n, ring_n = c["released"], c["ring_writes"]
    base = Slot("base", n)
    turns = Slot("turns", n)
    many = Slot("released", n)
    ring = Slot("ring", n)
    rng = np.random.default_rng(11)
    after_rel, after_relm, after_done, base_s, released_s, released_first = [], [], [], [], [], []
    after_calls: list[Sample] = []
    first, nxt, bare_ring, bare_base, pending = [], [], [], [], []
    rel_held: list[int] = []
    bare_error = ""
    try:
        for _ in range(c["rounds"]):
            eng = turns.get(per * BUDGET)
            b = eng.claim(budget=BUDGET, now_ms=NOW)  # the first claim follows no release
            for r, tok in zip(b.rows.tolist(), b.tokens.tolist(), strict=True):
                eng.release(r, tok)
            after_rel.append(time_claims(eng, per, NOW, c["round_s"], after="release"))
            b = eng.claim(budget=BUDGET, now_ms=NOW)
            eng.release_many(b.rows, b.tokens)
            after_relm.append(time_claims(eng, per, NOW, c["round_s"], after="release_many"))
            after_done.append(time_claims(eng, per, NOW, c["round_s"]))
            after_calls.append(time_claims(eng, per, NOW, c["round_s"], after="complete+calls"))
            # (b) many released rows
            base_s.append(time_claims(base.get(k * BUDGET), k, NOW))
            eng = many.get(rel_n + k * BUDGET)
            batches = hold(eng, rel_n, NOW)
            rel_held.append(held_rows(batches))
            for bb in batches:
                for r, tok in zip(bb.rows.tolist(), bb.tokens.tolist(), strict=True):
                    eng.release(r, tok)
            released_first.append(time_claims(eng, 1, NOW))  # reads them, asks for a merge
            released_s.append(time_claims(eng, k, NOW))
        for _ in range(c["shot_rounds"]):
            # (c) due writes in the ring: bare passes first (they leave it unmerged), then the
            # first API claim after them, then the API claims after that one
            eng = ring.get((2 * k + 1) * BUDGET)
            for row in rng.choice(n, ring_n, replace=False).tolist():
                eng.prioritize(row, mode="wait", now_ms=NOW)
            if not bare_error:
                try:
                    bare_ring.append(Bare(eng).run(k, NOW, merge=False))
                    bare_base.append(Bare(base.get(k * BUDGET)).run(k, NOW, merge=True))
                except (AttributeError, TypeError, RuntimeError, ffi.error) as exc:
                    bare_error = f"the bare cffi claim call failed or is missing here: {exc}"
            first.append(time_claims(eng, 1, NOW))
            pending.append(eng.stats(NOW).get("ring", {}).get("pending", -1))  # -1: not told
            nxt.append(time_claims(eng, k, NOW))
    finally:
        for s in (base, turns, many, ring):
            s.close()

    f = latency("inflight.release.after_release_us",
                "claim(16) after release() of the previous batch", after_rel)
    figs.append(f)
    g = latency("inflight.release.after_complete_us",
                "claim(16) after complete_many of the previous batch", after_done)
    figs.append(g)
    figs.append(ratio("inflight.release.ratio", "claim after release / claim after complete_many",
                      after_rel, after_done, f if "skipped" in f else g))
    f = latency("inflight.release.after_complete_calls_us",
                "claim(16) after complete_many and 16 lane() calls (control)", after_calls)
    figs.append(f)
    figs.append(ratio("inflight.release.calls_ratio",
                      "claim after complete_many + 16 calls / claim after complete_many",
                      after_calls, after_done, f if "skipped" in f else g))
    f = latency("inflight.release.after_release_many_us",
                "claim(16) after release_many of the previous batch", after_relm)
    figs.append(f)
    figs.append(ratio("inflight.release.many_ratio",
                      "claim after release_many / claim after complete_many",
                      after_relm, after_done, f if "skipped" in f else g))
    held = int(np.median(rel_held))
    figs.append(latency("inflight.release.first_after_many_released_us",
                        f"first claim(16) after {rel_n:,} rows released (merge included)",
                        released_first))
    f = latency("inflight.release.many_released_us",
                f"the {k} claims(16) after it, released rows due at the lane heads", released_s,
                note=f"{held:,} rows held, then released", held=min(rel_held), wanted=rel_n)
    figs.append(f)
    figs.append(ratio("inflight.release.many_released_ratio",
                      f"claim(16), {rel_n:,} released rows due / none", released_s, base_s, f))
    figs.append(latency("inflight.ring.first_claim_us",
                        f"first claim(16) after {ring_n:,} due writes in the ring "
                        "(API, merge included)", first))
    if min(pending) >= 0:  # whether that claim merged them (stats() names the ring's fill)
        figs.append(figure("inflight.ring.pending_after_first",
                           "ring entries left after that first claim", "writes", pending))
    f = latency("inflight.ring.next_claims_us",
                f"the {k} claims(16) after it (API)", nxt)
    figs.append(f)
    if bare_error:
        for fid, label in (("inflight.ring.bare_us", "bare pass, due writes in the ring"),
                           ("inflight.ring.bare_ratio", "bare pass, ring / no ring")):
            figs.append({"id": fid, "label": label, "unit": "", "skipped": bare_error})
        return
    f = latency("inflight.ring.bare_us",
                f"bare claim(16) pass, {ring_n:,} due writes in the ring (unmerged)", bare_ring)
    figs.append(f)
    figs.append(latency("inflight.ring.bare_base_us",
                        "bare claim(16) pass, no due write in the ring", bare_base))
    figs.append(ratio("inflight.ring.bare_ratio",
                      f"bare pass, {ring_n:,} due ring writes / none", bare_ring, bare_base, f))


def part_expiry(c: dict[str, Any], figs: list[dict[str, Any]]) -> None:
    """Leases that lapse, in virtual time. Each round: claims with nothing in flight (base);
    `lapse` rows held with a short lease and claims beside them (held); the clock moved past
    their expiry, so they all lapse at once, and the first claim after that (lapsed) and the
    claims after it (next); then, on an engine of its own, a pool whose leases lapse
    continually: every claim(16) leases for `steady_lease_ms`, none is completed, the clock
    moves 1 ms a claim, so 16 leases lapse per claim and steady_lease_ms * 16 are live (steady).
    Its own engine, because a big table's sweeps are spaced in wall time (csrc/sweep.c): the
    steady claims' last sweep holds off the one that puts all their leases back (and the merge
    that asks for) for a few ms, which on a shared engine landed among the next round's held
    claims. That catch-up is timed where it falls, as the pool's first claim of the next round
    (catchup)."""
    n, k, lapse = c["n"], c["k_claims"], c["lapse"]
    lease, steady_lease = c["lapse_lease_ms"], c["steady_lease_ms"]
    base = Slot("base", n)
    slot = Slot("lapse", n)
    pool = Slot("steady", n)
    series: dict[str, list[Sample]] = {
        x: [] for x in ("base", "held", "lapsed", "next", "steady", "catchup")}
    held_n: list[int] = []
    catchup_base: list[Sample] = []  # the base samples of the rounds that have a catchup
    now = NOW
    warm = steady_lease + 8
    last: Engine | None = None
    try:
        for _ in range(c["shot_rounds"]):
            series["base"].append(time_claims(base.get(k * BUDGET), k, NOW))
            eng = slot.get(lapse + (2 * k + 1) * BUDGET)
            held_n.append(held_rows(hold(eng, lapse, now, lease_ms=lease)))
            series["held"].append(time_claims(eng, k, now + 1))
            now += lease  # every one of those leases lapses at this instant
            series["lapsed"].append(time_claims(eng, 1, now))
            series["next"].append(time_claims(eng, k, now + 1))
            now += 2
            eng = pool.get((warm + k) * BUDGET)
            first = time_claims(eng, 1, now, lease_ms=steady_lease, after="keep")
            if eng is last:  # the last round's steady leases have all lapsed: it puts them back
                series["catchup"].append(first)
                catchup_base.append(series["base"][-1])
            last = eng
            time_claims(eng, warm - 1, lambda i, t=now: t + 1 + i, lease_ms=steady_lease,
                        after="keep")
            now += warm
            series["steady"].append(time_claims(eng, k, lambda i, t=now: t + i,
                                                lease_ms=steady_lease, after="keep"))
            now += k + steady_lease + 1  # past every steady lease
    finally:
        base.close()
        slot.close()
        pool.close()
    live = steady_lease * BUDGET
    labels = {
        "base": "claim(16), nothing in flight (same rounds)",
        "held": f"claim(16) beside {lapse:,} live short leases",
        "lapsed": f"first claim(16) after {lapse:,} leases lapse at once",
        "next": f"the {k} claims(16) after that one",
        "steady": f"claim(16), leases lapsing continually ({live:,} live, 16 lapse a claim)",
        "catchup": "the steady pool's first claim(16) of a round, after all its leases lapsed",
    }
    out: dict[str, dict[str, Any]] = {}
    for key, label in labels.items():
        f = latency(f"inflight.expiry.{key}_us", label, series[key],
                    held=min(held_n) if key == "held" else None,
                    wanted=lapse if key == "held" else None)
        out[key] = f
        figs.append(f)
    for key in ("held", "lapsed", "next", "steady", "catchup"):
        figs.append(ratio(f"inflight.expiry.{key}_ratio", f"{labels[key]} / nothing in flight",
                          series[key], catchup_base if key == "catchup" else series["base"],
                          out[key]))
    # A round of the steady pool either sweeps on nearly every claim or on almost none: the
    # share of rounds that cost over 10x nothing in flight says which, where a median may not.
    swept = [a.us > 10 * b.us for a, b in zip(series["steady"], series["base"], strict=True)]
    figs.append(figure("inflight.expiry.steady_slow_rounds", f"share of rounds where"
                       f" {labels['steady']} costs over 10x nothing in flight", "x",
                       [sum(swept) / len(swept)]))
    # Where a lapse is paid for need not be the first claim after it (a sweep may run later):
    # the slowest single claim of the 1 + k after the lapse, beside the slowest of k with
    # nothing in flight (each includes any merge a claim runs).
    after = [max(a.max_us, b.max_us) for a, b in zip(series["lapsed"], series["next"],
                                                       strict=True)]
    figs.append(figure("inflight.expiry.slowest_after_lapse_us",
                       f"slowest claim(16) of the {k + 1} after the lapse", "µs", after))
    # The held figure is a mean: one claim that pays a sweep and its merge (about 10 ms at 1.6M
    # rows) among k moves it by 10 ms / k. The slowest held claim says whether one did.
    figs.append(figure("inflight.expiry.slowest_held_us",
                       f"slowest claim(16) of {k} beside {lapse:,} live short leases", "µs",
                       [x.max_us for x in series["held"]]))
    figs.append(figure("inflight.expiry.slowest_base_us",
                       f"slowest claim(16) of {k}, nothing in flight (same rounds)", "µs",
                       [x.max_us for x in series["base"]]))


PARTS = ("inflight", "pool", "release", "expiry")


def options(ap: Any) -> None:
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all): {', '.join(PARTS)}")
    ap.add_argument("--shape", default="bench", choices=SHAPES,
                    help="the rows and policy of every engine (default bench)")


def main() -> None:
    args = parse_args(__doc__, options)
    started = time.perf_counter()
    use_shape(args.shape)
    c = dict(SMOKE if args.smoke else FULL)
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    if only - set(PARTS):
        raise SystemExit(f"--only: unknown part(s) {sorted(only - set(PARTS))}; known: {PARTS}")
    figs: list[dict[str, Any]] = []
    lat: dict[int, list[Sample]] | None = None
    for part in PARTS:
        if part not in only:
            continue
        t0 = time.perf_counter()
        if part == "inflight":
            lat = part_inflight(c, figs)
        elif part == "pool":
            part_pool(c, figs, lat)
        elif part == "release":
            part_release(c, figs)
        else:
            part_expiry(c, figs)
        print(f"-- {part}: {time.perf_counter() - t0:.0f} s", flush=True)
    finish(f"bench_inflight --shape {args.shape}", args, figs, started)


if __name__ == "__main__":
    main()
