"""Thin wrappers around git; every call runs without the user's or the system's git
configuration, so that nothing in ~/.gitconfig changes the bytes vstack writes."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from vstack.errors import VstackError

# Global and system configuration are not read at all (see git_env); these pin what a
# repository's own .git/config, or git's built-in per-user files, could still change.
_PINNED_CONFIG = [
    "core.quotePath=true",
    "core.autocrlf=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.renames=false",
    "diff.algorithm=myers",
    "diff.context=3",
    "diff.suppressBlankEmpty=false",
    "format.signature=",
    "format.headers=",
    "format.coverLetter=false",
    "format.numbered=false",
    "commit.gpgSign=false",
    "am.threeWay=false",
    # A CR byte a patch adds (a file with CRLF lines) is content: it must reach the
    # commit, and so the wheel, as the patch says (git am strips it otherwise).
    "am.keepcr=true",
    "advice.detachedHead=false",
    # A repository's own .git/config (`git config apply.whitespace fix` in
    # .vstack/repo) is read too: pin what would change the commits git am makes, the
    # message it keeps, the bytes format-patch writes, or the output vstack parses.
    "apply.whitespace=warn",
    "apply.ignoreWhitespace=no",
    "core.whitespace=blank-at-eol,space-before-tab,blank-at-eof",
    "core.commentChar=#",
    "core.eol=lf",
    "mailinfo.scissors=false",
    "am.messageId=false",
    "format.notes=false",
    "format.from=false",
    "format.useAutoBase=false",
    "format.signOff=false",
    "format.forceInBodyFrom=false",
    "format.encodeEmailHeaders=true",
    "format.thread=false",
    "format.subjectPrefix=PATCH",
    "format.suffix=.patch",
    "i18n.commitEncoding=UTF-8",
    "i18n.logOutputEncoding=UTF-8",
    "color.ui=never",
    "color.diff=never",
    "color.status=never",
    "color.branch=never",
    "log.showSignature=false",
    "merge.conflictStyle=merge",
    "rerere.enabled=false",
    "commit.cleanup=default",
    "gc.auto=0",
    "core.hooksPath=/dev/null",
    # Read even without a global config file: ~/.config/git/{attributes,ignore}.
    f"core.attributesFile={os.devnull}",
    f"core.excludesFile={os.devnull}",
]

# Settings that `-c` cannot reset (format.to and format.cc add to a list, an empty
# format.attach is not "off" in every git): the command's own --no-* flags do.
_COMMAND_FLAGS = {"format-patch": ["--no-to", "--no-cc", "--no-attach", "--no-notes"]}

IDENTITY = {
    "GIT_AUTHOR_NAME": "vstack",
    "GIT_AUTHOR_EMAIL": "vstack@localhost",
    "GIT_COMMITTER_NAME": "vstack",
    "GIT_COMMITTER_EMAIL": "vstack@localhost",
}
# Base commits get a fixed date so one wheel always yields the same base commit id.
FIXED_DATE = "1700000000 +0000"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Every git process vstack starts goes through here (tests/interrupts.py stops
    a run at each call in turn, to check that recovery from there is exact)."""
    return subprocess.run(cmd, **kw)


@functools.cache
def _user_safe_directories() -> tuple[str, ...]:
    """safe.directory entries of the user's global and system configuration: the one
    setting of them that vstack keeps (a checkout owned by another user stays usable)."""
    found: list[str] = []
    for scope in ("--system", "--global"):
        p = run(
            ["git", "config", scope, "--get-all", "safe.directory"],
            capture_output=True, encoding="utf-8", errors="replace", cwd=os.sep,
        )  # fmt: skip
        found += [ln for ln in p.stdout.splitlines() if ln]
    return tuple(found)


def git_env(
    extra: dict[str, str] | None = None, user_config: bool = False
) -> dict[str, str]:
    """The environment of every git call: the user's ~/.gitconfig and the system
    config are not read (format.signOff, diff.orderFile, color.ui, hooks, ... would
    change what vstack writes); identity comes from the environment or IDENTITY.
    user_config=True keeps them, for calls that only reach a network remote (proxy,
    URL rewriting and credentials are the user's) and write nothing."""
    env = dict(os.environ)
    env.setdefault("GIT_AUTHOR_NAME", IDENTITY["GIT_AUTHOR_NAME"])
    env.setdefault("GIT_AUTHOR_EMAIL", IDENTITY["GIT_AUTHOR_EMAIL"])
    env.setdefault("GIT_COMMITTER_NAME", IDENTITY["GIT_COMMITTER_NAME"])
    env.setdefault("GIT_COMMITTER_EMAIL", IDENTITY["GIT_COMMITTER_EMAIL"])
    env["GIT_TERMINAL_PROMPT"] = "0"
    if not user_config:
        env["GIT_CONFIG_GLOBAL"] = os.devnull
        env["GIT_CONFIG_NOSYSTEM"] = "1"
        for k in [
            k for k in env if k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))
        ]:
            del env[k]
        env.pop("GIT_CONFIG_COUNT", None)
        env.pop("GIT_CONFIG_PARAMETERS", None)
        env.pop("GIT_CONFIG", None)
    env["LC_ALL"] = "C"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


def config_args() -> list[str]:
    """The -c options every git call vstack makes carries (see _PINNED_CONFIG)."""
    args = []
    for c in _PINNED_CONFIG:
        args += ["-c", c]
    for d in _user_safe_directories():
        args += ["-c", f"safe.directory={d}"]
    return args


def git(
    repo: Path | str,
    *args: str,
    check: bool = True,
    input: bytes | str | None = None,
    env: dict[str, str] | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess:
    cmd = ["git", "-C", str(repo), *config_args()]
    cmd += (
        list(args[:1])
        + _COMMAND_FLAGS.get(args[0] if args else "", [])
        + list(args[1:])
    )
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = run(
        cmd,
        input=input,
        capture_output=True,
        # Output with bytes that are not UTF-8 (a file's content in blame or a diff)
        # must not end in a traceback.
        **({"encoding": "utf-8", "errors": "replace"} if text else {}),
        env=git_env(env),
    )
    if check and proc.returncode != 0:
        err = proc.stderr if text else proc.stderr.decode(errors="replace")
        if proc.returncode == -signal.SIGXFSZ:
            # Killed writing past `ulimit -f`, without a word on stderr.
            err += "\nFile too large"
        lock = held_lock(err)
        if lock:
            raise VstackError(
                f"git {' '.join(args[:3])} failed in {repo}: {lock} exists: another git "
                f"is running there, or one was killed (rerun vstack: it removes a lock "
                f"that no process holds)"
            )
        raise (
            VstackError(
                f"git {' '.join(args[:3])} failed in {repo}: {err.strip().splitlines()[-1:] or ['?']}"
                if err.strip()
                else f"git {' '.join(args[:3])} failed in {repo} (exit {proc.returncode})"
            )
            if not limit_hit(repo, err)
            else VstackError(
                f"git {' '.join(args[:3])} could not write in {repo}: {limit_hit(repo, err)}: "
                f"free space or raise the limit and rerun"
            )
        )
    return proc


def limit_hit(repo: Path | str, stderr: str) -> str:
    """A full disk or a file size limit, when git's failure looks like a failed
    write ("Failed to split patches", "No space left", "File too large"); or ""."""
    if not re.search(r"Failed to split patches|No space left|File too large|"
                     r"short write|unable to write", stderr):  # fmt: skip
        return ""
    from vstack.oserrors import write_limit_hint

    return write_limit_hint(repo)


def limit_note(repo: Path | str, stderr: str) -> str:
    """limit_hit as a parenthesis to end an error message with, or ""."""
    hit = limit_hit(repo, stderr)
    return f" ({hit}: free space or raise the limit, then rerun)" if hit else ""


def held_lock(stderr: str) -> str | None:
    """The lock file named by git's "Unable to create '...lock': File exists"."""
    m = re.search(r"Unable to create '([^']+\.lock)': File exists", stderr)
    return m.group(1) if m else None


def out(repo: Path | str, *args: str, **kw) -> str:
    return git(repo, *args, **kw).stdout.strip()


def rev_parse(repo: Path | str, rev: str) -> str | None:
    p = git(repo, "rev-parse", "--verify", "--quiet", rev + "^{commit}", check=False)
    return p.stdout.strip() or None if p.returncode == 0 else None


def is_repo(path: Path) -> bool:
    if not path.exists():
        return False
    p = run(
        ["git", "-C", str(path), "rev-parse", "--show-toplevel"],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        env=git_env(),
    )
    return p.returncode == 0 and Path(p.stdout.strip()).resolve() == path.resolve()


def status_porcelain(repo: Path | str) -> str:
    return git(repo, "status", "--porcelain", "--untracked-files=all").stdout


def op_in_progress(repo: Path) -> str | None:
    """Name of a git am/rebase/merge/cherry-pick/revert/bisect left unfinished in
    repo, if any (op_abort says how to drop it)."""
    dotgit = Path(repo) / ".git"
    # A repository's own .git folder needs no git call; a worktree's .git is a file.
    gitdir = (
        dotgit
        if dotgit.is_dir()
        else Path(out(repo, "rev-parse", "--absolute-git-dir"))
    )
    for marker, name in (
        ("rebase-apply", "git am / rebase"),
        ("rebase-merge", "git rebase"),
        ("MERGE_HEAD", "git merge"),
        ("CHERRY_PICK_HEAD", "git cherry-pick"),
        ("REVERT_HEAD", "git revert"),
        ("BISECT_LOG", "git bisect"),
    ):
        if (gitdir / marker).exists():
            return name
    return None


def op_abort(op: str) -> str:
    """The git command that drops an operation op_in_progress named."""
    return {
        "git am / rebase": "am --abort",
        "git rebase": "rebase --abort",
        "git merge": "merge --abort",
        "git cherry-pick": "cherry-pick --abort",
        "git revert": "revert --abort",
        "git bisect": "bisect reset",
    }.get(op, "am --abort")


def read_blobs(repo: Path | str, rev: str, paths: list[str]) -> dict[str, bytes]:
    """Contents of paths at rev, in one `git cat-file --batch` process."""
    if not paths:
        return {}
    req = "".join(f"{rev}:{p}\n" for p in paths).encode()
    data = git(repo, "cat-file", "--batch", input=req, text=False).stdout
    blobs, pos = {}, 0
    for p in paths:
        nl = data.index(b"\n", pos)
        header = data[pos:nl].decode()
        if header.endswith("missing"):
            raise VstackError(f"{p} is missing at {rev}")
        size = int(header.split()[2])
        blobs[p] = data[nl + 1 : nl + 1 + size]
        pos = nl + 1 + size + 1
    return blobs


def tree_changes(repo: Path | str, old: str, new: str) -> list[tuple[str, str, str]]:
    """[(status A/M/D, path, new mode)] between two commits, renames off."""
    text = out(repo, "diff-tree", "-r", "--no-renames", "-z", old, new)
    fields = text.split("\0")
    changes = []
    i = 0
    while i + 1 < len(fields):
        meta, path = fields[i], fields[i + 1]
        i += 2
        if not meta.startswith(":"):
            continue
        _, new_mode, _, _, status = meta[1:].split(" ")
        changes.append((status[0], path, new_mode))
    return changes


@contextlib.contextmanager
def temp_worktree(repo: Path, rev: str, parent: Path):
    """A detached worktree of repo at rev under parent, removed afterwards: work done
    in it never touches the user's work branch or work tree."""
    parent.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="wt-", dir=parent))
    try:
        git(repo, "worktree", "add", "-q", "--detach", str(tree), rev)
        yield tree
    finally:
        git(repo, "worktree", "remove", "--force", str(tree), check=False)
        shutil.rmtree(tree, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)
