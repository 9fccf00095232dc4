"""The failure log (engine/pool/failures.py): what record, clear and entries keep; concurrent
writers in forked processes, one SIGKILLed mid-way; connections never crossing a fork; the
checkpoint round trip by URL; and no file left in /dev/shm."""

from __future__ import annotations

import ctypes
import glob
import json
import multiprocessing as mp
import os
import signal
import sqlite3
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from lanes_testlib import unique_name

from engine import shmfile
from engine.errors import (
    EngineClosed,
    EngineValueError,
    LayoutMismatch,
    SegmentExists,
    SegmentMissing,
)
from engine.pool.failures import EXPORT_FIELDS, FailureEntry, FailureLog
from engine.pool.render import Failure

GONE = Failure("curl exited 22: curl: (22) The requested URL returned error: 404", "exit", True,
               22, 404)
BUSY = Failure("curl exited 22: curl: (22) The requested URL returned error: 503", "exit",
               False, 22, 503)
BUG = Failure("NameError: name 'x' is not defined", "exception", False)


def files_of(name: str) -> list[str]:
    return sorted(glob.glob(glob.escape(shmfile.path_of(name, "")) + "*"))


@pytest.fixture
def name() -> Iterator[str]:
    """A unique pool name whose failure files are removed, and checked gone, afterwards."""
    n = unique_name()
    yield n
    path = shmfile.path_of(n, "failures")
    assert set(files_of(n)) <= {path, f"{path}-wal", f"{path}-shm"}  # no temporary file left
    FailureLog.unlink(n)
    assert files_of(n) == []


@pytest.fixture
def log(name: str) -> Iterator[FailureLog]:
    with FailureLog.create(name) as log:
        yield log


def entry(log: FailureLog, row: int) -> FailureEntry | None:
    got = log.entries([row])
    return got[0] if got else None


# -- what is kept -------------------------------------------------------------------------------


def test_record_counts_failures_and_keeps_the_latest_reason(log: FailureLog) -> None:
    log.record(5, "https://a.example/5", BUSY, 1_000)
    log.record(5, "https://a.example/5", GONE, 2_000)
    assert entry(log, 5) == FailureEntry(5, "https://a.example/5", 2, 1_000, 2_000, GONE.reason,
                                         "exit", True, 404)


def test_a_row_that_now_holds_another_url_counts_from_one(log: FailureLog) -> None:
    log.record(5, "https://a.example/old", BUSY, 1_000)
    log.record(5, "https://a.example/old", BUSY, 2_000)
    log.record(5, "https://a.example/new", BUG, 3_000)
    assert entry(log, 5) == FailureEntry(5, "https://a.example/new", 1, 3_000, 3_000, BUG.reason,
                                         "exception", False, None)


def test_clear_removes_the_rendered_rows_only(log: FailureLog) -> None:
    for row in range(6):
        log.record(row, f"https://a.example/{row}", BUSY, 1_000 + row)
    log.clear([1, 3, 99])
    log.clear([])
    log.clear(np.array([4], dtype=np.int64))  # the pool's batches are numpy arrays
    assert [e.row for e in log.entries()] == [5, 2, 0]


def test_clearing_rows_that_never_failed_is_cheap(log: FailureLog) -> None:
    """A completed batch is cleared on every cycle: for rows that never failed that is one
    SELECT, with no write and no transaction."""
    for row in range(1000):
        log.record(row, f"https://a.example/{row}", BUSY, row)
    batch = list(range(5000, 5016))
    log.clear(batch)  # the connection is open
    ran: list[str] = []
    log._db().set_trace_callback(ran.append)
    try:
        log.clear(batch)
    finally:
        log._db().set_trace_callback(None)
    assert len(ran) == 1 and ran[0].lstrip().upper().startswith("SELECT"), ran
    assert log.statistics()["entries"] == 1000


def test_entries_are_newest_first_and_can_be_filtered_and_limited(log: FailureLog) -> None:
    for row, at in ((0, 30), (1, 10), (2, 50), (3, 20), (4, 50)):
        log.record(row, f"https://a.example/{row}", BUSY, at)
    assert [e.row for e in log.entries()] == [2, 4, 0, 3, 1]  # ties by row
    assert [e.row for e in log.entries(limit=2)] == [2, 4]
    assert [e.row for e in log.entries(rows=[1, 3, 4, 77])] == [4, 3, 1]
    assert [e.row for e in log.entries(rows=range(4), limit=1)] == [2]
    assert log.entries(rows=[]) == [] and log.entries(limit=0) == []
    assert [e.row for e in log.entries(rows=range(100_000))] == [2, 4, 0, 3, 1]


def test_statistics_count_entries_and_permanent_ones(log: FailureLog) -> None:
    log.record(0, "https://a.example/0", GONE, 1)
    log.record(1, "https://a.example/1", BUSY, 1)
    stats = log.statistics()
    assert (stats["entries"], stats["permanent"], stats["connection_pid"]) == (2, 1, os.getpid())


@pytest.mark.parametrize("args", [(-1, "u", BUSY, 1), (1.0, "u", BUSY, 1), (1, None, BUSY, 1),
                                  (1, "u", "boom", 1), (1, "u", BUSY, 1.5), (True, "u", BUSY, 1)])
def test_bad_records_are_refused(log: FailureLog, args: tuple[Any, ...]) -> None:
    with pytest.raises(EngineValueError):
        log.record(*args)


def test_bad_queries_are_refused(log: FailureLog) -> None:
    with pytest.raises(EngineValueError, match="limit"):
        log.entries(limit=-1)
    with pytest.raises(EngineValueError, match="integers"):
        log.entries(rows=[1.5])  # type: ignore[list-item]


# -- the file -----------------------------------------------------------------------------------


def test_create_refuses_to_replace_and_attach_needs_the_file(name: str) -> None:
    with pytest.raises(SegmentMissing):
        FailureLog.attach(name)
    with FailureLog.create(name) as first:
        first.record(1, "https://a.example/1", BUSY, 1)
        with pytest.raises(SegmentExists):
            FailureLog.create(name)
        with FailureLog.attach(name) as second:
            assert [e.row for e in second.entries()] == [1]


def test_create_does_not_replay_a_stale_wal_of_a_removed_database(name: str) -> None:
    with FailureLog.create(name) as log:
        log.record(1, "https://a.example/1", BUSY, 1)
        wal = log.path + "-wal"
        stale = open(wal, "rb").read()
    with open(wal, "wb") as f:  # a -wal the last close removed, as a crash would leave it
        f.write(stale)
    os.unlink(shmfile.path_of(name, "failures"))
    with FailureLog.create(name) as log:
        assert log.entries() == []
        assert _integrity(log.path) == "ok"


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b""])
def test_attach_refuses_a_file_that_is_not_a_failure_log(name: str, content: bytes) -> None:
    with open(shmfile.path_of(name, "failures"), "wb") as f:
        f.write(content)
    with pytest.raises(LayoutMismatch):
        FailureLog.attach(name)


def test_attach_refuses_another_sqlite_database(name: str) -> None:
    conn = sqlite3.connect(shmfile.path_of(name, "failures"))
    conn.execute("CREATE TABLE failures (row INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(LayoutMismatch, match="application_id"):
        FailureLog.attach(name)


def test_unlink_removes_the_database_and_its_wal_and_shm(name: str) -> None:
    log = FailureLog.create(name)
    log.record(1, "https://a.example/1", BUSY, 1)
    path = shmfile.path_of(name, "failures")
    assert files_of(name) == [path, f"{path}-shm", f"{path}-wal"]
    assert FailureLog.unlink(name) is True
    assert files_of(name) == []
    assert FailureLog.unlink(name) is False
    log.close()
    assert files_of(name) == []


def test_a_closed_log_refuses_every_call(log: FailureLog) -> None:
    log.close()
    log.close()
    for call in (lambda: log.entries(), lambda: log.clear([1]), lambda: log.export(),
                 lambda: log.record(1, "u", BUSY, 1)):
        with pytest.raises(EngineClosed):
            call()


@pytest.mark.parametrize("bad", ["a/b", "", "a\x00b"])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(EngineValueError):
        FailureLog.create(bad)
    with pytest.raises(EngineValueError):
        FailureLog.unlink(bad)


# -- checkpoints --------------------------------------------------------------------------------


def test_export_and_import_carry_entries_to_the_rows_their_urls_have_now(
        log: FailureLog) -> None:
    for row, failure in enumerate((GONE, BUSY, BUG, BUSY, GONE)):
        log.record(row, f"https://a.example/{row}", failure, 1_000 + row)
        log.record(row, f"https://a.example/{row}", failure, 2_000 + row)
    log.clear([2])
    saved = log.export()
    assert all(len(e) == len(EXPORT_FIELDS) for e in saved)
    saved = json.loads(json.dumps(saved))  # the way a checkpoint keeps them
    before = {e.url: e for e in log.entries()}
    name = unique_name()
    try:
        with FailureLog.create(name) as resumed:
            # After a resume rows are renumbered; row 4's URL is no longer queued.
            new_rows = {"https://a.example/0": 10, "https://a.example/1": 0,
                        "https://a.example/3": 7, "https://a.example/2": 3}
            assert resumed.import_(saved, new_rows) == 3
            after = {e.url: e for e in resumed.entries()}
            assert set(after) == {"https://a.example/0", "https://a.example/1",
                                  "https://a.example/3"}
            for url, e in after.items():
                assert e.row == new_rows[url]
                assert e == FailureEntry(e.row, *(getattr(before[url], f)
                                                  for f in EXPORT_FIELDS))
            assert entry(resumed, 10) == FailureEntry(10, "https://a.example/0", 2, 1_000,
                                                      2_000, GONE.reason, "exit", True, 404)
    finally:
        FailureLog.unlink(name)


@pytest.mark.parametrize("bad", [("u", 1, 1, 1, "r", "exit", True), ("u", 0, 1, 1, "r", "exit",
                                 True, None), ("u", 1, 1, 1, "r", "weird", True, None),
                                 (1, 1, 1, 1, "r", "exit", True, None), "garbage"])
def test_import_refuses_damaged_entries_and_restores_nothing(log: FailureLog, bad: Any) -> None:
    good = ["https://a.example/0", 1, 1, 1, "r", "exit", False, None]
    with pytest.raises(EngineValueError, match="damaged"):
        log.import_([good, bad], {"https://a.example/0": 0, "u": 1})
    assert log.entries() == []


# -- processes ----------------------------------------------------------------------------------


def _report(q: Any, fn: Any) -> None:
    try:
        q.put(("ok", fn()))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def child_record_by_name(name: str, row: int, q: Any) -> None:
    def body() -> int:
        with FailureLog.attach(name) as log:
            log.record(row, f"https://a.example/{row}", GONE, 5)
            return int(log.statistics()["connection_pid"])

    _report(q, body)


def child_record_with_inherited(log: FailureLog, row: int, q: Any) -> None:
    def body() -> dict[str, Any]:
        log.record(row, f"https://a.example/{row}", BUG, row)
        return {"pid": os.getpid(), **log.statistics()}

    _report(q, body)


AFTER_KILL = 300  # records each writer makes after the victim's death, before its last phases
WRITER_SPAN = 1_000_000  # writer k records rows k * WRITER_SPAN on
VICTIM_BASE = 10_000_000


WRITE_GAP_S = 0.0002
"""A writer's pause between records. A worker records one failure per render, never in a tight
loop; five processes committing back to back starve one another past the busy timeout (SQLite's
busy handler tries the lock again only every 100 ms or so), which is SQLite's lock, not what
this test holds."""


def child_writer(name: str, base: int, start: Any, killed: Any, q: Any) -> None:
    """Record failures of rows base, base + 1, ... until AFTER_KILL records after the victim's
    death; fail the first half of them again, then clear (in batches of 16, as a worker does)
    the last quarter. Reports (base, how many rows it recorded)."""

    def body() -> tuple[int, int]:
        log = FailureLog.attach(name)
        start.wait()
        n = after = 0
        while after < AFTER_KILL and n < WRITER_SPAN:
            log.record(base + n, f"https://w{base}.example/{n}", BUSY, n)
            n += 1
            after += killed.is_set()
            time.sleep(WRITE_GAP_S)
        for i in range(n // 2):
            log.record(base + i, f"https://w{base}.example/{i}", GONE, n + i)
        for lo in range(n - n // 4, n, 16):
            log.clear(range(base + lo, base + min(lo + 16, n)))
        log.close()
        return base, n

    _report(q, body)


def child_victim(name: str, start: Any) -> None:
    """Record failures of rows VICTIM_BASE, VICTIM_BASE + 1, ... until killed."""
    log = FailureLog.attach(name)
    start.wait()
    i = 0
    while True:
        log.record(VICTIM_BASE + i, f"https://victim.example/{i}", BUG, i)
        i += 1
        time.sleep(WRITE_GAP_S)


def test_concurrent_writers_keep_every_commit_when_one_is_killed_mid_way(log: FailureLog,
                                                                        name: str) -> None:
    ctx = mp.get_context("fork")
    start, killed, q = ctx.Event(), ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=child_writer, args=(name, k * WRITER_SPAN, start, killed, q))
               for k in range(3)]
    victim = ctx.Process(target=child_victim, args=(name, start))
    procs = [*writers, victim]
    for p in procs:
        p.start()
    try:
        start.set()
        deadline = time.monotonic() + 60
        for base in (*(k * WRITER_SPAN for k in range(3)), VICTIM_BASE):
            while len(log.entries(rows=range(base, base + 30))) < 20:  # all under way
                assert q.empty(), f"a writer stopped before the kill: {q.get()}"
                assert time.monotonic() < deadline, f"writer {base} never recorded 20 failures"
                time.sleep(0.001)
        os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        victim.join(60)
        killed.set()  # the writers were writing all along, and go on writing
        reports = [q.get(timeout=120) for _ in writers]
        for p in writers:
            p.join(60)
    finally:
        killed.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert victim.exitcode == -signal.SIGKILL
    assert [status for status, _ in reports] == ["ok"] * 3, reports
    assert [p.exitcode for p in writers] == [0, 0, 0]

    assert _integrity(log.path) == "ok"
    with FailureLog.attach(name) as fresh:  # opens as a new process would
        for base, n in (value for _, value in reports):
            assert n >= AFTER_KILL + 20
            got = fresh.entries(rows=range(base, base + n))
            assert sorted(e.row - base for e in got) == list(range(n - n // 4))
            for e in got:
                again = e.row - base < n // 2
                assert (e.failures, e.reason) == ((2, GONE.reason) if again else (1, BUSY.reason))
                assert e.first_ms == e.row - base
        victims = sorted(e.row - VICTIM_BASE for e in fresh.entries() if e.row >= VICTIM_BASE)
        assert len(victims) >= 20 and victims == list(range(len(victims)))  # commits in order
        assert fresh.statistics()["entries"] == len(victims) + sum(
            n - n // 4 for _, (_, n) in reports)
        fresh.record(VICTIM_BASE, "https://victim.example/0", BUG, 99)  # and it still takes writes
        assert entry(fresh, VICTIM_BASE).failures == 2  # type: ignore[union-attr]


def test_a_forked_child_reopens_instead_of_using_the_parents_connection(
        log: FailureLog) -> None:
    log.record(1, "https://a.example/1", BUSY, 1)
    opened = log.statistics()["opens"]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child_record_with_inherited, args=(log, 2, q))
    p.start()
    status, child = q.get(timeout=60)
    p.join(60)
    assert status == "ok", child
    assert child["connection_pid"] == child["pid"] != os.getpid()
    log.record(3, "https://a.example/3", BUSY, 3)  # the parent goes on, on a new connection
    stats = log.statistics()
    assert stats["connection_pid"] == os.getpid() and stats["opens"] == opened + 1
    assert [e.row for e in log.entries()] == [3, 2, 1]


def test_a_fork_that_skips_pythons_hooks_is_caught_by_the_pid(log: FailureLog) -> None:
    log.record(1, "https://a.example/1", BUSY, 1)
    libc = ctypes.CDLL(None, use_errno=True)
    pid = libc.fork()  # no os.register_at_fork hook runs: the child inherits an open connection
    if pid == 0:
        code = 1
        try:
            log.record(2, "https://a.example/2", BUG, 2)
            code = 0 if log.statistics()["connection_pid"] == os.getpid() else 2
        finally:
            os._exit(code)
    assert pid > 0
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    log.record(3, "https://a.example/3", BUSY, 3)
    assert [e.row for e in log.entries()] == [3, 2, 1]
    assert _integrity(log.path) == "ok"


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_child_attaches_by_name_under_each_start_method(log: FailureLog, name: str,
                                                          method: str) -> None:
    log.record(1, "https://a.example/1", BUSY, 1)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=child_record_by_name, args=(name, 2, q))
    p.start()
    status, value = q.get(timeout=60)
    p.join(60)
    assert status == "ok", value
    assert value == p.pid
    assert [(e.row, e.permanent) for e in log.entries()] == [(2, True), (1, False)]


def _integrity(path: str) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()
