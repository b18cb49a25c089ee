"""Changes to several project files at once (patches/, stack.toml, resolutions/ and
vstack's record of the last sync), all or nothing: a redo journal.

  1. the new content of every file is staged in .vstack/journal/ (content-addressed);
  2. the intent (.vstack/journal/intent.json: each path with the sha256 it had and
     the one it gets) is written atomically. From this instant the change is
     decided: a run killed later is finished by the next vstack command;
  3. each file is replaced atomically (vstack.fsutil) or removed, vstack's own
     records (.vstack/: the sync record) last, so that a run stopped on the way
     never has a record saying patches/ holds what it does not hold yet;
  4. the intent is removed, then the staged content.

recover() runs before every vstack command that writes (under the project lock):
an intent left behind is carried out, which gives exactly the files an
uninterrupted run writes; staged content without an intent is dropped (the change
never started). A file that holds neither its old nor its new content was changed
by someone else since: it is named and nothing is overwritten.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from vstack import fsutil
from vstack.errors import VstackError

FOLDER = "journal"
INTENT = "intent.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(path: Path) -> str | None:
    return sha256(path.read_bytes()) if path.is_file() else None


def commit(
    root: Path, cache: Path, changes: dict[str, bytes | None], verb: str
) -> list[str]:
    """Make each root-relative path in changes hold its bytes (None: absent).
    Returns the paths that changed. Paths already as wanted are left alone."""
    todo = {}
    for rel, data in sorted(changes.items(), key=_order):
        have = _current(root / rel)
        want = None if data is None else sha256(data)
        if have != want:
            todo[rel] = (have, want, data)
    if not todo:
        return []
    folder = cache / FOLDER
    for _, want, data in todo.values():
        if data is not None:
            fsutil.write_bytes(folder / want, data)
    intent = {
        "verb": verb,
        "files": {
            rel: {"old": have, "new": want} for rel, (have, want, _) in todo.items()
        },
    }
    fsutil.write_text(folder / INTENT, json.dumps(intent, indent=1) + "\n")
    _carry_out(root, folder, intent)
    return list(todo)


def _order(item: tuple[str, object]) -> tuple[bool, str]:
    """Project files first, vstack's records (.vstack/...) after them."""
    return item[0].startswith(".vstack/"), item[0]


def _carry_out(root: Path, folder: Path, intent: dict) -> None:
    for rel, f in sorted(intent["files"].items(), key=_order):
        path = root / rel
        if _current(path) == f["new"]:
            continue
        if f["new"] is None:
            fsutil.remove(path)
        else:
            fsutil.write_bytes(path, (folder / f["new"]).read_bytes())
    fsutil.remove(folder / INTENT)
    fsutil.remove_tree(folder)


def recover(root: Path, cache: Path, say=None) -> list[str]:
    """Finish a change a killed run had decided (see the module's doc); returns the
    paths it wrote."""
    # What a run killed inside an atomic write left (.NAME.PID.tmp beside it).
    for where in (root / "patches", root, cache, cache / "rebase", cache / "reports"):
        fsutil.sweep_tmp(where)
    folder = cache / FOLDER
    if not folder.is_dir():
        return []
    path = folder / INTENT
    if not path.is_file():
        fsutil.remove_tree(folder)  # staged only: the change never began
        return []
    try:
        intent = json.loads(path.read_text())
        files = intent["files"]
    except (ValueError, KeyError, TypeError):
        raise VstackError(
            f"{path} is damaged: it records an interrupted change to patches/ or "
            f"{'stack.toml'}; check those files with `git status`, then remove {folder}"
        ) from None
    missing = [
        rel for rel, f in files.items()
        if f["new"] is not None and _current(root / rel) != f["new"]
        and not (folder / f["new"]).is_file()
    ]  # fmt: skip
    foreign = [
        rel for rel, f in files.items()
        if _current(root / rel) not in (f["old"], f["new"])
    ]  # fmt: skip
    if foreign or missing:
        raise VstackError(
            f"an interrupted `vstack {intent.get('verb', '?')}` was writing "
            f"{', '.join(foreign or missing)}, which "
            + (
                "changed since (not by vstack)"
                if foreign
                else "cannot be finished (its staged content is gone)"
            )
            + f": nothing overwritten; check them with `git status`, then remove "
            f"{folder} to give up the rest of that change"
        )
    todo = [rel for rel, f in files.items() if _current(root / rel) != f["new"]]
    _carry_out(root, folder, intent)
    if todo and say:
        say(
            f"finished what an interrupted `vstack {intent.get('verb', '?')}` had "
            f"begun writing: {', '.join(todo)}"
        )
    return todo
