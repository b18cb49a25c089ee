"""Commit messages that git am would change: a line of the message that git mailinfo
takes as the start of the patch ("---", "diff -", "Index: ") ends the message there,
and what follows becomes part of the patch (a quoted diff is applied as code); a body
that starts with "From:", "Subject:" or "Date:" is read as in-body mail headers (the
author or subject replaced, the line gone). Such a message never reaches a patch
file. vstack runs git am without --scissors and with mailinfo.scissors=false, so a
scissors line ("-- >8 --") and a "+++ " line are kept: they are not refused."""

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


_INBODY = re.compile(r"(?i)^(from|subject|date):")


def is_inbody_header(line: str) -> bool:
    """git mailinfo's check_inbody_header(): a line it takes as a mail header when
    it opens the message body ("From: x", "Subject: y", "Date: z", "[PATCH] s")."""
    return bool(_INBODY.match(line)) or (
        line.startswith("[PATCH]") and line[7:8].isspace()
    )


def split_line(message: str) -> tuple[int, str] | None:
    """(1-based line number, line) of the first line of a commit message that git am
    would not keep as it is (the end of the message, or an in-body header), or None."""
    lines = message.split("\n")
    # format-patch puts the first paragraph in Subject:; the body after it is where
    # mailinfo looks for in-body headers (its first non-blank line).
    body = next((i for i, ln in enumerate(lines) if not ln.strip()), len(lines))
    first = next((i for i in range(body, len(lines)) if lines[i].strip()), None)
    for n, line in enumerate(lines, 1):
        if is_patch_break(line) or (n - 1 == first and is_inbody_header(line)):
            return n, line
    return None


def refusal(message: str) -> str | None:
    found = split_line(message)
    if not found:
        return None
    n, line = found
    if not is_patch_break(line):
        return (
            f"line {n} of its message, {line[:60]!r}, opens the message body, so git "
            f"am would read it as a mail header when the patch is applied (it would "
            f"replace the author, subject or date, and the line would be lost): "
            f"reword it or put a sentence before it (git commit --amend, or git "
            f"rebase -i), then rerun"
        )
    return (
        f"line {n} of its message, {line[:60]!r}, would end the message when the patch "
        f"is applied (git am reads it as the start of the diff; what follows would be "
        f"lost or applied as code): indent it or reword it (git commit --amend, or "
        f"git rebase -i), then rerun"
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
    """(1-based line, what) where git am would not keep the message of a patch file:
    an in-body header ("From:", "Subject:", "Date:" opening the body), a "---"
    separator followed by more message text, or a quoted diff ("diff --git", "Index: ", "--- file") before the real "---" separator."""
    lines = text.split("\n")
    try:
        start = lines.index("") + 1  # the message starts after the mail headers
    except ValueError:
        return None
    cut = next((i for i in range(start, len(lines)) if is_patch_break(lines[i])), None)
    first = next((i for i in range(start, len(lines)) if lines[i].strip()), None)
    if first is not None and first != cut and is_inbody_header(lines[first]):
        return (
            first + 1,
            f"{lines[first][:60]!r} opens the message body, so git am reads it as a "
            f"mail header (it replaces the author or subject, and the line is lost)",
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
