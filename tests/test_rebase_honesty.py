"""rebase in the states a real user meets: a merged patch on a wheel base, a run killed
with git's index.lock left behind, a stop that was no conflict, a stale resolution
record, a stop's report, a local wheel, and --abort after a killed finish."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, make_two_wheels, make_wheel, sha256
from vstack_testlib import numbered_lines as _lines

import vstack.rebase
from vstack.apply import PatchResult

SIGNED = "\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


@pytest.fixture
def two_wheels(stack):
    return make_two_wheels(stack)


def _report(stack) -> dict:
    return json.loads((stack.root / ".vstack/reports/rebase.json").read_text())


def _statuses(stack) -> list[tuple[str, str]]:
    return [(r["patch"], r["status"]) for r in _report(stack)["patches"]]


def _repin(stack, wheel: Path) -> None:
    toml = stack.root / "stack.toml"
    old = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(old, sha256(wheel)))


def _commit_project(stack) -> None:
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")


# ---------------------------------------------------------------- merged upstream


def test_merged_patch_is_dropped_on_a_wheel_base(stack, tmp_path, capsys):
    """Wheels carry no tests/: a merged patch that adds tests must still be dropped,
    whether it reverse-applies on vllm/ or only a 3-way merge shows it is upstream."""
    old = {f"vllm/{x}.py": _lines().encode() for x in "mnqr"}
    _repin(stack, make_wheel(stack.wheel, files=old))
    assert stack.run("apply") == 0
    for x, line in (("m", 10), ("n", 20)):  # each with a test, as patches should
        (stack.repo / f"vllm/{x}.py").write_text(_lines({line: f"line {line} merged"}))
        (stack.repo / "tests").mkdir(exist_ok=True)
        (stack.repo / f"tests/test_{x}.py").write_text(f"def test_{x}():\n    pass\n")
        git(stack.repo, "add", "-A")
        git(
            stack.repo,
            "commit",
            "-q",
            "-m",
            f"[EPLB] {x.upper()}\n\nChange {x}, test it." + SIGNED,
        )
    stack.commit_on_work("vllm/q.py", _lines({30: "line 30 merged"}),
                         "[EPLB] Q\n\nChange q, merged upstream, no test." + SIGNED)  # fmt: skip
    stack.commit_on_work("vllm/r.py", _lines({40: "line 40 ours"}),
                         "[EPLB] R\n\nOur change to r, not upstream." + SIGNED)  # fmt: skip
    assert stack.run("export") == 0
    _commit_project(stack)
    # upstream merged M, N and Q; next to N's and Q's lines it changed more, so
    # those two neither reverse-apply nor apply: only a 3-way merge sees them merged
    new = make_wheel(
        tmp_path / "new" / "vllm-1.1.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        version="1.1.0", commit="gdef5678",
        files={
            "vllm/m.py": _lines({10: "line 10 merged"}).encode(),
            "vllm/n.py": _lines({20: "line 20 merged", 22: "line 22 upstream"}).encode(),
            "vllm/q.py": _lines({30: "line 30 merged", 32: "line 32 upstream"}).encode(),
            "vllm/r.py": _lines().encode(),
        },
    )  # fmt: skip
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(new)) == 0
    assert _statuses(stack) == [
        ("eplb-m.patch", "dropped-upstream"),
        ("eplb-n.patch", "dropped-upstream"),
        ("eplb-q.patch", "dropped-upstream"),
        ("eplb-r.patch", "clean"),
    ]
    rows = {r["patch"]: r for r in _report(stack)["patches"]}
    # the whole patch went forward: nothing changed where the wheel has files; the
    # test it adds is where a wheel has nothing to compare, and the report says so
    for x in "mn":
        said = rows[f"eplb-{x}.patch"]["details"]
        assert said[0] == (
            f"git am -3 of the whole patch onto the new base changed nothing in "
            f"vllm/{x}.py: the base already has it there; what it changes in "
            f"tests/test_{x}.py cannot be compared (the base has no tests/)"
        )
        assert said[1] == f"kept as refs/vstack/dropped/1.1.0/eplb-{x}.patch"
    assert "1 patch(es) kept, 3 dropped" in capsys.readouterr().out
    series = (stack.root / "patches/series").read_text()
    assert "eplb-r.patch" in series and "eplb-n.patch" not in series
    assert not (stack.repo / "tests/test_n.py").exists()
    assert git(stack.repo, "log", "--format=%s", "base/1.1.0..work").split("\n")[0] == (
        "[EPLB] R"
    )


# ---------------------------------------------------------------- kill -9 and locks

_SHIM = """#!/bin/bash
# Stands in for git: at vstack's second `git -C <repo> am` (the second patch), do
# what a kill -9 of vstack while git holds the index does: the lock stays behind
# (SHIM_MODE=kill); or let that git run into a lock it did not take (SHIM_MODE=lock).
if [ "$1" = "-C" ] && [ "$2" = "$SHIM_REPO" ]; then
  for a in "$@"; do
    if [ "$a" = "am" ]; then
      n=$(( $(cat "$SHIM_COUNT" 2>/dev/null || echo 0) + 1 )); echo $n > "$SHIM_COUNT"
      if [ $n -eq 2 ]; then
        : > "$SHIM_REPO/.git/index.lock"
        if [ "$SHIM_MODE" = kill ]; then kill -9 $PPID; exit 137; fi
        break  # "lock": git runs into the lock, as beside a git the user started
      fi
      break
    fi
  done
fi
exec "$SHIM_GIT" "$@"
"""


def _rebase_with_shim(stack, target: Path, tmp_path: Path, mode: str):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "git").write_text(_SHIM)
    (shim / "git").chmod(0o755)
    real_git = subprocess.run(["which", "git"], capture_output=True, text=True)
    env = {
        **os.environ,
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
        "SHIM_REPO": str(stack.repo),
        "SHIM_COUNT": str(tmp_path / "count"),
        "SHIM_GIT": real_git.stdout.strip(),
        "SHIM_MODE": mode,
    }
    return subprocess.run(
        [sys.executable, "-m", "vstack", "--root", str(stack.root), "rebase", "--onto",
         str(target)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _rebase_killed_at_second_patch(stack, target: Path, tmp_path: Path) -> None:
    p = _rebase_with_shim(stack, target, tmp_path, "kill")
    assert p.returncode == -9, p.stderr  # killed, in the middle of the rebase
    assert (stack.repo / ".git/index.lock").exists()
    state = json.loads((stack.root / ".vstack/rebase/state.json").read_text())
    assert [r["status"] for r in state["results"]] == ["clean"]


def test_kill_during_rebase_then_continue_reports_no_false_conflict(
    stack, two_wheels, tmp_path, capsys
):
    before = stack.snapshot()
    _rebase_killed_at_second_patch(stack, two_wheels, tmp_path)
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 1
    out, err = capsys.readouterr()
    lock = stack.repo / ".git/index.lock"
    assert f"removed {lock}: a stale lock" in err
    assert "[2/5] 3way             eplb-edit-b.patch" in out
    assert (
        "conflict in eplb-edit-c.patch" in err
        and "eplb-edit-b" not in err.split("conflict in")[0]
    )
    assert _statuses(stack)[:3] == [
        ("eplb-edit-a.patch", "clean"),
        ("eplb-edit-b.patch", "3way"),
        ("eplb-edit-c.patch", "conflict"),
    ]
    assert stack.run("rebase", "--abort") == 0
    assert stack.snapshot() == before


def test_a_git_failure_that_is_no_conflict_is_not_reported_as_one(
    stack, two_wheels, tmp_path, capsys
):
    p = _rebase_with_shim(stack, two_wheels, tmp_path, "lock")
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("vstack: error: git am of eplb-edit-b.patch failed in ")
    assert "for a reason other than a conflict" in last
    assert "conflict in" not in p.stderr
    state = json.loads((stack.root / ".vstack/rebase/state.json").read_text())
    assert [r["status"] for r in state["results"]] == ["clean"]  # b: no verdict
    capsys.readouterr()
    assert stack.run("rebase", "--continue") == 1  # the lock is gone: b goes through
    out, err = capsys.readouterr()
    assert "[2/5] 3way             eplb-edit-b.patch" in out
    assert "conflict in eplb-edit-c.patch" in err


def test_abort_after_kill_clears_a_stale_lock_and_names_a_held_one(
    stack, two_wheels, tmp_path, capsys
):
    before = stack.snapshot()
    work = git(stack.repo, "rev-parse", "work").strip()
    _rebase_killed_at_second_patch(stack, two_wheels, tmp_path)
    lock = stack.repo / ".git/index.lock"
    # a live process holds the lock: nothing is removed, the lock and pid are named
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(120)",
         str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        capsys.readouterr()
        assert stack.run("rebase", "--abort") == 1
        err = capsys.readouterr().err
        assert str(lock) in err and f"pid {holder.pid}" in err
        assert lock.exists() and (stack.root / ".vstack/rebase/state.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert stack.run("rebase", "--abort") == 0
    cap = capsys.readouterr()
    assert f"removed {lock}" in cap.err and "as before" in cap.out
    assert stack.snapshot() == before
    assert git(stack.repo, "rev-parse", "work").strip() == work
    assert not lock.exists()


def test_skip_refuses_a_patch_that_applies_and_continue_retries_it(
    stack, two_wheels, monkeypatch, capsys
):
    """A stop that was no conflict (git failed for another reason) must not become a
    'superseded' record: --skip refuses, --continue applies the patch again."""
    real = vstack.rebase.apply_one
    failed = []

    def flaky(repo, patch):
        if patch.name == "eplb-edit-b.patch" and not failed:
            failed.append(patch.name)
            return PatchResult(patch.name, "conflict", ["vllm/b.py"], ["git failed"])
        return real(repo, patch)

    monkeypatch.setattr(vstack.rebase, "apply_one", flaky)
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    capsys.readouterr()
    assert stack.run("rebase", "--skip", "--reason", "upstream has it") == 1
    err = capsys.readouterr().err
    assert "--skip refused: eplb-edit-b.patch applies on the new base" in err
    assert not (stack.root / "resolutions").exists()
    assert stack.run("rebase", "--continue") == 1  # then stops at c, a real conflict
    out = capsys.readouterr().out
    assert "nothing was resolved for eplb-edit-b.patch; applying it again" in out
    assert [s for _, s in _statuses(stack)][:3] == ["clean", "3way", "conflict"]


# ---------------------------------------------------------------- stale records


def _patch_sha(stack, name: str) -> str:
    return hashlib.sha256((stack.root / "patches" / name).read_bytes()).hexdigest()


def _back_to_old_pin(stack):
    git(stack.root, "checkout", "-q", "HEAD", "--", "patches", "stack.toml")
    assert stack.run("apply", "--force") == 0


def test_a_record_names_its_patch_and_a_stale_record_stops_the_rebase(
    stack, two_wheels, capsys
):
    sha_c = _patch_sha(stack, "eplb-edit-c.patch")
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream, ported"}))
    assert stack.run("rebase", "--continue") == 0
    record = stack.root / "resolutions/1.1.0/eplb-edit-c.patch"
    assert f"\nResolves-Patch-Sha256: {sha_c}\n" in record.read_text()
    # the kept patch is the port, without the record's trailer
    assert (
        "Resolves-Patch-Sha256"
        not in (stack.root / "patches/eplb-edit-c.patch").read_text()
    )
    _back_to_old_pin(stack)
    git(stack.root, "add", "resolutions")
    git(stack.root, "commit", "-q", "-m", "record")
    # the patch changes after the record was made
    patch = stack.root / "patches/eplb-edit-c.patch"
    patch.write_text(patch.read_text().replace("+line 20 ours", "+line 20 ours, v2"))
    git(stack.root, "commit", "-q", "-am", "patch v2")
    assert stack.run("apply", "--force") == 0
    before = stack.snapshot()
    capsys.readouterr()
    assert stack.run("lint") == 1
    assert "resolutions/1.1.0/eplb-edit-c.patch:1: stale" in capsys.readouterr().out
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    err = capsys.readouterr().err
    assert "stale record for eplb-edit-c.patch" in err
    assert f"the patch is now {_patch_sha(stack, 'eplb-edit-c.patch')[:12]}" in err
    assert "git rm resolutions/1.1.0/eplb-edit-c.patch" in err
    assert stack.snapshot() == before
    report = _report(stack)  # written at the stop
    assert report["stopped_at"] == "eplb-edit-c.patch"
    assert [r["status"] for r in report["patches"]] == [
        "clean", "3way", "stale-record", "pending", "pending",
    ]  # fmt: skip
    # re-resolve: drop the stale record; the patch conflicts and is recorded anew
    git(stack.root, "rm", "-q", "resolutions/1.1.0/eplb-edit-c.patch")
    assert stack.run("rebase", "--continue") == 1
    assert "conflict in eplb-edit-c.patch" in capsys.readouterr().err
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream, ours v2"}))
    sha_v2 = hashlib.sha256(
        git(stack.root, "show", "HEAD:patches/eplb-edit-c.patch").encode()
    ).hexdigest()
    assert stack.run("rebase", "--continue") == 0
    assert f"Resolves-Patch-Sha256: {sha_v2}" in record.read_text()


def test_a_record_without_a_hash_replays_with_a_note(stack, two_wheels, capsys):
    sha_c = _patch_sha(stack, "eplb-edit-c.patch")
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    assert stack.run("rebase", "--skip", "--reason", "upstream's line 20 does it") == 0
    record = stack.root / "resolutions/1.1.0/eplb-edit-c.patch"
    text = record.read_text()
    assert f"\nResolves-Patch-Sha256: {sha_c}\n" in text
    from vstack.records import strip_patch_hash

    record.write_text(strip_patch_hash(text))  # as records were written before
    _back_to_old_pin(stack)
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 0
    err = capsys.readouterr().err
    assert "resolutions/1.1.0/eplb-edit-c.patch has no Resolves-Patch-Sha256" in err
    row = _report(stack)["patches"][2]
    assert row["status"] == "superseded"
    assert any("cannot be checked" in d for d in row["details"])


# ---------------------------------------------------------------- the report at a stop


def test_report_is_written_at_the_stop_with_every_rejected_hunk(
    stack, tmp_path, capsys
):
    old = {"vllm/h.py": _lines().encode()}
    _repin(stack, make_wheel(stack.wheel, files=old))
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/h.py", _lines({10: "line 10 ours", 30: "line 30 ours", 50: "line 50 ours"}),
        "[EPLB] H\n\nThree changes to h." + SIGNED,
    )  # fmt: skip
    assert stack.run("export") == 0
    _commit_project(stack)
    new = make_wheel(
        tmp_path / "new" / "vllm-1.1.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        version="1.1.0", commit="gdef5678",
        files={"vllm/h.py": _lines({10: "up 10", 30: "up 30", 50: "up 50"}).encode()},
    )  # fmt: skip
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(new)) == 1
    err = capsys.readouterr().err
    for hunk in ("-7,7 +7,7", "-27,7 +27,7", "-47,7 +47,7"):
        assert f"vllm/h.py: hunk {hunk} failed" in err
    assert ".vstack/reports/rebase.md" in err
    report = _report(stack)
    assert report["stopped_at"] == "eplb-h.patch"
    assert sum("failed" in d for d in report["patches"][0]["details"]) == 3
    md = (stack.root / ".vstack/reports/rebase.md").read_text()
    assert "Stopped at eplb-h.patch" in md and "hunk -47,7 +47,7 failed" in md


# ---------------------------------------------------------------- a local wheel


def test_rebase_onto_a_local_wheel_caches_it_for_offline_builds(
    stack, two_wheels, tmp_path
):
    elsewhere = tmp_path / "downloads" / two_wheels.name
    elsewhere.parent.mkdir()
    two_wheels.replace(elsewhere)
    assert stack.run("rebase", "--onto", str(elsewhere)) == 1
    assert stack.run("rebase", "--skip", "--reason", "upstream's line 20 does it") == 0
    assert (stack.cache / elsewhere.name).read_bytes() == elsewhere.read_bytes()
    elsewhere.unlink()  # gone, and PIP_NO_INDEX: the build must find it in the cache
    assert stack.run("build") == 0
    info = json.loads((stack.root / "dist/build.json").read_text())
    assert info["version"].startswith("1.1.0+eplb.g")


# ---------------------------------------------------------------- a killed finish


def test_abort_after_a_killed_finish_restores_patches_and_stack_toml(
    stack, two_wheels, monkeypatch, capsys
):
    before = stack.snapshot()
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1

    def killed(*args, **kw):
        raise KeyboardInterrupt  # the finish dies after writing patches/ and stack.toml

    monkeypatch.setattr(vstack.rebase, "after_pin_moved", killed)
    assert (
        stack.run("rebase", "--skip", "--reason", "upstream's line 20 does it") == 130
    )
    assert stack.snapshot() != before  # half written: patches/, stack.toml, a record
    assert (stack.root / "resolutions/1.1.0/eplb-edit-c.patch").exists()
    capsys.readouterr()
    assert stack.run("rebase", "--abort") == 0
    out = capsys.readouterr().out
    assert "put back as they were before it" in out and "stack.toml" in out
    assert stack.snapshot() == before
    assert git(stack.root, "status", "--porcelain") == ""


def test_abort_names_what_someone_else_changed(stack, two_wheels, capsys):
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    series = stack.root / "patches/series"
    series.write_text(series.read_text() + "# edited during the rebase\n")
    capsys.readouterr()
    assert stack.run("rebase", "--abort") == 0
    cap = capsys.readouterr()
    assert "as before" not in cap.out
    assert "differ from before the rebase" in cap.err and "patches/series" in cap.err
    assert series.read_text().endswith("# edited during the rebase\n")  # not lost


def test_abort_of_a_rebase_without_a_saved_copy_still_names_differences(
    stack, two_wheels, capsys
):
    """A rebase begun by a vstack that saved no copy of patches/: --abort still
    says what git sees changed in patches/ and stack.toml."""
    assert stack.run("rebase", "--onto", str(two_wheels)) == 1
    shutil.rmtree(stack.root / ".vstack/rebase/saved")
    toml = stack.root / "stack.toml"
    toml.write_text(toml.read_text().replace('version = "1.0.0"', 'version = "1.1.0"'))
    capsys.readouterr()
    assert stack.run("rebase", "--abort") == 0
    cap = capsys.readouterr()
    assert "as before" not in cap.out and "stack.toml" in cap.err
