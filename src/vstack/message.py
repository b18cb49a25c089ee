"""Commit messages that git am would cut: a line of the message that git mailinfo
takes as the start of the patch ("---", "diff -", "Index: ") or as a scissors line
("-- >8 --") ends the message there, and what follows becomes part of the patch (a
quoted diff is applied as code). Such a message never reaches a patch file."""

from __future__ import annotations

import re
from pathlib import Path

from vstack import gitutil
from vstack.errors import VstackError


def is_patch_break(line: str) -> bool:
    """git mailinfo's patchbreak(): where it stops reading the message."""
    if line.startswith(("diff -", "Index: ")):
        return True
    if line.startswith("---"):
        rest = line[3:]
        if rest.startswith(" ") and rest[1:2] and not rest[1:2].isspace():
            return True  # "--- <file name>"
        return rest.strip() == ""  # "---" and only blanks
    return False


def is_scissors(line: str) -> bool:
    """git mailinfo's is_scissors_line() ("-- >8 --", "--8<-- cut here --")."""
    scissors = gap = perforation = 0
    in_perforation = False
    first = last = None
    i = 0
    while i < len(line):
        c = line[i]
        if c.isspace():
            if in_perforation:
                perforation += 1
                gap += 1
            i += 1
            continue
        last = i
        if first is None:
            first = i
        if c == "-":
            in_perforation = True
            perforation += 1
        elif line[i : i + 2] in (">8", "8<", ">%", "%<"):
            in_perforation = True
            perforation += 2
            scissors += 2
            last = i + 1
            i += 1
        else:
            in_perforation = False
        i += 1
    visible = last - first + 1 if first is not None and last is not None else 0
    return bool(scissors) and 8 <= visible < perforation * 3 and gap * 2 < perforation


def split_line(message: str) -> tuple[int, str] | None:
    """(1-based line number, line) of the first line of a commit message that git am
    would take as the end of the message, or None."""
    for n, line in enumerate(message.split("\n"), 1):
        if is_patch_break(line) or line.startswith("+++ ") or is_scissors(line):
            return n, line
    return None


def refusal(message: str) -> str | None:
    found = split_line(message)
    if not found:
        return None
    n, line = found
    return (
        f"line {n} of its message, {line[:60]!r}, would end the message when the patch "
        f"is applied (git am reads it as the start of the diff or a scissors line; "
        f"what follows would be lost or applied as code): indent it or reword it "
        f"(git commit --amend, or git rebase -i), then rerun"
    )


def check_commit(repo: Path, sha: str, branch: str = "work") -> None:
    """Refuse, naming the commit and the line, a commit whose message git am would cut."""
    message = gitutil.out(repo, "log", "-1", "--format=%B", sha)
    why = refusal(message)
    if why:
        subject = message.split("\n", 1)[0]
        raise VstackError(
            f"commit {sha[:12]} ('{subject}') on branch '{branch}' in {repo}: {why}"
        )


_DIFFSTAT = re.compile(
    r"^ (\S.* \| |\d+ files? changed|create mode |delete mode |rename |mode change |copy )"
)


_DIFF_LINE = (
    " ", "+", "-", "@@", "\\", "diff ", "index ", "new file mode", "deleted file mode",
    "old mode", "new mode", "similarity", "dissimilarity", "rename ", "copy ",
    "Index: ", "====", "Binary files",
)  # fmt: skip


def patch_file_problem(text: str) -> tuple[int, str] | None:
    """(1-based line, what) where git am would cut the message of a patch file short:
    a scissors line, a "---" separator followed by more message text, or a quoted
    diff ("diff --git", "Index: ", "--- file") before the real "---" separator."""
    lines = text.split("\n")
    try:
        start = lines.index("") + 1  # the message starts after the mail headers
    except ValueError:
        return None
    cut = next((i for i in range(start, len(lines)) if is_patch_break(lines[i])), None)
    for i in range(start, cut if cut is not None else len(lines)):
        if is_scissors(lines[i]):
            return (
                i + 1,
                f"{lines[i][:60]!r} is a scissors line: git am --scissors drops the message above it",
            )
    if cut is None:
        return None
    diff = next(
        (i for i in range(cut, len(lines)) if lines[i].startswith("diff --git ")), None
    )
    if lines[cut].rstrip() == "---":
        lost = [
            i for i in range(cut + 1, diff if diff is not None else len(lines))
            if lines[i].strip() and not _DIFFSTAT.match(lines[i])
        ]  # fmt: skip
        if lost:
            i = lost[0]
            return i + 1, (
                f"{lines[i][:60]!r} follows the '---' line at {cut + 1}, so git am drops "
                f"it from the message: a '---' line in a message ends it"
            )
        return None
    # After a quoted diff, the rest of the message (text, trailers, the blank line
    # before the real diff) lies between the cut and the patch's last file diff.
    last = max(i for i in range(cut, len(lines)) if lines[i].startswith("diff -")) if any(
        lines[i].startswith("diff -") for i in range(cut, len(lines))) else cut  # fmt: skip
    if any(not ln.startswith(_DIFF_LINE) for ln in lines[cut + 1 : last]):
        return cut + 1, (
            f"{lines[cut][:60]!r} in the message is where git am ends it: what follows "
            f"(a quoted diff) would be applied as code"
        )
    return None
