"""A corpus as plain data, and the columns it is built from.

A :class:`Corpus` is a list of URLs and four numpy arrays, which pickles by value, so the URL
of each row reaches workers under fork, spawn and forkserver alike. The readers (``tables``,
``sitemaps``) fill :class:`Rows`, which drops a repeated URL and counts it, naming both places:
real sitemaps repeat pages (a post in two category sitemaps), and refusing a whole site for that
helped no one. A :class:`Corpus` built directly, and :meth:`Corpus.concat`, still refuse a
duplicate: there the caller assembled the rows, and a repeat is a bug to name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

from ..checks import is_int
from ..errors import CorpusError, EngineTypeError, EngineValueError
from ..keys import as_int64_array, check_due_array
from ..policy import MAX_INTERVAL_S, PROVENANCES
from .routes import Routes
from .urlnorm import BadUrl, normal_url

IntArray = npt.NDArray[np.int64]
U8Array = npt.NDArray[np.uint8]
I16Array = npt.NDArray[np.int16]
PathLike = str | os.PathLike[str]

DAY_S: Final = 86_400
PROVENANCE_CODE: Final = {name: code for code, name in enumerate(PROVENANCES)}






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

    ``route`` is the :class:`~engine.corpus.routes.Routes` index each row matched (-1: none; all
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
            normal = check_url(f"urls[{i}]", url)
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
                for name, code in PROVENANCE_CODE.items()}
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


@dataclass(frozen=True)
class Options:
    now_ms: int
    provenance: int
    changefreq: Mapping[str, int]
    max_entries: int
    base_url: str | None  # normalised; root-relative <loc>s in a urlset resolve against it
    base_path: str  # its path, percent-decoded ("/" when none): the corpus directory's URL path


class Rows:
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


def check_url(where: str, value: object) -> str:
    """An absolute http(s) URL with a host, normalised (surrounding whitespace dropped)."""
    if not isinstance(value, str):
        raise CorpusError(f"{where}: url must be a string, got {value!r}")
    try:
        return normal_url(value.strip())
    except BadUrl as exc:
        raise CorpusError(f"{where}: {exc}") from None
