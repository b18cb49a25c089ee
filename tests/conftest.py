"""pytest wiring for the tool's tests (helpers live in vstack_testlib)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vstack_testlib import Stack, make_wheel, write_stack_toml  # noqa: E402


@pytest.fixture
def stack(tmp_path, monkeypatch) -> Stack:
    cache = tmp_path / "wheels"
    wheel = make_wheel(cache / "vllm-1.0.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("")
    write_stack_toml(root, wheel)
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(cache))
    # No test may reach a package index.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    # Nor vLLM's per-commit wheel repository: port 9 (discard) refuses at once.
    monkeypatch.setenv("VSTACK_WHEEL_INDEX", "http://127.0.0.1:9")
    # Nobody signs off a draft unless a test says so.
    monkeypatch.delenv("VSTACK_SIGNOFF", raising=False)
    return Stack(root, cache, wheel)


def pytest_terminal_summary(terminalreporter):
    """The interrupt points tests/test_interrupts.py covered, per verb."""
    from interrupts import COUNTS

    if not COUNTS:
        return
    terminalreporter.section("interrupt points covered (each: SIGINT and SIGKILL)")
    for verb, c in COUNTS.items():
        terminalreporter.write_line(
            f"{verb:<34} {c['points']:>4} points  "
            f"SIGINT {c.get('SIGINT', 0):>4}  SIGKILL {c.get('SIGKILL', 0):>4}"
        )
