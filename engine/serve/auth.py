"""Who may talk to ``lanes serve``, and which POSTs it takes.

Why this module exists: the server drives a running pool (retry, park, policy edits) and hands
out a site's snapshots, so it must not be reachable by anyone on the network, nor be driven by
a page in the operator's browser that posts to it (CSRF). What a connection and a Host name may
do before they get here is :mod:`engine.serve.door`'s.

* **Binding.** Loopback by default. Any other address needs ``--token-file F``
  (:func:`check_binding` refuses to start otherwise, and says why).
* **Token.** With a token file, every request but the login form needs one of: the session
  cookie the login form sets; ``Authorization: Bearer <token>``; on the snapshot routes also
  ``X-Prerender-Token: <token>`` (what prerender middleware sends). A browser asking for a page
  is sent to the login form; anything else gets 401. The file holds the token on its first
  line, at least ``MIN_TOKEN`` characters (``lanes token F`` writes one), and must be a regular
  file not readable by group or others. It is looked at again at most every ``RECHECK_S``: a
  changed token ends every session, a file that became unusable refuses every token.
* **Guessing** is throttled per client (:class:`~engine.serve.door.Throttle`): a wrong token,
  by login form or header, counts; past a few, the client waits, answered 429.
* **Sessions** are signed: ``<expiry>.<id>.<HMAC(key, expiry.id)>`` with a key derived from
  the token, so every process of the server (``--processes``) and a restarted server accept
  them, and changing the token ends them all. Logging out ends the session on the server too:
  its id goes into :class:`Ended`, a table every process of the server shares.
* **CSRF.** Every POST carries the token ``request["csrf"]`` holds, as the header
  ``X-CSRF-Token`` or the form field ``csrf``. It is a signed double-submit token: a random
  nonce and its HMAC, kept in a ``SameSite=Strict`` cookie and compared with what the POST
  sends; a page of another site can neither read the cookie nor forge a signed nonce. A JSON
  POST (``Content-Type: application/json``: a CMS calling the API) needs none: a browser sends
  that type to another origin only after a CORS preflight, which this server never grants, and
  the Host allow-list keeps a rebound name from making it same-origin.
* **Read-only** (``--read-only``) refuses every POST but the login form with 403.
* **Odd input** (non-ASCII or undecodable bytes in a cookie or a token) is a wrong credential,
  never an error: every comparison is of bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import mmap
import multiprocessing
import os
import secrets
import stat
import struct
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from html import escape
from typing import Final
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..errors import EngineValueError
from .door import UNSAFE, Throttle, is_snapshot_route, refusal

MIN_TOKEN: Final = 32
TOKEN_BYTES: Final = 32
SESSION_S: Final = 12 * 3600
RECHECK_S: Final = 1.0
SESSION_COOKIE: Final = "lanes_session"
CSRF_COOKIE: Final = "lanes_csrf"
CSRF_HEADER: Final = "X-CSRF-Token"
PRERENDER_HEADER: Final = "X-Prerender-Token"

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PUBLIC: Final = frozenset({"/login", "/healthz", "/recache"})  # /recache: token in its body
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
            f" 0600, holding a token of at least {MIN_TOKEN} characters: lanes token F writes"
            " one) or bind 127.0.0.1")


def read_token(path: str) -> str:
    """The token in ``path`` (its first line), checked: a regular file, private, long enough.
    Opened without blocking, so a FIFO or a device is refused rather than waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise EngineValueError(f"--token-file {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise EngineValueError(f"--token-file {path}: not a regular file")
        if mode & 0o077:
            raise EngineValueError(f"--token-file {path} is readable by others (mode"
                                   f" {stat.S_IMODE(mode):04o}): chmod 600 {path}")
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise EngineValueError(f"--token-file {path}: not UTF-8 text") from None
    token = lines[0].strip() if lines else ""
    if len(token) < MIN_TOKEN or any(c.isspace() or not c.isprintable() or not c.isascii()
                                     for c in token):
        raise EngineValueError(f"--token-file {path}: the token (first line) must be at least"
                               f" {MIN_TOKEN} printable ASCII characters without spaces (lanes"
                               f" token {path} writes a random one)")
    return token


def write_token(path: str, replace: bool = False) -> None:
    """A new random token (``TOKEN_BYTES`` bytes, URL-safe base64) in ``path``, mode 0600.
    An existing file is kept unless ``replace``; then it is replaced atomically (which ends
    every session of a server reading it)."""
    token = secrets.token_urlsafe(TOKEN_BYTES) + "\n"
    target = path if not replace else f"{path}.{os.getpid()}.new"
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise EngineValueError(f"{path} exists: give --replace to write a new token over it"
                               " (every session of a server reading it ends)") from None
    except OSError as e:
        raise EngineValueError(f"cannot write {path}: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)


def same(given: str | None, expected: str) -> bool:
    """A constant-time comparison of what a client sent with what we hold, whatever it sent
    (aiohttp hands undecodable header bytes over as surrogates; they simply differ)."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


def local_path(value: object, default: str = "/") -> str:
    """Where a redirect may go: a path on this server, or ``default``. Browsers drop tabs and
    newlines inside a URL and read ``\\`` as ``/``, so ``/\t/evil.example`` is another site:
    anything holding a control character, a backslash, a scheme or an authority is refused."""
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 4096:
        return default
    if "\\" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return default
    parts = urllib.parse.urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return default
    return value


class Ended:
    """Sessions ended by logging out, shared by every process of a server: an anonymous shared
    mapping made before the fork, ``SLOTS`` entries of (expiry, id), under one lock.

    An entry is needed only until its session would have expired anyway, so its slot is then
    free again. When every slot holds a live entry (``SLOTS`` logouts within ``SESSION_S``),
    the table ends every session made so far instead (``not_before``): safe, and the operator
    simply logs in again."""

    SLOTS: Final = 4096
    _ENTRY: Final = struct.Struct("<q16s")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8 + self.SLOTS * self._ENTRY.size)
        self._lock = multiprocessing.Lock()

    def end(self, sid: bytes, expiry: int, now: float) -> None:
        with self._lock:
            free = None
            for i in range(self.SLOTS):
                at = 8 + i * self._ENTRY.size
                until, _ = self._ENTRY.unpack_from(self._map, at)
                if until < now:
                    free = at
                    break
            if free is None:
                struct.pack_into("<q", self._map, 0, int(now) + 1)
                return
            self._ENTRY.pack_into(self._map, free, expiry, sid)

    def ended(self, sid: bytes, expiry: int) -> bool:
        with self._lock:
            (not_before,) = struct.unpack_from("<q", self._map, 0)
            if expiry - SESSION_S < not_before:
                return True
            step = self._ENTRY.size
            return any(self._ENTRY.unpack_from(self._map, at) == (expiry, sid)
                       for at in range(8, 8 + self.SLOTS * step, step))


class Auth:
    """The token (None: an open loopback server), the keys that sign sessions and CSRF
    tokens, the ended sessions and the throttle. Made before any fork, so every process of a
    server shares the keys and the ended sessions; each re-reads the token file itself."""

    def __init__(self, token: str | None, read_only: bool = False,
                 token_file: str | None = None) -> None:
        self.read_only = read_only
        self.token_file = token_file
        self.throttle = Throttle()
        self.ended = Ended()
        self._csrf_key = hmac.digest(secrets.token_bytes(32), b"lanes serve csrf", "sha256")
        self._file_id = _file_id(token_file)
        self._checked = time.monotonic()
        self._use(token)

    def _use(self, token: str | None) -> None:
        self.token = token
        self.broken = False  # the token file became unusable: every token is refused
        base = token.encode() if token is not None else secrets.token_bytes(32)
        self._session_key = hmac.digest(base, b"lanes serve session", "sha256")

    def recheck(self, now: float | None = None) -> None:
        """Read the token file again if it changed (looked at most every ``RECHECK_S``)."""
        now = time.monotonic() if now is None else now
        if self.token_file is None or now - self._checked < RECHECK_S:
            return
        self._checked = now
        seen = _file_id(self.token_file)
        if seen == self._file_id:
            return
        self._file_id = seen
        try:
            token = read_token(self.token_file)
        except EngineValueError as e:
            if not self.broken:
                log.warning("lanes serve: %s; every token is refused until it is mended", e)
            self.broken = True
            return
        if token != self.token or self.broken:
            log.warning("lanes serve: the token file changed: every session has ended")
            self._use(token)

    # -- sessions --------------------------------------------------------------------------

    def new_session(self, now_s: float | None = None) -> str:
        expiry = int((time.time() if now_s is None else now_s) + SESSION_S)
        body = f"{expiry}.{secrets.token_hex(8)}"
        return f"{body}.{self._sign(self._session_key, body)}"

    def _session(self, value: str | None, now_s: float | None = None) -> tuple[int, bytes] | None:
        """A valid session's (expiry, id), else None."""
        parts = (value or "").split(".")
        if len(parts) != 3 or not all(p.isascii() for p in parts):
            return None
        expiry, sid, mac = parts
        if not expiry.isdigit() or len(expiry) > 12 or len(sid) != 16:
            return None
        if not same(mac, self._sign(self._session_key, f"{expiry}.{sid}")):
            return None
        if int(expiry) < (time.time() if now_s is None else now_s):
            return None
        return int(expiry), sid.encode()

    def valid_session(self, value: str | None, now_s: float | None = None) -> bool:
        found = self._session(value, now_s)
        return found is not None and not self.ended.ended(found[1], found[0])

    def end_session(self, value: str | None) -> None:
        found = self._session(value)
        if found is not None:
            self.ended.end(found[1], found[0], time.time())

    def valid_token(self, value: str | None) -> bool:
        return self.token is not None and not self.broken and same(value, self.token)

    # -- CSRF tokens ------------------------------------------------------------------------

    def new_csrf(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(self._csrf_key, nonce)}"

    def valid_csrf(self, value: str | None) -> bool:
        nonce, _, mac = (value or "").partition(".")
        return bool(nonce) and nonce.isascii() and same(mac, self._sign(self._csrf_key, nonce))

    @staticmethod
    def _sign(key: bytes, text: str) -> str:
        return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]

    # -- who is asking ----------------------------------------------------------------------

    def check(self, request: web.Request) -> web.StreamResponse | None:
        """None when ``request`` may pass (always, without a token); else the refusal."""
        if self.token is None or request.path in _PUBLIC:
            return None
        self.recheck()
        if self.valid_session(request.cookies.get(SESSION_COOKIE)):
            return None
        given = _bearer(request.headers.get("Authorization", ""))
        if given is None and is_snapshot_route(request):
            given = request.headers.get(PRERENDER_HEADER)
        if given is None:
            return _unauthenticated(request)
        return self.guess(request, given)

    def guess(self, request: web.Request, given: str | None) -> web.StreamResponse | None:
        """A token a client offered: None if right; 401 if wrong; 429 while it must wait."""
        client = request.remote
        wait = self.throttle.wait_s(client)
        if wait > 0:
            self.throttle.refused += 1
            return refusal(429, "too many wrong tokens from this address: wait and retry",
                           {"Retry-After": str(max(1, round(wait)))})
        if self.valid_token(given):
            self.throttle.succeeded(client)
            return None
        self.throttle.failed(client)
        return _unauthenticated(request)


def _file_id(path: str | None) -> tuple[int, ...] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)


def _bearer(header: str) -> str | None:
    if header[:7].lower() != "bearer ":
        return None
    return header[7:].strip()


def middleware(auth: Auth) -> Middleware:
    """Token, read-only and CSRF rules, in that order, and the CSRF cookie. A snapshot read
    only passes the token check: it goes to a bot, which keeps no cookie and posts nothing."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = auth.check(request)
        if refused is not None:
            return refused
        if request.method in ("GET", "HEAD") and is_snapshot_route(request):
            return await handler(request)
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = not auth.valid_csrf(cookie)
        request["csrf"] = auth.new_csrf() if fresh else cookie
        if request.method in UNSAFE:
            if auth.read_only and request.path not in _SESSION_PATHS:
                return refusal(403, "read-only server: actions are refused")
            if request.content_type != "application/json" and (
                    fresh or not same(await _sent_csrf(request), request["csrf"])):
                return refusal(403, "missing or wrong CSRF token: reload the page and retry")
        response = await handler(request)
        if fresh and not response.prepared:
            response.set_cookie(CSRF_COOKIE, request["csrf"], httponly=True,
                                samesite="Strict", path="/", secure=request.secure)
        return response

    return guard


async def _sent_csrf(request: web.Request) -> str:
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and request.content_type == "application/x-www-form-urlencoded":
        value = (await request.post()).get("csrf")
        sent = value if isinstance(value, str) else None
    return sent or ""


def _unauthenticated(request: web.Request) -> web.Response:
    if (request.method == "GET" and not is_snapshot_route(request)
            and "text/html" in request.headers.get("Accept", "")):
        raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
    return refusal(401, "a token is needed: log in at /login, or send Authorization: Bearer"
                        " <token>", {"WWW-Authenticate": 'Bearer realm="lanes"'})


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


def add_login_routes(app: web.Application, auth: Auth) -> None:
    """``GET/POST /login`` and ``POST /logout`` (only with a token)."""

    async def form(request: web.Request) -> web.Response:
        return _form(request, local_path(request.query.get("next")), "", 200)

    async def login(request: web.Request) -> web.StreamResponse:
        data = await request.post()
        target = local_path(data.get("next"))
        given = data.get("token")
        refused = auth.guess(request, given.strip() if isinstance(given, str) else None)
        if refused is not None and refused.status == 429:
            return refused
        if refused is not None:
            return _form(request, target, "<p role=\"alert\">Wrong token.</p>", 401)
        response = web.HTTPSeeOther(target)
        response.set_cookie(SESSION_COOKIE, auth.new_session(), max_age=SESSION_S, httponly=True,
                            samesite="Strict", path="/", secure=request.secure)
        raise response

    async def logout(request: web.Request) -> web.Response:
        auth.end_session(request.cookies.get(SESSION_COOKIE))
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

