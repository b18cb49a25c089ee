"""scripts/stress-test's arguments: --help explains and starts nothing, a bad
--runs is refused in one line before any setup."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "stress-test"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage_and_starts_nothing(flag):
    proc = _run(flag)
    assert proc.returncode == 0, proc.stderr
    assert "scripts/stress-test [--runs N] [--matrix] [pytest args]" in proc.stdout
    # scripts/test's setup would print its steps ("==> ...").
    assert "==>" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("runs", ["", "0", "x", "-3", "2.5"])
def test_a_bad_run_count_is_refused_before_any_setup(runs):
    proc = _run("--runs", runs) if runs else _run("--runs")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"stress-test: --runs needs a positive count, got '{runs}'"
    )
    assert "==>" not in proc.stdout
