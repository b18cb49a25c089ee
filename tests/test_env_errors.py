"""Issue 21: a problem of the environment (network, disk, permissions, pipes,
settings) is one line naming the cause and a non-zero exit, never a traceback; and
a download cut short is never cached as the wheel."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, make_wheel, per_commit_repo, serve

import vstack.wheelzip

SHA = "c" * 40
VERSION = f"1.0.1.dev7+g{SHA[:9]}"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_31_x86_64.whl"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("vstack: error: "), err
    assert not any("Traceback" in ln for ln in err)
    return err[-1]


class _Hangup:
    """A server that accepts each connection and closes it without a word."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    def close(self):
        # close() alone does not wake the thread blocked in accept(): it would
        # go on accepting on the fd number, which the next test's server gets.
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        self.sock.close()


def test_a_server_that_closes_without_answering(stack, capsys):
    server = _Hangup()
    try:
        assert (
            stack.run("rebase", "--onto", "nightly", "--wheel-index", server.url) == 1
        )
    finally:
        server.close()
    line = _one_line(capsys)
    assert f"{server.url}/nightly/vllm/" in line and "gave no answer" in line


def test_a_non_numeric_download_timeout(stack, monkeypatch, capsys):
    monkeypatch.setenv("VSTACK_DOWNLOAD_TIMEOUT", "ten")
    for args in (["rebase", "--onto", "nightly"], ["pin", "--submodule"]):
        if args[0] == "pin":
            (stack.root / ".gitmodules").write_text(
                '[submodule "vllm"]\n\tpath = vllm\n\turl = /nonexistent\n'
            )
            git(stack.root, "init", "-q")
        stack.run(*args)
        err = capsys.readouterr().err
        assert "VSTACK_DOWNLOAD_TIMEOUT='ten' is not a number of seconds" in err, args
        assert "Traceback" not in err


def _unwritable() -> Path:
    """A folder nobody, root included, can create anything in."""
    sysfs = Path("/sys")
    if not sysfs.is_dir():
        pytest.skip("no /sys")
    return sysfs / "vstack-test-cannot-exist"


def test_an_unwritable_home(stack, monkeypatch, capsys):
    """HOME where nothing can be written, no VSTACK_WHEEL_CACHE: the wheel cache
    cannot be made."""
    home = _unwritable()
    monkeypatch.delenv("VSTACK_WHEEL_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert stack.run("build") == 1
    line = _one_line(capsys)
    assert str(home) in line


def test_a_read_only_out_folder(stack, capsys):
    out = _unwritable() / "dist"
    assert stack.run("build", "--out", str(out)) == 1
    line = _one_line(capsys)
    assert str(_unwritable()) in line


def test_a_full_disk(stack, monkeypatch, capsys):
    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(vstack.wheelzip, "_copy_range", full)
    assert stack.run("build") == 1
    line = _one_line(capsys)
    assert "No space left on device" in line and "the disk is full" in line
    dist = stack.root / "dist"
    left = [p.name for p in dist.iterdir()] if dist.is_dir() else []
    assert not [n for n in left if ".whl" in n], left  # no partial wheel left


def test_a_closed_pipe(stack):
    """`vstack pin | head -1`: the reader is gone before vstack writes."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "vstack", "--root", str(stack.root), "pin"],
            stdout=w, stderr=subprocess.PIPE, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
    finally:
        os.close(w)
    assert p.returncode != 0
    assert p.stderr == ""  # as git or cat: no traceback, no "Exception ignored"


# ---------------------------------------------------------------- a cut download


def _nightly_repo(tmp_path, stack) -> Path:
    wheel = make_wheel(tmp_path / "built" / WHEEL, VERSION, "g" + SHA[:9])
    return per_commit_repo(tmp_path / "repo", {SHA: wheel}, SHA)


def test_a_cut_download_is_not_cached_as_the_wheel(stack, tmp_path, capsys):
    """The index gives no #sha256= and the server no Content-Length for the
    missing part: the first half of the wheel used to be cached and fail every
    later run."""
    folder = _nightly_repo(tmp_path, stack)
    served = folder / SHA / WHEEL
    whole = served.read_bytes()
    served.write_bytes(whole[: len(whole) // 2])
    with serve(folder) as url:
        assert stack.run("rebase", "--onto", "nightly", "--wheel-index", url) == 1
    line = _one_line(capsys)
    assert "not a whole wheel" in line and "nothing was cached" in line
    assert not (stack.cache / WHEEL).exists()
    assert not list(stack.cache.glob(".download-*"))
    # a cut file an older vstack did cache: named, with what to do
    (stack.cache / WHEEL).write_bytes(whole[: len(whole) // 2])
    served.write_bytes(whole)
    with serve(folder) as url:
        assert stack.run("rebase", "--onto", "nightly", "--wheel-index", url) == 1
    line = _one_line(capsys)
    assert f"the cached {stack.cache / WHEEL} is not a whole wheel" in line
    assert "Remove it and rerun" in line


@pytest.mark.parametrize("raw", ["nan", "inf", "-5", "0", "abc", "1e999"])
def test_a_timeout_setting_that_is_no_number_of_seconds(
    stack, monkeypatch, capsys, raw
):
    """nan and inf passed the check and socket.settimeout raised later; a non-numeric
    VSTACK_UPSTREAM_TEST_TIMEOUT raised at import time."""
    from vstack import settings

    for name in ("VSTACK_DOWNLOAD_TIMEOUT", "VSTACK_UPSTREAM_TEST_TIMEOUT",
                 "VSTACK_PRE_COMMIT_TIMEOUT"):  # fmt: skip
        monkeypatch.setenv(name, raw)
        # nothing is read at import time
        subprocess.run(
            [sys.executable, "-c", "import vstack.upstream, vstack.precommit, vstack.fetch"],
            check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        with pytest.raises(settings.VstackError) as e:
            settings.env_seconds(name, 60)
        assert f"{name}={raw!r} is not a number of seconds" in str(e.value)
        monkeypatch.delenv(name)
    monkeypatch.setenv("VSTACK_DOWNLOAD_TIMEOUT", raw)
    assert stack.run("rebase", "--onto", "nightly") != 0
    line = _one_line(capsys)
    assert f"VSTACK_DOWNLOAD_TIMEOUT={raw!r} is not a number of seconds" in line


@pytest.fixture
def file_size_limit():
    """ulimit -f of 64 KiB for this process and the git it starts, restored after."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, old[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, old)


def test_a_file_size_limit_names_the_file_and_the_limit(stack, capsys, file_size_limit):
    """Under ulimit -f, export said `vstack: error: File too large` with no path, and
    apply "git am ... fatal: Failed to split patches"."""
    assert stack.run("apply") == 0
    big = "".join(f"LINE_{i} = {i}\n" for i in range(8000))  # ~100 KiB
    stack.commit_on_work("vllm/big.py", big,
                         "[EPLB] Big\n\nA module too big for the limit.\n\nUpstream-Status: pending")  # fmt: skip
    capsys.readouterr()
    file_size_limit()
    assert stack.run("export") == 1
    line = _one_line(capsys)
    assert "File too large" in line and "ulimit -f" in line, line
    assert f"error: {stack.root}/" in line, line  # the file it was writing
    import resource

    resource.setrlimit(
        resource.RLIMIT_FSIZE, resource.getrlimit(resource.RLIMIT_FSIZE)[1:] * 2
    )
    assert stack.run("export") == 0
    capsys.readouterr()
    file_size_limit()
    assert stack.run("apply", "--force") == 1
    line = _one_line(capsys)
    assert "the file size limit (ulimit -f) is 65536 bytes" in line, line


# ---------------------------------------------------------------- issue 29


def _older_pythons() -> list[str]:
    """Real interpreters older than 3.11 on this machine (PATH, pyenv)."""
    found = []
    candidates = [f"python3.{m}" for m in range(6, 11)]
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir())]
    for c in candidates:
        try:
            p = subprocess.run(
                [c, "-c", "import sys; print(sys.version_info < (3, 11))"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except OSError:
            continue
        if p.returncode == 0 and p.stdout.strip() == "True":
            found.append(c)
    return found[:1]


def _fake_python310(tmp_path: Path) -> Path:
    """An interpreter that says it is 3.10.12 (Ubuntu 22.04's python3): it runs
    `-m vstack ARGS` with sys.version_info set before vstack is imported."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(parents=True, exist_ok=True)
    prelude = (
        "import runpy, sys; sys.version_info = (3, 10, 12, 'final', 0); "
        "sys.argv = ['vstack', *sys.argv[3:]]; "
        "runpy.run_module('vstack', run_name='__main__', alter_sys=True)"
    )
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{prelude}" -- "$@"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("which", ["fake 3.10.12", "real"])
def test_scripts_build_on_an_old_python_is_one_line(stack, tmp_path, which):
    """scripts/build with Ubuntu 22.04's python3 (3.10) printed a 12-line tomllib
    traceback; now one line that names the version needed and how to pick one."""
    if which == "real":
        olds = _older_pythons()
        if not olds:
            pytest.skip("no Python older than 3.11 on this machine")
        python = olds[0]
    else:
        python = str(_fake_python310(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [str(ROOT / "scripts" / "vstack"), "--root", str(stack.root), "build"],
        env={**env, "PYTHON": python}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    err = p.stderr.strip().splitlines()
    assert p.returncode == 1 and p.stdout == ""
    assert len(err) == 1, p.stderr
    assert err[0].startswith("vstack: error: needs Python 3.11 or newer; ")
    assert "PYTHON=python3.11" in err[0]
    if which != "real":
        assert "Python 3.10.12" in err[0]
    # scripts/build is scripts/vstack build: the same line
    q = subprocess.run(
        [str(ROOT / "scripts" / "build")], cwd=stack.root,
        env={**env, "PYTHON": python}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert q.returncode == 1 and q.stderr.strip().splitlines() == err
