"""Sitemaps and sitemap indexes, on disk and over HTTP, walked by one walker.

Sitemaps come from the open web, so they are parsed as hostile input: through defusedxml's
expat reader with DTDs, entity declarations and external references forbidden (billion laughs
and XXE are refused, never expanded), with the protocol's size limits (50 MiB uncompressed,
also after gunzip, and 50,000 entries per file).

An index is walked the same way wherever it came from (:func:`walk`): each sitemap is read once,
a cycle is named with its path, nesting is bounded, and an error in a child names the child's
line, then each index line that led there. Where the sitemaps are read from is a :class:`Place`:

* :class:`Disk`: the directory of the file given mirrors the site root, or a subpath of it, as a
  download of the site would. An index child named by an http(s) URL or a root-relative path
  (``/en/sitemap.xml``) is looked for by the longest suffix of its URL path (percent-decoded)
  that exists under that directory, so a project site under a subpath resolves; with
  ``base_url``, a URL below its path is taken relative to it first. A relative child is relative
  to its index; a ``file://`` child is taken as given; a URL child found nowhere else is looked
  for by its basename next to the index (a flat download). A suffix or a basename is never the
  index itself or an ancestor. Whatever the spelling, a child whose real path (symlinks
  resolved) lies outside the directory is refused before it is opened: an index is input from
  the web and must not make the tool read ``/etc/hostname``. An index on disk is never fetched.
* :class:`Web`: a sitemap URL is fetched (``engine.corpus.fetch``: timeouts, a deadline, bounded
  redirects, gzip, the size limit enforced while the body streams), and so is every child of an
  index on the index's own host (after redirects); a child on another host is skipped and
  counted (``Corpus.off_site``), as the protocol allows an index to list only its own host's
  sitemaps.

Sitemaps carry no due time: ``<lastmod>`` says when the *page* changed, not when *our render*
goes stale, and a page never rendered is due now. Leading whitespace, blank lines and a UTF-8
BOM before ``<?xml`` are skipped (expat refuses them; generators emit them). A root-relative
``<loc>`` in a urlset needs ``base_url`` (or the URL it was fetched from) to say which site it
belongs to.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import unquote, urljoin, urlsplit
from xml.sax import SAXParseException
from xml.sax.handler import ContentHandler, feature_namespaces
from xml.sax.xmlreader import AttributesNSImpl, Locator

from ..errors import CorpusError
from .fetch import Fetcher
from .model import DAY_S, PROVENANCE_CODE, Options, Rows, check_url

SITEMAP_NS: Final = "http://www.sitemaps.org/schemas/sitemap/0.9"

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

_SUBMITTED: Final = PROVENANCE_CODE["submitted"]
_PIP_HINT: Final = "pip install 'render-lanes[pool]'"



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


class Place(Protocol):
    """Where a walk reads its sitemaps (see the module's docstring)."""

    def key(self, source: str) -> str:
        """The one spelling by which a sitemap is read once and a cycle is seen."""

    def read(self, source: str) -> tuple[str | None, bytes]:
        """The base a urlset's root-relative ``<loc>``s resolve against, and the document."""

    def child(self, index: str, base: str | None, where: str, loc: str,
              chain: Sequence[str]) -> str | None:
        """The sitemap an entry of ``index`` names, or None when it is skipped (and counted)."""


class Disk:
    """Sitemaps in ``corpus_dir`` and below, never fetched."""

    def __init__(self, corpus_dir: str, opts: Options) -> None:
        self.corpus_dir, self.base_url, self.base_path = corpus_dir, opts.base_url, opts.base_path

    def key(self, source: str) -> str:
        return os.path.realpath(source)

    def read(self, source: str) -> tuple[str | None, bytes]:
        return self.base_url, _read_xml_bytes(source, source.lower().endswith(".gz"))

    def child(self, index: str, base: str | None, where: str, loc: str,
              chain: Sequence[str]) -> str | None:
        return _child_path(index, where, loc, self.corpus_dir, self.base_path, chain)


class Web:
    """Sitemaps fetched over HTTP; an index's children only on its own host."""

    def __init__(self, fetcher: Fetcher, rows: Rows) -> None:
        self.fetcher, self.rows = fetcher, rows

    def key(self, source: str) -> str:
        return source

    def read(self, source: str) -> tuple[str | None, bytes]:
        return self.fetcher.get(source)

    def child(self, index: str, base: str | None, where: str, loc: str,
              chain: Sequence[str]) -> str | None:
        assert base is not None  # the URL the index came from, after redirects
        child = check_url(where, urljoin(base, loc))
        site = urlsplit(base).netloc.lower()
        if urlsplit(child).netloc == site:
            return child
        self.rows.off_site += 1
        if self.rows.off_site_note is None:
            self.rows.off_site_note = (f"{where} lists {child}, on another host than the index "
                                       f"({site}): sitemaps of an index must be on its host")
        return None


def walk(source: str, rows: Rows, opts: Options, place: Place,
         parents: Sequence[str] = ()) -> None:
    """Read the sitemap ``source``: a ``<urlset>`` adds its URLs (submitted, due now, interval
    from ``<changefreq>``); a ``<sitemapindex>`` walks each child ``place`` gives. Each sitemap
    is read once; an error in a child names its line, then each index line that led there."""
    key = place.key(source)
    if not parents:
        if key in rows.sitemaps:
            raise CorpusError(f"{source}: this sitemap was already read{rows.sitemaps[key]}; a "
                              "sitemap is read once")
        rows.sitemaps[key] = ""
    base, data = place.read(source)
    handler = _parse_sitemap(source, data, opts.max_entries)
    if handler.kind == "urlset":
        _add_urlset(source, handler, rows, opts, base)
        return
    if len(parents) >= MAX_INDEX_DEPTH:
        raise CorpusError(f"{source}:{handler.root_line}: sitemap indexes nested deeper than "
                          f"{MAX_INDEX_DEPTH}")
    chain = [*parents, key]
    for entry in handler.entries:
        loc_line, loc = entry.fields["loc"]
        where = f"{source}:{loc_line}"
        child = place.child(source, base, where, loc, chain)
        if child is None:
            continue
        if child in chain:
            cycle = " -> ".join([*chain[chain.index(child):], child])
            raise CorpusError(f"{where}: sitemap index cycle: {cycle}")
        if child in rows.sitemaps:
            raise CorpusError(f"{where}: sitemap {loc!r} ({child}) was already read"
                              f"{rows.sitemaps[child]}; a sitemap is read once")
        rows.sitemaps[child] = f" (via {where})"
        try:
            walk(child, rows, opts, place, chain)
        except CorpusError as exc:
            raise CorpusError(f"{exc} (listed at {where})") from None


def _add_urlset(source: str, handler: _SitemapHandler, rows: Rows, opts: Options,
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
        url = check_url(where, loc)
        interval = opts.changefreq.get(word.lower())
        if interval is None:
            raise CorpusError(f"{source}:{cf_line}: unknown changefreq {word!r} (known: "
                              f"{', '.join(opts.changefreq)})")
        rows.add(file, loc_line, url, interval, _SUBMITTED, opts.now_ms)


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
