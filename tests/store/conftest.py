"""The store suite's fixtures: ``store`` is opened on every backend (a directory, and the
shared store on a real S3 API server and a real redis-server), as tests/contract/ runs the
queue's suite on every engine."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.store import Store, StoreSpec, open_store

STORES = ("local", "s3")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """One moto S3 server for the session, stopped at the end."""
    from s3_server import S3Server

    srv = S3Server().start()
    yield srv
    srv.stop()
    assert srv.proc is not None and srv.proc.poll() is not None


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_spec(store_kind: str, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[Callable[[], StoreSpec]]:
    """``make_spec()``: the spec of a new, empty store on this test's backend; every shared
    store's Redis keys are deleted at the end (its blobs go with the S3 server)."""
    made: list[StoreSpec] = []

    def make() -> StoreSpec:
        if store_kind == "local":
            spec = StoreSpec(str(tmp_path / f"store-{len(made)}"))
        else:
            s3 = request.getfixturevalue("s3_server")
            redis = request.getfixturevalue("redis_server")
            spec = StoreSpec(f"s3://{s3.bucket}/t-{secrets.token_hex(6)}", s3.endpoint,
                             redis.url)
        made.append(spec)
        return spec

    yield make
    for spec in made:
        if spec.shared:
            from engine.store.api import bucket_and_prefix
            from engine.store.pointers import Pointers

            bucket, prefix = bucket_and_prefix(spec.address)
            assert spec.redis is not None
            pointers = Pointers(spec.redis, f"{bucket}/{prefix}")
            pointers.drop()
            pointers.close()


@pytest.fixture
def store(make_spec: Callable[[], StoreSpec]) -> Iterator[Store]:
    s = open_store(make_spec())
    yield s
    s.close()
