"""Corrupt segments (docs/design.md §4, §15): whatever lies in /dev/shm under an
engine's name, attaching refuses it with ``LayoutMismatch`` or ``AttachTimeout``, never reads a
view with shifted offsets, never writes to it, and never crashes the interpreter.

tests/shm/test_segment.py already covers: a file of random bytes, a tiny text file, an empty file
(timeout 0.3), layout version + 1 and a foreign magic patched into a live segment, a copy cut
to four sizes, a header-only copy, and one truncated copy attached in a child. This file
extends that to: random bytes anywhere in the identity block of a real segment, every size and
capacity field, versions older, newer and far off (refused at once, also with a bigger header),
hypothesis-chosen cut and grown sizes, the ready flag (never set, set late, set to junk),
tiny files of any content, corrupt runtime words past the identity block (the policy slot, the
recent-write ring's positions: attached, so they must be harmless), and the refusals again in
a fresh interpreter.

Every segment is created here under a unique name, patched only after its engine is closed,
and removed afterwards; none is shared with another test.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st
from lanes_testlib import HOUR, NOW, ROOT, shm_path, unique_name

from engine import Engine, LanePolicy
from engine.errors import EngineError

RL_MAGIC = 0x314E414C5F4C5252
# The identity block of rl_header (csrc/layout.h), checked against a real segment below.
OFF_MAGIC, OFF_VERSION, OFF_HEADER_BYTES, OFF_TOTAL = 0, 8, 12, 16
OFF_MAX_LANES, OFF_MAX_OWNERS, OFF_ROWS, OFF_RING = 24, 28, 32, 36
OFF_OFFSETS = 40  # off_lanes ... off_ring: nine uint64
OFF_CREATED, OFF_SUM, OFF_READY, IDENTITY_END = 112, 120, 128, 132
CAPACITY = 64
PAGE = 4096
# Distinctive band boundaries, so the policy slot can be found in the header by its bytes.
MARK_BANDS = (1111, 2222, 3333)

FAST = settings(deadline=None, derandomize=False,
                phases=(Phase.explicit, Phase.reuse, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Seg:
    """A real segment whose engine is closed: its name, pristine bytes and identity fields."""

    def __init__(self, name: str, data: bytes) -> None:
        self.name = name
        self.data = data
        self.version = struct.unpack_from("<I", data, OFF_VERSION)[0]
        self.total = len(data)

    @property
    def path(self) -> str:
        return shm_path(self.name)

    def write(self, data: bytes) -> None:
        """Replace the whole object's content (and size)."""
        with open(self.path, "r+b") as f:
            f.write(data)
            f.truncate(len(data))

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def restore(self) -> None:
        self.write(self.data)

    def patched(self, offset: int, fmt: str, value: int) -> bytes:
        b = bytearray(self.data)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)


def make_segment() -> Seg:
    """Create an engine with a few rows, close it, and keep its bytes (the owner is gone)."""
    name = unique_name()
    eng = Engine.create(name, CAPACITY, LanePolicy(ttl_bands=MARK_BANDS))
    try:
        eng.add(NOW - HOUR, 600)
        eng.add(NOW + HOUR, 7200, "discovered")
        eng.claim(budget=1, now_ms=NOW, lease_ms=HOUR)
    finally:
        eng.close()
    with open(shm_path(name), "rb") as f:
        data = f.read()
    seg = Seg(name, data)
    # the offsets above must still describe csrc/layout.h
    magic, = struct.unpack_from("<Q", data, OFF_MAGIC)
    total, = struct.unpack_from("<Q", data, OFF_TOTAL)
    rows, ring = struct.unpack_from("<II", data, OFF_ROWS)
    ready, = struct.unpack_from("<I", data, OFF_READY)
    if (magic, total, rows, ready) != (RL_MAGIC, len(data), CAPACITY, 1) or ring < 1:
        os.unlink(shm_path(name))
        pytest.fail("csrc/layout.h's identity block moved: update the offsets in this file")
    return seg


@contextlib.contextmanager
def segment() -> Iterator[Seg]:
    seg = make_segment()
    try:
        yield seg
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.path)


@pytest.fixture
def seg() -> Iterator[Seg]:
    with segment() as s:
        yield s


@pytest.fixture
def files() -> Iterator[list[str]]:
    """Names of hand-made files in /dev/shm, removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(shm_path(name))


AT_ONCE_TIMEOUT = 60.0
AT_ONCE = AT_ONCE_TIMEOUT / 2
"""A refusal "at once" is one that did not wait for its timeout: the attach is given a long
timeout and must answer within half of it, a margin no loaded machine's scheduling eats (an
attach that waited for a ready flag would take the whole minute)."""
TIMED_OUT = 10.0
"""An attach that times out after a short timeout gives up within this (it does not hang); its
lower bound, the timeout itself, is what shows it waited."""


def outcome(name: str, timeout: float) -> tuple[str, float]:
    """Attach and report what happened: the exception's name, or "attached" (then closed)."""
    t0 = time.monotonic()
    try:
        eng = Engine.attach(name, timeout=timeout)
    except EngineError as exc:
        return type(exc).__name__, time.monotonic() - t0
    eng.close()
    return "attached", time.monotonic() - t0


def expected_refusal(header: bytes) -> str:
    """What rl_attach must answer for this header (the object being full size): a foreign
    magic at once; no ready flag yet (an all-zero magic may be a creator at work): wait, then
    time out; a published header that does not match: LayoutMismatch."""
    magic, = struct.unpack_from("<Q", header, OFF_MAGIC)
    ready, = struct.unpack_from("<I", header, OFF_READY)
    if magic not in (0, RL_MAGIC):
        return "LayoutMismatch"
    return "AttachTimeout" if ready != 1 else "LayoutMismatch"


# -- random bytes in the header --------------------------------------------------------------

IDENTITY_BYTES = [o for o in range(IDENTITY_END)
                  if not OFF_ROWS <= o < OFF_OFFSETS  # the capacities: see the next test
                  and not OFF_CREATED <= o < OFF_READY]  # created_ms: not part of the layout


@st.composite
def identity_patch(draw: st.DrawFn) -> list[tuple[int, int]]:
    if draw(st.integers(0, 4)) == 0:  # everything after the magic at random
        body = draw(st.binary(min_size=IDENTITY_END - 8, max_size=IDENTITY_END - 8))
        return [(8 + i, b) for i, b in enumerate(body)
                if not OFF_ROWS <= 8 + i < OFF_OFFSETS and not OFF_CREATED <= 8 + i < OFF_READY]
    return draw(st.lists(st.tuples(st.sampled_from(IDENTITY_BYTES), st.integers(0, 255)),
                         min_size=1, max_size=6))


@settings(FAST, max_examples=60)
@given(patch=identity_patch())
@example(patch=[(OFF_VERSION, 0xFF)])
@example(patch=[(OFF_HEADER_BYTES + 1, 0x7F)])
@example(patch=[(OFF_TOTAL + 5, 1)])
@example(patch=[(OFF_MAX_LANES, 0)])
@example(patch=[(OFF_MAX_OWNERS + 1, 0)])
@example(patch=[(OFF_OFFSETS + 8 * 8, 0x40)])  # off_ring
@example(patch=[(OFF_READY, 0)])
@example(patch=[(i, 0) for i in range(8)])  # magic zeroed: looks like a creator at work
def test_random_bytes_in_the_identity_block_are_refused(seg, patch):
    data = bytearray(seg.data)
    for offset, value in patch:
        data[offset] = value
    assume(bytes(data) != seg.data)
    seg.write(bytes(data))
    try:
        got, _ = outcome(seg.name, timeout=0.05)
        assert got == expected_refusal(bytes(data)), (
            f"{'ENGINE BUG: ' if got == 'attached' else ''}patch {patch}: got {got}")
        assert seg.read() == bytes(data), "a refused attach wrote to the segment"
    finally:
        seg.restore()


def test_the_pristine_segment_attaches_and_reads_back(seg):
    """The control: the unpatched segment is accepted, so every refusal here is the patch's."""
    eng = Engine.attach(seg.name, timeout=1.0)
    try:
        assert eng.due_ms(0) == NOW - HOUR and eng.due_ms(1) == NOW + HOUR
        assert eng.policy.ttl_bands == MARK_BANDS
        assert eng.verify() == []
    finally:
        eng.close()


@pytest.mark.parametrize(
    "field, value",
    [("row_capacity", 0), ("row_capacity", CAPACITY - 1), ("row_capacity", CAPACITY + 1),
     ("row_capacity", 2**31 + 1), ("row_capacity", 2**32 - 1),
     ("ring_capacity", 0), ("ring_capacity", 1), ("ring_capacity", None),
     ("ring_capacity", 2**28 + 1), ("ring_capacity", 2**32 - 1)],
    ids=lambda v: str(v),
)
def test_a_capacity_field_that_differs_from_the_segment_is_refused(seg, field, value):
    """The recorded row and ring capacities are what every index into the segment is computed
    from: any value other than the one the segment was created with must be refused.
    (``None``: the ring capacity plus one.)"""
    offset = OFF_ROWS if field == "row_capacity" else OFF_RING
    real, = struct.unpack_from("<I", seg.data, offset)
    if value is None:
        value = real + 1
    seg.write(seg.patched(offset, "<I", value))
    got, _ = outcome(seg.name, timeout=0.05)
    if got == "attached":
        eng = Engine.attach(seg.name, timeout=0.05)
        try:
            seen, problems = eng.stats(now_ms=NOW), eng.verify()
        finally:
            eng.close()
        pytest.fail(f"ENGINE BUG: {field} {real} -> {value} accepted (the layout computed from "
                    f"it lands on the same offsets and size): the attacher sees capacity "
                    f"{seen['capacity']}, ring {seen['ring']['capacity']}; verify() says "
                    f"{problems}")
    assert got == "LayoutMismatch"
    assert seg.read() == seg.patched(offset, "<I", value)


# -- other layout versions -------------------------------------------------------------------


VERSIONS = {"older": lambda v: v - 1, "newer by 2": lambda v: v + 2,
            "newer by 100": lambda v: v + 100, "zero": lambda v: 0,
            "all ones": lambda v: 2**32 - 1, "high bit": lambda v: v | 2**31}


@pytest.mark.parametrize("which", list(VERSIONS))
def test_another_layout_version_is_refused_at_once(seg, which):
    """test_segment.py covers version + 1 on a live segment; here: older, far newer, 0 and the
    extremes, refused at once although the timeout would allow seconds of waiting."""
    v = VERSIONS[which](seg.version)
    data = seg.patched(OFF_VERSION, "<I", v)
    seg.write(data)
    got, took = outcome(seg.name, timeout=AT_ONCE_TIMEOUT)
    assert got == "LayoutMismatch"
    assert took < AT_ONCE, f"a published header of version {v} was refused only after {took:.2f}s"
    assert seg.read() == data


def test_a_newer_layout_with_a_bigger_header_and_size_is_refused_at_once(seg):
    """What a future build would write: version + 1, a header grown by a line, one more page."""
    b = bytearray(seg.data + bytes(PAGE))
    struct.pack_into("<I", b, OFF_VERSION, seg.version + 1)
    hb, = struct.unpack_from("<I", b, OFF_HEADER_BYTES)
    struct.pack_into("<I", b, OFF_HEADER_BYTES, hb + 64)
    struct.pack_into("<Q", b, OFF_TOTAL, len(b))
    for i in range(9):  # every region one page further
        off, = struct.unpack_from("<Q", b, OFF_OFFSETS + 8 * i)
        struct.pack_into("<Q", b, OFF_OFFSETS + 8 * i, off + PAGE)
    seg.write(bytes(b))
    got, took = outcome(seg.name, timeout=AT_ONCE_TIMEOUT)
    assert got == "LayoutMismatch" and took < AT_ONCE, took


# -- cut short, or grown ---------------------------------------------------------------------


def _cut_or_grown(seg: Seg, size: int) -> bytes:
    """The first ``size`` bytes, or (``size`` >= the whole) the whole plus zero bytes."""
    if size < seg.total:
        return seg.data[:size]
    return seg.data + bytes(size - seg.total + 1)


def _refused_at_once(seg: Seg, data: bytes) -> None:
    seg.write(data)
    try:
        got, took = outcome(seg.name, timeout=AT_ONCE_TIMEOUT)
        assert got == "LayoutMismatch", f"{len(data)} of {seg.total} bytes: {got}"
        assert took < AT_ONCE, f"{len(data)} of {seg.total} bytes refused only after {took:.2f}s"
        assert seg.read() == data
    finally:
        seg.restore()


@settings(FAST, max_examples=30)
@given(size=st.integers(1, 1 << 17))
@example(size=1)
@example(size=OFF_READY)
@example(size=PAGE - 1)
@example(size=PAGE)
@example(size=PAGE + 1)
def test_a_segment_cut_short_or_grown_is_refused_at_once(seg, size):
    _refused_at_once(seg, _cut_or_grown(seg, size))


def test_a_segment_one_byte_or_one_page_off_is_refused_at_once(seg):
    for size in (seg.total - 1, seg.total - 16, seg.total - PAGE, seg.total + 1,
                 seg.total + PAGE, 2 * seg.total):
        data = seg.data[:size] if size < seg.total else seg.data + bytes(size - seg.total)
        _refused_at_once(seg, data)


# -- the ready flag ----------------------------------------------------------------------------


def test_a_ready_flag_that_never_comes_times_out_without_reading(seg):
    data = seg.patched(OFF_READY, "<I", 0)
    seg.write(data)
    got, took = outcome(seg.name, timeout=0.3)
    assert got == "AttachTimeout"
    assert 0.25 <= took < TIMED_OUT, took  # waited its timeout, then gave up
    assert seg.read() == data  # never written
    seg.restore()  # the same bytes with the flag: accepted, so only the flag was missing
    eng = Engine.attach(seg.name, timeout=0.3)
    try:
        assert eng.due_ms(0) == NOW - HOUR
    finally:
        eng.close()


@pytest.mark.parametrize("size", ["whole", "one_page"])
def test_a_bare_header_with_magic_and_version_but_no_flag_times_out(files, seg, size):
    """Written by hand: magic and version right, every other byte zero, ready = 0."""
    data = bytearray(seg.total if size == "whole" else PAGE)
    struct.pack_into("<QI", data, 0, RL_MAGIC, seg.version)
    name = unique_name()
    files.append(name)
    with open(shm_path(name), "xb") as f:
        f.write(bytes(data))
    got, took = outcome(name, timeout=0.3)
    assert got == "AttachTimeout" and 0.25 <= took < TIMED_OUT, (got, took)
    with open(shm_path(name), "rb") as f:
        assert f.read() == bytes(data)


@pytest.mark.parametrize("flag", [2, 0xFFFFFFFF, 0x100])
def test_a_junk_ready_flag_is_never_taken_as_ready(seg, flag):
    data = seg.patched(OFF_READY, "<I", flag)
    seg.write(data)
    got, _ = outcome(seg.name, timeout=0.1)
    assert got in ("AttachTimeout", "LayoutMismatch")
    assert seg.read() == data


def test_a_flag_published_while_waiting_is_seen(seg):
    """A creator between writing its header and publishing the flag: the attacher waits."""
    seg.write(seg.patched(OFF_READY, "<I", 0))

    def publish() -> None:
        time.sleep(0.25)
        with open(seg.path, "r+b") as f:
            f.seek(OFF_READY)
            f.write(struct.pack("<I", 1))

    t = threading.Thread(target=publish)
    t.start()
    try:
        t0 = time.monotonic()
        eng = Engine.attach(seg.name, timeout=AT_ONCE_TIMEOUT)
        took = time.monotonic() - t0
    finally:
        t.join()
    try:
        assert 0.2 <= took < AT_ONCE, took  # waited for the flag, not for the timeout
        assert eng.due_ms(1) == NOW + HOUR
    finally:
        eng.close()


def test_an_empty_segment_filled_while_waiting_is_attached(seg):
    """A creator between shm_open and its first write: empty, then full size, then the flag."""
    seg.write(b"")

    def create() -> None:
        time.sleep(0.2)
        with open(seg.path, "r+b") as f:
            f.write(seg.patched(OFF_READY, "<I", 0))
        time.sleep(0.1)
        with open(seg.path, "r+b") as f:
            f.seek(OFF_READY)
            f.write(struct.pack("<I", 1))

    t = threading.Thread(target=create)
    t.start()
    try:
        eng = Engine.attach(seg.name, timeout=10.0)
    finally:
        t.join()
    try:
        assert eng.due_ms(0) == NOW - HOUR
    finally:
        eng.close()


def test_an_empty_segment_times_out_at_once_with_timeout_zero(files):
    name = unique_name()
    files.append(name)
    open(shm_path(name), "xb").close()
    got, took = outcome(name, timeout=0.0)
    assert got == "AttachTimeout" and took < TIMED_OUT, took
    assert os.path.getsize(shm_path(name)) == 0  # nothing written, not grown


# -- tiny files ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_head() -> bytes:
    """The first KiB of a real, ready segment."""
    with segment() as seg:
        return seg.data[:1024]


@settings(FAST, max_examples=40)
@given(size=st.integers(1, 1024), fill=st.sampled_from(["zeros", "magic", "real", "random"]),
       noise=st.binary(min_size=1024, max_size=1024))
@example(size=1, fill="zeros", noise=bytes(1024))
@example(size=8, fill="magic", noise=bytes(1024))
@example(size=OFF_READY + 4, fill="real", noise=bytes(1024))
def test_a_tiny_non_empty_file_is_refused_at_once(files, real_head, size, fill, noise):
    """Smaller than any header: refused at once whatever it holds, even all zeros (a creator
    goes from size 0 straight to its full size, so a tiny file is never one at work)."""
    data = {"zeros": bytes(size), "magic": (struct.pack("<Q", RL_MAGIC) + bytes(size))[:size],
            "real": real_head[:size], "random": noise[:size]}[fill]
    name = unique_name()
    files.append(name)
    with open(shm_path(name), "xb") as f:
        f.write(data)
    got, took = outcome(name, timeout=AT_ONCE_TIMEOUT)
    assert got == "LayoutMismatch", (size, fill, got)
    assert took < AT_ONCE, took
    with open(shm_path(name), "rb") as f:
        assert f.read() == data


# -- corrupt runtime words: the policy slot, the ring ---------------------------------------

CHILD_USE = r"""
import json, sys
sys.path[:0] = [sys.argv[1]]
from engine import Engine
from engine.errors import EngineError
NOW = 1_800_000_000_000
out = {"attach": None, "foreign": []}
try:
    eng = Engine.attach(sys.argv[2], timeout=0.3)
except EngineError as exc:
    out["attach"] = type(exc).__name__
    print(json.dumps(out)); sys.exit(0)
out["attach"] = "attached"
for label, call in [("policy", lambda: eng.policy), ("stats", lambda: eng.stats(now_ms=NOW)),
                    ("add", lambda: eng.add(NOW, 4294967295, "discovered")),
                    ("add_many", lambda: eng.add_many([NOW, NOW], [5, 99999])),
                    ("claim", lambda: eng.claim(budget=8, now_ms=NOW)),
                    ("verify", lambda: eng.verify()), ("compact", lambda: eng.compact(full=True))]:
    print(label, file=sys.stderr, flush=True)
    try:
        call()
    except EngineError:
        pass
    except Exception as exc:
        out["foreign"].append(f"{label}: {type(exc).__name__}: {exc}")
eng.close()
print(json.dumps(out))
"""


OFF_RING_HEAD, OFF_RING_TAIL = 256, 320  # rl_header's hot words, each on its own line
HANG = 5.0
"""Seconds a child gets for attach and seven calls (it needs well under one)."""


def _word(seg: Seg, field: str) -> tuple[int, str]:
    """(offset, struct format) of a runtime word of the header.

    The policy slot is found by its distinctive band list; the ring words are checked against
    what make_segment left in them (a few appends, nothing merged: head 0, tail small)."""
    if field.startswith("policy."):
        at = seg.data.find(struct.pack("<4I", len(MARK_BANDS), *MARK_BANDS), 0, PAGE)
        assert at > 0, "policy slot not found in the header"
        return at + {"band_count": 0, "cold_after": 4 + 4 * 30, "lanes_enabled": 4 + 4 * 37}[
            field.split(".")[1]], "<I"
    head, = struct.unpack_from("<Q", seg.data, OFF_RING_HEAD)
    tail, = struct.unpack_from("<Q", seg.data, OFF_RING_TAIL)
    if head != 0 or not 2 <= tail <= 64:
        pytest.fail("csrc/layout.h's ring words moved: update OFF_RING_HEAD / OFF_RING_TAIL")
    return {"ring_head": OFF_RING_HEAD, "ring_tail": OFF_RING_TAIL}[field], "<Q"


def _run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code, ROOT, *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("field, value", [
    ("policy.band_count", 31), ("policy.band_count", 1000), ("policy.band_count", 2**32 - 1),
    ("policy.cold_after", 0), ("policy.lanes_enabled", 7),
    ("ring_tail", 2**40),  # (ring_head = 2**63 hangs the same way: one case costs the timeout)
])
def test_corrupt_runtime_words_in_the_header_are_refused_or_harmless(seg, field, value):
    """Random bytes may land past the identity block: in the policy the header carries
    (band_count <= 30, cold_after in [1, 255], flags 0/1) or in the recent-write ring's
    positions. Attaching must refuse such a segment, or every call must end cleanly: the child
    running them must exit 0, in time, raising nothing but EngineErrors."""
    at, fmt = _word(seg, field)
    seg.write(seg.patched(at, fmt, value))
    try:
        out = _run_child(CHILD_USE, seg.name, timeout=HANG)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        last = err.strip().splitlines()[-1:] or ["attach"]
        pytest.fail(f"ENGINE BUG: {field}={value}: the child hung for {HANG} s in {last[0]!r}")
    last = out.stderr.strip().splitlines()[-1:] or ["attach"]
    assert out.returncode == 0, (
        f"ENGINE BUG: {field}={value}: the interpreter died with return code "
        f"{out.returncode} (-11 = SIGSEGV) in {last[0]!r}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["attach"] in ("attached", "LayoutMismatch"), report
    assert report["foreign"] == [], (
        f"ENGINE BUG: {field}={value} was attached and then: {report['foreign']}")


# -- all of it in a fresh interpreter ------------------------------------------------------------

CHILD_REFUSE = r"""
import json, sys
sys.path[:0] = [sys.argv[1]]
from engine import Engine
from engine.errors import EngineError
got = {}
for name in sys.argv[2:]:
    print(name, file=sys.stderr, flush=True)
    try:
        Engine.attach(name, timeout=0.3).close()
        got[name] = "attached"
    except EngineError as exc:
        got[name] = type(exc).__name__
print(json.dumps(got))
"""


def test_every_refusal_happens_in_a_fresh_interpreter_too(files):
    with segment() as seg:
        variants: dict[str, tuple[bytes, str]] = {
            "newer version": (seg.patched(OFF_VERSION, "<I", seg.version + 1), "LayoutMismatch"),
            "older version": (seg.patched(OFF_VERSION, "<I", seg.version - 1), "LayoutMismatch"),
            "foreign magic": (seg.patched(OFF_MAGIC, "<Q", 0xDEADBEEF), "LayoutMismatch"),
            "total bytes": (seg.patched(OFF_TOTAL, "<Q", seg.total + PAGE), "LayoutMismatch"),
            "row capacity": (seg.patched(OFF_ROWS, "<I", 2**31 + 1), "LayoutMismatch"),
            "an offset": (seg.patched(OFF_OFFSETS + 16, "<Q", 8), "LayoutMismatch"),
            "cut short": (seg.data[: seg.total - 64], "LayoutMismatch"),
            "cut to a page": (seg.data[:PAGE], "LayoutMismatch"),
            "grown": (seg.data + bytes(PAGE), "LayoutMismatch"),
            "no ready flag": (seg.patched(OFF_READY, "<I", 0), "AttachTimeout"),
            "empty": (b"", "AttachTimeout"),
            "tiny zeros": (bytes(100), "LayoutMismatch"),
            "tiny text": (b"render-lanes?", "LayoutMismatch"),
        }
    names = {}
    for label, (data, _) in variants.items():
        name = unique_name()
        files.append(name)
        names[name] = label
        with open(shm_path(name), "xb") as f:
            f.write(data)
    out = _run_child(CHILD_REFUSE, *names)
    last = out.stderr.strip().splitlines()[-1:] or ["?"]
    assert out.returncode == 0, (
        f"ENGINE BUG: the interpreter died (return code {out.returncode}) attaching to "
        f"{names.get(last[0], last[0])!r}")
    got = {names[n]: v for n, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    assert got == {label: want for label, (_, want) in variants.items()}
    for name, label in names.items():  # refused, and left exactly as written
        with open(shm_path(name), "rb") as f:
            assert f.read() == variants[label][0], label
