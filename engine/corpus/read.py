"""Read corpora: each file by its suffix (CSV, JSONL, sitemap XML, optionally gzipped) or a
sitemap URL, into one :class:`~engine.corpus.model.Corpus`.

Every URL is normalised (``engine.corpus.urlnorm.normalize_url``: lowercase scheme and host,
IDNA host, no default port, non-ASCII percent-encoded, escapes' hex uppercase; nothing decoded,
nothing reordered), so two spellings of one page are one row and routes match one spelling.
Routes (``engine.corpus.routes``) then set per-route intervals: a route's interval wins over what
the file gave (``<changefreq>``, ``interval_s``), which wins over the missing-changefreq
default; ``Corpus.route`` says which route each row took (-1: none).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit

from ..checks import is_int, wall_ms
from ..errors import CorpusError, EngineTypeError, EngineValueError
from ..keys import check_due_ms
from ..policy import MAX_INTERVAL_S, PROVENANCES
from .fetch import Fetcher, FetchLimits, is_http_url
from .model import PROVENANCE_CODE, Corpus, Options, PathLike, Rows, check_url
from .routes import Routes
from .sitemaps import CHANGEFREQ_INTERVALS, MAX_SITEMAP_URLS, Disk, Web, walk
from .tables import read_csv, read_jsonl
from .urlnorm import BadUrl, normal_url

# -- reading -----------------------------------------------------------------------------------


def read_corpus(path: PathLike, *, now_ms: int | None = None,
                default_provenance: str = "submitted",
                changefreq_map: Mapping[str, int] | None = None,
                max_sitemap_urls: int = MAX_SITEMAP_URLS, base_url: str | None = None,
                routes: Routes | None = None, fetch: FetchLimits | None = None) -> Corpus:
    """Read one corpus file, chosen by suffix: ``.csv``, ``.jsonl``/``.ndjson``, ``.xml``
    (a sitemap or a sitemap index), each optionally gzipped (``.gz``); or fetch a sitemap (or
    sitemap index) from an http(s) URL, within ``fetch``'s limits (``engine.corpus.fetch``).

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
    opts = Options(
        now_ms=wall_ms() if now_ms is None else check_due_ms(now_ms, "now_ms"),
        provenance=_default_provenance(default_provenance),
        changefreq=_changefreq_table(changefreq_map),
        max_entries=_max_entries(max_sitemap_urls),
        base_url=base,
        base_path=base_path,
    )
    rows = Rows()
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise EngineTypeError(f"a corpus path must be a str or os.PathLike, got {p!r}")
        path = os.fspath(p)
        if isinstance(path, str) and is_http_url(path):
            walk(check_url(path, path), rows, opts, Web(Fetcher(fetch), rows))
            continue
        if "://" in path:
            raise CorpusError(f"{path}: only http(s) URLs are fetched; a file is named by its"
                              " path")
        fmt, compressed = _format_of(path)
        if fmt == "csv":
            read_csv(path, compressed, rows, opts)
        elif fmt == "jsonl":
            read_jsonl(path, compressed, rows, opts)
        else:
            corpus_dir = os.path.realpath(os.path.dirname(os.path.abspath(path)))
            walk(path, rows, opts, Disk(corpus_dir, opts))
    return rows.corpus(routes)


def _default_provenance(value: object) -> int:
    if not isinstance(value, str) or value not in PROVENANCE_CODE:
        raise EngineValueError(f"default_provenance must be one of {PROVENANCES}, got {value!r}")
    return PROVENANCE_CODE[value]


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
