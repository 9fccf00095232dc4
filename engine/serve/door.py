"""The front door of ``lanes serve``: what a connection may cost before it is a request, who
the client is, which Host names the operator's pages answer to, and how fast anyone may guess.

Why this module exists: prerender middleware relays to this server every URL that any crawler,
or anyone posing as one, asks for, so the server faces the internet. aiohttp parses requests
well but leaves three things open that an attacker uses (docs/serve.md, "Security"):

* **Time.** aiohttp bounds an idle keep-alive (``keepalive_timeout``) but not the time a
  client takes to send its headers or its body: a client that sends one byte every few seconds
  holds a connection, and a file descriptor, for as long as it likes (slowloris). So each
  connection is wrapped (:class:`_Guarded`): from the first byte of a request to the end of its
  headers it has ``Limits.header_s``, after which it is answered 408 and closed; a POST body
  has ``Limits.body_s`` (:func:`front`); an idle keep-alive ``Limits.idle_s`` (aiohttp's own).
* **Connections per client.** One address may hold at most ``Limits.per_peer`` connections;
  the next is answered 429 and closed before anything is parsed. A trusted proxy
  (``--trust-proxy``) is exempt: it carries everyone.
* **Names.** A page on any site can make the operator's browser resolve its own name to
  127.0.0.1 (DNS rebinding) and then read the dashboard as a same-origin page. Only a request
  whose ``Host`` is one the operator serves (the bound address, loopback names, ``--allowed-host``)
  reaches the dashboard, its API, the login form or ``/metrics``; any other Host gets **421
  Misdirected Request**, the status HTTP has for "this server does not answer for that name"
  (a 403 would say the client lacks a right it could obtain; no credential makes a foreign Host
  valid). The snapshot routes and ``/healthz`` answer any Host: middleware sends its own.

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are read only from a peer inside a
``--trust-proxy`` network, and then give the client's address (for throttling and the per-peer
cap) and the scheme (the ``Secure`` cookie flag). From anyone else they are ignored.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from ..errors import EngineValueError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SECURITY_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                           "Referrer-Policy": "same-origin"}
SNAPSHOT_ROUTE: Final = "snapshot"
"""Routes whose name starts with this are snapshot routes: they answer any Host, take
X-Prerender-Token, never set a cookie and set their own caching headers."""
ANY_HOST_PATHS: Final = frozenset({"/healthz"})
LARGE_BODIES: Final = {"/api/prioritize": 16 << 20, "/recache": 16 << 20}
"""POSTs that may carry more than ``Limits.body_bytes``: up to 10,000 URLs."""
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
SWEEP_S: Final = 0.25
"""How often the header deadlines are looked at: a slow client is cut within this of its own."""
UNSAFE: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_READS: Final = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Limits:
    """What one connection or request may cost (``lanes serve`` options of the same names)."""

    header_s: float = 10.0  # first byte of a request to the end of its headers
    idle_s: float = 60.0  # an idle keep-alive connection
    body_s: float = 10.0  # a POST body, once its headers are in
    per_peer: int = 256  # open connections from one client address
    body_bytes: int = 1 << 20  # a POST body

    def check(self) -> None:
        for what, value in (("--header-timeout", self.header_s), ("--idle-timeout", self.idle_s),
                            ("--body-timeout", self.body_s)):
            if not 0 < value <= 3600:
                raise EngineValueError(f"{what} must lie in (0, 3600] seconds, got {value!r}")
        if not 1 <= self.per_peer <= 1_000_000:
            raise EngineValueError(f"--max-connections-per-client must lie in [1, 1000000],"
                                   f" got {self.per_peer!r}")


def networks(given: Iterable[str]) -> tuple[Network, ...]:
    """``--trust-proxy`` values as networks (an address alone is a network of one)."""
    out = []
    for text in given:
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise EngineValueError(f"--trust-proxy {text!r} is not an address or a network"
                                   " (CIDR, e.g. 10.0.0.0/8 or 127.0.0.1)") from None
    return tuple(out)


def host_names(bound: str, given: Iterable[str]) -> frozenset[str]:
    """The Host names the operator's pages answer to: loopback names, the bound address
    (unless it is a wildcard) and every ``--allowed-host``."""
    names = set(LOOPBACK_NAMES)
    if bound not in ("0.0.0.0", "::", ""):
        names.add(_bare(bound))
    for name in given:
        bare = _bare(name)
        if not bare or any(c.isspace() or c in "/?#@" for c in bare):
            raise EngineValueError(f"--allowed-host {name!r} is not a host name")
        names.add(bare)
    return frozenset(names)


def _bare(host: str) -> str:
    """A Host header's name: lowercased, without port, brackets or a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


@dataclass
class Door:
    """One server process's front door: its limits, the trusted proxies, the Host names, the
    connections open per client, and what it refused (``statistics``)."""

    limits: Limits = field(default_factory=Limits)
    trusted: tuple[Network, ...] = ()
    hosts: frozenset[str] = LOOPBACK_NAMES
    open_per_peer: dict[str, int] = field(default_factory=dict)
    guarded: dict[Any, _Guarded] = field(default_factory=dict)  # transport -> its guard
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("too_many_connections", "header_timeout", "body_timeout", "wrong_host"), 0))
    sweeping: bool = False  # a sweep of the header deadlines is scheduled

    def statistics(self) -> dict[str, Any]:
        return {"open": len(self.guarded), "clients": len(self.open_per_peer), **self.refused}

    def is_trusted(self, address: str | None) -> bool:
        if not self.trusted or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def sweep_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure a sweep of the header deadlines is coming."""
        if not self.sweeping:
            self.sweeping = True
            loop.call_later(SWEEP_S, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sweeping = False
        now = loop.time()
        for guard in list(self.guarded.values()):
            if guard.deadline is not None and guard.deadline <= now:
                guard.expired()
        if any(g.deadline is not None for g in self.guarded.values()):
            self.sweep_soon(loop)

    def protocol(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of a listening socket: aiohttp's, wrapped."""
        return lambda: _Guarded(self, make)

    def admit(self, peer: str) -> bool:
        if self.is_trusted(peer):
            return True
        n = self.open_per_peer.get(peer, 0)
        if n >= self.limits.per_peer:
            self.refused["too_many_connections"] += 1
            return False
        self.open_per_peer[peer] = n + 1
        return True

    def release(self, peer: str) -> None:
        n = self.open_per_peer.get(peer, 0) - 1
        if n > 0:
            self.open_per_peer[peer] = n
        else:
            self.open_per_peer.pop(peer, None)

    def client_view(self, request: web.Request) -> web.Request:
        """``request`` as its client sent it: behind a trusted proxy, with the client's address
        (the last untrusted hop of X-Forwarded-For) and scheme (X-Forwarded-Proto)."""
        if not self.trusted or not self.is_trusted(request.remote):
            return request
        changes: dict[str, Any] = {}
        proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
        if proto in ("http", "https"):
            changes["scheme"] = proto
        hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
        for hop in reversed([h for h in hops if h]):
            if not _is_address(hop):
                break  # garbage: stop at the proxy, whose word we have
            changes["remote"] = hop
            if not self.is_trusted(hop):
                break
        return request.clone(**changes) if changes else request

    def host_ok(self, request: web.Request) -> bool:
        return _bare(request.headers.get("Host", "")) in self.hosts


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind a per-client cap and a header deadline.

    The deadline runs from the connection's start, and then from the first byte of each later
    request, until :func:`front` sees the request (its headers are parsed); an idle keep-alive
    is aiohttp's ``keepalive_timeout``. A connection over the cap gets 429 and never reaches
    aiohttp. Deadlines are a number each connection holds, looked at by one sweep of the door
    every ``SWEEP_S``: a timer per request cost several percent of a snapshot answer."""

    def __init__(self, door: Door, make: Callable[[], asyncio.Protocol]) -> None:
        self.door = door
        self.make = make
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.deadline: float | None = None  # loop time by which the headers must be in
        self.loop = asyncio.get_running_loop()
        self.busy = False  # a request is being handled

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        peer = peer[0] if isinstance(peer, tuple) and peer else ""
        if not self.door.admit(peer):
            _answer_and_close(transport, "429 Too Many Requests", "too many connections from"
                              " this address", "Retry-After: 10\r\n")
            return
        self.peer = peer
        self.inner = self.make()
        self.door.guarded[transport] = self
        self.inner.connection_made(transport)
        self.arm()

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.deadline is None and not self.busy:
            self.arm()  # a new request begins
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.inner is None else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.inner is None:
            return
        self.door.guarded.pop(self.transport, None)
        self.door.release(self.peer)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def arm(self) -> None:
        door = self.door
        self.deadline = self.loop.time() + door.limits.header_s
        if not door.sweeping:
            door.sweep_soon(self.loop)

    def disarm(self) -> None:
        self.deadline = None

    def expired(self) -> None:
        self.deadline = None
        if self.busy or self.transport is None or self.transport.is_closing():
            return
        self.door.refused["header_timeout"] += 1
        _answer_and_close(self.transport, "408 Request Timeout",
                          f"headers not sent within {self.door.limits.header_s:g} s")


def _answer_and_close(transport: asyncio.Transport, status: str, why: str,
                      extra: str = "") -> None:
    body = why.encode() + b"\n"
    head = (f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\n{extra}"
            + "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS.items()) + "\r\n")
    transport.write(head.encode() + body)
    transport.close()


class GuardedSite(web.SockSite):
    """``web.SockSite`` whose connections pass through ``door`` first."""

    def __init__(self, runner: web.BaseRunner, sock: Any, door: Door) -> None:
        super().__init__(runner, sock)
        self.door = door

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        _screen_expect(server)
        self._server = await asyncio.get_running_loop().create_server(
            self.door.protocol(server), sock=self._sock, backlog=self._backlog)


def _screen_expect(server: web.Server) -> None:
    """Answer an ``Expect`` other than ``100-continue`` with 417 before aiohttp's own check,
    which runs before any middleware and fails (a 500) on a value that is not UTF-8."""
    handle = server.request_handler
    if getattr(handle, "screened", False):
        return

    def screened(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        expect = request.headers.get("Expect")
        if expect is not None and expect.lower() != "100-continue":
            return _answered(refusal(417, "the only Expect taken is 100-continue"))
        return handle(request)  # the handler's own coroutine: no frame of ours per request

    screened.screened = True  # type: ignore[attr-defined]
    server.request_handler = screened


async def _answered(response: web.StreamResponse) -> web.StreamResponse:
    return response


def is_snapshot_route(request: web.Request) -> bool:
    name = request.match_info.route.name
    return name is not None and name.startswith(SNAPSHOT_ROUTE)


def refusal(status: int, why: str, extra: dict[str, str] | None = None) -> web.Response:
    """A short plain answer with a reason, the way every refusal of the server looks."""
    return web.Response(status=status, text=why + "\n", headers={**SECURITY_HEADERS,
                                                                 **(extra or {})})


def front(door: Door) -> Middleware:
    """The outermost middleware: the client as a trusted proxy reports it, the Host
    allow-list, a POST's body read within its time and size (413 past ``body_bytes``, 408 past
    ``body_s``) before any handler sees it, and on every answer but a snapshot's (made with
    them) the security headers and ``no-store``, aiohttp's own 404, 405 and 413 included. A
    snapshot read (any Host, no body) passes straight through: it is the hot path."""

    @web.middleware
    async def door_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = door.guarded.get(request.transport)
        if guard is not None:
            guard.busy = True
            guard.disarm()
        try:
            if request.method in _READS and not door.trusted and is_snapshot_route(request):
                return await handler(request)
            try:
                response = await _checked(door, door.client_view(request), handler)
            except web.HTTPException as exc:  # a redirect, or aiohttp's 404/405/413
                _stamp(request, exc)
                raise
            _stamp(request, response)
            return response
        finally:
            if guard is not None:
                guard.busy = False

    return door_middleware


async def _checked(door: Door, request: web.Request, handler: Handler) -> web.StreamResponse:
    """``request`` past the Host allow-list and with its body read, handled."""
    path = request.path
    if not (is_snapshot_route(request) or path in ANY_HOST_PATHS or door.host_ok(request)):
        door.refused["wrong_host"] += 1
        return refusal(421, "this server does not answer for that Host name (give it with"
                            " lanes serve --allowed-host NAME)")
    if path in LARGE_BODIES:
        request = request.clone(client_max_size=LARGE_BODIES[path])
    if request.method in UNSAFE and request.body_exists:
        if request.content_type.startswith("multipart/"):
            return refusal(415, "multipart bodies are not taken: send a form"
                                " (application/x-www-form-urlencoded) or JSON")
        try:
            async with asyncio.timeout(door.limits.body_s):
                await request.read()  # kept: post() and json() read it from memory
        except TimeoutError:
            door.refused["body_timeout"] += 1
            return refusal(408, f"the body was not sent within {door.limits.body_s:g} s",
                           {"Connection": "close"})
    return await handler(request)


def _stamp(request: web.Request, response: web.StreamResponse) -> None:
    """The security headers, and ``no-store`` but on the static files, on an answer not yet
    sent."""
    if response.prepared:
        return
    for key, value in SECURITY_HEADERS.items():
        response.headers.setdefault(key, value)
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")


class Throttle:
    """Failed guesses of the token, per client: after ``FREE`` failures each further attempt
    waits ``2 ** (n - FREE)`` seconds (at most ``MAX_WAIT_S``) from the last failure, and is
    answered 429 until then, right token or not. A success forgets the client; a client quiet
    for ``FORGET_S`` is forgotten; at most ``CLIENTS`` are kept (the least recently failing
    dropped first), so a flood of addresses costs bounded memory. IPv6 clients are counted by
    their /64, which one host usually holds whole. Per server process."""

    FREE: Final = 5
    MAX_WAIT_S: Final = 300.0
    FORGET_S: Final = 3600.0
    CLIENTS: Final = 65_536

    def __init__(self) -> None:
        self._failed: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.refused = 0

    @staticmethod
    def key(client: str | None) -> str:
        try:
            ip = ipaddress.ip_address(client or "")
        except ValueError:
            return client or ""
        if ip.version == 6:
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
        return str(ip)

    def wait_s(self, client: str | None, now: float | None = None) -> float:
        """Seconds ``client`` must wait before its next attempt (0: it may try)."""
        seen = self._failed.get(self.key(client))
        if seen is None or seen[0] < self.FREE:
            return 0.0
        now = time.monotonic() if now is None else now
        n, last = seen
        return max(0.0, last + min(2.0 ** (n - self.FREE), self.MAX_WAIT_S) - now)

    def failed(self, client: str | None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = self.key(client)
        n, _ = self._failed.pop(key, (0, now))
        self._failed[key] = (n + 1, now)
        while len(self._failed) > self.CLIENTS or (
                self._failed and next(iter(self._failed.values()))[1] < now - self.FORGET_S):
            self._failed.popitem(last=False)

    def succeeded(self, client: str | None) -> None:
        self._failed.pop(self.key(client), None)


class QuietLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, where a request it could not parse (an HTTP 400 it answers
    itself) is one line without a traceback: such requests are the internet's noise, and a
    flood of them must not flood the log. Anything else keeps its traceback (a bug)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            first = str(exc_info.message).strip().splitlines()[:1] or [""]
            self.warning("lanes serve: a request it could not parse (%d): %s", exc_info.code,
                         first[0][:200])
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kw)
