"""A corpus that grows: URLs added to a running pool (``lanes add``) or to a resumed one.

New URLs become new rows through the engine's URL table (``QueueEngine.row_urls``, then
``RowUrls.add``): each URL is published before its row can be claimed, so a worker never claims
a row whose URL it cannot find. Known URLs are left alone, except a row parked after
``--max-failures``: adding its URL again is how an operator says "try it again", so it is made
due now. On shared memory two adders are serialised by a lock on the URL table, so the new
rows' ids follow the table's last row; on Redis one FCALL adds the new URLs and their rows
together, from any host.

The pool's routes (``--routes``) are kept with its URLs (``RowUrls.store_routes``), so rows
added later get the intervals the pool started with, and a URL whose route names two variants
gets its row per variant (``engine.corpus.variant_rows``) however it is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import RowUrls
from ..corpus.model import Corpus
from ..corpus.routes import Routes
from ..corpus.variant_rows import extra_rows, with_variants


@dataclass(frozen=True)
class Added:
    """What adding a corpus did."""

    added: int
    known: int
    unparked: int
    first_row: int | None


def store_routes(urls: RowUrls, routes: Routes | None) -> None:
    """Keep a pool's routes with its URLs (nothing when it has none)."""
    if routes is not None:
        urls.store_routes(routes.to_json())


def stored_routes(urls: RowUrls) -> Routes | None:
    """The routes the pool over ``urls`` was started with, or None."""
    text = urls.routes()
    return None if text is None else Routes.from_json(text)


def add_corpus(eng: Any, urls: RowUrls, corpus: Corpus, routes: Routes | None = None) -> Added:
    """Add ``corpus``'s new URLs, with a row for each further variant their route names, to the
    pool whose URL table is ``urls`` (``eng.row_urls()``; ``eng`` is kept for the callers that
    name it). ``routes``: the pool's (None: the ones stored with its URLs)."""
    if routes is None:
        routes = stored_routes(urls)
    keys, cols = with_variants(corpus.urls, routes, corpus.due_ms, corpus.interval_s,
                               corpus.provenance)
    return add_urls(urls, keys, *cols)


def add_variant_rows(urls: RowUrls, keys: list[str], routes: Routes | None, due_ms: Any,
                     interval_s: Any, provenance: Any) -> Added | None:
    """Add the rows of variants a pool's ``keys`` (its rows' keys, a checkpoint's) lack under
    ``routes`` (a route that names a second variant since): each due when its URL is."""
    more, cols = extra_rows(keys, routes, due_ms, interval_s, provenance)
    return add_urls(urls, more, *cols) if more else None


def add_urls(urls: RowUrls, new_urls: list[str], due_ms: Any, interval_s: Any, provenance: Any,
             failures: Any = None) -> Added:
    """Add the URLs not known yet, with their rows (``RowUrls.add``). ``first_row`` is set when
    the new rows are consecutive (another host adding meanwhile may interleave its own)."""
    got = urls.add(new_urls, due_ms, interval_s, provenance, failures)
    new = np.sort(got.rows[got.new])
    dense = len(new) > 0 and int(new[-1] - new[0]) == len(new) - 1
    return Added(got.added, got.known, got.unparked, int(new[0]) if dense else None)
