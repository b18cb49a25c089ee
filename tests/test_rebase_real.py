"""rebase between two real vLLM release wheels (0.33.0 -> 0.34.0) with fixture
patches derived from the real code so that each status is exercised: one applies
cleanly, one needs a 3-way merge, one conflicts, one is already upstream; and the
stack's own move from 0.33.0 to 0.34.0 replayed from its recorded resolutions."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from vstack_testlib import Stack, git

from vstack.config import load_project

ROOT = Path(__file__).resolve().parents[1]
NEW = "0.34.0"
# The last commit of this repository pinned to vLLM 0.33.0, and that pin.
LAST_0_33_0_COMMIT = "9686b63"
OLD_PIN = """[base]
version = "0.33.0"
commit = "g4ba787ec9"
wheel = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
sha256 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
image = "vllm/vllm-openai:v0.33.0"
image_digest = ""

[stack]
label = "eplb"
"""
pytestmark = pytest.mark.real_wheel


def _py_sources(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        return {
            n: zf.read(n).decode()
            for n in zf.namelist()
            if n.startswith("vllm/distributed/") and n.endswith(".py")
        }


def _pick(old: dict[str, str], new: dict[str, str]):
    same = sorted(n for n in old if new.get(n) == old[n] and old[n].count("\n") > 20)
    dropped = three = conflict = None
    for name in sorted(n for n in old if n in new and new[n] != old[n]):
        a, b = old[name].splitlines(True), new[name].splitlines(True)
        ops = [
            op
            for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
            if op[0] != "equal"
        ]
        if dropped is None and len(ops) <= 3:
            dropped = name
            continue
        first = ops[0]
        if (
            three is None
            and first[0] == "replace"
            and first[1] >= 6
            and first == ops[0]
        ):
            three = (
                name,
                first[1] - 2,
            )  # our edit, one unchanged line before upstream's
            continue
        if conflict is None and first[0] == "replace":
            conflict = (name, first[1])  # the very line upstream replaced
        if dropped and three and conflict:
            break
    assert same and dropped and three and conflict, (
        "0.33 -> 0.34 offers no fixture candidates"
    )
    return same[0], dropped, three, conflict


@pytest.fixture
def real_stack(tmp_path, monkeypatch):
    real = load_project(ROOT)
    cache = real.wheel_cache
    if not (cache / OLD_PIN.split('wheel = "')[1].split('"')[0]).is_file() and (
        os.environ.get("VSTACK_OFFLINE")
    ):
        pytest.skip("VSTACK_OFFLINE and the 0.33.0 wheel is not cached")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "stack.toml").write_text(OLD_PIN)
    (root / "patches" / "series").write_text("")
    (root / ".gitignore").write_text("/.vstack/\n")
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(cache))
    old = load_project(root).pin
    return Stack(root, cache, cache / old.wheel)


def _edit_line(text: str, line_no: int, marker: str) -> str:
    lines = text.splitlines(True)
    lines[line_no] = (
        f"# {marker}\n"
        if not lines[line_no].strip()
        else lines[line_no].rstrip("\n") + f"  # {marker}\n"
    )
    return "".join(lines)


def test_rebase_real_releases_each_status(real_stack, capsys):
    s = real_stack
    assert s.run("base") == 0
    from vstack.fetch import fetch_wheel

    new_wheel = fetch_wheel(NEW, s.cache)
    old_src, new_src = _py_sources(s.wheel), _py_sources(new_wheel)
    same, dropped, (three, three_line), (conf, conf_line) = _pick(old_src, new_src)
    msg = "{subj}\n\nFixture patch for the rebase test of real releases.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"
    assert s.run("apply") == 0
    s.commit_on_work(
        same,
        _edit_line(old_src[same], 3, "ours: clean"),
        msg.format(subj="[Test] Clean"),
    )
    s.commit_on_work(
        three,
        _edit_line(old_src[three], three_line, "ours: 3way"),
        msg.format(subj="[Test] Three way"),
    )
    s.commit_on_work(
        conf,
        _edit_line(old_src[conf], conf_line, "ours: conflict"),
        msg.format(subj="[Test] Conflict"),
    )
    s.commit_on_work(
        dropped, new_src[dropped], msg.format(subj="[Test] Already upstream")
    )
    assert s.run("export") == 0
    git(s.root, "init", "-q")
    git(s.root, "add", "-A")
    git(s.root, "commit", "-q", "-m", "stack")
    capsys.readouterr()
    assert s.run("rebase", "--onto", NEW) == 1
    err = capsys.readouterr().err
    assert "conflict in test-conflict.patch" in err and conf in err and "hunk" in err
    (s.repo / conf).write_text(new_src[conf] + "# ours: conflict, resolved\n")
    assert s.run("rebase", "--continue") == 0
    report = json.loads((s.root / ".vstack/reports/rebase.json").read_text())
    assert [(r["patch"], r["status"]) for r in report["patches"]] == [
        ("test-clean.patch", "clean"),
        ("test-three-way.patch", "3way"),
        ("test-conflict.patch", "conflict-resolved"),
        ("test-already-upstream.patch", "dropped-upstream"),
    ]
    assert report["new"]["version"] == NEW and report["new"]["commit"].startswith("g")
    toml = (s.root / "stack.toml").read_text()
    assert f'version = "{NEW}"' in toml and new_wheel.name in toml
    assert f'image = "vllm/vllm-openai:v{NEW}"' in toml
    series = [
        ln
        for ln in (s.root / "patches/series").read_text().splitlines()
        if not ln.startswith("#")
    ]
    assert series == ["test-clean.patch", "test-three-way.patch", "test-conflict.patch"]
    assert s.run("export", "--check") == 0


def _stack_at_last_0_33_0_commit(tmp_path, with_resolutions=True) -> Stack:
    """A project holding the 0.33.0 series as this repository had it (git history)
    and, optionally, today's resolutions/."""
    real = load_project(ROOT)

    def old(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)

    if old("cat-file", "-e", f"{LAST_0_33_0_COMMIT}^{{commit}}").returncode:
        pytest.skip(f"{LAST_0_33_0_COMMIT} is not in this clone's history")
    root = tmp_path / "real"
    (root / "patches").mkdir(parents=True)
    listing = old("ls-tree", "--name-only", LAST_0_33_0_COMMIT, "patches/")
    for path in listing.stdout.decode().splitlines():
        blob = old("show", f"{LAST_0_33_0_COMMIT}:{path}").stdout
        (root / path).write_bytes(blob)
    (root / "stack.toml").write_text(OLD_PIN)
    if with_resolutions:
        shutil.copytree(ROOT / "resolutions", root / "resolutions")
    (root / ".gitignore").write_text("/.vstack/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "stack")
    return Stack(
        root, real.wheel_cache, real.wheel_cache / load_project(root).pin.wheel
    )


def _series(root: Path) -> list[str]:
    text = (root / "patches/series").read_text()
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_real_stack_stops_where_upstream_reimplemented_it(
    tmp_path, monkeypatch, capsys
):
    """Without the recorded resolutions the 0.33.0 series stops at its first
    patch, naming the files and hunks, and --abort leaves the project as it was."""
    s = _stack_at_last_0_33_0_commit(tmp_path, with_resolutions=False)
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(s.cache))
    before = s.snapshot()
    first = _series(s.root)[0]
    capsys.readouterr()
    assert s.run("rebase", "--onto", NEW) == 1
    err = capsys.readouterr().err
    assert f"conflict in {first}" in err
    assert "vllm/model_executor/layers/fused_moe/deep_gemm_mega_moe.py: hunk" in err
    assert "--skip --reason" in err
    assert s.run("rebase", "--abort") == 0
    assert s.snapshot() == before
    assert git(s.root, "status", "--porcelain") == ""


def _recorded_series(name: str) -> bytes:
    """patches/<name> as this repository had it when resolutions/0.34.0/ was
    last written: the series the records reproduce (the series has moved on
    since: the clamp split out, no bot sign-off, async patches reworked)."""

    def git_out(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              check=True).stdout  # fmt: skip

    commit = git_out("log", "-1", "--format=%H", "--", "resolutions/0.34.0").strip()
    return git_out("show", f"{commit.decode()}:patches/{name}")


def test_the_move_to_0_34_0_replays_from_its_records(tmp_path, monkeypatch, capsys):
    """The 0.33.0 series rebases onto 0.34.0 without stopping, from the records
    the move left in resolutions/0.34.0/, and yields the series this repository
    pinned when they were recorded (its first patches, byte for byte)."""
    s = _stack_at_last_0_33_0_commit(tmp_path)
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(s.cache))
    fused, replica, async_, symm = _series(s.root)
    capsys.readouterr()
    assert s.run("rebase", "--onto", NEW) == 0
    out = capsys.readouterr().out
    assert f"[1/4] superseded       {fused}" in out
    assert f"[2/4] ported           {replica}" in out
    assert f"[3/4] superseded       {async_}" in out
    assert f"[4/4] ported           {symm}" in out
    report = json.loads((s.root / ".vstack/reports/rebase.json").read_text())
    rows = {r["patch"]: r for r in report["patches"]}
    assert "issue 13" in rows[async_]["details"][0]
    rebased = _series(s.root)
    assert len(rebased) == 2  # the two ported; the other two superseded
    for name in rebased:
        assert (s.root / "patches" / name).read_bytes() == _recorded_series(name), name
    assert f'version = "{NEW}"' in (s.root / "stack.toml").read_text()
    # they carry the stack's bot sign-off of that time, which lint now refuses
    capsys.readouterr()
    assert s.run("lint") == 1
    found = [
        ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("patches/")
    ]
    assert len(found) == 2 and all("'vLLM EPLB Stack' is a bot" in f for f in found)
