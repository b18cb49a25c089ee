"""Issue 21: the ways a hostile user (Ctrl-C, kill -9, stray edits, pulls, odd
checkouts) made the tool lose or corrupt the series, each with the refusal or the
recovery that replaces it. tests/test_interrupts.py enumerates every interrupt
point; these are the named cases."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest
from vstack_testlib import SO_BYTES, git, make_two_wheels, sha256, vstack_main
from vstack_testlib import numbered_lines as _lines

from vstack.rebase import pr_in_subjects

SIGNED = "\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


@pytest.fixture
def two_wheels(stack):
    return make_two_wheels(stack)


def _statuses(stack) -> list[tuple[str, str]]:
    report = json.loads((stack.root / ".vstack/reports/rebase.json").read_text())
    return [(r["patch"], r["status"]) for r in report["patches"]]


def _series(stack) -> list[str]:
    text = (stack.root / "patches/series").read_text()
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("vstack: error: "), err
    return err[-1]


def _interrupt_at(monkeypatch, when):
    """Ctrl-C (KeyboardInterrupt, as Python raises it) at the first git call for
    which when(argv) says "before" (the call is not made) or "after" (it is).
    Patches subprocess.run, which every git call of vstack's goes through."""
    real = subprocess.run

    def run(cmd, *a, **kw):
        hit = when(cmd) if cmd and cmd[0] == "git" else None
        if hit == "before":
            raise KeyboardInterrupt
        p = real(cmd, *a, **kw)
        if hit == "after":
            raise KeyboardInterrupt
        return p

    monkeypatch.setattr(subprocess, "run", run)
    return lambda: monkeypatch.setattr(subprocess, "run", real)


def _signalled(fn, when, sig) -> int:
    """fn() in a forked child that sends itself sig (a real SIGINT or SIGKILL) just
    before the first git call when(argv) picks; the child's exit (or -signal)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            real = subprocess.run

            def run(cmd, *a, **kw):
                if cmd and cmd[0] == "git" and when(cmd):
                    os.kill(os.getpid(), sig)
                    for _ in range(10000):
                        pass
                return real(cmd, *a, **kw)

            subprocess.run = run
            code = fn()
        finally:
            os._exit(code if isinstance(code, int) else 98)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _nth(n: int, pred):
    seen = {"n": 0}

    def when(cmd):
        if pred(cmd):
            seen["n"] += 1
            return seen["n"] == n
        return False

    return when


def _am_in(repo):
    """A `git am` of a patch in repo (not in a temporary worktree)."""
    return lambda cmd: "am" in cmd and "--3way" in cmd and str(repo) in cmd


# ---------------------------------------------------------------- case 1


def test_case1_a_stray_edit_during_a_stopped_rebase_is_refused_not_committed(
    stack, two_wheels, capsys
):
    """An unstaged edit of a file a later patch touches (e.py): --continue refused
    it, naming it; before, git am refused the dirty file, vstack called that a
    conflict in the later patch and the next --continue committed the stray edit as
    that patch (and recorded it in resolutions/)."""
    patch_e = (stack.root / "patches/eplb-edit-e.patch").read_text()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream and ours"}))
    (stack.repo / "vllm/e.py").write_text(_lines({42: "a stray edit"}, insert_top=5))
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 1
    line = _error(capsys)
    assert "vllm/e.py" in line and "outside eplb-edit-c.patch's files" in line
    assert "conflict in eplb-edit-e" not in capsys.readouterr().err
    state = json.loads((stack.root / ".vstack/rebase/state.json").read_text())
    assert [r["status"] for r in state["results"]] == ["clean", "3way", "conflict"]
    assert "a stray edit" in (stack.repo / "vllm/e.py").read_text()  # not lost
    git(stack.repo, "checkout", "--", "vllm/e.py")
    assert stack.run("rebase", "--continue") == 0
    assert ("eplb-edit-e.patch", "offset") in _statuses(stack)
    kept = (stack.root / "patches/eplb-edit-e.patch").read_text()
    assert "+line 40 ours" in kept and "a stray edit" not in kept
    assert kept.split("\ndiff --git")[0] == patch_e.split("\ndiff --git")[0]
    assert not (stack.root / "resolutions/1.1.0/eplb-edit-e.patch").exists()


def test_case1_git_am_refusing_a_dirty_tree_is_not_a_conflict(stack, capsys):
    """apply_one on a tree with someone else's change: a refusal that names the
    file, never a `conflict` result that --continue would commit."""
    from vstack.apply import apply_one
    from vstack.errors import VstackError

    assert stack.run("apply") == 0
    stack.commit_state_edit()
    assert stack.run("export") == 0
    patch = stack.root / "patches/eplb-change-line-5.patch"
    git(stack.repo, "reset", "-q", "--hard", "HEAD~1")
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 30\n", "line 30 stray\n"))
    with pytest.raises(VstackError, match="uncommitted changes there") as e:
        apply_one(stack.repo, patch)
    assert "vllm/distributed/eplb/state.py" in str(e.value)
    assert "line 30 stray" in state.read_text()


# ---------------------------------------------------------------- case 2


def test_case2_export_refuses_during_a_rebase_after_git_am_continue_by_hand(
    stack, two_wheels, capsys
):
    """git's own hint at a stop is `git am --continue`: after it, the work branch is
    on the new base while stack.toml still pins the old. export used to write the
    whole new base as one patch and delete the others."""
    before = stack.snapshot()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream and ours"}))
    git(stack.repo, "add", "vllm/c.py")
    git(stack.repo, "am", "--continue")
    capsys.readouterr()
    assert stack.run("export") == 1
    assert "a rebase is in progress" in _error(capsys)
    assert stack.snapshot() == before
    assert stack.run("rebase", "--continue") == 0  # and the rebase takes it from there
    assert ("eplb-edit-c.patch", "conflict-resolved") in _statuses(stack)


def test_case2_export_refuses_a_work_branch_on_another_base(stack, two_wheels, capsys):
    """A colleague re-pinned (pulled) while the work branch holds unexported work on
    the old base: export refuses, naming both bases, instead of exporting vLLM's
    changes between them as a patch; apply refuses too, --force starts over."""
    stack.commit_on_work(
        "vllm/a.py", _lines({5: "line 5 ours", 6: "line 6 ours too"}),
        "[EPLB] More of a\n\nUnexported work." + SIGNED,
    )  # fmt: skip
    toml = stack.root / "stack.toml"
    text = toml.read_text()
    old_sha = text.split('sha256 = "')[1].split('"')[0]
    toml.write_text(
        text.replace(old_sha, sha256(two_wheels))
        .replace('version = "1.0.0"', 'version = "1.1.0"')
        .replace("gabc1234", "gdef5678")
        .replace(stack.wheel.name, two_wheels.name)
    )
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("export") == 1
    line = _error(capsys)
    assert "does not descend from the pinned base 1.1.0" in line
    assert "built on 1.0.0" in line
    assert stack.snapshot() == before
    assert stack.run("apply") == 1
    assert "does not descend from the pinned base" in _error(capsys)
    tip = git(stack.repo, "rev-parse", "work").strip()
    assert stack.run("apply", "--force") == 1  # 1.1.0 conflicts; the old tip is kept
    backups = git(
        stack.repo, "for-each-ref", "--format=%(objectname)", "refs/vstack/backup/"
    )
    assert tip in backups.split()


# ---------------------------------------------------------------- case 3


def test_case3_ctrl_c_before_the_new_base_is_checked_out(
    stack, two_wheels, monkeypatch, capsys
):
    """Ctrl-C after the rebase state is saved, before the work branch moves to the
    new base: --continue used to run on the old branch, call every patch
    dropped-upstream, export the old base as a patch and re-pin stack.toml."""
    before = stack.snapshot()
    state = stack.root / ".vstack/rebase/state.json"
    undo = _interrupt_at(
        monkeypatch,
        lambda cmd: "before" if "checkout" in cmd and state.is_file() else None,
    )
    assert stack.run("rebase", "--onto", str(two_wheels)) == 130
    undo()
    assert state.is_file()
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 1  # the real conflict, in c
    assert "conflict in eplb-edit-c.patch" in capsys.readouterr().err
    assert _statuses(stack)[:3] == [
        ("eplb-edit-a.patch", "clean"),
        ("eplb-edit-b.patch", "3way"),
        ("eplb-edit-c.patch", "conflict"),
    ]
    assert stack.snapshot() == before


# ---------------------------------------------------------------- case 4


def _three(stack) -> list[str]:
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    stack.commit_on_work(
        "vllm/config.py",
        "A = 1\nB = 20\nC = 3\n",
        "[EPLB] Tune B\n\nB is twenty." + SIGNED,
    )
    stack.commit_on_work("vllm/new.py", "X = 1\n", "[EPLB] New\n\nA new module." + SIGNED)  # fmt: skip
    assert stack.run("export") == 0
    assert stack.run("apply", "--force") == 0  # synced, and the branch rebuilt by apply
    return _series(stack)


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_case4_an_interrupted_apply_is_never_exported(stack, capsys, how):
    """Ctrl-C or kill -9 at apply's second `git am`: the partial branch was marked
    synced, export deleted the rest of the series, and after a kill apply advised
    `vstack export` first."""
    names = _three(stack)
    before = stack.snapshot()
    sig = getattr(signal, how)
    got = _signalled(
        lambda: vstack_main(["--root", str(stack.root), "apply"]),
        _nth(2, _am_in(stack.repo)),
        sig,
    )
    assert got == (130 if how == "SIGINT" else -sig)
    assert (
        len(git(stack.repo, "log", "--format=%s", "base/1.0.0..work").split("\n")) < 3
    )
    capsys.readouterr()
    assert stack.run("export") == 1
    line = _error(capsys)
    assert "was interrupted" in line and "Run `vstack apply` again" in line
    assert stack.snapshot() == before
    assert stack.run("apply") == 0  # no advice to export first
    assert "run `vstack export` first" not in capsys.readouterr().err
    assert stack.run("export") == 0
    assert stack.snapshot() == before and _series(stack) == names


# ---------------------------------------------------------------- case 6


def test_case6_export_does_not_revert_a_pulled_patch(stack, capsys):
    """A pull changes a patch: export --check fails (the work branch is older), and
    export used to write the old branch back over the pulled change."""
    names = _three(stack)
    patch = stack.root / "patches" / names[1]
    pulled = patch.read_text().replace("+B = 20", "+B = 21")
    patch.write_text(pulled)
    capsys.readouterr()
    assert stack.run("export", "--check") == 1
    assert "`vstack apply` picks the change up" in capsys.readouterr().err
    assert stack.run("export") == 1
    line = _error(capsys)
    assert f"patches/ changed since the last apply/export (patches/{names[1]})" in line
    assert "`vstack apply` picks the change up" in line and "export --force" in line
    assert patch.read_text() == pulled
    assert stack.run("apply") == 0
    assert "B = 21" in (stack.repo / "vllm/config.py").read_text()
    assert stack.run("export") == 0
    assert "+B = 21" in patch.read_text()
    # --force overwrites, as it says
    patch.write_text(pulled.replace("+B = 21", "+B = 22"))
    assert stack.run("export", "--force") == 0
    assert "+B = 21" in patch.read_text()


# ---------------------------------------------------------------- small cases


def test_small_a_reverted_upstream_pr_is_not_dropped_upstream():
    """An Upstream-PR number in a revert subject meant 'dropped-upstream'."""
    landed = "1111111 [EPLB] Fuse mapping (#4321)"
    reverted = 'aaaaaaa Revert "[EPLB] Fuse mapping (#4321)" (#4400)'
    relanded = 'bbbbbbb Reapply "[EPLB] Fuse mapping (#4321)" (#4500)'
    assert pr_in_subjects("4321", [reverted, landed]) is None  # newest first
    assert pr_in_subjects("4321", [relanded, reverted, landed]) == relanded
    assert pr_in_subjects("4321", [reverted]) is None  # a revert alone: not in
    twice = 'ccccccc Revert "Revert "[EPLB] Fuse mapping (#4321)"" (#4600)'
    assert pr_in_subjects("4321", [twice, reverted, landed]) == twice


def test_small_ctrl_c_right_after_git_am_commits_is_no_dropped_upstream(
    stack, two_wheels, monkeypatch, capsys
):
    """Ctrl-C just after `git am` committed patch b, before the state recorded it:
    --continue re-applied b on top of itself and called it dropped-upstream."""
    second = _nth(2, _am_in(stack.repo))
    undo = _interrupt_at(monkeypatch, lambda cmd: "after" if second(cmd) else None)
    assert stack.run("rebase", "--onto", str(two_wheels)) == 130
    undo()
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 1
    assert _statuses(stack)[:3] == [
        ("eplb-edit-a.patch", "clean"),
        ("eplb-edit-b.patch", "3way"),
        ("eplb-edit-c.patch", "conflict"),
    ]


def test_small_export_never_deletes_a_patch_file_it_did_not_write(stack, capsys):
    """*.patch files not listed in patches/series (a draft, a colleague's) were
    deleted by export."""
    _three(stack)
    draft = stack.root / "patches/my-draft.patch"
    draft.write_text("From 0 Mon Sep 17 00:00:00 2001\nSubject: a draft\n\nwip\n")
    stack.commit_on_work("vllm/new.py", "X = 2\n", "[EPLB] X two\n\nX is two." + SIGNED)
    capsys.readouterr()
    assert stack.run("export") == 0
    assert draft.is_file()
    assert (
        "patches/my-draft.patch is not listed in patches/series"
        in capsys.readouterr().err
    )
    assert "eplb-x-two.patch" in _series(stack)
    # one in the way of a patch export writes: named, not overwritten
    draft.rename(stack.root / "patches/eplb-y.patch")
    stack.commit_on_work("vllm/new.py", "X = 3\n", "[EPLB] Y\n\nY." + SIGNED)
    assert stack.run("export") == 1
    assert "patches/eplb-y.patch is not listed in patches/series" in _error(capsys)
    assert "wip" in (stack.root / "patches/eplb-y.patch").read_text()


def test_small_an_empty_commit_on_work_is_named_and_apply_force_starts_over(
    stack, capsys
):
    """An empty commit on the work branch made export, apply and even apply --force
    fail with "not a git format-patch file (no header)", naming nothing."""
    _three(stack)
    git(stack.repo, "commit", "-q", "--allow-empty", "-m", "nothing at all")
    sha = git(stack.repo, "rev-parse", "--short=12", "HEAD").strip()
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("export") == 1
    line = _error(capsys)
    assert f"commit {sha} ('nothing at all')" in line and "changes nothing" in line
    assert stack.run("apply") == 1
    assert f"commit {sha} ('nothing at all')" in _error(capsys)
    assert stack.run("apply", "--force") == 0
    assert stack.snapshot() == before


def test_small_export_refuses_a_commit_that_is_not_utf8(stack, capsys):
    """A latin-1 file on the work branch: export wrote a non-UTF-8 patch, export
    --check accepted it and build refused it."""
    _three(stack)
    (stack.repo / "vllm/latin.py").write_bytes(b"NAME = 'caf\xe9'\n")
    git(stack.repo, "add", "vllm/latin.py")
    git(stack.repo, "commit", "-q", "-m", "[EPLB] Latin\n\nA latin-1 file." + SIGNED)
    before = stack.snapshot()
    capsys.readouterr()
    for args in (["export"], ["export", "--check"]):
        assert stack.run(*args) == 1
        line = _error(capsys)
        assert "('[EPLB] Latin')" in line and "vllm/latin.py" in line
        assert "not UTF-8" in line
    assert stack.snapshot() == before


def test_small_export_refuses_what_a_text_patch_cannot_carry(stack, capsys):
    """A binary file and a symlink: format-patch writes no content for either, so the
    wheel would lack them; export refuses, naming the commit and the file."""
    _three(stack)
    (stack.repo / "vllm/blob.bin").write_bytes(SO_BYTES)
    git(stack.repo, "add", "vllm/blob.bin")
    git(stack.repo, "commit", "-q", "-m", "[EPLB] Blob\n\nBinary." + SIGNED)
    capsys.readouterr()
    assert stack.run("export") == 1
    line = _error(capsys)
    assert "vllm/blob.bin" in line and "a binary change" in line
    git(stack.repo, "reset", "-q", "--hard", "HEAD~1")
    (stack.repo / "vllm/link.py").symlink_to("config.py")
    git(stack.repo, "add", "vllm/link.py")
    git(stack.repo, "commit", "-q", "-m", "[EPLB] Link\n\nA symlink." + SIGNED)
    assert stack.run("export") == 1
    line = _error(capsys)
    assert "vllm/link.py" in line and "a symlink (mode 120000)" in line


def test_small_apply_continue_refuses_a_stray_edit(stack, capsys):
    """apply --continue, like rebase --continue, refuses a stray file before it
    commits anything (it used to commit the resolution, then stop on the dirty
    tree, leaving the branch neither stopped nor through)."""
    names = _three(stack)
    bad = stack.root / "patches" / names[0]
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    assert stack.run("apply") == 1
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 5\n", "line five\n"))
    (stack.repo / "vllm/stray.py").write_text("oops\n")
    head = git(stack.repo, "rev-parse", "HEAD")
    capsys.readouterr()
    assert stack.run("apply", "--continue") == 1
    assert "vllm/stray.py" in _error(capsys)
    assert git(stack.repo, "rev-parse", "HEAD") == head  # nothing committed
    assert (stack.repo / ".git/rebase-apply").is_dir()  # the resolution still open
    (stack.repo / "vllm/stray.py").unlink()
    assert stack.run("apply", "--continue") == 0


def test_resolution_commits_are_the_same_whenever_they_are_made(stack, tmp_path):
    """git am --continue forgets --committer-date-is-author-date: the resolution
    commit (and so the work branch) got the time of the --continue."""
    names = _three(stack)
    bad = stack.root / "patches" / names[0]
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    assert stack.run("apply") == 1
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 5\n", "line five\n"))
    copy = tmp_path / "copy"
    shutil.copytree(stack.root, copy, symlinks=True)
    assert stack.run("apply", "--continue") == 0
    # the same --continue, made "later": git takes the committer date from here
    os.environ["GIT_COMMITTER_DATE"] = "2030-01-01T00:00:00 +0000"
    try:
        assert vstack_main(["--root", str(copy), "apply", "--continue"]) == 0
    finally:
        del os.environ["GIT_COMMITTER_DATE"]
    a = git(stack.repo, "rev-parse", "work").strip()
    b = git(copy / ".vstack/repo", "rev-parse", "work").strip()
    assert a == b


@pytest.mark.parametrize("amend", ["whitespace", "message"])
def test_an_amend_patch_id_cannot_see_is_not_taken_for_the_series(
    stack, capsys, monkeypatch, amend
):
    """apply interrupted after its first patch; the user amends that commit with a
    whitespace-only fix or a new message. git patch-id sees no change, so plain
    `vstack apply` rebuilt the branch with no refusal and no backup ref."""
    import vstack.apply as A

    _three(stack)
    orig, n = A.apply_one, [0]

    def stop_at_second(repo, patch):
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return orig(repo, patch)

    monkeypatch.setattr(A, "apply_one", stop_at_second)
    assert stack.run("apply", "--force") == 130
    monkeypatch.setattr(A, "apply_one", orig)
    if amend == "whitespace":
        diff = git(stack.repo, "show", "--format=", "-U0", "HEAD")
        path = next(ln[6:] for ln in diff.splitlines() if ln.startswith("+++ b/"))
        added = next(
            ln[1:] for ln in diff.splitlines() if ln[:1] == "+" and ln[:4] != "+++ "
        )
        f = stack.repo / path
        f.write_text(f.read_text().replace(added + "\n", added + "   \n", 1))
        git(stack.repo, "commit", "-q", "-a", "--amend", "--no-edit")
    else:
        msg = git(stack.repo, "log", "-1", "--format=%B", "HEAD")
        git(stack.repo, "commit", "-q", "--amend", "-m",
            msg.replace("\n\n", "\n\nA better description.\n\n", 1))  # fmt: skip
    mine = git(stack.repo, "rev-parse", "HEAD").strip()
    capsys.readouterr()
    assert stack.run("apply") == 1
    assert mine[:12] in _error(capsys)
    assert git(stack.repo, "rev-parse", "work").strip() == mine
    assert stack.run("apply", "--force") == 0
    assert "old work branch kept as" in capsys.readouterr().out
    assert git(stack.repo, "for-each-ref", "--contains", mine).strip()
