"""Materialising a vLLM base as a commit in the stack repository (.vstack/repo)."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
import zipfile
from pathlib import Path

from vstack import fsutil, gitutil
from vstack.config import Pin, Project
from vstack.errors import VstackError
from vstack.fetch import VerifiedCache, check_record, fetch_wheel
from vstack.nightly import fetch_pinned, is_per_commit_pin
from vstack.wheelzip import read_named

BASE_REF_PREFIX = "refs/vstack/bases/"
WORK_BRANCH = "work"


@dataclasses.dataclass(frozen=True)
class Base:
    ref: str
    commit: str  # the git commit id of the base in the stack repository
    source: str  # "wheel" or "git"
    version: str
    upstream_commit: str  # what vllm/_version.py (or the checkout) says


def ensure_repo(project: Project) -> Path:
    """The stack repository, made whole or not at all: `git init` runs in a folder
    beside it that is renamed into place, so a Ctrl-C that reaches git init (or a
    kill) leaves no half-made repository that every later command trips over."""
    repo = project.repo
    dotgit = repo / ".git"
    if all((dotgit / n).exists() for n in ("HEAD", "config", "objects", "refs")):
        return repo
    if repo.exists() and any(repo.iterdir()):
        # what a git init killed half-way left (a vstack before this one ran it in
        # place): kept aside, never removed
        aside = repo.with_name(f"{repo.name}-broken-{time.strftime('%Y%m%d-%H%M%S')}")
        fsutil.replace(repo, aside)
        print(f"vstack: {repo} was no whole git repository: moved to {aside}",
              file=sys.stderr)  # fmt: skip
    repo.parent.mkdir(parents=True, exist_ok=True)
    for old in repo.parent.glob(f".{repo.name}-init-*"):
        fsutil.remove_tree(old)  # an interrupted init's (under the project lock)
    tmp = repo.parent / f".{repo.name}-init-{os.getpid()}"
    tmp.mkdir()
    gitutil.git(tmp, "init", "-q")
    # A repository of its own for bases and work branches: nothing here is pushed.
    gitutil.git(tmp, "config", "gc.auto", "0")
    if repo.exists():
        repo.rmdir()  # empty
    fsutil.replace(tmp, repo)
    return repo


def is_text(data: bytes) -> bool:
    return b"\0" not in data[:8192]


def wheel_source_members(zf: zipfile.ZipFile) -> tuple[list[zipfile.ZipInfo], dict]:
    """Members a base keeps: package sources; no dist-info, compiled or binary files."""
    keep, skipped = [], {"compiled": 0, "binary": 0}
    for info in zf.infolist():
        name = info.filename
        if info.is_dir() or ".dist-info/" in name:
            continue
        if name.endswith((".so", ".pyd", ".dylib")) or ".so." in name:
            skipped["compiled"] += 1
            continue
        keep.append(info)
    return keep, skipped


def read_wheel_version(wheel: Path) -> tuple[str, str | None]:
    """(version, commit id) from vllm/_version.py inside the wheel."""
    got = read_named(wheel, ["vllm/_version.py"])
    if not got:
        raise VstackError(f"{wheel.name} has no vllm/_version.py")
    text = got["vllm/_version.py"].decode()
    v = re.search(r"__version__\s*=\s*version\s*=\s*'([^']+)'", text)
    c = re.search(r"__commit_id__\s*=\s*commit_id\s*=\s*'([^']+)'", text)
    if not v:
        raise VstackError("vllm/_version.py in the wheel names no __version__")
    return v.group(1), c.group(1) if c else None


def _fast_import_stream(zf, members, ref, message) -> tuple[bytes, dict]:
    chunks, files, skipped_binary = [], [], 0
    for i, info in enumerate(members, 1):
        data = zf.read(info)
        if not is_text(data):
            skipped_binary += 1
            continue
        mode = "100755" if (info.external_attr >> 16) & 0o111 else "100644"
        chunks.append(b"blob\nmark :%d\ndata %d\n" % (i, len(data)) + data + b"\n")
        files.append(f"M {mode} :{i} {info.filename}\n".encode())
    msg = message.replace("{binary}", str(skipped_binary)).encode()
    who = f"vstack <vstack@localhost> {gitutil.FIXED_DATE}"
    chunks.append(
        f"commit {ref}\nauthor {who}\ncommitter {who}\ndata {len(msg)}\n".encode()
        + msg
        + b"\n"
        + b"".join(files)
        + b"\n"
    )
    return b"".join(chunks), {"files": len(files), "binary": skipped_binary}


def import_wheel(repo: Path, wheel: Path, ref: str, sha256: str) -> dict:
    """Commit the wheel's source files as one root commit at ref (deterministic)."""
    version, commit = read_wheel_version(wheel)
    with zipfile.ZipFile(wheel) as zf:
        members, skipped = wheel_source_members(zf)
        message = (
            f"vLLM {version} base from {wheel.name}\n\n"
            f"Upstream commit: {commit}\n"
            f"Wheel sha256: {sha256}\n"
            f"Skipped: {skipped['compiled']} compiled files, {{binary}} binary files\n"
        )
        stream, counts = _fast_import_stream(zf, members, ref, message)
    proc = gitutil.run(
        [
            "git",
            "-C",
            str(repo),
            *gitutil.config_args(),
            "fast-import",
            "--quiet",
            "--date-format=raw",
        ],
        input=stream,
        capture_output=True,
        env=gitutil.git_env(),
    )
    if proc.returncode != 0:
        raise VstackError(f"git fast-import failed: {proc.stderr.decode()[-300:]}")
    return {"version": version, "commit": commit, **skipped, **counts}


def wheel_ref(version: str, sha256: str) -> str:
    return f"{BASE_REF_PREFIX}wheel-{version}-{sha256[:12]}"


def base_from_wheel(project: Project, wheel: Path, sha256: str) -> Base:
    repo = ensure_repo(project)
    version, upstream = read_wheel_version(wheel)
    ref = wheel_ref(version, sha256)
    commit = gitutil.rev_parse(repo, ref)
    if commit is None:
        print(f"vstack: importing {wheel.name} into {repo} ...", file=sys.stderr)
        info = import_wheel(repo, wheel, ref, sha256)
        commit = gitutil.rev_parse(repo, ref)
        print(
            f"vstack: base {version} = {commit[:12]} "
            f"({info['files']} files; skipped {info['compiled']} compiled, "
            f"{info['binary']} binary)",
            file=sys.stderr,
        )
    gitutil.git(repo, "update-ref", f"refs/heads/base/{version}", commit)
    return Base(ref, commit, "wheel", version, upstream or "")


def submodule_head(project: Project) -> str | None:
    """HEAD of a populated vllm/ checkout, or None when vllm/ is empty or absent."""
    sub = project.submodule
    if not sub.is_dir() or not any(sub.iterdir()):
        return None
    if not gitutil.is_repo(sub):
        raise VstackError(f"{sub} is populated but is not a git checkout")
    return gitutil.out(sub, "rev-parse", "HEAD")


def check_submodule(project: Project, pin: Pin) -> str | None:
    head = submodule_head(project)
    if head is not None and not head.startswith(pin.short_hash):
        raise VstackError(
            f"vllm/ is at {head[:12]}, but stack.toml pins {pin.short_hash} "
            f"(vLLM {pin.version}); run: git -C vllm fetch origin && "
            f"git -C vllm checkout {pin.short_hash}"
        )
    return head


def base_from_git(project: Project, checkout: Path, rev: str, version: str) -> Base:
    repo = ensure_repo(project)
    sha = gitutil.out(checkout, "rev-parse", f"{rev}^{{commit}}")
    ref = f"{BASE_REF_PREFIX}git-{sha[:12]}"
    if gitutil.rev_parse(repo, ref) is None:
        print(f"vstack: fetching {sha[:12]} from {checkout} ...", file=sys.stderr)
        gitutil.git(repo, "fetch", "-q", "--no-tags", str(checkout.resolve()), sha)
        gitutil.git(repo, "update-ref", ref, sha)
    gitutil.git(repo, "update-ref", f"refs/heads/base/{version}", sha)
    return Base(ref, sha, "git", version, "g" + sha[:9])


def ensure_base(project: Project, pin: Pin | None = None) -> Base:
    """The pinned base: from the vllm/ checkout when populated, else from the wheel."""
    pin = pin or project.pin
    head = check_submodule(project, pin)
    if head is not None:
        return base_from_git(project, project.submodule, head, pin.version)
    wheel = pinned_wheel(project, pin)
    return base_from_wheel(project, wheel, pin.sha256)


def pinned_base_anywhere(project: Project, pin: Pin | None = None) -> Base:
    """The pinned base even when vllm/ has since moved on (rebase starts from it):
    the pinned commit is looked up in the checkout's history."""
    pin = pin or project.pin
    head = submodule_head(project)
    if head is not None and not head.startswith(pin.short_hash):
        p = gitutil.git(project.submodule, "rev-parse", "--verify", "--quiet",
                        f"{pin.short_hash}^{{commit}}", check=False)  # fmt: skip
        if p.returncode == 0:
            return base_from_git(
                project, project.submodule, p.stdout.strip(), pin.version
            )
    return ensure_base(project, pin)


def pinned_wheel(project: Project, pin: Pin | None = None) -> Path:
    pin = pin or project.pin
    if not pin.wheel:
        raise VstackError(
            "stack.toml pins no wheel (a git-checkout base); building needs one: "
            "`vstack rebase --onto <git rev> --wheel <file or version>`"
        )
    verified = VerifiedCache(project.cache / "verified.json")
    if not (project.wheel_cache / pin.wheel).is_file() and is_per_commit_pin(pin):
        # pip cannot find a nightly: it comes from the per-commit repository.
        fetch_pinned(project, pin)
    wheel = fetch_wheel(
        pin.version, project.wheel_cache, pin.wheel, pin.sha256, verified
    )
    check_record(wheel, verified)
    _, commit = read_wheel_version(wheel)
    # A per-commit pin records the full id; the wheel reports setuptools-scm's short one.
    if commit and not pin.short_hash.startswith(commit.removeprefix("g")):
        raise VstackError(
            f"{wheel.name} reports commit {commit}, but stack.toml pins {pin.commit}"
        )
    return wheel
