"""vstack lint on exported patches with and without each problem."""

from __future__ import annotations

from vstack.lint import lint_patch, lint_series

GOOD_MSG = (
    "[EPLB] Add a module\n\nThe module exists so that the tests have something real to "
    "check.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"
)
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


def _export(stack, path, content, message):
    assert stack.run("apply") == 0
    stack.commit_on_work(path, content, message)
    assert stack.run("export") == 0
    return stack.root / "patches" / "eplb-add-a-module.patch"


def _messages(stack):
    return [str(f) for f in lint_series(stack.root / "patches")]


def test_clean_patch_passes(stack, capsys):
    _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", GOOD_MSG)
    assert _messages(stack) == []
    assert stack.run("lint") == 0
    assert "1 patch(es) OK" in capsys.readouterr().out


def test_each_problem_is_reported_with_location(stack, capsys):
    msg = (
        "[EPLB] Add a module\n\nshort\n\n"
        "Signed-off-by: vLLM EPLB Stack <eplb-stack@users.noreply.github.com>"
    )
    _export(stack, "vllm/new_mod.py", "X = 1   \ntorch.cuda.synchronize()\n", msg)
    (stack.root / "patches" / "stray.patch").write_text("x")
    found = "\n".join(_messages(stack))
    assert "patches/eplb-add-a-module.patch:1: no description" in found
    assert "no Upstream-Status: trailer" in found
    assert (
        "Signed-off-by: vLLM EPLB Stack <eplb-stack@users.noreply.github.com>: "
        "'vLLM EPLB Stack' is a bot or tool, not a person" in found
    )
    assert "trailing whitespace in vllm/new_mod.py:1" in found
    assert "new direct torch.cuda call in vllm/new_mod.py:2" in found
    assert "new file vllm/new_mod.py lacks vLLM's SPDX header lines" in found
    assert "patches/stray.patch:1: not listed in patches/series" in found
    assert stack.run("lint") == 1


def test_submitted_needs_pr_and_missing_entry(stack):
    msg = GOOD_MSG.replace("Upstream-Status: pending", "Upstream-Status: submitted")
    _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", msg)
    series = stack.root / "patches" / "series"
    series.write_text(series.read_text() + "gone.patch\n")
    found = "\n".join(_messages(stack))
    assert "Upstream-Status: submitted needs an Upstream-PR: trailer" in found
    assert "gone.patch does not exist" in found


def test_signoff_is_not_needed_but_must_be_a_persons(stack):
    """The person who sends a PR signs it off (vstack upstream --signoff): a
    patch of the stack needs none, and one it carries must not be a bot's or a
    placeholder's."""
    msg = "[EPLB] Add a module\n\nThe module exists for a reason worth a sentence.\n\nUpstream-Status: pending"
    patch = _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", msg)
    assert _messages(stack) == []
    text = patch.read_text()
    for who, why in [
        ("Ann <ann@example.com>", "placeholder address"),
        ("ci-runner[bot] <ci@lee.dev>", "is a bot or tool"),
        ("Ann <noreply@lee.dev>", "no-reply"),
        ("someone", "not 'Name <email>'"),
    ]:
        signed = text.replace(
            "Upstream-Status: pending",
            f"Upstream-Status: pending\nSigned-off-by: {who}",
        )
        assert any(why in f.message for f in lint_patch("x.patch", signed)), who
    person = text.replace(
        "Upstream-Status: pending",
        "Upstream-Status: pending\nSigned-off-by: Ada Lovelace <ada@lovelace.dev>",
    )
    assert lint_patch("x.patch", person) == []


def test_recorded_resolutions_follow_the_patch_rules(stack, capsys):
    from vstack.lint import lint_resolutions
    from vstack.rebase import superseded_record

    good = _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", GOOD_MSG).read_text()
    rec = stack.root / "resolutions" / "1.1.0"
    rec.mkdir(parents=True)
    (rec / "a.patch").write_text(good)
    (rec / "b.patch").write_text(
        superseded_record("[EPLB] B", "1.1.0", "upstream's fused kernel does this")
    )
    assert lint_resolutions(stack.root) == []
    (rec / "c.patch").write_text(superseded_record("[EPLB] C", "1.1.0", ""))
    (rec / "d.patch").write_text(good.replace("Upstream-Status: pending\n", ""))
    (rec / "notes.txt").write_text("x")
    found = [str(f) for f in lint_resolutions(stack.root)]
    assert any(
        f.startswith("resolutions/1.1.0/c.patch:1: a record with no diff")
        for f in found
    )
    assert any(
        f.startswith("resolutions/1.1.0/d.patch:1:") and "Upstream-Status" in f
        for f in found
    )
    assert "resolutions/1.1.0/notes.txt:1: not a .patch file" in found
    assert stack.run("lint") == 1


def test_series_entries_are_named_by_their_line(stack):
    patch = _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", GOOD_MSG)
    series = stack.root / "patches" / "series"
    series.write_text(
        "# apply order\n\n"  # lines 1-2
        f"{patch.name}\n"  # 3
        "# a comment between entries\n"  # 4
        f"{patch.name}\n"  # 5
        "\n"  # 6
        "gone.patch\n"  # 7
    )
    found = _messages(stack)
    assert f"patches/series:5: {patch.name} is listed twice" in found
    assert "patches/series:7: gone.patch does not exist" in found


def test_imports_vllm_hooks_reject_are_found_in_every_added_line(stack):
    """vLLM's check-triton-import rejects a Triton import anywhere but through
    vllm.triton_utils (a local import in a test helper too); enforce-regex-import
    rejects `re`."""
    content = SPDX + (
        "import regex as re\n"
        "from vllm.triton_utils import tl, triton\n\n\n"
        "def count():\n"
        "    from triton.runtime import interpreter\n\n"
        "    return interpreter, re, tl, triton\n"
    )
    _export(stack, "tests/kernels/helper_utils.py", content, GOOD_MSG)
    found = _messages(stack)
    assert found == [
        "patches/eplb-add-a-module.patch:25: `from triton.runtime import interpreter` "
        "in tests/kernels/helper_utils.py:8: import Triton as vLLM does: "
        "`from vllm.triton_utils import tl, triton` (check-triton-import)"
    ]
    assert stack.run("lint") == 1
    git_text = (stack.root / "patches" / "eplb-add-a-module.patch").read_text()
    for bad in ("import re", "from re import sub", "import triton", "import re, os"):
        text = git_text.replace("+import regex as re\n", f"+{bad}\n")
        msgs = [f.message for f in lint_patch("x.patch", text)]
        assert any(bad in m for m in msgs), bad
    # the one file vLLM lets import Triton directly
    text = git_text.replace(
        "tests/kernels/helper_utils.py", "vllm/triton_utils/importing.py"
    )
    assert lint_patch("x.patch", text) == []


QUOTED_DIFF = (
    "diff --git a/vllm/b.py b/vllm/b.py\n--- a/vllm/b.py\n+++ b/vllm/b.py\n"
    "@@ -1 +1 @@\n-B = 1\n+B = 2\n"
)


def test_export_refuses_a_message_git_am_would_cut(stack, capsys):
    """A '---' line cut the message on apply (design text and Upstream-Status lost);
    a quoted diff in the message became code in the wheel. Export refuses, naming
    the commit and the line, and writes nothing."""
    import pytest

    for body, line in [
        (
            "Why it exists, in a sentence or two.\n---\nDesign text after dashes.",
            "'---'",
        ),
        (
            "Why it exists: this was the old fix:\n\n" + QUOTED_DIFF,
            "'diff --git a/vllm/b.py",
        ),
        (
            "Why it exists, in a sentence or two.\n\nIndex: vllm/b.py",
            "'Index: vllm/b.py'",
        ),
        ("Why it exists, in a sentence or two.\n--- a/vllm/b.py", "'--- a/vllm/b.py'"),
        ("From: the design doc <d@vllm.invalid>\n\nWhy.", "'From: the design doc"),
    ]:
        before = {p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()}
        assert stack.run("apply", "--force") == 0
        msg = f"[EPLB] Add a module\n\n{body}\n\nUpstream-Status: pending"
        stack.commit_on_work("vllm/new_mod.py", SPDX + "X = 1\n", msg)
        capsys.readouterr()
        assert stack.run("export") == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vstack: error: commit "), err
        assert "('[EPLB] Add a module')" in err[0] and line in err[0], err[0]
        assert "would end the message" in err[0] or "as a mail header" in err[0]
        after = {p.name: p.read_bytes() for p in (stack.root / "patches").iterdir()}
        assert after == before
    from vstack.message import split_line

    # what git am keeps: not refused
    for ok in ("----", "--x", " --- indented", "-- not scissors", "a >8 b", "+++x",
               "+++ b/x.py", "-- >8 --", "Why.\nFrom: x <y@z.dev>"):  # fmt: skip
        assert split_line(f"Subject\n\n{ok}\n") is None, ok
    with pytest.raises(AssertionError):
        assert split_line("Subject\n\n--- \n") is None


def test_lint_refuses_a_patch_whose_message_git_am_would_cut(stack):
    patch = _export(stack, "vllm/new_mod.py", SPDX + "X = 1\n", GOOD_MSG)
    good = patch.read_text()
    assert _messages(stack) == []
    why = "The module exists so that the tests have something real to check.\n"
    for inserted, says in [
        (
            "---\nDesign text after dashes.\n",
            "'Design text after dashes.' follows the '---' line",
        ),
        (
            "Old fix:\n" + QUOTED_DIFF,
            "'diff --git a/vllm/b.py b/vllm/b.py' in the message is where git am ends it",
        ),
    ]:
        patch.write_text(good.replace(why, why + inserted, 1))
        found = "\n".join(_messages(stack))
        assert "patches/eplb-add-a-module.patch:" in found and says in found, found
        assert stack.run("lint") == 1
    # a body opening with "From:" is read by git am as the author
    patch.write_text(good.replace(why, "From: the design doc <d@x.dev>\n\n" + why, 1))
    found = "\n".join(_messages(stack))
    assert "'From: the design doc <d@x.dev>' opens the message body" in found, found
    # a scissors line is kept by git am as vstack runs it
    patch.write_text(good.replace(why, why + "-- >8 --\n", 1))
    assert _messages(stack) == []
    patch.write_text(good)
    assert _messages(stack) == []


ROUND_TRIP = [
    # (message body, whether git am as vstack runs it keeps message and author)
    ("Plain text.", True),
    ("+++ speedup measured on H100\n\nmore text", True),
    ("Why.\n+++ b/vllm/x.py", True),
    ("Why.\n-- >8 --\nmore.", True),
    ("--8<-- cut here --\nmore.", True),
    ("Why.\nFrom: the design doc <d@vllm.invalid>", True),
    ("From: the design doc <d@vllm.invalid>\n\nWe tune a.", False),
    ("\nsubject: other subject\n\nWe tune a.", False),
    ("Date: Mon, 1 Jan 2024 00:00:00 +0000\n\nWe tune a.", False),
    ("[PATCH] other subject\n\nWe tune a.", False),
    ("Why.\n---\nDesign text.", False),
    ("Why.\n\nIndex: vllm/b.py", False),
]


def test_message_rules_match_a_real_format_patch_and_am(tmp_path):
    """export refused a '+++ ' line and scissors lines, which git am (no --scissors,
    mailinfo.scissors=false) keeps, and passed a body opening with 'From:', which
    git am reads as the author. Each rule is checked against a real round trip."""
    import pytest

    from vstack import gitutil
    from vstack.apply import AM_ENV
    from vstack.export import FORMAT_PATCH
    from vstack.message import patch_file_problem, split_line

    repo = tmp_path / "r"
    repo.mkdir()
    g = gitutil.git
    g(repo, "init", "-q")
    (repo / "f").write_text("a\n")
    g(repo, "add", "f")
    g(repo, "commit", "-q", "-m", "init")
    base = gitutil.out(repo, "rev-parse", "HEAD")
    for body, kept in ROUND_TRIP:
        msg = f"[EPLB] Tune a\n\n{body}\n\nUpstream-Status: pending\n"
        (repo / "f").write_text("a\nb\n")
        g(repo, "commit", "-q", "-a", "--author=Ann Lee <ann@lee.dev>", "-F", "-",
          input=msg)  # fmt: skip
        want = gitutil.out(repo, "log", "-1", "--format=%an <%ae>%n%B", "HEAD")
        text = g(repo, *FORMAT_PATCH, "-1", "HEAD").stdout
        g(repo, "reset", "-q", "--hard", base)
        g(repo, "am", "--3way", "--keep", "--committer-date-is-author-date",
          "--quiet", input=text, env=AM_ENV)  # fmt: skip
        got = gitutil.out(repo, "log", "-1", "--format=%an <%ae>%n%B", "HEAD")
        g(repo, "reset", "-q", "--hard", base)
        assert (got == want) is kept, (body, got)
        assert (split_line(msg) is None) is kept, body
        assert (patch_file_problem(text) is None) is kept, body
    with pytest.raises(AssertionError):
        assert split_line("Subject\n\n--- \n") is None
