"""vLLM's own pre-commit hooks on the files a patch changes.

When a vLLM checkout is at hand (the populated vllm/ submodule, or --git), its commit
with the patch applied is checked out in a temporary worktree, reset --soft to the
patch's parent so that the patch is the staged change (vLLM's diff-based hooks read
`git diff --cached`), and `pre-commit run --files <the patch's files>` runs there.
Without a checkout, the config or pre-commit, vstack's restated checks stand alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from vstack import gitutil, settings
from vstack.config import Project
from vstack.errors import VstackError

CONFIG = ".pre-commit-config.yaml"
_STATUS = re.compile(r"^(.+?)\.{3,}(\(no files to check\))?(Passed|Failed|Skipped)$")


@dataclasses.dataclass
class HookFailure:
    hook: str  # the hook id (or its name when pre-commit prints no id)
    output: list[str]

    def summary(self) -> str:
        first = next((ln.strip() for ln in self.output if ln.strip()), "")
        return f"vLLM pre-commit hook {self.hook} failed" + (
            f": {first}" if first else ""
        )


def parse_output(text: str) -> list[HookFailure]:
    """The failed hooks of a `pre-commit run` and what each printed."""
    failures: list[HookFailure] = []
    current: HookFailure | None = None
    for line in text.splitlines():
        m = _STATUS.match(line.rstrip())
        if m:
            current = None
            if m.group(3) == "Failed":
                current = HookFailure(m.group(1).strip(), [])
                failures.append(current)
            continue
        if current is None:
            continue
        if line.startswith("- hook id: "):
            current.hook = line[len("- hook id: ") :].strip()
        elif not line.startswith(("- exit code:", "- files were modified")):
            current.output.append(line)
    return failures


def find_pre_commit(project: Project) -> str | None:
    env = os.environ.get("VSTACK_PRE_COMMIT")
    if env:
        return env
    for cand in (
        Path(sys.executable).parent / "pre-commit",
        shutil.which("pre-commit"),
    ):
        if cand and Path(cand).exists():
            return str(cand)
    from vstack.check import test_env_python

    py = test_env_python(project)
    if py and (py.parent / "pre-commit").exists():
        return str(py.parent / "pre-commit")
    return None


def why_not(project: Project, repo: Path, base: str) -> str | None:
    """Why vLLM's hooks cannot run on commits of repo based on `base`, or None."""
    if gitutil.git(repo, "cat-file", "-e", f"{base}:{CONFIG}", check=False).returncode:
        return f"the vLLM base {base[:12]} has no {CONFIG}"
    if find_pre_commit(project) is None:
        return (
            "pre-commit is not installed (pip install pre-commit, or VSTACK_PRE_COMMIT)"
        )
    return None


def run_on_commit(
    project: Project, repo: Path, parent: str, commit: str
) -> list[HookFailure]:
    """vLLM's hooks on the files `commit` changes, staged on top of `parent`."""
    files = [
        path
        for status, path, _ in gitutil.tree_changes(repo, parent, commit)
        if status != "D"
    ]
    if not files:
        return []
    timeout = settings.env_seconds("VSTACK_PRE_COMMIT_TIMEOUT", 1800)
    with gitutil.temp_worktree(repo, commit, project.cache) as tree:
        gitutil.git(tree, "reset", "-q", "--soft", parent)
        try:
            p = subprocess.run(
                [find_pre_commit(project), "run", "--color=never", "--files", *files],
                cwd=tree, capture_output=True, text=True, timeout=timeout,
                env=gitutil.git_env(),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise VstackError(
                f"vLLM's pre-commit hooks ran past {timeout:.0f} s "
                f"(VSTACK_PRE_COMMIT_TIMEOUT)"
            ) from None
    failures = parse_output(p.stdout + p.stderr)
    if p.returncode != 0 and not failures:
        last = ((p.stdout + p.stderr).strip().splitlines() or ["?"])[-1]
        failures = [HookFailure("pre-commit", [last])]
    return failures


def on_series(project: Project, git_path: str | None):
    """vLLM's hooks on each patch of the series, applied on the pinned commit of
    the vLLM checkout: (findings as (patch name, message), a one-line note)."""
    from vstack.base import base_from_git, submodule_head
    from vstack.export import applied_tip
    from vstack.series import series_paths

    if git_path:
        checkout = Path(git_path).resolve()
        if not gitutil.is_repo(checkout):
            raise VstackError(f"{checkout} is not a git checkout")
    elif submodule_head(project):
        checkout = project.submodule
    else:
        return (
            [],
            "vLLM's own hooks not run: no vLLM checkout (populate vllm/ or --git)",
        )
    rev = gitutil.rev_parse(checkout, project.pin.short_hash)
    if rev is None:
        return [], f"vLLM's own hooks not run: {checkout} lacks the pinned commit"
    base = base_from_git(project, checkout, rev, project.pin.version)
    reason = why_not(project, project.repo, base.commit)
    if reason:
        return [], f"vLLM's own hooks not run: {reason}"
    patches = series_paths(project.patches_dir)
    tip = applied_tip(project, base, patches)
    commits = gitutil.out(
        project.repo, "rev-list", "--reverse", f"{base.commit}..{tip}"
    ).split()
    if len(commits) != len(patches):
        return (
            [],
            "vLLM's own hooks not run: the series does not map to one commit each",
        )
    found = []
    parent = base.commit
    for patch, commit in zip(patches, commits, strict=True):
        for failure in run_on_commit(project, project.repo, parent, commit):
            found.append((patch.name, failure.summary()))
        parent = commit
    return found, f"vLLM's own pre-commit hooks ran on each patch's files ({checkout})"
