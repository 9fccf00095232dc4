"""Rows in flight are free (docs/design.md §9), in one process, in virtual time.

A pool always holds some rows: every worker has a batch in hand. A claim pass used to read the
leased rows of a lane one by one and give up after ``window`` + 4,096 of them (EXTRA_CAP in
csrc/claim.c), so once about 4,236 rows of one lane were in flight the lane went quiet however
many of its rows were due. What these tests hold the engine to:

* while a lane has a due row that is not leased, a claim that asks for that lane grants from it,
  however many rows are leased (up to the capacity);
* an expired lease is claimable by the first pass at its expiry (``expiry <= now``), and not a
  millisecond before; a renewed lease is never granted before its new expiry, nor twice;
* a released row is claimable at once, in due order among the lane's other due rows; a release
  with a stale token raises ``LeaseLost`` and changes nothing;
* a stateful model test that holds thousands of leases at once and lets them expire, releases,
  completes, fails and renews them.

Each scenario runs with no row, a few thousand rows (below the old limit) and ten thousand rows
(past it) held at the head of the lane. The leases of killed owners are in
tests/chaos/test_inflight_chaos.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from lanes_testlib import DAY, HOUR, MINUTE, NOW, dispose, ten_lanes, unique_name

from engine import STRIDE, Engine, LanePolicy, LeaseLost, _core

HOME = 600  # a 10-minute interval: lane 1 (submitted/b0) under the default bands
LANE = 1
IN_FLIGHT = [0, 3_000, 10_000]  # rows held at the head of the lane: none, below and past 4,236
HELD = 2 * DAY  # the lease of the rows held all along: longer than any test's timeline


def _add(eng: Engine, dues: np.ndarray) -> list[int]:
    """Rows of lane 1 with these due times."""
    if len(dues) == 0:
        return []
    return eng.add_many(np.asarray(dues, np.int64), HOME).tolist()


def _hold(eng: Engine, n: int, now: int, lease_ms: int, budget: int = 64) -> list[int]:
    """Claim until ``n`` rows are held (never completing); the rows in grant order. Fails, saying
    how far it got, if a claim comes back empty first."""
    rows: list[int] = []
    while len(rows) < n:
        c = eng.claim(budget=min(budget, n - len(rows)), now_ms=now, lease_ms=lease_ms)
        if len(c) == 0:
            pytest.fail(f"claims stopped granting with {len(rows):,} of {n:,} due rows of the "
                        f"lane held: the other {n - len(rows):,} are due and not leased")
        rows += c.rows.tolist()
    return rows


def _claim_until_empty(eng: Engine, now: int, lease_ms: int, budget: int,
                       limit: int) -> list[np.ndarray]:
    """Claim (never completing) until a claim grants nothing; each claim's rows and due times."""
    got = []
    for _ in range(limit):
        c = eng.claim(budget=budget, now_ms=now, lease_ms=lease_ms)
        if len(c) == 0:
            return got
        got.append(np.stack([c.rows.copy(), c.due_ms.copy()]))
    pytest.fail(f"still granting after {limit} claims")


def _lane_stats(eng: Engine, now: int) -> dict:
    return eng.stats(now_ms=now)["lanes"][LANE]


# -- 1. the stall: one lane, every due row held -----------------------------------------------


@pytest.mark.parametrize("n", [20_000, pytest.param(200_000, marks=pytest.mark.slow)])
def test_a_lane_grants_every_due_row_however_many_are_in_flight(make_engine, n):
    """One lane, ``n`` due rows, ``claim(budget=64)`` with a long lease and no completion: every
    claim grants a full budget until every row is held, each row once and in due order; then
    claims grant nothing."""
    eng = make_engine(capacity=n)
    rng = np.random.default_rng(n)
    dues = NOW - 3 * DAY + rng.permutation(n).astype(np.int64) * 7  # row ids not in due order
    rows = _add(eng, dues)
    eng.compact()
    batches = _claim_until_empty(eng, NOW, HELD, 64, limit=n // 64 + 2)
    granted = np.concatenate([b[0] for b in batches]) if batches else np.zeros(0, np.int64)
    got_dues = np.concatenate([b[1] for b in batches]) if batches else np.zeros(0, np.int64)
    assert len(granted) == n, (
        f"claims stopped granting after {len(granted):,} of {n:,} due rows of one lane; "
        f"stats: {_lane_stats(eng, NOW)}")
    assert len(np.unique(granted)) == n, "a row was granted twice"
    assert set(granted.tolist()) == set(rows)
    sizes = [b.shape[1] for b in batches]
    assert sizes[:-1] == [64] * (len(sizes) - 1), "a claim granted less than its budget early"
    assert (np.diff(got_dues) >= 0).all(), "grants left due order"
    for later in (NOW, NOW + HOUR, NOW + HELD - 1):
        assert len(eng.claim(budget=64, now_ms=later, lease_ms=HELD)) == 0
    lane = _lane_stats(eng, NOW)
    assert (lane["queued"], lane["due"], lane["leased"]) == (n, n, n)
    assert eng.verify() == []


def test_rows_written_while_thousands_are_held_are_granted_once_each(make_engine):
    """20,000 rows arrive in 40 batches of 500 (writes through the ring, merges along the way),
    each batch due anywhere in the last three days, so it lands between rows already held; after
    each batch, claims until one grants nothing take exactly that batch, in due order."""
    n, size = 20_000, 500
    eng = make_engine(capacity=n)
    rng = np.random.default_rng(7)
    seen: list[int] = []
    for b in range(n // size):
        rows = _add(eng, NOW - rng.integers(0, 3 * DAY, size))
        batches = _claim_until_empty(eng, NOW, HELD, 64, limit=size // 64 + 2)
        got = np.concatenate([x[0] for x in batches]).tolist() if batches else []
        dues = np.concatenate([x[1] for x in batches]) if batches else np.zeros(0)
        assert sorted(got) == sorted(rows), (
            f"batch {b}: {len(got)} of its {size} rows granted with {len(seen):,} rows held")
        assert (np.diff(dues) >= 0).all()
        seen += got
    assert len(set(seen)) == n
    lane = _lane_stats(eng, NOW)
    assert (lane["queued"], lane["leased"]) == (n, n)
    assert eng.verify() == []


def test_completions_between_rows_in_flight_do_not_stall_a_lane(make_engine):
    """The first 600 due rows of a lane claimed, then every other one completed (rescheduled a
    day out) while its neighbours stay in flight, as a pool's workers finish batches around
    slower ones: the claims that follow grant the other 1,400 due rows, a full budget each, in
    due order. (Each completed stretch between two rows in flight is a separate run of stale
    entries; the old pass paid one window slot per run and went quiet after 140 of them.)"""
    eng = make_engine(capacity=2_000)
    rows = _add(eng, NOW - DAY + np.arange(2_000) * 1_000)
    eng.compact()
    first = eng.claim(budget=600, now_ms=NOW, lease_ms=HELD, window=600)
    assert first.rows.tolist() == rows[:600]
    done = slice(1, None, 2)
    ok = eng.complete_many(first.rows[done], first.tokens[done],
                           next_due_ms=np.full(300, NOW + DAY), now_ms=NOW)
    assert ok.all()
    batches = _claim_until_empty(eng, NOW, HELD, 64, limit=1_400 // 64 + 2)
    got = [r for b in batches for r in b[0].tolist()]
    assert got == rows[600:], (
        f"{len(got):,} of the 1,400 due rows granted with 300 rows in flight between 300 "
        f"completed ones; stats: {_lane_stats(eng, NOW)}")
    assert [b.shape[1] for b in batches][:-1] == [64] * (len(batches) - 1)
    assert eng.verify() == []


# -- 2. expiry in virtual time ----------------------------------------------------------------


def _back_at_expiry(eng: Engine, expiry: dict[int, int], due: dict[int, int],
                    extra_points: tuple[int, ...] = ()) -> None:
    """Claim 1 ms before, at and 1 ms after every expiry (and at ``extra_points``), in time
    order: each claim grants exactly the rows whose lease has expired by then and that no earlier
    claim here took again, in due order (every other row of the lane is held past the end)."""
    points = sorted({e + d for e in expiry.values() for d in (-1, 0, 1)} | set(extra_points))
    back: set[int] = set()
    start = min(points)
    for t in points:
        c = eng.claim(budget=4096, now_ms=t, lease_ms=HELD)
        want = sorted((r for r, e in expiry.items() if e <= t and r not in back),
                      key=lambda r: (due[r], r))
        assert c.rows.tolist() == want, (
            f"at {t - start} ms past the first point: granted {len(c)} rows, expected {len(want)} "
            f"(leases expired by then: {sorted({e for e in expiry.values() if e <= t})})")
        back.update(want)
    assert back == set(expiry)


@pytest.mark.parametrize("in_flight", IN_FLIGHT)
def test_an_expired_lease_is_claimable_at_its_expiry_not_a_millisecond_before(make_engine,
                                                                            in_flight):
    """Leases of 1 ms, 10 ms, 1 s, 1 min and 1 h (five rows each) taken at T, with ``in_flight``
    earlier rows of the lane held all along: at T + lease - 1 a claim grants none of them, at
    T + lease exactly those (expiry <= now is claimable)."""
    leases = (1, 10, 1_000, MINUTE, HOUR)
    per = 5
    eng = make_engine(capacity=in_flight + per * len(leases) + 5)
    _add(eng, NOW - 2 * DAY + np.arange(in_flight))  # the lane's head
    _add(eng, NOW - DAY + np.arange(per * len(leases)) * MINUTE)
    _add(eng, NOW + 2 * DAY + np.arange(5))  # queued, not due during the test
    eng.compact()
    t = NOW
    _hold(eng, in_flight, t, HELD)
    expiry: dict[int, int] = {}
    for lease in leases:
        c = eng.claim(budget=per, now_ms=t, lease_ms=lease)
        assert len(c) == per, f"{len(c)} of {per} rows granted with {in_flight:,} held"
        for row in c.rows.tolist():
            expiry[row] = t + lease
            assert eng.describe(row, now_ms=t)["lease_expiry_ms"] == t + lease
    due = {r: eng.due_ms(r) for r in expiry}
    assert len(eng.claim(budget=4096, now_ms=t, lease_ms=HELD)) == 0
    _back_at_expiry(eng, expiry, due)
    lane = _lane_stats(eng, t + HOUR)
    assert lane["leased"] == in_flight + per * len(leases)
    assert eng.verify() == []


@pytest.mark.parametrize("in_flight", [3_000, 10_000])
def test_thousands_of_leases_expiring_together_all_come_back_at_their_expiry(make_engine,
                                                                            in_flight):
    """``in_flight`` rows held with one 1 s lease: nothing at T + 999, every one of them at
    T + 1000 (claims until one grants nothing take each once, in due order), then nothing."""
    eng = make_engine(capacity=in_flight)
    rows = _add(eng, NOW - DAY + np.random.default_rng(1).permutation(in_flight) * 11)
    eng.compact()
    _hold(eng, in_flight, NOW, 1_000)
    assert len(eng.claim(budget=64, now_ms=NOW + 999, lease_ms=HELD)) == 0
    batches = _claim_until_empty(eng, NOW + 1_000, HELD, 64, limit=in_flight // 64 + 2)
    got = np.concatenate([b[0] for b in batches]) if batches else np.zeros(0, np.int64)
    dues = np.concatenate([b[1] for b in batches]) if batches else np.zeros(0, np.int64)
    assert len(got) == in_flight, (
        f"{len(got):,} of {in_flight:,} expired leases came back at their expiry")
    assert sorted(got.tolist()) == sorted(rows)
    assert (np.diff(dues) >= 0).all()
    assert len(eng.claim(budget=64, now_ms=NOW + 1_001, lease_ms=HELD)) == 0
    assert eng.verify() == []


@pytest.mark.parametrize("held", [64, 100, 200])
def test_lapsed_leases_come_back_in_due_order_among_recent_writes(make_engine, held):
    """300 rows of a lane indexed and 20 written after the merge (recent writes), all due in the
    last three days; the ``held`` earliest claimed with 1 ms leases (claims of 16) and let lapse.
    At the first instant they are claimable, claims of 64 until one grants nothing return every
    row once, in due order: the lapsed rows are not served after later ones. Five corpora."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        eng = make_engine(capacity=320)
        rows = _add(eng, NOW - rng.integers(0, 3 * DAY, 300))
        eng.compact()
        rows += _add(eng, NOW - rng.integers(0, 3 * DAY, 20))
        _hold(eng, held, NOW, 1, budget=16)
        batches = _claim_until_empty(eng, NOW + 1, HELD, 64, limit=320 // 64 + 2)
        got = [r for b in batches for r in b[0].tolist()]
        dues = [d for b in batches for d in b[1].tolist()]
        assert sorted(got) == sorted(rows), f"corpus {seed}: {len(got)} of 320 rows granted"
        late = [i for i in range(1, len(dues)) if dues[i] < dues[i - 1]]
        assert late == [], (
            f"corpus {seed}: grant {late[0]} (claim {late[0] // 64}) is due "
            f"{dues[late[0] - 1] - dues[late[0]]} ms before the grant made ahead of it")
        assert eng.verify() == []


@pytest.mark.parametrize("in_flight", IN_FLIGHT)
@pytest.mark.parametrize("how", ["longer", "shorter"])
def test_a_renewed_lease_is_granted_at_its_new_expiry_and_never_twice(make_engine, in_flight,
                                                                      how):
    """Eight rows leased at T; four of them renewed at T + 30 s ("longer": 1 min -> 1 h;
    "shorter": 1 h -> 1 s). Past the original expiry a renewed row stays held; each row comes
    back exactly at the expiry in force, once; the tokens that were replaced stay dead."""
    eng = make_engine(capacity=in_flight + 8)
    _add(eng, NOW - 2 * DAY + np.arange(in_flight))
    _add(eng, NOW - DAY + np.arange(8) * MINUTE)
    eng.compact()
    t = NOW
    _hold(eng, in_flight, t, HELD)
    first, renewed_lease = (MINUTE, HOUR) if how == "longer" else (HOUR, 1_000)
    c = eng.claim(budget=8, now_ms=t, lease_ms=first)
    assert len(c) == 8
    rows, toks = c.rows.tolist(), c.tokens.tolist()
    expiry = {r: t + first for r in rows}
    replaced = []
    for r, tok in list(zip(rows, toks, strict=True))[::2]:
        new = eng.renew(r, tok, lease_ms=renewed_lease, now_ms=t + 30_000)
        assert new != tok
        replaced.append((r, tok))
        expiry[r] = t + 30_000 + renewed_lease
    due = {r: eng.due_ms(r) for r in rows}
    _back_at_expiry(eng, expiry, due, extra_points=(t + first - 1, t + first, t + first + 1))
    for r, tok in replaced:
        with pytest.raises(LeaseLost):
            eng.release(r, tok)
    assert eng.verify() == []


@pytest.mark.parametrize(("lapsed", "total"), [(600, 2_000), (3_000, 8_000)])
def test_leases_renewed_after_they_lapsed_do_not_stall_the_lane(make_engine, lapsed, total):
    """The first ``lapsed`` due rows of a lane claimed with 1 ms leases. At the first instant
    they have lapsed a claim takes 16 of them again; then the holders of every other one renew
    (their tokens still hold: nobody claimed those rows again), so those rows are in flight once
    more, between rows that are not. Claims until one grants nothing take every other due row,
    each once, in due order."""
    eng = make_engine(capacity=total)
    rows = _add(eng, NOW - DAY + np.arange(total) * 1_000)
    eng.compact()
    held: list[tuple[int, int]] = []
    while len(held) < lapsed:
        c = eng.claim(budget=min(64, lapsed - len(held)), now_ms=NOW, lease_ms=1)
        assert len(c), f"{len(held):,} of {lapsed:,} rows claimed, then nothing"
        held += list(zip(c.rows.tolist(), c.tokens.tolist(), strict=True))
    t = NOW + 1
    first = eng.claim(budget=16, now_ms=t, lease_ms=HELD)
    assert first.rows.tolist() == rows[:16]
    renewed = []
    for r, tok in held[17::2]:
        eng.renew(r, tok, lease_ms=HELD, now_ms=t)
        renewed.append(r)
    want = [r for r in rows[16:] if r not in set(renewed)]
    batches = _claim_until_empty(eng, t, HELD, 64, limit=total // 64 + 2)
    got = [r for b in batches for r in b[0].tolist()]
    assert got == want, (
        f"{len(got):,} of {len(want):,} due rows granted with {len(renewed):,} renewed leases "
        f"among them; stats: {_lane_stats(eng, t)}")
    assert eng.verify() == []


# -- 3. release ---------------------------------------------------------------------------------


@pytest.mark.parametrize("in_flight", IN_FLIGHT)
@pytest.mark.parametrize("compacted", [False, True], ids=["ring", "indexed"])
def test_released_rows_are_claimable_at_once_in_due_order(make_engine, in_flight, compacted):
    """A batch of 20 held with ``in_flight`` rows ahead of it; 20 newcomers written meanwhile,
    each due 30 s after a batch row. Releasing 14 of the batch makes them claimable at the same
    instant: the next claim returns them and the newcomers merged in due order, none of the 6
    still held; those 6 can still be completed."""
    eng = make_engine(capacity=in_flight + 40)
    _add(eng, NOW - 2 * DAY + np.arange(in_flight))
    base = NOW - DAY + np.arange(20) * MINUTE
    batch_rows = _add(eng, base)
    eng.compact()
    _hold(eng, in_flight, NOW, HELD)
    c = eng.claim(budget=20, now_ms=NOW, lease_ms=HOUR)
    assert sorted(c.rows.tolist()) == sorted(batch_rows)
    newcomers = _add(eng, base + 30_000)
    if compacted:
        eng.compact()
    pairs = list(zip(c.rows.tolist(), c.tokens.tolist(), strict=True))
    kept = pairs[::3]
    released = [p for p in pairs if p not in kept]
    for r, tok in released:
        eng.release(r, tok)
    want = sorted([r for r, _ in released] + newcomers, key=lambda r: (eng.due_ms(r), r))
    got = eng.claim(budget=100, now_ms=NOW, lease_ms=HOUR)
    assert got.rows.tolist() == want
    assert len(eng.claim(budget=100, now_ms=NOW, lease_ms=HOUR)) == 0
    ok = eng.complete_many([r for r, _ in kept], [k for _, k in kept], now_ms=NOW)
    assert ok.all()
    assert _lane_stats(eng, NOW)["leased"] == in_flight + len(want)
    assert eng.verify() == []


@pytest.mark.parametrize("remainder", ["lane-order", "lateness"])
def test_a_pass_after_a_release_below_the_floor_crosses_the_granted_run_in_one_step(
        make_engine, remainder):
    """A released row goes back below its lane's floor, so the next pass cannot start at the
    skip hint: it seeks to the floor and crosses the tombstones of every row granted since
    (csrc/claim.c, ``tomb_run``). That pass marks the run with a jump, so the pass after the next
    such release crosses it in a step or two, not entry by entry. Before, every pass after a
    release or a lapsed lease read the whole run again: a pool's cycle over 64 lanes in lane
    order cost 155 µs against 18 µs now (docs/design.md §6, "Tombstones and jumps")."""
    eng = make_engine(policy=ten_lanes(remainder=remainder), capacity=10_000)
    _add(eng, NOW - HOUR + np.arange(9_000) * 100)  # due one after another, 100 ms apart
    eng.compact()
    early = [eng.claim(budget=4, now_ms=NOW, lease_ms=HELD) for _ in range(2)]
    _hold(eng, 8_000, NOW, HELD, budget=16)  # held, so nothing is written and nothing merged
    reads = []
    for batch in early:
        eng.release_many(batch.rows, batch.tokens, now_ms=NOW)  # back below the floor
        before = _core.lib.rl_index_reads()
        got = eng.claim(budget=16, now_ms=NOW, lease_ms=HELD)
        reads.append(_core.lib.rl_index_reads() - before)
        assert got.rows.tolist()[:4] == batch.rows.tolist()  # first, in due order
    assert reads[0] >= 8_000, reads  # the first crosses the run entry by entry, and marks it
    assert reads[1] <= 64, reads
    assert eng.verify() == []


@pytest.mark.parametrize("in_flight", IN_FLIGHT)
def test_a_stale_release_raises_lease_lost_and_changes_nothing(make_engine, in_flight):
    """Three rows leased for 1 s, then expired and claimed again: releasing with the first
    tokens raises LeaseLost and changes no row, count or claim. A right release puts its row
    back once: releasing it twice does not make it claimable twice."""
    eng = make_engine(capacity=in_flight + 3)
    _add(eng, NOW - 2 * DAY + np.arange(in_flight))
    rows = _add(eng, NOW - DAY + np.arange(3) * MINUTE)
    eng.compact()
    _hold(eng, in_flight, NOW, HELD)
    old = eng.claim(budget=3, now_ms=NOW, lease_ms=1_000)
    assert old.rows.tolist() == rows
    t = NOW + 1_000
    new = eng.claim(budget=3, now_ms=t, lease_ms=HOUR)
    assert new.rows.tolist() == rows
    assert set(new.tokens.tolist()).isdisjoint(old.tokens.tolist())

    def snapshot():
        return [eng.describe(r, now_ms=t) for r in rows], eng.stats(now_ms=t)["lanes"]

    before = snapshot()
    for r, tok in zip(rows, old.tokens.tolist(), strict=True):
        with pytest.raises(LeaseLost):
            eng.release(r, tok)
        assert snapshot() == before
    assert len(eng.claim(budget=64, now_ms=t, lease_ms=HOUR)) == 0  # still held by `new`
    assert eng.verify() == []

    r0, tok0 = rows[0], int(new.tokens[0])
    eng.release(r0, tok0)
    with pytest.raises(LeaseLost):
        eng.release(r0, tok0)  # spent by the first release
    assert eng.claim(budget=64, now_ms=t, lease_ms=HOUR).rows.tolist() == [r0]
    assert len(eng.claim(budget=64, now_ms=t, lease_ms=HOUR)) == 0

    r1, tok1 = rows[1], int(new.tokens[1])
    eng.complete(r1, tok1, next_due_ms=t + DAY, now_ms=t)
    after = eng.describe(r1, now_ms=t)
    with pytest.raises(LeaseLost):
        eng.release(r1, tok1)  # spent by the complete: the row must not come back now
    assert eng.describe(r1, now_ms=t) == after
    assert len(eng.claim(budget=64, now_ms=t, lease_ms=HOUR)) == 0
    assert eng.verify() == []


# -- 4. a stateful model with thousands of leases held at once -------------------------------

HORIZON = STRIDE - 1
LEASES = st.sampled_from([1, 1_000, MINUTE, HOUR, DAY])
STEPS = st.one_of(st.sampled_from([1, 999, 1_000, MINUTE, HOUR, DAY]), st.integers(0, 2 * HOUR))
POLICIES = st.sampled_from([
    LanePolicy(),
    LanePolicy(remainder="edf"),
    LanePolicy(urgent_max_share=0.2, min_share={}, cold_after=2),
])
MAX_ROWS = 1_000  # rows the machine may add beyond its starting corpus
WINDOW = 140  # a claim's default window: index entries one lane's seek may read in one pass


class InFlightMachine(RuleBasedStateMachine):
    """A real engine and a numpy model of every row (due time, lane, lease) side by side, in
    virtual time, with up to eight thousand rows, most of them in lane 1, held in bulk (the
    second stateful machine: tests/test_stateful.py's covers every call on small engines).

    After every step the engine verifies and its per-lane queued / due / leased counts equal the
    model's. Every claim is held to the model: it grants only claimable rows (queued, due, no
    unexpired lease); each lane's grants come in due order, start with its earliest claimable
    row and, unless they fill half the lane's window, are exactly its earliest claimable rows
    (so expired and released rows come back in due order among the rest); and a claim that
    grants less than its budget took at least one row from every lane that had a claimable row
    (docs/design.md §14: a lane with a due unleased row is never passed over). ``drain`` claims
    until a claim grants nothing and must get exactly the model's claimable rows.

    A lease whose time is up but that nobody has claimed again still belongs to its holder, as
    in tests/test_stateful.py: its token completes, fails, releases or renews."""

    def __init__(self) -> None:
        super().__init__()
        self.eng: Engine | None = None
        self.name = ""
        self.clock = NOW
        self.n = 0
        self.spent: list[tuple[int, int]] = []  # (row, token) of leases that ended

    @initialize(n=st.sampled_from([300, 3_000, 8_000]), policy=POLICIES,
                seed=st.integers(0, 2**32 - 1), compacted=st.booleans(),
                hold_first=st.sampled_from([None, MINUTE, DAY]))
    def start(self, n, policy, seed, compacted, hold_first):
        """The engine and a corpus, mostly due, mostly in lane 1; with ``hold_first``, every
        due row is claimed (and kept) before the first step."""
        self.policy = policy
        self.cap = n + MAX_ROWS
        self.name = unique_name()
        self.eng = Engine.create(self.name, self.cap, policy)
        cap = self.cap
        self.due = np.full(cap, -1, np.int64)
        self.lane = np.zeros(cap, np.int64)
        self.interval = np.zeros(cap, np.int64)
        self.prov = np.zeros(cap, np.int64)
        self.failures = np.zeros(cap, np.int64)
        self.held = np.zeros(cap, bool)  # the row's lease has not ended (expired or not)
        self.tok = np.zeros(cap, np.int64)
        self.exp = np.zeros(cap, np.int64)
        self._add(np.random.default_rng(seed), n, mostly_due=True)
        if compacted:
            self.e.compact()
        if hold_first is not None:
            self._drain(hold_first, 64)

    def teardown(self) -> None:
        if self.eng is not None:
            dispose(self.eng, self.name)
            self.eng = None

    @property
    def e(self) -> Engine:
        assert self.eng is not None
        return self.eng

    # -- the model -----------------------------------------------------------------------------

    def _lane_of(self, prov: int, interval: int, failures: int) -> int:
        return self.policy.lane_for(("submitted", "discovered")[prov], interval, failures)

    def _add(self, rng: np.random.Generator, k: int, mostly_due: bool) -> None:
        k = min(k, self.cap - self.n)
        if k == 0:
            return
        interval = rng.choice(np.array([600, 7200, 43200, 172800]), k, p=[0.85, 0.05, 0.05, 0.05])
        prov = (rng.random(k) < 0.1).astype(np.int64)
        failures = (rng.random(k) < 0.05).astype(np.int64) * 5
        ahead = rng.random(k) < (0.1 if mostly_due else 0.5)
        due = np.where(ahead, self.clock + rng.integers(0, 2 * HOUR, k),
                       self.clock - rng.integers(0, 3 * DAY, k))
        due = np.clip(due, 0, HORIZON)
        rows = self.e.add_many(due, interval, prov, failures)
        assert rows.tolist() == list(range(self.n, self.n + k))
        sl = slice(self.n, self.n + k)
        self.due[sl], self.interval[sl], self.prov[sl], self.failures[sl] = (
            due, interval, prov, failures)
        self.lane[sl] = [self._lane_of(int(p), int(i), int(f))
                         for p, i, f in zip(prov, interval, failures, strict=True)]
        self.n += k

    def _claimable(self, now: int) -> np.ndarray:
        n = self.n
        return ((self.due[:n] >= 0) & (self.due[:n] <= now)
                & ~(self.held[:n] & (self.exp[:n] > now)))

    def _end(self, rows: np.ndarray) -> None:
        for r in rows.tolist():
            self.spent.append((r, int(self.tok[r])))
        del self.spent[:-2000]
        self.held[rows] = False

    def _claim(self, budget: int, lease_ms: int) -> np.ndarray:
        now, n = self.clock, self.n
        free = self._claimable(now)
        c = self.e.claim(budget=budget, now_ms=now, lease_ms=lease_ms)
        rows, lanes, dues, toks = (c.rows.copy(), c.lanes.copy(), c.due_ms.copy(),
                                   c.tokens.copy())
        assert len(rows) <= budget
        assert len(np.unique(rows)) == len(rows), "a row granted twice in one claim"
        bad = rows[~free[rows]]
        assert len(bad) == 0, (
            f"granted rows the model holds unclaimable: {bad[:5].tolist()}, due "
            f"{self.due[bad[:5]].tolist()}, lease expiry {self.exp[bad[:5]].tolist()}, now {now}")
        assert (lanes == self.lane[rows]).all() and (dues == self.due[rows]).all()
        lane_free = self.lane[:n][free]
        for lane in np.unique(lanes).tolist():
            d = dues[lanes == lane]
            assert (np.diff(d) >= 0).all(), f"lane {lane} not in due order: {d[:20]}"
            earliest = np.sort(self.due[:n][free & (self.lane[:n] == lane)])[: len(d)]
            assert d[0] == earliest[0], (
                f"lane {lane} passed over its earliest claimable row (due {earliest[0] - now} ms "
                f"from now) and granted {len(d)} rows from {d[0] - now} ms")
            # Exactly its earliest rows, unless the lane's grants filled most of its window: the
            # pass may then add recent writes due later than index entries past the window.
            assert len(d) >= WINDOW // 2 or (d == earliest).all(), (
                f"lane {lane} granted {len(d)} rows that are not its earliest claimable ones")
        if len(rows) < budget:
            passed_over = sorted(set(np.unique(lane_free).tolist()) - set(lanes.tolist()) - {0})
            assert not passed_over, (
                f"claim of {budget} granted {len(rows)} and none from lanes {passed_over}, "
                f"which have {[int((lane_free == ln).sum()) for ln in passed_over]} due unleased "
                f"rows and {[int((self.held[:n] & (self.exp[:n] > now) & (self.lane[:n] == ln)).sum()) for ln in passed_over]} "  # noqa: E501
                f"rows leased")
        was_held = rows[self.held[rows]]
        self._end(was_held)
        self.held[rows] = True
        self.tok[rows] = toks
        self.exp[rows] = min(now + lease_ms, HORIZON)
        return rows

    def _pick_held(self, seed: int, k: int) -> np.ndarray:
        held = np.nonzero(self.held[: self.n])[0]
        k = min(k, len(held))
        return np.random.default_rng(seed).choice(held, k, replace=False)

    # -- claims --------------------------------------------------------------------------------

    @rule(budget=st.sampled_from([16, 64, 256, 1024]), lease=LEASES, repeat=st.integers(1, 25))
    def hold(self, budget, lease, repeat):
        """Claims that keep every row they get."""
        for _ in range(repeat):
            self._claim(budget, lease)

    @rule(lease=LEASES, budget=st.sampled_from([64, 4096]))
    def drain(self, lease, budget):
        """Claims until one grants nothing take exactly the model's claimable rows, once each."""
        self._drain(lease, budget)

    def _drain(self, lease: int, budget: int) -> None:
        want = set(np.nonzero(self._claimable(self.clock))[0].tolist())
        got: list[int] = []
        for _ in range(self.n + 1):
            rows = self._claim(budget, lease)
            if len(rows) == 0:
                break
            got += rows.tolist()
        assert len(got) == len(set(got))
        assert set(got) == want, (
            f"drain took {len(got)} rows, {len(want)} claimable; missing "
            f"{sorted(want - set(got))[:10]}")

    # -- ends of leases ------------------------------------------------------------------------

    @precondition(lambda self: self.eng is not None and self.held[: self.n].any())
    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 2_000))
    def release_some(self, seed, k):
        rows = self._pick_held(seed, k)
        for r in rows.tolist():
            self.e.release(r, int(self.tok[r]))
        self._end(rows)

    @precondition(lambda self: self.eng is not None and self.held[: self.n].any())
    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 2_000),
          when=st.sampled_from(["default", "past", "soon"]))
    def complete_some(self, seed, k, when):
        rows = self._pick_held(seed, k)
        rng = np.random.default_rng(seed + 1)
        if when == "default":
            nxt = None
            new_due = np.minimum(self.clock + self.interval[rows] * 1000, HORIZON)
        else:
            off = rng.integers(0, 2 * HOUR, len(rows))
            new_due = np.clip(self.clock - off if when == "past" else self.clock + off, 0,
                              HORIZON)
            nxt = new_due
        ok = self.e.complete_many(rows, self.tok[rows], next_due_ms=nxt, now_ms=self.clock)
        assert ok.all()
        self._end(rows)
        self.due[rows] = new_due
        self.failures[rows] = 0
        for r in rows.tolist():
            self.lane[r] = self._lane_of(int(self.prov[r]), int(self.interval[r]), 0)

    @precondition(lambda self: self.eng is not None and self.held[: self.n].any())
    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 50))
    def fail_some(self, seed, k):
        rows = self._pick_held(seed, k)
        rng = np.random.default_rng(seed + 2)
        for r in rows.tolist():
            retry = int(np.clip(self.clock + rng.integers(-HOUR, HOUR), 0, HORIZON))
            self.e.fail(r, int(self.tok[r]), retry_at_ms=retry, now_ms=self.clock)
            self.failures[r] = min(255, self.failures[r] + 1)
            self.due[r] = retry
            self.lane[r] = self._lane_of(int(self.prov[r]), int(self.interval[r]),
                                         int(self.failures[r]))
        self._end(rows)

    @precondition(lambda self: self.eng is not None and self.held[: self.n].any())
    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 300), lease=LEASES)
    def renew_some(self, seed, k, lease):
        rows = self._pick_held(seed, k)
        for r in rows.tolist():
            old = int(self.tok[r])
            new = self.e.renew(r, old, lease_ms=lease, now_ms=self.clock)
            if new != old:
                self.spent.append((r, old))
            self.tok[r] = new
            self.exp[r] = min(self.clock + lease, HORIZON - 2)

    @precondition(lambda self: self.eng is not None and len(self.spent) > 0)
    @rule(data=st.data(), op=st.sampled_from(["release", "complete", "fail", "renew"]))
    def stale_token(self, data, op):
        """A token whose lease ended changes nothing, whatever the row's state now."""
        row, tok = data.draw(st.sampled_from(self.spent))
        if self.held[row] and self.tok[row] == tok:
            return  # cannot happen (tokens change on every grant); keep the model honest
        calls = {
            "release": lambda: self.e.release(row, tok),
            "complete": lambda: self.e.complete(row, tok, now_ms=self.clock),
            "fail": lambda: self.e.fail(row, tok, now_ms=self.clock),
            "renew": lambda: self.e.renew(row, tok, lease_ms=HOUR, now_ms=self.clock),
        }
        before = self.e.describe(row, now_ms=self.clock), self.e.stats(now_ms=self.clock)["lanes"]
        with pytest.raises(LeaseLost):
            calls[op]()
        assert (self.e.describe(row, now_ms=self.clock),
                self.e.stats(now_ms=self.clock)["lanes"]) == before

    # -- writes, time, maintenance -------------------------------------------------------------

    @precondition(lambda self: self.eng is not None and self.n < self.cap)
    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 200))
    def add_some(self, seed, k):
        self._add(np.random.default_rng(seed), k, mostly_due=False)

    @rule(ms=STEPS)
    def advance(self, ms):
        self.clock = min(HORIZON - 2 * DAY, self.clock + ms)

    @precondition(lambda self: self.eng is not None
                  and (self.held[: self.n] & (self.exp[: self.n] > self.clock)).any())
    @rule(delta=st.sampled_from([-1, 0, 1]))
    def to_lease_expiry(self, delta):
        """To the earliest unexpired lease's expiry: 1 ms before, at (claimable) or after."""
        live = self.held[: self.n] & (self.exp[: self.n] > self.clock)
        self.clock = max(self.clock, int(self.exp[: self.n][live].min()) + delta)

    @rule(full=st.booleans())
    def compact(self, full):
        self.e.compact(full=full)

    # -- after every step ----------------------------------------------------------------------

    @invariant()
    def engine_matches_the_model(self):
        if self.eng is None:
            return
        assert self.e.verify() == []
        now, n = self.clock, self.n
        queued = self.due[:n] >= 0
        size = 64
        want = {
            "queued": np.bincount(self.lane[:n][queued], minlength=size),
            "due": np.bincount(self.lane[:n][queued & (self.due[:n] <= now)], minlength=size),
            "leased": np.bincount(self.lane[:n][self.held[:n] & (self.exp[:n] > now)],
                                  minlength=size),
        }
        for ln in self.e.stats(now_ms=now)["lanes"]:
            got = {k: ln[k] for k in want}
            assert got == {k: int(v[ln["lane"]]) for k, v in want.items()}, ln["lane"]


# ~100 examples of up to 30 steps, a third of them with over 5,000 rows of one lane in flight:
# about 3 s on a core where rows in flight are free.
InFlightMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    # a failure with thousands of rows shrinks slowly; the explain phase would double that
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large],
)
TestInFlightStateful = InFlightMachine.TestCase
