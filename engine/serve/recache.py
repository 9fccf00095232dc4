"""The loop's one operation: prioritize pages by URL, by list or by scope.

Why this module exists: a site changes a page and must say so; an operator wants a section
re-rendered now, or dropped until the normal cadence comes back to it. Cache-clearing tricks
(deleting files, restarting) are what prerender's users do without it. One operation serves
every caller: ``POST /api/prioritize`` (a CMS, the dashboard), prerender.io's ``POST /recache``
(the CMS plugins that exist), and ``lanes prioritize --url | --urls | --scope``.

What is asked (:class:`Ask`) is checked whole before anything changes: a malformed URL, a host
the pool does not render, an unknown mode or route, more than ``MAX_URLS`` URLs is refused with
the reason and changes nothing. Then (:func:`prioritize`, on the pool source's thread):

* the rows of the named pages are found (a list: ``find_many``, one ``HMGET`` a thousand on
  Redis; ``route:NAME``: the URLs under the route's literal prefix, matched against the routes;
  a prefix ``https://host/path*``: the URL table's ``prioritize_prefix``, which a Redis queue
  answers on its server from a sorted index of its URLs, so a million rows take no URL over the
  wire, or ``find_prefix`` when the snapshots go first);
* ``rush`` puts them in the urgent lane, due now (capped by the policy's urgent share; the
  current snapshot is served until the new one lands); ``wait`` makes them due now in their own
  lane; ``clear-and-rush`` and ``clear-and-wait`` first drop their snapshots from the store, so
  a crawler gets the origin's own answer until a render lands;
* a listed URL the pool does not know is added (submitted, its route's interval) when ``add``
  is set, and otherwise reported in ``unknown``.

A URL whose route names two variants has two rows (``engine.corpus.variant_rows``), both found
by its URL or a scope and both acted on; ``matched`` and ``added`` count rows.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
from aiohttp import web

from ..corpus import variant_rows
from ..corpus.model import Corpus
from ..corpus.routes import Routes
from ..corpus.urlnorm import normalize_url, origin_of
from ..errors import EngineError, EngineValueError
from ..store.api import Store
from .auth import Auth
from .source import PoolSource

MODES: Final = ("rush", "wait", "clear-and-rush", "clear-and-wait")
MAX_URLS: Final = 10_000
SHOWN_UNKNOWN: Final = 100
DEFAULT_INTERVAL_S: Final = 86_400
"""The interval of a page added by ``"add": true`` when the pool has no routes."""


@dataclass(frozen=True)
class Ask:
    """What to prioritize: ``urls`` (normalised) or ``scope`` (``prefix`` or ``route``)."""

    mode: str = "rush"
    urls: tuple[str, ...] = ()
    prefix: str | None = None
    route: str | None = None
    add: bool = False

    @classmethod
    def of(cls, body: object) -> Ask:
        """An ask from a JSON body (``url`` | ``urls`` | ``scope``, ``mode``, ``add``)."""
        if not isinstance(body, dict):
            raise EngineValueError("the body must be a JSON object with url, urls or scope")
        unknown = sorted(set(body) - {"url", "urls", "scope", "mode", "add", "prerenderToken"})
        if unknown:
            raise EngineValueError(f"unknown field(s): {', '.join(map(str, unknown))[:200]}")
        given = [k for k in ("url", "urls", "scope") if k in body]
        if len(given) != 1:
            raise EngineValueError("give exactly one of url, urls (a list) or scope")
        mode = body.get("mode", "rush")
        if mode not in MODES:
            raise EngineValueError(f"mode must be one of {', '.join(MODES)}, got"
                                   f" {str(mode)[:50]!r}")
        add = body.get("add", False)
        if not isinstance(add, bool):
            raise EngineValueError("add must be true or false")
        if given == ["scope"]:
            return cls.scoped(body["scope"], mode, add)
        urls = [body["url"]] if given == ["url"] else body["urls"]
        return cls.listed(urls, mode, add)

    @classmethod
    def listed(cls, urls: object, mode: str = "rush", add: bool = False) -> Ask:
        if not isinstance(urls, list) or not urls:
            raise EngineValueError("urls must be a non-empty list of URLs")
        if len(urls) > MAX_URLS:
            raise EngineValueError(f"{len(urls):,} URLs: at most {MAX_URLS:,} a request")
        out = []
        for i, url in enumerate(urls):
            if not isinstance(url, str):
                raise EngineValueError(f"urls[{i}] is not a string")
            try:
                out.append(normalize_url(url.strip()))
            except EngineError as e:
                raise EngineValueError(f"urls[{i}]: {str(e)[:300]}") from None
        return cls(mode=mode, urls=tuple(dict.fromkeys(out)), add=add)

    @classmethod
    def scoped(cls, scope: object, mode: str = "rush", add: bool = False) -> Ask:
        if not isinstance(scope, str):
            raise EngineValueError("scope must be a string: https://host/prefix* or route:NAME")
        if scope.startswith("route:"):
            return cls(mode=mode, route=scope[6:], add=add)
        if not scope.endswith("*") or scope.count("*") != 1:
            raise EngineValueError(f"scope {scope[:200]!r} must be a URL prefix ending in * (as"
                                   " https://shop.example/catalog/*) or route:NAME")
        try:
            prefix = normalize_url(scope[:-1])
        except EngineError as e:
            raise EngineValueError(f"scope: {str(e)[:300]}") from None
        if not scope[:-1].endswith("/") and prefix.endswith("/") and \
                urllib.parse.urlsplit(prefix).path == "/":
            prefix = prefix[:-1]  # "https://host*": every page of the host and its ports
        return cls(mode=mode, prefix=prefix, add=add)


@dataclass
class Pool:
    """What prioritizing reaches: the engine, its URL table, routes and the snapshot store."""

    engine: Any
    urls: Any
    routes: Routes | None
    store: Store | None

    def hosts(self) -> frozenset[str]:
        """``scheme://host[:port]`` of every page the pool renders."""
        found: frozenset[str] = self.urls.origins()
        return found


def prioritize(pool: Pool, ask: Ask, now_ms: int | None = None) -> dict[str, Any]:
    """Do what ``ask`` says; ``{"matched", "added", "unknown", "cleared"}``."""
    engine_mode = "rush" if ask.mode.endswith("rush") else "wait"
    clearing = ask.mode.startswith("clear-") and pool.store is not None
    route = None if ask.route is None else _route(pool, ask.route)
    if route is not None and (own := route[0].own_prefix(route[1])) is not None:
        ask, route = replace(ask, prefix=own), None  # on Redis, on its server
    if ask.prefix is not None and not clearing:
        # Matched and made due where the URLs are (a Redis queue's server): none read here.
        got = pool.urls.prioritize_prefix(ask.prefix, engine_mode, now_ms)
        if not got.matched and ask.route is None:  # a route may have no page yet
            _check_scope(pool, ask.prefix)
        return _answer(ask, got.done, 0, [], 0)
    unknown: list[str] = []
    if route is not None:
        rows, matched_urls = _route_rows(pool, *route)
    elif ask.prefix is not None:  # the snapshots go first: the URLs are read
        found, matched_urls = pool.urls.find_prefix(ask.prefix)
        if not matched_urls and ask.route is None:
            _check_scope(pool, ask.prefix)
        rows = found.tolist()
    else:
        hosts = pool.hosts()
        foreign = [u for u in ask.urls if origin_of(u) not in hosts]
        if foreign:
            raise EngineValueError(f"{len(foreign)} URL(s) on hosts the pool does not render,"
                                   f" such as {foreign[0][:200]}")
        found = variant_rows.rows_of(pool.urls, ask.urls)
        rows = [r for each in found for r in each]
        matched_urls = [u for u, r in zip(ask.urls, found, strict=True) if r]
        unknown = [u for u, r in zip(ask.urls, found, strict=True) if not r]
    added = 0
    if unknown and ask.add:
        new_rows = _add(pool, unknown, now_ms)
        rows += new_rows
        matched_urls += unknown
        added, unknown = len(new_rows), []
    cleared = 0
    if clearing and pool.store is not None:
        cleared = pool.store.clear(list(ask.urls) or matched_urls)
    done = pool.engine.prioritize_many(np.asarray(rows, np.int64), engine_mode, now_ms)
    return _answer(ask, done - added, added, unknown, cleared)


def _answer(ask: Ask, matched: int, added: int, unknown: list[str], cleared: int
            ) -> dict[str, Any]:
    return {"matched": matched, "added": added, "unknown": unknown[:SHOWN_UNKNOWN],
            "unknown_count": len(unknown), "cleared": cleared, "mode": ask.mode}


def _check_scope(pool: Pool, prefix: str) -> None:
    """A scope that matched nothing: fine on one of the pool's hosts (``matched: 0``), refused
    on any other (nothing was changed)."""
    if origin_of(prefix) not in pool.hosts():
        raise EngineValueError(f"scope {prefix}*: the pool renders no page of"
                               f" {origin_of(prefix)}")


def _route_rows(pool: Pool, routes: Routes, route: int) -> tuple[list[int], list[str]]:
    """The rows whose first matching route is ``routes.routes[route]``: looked for under the
    text every URL of that route starts with (the sorted index on Redis), the whole table only
    where its pattern opens with a wildcard."""
    prefix = routes.routes[route].prefix
    if prefix:
        found, urls = pool.urls.find_prefix(prefix)
    else:
        urls = pool.urls.urls()
        found = np.arange(len(urls))
    # An earlier route may take some of them: the first route that matches a URL is its route.
    mine = np.flatnonzero(routes.match(urls) == route)
    return found[mine].tolist(), [urls[i] for i in mine.tolist()]


def _route(pool: Pool, name: str) -> tuple[Routes, int]:
    """The pool's routes and the index of route ``name`` in them."""
    if pool.routes is None or name not in (names := pool.routes.names()):
        known = ", ".join(pool.routes.names()) if pool.routes is not None else ""
        raise EngineValueError(f"no route {name[:100]!r}: the pool's routes are"
                               f" {known or '(none)'}")
    return pool.routes, names.index(name)


def _add(pool: Pool, urls: list[str], now_ms: int | None) -> list[int]:
    """Add ``urls`` as submitted pages (their route's interval), due now; their rows."""
    from ..pool.grow import add_corpus

    now = int(time.time() * 1000) if now_ms is None else now_ms
    n = len(urls)
    interval = np.full(n, DEFAULT_INTERVAL_S, np.int64)
    provenance = np.zeros(n, np.uint8)
    route = np.full(n, -1, np.int16)
    if pool.routes is not None and pool.routes.routes:
        interval, provenance, route = pool.routes.apply(urls, interval, provenance)
        if (route < 0).any():
            lost = urls[int(np.flatnonzero(route < 0)[0])]
            raise EngineValueError(f"{lost[:200]} matches none of the pool's routes: it has no"
                                   " interval")
    corpus = Corpus(list(urls), interval, provenance, np.full(n, now, np.int64), route)
    add_corpus(pool.engine, pool.urls, corpus, pool.routes)
    return [r for each in variant_rows.rows_of(pool.urls, urls) for r in each]


def parse_json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise EngineValueError(f"the body is not JSON: {str(e)[:200]}") from None


# -- the endpoints -----------------------------------------------------------------------------

def add_routes(app: web.Application, source: PoolSource, guard: Auth, read_only: bool,
               forget: Callable[[Sequence[str]], None]) -> None:
    """``POST /api/prioritize`` and ``POST /recache`` over the pool of ``source``; ``forget``
    drops cleared URLs (none named: all) from this process's answer cache at once (the other
    ``--processes`` see the store within ``REVALIDATE_S``)."""
    pool = Pool(source.engine, None, None, source.store)

    async def run(request: web.Request, ask_of: Callable[[object], Ask]) -> web.Response:
        if read_only:
            return _json({"error": "read-only server: actions are refused"}, 403)
        if request.content_type != "application/json":
            return _json({"error": "send the request as JSON (Content-Type:"
                                   " application/json)"}, 415)
        try:
            ask = ask_of(parse_json(await request.read()))

            def act() -> dict[str, Any]:
                pool.urls, pool.routes = source.urls(), source.routes()
                return prioritize(pool, ask)

            result = await source.call(act)
        except EngineError as e:
            return _json({"error": str(e)}, 400)
        if ask.mode.startswith("clear-"):
            forget(ask.urls)  # a scope: () (every answer kept here)
        return _json(result)

    async def api(request: web.Request) -> web.Response:
        return await run(request, Ask.of)

    async def recache(request: web.Request) -> web.StreamResponse:
        """prerender.io's recache API: the server's token in the body, mode rush."""
        body = parse_json(await request.read()) if request.content_type == \
            "application/json" else None
        if guard.token is not None:
            given = body.get("prerenderToken") if isinstance(body, dict) else None
            refused = guard.guess(request, given if isinstance(given, str) else None)
            if refused is not None:
                return refused
        return await run(request, _recache_ask)

    app.router.add_post("/api/prioritize", api, name="prioritize")
    app.router.add_post("/recache", recache, name="recache")


def _recache_ask(body: object) -> Ask:
    """prerender.io's fields: the token, ``url`` or ``urls``, and ``adaptiveType`` (its
    mobile/desktop choice, taken and ignored: every variant of a URL is rushed); always rush."""
    if not isinstance(body, dict):
        raise EngineValueError("the body must be a JSON object: {prerenderToken, url | urls}")
    unknown = sorted(set(body) - {"prerenderToken", "url", "urls", "adaptiveType"})
    if unknown:
        raise EngineValueError(f"unknown field(s) for /recache: {', '.join(unknown)[:200]}"
                               " (POST /api/prioritize takes a mode)")
    return Ask.of({k: v for k, v in body.items() if k in ("url", "urls")})


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status)
