"""``lanes serve``: one aiohttp server for the dashboard, its API, /metrics and the snapshots.

What it serves depends on what it is given (:class:`ServeOptions`):

* with NAME, the pool's dashboard (``engine.serve.dashboard.add_routes``) and its metrics;
* with ``--store DIR``, the snapshot routes (``engine.serve.snapshots``) and the staleness
  metrics;
* always ``/metrics`` (Prometheus) and ``/healthz``; with a token, ``/login`` and ``/logout``.

A refused start leaves nothing behind: the options, the binding rule and the token file are
checked before anything is bound; a store or a pool that cannot be opened stops the server
before it announces itself (and a store directory made by the failed open is removed).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiohttp import web

from ..checks import is_int
from ..errors import EngineValueError
from ..store import open_store
from ..store.api import Store, StoreSpec
from . import DEFAULT_PORT as DEFAULT_PORT  # the command line's help reads it there
from . import auth, crawlers, discover, door, origin, recache
from .snapshots import HitLog, SnapshotRoutes
from .source import PoolSource

T = TypeVar("T")

SOURCE_KEY: Final = web.AppKey("source", PoolSource)
STORE_KEY: Final = web.AppKey("store", Store)


@dataclass(frozen=True)
class ServeOptions:
    """What ``lanes serve`` was asked for; :meth:`check` refuses a bad combination."""

    name: str | None = None
    store: str | None = None
    redis: str | None = None
    store_endpoint: str | None = None
    local: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    read_only: bool = False
    token_file: str | None = None
    max_stale: float | None = None
    processes: int = 1
    allowed_hosts: tuple[str, ...] = ()
    trust_proxy: tuple[str, ...] = ()
    limits: door.Limits = door.Limits()
    origin_timeout: float = 10.0
    origin_per_host: int = 8
    discover: bool = False
    discover_rate: int = 60
    discover_max: int = 100_000
    render_on_miss: float = 0.0

    def check(self) -> None:
        if self.name is None and self.store is None:
            raise EngineValueError("nothing to serve: give a pool NAME (the dashboard) or"
                                   " --store DIR (the snapshots), or both")
        spec = self.store_spec()
        shared = spec is not None and spec.shared
        if self.name is None and (self.local is not None or self.redis is not None and not shared):
            raise EngineValueError("--redis and --local-name name a pool: give its NAME (or"
                                   " --store s3://..., whose pointers --redis holds)")
        if spec is not None:
            spec.check()
        if not is_int(self.port) or not 0 <= self.port <= 65535:
            raise EngineValueError(f"--port must lie in [0, 65535], got {self.port!r}")
        if self.max_stale is not None and (self.store is None or not math.isfinite(
                self.max_stale) or self.max_stale <= 0):
            raise EngineValueError("--max-stale F needs --store and a number > 0 (a snapshot"
                                   f" older than F x its interval is refused), got"
                                   f" {self.max_stale!r}")
        if not is_int(self.processes) or not 1 <= self.processes <= 64:
            raise EngineValueError(f"--processes must lie in [1, 64], got {self.processes!r}")
        auth.check_binding(self.host, self.token_file)
        self.limits.check()
        if self.discover and (self.name is None or self.store is None):
            raise EngineValueError("--discover adds missed pages to a pool: give its NAME and"
                                   " --store DIR")
        if self.render_on_miss and (not self.discover or not 0 < self.render_on_miss <= 60):
            raise EngineValueError("--render-on-miss S rushes a missed page, which --discover"
                                   " adds: give --discover, and S in (0, 60] seconds")
        if not 1 <= self.discover_rate <= 1_000_000 or not 0 <= self.discover_max:
            raise EngineValueError("--discover-rate must lie in [1, 1000000] a minute and"
                                   " --discover-max be >= 0")
        if not 0 < self.origin_timeout <= 600 or not 1 <= self.origin_per_host <= 1024:
            raise EngineValueError("--origin-timeout must lie in (0, 600] s and"
                                   " --origin-per-host in [1, 1024]")
        self.front_door()  # refuses a bad --allowed-host or --trust-proxy

    def store_spec(self) -> StoreSpec | None:
        """The store to serve (``--store``, ``--store-endpoint``, ``--redis``), or None."""
        if self.store is None:
            return None
        return StoreSpec(self.store, self.store_endpoint, self.redis)

    def front_door(self) -> door.Door:
        """A server process's front door (each process makes its own: it counts connections)."""
        return door.Door(self.limits, door.networks(self.trust_proxy),
                         door.host_names(self.host, self.allowed_hosts))


@dataclass
class Parts:
    """What one server process opened, and closes at its end. The snapshot routes read
    ``store`` on the event loop; everything slow (the dashboard's figures, ``/metrics``) runs on
    the pool source's thread, or without a pool on ``slow``, and reads the store through
    ``figures``, a connection of its own, so a long read never holds the routes' lock."""

    source: PoolSource | None
    store: Store | None
    figures: Store | None
    hits: HitLog | None
    slow: ThreadPoolExecutor

    async def call(self, fn: Callable[[], T]) -> T:
        if self.source is not None:
            return await self.source.call(fn)
        return await asyncio.get_running_loop().run_in_executor(self.slow, fn)

    def close(self) -> None:
        self.slow.shutdown(wait=True)
        if self.source is not None:
            self.source.close()
        for store in (self.store, self.figures):
            if store is not None:
                store.close()


def open_parts(options: ServeOptions) -> Parts:
    """The stores and the pool source of one server process (after any fork)."""
    opened: list[Any] = []
    try:
        store = figures = None
        spec = options.store_spec()
        if spec is not None:
            store = open_store(spec)
            opened.append(store)
            figures = open_store(store.spec, create=False)
            opened.append(figures)
        source = None
        if options.name is not None:
            source = PoolSource(options.name, redis=options.redis, local=options.local,
                                store=figures)
            opened.append(source)
        hits = None if store is None else HitLog(store.spec)
    except BaseException:
        for part in reversed(opened):
            part.close()
        raise
    return Parts(source, store, figures, hits,
                 ThreadPoolExecutor(1, thread_name_prefix="lanes-serve-slow"))


def build_app(options: ServeOptions, guard: auth.Auth, parts: Parts,
              front: door.Door | None = None) -> web.Application:
    """The application: middleware (the front door's, then the token's), the server's own
    routes, the snapshot routes (with a store) and the dashboard's (with a pool)."""
    front = options.front_door() if front is None else front
    app = web.Application(middlewares=[door.front(front), auth.middleware(guard)],
                          client_max_size=options.limits.body_bytes)
    if guard.token is not None:
        auth.add_login_routes(app, guard)
    app.router.add_get("/healthz", _healthz, name="healthz")
    counts: dict[str, Any] = {"door": front.refused, "throttle": guard.throttle}
    app.router.add_get("/metrics", _metrics_handler(parts, counts), name="metrics")
    snapshots = None
    if parts.store is not None and parts.hits is not None:
        app[STORE_KEY] = parts.store
        relay = None if parts.source is None else origin.relay_for(
            parts.source, options.origin_timeout, options.origin_per_host)
        found = None
        if options.discover and parts.source is not None:
            found = discover.Discovery(parts.source, options.discover_rate, options.discover_max)
        snapshots = SnapshotRoutes(parts.store, parts.hits, options.max_stale, relay, found,
                                   options.render_on_miss)
        snapshots.add_to(app)
        routes = snapshots
        _serve_counts(app, counts, relay, found)
        hits = parts.hits

        async def start_hits(app: web.Application) -> None:
            hits.start()

        async def stop_hits(app: web.Application) -> None:
            await hits.close()
            routes.close()

        app.on_startup.append(start_hits)
        app.on_cleanup.append(stop_hits)
    if parts.source is not None:
        from . import dashboard  # the hook: engine/serve/__init__.py

        app[SOURCE_KEY] = parts.source
        dashboard.add_routes(app, parts.source, read_only=options.read_only)
        recache.add_routes(app, parts.source, guard, options.read_only,
                           snapshots.forget if snapshots is not None else lambda urls: None)
    elif parts.store is not None:
        app.router.add_get("/", _store_index, name="index")
    return app


def _serve_counts(app: web.Application, counts: dict[str, Any], relay: origin.Relay | None,
                  found: discover.Discovery | None) -> None:
    """The relay's and discovery's counts joined to ``counts`` (``/metrics``); both started
    and stopped with the app."""
    counts.update(relay=None if relay is None else relay.counts,
                  discovery=None if found is None else found.counts)

    async def start(app: web.Application) -> None:
        if found is not None:
            found.start()

    async def stop(app: web.Application) -> None:
        if found is not None:
            await found.close()
        if relay is not None:
            await relay.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _store_index(request: web.Request) -> web.Response:
    return web.Response(text="lanes serve: snapshots at /render?url=URL and /URL; metrics at"
                             " /metrics\n")


class ServeCounts:
    """``/metrics``: what this server process refused (``lanes_serve_refused_total{reason}``),
    answered from the origin (``lanes_serve_origin_answers_total{outcome}``) and discovered
    (``lanes_serve_discovery_total{outcome}``). Per process: with ``--processes N`` a scrape
    reads the one it reaches."""

    def __init__(self, counts: dict[str, Any]) -> None:
        self.counts = counts

    def collect(self) -> Any:
        from prometheus_client import core

        refused = core.CounterMetricFamily("lanes_serve_refused", "requests and connections"
                                           " refused by this server process", labels=["reason"])
        for reason, n in self.counts["door"].items():
            refused.add_metric([reason], n)
        refused.add_metric(["throttled_guess"], self.counts["throttle"].refused)
        yield refused
        for key, metric, help_ in (("relay", "lanes_serve_origin_answers", "misses answered"
                                    " with the origin's response, by outcome"),
                                   ("discovery", "lanes_serve_discovery", "missed URLs offered"
                                    " for discovery, by outcome")):
            found = self.counts.get(key)
            if found is not None:
                c = core.CounterMetricFamily(metric, help_, labels=["outcome"])
                for outcome, n in sorted(found.items()):
                    if not outcome.startswith("failed: "):
                        c.add_metric([outcome], n)
                yield c


def _metrics_handler(parts: Parts, counts: dict[str, Any]) -> Callable[[web.Request], Any]:
    """``/metrics``: the pool's metrics and the store's staleness, computed off the event
    loop; one registry per server process, so the staleness figures are cached across
    scrapes (``STALENESS_EVERY_S``)."""
    from ..report.metrics import generate, registry

    made: list[Any] = []

    def exposition() -> str:
        if not made:
            source = parts.source
            made.append(registry(None if source is None else source.engine,
                                 None if source is None else source.local, parts.figures,
                                 None if source is None else source.routes()))
            if parts.figures is not None:
                made[0].register(crawlers.Collector(parts.figures))
            made[0].register(ServeCounts(counts))
        return generate(made[0])

    async def metrics(request: web.Request) -> web.Response:
        text = await parts.call(exposition)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    return metrics


# -- running ----------------------------------------------------------------------------------

def run(options: ServeOptions, *, seconds: float | None = None,
        announce: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or ``seconds``); ``announce`` gets the base URL once bound."""
    options.check()
    token = None if options.token_file is None else auth.read_token(options.token_file)
    guard = auth.Auth(token, read_only=options.read_only, token_file=options.token_file)
    sock = bind(options.host, options.port, reuse_port=options.processes > 1)
    try:
        base = _base_url(options.host, sock.getsockname()[1])
        children = _fork_workers(options, guard, sock, options.processes - 1)
        try:
            parts = open_parts(options)  # a store or pool that cannot be opened stops us here
            if parts.store is not None and parts.store.created:
                print(f"lanes serve: {parts.store.address} held no snapshot store: made an"
                      " empty one (every URL is a 404 until a pool renders into it)",
                      file=sys.stderr, flush=True)
            if announce is not None:
                announce(base)
            asyncio.run(_serve(options, guard, sock, parts, seconds))
        finally:
            _stop_workers(children)
    finally:
        sock.close()


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket on ``host:port`` (``reuse_port``: shared by forked processes)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EngineValueError(f"cannot bind {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise EngineValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.setblocking(False)
    return sock


def _base_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


async def _serve(options: ServeOptions, guard: auth.Auth, sock: socket.socket, parts: Parts,
                 seconds: float | None) -> None:
    try:
        front = options.front_door()
        runner = web.AppRunner(build_app(options, guard, parts, front), access_log=None,
                               handle_signals=False, keepalive_timeout=options.limits.idle_s,
                               logger=door.QuietLog())
        await runner.setup()
        try:
            await door.GuardedSite(runner, sock, front).start()
            await _until_stopped(seconds)
        finally:
            await runner.cleanup()
    finally:
        parts.close()


async def _until_stopped(seconds: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _fork_workers(options: ServeOptions, guard: auth.Auth, sock: socket.socket,
                  n: int) -> list[int]:
    """``n`` more server processes, each with a socket of its own on the same port
    (SO_REUSEPORT: the kernel spreads new connections over them evenly) and its own store
    and pool source, opened after the fork."""
    children: list[int] = []
    port = sock.getsockname()[1]
    for _ in range(n):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sock.close()
                own = bind(options.host, port, reuse_port=True)
                asyncio.run(_serve(options, guard, own, open_parts(options), None))
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    return children


def _stop_workers(children: list[int]) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
