"""Bad input: one clear line, non-zero exit, nothing changed on disk."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, vstack_main, write_stack_toml

NUL_PROBLEM = "a NUL byte (binary content in a text patch)"


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


# ---------------------------------------------------------------- bytes that are no patch


def _one_patch(stack) -> Path:
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    assert stack.run("export") == 0
    return stack.root / "patches" / "eplb-change-line-5.patch"


def _refused_everywhere(stack, capsys, patch: Path, line: int, what: str) -> None:
    before = stack.snapshot()
    for verb in ("apply", "build"):
        assert stack.run(verb) == 1, verb
        assert _only_error_line(capsys) == f"vstack: error: {patch}:{line}: {what}"
    assert stack.run("lint") == 1
    assert f"patches/{patch.name}:{line}: {what}" in capsys.readouterr().out
    assert stack.snapshot() == before
    assert not (stack.root / "dist").exists()


def test_random_bytes_are_refused_naming_the_file(stack, capsys):
    patch = _one_patch(stack)
    patch.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    what = "not a git format-patch file (no 'From <commit>' line and Subject: header)"
    _refused_everywhere(stack, capsys, patch, 1, what)


def test_invalid_utf8_in_a_context_line_is_a_clear_error(stack, capsys):
    patch = _one_patch(stack)
    data = patch.read_bytes().replace(b" line 4\n", b" line \xff4\n")
    patch.write_bytes(data)
    at = data.index(b"\xff")
    line = data.count(b"\n", 0, at) + 1
    what = f"not UTF-8 text (byte 0xff at offset {at})"
    _refused_everywhere(stack, capsys, patch, line, what)


def test_a_nul_byte_in_an_added_line_is_refused_by_lint_and_build(stack, capsys):
    patch = _one_patch(stack)
    data = patch.read_bytes().replace(b"+line five", b"+line\x00five")
    patch.write_bytes(data)
    line = data.count(b"\n", 0, data.index(b"\x00")) + 1
    assert data.splitlines()[line - 1].startswith(b"+line")
    _refused_everywhere(stack, capsys, patch, line, NUL_PROBLEM)


# ---------------------------------------------------------------- an empty series


def test_empty_or_missing_series_with_patch_files_is_an_error(stack, capsys):
    patch = _one_patch(stack)
    series = stack.root / "patches/series"
    series.write_text("# everything commented out\n")
    for state in ("lists no patch", "is missing"):
        assert stack.run("build") == 1
        line = _only_error_line(capsys)
        assert f"patches/series {state}" in line and patch.name in line
        assert not (stack.root / "dist").exists()
        series.unlink(missing_ok=True)
    # no .patch files at all: an empty series is a legitimate (unpatched) build
    patch.unlink()
    assert stack.run("build") == 0


# ---------------------------------------------------------------- the stack repository


def test_dirty_tree_hint_also_clears_untracked_files(stack, capsys):
    assert stack.run("apply") == 0
    (stack.repo / "vllm/config.py").write_text("dirty\n")
    (stack.repo / "vllm/stray.py").write_text("untracked\n")
    capsys.readouterr()
    assert stack.run("apply") == 1
    hint = _only_error_line(capsys).rsplit("`", 2)[-2]
    assert "clean" in hint
    subprocess.run(hint, shell=True, check=True)
    assert stack.run("apply") == 0
    assert not (stack.repo / "vllm/stray.py").exists()


def test_leftovers_of_a_killed_run_are_removed_by_the_next(stack, capsys):
    from vstack.locks import held_folder

    assert stack.run("build") == 0
    repo = stack.repo
    git(
        repo, "worktree", "add", "-q", "--detach", str(stack.root / ".vstack/wt-killed"),
        "base/1.0.0",
    )  # fmt: skip
    (repo / ".git/worktrees/wt-killed/index.lock").write_text("")
    pack = repo / ".git/objects/pack/tmp_pack_Xy12ab"
    pack.write_bytes(b"PACK")
    old = stack.cache / ".download-killed"
    old.mkdir()
    (old / ".lock").write_text("")
    (old / "vllm-1.0.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"partial")
    legacy = stack.cache / ".download-legacy"  # from a vstack without the lock file
    legacy.mkdir()
    os.utime(legacy, (time.time() - 3600, time.time() - 3600))
    streamed = stack.cache / ".download-abc123"  # a killed per-commit download
    streamed.write_bytes(b"partial")
    live = stack.cache / ".download-live"  # another process is downloading now
    live.mkdir()
    capsys.readouterr()
    with held_folder(live):
        assert stack.run("build") == 0
    err = capsys.readouterr().err
    assert "temporary worktree" in err and "unfinished download(s)" in err
    assert not (stack.root / ".vstack/wt-killed").exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not pack.exists() and not old.exists() and not legacy.exists()
    assert not streamed.exists()
    assert live.is_dir()


@pytest.mark.parametrize("verb", [["lint"], ["gpu-check", "--bundle", "B"]])
def test_lint_and_gpu_check_take_the_project_lock(stack, capsys, verb):
    """gpu-check (which builds) and lint (applied_tip, temp worktrees in .vstack/)
    ran while another vstack command held the project lock, and without recovery."""
    verb = [str(stack.root.parent / "bundle") if v == "B" else v for v in verb]
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from vstack.locks import project_lock\n"
         "with project_lock(Path(sys.argv[1]), 'apply'):\n"
         "    print('held', flush=True); time.sleep(120)",
         str(stack.root)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert stack.run(*verb) == 1
        line = _only_error_line(capsys)
        assert f"another vstack command is running in {stack.root}" in line, line
        assert not (stack.root / "dist").exists()
        assert not (stack.root / ".vstack" / "repo").exists()
        assert not (stack.root.parent / "bundle").exists()
    finally:
        holder.kill()
        holder.wait()
    assert stack.run("gpu-check", "--list") == 0  # needs no lock, no project


def test_gpu_check_multi_takes_the_project_lock(stack, capsys):
    """scripts/gpu-check --multi runs `python -m vstack.gpucheck`, not the cli."""
    from vstack import gpucheck

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from vstack.locks import project_lock\n"
         "with project_lock(Path(sys.argv[1]), 'apply'):\n"
         "    print('held', flush=True); time.sleep(120)",
         str(stack.root)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert gpucheck.main(["--root", str(stack.root), "--multi",
                              "--python", sys.executable]) == 1  # fmt: skip
        line = _only_error_line(capsys)
        assert f"another vstack command is running in {stack.root}" in line, line
    finally:
        holder.kill()
        holder.wait()


def test_two_builds_at_once_get_a_clear_lock_error(stack, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from vstack.locks import project_lock\n"
         "with project_lock(Path(sys.argv[1]), 'build'):\n"
         "    print('held', flush=True); time.sleep(120)",
         str(stack.root)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert stack.run("build") == 1
        line = _only_error_line(capsys)
        assert f"another vstack command is running in {stack.root}" in line
        assert f"pid {holder.pid}" in line and "wait for it to finish" in line
        assert not (stack.root / "dist").exists()
    finally:
        holder.kill()
        holder.wait()
    assert stack.run("build") == 0


def test_dist_keeps_only_the_current_build(stack):
    assert stack.run("build") == 0
    stale = (
        stack.root
        / "dist"
        / "vllm-1.0.0+eplb.g0123456789ab-cp38-abi3-manylinux_2_28_x86_64.whl"
    )
    stale.write_bytes(b"an earlier build")
    killed = (
        stack.root
        / "dist"
        / ".vllm-1.0.0+eplb.gba9876543210-cp38-abi3-manylinux_2_28_x86_64.whl.tmp"
    )
    killed.write_bytes(b"a build killed while writing")
    _one_patch(stack)
    assert stack.run("build") == 0
    info = json.loads((stack.root / "dist/build.json").read_text())
    names = sorted(p.name for p in (stack.root / "dist").iterdir())
    assert names == sorted(["build.json", "image", info["wheel"]])


# ---------------------------------------------------------------- the package index


class _SilentIndex:
    """A package index that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self.stop.set()
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_a_silent_index_times_out_with_a_clear_error(stack, monkeypatch, capfd):
    index = _SilentIndex()
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.delenv("PIP_FIND_LINKS")
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{index.port}/simple/")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("VSTACK_DOWNLOAD_TIMEOUT", "2")
    stack.wheel.unlink()
    try:
        t = time.monotonic()
        assert stack.run("build") == 1
        took = time.monotonic() - t
    finally:
        index.close()
    err = capfd.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("vstack: error: pip could not download vllm==1.0.0: ")
    assert "the package index did not answer within 2 s" in last
    assert "MB" not in err.split("pip could not download")[0].split("downloading")[1]
    assert "  pip: " in err  # pip's retries are shown as they happen
    assert (
        took < 60
    )  # pip's own default: 15 s x 6 tries, then "No matching distribution"


# ---------------------------------------------------------------- --help


@pytest.mark.parametrize(
    "verb, says",
    [
        ("pin", "checks a populated vllm/ checkout against the pin"),
        ("test-files", "folder to write them into"),
        ("bench", "benchmarks/results/bench_build.json"),
    ],
)
def test_help_explains_pin_test_files_and_bench(verb, says, capsys):
    with pytest.raises(SystemExit) as e:
        vstack_main([verb, "--help"])
    assert e.value.code == 0
    assert says in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda t: t + "# caf\xe9\n", "line "),
        (lambda t: t.replace('label = "', 'label = 5 #"', 1), "[stack] label is a int"),
        (
            lambda t: t.replace('commit = "', 'commit = ["a"] #"', 1),
            "[base] commit is a list",
        ),
        (lambda t: t.replace('wheel = "', 'wheel = 3 #"', 1), "[base] wheel is a int"),
        (
            lambda t: t.replace('sha256 = "', 'sha256 = 5 #"', 1),
            "[base] sha256 is a int",
        ),
        (
            lambda t: "stack = 1\n" + t.replace("[stack]", "[stackx]", 1),
            "[stack] is a int",
        ),
    ],
)
def test_a_hand_edited_stack_toml_of_the_wrong_type_or_encoding(
    stack, capsys, edit, says
):
    """A Latin-1 byte or `label = 5` in stack.toml: one line naming the key, not a
    UnicodeDecodeError or TypeError."""
    toml = stack.root / "stack.toml"
    text = edit(toml.read_text())
    assert text != toml.read_text()
    toml.write_bytes(text.encode("latin-1"))
    for verb in ("pin", "apply", "build"):
        assert stack.run(verb) != 0
        line = _only_error_line(capsys)
        assert "stack.toml" in line and says in line, (verb, line)


def test_test_files_out_writes_only_into_its_own_folder(stack, capsys):
    """test-files --out overwrote an uncommitted tests/test_x.py of a checkout, rc 0.
    Now: a non-empty folder without the .vstack-out marker is refused, untouched;
    a new folder gets the marker and is replaced on the next run."""
    assert stack.run("apply") == 0
    stack.commit_on_work("tests/test_eplb_x.py", "def test_x():\n    pass\n",
                         "[EPLB] Test\n\nWhy it exists.\n\nUpstream-Status: pending")  # fmt: skip
    assert stack.run("export") == 0
    mine = stack.root.parent / "my-vllm-checkout"
    (mine / "tests").mkdir(parents=True)
    (mine / "tests/test_eplb_x.py").write_text("# my uncommitted work\n")
    (mine / "README").write_text("mine\n")
    capsys.readouterr()
    assert stack.run("test-files", "--out", str(mine)) == 1
    line = _only_error_line(capsys)
    assert str(mine) in line and "was not made by vstack test-files" in line
    assert (mine / "tests/test_eplb_x.py").read_text() == "# my uncommitted work\n"
    assert sorted(p.name for p in mine.rglob("*")) == [
        "README",
        "test_eplb_x.py",
        "tests",
    ]
    out = stack.root.parent / "tf"
    assert stack.run("test-files", "--out", str(out)) == 0
    assert (out / "tests/test_eplb_x.py").read_text() == "def test_x():\n    pass\n"
    assert (out / ".vstack-out").is_file()
    (out / "stale.py").write_text("x")
    assert stack.run("test-files", "--out", str(out)) == 0
    assert not (out / "stale.py").exists()
    assert (out / "tests/test_eplb_x.py").is_file()
    assert not list(out.rglob(".*.tmp"))
