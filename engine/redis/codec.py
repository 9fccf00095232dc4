"""The layout of a Redis queue as this client reads and writes it: keys, records, arguments.

The Lua library states the data model (docs/redis.md explains it); this module is its
client-side reading, so that everything that packs an argument or unpacks a reply or a key is
in one place, beside :func:`verify`, which reads the whole queue and checks its invariants.

A queue ``name`` is five keys with the hash tag ``{name}`` (:func:`queue_keys`):

* ``ready`` -- ZSET of the rows waiting, member :func:`member` (the row id, zero-padded so
  equal scores order by row), score the row's key (``lane * STRIDE + due_ms``);
* ``lease`` -- ZSET of the batches in flight, member the batch id (its first token), score
  the batch's lease expiry;
* ``rows`` -- one string, a ``RECORD``-byte record per row (interval, failures, flags);
* ``meta`` -- HASH of counters, the capacity, the policy (JSON) and the share credits;
* ``holder`` -- HASH: a row in flight (or one whose lease lapsed, until it is granted again)
  -> :class:`Held`, and per batch in flight ``b<batch>`` -> ``count:members``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..api import Claim, ClaimBatch, IntArray, RowInfo
from ..checks import broadcast, choice_codes
from ..errors import EngineError
from ..keys import STRIDE, check_due_array, check_due_ms
from ..policy import MAX_INTERVAL_S, PROVENANCES, REMAINDERS, LanePolicy, share_fp

LIBRARY = "render_lanes"
LIBRARY_VERSION = "21"
"""Bump with any change to the library (its VERSION): a server holding another version is
refused, or replaced when the caller allows it (``create=True`` or ``upgrade=True``)."""
LAYOUT_VERSION = 5
"""The data model of a queue's keys (the library's LAYOUT): bump when a record or key changes.
A queue of another layout is refused."""
RECORD = 6
"""Bytes per row in the row table (the library's REC)."""
MAX_ROWS = (512 * 1024 * 1024) // RECORD
"""The row table is one string, and a Redis string holds at most 512 MiB."""
MAX_LANES = 64
"""Lanes a policy can make (2 * 30 bands + 4): stats look at this many."""
TOKEN_LIMIT = 1 << 53
"""Tokens are below this (a Lua number is exact there): any other value is never a live lease."""
LIVE = 4
"""The record flag of a row not removed (1: discovered, 2: urgent)."""

_ADD_ROW = np.dtype([("due", "<u8"), ("interval", "<u4"), ("prov", "u1"), ("failures", "u1")])
_RECORD_DTYPE = np.dtype([("interval", ">u4"), ("failures", "u1"), ("flags", "u1")])
assert _RECORD_DTYPE.itemsize == RECORD


def beats_key(name: str) -> str:
    """The heartbeats of queue ``name``'s owners (ZSET: owner id -> the time its heartbeat
    lapses, ms), beside the five keys under the same hash tag (docs/redis.md "Heartbeats")."""
    return f"lanes:{{{name}}}:beats"


def queue_keys(name: str) -> tuple[str, str, str, str, str]:
    """The five keys of queue ``name`` in the order every function takes them. One hash tag,
    so a queue is one Cluster slot."""
    tag = f"lanes:{{{name}}}:"
    return f"{tag}ready", f"{tag}lease", f"{tag}rows", f"{tag}meta", f"{tag}holder"


# -- arguments ------------------------------------------------------------------------------------


def member(row: int) -> str:
    """Row ``row`` as a member of the ready ZSET and the holder hash (the library's MEMBER):
    8 zero-padded digits, so equal scores order by row id, as the shared-memory engine serves
    rows due at the same millisecond."""
    return f"{row:08d}"


def live_token(token: int) -> int:
    """A token as sent: one that can never be live is sent as 0 (never a lease)."""
    return token if 0 < token < TOKEN_LIMIT else 0


def batch_args(rows: list[int], tokens: list[int]) -> tuple[str, str]:
    """A batch as the library's ``rows_tokens`` takes it: the rows' members joined, and the
    tokens, each with the ':' that ends it in a holder entry, joined (one that can never be
    live as 0). Two arguments instead of two per row: redis-py packs each argument in Python,
    the server converts each into a Lua string, and both cost more than one join here and one
    split there."""
    return ("".join([f"{row:08d}" for row in rows]),
            "".join([f"{token}:" if 0 < token < TOKEN_LIMIT else "0:" for token in tokens]))


def now_arg(now_ms: object) -> int | str:
    """``now_ms`` checked, or "" for the server's clock (``TIME`` inside the function)."""
    return "" if now_ms is None else check_due_ms(now_ms, "now_ms")


def policy_args(policy: LanePolicy) -> list[Any]:
    """The policy as the library reads it (fixed-point shares, the remainder's index in
    REMAINDERS, the lane weights in ONE fixed point, "" when all are 1, or "intervals" when
    derived from the lanes' interval bounds), then as JSON for
    ``policy``."""
    shares = [share_fp(policy.min_share.get(c, 0.0)) for c in ("submitted", "discovered", "cold")]
    weights = (policy.weights if isinstance(policy.weights, str)
               else ",".join(map(str, policy.lane_weights_fp(policy.lane_count)))
               if policy.weights else "")
    return [int(policy.lanes_enabled), ",".join(str(b) for b in policy.ttl_bands),
            policy.cold_after, share_fp(policy.urgent_max_share), *shares,
            REMAINDERS.index(policy.remainder), weights,
            json.dumps(policy.to_dict(), sort_keys=True)]


def lane_bounds(stored: str | None) -> tuple[int, int]:
    """A lane's interval bounds as meta keeps them (``v<lane>`` = ``"lo:hi"``; none: 0, 0)."""
    lo, _, hi = (stored or "0:0").partition(":")
    return int(lo), int(hi)


def policy_from(stored: bytes | str) -> LanePolicy:
    """The policy a queue's meta holds (``policy_args``' JSON)."""
    return LanePolicy.from_dict(json.loads(stored))


def packed_rows(due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                failures: Any = None) -> npt.NDArray[np.uint8]:
    """Rows checked (every element, before anything is sent) and packed as the library's
    ``lanes_add`` takes them: one 12-byte row ``<I6I4BB`` per row, an (n, 12) uint8 array."""
    due = check_due_array(due_ms)
    n = len(due)
    packed = np.empty(n, _ADD_ROW)
    packed["due"] = due
    packed["interval"] = broadcast(interval_s, n, "interval_s", 1, MAX_INTERVAL_S)
    packed["prov"] = choice_codes(provenance, PROVENANCES, n, "provenance")
    packed["failures"] = 0 if failures is None else broadcast(failures, n, "failures", 0, 255)
    raw = packed.view(np.uint8).reshape(n, _ADD_ROW.itemsize)
    return np.ascontiguousarray(np.concatenate([raw[:, :6], raw[:, 8:]], axis=1))


# -- replies --------------------------------------------------------------------------------------


class RedisClaims:
    """The rows one claim pass leased (an ``engine.api.ClaimBatch``): four int64 arrays of one
    length, ``rows``, ``lanes``, ``due_ms`` and ``tokens``; iteration yields ``Claim``."""

    __slots__ = ("rows", "lanes", "due_ms", "tokens")

    def __init__(self, rows: IntArray, lanes: IntArray, due_ms: IntArray,
                 tokens: IntArray) -> None:
        self.rows, self.lanes, self.due_ms, self.tokens = rows, lanes, due_ms, tokens

    @classmethod
    def from_reply(cls, reply: bytes) -> RedisClaims:
        """The batch as the library's ``batch_reply`` sends it: the first token, the keys, the
        members joined, space separated (empty: no row). The i-th row's token is first + i."""
        if not reply:
            empty = np.zeros(0, np.int64)
            return cls(empty, empty.copy(), empty.copy(), empty.copy())
        parts = reply.split(b" ")
        keys = np.array(parts[1:-1], np.int64)
        rows = np.frombuffer(parts[-1], "S8").astype(np.int64)
        if len(rows) != len(keys):
            raise EngineError(f"a claim's reply holds {len(rows)} rows and {len(keys)} keys")
        return cls(rows, keys // STRIDE, keys % STRIDE,
                   np.arange(int(parts[0]), int(parts[0]) + len(rows), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Claim]:
        cols = zip(self.rows.tolist(), self.lanes.tolist(), self.due_ms.tolist(),
                   self.tokens.tolist(), strict=True)
        for row, lane, due, token in cols:
            yield Claim(row, lane, due, token)

    def __repr__(self) -> str:
        return f"RedisClaims(n={len(self)}, rows={self.rows.tolist()})"


_: type[ClaimBatch] = RedisClaims


def text_map(fields: dict[bytes, bytes]) -> dict[str, str]:
    """A HASH read whole, decoded."""
    return {k.decode(): v.decode() for k, v in fields.items()}


def flags(raw: bytes | bytearray) -> npt.NDArray[np.uint8]:
    """The flags byte of packed row records (a view: no copy)."""
    return np.frombuffer(raw, _RECORD_DTYPE)["flags"]


def records(raw: bytes) -> dict[str, npt.NDArray[np.int64]]:
    """Columns of packed row records (the library's REC, big endian) as int64 arrays."""
    a = np.frombuffer(raw, _RECORD_DTYPE)
    return {c: a[c].astype(np.int64) for c in ("interval", "failures", "flags")}


class Held(NamedTuple):
    """A row's holder entry, ``token:batch:n:expiry:key:owner`` (the library's holder_value)."""

    token: int
    batch: str
    """The lease entry (member of ``lease``) of the batch the row was granted in."""
    size: int
    expiry: int
    key: int
    owner: str


def holding(value: bytes | str) -> Held:
    text = value.decode() if isinstance(value, bytes) else str(value)
    token, batch, size, expiry, key, owner = text.split(":", 5)
    return Held(int(token), batch, int(size), int(expiry), int(key), owner)


def split_holder(fields: dict[bytes, bytes]) -> tuple[dict[str, tuple[int, list[int]]],
                                                      dict[int, Held]]:
    """The holder hash read whole, as (batch -> (count, rows) of the batches' records
    ``b<batch>`` = ``count:members``, row -> its entry)."""
    batches: dict[str, tuple[int, list[int]]] = {}
    held: dict[int, Held] = {}
    for k, v in fields.items():
        name = k.decode()
        if name.startswith("b"):
            count, _, members = v.decode().partition(":")
            batches[name[1:]] = (int(count), [int(members[i:i + 8])
                                              for i in range(0, len(members), 8)])
        else:
            held[int(name)] = holding(v)
    return batches, held


def row_info(row: int, record: bytes, key: Any, held: bytes | None, now: int) -> RowInfo:
    """``describe`` of a row from its record, its ready score (or None) and its holder entry
    (or None): in flight, the key is the holder entry's; in ready, that entry is a lapsed
    lease's."""
    f = records(record)
    flags = int(f["flags"][0])
    live = bool(flags & LIVE)
    h = holding(held) if held is not None else None
    expiry: int | None = None
    if h is not None and key is None:
        key, expiry = h.key, h.expiry
    lane, due = (int(key) // STRIDE, int(key) % STRIDE) if live and key is not None \
        else (None, None)
    leased = live and expiry is not None and expiry > now
    return {
        "row": row,
        "queued": live,
        "due_ms": due,
        "lane": lane,
        "interval_s": int(f["interval"][0]),
        "failures": int(f["failures"][0]),
        "provenance": PROVENANCES[flags & 1],
        "urgent": bool(flags & 2),
        "leased": leased,
        "lease_expiry_ms": expiry if leased else None,
        "owner": h.owner if leased and h is not None else None,
    }


def exported_rows(table: bytes | bytearray, key: npt.NDArray[np.int64]
                  ) -> tuple[IntArray, dict[str, IntArray]]:
    """``export_rows`` from the row table's records and each row's key (-1: none, the row is
    not queued): every live row with a key, in row order."""
    rec = np.frombuffer(table, _RECORD_DTYPE)
    rows = np.flatnonzero(((rec["flags"] & LIVE) != 0) & (key >= 0))
    picked, key = rec[rows], key[rows]
    f = picked["flags"].astype(np.int64)
    cols = {"due_ms": key % STRIDE, "interval_s": picked["interval"],
            "failures": picked["failures"], "provenance": f & 1, "urgent": (f >> 1) & 1,
            "lane": key // STRIDE}
    return rows, {c: np.ascontiguousarray(v, np.int64) for c, v in cols.items()}


# -- verify ---------------------------------------------------------------------------------------


@dataclass
class QueueParts:
    """What :func:`verify` checks, as read from a queue: by chunks (``engine.redis.scan``), or
    in one snapshot restricted to some rows (``only``: the per-row checks look at those rows
    alone; the batch and token checks always see lease and holder whole)."""

    n: int
    """``next_row``: rows below it exist."""
    counter: int
    """The token counter (``meta token``)."""
    live: npt.NDArray[np.bool_]
    """Per row below ``n``: its record's live flag."""
    in_ready: npt.NDArray[np.bool_]
    """Per row below ``n``: in the ready ZSET."""
    lease: dict[str, int]
    """Batch (member of lease) -> expiry."""
    holder: dict[bytes, bytes]
    """The holder hash whole: rows in flight (and lapsed leases' entries), batches' records."""
    far_lanes: list[int] = field(default_factory=list)
    """Rows in ready whose key's lane is past what a policy can make."""
    past: list[tuple[str, int]] = field(default_factory=list)
    """(where, row) of rows at or past ``n`` seen in ready (holder's are found here)."""
    only: npt.NDArray[np.bool_] | None = None


class _Walk:
    """What :func:`verify` counts on its way through lease and holder, and the rows involved
    in each problem it finds (``suspects``: what a re-read in one snapshot looks at again)."""

    def __init__(self, p: QueueParts) -> None:
        self.p = p
        self.problems: list[str] = []
        self.suspects: set[int] = set()
        self.in_lease = np.zeros(p.n, np.uint8)  # a byte a row: a big queue's walk is light
        self.tokens: dict[int, int] = {}
        """Row -> the token of its holder entry (rows in flight and lapsed leases' entries)."""

    def report(self, text: str, *rows: int) -> None:
        self.problems.append(text)
        self.suspects.update(rows)

    def known(self, row: int, where: str) -> bool:
        if 0 <= row < self.p.n:
            return True
        self.report(f"{where} holds row {row}, past next_row {self.p.n}", row)
        return False


def verify(p: QueueParts) -> tuple[list[str], set[int]]:
    """(one line per broken invariant, the rows involved) of a queue's parts (empty when all
    hold): every live row is in exactly one of ready and a batch in lease (in flight: its
    holder entry names a batch in lease), a removed row in neither; a row in flight has its
    batch's expiry and is listed in its batch's record, every batch in lease has a record
    counting its rows in flight (at least one) and every record a batch in lease (a row in
    ready may keep the entry of a lapsed lease nobody was granted since), a removed row no
    entry; tokens are below the token counter and unique; every key's lane is one a policy
    can make."""
    walk = _Walk(p)
    for where, row in p.past:
        walk.report(f"{where} holds row {row}, past next_row {p.n}", row)
    if p.far_lanes:
        walk.report("a row's lane is past the 64 a policy can make", *p.far_lanes)
    _walk_batches(walk)
    _check_rows(walk)
    return walk.problems, walk.suspects


def _walk_batches(walk: _Walk) -> None:
    """The holder entries against the batches in lease and the batches' records."""
    batches = walk.p.lease
    records_of, held = split_holder(walk.p.holder)
    listed = {b: set(rows) for b, (_count, rows) in records_of.items()}
    flying: dict[str, list[int]] = {b: [] for b in batches}
    far = []
    for row, h in held.items():
        if not walk.known(row, "holder"):
            continue
        walk.tokens[row] = h.token
        if h.batch not in batches:  # a lapsed lease's entry (row back in ready): key void
            continue
        walk.in_lease[row] += 1
        flying[h.batch].append(row)
        if h.key // STRIDE >= MAX_LANES:
            far.append(row)
        if h.expiry != batches[h.batch]:
            walk.report(f"row {row}: expiry {h.expiry}, its batch {h.batch}'s is "
                        f"{batches[h.batch]}", row)
        if row not in listed.get(h.batch, ()):
            walk.report(f"row {row}: not in the record of its batch {h.batch}", row)
    if far:
        walk.report("a row's lane is past the 64 a policy can make", *far)
    for batch, rows in flying.items():
        involved = [*rows, *records_of.get(batch, (0, []))[1]]
        if batch not in records_of:
            walk.report(f"batch {batch}: in lease without a record", *involved)
        elif records_of[batch][0] != len(rows):
            walk.report(f"batch {batch}: its record counts {records_of[batch][0]} "
                        f"rows in flight, {len(rows)} are", *involved)
        if not rows:
            walk.report(f"batch {batch}: in lease with no row in flight", *involved)
    for batch in records_of.keys() - batches.keys():
        walk.report(f"batch {batch}: a record without a lease entry", *records_of[batch][1])


def _check_rows(walk: _Walk) -> None:
    """Each row against its record's live flag; the tokens against the counter."""
    p, out = walk.p, walk.report
    queued = p.in_ready.astype(np.uint8) + walk.in_lease
    look = np.ones(p.n, np.bool_) if p.only is None else p.only
    for row in np.flatnonzero(look & p.live & (queued != 1)).tolist():
        out(f"live row {row} is in {int(p.in_ready[row])} ready and "
            f"{int(walk.in_lease[row])} lease entries", row)
    for row in np.flatnonzero(look & ~p.live & (queued != 0)).tolist():
        out(f"removed row {row} is still queued", row)
    held = sorted(walk.tokens.items())
    for row, token in held:
        if look[row] and not p.live[row]:
            out(f"removed row {row} holds token {token}", row)
        if token == 0:
            out(f"row {row}: its holder entry holds no token", row)
        if token > p.counter:
            out(f"row {row}: token {token} past the counter {p.counter}", row)
    issued = Counter(token for _row, token in held if token)
    twice = [row for row, token in held if issued[token] > 1]
    if twice:
        out("a token is held by two rows", *twice)
