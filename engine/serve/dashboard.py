"""The dashboard: server-rendered pages over a running pool, a little JavaScript, no build step.

Pages are jinja2 templates (autoescape on: a URL or a reason is always text) filled from the
shared :class:`~engine.serve.api.Figures`; their tables are written with the same cells as the
terminal's live view (``view.lane_cells``, ``words.format_*``). The overview replaces its
live part every second with a fragment the server renders (``/live``) and draws its charts
with the vendored uPlot from ``/api/history``. Actions are HTML forms that POST (the server's
CSRF middleware checks them) and answer with a redirect back; without JavaScript they work
the same, minus the confirmation of an action on every matching row; the one exception is
the Prioritize page, whose form the script sends as JSON to ``POST /api/prioritize`` (the API
a CMS calls) and whose answer it shows. With ``read_only`` no action is shown and no POST
route exists.

Everything the pages load comes from ``static/`` in the package: no request leaves the server.
"""

from __future__ import annotations

import math
import urllib.parse
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from ..checks import wall_ms
from ..errors import EngineError
from ..report import words
from ..report.staleness import cells as staleness_cells
from ..report.view import COLUMNS, lane_cells
from . import api, auth
from .source import PoolSource

HERE = Path(__file__).parent
READ_ONLY = web.AppKey("lanes_read_only", bool)
TEMPLATES = web.AppKey("lanes_templates", jinja2.Environment)
CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none';"
       " frame-ancestors 'none'; form-action 'self'")
"""Every page: nothing but this server's own files; no inline script runs."""
LIVE_EVERY_MS = 1000
"""How often the overview's open page asks for its live part."""


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(due=_due, duration=_duration, number=_number_cell, served=served_cell,
                       rate=words.format_rate, quote=urllib.parse.quote)
    return env


def _due(ms: int | None, now_ms: int | None = None) -> str:
    return words.format_due(ms, wall_ms() if now_ms is None else now_ms)


def _duration(s: float | None) -> str:
    return "-" if s is None else words.format_duration(s)


def _number_cell(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else (
        f"{v:.{digits}f}")


def _page(request: web.Request, template: str, status: int = 200, **values: Any
          ) -> web.Response:
    env = request.app[TEMPLATES]
    html = env.get_template(template).render(
        csrf=request.get("csrf", ""), read_only=request.app[READ_ONLY], path=request.path,
        live_every_ms=LIVE_EVERY_MS, **values)
    return web.Response(text=html, status=status, content_type="text/html",
                        headers={"Content-Security-Policy": CSP})


SERVED = "served age/TTL"
"""p50/p95/max of age ÷ interval of the snapshots served over the last hour."""


def lane_columns(overview: dict[str, Any]) -> tuple[str, ...]:
    """``view.COLUMNS``, and the served staleness when the server has a store."""
    return (*COLUMNS, SERVED) if overview["store"] else COLUMNS


def lane_table(overview: dict[str, Any]) -> list[tuple[str, ...]]:
    """The overview's lane rows as the cells of ``lane_columns`` (age/TTL: recent renders)."""
    if overview["pool"] is None:
        return []
    return [(*lane_cells(f, overview["now_ms"], f["age_over_ttl"]),
             *((served_cell(f["staleness"]),) if overview["store"] else ()))
            for f in overview["lanes"]]


def served_cell(group: dict[str, Any] | None) -> str:
    """A lane's or route's served staleness (``staleness.cells``), "-" with no hits."""
    return "-" if group is None else staleness_cells(group["served"])


# -- pages -------------------------------------------------------------------------------------


async def overview_page(request: web.Request) -> web.Response:
    ov = await api.overview_of(request.app[api.FIGURES])
    bots = await api.crawlers_of(request.app[api.FIGURES])
    return _page(request, "overview.html", ov=ov, columns=lane_columns(ov), rows=lane_table(ov),
                 bots=bots)


async def live_part(request: web.Request) -> web.Response:
    ov = await api.overview_of(request.app[api.FIGURES])
    return _page(request, "live.html", ov=ov, columns=lane_columns(ov), rows=lane_table(ov))


async def failures_page(request: web.Request) -> web.Response:
    fig = request.app[api.FIGURES]
    status, error = 200, ""
    try:
        rows, f = await api.failures_of(fig, request.query)
    except EngineError as e:  # a filter no form offers: say so, list everything
        status, error = 400, str(e)
        rows, f = await api.failures_of(fig, {})
    ov = await api.overview_of(fig)
    return _page(request, "failures.html", status, rows=rows[:api.SHOWN_FAILURES],
                 matching=len(rows), filter=f, kinds=api.KINDS, error=error,
                 lanes=[(ln["name"], ln["label"]) for ln in ov["lanes"]],
                 done=request.query.get("done", ""), now_ms=wall_ms())


async def url_page(request: web.Request) -> web.Response:
    fig = request.app[api.FIGURES]
    url, row = request.query.get("url"), request.query.get("row")
    try:
        info = await fig.run(fig.url_page, url, None if row is None else api.row_number(row))
    except EngineError as e:
        return _page(request, "url.html", status=404, info=None, error=str(e), asked=url or row)
    return _page(request, "url.html", info=info, error=None, asked=url,
                 cold_after=(await fig.run(lambda: fig.parts.engine.policy)).cold_after,
                 store=fig.parts.store is not None, done=request.query.get("done", ""))


async def routes_page(request: web.Request) -> web.Response:
    fig = request.app[api.FIGURES]
    return _page(request, "routes.html", routes=await api.routes_of(fig))


async def policy_page(request: web.Request) -> web.Response:
    fig = request.app[api.FIGURES]
    policy = await fig.run(fig.policy)
    return _page(request, "policy.html", policy=policy, error=None, form=None,
                 saved=request.query.get("saved") == "1", preview=None)


async def prioritize_page(request: web.Request) -> web.Response:
    """A form over ``POST /api/prioritize`` (the script sends it as JSON and shows the answer)."""
    return _page(request, "prioritize.html")


# -- actions -----------------------------------------------------------------------------------


async def failures_action(request: web.Request) -> web.Response:
    """POST /failures/retry or /failures/park: act, then back to the page it came from."""
    fig = request.app[api.FIGURES]
    form = await request.post()
    what = request.match_info["action"]
    try:
        rows = await api.action_rows(request, form)
        done = await fig.run(fig.retry if what == "retry" else fig.park, rows)
        note = (f"{'retrying' if what == 'retry' else 'parking'} {done} of {len(rows)}"
                " row(s)")
    except EngineError as e:
        note = f"refused: {e}"
    fig.forget("failures", "overview")
    back = auth.local_path(form.get("back"), "/failures")  # only ever a page of this server
    sep = "&" if "?" in back else "?"
    raise web.HTTPSeeOther(f"{back}{sep}done={urllib.parse.quote(note)}")


async def policy_action(request: web.Request) -> web.Response:
    """Apply the form's policy, or with ``preview`` show what applying it would change."""
    fig = request.app[api.FIGURES]
    form = {k: str(v) for k, v in (await request.post()).items() if k not in ("csrf", "preview")}
    preview = "preview" in await request.post()
    try:
        if preview:
            changes = await fig.run(fig.preview, form)
            return _page(request, "policy.html", policy=await fig.run(fig.policy), error=None,
                         form=form, saved=False, preview=changes)
        await fig.run(fig.set_policy, form)
    except EngineError as e:
        policy = await fig.run(fig.policy)
        return _page(request, "policy.html", status=400, policy=policy, error=str(e),
                     form=form, saved=False, preview=None)
    fig.forget("overview")
    raise web.HTTPSeeOther("/policy?saved=1")


# -- the hook ----------------------------------------------------------------------------------


def add_routes(app: web.Application, source: PoolSource, *, read_only: bool) -> None:
    """Serve the dashboard of ``source``'s pool at ``/`` and its JSON API under ``/api/``."""
    figures = api.Figures(source)
    app[api.FIGURES] = figures
    app[READ_ONLY] = read_only
    app[TEMPLATES] = _environment()
    app.middlewares.append(api.engine_errors)
    app.on_startup.append(lambda _app: figures.start())
    app.on_cleanup.append(lambda _app: figures.stop())
    r = app.router
    r.add_get("/", overview_page)
    r.add_get("/live", live_part)
    r.add_get("/failures", failures_page)
    r.add_get("/url", url_page)
    r.add_get("/routes", routes_page)
    r.add_get("/policy", policy_page)
    r.add_get("/prioritize", prioritize_page)
    r.add_static("/static/", HERE / "static")
    api.add_api_routes(app, read_only)
    r.add_post("/failures/{action:retry|park}", api.refused if read_only else failures_action)
    r.add_post("/policy", api.refused if read_only else policy_action)
