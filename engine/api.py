"""The contract: what a queue engine is, whichever backend holds the queue.

Two backends implement it: ``engine.Engine`` (one shared-memory segment, the workers of one
machine; engine/shm/) and ``engine.redis.RedisEngine`` (a queue in Redis shared by many
hosts; engine/redis/). Everything above them (the render pool, the CLI, checkpoints) reaches an
engine through :class:`QueueEngine`, and each backend module checks itself against it with a
line ``_: type[QueueEngine] = TheBackend``, so a signature that drifts is a mypy error. The
contract tests (``pytestmark = pytest.mark.contract``) run the same behaviour on both.

A backend that lacks something says so with a ``supports_...`` attribute rather than by
raising: ``compact()`` exists everywhere and does nothing where there is nothing to merge.

This module imports no backend and nothing compiled: the defaults of a claim are here (from
``engine.limits``, which engine.checks reads too), and the C core's hot calls (csrc/hot.c) read
them from this module when they load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, NotRequired, Protocol, Self, TypedDict

import numpy as np
import numpy.typing as npt

from .limits import DEFAULT_BUDGET as DEFAULT_BUDGET
from .limits import DEFAULT_LEASE_MS as DEFAULT_LEASE_MS
from .limits import DEFAULT_WINDOW as DEFAULT_WINDOW
from .limits import MAX_BUDGET as MAX_BUDGET
from .limits import MAX_WINDOW as MAX_WINDOW

if TYPE_CHECKING:
    from .policy import LanePolicy

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

class Claim(NamedTuple):
    """One leased row: what a worker needs to render it and to end its lease."""

    row: int
    lane: int
    due_ms: int
    token: int


class ClaimBatch(Protocol):
    """The rows one claim pass leased: four int64 arrays of one length, ``len(batch)`` rows;
    iterating yields a :class:`Claim` per row."""

    @property
    def rows(self) -> IntArray: ...
    @property
    def lanes(self) -> IntArray: ...
    @property
    def due_ms(self) -> IntArray: ...
    @property
    def tokens(self) -> IntArray: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Claim]: ...


class LaneStats(TypedDict):
    """One lane in :meth:`QueueEngine.stats`."""

    lane: int
    name: str
    floor_minute: int
    queued: int
    due: int
    leased: int
    in_flight: int
    granted: int
    spilled: int
    stale_skipped: int
    lease_refused: int
    iv_min: int
    """The lowest and the highest interval (s) a row of the lane ever had (0: none); under
    ``weights="intervals"`` the lane's weight follows from them."""
    iv_max: int


class Stats(TypedDict):
    """:meth:`QueueEngine.stats`: the queue and each lane the policy makes or that holds rows.
    The keys marked ``NotRequired`` are one backend's (see docs/redis.md for Redis's)."""

    name: str
    layout_version: int
    capacity: int
    rows: int
    queued: int
    in_flight: int
    credits: dict[str, float]
    lanes: list[LaneStats]
    bytes: NotRequired[int]
    index: NotRequired[dict[str, int]]
    ring: NotRequired[dict[str, int]]
    backend: NotRequired[str]
    url: NotRequired[str]
    library_version: NotRequired[str]
    owners: NotRequired[dict[str, int]]
    shards: NotRequired[list[dict[str, Any]]]


class RowInfo(TypedDict):
    """:meth:`QueueEngine.describe`: everything the queue holds about one row."""

    row: int
    queued: bool
    due_ms: int | None
    lane: int | None
    interval_s: int
    failures: int
    provenance: str
    urgent: bool
    leased: bool
    lease_expiry_ms: int | None
    owner: NotRequired[str | None]


class Restamped(TypedDict):
    """:meth:`QueueEngine.restamp`: rows re-encoded, and whether none is left."""

    restamped: int
    done: bool


@dataclass
class VerifyWalk:
    """:meth:`QueueEngine.verify_walk`: broken invariants, and the marks writers killed midway
    left (``unpublished``: rows stored and not yet published; ``abandoned``: reserved, never
    written), which :meth:`QueueEngine.repair` finishes or takes back."""

    problems: list[str]
    marks: list[str]
    unpublished: int
    abandoned: int


@dataclass(frozen=True)
class UrlsAdded:
    """What :meth:`RowUrls.add` did, per URL given: its row and whether it was new."""

    rows: npt.NDArray[np.int64]
    new: npt.NDArray[np.bool_]
    unparked: int

    @property
    def added(self) -> int:
        return int(self.new.sum())

    @property
    def known(self) -> int:
        return len(self.new) - self.added


@dataclass(frozen=True)
class Scoped:
    """What :meth:`RowUrls.prioritize_prefix` did: how many URLs start with the prefix
    (``matched``), and how many of their rows were made due (``done``: a removed row is
    skipped)."""

    matched: int
    done: int


class QueueEngine(Protocol):
    """A claim queue: rows with a due time and an interval, leased in claim passes that share
    capacity between lanes as the :class:`~engine.policy.LanePolicy` says.

    ``now_ms`` everywhere defaults to the clock (the process's wall clock on shared memory, the
    server's on Redis); passing it runs the engine in virtual time. Bad input raises an
    ``EngineError`` and changes nothing; a stale token raises ``LeaseLost`` (the ``_many``
    calls report it per row instead).
    """

    supports_compact: ClassVar[bool]
    """Whether recent writes wait in a buffer that :meth:`compact` merges into the index
    (shared memory); where a write is in order at once (a Redis ZSET), ``compact`` only checks
    that the engine is open."""
    spans_hosts: ClassVar[bool]
    """Whether processes on several hosts share the queue (Redis). Then :meth:`reap` judges
    only this host's processes: the leases of another host's lapse by themselves."""
    writes_whole: ClassVar[bool]
    """Whether every write is applied whole or not at all (one function call on Redis): then a
    writer killed midway leaves no mark, and :meth:`verify_walk` finds none to repair."""

    @property
    def name(self) -> str: ...
    @property
    def policy(self) -> LanePolicy: ...

    # lifetime
    def close(self) -> None: ...
    def unlink(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    # writes
    def add(self, due_ms: int, interval_s: int, provenance: str = "submitted",
            failures: int = 0) -> int: ...
    def add_many(self, due_ms: Any, interval_s: Any, provenance: Any = "submitted",
                 failures: Any = None) -> IntArray: ...
    def complete(self, row: int, token: int, next_due_ms: int | None = None,
                 now_ms: int | None = None) -> None: ...
    def complete_many(self, rows: Any, tokens: Any, next_due_ms: Any = None,
                      now_ms: int | None = None) -> BoolArray: ...
    def fail(self, row: int, token: int, retry_at_ms: int | None = None,
             now_ms: int | None = None, permanent: bool = False) -> None: ...
    def release(self, row: int, token: int, now_ms: int | None = None) -> None: ...
    def release_many(self, rows: Any, tokens: Any, now_ms: int | None = None) -> BoolArray: ...
    def renew(self, row: int, token: int, lease_ms: int = DEFAULT_LEASE_MS,
              now_ms: int | None = None) -> int: ...
    def prioritize(self, row: int, mode: str = "rush", now_ms: int | None = None) -> None: ...
    def prioritize_many(self, rows: Any, mode: str = "rush", now_ms: int | None = None
                        ) -> int: ...
    def reclassify(self, row: int, provenance: str | int) -> None: ...
    def remove(self, row: int) -> None: ...

    # claims
    def claim(self, budget: int = DEFAULT_BUDGET, now_ms: int | None = None,
              lease_ms: int = DEFAULT_LEASE_MS, window: int = DEFAULT_WINDOW) -> ClaimBatch: ...
    def complete_and_claim(self, rows: Any, tokens: Any, budget: int = DEFAULT_BUDGET,
                           now_ms: int | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                           window: int = DEFAULT_WINDOW) -> tuple[BoolArray, ClaimBatch]: ...

    # reading
    def describe(self, row: int, now_ms: int | None = None) -> RowInfo: ...
    def due_ms(self, row: int) -> int | None: ...
    def lane(self, row: int) -> int | None: ...
    def lane_name(self, lane: int) -> str: ...
    def floor_minute(self, lane: int) -> int: ...
    def set_policy(self, policy: LanePolicy) -> None: ...
    def stats(self, now_ms: int | None = None) -> Stats: ...
    def verify(self) -> list[str]: ...
    def check(self) -> list[str]: ...
    def verify_walk(self) -> VerifyWalk:
        """One walk of the invariants that changes nothing (``verify`` repairs the marks of
        dead writers first); ``lanes check`` reports the marks apart from the problems."""
        ...

    # maintenance
    def compact(self, full: bool = False) -> None: ...
    def restamp(self, limit: int = 5000) -> Restamped: ...
    def reap(self) -> int: ...
    def repair(self) -> dict[str, int]:
        """``reap``, and finish or take back what dead writers left even when no dead owner is
        left (a mark an earlier repair left waiting); returns what it did, ``dead_owners`` at
        least (``lanes check --repair`` prints it)."""
        ...

    # the pool's URLs
    def row_urls(self) -> RowUrls:
        """The URLs a render pool keeps with this queue (row id -> URL), read and added to
        through this engine, which the caller keeps open while it uses them."""
        ...

    # checkpoints (engine/checkpoint.py)
    def export_rows(self) -> tuple[IntArray, dict[str, IntArray]]: ...
    def save(self, path: str | os.PathLike[str], urls: Any = None,
             extra: dict[str, Any] | None = None) -> int: ...


class RowUrls(Protocol):
    """Row id -> URL of a render pool's queue: files in /dev/shm beside a segment
    (``engine.shm.urls.UrlTable``), or two hashes beside a Redis queue
    (``engine.redis.urls.RedisUrls``, ``engine.redis.shard_urls.ShardedUrls`` over shards).
    :meth:`QueueEngine.row_urls` gives the one of an engine."""

    name: str

    def __len__(self) -> int: ...
    def __getitem__(self, row: int) -> str: ...
    def many(self, rows: Sequence[int]) -> list[str]: ...
    def urls(self) -> list[str]: ...
    def find(self, url: str) -> int: ...
    def find_many(self, urls: Sequence[str]) -> IntArray:
        """The row of each of ``urls``, -1 where the table holds none."""
        ...
    def origins(self) -> frozenset[str]:
        """``scheme://host[:port]`` of every URL: the hosts the pool renders pages of."""
        ...
    def refresh(self) -> None: ...
    def close(self) -> None: ...
    def drop(self) -> None:
        """Delete the URLs (and the routes) kept with the queue; the queue is the caller's."""
        ...
    def store_routes(self, text: str) -> None:
        """Keep the routes (``Routes.to_json``) a pool was started with."""
        ...
    def routes(self) -> str | None: ...
    def find_prefix(self, prefix: str) -> tuple[IntArray, list[str]]:
        """The rows whose URL starts with ``prefix``, and their URLs."""
        ...
    def prioritize_prefix(self, prefix: str, mode: str = "rush", now_ms: int | None = None
                          ) -> Scoped:
        """``QueueEngine.prioritize_many`` of the rows whose URL starts with ``prefix`` (a
        scope of ``POST /api/prioritize``) where the URLs are: on Redis, on the server, no URL
        sent. Needs the table of an engine."""
        ...
    def add(self, urls: Sequence[str], due_ms: Any, interval_s: Any, provenance: Any = "submitted",
            failures: Any = None, now_ms: int | None = None) -> UrlsAdded:
        """Queue a row for each URL not known yet (``urls[i]`` with ``due_ms[i]``...), its URL
        published before its row can be claimed; known URLs are left alone, except parked rows,
        made due now. Needs the table of an engine (``QueueEngine.row_urls``)."""
        ...

