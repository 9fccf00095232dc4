"""CSV and JSONL corpora: ``url,interval_s,provenance[,due_ms]``, optionally gzipped.

Every element is checked before anything is returned (a corpus loads whole or not at all), and
every refusal is a :class:`~engine.errors.CorpusError` of the form ``path:line: what``. An absent
due time is the reader's ``now_ms``; one that is present but empty or null is an error, never 0
and never now. Unknown columns and keys are refused, so a typo such as ``due_sm`` cannot quietly
turn into "due now". Lines and decompressed sizes are bounded, so a hostile file costs bounded
memory.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import re
import zlib
from collections.abc import Generator, Sequence
from typing import Any, Final

from ..checks import is_int
from ..errors import CorpusError
from ..keys import STRIDE
from ..policy import MAX_INTERVAL_S, PROVENANCES
from .model import PROVENANCE_CODE, Options, Rows, check_url

MAX_LINE_BYTES: Final = 1 << 20
"""A CSV/JSONL line longer than this is refused before it is held in memory."""

MAX_TABULAR_GZ_BYTES: Final = 1 << 31
"""Decompressed size of a gzipped CSV/JSONL, so a small bomb cannot inflate without bound."""

COLUMNS: Final = ("url", "interval_s", "provenance", "due_ms")
REQUIRED_COLUMNS: Final = ("url", "interval_s")

_DIGITS = re.compile(r"[0-9]{1,20}")
_ABSENT: Final = object()


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
    if not isinstance(name, str) or name not in PROVENANCE_CODE:
        raise CorpusError(f"{where}: provenance must be one of {', '.join(PROVENANCES)}, "
                          f"got {value!r}")
    return PROVENANCE_CODE[name]


def _check_columns(where: str, names: Sequence[str], kind: str) -> None:
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise CorpusError(f"{where}: unknown {kind} {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(COLUMNS)})")
    missing = [n for n in REQUIRED_COLUMNS if n not in names]
    if missing:
        raise CorpusError(f"{where}: missing {kind} {', '.join(map(repr, missing))}")


def _add_row(rows: Rows, file: int, where: str, line: int, values: Sequence[object],
             opts: Options, *, text: bool) -> None:
    """One CSV/JSONL row, ``values`` in ``COLUMNS`` order; ``_ABSENT`` marks a provenance or
    due time the source does not give."""
    url, interval, prov, due = values
    rows.add(file, line, check_url(where, url), _interval(where, interval, text=text),
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


def read_csv(path: str, compressed: bool, rows: Rows, opts: Options) -> None:
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


def read_jsonl(path: str, compressed: bool, rows: Rows, opts: Options) -> None:
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
