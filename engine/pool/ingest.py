"""Corpus ingest: turn the files an operator already has into columns ``Engine.add_many`` takes.

Why this module exists: a render pool is started from a corpus of pages, and those pages live in
CSV or JSONL exports and in sitemap XML. Every one of those files is written by someone else, so
every element is checked before anything is returned (a corpus either loads whole or not at all),
and every refusal is a :class:`~engine.errors.CorpusError` of the form ``path:line: what``.

Sitemaps come from the open web, so they are parsed as hostile input: through defusedxml's
expat reader with DTDs, entity declarations and external references forbidden (billion laughs
and XXE are refused, never expanded), with the protocol's size limits (50 MiB uncompressed,
also after gunzip, and 50,000 entries per file).

**Sitemaps over HTTP.** A corpus source that is an http(s) URL is fetched
(``engine.pool.fetch``: timeouts, a deadline, bounded redirects, gzip, the size limit enforced
while the body streams), and so is every child of a fetched index that lies on the index's own
host (after redirects); a child on another host is skipped and counted (``Corpus.off_site``),
as the protocol allows an index to list only its own host's sitemaps. A failed fetch is a
``CorpusError`` naming the URL and why. An index read from a file is followed on disk only.

**The corpus directory.** The directory of each file given to :func:`read_corpus` /
:func:`read_corpora` mirrors the site root, or a subpath of it, as a download of the site
would. An index child named by an http(s) URL or a root-relative path (``/en/sitemap.xml``) is
looked for by the longest suffix of its URL path (percent-decoded) that exists under that
directory, so a project site under a subpath resolves (the index ``name/sitemap.xml`` listing
``https://host/name/en/sitemap.xml`` finds ``name/en/sitemap.xml``); with ``base_url``, a URL
that lies below its path is taken relative to it first (``https://site/blog/`` maps
``/blog/x.xml`` to ``x.xml``). A relative child (``en/sitemap.xml``) is relative to its index;
a ``file://`` child is taken as given. A URL child found nowhere else is looked for by its
basename next to the index (a flat download). A suffix or a basename is never the index itself
or one of its ancestors. Whatever the spelling, a child whose real path (symlinks resolved)
lies outside the corpus directory is refused before it is opened: an index is input from the
web and must not make the tool read ``/etc/hostname``.

Choices the issue left open (the readers' docstrings give the rest):

* An absent due time is the reader's ``now_ms``; a due time that is present but empty or null
  is an error, never 0 and never now. Sitemaps carry no due time: ``<lastmod>`` says when the
  *page* changed, not when *our render* goes stale, and a page never rendered is due now.
* Every URL is normalised (:func:`normalize_url`: lowercase scheme and host, IDNA host, no
  default port, non-ASCII percent-encoded, escapes' hex uppercase; nothing decoded, nothing
  reordered), so two spellings of one page are one row and routes match one spelling.
* Duplicate URLs (after normalisation) are dropped by the readers, first occurrence wins, and
  counted on the corpus (``duplicates``, ``duplicate_note`` naming the first repeat and where it
  was first seen): real sitemaps repeat pages (a post in two category sitemaps), and refusing a
  whole site for that helped no one. A :class:`Corpus` built directly, and
  :meth:`Corpus.concat`, still refuse a duplicate: there the caller assembled the rows and a
  repeat is a bug to name, not web noise to tidy.
* Leading whitespace, blank lines and a UTF-8 BOM before ``<?xml`` are skipped (expat refuses
  them; generators emit them); error lines still count the file's real lines.
* A root-relative ``<loc>`` in a urlset (``/about/``) needs ``base_url`` to say which site it
  belongs to, and is refused without it.
* Unknown CSV columns and JSONL keys are refused, so a typo such as ``due_sm`` cannot quietly
  turn into "due now".

**Routes** (``engine/pool/routes.py``) set per-route intervals after reading: a route's
interval wins over what the file gave (``<changefreq>``, ``interval_s``), which wins over the
missing-changefreq default. ``Corpus.route`` says which route each row took (-1: none).

The result, :class:`Corpus`, is plain data (a list and four numpy arrays) and pickles by value,
so the URL of each row reaches workers under fork, spawn and forkserver alike.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import posixpath
import re
import zlib
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final
from urllib.parse import unquote, urljoin, urlsplit
from xml.sax import SAXParseException
from xml.sax.handler import ContentHandler, feature_namespaces
from xml.sax.xmlreader import AttributesNSImpl, Locator

import numpy as np
import numpy.typing as npt

from ..checks import is_int, wall_ms
from ..errors import CorpusError, EngineTypeError, EngineValueError
from ..keys import STRIDE, as_int64_array, check_due_array, check_due_ms
from ..policy import MAX_INTERVAL_S, PROVENANCES
from ..urlnorm import MAX_URL_CHARS as MAX_URL_CHARS
from ..urlnorm import BadUrl, normal_url
from ..urlnorm import normalize_url as normalize_url
from .fetch import Fetcher, FetchLimits, is_http_url
from .routes import Routes

IntArray = npt.NDArray[np.int64]
U8Array = npt.NDArray[np.uint8]
I16Array = npt.NDArray[np.int16]
PathLike = str | os.PathLike[str]

SITEMAP_NS: Final = "http://www.sitemaps.org/schemas/sitemap/0.9"

DAY_S: Final = 86_400
CHANGEFREQ_INTERVALS: Final[Mapping[str, int]] = {
    "always": 3600,  # a render pool cannot follow "on every access"; hourly is the tightest
    "hourly": 3600,
    "daily": DAY_S,
    "weekly": 7 * DAY_S,
    "monthly": 30 * DAY_S,
    "yearly": 365 * DAY_S,
    "never": 365 * DAY_S,  # archived pages still pick up template changes once a year
}
"""``<changefreq>`` word -> refresh interval in seconds (``changefreq_map`` overrides entries)."""

MISSING_CHANGEFREQ: Final = "daily"
"""A ``<url>`` without ``<changefreq>`` is read as this word (so overriding it moves both)."""

MAX_SITEMAP_URLS: Final = 50_000
"""Entries per sitemap file (and sitemaps per index): the protocol's limit, the default cap."""

MAX_SITEMAP_BYTES: Final = 50 * 1024 * 1024
"""A sitemap's size, uncompressed (also after gunzip): the protocol's 52,428,800 bytes."""

MAX_INDEX_DEPTH: Final = 3
"""Sitemap indexes nested above a urlset. The protocol allows 1; a little slack, no more."""

MAX_LINE_BYTES: Final = 1 << 20
"""A CSV/JSONL line longer than this is refused before it is held in memory."""

MAX_TABULAR_GZ_BYTES: Final = 1 << 31
"""Decompressed size of a gzipped CSV/JSONL, so a small bomb cannot inflate without bound."""

COLUMNS: Final = ("url", "interval_s", "provenance", "due_ms")
REQUIRED_COLUMNS: Final = ("url", "interval_s")

_PROVENANCE_CODE: Final = {name: code for code, name in enumerate(PROVENANCES)}
_SUBMITTED: Final = _PROVENANCE_CODE["submitted"]
_DIGITS = re.compile(r"[0-9]{1,20}")
_ABSENT: Final = object()
_PIP_HINT: Final = "pip install 'render-lanes[pool]'"


# -- the corpus --------------------------------------------------------------------------------


@final
@dataclass(frozen=True, eq=False, repr=False)
class Corpus:
    """Parallel columns of a corpus, ready for ``eng.add_many(c.due_ms, c.interval_s,
    c.provenance)``; row ``i`` of the engine batch is ``c.urls[i]``.

    Constructing one checks every column (lengths, ranges, URL syntax, unique URLs), normalises
    the URLs (:func:`normalize_url`, so a corpus only ever holds normal URLs) and freezes the
    arrays; a duplicate is refused here, unlike in the readers, which drop and count it. The
    readers and :meth:`concat` build from already-checked parts. ``urls`` is a plain list for
    speed: treat it as read-only, like the arrays.

    ``route`` is the :class:`~engine.pool.routes.Routes` index each row matched (-1: none; all
    -1 when no routes were given). ``duplicates`` and ``duplicate_note`` say what a reader
    dropped; they describe how the rows were read, so equality compares the rows only.
    """

    urls: list[str]
    interval_s: IntArray
    provenance: U8Array  # PROVENANCES codes: 0 = submitted, 1 = discovered
    due_ms: IntArray
    route: I16Array = None  # type: ignore[assignment]  # None given: no route, all -1
    duplicates: int = 0  # rows the reader dropped as repeats of an earlier URL
    duplicate_note: str | None = None  # the first of them and where it was first seen
    off_site: int = 0  # sitemaps an index listed on another host, skipped (fetched indexes)
    off_site_note: str | None = None  # the first of them and the index that listed it

    def __post_init__(self) -> None:
        if isinstance(self.urls, (str, bytes)) or not isinstance(self.urls, Sequence):
            raise EngineTypeError("urls must be a list of strings")
        urls = []
        for i, url in enumerate(self.urls):
            normal = _check_url(f"urls[{i}]", url)
            if url != url.strip():
                raise EngineValueError(f"urls[{i}] has surrounding whitespace: {url!r}")
            urls.append(normal)
        n = len(urls)
        interval = as_int64_array(self.interval_s, "interval_s")
        due = check_due_array(self.due_ms)
        prov = as_int64_array(self.provenance, "provenance")
        route = (np.full(n, -1, np.int64) if self.route is None
                 else as_int64_array(self.route, "route"))
        for what, arr in (("interval_s", interval), ("provenance", prov), ("due_ms", due),
                          ("route", route)):
            if len(arr) != n:
                raise EngineValueError(f"{what} has {len(arr)} elements, urls has {n}")
        if n and (interval.min() < 1 or interval.max() > MAX_INTERVAL_S):
            raise EngineValueError(f"interval_s must lie in [1, {MAX_INTERVAL_S}]")
        if n and ((prov != 0) & (prov != 1)).any():
            raise EngineValueError("provenance codes must be 0 (submitted) or 1 (discovered)")
        if n and (route.min() < -1 or route.max() > np.iinfo(np.int16).max):
            raise EngineValueError("route must hold route indexes (int16), or -1 for none")
        if not is_int(self.duplicates) or self.duplicates < 0:
            raise EngineValueError(f"duplicates must be a count >= 0, got {self.duplicates!r}")
        if not is_int(self.off_site) or self.off_site < 0:
            raise EngineValueError(f"off_site must be a count >= 0, got {self.off_site!r}")
        for what, note in (("duplicate_note", self.duplicate_note),
                           ("off_site_note", self.off_site_note)):
            if note is not None and not isinstance(note, str):
                raise EngineTypeError(f"{what} must be a str or None")
        _refuse_duplicates([urls])
        _freeze(self, urls, interval, prov.astype(np.uint8), due, route.astype(np.int16),
                _Notes(self.duplicates, self.duplicate_note, self.off_site, self.off_site_note))

    @classmethod
    def _trusted(cls, urls: list[str], interval_s: IntArray, provenance: U8Array,
                 due_ms: IntArray, route: I16Array | None = None,
                 notes: _Notes | None = None) -> Corpus:
        """Skip the per-URL checks for parts the readers (or another Corpus) already checked."""
        self = object.__new__(cls)
        if route is None:
            route = np.full(len(urls), -1, np.int16)
        _freeze(self, urls, interval_s, provenance, due_ms, route, notes or _Notes())
        return self

    @classmethod
    def empty(cls) -> Corpus:
        return cls._trusted([], np.empty(0, np.int64), np.empty(0, np.uint8),
                            np.empty(0, np.int64))

    @classmethod
    def concat(cls, corpora: Iterable[Corpus]) -> Corpus:
        """One corpus of all rows, in order; a URL in two of them is refused (both named).
        The route indexes are kept as they are (they mean something only if every part was
        read with the same routes); the duplicate counts add up, the first note is kept."""
        parts = list(corpora)
        for p in parts:
            if not isinstance(p, Corpus):
                raise EngineTypeError(f"concat takes Corpus objects, got {type(p).__name__}")
        if not parts:
            return cls.empty()
        _refuse_duplicates([p.urls for p in parts])
        return cls._trusted(
            [u for p in parts for u in p.urls],
            np.concatenate([p.interval_s for p in parts]),
            np.concatenate([p.provenance for p in parts]),
            np.concatenate([p.due_ms for p in parts]),
            np.concatenate([p.route for p in parts]),
            _Notes(sum(p.duplicates for p in parts),
                   next((p.duplicate_note for p in parts if p.duplicate_note), None),
                   sum(p.off_site for p in parts),
                   next((p.off_site_note for p in parts if p.off_site_note), None)),
        )

    def select(self, mask: npt.ArrayLike) -> Corpus:
        """The rows where ``mask`` (booleans, one per row) is true, in order; the reader's
        counts stay with the whole corpus, not with a part of it."""
        keep = np.asarray(mask, dtype=np.bool_)
        if keep.shape != (len(self),):
            raise EngineValueError(f"mask must hold {len(self)} booleans, got shape {keep.shape}")
        return Corpus._trusted([u for u, k in zip(self.urls, keep.tolist(), strict=True) if k],
                               self.interval_s[keep], self.provenance[keep], self.due_ms[keep],
                               self.route[keep])

    def __len__(self) -> int:
        return len(self.urls)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Corpus):
            return NotImplemented
        return (self.urls == other.urls
                and np.array_equal(self.interval_s, other.interval_s)
                and np.array_equal(self.provenance, other.provenance)
                and np.array_equal(self.due_ms, other.due_ms)
                and np.array_equal(self.route, other.route))

    __hash__ = None  # type: ignore[assignment]  # equal by content, and the list is mutable

    def __repr__(self) -> str:
        counts = self.statistics()["provenance"]
        return f"<Corpus {len(self)} rows: {', '.join(f'{v} {k}' for k, v in counts.items())}>"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickle by value and come back frozen, so spawn/forkserver workers get the same object.
        return (_rebuild, (self.urls, self.interval_s, self.provenance, self.due_ms, self.route,
                           self.duplicates, self.duplicate_note, self.off_site,
                           self.off_site_note))

    def statistics(self) -> dict[str, Any]:
        """Rows per provenance, per interval and per route index (-1: none), the span of due
        times (None when empty), the duplicates a reader dropped and the sitemaps on other
        hosts it skipped."""
        prov = {name: int((self.provenance == code).sum())
                for name, code in _PROVENANCE_CODE.items()}
        values, counts = np.unique(self.interval_s, return_counts=True)
        routes, per_route = np.unique(self.route, return_counts=True)
        return {
            "rows": len(self),
            "provenance": prov,
            "interval_s": {int(v): int(c) for v, c in zip(values, counts, strict=True)},
            "route": {int(r): int(c) for r, c in zip(routes, per_route, strict=True)},
            "due_ms": ({"min": int(self.due_ms.min()), "max": int(self.due_ms.max())}
                       if len(self) else None),
            "duplicates": self.duplicates,
            "off_site": self.off_site,
        }

    def describe(self) -> str:
        """The :meth:`statistics` as a few lines of text, for the CLI and logs."""
        s = self.statistics()
        lines = [f"{s['rows']} rows"]
        lines += [f"  {name:<10} {count}" for name, count in s["provenance"].items()]
        lines += [f"  every {_human_interval(v):<10} {c}" for v, c in s["interval_s"].items()]
        routed = len(self) - s["route"].get(-1, 0)
        if routed:
            lines.append(f"  routed     {routed}")
        if s["due_ms"] is not None:
            lines.append(f"  due_ms     {s['due_ms']['min']} .. {s['due_ms']['max']}")
        if self.duplicate_note:
            lines.append(f"  duplicates {self.duplicate_note}")
        if self.off_site_note:
            lines.append(f"  off-site   {self.off_site_note}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Notes:
    """What a reader dropped or skipped, as ``Corpus`` reports it."""

    duplicates: int = 0
    duplicate_note: str | None = None
    off_site: int = 0
    off_site_note: str | None = None


def _freeze(obj: Corpus, urls: list[str], interval: IntArray, prov: U8Array, due: IntArray,
            route: I16Array, notes: _Notes) -> None:
    cols: dict[str, Any] = {"urls": urls, "duplicates": notes.duplicates,
                            "duplicate_note": notes.duplicate_note, "off_site": notes.off_site,
                            "off_site_note": notes.off_site_note}
    for name, arr, dtype in (("interval_s", interval, np.int64), ("provenance", prov, np.uint8),
                             ("due_ms", due, np.int64), ("route", route, np.int16)):
        own = np.array(arr, dtype=dtype, copy=True)
        own.setflags(write=False)
        cols[name] = own
    for name, value in cols.items():
        object.__setattr__(obj, name, value)


def _rebuild(urls: list[str], interval_s: IntArray, provenance: U8Array, due_ms: IntArray,
             route: I16Array | None = None, duplicates: int = 0,
             duplicate_note: str | None = None, off_site: int = 0,
             off_site_note: str | None = None) -> Corpus:
    return Corpus._trusted(list(urls), interval_s, provenance, due_ms, route,
                           _Notes(duplicates, duplicate_note, off_site, off_site_note))


def _refuse_duplicates(url_lists: Sequence[Sequence[str]]) -> None:
    first: dict[str, tuple[int, int]] = {}
    for k, urls in enumerate(url_lists):
        for i, url in enumerate(urls):
            seen = first.setdefault(url, (k, i))
            if seen != (k, i):
                where = (f"rows {seen[1]} and {i}" if seen[0] == k else
                         f"row {seen[1]} of corpus {seen[0]} and row {i} of corpus {k}")
                raise EngineValueError(f"duplicate url {url!r}: {where}")


def _human_interval(seconds: int) -> str:
    for unit, size in (("d", DAY_S), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# -- reading -----------------------------------------------------------------------------------


def read_corpus(path: PathLike, *, now_ms: int | None = None,
                default_provenance: str = "submitted",
                changefreq_map: Mapping[str, int] | None = None,
                max_sitemap_urls: int = MAX_SITEMAP_URLS, base_url: str | None = None,
                routes: Routes | None = None, fetch: FetchLimits | None = None) -> Corpus:
    """Read one corpus file, chosen by suffix: ``.csv``, ``.jsonl``/``.ndjson``, ``.xml``
    (a sitemap or a sitemap index), each optionally gzipped (``.gz``); or fetch a sitemap (or
    sitemap index) from an http(s) URL, within ``fetch``'s limits (``engine.pool.fetch``).

    ``now_ms`` is the due time of every row whose source gives none (default: the wall clock,
    read once). ``default_provenance`` fills CSV/JSONL rows when the ``provenance`` column or key
    is absent altogether; sitemap rows are always ``submitted`` (being in a sitemap is what that
    word means). ``changefreq_map`` overrides entries of :data:`CHANGEFREQ_INTERVALS`.
    ``max_sitemap_urls`` caps the entries of each sitemap file and index. ``base_url`` (an
    absolute http(s) URL) resolves root-relative ``<loc>`` entries and says which part of the site
    the corpus directory mirrors. ``routes`` then sets the interval (and provenance, where a
    route gives one) of every row a route matches, and ``Corpus.route``.

    Every URL comes back normalised (:func:`normalize_url`); a repeated URL is dropped and
    counted (``Corpus.duplicates``, ``Corpus.duplicate_note``). Raises :class:`CorpusError`
    (``path:line: what``) for any bad file or row, and returns nothing partial; bad arguments
    raise ``EngineValueError``/``EngineTypeError``.
    """
    return read_corpora([path], now_ms=now_ms, default_provenance=default_provenance,
                        changefreq_map=changefreq_map, max_sitemap_urls=max_sitemap_urls,
                        base_url=base_url, routes=routes, fetch=fetch)


def read_corpora(paths: Iterable[PathLike], *, now_ms: int | None = None,
                 default_provenance: str = "submitted",
                 changefreq_map: Mapping[str, int] | None = None,
                 max_sitemap_urls: int = MAX_SITEMAP_URLS, base_url: str | None = None,
                 routes: Routes | None = None, fetch: FetchLimits | None = None) -> Corpus:
    """Read several corpus files and sitemap URLs (as :func:`read_corpus`) into one corpus,
    in order, with one ``now_ms`` for all of them. A URL in two files is kept once, where it
    came first; one sitemap read twice is refused. Each file's directory is its own corpus
    directory; each sitemap URL has its own deadline (``fetch.deadline_s``)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise EngineTypeError("read_corpora takes a list of paths (use read_corpus for one)")
    if routes is not None and not isinstance(routes, Routes):
        raise EngineTypeError(f"routes must be a Routes (Routes.load(path)), got {routes!r}")
    if fetch is not None and not isinstance(fetch, FetchLimits):
        raise EngineTypeError(f"fetch must be a FetchLimits, got {fetch!r}")
    base, base_path = _base_url(base_url)
    opts = _Options(
        now_ms=wall_ms() if now_ms is None else check_due_ms(now_ms, "now_ms"),
        provenance=_default_provenance(default_provenance),
        changefreq=_changefreq_table(changefreq_map),
        max_entries=_max_entries(max_sitemap_urls),
        base_url=base,
        base_path=base_path,
    )
    rows = _Rows()
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise EngineTypeError(f"a corpus path must be a str or os.PathLike, got {p!r}")
        path = os.fspath(p)
        if isinstance(path, str) and is_http_url(path):
            _read_remote_sitemap(_check_url(path, path), rows, opts, Fetcher(fetch), parents=[])
            continue
        if "://" in path:
            raise CorpusError(f"{path}: only http(s) URLs are fetched; a file is named by its"
                              " path")
        fmt, compressed = _format_of(path)
        if fmt == "csv":
            _read_csv(path, compressed, rows, opts)
        elif fmt == "jsonl":
            _read_jsonl(path, compressed, rows, opts)
        else:
            corpus_dir = os.path.realpath(os.path.dirname(os.path.abspath(path)))
            _read_sitemap(path, compressed, rows, opts, corpus_dir, parents=[])
    return rows.corpus(routes)


@dataclass(frozen=True)
class _Options:
    now_ms: int
    provenance: int
    changefreq: Mapping[str, int]
    max_entries: int
    base_url: str | None  # normalised; root-relative <loc>s in a urlset resolve against it
    base_path: str  # its path, percent-decoded ("/" when none): the corpus directory's URL path


class _Rows:
    """Columns under construction, and where each URL and sitemap file was first seen, so a
    duplicate can be dropped yet named with both places."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.interval: list[int] = []
        self.provenance: list[int] = []
        self.due: list[int] = []
        self._first: dict[str, int] = {}
        self._where: list[tuple[int, int]] = []  # (file, line) per row
        self._files: list[str] = []
        self.sitemaps: dict[str, str] = {}  # realpath -> where it was reached from
        self.duplicates = 0
        self._first_duplicate = ""  # "b.xml:12 repeats a.xml:3 (url)"
        self.off_site = 0
        self.off_site_note: str | None = None

    def file(self, path: str) -> int:
        self._files.append(path)
        return len(self._files) - 1

    def add(self, file: int, line: int, url: str, interval: int, provenance: int,
            due: int) -> None:
        row = self._first.setdefault(url, len(self.urls))
        if row != len(self.urls):
            self.duplicates += 1
            if self.duplicates == 1:
                f, ln = self._where[row]
                self._first_duplicate = (f"{self._files[file]}:{line} repeats "
                                         f"{self._files[f]}:{ln} ({url})")
            return
        self.urls.append(url)
        self.interval.append(interval)
        self.provenance.append(provenance)
        self.due.append(due)
        self._where.append((file, line))

    def corpus(self, routes: Routes | None) -> Corpus:
        interval = np.array(self.interval, np.int64)
        provenance = np.array(self.provenance, np.uint8)
        route = None
        if routes is not None:
            interval, provenance, route = routes.apply(self.urls, interval, provenance)
        note = None
        if self.duplicates:
            dropped = f"{self.duplicates} duplicate{'s' if self.duplicates > 1 else ''} dropped"
            note = f"{self._first_duplicate}; {dropped}"
        if self.off_site:
            assert self.off_site_note is not None
            self.off_site_note += f"; {self.off_site} skipped"
        return Corpus._trusted(self.urls, interval, provenance, np.array(self.due, np.int64),
                               route, _Notes(self.duplicates, note, self.off_site,
                                             self.off_site_note))


def _default_provenance(value: object) -> int:
    if not isinstance(value, str) or value not in _PROVENANCE_CODE:
        raise EngineValueError(f"default_provenance must be one of {PROVENANCES}, got {value!r}")
    return _PROVENANCE_CODE[value]


def _changefreq_table(overrides: Mapping[str, int] | None) -> Mapping[str, int]:
    table = dict(CHANGEFREQ_INTERVALS)
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise EngineTypeError("changefreq_map must map changefreq words to seconds")
    for word, seconds in overrides.items():
        if not isinstance(word, str):
            raise EngineTypeError(f"changefreq_map key {word!r} is not a string")
        if not is_int(seconds) or not (
                1 <= seconds <= MAX_INTERVAL_S):
            raise EngineValueError(
                f"changefreq_map[{word!r}] must be whole seconds in [1, {MAX_INTERVAL_S}], "
                f"got {seconds!r}")
        table[word.strip().lower()] = seconds
    return table


def _max_entries(value: object) -> int:
    if not is_int(value) or value < 1:
        raise EngineValueError(f"max_sitemap_urls must be a positive int, got {value!r}")
    return value


def _base_url(value: object) -> tuple[str | None, str]:
    """``base_url`` normalised, and its path percent-decoded with a trailing slash."""
    if value is None:
        return None, "/"
    if not isinstance(value, str):
        raise EngineTypeError(f"base_url must be a str, got {value!r}")
    try:
        base = normal_url(value)
    except BadUrl as exc:
        raise EngineValueError(f"base_url must be an absolute http(s) URL: {exc}") from None
    path = unquote(urlsplit(base).path) or "/"
    return base, path if path.endswith("/") else path + "/"


def _format_of(path: str) -> tuple[str, bool]:
    name = os.path.basename(path).lower()
    compressed = name.endswith(".gz")
    if compressed:
        name = name[:-3]
    for suffix, fmt in ((".csv", "csv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"),
                        (".xml", "xml")):
        if name.endswith(suffix):
            return fmt, compressed
    raise CorpusError(f"{path}: unknown corpus format (expected .csv, .jsonl, .ndjson or .xml, "
                      "optionally .gz)")


# -- checks shared by every format -------------------------------------------------------------


def _check_url(where: str, value: object) -> str:
    """An absolute http(s) URL with a host, normalised (surrounding whitespace dropped)."""
    if not isinstance(value, str):
        raise CorpusError(f"{where}: url must be a string, got {value!r}")
    try:
        return normal_url(value.strip())
    except BadUrl as exc:
        raise CorpusError(f"{where}: {exc}") from None


def _whole(where: str, what: str, value: object, lo: int, hi: int, unit: str, *,
           text: bool) -> int:
    """A whole number in [lo, hi]: digits in a CSV cell, a JSON integer in JSONL. Floats,
    bools, signs, NaN and the like are refused, never rounded."""
    n: int | None = None
    if text and isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        n = int(value.strip())
    elif not text and is_int(value):
        n = value
    if n is None or not lo <= n <= hi:
        bound = "2**42 - 1" if hi == STRIDE - 1 else str(hi)
        raise CorpusError(f"{where}: {what} must be a whole number of {unit} in "
                          f"[{lo}, {bound}], got {value!r}")
    return n


def _interval(where: str, value: object, *, text: bool) -> int:
    return _whole(where, "interval_s", value, 1, MAX_INTERVAL_S, "seconds", text=text)


def _due(where: str, value: object, *, text: bool) -> int:
    if value is None or (text and isinstance(value, str) and not value.strip()):
        raise CorpusError(f"{where}: due_ms is empty; an absent due time is never taken as 0 or "
                          "as now (leave the column or key out to mean now)")
    return _whole(where, "due_ms", value, 0, STRIDE - 1, "ms since the epoch", text=text)


def _provenance(where: str, value: object) -> int:
    name = value.strip() if isinstance(value, str) else value
    if not isinstance(name, str) or name not in _PROVENANCE_CODE:
        raise CorpusError(f"{where}: provenance must be one of {', '.join(PROVENANCES)}, "
                          f"got {value!r}")
    return _PROVENANCE_CODE[name]


def _check_columns(where: str, names: Sequence[str], kind: str) -> None:
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise CorpusError(f"{where}: unknown {kind} {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(COLUMNS)})")
    missing = [n for n in REQUIRED_COLUMNS if n not in names]
    if missing:
        raise CorpusError(f"{where}: missing {kind} {', '.join(map(repr, missing))}")


def _add_row(rows: _Rows, file: int, where: str, line: int, values: Sequence[object],
             opts: _Options, *, text: bool) -> None:
    """One CSV/JSONL row, ``values`` in ``COLUMNS`` order; ``_ABSENT`` marks a provenance or
    due time the source does not give."""
    url, interval, prov, due = values
    rows.add(file, line, _check_url(where, url), _interval(where, interval, text=text),
             opts.provenance if prov is _ABSENT else _provenance(where, prov),
             opts.now_ms if due is _ABSENT else _due(where, due, text=text))


# -- CSV and JSONL -----------------------------------------------------------------------------


def _binary_lines(path: str, compressed: bool) -> Generator[tuple[int, bytes], None, None]:
    """``(line number, raw line)``, with line length and decompressed size bounded."""
    try:
        f: io.BufferedIOBase = gzip.open(path, "rb") if compressed else open(path, "rb")
    except OSError as exc:
        raise CorpusError(f"{path}: cannot open: {exc.strerror or exc}") from None
    total = 0
    line = 0
    with f:
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as exc:
                raise CorpusError(f"{path}:{line + 1}: cannot read: {exc}") from None
            if not raw:
                return
            line += 1
            if len(raw) > MAX_LINE_BYTES:
                raise CorpusError(f"{path}:{line}: line longer than {MAX_LINE_BYTES} bytes")
            total += len(raw)
            if compressed and total > MAX_TABULAR_GZ_BYTES:
                raise CorpusError(f"{path}:{line}: decompresses to more than "
                                  f"{MAX_TABULAR_GZ_BYTES} bytes; refused")
            yield line, raw


def _text_lines(path: str, compressed: bool) -> Generator[tuple[int, str], None, None]:
    # Decoding line by line (rather than through a TextIOWrapper) names the bad line exactly.
    with contextlib.closing(_binary_lines(path, compressed)) as lines:
        for line, raw in lines:
            try:
                text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}:{line}: not valid UTF-8 (byte {exc.start + 1} of the "
                                  "line)") from None
            yield line, text


def _is_blank(cells: Sequence[str]) -> bool:
    return not cells or (len(cells) == 1 and not cells[0].strip())


def _read_csv(path: str, compressed: bool, rows: _Rows, opts: _Options) -> None:
    """Header row first (``url,interval_s[,provenance][,due_ms]``, any order, nothing else);
    blank lines skipped; cells stripped of surrounding whitespace."""
    file = rows.file(path)
    with contextlib.closing(_text_lines(path, compressed)) as lines:
        reader = csv.reader((text for _, text in lines), strict=True)
        header: list[str] | None = None
        while True:
            start = reader.line_num + 1  # a quoted cell may span lines: name the first
            try:
                cells = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise CorpusError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None
            if _is_blank(cells):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                dup = {c for c in header if header.count(c) > 1}
                if dup:
                    raise CorpusError(f"{path}:{start}: column {sorted(dup)[0]!r} appears twice")
                _check_columns(f"{path}:{start}", header, "column")
                columns = [header.index(c) if c in header else None for c in COLUMNS]
                continue
            if len(cells) != len(header):
                raise CorpusError(f"{path}:{start}: {len(cells)} cells, the header has "
                                  f"{len(header)}")
            values = [_ABSENT if i is None else cells[i] for i in columns]
            _add_row(rows, file, f"{path}:{start}", start, values, opts, text=True)
    if header is None:
        raise CorpusError(f"{path}:1: no header row (expected {','.join(COLUMNS)})")


class _JsonRefused(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _JsonRefused(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefused(f"key {key!r} appears twice")
        out[key] = value
    return out


def _read_jsonl(path: str, compressed: bool, rows: _Rows, opts: _Options) -> None:
    """One JSON object per line with the CSV's keys; blank lines skipped. Numbers must be JSON
    integers (``3600``, not ``3600.0`` or ``"3600"``); NaN, Infinity and repeated keys refused."""
    file = rows.file(path)
    with contextlib.closing(_text_lines(path, compressed)) as lines:
        for line, text in lines:
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                obj = json.loads(text, object_pairs_hook=_unique_keys,
                                 parse_constant=_refuse_constant)
            except (ValueError, RecursionError) as exc:
                raise CorpusError(f"{where}: not valid JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            _check_columns(where, list(obj), "key")
            _add_row(rows, file, where, line, [obj.get(c, _ABSENT) for c in COLUMNS], opts,
                     text=False)


# -- sitemaps ----------------------------------------------------------------------------------


_ITEM: Final = {"urlset": "url", "sitemapindex": "sitemap"}
_FIELDS: Final = {"url": ("loc", "lastmod", "changefreq", "priority"),
                  "sitemap": ("loc", "lastmod")}
_KEPT: Final = ("loc", "changefreq")  # lastmod and priority do not bear on a render schedule


@dataclass
class _Entry:
    line: int
    fields: dict[str, tuple[int, str]]  # name -> (line of its start tag, stripped text)


class _SitemapHandler(ContentHandler):
    """Collects ``<url>``/``<sitemap>`` entries with the line of each tag, refusing a document
    whose structure is not a sitemap. Elements of other namespaces (image:, xhtml:, news: ...)
    are skipped whole; elements without a namespace are read as sitemap elements."""

    def __init__(self, path: str, max_entries: int, skipped_lines: int) -> None:
        super().__init__()
        self.path = path
        self.max_entries = max_entries
        self.skipped_lines = skipped_lines  # lines before the XML that the parser never saw
        self.kind = ""
        self.root_line = 0
        self.entries: list[_Entry] = []
        self._locator: Locator | None = None
        self._open: list[str] = []
        self._foreign = 0
        self._entry: _Entry | None = None
        self._text: list[str] | None = None
        self._field_line = 0

    def setDocumentLocator(self, locator: Locator) -> None:
        self._locator = locator

    def line(self) -> int:
        if self._locator is None:
            return 0
        return (self._locator.getLineNumber() or 0) + self.skipped_lines

    def _fail(self, what: str) -> CorpusError:
        return CorpusError(f"{self.path}:{self.line()}: {what}")

    def startElementNS(self, name: tuple[str | None, str], qname: str | None,
                       attrs: AttributesNSImpl) -> None:
        ns, local = name
        if self._foreign or ns not in (None, SITEMAP_NS):
            if not self._open:
                raise self._fail(f"root element <{qname or local}> (namespace {ns}) is not a "
                                 f"sitemap <urlset> or <sitemapindex> of {SITEMAP_NS}")
            self._foreign += 1
            return
        depth = len(self._open)
        if depth == 0:
            if local not in _ITEM:
                raise self._fail(f"root element <{local}> is not a sitemap <urlset> or "
                                 "<sitemapindex>")
            self.kind, self.root_line = local, self.line()
        elif depth == 1:
            item = _ITEM[self.kind]
            if local != item:
                raise self._fail(f"unexpected <{local}> in <{self.kind}> (expected <{item}>)")
            if len(self.entries) >= self.max_entries:
                raise self._fail(f"more than {self.max_entries} <{item}> entries in one file "
                                 "(split it and list the parts in a sitemap index)")
            self._entry = _Entry(self.line(), {})
        elif depth == 2 and local in _FIELDS[self._open[1]]:
            assert self._entry is not None
            if local in self._entry.fields:
                raise self._fail(f"<{local}> appears twice in one <{self._open[1]}>")
            self._entry.fields[local] = (self.line(), "")
            if local in _KEPT:
                self._text, self._field_line = [], self.line()
        else:
            raise self._fail(f"unexpected <{local}> in <{self._open[-1]}>")
        self._open.append(local)

    def characters(self, content: str) -> None:
        if self._text is not None and not self._foreign:
            self._text.append(content)

    def endElementNS(self, name: tuple[str | None, str], qname: str | None) -> None:
        if self._foreign:
            self._foreign -= 1
            return
        local = self._open.pop()
        if len(self._open) == 2 and self._text is not None:
            assert self._entry is not None
            self._entry.fields[local] = (self._field_line, "".join(self._text).strip())
            self._text = None
        elif len(self._open) == 1:
            assert self._entry is not None
            if "loc" not in self._entry.fields:
                raise CorpusError(f"{self.path}:{self._entry.line}: <{local}> has no <loc>")
            self.entries.append(self._entry)
            self._entry = None


def _read_xml_bytes(path: str, compressed: bool) -> bytes:
    try:
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as f:
            data = f.read(MAX_SITEMAP_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CorpusError(f"{path}: cannot read{' (gzip)' if compressed else ''}: {what}"
                          ) from None
    if len(data) > MAX_SITEMAP_BYTES:
        raise CorpusError(f"{path}: larger than {MAX_SITEMAP_BYTES} bytes uncompressed (the "
                          "sitemap protocol's limit); refused")
    return data


_UTF8_BOM: Final = b"\xef\xbb\xbf"


def _skip_leading_space(data: bytes) -> tuple[bytes, int]:
    """The document from its first non-blank byte, and how many lines came before it. Expat
    refuses anything before ``<?xml``, yet generators emit a BOM, blank lines or indentation."""
    body = data[len(_UTF8_BOM):] if data.startswith(_UTF8_BOM) else data
    stripped = body.lstrip(b" \t\r\n")
    if len(stripped) == len(data):
        return data, 0
    skipped = body[:len(body) - len(stripped)]
    # CR LF, LF and a lone CR each end a line, as expat counts them.
    return stripped, skipped.count(b"\n") + skipped.count(b"\r") - skipped.count(b"\r\n")


def _parse_sitemap(path: str, data: bytes, max_entries: int) -> _SitemapHandler:
    try:
        from defusedxml import DefusedXmlException
        from defusedxml.expatreader import DefusedExpatParser
    except ImportError as exc:
        raise ImportError(f"reading sitemap {path} needs defusedxml: {_PIP_HINT}") from exc
    data, skipped_lines = _skip_leading_space(data)
    handler = _SitemapHandler(path, max_entries, skipped_lines)
    parser = DefusedExpatParser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    parser.setFeature(feature_namespaces, True)
    parser.setContentHandler(handler)
    try:
        parser.parse(io.BytesIO(data))
    except SAXParseException as exc:
        line = (exc.getLineNumber() or 0) + skipped_lines
        raise CorpusError(f"{path}:{line}: malformed XML: {exc.getMessage()} "
                          f"(column {(exc.getColumnNumber() or 0) + 1})") from None
    except DefusedXmlException as exc:
        # DTDs are forbidden outright: every entity-expansion and XXE attack needs one.
        raise CorpusError(f"{path}:{handler.line()}: refused as unsafe XML ({type(exc).__name__}:"
                          " DTDs, entity declarations and external references are not "
                          "allowed in a sitemap)") from None
    return handler


def _read_sitemap(path: str, compressed: bool, rows: _Rows, opts: _Options, corpus_dir: str,
                  parents: list[str]) -> None:
    """A ``<urlset>`` adds its URLs (submitted, due now, interval from ``<changefreq>``); a
    ``<sitemapindex>`` reads each child found on disk inside ``corpus_dir`` (see
    :func:`_child_path`). An error in a child names the child's line, then each index line
    that led there."""
    real = os.path.realpath(path)
    if not parents:
        if real in rows.sitemaps:
            raise CorpusError(f"{path}: this sitemap was already read{rows.sitemaps[real]}; "
                              "a file is read once")
        rows.sitemaps[real] = ""
    handler = _parse_sitemap(path, _read_xml_bytes(path, compressed), opts.max_entries)
    if handler.kind == "urlset":
        _add_urlset(path, handler, rows, opts, opts.base_url)
        return
    _check_depth(path, handler, parents)
    chain = [*parents, real]
    for entry in handler.entries:
        loc_line, loc = entry.fields["loc"]
        where = f"{path}:{loc_line}"
        child = _child_path(path, where, loc, corpus_dir, opts.base_path, chain)
        if child in chain:
            cycle = " -> ".join([*chain[chain.index(child):], child])
            raise CorpusError(f"{where}: sitemap index cycle: {cycle}")
        if child in rows.sitemaps:
            raise CorpusError(f"{where}: sitemap {loc!r} ({child}) was already read"
                              f"{rows.sitemaps[child]}; a file is read once")
        rows.sitemaps[child] = f" (via {where})"
        try:
            _read_sitemap(child, child.lower().endswith(".gz"), rows, opts, corpus_dir, chain)
        except CorpusError as exc:
            raise CorpusError(f"{exc} (listed at {where})") from None


def _add_urlset(source: str, handler: _SitemapHandler, rows: _Rows, opts: _Options,
                base: str | None) -> None:
    """A ``<urlset>``'s URLs, submitted, due now, every ``<changefreq>`` mapped to seconds; a
    root-relative ``<loc>`` resolves against ``base`` (a fetched sitemap's own URL)."""
    file = rows.file(source)
    for entry in handler.entries:
        loc_line, loc = entry.fields["loc"]
        where = f"{source}:{loc_line}"
        cf_line, word = entry.fields.get("changefreq", (loc_line, MISSING_CHANGEFREQ))
        if loc.startswith("/"):
            if base is None:
                raise CorpusError(f"{where}: <loc> {loc!r} is root-relative; say which site "
                                  "it belongs to with --base-url (base_url=)")
            loc = urljoin(base, loc)
        url = _check_url(where, loc)
        interval = opts.changefreq.get(word.lower())
        if interval is None:
            raise CorpusError(f"{source}:{cf_line}: unknown changefreq {word!r} (known: "
                              f"{', '.join(opts.changefreq)})")
        rows.add(file, loc_line, url, interval, _SUBMITTED, opts.now_ms)


def _check_depth(source: str, handler: _SitemapHandler, parents: Sequence[str]) -> None:
    if len(parents) >= MAX_INDEX_DEPTH:
        raise CorpusError(f"{source}:{handler.root_line}: sitemap indexes nested deeper than "
                          f"{MAX_INDEX_DEPTH}")


def _read_remote_sitemap(url: str, rows: _Rows, opts: _Options, fetcher: Fetcher,
                         parents: list[str]) -> None:
    """A sitemap fetched from ``url`` (normal): a ``<urlset>`` as on disk, its root-relative
    ``<loc>``s resolved against the URL it came from; a ``<sitemapindex>`` fetches each child
    on the index's own host (after redirects), and skips and counts the others, which the
    protocol does not allow. Errors name the URL and line, then each index line that led
    there."""
    if not parents:
        if url in rows.sitemaps:
            raise CorpusError(f"{url}: this sitemap was already read{rows.sitemaps[url]}; a "
                              "sitemap is read once")
        rows.sitemaps[url] = ""
    final, data = fetcher.get(url)
    handler = _parse_sitemap(url, data, opts.max_entries)
    if handler.kind == "urlset":
        _add_urlset(url, handler, rows, opts, final)
        return
    _check_depth(url, handler, parents)
    chain = [*parents, url]
    site = urlsplit(final).netloc.lower()
    for entry in handler.entries:
        loc_line, loc = entry.fields["loc"]
        where = f"{url}:{loc_line}"
        child = _check_url(where, urljoin(final, loc))
        if urlsplit(child).netloc != site:
            rows.off_site += 1
            if rows.off_site_note is None:
                rows.off_site_note = (f"{where} lists {child}, on another host than the index "
                                      f"({site}): sitemaps of an index must be on its host")
            continue
        if child in chain:
            cycle = " -> ".join([*chain[chain.index(child):], child])
            raise CorpusError(f"{where}: sitemap index cycle: {cycle}")
        if child in rows.sitemaps:
            raise CorpusError(f"{where}: sitemap {child} was already read"
                              f"{rows.sitemaps[child]}; a sitemap is read once")
        rows.sitemaps[child] = f" (via {where})"
        try:
            _read_remote_sitemap(child, rows, opts, fetcher, chain)
        except CorpusError as exc:
            raise CorpusError(f"{exc} (listed at {where})") from None


def _child_path(index: str, where: str, loc: str, corpus_dir: str, base_path: str,
                chain: Sequence[str]) -> str:
    """The real path of a ``<sitemap><loc>``, inside ``corpus_dir`` (which mirrors the site
    root, or ``base_path`` of it, or a subpath of the site): an http(s) URL or a root-relative
    path by the longest suffix of its URL path found under ``corpus_dir``, else by its basename
    next to the index (a flat download), a suffix never being the index or an ancestor
    (``chain``); a relative path from the index; a local ``file://`` URL as given. Anything
    resolving outside ``corpus_dir`` is refused before it is opened. Never fetched."""
    if not loc:
        raise CorpusError(f"{where}: <loc> is empty")
    try:
        parts = urlsplit(loc)
    except ValueError as exc:
        raise CorpusError(f"{where}: {loc!r} is not a valid URL or path: {exc}") from None
    scheme = parts.scheme.lower()
    index_dir = os.path.dirname(index)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise CorpusError(f"{where}: {loc!r} names another host; only local files are read")
        candidates = [unquote(parts.path)]
    elif scheme in ("http", "https") or (not scheme and loc.startswith("/")):
        url_path = unquote(parts.path)
        name = posixpath.basename(url_path)
        if name in ("", ".", ".."):
            raise CorpusError(f"{where}: {loc!r} names no file to look for in the corpus "
                              "directory")
        if url_path.startswith(base_path):
            url_path = url_path[len(base_path):]
        # The longest suffix of the URL path that exists wins: a project site under a subpath
        # (index at name/sitemap.xml, child https://host/name/en/sitemap.xml) is a download
        # whose directory is the subpath, not the site root.
        segments = [seg for seg in url_path.split("/") if seg]
        candidates = [os.path.join(corpus_dir, *segments[i:]) for i in range(len(segments))]
        candidates = list(dict.fromkeys([*candidates, os.path.join(index_dir, name)]))
    elif not scheme:
        candidates = [os.path.join(index_dir, unquote(parts.path))]
    else:
        raise CorpusError(f"{where}: {loc!r}: only relative paths (root-relative too), file:// "
                          "and http(s) URLs (looked up in the corpus directory) are followed")
    looked = []
    for i, candidate in enumerate(candidates):
        if "\x00" in candidate:
            raise CorpusError(f"{where}: {loc!r} names a path with a NUL byte")
        real = os.path.realpath(candidate)
        if os.path.commonpath([corpus_dir, real]) != corpus_dir:
            raise CorpusError(f"{where}: sitemap {loc!r} resolves to {real}, outside the corpus "
                              f"directory {corpus_dir} (the directory of the file given to "
                              "read); refused, nothing outside it is opened")
        if i and real in chain:
            looked.append(f"{candidate} (the index itself or an ancestor, not a child)")
        elif os.path.isfile(real):
            return real
        else:
            looked.append(candidate)
    places = looked[0] if len(looked) == 1 else f"{', '.join(looked[:-1])} and {looked[-1]}"
    raise CorpusError(f"{where}: sitemap {loc!r} is not on disk (looked for {places}); an "
                      "index read from a file is followed on disk only, never fetched")
