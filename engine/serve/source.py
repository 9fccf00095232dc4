"""The pool as ``lanes serve`` sees it: its shared parts, opened by the server's process.

Why this module exists: the dashboard, the JSON API and ``/metrics`` all read the same engine,
URL table, failure log, board and routes, and none may stall the event loop that also serves
snapshots. :class:`PoolSource` opens each part through the pool's own attach functions
(``engine.pool.parts``: the same ones a worker and ``lanes`` commands use, either backend), but
each when first needed, since a pool's board and failure log come and go while the server runs
(``PoolParts`` opens them all at once, for a process of the pool). It runs every call on
them in one worker thread (:meth:`PoolSource.call`): a slow figure delays other figures, never
a snapshot. The board is attached per use, since the pool it belongs to may start, stop or be
restarted while the server runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..corpus.routes import Routes
from ..errors import LayoutMismatch, SegmentMissing
from ..pool.board import Board
from ..pool.failures import FailureLog
from ..pool.parts import attach_engine
from ..store.api import Store

T = TypeVar("T")


class PoolSource:
    """The shared parts of pool ``name`` (on Redis: the queue ``name`` at ``redis``, with this
    host's pool files named ``local``), and the snapshot store when the server has one."""

    def __init__(self, name: str, *, redis: str | None = None, local: str | None = None,
                 store: Store | None = None) -> None:
        self.name = name
        self.redis = redis
        self.local = local or name
        self.store = store
        self.engine: Any = attach_engine(name, redis)
        self._urls: Any = None
        self._failures: FailureLog | None = None
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lanes-serve-pool")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the source's thread: how handlers reach the pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    def urls(self) -> Any:
        """The engine's URL table (``QueueEngine.row_urls``), refreshed: rows added by
        ``lanes add`` since the last call are seen."""
        with self._lock:
            if self._urls is None:
                self._urls = self.engine.row_urls()
            self._urls.refresh()
            return self._urls

    def failures(self) -> FailureLog | None:
        """The pool's failure log, or None when this host runs no pool of that name."""
        with self._lock:
            if self._failures is None:
                try:
                    self._failures = FailureLog.attach(self.local)
                except SegmentMissing:
                    return None
            return self._failures

    @contextlib.contextmanager
    def board(self) -> Iterator[Board | None]:
        """The pool's board for the length of a ``with``, or None when no pool runs here."""
        try:
            board: Board | None = Board.attach(self.local)
        except (SegmentMissing, LayoutMismatch):
            board = None
        try:
            yield board
        finally:
            if board is not None:
                board.close()

    def routes(self) -> Routes | None:
        """The routes the pool was started with, or None."""
        from ..pool.grow import stored_routes

        try:
            urls = self.urls()
        except SegmentMissing:
            return None  # an engine without a pool's URLs has no routes either
        return stored_routes(urls)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        with self._lock:
            for part in (self._urls, self._failures):
                if part is not None:
                    part.close()
            self._urls = self._failures = None
        self.engine.close()
