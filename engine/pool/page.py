"""One page rendered in a fresh browser context: readiness, blocking, status and the snapshot.

Ready when, after DOMContentLoaded, no request has been in flight for ``settle_ms`` (500 ms, as
prerender waits after the last request), not counting websockets, EventSource and blocked
requests; or, when the page defines ``window.prerenderReady``, when that turns true. Both are
polled every ``POLL_S``: the in-flight set is kept from the Network events, the flag read with
``Runtime.evaluate``. The caller caps the whole render with its own timeout, which never waits
on the page: a tab stuck in a busy loop does not answer ``Runtime.evaluate``, so its render is
cut by the timeout, and the context is then disposed from the browser side, which kills that
renderer whatever it is doing.

Blocking is done by the ``Fetch`` domain: requests of the blocked resource types (images, media,
fonts) and to the blocked hosts (each host and its subdomains) are paused and failed at once
(``BlockedByClient``), before any byte goes out.

The status is the main document's response status; ``<meta name="prerender-status-code">``
overrides it (and ``<meta name="prerender-header" content="Location: URL">`` gives a 3xx its
Location). A redirect of the main document is not followed: its status and ``Location`` are
the render (as prerender does by default). The snapshot is the serialised DOM with every
``<script>`` removed except ``application/ld+json``, unless scripts are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngineError
from .cdp import BrowserGone, Cdp, CdpError

POLL_S = 0.1
"""How often readiness is looked at."""
CLOSE_S = 5.0
"""How long disposing of a context may take before the browser is deemed broken."""
_SKIPPED_TYPES = frozenset({"WebSocket", "EventSource"})


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

    def fetch_patterns(self) -> list[dict[str, str]]:
        pats = [{"resourceType": t, "requestStage": "Request"} for t in self.block_types]
        for host in self.block_hosts:
            pats += [{"urlPattern": f"*://{host}/*", "requestStage": "Request"},
                     {"urlPattern": f"*://*.{host}/*", "requestStage": "Request"}]
        return pats


_SNAPSHOT_JS = """(() => {
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
          status: meta ? meta.getAttribute('content') : null, headers};
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
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Tab:
    """One render: a fresh context and target, its events, and their disposal."""

    def __init__(self, cdp: Cdp, rules: PageRules) -> None:
        self.cdp, self.rules = cdp, rules
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
        await asyncio.gather(*(self._call(m, p) for m, p in (
            ("Page.enable", {}), ("Network.enable", {}), ("Inspector.enable", {}),
            ("Fetch.enable", {"patterns": self.rules.fetch_patterns()}))))
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
            if st.dom_ready:
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

    async def _snapshot(self, st: _State) -> Snapshot:
        keep = "true" if self.rules.keep_scripts else "false"
        st.waiting_on_js = True
        got = await self._call("Runtime.evaluate", {
            "expression": _SNAPSHOT_JS % {"keep": keep}, "returnByValue": True})
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
            task = asyncio.get_running_loop().create_task(self._block(p["requestId"]))
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

    async def _block(self, request_id: str) -> None:
        with contextlib.suppress(EngineError):
            await self.cdp.call("Fetch.failRequest", {"requestId": request_id,
                                                      "errorReason": "BlockedByClient"},
                                self.session)
