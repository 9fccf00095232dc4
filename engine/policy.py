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
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Any

from .checks import check_int, is_int, is_number
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


COLD_BACKOFF_DOUBLINGS = 3
"""A failed row backs off 30 s doubling per failure, to at most its interval; in the cold lane
(``cold_after`` failures, lanes enabled), its interval doubling per further failure, at most
this many times (up to 8 intervals): the cold floor would otherwise retry a row that keeps
failing each time a short back-off ends, more often than the healthy rows of its interval
(docs/simulator.md, "Lanes only redistribute work"). csrc/lanes.h RL_COLD_BACKOFF_DOUBLINGS,
the Lua's lanes_fail; ``LanePolicy.backoff_ms``."""

FIRST_BAND_WEIGHT = 4
"""The lanes holding the shortest interval weigh four times their spread: their rows are served
before they are a whole interval late while the rest are up to four (docs/design.md, "The
default policy")."""


FINE_BANDS: tuple[int, ...] = tuple(round(1800 * 2 ** (k / 2)) for k in range(MAX_BANDS))
"""The default's band boundaries, a factor sqrt(2) apart from 30 min (the most a segment holds:
30, so 64 lanes, up to 482 days): each lane then holds intervals at most sqrt(2) apart, and EDF
inside a lane is close to an order by relative lateness (docs/design.md, "The default
policy")."""

COARSE_BANDS: tuple[int, ...] = (3600, 6 * 3600, 24 * 3600)
"""The bands of the default before it weighed its lanes by their intervals (1 h, 6 h, 24 h):
the simulator's named presets (``floors``, ``lateness``, ...) keep them."""

SPREAD_EXPONENT = 3 / 16
"""A lane weighs ``(iv_max / iv_min) ** SPREAD_EXPONENT`` of its own intervals: EDF inside a
lane ranks its head by due time, so the shorter-interval rows behind it are later, relative to
their interval, than the head says, by up to the lane's spread. Chosen by the simulator
(docs/design.md, "The default policy"): 0 leaves the lanes whose intervals vary to take the
deficit at 75 %, 1/4 and above hands it to the lanes of one interval."""

INTERVALS = "intervals"
"""``LanePolicy.weights``' default: each band lane's weight derived at every pass from the
interval bounds the backend keeps for it (``interval_weights_fp``)."""

DEFAULT_FLOORS: Mapping[str, float] = {"discovered": 0.10, "cold": 0.005}
"""The default's floors. Cold rows also take part in the lateness remainder, so they are
retried without a large floor; one of 0.02 (the floor before) spent 0.4-0.6 % of the renders
at 50 % capacity on rows that always fail, 0.005 spends 0.1-0.3 % (docs/design.md, "The
default policy")."""

CLASSIC_FLOORS: Mapping[str, float] = {"discovered": 0.10, "cold": 0.02}
"""The floors of the default before, kept with ``COARSE_BANDS`` by the simulator's presets."""


def band_weights(ttl_bands: Sequence[int]) -> dict[str, float]:
    """Static lane weights from the bands alone, the same for submitted and discovered (the
    default before it weighed the intervals its lanes hold): ``FIRST_BAND_WEIGHT`` on the first
    band, ``(hi / lo) ** 0.25`` on a band between two boundaries ``lo`` and ``hi``, 1 on the last
    band and on cold."""
    bands = normalize_bands(ttl_bands)
    out: dict[str, float] = {}
    for band in range(len(bands)):
        w = FIRST_BAND_WEIGHT if band == 0 else round((bands[band] / bands[band - 1]) ** 0.25, 4)
        for provenance in PROVENANCES:
            out[f"{provenance}/b{band}"] = float(w)
    return out


def spread_weight_fp(iv_min: int, iv_max: int) -> int:
    """``(iv_max / iv_min) ** SPREAD_EXPONENT`` in ``ONE`` fixed point, rounded half up, as the C
    and Lua passes compute it (one libm ``pow`` of the same doubles)."""
    return math.floor(math.pow(iv_max / max(1, iv_min), SPREAD_EXPONENT) * ONE + 0.5)


def interval_weights_fp(policy: LanePolicy, bounds: Sequence[tuple[int, int]]) -> list[int]:
    """The weight of each lane in ``ONE`` fixed point under ``weights=INTERVALS``, from
    ``bounds[lane] = (iv_min, iv_max)``, the lowest and highest interval (s) of the rows written
    into the lane since its bands took effect (``(0, 0)``: none; ``stats()`` reports them). Each
    submitted or discovered lane with bounds weighs its spread (``spread_weight_fp``), times
    ``FIRST_BAND_WEIGHT`` when it holds the shortest interval of them all; urgent, cold and the
    lanes without bounds weigh 1. The rule names no lane: it follows from the bands and the
    intervals the rows bring."""
    band = [lane for lane, (_, hi) in enumerate(bounds)
            if hi > 0 and policy.class_of(lane) in PROVENANCES]
    shortest = min((max(1, bounds[lane][0]) for lane in band), default=0)
    out = [ONE] * len(bounds)
    for lane in band:
        lo, hi = max(1, bounds[lane][0]), bounds[lane][1]
        w = spread_weight_fp(lo, hi) * (FIRST_BAND_WEIGHT if lo == shortest else 1)
        out[lane] = min(w, weight_fp(WEIGHT_MAX))
    return out


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
    ttl_bands: tuple[int, ...] = FINE_BANDS
    cold_after: int = 3
    urgent_max_share: float = 0.2
    min_share: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOORS))
    remainder: str = "lateness"
    lanes_enabled: bool = True
    weights: Mapping[str, float] | str = INTERVALS
    """Per lane, a factor on the lane head's relative lateness under ``remainder="lateness"``.
    ``INTERVALS`` (the default): derived at every pass from the intervals each lane holds
    (``interval_weights_fp``). A mapping of lane name (``"submitted/b0"``, ``"cold"``, ...) to
    weight: those, fixed; a lane not named weighs 1, and ``{}`` weighs every lane 1. Other
    remainders keep the weights but do not use them."""

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
        if isinstance(self.weights, str):
            if self.weights != INTERVALS:
                raise EngineValueError(f"weights must be a mapping of lane name to weight, or"
                                       f" {INTERVALS!r}, got {self.weights!r}")
            return
        if not isinstance(self.weights, Mapping):
            raise EngineTypeError("weights must be a mapping of lane name to weight, or"
                                  f" {INTERVALS!r}")
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
                     self.weights if isinstance(self.weights, str)
                     else tuple(self.weights.items())))

    @property
    def live_weights(self) -> bool:
        """Whether the weights are derived at every pass from the lanes' intervals."""
        return isinstance(self.weights, str)

    # -- as data (checkpoints, the Redis queue's meta) -----------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The policy as plain JSON data; :meth:`from_dict` reads it back equal."""
        return {"ttl_bands": list(self.ttl_bands), "cold_after": self.cold_after,
                "urgent_max_share": self.urgent_max_share, "min_share": dict(self.min_share),
                "remainder": self.remainder, "lanes_enabled": self.lanes_enabled,
                "weights": self.weights if isinstance(self.weights, str)
                else dict(self.weights)}

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

    @classmethod
    def fitted(cls, interval_s: Any, provenance: Any = "submitted",
               ttl_bands: Sequence[int] = FINE_BANDS, **fields: Any) -> LanePolicy:
        """The lateness remainder with lane weights fitted to a corpus's intervals (the rows'
        ``interval_s`` and ``provenance``, as ``add_many`` takes them) over fine bands
        (``FINE_BANDS``): each lane weighs ``(iv_max / iv_min) ** SPREAD_EXPONENT`` of the
        intervals it holds, and the lanes holding the corpus's shortest interval four times
        that (``FIRST_BAND_WEIGHT``), so that class is held on time whatever its band. Both
        backends run it as given weights; fit again when the corpus's shape changes. These are the
        weights the default derives at every pass once these rows are in (``INTERVALS``), as a
        snapshot. ``fields`` are any other ``LanePolicy`` fields (not ``weights``)."""
        if "weights" in fields or "remainder" in fields:
            raise EngineValueError("a fitted policy derives its weights for the lateness"
                                   " remainder; build a LanePolicy to give them")
        policy = cls(ttl_bands=tuple(ttl_bands), weights={}, **fields)
        return replace(policy, weights=fitted_weights(policy, interval_s, provenance))

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

    def backoff_ms(self, failures: int, interval_s: int) -> int:
        """The back-off of a row that has just failed for the ``failures``-th time in a row
        (``COLD_BACKOFF_DOUBLINGS``; ``rl_fail``). Failures in [1, 255], the interval in whole
        seconds in [1, ``MAX_INTERVAL_S``]; anything else raises an ``EngineError``."""
        failures = check_int(failures, "failures", 1, 255)
        interval_s = check_int(interval_s, "interval_s", 1, MAX_INTERVAL_S)
        if self.lanes_enabled and failures >= self.cold_after:
            return interval_s * 1000 << min(failures - self.cold_after, COLD_BACKOFF_DOUBLINGS)
        return min(30_000 << min(failures - 1, 20), interval_s * 1000)

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

    def lane_weights_fp(self, lane_total: int,
                        bounds: Sequence[tuple[int, int]] | None = None) -> list[int]:
        """The weight of each lane in ``ONE`` fixed point, as the C pass compares them (a lane
        past this layout weighs 1). Derived weights (``INTERVALS``) need the lanes' interval
        bounds, ``(iv_min, iv_max)`` per lane."""
        if isinstance(self.weights, str):
            if bounds is None or len(bounds) < lane_total:
                raise EngineValueError(f"weights={INTERVALS!r} needs each lane's interval bounds")
            return interval_weights_fp(self, list(bounds[:lane_total]))
        fp = {name: weight_fp(w) for name, w in self.weights.items()}
        return [fp.get(name, ONE) for name in self.lane_names(lane_total)]


def _corpus_lanes(policy: LanePolicy, interval_s: Any, provenance: Any) -> dict[int, list[int]]:
    """The band lane of every row of a corpus, with its interval: lane -> intervals."""
    import numpy as np

    try:
        iv = np.asarray(interval_s)
        if iv.ndim == 0:
            iv = iv.reshape(1)
        if iv.ndim != 1 or iv.size == 0 or iv.dtype.kind not in "iu":
            raise EngineValueError("interval_s must be a non-empty 1-D array of whole seconds,"
                                   f" got {iv.dtype} of shape {iv.shape}")
    except (TypeError, ValueError) as e:
        raise EngineValueError(f"interval_s is not an array of whole seconds: {e}") from None
    if int(iv.min()) < 1 or int(iv.max()) > MAX_INTERVAL_S:
        raise EngineValueError(f"intervals must lie in [1, {MAX_INTERVAL_S}] s, got"
                               f" {int(iv.min())}..{int(iv.max())}")
    if isinstance(provenance, str):
        prov = np.full(iv.size, PROVENANCES.index(provenance) if provenance in PROVENANCES
                       else -1)
    else:
        prov = np.asarray(provenance)
        if prov.dtype.kind in "US":
            prov = np.array([PROVENANCES.index(p) if p in PROVENANCES else -1 for p in prov])
    if prov.shape != iv.shape or prov.dtype.kind not in "iu" or not np.isin(prov, (0, 1)).all():
        raise EngineValueError(f"provenance must be one of {PROVENANCES} (or 0 / 1), one per"
                               " interval")
    out: dict[int, list[int]] = {}
    bands = np.searchsorted(np.asarray(policy.ttl_bands, np.int64), iv, side="left")
    lanes = np.where(prov == 0, 1, 1 + policy.bands_per_class) + bands
    for lane in np.unique(lanes).tolist():
        mine = iv[lanes == lane]
        out[int(lane)] = [int(mine.min()), int(mine.max())]
    return out


def fitted_weights(policy: LanePolicy, interval_s: Any, provenance: Any) -> dict[str, float]:
    """``LanePolicy.fitted``'s weights over ``policy``'s bands for this corpus: the weights
    ``INTERVALS`` derives from the bounds of a queue that holds just these rows."""
    lanes = _corpus_lanes(policy, interval_s, provenance)
    bounds = [(lanes[lane][0], lanes[lane][1]) if lane in lanes else (0, 0)
              for lane in range(policy.lane_count)]
    fp = interval_weights_fp(policy, bounds)
    return {policy.lane_name(lane): fp[lane] / ONE for lane in sorted(lanes)}


# -- the reference of one claim pass -----------------------------------------------------------


@dataclass
class _Pass:
    """The state one reference pass works on: what is left of each lane (due times and the
    rows' intervals, in index order), the grants so far, the credits and the budget left."""

    policy: LanePolicy
    left: list[list[int]]
    ivs: list[list[int]]
    cred: dict[str, int]
    remaining: int
    bounds: Sequence[tuple[int, int]] | None = None
    grants: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.grants = [0] * len(self.left)

    @property
    def lanes(self) -> int:
        return len(self.left)

    @property
    def capped(self) -> bool:
        return share_fp(self.policy.urgent_max_share) < ONE

    def lanes_of(self, cls: str) -> list[int]:
        return self.policy.class_lanes(cls, self.lanes)

    def floor_shares(self) -> dict[str, int]:
        """The ``min_share`` classes with a share above zero, in ``ONE`` fixed point."""
        return {c: share_fp(s) for c, s in self.policy.min_share.items() if share_fp(s) > 0}

    def take(self, lane: int, want: int) -> int:
        got = min(want, len(self.left[lane]), self.remaining)
        del self.left[lane][:got]
        del self.ivs[lane][:got]
        self.grants[lane] += got
        self.remaining -= got
        return got

    def remainder_lanes(self) -> list[int]:
        """The lanes the remainder serves: every lane but urgent while urgent is capped."""
        return [lane for lane in range(self.lanes) if not (self.capped and lane == 0)]


def accrue(p: _Pass, budget: int) -> None:
    """Each accounted class that has a claimable row gains ``share * budget`` of credit, capped
    at that plus one grant; urgent is accounted while capped, even at share 0."""
    accrual = p.floor_shares()
    if p.capped:
        accrual["urgent"] = share_fp(p.policy.urgent_max_share)
    for cls, fp in accrual.items():
        if any(p.left[lane] for lane in p.lanes_of(cls)):
            p.cred[cls] = min(p.cred[cls] + fp * budget, fp * budget + ONE)


def urgent_cap(p: _Pass) -> None:
    """Lane 0 takes at most its credit, in whole grants, while urgent is capped."""
    if p.capped:
        got = p.take(0, max(0, p.cred["urgent"] // ONE))
        p.cred["urgent"] -= got * ONE


def floors(p: _Pass) -> None:
    """Each ``min_share`` class, in class order and inside it in lane order, takes up to its
    credit."""
    for cls in SHARE_CLASSES:
        if cls not in p.floor_shares():
            continue
        want = max(0, p.cred[cls] // ONE)
        for lane in p.lanes_of(cls):
            got = p.take(lane, want)
            want -= got
            p.cred[cls] -= got * ONE


LATE_BITS = 6
"""The lateness remainder compares lane heads by their lateness in quanta: a double's exponent
and its top ``LATE_BITS`` mantissa bits (a quantum spans 0.8 to 1.6 % of the lateness in it)."""


def lateness_quantum(weight: int, late_ms: int, interval_s: int) -> int:
    """The quantum the lateness remainder weighs a head by: ``weight * late_ms / interval_s``
    rounded as the C pass and the Lua pass round it (a product of two doubles, then a quotient,
    each rounded once; an interval of 0 counts as 1 s, a row not yet late as 0), its bits with
    all but the top ``LATE_BITS`` of the mantissa dropped. Higher is later; 0 for no lateness.
    ``weight`` is in ``ONE`` fixed point, below ``2**26``."""
    return _quantum(check_int(weight, "weight", 0, (1 << 26) - 1),
                    check_int(late_ms, "late_ms", -(1 << 63), (1 << 63) - 1),
                    check_int(interval_s, "interval_s", 0, (1 << 32) - 1))


def _quantum(weight: int, late_ms: int, interval_s: int) -> int:
    v = float(weight) * float(max(0, late_ms)) / float(max(1, interval_s))
    return int.from_bytes(struct.pack("<d", v), "little") >> (52 - LATE_BITS)


def _exact(weight: int, late_ms: int, interval_s: int) -> Fraction:
    return Fraction(weight * max(0, late_ms), max(1, interval_s))


def _take_latest(p: _Pass, lateness: Callable[[int], int | Fraction]) -> None:
    """One grant at a time to the lane whose head has the highest ``lateness(lane)``, ties to
    the lower lane."""
    order = p.remainder_lanes()
    while p.remaining > 0:
        heads = [(lateness(lane), -lane) for lane in order if p.left[lane]]
        if not heads:
            break
        p.take(-max(heads)[1], 1)


def remainder_edf(p: _Pass, now: int) -> None:
    """The lateness remainder with every lane weighing the same and every interval 1 s: each
    grant to the head latest by ``now - due``, in quanta of a 64th, ties to the lower lane."""
    _take_latest(p, lambda lane: _quantum(1, now - p.left[lane][0], 1))


def remainder_lateness(p: _Pass, now: int, quanta: bool = True) -> None:
    """Each grant to the lane whose head has the highest ``lateness_quantum`` (weight times
    lateness relative to its own interval), ties to the lower lane; with ``quanta`` false, the
    highest such lateness exactly (a rational)."""
    weight = p.policy.lane_weights_fp(p.lanes, p.bounds)
    weigh = _quantum if quanta else _exact
    _take_latest(p, lambda lane: weigh(weight[lane], now - p.left[lane][0], p.ivs[lane][0]))


def commit(p: _Pass, before: Sequence[int]) -> None:
    """Grants a floor class got from the remainder count against its credit, down to zero,
    so a class served anyway cannot bank its floor."""
    for cls in p.floor_shares():
        extra = sum(p.grants[lane] - before[lane] for lane in p.lanes_of(cls))
        if extra and p.cred[cls] > 0:
            p.cred[cls] = max(0, p.cred[cls] - extra * ONE)


def reference_pass(
    policy: LanePolicy,
    budget: int,
    due: Sequence[Sequence[int]],
    credits: Mapping[str, int],
    now: int | None = None,
    intervals: Sequence[Sequence[int]] | None = None,
    bounds: Sequence[tuple[int, int]] | None = None,
    quanta: bool = True,
) -> tuple[list[int], dict[str, int]]:
    """What one claim pass grants, in plain Python: the oracle for ``csrc/claim.c``.

    ``due[L]`` lists the due times (ascending) of lane ``L``'s claimable rows; ``credits`` are the
    shared share counters in ``ONE`` units. Returns grants per lane and the updated credits.

    1. ``accrue``: each share class that has a claimable row accrues ``share * budget`` of
       credit, capped at that plus one grant (an idle class banks nothing).
    2. ``urgent_cap``: urgent (lane 0) is served first but never beyond its credit: a cap on
       drain share.
    3. ``floors``: each ``min_share`` class, in lane order, takes up to its credit.
    4. The remainder goes in lane order, or one grant at a time to the lane whose head row is
       latest relative to its own interval, ``weight * (now - due) / interval``
       (``remainder_lateness``: needs ``now`` and ``intervals[L]``, the intervals in seconds of
       ``due[L]``'s rows; weights in ``ONE`` fixed point), or latest alone, ``now - due``
       (``remainder_edf``: needs ``now``). Heads are compared in quanta of a 64th
       (``lateness_quantum``), as the C pass and the Lua pass compare them; ties go to the
       lower lane (``quanta=False``: the lateness remainder's heads compared exactly, as
       rationals, as no backend does: engine.sim's ``exact`` anchor). Derived weights
       (``weights=INTERVALS``) need ``bounds[L]``, the lane's ``(iv_min, iv_max)`` as the
       backend keeps them (``stats()``'s ``iv_min``/``iv_max``).
    5. ``commit``: grants a floor class gets from the remainder count against its credit, so
       it cannot bank them.
    With lanes disabled the pass is one EDF queue over every lane, in lane order, with no shares.
    """
    lanes = len(due)
    if policy.lanes_enabled and policy.remainder == "lateness":
        if now is None or intervals is None or len(intervals) != lanes or any(
                len(i) != len(d) for i, d in zip(intervals, due, strict=True)):
            raise EngineValueError("remainder='lateness' needs now and intervals shaped as due")
    if policy.lanes_enabled and policy.remainder == "edf" and now is None:
        raise EngineValueError("remainder='edf' needs now")
    if not isinstance(quanta, bool):
        raise EngineTypeError(f"quanta must be True or False, got {type(quanta).__name__}")
    p = _Pass(policy, [list(d) for d in due],
              [list(i) for i in intervals] if intervals is not None else [[] for _ in due],
              {c: int(credits.get(c, 0)) for c in CLASSES}, budget, bounds)
    if not policy.lanes_enabled:
        for lane in range(lanes):
            p.take(lane, p.remaining)
        return p.grants, p.cred
    accrue(p, budget)
    urgent_cap(p)
    floors(p)
    before = list(p.grants)
    if policy.remainder == "lateness":
        assert now is not None
        remainder_lateness(p, now, quanta)
    elif policy.remainder == "edf":
        assert now is not None
        remainder_edf(p, now)
    else:
        for lane in p.remainder_lanes():
            p.take(lane, p.remaining)
    commit(p, before)
    return p.grants, p.cred
