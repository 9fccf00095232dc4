"""Routes: per-route refresh intervals, set the way the product resolves them.

Why this module exists: a site's sitemap rarely says how often a page really goes stale (most
have no ``<changefreq>``, the rest say "daily" for everything), but the operator knows it by
page type: the home page hourly, categories every few hours, products every two days. A routes
file says that once, by URL pattern, instead of per row.

**Resolution order: route > stored > default.** For each row of a corpus:

1. *route*: the first route (in file order) whose pattern matches the row's normalised URL
   gives the interval, and the provenance too where the route names one;
2. *stored*: otherwise the value the corpus file gave stays (a sitemap's ``<changefreq>``, a
   CSV/JSONL ``interval_s`` and ``provenance``);
3. *default*: and where the file gave none, the reader's default (``MISSING_CHANGEFREQ`` for a
   ``<url>`` without ``<changefreq>``, ``default_provenance`` for a CSV without that column).

A routes file is TOML (see ``examples/routes-shop.toml``)::

    [[route]]
    name = "product"                      # required, unique: named in stats and errors
    match = "https://shop.example/p/*"    # a glob, or: regex = "https://shop\\.example/p/.+"
    interval = "48h"                      # "90s", "15m", "6h", "2d" or whole seconds
    provenance = "submitted"              # optional: submitted | discovered
    discover = false                      # optional: lanes serve --discover never adds these
    query = ["page"]                      # optional: the query parameters that matter to a
                                          # discovered URL ([]: none); default all but tracking
    wait_for = "#price"                   # optional: how its pages render and what their
    require = { selectors = ["#price"] }  # snapshot must hold (rules.py lists the keys)

Patterns are matched against the **whole normalised URL** (``engine.corpus.urlnorm.normalize_url``:
lowercase scheme and host, no default port, non-ASCII percent-encoded), so write them that way.
A glob is ``fnmatch``-style: ``*`` matches any run of characters *including* ``/``, ``?`` any
one character (a literal ``?`` included; write ``[?]`` for exactly that), ``[...]`` a class. A
regex must match the whole URL too (``re.fullmatch``), so ``^`` and ``$`` are allowed but not
needed. Both are case-sensitive.

Matching a million URLs is one pass of one compiled regex: every route's pattern becomes a
named alternative in file order, so the first alternative that matches the whole URL is the
first route that does. Routes whose regexes use backreferences or global flags cannot share
one regex; they are matched one pattern at a time (slower, same result).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

from ..checks import is_int
from ..errors import CorpusError, EngineTypeError, EngineValueError
from ..keys import as_int64_array
from ..policy import MAX_INTERVAL_S, PROVENANCES
from .rules import NO_RULES, RULE_KEYS, RouteRules, route_host, rules_from

I16Array = npt.NDArray[np.int16]
IntArray = npt.NDArray[np.int64]
U8Array = npt.NDArray[np.uint8]

MAX_ROUTES: Final = int(np.iinfo(np.int16).max)
"""Route indexes are int16 per row (a corpus column), -1 meaning none."""

ROUTE_KEYS: Final = ("name", "match", "regex", "interval", "provenance", "discover", "query",
                     *RULE_KEYS)
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_INTERVAL_TEXT = re.compile(r"([0-9]{1,12})([smhd])")
_TOML_LINE = re.compile(r"\(at line (\d+), column (\d+)\)$")
_ROUTE_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*route[ \t]*\]\]", re.MULTILINE)
# A regex that refers to its own groups by number or name would refer to the wrong ones inside
# the combined regex: such routes are matched one at a time (false positives only cost speed).
_GROUP_REFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")


@final
@dataclass(frozen=True)
class Route:
    """One route: a glob (``is_regex=False``) or a regex over the whole normalised URL, and the
    interval (and optionally provenance, a ``PROVENANCES`` code) it gives the rows it matches.
    Constructing one checks every field."""

    name: str
    pattern: str
    is_regex: bool
    interval_s: int
    provenance: int | None = None
    discover: bool = True
    query: tuple[str, ...] | None = None
    rules: RouteRules = NO_RULES
    """How its pages render and what their snapshot must hold (rules.py)."""
    place: str = field(default="", compare=False, repr=False)
    """Where the route was written (``FILE:LINE: route N ("name")``), for later refusals."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise EngineValueError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.pattern, str) or not self.pattern:
            raise EngineValueError(f"the pattern must be a non-empty string, got "
                                   f"{self.pattern!r}")
        if not isinstance(self.is_regex, bool):
            raise EngineTypeError(f"is_regex must be a bool, got {self.is_regex!r}")
        if not is_int(self.interval_s) or not 1 <= self.interval_s <= MAX_INTERVAL_S:
            raise EngineValueError(f"interval must be whole seconds in [1, {MAX_INTERVAL_S}], "
                                   f"got {self.interval_s!r}")
        if self.provenance is not None and (not is_int(self.provenance)
                                            or not 0 <= self.provenance < len(PROVENANCES)):
            raise EngineValueError(f"provenance must be a code 0..{len(PROVENANCES) - 1} "
                                   f"({', '.join(PROVENANCES)}) or None, got {self.provenance!r}")
        if not isinstance(self.discover, bool):
            raise EngineTypeError(f"discover must be true or false, got {self.discover!r}")
        if isinstance(self.query, list):
            object.__setattr__(self, "query", tuple(self.query))
        if self.query is not None and (not isinstance(self.query, tuple) or not all(
                isinstance(q, str) and q and len(q) <= 200 for q in self.query)):
            raise EngineValueError(f"query must be a list of parameter names, got"
                                   f" {self.query!r}")
        if not isinstance(self.rules, RouteRules):
            raise EngineTypeError(f"rules must be RouteRules, got {self.rules!r}")
        try:
            re.compile(self.regex)
        except re.error as exc:
            raise EngineValueError(f"regex {self.pattern!r} does not compile: {exc}") from None

    @property
    def host(self) -> str | None:
        """The one host the pattern can match, where it spells it (else None)."""
        return route_host(self.pattern, self.is_regex)

    @property
    def prefix(self) -> str:
        """Text every URL the route matches starts with, "" when its pattern opens with a
        wildcard: where a ``route:NAME`` scope looks in the sorted URL index."""
        if not self.is_regex:
            return re.split(r"[*?[]", self.pattern, maxsplit=1)[0]
        return _regex_prefix(self.pattern)

    @property
    def regex(self) -> str:
        """The pattern as a regex for ``re.fullmatch`` (a glob through ``fnmatch.translate``)."""
        return self.pattern if self.is_regex else fnmatch.translate(self.pattern)


@final
@dataclass(frozen=True)
class Routes:
    """Routes in the order they are tried; the first that matches a URL wins."""

    routes: tuple[Route, ...]
    _matcher: _Matcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.routes, list):
            object.__setattr__(self, "routes", tuple(self.routes))
        if not isinstance(self.routes, tuple) or not all(isinstance(r, Route)
                                                         for r in self.routes):
            raise EngineTypeError("routes must be a tuple of Route")
        if len(self.routes) > MAX_ROUTES:
            raise EngineValueError(f"{len(self.routes)} routes; at most {MAX_ROUTES}")
        seen: dict[str, int] = {}
        for i, route in enumerate(self.routes):
            first = seen.setdefault(route.name, i)
            if first != i:
                raise EngineValueError(f"route {i + 1} ({json.dumps(route.name)}): name already "
                                       f"used by "
                                       f"route {first + 1}; names must be unique")
        object.__setattr__(self, "_matcher", _Matcher(self.routes))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Routes:
        """Read a routes TOML file (see the module docstring). Every refusal is a
        :class:`CorpusError` naming the file, and the line and route where it can."""
        where = os.fspath(path)
        try:
            with open(where, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise CorpusError(f"{where}: cannot open: {exc.strerror or exc}") from None
        try:
            text = raw.decode("utf-8")
            doc = tomllib.loads(text)
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{where}: not valid UTF-8 (byte {exc.start + 1})") from None
        except tomllib.TOMLDecodeError as exc:
            msg = str(exc)
            at = _TOML_LINE.search(msg)
            if at is None:
                raise CorpusError(f"{where}: not valid TOML: {msg}") from None
            raise CorpusError(f"{where}:{at.group(1)}: not valid TOML: {msg[:at.start()].strip()}"
                              f" (column {at.group(2)})") from None
        unknown = [k for k in doc if k != "route"]
        if unknown:
            raise CorpusError(f"{where}: unknown top-level key {unknown[0]!r}; a routes file "
                              "holds only [[route]] tables")
        tables = doc.get("route")
        if tables is None:
            raise CorpusError(f"{where}: no [[route]] tables; a routes file needs at least one")
        if not isinstance(tables, list):
            raise CorpusError(f"{where}: 'route' must be an array of tables, written [[route]]")
        # tomllib gives no positions for values: name each route's [[route]] line instead.
        headers = [text.count("\n", 0, m.start()) + 1 for m in _ROUTE_HEADER.finditer(text)]
        lines = headers if len(headers) == len(tables) else [None] * len(tables)
        routes = []
        for i, (table, line) in enumerate(zip(tables, lines, strict=True)):
            place = f"{where}:{line}" if line is not None else where
            routes.append(_route_from_toml(_route_place(place, i, table), table))
        return _checked_routes(where, routes)

    @classmethod
    def from_json(cls, text: str) -> Routes:
        """The inverse of :meth:`to_json`, checked as :meth:`load` checks a file."""
        where = "routes JSON"
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise CorpusError(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or set(doc) != {"routes"} or not isinstance(
                doc["routes"], list):
            raise CorpusError(f'{where}: expected {{"routes": [...]}}')
        routes = []
        for i, item in enumerate(doc["routes"]):
            place = _route_place(where, i, item)
            if not isinstance(item, dict) or not set(_JSON_KEYS) <= set(item) <= set(
                    _JSON_KEYS + _JSON_OPTIONAL):
                raise CorpusError(f"{place}: expected the keys {', '.join(_JSON_KEYS)}")
            prov = item["provenance"]
            routes.append(_route(place, item["name"], item["pattern"], item["is_regex"],
                                 item["interval_s"], None if prov is None else
                                 _provenance_code(place, prov), item.get("discover", True),
                                 item.get("query"), item.get("rules", {})))
        return _checked_routes(where, routes)

    def to_json(self) -> str:
        """The routes as JSON, so a pool can store them beside its URL table."""
        return json.dumps({"routes": [
            {"name": r.name, "pattern": r.pattern, "is_regex": r.is_regex,
             "interval_s": r.interval_s,
             "provenance": None if r.provenance is None else PROVENANCES[r.provenance],
             "discover": r.discover, "query": None if r.query is None else list(r.query),
             **({"rules": r.rules.to_json()} if r.rules != NO_RULES else {})}
            for r in self.routes]}, ensure_ascii=False)

    def rules_for(self, url: str) -> RouteRules:
        """The rules of the first route matching ``url`` (normalised), none if none does."""
        i = int(self.match([url])[0])
        return self.routes[i].rules if i >= 0 else NO_RULES

    def match(self, urls: Sequence[str]) -> I16Array:
        """The index of the first route matching each URL (int16), -1 where none does. Pass
        normalised URLs (a Corpus holds only those); a row key of a variant (``URL mobile``,
        variant_rows.py) matches as its URL."""
        if isinstance(urls, (str, bytes)):
            raise EngineTypeError("match takes a sequence of URLs, not one string")
        return self._matcher.match([u.partition(" ")[0] for u in urls])

    def apply(self, urls: Sequence[str], interval_s: npt.ArrayLike,
              provenance: npt.ArrayLike) -> tuple[IntArray, U8Array, I16Array]:
        """New ``(interval_s, provenance, route_ids)``: where a route matches, its interval
        (and its provenance, if it names one) replaces the stored value; elsewhere the stored
        value stays. The inputs are not modified."""
        ids = self.match(urls)
        interval = as_int64_array(interval_s, "interval_s").copy()
        prov = as_int64_array(provenance, "provenance").copy()
        for what, arr in (("interval_s", interval), ("provenance", prov)):
            if len(arr) != len(ids):
                raise EngineValueError(f"{what} has {len(arr)} elements, urls has {len(ids)}")
        if self.routes:
            hit = ids >= 0
            row_route = ids[hit]
            route_interval = np.array([r.interval_s for r in self.routes], np.int64)
            route_prov = np.array([-1 if r.provenance is None else r.provenance
                                   for r in self.routes], np.int64)
            interval[hit] = route_interval[row_route]
            given = route_prov[row_route]
            prov[np.flatnonzero(hit)[given >= 0]] = given[given >= 0]
        return interval, prov.astype(np.uint8), ids

    def names(self) -> list[str]:
        """Route names by index, to label ``Corpus.route`` counts."""
        return [r.name for r in self.routes]

    def own_prefix(self, index: int) -> str | None:
        """A prefix whose URLs are exactly those route ``index`` is the first to match, when
        there is one: its pattern is ``PREFIX*`` and every route before it starts elsewhere
        (no URL starts with both prefixes). Then its scope is a prefix scope."""
        route = self.routes[index]
        prefix = route.prefix
        if route.is_regex or not prefix or route.pattern != prefix + "*":
            return None
        earlier = (r.prefix for r in self.routes[:index])
        if any(not p or p.startswith(prefix) or prefix.startswith(p) for p in earlier):
            return None
        return prefix


_JSON_KEYS: Final = ("name", "pattern", "is_regex", "interval_s", "provenance")
_JSON_OPTIONAL: Final = ("discover", "query", "rules")  # routes stored by an older pool lack
# them


class _Matcher:
    """The compiled form of the routes: one combined regex when they can share one, else one
    regex per route tried in order."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.singles = [re.compile(r.regex) for r in routes]
        self.combined: re.Pattern[str] | None = None
        self.route_of_group: list[int] = []
        if routes and not any(r.is_regex and _GROUP_REFERENCE.search(r.pattern)
                              for r in routes):
            source = "|".join(f"(?P<_route{i}>{r.regex})" for i, r in enumerate(routes))
            try:
                combined = re.compile(source)
            except re.error:
                return  # a global flag or a clashing group name: keep to the singles
            self.route_of_group = [-1] * (combined.groups + 1)
            for i in range(len(routes)):
                self.route_of_group[combined.groupindex[f"_route{i}"]] = i
            self.combined = combined

    def match(self, urls: Sequence[str]) -> I16Array:
        if isinstance(urls, (str, bytes)):
            raise EngineTypeError("match takes a sequence of URLs, not one string")
        if self.combined is not None:
            # m.lastindex is the outermost group that closed last: the route's own group.
            full, route_of = self.combined.fullmatch, self.route_of_group
            ids = [-1 if (m := full(u)) is None else route_of[m.lastindex or 0] for u in urls]
        elif self.singles:
            ids = [next((i for i, p in enumerate(self.singles) if p.fullmatch(u)), -1)
                   for u in urls]
        else:
            ids = [-1] * len(urls)
        return np.array(ids, np.int16)


def _regex_prefix(pattern: str) -> str:
    """The literal text a regex's every match starts with, read conservatively: up to the first
    construct that is not a plain or escaped character (a repeat takes back the character it
    repeats); "" for a pattern with an alternation or flags anywhere."""
    if re.search(r"(?<!\\)(?:\\\\)*[|]|\(\?[aiLmsux]", pattern):
        return ""
    out: list[str] = []
    i = 1 if pattern.startswith("^") else 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            c, i = pattern[i + 1], i + 1
        elif c in "\\.^$*+?{}[]|()":
            if c in "*+?{" and out:
                out.pop()
            break
        out.append(c)
        i += 1
    return "".join(out)


def _route_place(where: str, i: int, table: object) -> str:
    name = table.get("name") if isinstance(table, dict) else None
    return f"{where}: route {i + 1}" + (f" ({json.dumps(name)})" if isinstance(name, str)
                                        else "")


def _route_from_toml(place: str, table: Mapping[str, Any]) -> Route:
    if not isinstance(table, dict):
        raise CorpusError(f"{place}: a route must be a table, written [[route]]")
    unknown = [k for k in table if k not in ROUTE_KEYS]
    if unknown:
        raise CorpusError(f"{place}: unknown key {unknown[0]!r} (known: {', '.join(ROUTE_KEYS)})")
    for key in ("name", "interval"):
        if key not in table:
            raise CorpusError(f"{place}: missing key {key!r}")
    if ("match" in table) == ("regex" in table):
        raise CorpusError(f"{place}: give exactly one of 'match' (a glob) and 'regex'")
    is_regex = "regex" in table
    prov = table.get("provenance")
    return _route(place, table["name"], table["regex" if is_regex else "match"], is_regex,
                  _interval_s(place, table["interval"]),
                  None if prov is None else _provenance_code(place, prov),
                  table.get("discover", True), table.get("query"), table)


def _route(place: str, name: object, pattern: object, is_regex: object, interval_s: object,
           provenance: int | None, discover: object = True, query: object = None,
           rules: object = None) -> Route:
    rules = {} if rules is None else rules
    try:
        if not isinstance(rules, Mapping):
            raise EngineTypeError(f"rules must be a table, got {rules!r}")
        host = route_host(pattern, bool(is_regex)) if isinstance(pattern, str) else None
        return Route(name, pattern, is_regex, interval_s, provenance,  # type: ignore[arg-type]
                     discover, query, rules_from(rules, host), place)  # type: ignore[arg-type]
    except (EngineValueError, EngineTypeError) as exc:
        raise CorpusError(f"{place}: {exc}") from None


def _checked_routes(where: str, routes: list[Route]) -> Routes:
    try:
        return Routes(tuple(routes))
    except (EngineValueError, EngineTypeError) as exc:
        raise CorpusError(f"{where}: {exc}") from None


def _interval_s(place: str, value: object) -> int:
    """``"90s"``, ``"15m"``, ``"6h"``, ``"2d"`` or an integer of seconds (a TOML int, not a
    float or bool); the range is checked by :class:`Route`."""
    if is_int(value):
        return value
    if isinstance(value, str):
        m = _INTERVAL_TEXT.fullmatch(value.strip())
        if m:
            return int(m.group(1)) * _UNITS[m.group(2)]
    raise CorpusError(f"{place}: interval must be like \"90s\", \"15m\", \"6h\", \"2d\" or whole "
                      f"seconds, got {value!r}")


def _provenance_code(place: str, value: object) -> int:
    if not isinstance(value, str) or value not in PROVENANCES:
        raise CorpusError(f"{place}: provenance must be one of {', '.join(PROVENANCES)}, got "
                          f"{value!r}")
    return PROVENANCES.index(value)
