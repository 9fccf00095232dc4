"""The shared segment (docs/design.md §4): create / attach / refuse what is not ours / lifetime."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from lanes_testlib import (
    DAY,
    HOUR,
    NOW,
    ROOT,
    TEN_LANES,
    attach_raw,
    dispose,
    shm_path,
    unique_name,
)

from engine import Engine, EngineError, LanePolicy, LayoutMismatch
from engine.errors import (
    AttachTimeout,
    EngineClosed,
    EngineTypeError,
    EngineValueError,
    SegmentExists,
    SegmentMissing,
)

RL_MAGIC = 0x314E414C5F4C5252
LANE_KEYS = {"lane", "name", "floor_minute", "queued", "due", "leased", "granted", "spilled",
             "stale_skipped", "lease_refused"}


def _patch(name: str, fmt: str, offset: int, value: int) -> int:
    shm = attach_raw(name)
    try:
        (old,) = struct.unpack_from(fmt, shm.buf, offset)
        struct.pack_into(fmt, shm.buf, offset, value)
        return old
    finally:
        shm.close()


@pytest.fixture
def foreign():
    """Names of hand-made segments, removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            os.unlink(shm_path(name))
        except FileNotFoundError:
            pass


# -- refusing what is not ours --------------------------------------------------------------------


def test_attach_to_random_bytes_raises_layout_mismatch(foreign):
    name = unique_name()
    foreign.append(name)
    data = bytearray(os.urandom(1 << 16))
    if struct.unpack_from("<Q", data, 0)[0] in (0, RL_MAGIC):
        data[0] ^= 0xFF
    with open(shm_path(name), "xb") as f:
        f.write(bytes(data))
    t0 = time.monotonic()
    with pytest.raises(LayoutMismatch):
        Engine.attach(name, timeout=60.0)
    # a foreign magic is refused at once, not after waiting for a ready flag (the minute)
    assert time.monotonic() - t0 < 30.0
    assert os.path.exists(shm_path(name))  # refused, not removed or rewritten
    with open(shm_path(name), "rb") as f:
        assert f.read() == bytes(data)


def test_attach_to_a_tiny_foreign_segment_raises_layout_mismatch(foreign):
    name = unique_name()
    foreign.append(name)
    with open(shm_path(name), "xb") as f:
        f.write(b"not a render-lanes segment")
    with pytest.raises(LayoutMismatch):
        Engine.attach(name, timeout=0.5)


def test_attach_to_an_empty_segment_times_out(foreign):
    name = unique_name()
    foreign.append(name)
    open(shm_path(name), "xb").close()  # a creator between shm_open and the ready flag
    t0 = time.monotonic()
    with pytest.raises(AttachTimeout):
        Engine.attach(name, timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 10.0  # waited its timeout, then gave up
    assert issubclass(AttachTimeout, EngineError)


def test_attach_to_another_layout_version_raises_layout_mismatch(make_engine):
    eng = make_engine(capacity=64)
    name = eng.stats()["name"]
    version = eng.stats()["layout_version"]
    old = _patch(name, "<I", 8, version + 1)
    assert old == version
    try:
        with pytest.raises(LayoutMismatch):
            Engine.attach(name, timeout=0.5)
    finally:
        _patch(name, "<I", 8, version)
    other = Engine.attach(name, timeout=0.5)  # restored: accepted again
    assert other.stats()["layout_version"] == version
    other.close()


def test_attach_with_a_foreign_magic_raises_layout_mismatch(make_engine):
    eng = make_engine(capacity=64)
    name = eng.stats()["name"]
    old = _patch(name, "<Q", 0, 0x0123456789ABCDEF)
    assert old == RL_MAGIC
    try:
        with pytest.raises(LayoutMismatch):
            Engine.attach(name, timeout=0.5)
    finally:
        _patch(name, "<Q", 0, old)


def _copy_segment(src: str, foreign: list[str]) -> str:
    """A byte-exact copy of a live segment under a new name (nobody maps or owns the copy)."""
    name = unique_name()
    foreign.append(name)
    with open(shm_path(src), "rb") as f:
        data = f.read()
    with open(shm_path(name), "xb") as f:
        f.write(data)
    return name


def test_attach_to_a_truncated_segment_raises_layout_mismatch(make_engine, foreign):
    eng = make_engine(capacity=1024)
    eng.add(NOW, 3600)
    copy = _copy_segment(eng.stats()["name"], foreign)
    size = os.path.getsize(shm_path(copy))
    whole = Engine.attach(copy, timeout=0.5)  # the untruncated copy is a valid segment
    assert whole.due_ms(0) == NOW
    whole.close()
    assert os.path.exists(shm_path(copy))
    for new_size in (size - 4096, size // 2, 4096, 100):
        os.truncate(shm_path(copy), new_size)
        with pytest.raises(LayoutMismatch):
            Engine.attach(copy, timeout=0.3)


def test_attach_to_a_header_only_copy_raises_layout_mismatch(make_engine, foreign):
    eng = make_engine(capacity=1024)
    with open(shm_path(eng.stats()["name"]), "rb") as f:
        header = f.read(8192)
    name = unique_name()
    foreign.append(name)
    with open(shm_path(name), "xb") as f:
        f.write(header)
    with pytest.raises(LayoutMismatch):
        Engine.attach(name, timeout=0.5)


def test_refused_attach_in_a_child_process_does_not_crash(make_engine, foreign):
    """Nothing segfaults: a truncated segment is refused in a fresh interpreter too."""
    eng = make_engine(capacity=256)
    copy = _copy_segment(eng.stats()["name"], foreign)
    os.truncate(shm_path(copy), os.path.getsize(shm_path(copy)) - 64)
    code = (
        "import sys\n"
        "from engine import Engine, LayoutMismatch\n"
        "try:\n"
        "    Engine.attach(sys.argv[1], timeout=0.5)\n"
        "except LayoutMismatch:\n"
        "    print('refused')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, copy], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"


# -- create / attach / lifetime -----------------------------------------------------------------


def test_create_twice_raises_segment_exists_and_leaves_the_first_intact(make_engine):
    eng = make_engine(capacity=64)
    row = eng.add(NOW - HOUR, 3600)
    name = eng.stats()["name"]
    with pytest.raises(SegmentExists):
        Engine.create(name, 64)
    assert issubclass(SegmentExists, FileExistsError)
    assert eng.due_ms(row) == NOW - HOUR
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [row]
    assert eng.verify() == []


def test_attach_missing_raises_segment_missing():
    name = unique_name()
    with pytest.raises(SegmentMissing):
        Engine.attach(name, timeout=0.2)
    assert issubclass(SegmentMissing, FileNotFoundError)
    assert not os.path.exists(shm_path(name))


@pytest.mark.parametrize(
    "args, kwargs, exc",
    [
        ((0,), {}, EngineValueError),
        ((-5,), {}, EngineValueError),
        ((1.5,), {}, EngineError),
        (("100",), {}, EngineTypeError),
        ((64, {"urgent_max_share": 0.2}), {}, EngineTypeError),
        ((64,), {"ring_capacity": 0}, EngineValueError),
    ],
    ids=repr,
)
def test_create_rejects_bad_arguments(args, kwargs, exc):
    name = unique_name()
    try:
        eng = Engine.create(name, *args, **kwargs)
    except exc:
        assert not os.path.exists(shm_path(name))
        return
    dispose(eng, name)
    pytest.fail(f"Engine.create accepted {args!r} {kwargs!r}")


@pytest.mark.parametrize("name", ["", "a/b", "/leading", "x" * 300])
def test_create_rejects_bad_names(name):
    try:
        eng = Engine.create(name, 64)
    except EngineError:
        return
    dispose(eng, name.lstrip("/"))
    pytest.fail(f"Engine.create accepted the segment name {name!r}")


def test_context_manager_closes_and_unlinks_the_owner():
    name = unique_name()
    with Engine.create(name, 64) as eng:
        row = eng.add(NOW, 3600)
        assert os.path.exists(shm_path(name))
        with Engine.attach(name) as other:  # an attached handle: closes, never unlinks
            assert other.due_ms(row) == NOW
        assert os.path.exists(shm_path(name))
        assert eng.due_ms(row) == NOW
    assert not os.path.exists(shm_path(name))
    with pytest.raises(EngineClosed):
        eng.add(NOW, 3600)
    with pytest.raises(SegmentMissing):
        Engine.attach(name, timeout=0.2)


def test_context_manager_unlinks_on_error_too():
    name = unique_name()
    with pytest.raises(RuntimeError):
        with Engine.create(name, 64) as eng:
            eng.add(NOW, 3600)
            raise RuntimeError("boom")
    assert not os.path.exists(shm_path(name))


def test_closed_engine_raises_engine_closed(make_engine):
    eng = make_engine(capacity=64)
    row = eng.add(NOW - HOUR, 3600)
    tok = int(eng.claim(budget=1, now_ms=NOW).tokens[0])
    eng.close()
    for call in (
        lambda: eng.add(NOW, 3600),
        lambda: eng.claim(budget=1, now_ms=NOW),
        lambda: eng.complete(row, tok, now_ms=NOW),
        lambda: eng.describe(row),
        lambda: eng.due_ms(row),
        lambda: eng.stats(),
        lambda: eng.verify(),
        lambda: eng.set_policy(LanePolicy()),
        lambda: eng.compact(),
    ):
        with pytest.raises(EngineClosed):
            call()
    assert issubclass(EngineClosed, EngineError)


def test_closing_an_attached_handle_leaves_the_owner_working(make_engine):
    eng = make_engine(capacity=64)
    name = eng.stats()["name"]
    other = Engine.attach(name)
    row = other.add(NOW - HOUR, 3600)
    other.close()
    with pytest.raises(EngineClosed):
        other.stats()
    assert os.path.exists(shm_path(name))
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [row]
    assert eng.verify() == []


def test_short_lived_attachers_never_exhaust_the_owner_slots(make_engine):
    """More attach / write / close cycles than there are owner slots (1024)."""
    eng = make_engine(capacity=2048)
    name = eng.stats()["name"]
    for i in range(1100):
        h = Engine.attach(name)
        h.add(NOW - HOUR - i, 3600)
        h.close()
    for _ in range(50):
        h = Engine.attach(name)
        assert len(h.claim(budget=1, now_ms=NOW, lease_ms=HOUR)) == 1
        h.close()
    assert eng.stats()["rows"] == 1100
    assert eng.verify() == []


def test_owner_unlink_removes_the_segment_name(make_engine):
    eng = make_engine(capacity=64)
    name = eng.stats()["name"]
    eng.unlink()
    assert not os.path.exists(shm_path(name))
    with pytest.raises(SegmentMissing):
        Engine.attach(name, timeout=0.2)
    dispose(eng, name)


def test_create_exist_ok_takes_over_a_segment_left_by_a_crashed_owner():
    name = unique_name()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the crashing owner
        code = 1
        try:
            os.close(r)
            eng = Engine.create(name, 64)
            eng.add(NOW - HOUR, 3600)
            c = eng.claim(budget=1, now_ms=NOW, lease_ms=10 * 60_000)
            os.write(w, str(int(c.rows[0])).encode())
            code = 0
        finally:
            os.kill(os.getpid(), 9) if code == 0 else os._exit(code)
    os.close(w)
    try:
        with os.fdopen(r) as f:
            leased_row = int(f.read())
        os.waitpid(pid, 0)
        assert os.path.exists(shm_path(name))  # a crash leaves the segment behind
        with pytest.raises(SegmentExists):
            Engine.create(name, 64)
        eng = Engine.create(name, 64, exist_ok=True)
        try:
            assert eng.due_ms(leased_row) == NOW - HOUR
            assert eng.describe(leased_row)["leased"] is False  # the dead owner's lease ended
            assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [leased_row]
            assert eng.verify() == []
        finally:
            eng.unlink()  # the owner's job, now this process's
            eng.close()
        assert not os.path.exists(shm_path(name))
    finally:
        try:
            os.unlink(shm_path(name))
        except FileNotFoundError:
            pass


def test_cli_cleanup_removes_a_left_segment():
    name = unique_name()
    eng = Engine.create(name, 64)
    try:
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-m", "engine", "cleanup", name],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        assert not os.path.exists(shm_path(name))
    finally:
        dispose(eng, name)


# -- stats ----------------------------------------------------------------------------------------


def test_stats_shape_matches_the_api(make_engine):
    eng = make_engine(capacity=128)
    name = eng.stats()["name"]
    for i in range(3):
        eng.add(NOW - HOUR - i, 3600)  # lane 1, due
    for i in range(2):
        eng.add(NOW + HOUR + i, 3600)  # lane 1, not yet due
    eng.add(NOW - HOUR, 7200, provenance="discovered")  # lane 6
    s = eng.stats(now_ms=NOW)
    assert isinstance(s, dict)
    assert s["name"] == name and isinstance(s["name"], str)
    assert isinstance(s["layout_version"], int) and s["layout_version"] >= 1
    assert s["capacity"] == 128
    assert s["rows"] == 6
    lanes = s["lanes"]
    assert isinstance(lanes, list) and len(lanes) >= 10
    names = [TEN_LANES.lane_name(i) for i in range(10)]
    for i, ln in enumerate(lanes[:10]):
        assert set(ln) >= LANE_KEYS
        assert ln["lane"] == i
        assert ln["name"] == names[i]
        for key in LANE_KEYS - {"name"}:
            assert isinstance(ln[key], int) and ln[key] >= 0, (i, key)
    assert lanes[1]["queued"] == 5
    assert lanes[1]["due"] == 3
    assert lanes[6]["queued"] == 1 and lanes[6]["due"] == 1
    assert sum(ln["queued"] for ln in lanes) == 6
    assert sum(ln["leased"] for ln in lanes) == 0
    c = eng.claim(budget=2, now_ms=NOW, lease_ms=HOUR)
    s = eng.stats(now_ms=NOW)
    assert s["lanes"][1]["leased"] == 2
    assert s["lanes"][1]["granted"] == 2
    assert len(c) == 2
    assert eng.verify() == []


def _find_floor_word(eng, shm, lane: int) -> int:
    """Offset of ``lane``'s floor word, found by observation rather than from the private
    layout: the 8-byte word whose high half is the floor minute and whose change
    ``floor_minute`` reports."""
    minute = eng.floor_minute(lane)
    assert minute > 0
    data = bytes(shm.buf[: min(len(shm.buf), 1 << 20)])
    for at in range(0, len(data) - 7, 8):
        (word,) = struct.unpack_from("<Q", data, at)
        if word >> 32 != minute:
            continue
        struct.pack_into("<Q", shm.buf, at, ((minute + 1) << 32) | (word & 0xFFFFFFFF))
        moved = eng.floor_minute(lane) == minute + 1
        struct.pack_into("<Q", shm.buf, at, word)
        if moved:
            return at
    raise AssertionError("no floor word found")


def test_verify_reports_a_live_row_stranded_below_its_lane_floor(make_engine):
    """verify() is not a rubber stamp: forge a floor above a live row and it must say so."""
    eng = make_engine(capacity=64)
    name = eng.stats()["name"]
    held = eng.add(NOW - 7 * HOUR, 3600)  # lane 1
    waiting = eng.add(NOW - 6 * HOUR, 3600)
    eng.compact()
    c = eng.claim(budget=1, now_ms=NOW, lease_ms=DAY)
    assert c.rows.tolist() == [held]
    assert eng.floor_minute(1) == (NOW - 7 * HOUR) // 60_000  # held by the in-flight row
    assert eng.verify() == []
    shm = attach_raw(name)
    try:
        at = _find_floor_word(eng, shm, 1)
        (word,) = struct.unpack_from("<Q", shm.buf, at)
        forged = (NOW + DAY) // 60_000
        struct.pack_into("<Q", shm.buf, at, (forged << 32) | (word & 0xFFFFFFFF))
        assert eng.floor_minute(1) == forged
        problems = eng.verify()
        assert problems, "live rows below their floor went unreported"
        assert any(str(waiting) in p for p in problems), problems
        struct.pack_into("<Q", shm.buf, at, word)  # put the true floor back
    finally:
        shm.close()
    assert eng.verify() == []
    assert eng.claim(budget=1, now_ms=NOW).rows.tolist() == [waiting]


def test_verify_is_clean_on_a_fresh_engine(eng):
    assert eng.verify() == []
    eng.add(NOW, 3600)
    assert eng.verify() == []
