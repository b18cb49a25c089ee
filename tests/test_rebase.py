"""vstack rebase between two synthetic wheels: every status, the report, --continue,
--abort, and the bad-input cases."""

from __future__ import annotations

import json
import subprocess

import pytest
from vstack_testlib import git, make_two_wheels, sha256
from vstack_testlib import numbered_lines as _lines

from vstack.rebase import ours_ranges, pr_in_subjects


@pytest.fixture
def two_wheels(stack):
    return make_two_wheels(stack)


def _project_state(stack):
    return stack.snapshot(), git(stack.root, "status", "--porcelain")


def test_rebase_classifies_each_patch_and_stops_at_conflict(stack, two_wheels, capsys):
    before = _project_state(stack)
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    cap = capsys.readouterr()
    out = cap.out + cap.err
    assert "[1/5] clean            eplb-edit-a.patch" in out
    assert "[2/5] 3way             eplb-edit-b.patch" in out
    assert "conflict in eplb-edit-c.patch" in out and "vllm/c.py" in out
    assert "hunk -17,7 +17,7 failed" in out
    assert "vstack rebase --continue" in out and "--abort" in out
    assert _project_state(stack) == before  # patches/ and stack.toml untouched
    assert "<<<<<<<" in (stack.repo / "vllm/c.py").read_text()
    # a second rebase while this one is open is refused
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    assert "already in progress" in capsys.readouterr().err
    # --continue with markers left is refused, nothing lost
    assert stack.run("rebase", "--continue") == 1
    assert "unresolved conflict markers in vllm/c.py:" in capsys.readouterr().err
    assert "<<<<<<<" in (stack.repo / "vllm/c.py").read_text()
    # resolve: keep both edits
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream and ours"}))
    assert stack.run("rebase", "--continue") == 0
    out = capsys.readouterr().out
    assert "dropped-upstream" in out and "eplb-edit-d.patch" in out
    assert "offset" in out and "eplb-edit-e.patch" in out
    series = [
        ln
        for ln in (stack.root / "patches/series").read_text().splitlines()
        if not ln.startswith("#")
    ]
    assert series == [
        "eplb-edit-a.patch",
        "eplb-edit-b.patch",
        "eplb-edit-c.patch",
        "eplb-edit-e.patch",
    ]
    assert not (stack.root / "patches/eplb-edit-d.patch").exists()
    toml = (stack.root / "stack.toml").read_text()
    assert 'version = "1.1.0"' in toml and 'commit = "gdef5678"' in toml
    assert f'sha256 = "{sha256(two_wheels)}"' in toml and two_wheels.name in toml
    report = json.loads((stack.root / ".vstack/reports/rebase.json").read_text())
    assert [r["status"] for r in report["patches"]] == [
        "clean",
        "3way",
        "conflict-resolved",
        "dropped-upstream",
        "offset",
    ]
    assert report["old"]["version"] == "1.0.0" and report["new"]["version"] == "1.1.0"
    timings = json.loads(
        (stack.root / ".vstack/reports/rebase-timings.json").read_text()
    )
    assert set(timings) >= {"download", "base_extraction", "apply", "export"}
    assert "timings" not in report  # the report is the same for every run
    md = (stack.root / ".vstack/reports/rebase.md").read_text()
    assert "| 3 | eplb-edit-c.patch | conflict-resolved | vllm/c.py |" in md
    # the refreshed series applies cleanly on the new base and round-trips
    assert stack.run("apply") == 0
    assert stack.run("export", "--check") == 0
    assert "line 20 upstream and ours" in (stack.repo / "vllm/c.py").read_text()


def test_abort_restores_everything(stack, two_wheels, capsys):
    work_before = git(stack.repo, "rev-parse", "work").strip()
    tree_before = {p: (stack.repo / p).read_bytes() for p in ("vllm/a.py", "vllm/c.py")}
    before = _project_state(stack)
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    assert stack.run("rebase", "--abort") == 0
    assert _project_state(stack) == before
    assert git(stack.repo, "rev-parse", "work").strip() == work_before
    assert git(stack.repo, "status", "--porcelain") == ""
    assert {p: (stack.repo / p).read_bytes() for p in tree_before} == tree_before
    assert not (stack.root / ".vstack/rebase").exists()
    assert stack.run("rebase", "--continue") == 1
    assert "no rebase in progress" in capsys.readouterr().err


def test_bad_inputs_change_nothing(stack, two_wheels, capsys):
    before = _project_state(stack)
    assert stack.run("rebase", "--onto", "99.0.0") == 1
    assert "could not download vllm==99.0.0" in capsys.readouterr().err
    assert stack.run("rebase", "--onto", "not a target") == 1
    assert "cannot tell what" in capsys.readouterr().err
    assert stack.run("rebase", "--onto", str(stack.cache / "missing.whl")) == 1
    assert "no such wheel file" in capsys.readouterr().err
    assert _project_state(stack) == before
    # a dirty project tree is refused
    (stack.root / "patches/series").write_text(
        "# edited\n" + (stack.root / "patches/series").read_text()
    )
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    assert "uncommitted changes in patches/series" in capsys.readouterr().err
    git(stack.root, "checkout", "--", "patches/series")
    # a wheel whose recorded hash no longer matches (pinned base corrupted)
    stack.wheel.write_bytes(stack.wheel.read_bytes() + b"x")
    subprocess.run(["rm", "-rf", str(stack.root / ".vstack")], check=True)
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert _project_state(stack) == before


def test_pr_number_and_conflict_ranges_helpers():
    subjects = ["abc123 [EPLB] Fuse mapping (#4321)", "def456 [Misc] other (#12)"]
    assert pr_in_subjects("4321", subjects) == subjects[0]
    assert (
        pr_in_subjects("https://github.com/vllm-project/vllm/pull/12", subjects)
        == subjects[1]
    )
    assert pr_in_subjects("432", subjects) is None
    text = "a\nb\n<<<<<<< HEAD\nx\ny\n=======\nz\n>>>>>>> p\nc\n<<<<<<< HEAD\nq\n=======\nr\n>>>>>>> p\n"
    assert ours_ranges(text) == [(3, 4), (6, 6)]


def _statuses(stack):
    report = json.loads((stack.root / ".vstack/reports/rebase.json").read_text())
    return [r["status"] for r in report["patches"]], report


def _back_to_old_pin(stack):
    """Undo a completed rebase in the project (git) and the stack repo."""
    git(stack.root, "checkout", "-q", "HEAD", "--", "patches", "stack.toml")
    assert stack.run("apply", "--force") == 0


def test_skip_drops_a_superseded_patch_and_the_record_replays(
    stack, two_wheels, capsys
):
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    capsys.readouterr()
    assert stack.run("rebase", "--skip") == 1
    assert "--skip needs --reason" in capsys.readouterr().err
    reason = "upstream's line 20 does what ours did"
    assert stack.run("rebase", "--skip", "--reason", reason) == 0
    out = capsys.readouterr().out
    assert "superseded       eplb-edit-c.patch" in out
    assert "recorded the resolution in resolutions/1.1.0/eplb-edit-c.patch" in out
    statuses, report = _statuses(stack)
    assert statuses == ["clean", "3way", "superseded", "dropped-upstream", "offset"]
    assert f"skipped: {reason}" in report["patches"][2]["details"]
    record = stack.root / "resolutions/1.1.0/eplb-edit-c.patch"
    assert f"Superseded by vLLM 1.1.0: {reason}" in record.read_text()
    assert "eplb-edit-c.patch" not in (stack.root / "patches/series").read_text()
    assert (stack.repo / "vllm/c.py").read_text() == _lines({20: "line 20 upstream"})

    # the next rebase onto the same base (CI, a colleague) does not stop
    _back_to_old_pin(stack)
    git(stack.root, "add", "resolutions")
    git(stack.root, "commit", "-q", "-m", "record")
    assert stack.run("rebase", "--onto", str(two_wheels)) == 0
    statuses, report = _statuses(stack)
    assert statuses == ["clean", "3way", "superseded", "dropped-upstream", "offset"]
    assert report["patches"][2]["details"][0].startswith(
        "recorded in resolutions/1.1.0/eplb-edit-c.patch: Superseded by vLLM 1.1.0"
    )


def test_continue_records_the_port_and_the_next_rebase_applies_it(
    stack, two_wheels, capsys
):
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream, ported"}))
    assert stack.run("rebase", "--continue") == 0
    record = stack.root / "resolutions/1.1.0/eplb-edit-c.patch"
    assert "+line 20 upstream, ported" in record.read_text()
    _back_to_old_pin(stack)
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 0
    assert "ported           eplb-edit-c.patch" in capsys.readouterr().out
    statuses, report = _statuses(stack)
    assert statuses == ["clean", "3way", "ported", "dropped-upstream", "offset"]
    assert (
        "recorded port resolutions/1.1.0/eplb-edit-c.patch"
        in (report["patches"][2]["details"][0])
    )
    assert "line 20 upstream, ported" in (stack.repo / "vllm/c.py").read_text()
    # a record is never overwritten by a later, different resolution
    _back_to_old_pin(stack)
    record.write_text(record.read_text().replace("ported", "p0rted"))
    assert stack.run("rebase", "--onto", str(two_wheels)) == 0
    assert "p0rted" in record.read_text()


def test_added_surface_and_what_upstream_already_has(tmp_path):
    diff = (
        "diff --git a/vllm/config/parallel.py b/vllm/config/parallel.py\n"
        "--- a/vllm/config/parallel.py\n+++ b/vllm/config/parallel.py\n"
        '@@ -1 +1,2 @@\n-Comm = Literal["gloo", "nccl"]\n'
        '+Comm = Literal["gloo", "nccl", "symm_mem"]\n'
        "+    double_buffer: bool = False\n"
        "diff --git a/vllm/eplb/comm.py b/vllm/eplb/comm.py\n"
        "--- /dev/null\n+++ b/vllm/eplb/comm.py\n@@ -0,0 +1,3 @@\n"
        "+class SymmComm:\n+def plan_rows(x):\n+def _private(x):\n"
        "diff --git a/tests/test_x.py b/tests/test_x.py\n"
        "--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1 @@\n+def test_x():\n"
    )
    from vstack.rebase import added_surface, upstream_provides

    assert added_surface(diff) == [
        ("value", "symm_mem", "vllm/config/parallel.py"),
        ("class", "SymmComm", "vllm/eplb/comm.py"),
        ("def", "plan_rows", "vllm/eplb/comm.py"),
    ]
    repo = tmp_path / "r"
    (repo / "vllm/config").mkdir(parents=True)
    (repo / "vllm/config/parallel.py").write_text(
        'Comm = Literal["gloo", "nccl", "symm_mem"]\n'
    )
    (repo / "vllm/comm_other.py").write_text("class SymmComm:\n    pass\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "-m", "b")
    assert upstream_provides(repo, "HEAD", diff) == [
        'upstream now has: value "symm_mem" (vllm/config/parallel.py)',
        "upstream now has: class SymmComm (vllm/comm_other.py)",
    ]


def test_a_message_export_refuses_is_refused_before_the_rebase_starts(
    stack, two_wheels, capsys
):
    """A patch message that export refuses reached the rebase's finish: --continue
    advised a reword, then reset the reworded branch and refused again (only
    --abort got out). Now the rebase refuses it first, changing nothing."""
    patch = stack.root / "patches/eplb-edit-e.patch"
    text = patch.read_text()
    line = next(ln for ln in text.splitlines()[4:] if ln.strip())
    patch.write_text(text.replace(line, line + "\n---\nDesign text after dashes.", 1))
    git(stack.root, "commit", "-q", "-a", "-m", "reword e")
    before = _project_state(stack)
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "patches/eplb-edit-e.patch:" in err[0], err
    assert "nothing was changed" in err[0]
    assert _project_state(stack) == before
    assert stack.run("rebase", "--abort") == 1  # no rebase was started
    capsys.readouterr()
    # once reworded, the rebase runs (and stops at its usual conflict)
    patch.write_text(text)
    git(stack.root, "commit", "-q", "-a", "-m", "unreword e")
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    cap = capsys.readouterr()
    assert "conflict in eplb-edit-c.patch" in cap.out + cap.err
