"""A patch leaves the series only on proof (issue 28): dropped-upstream only when
applying the whole patch forward to the new base changes nothing there (renames and
quoted names included), a recorded resolution replayed only after the same proof on
the base at hand, Depends-On trailers that name a dropped patch follow the drop, and
every drop is kept under a ref and listed in the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from series_lab import (
    commit,
    commit_project,
    hand_series,
    lines,
    message,
    new_wheel,
    repin,
    series_names,
)
from vstack_testlib import git

from vstack import records
from vstack.rebase import superseded_record


def _report(stack) -> dict:
    return json.loads((stack.root / ".vstack/reports/rebase.json").read_text())


def _status(stack) -> dict[str, str]:
    return {r["patch"]: r["status"] for r in _report(stack)["patches"]}


def _work_file(stack, path: str) -> bytes | None:
    p = stack.repo / path
    return p.read_bytes() if p.is_file() else None


def test_a_patch_in_rename_form_is_kept_on_a_new_base(stack, tmp_path):
    """Defect 1: `git format-patch -M` (GitHub's <PR>.patch) wrote the patch as a
    rename; the reverse check filtered it down to nothing and dropped it."""
    repin(stack, {"vllm/a.py": lines(), "vllm/b.py": lines()})

    def commits(repo):
        git(repo, "mv", "vllm/a.py", "vllm/a2.py")
        (repo / "vllm/a2.py").write_bytes(lines(changes={5: "line 5 ours"}))
        commit(repo, message("[EPLB] Move a to a2"))

    patches = hand_series(stack, commits, fmt=["-M"])
    assert b"rename from vllm/a.py" in patches["eplb-move-a-to-a2.patch"]
    new = new_wheel(
        tmp_path, {"vllm/a.py": lines(), "vllm/b.py": lines(changes={20: "up"})}
    )
    assert stack.run("rebase", "--onto", str(new)) == 0
    assert _status(stack)["eplb-move-a-to-a2.patch"] not in (
        "dropped-upstream",
        "superseded",
    )
    assert series_names(stack) == ["eplb-move-a-to-a2.patch"]
    assert _work_file(stack, "vllm/a2.py") == lines(changes={5: "line 5 ours"})
    assert _work_file(stack, "vllm/a.py") is None
    assert _work_file(stack, "vllm/b.py") == lines(changes={20: "up"})


def test_a_rename_upstream_made_too_is_proven_present(stack, tmp_path):
    """The same patch on a base that made the very rename: git am -3 forward
    changes nothing, so it is dropped, with the proof and a backup ref."""
    repin(stack, {"vllm/a.py": lines(), "vllm/b.py": lines()})

    def commits(repo):
        git(repo, "mv", "vllm/a.py", "vllm/a2.py")
        (repo / "vllm/a2.py").write_bytes(lines(changes={5: "line 5 ours"}))
        commit(repo, message("[EPLB] Move a to a2"))

    hand_series(stack, commits, fmt=["-M"])
    new = new_wheel(
        tmp_path,
        {"vllm/a2.py": lines(changes={5: "line 5 ours"}), "vllm/b.py": lines()},
    )
    assert stack.run("rebase", "--onto", str(new)) == 0
    row = _report(stack)["patches"][0]
    assert row["status"] == "dropped-upstream"
    assert "the whole patch onto the new base left no change" in row["details"][0]
    ref = row["backup"]
    assert ref == "refs/vstack/dropped/1.1.0/eplb-move-a-to-a2.patch"
    kept = git(stack.repo, "show", "--format=%s", "--stat", ref)
    assert "[EPLB] Move a to a2" in kept and "a2.py" in kept
    md = (stack.root / ".vstack/reports/rebase.md").read_text()
    assert "eplb-move-a-to-a2.patch" in md and ref in md


def test_a_new_non_ascii_file_keeps_its_patch(stack, tmp_path):
    """Defect 5: a patch adds vllm/é.py (C-quoted in the patch) and changes b.py;
    upstream makes the b.py change: the patch is not dropped, é.py is not lost."""
    repin(stack, {"vllm/a.py": lines(), "vllm/b.py": lines()})

    def commits(repo):
        (repo / "vllm/é.py").write_bytes(b"X = 1\n")
        (repo / "vllm/b.py").write_bytes(lines(changes={10: "line 10 ours"}))
        commit(repo, message("[EPLB] Add a module and change b"))

    patches = hand_series(stack, commits)
    assert b'"b/vllm/\\303\\251.py"' in patches["eplb-add-a-module-and-change-b.patch"]
    new = new_wheel(
        tmp_path,
        {"vllm/a.py": lines(), "vllm/b.py": lines(changes={10: "line 10 ours"})},
    )
    assert stack.run("rebase", "--onto", str(new)) == 0
    assert _status(stack)["eplb-add-a-module-and-change-b.patch"] == "3way"
    assert series_names(stack) == ["eplb-add-a-module-and-change-b.patch"]
    assert _work_file(stack, "vllm/é.py") == b"X = 1\n"
    text = (stack.root / "patches/eplb-add-a-module-and-change-b.patch").read_bytes()
    assert b"\\303\\251.py" in text and b"vllm/b.py" not in text


def _one_patch_on_c(stack):
    repin(stack, {"vllm/c.py": lines(), "vllm/d.py": lines()})

    def commits(repo):
        (repo / "vllm/c.py").write_bytes(lines(changes={20: "line 20 ours"}))
        commit(repo, message("[EPLB] Change c"))

    hand_series(stack, commits)


def _superseded_on_1_1_0(stack) -> Path:
    """One patch on c with a "superseded" record made for 1.1.0, committed."""
    _one_patch_on_c(stack)
    patch = stack.root / "patches/eplb-change-c.patch"
    rec = stack.root / "resolutions/1.1.0/eplb-change-c.patch"
    rec.parent.mkdir(parents=True)
    rec.write_text(
        superseded_record(
            "[EPLB] Change c", "1.1.0", "1.1.0 rewrote c",
            records.patch_sha256(patch.read_bytes()),
        )
    )  # fmt: skip
    commit_project(stack)
    return patch


def test_a_superseded_record_is_not_replayed_where_the_patch_applies(stack, tmp_path):
    """Defect 6: a "superseded" record made for 1.1.0 was replayed on 1.2.0, where
    the patch applies: the patch was dropped unproven."""
    patch = _superseded_on_1_1_0(stack)
    # 1.2.0 is a later base where the patch applies again
    new = new_wheel(
        tmp_path, {"vllm/c.py": lines(), "vllm/d.py": lines(changes={3: "x"})}, "1.2.0"
    )
    assert stack.run("rebase", "--onto", str(new)) == 1
    row = _report(stack)["patches"][0]
    assert row["status"] == "stale-record"
    assert "applies on this base" in row["details"][0]
    assert patch.is_file()
    # removing the record (as the stop says) applies the patch
    git(stack.root, "rm", "-q", "resolutions/1.1.0/eplb-change-c.patch")
    assert stack.run("rebase", "--continue") == 0
    assert _status(stack) == {"eplb-change-c.patch": "clean"}
    assert series_names(stack) == ["eplb-change-c.patch"]


def test_a_superseded_record_is_replayed_where_the_patch_conflicts(stack, tmp_path):
    """The same record where the proof holds (the patch does not apply): replayed."""
    _superseded_on_1_1_0(stack)
    new = new_wheel(
        tmp_path,
        {"vllm/c.py": lines(changes={20: "line 20 upstream"}), "vllm/d.py": lines()},
        "1.2.0",
    )
    assert stack.run("rebase", "--onto", str(new)) == 0
    row = _report(stack)["patches"][0]
    assert row["status"] == "superseded"
    assert row["backup"] == "refs/vstack/dropped/1.2.0/eplb-change-c.patch"
    assert series_names(stack) == []


def test_a_recorded_port_that_changes_nothing_is_no_resolution(stack, tmp_path):
    """A recorded port that the base at hand already has would be reported
    'ported' while the branch holds none of it: the rebase stops instead."""
    _one_patch_on_c(stack)
    patch = stack.root / "patches/eplb-change-c.patch"
    port = patch.read_text().replace("line 20 ours", "line 20 ported")
    rec = stack.root / "resolutions/1.1.0/eplb-change-c.patch"
    rec.parent.mkdir(parents=True)
    rec.write_text(
        records.with_patch_hash(port, records.patch_sha256(patch.read_bytes()))
    )
    commit_project(stack)
    # the base made the ported change itself, and moved our line
    new = new_wheel(
        tmp_path,
        {"vllm/c.py": lines(changes={20: "line 20 ported"}), "vllm/d.py": lines()},
        "1.1.0",
    )
    assert stack.run("rebase", "--onto", str(new)) == 1
    row = _report(stack)["patches"][0]
    assert row["status"] == "stale-record"
    assert "changes nothing" in row["details"][0]


def test_depends_on_a_dropped_patch_follows_the_drop(stack, tmp_path, capsys):
    """Defect 8: the merged patch leaves the series; the Depends-On: of the patch
    built on it goes with it, so lint passes and the report says so."""
    repin(stack, {"vllm/a.py": lines(), "vllm/b.py": lines()})

    def commits(repo):
        (repo / "vllm/a.py").write_bytes(lines(changes={5: "line 5 merged"}))
        commit(repo, message("[EPLB] Base change"))
        (repo / "vllm/b.py").write_bytes(lines(changes={9: "line 9 ours"}))
        commit(
            repo,
            message(
                "[EPLB] Built on it",
                trailers=["Depends-On: eplb-base-change", "RFC: docs/x.md"],
            ),
        )

    hand_series(stack, commits)
    new = new_wheel(
        tmp_path,
        {"vllm/a.py": lines(changes={5: "line 5 merged"}), "vllm/b.py": lines()},
    )
    assert stack.run("rebase", "--onto", str(new)) == 0
    assert series_names(stack) == ["eplb-built-on-it.patch"]
    text = (stack.root / "patches/eplb-built-on-it.patch").read_text()
    assert "Depends-On" not in text
    assert "RFC: docs/x.md" in text and "Upstream-Status: pending" in text
    row = _report(stack)["patches"][1]
    assert any("Depends-On: eplb-base-change removed" in d for d in row["details"])
    capsys.readouterr()
    (stack.root / "docs").mkdir()
    (stack.root / "docs/x.md").write_text("# x\n")
    stack.run("lint")
    assert "Depends-On" not in capsys.readouterr().out


def test_an_upstream_pr_in_a_subject_is_no_proof(stack, tmp_path, capsys):
    """An upstream commit naming the patch's Upstream-PR is reported, but a patch
    whose changes the base lacks stays in the series."""
    up = stack.root / "vllm"
    (up / "vllm").mkdir(parents=True)
    (up / "vllm/f.py").write_bytes(lines())
    (up / "vllm/g.py").write_bytes(lines())
    git(up, "init", "-q")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "release")
    old = git(up, "rev-parse", "HEAD").strip()
    toml = stack.root / "stack.toml"
    toml.write_text(toml.read_text().replace('"gabc1234"', f'"g{old[:9]}"'))
    (stack.root / ".gitignore").write_text("/.vstack/\n/vllm/\n")

    def commits(repo):
        (repo / "vllm/f.py").write_bytes(lines(changes={5: "line 5 ours"}))
        commit(repo, message("[EPLB] F", trailers=["Upstream-PR: 888"]))

    hand_series(stack, commits)
    # a PR #888 lands that touches another file only (a typo in our trailer)
    (up / "vllm/g.py").write_bytes(lines(changes={2: "g"}))
    git(up, "commit", "-q", "-am", "[Misc] Something else (#888)")
    new = git(up, "rev-parse", "HEAD").strip()
    assert stack.run("rebase", "--onto", new, "--git") == 0
    row = _report(stack)["patches"][0]
    assert row["status"] == "clean"
    assert any("Something else (#888)" in d for d in row["details"])
    assert series_names(stack) == ["eplb-f.patch"]
    shutil.rmtree(up)
