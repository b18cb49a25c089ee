"""vstack apply: the series onto a fresh work branch of the base, one `git am -3` each."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path

from vstack import gitutil
from vstack.base import WORK_BRANCH, Base, ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import hunks_at, parse_patch, series_paths

# Commits made by apply are reproducible: same base + series -> same commit ids.
SYNCED_REF = "refs/vstack/synced"

AM_ENV = {
    "GIT_COMMITTER_NAME": gitutil.IDENTITY["GIT_COMMITTER_NAME"],
    "GIT_COMMITTER_EMAIL": gitutil.IDENTITY["GIT_COMMITTER_EMAIL"],
}


@dataclasses.dataclass
class PatchResult:
    patch: str
    status: str  # clean | offset | 3way | conflict
    files: list[str] = dataclasses.field(default_factory=list)
    details: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status != "conflict"


def ensure_clean(repo: Path) -> None:
    op = gitutil.op_in_progress(repo)
    if op:
        raise VstackError(
            f"an unfinished {op} is in {repo}: finish it (git -C {repo} am --continue) "
            f"or drop it (git -C {repo} am --abort) first"
        )
    dirty = gitutil.status_porcelain(repo).splitlines()
    if dirty:
        names = ", ".join(ln[3:] for ln in dirty[:3]) + (
            " ..." if len(dirty) > 3 else ""
        )
        raise VstackError(
            f"{repo} has uncommitted changes ({names}): commit them and run "
            f"`vstack export`, or discard them with `git -C {repo} reset --hard`"
        )


def _check(
    repo: Path, patch: Path
) -> tuple[bool, list[str], list[tuple[str, int | None]]]:
    """git apply --check: (applies, offset notes, failing (file, line))."""
    p = gitutil.git(repo, "apply", "--check", "--verbose", str(patch), check=False)
    text = p.stdout + p.stderr
    offsets = re.findall(r"Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\)\.", text)
    fails: list[tuple[str, int | None]] = []
    for m in re.finditer(r"error: patch failed: (.+):(\d+)", text):
        fails.append((m.group(1), int(m.group(2))))
    for m in re.finditer(
        r"error: (.+): (does not exist in index|No such file|already exists)", text
    ):
        fails.append((m.group(1), None))
    return p.returncode == 0, offsets, fails


def apply_one(repo: Path, patch: Path) -> PatchResult:
    """Apply one patch on HEAD with git am -3 and classify how it went."""
    info = parse_patch(patch.read_text(errors="replace"))
    applies, offsets, fails = _check(repo, patch)
    p = gitutil.git(
        repo, "am", "--3way", "--keep", "--committer-date-is-author-date", "--quiet",
        str(patch), check=False, env=AM_ENV,
    )  # fmt: skip
    if p.returncode == 0:
        if applies and not offsets:
            return PatchResult(patch.name, "clean", info.files)
        if applies:
            return PatchResult(patch.name, "offset", info.files, offsets)
        return PatchResult(
            patch.name, "3way", info.files,
            [f"{f}:{ln} needed a 3-way merge" for f, ln in fails],
        )  # fmt: skip
    conflicted = gitutil.out(
        repo, "diff", "--name-only", "--diff-filter=U"
    ).splitlines()
    details = []
    for f, ln in fails or [(f, None) for f in conflicted]:
        for h in hunks_at(info, f, ln):
            details.append(f"{f}: hunk {h.header.split('@@')[1].strip()} failed")
        if not hunks_at(info, f, ln):
            details.append(f"{f}: does not apply")
    if not details:
        details = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-3:]
    return PatchResult(
        patch.name, "conflict", conflicted or sorted({f for f, _ in fails}), details
    )


def start_work_branch(repo: Path, base: Base, branch: str = WORK_BRANCH) -> None:
    gitutil.git(repo, "checkout", "-q", "-f", "-B", branch, base.commit)


def backup_branch(repo: Path, branch: str = WORK_BRANCH) -> str | None:
    """Keep the branch's tip under refs/vstack/backup/ before it is reset."""
    tip = gitutil.rev_parse(repo, f"refs/heads/{branch}")
    if tip is None:
        return None
    ref = f"refs/vstack/backup/{branch}-{time.strftime('%Y%m%d-%H%M%S')}"
    gitutil.git(repo, "update-ref", ref, tip)
    return ref


def apply_patches(repo: Path, patches: list[Path], log=print) -> list[PatchResult]:
    results = []
    for i, patch in enumerate(patches, 1):
        r = apply_one(repo, patch)
        results.append(r)
        log(f"  [{i}/{len(patches)}] {r.status:<8} {patch.name}")
        for d in r.details:
            log(f"             {d}")
        if not r.ok:
            break
    return results


def unexported_work(project: Project, base: Base) -> list[str]:
    """patches/ files the work branch would change, if it has commits made since the
    last apply/export (empty when the branch is exactly what vstack left there)."""
    from vstack.export import unexported_changes

    tip = gitutil.rev_parse(project.repo, f"refs/heads/{WORK_BRANCH}")
    if tip is None or tip == gitutil.rev_parse(project.repo, SYNCED_REF):
        return []
    return unexported_changes(project, base)


def cmd_apply(project: Project, force: bool = False) -> int:
    patches = series_paths(project.patches_dir)
    base = ensure_base(project)
    repo = project.repo
    ensure_clean(repo)
    changed = unexported_work(project, base)
    if changed:
        if not force:
            raise VstackError(
                f"branch '{WORK_BRANCH}' in {repo} has commits that patches/ does not have "
                f"({', '.join(changed[:3])}): run `vstack export` first, or "
                f"`vstack apply --force` to start over (the old tip is kept as a backup ref)"
            )
        log_ref = backup_branch(repo)
        print(f"vstack: old work branch kept as {log_ref}")
    start_work_branch(repo, base)
    try:
        rc = _apply_and_report(project, base, patches)
    finally:
        mark_synced(repo)
    return rc


def mark_synced(repo: Path) -> None:
    """Record that the work branch holds nothing patches/ lacks (after apply/export)."""
    tip = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if tip:
        gitutil.git(repo, "update-ref", SYNCED_REF, tip)


def _apply_and_report(project: Project, base: Base, patches: list[Path]) -> int:
    repo = project.repo
    print(
        f"vstack: applying {len(patches)} patch(es) onto {base.version} ({base.commit[:12]}, from {base.source})"
    )
    results = apply_patches(repo, patches)
    if results and not results[-1].ok:
        r = results[-1]
        print(
            f"vstack: {r.patch} does not apply; the work tree {repo} is left in "
            f"`git am` state for inspection.\n"
            f"  resolve, `git -C {repo} add <files> && git -C {repo} am --continue`, "
            f"then `vstack export`; or `git -C {repo} am --abort`.",
            file=sys.stderr,
        )
        return 1
    print(f"vstack: work branch '{WORK_BRANCH}' ready in {repo}")
    return 0
