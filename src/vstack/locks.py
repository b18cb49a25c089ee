"""One vstack command per project at a time, and what a killed run leaves behind.

A command that changes the stack repository holds an flock on the project folder
(released by the kernel when the process dies, so it never goes stale). Under it,
anything of git's or vstack's in .vstack/ that looks in use can only be a leftover
of a killed run, unless a process outside vstack (a git the user started) holds it:
that is checked through /proc before anything is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

from vstack.errors import VstackError

# Lock files git creates next to what it is about to rewrite.
GIT_LOCK_NAMES = (
    "index.lock", "HEAD.lock", "ORIG_HEAD.lock", "FETCH_HEAD.lock", "config.lock",
    "packed-refs.lock", "shallow.lock", "MERGE_HEAD.lock", "AUTO_MERGE.lock",
)  # fmt: skip
# A .download-* folder with no lock file younger than this may be one being created.
_FRESH_S = 60.0
# Where /proc cannot tell whether a partial download file is in use: a day old.
_STALE_FILE_S = 86400.0


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _say(msg: str) -> None:
    print(f"vstack: {msg}", file=sys.stderr)


def _holder_pid(st: os.stat_result) -> int | None:
    """The pid holding an flock on the file with this stat, from /proc/locks."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        f = line.split()
        if len(f) > 5 and f[1] == "FLOCK" and f[5] == want and f[4].isdigit():
            return int(f[4])
    return None


def describe_pid(pid: int | None) -> str:
    if pid is None:
        return "pid unknown"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    except OSError:
        return f"pid {pid}"
    cmd = " ".join(cmd.split())  # one line, whatever the arguments hold
    return f"pid {pid}: {cmd[:120]}" if cmd else f"pid {pid}"


@contextlib.contextmanager
def project_lock(root: Path, verb: str):
    """Exclusive use of the project at root for one vstack command."""
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder_pid(os.fstat(fd))
            raise VstackError(
                f"another vstack command is running in {root} ({describe_pid(pid)}): "
                f"wait for it to finish before `vstack {verb}`"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the flock


def processes_using(files: list[Path], folder: Path) -> list[tuple[int, str]] | None:
    """(pid, name) of the processes that hold one of files open, or are a git
    working inside folder; None where /proc cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    targets = {os.path.realpath(f) for f in files}
    top = os.path.realpath(folder)
    me = os.getpid()
    found = []
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            name = (d / "comm").read_text().strip()
        except OSError:
            continue
        hit = False
        if name.startswith("git"):
            try:
                cwd = os.readlink(d / "cwd")
                hit = cwd == top or cwd.startswith(top + os.sep)
            except OSError:
                pass
        if not hit and targets:
            try:
                fds = os.listdir(d / "fd")
            except OSError:
                fds = []
            for fd in fds:
                try:
                    if os.readlink(d / "fd" / fd) in targets:
                        hit = True
                        break
                except OSError:
                    continue
        if hit:
            found.append((int(d.name), name))
    return found


def git_lock_files(gitdir: Path) -> list[Path]:
    found = [gitdir / n for n in GIT_LOCK_NAMES if (gitdir / n).exists()]
    found += sorted((gitdir / "refs").rglob("*.lock"))
    found += sorted(gitdir.glob("worktrees/*/*.lock"))
    return found


def clear_stale_git_locks(repo: Path, scope: Path | None = None) -> list[Path]:
    """Remove git lock files in repo that no process holds, naming each; raise,
    naming the lock and the process, when one is in use."""
    gitdir = repo / ".git"
    if not gitdir.is_dir():
        return []
    locks = git_lock_files(gitdir)
    if not locks:
        return []
    users = processes_using(locks, scope or repo)
    names = ", ".join(str(p) for p in locks)
    if users is None:
        raise VstackError(
            f"{names} exists (left by a git that was killed?), and this system cannot "
            f"tell whether a git process still holds it: remove it once none is running"
        )
    if users:
        who = ", ".join(f"{name} (pid {pid})" for pid, name in users)
        raise VstackError(
            f"{names} is in use by {who}: wait for it to finish, or stop it"
        )
    for p in locks:
        p.unlink(missing_ok=True)
        _say(
            f"removed {p}: a stale lock left by an interrupted git (no process holds it)"
        )
    return locks


def remove_leftovers(cache: Path, repo: Path) -> list[Path]:
    """Temporary worktrees (.vstack/wt-*) and git's temporary packs left by a killed
    run. Only called under the project lock: no vstack of this project runs."""
    gitdir = repo / ".git"
    trees = [p for p in cache.glob("wt-*") if p.is_dir()]
    packs = []
    if gitdir.is_dir():
        packs = sorted((gitdir / "objects" / "pack").glob("tmp_*"))
        packs += sorted((gitdir / "objects").glob("*/tmp_obj_*"))
    if not trees and not packs:
        return []
    users = processes_using(packs, cache)
    if users is None or users:
        return []  # a git is at work in .vstack (or cannot tell): leave them
    for t in trees:
        shutil.rmtree(t, ignore_errors=True)
    for p in packs:
        p.unlink(missing_ok=True)
    if trees and gitdir.is_dir():
        from vstack import gitutil

        gitutil.git(repo, "worktree", "prune", check=False)
    if trees or packs:
        _say(
            f"removed what an interrupted run left in {cache}: {len(trees)} temporary "
            f"worktree(s), {len(packs)} temporary pack file(s)"
        )
    return trees + packs


def recover(cache: Path, repo: Path) -> None:
    """Before a command uses the stack repository: stale locks, then leftovers."""
    if not cache.is_dir():
        return
    clear_stale_git_locks(repo, cache)
    remove_leftovers(cache, repo)


# ---------------------------------------------------------------- download folders


@contextlib.contextmanager
def held_folder(folder: Path):
    """Mark folder as in use for as long as the block runs (an flock on a file in
    it), so that sweep_folders in another process leaves it alone."""
    fd = os.open(folder / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


def sweep_folders(parent: Path, pattern: str) -> list[Path]:
    """Remove folders matching pattern under parent that no process holds (see
    held_folder): what a killed download left."""
    removed = []
    for d in parent.glob(pattern):
        if d.is_file():
            # A download streamed into a file of that name (vstack.nightly) holds
            # it open while it runs.
            users = processes_using([d], parent)
            if users == [] or (users is None and _age(d) > _STALE_FILE_S):
                d.unlink(missing_ok=True)
                removed.append(d)
            continue
        if not d.is_dir():
            continue
        lock = d / ".lock"
        if not lock.exists():
            if _age(d) < _FRESH_S:
                continue  # being created right now, or too recent to judge
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    if removed:
        _say(
            f"removed {len(removed)} unfinished download(s) in {parent} "
            f"(left by an interrupted run)"
        )
    return removed
