"""The forked render pool: a supervisor and N workers over one engine.

Each worker (``worker``) claims rows, renders them (a callable, a command, or headless
Chromium with ``BrowserSpec``) and completes or fails each; it leads its own process group, so
everything it starts dies with it.

The supervisor owns the engine's segment and the pool's files beside it: the URL table, the
pool board, the failure log, the host gate and the routes (``remove_pool_files``). On Redis
(``redis=URL``: pools on several hosts share one queue, docs/redis.md) the queue, its URLs and
its routes live in Redis and outlive every pool; each host keeps only its local files (board,
failure log, host gate) under the pool's local name. It restarts a worker that dies, kills
that worker's process group at once (a render command or a browser it started must not
outlive it), reclaims the dead worker's leases at once (``Engine.reap``, ``RedisEngine.reap``),
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
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import checkpoint, factory
from ..api import QueueEngine, RowUrls
from ..checks import is_int, is_number, wall_ms
from ..corpus.model import Corpus
from ..corpus.routes import Routes
from ..corpus.variant_rows import with_variants
from ..errors import (
    EngineError,
    EngineValueError,
    LayoutMismatch,
    SegmentExists,
    SegmentMissing,
)
from ..policy import LanePolicy
from ..process import is_running, process_start_ms
from .board import Board, Clock
from .failures import FailureLog
from .grow import Added, add_corpus, add_urls, add_variant_rows, store_routes
from .heartbeat import HEARTBEAT_S
from .hosts import HostGate
from .render import RenderSpec
from .worker import WorkerSpec, worker_main

if TYPE_CHECKING:
    from .browser import BrowserSpec
    from .refresh import CorpusRefresh

    AnyRender = RenderSpec | BrowserSpec

START_METHODS = ("fork", "spawn", "forkserver")
GROWTH_ROOM = 100_000
"""A new pool's segment holds its corpus twice over and at least this many rows (about 50 bytes
a row), so ``lanes add`` has room; ``capacity=`` sets it exactly."""
log = logging.getLogger("engine.pool")


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
    heartbeat_s: float = HEARTBEAT_S
    """On Redis, each worker's heartbeat period (0: none); a dead host's rows come back within
    3.5 periods, where the lease is longer than 2.5 (engine/pool/heartbeat.py)."""

    def __post_init__(self) -> None:
        for what, v, lo, hi in (("workers", self.workers, 1, 1000), ("batch", self.batch, 1, 4096)):
            if not is_int(v) or not lo <= v <= hi:
                raise EngineValueError(f"{what} must be an int in [{lo}, {hi}], got {v!r}")
        for what, x in (("lease_s", self.lease_s), ("checkpoint_every_s", self.checkpoint_every_s),
                        ("idle_s", self.idle_s), ("time_scale", self.time_scale)):
            if not is_number(x) or not 1e-3 <= x < 1e9:
                raise EngineValueError(f"{what} must be a positive number, got {x!r}")
        if not is_number(self.heartbeat_s) or not 0 <= self.heartbeat_s <= 3600:
            raise EngineValueError(f"heartbeat_s must be a number in [0, 3600], got "
                                   f"{self.heartbeat_s!r}")
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


# -- the supervisor ----------------------------------------------------------------------------


class Pool:
    """A supervisor: owns the engine, its URL table and its board; runs the workers.

    On Redis (``redis`` set) it owns only its connection and its local files (``local``):
    the queue and its URLs belong to every pool that shares them."""

    def __init__(self, eng: QueueEngine, urls: RowUrls, board: Board, failures: FailureLog,
                 render: AnyRender, options: PoolOptions, *, local: str | None = None,
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
               render: AnyRender, options: PoolOptions | None = None, *,
               policy: LanePolicy | None = None, capacity: int | None = None,
               failures: Any = None, routes: Routes | None = None, redis: str | None = None,
               local: str | None = None, shards: int | None = None) -> Pool:
        """A new engine filled with a corpus (row ``r`` renders ``urls[r]``), with room for it
        to grow (``GROWTH_ROOM``) unless ``capacity`` is given. ``routes`` (the ones the corpus
        was read with) are kept for the rows ``lanes add`` adds later.

        With ``redis`` (a URL), the pool runs over Redis queue ``name`` instead, created if
        missing (with ``policy`` and ``capacity``, default ``MAX_ROWS``); the corpus's URLs not
        in it yet are added (``Pool.added`` says what happened), so the pool of every host
        starts with the same call. Its files in /dev/shm are named ``local`` (default
        ``name``): two pools on one host need two local names. ``shards``: the queue is (or is
        made) over that many shards (docs/redis.md "Shards")."""
        options = options or PoolOptions()
        n = len(urls)
        if n == 0:
            raise EngineValueError("the corpus is empty: nothing to render")
        for what, col in (("due_ms", due_ms), ("interval_s", interval_s),
                          ("provenance", provenance), ("failures", failures)):
            if col is not None and np.ndim(col) == 1 and len(col) != n:
                raise EngineValueError(f"{what} has {len(col)} entries for {n} URLs")
        # A route naming two variants: a row per further variant, after the URLs' own rows.
        urls, (due_ms, interval_s, provenance, failures) = with_variants(
            urls, routes, due_ms, interval_s, provenance, failures)
        n = len(urls)
        if redis is not None:
            return cls._on_redis(redis, name, render, options, local, policy, capacity, routes,
                                 (urls, due_ms, interval_s, provenance, failures),
                                 shards=shards)
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
    def resume(cls, name: str, path: str, render: AnyRender,
               options: PoolOptions | None = None, *, policy: LanePolicy | None = None,
               capacity: int | None = None, routes: Routes | None = None,
               corpus: Corpus | None = None, redis: str | None = None,
               local: str | None = None, shards: int | None = None) -> Pool:
        """A new engine holding the schedule, URLs and failure log of checkpoint ``path``.

        ``routes`` set the intervals (and provenances) of the rows they match, as at ingest;
        ``corpus`` adds its new URLs (read with the same routes), as ``lanes add`` does. Files
        left under ``name`` by a supervisor that was killed are removed first; a pool whose
        supervisor is still running is refused.

        With ``redis`` (a URL) the checkpoint, whichever backend wrote it, becomes the new Redis
        queue ``name`` with its URLs (``engine.factory.restore``), and the pool runs over it
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
                                 None, resume=ck, shards=shards)
            try:
                restored = ck.extra.get("failures")
                if restored:
                    # the rows the URLs have now (over shards, not their saved order)
                    pool.failures.import_(restored, {u: r for r, u in
                                                     enumerate(pool.urls.urls()) if u})
                add_variant_rows(pool.urls, urls, routes, ck.due_ms, ck.interval_s,
                                 ck.provenance)
                if corpus is not None:
                    pool.added = add_corpus(pool.engine, pool.urls, corpus, routes)
            except BaseException:
                pool.urls.drop()  # ours, made just now: deleted again
                pool.engine.unlink()
                pool.close()
                raise
            return pool
        if local is not None and local != name:
            raise EngineValueError("a local name is for pools on Redis: a pool on shared memory"
                                   " names its files after its engine")
        if capacity is None and corpus is not None:
            capacity = max(ck.capacity, 2 * (len(ck) + len(corpus)), GROWTH_ROOM)
        clear_stale(name)
        eng, _ = factory.restore(ck, name, capacity=capacity, policy=policy)
        try:
            pool = cls._around(eng, urls, render, options, routes)
            restored = ck.extra.get("failures")
            if restored:
                pool.failures.import_(restored, {u: r for r, u in enumerate(urls)})
            add_variant_rows(pool.urls, urls, routes, ck.due_ms, ck.interval_s, ck.provenance)
            if corpus is not None:
                pool.added = add_corpus(eng, pool.urls, corpus, routes)
            return pool
        except BaseException:
            _remove(name, eng)
            raise

    @classmethod
    def join(cls, redis: str, name: str, render: AnyRender, options: PoolOptions | None = None,
             *, local: str | None = None, policy: LanePolicy | None = None,
             shards: int | None = None) -> Pool:
        """A pool over the existing Redis queue ``name`` at ``redis`` (another host's pool made
        it, or ``create`` did); ``SegmentMissing`` if there is none. ``shards``: the count it
        must have (None: as it is)."""
        return cls._on_redis(redis, name, render, options or PoolOptions(), local, policy, None,
                             None, None, shards=shards)

    @classmethod
    def _on_redis(cls, redis: str, name: str, render: AnyRender, options: PoolOptions,
                  local: str | None, policy: LanePolicy | None, capacity: int | None,
                  routes: Routes | None, corpus: tuple[Any, ...] | None,
                  resume: checkpoint.Checkpoint | None = None,
                  shards: int | None = None) -> Pool:
        """A pool over a Redis queue: its local files first (a clash with a running pool is
        found before Redis is touched), then the queue (made and filled when ``corpus`` is
        given, made from checkpoint ``resume`` when given). Nothing is left on this host if it
        fails; a queue that existed before is never dropped."""
        if options.time_scale != 1.0:
            raise EngineValueError("a pool on Redis runs on the server's clock: time_scale"
                                   " must be 1")
        local = local or name
        _clear_stale_local(local)
        board, failures = _local_files(local, options)
        eng: QueueEngine | None = None
        try:
            if resume is not None:
                eng, _ = factory.restore(resume, name, redis, capacity=capacity, policy=policy,
                                         shards=shards)
            else:
                try:
                    # Not create=True first: that would also replace another version of the
                    # function library under the pools of other hosts (RedisEngine.connect).
                    eng = factory.open(name, redis, policy=policy, shards=shards)
                except SegmentMissing as e:
                    if corpus is None:
                        raise SegmentMissing(f"{e}: start the first pool with --corpus FILE,"
                                             " which creates it") from None
                    eng = factory.open(name, redis, create=True, capacity=capacity,
                                       policy=policy, shards=shards)
            table = eng.row_urls()
            added = add_urls(table, *corpus) if corpus is not None else None
            store_routes(table, routes)
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
    def _around(cls, eng: QueueEngine, urls: list[str], render: AnyRender, options: PoolOptions,
                routes: Routes | None) -> Pool:
        """The pool's files around a filled engine (all of them removed if one fails)."""
        name = eng.name
        table: RowUrls | None = None
        try:
            table = factory.publish_urls(eng, urls)
            board, failures = _local_files(name, options)
            store_routes(table, routes)
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
                          dict(o.env), o.max_failures, _polite(o), self.local, self.redis,
                          o.heartbeat_s)
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
                _kill_group(self._procs[i].pid)
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
            if not self.engine.spans_hosts:
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
        """SIGKILL the workers still running and everything they started (their process
        groups: render commands, browsers); returns how many workers were killed."""
        killed = 0
        for i, p in enumerate(self._procs):
            if p is None:
                continue
            alive = p.is_alive()
            _kill_group(p.pid)  # the worker leads it: killed with everything it started
            if alive:
                p.kill()  # in case it was killed before it made its group
                killed += 1
            p.join()
            self._procs[i] = None
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
        if not self.engine.spans_hosts:  # the queue is this pool's alone
            _remove(self.engine.name, self.engine)
        else:
            self.engine.close()
            remove_local_files(self.local)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.shutdown()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group worker ``pid`` leads (it calls setpgid first thing). No
    group: the worker died before it made one, so it started nothing."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _remove(name: str, eng: QueueEngine | None = None) -> None:
    """Unlink an engine's segment and its pool files; missing ones are fine."""
    if eng is not None:
        eng.close()
    remove_pool_files(name)
    factory.unlink(name)


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
    files = (("urls", factory.unlink_urls), *LOCAL_FILES, ("routes", factory.unlink_routes))
    return [f"/dev/shm/{name}.{what}" for what, unlink in files if unlink(name)]


def _polite(options: PoolOptions) -> bool:
    return options.per_host is not None or options.delay_ms > 0


def _create_engine(name: str, capacity: int, policy: LanePolicy | None) -> QueueEngine:
    """A new shared-memory engine, with a hint of what to do when the name is taken."""
    try:
        return factory.open(name, create=True, capacity=capacity, policy=policy)
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
        return factory.unlink_urls(name)  # an orphan from a supervisor killed while starting
    pid = supervisor_running(name)
    if pid is not None:
        raise SegmentExists(f"a pool over {name!r} is running (supervisor pid {pid})")
    _remove(name)
    return True
