"""patches/series and the patch files it names: reading and small parsers."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from vstack.errors import VstackError


def read_series(patches_dir: Path) -> list[str]:
    """Patch file names in apply order. Blank lines and '#' comments are ignored."""
    series = patches_dir / "series"
    if not series.is_file():
        return []
    names = []
    for n, raw in enumerate(series.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "/" in line or not line.endswith(".patch"):
            raise VstackError(f"{series}:{n}: '{line}' is not a .patch file name")
        names.append(line)
    return names


def series_paths(patches_dir: Path) -> list[Path]:
    paths = []
    for name in read_series(patches_dir):
        p = patches_dir / name
        if not p.is_file():
            raise VstackError(
                f"patches/series names {name}, but patches/{name} is missing"
            )
        paths.append(p)
    return paths


def series_digest(patches: list[Path]) -> str:
    """Identifies the series content (order + bytes), for the wheel's version label."""
    h = hashlib.sha256()
    for p in patches:
        data = p.read_bytes()
        h.update(p.name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


@dataclasses.dataclass
class Hunk:
    file: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str


@dataclasses.dataclass
class PatchInfo:
    subject: str
    body: str  # the description between subject and trailers
    trailers: dict[str, list[str]]
    files: list[str]
    added: list[str]
    deleted: list[str]
    hunks: list[Hunk]
    diff_lines: int  # added + removed lines


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")


def _unfold_subject(header_lines: list[str]) -> str:
    subject, taking = [], False
    for line in header_lines:
        if line.startswith("Subject: "):
            subject.append(line[len("Subject: ") :])
            taking = True
        elif taking and line.startswith((" ", "\t")):
            subject.append(line.strip())
        else:
            taking = False
    s = " ".join(subject).strip()
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", s)


def parse_patch(text: str) -> PatchInfo:
    head, sep, rest = text.partition("\n\n")
    if not sep:
        raise VstackError("not a git format-patch file (no header)")
    subject = _unfold_subject(head.splitlines())
    # --no-stat output has no "---" line: the diff starts at the first "diff --git".
    text_ = "\n" + rest
    cut = text_.find("\ndiff --git ")
    sep_at = text_.find("\n---\n")
    if sep_at != -1 and (cut == -1 or sep_at < cut):
        message, diff = text_[:sep_at], text_[sep_at + 5 :]
    elif cut != -1:
        message, diff = text_[:cut], text_[cut + 1 :]
    else:
        message, diff = text_, ""
    paragraphs = message.strip("\n").split("\n\n")
    trailers: dict[str, list[str]] = {}
    if paragraphs and all(_TRAILER.match(ln) for ln in paragraphs[-1].splitlines()):
        for ln in paragraphs[-1].splitlines():
            k, v = _TRAILER.match(ln).groups()
            trailers.setdefault(k, []).append(v)
        paragraphs = paragraphs[:-1]
    files, added, deleted, hunks, changed = [], [], [], [], 0
    current = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.+) b/(.+)$", line)
            current = m.group(2) if m else line.split()[-1]
            files.append(current)
        elif line.startswith("new file mode") and current:
            added.append(current)
        elif line.startswith("deleted file mode") and current:
            deleted.append(current)
        elif line.startswith("@@") and current:
            m = _HUNK.match(line)
            if m:
                o, ol, n, nl, hdr = m.groups()
                hunks.append(
                    Hunk(current, int(o), int(ol or 1), int(n), int(nl or 1), line)
                )
        elif line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            changed += 1
    return PatchInfo(
        subject=subject,
        body="\n\n".join(paragraphs).strip(),
        trailers=trailers,
        files=files,
        added=added,
        deleted=deleted,
        hunks=hunks,
        diff_lines=changed,
    )


def hunks_at(info: PatchInfo, file: str, line: int | None) -> list[Hunk]:
    """The hunks of file that git reported failing at line (all of file's if None)."""
    hs = [h for h in info.hunks if h.file == file]
    if line is None:
        return hs
    exact = [h for h in hs if h.old_start == line]
    return (
        exact
        or [h for h in hs if h.old_start <= line < h.old_start + max(h.old_len, 1)]
        or hs
    )


def slug(subject: str, limit: int = 72) -> str:
    """File name for a patch: its subject, lowercase, cut at a word boundary."""
    s = re.sub(r"\[([^\]]*)\]", r"\1 ", subject).lower()
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    if len(s) > limit:
        s = s[:limit].rsplit("-", 1)[0]
    return (s or "patch") + ".patch"
