"""A worker's heartbeat on a queue that several hosts share (docs/redis.md "Heartbeats").

Why: a host that dies whole (power, kernel, a network cut) leaves leases that no other host can
judge by pid, so without a heartbeat its rows wait out their leases (30 s by default). Each
worker that holds leases on Redis beats from a thread of its own: every ``period_s`` it keeps
its owner id alive for two periods (``RedisEngine.heartbeat``), and the same call puts back the
leases of every owner whose heartbeat lapsed. So a dead host's rows are claimable elsewhere
within three periods of its death (its last beat's TTL, then one period until another worker's
beat), whatever the lease. A worker beats only when its lease is longer than two periods:
with a shorter one, expiry is as quick.

The beat is per lease owner (a worker process), not per host: the holder entries name owners,
so reaping needs no map from hosts to owners, and a beat from the process that holds the leases
says exactly what matters, that it runs and reaches Redis. A host cut off for longer than the
TTL loses its leases while it renders on: its late completes are refused as stale (LeaseLost)
and the rows render again elsewhere, never lost.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from ..errors import EngineError

log = logging.getLogger("engine.pool")
HEARTBEAT_S = 1.0
"""A pool worker's heartbeat period on Redis; its heartbeat holds two periods."""


class Beats(Protocol):
    """An engine that keeps heartbeats (``RedisEngine``)."""

    def heartbeat(self, ttl_ms: int = ..., now_ms: int | None = None) -> tuple[int, int]: ...


class Heartbeat:
    """The heartbeat thread of one lease owner (one worker process)."""

    def __init__(self, eng: Beats, period_s: float) -> None:
        self._eng = eng
        self._period = period_s
        self._ttl_ms = max(1, round(2000 * period_s))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    @classmethod
    def of(cls, eng: object, period_s: float, lease_s: float) -> Heartbeat | None:
        """A started heartbeat for ``eng`` if it keeps them (Redis), ``period_s`` > 0 and the
        lease is longer than the heartbeat's TTL (two periods). With a shorter lease, expiry
        puts a dead owner's rows back as soon as a lapsed heartbeat would, and a heartbeat
        would only add a way to lose leases: a worker stalled for a moment (a pause, SIGSTOP)
        would lose them before they expire."""
        if (period_s <= 0 or lease_s <= 2 * period_s
                or not callable(getattr(eng, "heartbeat", None))):
            return None
        beat = cls(eng, period_s)  # type: ignore[arg-type]
        beat._thread.start()
        return beat

    def _loop(self) -> None:
        while True:
            try:
                owners, rows = self._eng.heartbeat(self._ttl_ms)
                if owners:
                    log.info("put back %d row(s) of %d owner(s) whose heartbeat lapsed", rows,
                             owners)
            except EngineError as e:  # out of reach: our own beat lapses, as it should
                log.debug("heartbeat missed: %s", e)
            if self._stop.wait(self._period):
                return

    def stop(self) -> None:
        """Stop beating and take this owner's heartbeat out (it leaves; nothing to reap)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._eng.heartbeat(0)
        except EngineError:
            pass  # its entry lapses instead, and reaps nothing: the worker gave its rows back
