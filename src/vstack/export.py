"""vstack export: work-branch commits -> patches/ and patches/series, deterministically."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vstack import fsutil, gitutil, journal, message, synced
from vstack.base import WORK_BRANCH, Base, ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import (
    parse_patch,
    patch_problems,
    read_series,
    series_digest,
    series_paths,
    slug,
)

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


def _refuse_commit(repo: Path, sha: str, why: str) -> VstackError:
    subject = gitutil.out(repo, "log", "-1", "--format=%s", sha, check=False)
    return VstackError(
        f"commit {sha[:12]} ('{subject}') on branch '{WORK_BRANCH}' in {repo} {why}"
    )


def render(repo: Path, base: str, tip: str) -> dict[str, bytes]:
    """{file name: bytes} for every commit in base..tip plus 'series'. Every patch is
    one that apply and build take back byte for byte: a commit whose change a text
    patch cannot carry is refused here, naming it, not written."""
    files: dict[str, bytes] = {}
    order = []
    for sha in commits_between(repo, base, tip):
        message.check_commit(repo, sha, WORK_BRANCH)  # git am would cut its message
        text = gitutil.git(repo, *FORMAT_PATCH, "-1", sha, text=False).stdout
        if not text.strip():
            raise _refuse_commit(
                repo, sha,
                "changes nothing, so no patch can hold it: drop it (git rebase -i), "
                "or `vstack apply --force` to start over from patches/ (the branch is "
                "kept as a backup ref)",
            )  # fmt: skip
        problems = patch_problems(text)
        if problems:
            line, what = problems[0]
            raise _refuse_commit(
                repo, sha,
                f"cannot be exported as a patch that applies and builds as committed: "
                f"{file_at(text, line) or 'its message'}: {what}",
            )  # fmt: skip
        name = slug(parse_patch(text.decode(errors="replace")).subject)
        stem, n = name[: -len(".patch")], 2
        while name in files:
            name, n = f"{stem}-{n}.patch", n + 1
        files[name] = text
        order.append(name)
    files["series"] = (SERIES_HEADER + "".join(f"{n}\n" for n in order)).encode()
    return files


def file_at(text: bytes, line: int) -> str | None:
    """The file whose diff holds line `line` (1-based) of a patch."""
    from vstack import gitparse

    try:
        heads = gitparse.file_headers(text)
    except VstackError:
        heads = {}
    found = None
    for i in sorted(heads):
        if i < line:
            found = heads[i].path
    return found


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
        synced.series_files(project.patches_dir),
        render(project.repo, base.commit, f"refs/heads/{WORK_BRANCH}"),
    )


def plan_patches(
    patches_dir: Path, new: dict[str, bytes]
) -> tuple[dict[str, bytes | None], list[str]]:
    """({name: bytes, or None to remove}, unlisted): what makes patches/ hold the
    series `new`. Only the series' own files (patches/series and what it lists) are
    removed; other *.patch files are not export's and are returned to be named. One
    of those in the way of a new patch is an error: export would overwrite it."""
    old = synced.series_files(patches_dir)
    others = sorted(set(current_files(patches_dir)) - set(old))
    clash = [n for n in others if n in new]
    if clash:
        raise VstackError(
            f"patches/{clash[0]} is not listed in patches/series, and the work branch "
            f"exports a patch of that name: move it out of patches/ (or list it in "
            f"patches/series), then export"
        )
    changes: dict[str, bytes | None] = {
        n: new.get(n) for n in diff_files(old, new)
    }  # fmt: skip
    return changes, others


def _backup(patches_dir: Path, backup_root: Path) -> Path | None:
    """A copy of the series' files in a folder of its own under backup_root."""
    old = synced.series_files(patches_dir)
    if not old:
        return None
    stem = backup_root / f"patches-{time.strftime('%Y%m%d-%H%M%S')}"
    backup, n = stem, 2
    while backup.exists():
        backup, n = stem.with_name(f"{stem.name}-{n}"), n + 1
    for name, data in old.items():
        fsutil.write_bytes(backup / name, data)
    return backup


def write_patches(
    project: Project, new: dict[str, bytes], verb: str, extra=None
) -> list[str]:
    """Make the series in patches/ exactly `new` (.patch files + series), keeping a
    backup, in one journaled change with `extra` ({root-relative path: bytes or
    None}, e.g. stack.toml). Returns the patches/ names that changed."""
    changes, others = plan_patches(project.patches_dir, new)
    for name in others:
        print(
            f"vstack: note: patches/{name} is not listed in patches/series: not "
            f"export's, left as it is",
            file=sys.stderr,
        )
    if changes:
        backup = _backup(project.patches_dir, project.cache / "backup")
        if backup:
            print(f"vstack: previous patches/ saved in {backup}", file=sys.stderr)
    writes = {f"patches/{n}": data for n, data in changes.items()}
    writes.update(extra or {})
    journal.commit(project.root, project.cache, writes, verb)
    return sorted(changes)


def require_exportable(project: Project, base: Base, work: str, force: bool) -> None:
    """Everything export must know before it may trust the work branch: no rebase,
    git operation or unfinished apply in progress; the branch built on the pinned
    base; and patches/ as the last apply/export left it (else export would revert
    whatever changed it: a pull, a hand edit)."""
    from vstack.apply import (
        descends,
        describe_commits,
        diverged,
        foreign_base_note,
        local_commits,
        refuse_during_rebase,
        require_on_work,
        require_whole_series,
    )

    repo = project.repo
    refuse_during_rebase(project, "export")
    op = gitutil.op_in_progress(repo)
    if op:
        raise VstackError(
            f"an unfinished {op} is in {repo}: finish it (or drop it: git -C {repo} "
            f"{gitutil.op_abort(op)}) first; the work branch does not hold the series "
            f"until then"
        )
    require_on_work(repo, "export")
    require_whole_series(project)
    record = synced.load(project)
    if not descends(repo, base.commit, work):
        moved = synced.changed_since(project, record) if record else []
        if moved:
            # Re-pinned and patches/ changed (a colleague's rebase, pulled): the
            # old pin's export would be refused in turn; this keeps both.
            start, mine = local_commits(project, record["base"], work)
            pick = (
                f"{start[:12]}..{work[:12]}"
                if start != record["base"]
                else " ".join(c[:12] for c in mine) or "<your commits>"
            )
            raise VstackError(
                f"{foreign_base_note(project, base, work)}, and patches/ changed "
                f"with it ({', '.join('patches/' + n for n in moved[:3])}): to keep "
                f"your commits on it"
                + (f" ({describe_commits(repo, mine)})" if mine else "")
                + f", `vstack apply --force` (rebuilds the branch on the new pin, "
                f"keeping the old tip as a backup ref), then `git -C {repo} "
                f"cherry-pick {pick}` and `vstack export`"
            )
        raise VstackError(
            f"{foreign_base_note(project, base, work)}: exporting it would write "
            f"vLLM's own changes between the two bases as patches. Export it on the "
            f"pin it was built on (check out the previous stack.toml, `vstack export`, "
            f"commit) and `vstack rebase --onto` the new pin; or `vstack apply --force` "
            f"to start over on the new pin (the branch is kept as a backup ref)"
        )
    if force:
        return
    if record is None:
        raise VstackError(
            f"no record of what patches/ held when branch '{WORK_BRANCH}' was last "
            f"applied or exported (a .vstack of an older vstack?): `vstack apply` to "
            f"rebuild the branch from patches/, or `vstack export --force` to write the "
            f"branch over patches/"
        )
    changed = synced.changed_since(project, record)
    both = diverged(project, base.commit, work, changed) if changed else None
    if both:
        raise VstackError(both)
    if changed:
        raise VstackError(
            f"patches/ changed since the last apply/export "
            f"({', '.join('patches/' + n for n in changed[:3])}"
            f"{' ...' if len(changed) > 3 else ''}), and branch '{WORK_BRANCH}' "
            f"does not have that change: exporting would revert it. `vstack apply` "
            f"picks the change up (export your own commits first, or they stop it), or "
            f"`vstack export --force` overwrites it with the branch"
        )


def warn_uncommitted(repo: Path, verb: str) -> int:
    """One line when the work tree holds edits no commit has (export reads commits
    only): a user who forgot to commit would otherwise read "0 file(s) changed"."""
    dirty = [ln for ln in gitutil.status_porcelain(repo).splitlines() if ln.strip()]
    if dirty:
        print(
            f"vstack: warning: {len(dirty)} file(s) in {repo} have uncommitted "
            f"changes that {verb} leaves out: commit them on branch '{WORK_BRANCH}' "
            f"first (git -C {repo} status)",
            file=sys.stderr,
        )
    return len(dirty)


def cmd_export(project: Project, check: bool = False, force: bool = False) -> int:
    base = ensure_base(project)
    repo = project.repo
    work = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if work is None:
        # Nothing applied yet: the round trip apply -> export must be a no-op.
        tip = applied_tip(project, base, series_paths(project.patches_dir))
    else:
        require_exportable(project, base, work, force or check)
        tip = work
        warn_uncommitted(repo, "export --check" if check else "export")
    new = render(repo, base.commit, tip)
    if check:
        changed = diff_files(synced.series_files(project.patches_dir), new)
        if changed:
            print("vstack: re-exporting would change patches/:", file=sys.stderr)
            for name in changed:
                print(f"  patches/{name}", file=sys.stderr)
            record = synced.load(project) if work is not None else None
            moved = synced.changed_since(project, record) if record else []
            if moved:
                print(
                    "vstack: patches/ changed since the last apply/export (the work "
                    "branch is older than it): `vstack apply` picks the change up",
                    file=sys.stderr,
                )
            return 1
        print(
            f"vstack: patches/ is up to date ({len(read_series(project.patches_dir))} patches)"
        )
        return 0
    extra = {}
    if work is not None:
        extra[synced.REL] = synced.record_bytes(work, base.commit, new)
    changed = write_patches(project, new, "export", extra)
    n = len(new) - 1
    print(f"vstack: exported {n} patch(es); {len(changed)} file(s) in patches/ changed")
    for name in changed:
        print(f"  patches/{name}")
    return 0
