"""A model-based test: random interleavings of every write and claim, checked after each step
against a plain-Python model and the engine's own ``verify()`` (invariants 1, 2, 3, 6, 7)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from lanes_testlib import DAY, HOUR, NOW, dispose, unique_name

from engine import LanePolicy, LeaseLost
from engine.policy import reference_pass

LANES = LanePolicy().lane_count
MAX_ROWS = 40


class EngineModel(RuleBasedStateMachine):
    @initialize(remainder=st.sampled_from(["lane-order", "edf"]), shares=st.booleans())
    def start(self, remainder, shares):
        from engine import Engine

        if shares:  # the product's default fairness: urgent cap and floors
            self.policy = LanePolicy(cold_after=3, remainder=remainder)
        else:
            self.policy = LanePolicy(urgent_max_share=1.0, min_share={}, cold_after=3,
                                     remainder=remainder)
        self.credits: dict[str, int] = {}
        self.name = unique_name()
        self.eng = Engine.create(self.name, 64, self.policy)
        self.now = NOW
        self.rows: dict[int, dict] = {}
        self.dead_tokens: dict[int, list[int]] = {}

    def teardown(self):
        if hasattr(self, "eng"):
            dispose(self.eng, self.name)

    # -- helpers --------------------------------------------------------------------------

    def _pick(self, i, pred):
        cands = sorted(r for r, m in self.rows.items() if pred(m))
        return cands[i % len(cands)] if cands else None

    def _lane(self, m):
        return self.policy.lane_for(m["prov"], m["interval"], m["failures"], urgent=m["urgent"])

    def _sync_derived(self, row, m):
        """Fields whose reset on a write the contract leaves open: take them from the engine,
        then hold the lane to what they derive."""
        d = self.eng.describe(row)
        assert d["failures"] in (m["failures"], 0)
        m["failures"] = d["failures"]
        m["urgent"] = d["urgent"]
        m["lane"] = self._lane(m)

    def _claimable(self, m):
        return m["queued"] and m["due"] <= self.now and (
            m["token"] is None or m["expiry"] <= self.now)

    def _retire(self, row, m):
        if m["token"] is not None:
            self.dead_tokens.setdefault(row, []).append(m["token"])
        m["token"] = None
        m["expiry"] = None

    # -- rules ----------------------------------------------------------------------------

    @precondition(lambda self: len(self.rows) < MAX_ROWS)
    @rule(off=st.integers(-2 * DAY, 2 * HOUR),
          interval=st.sampled_from([60, 3600, 7200, 43200, 172800]),
          prov=st.sampled_from(["submitted", "discovered"]),
          failures=st.integers(0, 4))
    def add(self, off, interval, prov, failures):
        due = self.now + off
        row = self.eng.add(due, interval, provenance=prov, failures=failures)
        assert row not in self.rows
        m = dict(id=row, due=due, interval=interval, prov=prov, failures=failures, urgent=False,
                 queued=True, token=None, expiry=None)
        m["lane"] = self._lane(m)
        self.rows[row] = m

    @rule(budget=st.integers(1, 20), lease_ms=st.sampled_from([1_000, 60_000, HOUR]))
    def claim(self, budget, lease_ms):
        due_lists = [[] for _ in range(LANES)]
        for m in self.rows.values():
            if self._claimable(m):
                due_lists[m["lane"]].append(m["due"])
        due_lists = [sorted(d) for d in due_lists]
        expected, self.credits = reference_pass(self.policy, budget, due_lists, self.credits)
        c = self.eng.claim(budget=budget, now_ms=self.now, lease_ms=lease_ms)
        got = [0] * LANES
        for row, lane, due, tok in zip(c.rows.tolist(), c.lanes.tolist(), c.due_ms.tolist(),
                                       c.tokens.tolist(), strict=True):
            m = self.rows[row]
            assert self._claimable(m), (row, m)
            assert lane == m["lane"] and due == m["due"]
            got[lane] += 1
            self._retire(row, m)
            m["token"], m["expiry"] = tok, self.now + lease_ms
        assert got == expected, (got, expected, due_lists)
        for lane in range(LANES):
            pairs = zip(c.due_ms.tolist(), c.lanes.tolist(), strict=True)
            dues = sorted(d for d, ln in pairs if ln == lane)
            assert dues == due_lists[lane][: expected[lane]]

    @rule(i=st.integers(0, 10**6), next_off=st.one_of(st.none(), st.integers(-HOUR, 2 * HOUR)))
    def complete(self, i, next_off):
        row = self._pick(i, lambda m: m["token"] is not None)
        if row is None:
            return
        m = self.rows[row]
        if next_off is None:
            self.eng.complete(row, m["token"], now_ms=self.now)
            m["due"] = self.now + m["interval"] * 1000
        else:
            self.eng.complete(row, m["token"], next_due_ms=self.now + next_off, now_ms=self.now)
            m["due"] = self.now + next_off
        self._retire(row, m)
        self._sync_derived(row, m)

    @rule(i=st.integers(0, 10**6), retry_off=st.integers(-HOUR, HOUR))
    def fail(self, i, retry_off):
        row = self._pick(i, lambda m: m["token"] is not None)
        if row is None:
            return
        m = self.rows[row]
        before = m["failures"]
        self.eng.fail(row, m["token"], retry_at_ms=self.now + retry_off, now_ms=self.now)
        m["due"] = self.now + retry_off
        self._retire(row, m)
        d = self.eng.describe(row)
        assert d["failures"] == min(before + 1, 255)
        m["failures"] = d["failures"]
        m["urgent"] = d["urgent"]
        m["lane"] = self._lane(m)

    @rule(i=st.integers(0, 10**6))
    def release(self, i):
        row = self._pick(i, lambda m: m["token"] is not None)
        if row is None:
            return
        m = self.rows[row]
        self.eng.release(row, m["token"])
        self._retire(row, m)

    @rule(i=st.integers(0, 10**6))
    def stale_token_changes_nothing(self, i):
        row = self._pick(i, lambda m: m["queued"] and bool(self.dead_tokens.get(m["id"])))
        if row is None:
            return
        before = self.eng.describe(row)
        old = self.dead_tokens[row][-1]
        with pytest.raises(LeaseLost):
            self.eng.complete(row, old, now_ms=self.now)
        with pytest.raises(LeaseLost):
            self.eng.fail(row, old, now_ms=self.now)
        with pytest.raises(LeaseLost):
            self.eng.release(row, old)
        assert self.eng.describe(row) == before

    @rule(i=st.integers(0, 10**6), mode=st.sampled_from(["rush", "wait"]))
    def prioritize(self, i, mode):
        row = self._pick(i, lambda m: m["queued"] and m["token"] is None and not m["urgent"])
        if row is None:
            return
        m = self.rows[row]
        self.eng.prioritize(row, mode, now_ms=self.now)
        m["due"] = self.now
        if mode == "rush":
            m["urgent"] = True
            m["lane"] = 0
        d = self.eng.describe(row)
        assert d["urgent"] is (mode == "rush")

    @rule(i=st.integers(0, 10**6))
    def remove(self, i):
        row = self._pick(i, lambda m: m["queued"] and m["token"] is None)
        if row is None:
            return
        self.eng.remove(row)
        self.rows[row]["queued"] = False

    @rule()
    def compact(self):
        self.eng.compact()

    @rule(delta=st.integers(1, 2 * HOUR))
    def advance(self, delta):
        self.now += delta

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def engine_matches_model(self):
        if not hasattr(self, "eng"):
            return
        assert self.eng.verify() == []
        for row, m in self.rows.items():
            d = self.eng.describe(row)
            assert d["queued"] is m["queued"], (row, d, m)
            if not m["queued"]:
                continue
            assert d["due_ms"] == m["due"], (row, d, m)
            assert d["lane"] == m["lane"], (row, d, m)
            assert self.eng.due_ms(row) == m["due"]
            assert d["lease_expiry_ms"] == m["expiry"], (row, d, m)
        stats = self.eng.stats(now_ms=self.now)
        assert stats["rows"] == len(self.rows)
        queued = [0] * LANES
        for m in self.rows.values():
            if m["queued"]:
                queued[m["lane"]] += 1
        assert [ln["queued"] for ln in stats["lanes"][:LANES]] == queued
        assert sum(ln["queued"] for ln in stats["lanes"]) == sum(queued)


TestEngineModel = EngineModel.TestCase
TestEngineModel.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
