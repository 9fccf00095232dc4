"""The forked render pool: a supervisor and N workers over one engine.

Each worker loops: claim a batch, render each row (after asking the host gate, when the pool is
polite), fail the rows that failed one by one (their reasons logged and kept in the failure
log; a permanent failure goes cold at once, a row that failed ``max_failures`` times is
parked) and complete the rest in one ``complete_many``. A thread in the worker renews the
leases of the rows it holds, so a render longer than its lease keeps its row; a row whose lease
was lost anyway (the worker stalled past its lease) is not completed, since someone else holds
it now.

The supervisor owns the engine's segment and the pool's files beside it: the URL table, the
pool board, the failure log, the host gate and the routes (``remove_pool_files``). On Redis
(``redis=URL``: pools on several hosts share one queue, docs/redis.md) the queue, its URLs and
its routes live in Redis and outlive every pool; each host keeps only its local files (board,
failure log, host gate) under the pool's local name. It restarts a worker that dies and
reclaims the dead worker's leases at once (``Engine.reap``, ``RedisEngine.reap``),
checkpoints the schedule periodically, and on SIGINT/SIGTERM raises the board's stop flag:
workers finish the render in hand, complete what they rendered, release what they did not and
exit; after the grace period the rest are killed and their leases reclaimed. Then the last
checkpoint is written and every shared file is removed. Workers watch the supervisor and exit
if it dies, so a killed supervisor leaves no worker behind (its files stay for ``lanes pool
--resume``).

Workers get only names and a picklable ``WorkerSpec``, and attach to the pool's files by name,
so the pool runs the same under fork, spawn and forkserver.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import psutil

from .. import checkpoint
from ..api import Claim, ClaimBatch, QueueEngine, RowUrls
from ..checks import is_int, is_number, wall_ms
from ..engine import Engine
from ..errors import (
    EngineError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    SegmentExists,
    SegmentMissing,
)
from ..policy import LanePolicy
from ..process import is_running, process_start_ms
from ..segment import Segment
from .board import (
    F_CURRENT_ROW,
    F_LEASE_LOST,
    F_PID,
    F_RELEASED,
    F_RENEWED,
    F_STARTS,
    Board,
    Clock,
    record_render,
)
from .failures import PARKED_MS, FailureLog
from .grow import Added, add_corpus, store_routes, unlink_routes
from .hosts import HostGate
from .ingest import Corpus
from .progress import format_due
from .render import RenderSpec
from .routes import Routes
from .urls import UrlTable

if TYPE_CHECKING:
    from ..redis import RedisEngine
    from .refresh import CorpusRefresh

START_METHODS = ("fork", "spawn", "forkserver")
GROWTH_ROOM = 100_000
"""A new pool's segment holds its corpus twice over and at least this many rows (about 50 bytes
a row), so ``lanes add`` has room; ``capacity=`` sets it exactly."""
log = logging.getLogger("engine.pool")
LOG_FORMAT = "%(asctime)s %(processName)s %(levelname)s %(message)s"


@dataclass(frozen=True)
class PoolOptions:
    """How a pool runs. Durations are real seconds; the clock's scale maps them to pool time."""

    workers: int = 2
    batch: int = 16
    lease_s: float = 30.0
    start_method: str = "fork"
    checkpoint: str | None = None
    checkpoint_every_s: float = 60.0
    grace_s: float = 10.0
    idle_s: float = 0.05
    time_scale: float = 1.0
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables set in every worker before its render is built (a forkserver's
    workers inherit the server's environment, not the supervisor's)."""
    per_host: int | None = None
    """At most this many renders in flight per host, across every worker (None: no cap)."""
    delay_ms: int = 0
    """At least this long between the starts of two renders to one host."""
    max_failures: int | None = None
    """A row that failed this many times is parked: kept and listed, not claimed, until a rush
    or a re-add (None: retried for ever, backing off)."""

    def __post_init__(self) -> None:
        for what, v, lo, hi in (("workers", self.workers, 1, 1000), ("batch", self.batch, 1, 4096)):
            if not is_int(v) or not lo <= v <= hi:
                raise EngineValueError(f"{what} must be an int in [{lo}, {hi}], got {v!r}")
        for what, x in (("lease_s", self.lease_s), ("checkpoint_every_s", self.checkpoint_every_s),
                        ("idle_s", self.idle_s), ("time_scale", self.time_scale)):
            if not is_number(x) or not 1e-3 <= x < 1e9:
                raise EngineValueError(f"{what} must be a positive number, got {x!r}")
        if not is_number(self.grace_s) or not 0 <= self.grace_s < 1e6:
            raise EngineValueError(f"grace_s must be a number >= 0, got {self.grace_s!r}")
        if self.start_method not in START_METHODS:
            raise EngineValueError(f"start_method must be one of {START_METHODS}")
        if self.checkpoint is not None:
            where = os.path.dirname(os.path.abspath(self.checkpoint))
            if not os.path.isdir(where) or not os.access(where, os.W_OK | os.X_OK):
                raise EngineValueError(f"checkpoint directory {where} is missing or not writable")
        if self.max_failures is not None and (not is_int(self.max_failures)
                                              or not 1 <= self.max_failures <= 255):
            raise EngineValueError(f"max_failures must be an int in [1, 255], got"
                                   f" {self.max_failures!r}")
        HostGate.check_limits(self.per_host, self.delay_ms)
        if not isinstance(self.env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                for k, v in self.env.items()):
            raise EngineValueError("env must map variable names to strings")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, by name (picklable for spawn and forkserver)."""

    name: str
    render: RenderSpec
    batch: int
    lease_s: float
    idle_s: float
    env: dict[str, str] = field(default_factory=dict)
    max_failures: int | None = None
    polite: bool = False  # a host gate (per-host cap or delay) is in force
    local: str = ""  # the name of the pool's files in /dev/shm ("": the engine's name)
    redis: str | None = field(default=None, repr=False)  # the queue's Redis URL (may hold a
    # password, hence not in the repr); None: the shared-memory engine ``name``


# -- the worker --------------------------------------------------------------------------------


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

    def rest(self) -> tuple[list[int], list[int]]:
        with self._lock:
            rows = list(self._tokens)
        return self.take(rows)

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


def worker_main(spec: WorkerSpec, slot_index: int) -> None:
    """A worker process: claim, render, complete, until the board says stop."""
    stop = [False]

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop[0] = True  # finish the render in hand, then leave like a graceful stop

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when the pool stops
    signal.signal(signal.SIGTERM, on_term)
    os.environ.update(spec.env)
    if not log.handlers:  # a worker's failure lines go to stderr whatever the parent set up
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    local = spec.local or spec.name
    board = Board.attach(local)
    clock = board.clock
    eng: QueueEngine
    urls: RowUrls
    now: Callable[[], int | None]
    if spec.redis is None:
        eng, urls, now = Engine.attach(spec.name), UrlTable.attach(spec.name), clock.now_ms
    else:
        from ..redis.urls import RedisUrls

        # Its own owner id (host:pid:start); the server's clock, which every host shares.
        eng = Engine.connect(spec.redis, spec.name)
        urls, now = RedisUrls(eng), _server_time
    failures = FailureLog.attach(local)
    gate = HostGate.attach(local) if spec.polite else None
    slot = board.slot(slot_index)
    slot[F_PID] = os.getpid()
    slot[F_STARTS] += 1
    lease_ms = clock.virtual_ms(spec.lease_s * 1000)
    render = spec.render.build()
    worker = _Worker(spec, eng, failures, render, clock, now, slot)
    held = _Held(eng, now, lease_ms, slot)
    held.start(max(0.01, spec.lease_s / 3))
    # The supervisor is our parent (or, under forkserver, the server's, which exits with it).
    # A dead parent that is not reaped yet still answers kill(pid, 0); being re-parented is
    # the reliable sign.
    parent = os.getppid()
    supervisor, _ = board.supervisor

    def leaving() -> bool:
        # Checked before every render: an orphan must not render on beside a --resume.
        return stop[0] or board.stopping or os.getppid() != parent or not _alive(supervisor)

    try:
        while not leaving():
            batch = eng.claim(spec.batch, now_ms=now(), lease_ms=lease_ms)
            if not len(batch):
                time.sleep(spec.idle_s)
                continue
            held.hold(batch)
            done: list[int] = []
            later: list[int] = []
            parking = failures.parking(batch.rows.tolist())
            for c, url in zip(batch, urls.many(batch.rows.tolist()), strict=True):
                if leaving():
                    break
                if c.row in parking:
                    worker.park(c, url, held)
                    continue
                if gate is None:
                    worker.render_one(c, url, held, done)
                    continue
                ticket = gate.try_enter(url)
                if ticket is None:
                    later.append(c.row)  # its host is busy: given back below, due as it was
                    continue
                try:
                    worker.render_one(c, url, held, done)
                finally:
                    gate.leave(ticket)
            slot[F_LEASE_LOST] += held.drain_lost()
            rows, tokens = held.take(done)
            if rows:
                ok = eng.complete_many(rows, tokens, now_ms=now())
                slot[F_LEASE_LOST] += int(len(ok) - int(ok.sum()))
                failures.clear(rows)
            _give_back(eng, slot, *held.take(later), at_stop=False)
            _give_back(eng, slot, *held.rest(), at_stop=True)  # not rendered: stopping
            if len(later) == len(batch):
                time.sleep(spec.idle_s)  # every row waits for a busy host: do not spin on them
    finally:
        held.stop()
        if gate is not None:
            gate.close()
        failures.close()
        eng.close()


def _server_time() -> None:
    """The time a worker on Redis passes: None, the server's clock (hosts' clocks differ)."""
    return None


def _give_back(eng: QueueEngine, slot: Any, rows: list[int], tokens: list[int],
               at_stop: bool) -> None:
    """Release rows unrendered (due as they were); those given back at a stop are counted."""
    if rows:
        ok = eng.release_many(rows, tokens)
        slot[F_RELEASED] += int(ok.sum()) if at_stop else 0
        slot[F_LEASE_LOST] += int(len(ok) - int(ok.sum()))


class _Worker:
    """What a worker needs to render one row and to account for how it went."""

    def __init__(self, spec: WorkerSpec, eng: QueueEngine, failures: FailureLog,
                 render: Callable[[str, Claim], object], clock: Clock,
                 now: Callable[[], int | None], slot: Any) -> None:
        self.spec, self.eng, self.failures = spec, eng, failures
        self.render, self.clock, self.now, self.slot = render, clock, now, slot

    def render_one(self, c: Claim, url: str, held: _Held, done: list[int]) -> None:
        """Render ``c``; on success add its row to ``done``, on failure fail it at once (with its
        reason logged and kept in the failure log)."""
        eng, clock = self.eng, self.clock
        now = clock.now_ms()
        info = eng.describe(c.row, now_ms=now)
        age_over_ttl = 1.0 + max(0, now - c.due_ms) / (1000 * int(info["interval_s"]))
        t0 = time.perf_counter()
        self.slot[F_CURRENT_ROW] = c.row + 1
        try:
            self.render(url, c)
            failure = None
        except Exception as exc:
            failure = self.spec.render.classify(exc)
        finally:
            self.slot[F_CURRENT_ROW] = 0
        record_render(self.slot, c.lane, time.perf_counter() - t0, age_over_ttl,
                      failure is None)
        if failure is None:
            done.append(c.row)
            return
        rows, tokens = held.take([c.row])
        if not rows:
            log.warning("%s (row %d) failed: %s; its lease was lost meanwhile", url, c.row,
                        failure.reason)
            return  # the renewer already found this lease lost (and counted it)
        try:
            count = self.failures.record(c.row, url, failure, wall_ms())  # renders that failed
        except EngineError as exc:  # the log is advisory: the row is failed all the same
            log.error("cannot record the failure of %s in the failure log: %s", url, exc)
            count = 1
        park = self.spec.max_failures is not None and count >= self.spec.max_failures
        try:
            eng.fail(c.row, tokens[0], retry_at_ms=PARKED_MS if park else None,
                     now_ms=self.now(), permanent=failure.permanent)
        except LeaseLost:
            self.slot[F_LEASE_LOST] += 1
            return
        if park:
            then = f"parked after {count} failures (a rush or a re-add retries it)"
        else:
            due = eng.describe(c.row)["due_ms"]
            then = (f"{'permanent, ' if failure.permanent else ''}retry"
                    f" {format_due(due, clock.now_ms())}")
        log.warning("%s (row %d) failed: %s; %s", url, c.row, failure.reason, then)


    def park(self, c: Claim, url: str, held: _Held) -> None:
        """Park ``c`` unrendered, as an operator asked (``FailureLog.request_park``)."""
        rows, tokens = held.take([c.row])
        if rows:
            try:
                self.eng.fail(c.row, tokens[0], retry_at_ms=PARKED_MS, now_ms=self.now())
                log.warning("%s (row %d) parked on request", url, c.row)
            except LeaseLost:
                self.slot[F_LEASE_LOST] += 1
        self.failures.cancel_park([c.row])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the supervisor ----------------------------------------------------------------------------


class Pool:
    """A supervisor: owns the engine, its URL table and its board; runs the workers.

    On Redis (``redis`` set) it owns only its connection and its local files (``local``):
    the queue and its URLs belong to every pool that shares them."""

    def __init__(self, eng: QueueEngine, urls: RowUrls, board: Board, failures: FailureLog,
                 render: RenderSpec, options: PoolOptions, *, local: str | None = None,
                 redis: str | None = None) -> None:
        self.engine, self.urls, self.board, self.failures = eng, urls, board, failures
        self.local = local or eng.name  # the name of the pool's files in /dev/shm
        self.redis = redis  # the queue's Redis URL; None: the shared-memory engine
        self.added: Added | None = None  # what --resume --corpus (or, on Redis, --corpus) added
        self.refresh: CorpusRefresh | None = None  # --refresh-corpus: ticked by supervise
        self.render, self.options = render, options
        self.clock = board.clock
        self._ctx: Any = mp.get_context(options.start_method)
        self._procs: list[Any] = [None] * options.workers
        self._started = [0.0] * options.workers
        self._backoff = [0.0] * options.workers
        self._restart_at = [0.0] * options.workers
        self._stop_signal: int | None = None
        self._hurry = False  # a second signal: no more grace
        self._summary: dict[str, Any] = {}
        self._last_checkpoint = time.monotonic()
        self._closed = False

    # -- setting up ------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, urls: list[str], due_ms: Any, interval_s: Any, provenance: Any,
               render: RenderSpec, options: PoolOptions | None = None, *,
               policy: LanePolicy | None = None, capacity: int | None = None,
               failures: Any = None, routes: Routes | None = None, redis: str | None = None,
               local: str | None = None) -> Pool:
        """A new engine filled with a corpus (row ``r`` renders ``urls[r]``), with room for it
        to grow (``GROWTH_ROOM``) unless ``capacity`` is given. ``routes`` (the ones the corpus
        was read with) are kept for the rows ``lanes add`` adds later.

        With ``redis`` (a URL), the pool runs over Redis queue ``name`` instead, created if
        missing (with ``policy`` and ``capacity``, default ``MAX_ROWS``); the corpus's URLs not
        in it yet are added (``Pool.added`` says what happened), so the pool of every host
        starts with the same call. Its files in /dev/shm are named ``local`` (default
        ``name``): two pools on one host need two local names."""
        options = options or PoolOptions()
        n = len(urls)
        if n == 0:
            raise EngineValueError("the corpus is empty: nothing to render")
        for what, col in (("due_ms", due_ms), ("interval_s", interval_s),
                          ("provenance", provenance), ("failures", failures)):
            if col is not None and np.ndim(col) == 1 and len(col) != n:
                raise EngineValueError(f"{what} has {len(col)} entries for {n} URLs")
        if redis is not None:
            return cls._on_redis(redis, name, render, options, local, policy, capacity, routes,
                                 (urls, due_ms, interval_s, provenance, failures))
        if local is not None and local != name:
            raise EngineValueError("a local name is for pools on Redis: a pool on shared memory"
                                   " names its files after its engine")
        eng = _create_engine(name, capacity or max(2 * n, GROWTH_ROOM), policy)
        try:
            rows = eng.add_many(due_ms, interval_s, provenance, failures)
            if not np.array_equal(rows, np.arange(n)):
                raise SegmentExists(f"engine {name!r} was not empty")  # pragma: no cover
            return cls._around(eng, urls, render, options, routes)
        except BaseException:
            _remove(name, eng)
            raise

    @classmethod
    def resume(cls, name: str, path: str, render: RenderSpec,
               options: PoolOptions | None = None, *, policy: LanePolicy | None = None,
               capacity: int | None = None, routes: Routes | None = None,
               corpus: Corpus | None = None, redis: str | None = None,
               local: str | None = None) -> Pool:
        """A new engine holding the schedule, URLs and failure log of checkpoint ``path``.

        ``routes`` set the intervals (and provenances) of the rows they match, as at ingest;
        ``corpus`` adds its new URLs (read with the same routes), as ``lanes add`` does. Files
        left under ``name`` by a supervisor that was killed are removed first; a pool whose
        supervisor is still running is refused.

        With ``redis`` (a URL) the checkpoint, whichever backend wrote it, becomes the new Redis
        queue ``name`` with its URLs (``engine.redis.urls.restore``), and the pool runs over it
        with its files in /dev/shm named ``local``; a queue that exists already is refused
        (``SegmentExists``: join it instead, or resume into another name).
        """
        options = options or PoolOptions()
        ck = checkpoint.read(path)
        urls = ck.urls
        if urls is None:
            raise EngineValueError(f"{path} holds no URLs: not a pool checkpoint")
        if routes is not None:
            interval, prov, _ = routes.apply(urls, ck.interval_s, ck.provenance)
            ck = replace(ck, interval_s=interval, provenance=prov.astype(np.int64))
        if redis is not None:
            pool = cls._on_redis(redis, name, render, options, local, policy, capacity, routes,
                                 None, resume=ck)
            try:
                restored = ck.extra.get("failures")
                if restored:
                    pool.failures.import_(restored, {u: r for r, u in enumerate(urls)})
                if corpus is not None:
                    pool.added = add_corpus(pool.engine, pool.urls, corpus)
            except BaseException:
                from ..redis.urls import RedisUrls

                made = cast("RedisEngine", pool.engine)  # ours, made just now: deleted again
                RedisUrls(made).drop()
                made.drop()
                pool.close()
                raise
            return pool
        if local is not None and local != name:
            raise EngineValueError("a local name is for pools on Redis: a pool on shared memory"
                                   " names its files after its engine")
        if capacity is None and corpus is not None:
            capacity = max(ck.capacity, 2 * (len(ck) + len(corpus)), GROWTH_ROOM)
        clear_stale(name)
        eng = Engine.from_checkpoint(ck, name, capacity=capacity, policy=policy)
        try:
            pool = cls._around(eng, urls, render, options, routes)
            restored = ck.extra.get("failures")
            if restored:
                pool.failures.import_(restored, {u: r for r, u in enumerate(urls)})
            if corpus is not None:
                pool.added = add_corpus(eng, pool.urls, corpus)
            return pool
        except BaseException:
            _remove(name, eng)
            raise

    @classmethod
    def join(cls, redis: str, name: str, render: RenderSpec, options: PoolOptions | None = None,
             *, local: str | None = None, policy: LanePolicy | None = None) -> Pool:
        """A pool over the existing Redis queue ``name`` at ``redis`` (another host's pool made
        it, or ``create`` did); ``SegmentMissing`` if there is none."""
        return cls._on_redis(redis, name, render, options or PoolOptions(), local, policy, None,
                             None, None)

    @classmethod
    def _on_redis(cls, redis: str, name: str, render: RenderSpec, options: PoolOptions,
                  local: str | None, policy: LanePolicy | None, capacity: int | None,
                  routes: Routes | None, corpus: tuple[Any, ...] | None,
                  resume: checkpoint.Checkpoint | None = None) -> Pool:
        """A pool over a Redis queue: its local files first (a clash with a running pool is
        found before Redis is touched), then the queue (made and filled when ``corpus`` is
        given, made from checkpoint ``resume`` when given). Nothing is left on this host if it
        fails; a queue that existed before is never dropped."""
        from ..redis.urls import RedisUrls, restore
        from .grow import add_to_redis

        if options.time_scale != 1.0:
            raise EngineValueError("a pool on Redis runs on the server's clock: time_scale"
                                   " must be 1")
        local = local or name
        _clear_stale_local(local)
        board, failures = _local_files(local, options)
        eng: RedisEngine | None = None
        try:
            if resume is not None:
                eng, table = restore(resume, redis, name, policy, capacity)
            else:
                try:
                    # Not create=True first: that would also replace another version of the
                    # function library under the pools of other hosts (RedisEngine.connect).
                    eng = Engine.connect(redis, name, policy)
                except SegmentMissing as e:
                    if corpus is None:
                        raise SegmentMissing(f"{e}: start the first pool with --corpus FILE,"
                                             " which creates it") from None
                    eng = Engine.connect(redis, name, policy, create=True, capacity=capacity)
                table = RedisUrls(eng)
            added = add_to_redis(table, *corpus) if corpus is not None else None
            if routes is not None:
                table.store_routes(routes.to_json())
            pool = cls(eng, table, board, failures, render, options, local=local, redis=redis)
            pool.added = added
            return pool
        except BaseException:
            board.close()
            failures.close()
            if eng is not None:
                eng.close()
            remove_local_files(local)
            raise

    @classmethod
    def _around(cls, eng: Engine, urls: list[str], render: RenderSpec, options: PoolOptions,
                routes: Routes | None) -> Pool:
        """The pool's files around a filled engine (all of them removed if one fails)."""
        name = eng.name
        table: UrlTable | None = None
        try:
            table = UrlTable.create(name, urls)
            board, failures = _local_files(name, options)
            store_routes(name, routes)
        except BaseException:
            if table is not None:
                table.close()
            remove_pool_files(name)  # the caller removes the engine
            raise
        return cls(eng, table, board, failures, render, options)

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        o = self.options
        spec = WorkerSpec(self.engine.name, self.render, o.batch, o.lease_s, o.idle_s,
                          dict(o.env), o.max_failures, _polite(o), self.local, self.redis)
        self._spec = spec
        for i in range(self.options.workers):
            self._start_worker(i)

    def _start_worker(self, i: int) -> None:
        p = self._ctx.Process(target=worker_main, args=(self._spec, i), name=f"lanes-worker-{i}",
                              daemon=True)
        p.start()
        self._procs[i] = p
        self._started[i] = time.monotonic()

    def run(self, seconds: float | None = None, until: Callable[[], bool] | None = None,
            on_tick: Callable[[Pool], None] | None = None, tick_s: float = 0.25) -> dict[str, Any]:
        """Run until SIGINT/SIGTERM, ``seconds`` elapsed or ``until()`` holds; then shut down.

        Returns the summary (see ``summary``). Signal handlers are installed only while it runs,
        and only when called from the main thread.
        """
        if seconds is not None and (not is_number(seconds) or not 0 <= seconds < 1e9):
            raise EngineValueError(f"seconds must be a number >= 0, got {seconds!r}")
        old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[int(sig)] = signal.signal(sig, self._on_signal)
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            self.start()
            while self._stop_signal is None:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if until is not None and until():
                    break
                self.supervise()
                if on_tick is not None:
                    on_tick(self)
                time.sleep(tick_s)
            return self.shutdown()
        finally:
            try:
                if not self._closed:
                    self.shutdown()
            finally:
                for signum, handler in old.items():
                    signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_signal is not None:
            self._hurry = True  # the operator asked twice: kill the workers now
        self._stop_signal = signum

    def supervise(self) -> None:
        """Restart dead workers (reclaiming their leases at once); checkpoint when due."""
        now = time.monotonic()
        dead = [i for i, p in enumerate(self._procs) if p is not None and not p.is_alive()]
        if dead and not self.board.stopping:
            self._reap()  # the dead workers' leases are claimable from here on
            for i in dead:
                self._procs[i].join()
                self._procs[i] = None
                # A worker that dies young (a render module that fails to import...) is
                # restarted after a growing pause instead of in a tight loop.
                young = now - self._started[i] < 1.0
                self._backoff[i] = min(5.0, 2 * self._backoff[i] or 0.1) if young else 0.0
                self._restart_at[i] = now + self._backoff[i]
        for i, p in enumerate(self._procs):
            if p is None and not self.board.stopping and now >= self._restart_at[i]:
                self.board.note_restart()
                self._start_worker(i)
        if self.refresh is not None:
            self.refresh.tick()
        if (self.options.checkpoint is not None and time.monotonic() - self._last_checkpoint
                >= self.options.checkpoint_every_s):
            self.checkpoint()

    def _reap(self) -> None:
        """Reclaim the leases of dead workers. On Redis a server out of reach is no reason to
        stop the pool: those leases come back when they expire."""
        try:
            self.engine.reap()
        except EngineError as e:
            if self.redis is None:
                raise
            log.warning("cannot reclaim the leases of dead workers now (they come back when"
                        " they expire): %s", e)

    def checkpoint(self) -> int:
        """Save the schedule and URLs now (atomically); returns the rows saved."""
        if self.options.checkpoint is None:
            raise EngineValueError("this pool has no checkpoint path")
        try:
            # The URLs are read after the rows (a callable): rows another host or `lanes add`
            # adds meanwhile come with their URLs, never after them.
            n = checkpoint.save(self.engine, self.options.checkpoint, self.urls.urls,
                                {"failures": self.failures.export()})
        except OSError as e:
            raise EngineError(f"cannot write checkpoint {self.options.checkpoint}: {e}") from None
        self._last_checkpoint = time.monotonic()
        self.board.note_checkpoint(wall_ms())
        return n

    def shutdown(self) -> dict[str, Any]:
        """Stop claiming, give workers the grace period, reclaim, checkpoint, remove the files.

        The files are removed even if the last checkpoint fails (its error is raised after)."""
        if self._closed:
            return self._summary
        try:
            self.board.request_stop()
            deadline = time.monotonic() + self.options.grace_s
            for p in self._procs:
                while p is not None and p.is_alive() and not self._hurry:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    p.join(min(0.05, left))  # short waits, so a second signal cuts in
            killed = self._kill_workers()
            self._reap()  # leases of killed workers, and of any that died holding one
            if self.options.checkpoint is not None:
                self.checkpoint()
            self._summary = self.summary()
            self._summary["killed_at_shutdown"] = killed
            self._summary["stop_signal"] = (signal.Signals(self._stop_signal).name
                                            if self._stop_signal is not None else None)
        finally:
            self.close()
        return self._summary

    def _kill_workers(self) -> int:
        """SIGKILL the workers still running, and the commands they started; returns how many."""
        killed = 0
        for p in self._procs:
            if p is not None and p.is_alive():
                try:
                    children = psutil.Process(p.pid).children(recursive=True)
                except psutil.Error:
                    children = []
                p.kill()
                for c in children:  # a render command would outlive its worker otherwise
                    with contextlib.suppress(psutil.Error):
                        c.kill()
                p.join()
                killed += 1
        return killed

    def summary(self) -> dict[str, Any]:
        """Pool counters (board), per-lane engine statistics and the pool's clock."""
        stats = self.engine.stats(now_ms=self.clock.now_ms())
        totals = self.board.totals()
        lanes = []
        for lane in stats["lanes"]:
            i = lane["lane"]
            n = int(totals["lane_renders"][i]) if i < len(totals["lane_renders"]) else 0
            lanes.append({**lane, "renders": n,
                          "mean_age_over_ttl": float(totals["lane_age_sum"][i]) / n if n else None})
        board = {k: v for k, v in totals.items() if k not in ("lane_renders", "lane_age_sum")}
        return {"name": self.engine.name, "workers": self.options.workers,
                "virtual_now_ms": self.clock.now_ms(), "time_scale": self.clock.scale,
                "rows": stats["rows"], "queued": stats["queued"], **board, "lanes": lanes,
                "problems": self.engine.verify()}

    def close(self) -> None:
        """Remove the engine's segment, URL table and board (the supervisor's job). On Redis
        only this host's files go: the queue is every pool's."""
        if self._closed:
            return
        self._closed = True
        if self.refresh is not None:
            self.refresh.close()
        self._kill_workers()
        self.urls.close()
        self.board.close()
        self.failures.close()
        if isinstance(self.engine, Engine):
            _remove(self.engine.name, self.engine)
        else:
            self.engine.close()
            remove_local_files(self.local)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.shutdown()


def _remove(name: str, eng: Engine | None = None) -> None:
    """Unlink an engine's segment and its pool files; missing ones are fine."""
    if eng is not None:
        eng.close()
    remove_pool_files(name)
    try:
        Segment.unlink(name)
    except SegmentMissing:
        pass


def _local_files(local: str, options: PoolOptions) -> tuple[Board, FailureLog]:
    """The files every pool keeps on its host: board, failure log, host gate (if polite)."""
    clock = Clock.wall(options.time_scale)
    board = Board.create(local, options.workers, clock, os.getpid(), process_start_ms())
    try:
        failures = FailureLog.create(local)
        if _polite(options):
            HostGate.create(local, options.per_host, options.delay_ms).close()
    except BaseException:
        board.close()
        remove_local_files(local)
        raise
    return board, failures


LOCAL_FILES = (("pool", Board.unlink), ("failures", FailureLog.unlink), ("hosts", HostGate.unlink))
"""The files a pool keeps on its host whatever its backend (on Redis, all it keeps there)."""


def remove_local_files(local: str) -> list[str]:
    """Remove a pool's files on this host (``LOCAL_FILES``); returns those removed."""
    return [f"/dev/shm/{local}.{what}" for what, unlink in LOCAL_FILES if unlink(local)]


def _clear_stale_local(local: str) -> None:
    """Remove the local files a killed pool on Redis left under ``local``; refuse if its
    supervisor still runs (two pools on one host need two local names)."""
    if not os.path.exists(Board.path(local)):
        return
    pid = supervisor_running(local)
    if pid is not None:
        raise SegmentExists(f"a pool with local name {local!r} runs on this host (supervisor pid"
                            f" {pid}): give this one another --local-name")
    remove_local_files(local)


def remove_pool_files(name: str) -> list[str]:
    """Remove the files a pool keeps beside engine ``name``'s segment; returns those removed."""
    files = (("urls", UrlTable.unlink), *LOCAL_FILES, ("routes", unlink_routes))
    return [f"/dev/shm/{name}.{what}" for what, unlink in files if unlink(name)]


def _polite(options: PoolOptions) -> bool:
    return options.per_host is not None or options.delay_ms > 0


def _create_engine(name: str, capacity: int, policy: LanePolicy | None) -> Engine:
    """``Engine.create``, with a hint of what to do when the name is taken."""
    try:
        return Engine.create(name, capacity, policy)
    except SegmentExists:
        pid = supervisor_running(name)
        if pid is not None:
            raise SegmentExists(f"a pool over {name!r} is running (supervisor pid {pid})"
                                ) from None
        raise SegmentExists(f"engine {name!r} already exists: left by a pool that crashed (go on"
                            f" from its checkpoint with `lanes pool {name} --resume --checkpoint"
                            f" FILE`) or by another program (`lanes cleanup {name}` removes it)"
                            ) from None


def supervisor_running(name: str) -> int | None:
    """The pid of the running supervisor of pool ``name``, or None (no board, or a dead one)."""
    try:
        board = Board.attach(name)
    except SegmentMissing:
        return None
    except LayoutMismatch:
        return None  # not a board we wrote: nobody runs it
    pid, start = board.supervisor
    board.close()
    return pid if is_running(pid, start) else None


def clear_stale(name: str) -> bool:
    """Remove what a killed supervisor left under ``name``; refuse if it is still running.

    Returns True when something was removed.
    """
    if not os.path.exists(Board.path(name)):
        if os.path.exists(f"/dev/shm/{name}"):
            raise SegmentExists(f"engine {name!r} exists and is not a pool's (lanes cleanup"
                                f" {name} removes it)")
        return UrlTable.unlink(name)  # an orphan from a supervisor killed while starting
    pid = supervisor_running(name)
    if pid is not None:
        raise SegmentExists(f"a pool over {name!r} is running (supervisor pid {pid})")
    _remove(name)
    return True
