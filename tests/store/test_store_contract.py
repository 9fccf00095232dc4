"""The store contract (engine/store/api.py), held on every store: a put is whole or absent,
the same HTML is "unchanged", bad input is refused and changes nothing, a URL keeps its id,
clear drops what it names, and the hit log and crawler counts are the store's."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine.errors import EngineClosed, EngineTypeError, EngineValueError
from engine.store import HIT_WINDOW_MS, Store, StoreSpec, open_store
from engine.store import api as store_api

META: dict[str, Any] = {"status": 200, "location": None, "interval_s": 3600, "lane": 2,
                        "render_ms": 140.5}


def test_put_then_get_returns_the_html_and_its_metadata(store: Store) -> None:
    assert store.put("https://s.test/a", "<p>é</p>", rendered_at_ms=1_000_000, **META) == "written"
    snap = store.get("https://s.test/a")
    assert snap is not None
    assert snap.html() == "<p>é</p>".encode()
    assert gzip.decompress(snap.gz) == snap.html()
    assert (snap.status, snap.location, snap.interval_s, snap.lane, snap.render_ms) == (
        200, None, 3600, 2, 140.5)
    assert snap.rendered_at_ms == 1_000_000
    assert snap.html_bytes == len("<p>é</p>".encode()) and snap.gz_bytes == len(snap.gz)
    assert snap.age_s(1_000_000 + 61_500) == 61
    assert snap.age_over_interval(1_000_000 + 1_800_000) == pytest.approx(0.5)
    assert store.get("https://s.test/never") is None


def test_unchanged_html_is_counted_and_keeps_its_hash_and_id(store: Store) -> None:
    store.put("https://s.test/a", b"<p>same</p>", rendered_at_ms=1_000, **META)
    first = store.get("https://s.test/a")
    assert first is not None
    assert store.put("https://s.test/a", "<p>same</p>", rendered_at_ms=9_000,
                     **{**META, "status": 404}) == "unchanged"
    again = store.get("https://s.test/a")
    assert again is not None
    assert (again.hash, again.id, again.path) == (first.hash, first.id, first.path)
    assert (again.rendered_at_ms, again.status, again.renders, again.unchanged) == (
        9_000, 404, 2, 1)
    assert store.statistics()["unchanged"] == 1 and store.unchanged == 1


def test_changed_html_is_written_with_a_new_hash(store: Store) -> None:
    store.put("https://s.test/a", "<p>one</p>", rendered_at_ms=1_000, **META)
    old = store.get("https://s.test/a")
    assert store.put("https://s.test/a", "<p>two</p>", rendered_at_ms=2_000,
                     **{**META, "status": 301, "location": "https://s.test/b"}) == "written"
    new = store.get("https://s.test/a")
    assert old is not None and new is not None
    assert new.html() == b"<p>two</p>" and (new.status, new.location) == (301, "https://s.test/b")
    assert new.hash != old.hash and new.id == old.id
    assert store.written == 2


def test_a_known_answer_with_the_same_hash_is_reused_not_read_again(store: Store) -> None:
    store.put("https://s.test/a", "<p>x</p>", **META)
    first = store.get("https://s.test/a")
    assert first is not None
    again = store.get("https://s.test/a", first)
    assert again is not None and again.gz is first.gz


@pytest.mark.parametrize("change", [
    {"status": 99}, {"status": 600}, {"status": "200"}, {"status": True}, {"status": 200.0},
    {"interval_s": 0}, {"interval_s": -5}, {"interval_s": 1.5}, {"lane": -1}, {"lane": None},
    {"render_ms": float("nan")}, {"render_ms": -1.0}, {"render_ms": float("inf")},
    {"location": "a\r\nSet-Cookie: x"}, {"location": 5}, {"rendered_at_ms": -1},
])
def test_bad_metadata_is_refused_and_changes_nothing(store: Store,
                                                     change: dict[str, Any]) -> None:
    with pytest.raises(EngineValueError):
        store.put("https://s.test/a", "x", **{**META, **change})
    assert store.get("https://s.test/a") is None
    assert store.statistics()["snapshots"] == 0


@pytest.mark.parametrize("url", ["", "a\x00b", 5, None])
def test_bad_urls_and_html_are_refused(store: Store, url: Any) -> None:
    with pytest.raises((EngineValueError, EngineTypeError)):
        store.put(url, "x", **META)
    with pytest.raises(EngineTypeError):
        store.put("https://s.test/a", 5, **META)  # type: ignore[arg-type]
    with pytest.raises(EngineTypeError):
        store.clear("https://s.test/a")
    assert store.statistics()["snapshots"] == 0


def test_numpy_integers_are_accepted(store: Store) -> None:
    store.put("https://s.test/a", "x", **{**META, "lane": np.int64(3),
                                          "interval_s": np.int32(60), "render_ms": np.float64(2)})
    snap = store.get("https://s.test/a")
    assert snap is not None and (snap.lane, snap.interval_s) == (3, 60)


def test_a_closed_store_refuses_calls(store: Store) -> None:
    store.close()
    with pytest.raises(EngineClosed):
        store.get("https://s.test/a")


def test_clear_drops_the_named_snapshots_only(store: Store) -> None:
    for u in ("a", "b", "c"):
        store.put(f"https://s.test/{u}", u, **META)
    assert store.clear(["https://s.test/a", "https://s.test/b", "https://s.test/never"]) == 2
    assert store.get("https://s.test/a") is None and store.get("https://s.test/c") is not None
    assert [u for u, *_ in store.ages()] == ["https://s.test/c"]


def test_each_variant_of_a_url_is_a_snapshot_of_its_own_and_clearing_the_url_drops_all(
        store: Store) -> None:
    """Keyed by (URL, variant): ``URL mobile`` beside the URL (engine/corpus/variant_rows.py)."""
    url = "https://s.test/p"
    store.put(url, "desktop", **META)
    store.put(f"{url} mobile", "phone", **META)
    store.put("https://s.test/other mobile", "other", **META)
    desktop, phone = store.get(url), store.get(f"{url} mobile")
    assert desktop is not None and phone is not None and desktop.id != phone.id
    assert (desktop.html(), phone.html()) == (b"desktop", b"phone")
    assert store.clear([url]) == 2  # the URL's every variant
    assert store.get(url) is None and store.get(f"{url} mobile") is None
    assert [u for u, *_ in store.ages()] == ["https://s.test/other mobile"]
    assert store.clear(["https://s.test/other mobile"]) == 1  # a variant alone, by its key


def test_a_second_opener_sees_every_write_at_once(store: Store) -> None:
    other = open_store(store.spec, create=False)
    try:
        store.put("https://s.test/a", "one", **META)
        seen = other.get("https://s.test/a")
        assert seen is not None and seen.html() == b"one"
        other.put("https://s.test/a", "two", **META)
        mine = store.get("https://s.test/a")
        assert mine is not None and mine.html() == b"two" and mine.hash != seen.hash
        other.clear(["https://s.test/a"])
        assert store.get("https://s.test/a") is None
    finally:
        other.close()


def test_ids_ages_and_ratios_list_every_snapshot(store: Store) -> None:
    store.put("https://s.test/a", "a", rendered_at_ms=0, **META)
    store.put("https://s.test/b", "b", rendered_at_ms=1_800_000, **{**META, "lane": 5})
    a, b = store.get("https://s.test/a"), store.get("https://s.test/b")
    assert a is not None and b is not None and a.id != b.id
    assert store.urls_after(0) == sorted([(a.id, a.url), (b.id, b.url)])
    assert store.urls_after(max(a.id, b.id)) == []
    ids, lanes, ratios = store.ratios(3_600_000)
    got = dict(zip(ids.tolist(), zip(lanes.tolist(), ratios.tolist(), strict=True), strict=True))
    assert got == {a.id: (2, pytest.approx(1.0)), b.id: (5, pytest.approx(0.5))}
    assert sorted(store.ages()) == [(a.url, 2, 0, 3600), (b.url, 5, 1_800_000, 3600)]


def test_hits_are_logged_and_kept_for_the_window(store: Store) -> None:
    store.put("https://s.test/a", "x", **META)
    snap = store.get("https://s.test/a")
    assert snap is not None
    t = 10 * HIT_WINDOW_MS
    store.log_hits([(t, snap.id, 2, 0.25, True, 0), (t + 1, snap.id, 2, 3.0, False, 7)],
                   {0: (1, 0), 7: (2, 1)})
    assert sorted(store.hits(0)) == [("https://s.test/a", 2, 0.25, True),
                                     ("https://s.test/a", 2, 3.0, False)]
    ids, lanes, ratios, served = store.hit_ratios(0)
    assert sorted(zip(ratios.tolist(), served.tolist(), strict=True)) == [(0.25, True),
                                                                          (3.0, False)]
    assert store.bot_requests() == {0: (1, 0), 7: (2, 1)}
    assert store.bot_ratios(0) == {0: (1, 0.25, 0), 7: (1, pytest.approx(float("nan"),
                                                                         nan_ok=True), 1)}
    store.log_hits([(t + HIT_WINDOW_MS + 2, snap.id, 2, 0.5, True, 0)], {0: (1, 0)})
    assert store.hits(0) == [("https://s.test/a", 2, 0.5, True)]
    assert store.bot_requests()[0] == (2, 0)


def test_the_hit_log_keeps_at_most_the_cap(store: Store,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_api, "HIT_CAP", 5)
    store.put("https://s.test/a", "x", **META)
    snap = store.get("https://s.test/a")
    assert snap is not None
    t = 10 * HIT_WINDOW_MS
    store.log_hits([(t + i, snap.id, 2, i / 10, True, 0) for i in range(8)])
    store.log_hits([(t + 8, snap.id, 2, 0.8, True, 0)])
    assert sorted(r for _u, _ln, r, _ok in store.hits(0)) == [0.4, 0.5, 0.6, 0.7, 0.8]


def test_every_store_names_where_it_is_and_how_it_reads(store: Store,
                                                       store_kind: str) -> None:
    assert store.address == store.spec.address
    assert store.remote is (store_kind == "s3") is store.spec.shared
    assert store.statistics()["snapshots"] == 0


@pytest.mark.parametrize("spec, why", [
    (StoreSpec(""), "--store"),
    (StoreSpec("/tmp/x", endpoint="http://h"), "--store-endpoint"),
    (StoreSpec("s3://lanes-test/p"), "--redis"),
    (StoreSpec("s3://Bad_Bucket/p", redis="redis://h"), "BUCKET"),
    (StoreSpec("s3://lanes-test", redis="redis://h"), "PREFIX"),
    (StoreSpec("s3://lanes-test/a{b}", redis="redis://h"), "PREFIX"),
    (StoreSpec("s3://lanes-test/p", endpoint="ftp://h", redis="redis://h"), "http"),
])
def test_a_bad_spec_is_refused_before_anything_is_opened(spec: StoreSpec, why: str) -> None:
    with pytest.raises(EngineValueError, match=why):
        open_store(spec)


def test_make_spec_is_per_test(make_spec: Callable[[], StoreSpec]) -> None:
    assert make_spec() != make_spec()
