"""Lane policy: which lane a row belongs to, and how a claim pass shares capacity between lanes.

Lane layout for normalised ``ttl_bands = (b1, ..., bn)`` (seconds)::

    0               urgent              operator intent (prioritize rush)
    1 .. n+1        submitted/b0..bn    in a sitemap, banded by interval, shortest first
    n+2 .. 2n+2     discovered/b0..bn   crawler-found, banded the same way
    2n+3            cold                failures >= cold_after, or suppressed

The lane is derived on every write from stable inputs and never stored as intent, so a policy
change needs no sweep. Fairness (the urgent cap and the minimum shares) is applied at claim time
and lives in the segment header, so it changes live without rewriting a row.

:func:`reference_pass` is the plain-Python statement of what one claim pass grants. The C pass
(``csrc/claim.c``) must agree with it; the tests use it as the oracle.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .checks import is_int, is_number
from .errors import EngineTypeError, EngineValueError

PROVENANCES: tuple[str, ...] = ("submitted", "discovered")
CLASSES: tuple[str, ...] = ("urgent", "submitted", "discovered", "cold")
SHARE_CLASSES: tuple[str, ...] = ("submitted", "discovered", "cold")
REMAINDERS: tuple[str, ...] = ("lane-order", "edf", "lateness")
MAX_BANDS = 30
"""Band boundaries a segment can hold: 2 * 30 + 4 = 64 lanes (csrc/lanes.h RL_MAX_LANES)."""

MAX_INTERVAL_S = (1 << 32) - 1
"""Intervals and band boundaries are stored as uint32 seconds."""

ONE = 1 << 16
"""Fixed-point unit of share credit (one grant), shared with the C accounting."""

WEIGHT_MIN = 0.001
WEIGHT_MAX = 1000.0
"""Lane weights (``remainder="lateness"``) lie in [WEIGHT_MIN, WEIGHT_MAX]; the C core stores
them in ``ONE`` fixed point (csrc/lanes.h RL_WEIGHT_MAX)."""


def normalize_bands(bands: Any) -> tuple[int, ...]:
    """Sorted, deduplicated, positive whole seconds; an empty list means a single band."""
    if isinstance(bands, (str, bytes)) or not hasattr(bands, "__iter__"):
        raise EngineTypeError("ttl_bands must be a sequence of seconds")
    out: set[int] = set()
    for b in bands:
        if not is_number(b):
            raise EngineTypeError(f"ttl_bands holds {b!r}, not a number of seconds")
        if isinstance(b, float) and not math.isfinite(b):
            raise EngineValueError(f"ttl_bands must hold positive whole seconds, got {b!r}")
        if not 0 < b <= MAX_INTERVAL_S or b != int(b):
            raise EngineValueError(
                f"ttl_bands must hold whole seconds in [1, {MAX_INTERVAL_S}], got {b!r}")
        out.add(int(b))
    if len(out) > MAX_BANDS:
        raise EngineValueError(f"at most {MAX_BANDS} ttl_bands, got {len(out)}")
    return tuple(sorted(out))


def _as_float(value: Any, what: str) -> float:
    """A number as a float (an int too large for one becomes inf, to be refused by range)."""
    if not is_number(value):
        raise EngineTypeError(f"{what} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _share(value: Any, what: str) -> float:
    v = _as_float(value, what)
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise EngineValueError(f"{what} must lie in [0, 1], got {value!r}")
    return v


def share_fp(share: float) -> int:
    """A share as the C core stores it: fixed point, ``ONE`` = the whole budget.

    Rounded up, so five calls at 0.2 make a whole grant (13108 * 5 >= ONE), not 4.99998 of one.
    """
    return min(ONE, math.ceil(share * ONE))


def weight_fp(weight: float) -> int:
    """A lane weight as the C core stores it and the reference compares it: ``ONE`` = 1.0."""
    return round(weight * ONE)


def _weight(name: str, value: Any) -> float:
    v = _as_float(value, f"weights[{name!r}]")
    if not math.isfinite(v) or not WEIGHT_MIN <= v <= WEIGHT_MAX:
        raise EngineValueError(
            f"weights[{name!r}] must be a finite number in [{WEIGHT_MIN:g}, {WEIGHT_MAX:g}],"
            f" got {value!r}")
    return v


@dataclass(frozen=True)
class LanePolicy:
    ttl_bands: tuple[int, ...] = (3600, 6 * 3600, 24 * 3600)
    cold_after: int = 3
    urgent_max_share: float = 0.2
    min_share: Mapping[str, float] = field(
        default_factory=lambda: {"discovered": 0.10, "cold": 0.02}
    )
    remainder: str = "lane-order"
    lanes_enabled: bool = True
    weights: Mapping[str, float] = field(default_factory=dict)
    """Per lane name (``"submitted/b0"``, ``"cold"``, ...), a factor on the lane head's relative
    lateness under ``remainder="lateness"``; a lane not named weighs 1. Other remainders keep
    the weights but do not use them."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl_bands", normalize_bands(self.ttl_bands))
        if not is_int(self.cold_after):
            raise EngineTypeError(f"cold_after must be an int, got {self.cold_after!r}")
        if not 1 <= self.cold_after <= 255:
            raise EngineValueError(f"cold_after must be in [1, 255], got {self.cold_after}")
        urgent = _share(self.urgent_max_share, "urgent_max_share")
        object.__setattr__(self, "urgent_max_share", urgent)
        if not isinstance(self.min_share, Mapping):
            raise EngineTypeError("min_share must be a mapping of class name to share")
        shares: dict[str, float] = {}
        for name, value in self.min_share.items():
            if name not in SHARE_CLASSES:
                raise EngineValueError(
                    f"min_share names unknown class {name!r} (known: {', '.join(SHARE_CLASSES)};"
                    " urgent is bounded by urgent_max_share)"
                )
            shares[name] = _share(value, f"min_share[{name!r}]")
        total = urgent + sum(shares.values())
        if total > 1.0 + 1e-9:
            raise EngineValueError(f"urgent_max_share + sum(min_share) = {total:.4g} exceeds 1")
        object.__setattr__(self, "min_share", shares)
        if not isinstance(self.remainder, str) or self.remainder not in REMAINDERS:
            raise EngineValueError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if not isinstance(self.lanes_enabled, bool):
            raise EngineTypeError("lanes_enabled must be a bool")
        if not isinstance(self.weights, Mapping):
            raise EngineTypeError("weights must be a mapping of lane name to weight")
        known = self.lane_names()
        weights: dict[str, float] = {}
        for name, value in self.weights.items():
            if name not in known:
                raise EngineValueError(
                    f"weights names unknown lane {name!r} (lanes of these ttl_bands:"
                    f" {', '.join(known)})")
            w = _weight(name, value)
            if w != 1.0:  # 1 is every lane's default: kept out, so equal policies compare equal
                weights[name] = w
        object.__setattr__(self, "weights", dict(sorted(weights.items(), key=lambda kv:
                                                        known.index(kv[0]))))

    def __hash__(self) -> int:
        return hash((self.ttl_bands, self.cold_after, self.urgent_max_share,
                     tuple(sorted(self.min_share.items())), self.remainder, self.lanes_enabled,
                     tuple(self.weights.items())))

    # -- as data (checkpoints, the Redis queue's meta) -----------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The policy as plain JSON data; :meth:`from_dict` reads it back equal."""
        return {"ttl_bands": list(self.ttl_bands), "cold_after": self.cold_after,
                "urgent_max_share": self.urgent_max_share, "min_share": dict(self.min_share),
                "remainder": self.remainder, "lanes_enabled": self.lanes_enabled,
                "weights": dict(self.weights)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LanePolicy:
        """A policy from :meth:`to_dict`'s data (a field not given takes its default);
        ``EngineValueError`` for anything else."""
        if not isinstance(data, Mapping):
            raise EngineTypeError(f"a policy is a mapping, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise EngineValueError(f"a policy has no field {sorted(unknown)[0]!r}")
        return cls(**data)

    # -- lane layout -------------------------------------------------------------------------

    @property
    def bands_per_class(self) -> int:
        """TTL bands of one provenance: one more than the boundaries in ``ttl_bands`` (the C
        policy's ``band_count`` counts the boundaries)."""
        return len(self.ttl_bands) + 1

    @property
    def lane_count(self) -> int:
        return 2 * self.bands_per_class + 2

    @property
    def cold_lane(self) -> int:
        return self.lane_count - 1

    def band_of(self, interval_s: int) -> int:
        return bisect.bisect_left(self.ttl_bands, interval_s)

    def lane_for(self, provenance: str, interval_s: int, failures: int = 0,
                 urgent: bool = False, suppressed: bool = False) -> int:
        """The lane a row belongs in, derived from its inputs (mirrored by ``rl_lane_for``)."""
        if provenance not in PROVENANCES:
            raise EngineValueError(f"unknown provenance {provenance!r} (known: {PROVENANCES})")
        if not self.lanes_enabled:
            return 0
        if urgent:
            return 0
        if suppressed or failures >= self.cold_after:
            return self.cold_lane
        base = 1 if provenance == "submitted" else 1 + self.bands_per_class
        return base + self.band_of(interval_s)

    def class_of(self, lane: int) -> str:
        """Class of a lane; a lane past this layout (left by a wider policy) counts as cold."""
        if lane == 0:
            return "urgent"
        if lane <= self.bands_per_class:
            return "submitted"
        if lane <= 2 * self.bands_per_class:
            return "discovered"
        return "cold"

    def lane_name(self, lane: int) -> str:
        if lane == 0:
            return "urgent"
        if lane >= self.cold_lane:
            return "cold" if lane == self.cold_lane else f"lane{lane}"
        cls = self.class_of(lane)
        band = lane - 1 if cls == "submitted" else lane - 1 - self.bands_per_class
        return f"{cls}/b{band}"

    def class_lanes(self, cls: str, lane_total: int) -> list[int]:
        return [lane for lane in range(lane_total) if self.class_of(lane) == cls]

    def lane_names(self, lane_total: int | None = None) -> list[str]:
        """Names of lanes ``0 .. lane_total - 1`` (default: this layout's lanes)."""
        return [self.lane_name(lane) for lane in range(
            self.lane_count if lane_total is None else lane_total)]

    def lane_weights_fp(self, lane_total: int) -> list[int]:
        """The weight of each lane in ``ONE`` fixed point, as the C pass compares them (a lane
        past this layout weighs 1)."""
        fp = {name: weight_fp(w) for name, w in self.weights.items()}
        return [fp.get(name, ONE) for name in self.lane_names(lane_total)]


# -- the reference of one claim pass -----------------------------------------------------------


def reference_pass(
    policy: LanePolicy,
    budget: int,
    due: Sequence[Sequence[int]],
    credits: Mapping[str, int],
    now: int | None = None,
    intervals: Sequence[Sequence[int]] | None = None,
) -> tuple[list[int], dict[str, int]]:
    """What one claim pass grants, in plain Python: the oracle for ``csrc/claim.c``.

    ``due[L]`` lists the due times (ascending) of lane ``L``'s claimable rows; ``credits`` are the
    shared share counters in ``ONE`` units. Returns grants per lane and the updated credits.

    1. Each share class that has a claimable row accrues ``share * budget`` of credit, capped at
       that plus one grant (an idle class banks nothing).
    2. Urgent (lane 0) is served first but never beyond its credit: a cap on drain share.
    3. Each ``min_share`` class, in lane order, takes up to its credit: a floor.
    4. The remainder goes in lane order, by global due time (``remainder="edf"``), or one grant
       at a time to the lane whose head row is latest relative to its own interval,
       ``weight * (now - due) / interval`` (``remainder="lateness"``: needs ``now`` and
       ``intervals[L]``, the intervals in seconds of ``due[L]``'s rows). Compared as
       ``w_a * (now - due_a) * iv_b > w_b * (now - due_b) * iv_a`` in integers, weights in
       ``ONE`` fixed point and an interval of 0 as 1 s, exactly as the C pass does; ties go to
       the lower lane. Grants a floor class gets from the remainder count against its credit,
       so it cannot bank them.
    With lanes disabled the pass is one EDF queue over every lane, in lane order, with no shares.
    """
    lanes = len(due)
    if policy.lanes_enabled and policy.remainder == "lateness":
        if now is None or intervals is None or len(intervals) != lanes or any(
                len(i) != len(d) for i, d in zip(intervals, due, strict=True)):
            raise EngineValueError("remainder='lateness' needs now and intervals shaped as due")
    ivs = [list(i) for i in intervals] if intervals is not None else [[] for _ in due]
    left = [list(d) for d in due]
    grants = [0] * lanes
    cred = {c: int(credits.get(c, 0)) for c in CLASSES}
    remaining = budget

    def take(lane: int, want: int) -> int:
        nonlocal remaining
        got = min(want, len(left[lane]), remaining)
        del left[lane][:got]
        del ivs[lane][:got]
        grants[lane] += got
        remaining -= got
        return got

    if not policy.lanes_enabled:
        for lane in range(lanes):
            take(lane, remaining)
        return grants, cred

    urgent_fp = share_fp(policy.urgent_max_share)
    capped = urgent_fp < ONE
    floors = {c: share_fp(s) for c, s in policy.min_share.items() if share_fp(s) > 0}
    accrual = dict(floors)
    if capped:
        accrual["urgent"] = urgent_fp
    lanes_of = {c: policy.class_lanes(c, lanes) for c in CLASSES}
    for cls, fp in accrual.items():
        if any(left[lane] for lane in lanes_of[cls]):
            cred[cls] = min(cred[cls] + fp * budget, fp * budget + ONE)

    if capped:
        want = max(0, cred["urgent"] // ONE)
        got = take(0, want)
        cred["urgent"] -= got * ONE
    for cls in SHARE_CLASSES:
        if cls not in floors:
            continue
        want = max(0, cred[cls] // ONE)
        for lane in lanes_of[cls]:
            got = take(lane, want)
            want -= got
            cred[cls] -= got * ONE

    order = [lane for lane in range(lanes) if not (capped and lane == 0)]
    before = list(grants)
    if policy.remainder == "lane-order":
        for lane in order:
            take(lane, remaining)
    elif policy.remainder == "lateness":
        assert now is not None
        weight = policy.lane_weights_fp(lanes)
        while remaining > 0:
            best, best_late, best_iv = -1, 0, 1
            for lane in order:
                if not left[lane]:
                    continue
                late = weight[lane] * max(0, now - left[lane][0])
                iv = max(1, ivs[lane][0])
                if best < 0 or late * best_iv > best_late * iv:
                    best, best_late, best_iv = lane, late, iv
            if best < 0:
                break
            take(best, 1)
    else:
        while remaining > 0:
            heads = [(left[lane][0], lane) for lane in order if left[lane]]
            if not heads:
                break
            take(min(heads)[1], 1)
    for cls in floors:
        extra = sum(grants[lane] - before[lane] for lane in lanes_of[cls])
        if extra and cred[cls] > 0:
            cred[cls] = max(0, cred[cls] - extra * ONE)
    return grants, cred
