"""vLLM's own pre-commit hooks run by `vstack lint` and `vstack upstream` on the files
each patch changes, in a synthetic vLLM checkout whose .pre-commit-config.yaml has a
diff-based hook (like vLLM's check-triton-import) and a file-based one."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from vstack_testlib import git, write_stack_toml

from vstack.precommit import parse_output

SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
SIGNED = "\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"
CONFIG = """\
repos:
- repo: local
  hooks:
  - id: staged-diff-check
    name: no BANNED in added lines (reads git diff --cached)
    entry: python3 tools/staged_diff_check.py
    language: system
    pass_filenames: false
  - id: file-check
    name: no TODO in the files passed
    entry: python3 tools/file_check.py
    language: system
    types: [python]
"""
STAGED = """\
import subprocess
import sys

diff = subprocess.run(["git", "diff", "--cached", "--unified=0"],
                      capture_output=True, text=True, check=True).stdout
bad, file, no = [], None, 0
for line in diff.splitlines():
    if line.startswith("+++ b/"):
        file = line[6:]
    elif line.startswith("@@"):
        no = int(line.split("+")[1].split(",")[0].split(" ")[0]) - 1
    elif line.startswith("+"):
        no += 1
        if "BANNED" in line:
            bad.append(f"{file}:{no}: BANNED added")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""
FILES = """\
import sys

bad = [p for p in sys.argv[1:] if "TODO" in open(p).read()]
print("\\n".join(f"{p}: has a TODO" for p in bad))
sys.exit(1 if bad else 0)
"""


@pytest.fixture
def hooked(stack, tmp_path, monkeypatch):
    pre_commit = Path(sys.executable).parent / "pre-commit"
    if not pre_commit.exists() and not shutil.which("pre-commit"):
        pytest.skip("pre-commit is not installed (requirements/cpu-test.txt has it)")
    monkeypatch.setenv("PRE_COMMIT_HOME", str(tmp_path / "pre-commit-home"))
    up = stack.root / "vllm"
    (up / "vllm").mkdir(parents=True)
    (up / "tools").mkdir()
    (up / "vllm" / "__init__.py").write_text("")
    (up / "vllm" / "old.py").write_text(SPDX + "BANNED = 1  # upstream's own\n")
    (up / "tools" / "staged_diff_check.py").write_text(STAGED)
    (up / "tools" / "file_check.py").write_text(FILES)
    (up / ".pre-commit-config.yaml").write_text(CONFIG)
    git(up, "init", "-q")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "upstream base")
    head = git(up, "rev-parse", "HEAD").strip()
    write_stack_toml(stack.root, stack.wheel, commit="g" + head[:9])
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/good.py",
        SPDX + "X = 1\n",
        "[EPLB] Good\n\nA change that passes every hook vLLM has." + SIGNED,
    )
    stack.commit_on_work(
        "vllm/bad.py",
        SPDX + "Y = 1\nZ = 'BANNED'\n",
        "[EPLB] Bad\n\nA change that vLLM's diff hook rejects." + SIGNED,
    )
    stack.commit_on_work(
        "vllm/todo.py",
        SPDX + "W = 1  # TODO\n",
        "[EPLB] Todo\n\nA change that vLLM's file hook rejects." + SIGNED,
    )
    assert stack.run("export") == 0
    return up


def test_lint_runs_vllms_hooks_per_patch(stack, hooked, capsys):
    capsys.readouterr()
    assert stack.run("lint") == 1
    out = capsys.readouterr().out.splitlines()
    problems = [ln for ln in out if ln.startswith("patches/")]
    assert problems == [
        "patches/eplb-bad.patch:1: vLLM pre-commit hook staged-diff-check failed: "
        "vllm/bad.py:4: BANNED added",
        "patches/eplb-todo.patch:1: vLLM pre-commit hook file-check failed: "
        "vllm/todo.py: has a TODO",
    ]
    assert any(
        "vLLM's own pre-commit hooks ran on each patch's files" in ln for ln in out
    )
    # the same through --git with the checkout elsewhere (vllm/ not populated)
    elsewhere = hooked.parent.parent / "vllm-elsewhere"
    shutil.move(hooked, elsewhere)
    assert stack.run("lint") == 0  # the restated checks know nothing of BANNED
    assert "hooks not run: no vLLM checkout" in capsys.readouterr().out
    assert stack.run("lint", "--git", str(elsewhere)) == 1
    assert (
        "eplb-todo.patch:1: vLLM pre-commit hook file-check" in capsys.readouterr().out
    )


def test_upstream_runs_vllms_hooks_on_the_pr(stack, hooked, capsys):
    capsys.readouterr()
    assert stack.run("upstream", "eplb-bad.patch") == 1
    out = capsys.readouterr().out
    assert (
        "FAIL staged-diff-check: [pre-commit] vLLM pre-commit hook staged-diff-check "
        "failed: vllm/bad.py:4: BANNED added" in out
    )
    checks = (stack.root / "upstream/eplb-bad/checks.txt").read_text()
    assert "staged-diff-check" in checks
    assert stack.run("upstream", "eplb-good.patch") == 0


def test_parse_pre_commit_output():
    text = (
        "no BANNED in added lines.................................................Failed\n"
        "- hook id: staged-diff-check\n- exit code: 1\n\nvllm/bad.py:4: BANNED added\n\n"
        "no TODO in the files passed..............................................Passed\n"
        "ruff format..........................................(no files to check)Skipped\n"
    )
    (f,) = parse_output(text)
    assert f.hook == "staged-diff-check"
    assert f.summary() == (
        "vLLM pre-commit hook staged-diff-check failed: vllm/bad.py:4: BANNED added"
    )
