"""rebase on bases with git history: Upstream-PR found in a commit subject (reported,
not taken as proof), and the upstream commits behind a conflict found by blame."""

from __future__ import annotations

import json

from vstack_testlib import git, write_stack_toml


def _lines(changes=None):
    lines = [f"line {i}" for i in range(1, 41)]
    for i, t in (changes or {}).items():
        lines[i - 1] = t
    return "".join(x + "\n" for x in lines)


def test_git_history_names_the_pr_and_blames_conflicts(stack, capsys):
    up = stack.root / "vllm"
    (up / "vllm").mkdir(parents=True)
    for name in ("c.py", "f.py"):
        (up / "vllm" / name).write_text(_lines())
    git(up, "init", "-q")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "release 1.0.0")
    git(up, "tag", "v1.0.0")
    old = git(up, "rev-parse", "HEAD").strip()
    write_stack_toml(stack.root, stack.wheel, commit="g" + old[:9])
    (stack.root / ".gitignore").write_text("/.vstack/\n/vllm/\n")
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/c.py",
        _lines({20: "line 20 ours"}),
        "[EPLB] Edit c\n\nOur edit of c, for the conflict case.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    stack.commit_on_work(
        "vllm/f.py",
        _lines({5: "line 5 feature v1"}),
        "[EPLB] Feature\n\nOur feature, submitted upstream as a PR.\n\nUpstream-Status: submitted\nUpstream-PR: 888\nSigned-off-by: T <t@x>",
    )
    assert stack.run("export") == 0
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")
    # upstream moves on: someone refactors c's line 20; our PR lands reworked by review
    (up / "vllm" / "c.py").write_text(_lines({20: "line 20 refactored"}))
    git(up, "commit", "-q", "-am", "[Core] Refactor c (#777)")
    refactor = git(up, "rev-parse", "--short=12", "HEAD").strip()
    (up / "vllm" / "f.py").write_text(_lines({5: "line 5 feature v2 (after review)"}))
    git(up, "commit", "-q", "-am", "[EPLB] Feature (#888)")
    new = git(up, "rev-parse", "HEAD").strip()
    capsys.readouterr()
    assert stack.run("rebase", "--onto", new, "--git") == 1
    err = capsys.readouterr().err
    assert "conflict in eplb-edit-c.patch" in err
    assert f"upstream: {refactor} [Core] Refactor c (#777) (vllm/c.py:20-20)" in err
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 refactored + ours"}))
    # the PR landed reworked: its number in a subject is evidence, not proof; the
    # patch conflicts, the stop names the upstream commit, and --skip drops it
    assert stack.run("rebase", "--continue") == 1
    err = capsys.readouterr().err
    assert "conflict in eplb-feature.patch" in err
    assert "upstream commit naming its Upstream-PR: " in err and "(#888)" in err
    assert stack.run("rebase", "--skip", "--reason", "merged upstream as #888") == 0
    report = json.loads((stack.root / ".vstack/reports/rebase.json").read_text())
    by = {r["patch"]: r for r in report["patches"]}
    assert by["eplb-feature.patch"]["status"] == "superseded"
    assert by["eplb-feature.patch"]["details"][0] == "skipped: merged upstream as #888"
    assert by["eplb-edit-c.patch"]["status"] == "conflict-resolved"
    assert any(
        "Refactor c (#777)" in c for c in by["eplb-edit-c.patch"]["upstream_commits"]
    )
    assert report["new"]["commit"] == "g" + new[:9]
    assert report["new"]["version"].startswith("1.0.0.dev0+g")
    series = (stack.root / "patches/series").read_text()
    assert "eplb-edit-c.patch" in series and "eplb-feature.patch" not in series
