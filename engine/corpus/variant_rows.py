"""One engine row, and one snapshot, per (URL, variant): how a variant is named in a row's key.

Why this module exists: a route with ``variants = ["desktop", "mobile"]`` renders each of its
pages twice, as Googlebot's desktop and smartphone crawlers see them, and each render is a job
of its own (scheduled in its lane, counted in capacity, failing and retried alone) with a
snapshot of its own. The engine schedules rows and the URL table names each row by one string,
the store keeps a snapshot per string: so the variant goes into that string, the *row key*.

* The **plain URL** is the key of a URL's desktop row when its route names desktop, else of its
  only variant (a route with ``variants = ["mobile"]`` keeps the key it had), else of its one
  row as Chromium renders it (a route with no variants, unchanged).
* Any **other variant**'s key is ``"URL VARIANT"`` (``"https://shop.example/p/1 mobile"``): a
  normalised URL never holds a space (urlnorm.py percent-encodes it), so a key is split at its
  first space without ambiguity, and a variant key never equals a URL.

So every table, store and test of routes without variants reads as it did, a URL's rows are
found by a lookup of its few possible keys (:func:`keys_of`), and a scope ``https://host/p/*``
matches the variant keys too, since they start with their URL. Why not a variant column beside
the URL: the URL tables (shared memory and Redis, with its sorted index), the failure log and
both stores key by one string; a second column would change each of them and every lookup, and
buy nothing the key does not say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import numpy as np

from .model import IntArray
from .routes import Routes
from .rules import VARIANT_NAMES

SEPARATOR: Final = " "
PLAIN_FIRST: Final = ("desktop", "mobile")
"""Which of a route's variants keeps the plain URL as its key: the first of these it names."""


def plain_variant(variants: Sequence[str]) -> str | None:
    """The variant a route's plain-URL rows render as (None: no variants, Chromium as it is)."""
    return next((v for v in PLAIN_FIRST if v in variants), None)


def key_of(url: str, variant: str | None, variants: Sequence[str]) -> str:
    """The row key of ``url`` rendered as ``variant``, one of its route's ``variants``."""
    return url if variant == plain_variant(variants) else f"{url}{SEPARATOR}{variant}"


def split(key: str) -> tuple[str, str | None]:
    """``(url, variant)`` of a row key; the variant is None for a plain URL (its route says
    which one that is: :func:`variant_of`)."""
    url, sep, variant = key.partition(SEPARATOR)
    return url, (variant if sep else None)


def url_of(key: str) -> str:
    """The URL a row key renders."""
    return key.partition(SEPARATOR)[0]


def variant_of(key: str, variants: Sequence[str]) -> str | None:
    """The variant row ``key`` renders as, given its route's ``variants``."""
    named = split(key)[1]
    return named if named is not None else plain_variant(variants)


def keys_of(url: str) -> list[str]:
    """Every key a URL's rows and snapshots may have (a key of a variant: itself), for finding
    or clearing all of them without knowing the URL's route."""
    if SEPARATOR in url:
        return [url]
    # (desktop, first in PLAIN_FIRST, is always a plain URL: no "URL desktop" key exists)
    return [url, *(f"{url}{SEPARATOR}{v}" for v in VARIANT_NAMES if v != PLAIN_FIRST[0])]


def all_keys(urls: Iterable[str]) -> list[str]:
    """:func:`keys_of` of each URL, in order."""
    return [k for u in urls for k in keys_of(u)]


class _Finds(Protocol):
    def find_many(self, urls: Sequence[str]) -> IntArray: ...


def rows_of(table: _Finds, urls: Sequence[str]) -> list[list[int]]:
    """For each of ``urls``, the rows of every key of it a URL table (``RowUrls``) holds,
    plain URL first ([] where none): one ``find_many`` of all their keys."""
    keys = [keys_of(u) for u in urls]
    found = table.find_many([k for each in keys for k in each]).tolist()
    out, at = [], 0
    for each in keys:
        out.append([r for r in found[at:at + len(each)] if r >= 0])
        at += len(each)
    return out


def extra_rows(keys: Sequence[str], routes: Routes | None,
               *columns: Any) -> tuple[list[str], list[Any]]:
    """The rows a URL's route adds beside its plain-URL row: ``(keys, columns)`` of one row per
    further variant of each URL of ``keys`` (variant keys among them are skipped). A column
    may be a scalar or None (kept as it is, for every row) or one value per key (the new row
    takes its URL's)."""
    if routes is None or not any(len(r.rules.variants) > 1 for r in routes.routes):
        return [], [None if c is None or np.ndim(c) == 0 else np.asarray(c)[:0]
                    for c in columns]
    ids = routes.match(keys).tolist()
    out: list[str] = []
    source: list[int] = []
    for i, (key, r) in enumerate(zip(keys, ids, strict=True)):
        if r < 0 or SEPARATOR in key:
            continue
        variants = routes.routes[r].rules.variants
        for v in variants:
            if v != plain_variant(variants):
                out.append(f"{key}{SEPARATOR}{v}")
                source.append(i)
    pick = np.array(source, np.int64)
    return out, [c if c is None or np.ndim(c) == 0 else np.asarray(c)[pick] for c in columns]


def with_variants(keys: Sequence[str], routes: Routes | None,
                  *columns: Any) -> tuple[list[str], list[Any]]:
    """``keys`` and their :func:`extra_rows` after them, columns alike."""
    more, cols = extra_rows(keys, routes, *columns)
    if not more:
        return list(keys), list(columns)
    return [*keys, *more], [c if c is None or np.ndim(c) == 0 else
                            np.concatenate([np.asarray(c), m]) for c, m in
                            zip(columns, cols, strict=True)]


def mobile_key(url: str) -> str:
    """The key of ``url``'s mobile snapshot when its route renders desktop too (with mobile
    only, its plain URL is the mobile one): what ``lanes serve`` looks up for a phone."""
    return f"{url}{SEPARATOR}mobile"


__all__ = ["PLAIN_FIRST", "SEPARATOR", "all_keys", "extra_rows", "key_of", "keys_of",
           "mobile_key", "plain_variant", "rows_of", "split", "url_of", "variant_of",
           "with_variants"]
