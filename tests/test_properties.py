"""Properties over generated series (issue 28), with hypothesis, bounded for CI (see
tests/props.py for running more examples by hand):

- apply then export is the identity on patches/, for every shape a commit of the
  series can take (modes, renames, CRLF, a BOM, non-ASCII and C-quoted paths and
  subjects, empty files, many files); a shape a text patch cannot carry (a
  symlink, a binary file, an empty commit) is refused by export, naming the commit,
  and patches/ is left as it was;
- the built wheel holds exactly the applied tree's bytes and modes for what the
  series changes, with a RECORD that is true of every member;
- a rebase never loses a hunk: over generated upstream moves (the patch merged,
  conflicting with it, a file it touches renamed, an unrelated change) every patch
  ends applied (its added lines in the rebased tree), resolved (here: by the
  resolution the test makes, recorded), or dropped-upstream with its added lines in
  the new base and a backup ref; patches in rename form (format-patch -M -C) too;
- git's C-quoted names read back as git reads them (gitparse.unquote_c_style).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st
from props import bounded
from series_lab import (
    author_env,
    commit_project,
    format_patches,
    new_wheel,
    repin,
    series_names,
    write_series,
)
from vstack_testlib import git

from vstack import gitparse
from vstack.wheelzip import record_problems

FILES = [f"vllm/m{i}.py" for i in range(4)]
N_LINES = 24

# Characters of generated names and text: ASCII, spaces, quotes, backslashes and
# non-ASCII; no NUL, no "/" in a name part (a path separator).
NAME_CHARS = st.sampled_from(
    list("abcxyz019_-. ") + ['"', "\\", "é", "µ", "×", "\t", "≤", "José"[3]]
)
TEXT = st.text(
    alphabet=st.sampled_from(list("abc xyz=()0123_") + ["é", "×", "≤", "µ", '"', "\\", "\t"]),
    min_size=1, max_size=12,
)  # fmt: skip


def base_text(path: str) -> bytes:
    return "".join(f"{path} line {i}\n" for i in range(1, N_LINES + 1)).encode()


def _base(stack) -> None:
    repin(stack, {f: base_text(f) for f in FILES})


# ---------------------------------------------------------------- commit shapes

name_part = st.text(alphabet=NAME_CHARS, min_size=1, max_size=8).filter(
    lambda s: s.strip(" .") == s and s not in (".", "..")
)


@st.composite
def op(draw, kinds=("edit", "edit", "add", "delete", "rename", "chmod", "crlf", "bom",
                    "empty-file", "many")):  # fmt: skip
    kind = draw(st.sampled_from(kinds))
    return (kind, draw(st.sampled_from(FILES)), draw(name_part), draw(TEXT),
            draw(st.integers(1, N_LINES)), draw(st.integers(20, 400)))  # fmt: skip


subject = st.builds(
    lambda words, tail: f"[EPLB] {words} {tail}".strip(),
    st.text(alphabet=st.sampled_from(list("abcdefgh ") + ["×", "≤", "µ", "é"]), min_size=3, max_size=20),
    st.sampled_from(["", "(José)", "2× faster", "≤ 5 µs"]),
)  # fmt: skip


def _apply_op(repo: Path, o, k: int) -> None:
    kind, path, name, text, line, many = o
    f = repo / path
    new = f"vllm/new_{k}_{name}.py"
    if kind in ("edit", "crlf") and f.is_file():
        rows = f.read_bytes().split(b"\n")
        i = min(line, len(rows) - 1) - 1
        end = b"\r" if kind == "crlf" else b""
        rows[i] = f"{text} {k}".encode() + end
        f.write_bytes(b"\n".join(rows))
    elif kind == "add":
        (repo / new).write_text(f"X = {text!r}\n", encoding="utf-8")
    elif kind == "bom":
        (repo / new).write_bytes(b"\xef\xbb\xbfB = 1\n")
    elif kind == "empty-file":
        (repo / new).write_bytes(b"")
    elif kind == "delete" and f.is_file():
        f.unlink()
    elif kind == "rename" and f.is_file():
        data = f.read_bytes()
        f.unlink()
        (repo / new).write_bytes(data + f"# {text}\n".encode())
    elif kind == "chmod" and f.is_file():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    elif kind == "many":
        d = repo / f"vllm/many_{k}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(many):
            (d / f"f{i}.py").write_bytes(f"V = {i}\n".encode())
    elif kind == "symlink":
        os.symlink("m0.py", repo / f"vllm/link_{k}")
    elif kind == "binary":
        (repo / new).write_bytes(bytes(range(256)))


def _commit_series(repo: Path, series) -> list[str]:
    """One commit per (subject, ops); returns the subjects committed."""
    done = []
    for k, (subj, ops) in enumerate(series):
        for j, o in enumerate(ops):
            _apply_op(repo, o, k * 10 + j)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        staged = subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--quiet"])
        if ops and staged.returncode == 0:
            # the ops changed nothing (a chmod of an executable file, an edit of a
            # deleted one): a commit of the series changes something
            (repo / f"vllm/step_{k}.py").write_text(f"STEP = {k}\n")
            subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        msg = f"{subj}\n\nWhy: generated change number {k} for a property.\n\nUpstream-Status: pending\n"
        args = ["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-F", "-"]
        p = subprocess.run(args, input=msg.encode(), env=author_env("José Ü", "j@x"),
                           capture_output=True)  # fmt: skip
        assert p.returncode == 0, p.stderr
        done.append(subj)
    return done


def _tree_files(repo: Path, rev: str) -> dict[str, tuple[str, bytes]]:
    """{path: (mode, bytes)} of a commit's tree."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "-z", rev],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    found = {}
    for entry in out.split(b"\0"):
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, _, sha = meta.decode().split()
        data = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", sha],
                              check=True, capture_output=True).stdout  # fmt: skip
        found[path.decode("utf-8", "surrogateescape")] = (mode, data)
    return found


def _fresh(stack) -> None:
    shutil.rmtree(stack.root / ".vstack", ignore_errors=True)
    shutil.rmtree(stack.root / "dist", ignore_errors=True)


def _reset(stack) -> None:
    """The fixture's project as each example starts it (hypothesis runs every
    example on the same fixture): no patches, no resolutions, the first pin, a fresh
    clone's .vstack."""
    toml = stack.root / "stack.toml"
    first = stack.__dict__.setdefault("first_toml", toml.read_bytes())
    toml.write_bytes(first)
    _fresh(stack)
    shutil.rmtree(stack.root / "resolutions", ignore_errors=True)
    for p in (stack.root / "patches").glob("*.patch"):
        p.unlink()
    (stack.root / "patches/series").write_text("")
    _base(stack)


def _patches(stack) -> dict[str, bytes]:
    d = stack.root / "patches"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


SERIES = st.lists(
    st.tuples(subject, st.lists(op(), min_size=1, max_size=3)), min_size=1, max_size=4
)


@bounded(10)
@given(series=SERIES)
def test_apply_then_export_is_the_identity_and_the_wheel_holds_the_bytes(stack, series):
    _reset(stack)
    assert stack.run("apply") == 0
    repo = stack.repo
    base = git(repo, "rev-parse", "HEAD").strip()
    _commit_series(repo, series)
    tree = _tree_files(repo, "HEAD")
    assert stack.run("export") == 0
    exported = _patches(stack)
    assert len(series_names(stack)) == len(series)
    # a fresh clone: apply, then export, changes nothing; the tree is the committed one
    _fresh(stack)
    assert stack.run("apply") == 0
    assert _tree_files(repo, "work") == tree
    assert stack.run("export") == 0
    assert _patches(stack) == exported
    assert stack.run("export", "--check") == 0
    # the wheel: exactly the applied bytes and modes, and a true RECORD
    assert stack.run("build") == 0
    wheel = next((stack.root / "dist").glob("*.whl"))
    assert record_problems(wheel) == []
    changed = {
        p for p in set(tree) | set(_tree_files(repo, base))
        if tree.get(p) != _tree_files(repo, base).get(p)
    }  # fmt: skip
    with zipfile.ZipFile(wheel) as z:
        members = {i.filename: i for i in z.infolist()}
        for p in changed:
            if p in tree:
                mode, data = tree[p]
                assert z.read(p) == data, p
                assert bool((members[p].external_attr >> 16) & 0o100) == (
                    mode == "100755"
                ), p
            else:
                assert p not in members, p


@st.composite
def unexportable(draw):
    """A commit a text patch cannot carry: a symlink or a binary file (beside other
    changes), or no change at all."""
    kind = draw(st.sampled_from(["symlink", "binary", "empty-commit"]))
    if kind == "empty-commit":
        return draw(subject), []
    others = draw(st.lists(op(kinds=("edit", "add", "chmod", "crlf")), max_size=2))
    return draw(subject), [*others, draw(op(kinds=(kind,)))]


@bounded(8)
@given(
    good=st.lists(
        st.tuples(subject, st.lists(op(), min_size=1, max_size=2)), max_size=2
    ),
    bad=unexportable(),
)
def test_export_refuses_what_a_text_patch_cannot_carry_and_changes_nothing(
    stack, capsys, good, bad
):
    _reset(stack)
    assert stack.run("apply") == 0
    before = _patches(stack)
    _commit_series(stack.repo, [*good, bad])
    capsys.readouterr()
    assert stack.run("export") == 1
    err = capsys.readouterr().err
    assert "vstack: error: commit " in err and "on branch 'work'" in err
    assert _patches(stack) == before


# ---------------------------------------------------------------- rebase moves

MOVES = ["merge", "conflict", "rename", "unrelated", "none"]


@st.composite
def rebase_case(draw):
    """1-4 patches, each editing 1-2 lines of its own (no two patches share a
    line), some adding a file; one upstream move per patch."""
    n = draw(st.integers(1, 4))
    slots = draw(st.permutations([(f, i) for f in FILES for i in range(2, N_LINES, 3)]))
    patches, used = [], 0
    for k in range(n):
        edits = []
        for _ in range(draw(st.integers(1, 2))):
            f, i = slots[used]
            used += 1
            edits.append((f, i, f"{draw(TEXT)} patch {k}"))
        add = draw(st.one_of(st.none(), name_part))
        patches.append((draw(subject), edits, add, draw(st.sampled_from(MOVES))))
    foreign = draw(st.booleans())  # patches/ as `git format-patch -M -C` writes them
    return patches, foreign


def _added(patch_edits, add, k) -> list[bytes]:
    lines = [t.encode() for _, _, t in patch_edits]
    if add is not None:
        lines.append(f"ADDED = {k}".encode())
    return lines


def _resolve_markers(text: bytes) -> bytes:
    """A resolution a user would make: both sides of each conflict, upstream's
    lines first, then the patch's."""
    out, ours, theirs, side = [], [], [], None
    for line in text.split(b"\n"):
        if line.startswith(b"<<<<<<< "):
            side, ours, theirs = "ours", [], []
        elif line.startswith(b"||||||| ") and side:
            side = "base"
        elif line == b"=======" and side:
            side = "theirs"
        elif line.startswith(b">>>>>>> ") and side:
            out += ours + [t for t in theirs if t not in ours]
            side = None
        elif side == "ours":
            ours.append(line)
        elif side == "theirs":
            theirs.append(line)
        elif side is None:
            out.append(line)
    return b"\n".join(out)


@bounded(12)
@given(case=rebase_case())
def test_a_rebase_never_loses_a_hunk(stack, tmp_path, case):
    patches, foreign = case
    _reset(stack)
    assert stack.run("apply") == 0
    repo = stack.repo
    base = git(repo, "rev-parse", "HEAD").strip()
    upstream = {f: base_text(f).split(b"\n") for f in FILES}
    renamed: dict[str, str] = {}
    for k, (subj, edits, add, move) in enumerate(patches):
        for f, i, text in edits:
            rows = (repo / f).read_bytes().split(b"\n")
            rows[i - 1] = text.encode()
            (repo / f).write_bytes(b"\n".join(rows))
            if move == "merge":
                upstream[f][i - 1] = text.encode()
            elif move == "conflict":
                upstream[f][i - 1] = f"upstream {k}".encode()
            elif move == "unrelated":
                upstream[f][0] = f"unrelated {k}".encode()
        if add is not None:
            (repo / f"vllm/add_{k}_{add}.py").write_bytes(f"ADDED = {k}\n".encode())
            if move == "merge":
                upstream[f"vllm/add_{k}_{add}.py"] = f"ADDED = {k}\n".encode().split(
                    b"\n"
                )
        if move == "rename":
            renamed[edits[0][0]] = edits[0][0].replace(".py", "_moved.py")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        msg = f"{subj}\n\nWhy: a generated patch for the rebase property.\n\nUpstream-Status: pending\n"
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-F", "-"],
                       input=msg.encode(), env=author_env(), check=True)  # fmt: skip
    if foreign:
        write_series(stack, format_patches(repo, base, ["-M", "-C"]))
        assert stack.run("apply", "--force") == 0
    else:
        assert stack.run("export") == 0
    commit_project(stack)
    names = series_names(stack)
    assume(len(set(names)) == len(names) == len(patches))
    files = {renamed.get(f, f): b"\n".join(rows) for f, rows in upstream.items()}
    n = len(
        list(tmp_path.iterdir())
    )  # a version per example: the wheel cache keeps each
    new = new_wheel(tmp_path / f"new-{n}", files, version=f"1.1.{n}")
    rc = stack.run("rebase", "--onto", str(new))
    for _ in range(len(patches) + 1):
        if rc != 1:
            break
        state = stack.root / ".vstack/rebase/state.json"
        assert state.is_file(), "a rebase that stops keeps its state"
        conflicted = subprocess.run(
            ["git", "-C", str(repo), "diff", "--name-only", "--diff-filter=U", "-z"],
            capture_output=True, check=True,
        ).stdout.split(b"\0")  # fmt: skip
        for f in filter(None, conflicted):
            path = repo / f.decode()
            if path.is_file():
                path.write_bytes(_resolve_markers(path.read_bytes()))
        rc = stack.run("rebase", "--continue")
        if rc == 1 and not any(filter(None, conflicted)):
            # a patch whose file upstream moved away: nothing to merge into; the
            # user ports it by hand, here: skips it as superseded by the move
            rc = stack.run("rebase", "--skip", "--reason", "upstream moved the file")
    assert rc == 0
    import json

    report = json.loads((stack.root / ".vstack/reports/rebase.json").read_text())
    final = b"\n".join(d for _, d in _tree_files(repo, "work").values())
    new_base = b"\n".join(files.values())
    for k, row in enumerate(report["patches"]):
        subj, edits, add, move = patches[k]
        want = _added(edits, add, k)
        if row["status"] == "dropped-upstream":
            assert move in ("merge", "rename"), (row, move)
            assert all(w in new_base for w in want), (row, want)
            assert row["backup"].startswith("refs/vstack/dropped/")
            assert git(repo, "rev-parse", row["backup"]).strip()
        elif row["status"] == "superseded":
            assert move in ("rename", "conflict"), (row, move)
            assert row["backup"]
        else:
            assert row["status"] in ("clean", "offset", "3way", "conflict-resolved")
            missing = [w for w in want if w not in final]
            assert not missing, (row, missing)
    # what is left is a series that applies as it is
    _fresh(stack)
    assert stack.run("apply") == 0


# ---------------------------------------------------------------- names


@bounded(15)
@given(
    old=st.lists(name_part, min_size=1, max_size=3),
    new=st.lists(name_part, min_size=1, max_size=3),
    how=st.sampled_from(["add", "rename", "copy"]),
)
def test_c_quoted_names_read_back_as_git_reads_them(tmp_path, old, new, how):
    """Whatever git C-quotes (spaces, quotes, backslashes, tabs, non-ASCII), the
    names gitparse.files reads from a patch are the names git committed: added,
    renamed from/to, copied from/to."""
    old, new = "/".join(old), "/".join(new)
    assume(
        old != new and not new.startswith(old + "/") and not old.startswith(new + "/")
    )
    repo = tmp_path / f"q{len(list(tmp_path.iterdir()))}"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)

    def put(name):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(b"".join(b"row %d\n" % i for i in range(20)))

    if how != "add":
        put(old)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", "x"], check=True,
                       env=author_env())  # fmt: skip
    if how == "rename":
        (repo / new).parent.mkdir(parents=True, exist_ok=True)
        os.replace(repo / old, repo / new)
    else:
        put(new)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    diff = subprocess.run(
        ["git", "-C", str(repo), "-c", "core.quotePath=true", "diff", "--cached",
         "-M", "-C", "--find-copies-harder"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    want = {
        "add": ("A", None, new),
        "rename": ("R", old, new),
        "copy": ("C", old, new),
    }[how]
    assert [(f.status, f.old, f.new) for f in gitparse.files(diff)] == [want]
