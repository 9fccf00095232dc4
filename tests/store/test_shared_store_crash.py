"""The shared store under faults, with real servers: the S3 API server SIGKILLed and restarted
while writers upload (no torn snapshot, no pointer to a missing blob, the renders that failed
retried), and a Redis failover while writers set pointers (no acknowledged pointer lost)."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redis_server import SentinelGroup
from s3_server import S3Server

from engine.errors import StoreError
from engine.store import StoreSpec, open_store
from engine.store.api import bucket_and_prefix
from engine.store.pointers import Pointers
from engine.store.s3 import ObjectStore

META: dict[str, Any] = {"status": 200, "location": None, "interval_s": 3600, "lane": 1,
                        "render_ms": 800.0}
URLS = [f"https://shop.example/p/{i}" for i in range(12)]


def page(writer: int, n: int) -> str:
    """A page of about 60 KB (uploads take long enough to be cut), different every render."""
    return f"<html><body>writer {writer} render {n}" + "<p>filler</p>" * 5000 + "</body></html>"


def writer(spec: StoreSpec, me: int, stop: Path, out: Any) -> None:
    """Render every URL in turn until ``stop`` exists; a put that fails is retried (the pool
    retries a failed render); reports (failed puts, {url: (rendered_at_ms, digest)} acked)."""
    store = open_store(spec)
    failed, acked, n = 0, {}, 0
    try:
        while not stop.exists():
            url = URLS[n % len(URLS)]
            at = int(time.time() * 1000)
            try:
                store.put(url, page(me, n), rendered_at_ms=at, **META)
            except StoreError:
                failed += 1
                time.sleep(0.05)
                continue  # the same URL again: the render is retried
            snap_digest = hashlib.sha256(_gz(page(me, n))).hexdigest()
            acked[url] = (at, snap_digest)
            n += 1
    finally:
        store.close()
    out.put((failed, acked, n))


def _gz(html: str) -> bytes:
    import gzip

    return gzip.compress(html.encode(), compresslevel=6, mtime=0)


@contextlib.contextmanager
def _pointers(spec: StoreSpec) -> Iterator[Pointers]:
    """The store's pointers read straight from Redis (while S3 is down too)."""
    bucket, prefix = bucket_and_prefix(spec.address)
    assert spec.redis is not None
    pointers = Pointers(spec.redis, f"{bucket}/{prefix}")
    try:
        yield pointers
    finally:
        pointers.close()


def check_every_pointer_names_a_whole_blob(store: ObjectStore) -> dict[str, Any]:
    pointers = dict(store.pointers.scan())
    assert sorted(pointers) == sorted(URLS)
    for url in URLS:
        snap = store.get(url)  # fetches the blob and checks it against its digest
        assert snap is not None and snap.html().startswith(b"<html><body>writer ")
        assert snap.html().endswith(b"</body></html>")
    return pointers


def test_an_s3_server_killed_mid_upload_leaves_no_torn_snapshot_nor_dangling_pointer(
        tmp_path: Path, redis_server: Any) -> None:
    s3 = S3Server(bucket="lanes-kill").start()
    spec = StoreSpec(f"s3://lanes-kill/k-{secrets.token_hex(4)}", s3.endpoint, redis_server.url)
    stop = tmp_path / "stop"
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(spec, i, stop, out)) for i in range(2)]
    try:
        for p in procs:
            p.start()
        time.sleep(1.0)
        s3.kill()  # mid-upload: both writers are uploading all the time
        killed_at = int(time.time() * 1000)
        with _pointers(spec) as pointers:
            time.sleep(0.3)  # a put whose upload returned before the kill sets its pointer
            while_down = dict(pointers.scan())
            time.sleep(0.7)
            assert dict(pointers.scan()) == while_down, "a pointer was set while S3 was down"
        s3.start()  # moto comes back empty (see tests/lib/s3_server.py)
        with _pointers(spec) as pointers:  # every URL rendered again since the kill
            deadline = time.monotonic() + 60
            while not all(p[4] >= killed_at for _u, p in pointers.scan()):
                assert time.monotonic() < deadline, "the failed renders were not retried"
                time.sleep(0.1)
        stop.touch()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert sum(f for f, _a, _n in results) > 0, "no put failed while S3 was down"
        with open_store(spec, create=False) as store:
            assert isinstance(store, ObjectStore)
            # Every pointer names a whole blob (the blobs of renders before the kill went
            # with moto's memory; every URL has been rendered since).
            pointers = check_every_pointer_names_a_whole_blob(store)
            # No acknowledged render is lost: each URL holds its latest acknowledged render.
            latest: dict[str, tuple[int, str]] = {}
            for _f, acked, _n in results:
                for url, (at, digest) in acked.items():
                    latest[url] = max(latest.get(url, (0, "")), (at, digest))
            for url, (at, _digest) in latest.items():
                assert pointers[url][4] >= at, url
            store.pointers.drop()
    finally:
        stop.touch()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        s3.stop()


def test_a_redis_failover_mid_upload_loses_no_acknowledged_pointer(s3_server: Any) -> None:
    """Pointers wait for one replica (``?wait_replicas=1``): a put is acknowledged only once
    the replica has its pointer, so the promoted replica has every acknowledged one."""
    with SentinelGroup() as group:
        spec = StoreSpec(f"s3://{s3_server.bucket}/f-{secrets.token_hex(4)}", s3_server.endpoint,
                         f"{group.url}?wait_replicas=1&wait_timeout_ms=500")
        store = open_store(spec)
        assert isinstance(store, ObjectStore)
        acked: dict[str, tuple[int, str]] = {}
        failed = [0]
        stop = threading.Event()

        def write() -> None:
            n = 0
            while not stop.is_set():
                url = URLS[n % len(URLS)]
                at = int(time.time() * 1000)
                try:
                    store.put(url, page(0, n), rendered_at_ms=at, **META)
                except StoreError:
                    failed[0] += 1
                    time.sleep(0.05)
                    continue
                acked[url] = (at, hashlib.sha256(_gz(page(0, n))).hexdigest())
                n += 1

        thread = threading.Thread(target=write)
        thread.start()
        try:
            time.sleep(1.0)
            before = dict(acked)
            old, _new = group.fail_over()  # SIGKILL the primary mid-run
            group.rejoin(old)  # a replica again: pointers can be acknowledged again
            time.sleep(1.5)
        finally:
            stop.set()
            thread.join(timeout=60)
        try:
            # The failover happened under the writer: its calls were retried (a lost
            # connection, a demoted primary) or refused (too few replicas), and it went on.
            assert before and acked != before
            assert failed[0] + sum(store.pointers.transport.retried.values()) > 0
            pointers = dict(store.pointers.scan())
            for url, (at, digest) in acked.items():
                held = pointers[url]
                assert held[4] > at or (held[4], held[1]) == (at, digest), url
            check_every_pointer_names_a_whole_blob(store)
        finally:
            store.pointers.drop()
            store.close()
    assert not os.path.exists(group.servers[0].dir)
