"""The claim-floor protocol (csrc/floor.c) model-checked by spin: tests/model/check.sh.

check.sh searches every interleaving of tests/model/floor.pml for a live row left below its
lane's floor, and requires spin to catch each deliberately broken variant. spin is Debian's
package, which `make test` installs (`make spin`); without it this test fails, never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHECK = Path(__file__).parent / "model" / "check.sh"

# Set for the sanitized run (make test-sanitize) and meant for its C core only: neither spin
# nor the verifier it builds is instrumented.
_SANITIZER_VARS = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS")


def test_floor_protocol_model_check() -> None:
    if shutil.which("spin") is None:
        pytest.fail(
            "spin is not installed, so the floor protocol's model check cannot run: "
            "install it with `apt-get install -y spin` (or `make spin`)",
            pytrace=False,
        )
    env = {k: v for k, v in os.environ.items() if k not in _SANITIZER_VARS}
    proc = subprocess.run(
        ["sh", str(CHECK)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"tests/model/check.sh exited {proc.returncode}:\n{out}"
    assert "errors: 0" in out and "all as expected" in out, out
