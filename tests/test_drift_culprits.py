"""scripts/drift against a synthetic upstream: a local vLLM git repository whose
first-parent history breaks one patch at a known commit (a squash merge naming its
PR) and another later (a merge commit), and a per-commit wheel index on 127.0.0.1
with a tiny wheel per commit. Drift must give every patch a status, name both
commits, cache what it fetched, and the publish step must open one issue, then one
bump PR, through a stand-in `gh` that records its calls."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from vstack_testlib import (
    ROOT,
    git,
    make_wheel,
    numbered_lines,
    per_commit_repo,
    serve,
    write_stack_toml,
)

from vstack.drift import Bisection, pr_number
from vstack.series import read_series

FILES = "abcdefg"


def _tree(repo: Path) -> dict[str, bytes]:
    return {
        f"vllm/{x}.py": (repo / "vllm" / f"{x}.py").read_bytes() for x in FILES
    }  # fmt: skip


def _commit(repo: Path, subject: str, changes: dict[str, str] | None = None) -> str:
    for name, text in (changes or {}).items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", subject)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def upstream(stack, tmp_path):
    """vLLM's main: c0 (the pin, release 1.0.0) .. c8 (the nightly), first parent;
    c6 merges a side branch (s1) whose commit has a wheel too."""
    repo = tmp_path / "vllm-upstream"
    (repo / "vllm").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    lines = numbered_lines
    c = {}
    c[0] = _commit(repo, "[Release] v1.0.0", {f"vllm/{x}.py": lines() for x in FILES})
    c[1] = _commit(repo, "[Misc] touch g (#11)", {"vllm/g.py": lines({1: "g1"})})
    c[2] = _commit(repo, "[Core] c.py header (#12)", {"vllm/c.py": lines(insert_top=3)})
    c[3] = _commit(
        repo, "[EPLB] rework line 5 of a.py (#101)",
        {"vllm/a.py": lines({5: "line 5 upstream"})},
    )  # fmt: skip
    c[4] = _commit(repo, "[EPLB] d.py as the series has it (#14)",
                   {"vllm/d.py": lines({30: "line 30 ours"})})  # fmt: skip
    c[5] = _commit(repo, "[Perf] e.py line 12 (#15)", {"vllm/e.py": lines({12: "e12"})})
    git(repo, "checkout", "-q", "-b", "side")
    s1 = _commit(repo, "side: b.py line 20", {"vllm/b.py": lines({20: "line 20 up"})})
    git(repo, "checkout", "-q", "main")
    git(
        repo,
        "merge",
        "-q",
        "--no-ff",
        "side",
        "-m",
        "Merge pull request #202 from dev/side",
    )
    c[6] = git(repo, "rev-parse", "HEAD").strip()
    c[7] = _commit(repo, "[Misc] g again (#17)", {"vllm/g.py": lines({2: "g2"})})
    c[8] = _commit(repo, "[Misc] g once more (#18)", {"vllm/g.py": lines({3: "g3"})})
    wheels = {}
    built = tmp_path / "built"
    for k, sha in [*c.items(), ("s1", s1)]:
        git(repo, "checkout", "-q", sha)
        version = f"1.0.1.dev{k if k != 's1' else 50}+g{sha[:9]}"
        wheels[sha] = make_wheel(
            built / f"vllm-{version}-cp38-abi3-manylinux_2_31_x86_64.whl",
            version, "g" + sha[:9], _tree(repo),
        )  # fmt: skip
    git(repo, "checkout", "-q", "main")
    # the pin: release 1.0.0 at c0 (a short commit id, as a release reports it)
    git(repo, "checkout", "-q", c[0])
    make_wheel(stack.wheel, "1.0.0", "g" + c[0][:9], _tree(repo))
    git(repo, "checkout", "-q", "main")
    write_stack_toml(stack.root, stack.wheel, "1.0.0", "g" + c[0][:9])
    del wheels[c[0]]
    assert stack.run("apply") == 0
    edits = [
        ("a", {5: "line 5 ours"}), ("a again", {5: "line 5 ours twice"}),
        ("b", {20: "line 20 ours"}), ("c", {10: "line 10 ours"}),
        ("d", {30: "line 30 ours"}), ("e", {10: "line 10 ours"}),
        ("f", {5: "line 5 ours"}),
    ]  # fmt: skip
    done: dict[str, dict] = {}
    for what, change in edits:
        f = what[0]
        done[f] = {**done.get(f, {}), **change}
        stack.commit_on_work(
            f"vllm/{f}.py", lines(done[f]),
            f"[EPLB] Edit {what}\n\nOur change to {f}.py.\n\nUpstream-Status: pending\n"
            "Signed-off-by: T <t@x>",
        )  # fmt: skip
    assert stack.run("export") == 0
    # the stack is a checkout with an origin, for --publish
    (stack.root / ".gitignore").write_text(
        "/.vstack/\n/dist/\n/.venv/\n/drift-report/\n"
    )
    # as in this repository: scripts/drift and a CPU test venv (.venv) in the checkout
    (stack.root / "scripts").mkdir()
    (stack.root / "scripts/drift").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{ROOT}/scripts/drift" '
        '--root "$(cd "$(dirname "$0")/.." && pwd)" "$@"\n'
    )
    (stack.root / "scripts/drift").chmod(0o755)
    (stack.root / ".venv/bin").mkdir(parents=True)
    (stack.root / ".venv/bin/python").symlink_to(sys.executable)
    (stack.root / ".gitmodules").write_text(
        f'[submodule "vllm"]\n\tpath = vllm\n\turl = file://{repo}\n'
    )
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(stack.root, "init", "-q", "-b", "main")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "the stack")
    git(stack.root, "remote", "add", "origin", str(origin))
    git(stack.root, "push", "-q", "origin", "main")
    index = tmp_path / "per-commit"
    return {"repo": repo, "c": c, "s1": s1, "wheels": wheels, "index": index,
            "origin": origin}  # fmt: skip


def _drift(stack, up, tmp_path, nightly: str, *extra: str):
    per_commit_repo(up["index"], up["wheels"], nightly)
    out = tmp_path / "out"
    with serve(up["index"]) as url:
        p = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "drift"), "--root", str(stack.root),
             "--wheel-index", url, "--out", str(out), "--python", sys.executable,
             *extra],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    report = json.loads((out / "drift.json").read_text())
    return p, report, out


def _rows(report) -> dict[str, dict]:
    return {r["patch"]: r for r in report["patches"]}


def test_drift_tries_every_patch_and_names_the_commit_that_broke_each(
    stack, upstream, tmp_path
):
    c = upstream["c"]
    p, report, out = _drift(
        stack, upstream, tmp_path, c[8], "--vllm-repo", str(upstream["repo"])
    )
    assert p.returncode == 1, p.stdout + p.stderr
    rows = _rows(report)
    assert [r["patch"] for r in report["patches"]] == read_series(
        stack.root / "patches"
    )
    got = {n: (r["status"], r.get("blocked_by")) for n, r in rows.items()}
    assert got == {
        "eplb-edit-a.patch": ("conflict", None),
        "eplb-edit-a-again.patch": ("blocked", "eplb-edit-a.patch"),
        "eplb-edit-b.patch": ("conflict", None),
        "eplb-edit-c.patch": ("offset", None),
        "eplb-edit-d.patch": ("dropped-upstream", None),
        "eplb-edit-e.patch": ("3way", None),
        "eplb-edit-f.patch": ("clean", None),
    }
    # upstream broke a at c3 (a squash merge naming its PR) and b at c6 (a merge
    # of a side branch: first-parent, the merge is the commit on main)
    assert rows["eplb-edit-a.patch"]["first_bad"] == {
        "commit": c[3], "subject": "[EPLB] rework line 5 of a.py (#101)", "pr": 101,
    }  # fmt: skip
    assert rows["eplb-edit-b.patch"]["first_bad"] == {
        "commit": c[6], "subject": "Merge pull request #202 from dev/side", "pr": None,
    }  # fmt: skip
    assert rows["eplb-edit-a-again.patch"]["first_bad"]["commit"] == c[3]
    probed = report["bisection"]["probes"]
    assert upstream["s1"] not in probed and len(probed) == 5
    assert report["bisection"]["commits"] == 8
    md = (out / "drift.md").read_text()
    # each patch and its first bad commit on one line
    line_a = next(
        ln for ln in md.splitlines() if ln.startswith("| 1 | eplb-edit-a.patch")
    )
    assert (
        f"| conflict | {c[3]} `[EPLB] rework line 5 of a.py (#101)` (PR #101) |"
        in line_a
    )
    assert any(
        ln.startswith("| 3 | eplb-edit-b.patch | conflict |") and c[6] in ln
        for ln in md.splitlines()
    )
    assert "| 2 | eplb-edit-a-again.patch | blocked by eplb-edit-a.patch |" in md
    assert "| 6 | eplb-edit-e.patch | 3-way |" in md
    assert "| 5 | eplb-edit-d.patch | dropped upstream |" in md
    assert "not reached" not in md + p.stdout
    assert "**FAIL**: 3 of 7 patches stop applying" in md
    # the one command that reproduces it, and no path into drift's deleted copy
    assert (
        f"Reproduce locally: `scripts/vstack rebase --onto {c[8]} --wheel-index http://127.0.0.1:"
        in md
    )
    assert f"drift: reproduce locally: scripts/vstack rebase --onto {c[8]}" in p.stdout
    for text in [p.stdout, p.stderr] + [
        f.read_text() for f in out.iterdir() if f.is_file()
    ]:
        assert "vstack-drift-" not in text
    assert "resolve the conflict markers" not in p.stdout + p.stderr
    # the progress calls a patch drift leaves out what it is (vstack's --skip in
    # the copy says "superseded")
    assert (
        "  [1/7] conflict         eplb-edit-a.patch (left out: the patches after it "
        "are tried without it)\n" in p.stdout
    )
    assert "superseded" not in p.stdout
    assert "bisect cost: 5 wheel(s) fetched, 0 from the cache" in p.stdout

    # Again, the repository now from .gitmodules (a URL: a commits-only clone is
    # cached): the sources of every commit probed come from the cache.
    p2, report2, out2 = _drift(stack, upstream, tmp_path, c[8])
    assert p2.returncode == 1
    assert "bisect cost: 0 wheel(s) fetched, 5 from the cache" in p2.stdout
    strip = ("repository",)
    assert {k: v for k, v in report2["bisection"].items() if k not in strip} == {
        k: v for k, v in report["bisection"].items() if k not in strip
    }
    assert report2["patches"] == report["patches"]

    # A bounded bisection says where it stopped: a range, never a guess.
    p3, report3, _ = _drift(stack, upstream, tmp_path, c[8], "--max-probes", "2")
    assert p3.returncode == 1
    rows3 = _rows(report3)
    assert "first_bad" not in rows3["eplb-edit-a.patch"]
    assert rows3["eplb-edit-a.patch"]["first_bad_range"] == {
        "after": c[2], "through": c[4], "commits": 2,
        "why": "the probe budget (--max-probes 2) ran out",
    }  # fmt: skip
    assert rows3["eplb-edit-b.patch"]["first_bad_range"]["after"] == c[4]


def test_drift_names_a_range_where_the_wheel_repository_has_no_wheels(
    stack, upstream, tmp_path
):
    """vLLM's per-commit repository has gaps (a commit whose build failed): the
    bisection probes the nearest commit that has one, and where none is left says
    so with the range, not a guess."""
    c = upstream["c"]
    for k in (3, 5):
        del upstream["wheels"][c[k]]
    p, report, _ = _drift(
        stack, upstream, tmp_path, c[8], "--vllm-repo", str(upstream["repo"])
    )
    assert p.returncode == 1, p.stdout + p.stderr
    rows = _rows(report)
    none = "the wheel repository has no wheel for the commits between"
    assert rows["eplb-edit-a.patch"]["first_bad_range"] == {
        "after": c[2], "through": c[4], "commits": 2, "why": none,
    }  # fmt: skip
    assert rows["eplb-edit-b.patch"]["first_bad_range"] == {
        "after": c[4], "through": c[6], "commits": 2, "why": none,
    }  # fmt: skip
    assert {c[3], c[5]} <= set(report["bisection"]["probes"])
    assert (
        f"one of 2 commits after {c[2][:12]} up to {c[4]}"
        in (tmp_path / "out/drift.md").read_text()
    )


def _gh_standin(tmp_path: Path, monkeypatch) -> Path:
    """A `gh` on PATH that records each call (and the body it was given) in
    state.json, and answers list/create/edit from what it recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "gh-state.json"
    (bin_dir / "gh").write_text(
        f"#!{sys.executable}\n"
        + r"""
import json, os, sys
path = os.environ["GH_STANDIN_STATE"]
s = json.load(open(path)) if os.path.exists(path) else {"calls": [], "issues": [], "prs": []}
a = sys.argv[1:]
body = open(a[a.index("--body-file") + 1]).read() if "--body-file" in a else None
s["calls"].append({"args": a, "body": body})
def opt(name):
    return a[a.index(name) + 1] if name in a else None
cmd = tuple(a[:2])
out = ""
if cmd == ("label", "create"):
    pass
elif cmd == ("issue", "list"):
    out = json.dumps([{"number": i["number"], "title": i["title"]} for i in s["issues"]
                      if i["open"] and opt("--label") in i["labels"]])
elif cmd == ("issue", "create"):
    n = len(s["issues"]) + 1
    s["issues"].append({"number": n, "title": opt("--title"), "body": body,
                        "labels": [opt("--label")], "open": True})
    out = f"https://github.test/o/r/issues/{n}"
elif cmd == ("issue", "edit"):
    i = s["issues"][int(a[2]) - 1]
    i.update(title=opt("--title"), body=body)
elif cmd == ("issue", "comment"):
    pass
elif cmd == ("issue", "close"):
    s["issues"][int(a[2]) - 1]["open"] = False
elif cmd == ("pr", "list"):
    out = json.dumps([{"number": p["number"], "url": p["url"]} for p in s["prs"]
                      if p["head"] == opt("--head")])
elif cmd == ("pr", "create"):
    n = 100 + len(s["prs"])
    url = f"https://github.test/o/r/pull/{n}"
    s["prs"].append({"number": n, "url": url, "head": opt("--head"),
                     "base": opt("--base"), "title": opt("--title"), "body": body})
    out = url
elif cmd == ("pr", "edit"):
    p = next(p for p in s["prs"] if p["number"] == int(a[2]))
    p.update(title=opt("--title"), body=body)
else:
    print(f"gh stand-in: unknown command {a}", file=sys.stderr)
    sys.exit(1)
json.dump(s, open(path, "w"), indent=1)
print(out)
"""
    )
    (bin_dir / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GH_STANDIN_STATE", str(state))
    return state


def _step(needle: str) -> dict:
    import yaml  # in the CPU test lock: the workflow's steps are never skipped

    job = yaml.safe_load((ROOT / "ci" / "drift.yml").read_text())["jobs"]["drift"]
    return next(s for s in job["steps"] if needle in s.get("run", ""))


def _ci(stack, up, nightly: str, step: str) -> subprocess.CompletedProcess:
    """A step of ci/drift.yml as the job runs it: its `run` text, in the checkout,
    with the job's ONTO (the schedule's) and the index served here."""
    per_commit_repo(up["index"], up["wheels"], nightly)
    with serve(up["index"]) as url:
        return subprocess.run(
            ["bash", "-e", "-c", _step(step)["run"]], cwd=stack.root,
            env={**os.environ, "ONTO": "nightly", "VSTACK_WHEEL_INDEX": url},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip


def _calls(state: Path) -> list[list[str]]:
    return [c["args"][:2] for c in json.loads(state.read_text())["calls"]]


def test_the_workflow_opens_one_issue_then_one_bump_pr(
    stack, upstream, tmp_path, monkeypatch
):
    """ci/drift.yml's drift and publish steps, run as written, against the stand-in
    gh and a local origin."""
    c = upstream["c"]
    state = _gh_standin(tmp_path, monkeypatch)
    head = git(stack.root, "rev-parse", "HEAD")
    report = stack.root / "drift-report" / "drift.json"
    publish = _step("--publish")
    assert "steps.drift.outcome == 'failure'" in publish["if"]
    assert "!cancelled()" in publish["if"] and publish["env"]["GH_TOKEN"]

    # A nightly that breaks patches: one issue, opened then updated in place.
    p = _ci(stack, upstream, c[8], "scripts/drift --onto")
    assert p.returncode == 1, p.stdout + p.stderr
    for _ in range(2):
        pub = _ci(stack, upstream, c[8], "--publish")
        assert pub.returncode == 0, pub.stdout + pub.stderr
    s = json.loads(state.read_text())
    assert _calls(state) == [
        ["label", "create"], ["issue", "list"], ["issue", "create"],
        ["label", "create"], ["issue", "list"], ["issue", "edit"],
    ]  # fmt: skip
    (issue,) = s["issues"]
    assert issue["title"] == (
        f"vLLM drift: 3 patch(es) stop applying on vLLM 1.0.1.dev8+g{c[8][:9]} "
        f"(commit {c[8][:12]})"
    )
    assert issue["labels"] == ["vstack-drift"]
    body = issue["body"]
    assert f"scripts/vstack rebase --onto {c[8]}" in body
    assert f"- eplb-edit-a.patch (conflict): {c[3]} `[EPLB] rework line 5" in body
    assert f"- eplb-edit-b.patch (conflict): {c[6]} `Merge pull request #202" in body
    assert "- eplb-edit-a-again.patch (blocked by eplb-edit-a.patch): " in body

    # A nightly that applies: the bump is pushed to one branch, one PR opened, the
    # issue closed; the checkout is as it was.
    p = _ci(stack, upstream, c[2], "scripts/drift --onto")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(report.read_text())["verdict"] == "ok"
    pub = _ci(stack, upstream, c[2], "--publish")
    assert pub.returncode == 0, pub.stdout + pub.stderr
    s = json.loads(state.read_text())
    (pr,) = s["prs"]
    assert pr["head"] == "vstack/drift-bump" and pr["base"] == "main"
    assert (
        pr["title"]
        == f"vLLM bump: 1.0.0 -> vLLM 1.0.1.dev2+g{c[2][:9]} (commit {c[2][:12]})"
    )
    assert "**OK**: rebases, builds, tests pass" in pr["body"]
    assert not s["issues"][0]["open"]
    origin = upstream["origin"]
    pushed = git(origin, "show", "vstack/drift-bump:stack.toml")
    assert f'commit = "g{c[2]}"' in pushed
    msg = git(origin, "log", "-1", "--format=%B", "vstack/drift-bump")
    assert f"Vstack-Drift-Nightly: {c[2]}" in msg
    assert git(origin, "rev-parse", "vstack/drift-bump^") == head
    assert git(stack.root, "rev-parse", "HEAD") == head
    assert git(stack.root, "status", "--porcelain") == ""
    listed = git(stack.root, "worktree", "list", "--porcelain").splitlines()
    assert [x for x in listed if x.startswith("worktree ")] == [
        f"worktree {stack.root}"
    ]

    # The next good nightly updates the same PR (the branch is drift's own) ...
    p = _ci(stack, upstream, c[1], "scripts/drift --onto")
    assert p.returncode == 0, p.stdout + p.stderr
    before = len(_calls(state))
    pub = _ci(stack, upstream, c[1], "--publish")
    assert pub.returncode == 0, pub.stdout + pub.stderr
    assert len(json.loads(state.read_text())["prs"]) == 1
    assert _calls(state)[before:] == [["pr", "list"], ["pr", "edit"], ["issue", "list"]]
    assert f'commit = "g{c[1]}"' in git(origin, "show", "vstack/drift-bump:stack.toml")
    # ... but a commit someone else pushed to it is never overwritten.
    clone = tmp_path / "someone"
    git(tmp_path, "clone", "-q", "-b", "vstack/drift-bump", str(origin), str(clone))
    (clone / "NOTES").write_text("mine\n")
    git(clone, "add", "NOTES")
    git(clone, "commit", "-q", "-m", "a fix of mine")
    git(clone, "push", "-q", "origin", "vstack/drift-bump")
    theirs = git(origin, "rev-parse", "vstack/drift-bump")
    pub = _ci(stack, upstream, c[1], "--publish")
    assert pub.returncode == 1
    assert "has commits drift did not make" in pub.stderr
    assert git(origin, "rev-parse", "vstack/drift-bump") == theirs


def _publish(stack, out):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "drift"), "--publish",
         "--root", str(stack.root), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_publish_refuses_a_report_of_other_files_than_head(
    stack, upstream, tmp_path, monkeypatch
):
    """drift copies the work tree; the bump is committed on HEAD: a report made from
    uncommitted patches/ would put them in the PR unseen."""
    state = _gh_standin(tmp_path, monkeypatch)
    series = stack.root / "patches/series"
    series.write_text(series.read_text() + "# a local note\n")
    p, report, out = _drift(stack, upstream, tmp_path, upstream["c"][2])
    assert p.returncode == 0, p.stdout + p.stderr
    pub = _publish(stack, out)
    assert pub.returncode == 1
    assert (
        "made from other files than HEAD" in pub.stderr
        and "patches/series" in pub.stderr
    )
    assert not state.exists() or _calls(state) == []
    heads = git(upstream["origin"], "for-each-ref", "--format=%(refname)", "refs/heads")
    assert heads.split() == ["refs/heads/main"]


def test_pr_number_is_the_last_parenthesised_one():
    assert pr_number("[EPLB] Fix (#123)") == 123
    assert pr_number('Revert "[EPLB] Fix (#123)" (#456)') == 456
    assert pr_number("Merge pull request #202 from dev/side") is None
    assert pr_number("see #12 and (#x)") is None


@pytest.mark.parametrize("seed", range(300))
def test_bisection_finds_each_first_bad_commit(seed):
    """For any range, patches with any first bad commit (stopping is monotone) and
    any commits without a wheel: each patch ends with the smallest interval the
    wheels allow around its first bad commit, within the expected probe count.
    (Generated inputs, seeded: the lock has no hypothesis.)"""
    rnd = random.Random(seed)
    n = rnd.choice([1, 2, 3, rnd.randint(1, 40), rnd.randint(1, 3000)])
    k = rnd.randint(1, 5)
    first = {f"p{i}": rnd.randint(1, n) for i in range(k)}
    if rnd.random() < 0.3:  # several patches broken by one commit
        first = dict.fromkeys(first, rnd.randint(1, n))
    holes = set(rnd.sample(range(1, n), min(n - 1, rnd.choice([0, 1, 5, 40]))))
    b = Bisection(list(first), n)
    probes = 0
    while (i := b.next_probe()) is not None:
        probes += 1
        assert 0 < i < n and i not in b.skipped
        if i in holes:
            b.skip(i)
        else:
            b.record(i, {p for p, f in first.items() if i >= f})
    for p, f in first.items():
        lo, hi = b.lo[p], b.hi[p]
        assert lo < f <= hi
        assert all(j in holes for j in range(lo + 1, hi))  # as narrow as wheels allow
        if not holes:
            assert hi == f and b.exact(p)
    distinct = len(set(first.values()))
    assert probes <= distinct * n.bit_length() + len(holes)


def test_drift_tries_the_rest_itself_when_the_rebase_cannot_go_past_a_stop(
    stack, upstream, tmp_path, monkeypatch, capsys
):
    """Should `vstack rebase --skip` not move the copy's rebase on (it refuses a
    patch that `git apply --3way` takes although `git am -3` did not), drift tries
    the patches after the stop itself, as the rebase would have: never "not
    reached"."""
    from vstack import drift

    real = drift.Copy.vstack

    def no_skip(self, *args, **kw):
        return 1 if "--skip" in args else real(self, *args, **kw)

    monkeypatch.setattr(drift.Copy, "vstack", no_skip)
    per_commit_repo(upstream["index"], upstream["wheels"], upstream["c"][8])
    out = tmp_path / "out"
    with serve(upstream["index"]) as url:
        rc = drift.main(["--root", str(stack.root), "--wheel-index", url,
                         "--out", str(out), "--max-probes", "0"])  # fmt: skip
    assert rc == 1, capsys.readouterr()
    rows = _rows(json.loads((out / "drift.json").read_text()))
    assert {n: r["status"] for n, r in rows.items()} == {
        "eplb-edit-a.patch": "conflict", "eplb-edit-a-again.patch": "blocked",
        "eplb-edit-b.patch": "conflict", "eplb-edit-c.patch": "offset",
        "eplb-edit-d.patch": "dropped-upstream", "eplb-edit-e.patch": "3way",
        "eplb-edit-f.patch": "clean",
    }  # fmt: skip
    assert rows["eplb-edit-f.patch"]["details"] == [
        "tried by drift on top of where the rebase stopped (the rebase did not go on "
        "after eplb-edit-a.patch)"
    ]


def test_an_upstream_subject_is_inline_code_in_the_report():
    """A subject's @name (vLLM's say @torch.compile) must not mention a GitHub user
    in the issue, nor its | split the table."""
    from vstack.drift import render_md

    row = {
        "patch": "p.patch", "status": "conflict", "files": [], "details": [],
        "first_bad": {"commit": "a" * 40, "subject": "[Core] @torch.compile | `x` (#5)",
                      "pr": 5},
    }  # fmt: skip
    md = render_md({"target": "nightly", "verdict": "fail", "summary": "s",
                    "rebased": True, "old": None, "new": None, "patches": [row]})  # fmt: skip
    line = next(ln for ln in md.splitlines() if ln.startswith("| 1 |"))
    assert f"| {'a' * 40} `` [Core] @torch.compile \\| `x` (#5) `` (PR #5) |" in line
    assert "- p.patch (conflict): " + "a" * 40 + " `` [Core] @torch.compile | `x`" in md
