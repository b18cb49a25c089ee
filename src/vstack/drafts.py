"""What `vstack upstream` may write, and where, without losing a user's work.

upstream/<patch>/ holds the recorded drafts (title, body, checks, range-diff,
meta.json), which a person may edit and commits; everything else a run makes (the
signed copy to send, a draft made without its tests, a re-cut on another base)
goes to .vstack/outgoing/. A file in upstream/ is replaced only when it is vstack's
own: it holds what vstack wrote there (meta.json records those digests), or,
written before such records, git holds it unchanged. In a vLLM checkout, a branch
is moved only when it still points where vstack left it and is not checked out;
otherwise the draft gets the next free name, and the branch a backup ref.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from vstack import gitutil

KEEP_DIGESTS = 8  # per file: what vstack wrote in its last few runs
MADE_PREFIX = "refs/vstack/made/"  # in a checkout: the tip vstack left on a branch
BACKUP_PREFIX = "refs/vstack/backup/"  # in a checkout: a branch's tip before a move
MAX_NAMES = 50


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def clean_in_git(root: Path, path: Path) -> bool:
    """git tracks path and holds it unchanged (staged or not)."""
    if not gitutil.is_repo(root):
        return False
    rel = path.relative_to(root).as_posix()
    tracked = gitutil.git(root, "ls-files", "--error-unmatch", "--", rel, check=False)
    if tracked.returncode != 0:
        return False
    status = gitutil.git(root, "status", "--porcelain", "--", rel, check=False)
    return status.returncode == 0 and not status.stdout.strip()


def is_ours(root: Path, path: Path, written: list[str] | None) -> bool:
    """vstack may replace or remove the file at path: absent, or holding what
    vstack wrote there (`written`: the digests it recorded), or, with no record,
    held unchanged by git (an older vstack wrote it; git keeps it)."""
    if not path.exists():
        return True
    if not path.is_file():
        return False
    if written is not None:
        return digest(path.read_bytes()) in written
    return clean_in_git(root, path)


def remember(record: dict, name: str, data: bytes) -> None:
    """Add the digest of what vstack writes to `name` to its record (bounded)."""
    seen = [d for d in record.get(name, []) if d != digest(data)]
    record[name] = [digest(data), *seen][:KEEP_DIGESTS]


def edited(root: Path, folder: Path, names, record: dict) -> set[str]:
    """The files of `names` in folder that vstack may not replace: the user
    changed them since vstack wrote them (see is_ours)."""
    return {n for n in names if not is_ours(root, folder / n, record.get(n))}


# ---------------------------------------------------------------- branches


def _checked_out(checkout: Path) -> set[str]:
    p = gitutil.git(checkout, "worktree", "list", "--porcelain", check=False)
    return {
        ln.split(" ", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("branch ")
    }


def branch_plan(
    wanted: str, tip: str, state: dict[str, tuple[str | None, str | None, bool]],
    known: set[str],
) -> tuple[str, str]:  # fmt: skip
    """(branch name, action) for a draft's tip: the first of wanted, wanted-2, ...
    that is absent ("create"), already at tip ("keep"), or where vstack left it
    and not checked out ("move"). state[name] = (its tip, the tip vstack left
    there, checked out); `known`: other tips vstack made for the draft (branches
    written before vstack recorded what it left)."""
    for k in range(1, MAX_NAMES + 1):
        name = wanted if k == 1 else f"{wanted}-{k}"
        cur, made, checked_out = state.get(name, (None, None, False))
        if cur is None:
            return name, "create"
        if cur == tip:
            return name, "keep"
        if not checked_out and (cur == made or cur in known):
            return name, "move"
    raise ValueError(f"{wanted}: no free name among {MAX_NAMES}")


def publish_branch(
    checkout: Path, repo: Path, wanted: str, tip: str, known: set[str]
) -> tuple[str, list[str]]:
    """Point a branch of the vLLM checkout at `tip` (a commit of the stack
    repository) without moving one the user owns (see branch_plan); notes to
    print. Every branch passed over or moved gets a backup ref of its tip."""
    stage = f"refs/vstack/publish/{wanted}"
    gitutil.git(repo, "update-ref", stage, tip)
    gitutil.git(checkout, "fetch", "-q", "--no-tags", str(repo.resolve()), stage)
    state: dict[str, tuple[str | None, str | None, bool]] = {}
    checked_out = _checked_out(checkout)
    for k in range(1, MAX_NAMES + 1):
        name = wanted if k == 1 else f"{wanted}-{k}"
        ref = f"refs/heads/{name}"
        state[name] = (gitutil.rev_parse(checkout, ref),
                       gitutil.rev_parse(checkout, MADE_PREFIX + name),
                       ref in checked_out)  # fmt: skip
        if state[name][0] is None:
            break
    try:
        name, action = branch_plan(wanted, tip, state, known)
    except ValueError as e:
        from vstack.errors import VstackError

        raise VstackError(f"{checkout}: {e}: remove old vstack/ branches") from None
    notes = []
    for skipped in list(state)[: list(state).index(name)]:
        cur = state[skipped][0]
        backup = f"{BACKUP_PREFIX}{skipped}/{cur[:12]}"
        gitutil.git(checkout, "update-ref", backup, cur)
        why = ("it is checked out" if state[skipped][2] and cur in (state[skipped][1],
               *known) else "it holds commits vstack did not put there")  # fmt: skip
        notes.append(f"left branch {skipped} in {checkout} as it is ({why}; its tip "
                     f"{cur[:12]} is also kept as {backup})")  # fmt: skip
    ref = f"refs/heads/{name}"
    if action == "create":
        gitutil.git(checkout, "update-ref", ref, tip, "")
    elif action == "move":
        cur = state[name][0]
        backup = f"{BACKUP_PREFIX}{name}/{cur[:12]}"
        gitutil.git(checkout, "update-ref", backup, cur)
        gitutil.git(checkout, "update-ref", ref, tip, cur)
    gitutil.git(checkout, "update-ref", MADE_PREFIX + name, tip)
    gitutil.git(repo, "update-ref", "-d", stage, check=False)
    return name, notes
