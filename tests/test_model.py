"""The claim-floor protocol (csrc/floor.c), the rows-in-flight protocol (csrc/sweep.c), the
add path's reservation, rolled forward or back by a repair when its writer dies (csrc/writes.c),
and the interval classes of row words (csrc/layout.h), model-checked by spin:
tests/model/check.sh.

check.sh searches every interleaving of tests/model/floor.pml, in each of its bounded
configurations, for a live row left below its lane's floor, a row in flight that lease_min does
not cover, or a queued row that no claim pass can find; and it requires spin to catch each
deliberately broken variant (and each fix the model found to be needed). spin is Debian's
package, which `make test` installs (`make spin`); without it this test fails, never skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHECK = Path(__file__).parent / "model" / "check.sh"

# Each search of check.sh, by the name it prints: every one must end as expected.
VERIFIED = {
    "default",
    "claims",
    "merge",
    "passes",
    "leases",
    "lease-merge",
    "lease-write",
    "lease-write-merge",
    "relapse",
    "stale-grant",
    "add",
    "add-twice",
    "grow",
    "grow-writes",
    "grow-leases",
    "ivclass",
}
CAUGHT = {
    "broken-raise",
    "broken-lower",
    "broken-gen",
    "broken-ring-min",
    "broken-proposal",
    "broken-fresh",
    "reach-top",
    "broken-hint",
    "broken-used-first",
    "broken-release",
    "broken-republish",
    "broken-sweep-min",
    "broken-flight-order",
    "broken-note-order",
    "release-publish-first",
    "sweep-publish-first",
    "no-end-recheck",
    "add-no-settle",
    "add-journal-after",
    "add-settle-ignores-live",
    "add-drop-before-publish",
    "add-settle-journals-first",
    "ivclass-broken-store",
    "ivclass-broken-keep-class",
    "ivclass-broken-word-first",
    "ivclass-reach-full",
}

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
    verified = set(re.findall(r"^ok {4}(\S+) \(.*\): errors: 0, \d+ states", out, re.M))
    caught = set(re.findall(r"^ok {4}(\S+) \(.*\): caught, errors: [1-9]", out, re.M))
    assert verified == VERIFIED, f"searches verified: {sorted(verified)}\n{out}"
    assert caught == CAUGHT, f"variants caught: {sorted(caught)}\n{out}"
    assert not re.search(r"^FAIL", out, re.M), out
