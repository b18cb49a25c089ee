"""Bad input: one clear line, non-zero exit, nothing changed on disk."""

from __future__ import annotations

from vstack_testlib import git, write_stack_toml


def _only_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "expected an error message"
    assert err[-1].startswith("vstack: error: ")
    return err[-1]


def test_sha256_mismatch(stack, capsys):
    stack.wheel.write_bytes(stack.wheel.read_bytes() + b"junk")
    before = stack.snapshot()
    wheel_bytes = stack.wheel.read_bytes()
    assert stack.run("base") == 1
    line = _only_error_line(capsys)
    assert "sha256 mismatch" in line and stack.wheel.name in line
    assert stack.snapshot() == before
    assert stack.wheel.read_bytes() == wheel_bytes
    assert not (stack.root / ".vstack").exists()


def test_no_network_and_no_cache(stack, capsys):
    stack.wheel.unlink()
    before = stack.snapshot()
    assert stack.run("build") == 1
    line = _only_error_line(capsys)
    assert "could not download vllm==1.0.0" in line and "no cached wheel" in line
    assert stack.snapshot() == before
    assert not list(stack.cache.glob("*"))


def test_series_entry_missing(stack, capsys):
    (stack.root / "patches" / "series").write_text("gone.patch\n")
    before = stack.snapshot()
    assert stack.run("apply") == 1
    assert "patches/gone.patch is missing" in _only_error_line(capsys)
    assert stack.run("build") == 1
    assert "patches/gone.patch is missing" in _only_error_line(capsys)
    assert stack.snapshot() == before


def test_populated_submodule_at_wrong_commit(stack, capsys):
    sub = stack.root / "vllm"
    sub.mkdir()
    git(sub, "init", "-q")
    (sub / "README").write_text("x\n")
    git(sub, "add", "README")
    git(sub, "commit", "-q", "-m", "x")
    head = git(sub, "rev-parse", "HEAD").strip()
    before = stack.snapshot()
    assert stack.run("pin") == 1
    line = _only_error_line(capsys)
    assert f"vllm/ is at {head[:12]}" in line and "pins abc1234" in line
    assert stack.run("base") == 1
    assert stack.snapshot() == before


def test_submodule_at_pinned_commit_is_the_base(stack, tmp_path, capsys):
    sub = stack.root / "vllm"
    sub.mkdir()
    git(sub, "init", "-q")
    (sub / "vllm").mkdir()
    (sub / "vllm" / "config.py").write_text("A = 1\nB = 2\nC = 3\n")
    git(sub, "add", ".")
    git(sub, "commit", "-q", "-m", "upstream")
    head = git(sub, "rev-parse", "HEAD").strip()
    write_stack_toml(stack.root, stack.wheel, commit="g" + head[:9])
    assert stack.run("pin") == 0
    assert "matches the pin" in capsys.readouterr().out
    assert stack.run("base") == 0
    assert git(stack.repo, "rev-parse", "base/1.0.0").strip() == head


def test_unparsable_stack_toml(stack, capsys):
    (stack.root / "stack.toml").write_text("[base]\nversion = 1.0.0\n")
    assert stack.run("pin") == 1
    assert "stack.toml" in _only_error_line(capsys)
