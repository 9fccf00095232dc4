"""Rules per route: how the pages of one route are rendered and what their snapshot must hold.

Why this module exists: one browser setup renders every page one way, but sites differ by page
type. A product page is done when ``#price`` is there, not when the network goes quiet; a shop
behind a consent wall needs a cookie; a page whose API call failed inside it renders "fine" into
a "Loading…" shell that must never replace the last good snapshot (prerender's users ask for all
three: headers and cookies, waiting for a selector, and above all no half-loaded page cached).
A route in the routes TOML says so with these keys (each optional; what a route leaves out is
the pool's own setting, ``lanes pool --browser``'s options)::

    variants = ["desktop", "mobile"]  # as Googlebot's crawlers see it (pool/variants.py): one
                                      # row and snapshot per variant (corpus/variant_rows.py)
    wait_for = "#price"               # ready when this selector matches, or "js:EXPR" is true
    headers = { "Accept-Language" = "en" }      # on the page's own document request
    cookies = { consent = "yes" }     # for the page's host; or { value = "yes", domain = "..." }
    page_timeout = "30s"              # or seconds
    block_types = ["Image", "Font"]   # replaces the pool's list ([]: block nothing)
    block_hosts = ["ads.example"]     # replaces the pool's list
    keep_scripts = true
    require = { selectors = ["#price"], min_text = 200, absent = ["Loading…"] }

Everything is checked when the routes file loads, so a mistake stops the pool before it starts
instead of failing every page of a route: a header value with CR or LF (a header injection), a
name that is not an HTTP token or one the browser owns (``Host``, ``Cookie``: use ``cookies``),
a cookie whose explicit domain is not the route's host. A selector is checked by the browser
that will use it (``engine.pool.browser.check_selectors``, at ``lanes pool`` start): a parser
of our own would refuse selectors Chromium takes, or take ones it refuses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from ..checks import is_int, is_number
from ..errors import EngineTypeError, EngineValueError

RULE_KEYS: Final = ("variants", "wait_for", "headers", "cookies", "page_timeout",
                    "block_types", "block_hosts", "keep_scripts", "require")
REQUIRE_KEYS: Final = ("selectors", "min_text", "absent")
JS_PREFIX: Final = "js:"
MAX_TEXT: Final = 4096
"""The longest selector, expression, header or cookie value a route may give."""

RESOURCE_TYPES = ("Document", "Stylesheet", "Image", "Media", "Font", "Script", "TextTrack",
                  "XHR", "Fetch", "Prefetch", "EventSource", "WebSocket", "Manifest",
                  "SignedExchange", "Ping", "CSPViolationReport", "Preflight", "Other")
"""The DevTools resource types a route (or the pool) may block."""
VARIANT_NAMES: Final = ("mobile", "desktop")
"""The variants a route may name (``engine.pool.variants`` says what each one is)."""

# RFC 9110's token: a header name (and, by RFC 6265, a cookie name).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# RFC 6265's cookie-octet: no control, whitespace, DQUOTE, comma, semicolon or backslash.
_COOKIE_VALUE = re.compile(r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*')
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}"
                   r"[a-z0-9])?)*")
# Headers the browser sets itself from other facts: a route's value would be ignored, or worse.
BROWSER_HEADERS: Final = frozenset({"host", "cookie", "content-length", "connection",
                                    "transfer-encoding", "upgrade", "te", "keep-alive",
                                    "proxy-connection", "trailer", "expect"})


@final
@dataclass(frozen=True)
class Cookie:
    """One cookie set in a page's fresh context before it loads. ``domain`` None: the page's own
    host (host-only, as the site itself would set it)."""

    name: str
    value: str
    domain: str | None = None

    def to_cdp(self, url: str) -> dict[str, Any]:
        """The ``Storage.setCookies`` form, for a render of ``url``."""
        if self.domain is None:
            return {"name": self.name, "value": self.value, "url": url}
        return {"name": self.name, "value": self.value, "domain": self.domain, "path": "/"}



@final
@dataclass(frozen=True)
class Require:
    """A route's content check: selectors that must match, the least text the page's body may
    hold (characters, white space folded) and strings its text must not hold."""

    selectors: tuple[str, ...] = ()
    min_text: int = 0
    absent: tuple[str, ...] = ()

    def failures(self, found: dict[str, Any]) -> list[str]:
        """What the page failed, from what ``_SNAPSHOT_JS`` measured; [] if it passed."""
        out = [f"{s} missing" for s in found["missing"]]
        if found["text"] < self.min_text:
            out.append(f"{found['text']} characters of text, under min_text {self.min_text}")
        out += [f"{json.dumps(a, ensure_ascii=False)} present" for a in found["present"]]
        return out


@final
@dataclass(frozen=True)
class RouteRules:
    """What one route sets of its pages' render; ``None`` (or empty) means the pool's own."""

    variants: tuple[str, ...] = ()
    """The devices its pages are rendered as (``VARIANT_NAMES``); (): Chromium as it is."""
    wait_for: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    cookies: tuple[Cookie, ...] = ()
    page_timeout_s: float | None = None
    block_types: tuple[str, ...] | None = None
    block_hosts: tuple[str, ...] | None = None
    keep_scripts: bool | None = None
    require: Require | None = None

    def selectors(self) -> list[str]:
        """The CSS selectors these rules hand the browser (for ``browser.selector_errors``)."""
        out = list(self.require.selectors) if self.require is not None else []
        if self.wait_for is not None and not self.wait_for.startswith(JS_PREFIX):
            out.insert(0, self.wait_for)
        return out

    def to_json(self) -> dict[str, Any]:
        """The rules in the routes file's own spelling (``rules_from`` reads it back)."""
        out: dict[str, Any] = {}
        if self.variants:
            out["variants"] = list(self.variants)
        if self.wait_for is not None:
            out["wait_for"] = self.wait_for
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.cookies:
            out["cookies"] = {c.name: c.value if c.domain is None else
                              {"value": c.value, "domain": c.domain} for c in self.cookies}
        if self.page_timeout_s is not None:
            out["page_timeout"] = self.page_timeout_s
        for key in ("block_types", "block_hosts"):
            if getattr(self, key) is not None:
                out[key] = list(getattr(self, key))
        if self.keep_scripts is not None:
            out["keep_scripts"] = self.keep_scripts
        if self.require is not None:
            out["require"] = {"selectors": list(self.require.selectors),
                              "min_text": self.require.min_text,
                              "absent": list(self.require.absent)}
        return out


NO_RULES: Final = RouteRules()


def rules_from(table: Mapping[str, Any], host: str | None) -> RouteRules:
    """The rules of one route's table (its other keys ignored); ``host`` is the route's fixed
    host, if its pattern has one (cookies with an explicit domain must cover it). Every refusal
    is an ``EngineValueError`` saying which key and why."""
    wait_for = table.get("wait_for")
    if wait_for is not None:
        wait_for = _text("wait_for", wait_for)
        if wait_for.startswith(JS_PREFIX) and not wait_for[len(JS_PREFIX):].strip():
            raise EngineValueError('wait_for "js:" needs an expression after it')
    timeout = table.get("page_timeout")
    keep = table.get("keep_scripts")
    if keep is not None and not isinstance(keep, bool):
        raise EngineTypeError(f"keep_scripts must be true or false, got {keep!r}")
    return RouteRules(
        variants=_variants(table.get("variants", [])),
        wait_for=wait_for,
        headers=_headers(table.get("headers", {})),
        cookies=_cookies(table.get("cookies", {}), host),
        page_timeout_s=None if timeout is None else _seconds("page_timeout", timeout),
        block_types=_block_types(table.get("block_types")),
        block_hosts=_block_hosts(table.get("block_hosts")),
        keep_scripts=keep,
        require=_require(table.get("require")))


def route_host(pattern: str, is_regex: bool) -> str | None:
    """The one host a route's pattern can match, when its pattern spells it literally
    (``https://shop.example/p/*``, ``https://shop\\.example/c/.+``); else None."""
    if is_regex:
        m = re.match(r"\^?https?[?]?://((?:[A-Za-z0-9-]|\\\.)+)(?::[0-9]+)?(?:/|\\/|\$|$)",
                     pattern)
        return None if m is None else m.group(1).replace("\\.", ".").lower()
    m = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://([A-Za-z0-9.-]+)(?::[0-9]+)?(?:/|$)", pattern)
    return None if m is None else m.group(1).lower()


def check_header(name: object, value: object) -> tuple[str, str]:
    """One request header as a route may give it: a token name the browser does not own, a
    value with no CR, LF or other control character (a header injection otherwise)."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > 200:
        raise EngineValueError(f"header name {name!r} is not an HTTP token")
    if name.lower() in BROWSER_HEADERS:
        hint = " (give cookies as cookies = {...})" if name.lower() == "cookie" else ""
        raise EngineValueError(f"header {name!r} is the browser's own to set{hint}")
    if not isinstance(value, str):
        raise EngineTypeError(f"header {name!r}: the value must be a string, got {value!r}")
    bad = next((c for c in value if c in "\r\n" or (ord(c) < 32 and c != "\t") or ord(c) == 127),
               None)
    if bad is not None:
        what = {"\r": "CR", "\n": "LF"}.get(bad, f"control character {ord(bad):#04x}")
        raise EngineValueError(f"header {name!r}: the value holds {what} (a header injection)")
    if len(value) > MAX_TEXT:
        raise EngineValueError(f"header {name!r}: the value is longer than {MAX_TEXT}")
    return name, value


def _variants(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise EngineTypeError(f'variants must be a list, like ["mobile"], got {value!r}')
    unknown = [v for v in value if v not in VARIANT_NAMES]
    if unknown:
        raise EngineValueError(f"unknown variant {unknown[0]!r} (known:"
                               f" {', '.join(VARIANT_NAMES)})")
    if len(set(value)) != len(value):
        raise EngineValueError(f"variants names one twice: {value!r}")
    return tuple(value)


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EngineValueError(f"{key} must be a non-empty string, got {value!r}")
    if len(value) > MAX_TEXT:
        raise EngineValueError(f"{key} is longer than {MAX_TEXT} characters")
    return value


def _headers(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise EngineTypeError(f'headers must be a table, like {{ "X-Name" = "value" }}, got'
                              f" {value!r}")
    seen: set[str] = set()
    out = []
    for name, v in value.items():
        pair = check_header(name, v)
        if name.lower() in seen:
            raise EngineValueError(f"header {name!r} given twice")
        seen.add(name.lower())
        out.append(pair)
    return tuple(out)


def _cookies(value: object, host: str | None) -> tuple[Cookie, ...]:
    if not isinstance(value, Mapping):
        raise EngineTypeError(f'cookies must be a table, like {{ consent = "yes" }}, got'
                              f" {value!r}")
    out = []
    for name, v in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise EngineValueError(f"cookie name {name!r} is not a token")
        domain = None
        if isinstance(v, Mapping):
            unknown = [k for k in v if k not in ("value", "domain")]
            if unknown or "value" not in v:
                raise EngineValueError(f"cookie {name!r}: give {{ value = ..., domain = ... }}"
                                       f" (domain optional)")
            domain = _cookie_domain(name, v.get("domain"), host)
            v = v["value"]
        if not isinstance(v, str) or not _COOKIE_VALUE.fullmatch(v) or len(v) > MAX_TEXT:
            raise EngineValueError(f"cookie {name!r}: {v!r} is not a cookie value (no spaces,"
                                   " quotes, commas, semicolons, backslashes or controls)")
        out.append(Cookie(name, v, domain))
    return tuple(out)


def _cookie_domain(name: str, domain: object, host: str | None) -> str | None:
    if domain is None:
        return None
    if not isinstance(domain, str) or not _HOST.fullmatch(domain.lstrip(".").lower()):
        raise EngineValueError(f"cookie {name!r}: domain {domain!r} is not a host name")
    d = domain.lstrip(".").lower()
    if host is None:
        raise EngineValueError(f"cookie {name!r}: domain {domain!r} cannot be checked against"
                               " this route, whose pattern fixes no host; leave the domain out"
                               " (the cookie is then set for each page's own host)")
    if host != d and not host.endswith("." + d):
        raise EngineValueError(f"cookie {name!r}: domain {domain!r} is another host than the"
                               f" route's ({host}): a page's cookies are for its own host")
    return d


def _seconds(key: str, value: object) -> float:
    """``"30s"``, ``"2m"`` or a number of seconds, in [0.1, 3600]."""
    s: float | None = None
    if is_number(value):
        s = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m)\s*", value)
        if m:
            s = float(m.group(1)) * (60 if m.group(2) == "m" else 1)
    if s is None or not 0.1 <= s <= 3600:
        raise EngineValueError(f'{key} must be like "30s", "2m" or seconds in [0.1, 3600], got'
                               f" {value!r}")
    return s


def _block_types(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise EngineTypeError(f"block_types must be a list, got {value!r}")
    bad = [t for t in value if t not in RESOURCE_TYPES]
    if bad:
        raise EngineValueError(f"block_types: unknown resource type {bad[0]!r} (one of"
                               f" {', '.join(RESOURCE_TYPES)})")
    return tuple(value)


def _block_hosts(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise EngineTypeError(f"block_hosts must be a list, got {value!r}")
    bad = [h for h in value if not isinstance(h, str) or not _HOST.fullmatch(h.lower())]
    if bad:
        raise EngineValueError(f"block_hosts: {bad[0]!r} is not a host name")
    return tuple(h.lower() for h in value)


def _require(value: object) -> Require | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise EngineTypeError(f"require must be a table, like {{ selectors = [...], min_text ="
                              f" 200, absent = [...] }}, got {value!r}")
    unknown = [k for k in value if k not in REQUIRE_KEYS]
    if unknown:
        raise EngineValueError(f"require: unknown key {unknown[0]!r} (known:"
                               f" {', '.join(REQUIRE_KEYS)})")
    lists = {}
    for key in ("selectors", "absent"):
        items = value.get(key, [])
        if not isinstance(items, list):
            raise EngineTypeError(f"require.{key} must be a list of strings, got {items!r}")
        lists[key] = tuple(_text(f"require.{key}", s) for s in items)
    min_text = value.get("min_text", 0)
    if not is_int(min_text) or not 0 <= min_text <= 10**9:
        raise EngineValueError(f"require.min_text must be a whole number of characters, got"
                               f" {min_text!r}")
    if not lists["selectors"] and not lists["absent"] and not min_text:
        raise EngineValueError("require asks for nothing: give selectors, min_text or absent")
    return Require(lists["selectors"], min_text, lists["absent"])


