"""A user's git configuration must not change what vstack writes: exported patches,
the commits behind them, the built wheel."""

from __future__ import annotations

import json
import os
import subprocess

from vstack_testlib import STATE_PATCH_MESSAGE

HOSTILE = """\
[user]
    name = Hostile User
    email = hostile@example.com
[format]
    signOff = true
    to = list@example.com
    cc = someone@example.com
    headers = "X-Hostile: yes\\n"
    numbered = true
    signature = hostile signature
    from = Hostile <h@example.com>
    forceInBodyFrom = true
    thread = shallow
    encodeEmailHeaders = false
[diff]
    interHunkContext = 30
    indentHeuristic = false
    orderFile = {order}
    context = 9
    algorithm = patience
    noprefix = true
    mnemonicPrefix = true
    srcPrefix = SRC/
    dstPrefix = DST/
    renames = copies
[core]
    abbrev = 7
    hooksPath = {hooks}
    quotePath = false
[color]
    ui = always
[am]
    threeWay = true
    messageId = true
    keepcr = true
[apply]
    whitespace = error-all
[merge]
    conflictStyle = diff3
[rerere]
    enabled = true
[commit]
    gpgSign = true
[log]
    showSignature = true
[i18n]
    logOutputEncoding = ISO-8859-1
"""


def _series(stack):
    assert stack.run("apply") == 0
    text = (stack.repo / "vllm/distributed/eplb/state.py").read_text()
    # two hunks 20 lines apart (interHunkContext would merge them) in two files
    # (orderFile would reorder them)
    stack.commit_on_work(
        "vllm/distributed/eplb/state.py",
        text.replace("line 5\n", "line five\n").replace("line 30\n", "line thirty\n"),
        STATE_PATCH_MESSAGE,
    )
    (stack.repo / "tests").mkdir()
    (stack.repo / "tests/test_state.py").write_text("def test_state():\n    pass\n")
    (stack.repo / "vllm/config.py").write_text("A = 1\nB = 2\nC = 30\n")
    subprocess.run(["git", "-C", str(stack.repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(stack.repo), "-c", "user.name=T", "-c", "user.email=t@x",
         "commit", "-q", "-m",
         "[EPLB] Two files\n\nWhy: C and a test.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"],
        check=True, env={**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@x"},
    )  # fmt: skip
    assert stack.run("export") == 0
    assert stack.run("build") == 0


def _hostile_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    for hook in ("applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit",
                 "commit-msg", "post-checkout", "reference-transaction"):  # fmt: skip
        (hooks / hook).write_text("#!/bin/sh\necho hostile hook >&2\nexit 1\n")
        (hooks / hook).chmod(0o755)
    order = home / "order"
    order.write_text("vllm/config.py\ntests/*\n*\n")
    (home / ".gitconfig").write_text(HOSTILE.format(order=order, hooks=hooks))
    # read even without any config file: the per-user attributes
    (home / ".config/git").mkdir(parents=True)
    (home / ".config/git/attributes").write_text("*.py -diff\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
              "GIT_COMMITTER_EMAIL"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    return home


def test_a_hostile_gitconfig_changes_no_exported_byte(stack, tmp_path, monkeypatch):
    _series(stack)
    patches = {p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()}
    info = json.loads((stack.root / "dist/build.json").read_text())
    wheel = (stack.root / "dist" / info["wheel"]).read_bytes()
    _hostile_home(tmp_path, monkeypatch)
    # the configuration is in effect for git itself: plain format-patch differs
    plain = subprocess.run(
        ["git", "-C", str(stack.repo), "format-patch", "--stdout", "-1", "work"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert b"hostile signature" in plain and b"GIT binary patch" in plain
    # a fresh clone under that configuration: same patches, same wheel
    subprocess.run(["rm", "-rf", str(stack.root / ".vstack")], check=True)
    assert stack.run("export", "--check") == 0
    assert stack.run("apply") == 0
    assert stack.run("export") == 0
    assert {
        p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()
    } == patches
    assert stack.run("export", "--check") == 0
    assert stack.run("build") == 0
    assert (stack.root / "dist" / info["wheel"]).read_bytes() == wheel


REPO_LOCAL = """\
[apply]
    whitespace = fix
[core]
    whitespace = trailing-space,tab-in-indent,cr-at-eol
    commentChar = %
[mailinfo]
    scissors = true
[am]
    messageId = true
[format]
    attach = boundary
    notes = true
    from = Hostile <h@example.com>
    useAutoBase = true
    to = list@example.com
    cc = someone@example.com
[i18n]
    commitEncoding = ISO-8859-1
    logOutputEncoding = ISO-8859-1
[color]
    ui = always
    diff = always
[rerere]
    enabled = true
"""


def test_repo_local_config_in_vstack_repo_changes_no_byte(stack):
    """`git config apply.whitespace fix` (or mailinfo.scissors, format.attach, ...)
    in .vstack/repo itself: the wheel and the patches stay what the patches say."""
    assert stack.run("apply") == 0
    text = (
        (stack.repo / "vllm/config.py").read_text()
        if (stack.repo / "vllm/config.py").exists()
        else ""
    )
    msg = (
        "[EPLB] Trailing spaces\n\nWhy: the spaces are content.\n"
        "\nUpstream-Status: pending"
    )
    stack.commit_on_work("vllm/config.py", text + "X = 1   \n", msg)
    assert stack.run("export") == 0
    assert stack.run("build") == 0
    patches = {p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()}
    info = json.loads((stack.root / "dist/build.json").read_text())
    wheel = (stack.root / "dist" / info["wheel"]).read_bytes()
    with open(stack.repo / ".git/config", "a") as f:
        f.write(REPO_LOCAL)
    subprocess.run(["rm", "-rf", str(stack.root / "dist")], check=True)
    assert stack.run("build") == 0
    assert (stack.root / "dist" / info["wheel"]).read_bytes() == wheel
    assert stack.run("apply", "--force") == 0
    assert stack.run("export", "--check") == 0
    assert stack.run("export") == 0
    assert {
        p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()
    } == patches
