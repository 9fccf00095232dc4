"""The two backends side by side (docs/design.md §14, "one contract"): the same random sequence of
adds, claims, completes, fails, releases, renews and rushes, in virtual time, run on a shared-memory
engine and on a Redis queue with the same policy, grants the same rows in the same order with
the same lanes and due times, accepts and refuses the same tokens, and leaves every row and the
share credits the same. Only the tokens differ (each backend makes its own); each is mapped to
its engine through the grant it came from."""

from __future__ import annotations

from typing import Any

from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from lanes_testlib import DAY, HOUR, MINUTE, NOW, dispose, share_policies, unique_name

from engine import Engine, LanePolicy, LeaseLost

OFFSETS = st.integers(-2 * DAY, HOUR)
ADD = st.tuples(st.just("add"), OFFSETS, st.sampled_from([60, 600, 7200, 43200, 172800]),
                st.sampled_from(["submitted", "discovered"]), st.sampled_from([0, 0, 1, 3]))
CLAIM = st.tuples(st.just("claim"), st.integers(1, 12), st.sampled_from([1000, 60_000, HOUR]))
WIDE = 10_000
"""A window no lane's seek here reaches. The window means one thing per backend: shared memory
bounds the index entries a lane's seek reads (rows still in the recent-write ring come on top),
Redis the rows a lane grants; the two agree for a merged index (test_claim.py's window test)."""
OPS = st.one_of(
    ADD, CLAIM, CLAIM,
    st.tuples(st.just("complete"), st.integers(0, 10**6), st.none() | OFFSETS),
    st.tuples(st.just("fail"), st.integers(0, 10**6), st.none() | OFFSETS, st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 10**6)),
    st.tuples(st.just("renew"), st.integers(0, 10**6), st.sampled_from([1000, HOUR])),
    st.tuples(st.just("rush"), st.integers(0, 10**6), st.sampled_from(["rush", "wait"])),
    st.tuples(st.just("advance"), st.sampled_from([1, 999, 1000, 30_000, MINUTE, HOUR])),
)
CONTRACT_KEYS = ("row", "queued", "due_ms", "lane", "interval_s", "failures", "provenance",
                 "urgent", "leased", "lease_expiry_ms")


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What ``fn(*args, **kwargs)`` did, comparable across backends: its result, or that the
    token was stale."""
    try:
        return ("ok", fn(*args, **kwargs))
    except LeaseLost:
        return ("stale", None)


@settings(max_examples=100, deadline=None)
@given(policy=share_policies(), corpus=st.lists(ADD, min_size=1, max_size=30),
       ops=st.lists(OPS, min_size=5, max_size=40))
# Found by CI: a renew back to the claim's expiry gives the shared-memory claim token again.
@example(policy=LanePolicy(urgent_max_share=0.0, min_share={}),
         corpus=[("add", 0, 60, "submitted", 0)],
         ops=[("add", 0, 60, "submitted", 0), ("claim", 1, 1000), ("renew", 0, 3_600_000),
              ("renew", 1, 1000), ("release", 0)])
def test_both_backends_grant_the_same_rows_in_the_same_order(redis_server, policy, corpus, ops):
    name = unique_name()
    shm = Engine.create(name, 256, policy)
    red = Engine.connect(redis_server.url, unique_name(), policy, create=True, capacity=256)
    try:
        now = NOW
        grants: list[tuple[int, int, int]] = []  # (row, shm token, redis token), every grant
        for op in corpus + ops:
            kind = op[0]
            if kind == "add":
                _, off, interval, prov, failures = op
                a = shm.add(now + off, interval, provenance=prov, failures=failures)
                b = red.add(now + off, interval, provenance=prov, failures=failures)
                assert a == b
            elif kind == "claim":
                _, budget, lease_ms = op
                a = shm.claim(budget=budget, now_ms=now, lease_ms=lease_ms, window=WIDE)
                b = red.claim(budget=budget, now_ms=now, lease_ms=lease_ms, window=WIDE)
                assert (a.rows.tolist(), a.lanes.tolist(), a.due_ms.tolist()) == (
                    b.rows.tolist(), b.lanes.tolist(), b.due_ms.tolist()), (now, op)
                fresh = {(r, ta): tb for r, ta, tb in zip(a.rows.tolist(), a.tokens.tolist(),
                                                           b.tokens.tolist(), strict=True)}
                # A shared-memory token is the lease word (owner, expiry): a grant at an expiry
                # an earlier lease of the row had makes that earlier token live again (see
                # renew below), so those grants stand for the new lease.
                grants = [(r, ta, fresh.get((r, ta), tb)) for r, ta, tb in grants]
                grants += [(r, ta, tb) for (r, ta), tb in fresh.items()]
            elif kind == "advance":
                now += op[1]
            elif kind == "rush":
                used = shm.stats()["rows"]
                if used:
                    row = op[1] % used
                    assert _outcome(shm.prioritize, row, op[2], now_ms=now) == \
                        _outcome(red.prioritize, row, op[2], now_ms=now)
            elif grants:  # a write with the token of some earlier grant (live or stale)
                row, ta, tb = grants[op[1] % len(grants)]
                both = ((shm, ta), (red, tb))
                if kind == "complete":
                    nd = None if op[2] is None else now + op[2]
                    got = [_outcome(e.complete, row, t, next_due_ms=nd, now_ms=now)
                           for e, t in both]
                elif kind == "fail":
                    retry = None if op[2] is None else now + op[2]
                    got = [_outcome(e.fail, row, t, retry_at_ms=retry, now_ms=now,
                                    permanent=op[3]) for e, t in both]
                elif kind == "release":
                    got = [_outcome(e.release, row, t) for e, t in both]
                else:
                    got = [_outcome(e.renew, row, t, lease_ms=op[2], now_ms=now)
                           for e, t in both]
                    if got[0][0] == "ok" and got[1][0] == "ok":
                        new_a, new_b = got[0][1], got[1][1]
                        # A shared-memory token is the lease word (owner, expiry): a renew to
                        # an expiry this row's lease had before (the same one, or that of an
                        # earlier grant or renew) gives that token again, and so makes every
                        # earlier grant holding it live again, where Redis hands out a new
                        # token each time. Those grants now stand for the new lease.
                        grants = [(r, a, new_b if (r, a) == (row, new_a) else b)
                                  for r, a, b in grants]
                        grants.append((row, new_a, new_b))
                        got = [("ok", None), ("ok", None)]  # tokens differ by design
                assert got[0] == got[1], (op, row, got)
            rows = shm.stats()["rows"]
            assert [_contract(shm.describe(r, now_ms=now)) for r in range(rows)] == \
                [_contract(red.describe(r, now_ms=now)) for r in range(rows)]
            assert shm.stats(now)["credits"] == red.stats(now)["credits"]
        assert shm.verify() == [] and red.verify() == []
        event(f"grants: {'none' if not grants else '1-9' if len(grants) < 10 else '10+'}")
    finally:
        dispose(shm, name)
        dispose(red, red.name)


def _contract(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in CONTRACT_KEYS}


