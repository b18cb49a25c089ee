"""Which patch a recorded resolution (resolutions/<version>/<patch>) was made from.

A record carries the sha256 of the patch file it resolves in a trailer of its
message. When patches/<patch> has changed since, replaying the record would throw
the change away: the rebase stops instead. A record without the trailer (written
before it existed) cannot be checked; it is replayed with a note that says so.
The trailer never reaches a commit: it is stripped before a port is applied.
"""

from __future__ import annotations

import hashlib
import re

TRAILER = "Resolves-Patch-Sha256"
_LINE = re.compile(rf"^{TRAILER}: *([0-9a-fA-F]*)[ \t]*\n?", re.M)
_TRAILER_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: .+$")


def patch_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _message_end(text: str) -> int:
    """Where the message of a format-patch text ends (its diff, or the end)."""
    head_end = text.find("\n\n")
    start = head_end + 1 if head_end != -1 else 0
    cuts = [
        i
        for i in (text.find("\n---\n", start), text.find("\ndiff --git ", start))
        if i != -1
    ]
    return min(cuts) + 1 if cuts else len(text)


def with_patch_hash(text: str, sha256: str) -> str:
    """text with the trailer added at the end of its message's trailer block (or as a
    trailer paragraph of its own); an existing one is replaced."""
    text = strip_patch_hash(text)
    end = _message_end(text)
    msg, rest = text[:end], text[end:]
    body = msg.rstrip("\n")
    tail = msg[len(body) :] or "\n"
    head_end = body.find("\n\n")
    last = body.rsplit("\n\n", 1)[-1]
    in_trailers = head_end != -1 and all(
        _TRAILER_LINE.match(ln) for ln in last.splitlines()
    )
    sep = "\n" if in_trailers else "\n\n"
    return f"{body}{sep}{TRAILER}: {sha256}{tail}{rest}"


def strip_patch_hash(text: str) -> str:
    return _LINE.sub("", text)


def recorded_hash(text: str) -> str | None:
    m = _LINE.search(text[: _message_end(text)])
    return m.group(1).lower() if m and m.group(1) else None


def check_record(record_text: str, patch_data: bytes) -> tuple[str, str | None, str]:
    """('ok' | 'stale' | 'unverifiable', the recorded hash, the patch's hash)."""
    want = recorded_hash(record_text)
    have = patch_sha256(patch_data)
    if want is None:
        return "unverifiable", None, have
    return ("ok" if want == have else "stale"), want, have
