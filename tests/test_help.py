"""Help text without noise: every subcommand's ``--help`` says a default only when it has one
worth saying, and says it once."""

from __future__ import annotations

import re

import pytest

from engine.cli import COMMANDS, main

NOISE = re.compile(r"\(default: (None|True|False|\[\]|)\)")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> list[str]:
    """Each option's help as one line (argparse wraps it over several)."""
    out: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  -", line) or not out:
            out.append(line.strip())
        elif line.startswith("    "):
            out[-1] += " " + line.strip()
        else:
            out.append(line.strip())
    return out


@pytest.mark.parametrize("argv", [(), *((c.name,) for c in COMMANDS)],
                         ids=lambda a: " ".join(("lanes", *a)))
def test_help_says_each_default_once_and_none_that_says_nothing(
        capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    text = _help(capsys, *argv)
    assert not NOISE.findall(text), NOISE.findall(text)
    doubled = [e for e in _entries(text) if e.count("default:") > 1]
    assert doubled == []


def test_the_sim_help_the_issue_quoted_reads_clean(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(capsys, "sim").split())
    assert text.count("(default: 1,0.75,0.5)") == 1
    assert "(default: None)" not in text and "--seed SEED random seed" in text
    assert "how long the pool runs (default: 45.0)" in " ".join(_help(capsys, "demo").split())
