"""Building stacks whose patches come in any shape git writes (renames, copies, modes,
quoted names, RFC 2047 subjects, foreign format-patch options), for the tests of
issue 28 and the property tests. A stack is made on a synthetic wheel: the series'
commits are made on the work branch of .vstack/repo with plain git, written out with
`git format-patch` and the options a test gives, and the project committed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vstack_testlib import git, make_wheel, sha256

from vstack.series import parse_patch, slug

WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"


def lines(n=30, changes=None, tag="") -> bytes:
    out = [f"{tag}line {i}" for i in range(1, n + 1)]
    for i, text in (changes or {}).items():
        out[i - 1] = text
    return "".join(x + "\n" for x in out).encode()


def repin(stack, files: dict[str, bytes]) -> Path:
    """The stack's pinned 1.0.0 wheel rebuilt with these files."""
    wheel = make_wheel(stack.wheel, files=files)
    toml = stack.root / "stack.toml"
    old = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(old, sha256(wheel)))
    return wheel


def new_wheel(where: Path, files: dict[str, bytes], version="1.1.0") -> Path:
    return make_wheel(
        where / WHEEL.format(v=version), version=version, commit="gdef5678", files=files
    )


def author_env(name="T", email="t@x") -> dict[str, str]:
    return {**os.environ, "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
            "GIT_AUTHOR_DATE": "1700000100 +0000",
            "GIT_COMMITTER_DATE": "1700000100 +0000"}  # fmt: skip


def commit(repo: Path, message: str, env=None, allow_empty=False) -> str:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    args = ["git", "-C", str(repo), "commit", "-q", "--no-verify", "-F", "-"]
    if allow_empty:
        args.append("--allow-empty")
    subprocess.run(args, input=message.encode(), check=True, env=env or author_env())
    return git(repo, "rev-parse", "HEAD").strip()


def message(subject: str, why="It exists for a test of the tool.", trailers=()) -> str:
    return "\n".join([subject, "", why, "", "Upstream-Status: pending", *trailers, ""])


def write_series(stack, patches: dict[str, bytes], bom=False) -> None:
    d = stack.root / "patches"
    for p in d.glob("*.patch"):
        p.unlink()
    for name, data in patches.items():
        (d / name).write_bytes(data)
    text = "".join(f"{n}\n" for n in patches).encode()
    (d / "series").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text)


def format_patches(repo: Path, base: str, fmt=(), names=None) -> dict[str, bytes]:
    """{file name: bytes} of base..HEAD as `git format-patch <fmt>` writes them."""
    shas = git(repo, "rev-list", "--reverse", f"{base}..HEAD").split()
    out = {}
    for i, sha in enumerate(shas):
        data = subprocess.run(
            ["git", "-C", str(repo), "-c", "core.quotePath=true", "format-patch",
             "--stdout", "-1", *fmt, sha],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        name = names[i] if names else slug(parse_patch(data).subject)
        out[name] = data
    return out


def commit_project(stack) -> None:
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    if not (stack.root / ".git").exists():
        git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "--allow-empty", "-m", "stack")


def hand_series(stack, make_commits, fmt=(), names=None, bom=False) -> dict[str, bytes]:
    """patches/ written by `git format-patch <fmt>` from the commits make_commits(repo)
    makes on the work branch; the work branch then rebuilt from them (apply --force)
    and the project committed."""
    assert stack.run("apply") == 0
    repo = stack.repo
    base = git(repo, "rev-parse", "HEAD").strip()
    make_commits(repo)
    patches = format_patches(repo, base, fmt, names)
    write_series(stack, patches, bom=bom)
    assert stack.run("apply", "--force") == 0
    commit_project(stack)
    return patches


def series_names(stack) -> list[str]:
    text = (stack.root / "patches/series").read_text(encoding="utf-8-sig")
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
