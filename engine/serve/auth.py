"""Who may talk to ``lanes serve``, and which POSTs it takes.

Why this module exists: the server drives a running pool (retry, park, policy edits) and hands
out a site's snapshots, so it must not be reachable by anyone on the network, nor be driven by
a page in the operator's browser that posts to it (CSRF).

* **Binding.** Loopback by default. Any other address needs ``--token-file F``
  (:func:`check_binding` refuses to start otherwise, and says why).
* **Token.** With a token file, every request but the login form needs one of: the session
  cookie the login form sets; ``Authorization: Bearer <token>``; on the snapshot routes also
  ``X-Prerender-Token: <token>`` (what prerender middleware sends). A browser asking for a page
  is sent to the login form; anything else gets 401. The file holds the token on its first
  line, at least ``MIN_TOKEN`` characters, and must not be readable by group or others.
* **Sessions** are signed, not stored: ``<expiry>.<HMAC(key, expiry)>`` with a key derived from
  the token, so every process of the server (``--processes``) and a restarted server accept
  them, and changing the token ends them all.
* **CSRF.** Every POST carries the token ``request["csrf"]`` holds, as the header
  ``X-CSRF-Token`` or the form field ``csrf``. It is a signed double-submit token: a random
  nonce and its HMAC, kept in a ``SameSite=Strict`` cookie and compared with what the POST
  sends; a page of another site can neither read the cookie nor forge a signed nonce.
* **Read-only** (``--read-only``) refuses every POST but the login form with 403.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from html import escape
from typing import Final
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..errors import EngineValueError

MIN_TOKEN: Final = 16
SESSION_S: Final = 12 * 3600
SESSION_COOKIE: Final = "lanes_session"
CSRF_COOKIE: Final = "lanes_csrf"
CSRF_HEADER: Final = "X-CSRF-Token"
PRERENDER_HEADER: Final = "X-Prerender-Token"
SNAPSHOT_ROUTE: Final = "snapshot"
"""Routes whose name starts with this are snapshot routes: X-Prerender-Token is accepted there,
and no cookie is ever set on their answers (they go to bots)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_UNSAFE: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_PUBLIC: Final = frozenset({"/login", "/healthz"})
_SESSION_PATHS: Final = frozenset({"/login", "/logout"})  # not actions: open to read-only


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_binding(host: str, token_file: str | None) -> None:
    """Refuse (``EngineValueError``, saying why) to bind a non-loopback ``host`` untokened."""
    if token_file is None and not is_loopback(host):
        raise EngineValueError(
            f"refusing to bind {host}: it is not a loopback address, and anyone who reaches it"
            " could drive the pool and read every snapshot; give --token-file F (a file, mode"
            " 0600, holding a token of at least 16 characters) or bind 127.0.0.1")


def read_token(path: str) -> str:
    """The token in ``path`` (its first line), checked: present, long enough, private."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise EngineValueError(f"--token-file {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(4096)
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        raise EngineValueError(f"--token-file {path}: not a regular file")
    if mode & 0o077:
        raise EngineValueError(f"--token-file {path} is readable by others (mode"
                               f" {stat.S_IMODE(mode):04o}): chmod 600 {path}")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise EngineValueError(f"--token-file {path}: not UTF-8 text") from None
    token = lines[0].strip() if lines else ""
    if len(token) < MIN_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
        raise EngineValueError(f"--token-file {path}: the token (first line) must be at least"
                               f" {MIN_TOKEN} printable characters without spaces")
    return token


class Auth:
    """The token (None: an open loopback server) and the keys that sign sessions and CSRF
    tokens. Made before any fork, so every process of a server shares the keys."""

    def __init__(self, token: str | None, read_only: bool = False) -> None:
        self.token = token
        self.read_only = read_only
        base = token.encode() if token is not None else secrets.token_bytes(32)
        self._session_key = hmac.digest(base, b"lanes serve session", "sha256")
        self._csrf_key = hmac.digest(base, b"lanes serve csrf " + secrets.token_bytes(16),
                                     "sha256")

    # -- sessions --------------------------------------------------------------------------

    def new_session(self, now_s: float | None = None) -> str:
        expiry = int((time.time() if now_s is None else now_s) + SESSION_S)
        return f"{expiry}.{self._sign(self._session_key, str(expiry))}"

    def valid_session(self, value: str | None, now_s: float | None = None) -> bool:
        if not value or "." not in value:
            return False
        expiry, mac = value.split(".", 1)
        if not expiry.isdigit() or int(expiry) < (time.time() if now_s is None else now_s):
            return False
        return hmac.compare_digest(mac, self._sign(self._session_key, expiry))

    def valid_token(self, value: str | None) -> bool:
        return (self.token is not None and value is not None
                and hmac.compare_digest(value.encode(), self.token.encode()))

    # -- CSRF tokens ------------------------------------------------------------------------

    def new_csrf(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(self._csrf_key, nonce)}"

    def valid_csrf(self, value: str | None) -> bool:
        if not value or "." not in value:
            return False
        nonce, mac = value.split(".", 1)
        return hmac.compare_digest(mac, self._sign(self._csrf_key, nonce))

    @staticmethod
    def _sign(key: bytes, text: str) -> str:
        return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]

    # -- who is asking ----------------------------------------------------------------------

    def allowed(self, request: web.Request) -> bool:
        """Whether ``request`` may pass (always, without a token)."""
        if self.token is None or request.path in _PUBLIC:
            return True
        header = request.headers.get("Authorization", "")
        if header[:7].lower() == "bearer " and self.valid_token(header[7:].strip()):
            return True
        if is_snapshot_route(request) and self.valid_token(request.headers.get(PRERENDER_HEADER)):
            return True
        return self.valid_session(request.cookies.get(SESSION_COOKIE))


def is_snapshot_route(request: web.Request) -> bool:
    name = request.match_info.route.name
    return name is not None and name.startswith(SNAPSHOT_ROUTE)


SECURITY_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                           "Referrer-Policy": "same-origin"}


def middleware(auth: Auth) -> Middleware:
    """Token, read-only and CSRF rules, in that order; the CSRF cookie and the security
    headers. A snapshot read only passes the token check: it goes to a bot, which keeps no
    cookie and posts nothing, and its route sets its own headers."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not auth.allowed(request):
            return _unauthenticated(request)
        if request.method in ("GET", "HEAD") and is_snapshot_route(request):
            return await handler(request)
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = not auth.valid_csrf(cookie)
        request["csrf"] = auth.new_csrf() if fresh else cookie
        if request.method in _UNSAFE:
            if auth.read_only and request.path not in _SESSION_PATHS:
                return _refused(403, "read-only server: actions are refused")
            if fresh or not hmac.compare_digest(await _sent_csrf(request), request["csrf"]):
                return _refused(403, "missing or wrong CSRF token: reload the page and retry")
        response = await handler(request)
        if not response.prepared:
            for key, value in SECURITY_HEADERS.items():
                response.headers.setdefault(key, value)
            if fresh:
                response.set_cookie(CSRF_COOKIE, request["csrf"], httponly=True,
                                    samesite="Strict", path="/", secure=request.secure)
        return response

    return guard


async def _sent_csrf(request: web.Request) -> str:
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and request.content_type in ("application/x-www-form-urlencoded",
                                                 "multipart/form-data"):
        value = (await request.post()).get("csrf")
        sent = value if isinstance(value, str) else None
    return sent or ""


def _refused(status: int, why: str) -> web.Response:
    return web.Response(status=status, text=why + "\n", headers=SECURITY_HEADERS)


def _unauthenticated(request: web.Request) -> web.Response:
    if (request.method == "GET" and not is_snapshot_route(request)
            and "text/html" in request.headers.get("Accept", "")):
        raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
    return web.Response(status=401, text="a token is needed: log in at /login, or send"
                        " Authorization: Bearer <token>\n",
                        headers={"WWW-Authenticate": 'Bearer realm="lanes"'})


# -- the login form -------------------------------------------------------------------------

_FORM: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lanes serve: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>Log in</h1>{error}
<form method="post" action="/login">
<input type="hidden" name="csrf" value="{csrf}"><input type="hidden" name="next" value="{next}">
<label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<button type="submit">Log in</button></form></main></body></html>
"""


def _local_path(value: object) -> str:
    """Where to go after logging in: a path on this server, never another site."""
    if isinstance(value, str) and value.startswith("/") and not value.startswith("//") \
            and "\\" not in value:
        return value
    return "/"


def add_login_routes(app: web.Application, auth: Auth) -> None:
    """``GET/POST /login`` and ``POST /logout`` (only with a token)."""

    async def form(request: web.Request) -> web.Response:
        return _form(request, _local_path(request.query.get("next")), "", 200)

    async def login(request: web.Request) -> web.Response:
        data = await request.post()
        target = _local_path(data.get("next"))
        given = data.get("token")
        if not auth.valid_token(given.strip() if isinstance(given, str) else None):
            return _form(request, target, "<p role=\"alert\">Wrong token.</p>", 401)
        response = web.HTTPSeeOther(target)
        response.set_cookie(SESSION_COOKIE, auth.new_session(), max_age=SESSION_S, httponly=True,
                            samesite="Strict", path="/", secure=request.secure)
        raise response

    async def logout(request: web.Request) -> web.Response:
        response = web.HTTPSeeOther("/login")
        response.del_cookie(SESSION_COOKIE, path="/")
        raise response

    app.router.add_get("/login", form, name="login")
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout, name="logout")


def _form(request: web.Request, target: str, error: str, status: int) -> web.Response:
    return web.Response(status=status, content_type="text/html", text=_FORM.format(
        error=error, csrf=escape(request["csrf"]), next=escape(target)), headers={
            "Content-Security-Policy": "default-src 'none'; form-action 'self'"})
