"""Base materialisation, apply and export on a synthetic wheel."""

from __future__ import annotations

import subprocess

from vstack_testlib import git


def test_base_from_wheel_skips_compiled_and_is_reused(stack, capsys):
    assert stack.run("base") == 0
    files = git(stack.repo, "ls-tree", "-r", "--name-only", "base/1.0.0").split()
    assert "vllm/distributed/eplb/state.py" in files
    assert "vllm/_C.abi3.so" not in files
    assert not any(".dist-info/" in f for f in files)
    first = git(stack.repo, "rev-parse", "base/1.0.0").strip()
    capsys.readouterr()
    assert stack.run("base") == 0
    err = capsys.readouterr().err
    assert "importing" not in err  # cache hit: no second import
    assert git(stack.repo, "rev-parse", "base/1.0.0").strip() == first


def test_base_commit_is_deterministic(stack, tmp_path):
    assert stack.run("base") == 0
    first = git(stack.repo, "rev-parse", "base/1.0.0").strip()
    subprocess.run(["rm", "-rf", str(stack.root / ".vstack")], check=True)
    assert stack.run("base") == 0
    assert git(stack.repo, "rev-parse", "base/1.0.0").strip() == first


def _edit_and_export(stack):
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    stack.commit_on_work(
        "tests/distributed/test_new.py",
        "def test_x():\n    assert 1 + 1 == 2\n",
        "[EPLB] Add a test\n\nWhy: coverage.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    assert stack.run("export") == 0


def test_export_writes_deterministic_series_and_round_trips(stack):
    _edit_and_export(stack)
    series = (stack.root / "patches/series").read_text().split("\n")
    names = [ln for ln in series if ln and not ln.startswith("#")]
    assert names == ["eplb-change-line-5.patch", "eplb-add-a-test.patch"]
    text = (stack.root / "patches" / names[0]).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [EPLB] Change line 5\n" in text
    assert "Upstream-Status: pending" in text
    assert " files changed" not in text and " file changed" not in text  # no stat
    assert "\n-- \n" not in text  # no signature
    idx = [ln for ln in text.splitlines() if ln.startswith("index ")]
    assert idx and all(len(ln.split()[1].split("..")[0]) == 40 for ln in idx)
    before = stack.snapshot()
    assert stack.run("export") == 0
    assert stack.snapshot() == before
    assert stack.run("export", "--check") == 0
    # apply again from patches/: same commits, so export is still a no-op
    assert stack.run("apply") == 0
    assert stack.run("export") == 0
    assert stack.snapshot() == before


def test_apply_never_modifies_patches_and_reports_per_patch(stack, capsys):
    _edit_and_export(stack)
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("apply") == 0
    out = capsys.readouterr().out
    assert "[1/2] clean    eplb-change-line-5.patch" in out
    assert "[2/2] clean    eplb-add-a-test.patch" in out
    assert stack.snapshot() == before
    assert "line five" in (stack.repo / "vllm/distributed/eplb/state.py").read_text()


def test_export_check_lists_files_that_would_change(stack, capsys):
    _edit_and_export(stack)
    stack.commit_on_work(
        "vllm/config.py",
        "A = 10\n",
        "[Misc] Tweak\n\nWhy: x.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("export", "--check") == 1
    err = capsys.readouterr().err
    assert "patches/misc-tweak.patch" in err and "patches/series" in err
    assert stack.snapshot() == before


def test_export_check_without_work_branch_round_trips(stack):
    _edit_and_export(stack)
    subprocess.run(["rm", "-rf", str(stack.root / ".vstack")], check=True)
    assert stack.run("export", "--check") == 0


def test_apply_refuses_to_drop_unexported_commits(stack, capsys):
    _edit_and_export(stack)
    stack.commit_on_work(
        "vllm/config.py",
        "A = 10\n",
        "[Misc] Unexported\n\nWhy.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    tip = git(stack.repo, "rev-parse", "work").strip()
    assert stack.run("apply") == 1
    assert "run `vstack export` first" in capsys.readouterr().err
    assert git(stack.repo, "rev-parse", "work").strip() == tip
    assert stack.run("apply", "--force") == 0
    backups = git(
        stack.repo, "for-each-ref", "--format=%(objectname)", "refs/vstack/backup/"
    ).split()
    assert tip in backups


def test_apply_failure_names_patch_file_and_hunk(stack, capsys):
    _edit_and_export(stack)
    bad = stack.root / "patches" / "eplb-change-line-5.patch"
    # Make the patch's context disagree with the base: it can no longer apply.
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("apply") == 1
    cap = capsys.readouterr()
    out = cap.out + cap.err
    assert "conflict" in out and "eplb-change-line-5.patch" in out
    assert "vllm/distributed/eplb/state.py" in out
    assert "hunk -2,7 +2,7 failed" in out
    assert "git am" in out
    assert stack.snapshot() == before
    assert (stack.repo / ".git" / "rebase-apply").exists()  # left for inspection


def test_apply_refuses_dirty_work_tree(stack, capsys):
    assert stack.run("apply") == 0
    (stack.repo / "vllm/config.py").write_text("dirty\n")
    capsys.readouterr()
    assert stack.run("apply") == 1
    err = capsys.readouterr().err
    assert "uncommitted changes" in err and "vllm/config.py" in err
    assert (stack.repo / "vllm/config.py").read_text() == "dirty\n"


def _third_patch(stack):
    """_edit_and_export plus a third patch, after the one that will be broken."""
    _edit_and_export(stack)
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/config.py",
        "A = 1\nB = 20\nC = 3\n",
        "[EPLB] Tune B\n\nWhy: B must be twenty.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    assert stack.run("export") == 0
    names = [
        ln
        for ln in (stack.root / "patches/series").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert len(names) == 3
    return names


def test_export_after_a_failed_apply_deletes_nothing(stack, capsys):
    names = _third_patch(stack)
    bad = stack.root / "patches" / names[0]
    good = bad.read_bytes()
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    before = stack.snapshot()
    assert stack.run("apply") == 1
    capsys.readouterr()
    # while git am waits, and after the `git am --abort` a user tries next
    assert stack.run("export") == 1
    git(stack.repo, "am", "--abort")
    for args in (["export"], ["export", "--check"]):
        assert stack.run(*args) == 1
        err = capsys.readouterr().err
        assert f"stopped at patch 1/3 ({names[0]})" in err
        assert "would delete 3 patch(es) from patches/" in err
    assert stack.snapshot() == before
    # fixed patch, fresh apply: export is possible again and changes nothing
    bad.write_bytes(good)
    assert stack.run("apply") == 0
    assert stack.run("export") == 0
    before[f"patches/{names[0]}"] = good
    assert stack.snapshot() == before


def test_apply_continue_applies_the_rest_and_export_keeps_every_patch(stack, capsys):
    names = _third_patch(stack)
    bad = stack.root / "patches" / names[0]
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    assert stack.run("apply") == 1
    # the user resolves the stopped patch by hand, then continues
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 5\n", "line five\n"))
    capsys.readouterr()
    assert stack.run("apply", "--continue") == 0
    out = capsys.readouterr().out
    assert f"[1/3] resolved {names[0]}" in out
    assert f"[2/3] clean    {names[1]}" in out and f"[3/3] clean    {names[2]}" in out
    assert stack.run("export") == 0
    after = [
        ln
        for ln in (stack.root / "patches/series").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert after == names
    assert " line 4\n" in bad.read_text()  # the resolution, exported
    assert stack.run("export", "--check") == 0


def test_apply_stops_at_a_patch_that_leaves_no_change(stack, capsys):
    """git am -3 commits nothing for a patch whose change is already there: apply
    must stop instead of dropping the patch, which export would then delete."""
    _edit_and_export(stack)
    patches = stack.root / "patches"
    first = (patches / "eplb-change-line-5.patch").read_text()
    (patches / "eplb-change-line-5-again.patch").write_text(
        first.replace(
            "Subject: [EPLB] Change line 5", "Subject: [EPLB] Change line 5 again"
        )
    )
    series = patches / "series"
    series.write_text(series.read_text() + "eplb-change-line-5-again.patch\n")
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("apply") == 1
    cap = capsys.readouterr()
    assert "[3/3] empty    eplb-change-line-5-again.patch" in cap.out
    assert "the base already has all of it" in cap.out
    assert stack.run("export") == 1
    assert (
        "stopped at patch 3/3 (eplb-change-line-5-again.patch)"
        in capsys.readouterr().err
    )
    assert stack.snapshot() == before


def test_export_warns_of_uncommitted_edits_with_their_count(stack, capsys):
    """Issue 29: edits left uncommitted in the work tree: export said "0 file(s) in
    patches/ changed" and nothing else a user would notice; now one line with the
    count (tracked edits and new files alike), for export and export --check."""
    assert stack.run("apply") == 0
    assert stack.run("export") == 0  # patches/series in export's own form
    (stack.repo / "vllm/config.py").write_text("edited, not committed\n")
    (stack.repo / "vllm/new_module.py").write_text("X = 1\n")
    capsys.readouterr()
    assert stack.run("export") == 0
    cap = capsys.readouterr()
    warn = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert warn == [
        f"vstack: warning: 2 file(s) in {stack.repo} have uncommitted changes that "
        f"export leaves out: commit them on branch 'work' first (git -C {stack.repo} "
        f"status)"
    ]
    assert "0 file(s) in patches/ changed" in cap.out
    assert stack.run("export", "--check") == 0
    assert "2 file(s)" in capsys.readouterr().err
    # committed: no warning
    git(stack.repo, "checkout", "--", "vllm/config.py")
    (stack.repo / "vllm/new_module.py").unlink()
    assert stack.run("export") == 0
    assert "warning" not in capsys.readouterr().err
