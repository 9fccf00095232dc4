"""The directory store's own mechanics: atomic gzipped snapshots beside their metadata, files
and modes, bad input, forks, and no torn snapshot when writers are SIGKILLed mid-write. What
every store promises is tests/store/test_store_contract.py, run on this store too."""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineTypeError, EngineValueError, StoreError
from engine.store import DATABASE, HIT_WINDOW_MS, SnapshotStore
from engine.store import local as store_module

META: dict[str, Any] = {"status": 200, "location": None, "interval_s": 3600, "lane": 2,
                        "render_ms": 140.5}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    s = SnapshotStore.open(tmp_path / "store")
    yield s
    s.close()


def every_file(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory this process cannot write into: for root (who passes every permission
    check) a path under sysfs, which refuses every new entry."""
    if os.geteuid() == 0:
        return Path(f"/sys/lanes-store-test-{os.getpid()}")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return locked / "store"


def test_put_then_get_returns_the_html_and_its_metadata(store: SnapshotStore) -> None:
    assert store.put("https://s.test/a", "<p>é</p>", rendered_at_ms=1_000_000, **META) == "written"
    snap = store.get("https://s.test/a")
    assert snap is not None
    assert snap.html() == "<p>é</p>".encode()
    assert gzip.decompress(snap.gz) == snap.html()
    assert (snap.status, snap.location, snap.interval_s, snap.lane, snap.render_ms) == (
        200, None, 3600, 2, 140.5)
    assert snap.rendered_at_ms == 1_000_000
    assert snap.html_bytes == len("<p>é</p>".encode())
    assert snap.gz_bytes == os.path.getsize(snap.path) == len(snap.gz)
    assert snap.hash == hashlib.sha256(snap.html()).hexdigest()
    assert snap.age_s(1_000_000 + 61_500) == 61
    assert snap.age_over_interval(1_000_000 + 1_800_000) == pytest.approx(0.5)
    assert store.get("https://s.test/never") is None


def test_unchanged_html_is_counted_and_not_rewritten(store: SnapshotStore) -> None:
    store.put("https://s.test/a", b"<p>same</p>", rendered_at_ms=1_000, **META)
    first = store.get("https://s.test/a")
    assert first is not None
    inode = os.stat(first.path).st_ino
    assert store.put("https://s.test/a", "<p>same</p>", rendered_at_ms=9_000,
                     **{**META, "status": 404}) == "unchanged"
    again = store.get("https://s.test/a")
    assert again is not None
    assert os.stat(again.path).st_ino == inode and again.path == first.path
    assert (again.rendered_at_ms, again.status, again.renders, again.unchanged) == (
        9_000, 404, 2, 1)
    assert store.statistics()["unchanged"] == 1 and store.unchanged == 1


def test_changed_html_replaces_the_file_and_removes_the_old_one(store: SnapshotStore,
                                                                tmp_path: Path) -> None:
    store.put("https://s.test/a", "<p>one</p>", **META)
    old = store.get("https://s.test/a")
    assert store.put("https://s.test/a", "<p>two</p>",
                     **{**META, "status": 301, "location": "https://s.test/b"}) == "written"
    new = store.get("https://s.test/a")
    assert old is not None and new is not None
    assert new.html() == b"<p>two</p>" and (new.status, new.location) == (301, "https://s.test/b")
    assert not os.path.exists(old.path)
    assert every_file(tmp_path / "store" / "snapshots") == [Path(new.path)]


def test_file_names_fan_out_by_url_hash(store: SnapshotStore) -> None:
    store.put("https://s.test/a", "x", **META)
    snap = store.get("https://s.test/a")
    assert snap is not None
    h = hashlib.sha256(b"https://s.test/a").hexdigest()
    rel = os.path.relpath(snap.path, store.files).split(os.sep)
    assert rel[:2] == [h[:2], h[2:4]] and rel[2].startswith(h)


def test_every_file_is_0600_and_every_directory_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with SnapshotStore.open(tmp_path / "made" / "store") as s:
            s.put("https://s.test/a", "x", **META)
            s.log_hits([(1, 1, 0, 0.5, True, 0)])
            paths = list((tmp_path / "made").rglob("*"))
            names = {p.name for p in paths}
            assert {DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm"} <= names
            for p in [tmp_path / "made", *paths]:
                mode = stat.S_IMODE(p.stat().st_mode)
                assert mode == (0o700 if p.is_dir() else 0o600), p
    finally:
        os.umask(old)


@pytest.mark.parametrize("change", [
    {"status": 99}, {"status": 600}, {"status": "200"}, {"status": True}, {"status": 200.0},
    {"interval_s": 0}, {"interval_s": -5}, {"interval_s": 1.5}, {"lane": -1}, {"lane": None},
    {"render_ms": float("nan")}, {"render_ms": -1.0}, {"render_ms": float("inf")},
    {"location": "a\r\nSet-Cookie: x"}, {"location": 5}, {"rendered_at_ms": -1},
])
def test_bad_metadata_is_refused_and_changes_nothing(store: SnapshotStore,
                                                     change: dict[str, Any]) -> None:
    with pytest.raises(EngineValueError):
        store.put("https://s.test/a", "x", **{**META, **change})
    assert store.get("https://s.test/a") is None
    assert every_file(Path(store.files)) == []


@pytest.mark.parametrize("url", ["", "a\x00b", 5, None])
def test_bad_urls_and_html_are_refused(store: SnapshotStore, url: Any) -> None:
    with pytest.raises((EngineValueError, EngineTypeError)):
        store.put(url, "x", **META)
    with pytest.raises(EngineTypeError):
        store.put("https://s.test/a", 5, **META)  # type: ignore[arg-type]
    assert store.statistics()["snapshots"] == 0


def test_opening_an_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    target = unwritable_directory(tmp_path)
    with pytest.raises(StoreError, match="cannot"):
        SnapshotStore.open(target)
    assert not target.exists()


def test_a_failed_open_removes_the_directories_it_made(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(directory: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store_module, "_probe", refuse)
    with pytest.raises(StoreError, match="Permission denied"):
        SnapshotStore.open(tmp_path / "new" / "store")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_is_not_a_store_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a snapshot store: it holds notes.txt"):
        SnapshotStore.open(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        SnapshotStore.open(file)


@pytest.mark.parametrize("content", [b"garbage" * 200, None])
def test_a_foreign_database_is_refused(tmp_path: Path, content: bytes | None) -> None:
    (tmp_path / "s").mkdir()
    db = tmp_path / "s" / DATABASE
    if content is None:
        sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    else:
        db.write_bytes(content)
    with pytest.raises(StoreError):
        SnapshotStore.open(tmp_path / "s")


def test_open_without_create_needs_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no snapshot store"):
        SnapshotStore.open(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no snapshot store"):
        SnapshotStore.open(tmp_path / "empty", create=False)
    with SnapshotStore.open(tmp_path / "made") as made:
        assert made.created
    with SnapshotStore.open(tmp_path / "made", create=False) as s:
        assert s.statistics()["snapshots"] == 0 and not s.created


def test_a_store_used_across_a_fork_refuses_and_one_opened_after_it_works(
        store: SnapshotStore) -> None:
    store.put("https://s.test/a", "parent", **META)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 1
        try:
            try:
                store.get("https://s.test/a")
            except StoreError:
                store.close()  # abandons the inherited connection: the parent keeps its locks
                with SnapshotStore.open(store.directory) as mine:
                    mine.put("https://s.test/b", "child", **META)
                    code = 0 if mine.get("https://s.test/a") is not None else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    b = store.get("https://s.test/b")
    assert b is not None and b.html() == b"child"


def test_hits_are_logged_and_kept_for_the_window(store: SnapshotStore) -> None:
    store.put("https://s.test/a", "x", **META)
    snap = store.get("https://s.test/a")
    assert snap is not None
    t = 10 * HIT_WINDOW_MS
    store.log_hits([(t, snap.id, 2, 0.25, True, 0), (t + 1, snap.id, 2, 3.0, False, 7)])
    assert sorted(store.hits(0)) == [("https://s.test/a", 2, 0.25, True),
                                     ("https://s.test/a", 2, 3.0, False)]
    store.log_hits([(t + HIT_WINDOW_MS + 2, snap.id, 2, 0.5, True, 0)])
    assert store.hits(0) == [("https://s.test/a", 2, 0.5, True)]


def test_sweep_removes_orphans_and_dead_writers_temporary_files(store: SnapshotStore) -> None:
    store.put("https://s.test/a", "kept", **META)
    snap = store.get("https://s.test/a")
    assert snap is not None
    where = os.path.dirname(snap.path)
    orphan = snap.path.replace(snap.hash[:16], "0" * 16)
    Path(orphan).write_bytes(gzip.compress(b"old"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(where, f".tmp-{dead}-abcd").write_bytes(b"torn")
    live = Path(where, f".tmp-{os.getpid()}-abcd")
    live.write_bytes(b"in progress")
    assert store.sweep() == {"temporary": 1, "orphans": 1}
    assert sorted(every_file(Path(store.files))) == sorted([Path(snap.path), live])


# -- SIGKILL mid-write --------------------------------------------------------------------------

WRITER = """
import random, sys, time
from engine.store import SnapshotStore
s = SnapshotStore.open(sys.argv[1])
rng = random.Random(int(sys.argv[2]))
print("ready", flush=True)
while True:
    url = f"https://s.test/{rng.randrange(12)}"
    body = ("<p>" + str(rng.random()) + "</p>") * rng.randrange(1, 20000)
    s.put(url, body, status=200, location=None, interval_s=60, lane=rng.randrange(4),
          render_ms=1.0)
"""


def check_whole(directory: Path) -> int:
    """Every row's file is there, decompresses, and hashes to the row's hash; returns the rows."""
    with SnapshotStore.open(directory, create=False) as s:
        rows = s.ages()
        for url, _lane, _at, _interval in rows:
            snap = s.get(url)
            assert snap is not None
            assert hashlib.sha256(snap.html()).hexdigest() == snap.hash, url
            assert len(snap.html()) == snap.html_bytes
        return len(rows)


def test_sigkilled_writers_never_leave_a_torn_snapshot(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    SnapshotStore.open(directory).close()
    rng = random.Random(7)
    for round_ in range(12):
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(directory),
                                     str(round_ * 10 + i)], stdout=subprocess.PIPE, text=True)
                   for i in range(2)]  # two at once: the same URLs race
        try:
            for w in writers:
                assert w.stdout is not None and w.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            for w in writers:
                w.send_signal(signal.SIGKILL)
                w.wait()
                assert w.stdout is not None
                w.stdout.close()
        assert check_whole(directory) > 0
    with SnapshotStore.open(directory) as s:
        left = s.sweep()
        assert left["temporary"] > 0  # some kill did land mid-write
        referenced = {Path(s.get(url).path) for url, *_ in s.ages()}  # type: ignore[union-attr]
        assert set(every_file(Path(s.files))) == referenced
    assert check_whole(directory) == len(referenced)
