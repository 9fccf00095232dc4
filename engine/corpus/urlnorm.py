"""URL normalization: the one spelling of an absolute http(s) URL that the corpus readers, their
duplicate check, the routes and ``lanes serve``'s snapshot lookup all use. A leaf module (the
standard library only), so that the server normalizes a request's URL without importing the
corpus readers and their XML parser.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, urlsplit

from ..errors import EngineTypeError, EngineValueError

MAX_URL_CHARS: Final = 2047
"""The protocol's "less than 2,048 characters", applied to every source."""

_BAD_URL_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")
# The common shape, already normal (lowercase scheme and host, no port or userinfo, printable
# ASCII after the host): a million-row corpus otherwise spends most of its load time in
# urlsplit. A "%" sends the URL down the slow path only if an escape is not uppercase hex.
_NORMAL_URL = re.compile(r"https?://[a-z0-9.-]+(?:[/?#][!-~]*)?")
# The same shape in any case (``https://WWW.Example.com/a%2f``): normal after lowercasing the
# scheme and host and uppercasing escapes, still without urlsplit (5 us a URL).
_PLAIN_URL = re.compile(r"([hH][tT][tT][pP][sS]?://[A-Za-z0-9.-]+)((?:[/?#][!-~]*)?)")
_ODD_ESCAPE = re.compile(r"%(?![0-9A-F]{2})")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_DEFAULT_PORT: Final = {"http": 80, "https": 443}


def normalize_url(url: str) -> str:
    """The one spelling of an absolute http(s) URL that the corpus, its duplicate check and the
    routes use: scheme and host lowercased, a non-ASCII host IDNA-encoded (Python's ``idna``
    codec, IDNA 2003), the default port (:80 for http, :443 for https) and an empty port
    dropped, non-ASCII characters in userinfo, path, query and fragment percent-encoded as UTF-8,
    and the hex digits of existing escapes uppercased (``%c3%a9`` -> ``%C3%A9``).

    Nothing else changes: escapes are never decoded (``%2F`` is not ``/`` to every server),
    reserved characters stay, the query keeps its order and the fragment stays. Idempotent.
    Raises ``EngineValueError`` saying why for anything that is not such a URL, including one
    with whitespace or a control character in it (percent-encode those).
    """
    if not isinstance(url, str):
        raise EngineTypeError(f"normalize_url takes a str, got {url!r}")
    try:
        return normal_url(url)
    except BadUrl as exc:
        raise EngineValueError(str(exc)) from None


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a normalised URL."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0].partition('?')[0]}"


class BadUrl(ValueError):
    """Why a URL was refused; the caller adds where (``path:line``) or not (normalize_url)."""


def normal_url(url: str) -> str:
    """:func:`normalize_url` without the type check: the fast path, else the full one."""
    if (_NORMAL_URL.fullmatch(url) and len(url) <= MAX_URL_CHARS
            and ("%" not in url or not _ODD_ESCAPE.search(url))):
        return url  # already normal: the fast path that keeps a million rows in seconds
    plain = _PLAIN_URL.fullmatch(url)
    if plain and len(url) <= MAX_URL_CHARS:
        return plain.group(1).lower() + _encode_text(plain.group(2))
    return _normalize_fully(url)


def _normalize_fully(url: str) -> str:
    if not url:
        raise BadUrl("url is empty")
    if len(url) > MAX_URL_CHARS:
        raise BadUrl(f"url is {len(url)} characters long (at most {MAX_URL_CHARS})")
    bad = _BAD_URL_CHAR.search(url)
    if bad:
        raise BadUrl(f"url {url!r} contains whitespace or a control character "
                      f"({bad.group()!r}); percent-encode it")
    try:
        parts = urlsplit(url)
        port = parts.port  # urlsplit defers the port check to this property
    except ValueError as exc:
        raise BadUrl(f"url {url!r} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORT:
        raise BadUrl(f"url {url!r} is not an absolute http(s) URL")
    host = parts.hostname  # lowercased, brackets of an IPv6 literal dropped
    if not host:
        raise BadUrl(f"url {url!r} has no host")
    try:
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise BadUrl(f"url {url!r}: its host cannot be IDNA-encoded ({exc})") from None
        netloc = f"[{host}]" if ":" in host else host
        if port is not None and port != _DEFAULT_PORT[scheme]:
            netloc = f"{netloc}:{port}"
        userinfo, at, _ = parts.netloc.rpartition("@")
        if at:
            netloc = f"{_encode_text(userinfo)}@{netloc}"
        # The rest is everything after the authority, exactly as written (urlunsplit would
        # drop an empty "?" or "#").
        rest = url[len(parts.scheme) + 3 + len(parts.netloc):]
        normal = f"{scheme}://{netloc}{_encode_text(rest)}"
    except UnicodeEncodeError:
        raise BadUrl(f"url {url!r} is not valid Unicode (a lone surrogate)") from None
    if len(normal) > MAX_URL_CHARS:
        raise BadUrl(f"url {url!r} is {len(normal)} characters long once percent-encoded (at "
                      f"most {MAX_URL_CHARS})")
    return normal


def _encode_text(text: str) -> str:
    """Non-ASCII percent-encoded as UTF-8 and escapes' hex uppercased; nothing decoded."""
    if not text.isascii():
        text = _NON_ASCII.sub(lambda m: quote(m.group(), safe="", errors="strict"), text)
    if "%" in text:
        text = _ESCAPE.sub(lambda m: m.group().upper(), text)
    return text
