"""The snapshot store's contract: what the pool writes and ``lanes serve`` reads, whatever holds
the snapshots.

Why a contract: one host keeps its snapshots in a directory (:mod:`engine.store.local`); a farm
of hosts keeps them where every host reads them, in object storage over the S3 API with each
URL's pointer in the queue's Redis (:mod:`engine.store.s3`). The pool, the server, the metrics
and the CLI speak :class:`Store` only, and reach a backend through :func:`engine.store.open_store`
with a :class:`StoreSpec` (``--store``, ``--store-endpoint``, ``--redis``); one test suite
(tests/store/) runs on both.

What every store promises:

* ``put`` is atomic: a reader sees the URL's previous snapshot or the new one, never part of
  one, whatever is killed when; the HTML already stored for the URL is ``"unchanged"`` and
  rewrites no body;
* a snapshot is keyed by its row's key: a URL, or ``URL VARIANT`` for a further variant of a
  URL (``engine.corpus.variant_rows``); clearing a URL clears all of them;
* ``get`` returns a whole snapshot or None (never rendered, or cleared), or raises
  :class:`~engine.errors.StoreError` when the body cannot be read now: never a torn body;
* a URL keeps its ``id`` until it is cleared (hits name snapshots by id);
* ``hash`` is the digest of the stored body: two snapshots of one store with one hash have the
  same HTML (``lanes serve`` makes its ETag from it, so every host answers with the same one);
* the hit log and the per-crawler counts are the store's, so every server that shares a store
  counts into the same figures.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import numpy as np

from ..errors import EngineValueError

HIT_WINDOW_MS: Final = 3_600_000
HIT_CAP: Final = 200_000
"""The hit log keeps the hits of the last hour, and at most the last ``HIT_CAP`` of them (at
thousands of hits a second an hour would be millions of entries to read for each figure)."""

S3_SCHEME: Final = "s3://"

Outcome = Literal["written", "unchanged"]


@dataclass(frozen=True)
class Snapshot:
    """One URL's latest snapshot: its metadata and its gzipped HTML (``gz``); ``path`` says
    where the body is (a file, or an object's s3:// address)."""

    id: int
    url: str
    status: int
    location: str | None
    rendered_at_ms: int
    interval_s: int
    lane: int
    html_bytes: int
    gz_bytes: int
    hash: str
    render_ms: float
    renders: int
    unchanged: int
    path: str
    gz: bytes

    def html(self) -> bytes:
        return gzip.decompress(self.gz)

    def age_s(self, now_ms: int) -> int:
        """Whole seconds since it was rendered (never negative: clocks of two hosts differ)."""
        return max(0, (now_ms - self.rendered_at_ms) // 1000)

    def age_over_interval(self, now_ms: int) -> float:
        return max(0, now_ms - self.rendered_at_ms) / 1000 / self.interval_s


@dataclass(frozen=True)
class StoreSpec:
    """Where a store is: a directory, or ``s3://BUCKET/PREFIX`` with the S3 service's
    ``endpoint`` (None: AWS's own, as the environment and config chain name it) and the
    ``redis`` URL that holds its pointers (the pool's queue)."""

    address: str
    endpoint: str | None = None
    redis: str | None = None

    @property
    def shared(self) -> bool:
        """Whether the store is object storage that every host reads."""
        return self.address.startswith(S3_SCHEME)

    def check(self) -> None:
        """``EngineValueError`` for a spec no store can be opened from (nothing is touched)."""
        if not isinstance(self.address, str) or not self.address:
            raise EngineValueError(f"--store is a directory or s3://BUCKET/PREFIX, got"
                                   f" {self.address!r}")
        if not self.shared:
            if self.endpoint is not None:
                raise EngineValueError("--store-endpoint names an S3 service: give --store"
                                       " s3://BUCKET/PREFIX")
            return
        bucket_and_prefix(self.address)
        if self.redis is None:
            raise EngineValueError("--store s3://... keeps each URL's pointer in the pool's"
                                   " Redis: give --redis URL")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise EngineValueError(f"--store-endpoint is an http(s) URL, got {self.endpoint!r}")


_BUCKET_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_PREFIX_CHARS: Final = _BUCKET_CHARS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ_/")


def bucket_and_prefix(address: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` as (bucket, prefix without slashes at its ends). The prefix names
    the store's keys in Redis too, so it is kept to letters, digits and ``._-/``."""
    bucket, _, prefix = address[len(S3_SCHEME):].partition("/")
    prefix = prefix.strip("/")
    if not 3 <= len(bucket) <= 63 or not set(bucket) <= _BUCKET_CHARS or not prefix \
            or not set(prefix) <= _PREFIX_CHARS or len(prefix) > 512 or "//" in prefix:
        raise EngineValueError(f"--store s3://BUCKET/PREFIX: a bucket name (3-63 of a-z 0-9 .-)"
                               f" and a prefix of letters, digits and ._-/, got {address!r}")
    return bucket, prefix


class Store(Protocol):
    """A snapshot store opened in this process (open one in each process, after a fork)."""

    spec: StoreSpec
    """What it was opened from: :func:`engine.store.open_store` opens another connection."""
    created: bool
    """Whether the open that made this object made the store."""
    written: int
    unchanged: int
    """This object's puts, by outcome."""

    @property
    def address(self) -> str:
        """Where it is, for messages: the directory, or ``s3://BUCKET/PREFIX``."""
        ...

    @property
    def remote(self) -> bool:
        """Whether a read may wait on the network (the server then reads off its event loop)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Store: ...

    def __exit__(self, *exc: object) -> None: ...

    def put(self, url: str, html: bytes | str, *, status: int, location: str | None,
            interval_s: int, lane: int, render_ms: float,
            rendered_at_ms: int | None = None) -> Outcome:
        """Store ``html`` as ``url``'s snapshot: ``"written"``, or ``"unchanged"`` when it is
        the HTML already stored (then only the metadata moves)."""
        ...

    def get(self, url: str, known: Snapshot | None = None) -> Snapshot | None:
        """``url``'s latest snapshot, or None if it has none. When ``known`` (an earlier
        answer for ``url``) has the same hash, its body is reused, not read again."""
        ...

    def clear(self, urls: Sequence[str]) -> int:
        """Drop the snapshots of ``urls`` (those it has), each URL's of every variant: how many
        went."""
        ...

    def ages(self) -> list[tuple[str, int, int, int]]:
        """Every snapshot's ``(url, lane, rendered_at_ms, interval_s)``."""
        ...

    def ratios(self, now_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every snapshot's ``(id, lane, age ÷ interval at now_ms)``, as three arrays."""
        ...

    def urls_after(self, last_id: int) -> list[tuple[int, str]]:
        """``(id, url)`` of the snapshots whose id is above ``last_id``, by id."""
        ...

    def log_hits(self, hits: Sequence[tuple[int, int, int, float, bool, int]],
                 requests: dict[int, tuple[int, int]] | None = None) -> None:
        """Append ``(at_ms, snapshot id, lane, age ÷ interval, served, crawler family)`` hits
        and add ``requests`` (family -> (requests, of which relayed from the origin)) to the
        per-crawler counts; forget hits older than ``HIT_WINDOW_MS`` or past ``HIT_CAP``."""
        ...

    def hits(self, since_ms: int) -> list[tuple[str, int, float, bool]]:
        """The hits logged since ``since_ms``: ``(url, lane, age ÷ interval, served)``."""
        ...

    def hit_ratios(self, since_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
        """The hits logged since ``since_ms`` as arrays: snapshot id, lane, age ÷ interval,
        served (bool)."""
        ...

    def bot_requests(self) -> dict[int, tuple[int, int]]:
        """Crawler family -> (requests, of which the origin's answer), since the store began."""
        ...

    def bot_ratios(self, since_ms: int) -> dict[int, tuple[int, float, int]]:
        """Crawler family -> (snapshot hits, mean age ÷ interval of those served, refused as
        too stale) since ``since_ms``."""
        ...

    def gc(self, grace_s: float) -> dict[str, int]:
        """Remove bodies no snapshot names that are older than ``grace_s`` (and what killed
        writers left): what went, by kind."""
        ...

    def statistics(self) -> dict[str, Any]:
        """What the store holds, and this object's puts."""
        ...


def bot_ratios_of(bots: np.ndarray, ratios: np.ndarray,
                  served: np.ndarray) -> dict[int, tuple[int, float, int]]:
    """:meth:`Store.bot_ratios` from the hits' crawler families, ratios and served flags."""
    out: dict[int, tuple[int, float, int]] = {}
    for bot in np.unique(bots).tolist():
        mine = bots == bot
        ok = ratios[mine & served]
        out[int(bot)] = (int(mine.sum()), float(ok.mean()) if len(ok) else float("nan"),
                         int((mine & ~served).sum()))
    return out


__all__ = ["HIT_CAP", "HIT_WINDOW_MS", "Outcome", "Snapshot", "Store", "StoreSpec",
           "bucket_and_prefix"]
