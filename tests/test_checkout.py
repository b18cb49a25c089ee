"""Issue 21: a clone made with core.autocrlf=true works like any other. Without
.gitattributes every script failed on "bash\\r" and every verb on "no header"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from vstack_testlib import ROOT, git

# A patch that adds a file with CRLF lines: its CR bytes are content.
CR_PATCH = (
    b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    b"From: T <t@x>\nDate: Tue, 14 Nov 2023 22:13:20 +0000\nSubject: [EPLB] Dos\n\n"
    b"A file with CRLF lines.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>\n"
    b"---\ndiff --git a/vllm/dos.py b/vllm/dos.py\nnew file mode 100644\n"
    b"index 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111\n"
    b"--- /dev/null\n+++ b/vllm/dos.py\n@@ -0,0 +1 @@\n+X = 1\r\n"
)


def test_an_autocrlf_clone_is_byte_exact_and_its_scripts_run(tmp_path):
    origin = tmp_path / "origin"
    for rel in (".gitattributes", "scripts/vstack", "scripts/build", "stack.toml"):
        if (ROOT / rel).exists():
            (origin / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, origin / rel)
    shutil.copytree(
        ROOT / "src" / "vstack", origin / "src" / "vstack",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    (origin / "patches").mkdir()
    (origin / "patches" / "eplb-dos.patch").write_bytes(CR_PATCH)
    (origin / "patches" / "series").write_text("eplb-dos.patch\n")
    (origin / "resolutions" / "1.1.0").mkdir(parents=True)
    (origin / "resolutions" / "1.1.0" / "eplb-dos.patch").write_bytes(CR_PATCH)
    git(origin, "init", "-q")
    git(origin, "-c", "core.autocrlf=false", "add", "-A")
    git(origin, "commit", "-q", "-m", "stack")
    clone = tmp_path / "clone"
    git(tmp_path, "-c", "core.autocrlf=true", "clone", "-q", str(origin), str(clone))
    for p in sorted(origin.rglob("*")):
        rel = p.relative_to(origin)
        if p.is_file() and ".git" not in rel.parts:
            assert (clone / rel).read_bytes() == p.read_bytes(), f"{rel} was converted"
    p = subprocess.run(
        [str(clone / "scripts" / "vstack"), "--help"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "Maintain the vLLM EPLB patch series" in p.stdout


def test_a_patch_converted_to_crlf_is_named_as_such(stack, capsys):
    """A patch checked out with CRLF line endings: the error says so (it used to
    say "not a git format-patch file (no header)")."""
    patch = stack.root / "patches" / "eplb-dos.patch"
    patch.write_bytes(CR_PATCH.replace(b"\n", b"\r\n"))
    (stack.root / "patches" / "series").write_text("eplb-dos.patch\n")
    for verb in ("apply", "build"):
        assert stack.run(verb) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"vstack: error: {patch}:1: CRLF line endings throughout")
        assert ".gitattributes" in err
