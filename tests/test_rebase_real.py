"""rebase between two real vLLM release wheels (0.33.0 -> 0.34.0) with fixture
patches derived from the real code so that each status is exercised: one applies
cleanly, one needs a 3-way merge, one conflicts, one is already upstream."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from vstack_testlib import Stack, git

from vstack.config import load_project

ROOT = Path(__file__).resolve().parents[1]
NEW = "0.34.0"
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
    if not (cache / real.pin.wheel).is_file() and os.environ.get("VSTACK_OFFLINE"):
        pytest.skip("VSTACK_OFFLINE and the pinned wheel is not cached")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    shutil.copy(ROOT / "stack.toml", root / "stack.toml")
    (root / "patches" / "series").write_text("")
    (root / ".gitignore").write_text("/.vstack/\n")
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(cache))
    return Stack(root, cache, cache / real.pin.wheel)


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


def _copy_real_stack(tmp_path, with_resolutions: bool) -> Stack:
    real = load_project(ROOT)
    if not (real.wheel_cache / real.pin.wheel).is_file() and os.environ.get(
        "VSTACK_OFFLINE"
    ):
        pytest.skip("VSTACK_OFFLINE and the pinned wheel is not cached")
    root = tmp_path / "real"
    root.mkdir()
    shutil.copy(ROOT / "stack.toml", root / "stack.toml")
    shutil.copytree(ROOT / "patches", root / "patches")
    if with_resolutions:
        shutil.copytree(ROOT / "resolutions", root / "resolutions")
    (root / ".gitignore").write_text("/.vstack/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "stack")
    return Stack(root, real.wheel_cache, real.wheel_cache / real.pin.wheel)


def _series(root: Path) -> list[str]:
    text = (root / "patches/series").read_text()
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_real_stack_stops_where_upstream_reimplemented_it(
    tmp_path, monkeypatch, capsys
):
    """Without the recorded resolutions the real series stops at its first patch,
    naming the files and hunks, and --abort leaves the project as it was."""
    s = _copy_real_stack(tmp_path, with_resolutions=False)
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


def test_real_stack_rebases_onto_0_34_0_with_its_recorded_resolutions(
    tmp_path, monkeypatch, capsys
):
    """0.34.0 reimplemented parts of the series. The records replay: the fused
    MegaMoE mapping is superseded, replica selection is its recorded port; the
    async patch (no record yet) stops the rebase with what upstream now has, and
    skipping the unported rest finishes with only the kept delta."""
    s = _copy_real_stack(tmp_path, with_resolutions=True)
    monkeypatch.setenv("VSTACK_WHEEL_CACHE", str(s.cache))
    old_series = _series(s.root)
    fused, replica, async_, symm = old_series
    records = {p.name for p in (ROOT / "resolutions" / NEW).iterdir()}
    assert records == {fused, replica}
    capsys.readouterr()
    assert s.run("rebase", "--onto", NEW) == 1
    out, err = capsys.readouterr()
    assert f"[1/4] superseded       {fused}" in out
    assert f"[2/4] ported           {replica}" in out
    assert f"conflict in {async_}" in err
    assert "vllm/distributed/eplb/async_worker.py: hunk" in err
    # A fresh project never applied the series, yet the 3-way merge had the
    # patches' preimages: the stop leaves conflict markers to resolve.
    worker = (s.repo / "vllm/distributed/eplb/async_worker.py").read_text()
    assert "<<<<<<< " in worker and ">>>>>>> " in worker
    assert s.run("rebase", "--skip", "--reason", "not ported in this test") == 1
    # The communicator patch conflicts where 0.34.0 has its own symm_mem one.
    err = capsys.readouterr().err
    assert f"conflict in {symm}" in err
    assert s.run("rebase", "--skip", "--reason", "not ported in this test") == 0
    out = capsys.readouterr().out
    report = json.loads((s.root / ".vstack/reports/rebase.json").read_text())
    rows = {r["patch"]: r for r in report["patches"]}
    assert [r["patch"] for r in report["patches"]] == old_series
    assert rows[fused]["status"] == "superseded", rows[fused]
    assert rows[fused]["details"][0].startswith(
        f"recorded in resolutions/{NEW}/{fused}: Superseded by vLLM {NEW}"
    )
    assert rows[replica]["status"] == "ported", rows[replica]
    assert rows[replica]["details"][0].startswith(
        f"recorded port resolutions/{NEW}/{replica}"
    )
    assert (
        'upstream now has: value "symm_mem" (vllm/config/parallel.py)'
        in rows[symm]["details"]
    )
    assert any(
        d.startswith("upstream now has: class SymmMemEplbCommunicator")
        and "eplb_communicator.py" in d
        for d in rows[symm]["details"]
    )
    assert "1 patch(es) kept, 3 dropped" in out
    assert _series(s.root) == [replica]
    assert f'version = "{NEW}"' in (s.root / "stack.toml").read_text()
    assert s.run("export", "--check") == 0
    assert s.run("lint") == 0
    # The kept patch is its recorded port, byte for byte after re-export.
    ported = (s.root / "patches" / replica).read_text()
    assert ported == (ROOT / "resolutions" / NEW / replica).read_text()
