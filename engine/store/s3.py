"""The shared store: snapshot bodies in object storage over the S3 API, each URL's pointer in the
pool's Redis (:mod:`engine.store.pointers`), so every host serves every host's renders.

Why this client: boto3 (the ``s3`` extra) reads credentials the way every AWS tool does (the
environment, ``~/.aws/config`` and ``credentials`` with profiles, SSO, container and instance
roles), speaks to any S3-compatible service through ``--store-endpoint``, is thread-safe for one
client per process, and retries the S3 errors that say "try again" itself.

Layout of a store ``s3://BUCKET/PREFIX``::

    PREFIX/blobs/<sha256 of the stored bytes>   a snapshot's HTML, gzipped (mtime 0)

How a snapshot is written so that nothing reads a torn or missing body
----------------------------------------------------------------------

1. The HTML is gzipped with a zero mtime (the same HTML makes the same bytes) and hashed: the
   digest names the blob. When the URL's pointer already names it, nothing is uploaded.
2. Otherwise the blob is PUT with its SHA-256 checksum: the service refuses a body that does
   not match, and a PUT that returned is durable. A kill before that leaves no pointer to it.
3. The pointer is set (``SET_POINTER``) only after the PUT returned, and only if no later
   render of the URL is there already. A blob the pointer no longer names stays until
   ``lanes store gc`` finds it older than its grace period.

A read takes the pointer, then the blob, and checks the blob's SHA-256 against the digest
before handing it out: a body that does not match, or cannot be fetched, is a
:class:`~engine.errors.StoreError`, never a torn answer. A gc racing a put is made harmless by
order: gc lists the blobs first and reads the pointers after, and a put either finds its blob
named by the pointer (kept) or uploads it again (fresh: younger than any grace).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np

from ..checks import wall_ms
from ..corpus.variant_rows import all_keys
from ..errors import EngineClosed, EngineTypeError, MissingExtra, StoreError
from .api import Outcome, Snapshot, StoreSpec, bot_ratios_of, bucket_and_prefix
from .checks import checked_meta, html_bytes
from .pointers import Pointers

BLOBS: Final = "blobs"
MIN_GRACE_S: Final = 60.0
"""``gc`` refuses a shorter grace: a put's upload and its pointer are a round trip or two
apart, and a grace shorter than a stalled writer could let gc take a blob just uploaded."""


def _client(endpoint: str | None) -> Any:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=2,
                    read_timeout=10, max_pool_connections=32)
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def _missing(e: Exception) -> bool:
    code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


class ObjectStore:
    """A shared snapshot store, opened in this process (see the module docstring)."""

    remote = True  # a read may wait on Redis and the object service: off the event loop

    def __init__(self, spec: StoreSpec, client: Any, pointers: Pointers) -> None:
        self.spec = spec
        self.bucket, self.prefix = bucket_and_prefix(spec.address)
        self.client = client
        self.pointers = pointers
        self.created = False
        self.written = 0
        self.unchanged = 0
        self.uploaded = 0  # blobs this object PUT
        self._closed = False
        self._lock = threading.Lock()  # the counters, from the server's threads

    @classmethod
    def open(cls, spec: StoreSpec, *, create: bool = True) -> ObjectStore:
        """The store at ``spec.address``. The bucket must exist (making buckets is the
        operator's, with their policy); :class:`StoreError` if it cannot be reached or
        written. ``create`` changes nothing: a store is made by its first put."""
        spec.check()
        assert spec.redis is not None
        try:
            client = _client(spec.endpoint)
        except ModuleNotFoundError as e:
            raise MissingExtra(e.name or "boto3", "s3") from None
        except Exception as e:  # botocore's configuration errors: a bad endpoint, region
            raise StoreError(f"cannot open {spec.address}: {e}") from None
        bucket, prefix = bucket_and_prefix(spec.address)
        try:
            client.head_bucket(Bucket=bucket)
        except Exception as e:
            raise StoreError(f"cannot open the snapshot store {spec.address}: the bucket"
                             f" {bucket!r} cannot be reached: {e}") from None
        pointers = Pointers(spec.redis, f"{bucket}/{prefix}")
        try:
            pointers.memory()  # Redis reachable, or a clear error now
        except BaseException:
            pointers.close()
            raise
        return cls(spec, client, pointers)

    @property
    def address(self) -> str:
        return self.spec.address

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pointers.close()
            self.client.close()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> None:
        if self._closed:
            raise EngineClosed(f"the snapshot store {self.address} is closed")

    def key_of(self, digest: str) -> str:
        return f"{self.prefix}/{BLOBS}/{digest}"

    # -- writing --------------------------------------------------------------------------------

    def put(self, url: str, html: bytes | str, *, status: int, location: str | None,
            interval_s: int, lane: int, render_ms: float,
            rendered_at_ms: int | None = None) -> Outcome:
        data = html_bytes(html)
        code, location, at_ms, interval, lane_, render = checked_meta(
            url, status, location, interval_s, lane, render_ms,
            wall_ms() if rendered_at_ms is None else rendered_at_ms)
        self._live()
        gz = gzip.compress(data, compresslevel=6, mtime=0)
        digest = hashlib.sha256(gz).hexdigest()
        meta = (at_ms, code, location, interval, lane_, len(data), len(gz), render)
        verdict, held = self.pointers.write(url, digest, False, meta)
        if verdict == "UPLOAD":
            self._upload(digest, gz)
            verdict, held = self.pointers.write(url, digest, True, meta)
        outcome: Outcome = "unchanged" if held == digest or verdict == "OLDER" else "written"
        with self._lock:
            if outcome == "written":
                self.written += 1
            else:
                self.unchanged += 1
        return outcome

    def _upload(self, digest: str, gz: bytes) -> None:
        checksum = base64.b64encode(bytes.fromhex(digest)).decode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key_of(digest), Body=gz,
                                   ContentType="text/html", ContentEncoding="gzip",
                                   ChecksumSHA256=checksum)
        except Exception as e:
            raise StoreError(f"cannot upload a snapshot to {self.address}: {e}") from None
        with self._lock:
            self.uploaded += 1

    def clear(self, urls: Sequence[str]) -> int:
        """Drop the pointers of ``urls``, every variant's of each (``variant_rows.keys_of``):
        every host's server stops serving them within its revalidation (a second); the blobs
        go with ``gc``."""
        if isinstance(urls, str) or not all(isinstance(u, str) for u in urls):
            raise EngineTypeError("clear takes a sequence of URL strings")
        self._live()
        urls = all_keys(urls)
        return sum(self.pointers.delete(urls[i:i + 10_000]) for i in range(0, len(urls), 10_000))

    # -- reading --------------------------------------------------------------------------------

    def get(self, url: str, known: Snapshot | None = None) -> Snapshot | None:
        if not isinstance(url, str):
            raise EngineTypeError(f"a URL is a str, got {type(url).__name__}")
        self._live()
        p = self.pointers.get(url)
        if p is None:
            return None
        digest = p[1]
        if known is not None and known.url == url and known.hash == digest:
            return self._snapshot(url, p, known.gz)
        return self._snapshot(url, p, self.fetch(digest))

    def fetch(self, digest: str) -> bytes:
        """The blob ``digest``, whole and checked; :class:`StoreError` otherwise."""
        key = self.key_of(digest)
        try:
            gz: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as e:
            why = "it is missing" if _missing(e) else str(e)
            raise StoreError(f"cannot fetch the snapshot s3://{self.bucket}/{key}: {why}"
                             ) from None
        if hashlib.sha256(gz).hexdigest() != digest:
            raise StoreError(f"s3://{self.bucket}/{key} does not hash to its name: not served")
        return gz

    def _snapshot(self, url: str, p: list[Any], gz: bytes) -> Snapshot:
        (id_, digest, status, location, at_ms, interval_s, lane, size, gz_size, render_ms,
         renders, unchanged) = p
        return Snapshot(int(id_), url, int(status), location, int(at_ms), int(interval_s),
                        int(lane), int(size), int(gz_size), digest, float(render_ms),
                        int(renders), int(unchanged), f"s3://{self.bucket}/{self.key_of(digest)}",
                        gz)

    def ages(self) -> list[tuple[str, int, int, int]]:
        self._live()
        return [(u, int(p[6]), int(p[4]), int(p[5])) for u, p in self.pointers.scan()]

    def ratios(self, now_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._live()
        rows = [(p[0], p[6], p[4], p[5]) for _u, p in self.pointers.scan()]
        a = np.array(rows, dtype=np.float64).reshape(-1, 4)
        ratio = np.maximum(0.0, now_ms - a[:, 2]) / 1000.0 / a[:, 3]
        return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), ratio

    def urls_after(self, last_id: int) -> list[tuple[int, str]]:
        self._live()
        return sorted((int(p[0]), u) for u, p in self.pointers.scan() if int(p[0]) > last_id)

    # -- the hit log (every host's, in Redis) ---------------------------------------------------

    def log_hits(self, hits: Sequence[tuple[int, int, int, float, bool, int]],
                 requests: dict[int, tuple[int, int]] | None = None) -> None:
        self._live()
        if hits or requests:
            self.pointers.log_hits(hits, requests)

    def hits(self, since_ms: int) -> list[tuple[str, int, float, bool]]:
        self._live()
        url_of = {int(p[0]): u for u, p in self.pointers.scan()}
        return [(url_of[int(r[0])], int(r[1]), float(r[2]), bool(r[3]))
                for r in self.pointers.hit_rows(since_ms) if int(r[0]) in url_of]

    def hit_ratios(self, since_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
        self._live()
        a = self.pointers.hit_rows(since_ms)
        return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2], a[:, 3].astype(bool)

    def bot_requests(self) -> dict[int, tuple[int, int]]:
        self._live()
        return self.pointers.bot_requests()

    def bot_ratios(self, since_ms: int) -> dict[int, tuple[int, float, int]]:
        self._live()
        a = self.pointers.hit_rows(since_ms)
        return bot_ratios_of(a[:, 4].astype(np.int64), a[:, 2], a[:, 3].astype(bool))

    # -- upkeep ---------------------------------------------------------------------------------

    def blobs(self) -> list[tuple[str, datetime]]:
        """Every blob: (digest, last modified)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/{BLOBS}/")
        return [(o["Key"].rpartition("/")[2], o["LastModified"])
                for page in pages for o in page.get("Contents", ())]

    def gc(self, grace_s: float) -> dict[str, int]:
        """Remove the blobs no pointer names that were written more than ``grace_s`` ago."""
        if not isinstance(grace_s, (int, float)) or not grace_s >= MIN_GRACE_S:
            raise StoreError(f"gc's grace must be at least {MIN_GRACE_S:g} s, got {grace_s!r}")
        self._live()
        try:
            listed = self.blobs()  # first: a blob written after this is not a candidate
        except Exception as e:
            raise StoreError(f"cannot list {self.address}: {e}") from None
        named = self.pointers.digests()
        cutoff = datetime.now(UTC) - timedelta(seconds=grace_s)
        gone = [d for d, at in listed if d not in named and at < cutoff]
        for start in range(0, len(gone), 1000):
            batch = [{"Key": self.key_of(d)} for d in gone[start:start + 1000]]
            try:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch,
                                                                       "Quiet": True})
            except Exception as e:
                raise StoreError(f"cannot remove blobs of {self.address}: {e}") from None
        return {"blobs": len(listed), "named": len(named), "removed": len(gone)}

    def statistics(self) -> dict[str, Any]:
        self._live()
        n = size = gz = renders = unchanged = 0
        for _u, p in self.pointers.scan():
            n += 1
            size += int(p[7])
            gz += int(p[8])
            renders += int(p[10])
            unchanged += int(p[11])
        used, _ = self.pointers.memory()
        return {"directory": self.address, "snapshots": n, "bytes": size, "gz_bytes": gz,
                "renders": renders, "unchanged": unchanged,
                "hits": self.pointers.count_hits(), "written_here": self.written,
                "unchanged_here": self.unchanged, "uploaded_here": self.uploaded,
                "pointer_bytes": used}

