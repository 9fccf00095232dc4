"""One page rendered in a fresh browser context: readiness, blocking, status and the snapshot.

Ready when, after DOMContentLoaded, no request has been in flight for ``settle_ms`` (500 ms, as
prerender waits after the last request), not counting websockets, EventSource and blocked
requests; or, when the page defines ``window.prerenderReady``, when that turns true. Both are
polled every ``POLL_S``: the in-flight set is kept from the Network events, the flag read with
``Runtime.evaluate``. The caller caps the whole render with its own timeout, which never waits
on the page: a tab stuck in a busy loop does not answer ``Runtime.evaluate``, so its render is
cut by the timeout, and the context is then disposed from the browser side, which kills that
renderer whatever it is doing.

A route's ``wait_for`` (``engine/corpus/rules.py``) replaces that rule: the page is ready once
its selector matches (or its ``js:`` expression is true), whatever the network does.

Blocking is done by the ``Fetch`` domain: requests of the blocked resource types (images, media,
fonts) and to the blocked hosts (each host and its subdomains) are paused and failed at once
(``BlockedByClient``), before any byte goes out. The same domain adds the rules' headers
(``X-Prerender: 1`` and a route's own) to document requests only: sent on a cross-origin
``fetch`` they would make the browser ask the API for a CORS preflight it may refuse, and the
page would lose the very content it is rendered for. The User-Agent is Chromium's own with
``RENDER_MARK`` appended, so an origin behind prerender middleware or an nginx bot map sends the
render its page, not a snapshot of itself (a loop).

The status is the main document's response status; ``<meta name="prerender-status-code">``
overrides it (and ``<meta name="prerender-header" content="Location: URL">`` gives a 3xx its
Location). A redirect of the main document is not followed: its status and ``Location`` are
the render (as prerender does by default). The snapshot is the serialised DOM with every
``<script>`` removed except ``application/ld+json``, unless scripts are kept.

A 2xx snapshot must pass the route's content check (``Require``) before it goes anywhere: a
failing one raises ``ContentCheckFailed`` with what was wrong, so the last good snapshot stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from ..corpus.rules import JS_PREFIX, Cookie, Require
from ..errors import EngineError
from .cdp import BrowserGone, Cdp, CdpError
from .variants import Variant

POLL_S = 0.1
"""How often readiness is looked at."""
CLOSE_S = 5.0
"""How long disposing of a context may take before the browser is deemed broken."""
_SKIPPED_TYPES = frozenset({"WebSocket", "EventSource"})
RENDER_MARK: Final = "Prerender (lanes pool)"
"""Appended to Chromium's User-Agent (as prerender appends its own): the middleware rules that
send bots to a prerenderer skip a User-Agent that says "prerender"."""
PRERENDER_HEADER: Final = ("X-Prerender", "1")
"""Sent with every render's document request: what prerender-node checks first."""


class PageFailed(EngineError):
    """A page that did not render: it did not settle, crashed, or failed to load."""


class PageTimeout(PageFailed):
    """The page did not settle within the page timeout (transient)."""


class PageCrashed(PageFailed):
    """The tab's renderer died (out of memory, or killed) while the page rendered."""


class PageStatus(PageFailed):
    """The page rendered with an error status (``status``: 4xx permanent, 5xx transient)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (PageStatus, (str(self), self.status))


class ContentCheckFailed(PageFailed):
    """The page rendered but its content check failed (transient: the API inside it may answer
    next time). Its message is the reason as it stands: ``content check: #price missing``."""

    bare_reason = True


class BrowserBroken(PageFailed):
    """The browser stopped answering or died while this page rendered (transient)."""


@dataclass(frozen=True)
class Snapshot:
    """What a render produced."""

    html: str
    status: int
    location: str | None = None


@dataclass(frozen=True)
class PageRules:
    """How a page is rendered (the browser options a tab needs)."""

    settle_ms: int
    keep_scripts: bool
    block_types: tuple[str, ...]
    block_hosts: tuple[str, ...]
    wait_for: str | None = None
    """A CSS selector, or ``js:EXPRESSION``: ready when it matches (is true)."""
    headers: tuple[tuple[str, str], ...] = (PRERENDER_HEADER,)
    """Added to document requests; a ``User-Agent`` among them replaces the User-Agent."""
    cookies: tuple[Cookie, ...] = ()
    require: Require | None = None
    variant: Variant | None = None
    """The device to render as (variants.py); None: Chromium as it is."""

    def fetch_patterns(self) -> list[dict[str, str]]:
        pats = [{"resourceType": t, "requestStage": "Request"} for t in self.block_types]
        for host in self.block_hosts:
            pats += [{"urlPattern": f"*://{host}/*", "requestStage": "Request"},
                     {"urlPattern": f"*://*.{host}/*", "requestStage": "Request"}]
        if self.request_headers():
            pats.append({"resourceType": "Document", "requestStage": "Request"})
        return pats

    def blocks(self, url: str, resource_type: str) -> bool:
        """Whether a request is one the rules block (a paused document may not be)."""
        if resource_type in self.block_types:
            return True
        host = (urlsplit(url).hostname or "").lower()
        return any(host == h or host.endswith("." + h) for h in self.block_hosts)

    def user_agent(self, browsers: str) -> str:
        """The User-Agent of a render: the rules' own, else the variant's or the browser's,
        with the mark."""
        given = [v for k, v in self.headers if k.lower() == "user-agent"]
        if given:
            return given[-1]
        if self.variant is not None:
            return self.variant.user_agent(browsers, RENDER_MARK)
        return f"{browsers} {RENDER_MARK}"

    def emulation(self, browsers: str) -> list[tuple[str, dict[str, Any]]]:
        """The calls that set a page's device and User-Agent (none without ``browsers``, the
        browser's own User-Agent: the page is left as Chromium makes it)."""
        if not browsers:
            return []
        agent = self.user_agent(browsers)
        if self.variant is not None:
            return self.variant.emulation(agent)
        return [("Emulation.setUserAgentOverride", {"userAgent": agent})]

    def request_headers(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.headers if k.lower() != "user-agent"]

    def ready_js(self) -> str | None:
        """The expression that says the page is ready under ``wait_for``, or None."""
        if self.wait_for is None:
            return None
        if self.wait_for.startswith(JS_PREFIX):
            # On a line of its own: a trailing // comment must not swallow the parenthesis.
            return f"!!({self.wait_for[len(JS_PREFIX):]}\n)"
        return f"document.querySelector({json.dumps(self.wait_for)}) !== null"


_SNAPSHOT_JS = """(() => {
  const require = %(require)s;
  const text = document.body ? document.body.innerText.replace(/\\s+/g, ' ').trim() : '';
  const check = {missing: require.selectors.filter(s => document.querySelector(s) === null),
                 text: text.length, present: require.absent.filter(a => text.includes(a))};
  const meta = document.querySelector('meta[name="prerender-status-code"]');
  const headers = [...document.querySelectorAll('meta[name="prerender-header"]')]
    .map(m => m.getAttribute('content') || '');
  if (!%(keep)s) {
    for (const s of [...document.querySelectorAll('script')]) {
      if ((s.getAttribute('type') || '').trim().toLowerCase() !== 'application/ld+json') s.remove();
    }
  }
  const dt = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '';
  return {html: dt + document.documentElement.outerHTML,
          status: meta ? meta.getAttribute('content') : null, headers, check};
})()"""


@dataclass
class _State:
    """What the tab's events said so far (written by the event handler only)."""

    target: str
    main_request: str | None = None
    status: int | None = None
    redirect: tuple[int, str | None] | None = None
    dom_ready: bool = False
    crashed: bool = False
    gone: bool = False
    in_flight: dict[str, str] = field(default_factory=dict)  # request id -> URL
    quiet_since: float = field(default_factory=time.monotonic)
    waiting_on_js: bool = False  # a Runtime.evaluate is unanswered (a busy page?)
    wait_error: str | None = None  # what the wait_for expression last threw
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Tab:
    """One render: a fresh context and target, its events, and their disposal."""

    def __init__(self, cdp: Cdp, rules: PageRules, user_agent: str = "") -> None:
        """``user_agent``: the browser's own (``Browser.getVersion``); "" leaves it as it is."""
        self.cdp, self.rules, self.browser_ua = cdp, rules, user_agent
        self.context: str | None = None
        self.session: str | None = None
        self.state: _State | None = None
        self._blocking: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references

    async def render(self, url: str) -> Snapshot:
        """Load ``url`` and snapshot it once ready. No timeout here: the caller's cuts it."""
        cdp = self.cdp
        self.context = (await cdp.call("Target.createBrowserContext"))["browserContextId"]
        target = (await cdp.call("Target.createTarget", {
            "url": "about:blank", "browserContextId": self.context}))["targetId"]
        st = self.state = _State(target)
        self.session = (await cdp.call("Target.attachToTarget", {
            "targetId": target, "flatten": True}))["sessionId"]
        cdp.on(self.session, self._event)
        setup: list[tuple[str, dict[str, Any]]] = [
            ("Page.enable", {}), ("Network.enable", {}), ("Inspector.enable", {}),
            ("Fetch.enable", {"patterns": self.rules.fetch_patterns()})]
        setup += self.rules.emulation(self.browser_ua)
        await asyncio.gather(*(self._call(m, p) for m, p in setup))
        if self.rules.cookies:
            await cdp.call("Storage.setCookies", {
                "browserContextId": self.context,
                "cookies": [c.to_cdp(url) for c in self.rules.cookies]})
        nav = await self._call("Page.navigate", {"url": url})
        if st.redirect is not None:
            return Snapshot("", *st.redirect)
        if nav.get("errorText") and st.status is None:
            raise PageFailed(f"cannot load the page: {nav['errorText']}")
        if nav.get("errorText"):  # an error status with nothing to show (e.g. an empty 404)
            assert st.status is not None
            raise PageStatus(f"HTTP {st.status} ({nav['errorText']})", st.status)
        await self._settle(st)
        if st.redirect is not None:
            return Snapshot("", *st.redirect)
        return await self._snapshot(st)

    def why_not_ready(self, timeout_s: float) -> str:
        """The reason a render that ran out of time gives: what was still open."""
        st = self.state
        head = f"the page did not settle within {timeout_s:g} s"
        if st is None:
            return f"{head}: the browser did not open a tab"
        if st.waiting_on_js:
            return f"{head}: its JavaScript did not answer (a busy loop?)"
        if not st.dom_ready:
            head += " (DOMContentLoaded never came)"
        elif self.rules.wait_for is not None:
            threw = f" (it threw {st.wait_error})" if st.wait_error else ""
            return f"{head}: wait_for {self.rules.wait_for!r} never held{threw}"
        if not st.in_flight:
            return f"{head}: no request open (prerenderReady never turned true?)"
        urls = sorted(st.in_flight.values())
        shown = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        return f"{head}: {len(urls)} request(s) still open: {shown}"

    async def dispose(self) -> None:
        """Close the context (and kill its renderer); ``BrowserBroken`` if that hangs."""
        if self.session is not None:
            self.cdp.off(self.session)
        if self.context is None:
            return
        try:
            await asyncio.wait_for(self.cdp.call("Target.disposeBrowserContext", {
                "browserContextId": self.context}), CLOSE_S)
        except (TimeoutError, BrowserGone) as e:
            raise BrowserBroken(f"cannot close a tab: {type(e).__name__}") from None
        except CdpError:
            pass  # already gone with its crashed renderer

    # -- inside ----------------------------------------------------------------------------------

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        st = self.state
        assert st is not None
        if st.crashed:
            raise PageCrashed("the page crashed (its renderer died: out of memory?)")
        try:
            return await self.cdp.call(method, params, self.session)
        except BrowserGone:
            raise BrowserBroken("the browser died during the render") from None
        except CdpError:
            if st.crashed:
                raise PageCrashed("the page crashed (its renderer died: out of memory?)"
                                  ) from None
            raise

    async def _settle(self, st: _State) -> None:
        settle_s = self.rules.settle_ms / 1000
        while st.redirect is None:
            if st.crashed:
                raise PageCrashed("the page crashed (its renderer died: out of memory?)")
            if st.gone:
                raise BrowserBroken("the browser died during the render")
            if st.dom_ready and self.rules.wait_for is not None:
                if await self._holds(st):
                    return
            elif st.dom_ready:
                st.waiting_on_js = True
                got = await self._call("Runtime.evaluate", {
                    "expression": "window.prerenderReady", "returnByValue": True})
                st.waiting_on_js = False
                flag = got.get("result", {}).get("value")
                if isinstance(flag, bool):
                    if flag:
                        return
                elif not st.in_flight and time.monotonic() - st.quiet_since >= settle_s:
                    return
            st.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(st.wake.wait(), POLL_S)

    async def _holds(self, st: _State) -> bool:
        """Whether ``wait_for`` holds now. An expression that throws has not turned true yet
        (what it threw is kept for the timeout's reason), one that does not parse never will."""
        st.waiting_on_js = True
        got = await self._call("Runtime.evaluate", {"expression": self.rules.ready_js(),
                                                    "returnByValue": True})
        st.waiting_on_js = False
        if "exceptionDetails" in got:
            error = got["exceptionDetails"].get("exception", {}).get("description", "")
            st.wait_error = error.split("\n")[0] or "an exception"
            if st.wait_error.startswith("SyntaxError"):
                raise PageFailed(f"wait_for {self.rules.wait_for!r}: {st.wait_error}")
            return False
        return got.get("result", {}).get("value") is True

    async def _snapshot(self, st: _State) -> Snapshot:
        keep = "true" if self.rules.keep_scripts else "false"
        req = self.rules.require or Require()
        require = json.dumps({"selectors": req.selectors, "absent": req.absent})
        st.waiting_on_js = True
        got = await self._call("Runtime.evaluate", {
            "expression": _SNAPSHOT_JS % {"keep": keep, "require": require},
            "returnByValue": True})
        st.waiting_on_js = False
        if "exceptionDetails" in got:
            raise PageFailed("cannot serialise the page: "
                             + str(got["exceptionDetails"].get("text", "an exception")))
        value = got["result"]["value"]
        status = st.status if st.status is not None else 200
        meta = str(value.get("status") or "").strip()
        if meta.isdigit() and 100 <= int(meta) <= 599:
            status = int(meta)
        location = None
        for header in value.get("headers") or []:
            name, _, v = str(header).partition(":")
            if name.strip().lower() == "location" and v.strip():
                location = v.strip()
        if self.rules.require is not None and 200 <= status < 300:
            wrong = self.rules.require.failures(value["check"])
            if wrong:
                raise ContentCheckFailed("content check: " + "; ".join(wrong))
        return Snapshot(value["html"], status, location if 300 <= status < 400 else None)

    def _event(self, method: str, p: dict[str, Any]) -> None:
        st = self.state
        assert st is not None
        if method == "Network.requestWillBeSent":
            self._request(st, p)
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            if st.in_flight.pop(p.get("requestId", ""), None) is not None and not st.in_flight:
                st.quiet_since = time.monotonic()
        elif method == "Network.responseReceived":
            if p.get("requestId") == st.main_request:
                st.status = int(p["response"]["status"])
        elif method == "Fetch.requestPaused":
            task = asyncio.get_running_loop().create_task(self._paused(p))
            self._blocking.add(task)
            task.add_done_callback(self._blocking.discard)
        elif method == "Page.domContentEventFired":
            st.dom_ready = True
        elif method == "Inspector.targetCrashed":
            st.crashed = True
        elif method == "cdp.closed":
            st.gone = True
        st.wake.set()

    def _request(self, st: _State, p: dict[str, Any]) -> None:
        rid = p.get("requestId", "")
        if st.main_request is None and p.get("type") == "Document" and (
                p.get("frameId") == st.target):
            st.main_request = rid
        redirect = p.get("redirectResponse")
        if redirect is not None and rid == st.main_request:
            headers = {k.lower(): v for k, v in redirect.get("headers", {}).items()}
            st.redirect = (int(redirect["status"]), headers.get("location"))
            return
        if p.get("type") in _SKIPPED_TYPES or p.get("type") in self.rules.block_types:
            return
        st.in_flight[rid] = p.get("request", {}).get("url", "?")

    async def _paused(self, p: dict[str, Any]) -> None:
        """Fail a blocked request; let a document request go on with the rules' headers."""
        request = p.get("request", {})
        params: dict[str, Any]
        if self.rules.blocks(request.get("url", ""), p.get("resourceType", "")):
            method, params = "Fetch.failRequest", {"errorReason": "BlockedByClient"}
        else:
            extra = self.rules.request_headers()
            names = {k.lower() for k, _ in extra}
            headers = [{"name": k, "value": v} for k, v in request.get("headers", {}).items()
                       if k.lower() not in names]
            method, params = "Fetch.continueRequest", {
                "headers": headers + [{"name": k, "value": v} for k, v in extra]}
        with contextlib.suppress(EngineError):
            await self.cdp.call(method, {"requestId": p["requestId"], **params}, self.session)
