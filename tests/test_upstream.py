"""vstack upstream on a synthetic vLLM-like git repository."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, need_ruff, write_stack_toml

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


def _mbox(stack, slug: str, n: int = 1, signed: bool = False) -> Path:
    """The copy `vstack upstream` writes under .vstack/outgoing/ (no mbox is kept
    in upstream/)."""
    name = f"v{n}.mbox" if signed else f"v{n}.unsigned.mbox"
    return stack.root / ".vstack" / "outgoing" / slug / name


@pytest.fixture
def upstream_stack(stack, tmp_path):
    need_ruff()
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


def test_dependency_is_named_not_carried(stack, upstream_stack, capsys):
    up = upstream_stack
    capsys.readouterr()
    assert stack.run("upstream", "eplb-perf-use-helper-in-step.patch") == 0
    out = capsys.readouterr().out
    # no Depends-On: trailer, but it imports a module the helper patch adds
    assert "depends on: eplb-add-helper.patch" in out and "[inferred]" in out
    branch = "vstack/eplb-perf-use-helper-in-step-v1"
    subjects = git(up, "log", "--format=%s", f"HEAD..{branch}").split("\n")
    assert subjects[:2] == ["[EPLB][Perf] Use helper in step", "[EPLB] Add helper"]
    msg = git(up, "log", "-1", "--format=%B", branch)
    assert "Upstream-Status" not in msg and "Stack-Results" not in msg
    d = stack.root / "upstream" / "eplb-perf-use-helper-in-step"
    assert not list(d.glob("*.mbox"))  # regenerated from the patch files in git
    mbox = _mbox(stack, "eplb-perf-use-helper-in-step").read_text()
    # the draft holds its own commit only; the helper is the PR it depends on
    assert mbox.count("Subject: ") == 1
    assert "Subject: [EPLB][Perf] Use helper in step" in mbox
    body = (d / "body.md").read_text()
    for section in ("## Purpose", "## Test Plan", "## Test Result"):
        assert section in body
    assert "Step gets faster by reusing the helper." in body
    assert "**Depends on** the PR drafted in `upstream/eplb-add-helper/`" in body
    assert "python benchmarks/helper.py --layers 43" in body
    assert "- speedup_vs_baseline: 37.5" in body and "- p99_ms.after: 0.2" in body
    assert "**Not run on a GPU**" in body
    assert (d / "title.txt").read_text() == "[EPLB][Perf] Use helper in step\n"
    checks = (d / "checks.txt").read_text()
    assert "depends on: eplb-add-helper (inferred)" in checks
    assert (
        "PASS     [applies] on stock vLLM 1.0.0 + eplb-add-helper: inferred" in checks
    )
    assert "result: all checks that ran passed (1 skipped: pre-commit)\n" in checks


def test_checks_report_file_and_line(stack, upstream_stack, capsys):
    capsys.readouterr()
    assert stack.run("upstream", "misc-messy.patch") == 1
    out = capsys.readouterr().out
    assert "FAIL vllm/messy.py:3: [ruff] F401" in out
    assert "FAIL vllm/messy.py:6: [torch-cuda]" in out
    assert stack.run("upstream", "add-a-knob.patch") == 1
    out = capsys.readouterr().out
    assert "[title] title 'Add a knob' lacks vLLM's bracketed tags" in out
    assert "vllm/config/eplb.py:8: [config] EPLBConfig.new_knob has no docstring" in out
    checks = (stack.root / "upstream" / "add-a-knob" / "checks.txt").read_text()
    # no sign-off is not a failure, but the draft cannot be sent yet
    assert "UNSIGNED [dco] unsigned: not sendable" in checks
    assert "result: 2 check(s) failed" in checks
    assert "unsigned: not sendable yet" in out


def test_revision_two_replaces_one_and_shows_range_diff(stack, upstream_stack, capsys):
    assert stack.run("upstream", "eplb-add-helper.patch") == 0
    # same content again: still revision 1
    assert stack.run("upstream", "eplb-add-helper.patch") == 0
    assert "revision 1;" in capsys.readouterr().out
    assert stack.run("apply") == 0
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
    # the range-diff from the previous revision, no mbox
    assert not list(d.glob("*.mbox"))
    assert _mbox(stack, "eplb-add-helper", 2).is_file()
    assert "x << 1" in (d / "range-diff-v1-v2.txt").read_text()
    meta = json.loads((d / "meta.json").read_text())
    assert [r["revision"] for r in meta["revisions"]] == [1, 2]
    assert meta["revisions"][0]["patches"][0]["name"] == "eplb-add-helper.patch"
    assert git(
        upstream_stack, "rev-parse", "--verify", "vstack/eplb-add-helper-v2"
    ).strip()


def test_no_checkout_writes_mbox_and_says_unsigned(stack, capsys):
    need_ruff()
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/helper.py",
        SPDX + "\n\ndef helper(x: int) -> int:\n    return 2 * x\n",
        "[EPLB] Add helper\n\nThe helper is needed by a later change.\n\n"
        "Upstream-Status: pending",
    )
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("upstream", "eplb-add-helper") == 0
    out = capsys.readouterr().out
    d = stack.root / "upstream" / "eplb-add-helper"
    mbox = _mbox(stack, "eplb-add-helper").read_text()
    assert "Subject: [EPLB] Add helper" in mbox and "+def helper" in mbox
    assert "Upstream-Status" not in mbox and "Signed-off-by" not in mbox
    assert "## Design" not in (d / "body.md").read_text()
    assert "NOTE     [tests] the PR adds no tests" in (d / "checks.txt").read_text()
    assert "not sendable yet" in out and " am " not in out


def test_pure_helpers():
    from vstack.identity import parse
    from vstack.upstream import split_message, with_signoff

    msg = (
        "S\n\nBody.\n\nUpstream-Status: pending\nUpstream-PR: 1\nPorted-From: x\n"
        "Depends-On: a-b\nRFC: docs/p.md\nStack-Results: r.json\n"
        "Signed-off-by: A Person <a@person.dev>\n"
        "Signed-off-by: vLLM EPLB Stack <eplb-stack@users.noreply.github.com>\n"
        "Co-authored-by: B Person <b@person.dev>\n"
    )
    assert strip_stack_trailers(msg) == (
        "S\n\nBody.\n\nSigned-off-by: A Person <a@person.dev>\n"
        "Co-authored-by: B Person <b@person.dev>\n"
    )
    assert strip_stack_trailers("S\n\nBody.\n\nUpstream-Status: pending\n") == (
        "S\n\nBody.\n"
    )
    # a body paragraph that looks like a trailer ("Why: ...") stays
    assert strip_stack_trailers("S\n\nWhy: x.\n") == "S\n\nWhy: x.\n"
    signed = with_signoff("S\n\nBody.\n", parse("C D <c@d.dev>"))
    assert signed == "S\n\nBody.\n\nSigned-off-by: C D <c@d.dev>\n"
    assert with_signoff(signed, parse("C D <c@d.dev>")) == signed
    purpose, design, testing = split_message(
        "Why: a.\n\nWhat:\n- b.\n\nMore: c.\n\nTests: d.\n\nAlso: e."
    )
    assert (purpose, design) == ("a.", "- b.\n\nMore: c.")
    assert testing == "Tests: d.\n\nAlso: e."

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


def test_results_table_pivots_variants(tmp_path):
    from vstack.upstream import render_results

    data = {
        "command": "/opt/venv/bin/python b.py",
        "machine": {"cores": 2, "note": "CPU only, not measured on GPU"},
        "summary": {
            "stock 1.0: p99 ms": "7.4", "patched: p99 ms": "0.2 (0.03x stock)",
            "stock 1.0: collectives": 1.0, "patched: collectives": 0.0, "cases": 36,
        },
        "raw": {"x": 1},
    }  # fmt: skip
    text = render_results(tmp_path / "r.json", data)
    assert "(cores: 2, note: CPU only, not measured on GPU; `python b.py`)" in text
    assert "| | stock 1.0 | patched |" in text
    assert "| p99 ms | 7.4 | 0.2 (0.03x stock) |" in text
    assert "| collectives | 1 | 0 |" in text
    assert "- cases: 36" in text and "raw" not in text


def test_dependencies_are_pruned_to_what_the_chain_needs(stack, capsys):
    need_ruff()
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
        return _mbox(stack, "eplb-p2").read_bytes()

    fresh = upstream_mbox(lambda: None)
    built = upstream_mbox(lambda: stack.run("build"))
    assert fresh == built
    assert fresh.count(b"\nSubject: ") == 1  # P2 alone: the 3-way merge needs no P1


# ---------------------------------------------------------------- Depends-On, tests


BOT = "vLLM EPLB Stack <eplb-stack@users.noreply.github.com>"


def _bot_commit(stack, path, content, message):
    """A commit on the work branch authored by the stack's shared identity."""
    f = stack.repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(content)
    git(stack.repo, "add", path)
    git(stack.repo, "commit", "-q", f"--author={BOT}", "-m", message)


def _feature_stack(stack, fix=SPDX + "VALUE = 42\n", depends=True):
    """Three patches: a module, its test, and a [Bugfix] whose test fails on the
    module before the fix; the bugfix declares Depends-On the first two."""
    assert stack.run("apply") == 0
    _bot_commit(stack, "vllm/feature.py", SPDX + "VALUE = 41\n",
                "[EPLB] Add feature\n\nThe feature the tests need.\n\n"
                "Upstream-Status: pending\nPorted-From: old.patch")  # fmt: skip
    _bot_commit(stack, "vllm/other.py", SPDX + "OTHER = 1\n",
                "[EPLB] Add other\n\nAn unrelated change that the fix does not need.\n\nUpstream-Status: pending")  # fmt: skip
    trailer = "Depends-On: eplb-add-feature\n" if depends else ""
    (stack.repo / "tests").mkdir(exist_ok=True)
    (stack.repo / "tests" / "test_feature.py").write_text(
        SPDX + "import pytest\n\nfrom vllm.feature import VALUE\n\n\n"
        "def test_value():\n    assert VALUE == 42\n\n\n"
        '@pytest.mark.skip(reason="needs a GPU")\n'
        '@pytest.mark.parametrize("n", [1, 2])\ndef test_on_gpu(n):\n    pass\n'
    )  # fmt: skip
    (stack.repo / "vllm" / "feature.py").write_text(fix)
    git(stack.repo, "add", "-A")
    git(stack.repo, "commit", "-q", f"--author={BOT}", "-m",
        "[Bugfix][EPLB] Fix feature value\n\nThe value must be 42.\n\nTested: "
        f"tests/test_feature.py.\n\nUpstream-Status: pending\n{trailer}"
        "RFC: docs/proto.md\nSigned-off-by: " + BOT)  # fmt: skip
    assert stack.run("export") == 0
    return "bugfix-eplb-fix-feature-value"


def test_depends_on_builds_on_the_named_pr_and_runs_its_tests(stack, capsys):
    need_ruff()
    slug = _feature_stack(stack)
    capsys.readouterr()
    rc = stack.run("upstream", slug, "--python", sys.executable)
    out = capsys.readouterr().out
    d = stack.root / "upstream" / slug
    checks = (d / "checks.txt").read_text()
    assert rc == 0, checks
    assert "depends on: eplb-add-feature.patch" in out and "[inferred]" not in out
    assert (
        "PASS     [applies] on stock vLLM 1.0.0 + eplb-add-feature (its Depends-On)"
        in checks
    )
    assert (
        "PASS     [tests] 1 passed, 2 skipped on stock vLLM 1.0.0 + eplb-add-feature + this PR"
        in checks
    )
    assert (
        "PASS     [reproduces] without the fix, on stock vLLM 1.0.0 + eplb-add-feature: 1 failed"
        in checks
    )
    mbox = _mbox(stack, slug).read_text()
    assert mbox.count("Subject: ") == 1 and "+VALUE = 42" in mbox
    # stack-only trailers and the bot's sign-off never reach a draft
    for gone in ("Depends-On", "RFC:", "Upstream-Status", "Signed-off-by"):
        assert gone not in mbox, gone
    body = (d / "body.md").read_text()
    assert (
        f"{'TRITON_INTERPRET=1'} CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu pytest -q tests/test_feature.py"
        in body
    )
    assert (
        "Tests of revision 1 on stock vLLM 1.0.0 + eplb-add-feature + this PR, CPU: **1 passed, 2 skipped**"
        in body
    )
    assert (
        "Without the fix (revision 1), on stock vLLM 1.0.0 + eplb-add-feature: **1 failed, 2 skipped** (`test_value`)"
        in body
    )
    assert "**Part of the RFC** drafted from `docs/proto.md`" in body
    assert "Skipped: 2 (needs a GPU)." in body
    assert "the 2 test(s) skipped there still need a GPU run" in body


def test_bugfix_whose_tests_pass_without_the_fix_fails(stack, capsys):
    need_ruff()
    # the "fix" changes nothing the test sees: VALUE is already 42 without it
    assert stack.run("apply") == 0
    _bot_commit(stack, "vllm/feature.py", SPDX + "VALUE = 42\n",
                "[EPLB] Add feature\n\nThe feature.\n\nUpstream-Status: pending")  # fmt: skip
    (stack.repo / "tests").mkdir()
    (stack.repo / "tests" / "test_feature.py").write_text(
        SPDX
        + "from vllm.feature import VALUE\n\n\ndef test_value():\n    assert VALUE == 42\n"
    )
    (stack.repo / "vllm" / "feature.py").write_text(SPDX + "VALUE = 42  # fixed\n")
    git(stack.repo, "add", "-A")
    git(stack.repo, "commit", "-q", "-m", "[Bugfix] Fix\n\nNo fix at all.\n\n"
        "Upstream-Status: pending\nDepends-On: eplb-add-feature")  # fmt: skip
    assert stack.run("export") == 0
    assert stack.run("upstream", "bugfix-fix", "--python", sys.executable) == 1
    checks = (stack.root / "upstream" / "bugfix-fix" / "checks.txt").read_text()
    assert "FAIL     [reproduces] the tests pass on" in checks


def test_depends_on_must_name_an_earlier_patch(stack, capsys):
    from vstack.lint import lint_series

    slug = _feature_stack(stack)
    patch = stack.root / "patches" / f"{slug}.patch"
    text = patch.read_text()
    patch.write_text(text.replace("Depends-On: eplb-add-feature", "Depends-On: nope"))
    found = [str(f) for f in lint_series(stack.root / "patches")]
    assert (
        f"patches/{slug}.patch:1: Depends-On: nope: no such patch in patches/series"
        in found
    )
    assert stack.run("upstream", slug, "--no-tests") == 1
    assert "Depends-On: nope is not an earlier patch" in capsys.readouterr().err
    first = stack.root / "patches" / "eplb-add-feature.patch"
    first.write_text(first.read_text().replace(
        "Upstream-Status: pending", f"Upstream-Status: pending\nDepends-On: {slug}"))  # fmt: skip
    found = [str(f) for f in lint_series(stack.root / "patches")]
    assert (
        f"patches/eplb-add-feature.patch:1: Depends-On: {slug} comes after it in patches/series"
        in found
    )


def test_a_patch_that_needs_another_does_not_stand_alone(stack, capsys):
    """Without Depends-On, a patch that applies only on an earlier one gets it as
    an inferred dependency (named, not carried), and says how to declare it."""
    need_ruff()
    _feature_stack(stack, depends=False)
    capsys.readouterr()
    assert stack.run("upstream", "bugfix-eplb-fix-feature-value", "--no-tests") == 0
    out = capsys.readouterr().out
    assert "depends on: eplb-add-feature.patch" in out and "[inferred]" in out
    assert "eplb-add-other" not in out


# ---------------------------------------------------------------- sign-off


def test_signoff_makes_a_sendable_copy_and_keeps_upstream_unsigned(stack, capsys):
    """Defect 4 of issue 28: --signoff (and --no-tests) rewrote upstream/<patch>/'s
    title, body and checks: hand edits and the recorded test evidence were lost."""
    need_ruff()
    slug = _feature_stack(stack)
    # the recording run: tests run, unsigned, upstream/<patch>/ written
    assert stack.run("upstream", slug, "--python", sys.executable) == 0
    d = stack.root / "upstream" / slug
    (d / "title.txt").write_text("[Bugfix][EPLB] My better title\n")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert "1 passed, 2 skipped" in before["body.md"].decode()
    capsys.readouterr()
    person = "Ada Lovelace <ada@lovelace.dev>"
    assert stack.run("upstream", slug, "--no-tests", "--signoff", person) == 0
    out = capsys.readouterr().out
    sendable = stack.root / ".vstack" / "outgoing" / slug / "v1.mbox"
    assert f"sendable: {sendable} (signed off by {person})" in out
    text = sendable.read_text()
    # the DCO app wants the author's own sign-off: the bot author becomes the person
    assert f"From: {person}" in text and f"Signed-off-by: {person}" in text
    assert text.count("Signed-off-by:") == 1 and "noreply" not in text
    assert (
        f"  author: {person} replaces {BOT} (the stack's shared identity) on this "
        "PR's commit and 1 commit(s) of the PRs it depends on\n" in out
    )
    assert (
        "PASS     [dco] every commit (1) signed off by its author"
        in (sendable.parent / "checks.txt").read_text()
    )
    # nothing in upstream/ changed: the hand edit and the test evidence stay
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert f"upstream/{slug}/ unchanged (--signoff" in out
    # the copy to send takes upstream/'s title and body (this is its revision)
    assert (sendable.parent / "title.txt").read_bytes() == before["title.txt"]
    assert (sendable.parent / "body.md").read_bytes() == before["body.md"]
    assert "--title '[Bugfix][EPLB] My better title'" in out
    # git am without -k strips the [Bugfix][EPLB] tags from the commit subject
    assert f"git -C <your vLLM clone> am -k {sendable}\n" in out
    # the copy says whose results its (recorded) body states, and what was skipped
    copy = (sendable.parent / "checks.txt").read_text()
    assert (f"NOTE     [body] body.md is upstream/{slug}/body.md: its results are "
            f"revision 1's recorded run (upstream/{slug}/checks.txt), this run ran no "
            "tests\n") in copy  # fmt: skip
    assert "result: all checks that ran passed (2 skipped: pre-commit, tests)\n" in copy
    assert "all checks passed" not in copy
    # --no-tests alone writes only under .vstack/outgoing/ too
    assert stack.run("upstream", slug, "--no-tests") == 0
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    # the environment variable works the same way
    capsys.readouterr()
    os.environ["VSTACK_SIGNOFF"] = "Grace Hopper <grace@hopper.dev>"
    try:
        assert stack.run("upstream", slug, "--python", sys.executable) == 0
    finally:
        del os.environ["VSTACK_SIGNOFF"]
    assert "From: Grace Hopper <grace@hopper.dev>" in sendable.read_text()
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


@pytest.mark.parametrize(
    "who,why",
    [
        (BOT, "is a bot or tool"),
        ("Ann Lee <ann@example.com>", "placeholder address"),
        ("Ann Lee <noreply@lee.dev>", "no-reply or shared address"),
        ("Your Name <you@lee.dev>", "placeholder name"),
        ("dependabot[bot] <49699333+dependabot[bot]@users.noreply.github.com>", "bot"),
        ("Name <email>", "is not an identity"),
        ("Ubuntu <ubuntu@ip-10-0-0-1.ec2.internal>", "is a machine's address"),
        ("Ann Lee <user@mbp.local>", "is a machine's address"),
    ],
)
def test_signoff_refuses_bots_and_placeholders(stack, capsys, who, why):
    slug = _feature_stack(stack)
    capsys.readouterr()
    assert stack.run("upstream", slug, "--no-tests", "--signoff", who) == 1
    err = capsys.readouterr().err
    assert why in err and len(err.strip().splitlines()) == 1
    assert not (stack.root / "upstream" / slug).exists()


def test_identity_rules():
    from vstack.identity import parse, refusal

    assert refusal(parse("Ada Lovelace <ada@lovelace.dev>")) is None
    # GitHub's per-user private address is a person's own
    assert refusal(parse("Ada L <12345+ada@users.noreply.github.com>")) is None
    assert refusal(parse("X <maintainers@users.noreply.a-seed-1.example>"))
    assert refusal(parse("vstack <vstack@localhost>"))
    assert parse("no email") is None and parse("A <a>") is None


@pytest.mark.parametrize(
    "text",
    [
        "Ann Lee\n\nCo-authored-by: Nobody\nSigned-off-by: Mallory <mallory@corp.io>",
        "Ann Lee <ann@corp.io>\nSigned-off-by: Mallory <mallory@corp.io>",
        "Ann\rLee <ann@corp.io>",
        "Ann\x1bLee <ann@corp.io>",
        "Ann Lee <you@domain>",
        "Full Name <you@domain>",
        "Your Full Name <a@b.org>",
        "vLLM-EPLB-Stack <ann@corp.io>",
        "vllm_eplb_stack <ann@corp.io>",
        "root <root@localhost.localdomain>",
        "Ann Lee <root@corp.io>",
        "test <test@test.com>",
        "TODO <todo@corp.io>",
        "FIXME <ann@corp.io>",
        "dependabot[bot] <ann@corp.io>",
        "vLLMEPLBStack <ann@corp.io>",
        "Ann Lee <xxx@corp.io>",
        "Ann Lee <ann@a@corp.io>",
        "Ann Lee <ann@domain>",
        "ubuntu <ubuntu@ip-10-0-0-1.ec2.internal>",
        "Ann Lee <ann@corp.local>",
        "Ann Lee <ann@laptop.lan>",
        "Ann Lee <ann@10.0.0.7>",
        "Ann Lee <ann@[::1]>",
        "Ann Lee <ann@buildbox.(none)>",
    ],
)
def test_identity_refuses_injection_and_placeholders(text):
    """A newline in --signoff added trailer lines of its own to the mbox; vstack's
    own hint text, the shared author hyphenated, root@localhost.localdomain,
    test@test.com and TODO were taken as a person."""
    from vstack.errors import VstackError
    from vstack.identity import checked, parse, refusal

    ident = parse(text)
    assert ident is None or refusal(ident), text
    with pytest.raises(VstackError) as e:
        checked(text, "--signoff")
    assert "\n" not in str(e.value) and "\r" not in str(e.value)
    # a real person stays accepted
    assert refusal(parse("Ann Lee <ann.lee@corp.io>")) is None
    assert refusal(parse("Xavier Todorov <x.todorov@corp.io>")) is None


@pytest.mark.parametrize(
    "text",
    [
        "Kenji Todo <kenji.todo@gmail.com>",
        "Xiao Xu <xx@alibaba-inc.com>",
        "Li Xx <li@corp.io>",
        "Anna Smith <anna.smith@mail.com>",
        "Anna Smith <anna@email.com>",
        "Jan Bot <jan.bot@tudelft.nl>",
        "John Doe <john.doe@corp.io>",
        "Ann Lee <ann@cafe.de>",
        "Ann Lee <ann@node1>",
    ],
)
def test_identity_accepts_real_people_with_placeholder_like_parts(text):
    """Only whole placeholders are refused: surname Todo, initials xx, mail.com
    users, surname Bot were refused as placeholders. (A corp.local address is a
    machine's or an intranet's, which no one outside can write to: refused since
    issue 29's review; a dotless domain git never guesses: kept.)"""
    from vstack.identity import parse, refusal

    assert refusal(parse(text)) is None, text


def test_signoff_never_replaces_an_author_it_refuses(stack, capsys):
    """--signoff replaced any refused author (a real one, under the old rules)
    with the submitter and dropped their sign-off: only the stack's shared author
    is replaced; any other is an error."""
    need_ruff()
    slug = _feature_stack(stack)
    patch = stack.root / "patches" / f"{slug}.patch"
    real = "Kenji Todo <kenji.todo@gmail.com>"
    text = patch.read_text().replace(f"From: {BOT}", f"From: {real}")
    patch.write_text(text.replace(f"Signed-off-by: {BOT}", f"Signed-off-by: {real}"))
    capsys.readouterr()
    person = "Ada Lovelace <ada@lovelace.dev>"
    assert stack.run("upstream", slug, "--no-tests", "--signoff", person) == 0
    mbox = stack.root / ".vstack" / "outgoing" / slug / "v1.mbox"
    out = mbox.read_text()
    assert f"From: {real}" in out and f"Signed-off-by: {real}" in out
    assert f"Signed-off-by: {person}" in out
    patch.write_text(text.replace(f"From: {real}", "From: Helper [bot] <h@corp.io>"))
    capsys.readouterr()
    assert stack.run("upstream", slug, "--no-tests", "--signoff", person) == 1
    err = capsys.readouterr().err
    assert "never replaces an author" in err and "Helper [bot]" in err


def test_bare_signoff_reads_only_name_and_email_from_git_config(stack, capsys, tmp_path, monkeypatch):  # fmt: skip
    need_ruff()
    slug = _feature_stack(stack)
    cfg = tmp_path / "gitconfig"
    cfg.write_text("[user]\n\tname = Placeholder\n\temail = p@example.com\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    assert stack.run("upstream", slug, "--no-tests", "--signoff") == 1
    assert "placeholder address" in capsys.readouterr().err
    cfg.write_text(
        "[user]\n\tname = Ada Lovelace\n\temail = ada@lovelace.dev\n"
        "[format]\n\tsignOff = true\n\tnumbered = true\n[diff]\n\tnoprefix = true\n"
    )
    assert stack.run("upstream", slug, "--no-tests", "--signoff") == 0
    text = (stack.root / ".vstack" / "outgoing" / slug / "v1.mbox").read_text()
    assert text.count("Signed-off-by: Ada Lovelace <ada@lovelace.dev>") == 1
    # the rest of the user's configuration shapes nothing
    assert "diff --git a/vllm/feature.py b/vllm/feature.py" in text
    assert "[PATCH 1/1]" not in text


def test_lint_rejects_bot_signoff_and_needs_none(stack):
    from vstack.lint import lint_series

    _feature_stack(stack)
    found = "\n".join(str(f) for f in lint_series(stack.root / "patches"))
    assert f"Signed-off-by: {BOT}: 'vLLM EPLB Stack' is a bot or tool" in found
    # the two patches without a sign-off are fine
    assert "eplb-add-feature.patch" not in found and "eplb-add-other.patch" not in found


# ---------------------------------------------------------------- revisions, --all


def test_earlier_revision_is_regenerated_from_git(stack, capsys):
    need_ruff()
    slug = _feature_stack(stack)
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n")
    assert stack.run("upstream", slug, "--python", sys.executable) == 0
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "v1")
    v1 = _mbox(stack, slug).read_bytes()
    # the fix changes: revision 2
    assert stack.run("apply") == 0
    (stack.repo / "vllm" / "feature.py").write_text(SPDX + "VALUE = 6 * 7\n")
    git(stack.repo, "commit", "-q", "-a", "--amend", "--no-edit")
    assert stack.run("export") == 0
    assert stack.run("upstream", slug, "--python", sys.executable) == 0
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "v2")
    assert (stack.root / "upstream" / slug / "range-diff-v1-v2.txt").is_file()
    # from a fresh clone: nothing of .vstack, the patch files only in git history
    clone = stack.root.parent / "clone"
    git(stack.root.parent, "clone", "-q", str(stack.root), str(clone))
    from vstack.cli import main

    capsys.readouterr()
    assert main(["--root", str(clone), "upstream", slug, "--revision", "1"]) == 0
    assert "revision 1 of" in capsys.readouterr().out
    assert (
        clone / ".vstack" / "outgoing" / slug / "v1.unsigned.mbox"
    ).read_bytes() == v1
    person = "Ada Lovelace <ada@lovelace.dev>"
    assert main(["--root", str(clone), "upstream", slug, "--revision", "1",
                 "--signoff", person]) == 0  # fmt: skip
    signed = (clone / ".vstack" / "outgoing" / slug / "v1.mbox").read_text()
    assert f"Signed-off-by: {person}" in signed and "+VALUE = 42" in signed


def test_all_writes_every_draft_rfc_and_index(stack, capsys):
    need_ruff()
    slug = _feature_stack(stack)
    toml = stack.root / "stack.toml"
    toml.write_text(toml.read_text() + '\n[upstream]\nrfcs = ["docs/other.md"]\n')
    stale = stack.root / "upstream" / "gone-patch"
    stale.mkdir(parents=True)
    capsys.readouterr()
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    out = capsys.readouterr().out
    assert "RFC docs/other.md does not exist yet: no RFC issue draft written" in out
    assert "RFC docs/proto.md does not exist yet" in out and "(1 PR(s) name it)" in out
    assert not stale.exists()
    up = stack.root / "upstream"
    assert sorted(p.name for p in up.iterdir()) == [
        slug,
        "eplb-add-feature",
        "eplb-add-other",
        "index.md",
    ]
    index = (up / "index.md").read_text()
    assert (
        f"| 3 | `{slug}` | 1 | 2 | #1 | 1 passed, 2 skipped | pass (1 skipped: pre-commit), unsigned"
        in index
    ), index
    (stack.root / "docs").mkdir()
    (stack.root / "docs" / "proto.md").write_text(
        "# Async protocol\n\n## Motivation\n\nDecode must not wait.\n\n"
        "## Protocol\n\nWorkers vote.\n"
    )
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    rfc = up / "rfc-proto"
    assert (rfc / "title.txt").read_text() == "[RFC]: Async protocol\n"
    issue = (rfc / "issue.md").read_text()
    assert "### Motivation.\n\nDecode must not wait." in issue
    assert "#### Protocol\n\nWorkers vote." in issue
    assert (
        f"1. `upstream/{slug}/`: [Bugfix][EPLB] Fix feature value (depends on eplb-add-feature)"
        in issue
    )
    assert (
        "PASS     [rfc] implements the RFC drafted from docs/proto.md"
        in (up / slug / "checks.txt").read_text()
    )


def test_all_removes_only_committed_drafts_it_wrote(stack, capsys):
    """upstream --all rmtree'd every folder under upstream/ that no patch makes,
    uncommitted notes included, saying "its revisions stay in git history"."""
    need_ruff()
    slug = _feature_stack(stack)
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n")
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    up = stack.root / "upstream"
    shutil.copytree(up / slug, up / "old-committed")
    shutil.copytree(up / slug, up / "old-edited")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "drafts")
    (up / "old-edited" / "body.md").write_text("my edits\n")
    shutil.copytree(up / slug, up / "old-uncommitted")
    (up / "my-review-notes").mkdir()
    (up / "my-review-notes" / "notes.md").write_text("mine\n")
    (up / "empty").mkdir()
    capsys.readouterr()
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    out = capsys.readouterr().out
    assert not (up / "old-committed").exists() and not (up / "empty").exists()
    assert "removed upstream/old-committed/" in out and "stay in git history" in out
    assert (up / "my-review-notes" / "notes.md").read_text() == "mine\n"
    assert (up / "old-edited" / "body.md").read_text() == "my edits\n"
    assert (up / "old-uncommitted" / "meta.json").is_file()
    assert "kept upstream/my-review-notes/" in out and "did not write it" in out
    assert "kept upstream/old-edited/" in out and "not committed in git" in out
    assert "kept upstream/old-uncommitted/" in out


@pytest.mark.parametrize(
    "data, says",
    [
        ('{"revisions": [{"revision": 1, "di', "is not valid JSON"),
        ("<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> other\n", "merge conflict markers"),
        ('{"revisions": 3}', "is not a draft's record"),
        ("[]", "is not a draft's record"),
        (b"\xff\xfe", "is not valid JSON"),
    ],
)
def test_a_torn_or_conflicted_meta_json_is_one_line(stack, capsys, data, says):
    need_ruff()
    _feature_stack(stack)
    slug = "eplb-add-feature"  # no tests of its own: a quick recording run
    assert stack.run("upstream", slug) == 0
    meta = stack.root / "upstream" / slug / "meta.json"
    meta.write_bytes(data if isinstance(data, bytes) else data.encode())
    capsys.readouterr()
    assert stack.run("upstream", slug) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vstack: error: "), err
    assert str(meta) in err[0] and says in err[0], err[0]
    assert not list(meta.parent.glob(".*.tmp"))


def _reword(stack, subject_part: str, new_body: str) -> None:
    """Change the message (not the diff) of the work branch's commit whose subject
    holds subject_part, then export: its patch file changes, the diff does not."""
    assert stack.run("apply") == 0
    n = len([ln for ln in (stack.root / "patches" / "series").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")])  # fmt: skip
    shas = git(stack.repo, "rev-list", "--reverse", f"HEAD~{n}..HEAD").split()
    subjects = [git(stack.repo, "log", "-1", "--format=%s", s).strip() for s in shas]
    k = next(i for i, s in enumerate(subjects) if subject_part in s)
    msg = git(stack.repo, "log", "-1", "--format=%B", shas[k])
    first, _, rest = msg.partition("\n\n")
    _, _, trailers = rest.strip().rpartition("\n\n")
    git(stack.repo, "checkout", "-q", shas[k])
    git(
        stack.repo,
        "commit",
        "-q",
        "--amend",
        "-m",
        f"{first}\n\n{new_body}\n\n{trailers}\n",
    )
    for s in shas[k + 1 :]:
        git(stack.repo, "cherry-pick", s)
    git(stack.repo, "checkout", "-q", "-B", "work")
    assert stack.run("export") == 0


def test_check_names_each_stale_draft_and_the_command_that_fixes_it(stack, capsys):
    """upstream/ recorded from an older patches/ (a patch reworded after its draft
    was recorded, a patch dropped from the series) passed every check; `vstack
    upstream --check` names each stale draft and index row, and a recording run
    makes it pass again, also for a draft whose own mbox did not change."""
    need_ruff()
    slug = _feature_stack(stack)
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n")
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "drafts")
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 0
    assert (
        "upstream/ matches patches/ and the pin (3 draft(s)" in capsys.readouterr().out
    )
    # the feature patch's message changes: its draft and the bugfix that depends
    # on it are stale (the bugfix's own mbox is the same)
    _reword(stack, "Add feature", "The feature the tests need, reworded.")
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 1
    out = capsys.readouterr().out.splitlines()
    feature = [ln for ln in out if ln.startswith("upstream/eplb-add-feature/: stale")]
    assert len(feature) == 1, out
    assert "another version of patches/eplb-add-feature.patch (blob" in feature[0]
    assert feature[0].endswith(
        "`scripts/vstack upstream eplb-add-feature` re-records it (runs its tests)"
    )
    fix = [ln for ln in out if ln.startswith(f"upstream/{slug}/: stale")]
    assert len(fix) == 1 and "(a patch it depends on)" in fix[0], out
    assert not any("eplb-add-other" in ln for ln in out), out
    assert out[-1].startswith("vstack upstream --check: 2 stale record(s)")
    assert "scripts/vstack upstream --all" in out[-1]
    # one draft re-recorded: the index still says its old revision
    assert stack.run("upstream", "eplb-add-feature") == 0
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 1
    out = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("upstream/index.md row 1 (eplb-add-feature): rev '1', "
                             "its draft says '2'") for ln in out), out  # fmt: skip
    assert stack.run("upstream", "--all", "--python", sys.executable) == 0
    meta = json.loads((stack.root / "upstream" / slug / "meta.json").read_text())
    assert [r["revision"] for r in meta["revisions"]] == [1]  # same mbox, same revision
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 0, capsys.readouterr().out
    # a patch leaves the series: its committed draft is named, and how it goes
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "drafts again")
    series = stack.root / "patches" / "series"
    series.write_text(series.read_text().replace("eplb-add-other.patch\n", ""))
    (stack.root / "patches" / "eplb-add-other.patch").unlink()
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 1
    out = capsys.readouterr().out
    assert ("upstream/eplb-add-other/: stale: no patch of patches/series makes it any "
            "more: `scripts/vstack upstream --all` removes it") in out  # fmt: skip
    assert "upstream/index.md lists eplb-add-other" in out
    # --check runs nothing else
    capsys.readouterr()
    assert stack.run("upstream", "--check", "--all") == 1
    assert "--check reads upstream/ only: drop --all" in capsys.readouterr().err


def test_check_pure_rules():
    from vstack.upstreamcheck import draft_problem, index_problems

    pin = {"version": "1.0", "commit": "gabc", "wheel": "w.whl", "sha256": "s"}
    rev = {"revision": 3, "digest": "d", "pin": pin, "depends_on": ["a.patch"],
           "patches": [{"name": "a.patch", "blob": "1" * 40},
                       {"name": "b.patch", "blob": "2" * 40}]}  # fmt: skip
    meta = {"revisions": [rev]}
    blobs = {"a.patch": "1" * 40, "b.patch": "2" * 40}
    assert draft_problem("b", meta, blobs, pin, "draft b v3: [EPLB] B") is None
    said = draft_problem("b", meta, blobs, pin, "draft b v2: [EPLB] B")
    assert said.startswith("checks.txt is not revision 3's"), said
    said = draft_problem("b", meta, {**blobs, "b.patch": "3" * 40}, pin, None)
    assert (
        "another version of patches/b.patch (blob 222222222222, now 333333333333)"
        in said
    )
    assert "depends on" not in said
    said = draft_problem("b", meta, {**blobs, "a.patch": "4" * 40}, pin, None)
    assert "patches/a.patch (a patch it depends on)" in said
    said = draft_problem("b", meta, {"b.patch": "2" * 40}, pin, None)
    assert "patches/a.patch (a patch it depends on), which is no longer" in said
    said = draft_problem(
        "b", meta, blobs, {**pin, "version": "1.1", "wheel": "n.whl"}, None
    )
    assert "made on vLLM 1.0 (w.whl), the pin is now 1.1 (n.whl)" in said
    said = draft_problem(
        "b", {"revisions": [{"revision": 1, "digest": "d"}]}, blobs, pin, None
    )
    assert "records no patch files" in said
    index = ("| # | draft | rev | non-test lines | depends on | tests on its base | checks |\n"
             "|---|---|---|---|---|---|---|\n"
             "| 1 | `a` | 1 | 4 | stock | 2 passed | pass, unsigned |\n"
             "| 2 | `b` | 3 | 9 | #1 | not run | pass, unsigned |\n")  # fmt: skip
    want = [{"slug": "a", "rev": 1, "non_test": "4", "deps": "stock", "tests": "2 passed"},
            {"slug": "b", "rev": 3, "non_test": "9", "deps": "#1", "tests": None}]  # fmt: skip
    assert index_problems(index, want) == []
    want[1]["rev"] = 4
    assert index_problems(index, want) == [
        "upstream/index.md row 2 (b): rev '3', its draft says '4'"
    ]
    assert index_problems(index, want[:1]) == [
        "upstream/index.md lists b, which no patch of the series makes"
    ]
    assert index_problems(index, [*want, {**want[0], "slug": "c"}]) == [
        "upstream/index.md lacks c"
    ]


def test_an_ambiguous_patch_name_says_so(stack, capsys):
    _feature_stack(stack)
    capsys.readouterr()
    assert stack.run("upstream", "eplb-add", "--no-tests") == 1
    err = capsys.readouterr().err.strip()  # one line, before any apply
    assert err == ("vstack: error: eplb-add is ambiguous: matches 2 patches "
                   "(eplb-add-feature, eplb-add-other): give more of the name"), err  # fmt: skip
    assert stack.run("upstream", "eplb-add", "--revision", "1") == 1
    assert "eplb-add is ambiguous: matches 2 patches" in capsys.readouterr().err
    assert stack.run("upstream", "no-such", "--no-tests") == 1
    assert "no-such is not in patches/series (" in capsys.readouterr().err


def test_check_without_drafts_and_with_a_torn_meta_json(stack, capsys):
    _feature_stack(stack)
    capsys.readouterr()
    assert stack.run("upstream", "--check") == 0
    assert "no upstream/ folder: no draft recorded" in capsys.readouterr().out
    torn = stack.root / "upstream" / "eplb-add-feature" / "meta.json"
    torn.parent.mkdir(parents=True)
    torn.write_text('{"revisions": [')
    assert stack.run("upstream", "--check") == 1
    out = capsys.readouterr().out
    assert f"upstream/eplb-add-feature/: {torn} is not valid JSON" in out, out
    assert (
        "upstream/eplb-add-other/: no draft recorded: `scripts/vstack upstream " in out
    )
    assert (
        "upstream/index.md: missing: `scripts/vstack upstream --all` writes it" in out
    )


def test_ci_runs_the_upstream_check():
    run = (ROOT / ".ci" / "run").read_text()
    assert "scripts/vstack upstream --check" in run
