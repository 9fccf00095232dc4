"""The C core mirrors two pieces of Python: the key packing and the lane a row's inputs derive.
These hold the mirrors equal, and the typed stub of the core in step with its header."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import STRIDE, LanePolicy, encode
from engine.policy import LATE_BITS, PROVENANCES
from engine.shm.segment import lib, policy_to_c

ROOT = Path(__file__).resolve().parents[2]


@given(lane=st.integers(0, 63), due=st.integers(0, STRIDE - 1))
def test_c_encode_mirrors_python_encode(lane: int, due: int) -> None:
    assert lib.rl_encode(lane, due) == encode(lane, due)


policies = st.builds(
    LanePolicy,
    ttl_bands=st.lists(st.integers(1, 10 * 86400), max_size=8),
    cold_after=st.integers(1, 255),
    urgent_max_share=st.just(0.2),
    min_share=st.just({}),
    lanes_enabled=st.booleans(),
)


@settings(max_examples=300)
@given(policy=policies, provenance=st.sampled_from(PROVENANCES),
       interval=st.integers(1, 2**32 - 1), failures=st.integers(0, 255), urgent=st.booleans())
def test_c_lane_for_mirrors_the_policy(policy: LanePolicy, provenance: str, interval: int,
                                       failures: int, urgent: bool) -> None:
    c_policy = policy_to_c(policy)
    expected = policy.lane_for(provenance, interval, failures, urgent=urgent)
    got = lib.rl_lane_for(c_policy, PROVENANCES.index(provenance), interval, failures, urgent)
    assert got == expected


def test_lateness_quanta_are_as_wide_in_c_lua_and_python() -> None:
    """The three passes compare lane heads in quanta of the same width: C's LATE_BITS, the
    Python reference's, and Lua's frexp arithmetic (2^LATE_BITS quanta a binade)."""
    c = (ROOT / "csrc" / "claim.c").read_text()
    m = re.search(r"^#define LATE_BITS (\d+)", c, re.M)
    assert m and int(m.group(1)) == LATE_BITS
    lua = (ROOT / "engine" / "redis" / "lua" / "includes" / "claim_pass.lua").read_text()
    assert f"h.q = e * {2 ** LATE_BITS} + math.floor((m - 0.5) * {2 ** (LATE_BITS + 1)})" in lua


def test_band_edges_fall_in_the_shorter_band() -> None:
    policy = LanePolicy(ttl_bands=(3600, 21600))
    c_policy = policy_to_c(policy)
    for interval, band in ((3600, 0), (3601, 1), (21600, 1), (21601, 2)):
        assert policy.lane_for("submitted", interval) == 1 + band
        assert lib.rl_lane_for(c_policy, 0, interval, 0, 0) == 1 + band


def test_typed_stub_declares_every_function_of_the_header() -> None:
    header = (ROOT / "csrc" / "lanes.h").read_text()
    stub = (ROOT / "engine" / "_core.pyi").read_text()
    functions = set(re.findall(r"^\w+ \*?(rl_\w+)\(", header, re.M))
    assert functions, "no functions found in csrc/lanes.h"
    missing = sorted(f for f in functions if f"def {f}(" not in stub)
    assert not missing, f"engine/_core.pyi lacks {missing}"
    constants = set(re.findall(r"^#define (RL_\w+) -?\d+", header, re.M))
    assert not sorted(c for c in constants if f"{c}: int" not in stub)


def test_c_files_call_only_the_files_before_them() -> None:
    """The core's files are layered (engine/_build.py lists them bottom up): each calls only
    functions of files before it, so no two call each other in a circle."""
    import sys

    sys.path.insert(0, str(ROOT / "engine"))
    try:
        from _build import SOURCES
    finally:
        sys.path.pop(0)
    texts = {name: (ROOT / "csrc" / name).read_text() for name in SOURCES}
    defined = {fn: name for name, text in texts.items()
               for fn in re.findall(r"^[a-z][\w *]*?\b(rl_\w+)\(", text, re.M)}
    assert len(defined) > 40, "found too few definitions: the pattern no longer matches"
    upward = []
    for i, (name, text) in enumerate(texts.items()):
        for fn in sorted(set(re.findall(r"\b(rl_\w+)\(", text))):
            home = defined.get(fn)
            if home and home != name and SOURCES.index(home) > i:
                upward.append(f"{name} calls {fn} ({home})")
    assert not upward, upward


def test_the_error_table_maps_every_status_of_the_header() -> None:
    """engine/shm/segment.py's one table covers every RL_E_* code csrc/lanes.h defines."""
    from engine.shm.segment import _TABLE

    header = (ROOT / "csrc" / "lanes.h").read_text()
    statuses = re.findall(r"^#define (RL_E_\w+) -\d+", header, re.M)
    assert len(statuses) >= 11
    missing = [name for name in statuses if getattr(lib, name) not in _TABLE]
    assert not missing, f"engine/shm/segment.py's table lacks {missing}"


def test_remainder_codes_and_weight_bounds_match_the_header():
    """engine/shm/segment.py writes a remainder as its index in REMAINDERS and claim_pass.lua reads
    the same index; the C pass names them RL_REMAINDER_*. Weights are RL_ONE fixed point."""
    from engine.policy import ONE, REMAINDERS, WEIGHT_MAX, WEIGHT_MIN, weight_fp

    assert REMAINDERS.index("lane-order") == lib.RL_REMAINDER_LANE_ORDER
    assert REMAINDERS.index("edf") == lib.RL_REMAINDER_EDF
    assert REMAINDERS.index("lateness") == lib.RL_REMAINDER_LATENESS
    assert len(REMAINDERS) == lib.RL_REMAINDER_LATENESS + 1
    assert ONE == lib.RL_ONE
    assert weight_fp(WEIGHT_MAX) == lib.RL_WEIGHT_MAX
    assert weight_fp(WEIGHT_MIN) >= 1


def test_the_cold_back_off_matches_the_header():
    """rl_fail and LanePolicy.backoff_ms double a cold row's interval as many times at most."""
    from engine.policy import COLD_BACKOFF_DOUBLINGS

    assert COLD_BACKOFF_DOUBLINGS == lib.RL_COLD_BACKOFF_DOUBLINGS
