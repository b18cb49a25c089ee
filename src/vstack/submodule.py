"""The vllm/ submodule's gitlink: the stack repository records the pinned upstream
commit, so `git submodule update --init` checks out the base the series applies to.

stack.toml names the commit as vllm/_version.py does (a short id, except for bases
from the per-commit wheel repository); a gitlink needs the full id. It comes from the
pin itself, from a populated vllm/ checkout, or from `git ls-remote` of the upstream
URL (.gitmodules; VSTACK_UPSTREAM_URL or --url override it): the peeled release tag
v<version>, else a branch or tag tip starting with the short id (a nightly that is
still main's head).
"""

from __future__ import annotations

import os
import subprocess
import sys

from vstack import gitutil
from vstack.config import Pin, Project
from vstack.errors import VstackError
from vstack.nightly import FULL_SHA

PATH = "vllm"


def gitmodules_url(project: Project) -> str | None:
    f = project.root / ".gitmodules"
    if not f.is_file():
        return None
    p = gitutil.git(
        project.root, "config", "-f", str(f), "--get", f"submodule.{PATH}.url",
        check=False,
    )  # fmt: skip
    return p.stdout.strip() or None


def upstream_url(project: Project, flag: str | None = None) -> str | None:
    return flag or os.environ.get("VSTACK_UPSTREAM_URL") or gitmodules_url(project)


def ls_remote(url: str, *patterns: str) -> list[tuple[str, str]]:
    """(sha, ref) pairs the remote advertises for patterns; one-line error if it
    cannot be reached."""
    from vstack.fetch import download_timeout

    timeout = download_timeout()
    try:
        p = gitutil.run(
            ["git", "ls-remote", url, *patterns],
            capture_output=True, text=True, timeout=timeout,
            env=gitutil.git_env(user_config=True),  # the user's proxy, insteadOf
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise VstackError(f"git ls-remote {url}: no answer in {timeout:g} s") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise VstackError(f"git ls-remote {url} failed: {last}")
    return [tuple(ln.split("\t", 1)) for ln in p.stdout.splitlines() if "\t" in ln]


def pick_commit(refs: list[tuple[str, str]], version: str, short: str) -> str | None:
    """The full commit for the pin among advertised refs: tag v<version> (peeled,
    for annotated tags) when it matches, else the unique ref tip starting with
    the short id."""
    tag = f"refs/tags/v{version}"
    by_ref = dict((ref, sha) for sha, ref in refs)
    for ref in (tag + "^{}", tag):
        if ref in by_ref and by_ref[ref].startswith(short):
            return by_ref[ref]
    hits = {sha for sha, ref in refs if sha.startswith(short)}
    return hits.pop() if len(hits) == 1 else None


def resolve(project: Project, pin: Pin, url: str | None) -> tuple[str | None, str]:
    """(full commit, where it came from), or (None, why not)."""
    short = pin.short_hash
    if FULL_SHA.fullmatch(short):
        return short, "the pin records the full commit"
    if (project.submodule / ".git").exists():
        p = gitutil.git(
            project.submodule, "rev-parse", "--verify", "--quiet",
            f"{short}^{{commit}}", check=False,
        )  # fmt: skip
        if p.returncode == 0:
            return p.stdout.strip(), "from the vllm/ checkout"
    if not url:
        return None, f"no upstream URL (.gitmodules has no submodule.{PATH}.url)"
    try:
        tag = f"refs/tags/v{pin.version}"
        # patterns match the printed name, so the peeled line needs its own
        refs = ls_remote(url, tag, tag + "^{}", "HEAD", "refs/heads/*")
    except VstackError as e:
        return None, str(e)
    sha = pick_commit(refs, pin.version, short)
    if sha:
        return sha, f"from git ls-remote {url}"
    return None, (
        f"{url} has no tag v{pin.version} at {short} and no branch tip starting with it"
    )


def _toplevel(project: Project) -> str | None:
    p = gitutil.git(project.root, "rev-parse", "--show-toplevel", check=False)
    return p.stdout.strip() if p.returncode == 0 else None


def current_gitlink(project: Project) -> str | None:
    """The commit the index records for vllm/, or None without a gitlink."""
    p = gitutil.git(project.root, "ls-files", "--stage", "--", PATH, check=False)
    for line in p.stdout.splitlines():
        mode, sha, _ = line.split(" ", 2)
        if mode == "160000":
            return sha
    return None


def write_gitlink(project: Project, sha: str) -> None:
    top = _toplevel(project)
    if top is None:
        raise VstackError(f"{project.root} is not in a git repository: no gitlink")
    rel = os.path.relpath(project.submodule, top).replace(os.sep, "/")
    gitutil.git(top, "update-index", "--add", "--cacheinfo", f"160000,{sha},{rel}")
    # An uninitialised submodule is an empty folder (as git checkout leaves it);
    # without one, git status reports the submodule deleted.
    project.submodule.mkdir(exist_ok=True)


def unresolved_line(pin: Pin, why: str) -> str:
    return (
        f"vstack: cannot resolve the full commit of vLLM {pin.version} ({pin.commit}): "
        f"{why}; on a machine that reaches the upstream repository run "
        f"`scripts/vstack pin --submodule` (docs/workflow.md: the vllm/ submodule)"
    )


def cmd_submodule(project: Project, url_flag: str | None = None) -> int:
    """vstack pin --submodule: stage the gitlink at the pinned commit."""
    pin = project.pin
    if _toplevel(project) is None:
        raise VstackError(f"{project.root} is not in a git repository: no gitlink")
    sha, how = resolve(project, pin, upstream_url(project, url_flag))
    if sha is None:
        print(unresolved_line(pin, how), file=sys.stderr)
        return 1
    if current_gitlink(project) == sha:
        print(f"vstack: {PATH}/ gitlink already at {sha} (vLLM {pin.version})")
        return 0
    write_gitlink(project, sha)
    print(
        f"vstack: {PATH}/ gitlink -> {sha} (vLLM {pin.version}, {how}); staged: "
        f"commit it with stack.toml"
    )
    return 0


def after_pin_moved(project: Project, pin: Pin) -> None:
    """At the end of a rebase: move the gitlink with the pin when the repository has
    the submodule; never fails the rebase, says in one line when it cannot."""
    if gitmodules_url(project) is None or _toplevel(project) is None:
        return
    sha, how = resolve(project, pin, upstream_url(project))
    if sha is None:
        print(unresolved_line(pin, how).replace("vstack: ", "vstack: note: ", 1))
        return
    if current_gitlink(project) != sha:
        write_gitlink(project, sha)
        print(f"vstack: {PATH}/ gitlink -> {sha} ({how}); staged with the new pin")
