"""Builds ``engine._core`` from ``csrc/`` with cffi in API mode.

``csrc/lanes.h`` is both the C API and the cdef: lines marked CDEF-SKIP (include guards and
includes) are dropped before it reaches ``ffi.cdef``. ``RL_SANITIZE=undefined,address`` builds
the core with those sanitizers (``make test-sanitize``); setup.py builds ``engine._hot`` with the
same flags.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
# In the order the files call each other: each calls only files before it (layout.h's inline
# helpers aside). keys, floor and owners call nothing; claim is the top.
SOURCES = ["keys.c", "floor.c", "owners.c", "segment.c", "index.c", "writes.c", "lease.c",
           "sweep.c", "claim.c", "stats.c"]


def _cdef() -> str:
    text = (CSRC / "lanes.h").read_text()
    return "\n".join(line for line in text.splitlines() if "CDEF-SKIP" not in line)


def flags() -> tuple[list[str], list[str]]:
    compile_args = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    link_args: list[str] = []
    sanitize = os.environ.get("RL_SANITIZE", "").strip()
    if sanitize:
        compile_args = ["-O1", "-g", "-std=gnu11", f"-fsanitize={sanitize}",
                        "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
        link_args = [f"-fsanitize={sanitize}"]
    return compile_args, link_args


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
_compile, _link = flags()
ffibuilder.set_source(
    "engine._core",
    '#include "lanes.h"',
    sources=[str((CSRC / name).relative_to(ROOT)) for name in SOURCES],
    include_dirs=[str(CSRC)],
    extra_compile_args=_compile,
    extra_link_args=_link,
    libraries=["rt", "m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
