"""Sitemaps fetched over HTTP (engine/corpus/fetch.py through read_corpus): gzip either way,
indexes on their own host, the protocol's limits enforced while the body streams, timeouts, a
deadline, bounded redirects; every failure a CorpusError naming the URL and why. And on disk,
a project site under a subpath resolved by the longest suffix of a child's URL path."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest
from sitemap_server import SitemapServer, sitemapindex, urlset

from engine import CorpusError
from engine.corpus.fetch import FetchLimits
from engine.corpus.read import read_corpora, read_corpus
from engine.corpus.sitemaps import MAX_SITEMAP_BYTES

NOW = 1_700_000_000_000
QUICK = FetchLimits(timeout_s=1.0, deadline_s=10.0)


@pytest.fixture
def site() -> SitemapServer:
    with SitemapServer() as s:
        yield s


def _refused(url: str, *fragments: str, limits: FetchLimits = QUICK) -> str:
    with pytest.raises(CorpusError) as info:
        read_corpus(url, now_ms=NOW, fetch=limits)
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, text
    return text


def test_a_plain_sitemap_is_fetched_and_read_as_submitted_rows(site: SitemapServer) -> None:
    site.put("/sitemap.xml", urlset("https://shop.test/a", "https://shop.test/b", "/c"))
    c = read_corpus(site.url("/sitemap.xml"), now_ms=NOW, fetch=QUICK)
    # A root-relative <loc> resolves against the sitemap's own URL.
    assert c.urls == ["https://shop.test/a", "https://shop.test/b", site.url("/c")]
    assert c.statistics()["provenance"] == {"submitted": 3, "discovered": 0}
    assert (c.due_ms == NOW).all()


def test_gzip_is_undone_for_a_gz_file_for_content_encoding_and_for_both(
        site: SitemapServer) -> None:
    site.put("/a.xml.gz", gzip.compress(urlset("https://shop.test/a").encode()))
    site.put("/b.xml", urlset("https://shop.test/b"), gzip_encoding=True)
    site.put("/c.xml.gz", gzip.compress(urlset("https://shop.test/c").encode()),
             gzip_encoding=True)
    # Two gzip members concatenated are one file, as gunzip reads them.
    text = urlset("https://shop.test/d").encode()
    site.put("/d.xml.gz", gzip.compress(text[:40]) + gzip.compress(text[40:]))
    c = read_corpora([site.url(p) for p in ("/a.xml.gz", "/b.xml", "/c.xml.gz", "/d.xml.gz")],
                     now_ms=NOW, fetch=QUICK)
    assert c.urls == [f"https://shop.test/{x}" for x in "abcd"]


def test_an_index_fetches_its_children_on_its_host_and_counts_the_others(
        site: SitemapServer) -> None:
    site.put("/sitemap_index.xml", sitemapindex(
        site.url("/posts.xml"), "pages.xml.gz", "/en/sitemap.xml",
        "https://elsewhere.test/sitemap.xml", site.url("/x.xml", host="localhost")))
    site.put("/posts.xml", urlset("https://shop.test/p1", "https://shop.test/p2"))
    site.put("/pages.xml.gz", gzip.compress(urlset("https://shop.test/about").encode()))
    site.put("/en/sitemap.xml", urlset("https://shop.test/en/", "https://shop.test/p1"))
    c = read_corpus(site.url("/sitemap_index.xml"), now_ms=NOW, fetch=QUICK)
    assert c.urls == ["https://shop.test/p1", "https://shop.test/p2", "https://shop.test/about",
                      "https://shop.test/en/"]
    assert c.duplicates == 1
    # Off-site children are skipped with a count, never fetched.
    assert c.off_site == 2 and c.statistics()["off_site"] == 2
    assert "https://elsewhere.test/sitemap.xml, on another host" in (c.off_site_note or "")
    assert c.off_site_note.endswith("; 2 skipped")  # type: ignore[union-attr]
    assert "off-site" in c.describe()


def test_an_index_cycle_and_a_sitemap_listed_twice_are_refused(site: SitemapServer) -> None:
    site.put("/a.xml", sitemapindex("/b.xml"))
    site.put("/b.xml", sitemapindex(site.url("/a.xml")))
    _refused(site.url("/a.xml"), "sitemap index cycle", "/a.xml -> ", "(listed at ")
    site.put("/twice.xml", sitemapindex("/c.xml", "/c.xml"))
    site.put("/c.xml", urlset("https://shop.test/c"))
    _refused(site.url("/twice.xml"), "was already read")


@pytest.mark.parametrize("status", [500, 404, 503])
def test_a_non_2xx_answer_is_refused_with_its_status(site: SitemapServer, status: int) -> None:
    site.put("/sitemap.xml", "oops", status=status)
    text = _refused(site.url("/sitemap.xml"), f"HTTP {status}")
    assert text.startswith(f"{site.url('/sitemap.xml')}: cannot fetch: ")


def test_an_error_in_a_child_names_the_child_and_the_index_line(site: SitemapServer) -> None:
    site.put("/index.xml", sitemapindex("/ok.xml", "/gone.xml"))
    site.put("/ok.xml", urlset("https://shop.test/ok"))
    _refused(site.url("/index.xml"), f"{site.url('/gone.xml')}: cannot fetch: HTTP 404",
             f"(listed at {site.url('/index.xml')}:4)")
    site.put("/gone.xml", "<urlset><url><loc>not a url</loc></url></urlset>")
    _refused(site.url("/index.xml"), f"{site.url('/gone.xml')}:1: url 'not a url'")


def test_an_unreachable_host_is_refused_naming_the_url() -> None:
    with SitemapServer() as s:
        url = s.url("/sitemap.xml")  # its port, closed once the server is gone
    _refused(url, f"{url}: cannot fetch: cannot connect")


def test_a_server_that_never_answers_times_out(site: SitemapServer) -> None:
    site.hang("/sitemap.xml")
    t0 = time.monotonic()
    _refused(site.url("/sitemap.xml"), "no answer within 1 s")
    assert time.monotonic() - t0 < 20  # the 1 s timeout, not a hang


def test_a_body_that_trickles_in_stops_at_the_deadline(site: SitemapServer) -> None:
    site.drip("/sitemap.xml")  # every read answers within the timeout; the body never ends
    t0 = time.monotonic()
    _refused(site.url("/sitemap.xml"), "the deadline of 1.5 s for the sitemap and its children"
             " passed", limits=FetchLimits(timeout_s=1.0, deadline_s=1.5))
    assert 1.4 < time.monotonic() - t0 < 20  # read until the deadline, then stopped


def test_the_deadline_bounds_an_index_and_its_children_together(site: SitemapServer) -> None:
    # Each child answers within the timeout; together they take longer than the deadline.
    site.put("/index.xml", sitemapindex(*(f"/s{i}.xml" for i in range(5))))
    for i in range(5):
        site.put(f"/s{i}.xml", urlset(f"https://shop.test/{i}"), delay_s=0.4)
    t0 = time.monotonic()
    _refused(site.url("/index.xml"), "cannot fetch", "the deadline of 1 s for the sitemap and"
             " its children", limits=FetchLimits(timeout_s=1.0, deadline_s=1.0))
    assert time.monotonic() - t0 < 20
    assert sum(site.hits(f"/s{i}.xml") for i in range(5)) <= 3  # stopped at the deadline


def test_a_body_that_never_ends_stops_at_the_protocol_limit(site: SitemapServer) -> None:
    site.endless("/sitemap.xml")
    t0 = time.monotonic()
    _refused(site.url("/sitemap.xml"), f"larger than {MAX_SITEMAP_BYTES} bytes",
             limits=FetchLimits(timeout_s=5.0, deadline_s=60.0))
    assert time.monotonic() - t0 < 30


def test_a_gzip_bomb_and_a_large_content_length_are_refused_unread(site: SitemapServer) -> None:
    site.put("/bomb.xml.gz", gzip.compress(b" " * (MAX_SITEMAP_BYTES + 1)))
    _refused(site.url("/bomb.xml.gz"), f"larger than {MAX_SITEMAP_BYTES} bytes uncompressed")
    site.put("/huge.xml", b"", headers={"Content-Length": str(MAX_SITEMAP_BYTES + 1)})
    _refused(site.url("/huge.xml"), f"Content-Length {MAX_SITEMAP_BYTES + 1} is over")
    site.put("/bad.xml.gz", gzip.compress(urlset("https://shop.test/a").encode())[:-9])
    _refused(site.url("/bad.xml.gz"), "not valid gzip", "truncated")


def test_the_entry_cap_holds_for_fetched_sitemaps_and_indexes(site: SitemapServer) -> None:
    site.put("/big.xml", urlset(*(f"https://shop.test/{i}" for i in range(4))))
    site.put("/wide.xml", sitemapindex(*(f"/s{i}.xml" for i in range(4))))
    for url, entry in ((site.url("/big.xml"), "<url>"), (site.url("/wide.xml"), "<sitemap>")):
        with pytest.raises(CorpusError, match=f"more than 3 {entry} entries in one file"):
            read_corpus(url, now_ms=NOW, fetch=QUICK, max_sitemap_urls=3)


def test_a_malformed_body_is_refused_with_its_line(site: SitemapServer) -> None:
    site.put("/sitemap.xml", "<html><body>\nWelcome</body></html>")
    _refused(site.url("/sitemap.xml"), f"{site.url('/sitemap.xml')}:1: root element <html>")
    site.put("/sitemap.xml", '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY a "b">]>\n<urlset/>')
    _refused(site.url("/sitemap.xml"), "refused as unsafe XML")


def test_redirects_are_followed_within_a_bound_and_to_http_only(site: SitemapServer) -> None:
    site.redirect("/old.xml", "/sitemap.xml", 301)
    site.put("/sitemap.xml", urlset("https://shop.test/a"))
    assert read_corpus(site.url("/old.xml"), now_ms=NOW, fetch=QUICK).urls == [
        "https://shop.test/a"]
    site.redirect("/loop.xml", "/loop2.xml")
    site.redirect("/loop2.xml", "/loop.xml")
    _refused(site.url("/loop.xml"), "redirects")
    site.redirect("/ftp.xml", "ftp://127.0.0.1/sitemap.xml")
    _refused(site.url("/ftp.xml"), "not an http(s) URL")


def test_other_schemes_are_not_fetched(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="only http"):
        read_corpus("ftp://example.com/sitemap.xml", now_ms=NOW)


def test_a_project_site_under_a_subpath_resolves_by_the_longest_suffix(tmp_path: Path) -> None:
    root = tmp_path / "name"
    (root / "en").mkdir(parents=True)
    (root / "fr").mkdir()
    (root / "sitemap.xml").write_text(sitemapindex("https://host.test/name/en/sitemap.xml",
                                                   "https://host.test/name/fr/sitemap.xml"))
    (root / "en" / "sitemap.xml").write_text(urlset("https://host.test/name/en/"))
    (root / "fr" / "sitemap.xml").write_text(urlset("https://host.test/name/fr/"))
    c = read_corpus(root / "sitemap.xml", now_ms=NOW)
    assert c.urls == ["https://host.test/name/en/", "https://host.test/name/fr/"]


def test_a_suffix_never_leaves_the_corpus_directory(tmp_path: Path) -> None:
    root = tmp_path / "name"
    root.mkdir()
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "s.xml").write_text(urlset("https://host.test/secret"))
    os.symlink(outside, root / "en")  # en/s.xml exists, but outside
    (root / "sitemap.xml").write_text(sitemapindex("https://host.test/name/en/s.xml"))
    with pytest.raises(CorpusError, match="outside the corpus directory"):
        read_corpus(root / "sitemap.xml", now_ms=NOW)
    (root / "up.xml").write_text(sitemapindex("https://host.test/name/%2E%2E/secret/s.xml"))
    with pytest.raises(CorpusError, match="outside the corpus directory"):
        read_corpus(root / "up.xml", now_ms=NOW)
