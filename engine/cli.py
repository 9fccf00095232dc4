"""The ``lanes`` command line (also ``python -m engine``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from . import factory
from .api import QueueEngine
from .checks import wall_ms
from .errors import (
    EngineError,
    EngineValueError,
    LayoutMismatch,
    MissingExtra,
    NotAllowed,
    SegmentMissing,
)
from .policy import LanePolicy
from .report.lanes import lane_label


def _engine(args: argparse.Namespace) -> Any:
    """Engine NAME: the shared-memory segment, or with ``--redis URL`` the Redis queue."""
    from .pool.parts import attach_engine

    return attach_engine(args.name, args.redis)


def _url_source(args: argparse.Namespace, eng: Any) -> Any:
    """The URLs of NAME's rows: the pool's URL table, or those stored with the Redis queue."""
    return eng.row_urls()


def _attached(args: argparse.Namespace) -> tuple[Any, Any]:
    """A handle of one's own on engine NAME and its URLs (the caller closes both)."""
    eng = _engine(args)
    try:
        return eng, _url_source(args, eng)
    except BaseException:
        eng.close()
        raise


def _local(args: argparse.Namespace) -> str:
    """The name of this host's pool files in /dev/shm (``--local-name``, else NAME)."""
    local: str = getattr(args, "local_name", None) or args.name
    return local


def _routes(args: argparse.Namespace, eng: Any) -> Any:
    """The routes NAME's pool was started with (kept in /dev/shm, or with the Redis queue)."""
    from .pool.grow import stored_routes

    try:
        urls = eng.row_urls()
    except SegmentMissing:
        return None  # an engine without a pool's URLs has no routes either
    try:
        return stored_routes(urls)
    finally:
        urls.close()


def _stats(args: argparse.Namespace) -> int:
    from .pool.board import Board
    from .report import progress, words
    from .report.view import for_json, pool_report, print_pool_report, print_table

    eng = _engine(args)
    try:
        if args.prometheus:
            from .report.metrics import exposition
            from .store import open_store

            if args.store is None:
                sys.stdout.write(exposition(eng, _local(args)))
                return 0
            with open_store(_store_spec(args), create=False) as store:
                sys.stdout.write(exposition(eng, _local(args), store, _routes(args, eng)))
            return 0
        try:
            board: Board | None = Board.attach(_local(args))
        except SegmentMissing:
            board = None
        except LayoutMismatch as e:
            print(f"lanes stats: {e}: showing the engine only", file=sys.stderr)
            board = None
        if board is not None:
            try:
                report = pool_report(eng, board)
            finally:
                board.close()
            routes = _routes(args, eng)
            if routes is not None:
                table = _url_source(args, eng)
                try:
                    report["routes"] = progress.route_figures(eng, table.urls(), routes,
                                                              report["pool"]["now_ms"])
                finally:
                    table.close()
        else:
            now = wall_ms()
            report = eng.stats(now_ms=now)
            due = progress.next_due(eng, now)
            policy = eng.policy
            for lane in report["lanes"]:
                lane["next_due_ms"] = due.get(lane["lane"])
                lane["label"] = lane_label(policy, lane["lane"])
            report["now_ms"] = now
        if args.store is not None:
            report["staleness"] = _staleness(args, eng)
    finally:
        eng.close()
    if args.json:
        print(json.dumps(for_json(report), indent=2))
    elif board is not None:
        print_pool_report(report, plain=args.plain)
        if "routes" in report:
            print_table("per route (--routes; first match wins)", [
                (r["route"], r["pattern"],
                 "-" if r["interval_s"] is None else words.format_duration(r["interval_s"]),
                 *(str(r[c]) for c in ("rows", "due", "failing", "parked")))
                for r in report["routes"]],
                ("route", "pattern", "every", "rows", "due", "failing", "parked"),
                plain=args.plain)
    else:
        now = report["now_ms"]
        cols = ("lane", "floor", "queued", "due", "leased", "granted", "spilled",
                "stale skipped", "lease refused", "next due")
        rows = [(ln["label"],
                 words.format_due(ln["floor_minute"] * 60_000 or None, now),
                 *(str(ln[c]) for c in ("queued", "due", "leased", "granted", "spilled",
                                        "stale_skipped", "lease_refused")),
                 words.format_due(ln["next_due_ms"], now)) for ln in report["lanes"]]
        print_table(f"{report['name']}: {report['rows']} rows ({report['queued']} queued) of"
                    f" {report['capacity']}, layout v{report['layout_version']} (no pool)",
                    rows, cols, plain=args.plain)
    if "staleness" in report and not args.json:
        from .report.view import print_staleness

        print_staleness(report["staleness"], plain=args.plain)
    return 0


def _staleness(args: argparse.Namespace, eng: Any) -> dict[str, Any]:
    """``--store DIR``'s served staleness, per lane and (when the pool has routes) per route."""
    from .report.staleness import staleness
    from .store import open_store

    with open_store(_store_spec(args), create=False) as store:
        policy = eng.policy
        return staleness(store, wall_ms(), _routes(args, eng), policy.lane_name,
                         lane_label=lambda lane: lane_label(policy, lane))


def _check(args: argparse.Namespace) -> int:
    """Exit 0: every invariant holds (after ``--repair``, once what dead writers left was
    repaired); 1: a broken invariant; 3: only marks of dead writers, not repaired."""
    eng = _engine(args)
    marks: list[str] = []
    try:
        if args.repair and eng.writes_whole:
            print("nothing to repair: each write to a Redis queue is one function call,"
                  " applied whole or not at all")
        walk = eng.verify_walk()
        if args.repair and walk.marks:
            done = eng.repair()
            print(f"repaired {walk.unpublished + walk.abandoned} mark(s) of"
                  f" {done['dead_owners']} dead writer(s): {walk.unpublished} unpublished"
                  f" row(s) indexed, {done.get('rows_taken_back', 0)} reserved row(s) never"
                  f" written taken back, {done.get('leases_reclaimed', 0)} lease(s) reclaimed"
                  + (f"; {done['rows_waiting']} row(s) left to a writer still at work"
                     if done.get("rows_waiting") else ""))
            walk = eng.verify_walk()
        problems, marks = walk.problems, walk.marks
    finally:
        eng.close()
    for m in marks:
        print(f"dead writer: {m}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    if marks:
        print(f"{walk.unpublished + walk.abandoned} mark(s) of dead writers, no broken"
              f" invariant: `lanes check --repair {args.name}` finishes or takes back their"
              " writes")
        return 3
    print("ok")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from .pool.supervisor import remove_pool_files, supervisor_running

    pid = supervisor_running(args.name)
    if pid is not None and not args.force:
        raise NotAllowed(f"a pool over {args.name!r} is running (supervisor pid {pid}); stop it,"
                         " or --force")
    removed = remove_pool_files(args.name)
    if factory.unlink(args.name, missing_ok=bool(removed)):
        removed.insert(0, f"/dev/shm/{args.name}")
    print("removed " + ", ".join(removed))
    return 0


def _prioritize(args: argparse.Namespace) -> int:
    from .report.words import format_due

    given = [w for w in ("url", "urls", "scope", "row") if getattr(args, w) is not None]
    if len(given) != 1:
        raise EngineValueError("give the pages as one of --url U, --urls FILE, --scope S or"
                               " --row N")
    if given != ["row"] and (given != ["url"] or args.mode not in ("rush", "wait")
                             or args.add or args.store):
        return _prioritize_pages(args)
    from .corpus import variant_rows

    eng = _engine(args)
    try:
        if args.url is not None:
            table = _url_source(args, eng)
            try:
                # every variant's row (variant_rows.py); the plain URL's refused when unknown
                rows = [table.find(args.url), *variant_rows.rows_of(table, [args.url])[0][1:]]
            finally:
                table.close()
        else:
            rows = [args.row]
        shown = []
        for row in rows:
            eng.prioritize(row, args.mode)
            info = eng.describe(row)
            shown.append((row, lane_label(eng.policy, info["lane"]), info["due_ms"]))
    finally:
        eng.close()
    for row, lane, due_ms in shown:
        print(f"row {row}: {args.mode}, now in lane {lane}, due {format_due(due_ms, wall_ms())}")
    return 0


def _prioritize_pages(args: argparse.Namespace) -> int:
    """``lanes prioritize`` by URL list or scope, or with a clear mode: what the server's
    ``POST /api/prioritize`` does, from the command line."""
    from .serve.recache import Ask, Pool, prioritize
    from .store import open_store

    if args.mode.startswith("clear-") and args.store is None:
        raise EngineValueError(f"--mode {args.mode} clears snapshots: give the store (--store"
                               " DIR)")
    if args.scope is not None:
        ask = Ask.scoped(args.scope, args.mode, args.add)
    else:
        try:
            lines = [args.url] if args.url is not None else [
                line.strip() for line in open(args.urls, encoding="utf-8") if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise EngineValueError(f"--urls {args.urls}: {e}") from None
        ask = Ask.listed(lines, args.mode, args.add)
    eng, table = _attached(args)
    store = None if args.store is None else open_store(_store_spec(args), create=False)
    try:
        result = prioritize(Pool(eng, table, _routes(args, eng), store), ask)
    finally:
        for part in (store, table, eng):
            if part is not None:
                part.close()
    print(json.dumps(result))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .serve.app import ServeOptions, run
    from .serve.door import Limits

    limits = Limits(header_s=args.header_timeout, idle_s=args.idle_timeout,
                    body_s=args.body_timeout, per_peer=args.max_connections_per_client)
    options = ServeOptions(name=args.name, store=args.store, redis=args.redis,
                           store_endpoint=args.store_endpoint,
                           local=args.local_name, host=args.host, port=args.port,
                           read_only=args.read_only, token_file=args.token_file,
                           max_stale=args.max_stale, processes=args.processes,
                           allowed_hosts=tuple(args.allowed_host), trust_proxy=tuple(
                               args.trust_proxy), limits=limits,
                           origin_timeout=args.origin_timeout,
                           origin_per_host=args.origin_per_host, discover=args.discover,
                           discover_rate=args.discover_rate, discover_max=args.discover_max,
                           render_on_miss=args.render_on_miss)
    parts = [what for what, given in (("the dashboard at /", args.name), ("snapshots at"
             " /render?url=URL", args.store)) if given]

    def announce(base: str) -> None:
        if args.command == "serve-metrics":
            print(f"serving metrics of {args.name!r} on {base}metrics", flush=True)
        else:
            print(f"lanes serve: {', '.join(parts)}, /metrics"
                  f"{' (read-only)' if args.read_only else ''} at {base}", flush=True)

    try:
        run(options, seconds=args.seconds, announce=announce)
    except KeyboardInterrupt:
        pass
    return 0


def _read_corpus(args: argparse.Namespace, routes: Any) -> Any:
    """The --corpus files and sitemap URLs as one corpus (duplicates dropped and reported)."""
    from .corpus.fetch import FetchLimits
    from .corpus.read import read_corpora

    limits = FetchLimits(timeout_s=args.fetch_timeout, deadline_s=args.fetch_deadline)
    c = read_corpora(args.corpus, base_url=args.base_url, routes=routes, fetch=limits)
    if c.duplicates:
        print(f"{c.duplicates} duplicate URL(s) dropped: {c.duplicate_note}", file=sys.stderr)
    if c.off_site:
        print(f"{c.off_site} sitemap(s) on another host skipped: {c.off_site_note}",
              file=sys.stderr)
    return c


def _pool(args: argparse.Namespace) -> int:
    from .corpus.routes import Routes
    from .pool import Pool, PoolOptions
    from .pool.worker import LOG_FORMAT
    from .report.view import LiveView, print_summary

    if args.checkpoint is None and args.checkpoint_every != PoolOptions().checkpoint_every_s:
        raise EngineValueError("--checkpoint-every needs --checkpoint PATH")
    options = PoolOptions(workers=args.workers, batch=args.batch, lease_s=args.lease,
                          start_method=args.start_method, checkpoint=args.checkpoint,
                          checkpoint_every_s=args.checkpoint_every, grace_s=args.grace,
                          per_host=args.per_host, delay_ms=args.delay_ms,
                          max_failures=args.max_failures, heartbeat_s=args.heartbeat)
    policy = None if args.lanes else LanePolicy(lanes_enabled=False)
    if args.refresh_corpus is not None and not args.corpus:
        raise EngineValueError("--refresh-corpus needs --corpus: the files or sitemap URLs to"
                               " read again")
    routes = Routes.load(args.routes) if args.routes else None
    render = _browser_render(args, routes) if args.browser else _command_render(args, routes)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    if args.fit_policy:
        policy = _fitted_policy(args, routes)
    if args.wait_replicas:
        if args.redis is None:
            raise EngineValueError("--wait-replicas is for pools on Redis (--redis URL)")
        args.redis = factory.with_wait(args.redis, args.wait_replicas)  # to every worker
    if args.redis is not None:
        pool = _pool_on_redis(args, render, options, policy, routes)
    elif args.shards is not None:
        raise EngineValueError("--shards is for pools on Redis (--redis URL)")
    elif args.local_name is not None:
        raise EngineValueError("--local-name is for pools on Redis (--redis URL): a pool on"
                               " shared memory names its files after its engine")
    elif args.resume:
        if args.checkpoint is None:
            raise EngineValueError("--resume needs --checkpoint FILE: the checkpoint to go on"
                                   " from")
        corpus = _corpus_once(args, routes) if args.corpus else None
        pool = Pool.resume(args.name, args.checkpoint, render, options, policy=policy,
                           capacity=args.capacity, routes=routes, corpus=corpus)
        _print_added(pool.added)
    else:
        if not args.corpus:
            raise EngineValueError("give the pages as --corpus FILE (CSV, JSONL, sitemap)"
                                   " or --resume from a checkpoint")
        c = _corpus_once(args, routes, nonempty=True)
        pool = Pool.create(args.name, c.urls, c.due_ms, c.interval_s, c.provenance, render,
                           options, policy=policy, capacity=args.capacity, routes=routes)
    if args.refresh_corpus is not None:
        from .pool.refresh import CorpusRefresh

        pool.refresh = CorpusRefresh(lambda: _read_corpus(args, routes), args.refresh_corpus,
                                     lambda: _attached(args), fit=args.fit_policy)
    server, scraped = None, None
    view = LiveView(force_plain=args.plain, store=_store_spec(args))
    try:
        if args.metrics_port is not None:
            from .report.metrics import start_server

            # Its own handle: a scrape in flight must never read a segment the pool unmapped.
            scraped = _engine(args)
            server = start_server(scraped, args.metrics_port, args.metrics_host, pool.local)
        where = "" if args.redis is None else f" on Redis {pool.engine.url}"
        print(f"pool {args.name!r}{where}: {len(pool.urls)} pages, {args.workers} workers"
              f" ({args.start_method}); SIGINT/SIGTERM stop it", flush=True)
        in_force = pool.engine.policy  # the summary names lanes by it; run() closes the engine
        summary = pool.run(seconds=args.seconds, on_tick=view.update)
    finally:
        view.close()
        if server is not None:
            server.shutdown()
        if scraped is not None:
            scraped.close()
        pool.close()  # a no-op after run(); removes everything if we failed before it
    print_summary(summary, in_force)
    return 0 if not summary["problems"] else 1


def _command_render(args: argparse.Namespace, routes: Any) -> Any:
    """A render by a Python callable (``--render module:func``) or a command."""
    from .corpus.rules import NO_RULES
    from .pool.render import RenderSpec

    ruled = [] if routes is None else [r.name for r in routes.routes if r.rules != NO_RULES]
    twice = [] if routes is None else [r.name for r in routes.routes if len(r.rules.variants) > 1]
    if twice:  # each page would be a row per variant, every one rendered the same way
        raise EngineValueError(f"route(s) {', '.join(twice)} name two variants, which only"
                               " --browser renders (a render command would get each URL as"
                               " 'URL mobile' too): drop variants or use --browser")
    if ruled:
        print(f"note: route(s) {', '.join(ruled)} set rules for the browser render; a render"
              " command does not apply them", file=sys.stderr)

    return RenderSpec(callable=args.render, command=args.command_template, timeout_s=args.timeout,
                      permanent_exits=tuple(args.permanent_exit),
                      permanent_errors=tuple(args.permanent_error))


def _browser_render(args: argparse.Namespace, routes: Any) -> Any:
    """``--browser``: Chromium checked, the routes' selectors asked of it and the store opened
    here, before anything is made."""
    from .pool.browser import BrowserSpec, check_selectors, describe_chromium
    from .store import open_store

    if args.store is None:
        raise EngineValueError("--browser needs --store DIR: where the snapshots go")
    store = _store_spec(args)
    spec = BrowserSpec(store, chromium=args.chromium, tabs=args.tabs,
                       page_timeout_s=args.page_timeout, recycle_after=args.recycle_after,
                       rss_limit_mb=args.browser_rss_mb, js_heap_mb=args.js_heap_mb,
                       keep_scripts=args.keep_scripts,
                       block_types=_listed(args.block_type, BrowserSpec.block_types),
                       block_hosts=_listed(args.block_host, BrowserSpec.block_hosts),
                       routes=None if routes is None else routes.to_json())
    if routes is not None:
        check_selectors(spec, routes)
    open_store(store).close()  # an unwritable store is refused here
    assert spec.chromium is not None  # resolved by the spec
    print(describe_chromium(spec.chromium), file=sys.stderr, flush=True)
    return spec


def _listed(given: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """A repeatable option's values: the default when not given, nothing for ``none``."""
    if given is None:
        return default
    return () if given == ["none"] else tuple(given)


def _print_added(added: Any) -> None:
    """What --corpus added to a resumed pool or to a Redis queue."""
    if added is not None:
        print(f"--corpus: {added.added} new URL(s) added, {added.known} known left alone"
              f" ({added.unparked} parked one(s) made due)", flush=True)


def _corpus_once(args: argparse.Namespace, routes: Any, nonempty: bool = False) -> Any:
    """The corpus of --corpus, read once per command (a sitemap over HTTP is fetched once);
    ``nonempty``: refused when it holds no URL."""
    got = getattr(args, "corpus_read", None)
    if got is None:
        got = args.corpus_read = _read_corpus(args, routes)
    if nonempty and not len(got):
        raise EngineValueError(f"the corpus is empty: {', '.join(args.corpus)} hold no URL")
    return got


def _fitted_policy(args: argparse.Namespace, routes: Any) -> LanePolicy:
    """``--fit-policy``: ``LanePolicy.fitted`` to the intervals of --corpus."""
    if not args.lanes:
        raise EngineValueError("--fit-policy fits the lanes' weights; it cannot go with"
                               " --no-lanes")
    if not args.corpus:
        raise EngineValueError("--fit-policy needs --corpus: the pages whose intervals it fits"
                               " (a pool joining a Redis queue keeps the queue's policy)")
    c = _corpus_once(args, routes, nonempty=True)
    return LanePolicy.fitted(c.interval_s, c.provenance)


def _pool_on_redis(args: argparse.Namespace, render: Any, options: Any, policy: Any,
                   routes: Any) -> Any:
    """``lanes pool NAME --redis URL``: create or grow the queue from --corpus, make it from
    a checkpoint (--resume), or join it."""
    from .pool import Pool

    if args.resume:
        if args.checkpoint is None:
            raise EngineValueError("--resume needs --checkpoint FILE: the checkpoint to make"
                                   " the new Redis queue from")
        corpus = _corpus_once(args, routes) if args.corpus else None
        pool = Pool.resume(args.name, args.checkpoint, render, options, policy=policy,
                           capacity=args.capacity, routes=routes, corpus=corpus,
                           redis=args.redis, local=args.local_name, shards=args.shards)
        _print_added(pool.added)
        return pool
    if not args.corpus:
        return Pool.join(args.redis, args.name, render, options, local=args.local_name,
                         policy=policy, shards=args.shards)
    c = _corpus_once(args, routes)
    pool = Pool.create(args.name, c.urls, c.due_ms, c.interval_s, c.provenance, render,
                       options, policy=policy, capacity=args.capacity, routes=routes,
                       redis=args.redis, local=args.local_name, shards=args.shards)
    _print_added(pool.added)
    return pool


def _add(args: argparse.Namespace) -> int:
    from .pool.grow import add_corpus

    eng = _engine(args)
    try:
        table = _url_source(args, eng)
        try:
            corpus = _read_corpus(args, _routes(args, eng))
            added = add_corpus(eng, table, corpus)
        finally:
            table.close()
    finally:
        eng.close()
    print(f"{args.name}: {added.added} new URL(s) added"
          + (f" as rows {added.first_row}..{added.first_row + added.added - 1}"
             if added.first_row is not None else "")
          + f"; {added.known} known left alone ({added.unparked} parked one(s) made due)")
    return 0


def _failures(args: argparse.Namespace) -> int:
    from .pool.failures import failure_rows
    from .pool.parts import PoolParts
    from .report.view import print_table

    parts = PoolParts.attach(args.name, local=_local(args), redis=args.redis)
    eng = parts.engine
    try:
        assert parts.failures is not None
        entries = parts.failures.entries()
        wanted = None if args.lane is None else _lane_number(eng, args.lane)
        rows = failure_rows(eng, entries, wall_ms(), wanted, args.limit, parts.board.clock)
    finally:
        parts.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print_table(f"{args.name}: {len(rows)} failing URL(s)"
                + (f" in lane {args.lane}" if args.lane else "") + ", most recent first",
                [(r["url"], str(r["failures"]), r["lane_label"] or "-", r["next_retry"],
                  r["last_error"]) for r in rows],
                ("url", "failures", "lane", "next retry", "last error"))
    return 0


def _lane_number(eng: QueueEngine, lane: str) -> int:
    """A lane given by name (``cold``, ``submitted/b0``), label (``submitted · 30–42 min``, as
    the tables show it) or number."""
    from .report.lanes import labels

    named = labels(eng.policy)
    names, shown = list(named), list(named.values())
    if lane.isdigit() and int(lane) < len(names):
        return int(lane)
    if lane in names:
        return names.index(lane)
    if lane in shown:
        return shown.index(lane)
    raise EngineValueError(f"no lane {lane!r}: the lanes are {', '.join(names)} (or as the"
                           " tables name them)")


def _restamp(args: argparse.Namespace) -> int:
    eng = _engine(args)
    try:
        print(json.dumps(eng.restamp(args.limit)))
    finally:
        eng.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args.seconds, workers=args.workers, plain=args.plain)


def _sim(args: argparse.Namespace) -> int:
    from .sim import run_cli

    return run_cli(args)


class ShowDefaults(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter without its noise: a default is added to an
    option's help only when it says something (not None, not a flag's, not an empty list) and
    the help does not already give it in its own words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default is None or action.nargs == 0 or default == [] or "default" in text
                or default is argparse.SUPPRESS or text is argparse.SUPPRESS
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL,
                                                                  argparse.ZERO_OR_MORE))):
            return text
        return f"{text} (default: %(default)s)"


SHOW_DEFAULTS = ShowDefaults


def _period(text: str) -> int:
    """A --refresh-corpus period, checked while the arguments are parsed."""
    from .pool.refresh import parse_duration

    try:
        return parse_duration(text)
    except EngineValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _corpus_arguments(p: argparse.ArgumentParser, routes: bool) -> None:
    p.add_argument("--corpus", action="append", default=[], metavar="FILE|URL",
                   help="CSV, JSONL or sitemap (index) XML, optionally .gz, or the http(s) URL"
                        " of a sitemap (index); repeatable")
    p.add_argument("--fetch-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a sitemap URL's connection and each read")
    p.add_argument("--fetch-deadline", type=float, default=300.0, metavar="SECONDS",
                   help="a sitemap URL with every child it lists, in all")
    p.add_argument("--base-url", metavar="URL",
                   help="what root-relative <loc>s of a sitemap resolve against,"
                        " e.g. https://shop.example/")
    if routes:  # `lanes add` uses the routes the pool started with
        p.add_argument("--routes", metavar="FILE",
                       help="TOML: URL patterns -> interval (and provenance); first match"
                            " wins over the corpus's own interval")


def _store_arguments(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--store", metavar="DIR|s3://BUCKET/PREFIX",
                   help=help_ + "; s3://: object storage every host shares, each URL's pointer"
                        " in the pool's Redis (--redis)")
    p.add_argument("--store-endpoint", metavar="URL",
                   help="with --store s3://: an S3-compatible service's endpoint (default"
                        " AWS; credentials from the AWS environment and config chain)")


def _store_spec(args: argparse.Namespace) -> Any:
    """The ``StoreSpec`` of ``--store`` (with ``--store-endpoint`` and ``--redis``), or None."""
    from .store import StoreSpec

    if getattr(args, "store", None) is None:
        return None
    spec = StoreSpec(args.store, getattr(args, "store_endpoint", None),
                     getattr(args, "redis", None))
    spec.check()
    return spec


def _redis_arguments(p: argparse.ArgumentParser, local: bool) -> None:
    p.add_argument("--redis", metavar="URL",
                   help="the queue NAME on this Redis server (redis://, rediss://, unix://,"
                        " redis+sentinel://host:port[,host:port]/MASTER)"
                        " instead of the shared-memory engine NAME")
    if local:  # what names this host's pool files (board, failure log, host gate)
        p.add_argument("--local-name", metavar="NAME",
                       help="with --redis: the name of this host's pool files in /dev/shm"
                            " (default NAME; two pools on one host need two)")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=45.0, help="how long the pool runs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")


def _sim_arguments(p: argparse.ArgumentParser) -> None:
    from .sim import add_arguments as _sim_arguments

    _sim_arguments(p)


def _pool_arguments(p: argparse.ArgumentParser) -> None:
    from .pool.supervisor import GROWTH_ROOM, START_METHODS, PoolOptions

    DEFAULTS = PoolOptions()  # the pool's own defaults, not a copy of them
    p.add_argument("name", help="the engine's segment name (created; removed at the end), or"
                                " with --redis the queue's (created or grown from --corpus,"
                                " joined without; never removed)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--render", metavar="MODULE:FUNCTION", help="called with (url, claim)")
    how.add_argument("--command", dest="command_template", metavar="TEMPLATE",
                     help="e.g. 'curl -fsS {url} -o /dev/null' ({url}, {row}, {lane}; no shell)")
    how.add_argument("--browser", action="store_true",
                     help="render in headless Chromium; snapshots into --store DIR")
    _browser_arguments(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per command render")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--batch", type=int, default=DEFAULTS.batch, help="rows per claim")
    p.add_argument("--lease", type=float, default=DEFAULTS.lease_s, help="lease seconds (renewed)")
    p.add_argument("--heartbeat", type=float, default=DEFAULTS.heartbeat_s, metavar="SECONDS",
                   help="with --redis: each worker's heartbeat period; a dead host's rows come"
                        " back within 3.5 periods, not a lease (0, or a lease of at most 2.5"
                        " periods: by lease expiry only)")
    p.add_argument("--start-method", choices=START_METHODS, default=DEFAULTS.start_method)
    p.add_argument("--checkpoint", metavar="PATH", help="checkpoint file (written atomically)")
    p.add_argument("--checkpoint-every", type=float, default=DEFAULTS.checkpoint_every_s,
                   metavar="SECONDS")
    p.add_argument("--resume", action="store_true",
                   help="start from --checkpoint (with --redis: as a new Redis queue)")
    p.add_argument("--grace", type=float, default=DEFAULTS.grace_s,
                   help="seconds to finish at a stop (a second signal ends it)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--capacity", type=int, default=None,
                   help="rows the segment can hold (None: room for the corpus twice over, and"
                        f" at least {GROWTH_ROOM}, for `lanes add`)")
    p.add_argument("--no-lanes", dest="lanes", action="store_false",
                   help="one EDF queue (lanes disabled)")
    p.add_argument("--fit-policy", action="store_true",
                   help="LanePolicy.fitted: fine TTL bands, lane weights fitted to the corpus's"
                        " intervals (again after each --refresh-corpus); docs/design.md")
    p.add_argument("--metrics-port", type=int, default=None, help="also serve /metrics")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    _corpus_arguments(p, routes=True)
    p.add_argument("--refresh-corpus", type=_period, default=None, metavar="PERIOD",
                   help="read --corpus again every PERIOD (30s, 15m, 1h, 1d) while the pool"
                        " runs: new URLs added, URLs gone from it made discovered")
    p.add_argument("--per-host", type=int, default=DEFAULTS.per_host, metavar="N",
                   help="at most N renders in flight per host, across all workers")
    p.add_argument("--delay-ms", type=int, default=DEFAULTS.delay_ms, metavar="MS",
                   help="at least MS between the starts of two renders to one host")
    p.add_argument("--max-failures", type=int, default=DEFAULTS.max_failures, metavar="N",
                   help="park a row after N failures (listed, not retried until a rush or"
                        " a re-add)")
    p.add_argument("--permanent-exit", type=int, action="append", default=[], metavar="STATUS",
                   help="a command exit status meaning a permanent failure (cold at once);"
                        " repeatable. HTTP 4xx found in a command's stderr is permanent anyway")
    p.add_argument("--permanent-error", action="append", default=[], metavar="EXCEPTION",
                   help="an exception type (name or module.Name) a render raises for a"
                        " permanent failure; repeatable")
    _redis_arguments(p, local=True)
    p.add_argument("--wait-replicas", type=int, default=0, metavar="N",
                   help="with --redis: every write waits until N replicas have it (WAIT);"
                        " fewer in 1 s is an error, as a lost connection is")
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="with --redis: the queue is spread over N shards (hash tags; on a"
                        " cluster, on different primaries), made so when this pool creates"
                        " it; default: as the queue is, a new one not sharded")


def _browser_arguments(p: Any) -> None:
    from .pool.browser import BLOCKED_HOSTS, BrowserSpec

    b = p.add_argument_group("browser render (--browser)")
    _store_arguments(b, "the snapshot store (created if missing)")
    b.add_argument("--chromium", metavar="PATH", default=BrowserSpec.chromium,
                   help="the browser binary (default: Chromium's headless shell when installed,"
                        " else /usr/bin/chromium)")
    b.add_argument("--tabs", type=int, default=BrowserSpec.tabs,
                   help="pages rendered at once by each worker (one browser per worker)")
    b.add_argument("--page-timeout", type=float, default=BrowserSpec.page_timeout_s,
                   metavar="S", help="a page not ready by then fails (transient)")
    b.add_argument("--recycle-after", type=int, default=BrowserSpec.recycle_after, metavar="N",
                   help="restart a worker's browser after N pages")
    b.add_argument("--browser-rss-mb", type=int, default=BrowserSpec.rss_limit_mb, metavar="MB",
                   help="restart a worker's browser when its process tree's RSS passes this")
    b.add_argument("--js-heap-mb", type=int, default=BrowserSpec.js_heap_mb, metavar="MB",
                   help="a page's JavaScript heap cap (past it, its tab crashes)")
    b.add_argument("--keep-scripts", action="store_true",
                   help="keep <script> tags in snapshots (default: only application/ld+json)")
    b.add_argument("--block-type", action="append", default=None, metavar="TYPE",
                   help="a CDP resource type never fetched, repeatable (default: Image, Media,"
                        " Font; --block-type none blocks none)")
    b.add_argument("--block-host", action="append", default=None, metavar="HOST",
                   help=f"a host (and subdomains) never fetched, repeatable (default:"
                        f" {len(BLOCKED_HOSTS)} analytics and ad hosts; --block-host none"
                        " blocks none)")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    _corpus_arguments(p, routes=False)
    _redis_arguments(p, local=False)


def _failures_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--lane", help="only this lane (name or number), e.g. cold")
    p.add_argument("--limit", type=int, default=50, help="at most this many, most recent first")
    p.add_argument("--json", action="store_true")
    _redis_arguments(p, local=True)


def _stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--prometheus", action="store_true", help="Prometheus text exposition")
    fmt.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    _store_arguments(p, "the pool's snapshot store: served staleness per lane and per route")
    _redis_arguments(p, local=True)


def _check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--repair", action="store_true",
                   help="first finish or take back the writes that killed processes left half"
                        " done, and say what was repaired")
    _redis_arguments(p, local=False)


def _cleanup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="even if its pool still runs")


def _restamp_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=5000)
    _redis_arguments(p, local=False)


def _prioritize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--url", help="the page's URL (needs a pool's URL table)")
    p.add_argument("--row", type=int, help="the page's row id")
    p.add_argument("--urls", metavar="FILE", help="the pages' URLs, one a line (at most 10,000)")
    p.add_argument("--scope", metavar="S",
                   help="every page under a URL prefix ending in * (https://host/path*), or"
                        " route:NAME")
    p.add_argument("--mode", choices=("rush", "wait", "clear-and-rush", "clear-and-wait"),
                   default="rush",
                   help="rush: urgent lane, due now (the snapshot served meanwhile); wait:"
                        " due now in its own lane; clear-and-*: drop the snapshots first")
    p.add_argument("--add", action="store_true",
                   help="add listed URLs the pool does not know (on its hosts) as submitted")
    _store_arguments(p, "the snapshot store (for the clear modes)")
    _redis_arguments(p, local=False)


def _serve_arguments(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--port", type=int, default=port, help="0: any free port")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; anything but loopback needs --token-file")
    p.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--token-file", metavar="F",
                   help="a file (mode 0600) holding the token: a login form sets a session"
                        " cookie; also Authorization: Bearer, and X-Prerender-Token on the"
                        " snapshot routes")
    p.add_argument("--read-only", action="store_true",
                   help="show no action and refuse every POST (403)")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="N server processes on one port (SO_REUSEPORT)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name the dashboard, its API, /login and /metrics answer to,"
                        " besides loopback names and the bound address (repeatable); any"
                        " other Host gets 421")
    p.add_argument("--trust-proxy", action="append", default=[], metavar="CIDR",
                   help="honour X-Forwarded-For and X-Forwarded-Proto from peers in this"
                        " network (repeatable); ignored from anyone else")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="a request's headers must arrive within S seconds (else 408)")
    p.add_argument("--idle-timeout", type=float, default=60.0, metavar="S",
                   help="an idle keep-alive connection is closed after S seconds")
    p.add_argument("--body-timeout", type=float, default=10.0, metavar="S",
                   help="a POST body must arrive within S seconds (else 408)")
    p.add_argument("--max-connections-per-client", type=int, default=256, metavar="N",
                   help="open connections one address may hold (more get 429); a trusted"
                        " proxy is exempt")
    _redis_arguments(p, local=True)
    p.set_defaults(fn=_serve, store=None, store_endpoint=None, max_stale=None,
                   origin_timeout=10.0, origin_per_host=8, discover=False, discover_rate=60,
                   discover_max=100_000, render_on_miss=0.0)


def _serve_command_arguments(p: argparse.ArgumentParser) -> None:
    from .serve import DEFAULT_PORT

    p.add_argument("name", nargs="?", help="the pool's engine (segment, or with --redis the"
                                           " queue): its dashboard and metrics")
    _serve_arguments(p, DEFAULT_PORT)
    _store_arguments(p, "the snapshot store: GET /render?url=URL and GET /URL")
    p.add_argument("--max-stale", type=float, metavar="F",
                   help="a snapshot older than F x its interval is not served: with NAME the"
                        " origin's own answer is relayed, else 503")
    p.add_argument("--origin-timeout", type=float, default=10.0, metavar="S",
                   help="with NAME: a miss on the pool's hosts relays the origin's answer,"
                        " fetched within S seconds (else 504)")
    p.add_argument("--origin-per-host", type=int, default=8, metavar="N",
                   help="origin fetches at once per host (more: 503 with Retry-After)")
    p.add_argument("--discover", action="store_true",
                   help="with NAME: a miss on the pool's hosts adds the page as discovered"
                        " (normalised, tracking parameters dropped, its route's interval)")
    p.add_argument("--discover-rate", type=int, default=60, metavar="N",
                   help="new URLs discovered per host per minute, at most")
    p.add_argument("--discover-max", type=int, default=100_000, metavar="N",
                   help="add nothing while the pool holds N discovered rows")
    p.add_argument("--render-on-miss", type=float, default=0.0, metavar="S",
                   help="with --discover: rush a missed page and wait up to S seconds for its"
                        " snapshot before relaying the origin's answer (0: never wait)")


def _token(args: argparse.Namespace) -> int:
    from .serve.auth import TOKEN_BYTES, write_token

    write_token(args.file, replace=args.replace)
    print(f"wrote a random {TOKEN_BYTES}-byte token to {args.file} (mode 0600): give it to"
          f" lanes serve --token-file {args.file}")
    return 0


def _token_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="where to write it (mode 0600; an existing file is kept)")
    p.add_argument("--replace", action="store_true",
                   help="replace an existing file (every session of a server reading it ends)")


def _store(args: argparse.Namespace) -> int:
    """``lanes store gc STORE`` and ``lanes store migrate DIR s3://...``."""
    from .store import StoreSpec, open_store

    if args.action == "gc":
        with open_store(_store_spec(args), create=False) as store:
            print(json.dumps(store.gc(args.grace)))
        return 0
    from .store.migrate import migrate

    target = StoreSpec(args.target, args.store_endpoint, args.redis)
    if not target.shared:
        raise EngineValueError(f"lanes store migrate moves a directory to s3://BUCKET/PREFIX,"
                               f" got {args.target!r}")
    with open_store(args.source, create=False) as source, open_store(target) as shared:
        print(json.dumps(migrate(source, shared, lambda n, of: print(
            f"lanes store migrate: {n} of {of}", file=sys.stderr, flush=True))))
    return 0


def _store_command_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True)
    gc = actions.add_parser("gc", formatter_class=SHOW_DEFAULTS,
                            help="remove the blobs no pointer names, older than --grace")
    gc.add_argument("store", help="DIR or s3://BUCKET/PREFIX")
    gc.add_argument("--grace", type=_period, default=3600, metavar="PERIOD",
                    help="keep unnamed blobs younger than this (a put in flight names its blob"
                         " within it; at least 1m)")
    move = actions.add_parser("migrate", formatter_class=SHOW_DEFAULTS,
                              help="put every snapshot of a directory store into an S3 store")
    move.add_argument("source", metavar="DIR")
    move.add_argument("target", metavar="s3://BUCKET/PREFIX")
    for q in (gc, move):
        q.add_argument("--store-endpoint", metavar="URL",
                       help="an S3-compatible service's endpoint (default AWS)")
        q.add_argument("--redis", metavar="URL", help="the Redis holding the store's pointers"
                                                       " (the pool's)")


def _serve_metrics_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    _serve_arguments(p, 9464)


@dataclass(frozen=True)
class Command:
    """One subcommand of ``lanes``."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None]


COMMANDS = (
    Command("demo", "a forked pool over a synthetic corpus, with a live view",
            _demo, _demo_arguments),
    Command("sim", "the lane simulator: policies x capacities -> age / TTL",
            _sim, _sim_arguments),
    Command("pool", "run a forked render pool over a corpus or a checkpoint",
            _pool, _pool_arguments),
    Command("add", "add URLs to a running pool (known URLs left alone)",
            _add, _add_arguments),
    Command("failures", "failing URLs: count, last error, next retry",
            _failures, _failures_arguments),
    Command("stats", "per-lane statistics of an engine",
            _stats, _stats_arguments),
    Command("check", "verify every invariant of an engine",
            _check, _check_arguments),
    Command("cleanup", "remove a segment left by a crashed owner",
            _cleanup, _cleanup_arguments),
    Command("restamp", "move rows written with lanes off into their lanes",
            _restamp, _restamp_arguments),
    Command("prioritize", "rush a page to the urgent lane, or make it due now",
            _prioritize, _prioritize_arguments),
    Command("serve", "one server: the dashboard at / (with NAME), /metrics, and the snapshots"
            " of --store DIR", _serve, _serve_command_arguments),
    Command("serve-metrics", "lanes serve NAME on port 9464 (its /metrics)",
            _serve, _serve_metrics_arguments),
    Command("token", "write a random token for lanes serve --token-file",
            _token, _token_arguments),
    Command("store", "a snapshot store's upkeep: gc (unnamed blobs), migrate DIR s3://...",
            _store, _store_command_arguments),
)
"""Every subcommand: its name, its line in ``lanes --help``, what runs it and what adds its
arguments. Each imports what it needs when it runs (a base install, without the extras, runs
every ``--help``)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lanes", description=__doc__,
                                     formatter_class=SHOW_DEFAULTS)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, formatter_class=SHOW_DEFAULTS)
        p.set_defaults(fn=command.run)
        command.arguments(p)
    args: Any = parser.parse_args(argv)
    # SIGTERM before a command installs its own handling (a pool that is still starting) unwinds
    # like Ctrl-C, so whatever was created is removed on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        status: int = args.fn(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except BrokenPipeError:
        # The reader left (``lanes stats NAME | head``): the recipe of the ``signal`` docs,
        # stdout to devnull so the exit flush stays quiet, and the status a SIGPIPE death has.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except ModuleNotFoundError as exc:
        extra = _extra_of(args.command, exc.name or "")
        if extra is None:
            raise
        print(f"lanes {args.command}: {MissingExtra(exc.name or '', extra)}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"lanes {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lanes {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


EXTRAS = {"aiohttp": "browser", "defusedxml": "pool", "rich": "pool", "jinja2": "serve",
          "prometheus_client": "metrics", "redis": "redis", "matplotlib": "plot", "boto3": "s3",
          "botocore": "s3"}
"""The optional package a command may miss -> the extra that installs it (pyproject.toml)."""


def _extra_of(command: str, module: str) -> str | None:
    """The extra to install for ``module`` (None: not an optional package of ours)."""
    extra = EXTRAS.get(module.partition(".")[0])
    return "serve" if extra not in (None, "s3") and command == "serve" else extra


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
