"""vstack export: work-branch commits -> patches/ and patches/series, deterministically."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from vstack import gitutil
from vstack.base import WORK_BRANCH, Base, ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import parse_patch, read_series, series_digest, series_paths, slug

SERIES_HEADER = (
    "# Apply order of the stack's patches. Written by `vstack export`:\n"
    "# change a patch by committing on the work branch, then export.\n"
)

FORMAT_PATCH = [
    "format-patch", "--stdout", "--zero-commit", "--full-index", "--no-signature",
    "--no-stat", "--keep-subject", "--no-numbered", "--no-renames",
    "--encoding=UTF-8", "--no-thread", "--no-cover-letter",
]  # fmt: skip


def commits_between(repo: Path, base: str, tip: str) -> list[str]:
    merges = gitutil.out(repo, "rev-list", "--merges", f"{base}..{tip}")
    if merges:
        raise VstackError(f"{tip} has merge commits since the base; a series is linear")
    listed = gitutil.out(repo, "rev-list", "--reverse", f"{base}..{tip}")
    return listed.splitlines()


def render(repo: Path, base: str, tip: str) -> dict[str, bytes]:
    """{file name: bytes} for every commit in base..tip plus 'series'."""
    files: dict[str, bytes] = {}
    order = []
    for sha in commits_between(repo, base, tip):
        text = gitutil.git(repo, *FORMAT_PATCH, "-1", sha, text=False).stdout
        name = slug(parse_patch(text.decode(errors="replace")).subject)
        stem, n = name[: -len(".patch")], 2
        while name in files:
            name, n = f"{stem}-{n}.patch", n + 1
        files[name] = text
        order.append(name)
    files["series"] = (SERIES_HEADER + "".join(f"{n}\n" for n in order)).encode()
    return files


def current_files(patches_dir: Path) -> dict[str, bytes]:
    if not patches_dir.is_dir():
        return {}
    found = {p.name: p.read_bytes() for p in patches_dir.glob("*.patch")}
    series = patches_dir / "series"
    if series.is_file():
        found["series"] = series.read_bytes()
    return found


def diff_files(old: dict[str, bytes], new: dict[str, bytes]) -> list[str]:
    return sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))


def applied_tip(project: Project, base: Base, patches: list[Path]) -> str:
    """A commit with the series applied on base, made in a throwaway worktree so the
    user's work branch and work tree are never touched; cached per (base, series)."""
    from vstack.apply import apply_patches

    repo = project.repo
    ref = f"refs/vstack/applied/{base.commit[:12]}-{series_digest(patches)[:16]}"
    tip = gitutil.rev_parse(repo, ref)
    if tip:
        return tip
    if not patches:
        gitutil.git(repo, "update-ref", ref, base.commit)
        return base.commit
    with gitutil.temp_worktree(repo, base.commit, project.cache) as tmp:
        results = apply_patches(tmp, patches, log=lambda s: print(s, file=sys.stderr))
        if results and not results[-1].ok:
            r = results[-1]
            raise VstackError(
                f"{r.patch} does not apply onto {base.version}: "
                f"{'; '.join(r.details[:3]) or ', '.join(r.files)} (run `vstack apply` to inspect)"
            )
        tip = gitutil.out(tmp, "rev-parse", "HEAD")
    gitutil.git(repo, "update-ref", ref, tip)
    return tip


def unexported_changes(project: Project, base: Base) -> list[str]:
    """patches/ files that exporting the work branch would change."""
    return diff_files(
        current_files(project.patches_dir),
        render(project.repo, base.commit, f"refs/heads/{WORK_BRANCH}"),
    )


def write_patches(
    patches_dir: Path, new: dict[str, bytes], backup_root: Path
) -> list[str]:
    """Make patches/ hold exactly `new` (.patch files + series), keeping a backup."""
    old = current_files(patches_dir)
    changed = diff_files(old, new)
    if not changed:
        return []
    if old:
        backup = backup_root / f"patches-{time.strftime('%Y%m%d-%H%M%S')}"
        backup.mkdir(parents=True, exist_ok=True)
        for name, data in old.items():
            (backup / name).write_bytes(data)
        print(f"vstack: previous patches/ saved in {backup}", file=sys.stderr)
    patches_dir.mkdir(parents=True, exist_ok=True)
    for name in changed:
        target = patches_dir / name
        if name in new:
            tmp = target.with_name(f".{name}.tmp")
            tmp.write_bytes(new[name])
            os.replace(tmp, target)
        else:
            target.unlink()
    return changed


def cmd_export(project: Project, check: bool = False) -> int:
    base = ensure_base(project)
    repo = project.repo
    work = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if work is None:
        # Nothing applied yet: the round trip apply -> export must be a no-op.
        tip = applied_tip(project, base, series_paths(project.patches_dir))
    else:
        if gitutil.op_in_progress(repo):
            raise VstackError(f"finish or abort the git operation in {repo} first")
        from vstack.apply import require_whole_series

        require_whole_series(project)
        tip = work
        if not check and gitutil.status_porcelain(repo).strip():
            print(
                f"vstack: warning: uncommitted changes in {repo} are not exported",
                file=sys.stderr,
            )
    new = render(repo, base.commit, tip)
    if check:
        changed = diff_files(current_files(project.patches_dir), new)
        if changed:
            print("vstack: re-exporting would change patches/:", file=sys.stderr)
            for name in changed:
                print(f"  patches/{name}", file=sys.stderr)
            return 1
        print(
            f"vstack: patches/ is up to date ({len(read_series(project.patches_dir))} patches)"
        )
        return 0
    changed = write_patches(project.patches_dir, new, project.cache / "backup")
    if work is not None:
        from vstack.apply import mark_synced

        mark_synced(repo)
    n = len(new) - 1
    print(f"vstack: exported {n} patch(es); {len(changed)} file(s) in patches/ changed")
    for name in changed:
        print(f"  patches/{name}")
    return 0
