"""vstack lint: the rules every patch of the series follows, reported as file:line."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

from vstack import gitutil, identity, pep440, records
from vstack.config import Project
from vstack.errors import VstackError
from vstack.identity import Identity
from vstack.message import patch_file_problem
from vstack.series import parse_patch, patch_problems, read_series, read_series_entries

UPSTREAM_STATUSES = (
    "pending",
    "submitted",
    "accepted",
    "backport",
    "inappropriate",
    "rejected",
)
NEEDS_PR = ("submitted", "accepted", "backport")
SPDX_LINES = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)
# vLLM's pre-commit forbids new direct torch.cuda calls outside a few platform files.
TORCH_CUDA = re.compile(r"\btorch\.cuda\.")
TORCH_CUDA_ALLOWED = (
    "vllm/platforms/",
    "tests/",
    "benchmarks/",
    "vllm/utils/torch_utils.py",
)
# vLLM's import hooks, restated for when no vLLM checkout can run them: (pattern on
# the stripped line, the one file allowed to, what to do instead). Every Python file
# counts, tests too, and an indented (local) import as much as a top-level one.
FORBIDDEN_IMPORTS = (
    (  # check-triton-import: Triton only through vllm.triton_utils
        re.compile(r"^(from|import)\s+triton(\s|\.|$)"),
        "vllm/triton_utils/importing.py",
        "import Triton as vLLM does: `from vllm.triton_utils import tl, triton` "
        "(check-triton-import)",
    ),
    (  # enforce-regex-import: the regex package instead of re
        re.compile(r"^(import\s+re(\s|,|$)|from\s+re\s+import)"),
        "setup.py",
        "use `import regex as re` (enforce-regex-import)",
    ),
)


@dataclasses.dataclass(frozen=True)
class Finding:
    where: str  # "patches/x.patch:12"
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def new_torch_cuda_call(file: str, line: str) -> bool:
    """An added line of a vLLM source file that calls torch.cuda directly."""
    return (
        file.endswith(".py")
        and TORCH_CUDA.search(line.split("#", 1)[0]) is not None
        and not file.startswith(TORCH_CUDA_ALLOWED)
    )


def forbidden_import(file: str, line: str) -> str | None:
    """What vLLM's pre-commit says about an added import line, or None."""
    if not file.endswith(".py"):
        return None
    code = line.strip()
    for pattern, allowed_file, advice in FORBIDDEN_IMPORTS:
        if file != allowed_file and pattern.match(code):
            return advice
    return None


def _added_lines(text: str):
    """(patch line number, target file, new-file line number, text) of each added line;
    the files named as git apply names them (C-quoted names unquoted)."""
    from vstack import gitparse

    at = {
        i: f.path
        for i, f in gitparse.file_headers(
            text.encode("utf-8", errors="surrogateescape")
        ).items()
    }
    file, new_no = None, 0
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line.startswith("diff --git "):
            file = at.get(n - 1)
        elif line.startswith("@@"):
            m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", line)
            new_no = int(m.group(1)) if m else 0
        elif file and line.startswith("+") and not line.startswith("+++"):
            yield n, file, new_no, line[1:]
            new_no += 1
        elif file and line.startswith(" "):
            new_no += 1


def signoff_findings(where: str, signoffs: list[str]) -> list[Finding]:
    """A patch of the stack needs no sign-off (the person who sends a PR adds
    theirs: `vstack upstream --signoff`); one it carries must be a person's."""
    found = []
    for value in signoffs:
        ident = identity.parse(value)
        why = "not 'Name <email>'" if ident is None else identity.refusal(ident)
        if why:
            found.append(Finding(
                f"{where}:1",
                f"Signed-off-by: {value}: {why}; the DCO sign-off is a person's "
                f"own, added by whoever sends the PR (`vstack upstream --signoff`)",
            ))  # fmt: skip
    return found


def mails(path: Path) -> list[tuple[int, Identity | None, str, list[str]]]:
    """(line, author, subject, Signed-off-by values) of each mail of an mbox, read
    as `git am` reads them: `git mailsplit`, `git mailinfo` (RFC 2047 decoded),
    `git interpret-trailers --parse`."""
    data = path.read_bytes()
    starts = [n for n, ln in enumerate(data.split(b"\n"), 1) if ln.startswith(b"From ")]
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        split = Path(tmp) / "split"
        split.mkdir()
        gitutil.git(tmp, "mailsplit", f"-o{split}", str(path.resolve()))
        for k, mail in enumerate(sorted(split.iterdir())):
            msg, patch = Path(tmp) / "msg", Path(tmp) / "patch"
            info = gitutil.git(tmp, "mailinfo", "-b", str(msg), str(patch),
                               input=mail.read_bytes(), text=False).stdout  # fmt: skip
            head = dict(
                ln.split(": ", 1)
                for ln in info.decode("utf-8", "replace").splitlines()
                if ": " in ln
            )
            trailers = gitutil.out(tmp, "interpret-trailers", "--parse",
                                   input=msg.read_text(errors="replace"))  # fmt: skip
            values = [
                ln.split(": ", 1)[1].strip()
                for ln in trailers.splitlines()
                if ln.lower().startswith("signed-off-by: ")
            ]
            author = identity.parse(
                f"{head.get('Author', '')} <{head.get('Email', '')}>"
            )
            line = starts[k] if k < len(starts) else 1
            found.append((line, author, head.get("Subject", ""), values))
    return found


def mbox_findings(path: Path, where: str) -> list[Finding]:
    """A mail to send: signed off (a Signed-off-by of a person's, one of them its
    author's, as the DCO app checks) and authored by a person: the stack's shared
    identity or a placeholder as the author of a signed mail is refused
    (`vstack upstream --signoff` makes the signer its author)."""
    found = []
    try:
        parsed = mails(path)
    except VstackError as e:
        return [Finding(f"{where}:1", f"not an mbox git can read: {e}")]
    if not parsed:
        return [Finding(f"{where}:1", "holds no mail (not an mbox)")]
    for line, author, subject, values in parsed:
        at = f"{where}:{line}"
        if not values:
            found.append(Finding(at, f"'{subject}': no Signed-off-by: not sendable "
                                 f"(`vstack upstream <patch> --signoff` signs it)"))  # fmt: skip
            continue
        found += [Finding(at, f.message) for f in signoff_findings(where, values)]
        if author is None:
            found.append(Finding(at, f"'{subject}': its author is not 'Name <email>'"))
            continue
        why = identity.refusal(author)
        if why:
            found.append(Finding(at, f"'{subject}': From: {author}: {why}; a signed "
                                 f"mail's author must be a person (`vstack upstream "
                                 f"--signoff` makes the signer the author of the "
                                 f"stack's shared identity's patches)"))  # fmt: skip
        elif not any(
            (i := identity.parse(v)) is not None and i.same_as(author) for v in values
        ):
            found.append(Finding(at, f"'{subject}': no Signed-off-by from its author "
                                 f"{author} (the DCO check fails)"))  # fmt: skip
    return found


def signed_mboxes(outgoing: Path) -> list[Path]:
    """The signed mboxes under .vstack/outgoing/ (*.unsigned.mbox are not meant
    to be sent)."""
    if not outgoing.is_dir():
        return []
    return [p for p in sorted(outgoing.rglob("*.mbox"))
            if not p.name.endswith(".unsigned.mbox") and p.is_file()]  # fmt: skip


def outgoing_findings(root: Path, outgoing: Path) -> list[Finding]:
    """Every signed mbox under .vstack/outgoing/ (signed_mboxes)."""
    found = []
    for path in signed_mboxes(outgoing):
        where = path.relative_to(root) if path.is_relative_to(root) else path
        found += mbox_findings(path, where.as_posix())
    return found


def depends_on_findings(
    entries: list[tuple[int, str]], patches_dir: Path
) -> list[Finding]:
    """Each Depends-On: trailer names an earlier patch of the series (its file
    name, with or without .patch)."""
    found = []
    names = [name for _, name in entries]
    for i, name in enumerate(names):
        p = patches_dir / name
        if not p.is_file() or patch_problems(p.read_bytes()):
            continue  # reported as such
        info = parse_patch(p.read_text(errors="replace"))
        for dep in info.trailers.get("Depends-On", []):
            want = dep.strip()
            want = want if want.endswith(".patch") else want + ".patch"
            if want not in names:
                found.append(Finding(f"patches/{name}:1",
                                     f"Depends-On: {dep}: no such patch in patches/series"))  # fmt: skip
            elif names.index(want) >= i:
                found.append(Finding(f"patches/{name}:1",
                                     f"Depends-On: {dep} comes after it in patches/series"))  # fmt: skip
    return found


def lint_patch(
    name: str, text: str, folder: str = "patches", signoffs: bool = True
) -> list[Finding]:
    """signoffs=False for recorded resolutions: records of a past move, never sent."""
    info = parse_patch(text)
    where = f"{folder}/{name}"
    found = []
    if not info.body or len(info.body.split()) < 5:
        found.append(
            Finding(
                f"{where}:1",
                "no description of why the patch exists (a few sentences before the trailers)",
            )
        )
    status = info.trailers.get("Upstream-Status", [])
    if not status:
        found.append(Finding(f"{where}:1", "no Upstream-Status: trailer"))
    elif status[0].split()[0].lower() not in UPSTREAM_STATUSES:
        found.append(
            Finding(
                f"{where}:1",
                f"Upstream-Status: '{status[0]}' is not one of {', '.join(UPSTREAM_STATUSES)}",
            )
        )
    elif status[0].split()[0].lower() in NEEDS_PR and not info.trailers.get(
        "Upstream-PR"
    ):
        found.append(
            Finding(
                f"{where}:1",
                f"Upstream-Status: {status[0]} needs an Upstream-PR: trailer",
            )
        )
    found += [
        Finding(f"{where}:{n}", what)
        for n, what in filter(None, [patch_file_problem(text)])
    ]
    if signoffs:
        found += signoff_findings(where, info.trailers.get("Signed-off-by", []))
    lines_by_file: dict[str, list[tuple[int, int, str]]] = {}
    for n, file, new_no, line in _added_lines(text):
        lines_by_file.setdefault(file, []).append((n, new_no, line))
        if line != line.rstrip():
            found.append(
                Finding(f"{where}:{n}", f"trailing whitespace in {file}:{new_no}")
            )
        if new_torch_cuda_call(file, line):
            found.append(
                Finding(
                    f"{where}:{n}",
                    f"new direct torch.cuda call in {file}:{new_no} (use torch.accelerator / current_platform)",
                )
            )
        advice = forbidden_import(file, line)
        if advice:
            found.append(
                Finding(
                    f"{where}:{n}", f"`{line.strip()}` in {file}:{new_no}: {advice}"
                )
            )
    for file in info.added:
        if not file.endswith(".py"):
            continue
        head = [ln for _, _, ln in lines_by_file.get(file, [])[:5]]
        if not lines_by_file.get(file):
            continue  # an empty new file (__init__.py) needs no header
        if not all(s in head for s in SPDX_LINES):
            n = lines_by_file[file][0][0]
            found.append(
                Finding(
                    f"{where}:{n}", f"new file {file} lacks vLLM's SPDX header lines"
                )
            )
    return found


def byte_findings(where: str, data: bytes) -> list[Finding]:
    """What makes bytes unusable as a patch (not format-patch, not UTF-8, NUL)."""
    return [Finding(f"{where}:{line}", what) for line, what in patch_problems(data)]


def lint_series(patches_dir: Path) -> list[Finding]:
    found = []
    entries = read_series_entries(patches_dir)
    seen = set()
    for line, name in entries:
        if name in seen:
            found.append(Finding(f"patches/series:{line}", f"{name} is listed twice"))
        seen.add(name)
        if not (patches_dir / name).is_file():
            found.append(Finding(f"patches/series:{line}", f"{name} does not exist"))
    for p in sorted(patches_dir.glob("*.patch")):
        if p.name not in seen:
            found.append(Finding(f"patches/{p.name}:1", "not listed in patches/series"))
    for _, name in entries:
        p = patches_dir / name
        if p.is_file():
            data = p.read_bytes()
            bad = byte_findings(f"patches/{name}", data)
            found.extend(bad)
            if not any("format-patch" in f.message for f in bad):
                found.extend(lint_patch(name, data.decode(errors="replace")))
    found += depends_on_findings(entries, patches_dir)
    return found


def newer_than_pin(version: str, pin_version: str) -> bool:
    """Whether a resolutions/<version>/ folder is for a version after the pin, in
    PEP 440's order (vstack.pep440, the rule scripts/test uses too); a folder name
    that is no version is not."""
    v, pin = pep440.parse(version), pep440.parse(pin_version)
    return v is not None and pin is not None and v > pin


def record_notes(root: Path, pin_version: str | None = None) -> list[str]:
    """Records for a release newer than the pin that carry no patch hash: they
    replay, but whether their patch changed since cannot be checked."""
    notes = []
    for p in sorted((root / "resolutions").glob("*/*.patch")):
        version = p.parent.name
        if pin_version is not None and not newer_than_pin(version, pin_version):
            continue
        if records.recorded_hash(p.read_text(errors="replace")) is None:
            notes.append(
                f"{p.relative_to(root).as_posix()}: no {records.TRAILER}: trailer; "
                f"a rebase replays it without checking that its patch is unchanged"
            )
    return notes


def lint_resolutions(root: Path, pin_version: str | None = None) -> list[Finding]:
    """Recorded resolutions follow the patch rules; one with no diff says why. A
    record for a release newer than the pin (pin_version) whose patch hash is not
    that of patches/<name> is stale: the patch changed after it was recorded."""
    found = []
    for p in sorted((root / "resolutions").glob("*/*")):
        folder = p.parent.relative_to(root).as_posix()
        where = f"{folder}/{p.name}"
        if not p.name.endswith(".patch"):
            found.append(Finding(f"{where}:1", "not a .patch file"))
            continue
        data = p.read_bytes()
        bad = byte_findings(where, data)
        if bad:
            found.extend(bad)
            continue
        text = data.decode()
        try:
            info = parse_patch(text)
        except Exception as e:  # noqa: BLE001 - any parse failure is the finding
            found.append(Finding(f"{where}:1", f"not a patch: {e}"))
            continue
        want = records.recorded_hash(text)
        patch = root / "patches" / p.name
        if (
            want
            and pin_version is not None
            and newer_than_pin(p.parent.name, pin_version)
            and patch.is_file()
        ):
            have = records.patch_sha256(patch.read_bytes())
            if have != want:
                found.append(Finding(
                    f"{where}:1",
                    f"stale: recorded from another version of patches/{p.name} "
                    f"({records.TRAILER} {want[:12]}, the patch is now {have[:12]}); "
                    f"a rebase onto {p.parent.name} stops there until it is re-resolved",
                ))  # fmt: skip
        if info.files:
            found.extend(lint_patch(p.name, text, folder, signoffs=False))
        elif len(info.body.split()) < 5:
            found.append(
                Finding(
                    f"{where}:1", "a record with no diff must say what supersedes it"
                )
            )
    return found


def cmd_lint(
    project: Project, git_path: str | None = None, mboxes: list[str] | None = None
) -> int:
    from vstack.precommit import on_series

    if mboxes:
        found = []
        for m in mboxes:
            path = Path(m)
            if not path.is_file():
                raise VstackError(f"{m}: no such file")
            found += mbox_findings(path, m)
        for f in found:
            print(f)
        if found:
            print(f"vstack lint: {len(found)} problem(s) in {len(mboxes)} mbox(es)")
            return 1
        print(f"vstack lint: {len(mboxes)} mbox(es) OK: signed off by their authors")
        return 0
    version = project.pin.version
    found = lint_series(project.patches_dir) + lint_resolutions(project.root, version)
    found += outgoing_findings(project.root, project.cache / "outgoing")
    hooks, note = on_series(project, git_path)
    found += [Finding(f"patches/{name}:1", message) for name, message in hooks]
    for f in found:
        print(f)
    for record_note in record_notes(project.root, version):
        print(f"note: {record_note}")
    print(f"vstack lint: {note}")
    n = len(read_series(project.patches_dir))
    sent = len(signed_mboxes(project.cache / "outgoing"))
    what = f"{n} patch(es)" + (f" and {sent} signed mbox(es) under "
                               f".vstack/outgoing/" if sent else "")  # fmt: skip
    if found:
        print(f"vstack lint: {len(found)} problem(s) in {what}")
        return 1
    print(f"vstack lint: {what} OK" + ("" if sent else " (no signed mbox under "
                                       ".vstack/outgoing/ to check)"))  # fmt: skip
    return 0
