"""What git makes of a patch file, asked of git: the subject, author and message
`git mailinfo` takes from it (as `git am` does), its trailers as `git
interpret-trailers` reads them, the paths `git apply --numstat -z` names (never
C-quoted), and git's own unquoting (quote.c) for the one name numstat does not
print: the source of a rename or copy.

These git processes read stdin and write stdout (and a temporary folder): they
change nothing of the project or of a repository, so a kill in one is a kill just
before it. They run outside any repository, with every configuration pinned
(vstack.gitutil). Results are cached by the patch's bytes: one patch is parsed
once per process however often it is asked about.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from vstack import gitutil
from vstack.errors import VstackError


def _git_plain(args: list[str], data: bytes, pass_fds: tuple[int, ...] = ()) -> bytes:
    """git ARGS with data on stdin, run in an empty folder outside any repository."""
    with tempfile.TemporaryDirectory(prefix="vstack-parse-") as tmp:
        env = gitutil.git_env({"GIT_CEILING_DIRECTORIES": str(Path(tmp).parent)})
        p = subprocess.run(
            ["git", *gitutil.config_args(), *args],
            input=data, capture_output=True, cwd=tmp, env=env, pass_fds=pass_fds,
        )  # fmt: skip
        if p.returncode == -signal.SIGXFSZ:  # killed past `ulimit -f`, without a word
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), f"git {args[0]}")
        if p.returncode != 0:
            said = p.stderr.decode(errors="replace").strip().splitlines()
            raise VstackError(
                f"git {args[0]} cannot read this patch: "
                f"{said[-1] if said else f'exit {p.returncode}'}"
            )
        return p.stdout


@dataclasses.dataclass(frozen=True)
class Mail:
    author: str
    email: str
    subject: str
    date: str
    body: str  # the message after the subject, as git am commits it
    patch: bytes  # what git am applies


@functools.lru_cache(maxsize=512)
def mailinfo(data: bytes, keep: bool = False) -> Mail:
    """git mailinfo of a format-patch text. keep=False strips "[PATCH ...]" from the
    subject (-b, as a reader names the patch); keep=True leaves it whole (-k, what
    `git am --keep` commits)."""
    # The message and the patch come back through pipes, not files: parsing a
    # patch writes nothing (a disk that is full or a `ulimit -f` below the patch's
    # size does not fail a parse; the write that fails names its own file).
    pipes = [os.pipe(), os.pipe()]
    got: list[bytes] = [b"", b""]

    def drain(i: int) -> None:
        with os.fdopen(pipes[i][0], "rb") as f:
            got[i] = f.read()

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in (0, 1)]
    for t in readers:
        t.start()
    try:
        info = _git_plain(
            ["mailinfo", "-k" if keep else "-b", "--encoding=UTF-8",
             f"/dev/fd/{pipes[0][1]}", f"/dev/fd/{pipes[1][1]}"],
            data, pass_fds=(pipes[0][1], pipes[1][1]),
        ).decode("utf-8", errors="replace")  # fmt: skip
    finally:
        for _, w in pipes:
            os.close(w)
        for t in readers:
            t.join()
    body = got[0].decode("utf-8", errors="replace")
    diff = got[1]
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key not in fields:
            fields[key] = value
    return Mail(
        fields.get("Author", ""), fields.get("Email", ""), fields.get("Subject", ""),
        fields.get("Date", ""), body, diff,
    )  # fmt: skip


@functools.lru_cache(maxsize=512)
def trailers(message: str) -> tuple[tuple[str, str], ...]:
    """(key, value) of each trailer of a commit message (subject first), as `git
    interpret-trailers --parse` reads them (folded lines unfolded)."""
    out = _git_plain(
        ["interpret-trailers", "--parse", "--no-divider"], message.encode()
    ).decode("utf-8", errors="replace")
    found = []
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            found.append((key.strip(), value.strip()))
    return tuple(found)


def unquote_c_style(quoted: bytes) -> bytes:
    """git's unquote_c_style (quote.c): a name git wrote between double quotes."""
    if not quoted.startswith(b'"'):
        raise ValueError("not a quoted name")
    out, i = bytearray(), 1
    escapes = {b"a": 7, b"b": 8, b"f": 12, b"n": 10, b"r": 13, b"t": 9, b"v": 11}
    while i < len(quoted):
        c = quoted[i : i + 1]
        i += 1
        if c == b'"':
            if i != len(quoted):
                raise ValueError("text after the closing quote")
            return bytes(out)
        if c != b"\\":
            out += c
            continue
        c = quoted[i : i + 1]
        i += 1
        if c in escapes:
            out.append(escapes[c])
        elif c in (b"\\", b'"'):
            out += c
        elif c in (b"0", b"1", b"2", b"3"):
            digits = quoted[i - 1 : i + 2]
            if len(digits) != 3 or any(d not in b"01234567" for d in digits):
                raise ValueError("bad octal escape")
            out.append(int(digits, 8))
            i += 2
        else:
            raise ValueError("bad escape")
    raise ValueError("no closing quote")


def header_name(raw: bytes) -> str:
    """A path as a patch's extended header line writes it (rename from, copy from):
    C-quoted when it has to be."""
    raw = raw.rstrip(b"\r")
    if raw.startswith(b'"'):
        raw = unquote_c_style(raw)
    return raw.decode("utf-8", errors="surrogateescape")


@dataclasses.dataclass(frozen=True)
class FileDiff:
    old: str | None  # None: created
    new: str | None  # None: deleted
    status: str  # A(dded) D(eleted) M(odified) R(enamed) C(opied)
    old_mode: str | None
    new_mode: str | None
    binary: bool
    hunks: tuple[
        tuple[int, int, int, int, str], ...
    ]  # old_start, len, new_start, len, header
    changed: int  # added + removed lines

    @property
    def path(self) -> str:
        return self.new if self.new is not None else self.old  # type: ignore[return-value]


def _numstat(patch: bytes) -> list[tuple[str, bool]]:
    """(name, binary) per file of a patch, as git apply names them (-z: unquoted;
    the new name, or the old one of a deletion)."""
    if not patch.strip():
        return []
    out = _git_plain(["apply", "--numstat", "-z", "-"], patch)
    found = []
    for entry in out.split(b"\0"):
        if not entry:
            continue
        added, removed, name = entry.split(b"\t", 2)
        found.append(
            (name.decode("utf-8", errors="surrogateescape"), added == b"-" == removed)
        )
    return found


def _sections(patch: bytes) -> list[list[bytes]]:
    """The patch cut at each `diff --git` line (a line of a hunk never starts so)."""
    sections: list[list[bytes]] = []
    for line in patch.split(b"\n"):
        if line.startswith(b"diff --git "):
            sections.append([])
        if sections:
            sections[-1].append(line)
    return sections


def _hunk_header(line: bytes) -> tuple[int, int, int, int, str] | None:
    text = line.rstrip(b"\r").decode("utf-8", errors="replace")
    parts = text.split(" ", 3)
    if len(parts) < 3 or parts[0] != "@@" or not parts[1].startswith("-"):
        return None
    try:
        o = [int(x) for x in parts[1][1:].split(",")]
        n = [int(x) for x in parts[2][1:].split(",")]
    except ValueError:
        return None
    return o[0], o[1] if len(o) > 1 else 1, n[0], n[1] if len(n) > 1 else 1, text


@functools.lru_cache(maxsize=512)
def files(patch: bytes) -> tuple[FileDiff, ...]:
    """Every file a patch (what git am applies: Mail.patch) changes, in order, with
    names as git apply reads them."""
    named = _numstat(patch)
    sections = _sections(patch)
    if len(sections) != len(named):
        raise VstackError(
            f"git apply reads {len(named)} file(s) in this patch, but it has "
            f"{len(sections)} 'diff --git' header(s): not a patch vstack can take"
        )
    found = []
    for (name, binary), lines in zip(named, sections, strict=True):
        head: dict[bytes, bytes] = {}
        hunks, in_hunks = [], False
        changed = len(changed_lines(b"\n".join(lines)))
        for line in lines[1:]:
            if line.startswith(b"@@"):
                h = _hunk_header(line)
                if h:
                    hunks.append(h)
                    in_hunks = True
                continue
            if in_hunks:
                continue
            for key in (b"new file mode ", b"deleted file mode ", b"old mode ",
                        b"new mode ", b"rename from ", b"copy from "):  # fmt: skip
                if line.startswith(key):
                    head[key] = line[len(key) :]
        if b"new file mode " in head:
            old, new, status = None, name, "A"
        elif b"deleted file mode " in head:
            old, new, status = name, None, "D"
        elif b"rename from " in head:
            old, new, status = header_name(head[b"rename from "]), name, "R"
        elif b"copy from " in head:
            old, new, status = header_name(head[b"copy from "]), name, "C"
        else:
            old, new, status = name, name, "M"

        def mode(key: bytes, head=head) -> str | None:
            v = head.get(key)
            return v.rstrip(b"\r").decode() if v is not None else None

        found.append(FileDiff(
            old, new, status,
            mode(b"old mode ") or mode(b"deleted file mode "),
            mode(b"new mode ") or mode(b"new file mode "),
            binary, tuple(hunks), changed,
        ))  # fmt: skip
    return tuple(found)


def am_message(mail: Mail) -> str:
    """The commit message git am makes of a mail (its parse_mail: the subject, a
    blank line, the body, cleaned up as `git stripspace` does)."""
    raw = f"{mail.subject}\n\n{mail.body}".encode()
    return _git_plain(["stripspace"], raw).decode("utf-8", errors="replace")


def file_headers(text: bytes) -> dict[int, FileDiff]:
    """{0-based line index of a `diff --git` line of a format-patch text: the file
    it starts}, for the patch git am applies (the last such lines: a quoted diff in
    the message is not among them)."""
    diffs = files(mailinfo(text).patch)
    heads = [
        i for i, ln in enumerate(text.split(b"\n")) if ln.startswith(b"diff --git ")
    ]
    if len(heads) < len(diffs):
        return {}
    return dict(zip(heads[len(heads) - len(diffs) :], diffs, strict=True))


def changed_lines(patch: bytes) -> list[bytes]:
    """The added and removed lines of a patch's hunks, verbatim, each hunk read as
    far as its header's line counts go, as git apply reads it (what follows the
    last hunk, such as format-patch's "-- " signature, is not part of it)."""
    found: list[bytes] = []
    old = new = 0
    for line in patch.split(b"\n"):
        if old > 0 or new > 0:
            tag = line[:1]
            if tag == b"\\":
                continue  # "\ No newline at end of file"
            if tag == b"-":
                old -= 1
                found.append(line)
            elif tag == b"+":
                new -= 1
                found.append(line)
            else:  # context (" ", or an empty line git reads as one)
                old, new = old - 1, new - 1
            continue
        if line.startswith(b"@@ "):
            h = _hunk_header(line)
            if h:
                old, new = h[1], h[3]
    return found
