"""git's parsers, not ours (issue 28): a subject with one non-ASCII character (RFC
2047-encoded by format-patch, defect 7), trailers as git interpret-trailers reads
them, C-quoted paths, and a patches/series saved with a byte-order mark (defect 12)."""

from __future__ import annotations

import shutil
import subprocess

from series_lab import commit, hand_series, lines, message, repin, series_names

from vstack.series import parse_patch

SUBJECT = "[EPLB] 2× faster planning, ≤ 5 µs per layer (José)"


def test_a_non_ascii_subject_names_the_patch_and_the_pr_title(stack, capsys):
    assert stack.run("apply") == 0
    stack.commit_on_work(
        "vllm/config.py", "A = 1\nB = 2\nC = 4\n",
        f"{SUBJECT}\n\nPlanning is faster with this change, measured.\n\n"
        "Upstream-Status: pending",
    )  # fmt: skip
    assert stack.run("export") == 0
    names = series_names(stack)
    assert names == ["eplb-2-faster-planning-5-s-per-layer-jos.patch"]
    text = (stack.root / "patches" / names[0]).read_text()
    assert "Subject: =?UTF-8?q?" in text  # what format-patch writes
    assert parse_patch(text).subject == SUBJECT  # what git mailinfo reads
    if not (shutil.which("ruff") or shutil.which("ruff", path=_venv_bin())):
        return
    capsys.readouterr()
    assert stack.run("upstream", names[0].removesuffix(".patch")) == 0
    title = stack.root / "upstream" / names[0].removesuffix(".patch") / "title.txt"
    assert title.read_text().strip() == SUBJECT


def _venv_bin() -> str:
    import sys
    from pathlib import Path

    return str(Path(sys.executable).parent)


def test_parse_patch_reads_subject_author_trailers_and_paths_as_git_does(tmp_path):
    repo = tmp_path / "r"
    (repo / "d").mkdir(parents=True)
    (repo / "d/old.py").write_bytes(lines())
    (repo / "d/keep.sh").write_bytes(b"x\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit(repo, "init")
    subprocess.run(
        ["git", "-C", str(repo), "mv", "d/old.py", "d/n e\tw.py"], check=True
    )
    (repo / "d/n e\tw.py").write_bytes(lines(changes={3: "three"}))
    (repo / 'd/q"uote\\é.py').write_bytes(b"Q = 1\n")
    (repo / "d/keep.sh").chmod(0o755)
    msg = (
        f"{SUBJECT}\n\nWhy it exists, in a paragraph.\n\n"
        "Upstream-Status: pending\nDepends-On: eplb-a\n  folded-on\nRFC: docs/x.md\n"
    )
    from series_lab import author_env

    commit(repo, msg, env=author_env("José Ü", "j@x"))
    data = subprocess.run(
        ["git", "-C", str(repo), "-c", "core.quotePath=true", "format-patch",
         "--stdout", "-1", "-M", "HEAD"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    assert b'"b/d/n e\\tw.py"' in data and b"=?UTF-8?q?" in data
    info = parse_patch(data.decode())
    assert info.subject == SUBJECT
    assert (info.author, info.email) == ("José Ü", "j@x")
    assert info.trailers == {
        "Upstream-Status": ["pending"],
        "Depends-On": ["eplb-a folded-on"],
        "RFC": ["docs/x.md"],
    }
    assert info.body == "Why it exists, in a paragraph."
    assert sorted(info.files) == sorted(
        ["d/keep.sh", "d/old.py", "d/n e\tw.py", 'd/q"uote\\é.py']
    )
    assert info.added == ['d/q"uote\\é.py']
    assert info.deleted == []
    assert {h.file for h in info.hunks} == {"d/n e\tw.py", 'd/q"uote\\é.py'}


def test_a_series_saved_with_a_byte_order_mark_applies(stack):
    """Defect 12: "patches/series names X, but patches/X is missing"."""
    repin(stack, {"vllm/a.py": lines()})

    def commits(repo):
        (repo / "vllm/a.py").write_bytes(lines(changes={4: "four"}))
        commit(repo, message("[EPLB] Four"))

    hand_series(stack, commits, bom=True)
    assert (stack.root / "patches/series").read_bytes().startswith(b"\xef\xbb\xbf")
    assert stack.run("apply", "--force") == 0
    assert stack.run("build") == 0
