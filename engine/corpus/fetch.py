"""Fetching a sitemap over HTTP, bounded in every dimension.

A sitemap URL is input from the open web: the site may be down, slow, redirect in circles,
answer 500, or send a body that never ends or inflates without bound. Each of those costs the
reader a :class:`~engine.errors.CorpusError` that names the URL and why (``https://site/
sitemap.xml: cannot fetch: HTTP 503 Service Unavailable``), never a hang, an unbounded read or
a corpus read in part.

The bounds (:class:`FetchLimits`):

* **time**: ``timeout_s`` bounds the connection and each read of the socket; ``deadline_s``
  bounds the whole fetch of one corpus URL, the index and every child it lists (checked before
  each request and between reads, so one read may overrun it by at most ``timeout_s``);
* **size**: the protocol's 50 MB uncompressed per file, counted as the body streams in, both
  the bytes on the wire and the bytes gunzip makes of them (a small gzip bomb stops at the
  limit, it is never inflated whole); a ``Content-Length`` over the limit is refused unread;
* **redirects**: at most ``max_redirects``, to http(s) URLs only.

Gzip is undone whether the server says so (``Content-Encoding: gzip``) or the file is one
(``sitemap.xml.gz``, found by its magic bytes), and both at once. Only the standard library
is used (``urllib``): no new dependency for one GET.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from ..checks import is_int, is_number
from ..errors import CorpusError, EngineValueError

GZIP_MAGIC: Final = b"\x1f\x8b"
READ_CHUNK: Final = 1 << 16
USER_AGENT: Final = "render-lanes sitemap reader (+https://www.sitemaps.org/protocol.html)"


@dataclass(frozen=True)
class FetchLimits:
    """How long and how much one sitemap URL may take (see the module's docstring)."""

    timeout_s: float = 30.0
    deadline_s: float = 300.0
    max_redirects: int = 5
    max_bytes: int = 50 * 1024 * 1024

    def __post_init__(self) -> None:
        for what, x in (("timeout_s", self.timeout_s), ("deadline_s", self.deadline_s)):
            if not is_number(x) or not 0 < x < 1e6:
                raise EngineValueError(f"{what} must be a positive number of seconds, got {x!r}")
        if not is_int(self.max_redirects) or not 0 <= self.max_redirects <= 20:
            raise EngineValueError(f"max_redirects must be an int in [0, 20], got"
                                   f" {self.max_redirects!r}")
        if not is_int(self.max_bytes) or self.max_bytes < 1:
            raise EngineValueError(f"max_bytes must be a positive int, got {self.max_bytes!r}")


def is_http_url(source: str) -> bool:
    """Whether a corpus source names an http(s) URL rather than a file."""
    return source[:8].lower().startswith(("http://", "https://"))


def redact(url: str) -> str:
    """``url`` without a password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class _TooLarge(Exception):
    pass


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, bounded and to http(s) only (it would follow ftp:// too)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if not is_http_url(newurl):
            raise _Refused(f"redirected ({code}) to {redact(newurl)}, which is not an http(s)"
                           " URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Refused(Exception):
    """Why a fetch failed, in words: the caller puts the URL in front."""


class Fetcher:
    """GETs sitemap URLs within one set of limits, the deadline counted from construction (one
    ``Fetcher`` per corpus URL: its index and every child share the deadline)."""

    def __init__(self, limits: FetchLimits | None = None) -> None:
        self.limits = limits or FetchLimits()
        self._deadline = time.monotonic() + self.limits.deadline_s
        # urllib reads the bound from the class: a subclass per limit.
        bounded = type("_BoundedRedirects", (_Redirects,),
                       {"max_redirections": self.limits.max_redirects})
        self._opener = urllib.request.build_opener(bounded())

    def get(self, url: str) -> tuple[str, bytes]:
        """(the URL the body came from, after redirects; the body, gunzipped). Raises
        ``CorpusError`` naming ``url`` and why for anything but a whole, bounded 2xx body."""
        try:
            return self._get(url)
        except _Refused as exc:
            raise CorpusError(f"{redact(url)}: cannot fetch: {exc}") from None

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _Refused(f"the deadline of {self.limits.deadline_s:g} s for the sitemap and its"
                           " children passed")
        return left

    def _get(self, url: str) -> tuple[str, bytes]:
        limits = self.limits
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT,
                                                       "Accept-Encoding": "gzip"})
        wait = min(limits.timeout_s, self._left())
        waited = (f"within {limits.timeout_s:g} s" if wait == limits.timeout_s else
                  f"before the deadline of {limits.deadline_s:g} s for the sitemap and its"
                  " children")
        try:
            with self._opener.open(request, timeout=wait) as resp:
                final = resp.geturl()
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > limits.max_bytes:
                    raise _Refused(f"Content-Length {length} is over the sitemap protocol's"
                                   f" limit of {limits.max_bytes} bytes")
                encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
                if encoding not in ("identity", "gzip", "x-gzip"):
                    raise _Refused(f"unsupported Content-Encoding {encoding!r} (asked for gzip)")
                body = self._body(resp)
        except urllib.error.HTTPError as exc:
            if exc.code in (301, 302, 303, 307, 308) and exc.headers.get("Location"):
                raise _Refused(f"more than {limits.max_redirects} redirects (last: HTTP"
                               f" {exc.code})") from None
            raise _Refused(f"HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise _Refused(f"no connection {waited}") from None
            raise _Refused(f"cannot connect: {getattr(reason, 'strerror', None) or reason}"
                           ) from None
        except TimeoutError:
            raise _Refused(f"no answer {waited}") from None
        except (http.client.HTTPException, OSError) as exc:
            raise _Refused(f"the connection broke: {type(exc).__name__}: {exc}") from None
        except _TooLarge:
            raise _Refused(f"larger than {limits.max_bytes} bytes uncompressed (the sitemap"
                           " protocol's limit); refused") from None
        except zlib.error as exc:
            raise _Refused(f"not valid gzip: {exc}") from None
        return final, body

    def _body(self, resp: Any) -> bytes:
        """The body, read a chunk at a time within the deadline and gunzipped as it comes
        (two layers at most: Content-Encoding over a .gz file), never past ``max_bytes``."""
        limit = self.limits.max_bytes
        body = _Gunzip(limit, layers=2)
        wire = 0
        while True:
            self._left()
            chunk = resp.read1(READ_CHUNK)
            if not chunk:
                break
            wire += len(chunk)
            if wire > limit:  # gzip never makes a sitemap larger: empty members, say
                raise _TooLarge
            body.feed(chunk)
        return body.finish()


class _Gunzip:
    """Bytes in, bytes out: passed through, or gunzipped when the stream starts with gzip's
    magic (again for a second layer), with the output bounded while it is made."""

    def __init__(self, limit: int, layers: int) -> None:
        self.limit = limit
        self._layers = layers
        self._head = b""  # the first bytes, until it is known whether they are gzip
        self._d: Any = None  # zlib decompressor, or None: passing through
        self._inner: _Gunzip | None = None  # the next layer, fed what this one makes
        self._out = bytearray()
        self._decided = False

    def feed(self, data: bytes) -> None:
        if not self._decided:
            self._head += data
            if len(self._head) < len(GZIP_MAGIC):
                return
            data, self._head = self._head, b""
            self._decided = True
            if data.startswith(GZIP_MAGIC) and self._layers > 0:
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._inner = _Gunzip(self.limit, self._layers - 1)
        if self._d is None:
            self._emit(data)
            return
        while data:
            out = self._d.decompress(data, self.limit + 1)
            if out:
                assert self._inner is not None
                self._inner.feed(out)
            if self._d.eof:
                data = self._d.unused_data
                if data:  # another gzip member follows (concatenated gzip files are one file)
                    self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                data = self._d.unconsumed_tail

    def _emit(self, data: bytes) -> None:
        self._out += data
        if len(self._out) > self.limit:
            raise _TooLarge

    def finish(self) -> bytes:
        if not self._decided:  # fewer bytes than the magic: plain
            self._decided = True
            self._emit(self._head)
        if self._d is not None:
            if not self._d.eof:
                raise zlib.error("the gzip stream ends early (truncated)")
            assert self._inner is not None
            return self._inner.finish()
        return bytes(self._out)
