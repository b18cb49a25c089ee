"""A conflict resolution committed by hand (issue 28, defect 2): `git commit` while
vstack's `git am` waits, with or without `git am --skip` (git's own hint) after it.
--continue takes the commit's tree as the resolution of the stopped patch, with the
patch's own subject, message, author and trailers (as git am commits it), and keeps
the user's commit under a backup ref; --skip no longer sends the user back and forth."""

from __future__ import annotations

import os
import subprocess

import pytest
from vstack_testlib import git, make_two_wheels
from vstack_testlib import numbered_lines as _lines

from vstack.apply import commit_as_patch

USER = {**os.environ, "GIT_AUTHOR_NAME": "U", "GIT_AUTHOR_EMAIL": "u@x",
        "GIT_COMMITTER_NAME": "U", "GIT_COMMITTER_EMAIL": "u@x"}  # fmt: skip


def _user_git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
        env=USER,
    ).stdout  # fmt: skip


def _am_waits(repo) -> bool:
    return (repo / ".git" / "rebase-apply").exists()


@pytest.mark.parametrize("after", ["nothing", "am --skip", "am --quit"])
def test_rebase_continue_takes_a_hand_commit_with_the_patchs_message(
    stack, capsys, after
):
    new = make_two_wheels(stack)
    assert stack.run("rebase", "--onto", str(new)) == 1  # c conflicts
    repo = stack.repo
    assert _am_waits(repo)
    (repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream and ours"}))
    _user_git(repo, "add", "vllm/c.py")
    _user_git(repo, "commit", "-q", "-m", "fix")
    mine = git(repo, "rev-parse", "HEAD").strip()
    if after != "nothing":
        _user_git(repo, *after.split())
        assert not _am_waits(repo)
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 0
    err = capsys.readouterr().err
    assert "taken as the resolution of eplb-edit-c.patch" in err
    text = (stack.root / "patches/eplb-edit-c.patch").read_text()
    assert "Subject: [EPLB] Edit c" in text and "From: T <t@x>" in text
    assert "Our change to c exists for testing." in text
    assert "Upstream-Status: pending" in text and "Signed-off-by: T <t@x>" in text
    assert "+line 20 upstream and ours" in text
    record = (stack.root / "resolutions/1.1.0/eplb-edit-c.patch").read_text()
    assert "Subject: [EPLB] Edit c" in record and "fix" not in record.split("\n")[3]
    # the user's commit is kept
    refs = git(repo, "for-each-ref", "--format=%(objectname)", "refs/vstack/backup/")
    assert mine in refs.split()


def test_rebase_skip_after_a_hand_commit_points_to_continue_which_works(stack, capsys):
    new = make_two_wheels(stack)
    assert stack.run("rebase", "--onto", str(new)) == 1
    repo = stack.repo
    (repo / "vllm/c.py").write_text(_lines({20: "line 20 mine"}))
    _user_git(repo, "commit", "-q", "-am", "fix")
    capsys.readouterr()
    assert stack.run("rebase", "--skip", "--reason", "x") == 1
    assert "--continue takes them as its resolution" in capsys.readouterr().err
    assert stack.run("rebase", "--continue") == 0
    text = (stack.root / "patches/eplb-edit-c.patch").read_text()
    assert "Subject: [EPLB] Edit c" in text and "+line 20 mine" in text


def _three(stack):
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    stack.commit_on_work(
        "vllm/config.py", "A = 1\nB = 20\nC = 3\n",
        "[EPLB] Tune B\n\nB must be twenty for the tests.\n\nUpstream-Status: pending",
    )  # fmt: skip
    assert stack.run("export") == 0
    bad = stack.root / "patches/eplb-tune-b.patch"
    bad.write_text(bad.read_text().replace("-B = 2", "-B = 9"))
    assert stack.run("apply") == 1


@pytest.mark.parametrize("after", ["nothing", "am --skip"])
def test_apply_continue_takes_a_hand_commit_with_the_patchs_message(
    stack, capsys, after
):
    _three(stack)
    repo = stack.repo
    (repo / "vllm/config.py").write_text("A = 1\nB = 20\nC = 3\n")
    _user_git(repo, "add", "vllm/config.py")
    _user_git(repo, "commit", "-q", "-m", "my fix")
    if after != "nothing":
        _user_git(repo, *after.split())
    assert stack.run("apply", "--continue") == 0
    said = git(repo, "log", "-1", "--format=%s|%an|%ae|%b", "work").strip()
    assert said.startswith("[EPLB] Tune B|T|t@x|B must be twenty for the tests.")
    assert stack.run("export") == 0
    assert (
        "Subject: [EPLB] Tune B"
        in (stack.root / "patches/eplb-tune-b.patch").read_text()
    )


def test_commit_as_patch_is_the_commit_git_am_makes(stack, tmp_path):
    """The message, author and dates of a commit made for a patch are git am's, for
    subjects and bodies git am rewrites (RFC 2047, folding, trailing blanks)."""
    assert stack.run("apply") == 0
    repo = stack.repo
    for subject, body in [
        ("[EPLB] 2× faster ≤ 5 µs, José", "Why.\n\nSigned-off-by: José <j@x>\n"),
        ("A very long subject " * 6, "Body   \n\n\n\nmore\n\n"),
        ("[PATCH] [EPLB] kept", "Tested: yes.\n"),
    ]:
        (repo / "vllm/config.py").write_text(f"A = {len(subject)}\n")
        git(repo, "commit", "-q", "-am", f"{subject}\n\n{body}")
        data = subprocess.run(
            ["git", "-C", str(repo), "format-patch", "--stdout", "-1", "-k", "HEAD"],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        git(repo, "reset", "-q", "--hard", "HEAD~1")
        parent = git(repo, "rev-parse", "HEAD").strip()
        (tmp_path / "p.patch").write_bytes(data)
        env = {**os.environ, "GIT_COMMITTER_NAME": "vstack",
               "GIT_COMMITTER_EMAIL": "vstack@localhost"}  # fmt: skip
        subprocess.run(
            ["git", "-C", str(repo), "am", "-q", "--keep",
             "--committer-date-is-author-date", str(tmp_path / "p.patch")],
            check=True, env=env,
        )  # fmt: skip
        by_am = git(repo, "rev-parse", "HEAD").strip()
        tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
        assert commit_as_patch(repo, data, tree, parent) == by_am, subject
        git(repo, "reset", "-q", "--hard", parent)
