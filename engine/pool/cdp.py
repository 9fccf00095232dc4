"""A small Chrome DevTools Protocol client over one websocket (aiohttp), for the browser render.

One connection carries the browser's commands and, with ``Target.attachToTarget(flatten=True)``,
every tab's: a message names its session. ``call`` sends a command and awaits its answer;
events go to the handler registered for their session (a tab registers one while it renders).
Nothing here waits on a page: a call into a tab whose renderer is stuck in a busy loop simply
never answers, and the caller's own timeout (``asyncio.wait_for``) decides when to give up.
When the socket closes (the browser died or was killed) every pending call fails at once with
``BrowserGone``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import EngineError, MissingExtra

if TYPE_CHECKING:
    import aiohttp

EventHandler = Callable[[str, dict[str, Any]], None]


class CdpError(EngineError):
    """A command the browser answered with an error."""


class BrowserGone(EngineError):
    """The browser's DevTools socket closed (it died, or was killed)."""


class Cdp:
    """One DevTools websocket: commands with ids, events dispatched by session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession) -> None:
        self._ws, self._http = ws, http
        self._next = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[str, EventHandler] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.closed = False

    @classmethod
    async def connect(cls, ws_url: str) -> Cdp:
        http = _aiohttp().ClientSession()
        try:
            # A rendered page's HTML comes back as one message: no size cap.
            ws = await http.ws_connect(ws_url, max_msg_size=0, autoping=False)
        except BaseException:
            await http.close()
            raise
        return cls(ws, http)

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   session: str | None = None) -> dict[str, Any]:
        if self.closed:
            raise BrowserGone(f"the browser is gone ({method})")
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = fut
        try:
            await self._ws.send_str(json.dumps(msg))
            return await fut
        finally:
            self._pending.pop(msg["id"], None)

    def on(self, session: str, handler: EventHandler) -> None:
        self._handlers[session] = handler

    def off(self, session: str) -> None:
        self._handlers.pop(session, None)

    async def _read(self) -> None:
        try:
            async for m in self._ws:
                if m.type != _aiohttp().WSMsgType.TEXT:
                    break
                data = json.loads(m.data)
                if "id" in data:
                    fut = self._pending.get(data["id"])
                    if fut is None or fut.done():
                        continue
                    if "error" in data:
                        fut.set_exception(CdpError(data["error"].get("message", "CDP error")))
                    else:
                        fut.set_result(data.get("result", {}))
                else:
                    handler = self._handlers.get(data.get("sessionId", ""))
                    if handler is not None:
                        handler(data["method"], data.get("params", {}))
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(BrowserGone("the browser's DevTools socket closed"))
            for handler in list(self._handlers.values()):
                handler("cdp.closed", {})

    async def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        await self._http.close()


def _aiohttp() -> Any:
    """aiohttp, imported when a browser is first connected: the ``browser`` extra, which a
    base install (and every other command) does without."""
    try:
        import aiohttp
    except ModuleNotFoundError as e:
        raise MissingExtra("aiohttp", "browser") from e
    return aiohttp
