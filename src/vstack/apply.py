"""vstack apply: the series onto a fresh work branch of the base, one `git am -3` each."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from vstack import fsutil, gitutil, synced
from vstack.base import WORK_BRANCH, Base, ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import hunks_at, load_patch, series_paths

MARKER = re.compile(r"^(<{7}|={7}|>{7}|\|{7})( |$)")

AM_ENV = {
    "GIT_COMMITTER_NAME": gitutil.IDENTITY["GIT_COMMITTER_NAME"],
    "GIT_COMMITTER_EMAIL": gitutil.IDENTITY["GIT_COMMITTER_EMAIL"],
}


def am_continue_env(repo: Path) -> dict[str, str]:
    """AM_ENV for `git am --continue`, which forgets --committer-date-is-author-date:
    the committer date is the stopped patch's author date, so a resolution commit is
    the same whenever (and however often, after an interrupt) it is made."""
    gitdir = Path(gitutil.out(repo, "rev-parse", "--absolute-git-dir"))
    script = gitdir / "rebase-apply" / "author-script"
    env = dict(AM_ENV)
    if script.is_file():
        m = re.search(r"^GIT_AUTHOR_DATE='([^']*)'", script.read_text(), re.M)
        if m:
            env["GIT_COMMITTER_DATE"] = m.group(1)
    return env


@dataclasses.dataclass
class PatchResult:
    patch: str
    status: str  # clean | offset | 3way | conflict | empty (nothing left to commit)
    files: list[str] = dataclasses.field(default_factory=list)
    details: list[str] = dataclasses.field(default_factory=list)
    commit: str | None = None  # HEAD after it went through (not for a conflict)

    @property
    def ok(self) -> bool:
        return self.status not in ("conflict", "empty")


def dirty_files(repo: Path) -> list[str]:
    """Paths with changes not committed (staged, unstaged or untracked)."""
    return [ln[3:] for ln in gitutil.status_porcelain(repo).splitlines()]


def _names(paths: list[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (" ..." if len(paths) > n else "")


AM_OP = "git am / rebase"  # what op_in_progress calls a stopped `git am`


def ensure_clean(repo: Path) -> None:
    op = gitutil.op_in_progress(repo)
    if op:
        raise VstackError(
            f"an unfinished {op} is in {repo}: finish it, or drop it "
            f"(git -C {repo} {gitutil.op_abort(op)}) first"
        )
    dirty = dirty_files(repo)
    if dirty:
        raise VstackError(
            f"{repo} has uncommitted changes ({_names(dirty)}): commit them and run "
            f"`vstack export`, or discard them (untracked files too) with "
            f"`git -C {repo} reset -q --hard && git -C {repo} clean -q -fd`"
        )


def require_on_work(repo: Path, verb: str, strict: bool = False) -> None:
    """vstack reads and rebuilds branch 'work' only: refuse when HEAD of the stack
    repository is elsewhere (detached, another branch) with commits that branch
    lacks, which export would leave out and apply would orphan. strict (--continue,
    which takes HEAD as the resolution): HEAD must be the branch itself."""
    work = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if work is None:
        return  # nothing applied yet: apply makes the branch
    ref = gitutil.git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout.strip()
    head = gitutil.rev_parse(repo, "HEAD")
    if ref == f"refs/heads/{WORK_BRANCH}" or head is None:
        return
    if not strict and descends(repo, head, work):
        return  # a commit the branch has: nothing of HEAD's is left out
    where = f"branch '{ref.removeprefix('refs/heads/')}'" if ref else "a detached HEAD"
    # Only the commits whose change the branch has under no commit: HEAD may be a
    # backup ref of an older build of the series, whose patches are on the branch.
    cherry = gitutil.out(repo, "cherry", work, head).splitlines()
    own = [ln.split()[1] for ln in cherry if ln.startswith("+ ")]
    keep = (
        f" ({len(own)} commit(s) whose change '{WORK_BRANCH}' lacks): to keep them, "
        f"`git -C {repo} checkout {WORK_BRANCH} && git -C {repo} cherry-pick "
        f"{' '.join(c[:12] for c in own)}`, then rerun"
        if own
        else f" (its changes are all on '{WORK_BRANCH}' already): `git -C {repo} "
        f"checkout {WORK_BRANCH}`, then rerun"
    )
    raise VstackError(
        f"HEAD of {repo} is {where} at {head[:12]}, not branch '{WORK_BRANCH}', the "
        f"one `vstack {verb}` works on{keep}"
    )


def _patch_ids(repo: Path, text: bytes) -> list[tuple[str, str]]:
    """(patch id, commit) for each patch in text, as `git patch-id --stable` says."""
    said = gitutil.git(repo, "patch-id", "--stable", input=text, text=False).stdout
    return [tuple(ln.split()[:2]) for ln in said.decode().splitlines() if ln.strip()]


_MBOX_FROM = re.compile(rb"^From ([0-9a-f]{40}) Mon Sep 17 00:00:00 2001$", re.M)


def _changed_lines(text: bytes) -> list[bytes]:
    """The added and removed lines of a patch's diff, verbatim (whitespace and all;
    git patch-id ignores whitespace), hunk by hunk as git apply reads them."""
    from vstack import gitparse

    at = text.find(b"\ndiff --git ")
    return gitparse.changed_lines(text[at:]) if at >= 0 else []


def _mail_of(repo: Path, text: bytes) -> tuple[str, str, str]:
    """(author name, email, message) git am (as apply runs it: --keep) makes of a
    patch file."""

    with tempfile.TemporaryDirectory() as d:
        info = gitutil.git(
            repo, "mailinfo", "-k", f"{d}/msg", f"{d}/patch", input=text, text=False
        ).stdout.decode(errors="replace")
        body = Path(d, "msg").read_bytes().decode(errors="replace")
    fields = dict(
        ln.split(": ", 1) for ln in info.splitlines() if ": " in ln
    )  # fmt: skip
    msg = fields.get("Subject", "") + "\n\n" + body
    return fields.get("Author", ""), fields.get("Email", ""), _norm(msg)


def _norm(message: str) -> str:
    return "\n".join(ln.rstrip() for ln in message.strip().splitlines())


def _is_own(repo: Path, sha: str, mine: bytes, theirs: bytes) -> bool:
    """Whether commit sha (its format-patch text `mine`) is exactly what applying
    patch file `theirs` makes: the same bytes as export would write, or the same
    changed lines verbatim, author and message."""
    zero = b"From " + b"0" * 40 + b" "
    if _MBOX_FROM.sub(zero[:-1], mine, count=1) == theirs:
        return True
    if _changed_lines(mine) != _changed_lines(theirs):
        return False
    an, ae, msg = gitutil.out(
        repo, "log", "-1", "--format=%an%x00%ae%x00%B", sha
    ).split("\0", 2)
    return _mail_of(repo, theirs) == (an, ae, _norm(msg))


def commits_not_in(repo: Path, start: str, tip: str, patches: list[Path]) -> list[str]:
    """Commits in start..tip (oldest first) that are not exactly what applying one of
    the patches makes (paired by git patch-id, then compared verbatim: diff lines,
    author and message; an amend that patch-id cannot see, whitespace or message
    only, is the user's): what rebuilding the branch from patches/ would drop.
    Derived from git, whatever vstack's own records say."""
    from vstack.export import FORMAT_PATCH

    listed = gitutil.out(repo, "rev-list", "--reverse", f"{start}..{tip}").split()
    if not listed:
        return []
    files = [p.read_bytes() for p in patches if p.is_file()]
    marked = b"".join(
        f"From {i + 1:040x} Mon Sep 17 00:00:00 2001\n".encode()
        + _MBOX_FROM.sub(b"", t, count=1) + b"\n"
        for i, t in enumerate(files)
    )  # fmt: skip
    by_pid: dict[str, list[bytes]] = {}
    for pid, n in _patch_ids(repo, marked) if files else []:
        by_pid.setdefault(pid, []).append(files[int(n, 16) - 1])
    fmt = [a for a in FORMAT_PATCH if a != "--zero-commit"]
    text = gitutil.git(repo, *fmt, f"{start}..{tip}", text=False).stdout
    ids = {sha: pid for pid, sha in _patch_ids(repo, text)}
    marks = list(_MBOX_FROM.finditer(text))
    own_text = {
        m.group(1).decode(): text[m.start() : marks[k + 1].start() if k + 1 < len(marks) else len(text)]
        for k, m in enumerate(marks)
    }  # fmt: skip
    return [
        c for c in listed
        if not any(_is_own(repo, c, own_text.get(c, b""), t) for t in by_pid.get(ids.get(c), []))
    ]  # fmt: skip


def describe_commits(repo: Path, shas: list[str], n: int = 3) -> str:
    said = [
        f"{c[:12]} '{gitutil.out(repo, 'log', '-1', '--format=%s', c)}'"
        for c in shas[:n]
    ]
    return ", ".join(said) + (f" and {len(shas) - n} more" if len(shas) > n else "")


def local_commits(project: Project, base: str, tip: str) -> tuple[str, list[str]]:
    """(start, commits): the commits on the work branch since it last agreed with
    patches/ (start..tip), or, when that point is not below tip (history
    rewritten, a record lost), those of base..tip whose change no patch has."""
    repo = project.repo
    record = synced.load(project)
    start = record["work"] if record else None
    if start and descends(repo, base, start) and descends(repo, start, tip):
        return start, gitutil.out(
            repo, "rev-list", "--reverse", f"{start}..{tip}"
        ).split()
    if not descends(repo, base, tip):
        return base, []
    return base, commits_not_in(repo, base, tip, series_paths(project.patches_dir))


def diverged(project: Project, base: str, tip: str, moved: list[str]) -> str | None:
    """When the work branch has commits of its own AND patches/ changed since they
    last agreed (a pull): what keeps both, instead of apply and export each
    sending the user to the other."""
    start, mine = local_commits(project, base, tip)
    if not moved or not mine:
        return None
    repo = project.repo
    pick = (
        f"{start[:12]}..{tip[:12]}" if start != base else " ".join(c[:12] for c in mine)
    )
    return (
        f"branch '{WORK_BRANCH}' in {repo} has commits of yours that patches/ lacks "
        f"({describe_commits(repo, mine)}), and patches/ changed since the last "
        f"apply/export ({', '.join('patches/' + n for n in moved[:3])}"
        f"{' ...' if len(moved) > 3 else ''}): to keep both, `vstack apply --force` "
        f"(rebuilds the branch from patches/, keeping the old tip as a backup ref), "
        f"then `git -C {repo} cherry-pick {pick}` and `vstack export`"
    )


def am_failure(p) -> str:
    """git's own reason from a failed `git am --continue` (not its advice lines)."""
    said = [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    for ln in said:
        if ln.startswith(("No changes", "error:", "fatal:")):
            return ln
    said = [ln for ln in said if not ln.startswith("Applying:")]
    return said[0] if said else f"exit {p.returncode}"


def _check(
    repo: Path, patch: Path
) -> tuple[bool, list[str], list[tuple[str, int | None]]]:
    """git apply --check against HEAD (the index, which apply_one has checked to be
    HEAD's): (applies, offset notes, failing (file, line))."""
    p = gitutil.git(
        repo, "apply", "--check", "--cached", "--verbose", str(patch), check=False
    )
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


# What git am says when it refuses to touch the work tree: never the patch's fault.
_REFUSALS = re.compile(
    r"Your local changes to the following files would be overwritten|"
    r"does not match index|already exists in working directory|"
    r"would be overwritten by merge|untracked working tree files would be"
)


def repo_state(repo: Path) -> tuple[str | None, str | None, list[str]]:
    """(HEAD, the branch checked out or None, paths with changes not committed), in
    one `git status`."""
    text = gitutil.git(
        repo, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "-z"
    ).stdout
    head = branch = None
    dirty: list[str] = []
    fields = text.split("\0")
    i = 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if f.startswith("# branch.oid "):
            oid = f.split(" ", 2)[2]
            head = None if oid == "(initial)" else oid
        elif f.startswith("# branch.head "):
            name = f.split(" ", 2)[2]
            branch = None if name == "(detached)" else name
        elif f.startswith(("1 ", "u ")):
            dirty.append(f.split(" ", 8 if f[0] == "1" else 10)[-1])
        elif f.startswith("2 "):
            dirty.append(f.split(" ", 9)[-1])
            i += 1  # the original path of a rename
        elif f.startswith(("? ", "! ")):
            dirty.append(f[2:])
    return head, branch, dirty


def head_and_dirt(repo: Path) -> tuple[str | None, list[str]]:
    head, _, dirty = repo_state(repo)
    return head, dirty


def apply_one(repo: Path, patch: Path) -> PatchResult:
    """Apply one patch on HEAD with git am -3 and classify how it went. The work
    tree must be clean: git am refuses a file with changes of someone else's, and
    the refusal is neither a conflict nor the patch's fault."""
    _, info = load_patch(patch)
    before, dirty = head_and_dirt(repo)
    if dirty:
        raise VstackError(
            f"cannot apply {patch.name} in {repo}: uncommitted changes there "
            f"({_names(dirty)}) that are not part of any patch; commit them (they "
            f"become part of the previous patch's resolution only if you amend it) or "
            f"discard them (git -C {repo} checkout -- <file>), then rerun"
        )
    applies, offsets, fails = _check(repo, patch)
    p = gitutil.git(
        repo, "am", "--3way", "--keep", "--committer-date-is-author-date", "--quiet",
        str(patch), check=False, env=AM_ENV,
    )  # fmt: skip
    if p.returncode == 0:
        after = gitutil.rev_parse(repo, "HEAD")
        if after == before:
            # git am -3 says "No changes -- Patch already applied." and commits nothing.
            return PatchResult(
                patch.name, "empty", info.files,
                ["the 3-way merge left no change: the base already has all of it"],
                after,
            )  # fmt: skip
        if applies and not offsets:
            return PatchResult(patch.name, "clean", info.files, [], after)
        if applies:
            return PatchResult(patch.name, "offset", info.files, offsets, after)
        return PatchResult(
            patch.name, "3way", info.files,
            [f"{f}:{ln} needed a 3-way merge" for f, ln in fails], after,
        )  # fmt: skip
    conflicted = unmerged_files(repo)
    said = (p.stdout + p.stderr).splitlines()
    fatal = [ln for ln in said if ln.startswith("fatal:")]
    refused = [ln for ln in said if _REFUSALS.search(ln)]
    lock = gitutil.held_lock(p.stdout + p.stderr)
    if lock or refused or (not conflicted and (applies or fatal)):
        # Not the patch's fault (a lock, a refusal to overwrite, a full disk, ...):
        # never call this a conflict, or a --continue would commit what is there as
        # the patch and a --skip would record it as superseded.
        why = (
            f"{lock} exists (a git is running there, or was killed)"
            if lock
            else (refused or fatal or [ln for ln in said if ln.strip()] or ["?"])[-1]
        )
        if gitutil.op_in_progress(repo):
            gitutil.git(repo, "am", "--abort", check=False)
        raise VstackError(
            f"git am of {patch.name} failed in {repo} for a reason other than a "
            f"conflict: {why.strip()}{gitutil.limit_note(repo, why)}"
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


def clear_interrupted_git(repo: Path) -> str | None:
    """Undo what a git child that vstack was running left when it was stopped in the
    middle of its work (a terminal's Ctrl-C reaches git too): a `git am` state
    (aborted; removed when git cannot abort a half-written one), a half-checked-out
    or half-patched work tree. Only called where vstack's own journal says vstack,
    not the user, was at work there (no stop waiting for a resolution), so the
    changes are its own; they are still kept, as a commit under
    refs/vstack/backup/interrupted-*, before the tree is reset. Returns that ref."""
    if gitutil.op_in_progress(repo) == AM_OP:
        gitutil.git(repo, "am", "--abort", check=False)
        if gitutil.op_in_progress(repo) == AM_OP:
            gitdir = Path(gitutil.out(repo, "rev-parse", "--absolute-git-dir"))
            fsutil.remove_tree(gitdir / "rebase-apply")  # half-written: no --abort
    head, _, dirty = repo_state(repo)
    if not dirty:
        return None
    with tempfile.TemporaryDirectory(prefix="vstack-idx-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if head:
            gitutil.git(repo, "read-tree", head, env=env)
        gitutil.git(repo, "add", "-A", env=env)
        tree = gitutil.out(repo, "write-tree", env=env)
    parents = ["-p", head] if head else []
    snap = gitutil.out(
        repo, "commit-tree", tree, *parents, "-m",
        "vstack: what an interrupted git left in the work tree", env=AM_ENV,
    )  # fmt: skip
    ref = backup_branch(repo, "interrupted", snap)
    if head:
        gitutil.git(repo, "reset", "-q", "--hard", head)
    else:
        gitutil.git(repo, "read-tree", "--empty")
    gitutil.git(repo, "clean", "-q", "-f", "-d")
    print(
        f"vstack: reset what an interrupted git left in {repo} "
        f"({_names(dirty)}); kept as {ref}",
        file=sys.stderr,
    )
    return ref


def start_work_branch(repo: Path, base: Base, branch: str = WORK_BRANCH) -> None:
    gitutil.git(repo, "checkout", "-q", "-f", "-B", branch, base.commit)


def backup_branch(
    repo: Path, branch: str = WORK_BRANCH, tip: str | None = None
) -> str | None:
    """Keep the branch's tip (or `tip`) under refs/vstack/backup/ before it is reset
    (a name of its own, also for two resets in one second)."""
    tip = tip or gitutil.rev_parse(repo, f"refs/heads/{branch}")
    if tip is None:
        return None
    stem = f"refs/vstack/backup/{branch}-{time.strftime('%Y%m%d-%H%M%S')}"
    # One git call whatever exists (the interrupt tests number the calls).
    have = dict(
        ln.split(" ", 1)
        for ln in gitutil.out(
            repo, "for-each-ref", "--format=%(refname) %(objectname)",
            "refs/vstack/backup/",
        ).splitlines()
    )  # fmt: skip
    ref, n = stem, 2
    while have.get(ref) not in (None, tip):
        ref, n = f"{stem}-{n}", n + 1
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


# ---------------------------------------------------------------- the apply journal
# .vstack/apply.json exists from the moment `vstack apply` begins to rebuild the work
# branch until the branch holds the whole series (and synced.json says so):
#   state "running": an apply (or apply --continue, which resumes from "resume", the
#     user's resolution commit) is at work, or was interrupted: the commits on the
#     branch past "old_tip"/"resume" are vstack's own, and a rerun rebuilds them;
#   state "stopped": patch "index" (1-based) did not apply; the branch holds the
#     patches before it ("before"); what is committed past "before" is the user's.
# While it exists the branch lacks the end of the series: export refuses.
JOURNAL = "apply.json"
_LEGACY_STOP = "apply-stopped.json"  # written by vstack before the journal


def load_journal(project: Project) -> dict | None:
    if gitutil.rev_parse(project.repo, f"refs/heads/{WORK_BRANCH}") is None:
        return None
    for name, state in ((JOURNAL, None), (_LEGACY_STOP, "stopped")):
        path = project.cache / name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError:
                data = {}
            if not isinstance(data, dict):
                data = {}
            data.setdefault("state", state or "running")
            data.setdefault("series", [])
            return data
    return None


def _interrupted_apply(project: Project) -> bool:
    """Whether an apply (not one stopped for a resolution) was interrupted: its
    journal says running, also before the work branch was made."""
    path = project.cache / JOURNAL
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("state", "running") == "running"


def save_journal(project: Project, data: dict) -> None:
    fsutil.write_text(project.cache / JOURNAL, json.dumps(data, indent=1) + "\n")


def clear_journal(project: Project) -> None:
    fsutil.remove(project.cache / JOURNAL)
    fsutil.remove(project.cache / _LEGACY_STOP)


def require_whole_series(project: Project) -> None:
    """Refuse when the work branch lacks the end of the series: an apply stopped
    at a patch, or one that was interrupted."""
    j = load_journal(project)
    if j is None:
        return
    names = j.get("series", [])
    if j["state"] != "stopped":
        raise VstackError(
            f"the last `vstack apply` was interrupted before branch '{WORK_BRANCH}' "
            f"held the whole series: exporting it would delete patches from patches/. "
            + (
                "Run `vstack apply --continue` (it resumes after your resolution)"
                if j.get("resume")
                else "Run `vstack apply` again"
            )
        )
    k = j.get("index", 0)
    name = names[k - 1] if 0 < k <= len(names) else "?"
    missing = len(names) - k + 1 if names else "some"
    raise VstackError(
        f"the last `vstack apply` stopped at patch {k}/{len(names)} ({name}): branch "
        f"'{WORK_BRANCH}' lacks the rest of the series, and exporting it would delete "
        f"{missing} patch(es) from patches/. Resolve it and `vstack apply --continue`, "
        f"or fix patches/{name} and `vstack apply`"
    )


def refuse_during_rebase(project: Project, verb: str) -> None:
    if (project.cache / "rebase" / "state.json").is_file():
        raise VstackError(
            f"a rebase is in progress (.vstack/rebase/): `vstack {verb}` would work on "
            f"a series that is half on the old base and half on the new; finish it "
            f"with `vstack rebase --continue` or undo it with `vstack rebase --abort`"
        )


def descends(repo: Path, base: str, tip: str) -> bool:
    p = gitutil.git(repo, "merge-base", "--is-ancestor", base, tip, check=False)
    return p.returncode == 0


def foreign_base_note(project: Project, base: Base, tip: str) -> str:
    """Says which base (other than the pinned one) a work branch was built on."""
    record = synced.load(project)
    hint = ""
    out = gitutil.git(
        project.repo, "for-each-ref", "--format=%(refname:short) %(objectname)",
        "refs/heads/base/", check=False,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        name, sha = line.split(" ", 1)
        if sha != base.commit and descends(project.repo, sha, tip):
            hint = f" (it is built on {name.removeprefix('base/')}, {sha[:12]})"
            break
    if not hint and record and record.get("base") not in (None, base.commit):
        hint = f" (it was built on {record['base'][:12]})"
    return (
        f"branch '{WORK_BRANCH}' does not descend from the pinned base {base.version} "
        f"({base.commit[:12]}){hint}: stack.toml was re-pinned since it was built"
    )


def unexported_work(project: Project, base: Base, j: dict | None = None) -> str | None:
    """Why the work branch may hold commits of the user's that patches/ lacks (None
    when everything on it is what vstack put there, or exported)."""
    repo = project.repo
    tip = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if tip is None:
        return None
    if j is not None:
        if j["state"] == "running" and not j.get("resume"):
            if tip != j.get("old_tip") and descends(repo, base.commit, tip):
                # An interrupted apply's commits are the series' own; which they
                # are is read from git (the journal may be damaged, or older than
                # a commit the user made since).
                mine = commits_not_in(
                    repo, base.commit, tip, series_paths(project.patches_dir)
                )
                if not mine:
                    return None
                return (
                    f"branch '{WORK_BRANCH}' in {repo} has commits that are not in "
                    f"patches/ ({describe_commits(repo, mine)}), made after an "
                    f"interrupted `vstack apply` (the branch lacks the rest of the "
                    f"series: export refuses). To keep them: `vstack apply --force` "
                    f"(it keeps the old tip as a backup ref), then `git -C {repo} "
                    f"cherry-pick {' '.join(c[:12] for c in mine)}` and `vstack export`"
                )
        elif j["state"] == "stopped" and tip == j.get("before"):
            return None  # the patches before the stop: vstack's own
        else:
            return (
                f"branch '{WORK_BRANCH}' in {repo} holds your resolution of "
                f"{_stop_name(j)}: `vstack apply --continue` to apply the rest of the "
                f"series after it"
            )
    record = synced.load(project)
    if record and tip == record["work"]:
        return None
    if not descends(repo, base.commit, tip):
        return (
            f"{foreign_base_note(project, base, tip)}; its commits cannot be compared "
            f"with patches/"
        )
    from vstack.export import unexported_changes

    changed = unexported_changes(project, base)
    if changed:
        moved = synced.changed_since(project, record) if record else []
        both = diverged(project, base.commit, tip, moved)
        if both:
            return both
        _, mine = local_commits(project, base.commit, tip)
        what = (
            describe_commits(repo, mine)
            if mine
            else f"exporting it changes {', '.join('patches/' + n for n in changed[:3])}"
        )
        return (
            f"branch '{WORK_BRANCH}' in {repo} has commits that patches/ does not have "
            f"({what}): run `vstack export` first"
        )
    return None


def _stop_name(j: dict) -> str:
    names, k = j.get("series", []), j.get("index", 0)
    if j.get("resume"):
        k = j.get("next", 0)
    return names[k - 1] if 0 < k <= len(names) else "the stopped patch"


def cmd_apply(project: Project, force: bool = False, cont: bool = False) -> int:
    if cont:
        return cmd_apply_continue(project)
    patches = series_paths(project.patches_dir)
    base = ensure_base(project)
    repo = project.repo
    refuse_during_rebase(project, "apply")
    j = load_journal(project)
    if _interrupted_apply(project):
        clear_interrupted_git(repo)  # the interrupted apply's
    ensure_clean(repo)
    require_on_work(repo, "apply")
    tip = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    if not force:
        why = unexported_work(project, base, j)
        if why:
            raise VstackError(
                f"{why}; or `vstack apply --force` to start over (the old tip is kept "
                f"as a backup ref)"
            )
    # From here until the series is through, the branch is vstack's to rebuild.
    save_journal(project, {
        "state": "running", "series": [p.name for p in patches],
        "base": base.commit, "old_tip": tip,
    })  # fmt: skip
    record = synced.load(project)
    if (
        tip
        and tip != base.commit
        and (
            (force and tip != (record or {}).get("work"))
            or (
                descends(repo, base.commit, tip)
                and commits_not_in(repo, base.commit, tip, patches)
            )
        )
    ):
        # Whatever the branch holds that patches/ lacks survives the rebuild.
        print(f"vstack: old work branch kept as {backup_branch(repo)}")
    start_work_branch(repo, base)
    return _apply_and_report(project, base, patches)


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


def _finish_or_stop(
    project: Project, base: str, names: list[str], results: list[PatchResult], k: int
) -> int:
    """After patches from position k (1-based) on were applied: record the stop, or
    that the branch now holds the whole series (synced.json, then no journal)."""
    repo = project.repo
    if results and not results[-1].ok:
        save_journal(project, {
            "state": "stopped", "series": names, "base": base,
            "index": k + len(results) - 1,
            "before": gitutil.rev_parse(repo, "HEAD"),
        })  # fmt: skip
        _stopped_hint(project, results[-1])
        return 1
    synced.save(project, gitutil.rev_parse(repo, "HEAD"), base)
    clear_journal(project)
    return 0


def _apply_and_report(project: Project, base: Base, patches: list[Path]) -> int:
    repo = project.repo
    print(
        f"vstack: applying {len(patches)} patch(es) onto {base.version} ({base.commit[:12]}, from {base.source})"
    )
    results = apply_patches(repo, patches)
    rc = _finish_or_stop(project, base.commit, [p.name for p in patches], results, 1)
    if rc == 0:
        print(f"vstack: work branch '{WORK_BRANCH}' ready in {repo}")
    return rc


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


def unmerged_files(repo: Path) -> list[str]:
    """Paths left unmerged, as they are named (-z: not C-quoted, so a non-ASCII
    name is found by the marker check and `git add`)."""
    text = gitutil.out(repo, "diff", "--name-only", "--diff-filter=U", "-z")
    return [f for f in text.split("\0") if f]


def stray_changes(repo: Path, allowed: set[str]) -> list[str]:
    """Changes in repo's work tree that a --continue must not commit: unstaged or
    untracked ones outside `allowed` (the stopped patch's files and those left
    unmerged). What the user staged is part of the resolution."""
    fields = gitutil.git(
        repo, "status", "--porcelain", "--untracked-files=all", "-z"
    ).stdout.split("\0")
    found = []
    i = 0
    while i < len(fields):
        ln = fields[i]
        i += 1
        if len(ln) < 4:
            continue
        x, y, path = ln[0], ln[1], ln[3:]
        if x in "RC":
            i += 1  # the original path of a rename or copy
        if path in allowed or x == "U" or y == "U":
            continue
        if ln.startswith("??") or y != " ":
            found.append(path)
    return found


def commit_as_patch(repo: Path, data: bytes, tree: str, parent: str) -> str:
    """The commit `git am --keep` makes of the patch `data` when its result is
    `tree` on `parent`: the message, author and date as git mailinfo reads them
    (git am's parse_mail: subject, blank line, body, stripspace), the committer
    vstack's, dated as the author (as apply_one's --committer-date-is-author-date)."""
    from vstack import gitparse

    mail = gitparse.mailinfo(data, keep=True)
    env = {
        **AM_ENV, "GIT_AUTHOR_NAME": mail.author, "GIT_AUTHOR_EMAIL": mail.email,
        "GIT_AUTHOR_DATE": mail.date, "GIT_COMMITTER_DATE": mail.date,
    }  # fmt: skip
    return gitutil.out(
        repo, "commit-tree", tree, "-p", parent, "-F", "-",
        input=gitparse.am_message(mail), env=env,
    )  # fmt: skip


class NoChange(VstackError):
    """The resolution of a stopped patch leaves the branch as it was at the stop."""


def take_resolution(
    repo: Path, data: bytes, name: str, stop: str, paths: set[str]
) -> str | None:
    """Commit the resolution of the patch `data` (file `name`) that stopped at
    commit `stop`, with the patch's own message, author and trailers, however the
    user left it: staged or in the work tree of `paths` while `git am` waits (git am
    --continue commits it), or committed by hand (`git commit` during the stop, with
    or without `git am --skip`/--abort after it): then the commits' tree becomes the
    patch's commit on `stop`, and the user's commits are kept under a backup ref.
    Returns the new HEAD, or None when nothing was resolved (no `git am` waits and
    neither HEAD nor the patch's files changed since the stop)."""
    in_am = gitutil.op_in_progress(repo) == AM_OP
    head = gitutil.rev_parse(repo, "HEAD")
    literal = {"GIT_LITERAL_PATHSPECS": "1"}
    for f in sorted(paths):
        gitutil.git(repo, "add", "-A", "--", f, check=False, env=literal)
    if in_am and head == stop:
        p = gitutil.git(
            repo, "am", "--continue", check=False, env=am_continue_env(repo)
        )
        if p.returncode != 0:
            why = am_failure(p)
            if why.startswith("No changes"):
                raise NoChange(why)
            raise VstackError(f"git am --continue failed in {repo}: {why}")
        return gitutil.rev_parse(repo, "HEAD")
    tree = gitutil.out(repo, "write-tree")
    if tree == gitutil.out(repo, "rev-parse", f"{stop}^{{tree}}"):
        if not in_am and head == stop:
            return None
        raise NoChange("No changes: the resolution leaves the branch as it was")
    new = commit_as_patch(repo, data, tree, stop)
    if head not in (stop, new):
        ref = backup_branch(repo, "resolution", head)
        print(
            f"vstack: your commit(s) {stop[:12]}..{head[:12]} are taken as the "
            f"resolution of {name}, with its message and author (as git am commits "
            f"it); they are kept as {ref}",
            file=sys.stderr,
        )
    if in_am:
        gitutil.git(repo, "am", "--quit", check=False)  # HEAD and index stay
    gitutil.git(repo, "reset", "-q", "--soft", new)
    return new


def cmd_apply_continue(project: Project) -> int:
    """After a stopped apply: commit the resolved patch, apply the rest. After an
    interrupted --continue: resume after the resolution, as that run would have."""
    j = load_journal(project)
    if j is None or not (j["state"] == "stopped" or j.get("resume")):
        raise VstackError("no stopped `vstack apply` to continue")
    refuse_during_rebase(project, "apply --continue")
    op = gitutil.op_in_progress(project.repo)
    if op not in (None, AM_OP):
        ensure_clean(project.repo)  # names it and how to drop it
    require_on_work(project.repo, "apply --continue", strict=True)
    patches = series_paths(project.patches_dir)
    names = [p.name for p in patches]
    if names != j.get("series"):
        raise VstackError(
            "patches/series changed since `vstack apply` stopped: run `vstack apply` "
            "again (--force to drop the work branch's commits)"
        )
    repo = project.repo
    base = j.get("base") or ensure_base(project).commit
    if j["state"] == "stopped":
        k = j["index"]
        _commit_resolution(project, j, patches)
        ensure_clean(repo)
        resume = gitutil.rev_parse(repo, "HEAD")
        save_journal(project, {
            "state": "running", "series": names, "base": base, "resume": resume,
            "next": k, "old_tip": resume,
        })  # fmt: skip
    else:
        k, resume = j["next"], j["resume"]
        clear_interrupted_git(repo)  # the interrupted run's
        head = gitutil.rev_parse(repo, "HEAD")
        if head != resume:
            if not descends(repo, resume, head):
                raise VstackError(
                    f"branch '{WORK_BRANCH}' no longer holds your resolution of "
                    f"{names[k - 1]} ({resume[:12]}): `vstack apply --continue` cannot "
                    f"resume; `vstack apply` starts over"
                )
            gitutil.git(repo, "reset", "-q", "--hard", resume)
        ensure_clean(repo)
    print(f"  [{k}/{len(names)}] resolved {names[k - 1]}")
    results = apply_patches(repo, patches[k:], first=k + 1, total=len(names))
    rc = _finish_or_stop(project, base, names, results, k + 1)
    if rc == 0:
        print(
            f"vstack: work branch '{WORK_BRANCH}' holds the whole series in {repo}; "
            f"`vstack export` writes the resolution of {names[k - 1]} into patches/"
        )
    return rc


def _commit_resolution(project: Project, j: dict, patches: list[Path]) -> None:
    repo = project.repo
    k = j["index"]
    names = j["series"]
    _, info = load_patch(patches[k - 1])
    unmerged = unmerged_files(repo) if gitutil.op_in_progress(repo) else []
    left = conflict_markers(repo, unmerged)
    if left:
        raise VstackError(
            f"unresolved conflict markers in {', '.join(left)}; resolve them, then "
            f"`vstack apply --continue`"
        )
    stray = stray_changes(repo, set(unmerged) | set(info.files))
    if stray:
        raise VstackError(
            f"changes outside {names[k - 1]}'s files in {repo} ({_names(stray)}): "
            f"--continue would commit them as part of the patch; `git add` them if "
            f"they belong to the resolution, else commit or discard them elsewhere"
        )
    stop = j.get("before") or gitutil.rev_parse(repo, "HEAD")
    if not descends(repo, stop, gitutil.rev_parse(repo, "HEAD")):
        raise VstackError(
            f"HEAD of {repo} is not on top of where `vstack apply` stopped "
            f"({stop[:12]}): --continue cannot take it as the resolution of "
            f"{names[k - 1]}; check out the resolution there, or `vstack apply` again"
        )
    # The patch's own files (and any left unmerged) hold the resolution; a commit
    # made by hand gets the patch's message and author.
    try:
        new = take_resolution(
            repo, patches[k - 1].read_bytes(), names[k - 1], stop,
            set(unmerged) | set(info.files),
        )  # fmt: skip
    except NoChange as e:
        raise VstackError(
            f"git am --continue failed in {repo}: {e}: the resolution leaves no change "
            f"of {names[k - 1]}; fix patches/{names[k - 1]} (or remove it from "
            f"patches/series) and `vstack apply`"
        ) from None
    if new is None:
        raise VstackError(
            f"{names[k - 1]} is not on branch '{WORK_BRANCH}' (the `git am` was aborted "
            f"or skipped): commit its resolution there and `vstack apply --continue`, or "
            f"fix patches/{names[k - 1]} and `vstack apply`"
        )
