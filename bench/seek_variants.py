"""A bench-only build of the C core whose claim pass can seek the ways the design compared
(docs/design.md §7).

The product's seek (csrc/claim.c) starts each lane at its floor, or at the skip hint past a known
stale prefix, and reads forward with the upper bound checked in code. To measure what each of
those buys, this module compiles the same csrc/ sources a second time, with -DRL_BENCH, into
bench/build/ (gitignored) as ``_rl_bench``. In that build ``rl_bench_flags`` picks a variant at
run time; with flags 0 it is the product's pass (plus one load and branch per lane, so compare
variants with each other, not with the product module). The product build never defines
RL_BENCH and compiles to the same code as before the guards were added.

The module attaches to a segment an ``Engine`` created (same layout version), so the corpus is
built through the public API and only the passes under test go through this build.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path
from typing import Any

from common import ROOT

UNFLOORED = 1   # seek from the lane's base instead of its floor
NO_SKIP = 2     # ignore the skip hint
TWO_SIDED = 4   # also binary-search the upper bound (a two-sided range)
NO_TOMB = 8     # no tombstones for completed rows: every stale entry is read one by one

BUILD = ROOT / "bench" / "build"


def _digest() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "csrc").glob("*.[ch]")):
        h.update(p.name.encode() + p.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def load() -> tuple[Any, Any]:
    """(ffi, lib) of the bench build, compiled first if csrc/ changed since the last build."""
    tag = _digest()
    out = BUILD / tag
    modname = f"_rl_bench_{tag}"
    if not any(out.glob(f"{modname}*.so")):
        from cffi import FFI
        sys.path.insert(0, str(ROOT / "engine"))
        from _build import SOURCES, _cdef  # the product's sources and cdef (csrc/lanes.h)
        sys.path.pop(0)
        fb = FFI()
        fb.cdef(_cdef() + "\nextern int rl_bench_flags;\n")
        fb.set_source(modname, '#include "lanes.h"\nint rl_bench_flags = 0;\n',
                      sources=[str(ROOT / "csrc" / s) for s in SOURCES],
                      include_dirs=[str(ROOT / "csrc")],
                      extra_compile_args=["-O2", "-std=gnu11", "-w", "-DRL_BENCH"],
                      libraries=["rt"])
        out.mkdir(parents=True, exist_ok=True)
        for old in BUILD.iterdir():  # keep only the current build
            if old != out and old.is_dir():
                import shutil
                shutil.rmtree(old, ignore_errors=True)
        fb.compile(tmpdir=str(out), verbose=False)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    mod = importlib.import_module(modname)
    return mod.ffi, mod.lib


class Handle:
    """This process's handle on an engine's segment through the bench build."""

    def __init__(self, name: str) -> None:
        import os

        import psutil
        self.ffi, self.lib = load()
        ffi, lib = self.ffi, self.lib
        seg = ffi.new("rl_seg **")
        rc = lib.rl_attach(name.encode(), 5.0, seg)
        if rc != 0:
            raise RuntimeError(f"bench build: attach {name}: status {rc}")
        self.h = seg[0]
        owner = ffi.new("uint32_t *")
        start = int(psutil.Process().create_time() * 1000)
        rc = lib.rl_owner_register(self.h, os.getpid(), start, owner)
        if rc != 0:
            raise RuntimeError(f"bench build: register: status {rc}")
        self.owner = owner[0]
        self.advice = ffi.new("uint32_t *")
        self._out: Any = None
        self._ok: Any = None
        self._budget = 0
        self.warm()

    def warm(self) -> None:
        """Touch the whole mapping once. This is a second mapping of the segment in this
        process, and without this the first ~1,500 passes pay minor page faults on the row table
        (measured: 23 µs per pass at first, 2.4 µs until most pages are touched, then 1.4 µs)."""
        lanes = self.ffi.new("rl_lane_stats[]", 64)
        self.lib.rl_stats(self.h, 0, lanes)
        problems = self.ffi.new("rl_problem[]", 8)
        found = self.ffi.new("uint32_t *")
        self.lib.rl_verify(self.h, problems, 8, found)

    def flags(self, flags: int) -> None:
        self.lib.rl_bench_flags = flags

    def claim(self, budget: int, now: int, lease_ms: int = 600_000, window: int = 140) -> int:
        """One pass; the rows stay in self._out. Advice (merge now) is ignored on purpose."""
        if budget != self._budget:
            self._out = self.ffi.new("int64_t[]", 4 * budget)
            self._ok = self.ffi.new("uint8_t[]", budget)
            self._budget = budget
        n = self.lib.rl_claim(self.h, self.owner, budget, now, lease_ms, window, self._out,
                              self.advice)
        if n < 0:
            raise RuntimeError(f"bench build: claim: status {n}")
        return n

    def complete(self, n: int, now: int) -> None:
        """Complete the rows of the last claim, rescheduled to now + interval."""
        if n:
            rc = self.lib.rl_complete_many(self.h, self.owner, n, self._out,
                                           self._out + 3 * self._budget, self.ffi.NULL, now,
                                           self._ok, self.advice)
            if rc < 0:
                raise RuntimeError(f"bench build: complete: status {rc}")

    def compact(self) -> None:
        while (rc := self.lib.rl_compact(self.h, self.owner, 0)) == -11:  # RL_E_BUSY
            pass
        if rc != 0:
            raise RuntimeError(f"bench build: compact: status {rc}")

    def close(self) -> None:
        if self.h is not None:
            self.lib.rl_owner_release(self.h, self.owner)
            self.lib.rl_close(self.h)
            self.h = None
