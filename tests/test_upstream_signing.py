"""Signing PR drafts: identities as git records them, and lint refusing
placeholder authors in a signed mbox."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from vstack_testlib import git

SPDX = ("# SPDX-License-Identifier: Apache-2.0\n"
        "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n")  # fmt: skip
BOT = "vLLM EPLB Stack <eplb-stack@users.noreply.github.com>"
SEED = "Seed 7 maintainers <maintainers@users.noreply.a-seed-7.example>"
KENJI = "Kenji Todo <kenji.todo@gmail.com>"
ADA = "Ada Lovelace <ada@lovelace.dev>"


def _random_identity(rng: random.Random) -> str:
    crud = [".", ",", ";", ":", "'", '"', " ", "\\"] + (
        ["<", ">"] if rng.random() < 0.1 else []
    )
    letters = ["a", "Z", "é", "Ø", "ß", "李", "-", "_", "'", ".", " ", "Jr.", "O'N"]
    name = "".join(rng.choice(letters) for _ in range(rng.randint(1, 8)))
    name = "".join(rng.choice(crud) for _ in range(rng.randint(0, 3))) + name
    name += "".join(rng.choice(crud) for _ in range(rng.randint(0, 3)))
    local = "".join(rng.choice("abcxyz.+-_") for _ in range(rng.randint(1, 6)))
    email = f"{local}@{rng.choice(['corp.io', 'uni.edu', 'mail.de'])}"
    email = rng.choice(["", "", "."]) + email + rng.choice(["", "", ".", ","])
    return f"{name} <{email}>"


def test_any_signer_vstack_accepts_passes_its_own_dco_check(tmp_path):
    """Property over generated names with leading and trailing crud, quotes,
    angle brackets, non-ASCII: whoever --signoff accepts, the commit vstack makes
    carries their sign-off exactly as git records its author (or --signoff says
    in one line why not)."""
    from vstack.errors import VstackError
    from vstack.identity import checked
    from vstack.upstream import _rewrite, dco_check

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "base")
    (repo / "x.py").write_text("X = 1\n")
    git(repo, "add", "x.py")
    git(repo, "commit", "-q", f"--author={BOT}", "-m", "[EPLB] X\n\nA change.\n")
    base, tip = git(repo, "rev-parse", "HEAD~1", "HEAD").split()
    rng = random.Random(2029)
    accepted = 0
    for _ in range(40):
        text = _random_identity(rng)
        try:
            signer = checked(text, "--signoff")
        except VstackError as e:
            assert "\n" not in str(e), text
            continue
        accepted += 1
        made = _rewrite(repo, base, tip, signer)
        check = dco_check(repo, made, "")
        assert check.status == "PASS", (text, signer, check.message)
        author = git(repo, "log", "-1", "--format=%an <%ae>", made[-1]).strip()
        assert author == f"{signer.name} <{signer.email}>", text
    assert accepted >= 20  # the property was exercised, not skipped


def _format_patch(tmp_path, author: str, message: str) -> Path:
    repo = tmp_path / f"mail-{abs(hash((author, message)))}"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "base")
    (repo / "x.py").write_text("X = 1\n")
    git(repo, "add", "x.py")
    git(repo, "commit", "-q", f"--author={author}", "-m", message)
    out = git(repo, "format-patch", "--stdout", "-1", "HEAD")
    path = tmp_path / f"{repo.name}.mbox"
    path.write_text(out)
    return path


def test_lint_refuses_placeholder_authors_in_a_signed_mbox(stack, tmp_path, capsys):
    """Issue 29: `vstack lint` passed every signed mbox, the stack's shared
    identity or a placeholder as its author included."""
    msg = "[EPLB] X\n\nA change for the test.\n\nSigned-off-by: "
    shared = _format_patch(tmp_path, BOT, msg + ADA)
    seed = _format_patch(tmp_path, SEED, msg + ADA)
    jose = "José Núñez <jose@corp.io>"  # RFC 2047-encoded in From:
    person = _format_patch(tmp_path, jose, msg + jose)
    unsigned = _format_patch(tmp_path, ADA, "[EPLB] X\n\nA change for the test.\n")
    capsys.readouterr()
    assert stack.run("lint", str(person)) == 0
    assert "1 mbox(es) OK" in capsys.readouterr().out
    assert stack.run("lint", str(shared), str(seed), str(unsigned)) == 1
    out = capsys.readouterr().out
    assert (f"{shared}:1: '[EPLB] X': From: {BOT}: 'vLLM EPLB Stack' is a bot or tool, "
            "not a person; a signed mail's author must be a person") in out  # fmt: skip
    assert (
        f"{seed}:1: '[EPLB] X': From: {SEED}: " in out and "no-reply or shared" in out
    )
    assert f"{unsigned}:1: '[EPLB] X': no Signed-off-by: not sendable" in out
    # plain `vstack lint` checks every signed mbox under .vstack/outgoing/
    assert stack.run("lint") == 0
    dest = stack.root / ".vstack" / "outgoing" / "eplb-x"
    dest.mkdir(parents=True)
    shutil.copy(unsigned, dest / "v1.unsigned.mbox")  # not meant to be sent
    assert stack.run("lint") == 0
    shutil.copy(seed, dest / "v1.mbox")
    capsys.readouterr()
    assert stack.run("lint") == 1
    assert ".vstack/outgoing/eplb-x/v1.mbox:1: '[EPLB] X': From: Seed 7" in (
        capsys.readouterr().out
    )
