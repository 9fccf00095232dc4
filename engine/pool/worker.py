"""A pool's worker process: claim rows, render them, complete or fail each, until told to stop.

A worker attaches the pool's parts by name (``PoolParts``), so it starts the same under fork,
spawn and forkserver, and makes itself the leader of a process group at once: everything it
starts (a render command, a browser and its renderers) lives in that group, which the
supervisor kills whole when the worker dies, so nothing outlives it.

Two loops share the accounting (``Worker``): the serial one claims a batch and renders its rows
one after the other (a callable or a command, ``render``); the browser's renders several pages
at once (``browser.run_tabs``). Either way a failed row is failed at once, with its reason
logged and kept in the failure log (a permanent failure goes cold at once, a row that failed
``max_failures`` times is parked), and rendered rows are completed together. A thread renews
the leases of the rows held, so a render longer than its lease keeps its row; a row whose lease
was lost anyway (the worker stalled past its lease) is not completed, since someone else holds
it now. A worker leaves when SIGTERMed, when the board's stop flag rises, or when its supervisor
is gone: it finishes the render in hand, completes what it rendered and releases the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..api import BoolArray, Claim, ClaimBatch, QueueEngine
from ..checks import wall_ms
from ..errors import EngineError, LeaseLost, OutcomeUnknown
from ..keys import PARKED_MS
from ..report.words import format_due
from .board import (
    F_CURRENT_ROW,
    F_LEASE_LOST,
    F_PID,
    F_RELEASED,
    F_RENEWED,
    F_STARTS,
    record_render,
)
from .heartbeat import HEARTBEAT_S, Heartbeat
from .parts import PoolParts
from .render import RenderFn, RenderSpec

if TYPE_CHECKING:
    from .browser import BrowserSpec

log = logging.getLogger("engine.pool")
LOG_FORMAT = "%(asctime)s %(processName)s %(levelname)s %(message)s"
GONE = frozenset({404, 410})
"""The statuses with which a discovered page leaves the queue."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, by name (picklable for spawn and forkserver)."""

    name: str
    render: RenderSpec | BrowserSpec
    batch: int
    lease_s: float
    idle_s: float
    env: dict[str, str] = field(default_factory=dict)
    max_failures: int | None = None
    polite: bool = False  # a host gate (per-host cap or delay) is in force
    local: str = ""  # the name of the pool's files in /dev/shm ("": the engine's name)
    redis: str | None = field(default=None, repr=False)  # the queue's Redis URL (may hold a
    # password, hence not in the repr); None: the shared-memory engine ``name``
    heartbeat_s: float = HEARTBEAT_S  # on Redis (engine/pool/heartbeat.py); 0: none


def worker_main(spec: WorkerSpec, slot_index: int) -> None:
    """A worker process: claim, render, complete, until it is leaving."""
    stop = _set_up_process(spec)
    parts = PoolParts.attach(spec.name, local=spec.local or spec.name, redis=spec.redis,
                             gate=spec.polite)
    worker: Worker | None = None
    try:
        worker = Worker(spec, parts, slot_index, stop)
        if isinstance(spec.render, RenderSpec):
            worker.run_serial(spec.render.build())
        else:
            from .browser import run_tabs

            run_tabs(worker, spec.render)
    finally:
        if worker is not None:
            worker.held.stop()
            with contextlib.suppress(EngineError):  # leaving anyway; leases lapse otherwise
                worker.give_back(worker.held.rest(), at_stop=True)  # not rendered: stopping
            if worker.beat is not None:
                worker.beat.stop()
        parts.close()


def _set_up_process(spec: WorkerSpec) -> threading.Event:
    """Own process group, signals, environment and logging; the event SIGTERM sets."""
    os.setpgid(0, 0)  # what this worker starts dies with its group (the supervisor kills it)
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()  # finish the render in hand, then leave like a graceful stop

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when the pool stops
    signal.signal(signal.SIGTERM, on_term)
    os.environ.update(spec.env)
    if not log.handlers:  # a worker's failure lines go to stderr whatever the parent set up
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return stop


class _Held:
    """The tokens of the rows a worker holds, renewed by a thread while renders run long."""

    def __init__(self, eng: QueueEngine, now: Callable[[], int | None], lease_ms: int,
                 slot: Any) -> None:
        self._eng, self._now, self._lease_ms, self._slot = eng, now, lease_ms, slot
        self._lock = threading.Lock()
        self._tokens: dict[int, int] = {}
        self.lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)

    def start(self, period_s: float) -> None:
        self._period = period_s
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def hold(self, batch: ClaimBatch) -> None:
        with self._lock:
            self._tokens.update(zip(batch.rows.tolist(), batch.tokens.tolist(), strict=True))

    def take(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """Stop renewing ``rows``; returns those still held and their current tokens."""
        with self._lock:
            held = [(r, self._tokens.pop(r)) for r in rows if r in self._tokens]
        return [r for r, _ in held], [t for _, t in held]

    def drain_lost(self) -> int:
        """Leases the renewer found lost since the last call (the slot has one writer)."""
        with self._lock:
            n, self.lost = self.lost, 0
        return n

    def rest(self) -> list[int]:
        """The rows still held."""
        with self._lock:
            return list(self._tokens)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._period):
            with self._lock:
                for row, token in list(self._tokens.items()):
                    try:
                        self._tokens[row] = self._eng.renew(row, token, self._lease_ms,
                                                            now_ms=self._now())
                        self._slot[F_RENEWED] += 1
                    except LeaseLost:
                        del self._tokens[row]  # someone else holds it now; do not complete it
                        self.lost += 1  # counted into the slot by the main thread
                    except EngineError:
                        pass  # e.g. the engine closed under us at exit: try again next period


@dataclass(frozen=True)
class Started:
    """A render's start, as accounted: its clock, the row's interval and how stale it was."""

    t0: float
    interval_s: int
    age_over_ttl: float


class Worker:
    """One worker's state and its accounting of renders; the loops drive it."""

    def __init__(self, spec: WorkerSpec, parts: PoolParts, slot_index: int,
                 stop: threading.Event) -> None:
        self.spec, self.parts, self.eng, self.now = spec, parts, parts.engine, parts.now
        self.classify = spec.render.classify
        self.clock = parts.board.clock
        self.slot = parts.board.slot(slot_index)
        self.slot[F_PID] = os.getpid()
        self.slot[F_STARTS] += 1
        self.lease_ms = self.clock.virtual_ms(spec.lease_s * 1000)
        self.held = _Held(self.eng, self.now, self.lease_ms, self.slot)
        self.held.start(max(0.01, spec.lease_s / 3))
        self.beat = Heartbeat.of(self.eng, spec.heartbeat_s, spec.lease_s)
        self._stop = stop
        # The supervisor is our parent (or, under forkserver, the server's, which exits with
        # it). A dead parent that is not reaped yet still answers kill(pid, 0); being
        # re-parented is the reliable sign.
        self._parent = os.getppid()
        self._supervisor, _ = parts.board.supervisor

    def leaving(self) -> bool:
        """Checked before every render: an orphan must not render on beside a --resume."""
        return (self._stop.is_set() or self.parts.board.stopping
                or os.getppid() != self._parent or not _alive(self._supervisor))

    # -- the serial loop -------------------------------------------------------------------------

    def run_serial(self, render: RenderFn) -> None:
        """Claim a batch, render its rows one by one, complete them together; again."""
        while not self.leaving():
            batch, urls = self.claim(self.spec.batch)
            if not len(batch):
                time.sleep(self.spec.idle_s)
                continue
            done: list[int] = []
            later: list[int] = []
            for c, url in zip(batch, urls, strict=True):
                if self.leaving():
                    break
                ticket = self.enter_gate(url)
                if ticket is False:
                    later.append(c.row)  # its host is busy: given back below, due as it was
                    continue
                try:
                    if self.render_one(render, c, url):
                        done.append(c.row)
                finally:
                    self.leave_gate(ticket)
            self.complete(done)
            self.give_back(later)
            self.give_back(self.held.rest(), at_stop=True)  # not rendered: stopping
            if len(later) == len(batch):
                time.sleep(self.spec.idle_s)  # every row waits for a busy host: do not spin

    def render_one(self, render: RenderFn, c: Claim, url: str) -> bool:
        started = self.begin(c)
        try:
            render(url, c)
        except Exception as exc:
            return self.account(c, url, started, exc)
        return self.account(c, url, started, None)

    # -- what both loops use ---------------------------------------------------------------------

    def claim(self, budget: int) -> tuple[list[Claim], list[str]]:
        """Claim up to ``budget`` rows and hold them; those to render and their URLs. Rows an
        operator asked to park (``FailureLog.request_park``) are parked here, unrendered."""
        try:
            batch = self.eng.claim(budget, now_ms=self.now(), lease_ms=self.lease_ms)
        except OutcomeUnknown:  # what it may have leased lapses; claim again next time
            return [], []
        if not len(batch):
            return [], []
        self.held.hold(batch)
        rows = batch.rows.tolist()
        log_ = self.parts.failures
        parking = log_.parking(rows) if log_ is not None else set()
        claims, urls = [], []
        for c, url in zip(batch, self.parts.urls.many(rows), strict=True):
            if c.row in parking:
                self.park(c, url)
            else:
                claims.append(c)
                urls.append(url)
        return claims, urls

    def park(self, c: Claim, url: str) -> None:
        """Park ``c`` unrendered, as an operator asked."""
        rows, tokens = self.held.take([c.row])
        if rows:
            try:
                self.eng.fail(c.row, tokens[0], retry_at_ms=PARKED_MS, now_ms=self.now())
                log.warning("%s (row %d) parked on request", url, c.row)
            except LeaseLost:
                self.slot[F_LEASE_LOST] += 1
        assert self.parts.failures is not None  # parking is asked through the failure log
        self.parts.failures.cancel_park([c.row])

    def enter_gate(self, url: str) -> Any:
        """The host gate's ticket for ``url`` (None without a gate), False if its host is busy."""
        if self.parts.gate is None:
            return None
        ticket = self.parts.gate.try_enter(url)
        return False if ticket is None else ticket

    def leave_gate(self, ticket: Any) -> None:
        if ticket is not None and self.parts.gate is not None:
            self.parts.gate.leave(ticket)

    def begin(self, c: Claim) -> Started:
        now = self.clock.now_ms()
        interval_s = int(self.eng.describe(c.row, now_ms=now)["interval_s"])
        self.slot[F_CURRENT_ROW] = c.row + 1  # the row in hand (the last begun, with tabs)
        return Started(time.perf_counter(), interval_s,
                       1.0 + max(0, now - c.due_ms) / (1000 * interval_s))

    def account(self, c: Claim, url: str, started: Started, exc: BaseException | None) -> bool:
        """Count a finished render; fail its row at once if it failed (its reason logged and
        kept). True if it rendered (its row is to be completed)."""
        failure = None if exc is None else self.classify(exc)
        if self.slot[F_CURRENT_ROW] == c.row + 1:
            self.slot[F_CURRENT_ROW] = 0
        record_render(self.slot, c.lane, time.perf_counter() - started.t0, started.age_over_ttl,
                      failure is None)
        if failure is None:
            return True
        rows, tokens = self.held.take([c.row])
        if not rows:
            log.warning("%s (row %d) failed: %s; its lease was lost meanwhile", url, c.row,
                        failure.reason)
            return False  # the renewer already found this lease lost (and counted it)
        if failure.http_status in GONE and self._gone(c.row, url, failure.http_status):
            return False
        try:
            count = self.parts.failures.record(c.row, url, failure, wall_ms()) \
                if self.parts.failures is not None else 1
        except EngineError as e:  # the log is advisory: the row is failed all the same
            log.error("cannot record the failure of %s in the failure log: %s", url, e)
            count = 1
        park = self.spec.max_failures is not None and count >= self.spec.max_failures
        try:
            self.eng.fail(c.row, tokens[0], retry_at_ms=PARKED_MS if park else None,
                          now_ms=self.now(), permanent=failure.permanent)
        except LeaseLost:
            self.slot[F_LEASE_LOST] += 1
            return False
        if park:
            then = f"parked after {count} failures (a rush or a re-add retries it)"
        else:
            due = self.eng.describe(c.row)["due_ms"]
            then = (f"{'permanent, ' if failure.permanent else ''}retry"
                    f" {format_due(due, self.clock.now_ms())}")
        log.warning("%s (row %d) failed: %s; %s", url, c.row, failure.reason, then)
        return False

    def _gone(self, row: int, url: str, status: int) -> bool:
        """A discovered page the site says is gone (404, 410) leaves the queue, so requests for
        junk URLs cannot fill it (``lanes serve --discover``); a page a sitemap lists stays
        (it fails as permanent, parked after ``--max-failures``). True if it was removed."""
        try:
            if self.eng.describe(row)["provenance"] != "discovered":
                return False
            self.eng.remove(row)
        except EngineError as e:
            log.warning("%s (row %d) answered %d; could not remove it: %s", url, row, status, e)
            return False
        log.warning("%s (row %d, discovered) answered %d: removed from the queue", url, row,
                    status)
        return True

    def complete(self, done: list[int]) -> None:
        """Complete the rendered rows still held (one call), and clear their failures."""
        self.slot[F_LEASE_LOST] += self.held.drain_lost()
        rows, tokens = self.held.take(done)
        if rows:
            ok = self._complete_many(rows, tokens)
            self.slot[F_LEASE_LOST] += int(len(ok) - int(ok.sum()))
            if self.parts.failures is not None:
                self.parts.failures.clear(rows)

    def _complete_many(self, rows: list[int], tokens: list[int]) -> BoolArray:
        """``complete_many``, sent once more if the connection was lost after sending (a
        network cut): the tokens fence it, so it is applied once at most, and a refusal then
        may mean the first one was applied (docs/redis.md "Lost connections"). Rows whose
        outcome stays unknown count as not completed, and a warning says how many."""
        try:
            return self.eng.complete_many(rows, tokens, now_ms=self.now())
        except OutcomeUnknown:
            try:
                ok = self.eng.complete_many(rows, tokens, now_ms=self.now())
            except EngineError:  # out of reach still: their leases lapse, rows render again
                ok = np.zeros(len(rows), np.bool_)
        unknown = len(ok) - int(ok.sum())
        if unknown:
            log.warning("%d complete(s) of unknown outcome: applied once at most, counted as "
                        "leases lost", unknown)
        return ok

    def give_back(self, rows: list[int], at_stop: bool = False) -> None:
        """Release rows unrendered (due as they were); those given back at a stop are counted."""
        rows, tokens = self.held.take(rows)
        if rows:
            ok = self.eng.release_many(rows, tokens)
            self.slot[F_RELEASED] += int(ok.sum()) if at_stop else 0
            self.slot[F_LEASE_LOST] += int(len(ok) - int(ok.sum()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
