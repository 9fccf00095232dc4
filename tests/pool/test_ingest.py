"""Corpus ingest (docs/pool.md, "Corpus ingest"): CSV, JSONL and sitemaps become checked
columns, or a CorpusError that names the file and the line; hostile XML is refused, never
expanded; nothing partial comes back."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import pickle
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW, fresh_engine

from engine import CorpusError, EngineValueError
from engine.corpus.model import Corpus
from engine.corpus.read import read_corpora, read_corpus
from engine.corpus.sitemaps import CHANGEFREQ_INTERVALS, MAX_SITEMAP_BYTES, SITEMAP_NS
from engine.corpus.urlnorm import (
    _NORMAL_URL,
    MAX_URL_CHARS,
    _normalize_fully,
    normal_url,
    normalize_url,
)
from engine.errors import EngineError, EngineTypeError
from engine.policy import MAX_INTERVAL_S

DAY = 86_400
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def urlset(*entries: str, ns: str = SITEMAP_NS) -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{ns}">\n'
            + "\n".join(entries) + "\n</urlset>\n")


def url_entry(loc: str, changefreq: str | None = None) -> str:
    cf = f"<changefreq>{changefreq}</changefreq>" if changefreq is not None else ""
    return f"  <url><loc>{loc}</loc>{cf}</url>"


def index(*locs: str) -> str:
    body = "\n".join(f"  <sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{SITEMAP_NS}">\n'
            f"{body}\n</sitemapindex>\n")


def refused(path: Path, line: int | None, *fragments: str, **kw: Any) -> CorpusError:
    """read_corpus(path) raises a CorpusError that starts ``path:line:`` and says each fragment."""
    with pytest.raises(CorpusError) as info:
        read_corpus(path, now_ms=NOW, **kw)
    msg = str(info.value)
    prefix = f"{path}:{line}:" if line is not None else f"{path}:"
    assert msg.startswith(prefix), msg
    for fragment in fragments:
        assert fragment in msg, msg
    return info.value


# -- CSV ---------------------------------------------------------------------------------------


def test_csv_reads_every_column(tmp_path: Path) -> None:
    p = write(tmp_path / "c.csv", "url,interval_s,provenance,due_ms\n"
              "https://example.com/a,3600,submitted,1700000000000\n"
              "http://example.com/b,86400,discovered,0\n")
    c = read_corpus(p, now_ms=NOW)
    assert c.urls == ["https://example.com/a", "http://example.com/b"]
    assert c.interval_s.dtype == np.int64 and c.interval_s.tolist() == [3600, 86400]
    assert c.provenance.dtype == np.uint8 and c.provenance.tolist() == [0, 1]
    assert c.due_ms.dtype == np.int64 and c.due_ms.tolist() == [1_700_000_000_000, 0]
    assert len(c) == 2


def test_rows_without_a_due_time_are_due_at_the_readers_now_never_zero(tmp_path: Path) -> None:
    p = write(tmp_path / "c.csv", "url,interval_s,provenance\nhttps://example.com/a,60,submitted\n")
    assert read_corpus(p, now_ms=NOW).due_ms.tolist() == [NOW]
    before = time.time_ns() // 1_000_000
    due = int(read_corpus(p).due_ms[0])
    assert before <= due <= time.time_ns() // 1_000_000


def test_csv_without_provenance_column_takes_default_provenance(tmp_path: Path) -> None:
    p = write(tmp_path / "c.csv", "url,interval_s\nhttps://example.com/a,60\n")
    assert read_corpus(p, now_ms=NOW).provenance.tolist() == [0]
    assert read_corpus(p, now_ms=NOW, default_provenance="discovered").provenance.tolist() == [1]
    with pytest.raises(EngineValueError):
        read_corpus(p, now_ms=NOW, default_provenance="crawled")


def test_csv_columns_in_any_order_blank_lines_bom_whitespace_and_quotes(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_bytes("\ufeff\n due_ms , url ,interval_s\r\n\r\n"
                  ' 5 ,"https://example.com/a,b", 60 \r\n'
                  "\n   \n"
                  '7,"https://example.com/ml",60\n'.encode())
    c = read_corpus(p, now_ms=NOW)
    assert c.urls == ["https://example.com/a,b", "https://example.com/ml"]
    assert c.due_ms.tolist() == [5, 7]


def test_a_quoted_cell_spanning_lines_is_named_by_its_first_line(tmp_path: Path) -> None:
    p = write(tmp_path / "c.csv", 'url,interval_s\nhttps://example.com/a,60\n"https://example.com/\n'
              'x y",60\n')
    refused(p, 3, "whitespace")


def test_header_only_is_an_empty_corpus(tmp_path: Path) -> None:
    p = write(tmp_path / "c.csv", "url,interval_s,provenance\n")
    c = read_corpus(p, now_ms=NOW)
    assert len(c) == 0 and c.statistics()["due_ms"] is None


BAD_CSV = [
    # (body after the header "url,interval_s,provenance,due_ms", line, fragments)
    (",60,submitted,1\n", 2, ["url is empty"]),
    ("ftp://example.com/a,60,submitted,1\n", 2, ["not an absolute http(s) URL"]),
    ("/relative/path,60,submitted,1\n", 2, ["not an absolute http(s) URL"]),
    ("example.com/a,60,submitted,1\n", 2, ["not an absolute http(s) URL"]),
    ("http:///nohost,60,submitted,1\n", 2, ["has no host"]),
    ("http://example.com:99999/,60,submitted,1\n", 2, ["not a valid URL"]),
    ("http://[::1/,60,submitted,1\n", 2, ["not a valid URL"]),
    ("http://example.com/a b,60,submitted,1\n", 2, ["whitespace"]),
    ("http://example.com/a\x01,60,submitted,1\n", 2, ["control"]),
    ("https://example.com/" + "a" * 2100 + ",60,submitted,1\n", 2, ["characters long"]),
    ("https://example.com/a,0,submitted,1\n", 2, ["interval_s", "'0'"]),
    ("https://example.com/a,-5,submitted,1\n", 2, ["interval_s", "'-5'"]),
    ("https://example.com/a,3.5,submitted,1\n", 2, ["interval_s", "'3.5'"]),
    ("https://example.com/a,3600.0,submitted,1\n", 2, ["interval_s"]),
    ("https://example.com/a,nan,submitted,1\n", 2, ["interval_s", "'nan'"]),
    ("https://example.com/a,inf,submitted,1\n", 2, ["interval_s", "'inf'"]),
    ("https://example.com/a,1e3,submitted,1\n", 2, ["interval_s"]),
    (f"https://example.com/a,{MAX_INTERVAL_S + 1},submitted,1\n", 2, ["interval_s"]),
    ("https://example.com/a,,submitted,1\n", 2, ["interval_s"]),
    ("https://example.com/a,٣٦٠٠,submitted,1\n", 2, ["interval_s"]),  # Arabic-Indic digits
    ("https://example.com/a,60,crawled,1\n", 2, ["provenance", "'crawled'"]),
    ("https://example.com/a,60,,1\n", 2, ["provenance"]),
    ("https://example.com/a,60,SUBMITTED,1\n", 2, ["provenance"]),
    ("https://example.com/a,60,submitted,\n", 2, ["due_ms is empty", "never taken as 0"]),
    ("https://example.com/a,60,submitted,  \n", 2, ["due_ms is empty"]),
    ("https://example.com/a,60,submitted,nan\n", 2, ["due_ms", "'nan'"]),
    ("https://example.com/a,60,submitted,-inf\n", 2, ["due_ms"]),
    ("https://example.com/a,60,submitted,1.7e12\n", 2, ["due_ms", "'1.7e12'"]),
    ("https://example.com/a,60,submitted,-1\n", 2, ["due_ms"]),
    (f"https://example.com/a,60,submitted,{2**42}\n", 2, ["due_ms", "2**42 - 1"]),
    ("https://example.com/a,60,submitted,1,extra\n", 2, ["5 cells, the header has 4"]),
    ("https://example.com/a,60,submitted\n", 2, ["3 cells"]),
    ("https://example.com/ok,60,submitted,1\n\nhttps://example.com/a,60,submitted\n", 4,
     ["3 cells"]),
    ('"https://example.com/a,60,submitted,1\n', 2, ["malformed CSV"]),
    ("https://example.com/a\x00,60,submitted,1\n", 2, ["control character"]),
]


@pytest.mark.parametrize(("body", "line", "fragments"), BAD_CSV)
def test_a_bad_csv_row_is_refused_naming_its_line(tmp_path: Path, body: str, line: int,
                                                    fragments: list[str]) -> None:
    p = write(tmp_path / "bad.csv", "url,interval_s,provenance,due_ms\n" + body)
    refused(p, line, *fragments)


def test_a_repeated_csv_url_is_dropped_counted_and_named(tmp_path: Path) -> None:
    p = write(tmp_path / "d.csv", "url,interval_s,provenance,due_ms\n"
              "https://example.com/a,60,submitted,1\nhttps://example.com/b,60,submitted,1\n"
              "https://example.com/a,120,discovered,1\nHTTPS://example.com/b,5,discovered,2\n")
    c = read_corpus(p, now_ms=NOW)
    assert c.urls == ["https://example.com/a", "https://example.com/b"]
    assert c.interval_s.tolist() == [60, 60] and c.provenance.tolist() == [0, 0]
    assert c.duplicates == 2
    assert c.duplicate_note == (f"{p}:4 repeats {p}:2 (https://example.com/a); "
                                "2 duplicates dropped")
    assert "duplicates" in c.describe() and c.statistics()["duplicates"] == 2


@pytest.mark.parametrize(("text", "line", "fragments"), [
    ("", 1, ["no header row"]),
    ("\n\n", 1, ["no header row"]),
    ("url,interval,provenance\n", 1, ["unknown column 'interval'", "known: url"]),
    ("url,interval_s,due_sm\nhttps://example.com/a,60,1\n", 1, ["unknown column 'due_sm'"]),
    ("url,provenance\n", 1, ["missing column 'interval_s'"]),
    ("interval_s\n", 1, ["missing column 'url'"]),
    ("\nurl,url,interval_s\n", 2, ["'url' appears twice"]),
])
def test_a_bad_csv_header_is_refused(tmp_path: Path, text: str, line: int,
                                     fragments: list[str]) -> None:
    refused(write(tmp_path / "h.csv", text), line, *fragments)


def test_invalid_utf8_is_refused_naming_the_line(tmp_path: Path) -> None:
    p = tmp_path / "u.csv"
    p.write_bytes(b"url,interval_s\nhttps://example.com/a,60\nhttps://example.com/\xff,60\n")
    refused(p, 3, "not valid UTF-8")


def test_an_overlong_line_is_refused_before_it_is_held(tmp_path: Path) -> None:
    p = tmp_path / "long.jsonl"
    p.write_bytes(b'{"url": "' + b"a" * (2 << 20) + b'"}\n')
    refused(p, 1, "line longer than")


# -- JSONL -------------------------------------------------------------------------------------


def test_jsonl_and_ndjson_read_the_same_rows(tmp_path: Path) -> None:
    lines = [
        {"url": "https://example.com/a", "interval_s": 3600, "provenance": "discovered"},
        {"url": "https://example.com/b", "interval_s": 60, "due_ms": 12345},
    ]
    text = "\n" + "\n  \n".join(json.dumps(x) for x in lines) + "\n\n"
    for name in ("c.jsonl", "c.ndjson", "C.JSONL"):
        c = read_corpus(write(tmp_path / name, text), now_ms=NOW)
        assert c.urls == ["https://example.com/a", "https://example.com/b"]
        assert c.interval_s.tolist() == [3600, 60]
        assert c.provenance.tolist() == [1, 0]
        assert c.due_ms.tolist() == [NOW, 12345]


BAD_JSONL = [
    ('{"url": "https://example.com/a", "interval_s": 60', ["not valid JSON"]),
    ('["https://example.com/a", 60]', ["expected a JSON object, got list"]),
    ('"https://example.com/a"', ["expected a JSON object, got str"]),
    ('{"url": "https://example.com/a", "interval_s": 60.0}', ["interval_s", "60.0"]),
    ('{"url": "https://example.com/a", "interval_s": 60.5}', ["interval_s", "60.5"]),
    ('{"url": "https://example.com/a", "interval_s": "60"}', ["interval_s", "'60'"]),
    ('{"url": "https://example.com/a", "interval_s": true}', ["interval_s", "True"]),
    ('{"url": "https://example.com/a", "interval_s": null}', ["interval_s", "None"]),
    ('{"url": "https://example.com/a", "interval_s": NaN}', ["NaN is not a JSON number"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "due_ms": Infinity}',
     ["Infinity is not a JSON number"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "due_ms": -Infinity}',
     ["Infinity is not a JSON number"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "due_ms": null}',
     ["due_ms is empty", "never taken as 0"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "due_ms": 1e12}', ["due_ms"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "due_ms": ' + "9" * 5000 + "}",
     ["not valid JSON"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "provenance": null}', ["provenance"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "provenance": 1}', ["provenance"]),
    ('{"url": "https://example.com/a", "interval_s": 60, "ttl": 5}', ["unknown key 'ttl'"]),
    ('{"interval_s": 60}', ["missing key 'url'"]),
    ('{"url": "https://example.com/a"}', ["missing key 'interval_s'"]),
    ('{"url": 5, "interval_s": 60}', ["url must be a string"]),
    ('{"url": "mailto:a@example.com", "interval_s": 60}', ["not an absolute http(s) URL"]),
    ('{"url": "https://example.com/a", "url": "https://example.com/b", "interval_s": 60}',
     ["key 'url' appears twice"]),
    ("[" * 100_000 + "]" * 100_000, ["not valid JSON"]),
]


@pytest.mark.parametrize(("line_text", "fragments"), BAD_JSONL)
def test_a_bad_jsonl_line_is_refused_naming_its_line(tmp_path: Path, line_text: str,
                                                     fragments: list[str]) -> None:
    good = json.dumps({"url": "https://example.com/ok", "interval_s": 60})
    p = write(tmp_path / "bad.jsonl", f"{good}\n\n{line_text}\n{good.replace('ok', 'ok2')}\n")
    refused(p, 3, *fragments)


def test_gzipped_csv_and_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "c.csv.gz"
    p.write_bytes(gzip.compress(b"url,interval_s\nhttps://example.com/a,60\n"))
    assert read_corpus(p, now_ms=NOW).urls == ["https://example.com/a"]
    q = tmp_path / "c.jsonl.gz"
    q.write_bytes(gzip.compress(b'{"url": "https://example.com/b", "interval_s": 60}\n'))
    assert read_corpus(q, now_ms=NOW).urls == ["https://example.com/b"]
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"url,interval_s\n")
    refused(broken, 1, "cannot read")


# -- hypothesis: what is written is what is read -----------------------------------------------

HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,12}\.(com|org|example)", fullmatch=True)
PATHS = st.from_regex(r"(/[A-Za-z0-9._~%!$&'()*+,;=:@-]{0,10}){0,3}(\?[a-z0-9=&,]{0,10})?",
                      fullmatch=True)
ROWS = st.lists(
    st.tuples(
        st.builds(lambda s, h, p: f"{s}://{h}{p}", st.sampled_from(["http", "https", "HTTPS"]),
                  HOSTS, PATHS),
        st.integers(1, MAX_INTERVAL_S),
        st.sampled_from(["submitted", "discovered"]),
        st.one_of(st.none(), st.integers(0, 2**42 - 1)),
    ),
    max_size=30,
    unique_by=lambda r: normalize_url(r[0]),
)


@settings(max_examples=60)
@given(rows=ROWS, with_due=st.booleans(), fmt=st.sampled_from(["csv", "jsonl"]))
def test_random_valid_rows_read_back_exactly(tmp_path_factory: Any, rows: list[Any],
                                             with_due: bool, fmt: str) -> None:
    path = tmp_path_factory.mktemp("rt") / f"corpus.{fmt}"
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(["provenance", "url", "interval_s"] + (["due_ms"] if with_due else []))
        for url, interval, prov, due in rows:
            due = NOW - 1 if due is None else due
            w.writerow([prov, url, interval] + ([due] if with_due else []))
        path.write_text(out.getvalue())
    else:
        path.write_text("".join(json.dumps(
            {"url": url, "interval_s": interval, "provenance": prov}
            | ({"due_ms": NOW - 1 if due is None else due} if with_due else {})) + "\n"
            for url, interval, prov, due in rows))
    c = read_corpus(path, now_ms=NOW)
    assert c.urls == [normalize_url(r[0]) for r in rows]
    assert c.interval_s.tolist() == [r[1] for r in rows]
    assert c.provenance.tolist() == [0 if r[2] == "submitted" else 1 for r in rows]
    want = [(NOW - 1 if r[3] is None else r[3]) if with_due else NOW for r in rows]
    assert c.due_ms.tolist() == want


# Plain-looking URLs, mixed case, escapes in either case: the shapes a fast path could get wrong.
_PLAIN_LOOKING = r"[hH][tT][tT][pP][sS]?://[A-Za-z0-9.-]+(?:[/?#][!-~]*)?"


@settings(max_examples=300)
@given(url=st.from_regex(_NORMAL_URL, fullmatch=True) | st.from_regex(_PLAIN_LOOKING,
                                                                       fullmatch=True))
def test_the_url_fast_path_gives_what_the_full_normalisation_gives(url: str) -> None:
    if len(url) <= MAX_URL_CHARS:
        assert normal_url(url) == _normalize_fully(url)


# -- sitemaps ----------------------------------------------------------------------------------


def test_sitemap_rows_are_submitted_due_now_with_changefreq_intervals(tmp_path: Path) -> None:
    entries = [url_entry(f"https://example.com/{w}", w) for w in CHANGEFREQ_INTERVALS]
    entries += [
        url_entry("https://example.com/none"),
        url_entry("https://example.com/upper", " Weekly "),
        "  <url>\n    <loc>\n      https://example.com/spread?a=1&amp;b=2\n    </loc>\n"
        "    <lastmod>2001-01-01</lastmod><priority>0.9</priority>\n  </url>",
    ]
    c = read_corpus(write(tmp_path / "s.xml", urlset(*entries)), now_ms=NOW,
                    default_provenance="discovered")
    assert c.urls[-1] == "https://example.com/spread?a=1&b=2"
    assert c.interval_s.tolist() == [*CHANGEFREQ_INTERVALS.values(), DAY, 7 * DAY, DAY]
    assert c.provenance.tolist() == [0] * len(c)
    assert c.due_ms.tolist() == [NOW] * len(c)  # lastmod does not move the due time


def test_changefreq_map_overrides_and_sets_the_missing_default(tmp_path: Path) -> None:
    p = write(tmp_path / "s.xml", urlset(url_entry("https://example.com/a", "hourly"),
                                         url_entry("https://example.com/b")))
    c = read_corpus(p, now_ms=NOW, changefreq_map={"HOURLY": 600, "daily": 7200})
    assert c.interval_s.tolist() == [600, 7200]
    with pytest.raises(EngineValueError):
        read_corpus(p, now_ms=NOW, changefreq_map={"hourly": 0})
    with pytest.raises(EngineValueError):
        read_corpus(p, now_ms=NOW, changefreq_map={"hourly": 3600.0})  # type: ignore[dict-item]


def test_prefixed_namespace_no_namespace_and_extensions_are_read(tmp_path: Path) -> None:
    prefixed = (f'<sm:urlset xmlns:sm="{SITEMAP_NS}" '
                'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">\n'
                "<sm:url><sm:loc>https://example.com/a</sm:loc>\n"
                "<image:image><image:loc>https://example.com/a.png</image:loc>"
                "<sm:loc>ignored</sm:loc></image:image>\n"
                "</sm:url></sm:urlset>")
    assert read_corpus(write(tmp_path / "p.xml", prefixed), now_ms=NOW).urls == [
        "https://example.com/a"]
    bare = "<urlset><url><loc>https://example.com/b</loc></url></urlset>"
    assert read_corpus(write(tmp_path / "b.xml", bare), now_ms=NOW).urls == [
        "https://example.com/b"]


def test_gzipped_sitemap(tmp_path: Path) -> None:
    p = tmp_path / "s.xml.gz"
    p.write_bytes(gzip.compress(urlset(url_entry("https://example.com/a", "daily")).encode()))
    c = read_corpus(p, now_ms=NOW)
    assert c.urls == ["https://example.com/a"] and c.interval_s.tolist() == [DAY]
    not_gzip = write(tmp_path / "plain.xml.gz", urlset(url_entry("https://example.com/a")))
    refused(not_gzip, None, "cannot read (gzip)")


def test_a_gzip_bomb_is_refused_by_its_decompressed_size(tmp_path: Path) -> None:
    p = tmp_path / "bomb.xml.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:
        f.write(b"<urlset>")
        chunk = b" " * (1 << 20)
        for _ in range(MAX_SITEMAP_BYTES // len(chunk) + 1):
            f.write(chunk)
    assert p.stat().st_size < 200_000
    refused(p, None, "larger than", "refused")


@pytest.mark.parametrize(("xml", "line", "fragments"), [
    ("<urlset>\n<url>\n<loc>https://example.com/a</loc>\n</urlset>\n", 4,
     ["malformed XML", "mismatched tag"]),
    ("", 1, ["malformed XML", "no element found"]),
    ("<urlset>\n\n<url><loc>https://example.com/&foo;</loc></url></urlset>", 3,
     ["malformed XML", "undefined entity"]),
    ("<urlset>\n<url><loc>a</loc></url>\n</urlset>\n<urlset/>", 4, ["malformed XML", "junk"]),
    ('<rss version="2.0"><channel/></rss>', 1, ["not a sitemap"]),
    ('<feed xmlns="http://www.w3.org/2005/Atom"/>', 1, ["not a sitemap"]),
    ("<urlset>\n<sitemap><loc>https://example.com/a</loc></sitemap></urlset>", 2,
     ["unexpected <sitemap> in <urlset>"]),
    ("<urlset>\n<url>\n<lastmod>2020-01-01</lastmod>\n</url></urlset>", 2, ["<url> has no <loc>"]),
    ("<urlset><url>\n<loc>https://example.com/a</loc>\n<loc>https://example.com/b</loc>"
     "</url></urlset>", 3, ["<loc> appears twice"]),
    ("<urlset><url><loc>https://example.com/a<b>x</b></loc></url></urlset>", 1,
     ["unexpected <b> in <loc>"]),
    ("<urlset><url><loc>https://example.com/a</loc><title>x</title></url></urlset>", 1,
     ["unexpected <title> in <url>"]),
    ("<urlset>\n<url><loc></loc></url></urlset>", 2, ["url is empty"]),
    ("<urlset>\n<url><loc>javascript:alert(1)</loc></url></urlset>", 2,
     ["not an absolute http(s) URL"]),
    ("<urlset>\n<url>\n<loc>https://example.com/a</loc>\n<changefreq>fortnightly</changefreq>"
     "</url></urlset>", 4, ["unknown changefreq 'fortnightly'", "known: always"]),
    ("<urlset>\n<url><loc>https://example.com/a</loc><changefreq/></url></urlset>", 2,
     ["unknown changefreq ''"]),
])
def test_a_bad_sitemap_is_refused_naming_its_line(tmp_path: Path, xml: str, line: int,
                                                  fragments: list[str]) -> None:
    refused(write(tmp_path / "bad.xml", xml), line, *fragments)


def test_a_repeated_sitemap_loc_is_dropped_and_counted(tmp_path: Path) -> None:
    p = write(tmp_path / "s.xml", "<urlset>\n<url><loc>https://example.com/a</loc></url>\n"
              "<url><loc>https://example.com/a</loc><changefreq>hourly</changefreq></url>"
              "</urlset>")
    c = read_corpus(p, now_ms=NOW)
    assert c.urls == ["https://example.com/a"] and c.interval_s.tolist() == [DAY]
    assert c.duplicate_note == f"{p}:3 repeats {p}:2 (https://example.com/a); 1 duplicate dropped"
    clean = read_corpus(write(tmp_path / "t.xml", urlset(url_entry("https://example.com/a"))),
                        now_ms=NOW)
    assert clean.duplicates == 0 and clean.duplicate_note is None


def test_entries_beyond_the_cap_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "s.xml", urlset(*(url_entry(f"https://example.com/{i}")
                                           for i in range(4))))
    assert len(read_corpus(p, now_ms=NOW, max_sitemap_urls=4)) == 4
    refused(p, 6, "more than 3 <url> entries", max_sitemap_urls=3)
    with pytest.raises(EngineValueError):
        read_corpus(p, now_ms=NOW, max_sitemap_urls=0)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>https://example.com/&lol9;</loc></url>
</urlset>
"""


def test_billion_laughs_is_refused_as_unsafe(tmp_path: Path) -> None:
    t0 = time.monotonic()
    refused(write(tmp_path / "lol.xml", BILLION_LAUGHS), 2, "refused as unsafe", "DTDForbidden")
    assert time.monotonic() - t0 < 10  # refused before expanding (expanded, it would not end)


@pytest.mark.parametrize("doctype", [
    '<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>',
    '<!DOCTYPE urlset SYSTEM "file:///etc/passwd">',
    '<!DOCTYPE urlset [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]>',
])
def test_external_entities_are_refused_and_nothing_is_read(tmp_path: Path, doctype: str) -> None:
    xml = (f'<?xml version="1.0"?>\n{doctype}\n<urlset xmlns="{SITEMAP_NS}">\n'
           "<url><loc>https://example.com/&xxe;</loc></url>\n</urlset>\n")
    err = refused(write(tmp_path / "xxe.xml", xml), 2, "refused as unsafe")
    passwd = Path("/etc/passwd").read_text().splitlines()
    shown = f"{err!s} {err!r} {err.__cause__!r} {err.__context__!r}"
    assert err.__cause__ is None and err.__suppress_context__
    assert not any(line and line in shown for line in passwd)
    assert "root:" not in shown


def test_without_defusedxml_sitemaps_name_the_extra_to_install(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    p = write(tmp_path / "s.xml", urlset(url_entry("https://example.com/a")))
    monkeypatch.setitem(sys.modules, "defusedxml", None)
    monkeypatch.setitem(sys.modules, "defusedxml.expatreader", None)
    with pytest.raises(ImportError, match=r"pip install 'render-lanes\[pool\]'"):
        read_corpus(p, now_ms=NOW)
    csv_path = write(tmp_path / "c.csv", "url,interval_s\nhttps://example.com/a,60\n")
    assert len(read_corpus(csv_path, now_ms=NOW)) == 1  # CSV never needs it


# -- sitemap indexes ---------------------------------------------------------------------------


def test_sitemap_index_follows_relative_file_and_http_locs_on_disk(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    write(tmp_path / "parts" / "a.xml", urlset(url_entry("https://example.com/a", "hourly")))
    (tmp_path / "b.xml.gz").write_bytes(
        gzip.compress(urlset(url_entry("https://example.com/b", "weekly")).encode()))
    write(tmp_path / "c.xml", urlset(url_entry("https://example.com/c")))
    write(tmp_path / "nested.xml", index("parts/a.xml", "https://example.com/b.xml.gz"))
    write(tmp_path / "top.xml", index("nested.xml", (tmp_path / "c.xml").as_uri()))
    c = read_corpus(tmp_path / "top.xml", now_ms=NOW)
    assert c.urls == ["https://example.com/a", "https://example.com/b", "https://example.com/c"]
    assert c.interval_s.tolist() == [3600, 7 * DAY, DAY]
    assert c.provenance.tolist() == [0, 0, 0]


def test_an_index_in_a_cycle_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "a.xml", index("b.xml"))
    write(tmp_path / "b.xml", index("https://example.com/sitemaps/a.xml"))
    with pytest.raises(CorpusError) as info:
        read_corpus(tmp_path / "b.xml", now_ms=NOW)
    b, a = tmp_path / "b.xml", tmp_path / "a.xml"
    assert str(info.value) == f"{a}:3: sitemap index cycle: {b} -> {a} -> {b} (listed at {b}:3)"
    write(tmp_path / "self.xml", index("self.xml"))
    refused(tmp_path / "self.xml", 3, "cycle")


def test_a_missing_child_is_refused_naming_the_index_line(tmp_path: Path) -> None:
    write(tmp_path / "a.xml", urlset(url_entry("https://example.com/a")))
    p = write(tmp_path / "i.xml", index("a.xml", "https://example.com/missing.xml"))
    refused(p, 4, "not on disk", "never fetched")
    for loc, fragment in [("https://example.com/", "names no file"),
                          ("http://[oops/a.xml", "not a valid URL"),
                          ("file://otherhost/a.xml", "another host"),
                          ("ftp://example.com/a.xml", "only relative paths")]:
        refused(write(tmp_path / "j.xml", index(loc)), 3, fragment)


def test_an_error_in_a_child_names_the_child_and_the_index(tmp_path: Path) -> None:
    write(tmp_path / "bad.xml", "<urlset>\n<url><loc>nope</loc></url></urlset>")
    write(tmp_path / "i.xml", index("bad.xml"))
    refused(tmp_path / "bad.xml", 2, "not an absolute")
    with pytest.raises(CorpusError) as info:
        read_corpus(tmp_path / "i.xml", now_ms=NOW)
    assert str(info.value).startswith(f"{tmp_path / 'bad.xml'}:2: url 'nope'")
    assert str(info.value).endswith(f"(listed at {tmp_path / 'i.xml'}:3)")
    (tmp_path / "big.xml.gz").write_bytes(gzip.compress(b" " * (MAX_SITEMAP_BYTES + 1)))
    write(tmp_path / "k.xml", index("big.xml.gz"))
    with pytest.raises(CorpusError, match=r"listed at .*k\.xml:3"):
        read_corpus(tmp_path / "k.xml", now_ms=NOW)


def test_indexes_nested_too_deep_are_refused(tmp_path: Path) -> None:
    write(tmp_path / "leaf.xml", urlset(url_entry("https://example.com/a")))
    write(tmp_path / "i3.xml", index("leaf.xml"))
    write(tmp_path / "i2.xml", index("i3.xml"))
    write(tmp_path / "i1.xml", index("i2.xml"))
    write(tmp_path / "i0.xml", index("i1.xml"))
    assert len(read_corpus(tmp_path / "i1.xml", now_ms=NOW)) == 1
    with pytest.raises(CorpusError) as info:
        read_corpus(tmp_path / "i0.xml", now_ms=NOW)
    assert str(info.value) == (f"{tmp_path / 'i3.xml'}:2: sitemap indexes nested deeper than 3"
                               f" (listed at {tmp_path / 'i2.xml'}:3)"
                               f" (listed at {tmp_path / 'i1.xml'}:3)"
                               f" (listed at {tmp_path / 'i0.xml'}:3)")


def test_a_sitemap_listed_twice_is_read_once_or_refused(tmp_path: Path) -> None:
    write(tmp_path / "a.xml", urlset(url_entry("https://example.com/a")))
    write(tmp_path / "i.xml", index("a.xml", "./a.xml"))
    refused(tmp_path / "i.xml", 4, "already read", "via")
    with pytest.raises(CorpusError, match="already read"):
        read_corpora([tmp_path / "a.xml", tmp_path / "a.xml"], now_ms=NOW)
    with pytest.raises(CorpusError, match=r"a\.xml: this sitemap was already read \(via "):
        read_corpora([write(tmp_path / "j.xml", index("a.xml")), tmp_path / "a.xml"], now_ms=NOW)


def test_an_index_refuses_hostile_children(tmp_path: Path) -> None:
    write(tmp_path / "lol.xml", BILLION_LAUGHS)
    write(tmp_path / "i.xml", index("lol.xml"))
    with pytest.raises(CorpusError, match=r"lol\.xml:2: refused as unsafe"):
        read_corpus(tmp_path / "i.xml", now_ms=NOW)


# -- several files, nothing partial ------------------------------------------------------------


def test_read_corpora_concatenates_with_one_now_and_drops_cross_file_duplicates(
        tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", "url,interval_s\nhttps://example.com/a,60\n")
    b = write(tmp_path / "b.xml", urlset(url_entry("https://example.com/b")))
    c = read_corpora([a, str(b)], now_ms=NOW)
    assert c.urls == ["https://example.com/a", "https://example.com/b"]
    assert c.due_ms.tolist() == [NOW, NOW]
    dup = write(tmp_path / "d.jsonl", '{"url": "https://EXAMPLE.com:443/b", "interval_s": 5}\n')
    c = read_corpora([a, b, dup], now_ms=NOW)
    assert c.urls == ["https://example.com/a", "https://example.com/b"]
    assert c.interval_s.tolist() == [60, DAY]  # the first occurrence wins
    assert c.duplicates == 1
    assert c.duplicate_note == f"{dup}:1 repeats {b}:3 (https://example.com/b); 1 duplicate dropped"
    with pytest.raises(EngineTypeError):
        read_corpora(str(a))  # a str is iterable, but not a list of paths


def test_nothing_is_returned_when_any_row_is_bad(tmp_path: Path) -> None:
    good = "".join(f"https://example.com/{i},60\n" for i in range(5000))
    p = write(tmp_path / "late.csv", "url,interval_s\n" + good + "https://example.com/x,0\n")
    refused(p, 5002, "interval_s")
    ok = write(tmp_path / "ok.csv", "url,interval_s\n" + good)
    with pytest.raises(CorpusError):
        read_corpora([ok, p], now_ms=NOW)


@pytest.mark.parametrize("name", ["corpus.txt", "corpus", "corpus.xml.bz2", "corpus.gz"])
def test_an_unknown_suffix_is_refused(tmp_path: Path, name: str) -> None:
    refused(write(tmp_path / name, "url,interval_s\n"), None, "unknown corpus format")


def test_a_missing_file_is_a_corpus_error(tmp_path: Path) -> None:
    for name in ("nope.csv", "nope.xml", "nope.jsonl.gz"):
        refused(tmp_path / name, None, "No such file")


@pytest.mark.parametrize("now", [-1, 2**42, 1.5, float("nan"), True, "1"])
def test_a_bad_now_is_refused(tmp_path: Path, now: Any) -> None:
    p = write(tmp_path / "c.csv", "url,interval_s\nhttps://example.com/a,60\n")
    with pytest.raises(EngineError):
        read_corpus(p, now_ms=now)


# -- the Corpus value --------------------------------------------------------------------------


def test_corpus_checks_its_columns_and_freezes_them() -> None:
    c = Corpus(["https://example.com/a"], np.array([60]), np.array([1]), np.array([NOW]))
    assert c.provenance.dtype == np.uint8 and c.interval_s.dtype == np.int64
    with pytest.raises(ValueError):
        c.due_ms[0] = 0
    bad: list[tuple[Any, ...]] = [
        (["ftp://example.com/a"], [60], [0], [NOW]),
        ([" https://example.com/a"], [60], [0], [NOW]),
        (["https://example.com/a"], [0], [0], [NOW]),
        (["https://example.com/a"], [60.5], [0], [NOW]),
        (["https://example.com/a"], [60], [2], [NOW]),
        (["https://example.com/a"], [60], [0], [float("nan")]),
        (["https://example.com/a"], [60], [0], [-1]),
        (["https://example.com/a"], [60, 60], [0], [NOW]),
        (["https://example.com/a"] * 2, [60, 60], [0, 0], [NOW, NOW]),
        ("https://example.com/a", [60], [0], [NOW]),
    ]
    for args in bad:
        with pytest.raises(EngineError):
            Corpus(*args)


def test_concat_statistics_and_describe(tmp_path: Path) -> None:
    a = read_corpus(EXAMPLES / "sitemap.xml", now_ms=NOW)
    b = read_corpus(EXAMPLES / "corpus.csv", now_ms=NOW + 1)
    both = Corpus.concat([a, b])
    assert both.due_ms.tolist() == [NOW] * len(a) + [NOW + 1] * len(b)
    assert both.urls == a.urls + b.urls and len(both) == len(a) + len(b) == 22
    assert Corpus.concat([]) == Corpus.empty() and len(Corpus.empty()) == 0
    with pytest.raises(EngineValueError, match="duplicate url .* corpus 0 and row 0 of corpus 1"):
        Corpus.concat([a, a])
    s = both.statistics()
    assert s["rows"] == 22
    assert s["provenance"] == {"submitted": 15, "discovered": 7}
    assert sum(s["interval_s"].values()) == 22 and s["interval_s"][3600] == 4
    assert s["due_ms"] == {"min": NOW, "max": NOW + 1}
    text = both.describe()
    assert "22 rows" in text and "discovered" in text and "1 h" in text
    assert repr(both) == "<Corpus 22 rows: 15 submitted, 7 discovered>"


def test_a_corpus_pickles_by_value_for_spawned_workers() -> None:
    c = read_corpus(EXAMPLES / "corpus.csv", now_ms=NOW)
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.urls[3] == "https://www.example.com/search?q=kettle"
    assert not back.due_ms.flags.writeable


def test_an_ingested_corpus_loads_into_an_engine(tmp_path: Path) -> None:
    c = read_corpora([EXAMPLES / "sitemap.xml", EXAMPLES / "corpus.csv"], now_ms=NOW)
    with fresh_engine(capacity=64) as eng:
        rows = eng.add_many(c.due_ms, c.interval_s, c.provenance)
        assert len(rows) == len(c)
        for i, row in enumerate(rows.tolist()):
            d = eng.describe(row)
            assert d["due_ms"] == NOW and d["interval_s"] == int(c.interval_s[i])
            assert d["provenance"] == ("submitted", "discovered")[int(c.provenance[i])]
        got = eng.claim(budget=64, now_ms=NOW)
        assert sorted(got.rows.tolist()) == sorted(rows.tolist())
        assert {c.urls[rows.tolist().index(r)] for r in got.rows.tolist()} == set(c.urls)
        assert eng.verify() == []


def test_examples_are_valid(tmp_path: Path) -> None:
    for name in os.listdir(EXAMPLES):
        if name.endswith((".csv", ".xml", ".jsonl")):
            assert len(read_corpus(EXAMPLES / name, now_ms=NOW)) > 0


# -- URL normalisation -------------------------------------------------------------------------


@pytest.mark.parametrize(("spelling", "normal"), [
    ("https://Shop.example:443/café", "https://shop.example/caf%C3%A9"),
    ("https://shop.example/caf%c3%a9", "https://shop.example/caf%C3%A9"),
    ("HTTP://SHOP.EXAMPLE:80/A?B=C#D", "http://shop.example/A?B=C#D"),
    ("http://shop.example:8080/", "http://shop.example:8080/"),
    ("https://shop.example:80/", "https://shop.example:80/"),  # 80 is not https's default
    ("https://shop.example:/a", "https://shop.example/a"),
    ("https://bücher.example/straße?q=ü#é",
     "https://xn--bcher-kva.example/stra%C3%9Fe?q=%C3%BC#%C3%A9"),
    ("http://[::1]:80/a", "http://[::1]/a"),
    ("https://User:pä@Shop.example/", "https://User:p%C3%A4@shop.example/"),
    ("https://shop.example/a%2fb?z=1&a=2", "https://shop.example/a%2Fb?z=1&a=2"),  # not decoded
    ("https://shop.example/100%", "https://shop.example/100%"),  # a stray % stays
    ("https://shop.example/a?", "https://shop.example/a?"),
    ("https://shop.example/a#", "https://shop.example/a#"),
    ("https://shop.example", "https://shop.example"),
])
def test_normalize_url_gives_one_spelling_and_changes_nothing_else(spelling: str,
                                                                   normal: str) -> None:
    assert normalize_url(spelling) == normal
    assert normalize_url(normal) == normal


@pytest.mark.parametrize(("url", "reason"), [
    ("", "empty"),
    ("https://shop.example/a b", "whitespace"),
    ("https://shop.example/a\x7f", "control character"),
    ("https://shop.example/a\u00a0", "whitespace"),
    ("ftp://shop.example/", "not an absolute http(s) URL"),
    ("/about/", "not an absolute http(s) URL"),
    ("https:///a", "no host"),
    ("https://shop.example:99999/", "not a valid URL"),
    ("https://[oops/", "not a valid URL"),
    ("https://" + "é" * 64 + ".example/", "IDNA"),
    ("https://shop.example/\ud800", "lone surrogate"),
    ("https://shop.example/" + "é" * 400, "once percent-encoded"),
])
def test_normalize_url_refuses_what_is_not_an_http_url_saying_why(url: str, reason: str) -> None:
    with pytest.raises(EngineValueError, match=re.escape(reason)):
        normalize_url(url)


_LABEL = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
# A path as pieces: plain ASCII, a non-ASCII character, or a byte written as an escape.
_PIECE = st.one_of(st.from_regex(r"[A-Za-z0-9/._~!$&'()*+,;=:@?-]{1,6}", fullmatch=True),
                   st.characters(min_codepoint=0xA1, max_codepoint=0x2FFF,
                                 blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")),
                   st.integers(0, 255).map(lambda b: f"%{b:02x}"))


def _spellings(scheme: str, labels: list[str], pieces: list[str], upper: list[bool]
               ) -> tuple[str, str]:
    """Two spellings of one URL: raw non-ASCII and lowercase escapes with the default port and
    a mixed-case host, and everything encoded with uppercase escapes."""
    host = ".".join(labels) + ".example"
    mixed = "".join(c.upper() if u else c for c, u in zip(host, upper * len(host), strict=False))
    port = {"http": 80, "https": 443}[scheme]
    raw = "/" + "".join(pieces)
    encoded = "/" + "".join(p.upper() if p.startswith("%") else
                            p if p.isascii() else quote(p, safe="") for p in pieces)
    return f"{scheme.upper()}://{mixed}:{port}{raw}", f"{scheme}://{host}{encoded}"


@settings(max_examples=300)
@given(scheme=st.sampled_from(["http", "https"]), labels=st.lists(_LABEL, min_size=1, max_size=3),
       pieces=st.lists(_PIECE, max_size=12), upper=st.lists(st.booleans(), min_size=1))
def test_normalize_url_is_idempotent_and_equal_on_equivalent_spellings(
        scheme: str, labels: list[str], pieces: list[str], upper: list[bool]) -> None:
    a, b = _spellings(scheme, labels, pieces, upper)
    assert normalize_url(a) == normalize_url(b) == b
    assert normalize_url(normalize_url(a)) == normalize_url(a)


def test_every_reader_returns_normal_urls_and_merges_spellings(tmp_path: Path) -> None:
    c = write(tmp_path / "c.csv", "url,interval_s\nhttps://Shop.example:443/café,60\n")
    j = write(tmp_path / "j.jsonl", '{"url": "https://shop.example/caf%c3%a9", "interval_s": 5}\n'
              '{"url": "HTTPS://shop.example/b", "interval_s": 5}\n')
    s = write(tmp_path / "s.xml", urlset(url_entry("https://SHOP.example/b"),
                                         url_entry("https://shop.example/ü")))
    got = read_corpora([c, j, s], now_ms=NOW)
    assert got.urls == ["https://shop.example/caf%C3%A9", "https://shop.example/b",
                        "https://shop.example/%C3%BC"]
    assert got.duplicates == 2
    assert got.duplicate_note is not None and got.duplicate_note.startswith(f"{j}:1 repeats {c}:2")
    one = np.array([60]), np.array([0], np.uint8), np.array([NOW])
    assert Corpus(["HTTPS://Shop.example/é"], *one).urls == [
        "https://shop.example/%C3%A9"]
    with pytest.raises(EngineValueError, match="duplicate url"):
        Corpus(["https://shop.example/é", "https://shop.example/%c3%a9"], np.array([60, 60]),
               np.array([0, 0], np.uint8), np.array([NOW, NOW]))


def test_a_url_with_whitespace_inside_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    refused(write(tmp_path / "c.csv", 'url,interval_s\n"https://shop.example/a b",60\n'), 2,
            "whitespace")
    refused(write(tmp_path / "s.xml", "<urlset>\n<url><loc>https://shop.example/a\tb</loc></url>"
                                      "</urlset>"), 2, "whitespace")


# -- leading whitespace, base_url --------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "skipped"), [
    ("\n\n", 2), ("   \n\t", 1), ("\ufeff\n\n", 2), ("\r\n\r\n", 2), ("\r\r\n", 2), ("  ", 0)])
def test_blank_lines_before_the_declaration_are_skipped_and_lines_still_count(
        tmp_path: Path, prefix: str, skipped: int) -> None:
    body = urlset(url_entry("https://example.com/a"))
    p = tmp_path / "s.xml"
    p.write_bytes((prefix + body).encode())
    assert read_corpus(p, now_ms=NOW).urls == ["https://example.com/a"]
    bad = prefix + '<?xml version="1.0"?>\n<urlset>\n<url><loc>nope</loc></url></urlset>'
    p.write_bytes(bad.encode())
    refused(p, skipped + 3, "not an absolute")
    p.write_bytes((prefix + '<?xml version="1.0"?>\n<urlset>\n<url>\n</urlset>').encode())
    refused(p, skipped + 4, "malformed XML")


def test_root_relative_locs_need_base_url(tmp_path: Path) -> None:
    p = write(tmp_path / "s.xml", "<urlset>\n<url><loc>https://site.test/a</loc></url>\n"
                                  "<url><loc>/about/</loc></url></urlset>")
    refused(p, 3, "'/about/' is root-relative", "--base-url")
    c = read_corpus(p, now_ms=NOW, base_url="https://Site.test/blog/")
    assert c.urls == ["https://site.test/a", "https://site.test/about/"]
    for bad in ["site.test", "/blog/", "ftp://site.test/", "https:///x", ""]:
        with pytest.raises(EngineValueError, match="base_url"):
            read_corpus(p, now_ms=NOW, base_url=bad)
    with pytest.raises(EngineTypeError):
        read_corpus(p, now_ms=NOW, base_url=b"https://site.test/")  # type: ignore[arg-type]


# -- the mirrored site (tests/data/site) -------------------------------------------------------

SITE = Path(__file__).resolve().parents[1] / "data" / "site"
ESCAPE = Path(__file__).resolve().parents[1] / "data" / "escape"


def test_a_hugo_multilingual_index_reads_its_language_sitemaps() -> None:
    c = read_corpus(SITE / "sitemap.xml", now_ms=NOW)
    assert c.urls == [
        "http://site.test/ca/", "http://site.test/ca/sobre/", "http://site.test/ca/c%C3%A0rrec/",
        "http://site.test/ca/pla%C3%A7a/",  # read from a file with blank lines before <?xml
        "http://site.test/en/", "http://site.test/en/about/", "http://site.test/en/posts/hello/"]
    assert c.interval_s.tolist() == [3600, 30 * DAY, 7 * DAY, 7 * DAY, 3600, 30 * DAY, 7 * DAY]
    assert c.duplicates == 0 and c.route.tolist() == [-1] * 7


def test_a_yoast_index_with_root_relative_and_gzipped_children() -> None:
    c = read_corpus(SITE / "sitemap_index.xml", now_ms=NOW)
    assert c.urls == [
        "http://site.test/blog/", "http://site.test/blog/hello-world/",
        "http://site.test/blog/spring-sale/",
        "http://site.test/", "http://site.test/contact/", "http://site.test/shipping/",
        "http://site.test/p/kettle/", "http://site.test/p/toaster/", "http://site.test/c/kitchen/"]
    assert c.interval_s.tolist() == [DAY] * 9  # no <changefreq>, or "daily"
    assert c.duplicates == 1
    assert c.duplicate_note == (f"{SITE / 'post-sitemap.xml'}:25 repeats "
                                f"{SITE / 'post-sitemap.xml'}:8 "
                                "(http://site.test/blog/hello-world/); 1 duplicate dropped")


def test_a_urlset_of_root_relative_locs_reads_with_base_url() -> None:
    p = SITE / "blog" / "sitemap.xml"
    refused(p, 4, "root-relative", "--base-url")
    c = read_corpus(p, now_ms=NOW, base_url="http://site.test/")
    assert c.urls == ["http://site.test/blog/archive/2023/", "http://site.test/blog/archive/2024/"]


def _opened_paths(monkeypatch: Any) -> list[str]:
    """Record every file the ingest module opens, through open() or gzip.open()."""
    import engine.corpus.sitemaps as ingest

    opened: list[str] = []
    real_open, real_gzip_open = open, gzip.open

    def spy_open(path: Any, *args: Any, **kw: Any) -> Any:
        opened.append(os.path.realpath(path))
        return real_open(path, *args, **kw)

    def spy_gzip_open(path: Any, *args: Any, **kw: Any) -> Any:
        opened.append(os.path.realpath(path))
        return real_gzip_open(path, *args, **kw)

    monkeypatch.setattr(ingest, "open", spy_open, raising=False)
    monkeypatch.setattr(gzip, "open", spy_gzip_open)
    return opened


@pytest.mark.parametrize(("name", "fragments"), [
    ("root-relative.xml", ["not on disk", f"looked for {ESCAPE / 'etc' / 'hostname'}"]),
    ("dotdot.xml", ["outside the corpus directory", str(ESCAPE)]),
    ("file-url.xml", ["outside the corpus directory", "/etc/hostname"]),
    ("http-dotdot.xml", ["outside the corpus directory", "/etc/hostname"]),
])
def test_a_hostile_index_never_opens_a_file_outside_the_corpus_directory(
        monkeypatch: Any, name: str, fragments: list[str]) -> None:
    opened = _opened_paths(monkeypatch)
    refused(ESCAPE / name, 4, *fragments)
    assert opened == [str(ESCAPE / name)]


def test_a_symlink_out_of_the_corpus_directory_is_refused(tmp_path: Path, monkeypatch: Any
                                                          ) -> None:
    site, outside = tmp_path / "site", tmp_path / "outside"
    site.mkdir()
    outside.mkdir()
    write(outside / "secret.xml", urlset(url_entry("https://example.com/secret")))
    (site / "evil.xml").symlink_to(outside / "secret.xml")
    (site / "en").symlink_to(outside, target_is_directory=True)
    write(outside / "sitemap.xml", urlset(url_entry("https://example.com/en")))
    opened = _opened_paths(monkeypatch)
    for loc in ["evil.xml", "http://site.test/evil.xml", "/evil.xml",
                "http://site.test/en/sitemap.xml", "en/sitemap.xml"]:
        err = refused(write(site / "i.xml", index(loc)), 3, "outside the corpus directory")
        assert str(outside) in str(err)
    assert all(p.startswith(str(site) + os.sep) for p in opened), opened
    # Given directly, the target's own directory is the corpus directory: that is the operator's
    # choice, not an index's.
    assert read_corpus(site / "evil.xml", now_ms=NOW).urls == ["https://example.com/secret"]


def test_url_children_map_to_their_path_under_the_corpus_directory(tmp_path: Path) -> None:
    (tmp_path / "en").mkdir()
    (tmp_path / "café").mkdir()
    write(tmp_path / "en" / "sitemap.xml", urlset(url_entry("https://site.test/en/")))
    write(tmp_path / "café" / "s.xml", urlset(url_entry("https://site.test/caf%C3%A9/")))
    write(tmp_path / "en" / "more.xml", urlset(url_entry("https://site.test/en/more")))
    write(tmp_path / "en" / "index.xml", index("more.xml", "/café/s.xml"))  # relative to en/
    top = write(tmp_path / "sitemap.xml", index("https://site.test/en/sitemap.xml",
                                                "//site.test/caf%C3%A9/s.xml"))
    assert read_corpus(top, now_ms=NOW).urls == ["https://site.test/en/",
                                                 "https://site.test/caf%C3%A9/"]
    nested = write(tmp_path / "n.xml", index("en/index.xml"))
    assert read_corpus(nested, now_ms=NOW).urls == ["https://site.test/en/more",
                                                    "https://site.test/caf%C3%A9/"]


def test_a_missing_url_child_falls_back_to_its_basename_next_to_the_index(tmp_path: Path
                                                                          ) -> None:
    write(tmp_path / "posts.xml", urlset(url_entry("https://site.test/p")))
    flat = write(tmp_path / "sitemap_index.xml", index("https://site.test/en/posts.xml"))
    assert read_corpus(flat, now_ms=NOW).urls == ["https://site.test/p"]
    # A flat download of a Hugo index: the child's basename is the index itself, never read.
    hugo = write(tmp_path / "sitemap.xml", index("https://site.test/en/sitemap.xml"))
    refused(hugo, 3, f"looked for {tmp_path / 'en' / 'sitemap.xml'} and",
            "the index itself or an ancestor", "never fetched")


def test_base_url_with_a_path_maps_urls_below_it_to_the_corpus_directory(tmp_path: Path
                                                                          ) -> None:
    (tmp_path / "en").mkdir()
    write(tmp_path / "en" / "s.xml", urlset(url_entry("https://site.test/blog/en/a")))
    top = write(tmp_path / "sitemap.xml", index("https://site.test/blog/en/s.xml"))
    # Without it, the longest suffix of the URL path that exists is found all the same.
    assert read_corpus(top, now_ms=NOW).urls == ["https://site.test/blog/en/a"]
    c = read_corpus(top, now_ms=NOW, base_url="https://site.test/blog/")
    assert c.urls == ["https://site.test/blog/en/a"]
    assert len(read_corpus(top, now_ms=NOW, base_url="https://site.test/blog")) == 1
