"""Ways a hostile user lost work through the work branch, the journal and a
stopped rebase, each with the refusal (or backup) that replaces it."""

from __future__ import annotations

import os
import signal

import pytest
from vstack_testlib import git, make_two_wheels, make_wheel, sha256
from vstack_testlib import numbered_lines as _lines

import vstack.apply as A
from vstack import fsutil, gitutil, journal

MSG = "[EPLB] Edit {x}\n\nOur change to {x}.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


@pytest.fixture
def three(stack):
    """Three one-line patches (a, b, c) of the base's files, applied and exported."""
    make_wheel(stack.wheel, files={f"vllm/{x}.py": _lines().encode() for x in "abc"})
    toml = stack.root / "stack.toml"
    pinned = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(pinned, sha256(stack.wheel)))
    assert stack.run("apply") == 0
    for i, x in enumerate("abc"):
        stack.commit_on_work(
            f"vllm/{x}.py", _lines({5 + i: f"line {5 + i} ours"}), MSG.format(x=x)
        )
    assert stack.run("export") == 0
    return stack


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("vstack: error: "), err
    return err[-1]


def _mine(stack, path="vllm/c.py", msg="[EPLB] Mine") -> str:
    f = stack.repo / path
    f.write_text((f.read_text() if f.exists() else "") + "mine = 1\n")
    git(stack.repo, "add", "-A")
    git(stack.repo, "commit", "-qm", msg)
    return git(stack.repo, "rev-parse", "HEAD").strip()


def _refs_with(stack, sha) -> list[str]:
    return git(
        stack.repo, "for-each-ref", "--contains", sha, "--format=%(refname)"
    ).split()


def _interrupt_apply_at(monkeypatch, n):
    real = A.apply_one
    calls = [0]

    def f(repo, patch):
        calls[0] += 1
        if calls[0] == n:
            raise KeyboardInterrupt
        return real(repo, patch)

    monkeypatch.setattr(A, "apply_one", f)
    return lambda: monkeypatch.setattr(A, "apply_one", real)


# ---------------------------------------------------------------- 1, 9


def test_1_apply_after_an_interrupted_apply_keeps_a_new_commit(
    three, monkeypatch, capsys
):
    """apply --force Ctrl-C'd after patch 1, the user commits on work: a plain apply
    refused (it used to rebuild the branch: the commit only in the reflog), and
    --force keeps it under a backup ref."""
    undo = _interrupt_apply_at(monkeypatch, 2)
    assert three.run("apply", "--force") == 130
    undo()
    c = _mine(three)
    capsys.readouterr()
    assert three.run("apply") == 1
    line = _error(capsys)
    assert c[:12] in line and "[EPLB] Mine" in line and "cherry-pick" in line
    assert git(three.repo, "rev-parse", "work").strip() == c
    assert three.run("apply", "--force") == 0
    assert "old work branch kept as refs/vstack/backup/" in capsys.readouterr().out
    assert any(r.startswith("refs/vstack/backup/") for r in _refs_with(three, c))


def test_1_an_interrupted_apply_is_still_finished_by_a_rerun(three, monkeypatch):
    undo = _interrupt_apply_at(monkeypatch, 2)
    assert three.run("apply", "--force") == 130
    undo()
    assert three.run("apply") == 0
    assert (
        git(three.repo, "log", "--format=%s", "base/1.0.0..work").count("[EPLB]") == 3
    )


@pytest.mark.parametrize("content", ["", "{}", "[1]", '{"state": "running"}'])
def test_9_a_damaged_apply_journal_does_not_drop_commits(three, capsys, content):
    c = _mine(three)
    (three.root / ".vstack/apply.json").write_text(content)
    capsys.readouterr()
    assert three.run("apply") == 1
    assert c[:12] in _error(capsys)
    assert git(three.repo, "rev-parse", "work").strip() == c
    assert three.run("apply", "--force") == 0
    assert any(r.startswith("refs/vstack/backup/") for r in _refs_with(three, c))


# ---------------------------------------------------------------- 3, 5


def test_3_apply_continue_and_export_refuse_head_on_another_branch(three, capsys):
    p = three.root / "patches/eplb-edit-b.patch"
    p.write_text(p.read_text().replace("-line 6\n", "-line 6 CHANGED\n"))
    assert three.run("apply", "--force") == 1  # stops at b
    before = three.snapshot()
    git(three.repo, "am", "--abort")
    git(three.repo, "checkout", "-q", "-b", "fix-b")
    three.commit_on_work("vllm/b.py", _lines({6: "line 6 ours"}), MSG.format(x="b"))
    capsys.readouterr()
    assert three.run("apply", "--continue") == 1
    line = _error(capsys)
    assert (
        "branch 'fix-b'" in line and "checkout work" in line and "cherry-pick" in line
    )
    assert three.run("export", "--force") == 1
    assert "branch 'fix-b'" in _error(capsys)
    assert three.snapshot() == before  # no patch deleted


def test_5_a_commit_on_a_detached_head_is_neither_skipped_nor_orphaned(three, capsys):
    git(three.repo, "checkout", "-q", "--detach", "work")
    c = _mine(three, "vllm/a.py")
    before = three.snapshot()
    capsys.readouterr()
    for verb in (
        ["export"],
        ["apply"],
        ["apply", "--force"],
        ["rebase", "--onto", "9.9.9"],
    ):
        assert three.run(*verb) == 1
        line = _error(capsys)
        assert "detached HEAD" in line and c[:12] in line, verb
    assert git(three.repo, "rev-parse", "HEAD").strip() == c
    assert three.snapshot() == before
    # Back on work (as the message says), everything works again.
    git(three.repo, "checkout", "-q", "work")
    git(three.repo, "cherry-pick", c)
    assert three.run("export") == 0
    assert (three.root / "patches/eplb-mine.patch").is_file()


def test_5_a_detached_head_the_branch_has_is_harmless(three):
    git(three.repo, "checkout", "-q", "--detach", "work~1")
    assert three.run("export", "--check") == 0
    assert three.run("apply") == 0


def test_op_in_progress_sees_revert_cherry_pick_and_bisect(three, capsys):
    gitdir = three.repo / ".git"
    for marker, name, hint in (
        ("REVERT_HEAD", "git revert", "revert --abort"),
        ("CHERRY_PICK_HEAD", "git cherry-pick", "cherry-pick --abort"),
        ("BISECT_LOG", "git bisect", "bisect reset"),
    ):
        (gitdir / marker).write_text("x\n")
        assert gitutil.op_in_progress(three.repo) == name
        capsys.readouterr()
        assert three.run("apply") == 1
        assert hint in _error(capsys)
        (gitdir / marker).unlink()


# ---------------------------------------------------------------- 2, tmp litter


def test_2_the_journal_writes_the_sync_record_last(tmp_path, monkeypatch):
    order = []
    real = fsutil.write_bytes

    def spy(path, data):
        order.append(str(path.relative_to(tmp_path)))
        return real(path, data)

    monkeypatch.setattr(fsutil, "write_bytes", spy)
    journal.commit(tmp_path, tmp_path / ".vstack", {
        ".vstack/synced.json": b"{}", "patches/a.patch": b"a", "patches/series": b"s",
        "stack.toml": b"t",
    }, "export")  # fmt: skip
    written = [p for p in order if not p.startswith(".vstack/journal")]
    assert written[-1] == ".vstack/synced.json", written


def test_2_giving_up_an_interrupted_export_loses_no_commit(three, capsys):
    """export SIGKILLed at its first patches/ file; patches/series then changes (a
    pull); recovery refuses; removing .vstack/journal as it says: apply must not
    rebuild the branch and drop the commit (synced.json claimed it exported)."""
    c = _mine(three, msg=MSG.format(x="mine").replace("Edit mine", "Mine"))
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            real = os.replace

            def rep(src, dst, *a, **k):
                if "patches" in str(dst) and ".vstack" not in str(dst):
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(src, dst, *a, **k)

            fsutil.os.replace = rep
            three.run("export")
        finally:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    series = three.root / "patches/series"
    series.write_text(series.read_text() + "# reviewed by the team\n")
    capsys.readouterr()
    assert three.run("apply") == 1
    assert ".vstack/journal" in _error(capsys)
    fsutil.remove_tree(three.root / ".vstack/journal")
    assert three.run("apply") == 1
    assert c[:12] in _error(capsys)
    assert git(three.repo, "rev-parse", "work").strip() == c


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_tmp_litter_of_a_killed_write_is_swept(three):
    dead = _dead_pid()
    litter = [
        three.root / f"patches/.eplb-x.patch.{dead}.tmp",
        three.root / f".vstack/.synced.json.{dead}.tmp",
        three.root / f".stack.toml.{dead}.tmp",
    ]
    for p in litter:
        p.write_text("half")
    assert three.run("export") == 0
    assert not [p for p in litter if p.exists()]


def test_tmp_sweep_keeps_the_users_own_tmp_files(three):
    """The sweep deleted every .*.tmp in the project and patches/: a user's
    .notes.tmp went without a word. Only .NAME.<pid>.tmp of a dead pid goes."""
    kept = [
        three.root / ".notes.tmp",
        three.root / "patches/.draft.tmp",
        three.root / ".stack.toml.swp.tmp",
        three.root / f".stack.toml.{os.getpid()}.tmp",  # a live process's write
    ]
    for p in kept:
        p.write_text("mine")
    assert three.run("lint") in (0, 1)
    assert three.run("export") == 0
    assert [p.read_text() for p in kept] == ["mine"] * len(kept)


# ---------------------------------------------------------------- 19


def test_19_a_pull_and_a_local_commit_get_advice_that_keeps_both(three, capsys):
    c = _mine(three, msg=MSG.format(x="mine").replace("Edit mine", "Mine"))
    p = three.root / "patches/eplb-edit-a.patch"
    p.write_text(
        p.read_text().replace("Our change to a.", "Our change to a, says a colleague.")
    )
    capsys.readouterr()
    assert three.run("apply") == 1
    a = _error(capsys)
    assert three.run("export") == 1
    e = _error(capsys)
    for line in (a, e):
        assert c[:12] in line and "patches/eplb-edit-a.patch" in line
        assert "apply --force" in line and "cherry-pick" in line
    assert "patches/ does not have (eplb-edit-a.patch" not in a
    # Following it keeps both.
    assert three.run("apply", "--force") == 0
    pick = a.split("cherry-pick ")[1].split("`")[0].split()
    git(three.repo, "cherry-pick", *pick)
    assert three.run("export") == 0
    assert "says a colleague" in p.read_text()
    assert (three.root / "patches/eplb-mine.patch").is_file()


def test_19_a_pulled_repin_gets_advice_that_works(stack, capsys):
    new = make_two_wheels(stack)
    colleague = stack.root.parent / "colleague"
    git(stack.root.parent, "clone", "-q", str(stack.root), str(colleague))
    from vstack_testlib import Stack

    other = Stack(colleague, stack.cache, stack.wheel)
    assert other.run("rebase", "--onto", str(new)) == 1
    (other.repo / "vllm/c.py").write_text(_lines({20: "line 20 ours"}))
    assert other.run("rebase", "--continue") == 0
    git(colleague, "add", "-A")
    git(colleague, "commit", "-qm", "rebase onto 1.1.0")
    c = _mine(stack, "vllm/a.py", MSG.format(x="mine").replace("Edit mine", "Mine"))
    git(stack.root, "pull", "-q", str(colleague), "HEAD")
    capsys.readouterr()
    assert stack.run("export") == 1
    line = _error(capsys)
    assert "re-pinned" in line and c[:12] in line and "apply --force" in line
    pick = line.split("cherry-pick ")[1].split("`")[0].split()
    assert stack.run("apply", "--force") == 0
    git(stack.repo, "cherry-pick", *pick)
    assert stack.run("export") == 0
    assert (stack.root / "patches/eplb-mine.patch").is_file()


# ---------------------------------------------------------------- 4, 18, 20, abort


@pytest.fixture
def stopped(stack):
    """A rebase onto 1.1.0 stopped at eplb-edit-c.patch (a conflict)."""
    new = make_two_wheels(stack)
    assert stack.run("rebase", "--onto", str(new)) == 1
    return stack


def test_4_rebase_continue_refuses_patches_changed_during_the_stop(stopped, capsys):
    p = stopped.root / "patches"
    new_f = (p / "eplb-edit-e.patch").read_text().replace("Edit e", "Edit f")
    (p / "my-new-f.patch").write_text(new_f)
    (p / "series").write_text((p / "series").read_text() + "my-new-f.patch\n")
    a = p / "eplb-edit-a.patch"
    a.write_text(a.read_text().replace("exists for testing", "exists (HAND EDIT)"))
    before = stopped.snapshot()
    (stopped.repo / "vllm/c.py").write_text(_lines({20: "line 20 ours"}))
    capsys.readouterr()
    for verb in ("--continue", "--skip"):
        args = ["rebase", verb] + (["--reason", "x"] if verb == "--skip" else [])
        assert stopped.run(*args) == 1
        line = _error(capsys)
        assert "patches/eplb-edit-a.patch" in line and "patches/series" in line, line
    assert stopped.snapshot() == before
    assert stopped.run("rebase", "--abort") == 0
    assert "HAND EDIT" in a.read_text() and (p / "my-new-f.patch").is_file()


def test_4_an_unlisted_patch_file_does_not_stop_the_rebase(stopped):
    (stopped.root / "patches/notes.patch").write_text("not a patch of the series\n")
    (stopped.repo / "vllm/c.py").write_text(_lines({20: "line 20 ours"}))
    assert stopped.run("rebase", "--continue") == 0


@pytest.mark.parametrize("content", ["{}", "[]", '{"old_work": null}'])
def test_18_a_damaged_rebase_state_is_one_line(stopped, capsys, content):
    (stopped.root / ".vstack/rebase/state.json").write_text(content)
    for verb in ("--abort", "--continue"):
        capsys.readouterr()
        assert stopped.run("rebase", verb) == 1
        line = _error(capsys)
        assert "state.json is damaged" in line and "remove" in line


def test_20_a_resolution_that_changes_nothing_says_why(stopped, capsys):
    (stopped.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream"}))
    capsys.readouterr()
    assert stopped.run("rebase", "--continue") == 1
    line = _error(capsys)
    assert "No changes" in line and "--skip --reason" in line and "['" not in line


def test_rebase_abort_keeps_the_users_untracked_files(stopped, capsys):
    (stopped.repo / "notes.txt").write_text("mine\n")
    assert stopped.run("rebase", "--abort") == 0
    assert (stopped.repo / "notes.txt").read_text() == "mine\n"
    assert "notes.txt" in capsys.readouterr().err


def test_a_conflict_in_a_non_ascii_file_name_is_resolved_by_continue(three, capsys):
    name = "vllm/caf\u00e9.py"
    three.commit_on_work(name, _lines(), MSG.format(x="cafe add"))
    three.commit_on_work(name, _lines({5: "line 5 ours"}), MSG.format(x="cafe"))
    assert three.run("export") == 0
    p = three.root / "patches/eplb-edit-cafe-add.patch"
    p.write_text(p.read_text().replace("+line 5\n", "+line 5 theirs\n"))
    assert three.run("apply", "--force") == 1
    capsys.readouterr()
    assert three.run("apply", "--continue") == 1
    assert f"{name}:" in _error(capsys)  # the marker is found, by its real name
    (three.repo / name).write_text(_lines({5: "line 5 ours"}))
    assert three.run("apply", "--continue") == 0
    assert "line 5 ours" in git(three.repo, "show", f"work:{name}")


def test_advice_on_a_checked_out_backup_picks_only_the_users_commits(three, capsys):
    """After apply --force, checking out its backup ref to look at it got the
    advice `cherry-pick work..<backup>`: the whole old series, every patch again.
    Only the commits whose change work lacks are named."""
    mine = _mine(three, "vllm/a.py")
    p = three.root / "patches/eplb-edit-b.patch"
    p.write_text(
        p.read_text().replace("Our change to b.", "Our change to b, reworded.")
    )
    assert three.run("apply", "--force") == 0
    backup = git(three.repo, "for-each-ref", "--format=%(refname)",
                 "refs/vstack/backup/").split()[0]  # fmt: skip
    git(three.repo, "checkout", "-q", "--detach", backup)
    capsys.readouterr()
    assert three.run("export") == 1
    line = _error(capsys)
    pick = line.split("cherry-pick ")[1].split("`")[0].split()
    assert pick == [mine[:12]], line
    git(three.repo, "checkout", "-q", "work")
    git(three.repo, "cherry-pick", *pick)
    assert three.run("export") == 0
