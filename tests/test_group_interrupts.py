"""Ctrl-C inside a git child (issue 28, defect 11): SIGINT to vstack's whole process
group, as a terminal sends it, right after any change git makes to the file system
(tests/group_interrupts.py), then the command vstack prints when interrupted: the
run ends as the uninterrupted one does (patches/, stack.toml, resolutions/, the
report, the work branch, the sync record), whatever git was in the middle of
(`git init`, `git checkout -f -B`, `git am`, `git am --continue`, ...)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from group_interrupts import printed_command, run
from hypothesis import given
from hypothesis import strategies as st
from props import bounded
from series_lab import (
    commit,
    commit_project,
    hand_series,
    lines,
    message,
    new_wheel,
    repin,
)
from test_interrupts import _outputs


@dataclasses.dataclass
class Step:
    args: list[str]
    rc: int
    then: object = None  # fn(root) after the step (a user's resolution)


def _series(stack):
    repin(stack, {f"vllm/{x}.py": lines() for x in "abc"})

    def commits(repo):
        for i, x in enumerate("abc"):
            (repo / f"vllm/{x}.py").write_bytes(lines(changes={5 + i: f"ours {x}"}))
            commit(repo, message(f"[EPLB] Change {x}"))
        (repo / "vllm/new.py").write_bytes(b"N = 1\n")
        commit(repo, message("[EPLB] New module"))

    hand_series(stack, commits)


def _fresh_apply(stack, tmp):
    """A fresh clone: patches/ committed, no .vstack at all."""
    _series(stack)
    shutil.rmtree(stack.root / ".vstack")
    return [Step(["apply"], 0)]


def _resolve_b(root: Path):
    (root / ".vstack/repo/vllm/b.py").write_bytes(
        lines(changes={6: "ours b and upstream"})
    )


def _rebase_with_a_conflict(stack, tmp):
    _series(stack)
    new = new_wheel(
        tmp / "new",
        {"vllm/a.py": lines(changes={5: "ours a"}),  # merged: dropped-upstream
         "vllm/b.py": lines(changes={6: "upstream b"}),  # conflicts
         "vllm/c.py": lines(changes={20: "upstream c"})},  # 3way/offset
    )  # fmt: skip
    return [
        Step(["rebase", "--onto", str(new)], 1, _resolve_b),
        Step(["rebase", "--continue"], 0),
    ]


def _apply_stopped_then_continued(stack, tmp):
    _series(stack)
    bad = next((stack.root / "patches").glob("*change-b*"))
    bad.write_bytes(bad.read_bytes().replace(b"-line 6\n", b"-line SIX\n"))
    commit_project(stack)

    def resolve(root):
        (root / ".vstack/repo/vllm/b.py").write_bytes(lines(changes={6: "ours b"}))

    return [Step(["apply", "--force"], 1, resolve), Step(["apply", "--continue"], 0)]


SCENARIOS = {
    "apply on a fresh clone": _fresh_apply,
    "rebase, conflict, --continue": _rebase_with_a_conflict,
    "apply stops, --continue": _apply_stopped_then_continued,
}


def _play(root, steps, work, interrupt=None):
    """Run the steps; with interrupt=(i, k): step i is stopped at git point k, then
    the printed command is run (again while it is itself interrupted... never: once)
    and must end as step i does."""
    for i, step in enumerate(steps):
        if interrupt and interrupt[0] == i:
            got = run(root, step.args, work / f"s{i}", at=interrupt[1])
            if got.rc != 130:
                # the point was not reached in this run (fewer changes): it ran on
                assert got.rc == step.rc, got.err
            else:
                assert "vstack: interrupted" in got.err, got.err
                cmd = printed_command(got.err)
                assert cmd, f"no command printed: {got.err}"
                again = run(root, cmd, work / f"r{i}")
                assert again.rc == step.rc, (cmd, again.err)
        else:
            got = run(root, step.args, work / f"s{i}")
            assert got.rc == step.rc, (step.args, got.err)
        if step.then:
            step.then(root)


_BASELINE: dict[str, tuple] = {}


@bounded(9)
@given(data=st.data())
def test_ctrl_c_inside_git_recovers_with_the_printed_command(stack, tmp_path, data):
    name = data.draw(st.sampled_from(sorted(SCENARIOS)), label="scenario")
    key = (name, str(tmp_path))
    if key not in _BASELINE:
        root = tmp_path / name.replace(" ", "-").replace(",", "")
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(stack.root, root)  # the fixture's empty project
        st_ = type(stack)(root, stack.cache, stack.wheel)
        steps = SCENARIOS[name](st_, tmp_path / f"w-{id(st_)}")
        snap = tmp_path / f"snap-{root.name}"
        shutil.copytree(root, snap, symlinks=True)
        counts = []
        for i, step in enumerate(steps):
            got = run(root, step.args, tmp_path / "count" / str(i))
            assert got.rc == step.rc, (step.args, got.err)
            counts.append(len(got.points))
            if step.then:
                step.then(root)
        _BASELINE[key] = (st_, steps, snap, counts, _outputs(st_))
    st_, steps, snap, counts, want = _BASELINE[key]
    i = data.draw(st.integers(0, len(steps) - 1), label="step")
    k = data.draw(st.integers(1, counts[i]), label="git point")
    shutil.rmtree(st_.root)
    shutil.copytree(snap, st_.root, symlinks=True)
    _play(st_.root, steps, tmp_path / "trial", interrupt=(i, k))
    have = _outputs(st_)
    diff = sorted(n for n in set(have) | set(want) if have.get(n) != want.get(n))
    assert not diff, f"{name}: step {i} point {k}: recovery differs in {diff}"


def test_ctrl_c_in_git_am_is_recovered_by_rerunning_apply(stack, tmp_path):
    """Defect 11 as reported: Ctrl-C lands while `git am` writes a file of the work
    tree; `vstack apply` (what it prints) finishes the series."""
    steps = _fresh_apply(stack, tmp_path)
    snap = tmp_path / "snap"
    shutil.copytree(stack.root, snap, symlinks=True)
    first = run(stack.root, ["apply"], tmp_path / "count")
    assert first.rc == 0
    want = _outputs(stack, report=False)
    inside = [
        n for n, label in enumerate(first.points, 1)
        if label.startswith("git-am open vllm/")
    ]  # fmt: skip
    assert inside, first.points
    for k in (inside[0], inside[-1]):
        shutil.rmtree(stack.root)
        shutil.copytree(snap, stack.root, symlinks=True)
        _play(stack.root, steps, tmp_path / f"t{k}", interrupt=(0, k))
        assert _outputs(stack, report=False) == want, k
