"""vstack check --per-patch on a synthetic series: the first failing prefix is named."""

from __future__ import annotations

import sys

MSG = "{}\n\nA patch for the per-patch check test.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


def _series(stack, second_test_body):
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/feature.py", "VALUE = 41\n", MSG.format("[Test] Feature")
    )
    stack.commit_on_work(
        "tests/test_feature.py",
        "from vllm.feature import VALUE\n\ndef test_value():\n    assert VALUE == 41\n",
        MSG.format("[Test] Feature test"),
    )
    stack.commit_on_work("vllm/feature.py", "VALUE = 42\n", MSG.format("[Test] Bump"))
    stack.commit_on_work(
        "vllm/broken.py", second_test_body, MSG.format("[Test] Broken")
    )
    assert stack.run("export") == 0


def test_per_patch_names_first_failing_prefix(stack, capsys):
    # prefix 3 changes VALUE: the test added by prefix 2 fails from there on
    _series(stack, "X = 1\n")
    capsys.readouterr()
    assert stack.run("check", "--per-patch", "--python", sys.executable) == 1
    cap = capsys.readouterr()
    assert "[2/4] test-feature-test.patch" in cap.out and "1 passed" in cap.out
    assert "tests failed" in cap.err
    assert "first failing prefix: 3 (test-bump.patch)" in cap.err


def test_per_patch_syntax_error_and_import(stack, capsys):
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/good.py", "import vllm.config\n", MSG.format("[Test] Good")
    )
    stack.commit_on_work("vllm/bad.py", "def f(:\n", MSG.format("[Test] Bad"))
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("check", "--per-patch", "--python", sys.executable) == 1
    cap = capsys.readouterr()
    assert "imports ok: vllm.good" in cap.out
    assert "vllm/bad.py:1: does not compile" in cap.err
    assert "first failing prefix: 2 (test-bad.patch)" in cap.err


def test_per_patch_import_failure(stack, capsys):
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/needs.py", "import not_a_module_anywhere\n", MSG.format("[Test] Needs")
    )
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("check", "--per-patch", "--python", sys.executable) == 1
    err = capsys.readouterr().err
    assert "import of vllm.needs failed: ModuleNotFoundError" in err
    assert "first failing prefix: 1 (test-needs.patch)" in err


def test_per_patch_all_pass(stack, capsys):
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/feature.py", "VALUE = 41\n", MSG.format("[Test] Feature")
    )
    assert stack.run("export") == 0
    assert stack.run("check", "--per-patch", "--python", sys.executable) == 0
    assert "all 1 prefix(es) pass" in capsys.readouterr().out
