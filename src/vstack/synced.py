"""What the work branch and patches/ held the last time they agreed.

.vstack/synced.json is written when they are made to agree (apply through the whole
series, export, a completed rebase): the work branch's tip, the base it was built
on, and the sha256 of each file of the series (patches/series and the patches it
lists). From it, export tells a work branch with new commits (export them) from a
patches/ that changed since (a pull, a hand edit: export would revert that, so it
refuses) and apply tells a branch that holds only what vstack put there (safe to
rebuild) from one with commits of the user's.
"""

from __future__ import annotations

import json
from pathlib import Path

from vstack import fsutil, journal
from vstack.config import Project
from vstack.errors import VstackError

FILE = "synced.json"
REL = f".vstack/{FILE}"


def series_files(patches_dir: Path) -> dict[str, bytes]:
    """patches/series and the patch files it lists (those that exist): the files
    export writes and may remove. Other *.patch files are not the series'."""
    from vstack.series import read_series

    found = {}
    series = patches_dir / "series"
    if series.is_file():
        found["series"] = series.read_bytes()
        try:
            names = read_series(patches_dir)
        except VstackError:
            names = []
        for name in names:
            p = patches_dir / name
            if p.is_file():
                found[name] = p.read_bytes()
    return found


def record_bytes(work: str, base: str, files: dict[str, bytes]) -> bytes:
    data = {
        "work": work,
        "base": base,
        "files": {n: journal.sha256(b) for n, b in sorted(files.items())},
    }
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def load(project: Project) -> dict | None:
    path = project.cache / FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not {"work", "base", "files"} <= set(data):
        return None
    return data


def save(project: Project, work: str, base: str) -> None:
    fsutil.write_bytes(
        project.cache / FILE,
        record_bytes(work, base, series_files(project.patches_dir)),
    )


def clear(project: Project) -> None:
    fsutil.remove(project.cache / FILE)


def changed_since(project: Project, record: dict) -> list[str]:
    """patches/ files (series files, then and now) that differ from the record."""
    now = {n: journal.sha256(b) for n, b in series_files(project.patches_dir).items()}
    then = record["files"]
    return sorted(n for n in set(now) | set(then) if now.get(n) != then.get(n))
