"""The shared store (engine/store/s3.py) on a real S3 API server and a real redis-server:
content-addressed blobs (an unchanged render uploads nothing), a pointer only after its blob,
a blob that does not match its digest never served, a later render never replaced by an older
one, gc and migrate through the CLI, the Redis bytes a pointer costs, and two servers of one
store answering alike (same ETag and Age, a new render seen within a second, the copy held
here when a blob cannot be fetched, else 503)."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pool_testlib import cli, serving

from engine.errors import StoreError
from engine.store import SnapshotStore, StoreSpec, open_store
from engine.store import s3 as s3_module
from engine.store.s3 import ObjectStore

META: dict[str, Any] = {"status": 200, "location": None, "interval_s": 3600, "lane": 2,
                        "render_ms": 140.5}


@pytest.fixture
def store_kind() -> str:
    """This file's tests are the shared store's own: on S3 only."""
    return "s3"


@pytest.fixture
def shared(make_spec: Callable[[], StoreSpec]) -> Iterator[ObjectStore]:
    s = open_store(make_spec())
    assert isinstance(s, ObjectStore)
    yield s
    s.close()


def blob_keys(s: ObjectStore) -> list[str]:
    return sorted(d for d, _at in s.blobs())


def test_an_unchanged_render_uploads_nothing(shared: ObjectStore) -> None:
    assert shared.put("https://s.test/a", "<p>x</p>", **META) == "written"
    assert shared.put("https://s.test/a", "<p>x</p>", **META) == "unchanged"
    assert shared.uploaded == 1
    snap = shared.get("https://s.test/a")
    assert snap is not None
    assert blob_keys(shared) == [snap.hash] == [hashlib.sha256(snap.gz).hexdigest()]


def test_a_pointer_is_set_only_after_its_blob_is_stored(shared: ObjectStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shared.put("https://s.test/a", "<p>old</p>", **META)

    def refused(**kw: Any) -> None:
        raise OSError("connection refused")

    monkeypatch.setattr(shared.client, "put_object", refused)
    with pytest.raises(StoreError, match="cannot upload"):
        shared.put("https://s.test/a", "<p>new</p>", **META)
    with pytest.raises(StoreError, match="cannot upload"):
        shared.put("https://s.test/b", "<p>b</p>", **META)
    snap = shared.get("https://s.test/a")
    assert snap is not None and snap.html() == b"<p>old</p>"
    assert shared.get("https://s.test/b") is None


def test_a_blob_that_is_missing_or_not_its_digest_is_never_served(shared: ObjectStore) -> None:
    shared.put("https://s.test/a", "<p>a</p>", **META)
    snap = shared.get("https://s.test/a")
    assert snap is not None
    shared.client.put_object(Bucket=shared.bucket, Key=shared.key_of(snap.hash), Body=b"torn")
    with pytest.raises(StoreError, match="does not hash to its name"):
        shared.get("https://s.test/a")
    shared.client.delete_object(Bucket=shared.bucket, Key=shared.key_of(snap.hash))
    with pytest.raises(StoreError, match="missing"):
        shared.get("https://s.test/a")
    assert shared.get("https://s.test/a", snap) is not None  # the copy held: no fetch


def test_an_older_render_never_replaces_a_newer_one(shared: ObjectStore) -> None:
    shared.put("https://s.test/a", "<p>new</p>", rendered_at_ms=2_000, **META)
    assert shared.put("https://s.test/a", "<p>old</p>", rendered_at_ms=1_000,
                      **META) == "unchanged"
    snap = shared.get("https://s.test/a")
    assert snap is not None and snap.html() == b"<p>new</p>" and snap.renders == 1


def test_gc_removes_only_unnamed_blobs_past_their_grace(shared: ObjectStore,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    shared.put("https://s.test/a", "<p>one</p>", rendered_at_ms=1_000, **META)
    shared.put("https://s.test/a", "<p>two</p>", rendered_at_ms=2_000, **META)
    shared.put("https://s.test/b", "<p>b</p>", **META)
    shared.clear(["https://s.test/b"])
    assert len(blob_keys(shared)) == 3
    with pytest.raises(StoreError, match="at least"):
        shared.gc(1.0)
    assert shared.gc(3600) == {"blobs": 3, "named": 1, "removed": 0}
    monkeypatch.setattr(s3_module, "MIN_GRACE_S", 0.0)
    time.sleep(1.1)  # LastModified has whole seconds
    assert shared.gc(0.5) == {"blobs": 3, "named": 1, "removed": 2}
    snap = shared.get("https://s.test/a")
    assert snap is not None and blob_keys(shared) == [snap.hash]


def test_the_cli_migrates_a_directory_and_gcs(shared: ObjectStore, tmp_path: Path) -> None:
    with SnapshotStore.open(tmp_path / "dir") as local:
        for i in range(3):
            local.put(f"https://s.test/{i}", f"<p>{i}</p>", rendered_at_ms=1_000 + i,
                      **{**META, "status": 200 + i})
    spec = shared.spec
    args = [str(tmp_path / "dir"), spec.address, "--store-endpoint", str(spec.endpoint),
            "--redis", str(spec.redis)]
    for expected in ({"written": 3, "unchanged": 0, "gone": 0},
                     {"written": 0, "unchanged": 3, "gone": 0}):
        p = cli("store", "migrate", *args)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert json.loads(out) == expected
    for i in range(3):
        snap = shared.get(f"https://s.test/{i}")
        assert snap is not None and snap.html() == f"<p>{i}</p>".encode()
        assert (snap.rendered_at_ms, snap.status) == (1_000 + i, 200 + i)
    p = cli("store", "gc", *args[1:])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out) == {"blobs": 3, "named": 3, "removed": 0}
    bad = cli("store", "migrate", str(tmp_path / "dir"), str(tmp_path / "other"))
    out, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "s3://BUCKET/PREFIX" in err
    assert not (tmp_path / "other").exists()


def test_a_pointer_costs_under_200_bytes_of_redis_beside_its_url(shared: ObjectStore) -> None:
    """Past 128 fields (Redis's listpack limit) the hash has the encoding a real store has."""
    urls = [f"https://shop.example/product/{i:06d}" for i in range(300)]
    shared.put(urls[0], "<p>0</p>", rendered_at_ms=1_765_000_000_000, **META)
    digest = shared.pointers.get(urls[0])[1]  # type: ignore[index]
    for u in urls[1:]:  # pointers as a put writes them, their one blob uploaded once
        shared.pointers.write(u, digest, True, (1_765_000_000_000, 200, None, 3600, 2, 8, 28,
                                                140.5))
    used, n = shared.pointers.memory()
    assert n == len(urls)
    per_url = used / n - len(urls[0])
    assert 0 < per_url < 200, per_url


# -- two servers of one store --------------------------------------------------------------------


@contextlib.contextmanager
def serving_store(spec: StoreSpec) -> Iterator[str]:
    with serving("--store", spec.address, "--store-endpoint", str(spec.endpoint),
                 "--redis", str(spec.redis)) as base:
        yield base


made = [0]


def fetch(base: str, url: str) -> tuple[int, dict[str, str], bytes]:
    made[0] += 1
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", f"/render?url={urllib.parse.quote(url, safe='')}")
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_two_servers_of_one_store_answer_alike_and_see_a_render_within_a_second(
        shared: ObjectStore) -> None:
    made[0] = 0
    url = "https://shop.example/p/1"
    shared.put(url, "<p>one</p>", rendered_at_ms=int(time.time() * 1000) - 125_000, **META)
    with serving_store(shared.spec) as a, serving_store(shared.spec) as b:
        (sa, ha, body_a), (sb, hb, body_b) = fetch(a, url), fetch(b, url)
        assert (sa, sb) == (200, 200) and body_a == body_b == b"<p>one</p>"
        assert ha["etag"] == hb["etag"] and abs(int(ha["age"]) - int(hb["age"])) <= 1
        assert int(ha["age"]) >= 125
        shared.put(url, "<p>two</p>", **META)
        seen = time.monotonic()
        while fetch(a, url)[2] != b"<p>two</p>" or fetch(b, url)[2] != b"<p>two</p>":
            assert time.monotonic() - seen < 1.5, "a new render was not served within 1 s"
            time.sleep(0.05)
        assert fetch(a, url)[1]["etag"] == fetch(b, url)[1]["etag"] != ha["etag"]
        # The blob of a newer render cannot be fetched: the copy held here is served whole,
        # and a server holding no copy answers 503 with Retry-After.
        shared.put(url, "<p>three</p>", **META)
        three = shared.get(url)
        assert three is not None
        shared.client.delete_object(Bucket=shared.bucket, Key=shared.key_of(three.hash))
        time.sleep(1.2)
        status, headers, body = fetch(a, url)
        assert (status, body) == (200, b"<p>two</p>")
        shared.put("https://shop.example/p/2", "<p>p2</p>", **META)
        p2 = shared.get("https://shop.example/p/2")
        assert p2 is not None
        shared.client.delete_object(Bucket=shared.bucket, Key=shared.key_of(p2.hash))
        status, headers, body = fetch(b, "https://shop.example/p/2")
        assert status == 503 and headers["retry-after"] == "5"
        assert headers["x-lanes-snapshot"] == "unavailable"
        shared.clear([url])  # clear works across hosts: both stop serving it within a second
        time.sleep(1.2)
        assert fetch(a, url)[0] == fetch(b, url)[0] == 404
    # Both servers flushed their hit logs into the store's (at their stop, if not before): the
    # farm's requests are counted together, whichever host answered them.
    assert sum(n for n, _o in shared.bot_requests().values()) == made[0]
    served = shared.hit_ratios(0)[3]
    assert served.all() and len(served) == made[0] - 3  # all but the 503 and the two 404s
