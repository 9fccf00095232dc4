"""A worker's heartbeat on a queue that several hosts share (docs/redis.md "Heartbeats").

Why: a host that dies whole (power, kernel, a network cut) leaves leases that no other host can
judge by pid, so without a heartbeat its rows wait out their leases (30 s by default). Each
worker that holds leases on Redis beats from a thread of its own: every ``period_s`` it keeps
its owner id alive for 2.5 periods (``RedisEngine.heartbeat``), and the same call puts back
the leases of every owner whose heartbeat lapsed. So a dead host's rows are claimable elsewhere
within 3.5 periods of its death (its last beat's TTL, then one period until another worker's
beat), whatever the lease. A worker beats only when its lease is longer than its TTL: with a
shorter one, expiry is as quick.

The beats keep a fixed rate (every ``period_s`` from the first, not ``period_s`` after the last
call returned), so a beat that arrives more than 1.25 periods after the previous one says the
server or the way to it stalled: the server then judges no one for a TTL, and every live owner
delayed by the same stall lands its beat again within it (a failed beat retries at most a
32nd of the TTL apart).

The beat is per lease owner (a worker process), not per host: the holder entries name owners,
so reaping needs no map from hosts to owners, and a beat from the process that holds the leases
says exactly what matters, that it runs and reaches Redis. A host cut off for longer than the
TTL loses its leases while it renders on: its late completes are refused as stale (LeaseLost)
and the rows render again elsewhere, never lost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from ..errors import EngineError

log = logging.getLogger("engine.pool")
HEARTBEAT_S = 1.0
"""A pool worker's heartbeat period on Redis; its heartbeat holds ``TTL_PERIODS`` periods."""
TTL_PERIODS = 2.5
"""A heartbeat's TTL in periods: one missed beat is forgiven, and a beat is late (a stall) past
half the TTL, 1.25 periods, which leaves a quarter period for a beat's own delay."""


class Beats(Protocol):
    """An engine that keeps heartbeats (``RedisEngine``)."""

    def heartbeat(self, ttl_ms: int = ..., now_ms: int | None = None) -> tuple[int, int]: ...


class Heartbeat:
    """The heartbeat thread of one lease owner (one worker process)."""

    def __init__(self, eng: Beats, period_s: float) -> None:
        self._eng = eng
        self._period = period_s
        self._ttl_ms = max(1, round(1000 * TTL_PERIODS * period_s))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    @classmethod
    def of(cls, eng: object, period_s: float, lease_s: float) -> Heartbeat | None:
        """A started heartbeat for ``eng`` if it keeps them (Redis), ``period_s`` > 0 and the
        lease is longer than the heartbeat's TTL (2.5 periods). With a shorter lease, expiry
        puts a dead owner's rows back as soon as a lapsed heartbeat would, and a heartbeat
        would only add a way to lose leases: a worker stalled for a moment (a pause, SIGSTOP)
        would lose them before they expire."""
        if (period_s <= 0 or lease_s <= TTL_PERIODS * period_s
                or not callable(getattr(eng, "heartbeat", None))):
            return None
        beat = cls(eng, period_s)  # type: ignore[arg-type]
        beat._thread.start()
        return beat

    def _loop(self) -> None:
        due = time.monotonic()
        while True:
            try:
                owners, rows = self._eng.heartbeat(self._ttl_ms)
                if owners:
                    log.info("put back %d row(s) of %d owner(s) whose heartbeat lapsed", rows,
                             owners)
            except EngineError as e:  # out of reach: our own beat lapses, as it should
                log.debug("heartbeat missed: %s", e)
            due += self._period  # a fixed rate; after a call longer than a period, from now
            if due <= time.monotonic():
                due = time.monotonic() + self._period
            if self._stop.wait(due - time.monotonic()):
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
