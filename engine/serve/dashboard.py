"""The pool's dashboard: an overview page of the pool's lanes (the hook of ``engine.serve``)."""

from __future__ import annotations

from html import escape
from typing import Any

from aiohttp import web

from ..checks import wall_ms
from .source import PoolSource


def add_routes(app: web.Application, source: PoolSource, *, read_only: bool) -> None:
    """Add the dashboard's pages to ``app`` (see ``engine.serve``'s docstring)."""

    async def overview(request: web.Request) -> web.Response:
        stats = await source.call(source.engine.stats, now_ms=wall_ms())
        return web.Response(text=_page(source.name, stats, read_only), content_type="text/html",
                            headers={"Content-Security-Policy": "default-src 'self'"})

    app.router.add_get("/", overview, name="overview")


def _page(name: str, stats: dict[str, Any], read_only: bool) -> str:
    cols = ("name", "queued", "due", "leased", "granted")
    head = "".join(f"<th scope=\"col\">{c}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(f"<td>{escape(str(lane[c]))}</td>" for c in cols) + "</tr>"
                   for lane in stats["lanes"])
    mode = " (read-only)" if read_only else ""
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{escape(name)}: lanes</title></head><body><main><h1>{escape(name)}{mode}</h1>"
            f"<p>{stats['rows']} rows, {stats['queued']} queued</p><table><caption>per lane"
            f"</caption><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></main>"
            "</body></html>")
