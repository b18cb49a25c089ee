"""patches/series and the patch files it names: reading and small parsers."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from vstack.errors import VstackError


def read_series_entries(patches_dir: Path) -> list[tuple[int, str]]:
    """(line number, patch file name) in apply order; blank lines and '#' comments
    are skipped."""
    series = patches_dir / "series"
    if not series.is_file():
        return []
    entries = []
    # utf-8-sig: an editor's byte-order mark is not part of the first name
    text = series.read_bytes().decode("utf-8-sig", errors="replace")
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "/" in line or not line.endswith(".patch"):
            raise VstackError(f"{series}:{n}: '{line}' is not a .patch file name")
        entries.append((n, line))
    return entries


def read_series(patches_dir: Path) -> list[str]:
    """Patch file names in apply order. Blank lines and '#' comments are ignored."""
    return [name for _, name in read_series_entries(patches_dir)]


def series_paths(patches_dir: Path) -> list[Path]:
    """The series' patch files, each checked to be a format-patch file (see
    patch_problems). An empty or missing series while patches/ holds .patch files
    is an error: it would build an unpatched wheel without a word."""
    names = read_series(patches_dir)
    if not names:
        unlisted = sorted(p.name for p in patches_dir.glob("*.patch"))
        if unlisted:
            what = (
                "is missing"
                if not (patches_dir / "series").is_file()
                else "lists no patch"
            )
            raise VstackError(
                f"patches/series {what}, but patches/ holds {len(unlisted)} patch "
                f"file(s) ({', '.join(unlisted[:3])}{' ...' if len(unlisted) > 3 else ''}): "
                f"list them in patches/series in apply order, or remove them"
            )
    paths = []
    for name in names:
        p = patches_dir / name
        if not p.is_file():
            raise VstackError(
                f"patches/series names {name}, but patches/{name} is missing"
            )
        load_patch(p)
        paths.append(p)
    return paths


def patch_problems(data: bytes) -> list[tuple[int, str]]:
    """(line, problem) for each reason git must not be given these bytes as a patch:
    not a format-patch file, not UTF-8 (vLLM's sources are), or a NUL byte (git
    applies it as text and the build would ship a file Python cannot import)."""
    found: list[tuple[int, str]] = []
    head = data[:4096].split(b"\n\n", 1)[0]
    if not data.startswith(b"From ") or b"\nSubject: " not in b"\n" + head:
        found.append(
            (
                1,
                "not a git format-patch file (no 'From <commit>' line and Subject: header)",
            )
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        found.append(
            (line, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})")
        )
    nul = data.find(b"\0")
    if nul != -1:
        line = data.count(b"\n", 0, nul) + 1
        found.append((line, "a NUL byte (binary content in a text patch)"))
    first = data.split(b"\n", 1)[0]
    if data.startswith(b"From ") and first.endswith(b"\r"):
        # format-patch never ends its "From <commit>" line with CR: the whole file
        # was converted (core.autocrlf on a checkout without .gitattributes).
        found.append(
            (
                1,
                "CRLF line endings throughout (converted by a checkout with "
                "core.autocrlf; .gitattributes keeps patches byte-exact: check "
                "patches/ out again)",
            )
        )
    found += _diff_problems(data)
    return found


# What a text patch cannot carry into the wheel (mode 120000: a symlink, 160000: a
# submodule; a binary diff): such a patch is refused, not built without it.
_DIFF_PROBLEMS = (
    (re.compile(rb"^(?:new file |new |deleted file )?mode 120000$"),
     "a symlink (mode 120000), which a wheel cannot carry"),
    (re.compile(rb"^(?:new file |new |deleted file )?mode 160000$"),
     "a submodule (mode 160000), which a wheel cannot carry"),
    (re.compile(rb"^GIT binary patch$|^Binary files .* differ$"),
     "a binary change, which a text patch does not carry (git writes no content)"),
)  # fmt: skip


def _diff_problems(data: bytes) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    in_diff = False
    for n, line in enumerate(data.split(b"\n"), 1):
        line = line.rstrip(b"\r")
        if line.startswith(b"diff --git "):
            in_diff = True
            continue
        if not in_diff or line[:1] in (b"+", b"-", b" "):
            continue
        for pat, what in _DIFF_PROBLEMS:
            if pat.match(line):
                found.append((n, what))
                break
    return found


def load_patch(path: Path) -> tuple[str, PatchInfo]:
    """The text and parsed form of a patch file; one clear error naming the file and
    line when it is not one."""
    data = path.read_bytes()
    problems = patch_problems(data)
    if problems:
        line, what = problems[0]
        raise VstackError(f"{path}:{line}: {what}")
    text = data.decode("utf-8")
    try:
        return text, parse_patch(text)
    except VstackError as e:
        raise VstackError(f"{path}: {e}") from None


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
    files: list[str]  # every path it touches (a rename's both names)
    added: list[str]
    deleted: list[str]
    hunks: list[Hunk]
    diff_lines: int  # added + removed lines
    author: str = ""
    email: str = ""


def parse_patch(text: str | bytes) -> PatchInfo:
    """What git makes of a format-patch text (vstack.gitparse): the subject and
    message `git mailinfo` reads (RFC 2047 headers decoded, folded lines joined),
    the trailers `git interpret-trailers` finds, and the files `git apply` names
    (C-quoted names unquoted; a rename's or copy's source included)."""
    from vstack import gitparse

    data = (
        text.encode("utf-8", errors="surrogateescape")
        if isinstance(text, str)
        else text
    )
    if b"\n\n" not in data.replace(b"\r\n", b"\n"):
        raise VstackError("not a git format-patch file (no header)")
    mail = gitparse.mailinfo(data)
    message = f"{mail.subject}\n\n{mail.body}"
    found = gitparse.trailers(message)
    trailers: dict[str, list[str]] = {}
    for key, value in found:
        trailers.setdefault(key, []).append(value)
    paragraphs = mail.body.strip("\n").split("\n\n")
    if found and paragraphs:
        paragraphs = paragraphs[:-1]  # git's trailer block: the last paragraph
    files: list[str] = []
    added, deleted, hunks, changed = [], [], [], 0
    for f in gitparse.files(mail.patch):
        for name in (f.old, f.new):
            if name is not None and name not in files:
                files.append(name)
        if f.status == "A":
            added.append(f.path)
        elif f.status == "D":
            deleted.append(f.path)
        for o, ol, n, nl, header in f.hunks:
            hunks.append(Hunk(f.path, o, ol, n, nl, header))
        changed += f.changed
    return PatchInfo(
        subject=mail.subject,
        body="\n\n".join(paragraphs).strip(),
        trailers=trailers,
        files=files,
        added=added,
        deleted=deleted,
        hunks=hunks,
        diff_lines=changed,
        author=mail.author,
        email=mail.email,
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
