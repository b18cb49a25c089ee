"""vstack upstream on a synthetic vLLM-like git repository."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, write_stack_toml

from vstack.upstream import (
    dependencies,
    strip_stack_trailers,
    undocumented_config_fields,
)

SPDX = ("# SPDX-License-Identifier: Apache-2.0\n"
        "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n")  # fmt: skip
SIGNED = "\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"
CONFIG = '''from dataclasses import dataclass


@dataclass
class EPLBConfig:
    window_size: int = 1000
    """Window size for expert load recording."""
'''


def _ruff_pyproject() -> str:
    """vLLM-style pyproject: the stack's ruff settings under [tool.ruff]."""
    text = (ROOT / "src" / "vstack" / "vllm_ruff.toml").read_text()
    out = []
    for line in text.splitlines():
        if line.startswith("[") and not line.startswith("[["):
            line = "[tool.ruff." + line[1:]
        out.append(line)
    head = [ln for ln in out if not ln.startswith("[")]
    return "[tool.ruff]\n" + "\n".join(out) if head else "\n".join(out)


def _need_ruff():
    import os

    if not (
        os.environ.get("VSTACK_RUFF")
        or shutil.which("ruff")
        or (Path(sys.executable).parent / "ruff").exists()
    ):
        pytest.skip("ruff is not installed here (scripts/test's environment has it)")


@pytest.fixture
def upstream_stack(stack, tmp_path):
    _need_ruff()
    up = stack.root / "vllm"
    (up / "vllm" / "config").mkdir(parents=True)
    (up / "pyproject.toml").write_text(_ruff_pyproject())
    (up / "vllm" / "__init__.py").write_text("")
    (up / "vllm" / "config" / "__init__.py").write_text("")
    (up / "vllm" / "config" / "eplb.py").write_text(CONFIG)
    (up / "vllm" / "eplb.py").write_text(
        SPDX + "\n\ndef step(x: int) -> int:\n    return x + 1\n"
    )
    git(up, "init", "-q")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "upstream base")
    head = git(up, "rev-parse", "HEAD").strip()
    write_stack_toml(stack.root, stack.wheel, commit="g" + head[:9])
    (stack.root / "benchmarks" / "results").mkdir(parents=True)
    (stack.root / "benchmarks" / "results" / "helper.json").write_text(json.dumps({
        "command": "python benchmarks/helper.py --layers 43", "machine": "x86_64 2 cores, CPU only, not measured on GPU",
        "when": "2026-12-02T00:00:00Z", "speedup_vs_baseline": 37.5, "p99_ms": {"before": 7.4, "after": 0.2},
    }))  # fmt: skip
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/helper.py",
        SPDX + "\n\ndef helper(x: int) -> int:\n    return 2 * x\n",
        "[EPLB] Add helper\n\nThe helper is needed by the step change that follows."
        + SIGNED,
    )
    stack.commit_on_work(
        "vllm/eplb.py",
        SPDX + "\nfrom vllm.helper import helper\n\n\ndef step(x: int) -> int:\n    return helper(x) + 1\n",
        "[EPLB][Perf] Use helper in step\n\nStep gets faster by reusing the helper." + SIGNED.replace(
            "Signed-off-by", "Stack-Results: benchmarks/results/helper.json\nSigned-off-by"),
    )  # fmt: skip
    stack.commit_on_work(
        "vllm/config/eplb.py",
        CONFIG + "    new_knob: bool = False\n",
        "Add a knob\n\nA new knob for tuning, documented nowhere.\n\nUpstream-Status: pending",
    )
    stack.commit_on_work(
        "vllm/messy.py",
        SPDX + "import os\nimport torch\n\ntorch.cuda.synchronize()\n",
        "[Misc] Messy\n\nA change with lint problems for the test." + SIGNED,
    )
    assert stack.run("export") == 0
    return up


def test_branch_commits_dependencies_and_body(stack, upstream_stack, capsys):
    up = upstream_stack
    capsys.readouterr()
    assert stack.run("upstream", "eplb-perf-use-helper-in-step.patch") == 0
    out = capsys.readouterr().out
    assert "depends on: eplb-add-helper.patch" in out
    branch = "vstack/eplb-perf-use-helper-in-step-v1"
    subjects = git(up, "log", "--format=%s", f"HEAD..{branch}").split("\n")
    assert subjects[:2] == ["[EPLB][Perf] Use helper in step", "[EPLB] Add helper"]
    msg = git(up, "log", "-1", "--format=%B", branch)
    assert (
        "Signed-off-by: T <t@x>" in msg
        and "Upstream-Status" not in msg
        and "Stack-Results" not in msg
    )
    assert (
        git(up, "rev-parse", "HEAD").strip()
        == git(up, "rev-parse", f"{branch}~2").strip()
    )
    d = stack.root / "upstream" / "eplb-perf-use-helper-in-step"
    body = (d / "body.md").read_text()
    for section in ("## Purpose", "## Test Plan", "## Test Result"):
        assert section in body
    assert "Step gets faster by reusing the helper." in body
    assert "python benchmarks/helper.py --layers 43" in body
    assert "| speedup_vs_baseline | 37.5 |" in body and "| p99_ms.after | 0.2 |" in body
    assert "Not measured on GPU." in body
    assert "[EPLB] Add helper (stack patch eplb-add-helper.patch)" in body
    assert (d / "title.txt").read_text() == "[EPLB][Perf] Use helper in step\n"
    assert (
        "push <your-fork> vstack/eplb-perf-use-helper-in-step-v1" in out
        and "gh pr create" in out
    )


def test_checks_report_file_and_line(stack, upstream_stack, capsys):
    capsys.readouterr()
    assert stack.run("upstream", "misc-messy.patch") == 1
    out = capsys.readouterr().out
    assert "vllm/messy.py:3: [ruff] F401" in out
    assert "vllm/messy.py:6: [torch-cuda]" in out
    assert stack.run("upstream", "add-a-knob.patch") == 1
    out = capsys.readouterr().out
    assert "[dco] commit 'Add a knob' lacks Signed-off-by" in out
    assert "[title] title 'Add a knob' lacks vLLM's bracketed tags" in out
    assert "vllm/config/eplb.py:8: [config] EPLBConfig.new_knob has no docstring" in out


def test_revision_two_shows_range_diff(stack, upstream_stack, capsys):
    assert stack.run("upstream", "eplb-add-helper.patch") == 0
    # same content again: still revision 1
    assert stack.run("upstream", "eplb-add-helper.patch") == 0
    assert "revision 1;" in capsys.readouterr().out
    assert stack.run("apply") == 0
    git(
        stack.repo, "rebase", "-q", "--exec", "true", "base/1.0.0"
    )  # no-op, keeps history linear
    text = (stack.repo / "vllm/helper.py").read_text()
    git(stack.repo, "checkout", "-q", "-B", "tmp", "work~3")
    (stack.repo / "vllm/helper.py").write_text(text.replace("2 * x", "x << 1"))
    git(stack.repo, "commit", "-q", "-a", "--amend", "--no-edit")
    git(stack.repo, "rebase", "-q", "--onto", "tmp", "work~3", "work")
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("upstream", "eplb-add-helper.patch") == 0
    out = capsys.readouterr().out
    assert "revision 2;" in out and "range-diff v1 -> v2:" in out
    assert "x << 1" in out
    d = stack.root / "upstream" / "eplb-add-helper"
    assert (d / "v1.mbox").is_file() and (d / "v2.mbox").is_file()
    assert "x << 1" in (d / "range-diff-v1-v2.txt").read_text()
    assert git(
        upstream_stack, "rev-parse", "--verify", "vstack/eplb-add-helper-v2"
    ).strip()


def test_no_checkout_writes_patch_file_and_body(stack, capsys):
    _need_ruff()
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/helper.py",
        SPDX + "\n\ndef helper(x: int) -> int:\n    return 2 * x\n",
        "[EPLB] Add helper\n\nThe helper is needed by a later change." + SIGNED,
    )
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("upstream", "eplb-add-helper") == 0
    out = capsys.readouterr().out
    d = stack.root / "upstream" / "eplb-add-helper"
    mbox = (d / "v1.mbox").read_text()
    assert (
        "Subject: [EPLB] Add helper" in mbox
        and "+def helper" in mbox
        and "Upstream-Status" not in mbox
    )
    assert "No recorded benchmark results" in (d / "body.md").read_text()
    assert "am " in out and "v1.mbox" in out


def test_pure_helpers():
    assert (
        strip_stack_trailers(
            "S\n\nBody.\n\nUpstream-Status: pending\nUpstream-PR: 1\nSigned-off-by: A <a@x>\n"
        )
        == "S\n\nBody.\n\nSigned-off-by: A <a@x>\n"
    )

    class Info:
        def __init__(self, files, added=()):
            self.files, self.added = files, list(added)

    infos = [Info(["a"]), Info(["b"], added=["b"]), Info(["c", "a"]), Info(["c"])]
    assert dependencies(infos, 3, applies_alone=False) == [0, 2]
    assert dependencies(infos, 3, applies_alone=True) == []
    # importing a module an earlier patch adds is a dependency; importing one it
    # only modifies is not
    assert dependencies(infos, 3, applies_alone=True, imports={"b", "a"}) == [1]
    found = undocumented_config_fields(
        "c.py", "class C:\n    x: int\n    y: int = 1\n    '''doc'''\n", {2, 3}
    )
    assert [str(f) for f in found] == [
        "c.py:2: [config] C.x has no default",
        "c.py:2: [config] C.x has no docstring",
    ]


def test_results_summary_and_description_split(tmp_path):
    from vstack.upstream import render_results, split_description

    data = {"command": "python b.py", "machine": {"cores": 2, "note": "CPU only"},
            "summary": {"p99 before / after (ms)": "7.4 / 0.2"}, "raw": {"x": 1}}  # fmt: skip
    text = render_results(tmp_path / "r.json", data)
    assert "| p99 before / after (ms) | 7.4 / 0.2 |" in text and "| raw.x |" not in text
    assert "on cores: 2, note: CPU only" in text and "Not measured on GPU." in text
    purpose, testing = split_description("Why: a.\n\nWhat: b.\n\nTests: c.\n\nMore: d.")
    assert purpose == "Why: a.\n\nWhat: b." and testing == "Tests: c.\n\nMore: d."


def test_dependencies_are_pruned_to_what_the_chain_needs(stack, capsys):
    _need_ruff()
    base = "".join(f"line {i}\n" for i in range(1, 41))

    def edit(text, n, new):
        lines = text.splitlines(True)
        lines[n - 1] = new + "\n"
        return "".join(lines)

    assert stack.run("apply") == 0
    a = stack.repo / "vllm/a.py"
    stack.commit_on_work(
        "vllm/a.py", base, "[Test] Seed a\n\nSeed file a for the test." + SIGNED
    )
    stack.commit_on_work(
        "vllm/b.py", base, "[Test] Seed b\n\nSeed file b for the test." + SIGNED
    )
    assert stack.run("export") == 0
    # the seeds become part of the base: re-pin onto a wheel that has them
    stack.commit_on_work(
        "vllm/a.py",
        edit(base, 5, "line 5 p1"),
        "[Test] P1\n\nFirst edit of a." + SIGNED,
    )
    a_text = a.read_text()
    (stack.repo / "vllm/a.py").write_text(edit(a_text, 30, "line 30 p2"))
    (stack.repo / "vllm/b.py").write_text(edit(base, 5, "line 5 p2"))
    git(
        stack.repo,
        "commit",
        "-q",
        "-am",
        "[Test] P2\n\nEdits a far from P1, and b." + SIGNED,
    )
    stack.commit_on_work("vllm/b.py", edit(edit(base, 5, "line 5 p2"), 6, "line 6 p3"),
                         "[Test] P3\n\nEdits b next to P2's line." + SIGNED)  # fmt: skip
    assert stack.run("export") == 0
    capsys.readouterr()
    stack.run("upstream", "test-p3.patch")  # its checks fail (the files are no Python)
    out = capsys.readouterr().out
    deps = [
        ln.split("depends on: ")[1].split(" ")[0]
        for ln in out.splitlines()
        if "depends on:" in ln
    ]
    # P3 needs P2 (its context), P2 needs the seeds; P1 only shares a file with P2
    assert "test-p2.patch" in deps and "test-p1.patch" not in deps


def test_revision_does_not_depend_on_the_local_cache(stack):
    """P2's context holds P1's line: alone it applies only by a 3-way merge, which
    needs P1's blobs. A fresh clone (no .vstack) and a checkout after a build must
    make the same PR from it."""
    lines = "".join(f"line {i}\n" for i in range(1, 41))
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/distributed/eplb/state.py",
        lines.replace("line 10\n", "line 10 p1\n"),
        "[EPLB] P1\n\nFirst edit, next to the second." + SIGNED,
    )
    stack.commit_on_work(
        "vllm/distributed/eplb/state.py",
        lines.replace("line 10\n", "line 10 p1\n").replace("line 12\n", "line 12 p2\n"),
        "[EPLB] P2\n\nSecond edit, two lines below the first." + SIGNED,
    )
    assert stack.run("export") == 0

    def upstream_mbox(prepare) -> bytes:
        shutil.rmtree(stack.root / ".vstack")
        shutil.rmtree(stack.root / "upstream", ignore_errors=True)
        prepare()
        stack.run(
            "upstream", "eplb-p2.patch"
        )  # exit 1 without ruff; the mbox is written
        return (stack.root / "upstream/eplb-p2/v1.mbox").read_bytes()

    fresh = upstream_mbox(lambda: None)
    built = upstream_mbox(lambda: stack.run("build"))
    assert fresh == built
    assert fresh.count(b"\nSubject: ") == 1  # P2 alone: the 3-way merge needs no P1
