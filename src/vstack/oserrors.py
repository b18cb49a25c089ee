"""Failures of the environment named by the file they hit: a write stopped by a full
disk or by the file size limit (ulimit -f) says which file, and a git command that
failed for the same reason says so."""

from __future__ import annotations

import contextlib
import resource
import shutil
from pathlib import Path

# Free space under which a failed git write is put down to a full disk.
LOW_SPACE = 1 << 20


@contextlib.contextmanager
def naming(path: Path | str):
    """An OSError raised inside without a file name gets path's (f.write() on a full
    disk or past ulimit -f raises "File too large" naming nothing)."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def write_limit_hint(where: Path | str) -> str:
    """Why writes under `where` may fail: a full disk, a file size limit; or ""."""
    hints = []
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(where).free
        if free < LOW_SPACE:
            hints.append(f"the disk holding {where} is full ({free} bytes free)")
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        hints.append(f"the file size limit (ulimit -f) is {soft} bytes")
    return "; ".join(hints)
