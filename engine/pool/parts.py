"""A running pool's shared parts, attached by name as one object and closed as one.

A pool is several files and handles: the engine (a segment, or a Redis queue), the URL table
(or the Redis map of row -> URL), the board, the failure log and, when the pool is polite, the
host gate. A worker needs all of them, ``lanes`` commands and the dashboard most of them.
``PoolParts.attach`` opens them in one call (closing what it had opened if one of them fails),
and ``close`` releases them all, once, in the reverse order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import factory
from ..api import QueueEngine, RowUrls
from .board import Board
from .failures import FailureLog
from .hosts import HostGate


@dataclass
class PoolParts:
    """The engine, URLs, board, failure log and host gate of one pool, as one handle."""

    name: str
    """The engine's name (the segment, or the Redis queue)."""
    local: str
    """The name of this host's files in /dev/shm (the board, failure log and host gate)."""
    engine: QueueEngine
    urls: RowUrls
    board: Board
    failures: FailureLog | None
    gate: HostGate | None
    now: Callable[[], int | None]
    """The time to pass the engine: the board's pool clock, or None (the Redis server's)."""
    redis: str | None = field(default=None, repr=False)  # a URL may hold a password
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @classmethod
    def attach(cls, name: str, *, local: str | None = None, redis: str | None = None,
               failures: bool = True, gate: bool = False) -> PoolParts:
        """Attach pool ``name``'s parts: on shared memory, or on Redis at ``redis`` (with this
        host's files under ``local``). ``gate``: the pool has a host gate."""
        local = local or name
        with contextlib.ExitStack() as opened:
            board = Board.attach(local)
            opened.callback(board.close)
            # On Redis: its own owner id (host:pid:start), and the server's clock, which every
            # host shares; on shared memory, the pool's clock.
            eng = attach_engine(name, redis)
            opened.callback(eng.close)
            now = _server_time if eng.spans_hosts else board.clock.now_ms
            urls = eng.row_urls()
            opened.callback(urls.close)
            log = FailureLog.attach(local) if failures else None
            if log is not None:
                opened.callback(log.close)
            host_gate = HostGate.attach(local) if gate else None
            if host_gate is not None:
                opened.callback(host_gate.close)
            closers = opened.pop_all()
        return cls(name, local, eng, urls, board, log, host_gate, now, redis, [closers.close])

    def close(self) -> None:
        """Close every part (in the reverse order of opening); a second call does nothing."""
        closers, self._closers = self._closers, []
        for close in closers:
            close()

    def __enter__(self) -> PoolParts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> dict[str, Any]:
        """What each part says about itself, for a look without a debugger."""
        if not self._closers:
            return {"name": self.name, "local": self.local, "closed": True}
        return {"name": self.name, "local": self.local,
                "backend": "shm" if self.redis is None else "redis",
                "closed": False, "rows": len(self.urls),
                "board": {k: v for k, v in self.board.totals().items()
                          if k not in ("lane_renders", "lane_age_sum", "lane_hist",
                                       "lane_duration_s")},
                "failures": None if self.failures is None else self.failures.statistics(),
                "gate": None if self.gate is None else self.gate.statistics()}


def _server_time() -> None:
    """The time a worker passes when the queue spans hosts: None, the server's clock (hosts'
    clocks differ)."""
    return None


def attach_engine(name: str, redis: str | None = None) -> QueueEngine:
    """Engine ``name``: the shared-memory segment, or with ``redis`` the queue at that URL."""
    return factory.open(name, redis)

