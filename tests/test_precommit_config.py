"""This repository's .pre-commit-config.yaml: it parses, pins ruff as the test lock
does, and pre-commit itself runs the vstack hooks on a stack (pass, then fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git

yaml = pytest.importorskip("yaml")


def _config() -> dict:
    return yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())


def _hooks() -> dict:
    return {h["id"]: h for repo in _config()["repos"] for h in repo["hooks"]}


def _ruff_pin() -> str:
    lock = (ROOT / "requirements" / "cpu-test.txt").read_text().splitlines()
    return next(ln for ln in lock if ln.startswith("ruff=="))


def test_hooks_and_the_ruff_pin():
    hooks = _hooks()
    assert set(hooks) == {
        "ruff-check",
        "ruff-format",
        "vstack-lint",
        "vstack-export-check",
    }
    for hid in ("ruff-check", "ruff-format"):
        assert hooks[hid]["additional_dependencies"] == [_ruff_pin()]
        assert hooks[hid]["language"] == "python"
    assert hooks["vstack-lint"]["entry"] == "scripts/vstack lint"
    assert hooks["vstack-export-check"]["entry"] == "scripts/vstack export --check"
    # the ruff hooks' commands pass on this repository with the pinned ruff
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed here (scripts/test's environment has it)")
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True)
    assert version.stdout.split()[1] == _ruff_pin().split("==")[1]
    for hid, extra in (("ruff-check", []), ("ruff-format", ["--check"])):
        cmd = [str(ruff), *hooks[hid]["entry"].split()[1:], *extra, "--no-cache"]
        p = subprocess.run(
            [*cmd, "src", "tests"], cwd=ROOT, capture_output=True, text=True
        )
        assert p.returncode == 0, p.stdout + p.stderr


def test_pre_commit_runs_the_vstack_hooks(stack, tmp_path):
    pre_commit = Path(sys.executable).parent / "pre-commit"
    if not pre_commit.exists():
        pytest.skip("pre-commit is not installed (requirements/cpu-test.txt has it)")
    # this repository's hooks and tool around a small stack
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/config.py", "A = 1\nB = 20\nC = 3\n",
        "[EPLB] Change B\n\nB must be twenty for the test.\n\n"
        "Upstream-Status: pending\nSigned-off-by: T <t@x>",
    )  # fmt: skip
    assert stack.run("export") == 0
    shutil.copy(ROOT / ".pre-commit-config.yaml", stack.root)
    shutil.copytree(ROOT / "scripts", stack.root / "scripts")
    shutil.copytree(
        ROOT / "src" / "vstack", stack.root / "src" / "vstack",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    (stack.root / ".gitignore").write_text("/.vstack/\n")
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "SKIP": "ruff-check,ruff-format",  # need PyPI to install; checked above
        "PYTHON": sys.executable,
    }

    def run(*args):
        return subprocess.run(
            [str(pre_commit), "run", "--color=never", *args],
            cwd=stack.root, capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip

    p = run("--all-files")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "vstack lint (the series and recorded resolutions)" in p.stdout
    assert "Passed" in p.stdout and "Failed" not in p.stdout
    # an unlisted patch, and a patch edited by hand: each hook catches its own
    (stack.root / "patches" / "stray.patch").write_text("x\n")
    patch = stack.root / "patches" / "eplb-change-b.patch"
    patch.write_text(patch.read_text().replace("B must be twenty", "B must be 20"))
    git(stack.root, "add", "-A")
    p = run("--all-files")
    assert p.returncode == 1
    assert "patches/stray.patch:1: not listed in patches/series" in p.stdout
    assert "- hook id: vstack-export-check" in p.stdout
    assert "patches/eplb-change-b.patch" in p.stdout.split("vstack-export-check")[-1]
