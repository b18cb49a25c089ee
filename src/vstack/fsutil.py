"""Every file vstack writes for the project or for its own records goes through here.

A write is atomic (git's lockfile discipline): the bytes go to a temporary file
beside the target, are flushed to disk, and the temporary file is renamed over the
target, so a reader, or the next run after a kill, sees the old content or the new,
never a torn file. Sets of files that must change together (patches/ and
stack.toml) go through vstack.journal, built on these.

tests/interrupts.py wraps these functions (and vstack.gitutil.run) to stop a run at
each of them in turn: callers use them as `fsutil.write_bytes(...)`, never by
importing the names, so that the wrapper sees every call.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from vstack import oserrors
from vstack.errors import VstackError

# Folders `build --out` and `scripts/drift --out` create hold this file: a later run
# may replace what is in such a folder; anywhere else it refuses a non-empty folder.
OWN_MARKER = ".vstack-out"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_bytes(path: Path, data: bytes) -> None:
    """path holds data, or (after a crash at any instant) what it held before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with oserrors.naming(path), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def replace(tmp: Path, path: Path) -> None:
    """Move a finished temporary file (a wheel written in place) over path."""
    os.replace(tmp, path)


def copy_file(src: Path, dst: Path) -> None:
    """dst becomes a copy of src, atomically (a large file is streamed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(dst)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


_OWN_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[1-9][0-9]*)\.tmp$")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process (or unknowable): leave its file
    return True


def sweep_tmp(folder: Path) -> None:
    """Temporary files of write_bytes that a killed run left in folder: only the
    tool's own .NAME.<pid>.tmp whose pid is no running process (a user's own
    .notes.tmp, or a live run's file, is left alone)."""
    if folder.is_dir():
        for p in folder.glob(".*.tmp"):
            m = _OWN_TMP.match(p.name)
            if m and p.is_file() and not _pid_running(int(m.group("pid"))):
                p.unlink(missing_ok=True)


def own_folder(folder: Path, what: str, default: bool = False, create: bool = True):
    """folder as an output folder of `what`: created (with OWN_MARKER) when absent
    or empty; reused when it holds the marker (or is the default folder, which is
    vstack's by definition); refused when it holds anything else, since a later
    step removes what an earlier run wrote there. create=False only checks."""
    if folder.exists() and not folder.is_dir():
        raise VstackError(f"{what}: {folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not default and not (folder / OWN_MARKER).is_file():
            raise VstackError(
                f"{what}: {folder} is not empty and was not made by {what} (no "
                f"{OWN_MARKER} in it): give a new or empty folder; {what} replaces "
                f"what it wrote there earlier and must not touch anything else"
            )
        return folder
    if create:
        folder.mkdir(parents=True, exist_ok=True)
        if not default:
            write_text(
                folder / OWN_MARKER, f"made by {what}; it replaces its files here\n"
            )
    return folder
