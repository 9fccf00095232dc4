"""``lanes serve``: one HTTP server for a pool's dashboard, its JSON API, ``/metrics`` and the
snapshot endpoint (aiohttp, the ``serve`` extra). Nothing here is imported by the engine or the
pool: ``engine.serve.app`` is loaded only by ``lanes serve``.

Modules
-------

* ``app``: the options, the application (middleware and the server's own routes), running it
  (one process, or several on one port with ``--processes``).
* ``auth``: binding rules, the token and login, sessions, CSRF, read-only.
* ``source``: :class:`~engine.serve.source.PoolSource`, the pool's shared parts opened by the
  server process.
* ``snapshots``: ``GET /render?url=URL`` and ``GET /{URL}`` over the snapshot store.
* ``dashboard``: the pages; it plugs in through the hook below.

The dashboard hook
------------------

With a pool NAME, ``app.build_app`` imports ``engine.serve.dashboard`` (always: it is part of
the package, and a missing or broken dashboard is an error, not a silent fallback) and calls::

    add_routes(app: aiohttp.web.Application, source: PoolSource, *, read_only: bool) -> None

once, before the server starts. The dashboard adds its routes (``/`` and below, its static
files, its JSON API) to ``app``; it must not add ``/metrics``, ``/healthz``, ``/login``,
``/logout``, ``/render`` or paths starting with ``/http:`` or ``/https:`` (the server's own).
What it may rely on:

* ``source`` opens the pool's engine, URL table, failure log, board and routes, and its
  ``call(fn, *args)`` runs ``fn`` on the source's own thread: every read or write of the pool
  goes through it, so the event loop (which also serves snapshots) never waits on the pool.
  ``source.store`` is the snapshot store (its own connection), or None without ``--store``.
* Every request has passed the token check (when the server has a token) before a handler
  runs. ``request["csrf"]`` is the CSRF token to embed in every form (field ``csrf``) or send
  as the header ``X-CSRF-Token``; a POST without it is refused with 403 before the handler.
* ``read_only``: the dashboard shows no action; the middleware refuses every POST anyway.
* Responses get ``X-Content-Type-Options``, ``X-Frame-Options`` and ``Referrer-Policy``; a
  dashboard sets its own ``Content-Security-Policy``.
"""

DEFAULT_PORT = 8090
"""``lanes serve``'s port unless told (here, where the command line's help reads it without
importing aiohttp)."""
