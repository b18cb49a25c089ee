"""vstack upstream: every draft signs (placeholder authors become the signer, a
person's authorship is kept, Depends-On chains too), identities as git records
them, signed copies only under .vstack/outgoing/, upstream/ never rewritten by
--signoff / --no-tests and never holding an mbox, a checkout's branches never
force-updated, lint refusing placeholder authors in a signed mbox, and
`--base nightly` re-cutting every draft on the newest per-commit wheel."""

from __future__ import annotations

import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vstack_testlib import (
    ROOT,
    git,
    make_wheel,
    need_ruff,
    per_commit_repo,
    serve,
    write_stack_toml,
)

SPDX = ("# SPDX-License-Identifier: Apache-2.0\n"
        "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n")  # fmt: skip
BOT = "vLLM EPLB Stack <eplb-stack@users.noreply.github.com>"
SEED = "Seed 7 maintainers <maintainers@users.noreply.a-seed-7.example>"
KENJI = "Kenji Todo <kenji.todo@gmail.com>"
ADA = "Ada Lovelace <ada@lovelace.dev>"


def _commit(stack, files: dict[str, str], message: str, author: str) -> None:
    for path, content in files.items():
        f = stack.repo / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(content)
        git(stack.repo, "add", path)
    git(stack.repo, "commit", "-q", f"--author={author}", "-m", message)


def _out(stack, slug: str, name: str = "v1.mbox") -> Path:
    return stack.root / ".vstack" / "outgoing" / slug / name


def _chain_stack(stack) -> list[str]:
    """A <- B <- C by Depends-On: A by a placeholder (the seed's shared address),
    B by the stack's shared identity, C by a person who signed it off."""
    assert stack.run("apply") == 0
    _commit(stack, {"vllm/a.py": SPDX + "A = 1\n"},
            "[EPLB] Add a\n\nThe first module of the chain, for the tests.\n\n"
            "Upstream-Status: pending", SEED)  # fmt: skip
    _commit(stack, {"vllm/b.py": SPDX + "from vllm.a import A\n\nB = A + 1\n"},
            "[EPLB] Add b\n\nThe second module, which needs the first one.\n\n"
            "Upstream-Status: pending\nDepends-On: eplb-add-a", BOT)  # fmt: skip
    _commit(stack, {"vllm/c.py": SPDX + "from vllm.b import B\n\nC = B + 1\n"},
            "[EPLB] Add c\n\nThe third module, written by a person.\n\n"
            f"Upstream-Status: pending\nDepends-On: eplb-add-b\nSigned-off-by: {KENJI}",
            KENJI)  # fmt: skip
    assert stack.run("export") == 0
    return ["eplb-add-a", "eplb-add-b", "eplb-add-c"]


def _headers(mbox: Path) -> tuple[str, list[str]]:
    """(author, Signed-off-by values) of a one-mail mbox, as git am reads it."""
    tmp = mbox.parent / ".read"
    tmp.mkdir(exist_ok=True)
    info = subprocess.run(["git", "mailinfo", str(tmp / "m"), str(tmp / "p")],
                          input=mbox.read_bytes(), capture_output=True, check=True).stdout  # fmt: skip
    head = dict(ln.split(": ", 1) for ln in info.decode().splitlines() if ": " in ln)
    trailers = subprocess.run(["git", "interpret-trailers", "--parse", str(tmp / "m")],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    shutil.rmtree(tmp)
    signed = [ln.split(": ", 1)[1] for ln in trailers.splitlines()
              if ln.startswith("Signed-off-by: ")]  # fmt: skip
    return f"{head['Author']} <{head['Email']}>", signed


# ---------------------------------------------------------------- signing


def test_every_draft_signs_placeholders_become_the_signer_people_stay(stack, capsys):
    """Issue 29: --signoff succeeded for 2 of 9 drafts: a placeholder author (and
    every draft depending on one) could not be signed."""
    need_ruff()
    a, b, c = _chain_stack(stack)
    capsys.readouterr()
    assert stack.run("upstream", "--all", "--no-tests", "--signoff", ADA) == 0
    out = capsys.readouterr().out
    assert _headers(_out(stack, a)) == (ADA, [ADA])
    assert _headers(_out(stack, b)) == (ADA, [ADA])
    # a person's authorship is kept; the signer's sign-off follows theirs
    assert _headers(_out(stack, c)) == (KENJI, [KENJI, ADA])
    lines = out.splitlines()
    seed = f"{SEED} (a placeholder, not a person)"
    shared = f"{BOT} (the stack's shared identity)"
    assert f"  author: {ADA} replaces {seed} on this PR's commit" in lines
    assert (f"  author: {ADA} replaces {seed} on 1 commit(s) of the PRs it depends "
            f"on; {shared} on this PR's commit") in lines  # fmt: skip
    assert (f"  author: {ADA} replaces {seed} on 1 commit(s) of the PRs it depends "
            f"on; {shared} on 1 commit(s) of the PRs it depends on") in lines  # fmt: skip
    assert f"  author: {KENJI} (a person) is kept; {ADA} adds their sign-off" in lines
    for slug in (a, b, c):
        checks = _out(stack, slug, "checks.txt").read_text()
        assert "PASS     [dco] every commit (1) signed off by its author" in checks
    # --signoff wrote nothing in upstream/; lint accepts the signed copies
    assert not (stack.root / "upstream").exists()
    capsys.readouterr()
    assert stack.run("lint") == 0, capsys.readouterr().out


def test_the_printed_gh_command_passes_the_title_byte_for_byte(stack, capsys):
    """Review: the title went through json.dumps into a double-quoted shell
    word: backticks ran as commands, `$X` expanded, non-ASCII became \\uXXXX."""
    need_ruff()
    title = "[EPLB] Cap `num_redundant_experts` at $MAX \u2264 2\u00d7 (it's $(id))"
    assert stack.run("apply") == 0
    _commit(stack, {"vllm/a.py": SPDX + "A = 1\n"},
            f"{title}\n\nA module for the test.\n\nUpstream-Status: pending", SEED)  # fmt: skip
    assert stack.run("export") == 0
    capsys.readouterr()
    assert stack.run("upstream", "--all", "--no-tests", "--signoff", ADA) == 0
    out = capsys.readouterr().out
    gh = [ln for ln in out.splitlines() if "gh pr create" in ln]
    assert len(gh) == 1, out
    words = shlex.split(gh[0])
    assert words[words.index("--title") + 1] == title


def test_signer_named_as_git_records_it_passes_the_dco_check(stack, capsys):
    """Issue 28 defect 10: git strips the trailing "." of "John Smith Jr." from
    the author it records, not from the Signed-off-by vstack wrote: vstack's own
    DCO check failed."""
    need_ruff()
    a, _, _ = _chain_stack(stack)
    capsys.readouterr()
    typed = "John Smith Jr. <john.smith@corp.io>"
    recorded = "John Smith Jr <john.smith@corp.io>"
    assert stack.run("upstream", a, "--no-tests", "--signoff", typed) == 0
    out = capsys.readouterr().out
    assert f"signing off as {recorded} (git records {typed} so)" in out
    assert _headers(_out(stack, a)) == (recorded, [recorded])
    assert "PASS     [dco]" in _out(stack, a, "checks.txt").read_text()


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


# ---------------------------------------------------------------- lint


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
    # plain `vstack lint` checks every signed mbox under .vstack/outgoing/, and
    # says how many it checked
    capsys.readouterr()
    assert stack.run("lint") == 0
    assert (
        "OK (no signed mbox under .vstack/outgoing/ to check)"
        in capsys.readouterr().out
    )
    dest = stack.root / ".vstack" / "outgoing" / "eplb-x"
    dest.mkdir(parents=True)
    shutil.copy(unsigned, dest / "v1.unsigned.mbox")  # not meant to be sent
    assert stack.run("lint") == 0
    shutil.copy(person, dest / "v1.mbox")
    capsys.readouterr()
    assert stack.run("lint") == 0
    assert (
        " and 1 signed mbox(es) under .vstack/outgoing/ OK\n" in capsys.readouterr().out
    )
    shutil.copy(seed, dest / "v1.mbox")
    capsys.readouterr()
    assert stack.run("lint") == 1
    assert ".vstack/outgoing/eplb-x/v1.mbox:1: '[EPLB] X': From: Seed 7" in (
        capsys.readouterr().out
    )


# ---------------------------------------------------------------- upstream/ and outgoing


def test_upstream_holds_no_mbox_and_keeps_hand_edits(stack, capsys):
    """A recording run writes upstream/<patch>/ without an mbox (a committed one
    from an older vstack is removed: git and the recorded patch files give it
    back) and keeps a file the user edited there."""
    need_ruff()
    a, _, _ = _chain_stack(stack)
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n")
    assert stack.run("upstream", a) == 0
    d = stack.root / "upstream" / a
    assert sorted(p.name for p in d.iterdir()) == [
        "body.md", "checks.txt", "meta.json", "title.txt"]  # fmt: skip
    unsigned = _out(stack, a, "v1.unsigned.mbox").read_bytes()
    # an older vstack committed the mbox beside the draft
    (d / "v1.mbox").write_bytes(unsigned)
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "drafts")
    (d / "body.md").write_text("## Purpose\n\nMy own words.\n")  # not committed
    (d / "title.txt").unlink()
    (d / "title.txt").mkdir()  # not a file: kept too, not a traceback
    # the patch changes: revision 2
    patch = stack.root / "patches" / f"{a}.patch"
    patch.write_text(patch.read_text().replace("+A = 1\n", "+A = 2\n"))
    capsys.readouterr()
    assert stack.run("upstream", a) == 0
    out = capsys.readouterr().out
    assert (d / "body.md").read_text() == "## Purpose\n\nMy own words.\n"
    new_body = _out(stack, a, "body.md")
    assert f"note: kept upstream/{a}/body.md: it holds edits vstack did not make " \
           f"(vstack's new one: {new_body})" in out  # fmt: skip
    assert "## Test Plan" in new_body.read_text()
    assert (d / "title.txt").is_dir() and _out(stack, a, "title.txt").is_file()
    assert "draft eplb-add-a v2:" in (d / "checks.txt").read_text()
    assert not (d / "v1.mbox").exists() and (d / "range-diff-v1-v2.txt").is_file()
    # revision 1 comes back from git, byte for byte
    assert stack.run("upstream", a, "--revision", "1") == 0
    assert _out(stack, a, "v1.unsigned.mbox").read_bytes() == unsigned
    # a recorded revision has its recorded base: --base is refused, not ignored
    capsys.readouterr()
    assert stack.run("upstream", a, "--revision", "1", "--base", "nightly") == 1
    assert "drop --base/--git" in capsys.readouterr().err


def test_committed_drafts_hold_no_mbox_and_fit_450_kb():
    """Issue 29: upstream/ was 716 KB, every draft's full mbox committed beside
    patches/ (the same lines twice)."""
    up = ROOT / "upstream"
    files = [p for p in up.rglob("*") if p.is_file()]
    assert not [p.name for p in files if p.suffix == ".mbox"]
    size = sum(p.stat().st_size for p in files)
    assert size <= 450_000, f"upstream/ holds {size} bytes"


# ---------------------------------------------------------------- the checkout's branches


@pytest.fixture
def checkout_stack(stack):
    """The chain stack with a vLLM checkout in vllm/ at the pinned commit."""
    up = stack.root / "vllm"
    (up / "vllm").mkdir(parents=True)
    (up / "vllm" / "__init__.py").write_text("")
    git(up, "init", "-q", "-b", "main")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "upstream base")
    head = git(up, "rev-parse", "HEAD").strip()
    write_stack_toml(stack.root, stack.wheel, commit="g" + head[:9])
    return up


def test_a_branch_the_user_committed_on_is_never_moved(stack, checkout_stack, capsys):
    """Issue 28 defect 3: every run force-updated vstack/<patch>-v<N> in the
    checkout: a review fix committed there was discarded without a word."""
    need_ruff()
    up = checkout_stack
    a, _, _ = _chain_stack(stack)
    branch = f"vstack/{a}-v1"
    assert stack.run("upstream", a) == 0
    made = git(up, "rev-parse", branch).strip()
    # the user fixes a review comment on the branch
    git(up, "checkout", "-q", branch)
    (up / "vllm" / "a.py").write_text(SPDX + "A = 1  # reviewed\n")
    git(up, "commit", "-q", "-a", "-m", "review fix")
    mine = git(up, "rev-parse", "HEAD").strip()
    git(up, "checkout", "-q", "main")
    capsys.readouterr()
    assert stack.run("upstream", a, "--no-tests", "--signoff", ADA) == 0
    out = capsys.readouterr().out
    assert git(up, "rev-parse", branch).strip() == mine
    backup = f"refs/vstack/backup/{branch}/{mine[:12]}"
    assert git(up, "rev-parse", backup).strip() == mine
    assert (f"note: left branch {branch} in {up} as it is (it holds commits vstack did "
            f"not put there; its tip {mine[:12]} is also kept as {backup})") in out  # fmt: skip
    assert f"branch {branch}-2 in {up} (1 commit(s), signed off by {ADA})" in out
    signed = git(up, "rev-parse", f"{branch}-2").strip()
    assert git(up, "log", "-1", "--format=%an <%ae>", signed).strip() == ADA
    assert git(up, "rev-parse", f"{signed}~1").strip() != made  # sits on the base
    # a branch vstack left as it was moves (its old tip kept as a backup) ...
    assert stack.run("upstream", a) == 0
    assert git(up, "rev-parse", f"{branch}-2").strip() == made
    assert (
        git(up, "rev-parse", f"refs/vstack/backup/{branch}-2/{signed[:12]}").strip()
        == signed
    )
    # ... unless it is checked out: then the draft takes the next name
    git(up, "checkout", "-q", f"{branch}-2")
    capsys.readouterr()
    assert stack.run("upstream", a, "--no-tests", "--signoff", ADA) == 0
    out = capsys.readouterr().out
    assert git(up, "rev-parse", "HEAD").strip() == made
    assert git(up, "rev-parse", f"{branch}-3").strip() == signed
    assert f"left branch {branch}-2 in {up} as it is (it is checked out;" in out
    assert git(up, "status", "--porcelain").strip() == ""
    assert git(up, "rev-parse", branch).strip() == mine


def test_branch_plan_never_picks_a_branch_the_user_owns():
    """Property over generated checkout states: the name chosen is absent, at the
    draft's tip, or where vstack left it and not checked out; every name passed
    over is one of those vstack may not move."""
    from vstack.drafts import branch_plan

    rng = random.Random(28)
    tips = ["t0", "t1", "t2", "t3"]
    for _ in range(300):
        state = {}
        names = ["b"] + [f"b-{k}" for k in range(2, rng.randint(2, 7))]
        for name in names:
            if rng.random() < 0.2:
                break
            state[name] = (
                rng.choice(tips),
                rng.choice([None, *tips]),
                rng.random() < 0.3,
            )
        tip, known = rng.choice(tips), set(rng.sample(tips, rng.randint(0, 2)))
        name, action = branch_plan("b", tip, state, known)
        seq = ["b"] + [f"b-{k}" for k in range(2, 60)]
        cur, made, out = state.get(name, (None, None, False))
        assert action == {None: "create"}.get(cur, action)
        if action == "keep":
            assert cur == tip
        if action == "move":
            assert not out and (cur == made or cur in known)
        for skipped in seq[: seq.index(name)]:
            c, m, o = state[skipped]
            assert c != tip and (o or (c != m and c not in known))


# ---------------------------------------------------------------- --base nightly

NEW = "3" * 40
NEW_VERSION = f"1.0.1.dev12+g{NEW[:9]}"
NEW_WHEEL = f"vllm-{NEW_VERSION}-cp38-abi3-manylinux_2_31_x86_64.whl"


def _state(changes: dict[int, str]) -> str:
    return "".join(f"{changes.get(i, f'line {i}')}\n" for i in range(1, 41))


def test_base_nightly_recuts_every_draft_and_says_where_it_applies_and_passes(
    stack, tmp_path, monkeypatch, capsys
):
    """Issue 29: the drafts targeted the pinned commit only; retargeting needed
    a vLLM checkout. --base nightly re-cuts each on the newest per-commit wheel
    and reports per PR: applies? tests pass?"""
    need_ruff()
    lines = "vllm/lines.txt"
    pinned = make_wheel(stack.wheel, files={lines: _state({}).encode()})
    write_stack_toml(stack.root, pinned)
    read = f'    text = Path("{lines}").read_text()\n'
    test_five = (SPDX + "from pathlib import Path\n\n\ndef test_five():\n" + read
                 + '    assert "line five" in text\n')  # fmt: skip
    test_30 = (SPDX + "from pathlib import Path\n\n\ndef test_line_30():\n" + read
               + '    assert text.splitlines()[29] == "line 30"\n')  # fmt: skip
    assert stack.run("apply") == 0
    _commit(stack, {lines: _state({5: "line five"}), "tests/test_five.py": test_five},
            "[EPLB] Change line 5\n\nLine 5 must say five.\n\nUpstream-Status: pending",
            BOT)  # fmt: skip
    _commit(stack, {lines: _state({5: "line five", 20: "line twenty"})},
            "[EPLB] Change line 20\n\nLine 20 must say twenty.\n\nUpstream-Status: pending",
            BOT)  # fmt: skip
    _commit(stack, {"vllm/c.py": SPDX + "C = 3\n", "tests/test_c.py": test_30},
            "[EPLB] Add c\n\nA module whose test reads line 30.\n\nUpstream-Status: pending",
            BOT)  # fmt: skip
    assert stack.run("export") == 0
    # the newest nightly changed lines 20 and 30
    nightly = make_wheel(tmp_path / "built" / NEW_WHEEL, NEW_VERSION, "g" + NEW[:9],
                         {lines: _state({20: "line 20 upstream", 30: "line 30 upstream"}).encode()})  # fmt: skip
    served = per_commit_repo(tmp_path / "wheels.example", {NEW: nightly}, NEW)
    before = stack.snapshot()
    capsys.readouterr()
    with serve(served) as url:
        monkeypatch.setenv("VSTACK_WHEEL_INDEX", url)
        rc = stack.run(
            "upstream", "--all", "--base", "nightly", "--python", sys.executable
        )
    out = capsys.readouterr().out
    assert rc == 1, out
    assert (f"vstack upstream: re-cut on vLLM {NEW_VERSION} (commit {NEW[:9]}): 2 of 3 "
            "PR(s) apply, 1 pass their checks and tests there") in out, out  # fmt: skip
    rows = [ln for ln in out.splitlines() if ln.startswith("   ")]
    assert (
        rows[0] == "   1 eplb-change-line-5: applies (on stock); tests pass (1 passed)"
    )
    assert rows[1].startswith("   2 eplb-change-line-20: does not apply: ")
    assert "eplb-change-line-20.patch does not apply on stock vLLM" in rows[1]
    assert rows[2].startswith("   3 eplb-add-c: applies (on stock); tests FAIL (")
    assert "1 failed" in rows[2]
    # nothing in the project changed; the re-cuts are under .vstack/outgoing/
    assert stack.snapshot() == before
    recut = _out(stack, "eplb-change-line-5", f"on-{NEW[:9]}")
    mbox = (recut / "pr.unsigned.mbox").read_text()
    assert "+line five" in mbox and "Subject: [EPLB] Change line 5" in mbox
    assert "1 passed on stock vLLM " + NEW_VERSION in (recut / "checks.txt").read_text()
    assert (stack.root / ".vstack/outgoing" / f"index-on-{NEW[:9]}.md").is_file()
    # the hint to sign names the re-cut's base, not the pinned one
    assert (f"unsigned: not sendable yet: scripts/vstack upstream eplb-change-line-5 "
            f"--base {NEW[:9]} --signoff") in out  # fmt: skip
    # the index cannot be reached: the newest nightly this machine has is used
    capsys.readouterr()
    rc = stack.run("upstream", "eplb-change-line-5", "--base", "nightly",
                   "--no-tests", "--signoff", ADA)  # fmt: skip
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    assert f"using the newest nightly in the wheel cache, {NEW_WHEEL}" in cap.err
    assert _headers(recut / "pr.mbox") == (ADA, [ADA])
    assert stack.snapshot() == before
