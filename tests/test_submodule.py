"""The vllm/ gitlink: `vstack pin --submodule` and the end of a rebase write it at
the pinned commit, resolved against a local bare repository standing in for
upstream (this machine cannot reach GitHub)."""

from __future__ import annotations

import subprocess

import pytest
from vstack_testlib import git, make_wheel, sha256, write_stack_toml

from vstack.submodule import pick_commit

GITHUB = "https://github.com/vllm-project/vllm.git"


@pytest.fixture
def upstream(tmp_path):
    """A bare 'vllm' repository: annotated tag v1.0.0 at A, then main moves to B."""
    src = tmp_path / "upstream-src"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "x.py").write_text("x = 1\n")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-q", "-m", "release 1.0.0")
    git(src, "tag", "-a", "v1.0.0", "-m", "v1.0.0")
    a = git(src, "rev-parse", "HEAD").strip()
    (src / "vllm" / "x.py").write_text("x = 2\n")
    git(src, "commit", "-q", "-am", "main moves on")
    b = git(src, "rev-parse", "HEAD").strip()
    bare = tmp_path / "vllm.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    assert git(bare, "rev-parse", "v1.0.0").strip() != a  # annotated: peel it
    return bare, a, b


def _project(stack, version, commit, url=GITHUB):
    write_stack_toml(stack.root, stack.wheel, version=version, commit=commit)
    (stack.root / ".gitmodules").write_text(
        f'[submodule "vllm"]\n\tpath = vllm\n\turl = {url}\n\tshallow = true\n'
    )
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")


def _gitlink(stack) -> str:
    return git(stack.root, "ls-files", "--stage", "--", "vllm")


def test_pin_submodule_writes_the_gitlink_at_the_release_tag(
    stack, upstream, monkeypatch, capsys
):
    bare, a, _ = upstream
    _project(stack, "1.0.0", "g" + a[:9])
    # .gitmodules names GitHub, which this machine cannot reach: one line, exit 1
    assert stack.run("pin", "--submodule") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        f"vstack: cannot resolve the full commit of vLLM 1.0.0 (g{a[:9]}): git ls-remote {GITHUB} failed"
    )
    assert "run `scripts/vstack pin --submodule`" in err[0]
    assert _gitlink(stack) == ""
    # the same command against a reachable upstream (flag, or environment)
    assert stack.run("pin", "--submodule", "--url", str(bare)) == 0
    assert (
        f"vllm/ gitlink -> {a} (vLLM 1.0.0, from git ls-remote"
        in capsys.readouterr().out
    )
    assert _gitlink(stack) == f"160000 {a} 0\tvllm\n"
    assert git(stack.root, "status", "--porcelain") == "A  vllm\n"
    monkeypatch.setenv("VSTACK_UPSTREAM_URL", str(bare))
    assert stack.run("pin", "--submodule") == 0
    assert "already at" in capsys.readouterr().out
    assert stack.run("pin") == 0
    assert f"gitlink  {a} (the pinned commit)" in capsys.readouterr().out
    # committed, the submodule checks out the base the series applies to
    git(stack.root, "commit", "-q", "-m", "vllm/ gitlink at the pin")
    git(stack.root, "submodule", "init")
    git(stack.root, "config", "submodule.vllm.url", str(bare))
    subprocess.run(
        ["git", "-C", str(stack.root), "-c", "protocol.file.allow=always",
         "submodule", "update"], check=True, capture_output=True,
    )  # fmt: skip
    assert git(stack.root / "vllm", "rev-parse", "HEAD").strip() == a
    assert stack.run("pin") == 0
    assert f"vllm/    at {a[:12]}, matches the pin" in capsys.readouterr().out


def test_a_nightly_at_mains_head_resolves_by_its_prefix(stack, upstream, capsys):
    bare, _, b = upstream
    _project(stack, f"1.0.1.dev1+g{b[:9]}", "g" + b[:9], url=str(bare))
    assert stack.run("pin", "--submodule") == 0
    assert _gitlink(stack) == f"160000 {b} 0\tvllm\n"
    # a pin with the full commit (per-commit wheels) needs no network at all
    c = "c" * 40
    _project(stack, "1.0.1.dev2+gccccccccc", "g" + c, url=GITHUB)
    assert stack.run("pin", "--submodule") == 0
    assert "the pin records the full commit" in capsys.readouterr().out
    assert _gitlink(stack) == f"160000 {c} 0\tvllm\n"


def test_rebase_moves_the_gitlink_or_says_why_not(stack, upstream, capsys):
    bare, a, b = upstream
    old = make_wheel(stack.wheel, commit="g" + a[:9])
    _project(stack, "1.0.0", "g" + a[:9], url=str(bare))
    assert sha256(old) in (stack.root / "stack.toml").read_text()
    assert stack.run("pin", "--submodule") == 0
    git(stack.root, "commit", "-q", "-m", "gitlink")
    new = make_wheel(
        stack.cache / "vllm-1.0.1-cp38-abi3-manylinux_2_28_x86_64.whl",
        version="1.0.1.dev1", commit="g" + b[:9],
        files={"vllm/other.py": b"y = 1\n"},
    )  # fmt: skip
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(new)) == 0
    assert f"vllm/ gitlink -> {b} (from git ls-remote" in capsys.readouterr().out
    assert _gitlink(stack) == f"160000 {b} 0\tvllm\n"
    # an upstream that cannot be reached: the rebase completes, one line says so
    git(stack.root, "checkout", "-q", "HEAD", "--", "stack.toml", "patches", "vllm")
    git(stack.root, "config", "-f", ".gitmodules", "submodule.vllm.url", GITHUB)
    git(stack.root, "commit", "-q", "-am", "github url")
    assert stack.run("apply", "--force") == 0
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(new)) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if "cannot resolve the full commit" in ln]
    assert len(notes) == 1 and notes[0].startswith("vstack: note: cannot resolve")
    assert "gitlink ->" not in out
    assert _gitlink(stack) == f"160000 {a} 0\tvllm\n"  # left where it was
    assert 'version = "1.0.1.dev1"' in (stack.root / "stack.toml").read_text()


def test_pick_commit_prefers_the_peeled_tag():
    refs = [("1" * 40, "refs/tags/v1.0.0"), ("2" * 40, "refs/tags/v1.0.0^{}"),
            ("3" * 40, "refs/heads/main")]  # fmt: skip
    assert pick_commit(refs, "1.0.0", "2222222") == "2" * 40
    assert pick_commit(refs, "1.0.1.dev1", "3333333") == "3" * 40
    assert pick_commit(refs, "1.0.0", "4444444") is None
