"""Snapshot stores behind one contract (:mod:`engine.store.api`): a local directory
(:mod:`engine.store.local`, the default) and object storage over the S3 API with each URL's
pointer in the pool's Redis (:mod:`engine.store.s3`). Only this package names a store backend:
everything else opens a store with :func:`open_store` and speaks :class:`Store`."""

from __future__ import annotations

from ..errors import MissingExtra
from .api import HIT_CAP, HIT_WINDOW_MS, Outcome, Snapshot, Store, StoreSpec
from .local import DATABASE, SCHEMA_VERSION, SnapshotStore


def open_store(spec: StoreSpec | str, *, create: bool = True) -> Store:
    """The store ``spec`` names, opened in this process (``create``: made when missing).
    ``EngineValueError`` for a bad spec, :class:`~engine.errors.StoreError` for a store that
    cannot be opened; an S3 store without its extra installed names the extra."""
    if isinstance(spec, str):
        spec = StoreSpec(spec)
    spec.check()
    if not spec.shared:
        return SnapshotStore.open(spec.address, create=create)
    try:
        from .s3 import ObjectStore
    except ModuleNotFoundError as e:  # redis or boto3: both come with the extra
        raise MissingExtra(e.name or "boto3", "s3") from None
    shared: Store = ObjectStore.open(spec, create=create)  # mypy holds it to the contract
    return shared


__all__ = ["DATABASE", "HIT_CAP", "HIT_WINDOW_MS", "SCHEMA_VERSION", "Outcome", "Snapshot",
           "SnapshotStore", "Store", "StoreSpec", "open_store"]
