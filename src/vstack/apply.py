"""vstack apply: the series onto a fresh work branch of the base, one `git am -3` each."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from vstack import gitutil
from vstack.base import WORK_BRANCH, Base, ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import hunks_at, load_patch, series_paths

MARKER = re.compile(r"^(<{7}|={7}|>{7}|\|{7})( |$)")

# Commits made by apply are reproducible: same base + series -> same commit ids.
SYNCED_REF = "refs/vstack/synced"

AM_ENV = {
    "GIT_COMMITTER_NAME": gitutil.IDENTITY["GIT_COMMITTER_NAME"],
    "GIT_COMMITTER_EMAIL": gitutil.IDENTITY["GIT_COMMITTER_EMAIL"],
}


@dataclasses.dataclass
class PatchResult:
    patch: str
    status: str  # clean | offset | 3way | conflict | empty (nothing left to commit)
    files: list[str] = dataclasses.field(default_factory=list)
    details: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status not in ("conflict", "empty")


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
            f"`vstack export`, or discard them (untracked files too) with "
            f"`git -C {repo} reset -q --hard && git -C {repo} clean -q -fd`"
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


def rejected_hunks(repo: Path, patch: Path, info) -> list[str]:
    """Every hunk that does not apply on HEAD as it is, per file ("file: hunk -a,b
    +c,d failed"): git apply --check names only the first failing hunk of a file, so
    the files are applied with --reject in a scratch folder outside any repository."""
    with tempfile.TemporaryDirectory(prefix="vstack-rej-") as tmp:
        scratch = Path(tmp) / "t"
        scratch.mkdir()
        present = gitutil.out(repo, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--",
                              *info.files).split("\0")  # fmt: skip
        blobs = gitutil.read_blobs(repo, "HEAD", [f for f in present if f])
        for name, data in blobs.items():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / name).write_bytes(data)
        p = gitutil.git(
            scratch, "apply", "--reject", "--verbose", str(patch.resolve()), check=False,
            env={"GIT_CEILING_DIRECTORIES": tmp},
        )  # fmt: skip
    text = p.stdout + p.stderr
    found, current = [], None
    for line in text.splitlines():
        m = re.match(
            r"(?:Applying|Checking) patch (.+?)(?: with \d+ rejects?)?\.\.\.$", line
        )
        if m:
            current = m.group(1)
            continue
        m = re.match(r"Rejected hunk #(\d+)\.", line)
        if m and current:
            hs = [h for h in info.hunks if h.file == current]
            k = int(m.group(1)) - 1
            if k < len(hs):
                found.append(
                    f"{current}: hunk {hs[k].header.split('@@')[1].strip()} failed"
                )
    return found


def apply_one(repo: Path, patch: Path) -> PatchResult:
    """Apply one patch on HEAD with git am -3 and classify how it went."""
    _, info = load_patch(patch)
    applies, offsets, fails = _check(repo, patch)
    before = gitutil.rev_parse(repo, "HEAD")
    p = gitutil.git(
        repo, "am", "--3way", "--keep", "--committer-date-is-author-date", "--quiet",
        str(patch), check=False, env=AM_ENV,
    )  # fmt: skip
    if p.returncode == 0:
        if gitutil.rev_parse(repo, "HEAD") == before:
            # git am -3 says "No changes -- Patch already applied." and commits nothing.
            return PatchResult(
                patch.name, "empty", info.files,
                ["the 3-way merge left no change: the base already has all of it"],
            )  # fmt: skip
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
    said = (p.stdout + p.stderr).splitlines()
    fatal = [ln for ln in said if ln.startswith("fatal:")]
    lock = gitutil.held_lock(p.stdout + p.stderr)
    if lock or (not conflicted and (applies or fatal)):
        # Not the patch's fault (a lock, a full disk, ...): never call this a conflict,
        # or a --skip would record the patch as superseded.
        why = (
            f"{lock} exists (a git is running there, or was killed)"
            if lock
            else (fatal or [ln for ln in said if ln.strip()] or ["?"])[-1]
        )
        if gitutil.op_in_progress(repo):
            gitutil.git(repo, "am", "--abort", check=False)
        raise VstackError(
            f"git am of {patch.name} failed in {repo} for a reason other than a "
            f"conflict: {why}"
        )
    details = rejected_hunks(repo, patch, info) if fails else []
    if not details:
        for f, ln in fails or [(f, None) for f in conflicted]:
            for h in hunks_at(info, f, ln):
                details.append(f"{f}: hunk {h.header.split('@@')[1].strip()} failed")
            if not hunks_at(info, f, ln):
                details.append(f"{f}: does not apply")
    for f, ln in fails:
        if ln is None and not any(d.startswith(f"{f}:") for d in details):
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


def apply_patches(
    repo: Path, patches: list[Path], log=print, first: int = 1, total: int | None = None
) -> list[PatchResult]:
    results = []
    total = total or len(patches)
    for i, patch in enumerate(patches, first):
        r = apply_one(repo, patch)
        results.append(r)
        log(f"  [{i}/{total}] {r.status:<8} {patch.name}")
        for d in r.details:
            log(f"             {d}")
        if not r.ok:
            break
    return results


# ---------------------------------------------------------------- a stopped apply
# While `vstack apply` is stopped at patch k, the work branch holds patches 1..k-1
# only: exporting it would delete k..n from patches/. The stop is recorded until the
# series is through (apply --continue) or the branch is rebuilt.
STOP_FILE = "apply-stopped.json"


def stopped_apply(project: Project) -> dict | None:
    path = project.cache / STOP_FILE
    if (
        not path.is_file()
        or gitutil.rev_parse(project.repo, f"refs/heads/{WORK_BRANCH}") is None
    ):
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"series": [], "index": 0, "before": None}


def _save_stop(project: Project, names: list[str], index: int) -> None:
    path = project.cache / STOP_FILE
    data = {
        "series": names,
        "index": index,  # 1-based position of the patch that stopped
        "before": gitutil.rev_parse(project.repo, "HEAD"),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def clear_stop(project: Project) -> None:
    (project.cache / STOP_FILE).unlink(missing_ok=True)


def require_whole_series(project: Project) -> None:
    """Refuse when the work branch lacks the end of the series (a stopped apply)."""
    stop = stopped_apply(project)
    if stop is None:
        return
    names, k = stop.get("series", []), stop.get("index", 0)
    name = names[k - 1] if 0 < k <= len(names) else "?"
    missing = len(names) - k + 1 if names else "some"
    raise VstackError(
        f"the last `vstack apply` stopped at patch {k}/{len(names)} ({name}): branch "
        f"'{WORK_BRANCH}' lacks the rest of the series, and exporting it would delete "
        f"{missing} patch(es) from patches/. Resolve it and `vstack apply --continue`, "
        f"or fix patches/{name} and `vstack apply`"
    )


def unexported_work(project: Project, base: Base) -> list[str]:
    """patches/ files the work branch would change, if it has commits made since the
    last apply/export (empty when the branch is exactly what vstack left there)."""
    from vstack.export import unexported_changes

    tip = gitutil.rev_parse(project.repo, f"refs/heads/{WORK_BRANCH}")
    if tip is None or tip == gitutil.rev_parse(project.repo, SYNCED_REF):
        return []
    return unexported_changes(project, base)


def cmd_apply(project: Project, force: bool = False, cont: bool = False) -> int:
    if cont:
        return cmd_apply_continue(project)
    patches = series_paths(project.patches_dir)
    base = ensure_base(project)
    repo = project.repo
    ensure_clean(repo)
    changed = unexported_work(project, base)
    if changed:
        if not force:
            hint = (
                "`vstack apply --continue` to apply the rest of the series after the "
                "resolved patch"
                if stopped_apply(project)
                else "run `vstack export` first"
            )
            raise VstackError(
                f"branch '{WORK_BRANCH}' in {repo} has commits that patches/ does not have "
                f"({', '.join(changed[:3])}): {hint}, or "
                f"`vstack apply --force` to start over (the old tip is kept as a backup ref)"
            )
        log_ref = backup_branch(repo)
        print(f"vstack: old work branch kept as {log_ref}")
    start_work_branch(repo, base)
    clear_stop(project)
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


def _stopped_hint(project: Project, r: PatchResult) -> None:
    repo = project.repo
    state = (
        f"the work tree {repo} is left in `git am` state for inspection"
        if gitutil.op_in_progress(repo)
        else f"nothing of it was committed in {repo}"
    )
    print(
        f"vstack: {r.patch} does not apply; {state}.\n"
        f"  resolve it there, then `vstack apply --continue` (commits it and applies "
        f"the rest of the series), then `vstack export`; or fix patches/{r.patch} and "
        f"`vstack apply` again. Until the series is through, `vstack export` refuses: "
        f"the work branch lacks the patches from {r.patch} on.",
        file=sys.stderr,
    )


def _apply_and_report(project: Project, base: Base, patches: list[Path]) -> int:
    repo = project.repo
    print(
        f"vstack: applying {len(patches)} patch(es) onto {base.version} ({base.commit[:12]}, from {base.source})"
    )
    results = apply_patches(repo, patches)
    if results and not results[-1].ok:
        _save_stop(project, [p.name for p in patches], len(results))
        _stopped_hint(project, results[-1])
        return 1
    print(f"vstack: work branch '{WORK_BRANCH}' ready in {repo}")
    return 0


def conflict_markers(repo: Path, files: list[str]) -> list[str]:
    """file:line of the first conflict marker left in each of files."""
    found = []
    for f in files:
        path = repo / f
        if path.is_file():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if MARKER.match(line):
                    found.append(f"{f}:{n}")
                    break
    return found


def cmd_apply_continue(project: Project) -> int:
    """After a stopped apply: commit the resolved patch, apply the rest."""
    stop = stopped_apply(project)
    if stop is None:
        raise VstackError("no stopped `vstack apply` to continue")
    patches = series_paths(project.patches_dir)
    names = [p.name for p in patches]
    if names != stop.get("series"):
        raise VstackError(
            "patches/series changed since `vstack apply` stopped: run `vstack apply` "
            "again (--force to drop the work branch's commits)"
        )
    repo = project.repo
    k = stop["index"]
    if gitutil.op_in_progress(repo):
        unmerged = gitutil.out(
            repo, "diff", "--name-only", "--diff-filter=U"
        ).splitlines()
        left = conflict_markers(repo, unmerged)
        if left:
            raise VstackError(
                f"unresolved conflict markers in {', '.join(left)}; resolve them, then "
                f"`vstack apply --continue`"
            )
        _, info = load_patch(patches[k - 1])
        # The patch's own files (and any left unmerged) hold the resolution.
        for f in sorted(set(unmerged) | set(info.files)):
            gitutil.git(
                repo, "add", "-A", "--", f, check=False
            )  # absent: nothing to add
        p = gitutil.git(repo, "am", "--continue", check=False, env=AM_ENV)
        if p.returncode != 0:
            said = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
            raise VstackError(f"git am --continue failed in {repo}: {said[-1:]}")
    if gitutil.rev_parse(repo, "HEAD") == stop.get("before"):
        raise VstackError(
            f"{names[k - 1]} is not on branch '{WORK_BRANCH}' (the `git am` was aborted "
            f"or skipped): commit its resolution there and `vstack apply --continue`, or "
            f"fix patches/{names[k - 1]} and `vstack apply`"
        )
    ensure_clean(repo)
    print(f"  [{k}/{len(names)}] resolved {names[k - 1]}")
    results = apply_patches(repo, patches[k:], first=k + 1, total=len(names))
    if results and not results[-1].ok:
        _save_stop(project, names, k + len(results))
        _stopped_hint(project, results[-1])
        return 1
    clear_stop(project)
    print(
        f"vstack: work branch '{WORK_BRANCH}' holds the whole series in {repo}; "
        f"`vstack export` writes the resolution of {names[k - 1]} into patches/"
    )
    return 0
