"""scripts/drift against a local per-commit repository: OK, a patch that stops
applying, a recorded resolution gone stale, a test the nightly breaks; and the
GitHub Actions job that runs it parses."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from vstack_testlib import ROOT, git, make_wheel, per_commit_repo, serve

from vstack.records import with_patch_hash

STATE = "vllm/distributed/eplb/state.py"

TEST = """import vllm
import vllm.config
from pathlib import Path


def test_patched_line_and_upstream_config():
    state = Path(vllm.__file__).parent / "distributed" / "eplb" / "state.py"
    assert "line five" in state.read_text()
    assert ".eplb.g" in vllm.__version__
    assert vllm.config.B == 2
"""
MSG = (
    "[EPLB] Change line 5\n\nLine 5 must say five, and a test says so.\n\n"
    "Upstream-Status: pending\nSigned-off-by: T <t@x>"
)


def _sha(tag: str) -> str:
    return hashlib.sha1(tag.encode()).hexdigest()


def _lines(changes=None) -> bytes:
    lines = [f"line {i}" for i in range(1, 41)]
    for i, text in (changes or {}).items():
        lines[i - 1] = text
    return "".join(x + "\n" for x in lines).encode()


@pytest.fixture
def drift(stack, tmp_path, monkeypatch):
    assert stack.run("apply") == 0
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 5\n", "line five\n"))
    (stack.repo / "tests").mkdir()
    (stack.repo / "tests/test_stack.py").write_text(TEST)
    git(stack.repo, "add", "-A")
    git(stack.repo, "commit", "-q", "-m", MSG)
    assert stack.run("export") == 0
    nightlies = {
        "ok": {},
        "conflict": {"vllm/distributed/eplb/state.py": _lines({5: "line 5 upstream"})},
        "broken": {"vllm/config.py": b"A = 1\nB = 3\nC = 3\n"},
    }
    wheels = {}
    for n, (tag, files) in enumerate(nightlies.items(), 2):
        sha = _sha(tag)
        version = f"1.0.2.dev{n}+g{sha[:9]}"
        wheels[sha] = make_wheel(
            tmp_path / "built" / f"vllm-{version}-cp38-abi3-manylinux_2_31_x86_64.whl",
            version, "g" + sha[:9], {"vllm/distributed/eplb/state.py": _lines(), **files},
        )  # fmt: skip
    folder = tmp_path / "per-commit"
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    def run(nightly: str):
        per_commit_repo(folder, wheels, _sha(nightly))
        summary.write_text("")
        with serve(folder) as url:
            p = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "drift"), "--root", str(stack.root),
                 "--wheel-index", url, "--out", str(tmp_path / "out"),
                 "--python", sys.executable],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        return p, summary.read_text(), tmp_path / "out"

    run.folder, run.wheels = folder, wheels
    return run


def test_drift_ok_writes_the_table_and_the_report(stack, drift):
    before = stack.snapshot()
    p, summary, out = drift("ok")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("drift: OK")
    assert summary.startswith(f"# vLLM drift: 1.0.0 -> 1.0.2.dev2+g{_sha('ok')[:9]}")
    assert "**OK**: rebases, builds, tests pass" in summary
    assert "| 1 | eplb-change-line-5.patch | clean |" in summary
    assert "- tests: passed" in summary
    assert "1 passed" in (out / "tests.log").read_text()
    report = json.loads((out / "drift.json").read_text())
    assert report["verdict"] == "ok"
    assert [(r["patch"], r["status"]) for r in report["patches"]] == [
        ("eplb-change-line-5.patch", "clean")
    ]
    # the bump a PR would carry: the pin moved to the nightly
    bumped = (out / "bump" / "stack.toml").read_text()
    assert f'commit = "g{_sha("ok")}"' in bumped
    assert (out / "bump/patches/eplb-change-line-5.patch").is_file()
    assert stack.snapshot() == before  # a throwaway copy was rebased


def test_drift_fails_when_a_patch_stops_applying(drift):
    p, summary, out = drift("conflict")
    assert p.returncode == 1
    assert (
        "**FAIL**: 1 of 1 patches stop applying: eplb-change-line-5.patch (conflict)"
        in summary
    )
    assert "| 1 | eplb-change-line-5.patch | conflict |" in summary
    (row,) = json.loads((out / "drift.json").read_text())["patches"]
    assert row["status"] == "conflict" and row["files"] == [STATE]
    # no vLLM repository here: said, not guessed
    assert row["culprit_note"].startswith("not bisected: no vLLM repository")
    assert (
        f"reproduce locally: scripts/vstack rebase --onto {_sha('conflict')}"
        in p.stdout
    )
    assert not (out / "bump").exists()


def test_drift_fails_when_the_nightly_breaks_a_test(drift):
    p, summary, out = drift("broken")
    assert p.returncode == 1
    assert "**FAIL**: the rebased series' CPU tests fail" in summary
    assert "| 1 | eplb-change-line-5.patch | clean |" in summary
    assert "assert 3 == 2" in (out / "tests.log").read_text()


def test_drift_fails_when_a_recorded_resolution_goes_stale(stack, drift):
    # a port recorded for release 1.0.1: the nightlies after it (1.0.2.devN) replay
    # it, and the upstream lines it was made against are gone
    patch = (stack.root / "patches/eplb-change-line-5.patch").read_text()
    record = stack.root / "resolutions/1.0.1/eplb-change-line-5.patch"
    record.parent.mkdir(parents=True)
    record.write_text(patch.replace(" line 6\n", " line 6 as in 1.0.1\n", 1))
    p, summary, _ = drift("ok")
    assert p.returncode == 1
    assert (
        "**FAIL**: the recorded resolution resolutions/1.0.1/eplb-change-line-5.patch "
        "is stale: it no longer applies" in summary
    )
    # the patch itself applies without the record: that is its status's detail
    assert "| 1 | eplb-change-line-5.patch | stale record |" in summary
    assert "without the record the patch is clean" in summary


def test_drift_fails_on_a_record_made_from_another_version_of_the_patch(stack, drift):
    patch = (stack.root / "patches/eplb-change-line-5.patch").read_text()
    record = stack.root / "resolutions/1.0.1/eplb-change-line-5.patch"
    record.parent.mkdir(parents=True)
    record.write_text(with_patch_hash(patch, "0" * 64))
    p, summary, _ = drift("conflict")
    assert p.returncode == 1
    assert (
        "the recorded resolution resolutions/1.0.1/eplb-change-line-5.patch is stale: "
        "it was recorded from another version of the patch" in summary
    )
    # and without it the patch stops applying too: one status, both facts
    assert "| 1 | eplb-change-line-5.patch | conflict |" in summary


def test_drift_says_why_when_the_nightly_cannot_be_fetched(stack, tmp_path):
    # what drifts killed with SIGKILL left is removed; what is not known to be a
    # drift's (no .lock), or a drift at work (its .lock held), is left alone
    killed = Path(tempfile.mkdtemp(prefix="vstack-drift-"))
    (killed / ".lock").write_text("")
    (killed / "stack").mkdir()
    unknown = Path(tempfile.mkdtemp(prefix="vstack-drift-"))
    running = Path(tempfile.mkdtemp(prefix="vstack-drift-"))
    fd = os.open(running / ".lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "drift"), "--root", str(stack.root),
         "--wheel-index", "http://127.0.0.1:9", "--out", str(tmp_path / "out"),
         "--python", sys.executable],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()
    assert any(ln.startswith("drift: FAIL: the rebase failed: ") for ln in last)
    assert "127.0.0.1:9" in (tmp_path / "out/drift.md").read_text()
    assert json.loads((tmp_path / "out/drift.json").read_text())["verdict"] == "error"
    assert "Traceback" not in p.stdout + p.stderr
    os.close(fd)
    assert not killed.exists() and unknown.is_dir() and running.is_dir()
    shutil.rmtree(unknown)
    shutil.rmtree(running)


def test_drift_refuses_a_root_without_stack_toml(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "drift"), "--root", str(tmp_path),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"drift: error: {tmp_path} has no stack.toml: give the stack's folder with "
        f"--root"
    )


def test_drift_help_and_the_readme_say_how_to_use_it():
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "drift"), "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    for needed in ("--vllm-repo PATH_OR_URL", "--max-probes N", "--publish",
                   "blocked by", "first bad", "docs/drift.md"):  # fmt: skip
        assert needed in p.stdout, needed
    readme = (ROOT / "README.md").read_text()
    assert "[docs/drift.md](docs/drift.md)" in readme
    doc = (ROOT / "docs" / "drift.md").read_text()
    assert "--vllm-repo PATH_OR_URL" in doc and "scripts/drift --publish" in doc


def test_the_drift_job_parses_and_runs_the_script():
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((ROOT / "ci" / "drift.yml").read_text())
    triggers = job.get("on") or job.get(True)  # YAML 1.1 reads `on` as true
    assert triggers["schedule"][0]["cron"]
    steps = job["jobs"]["drift"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "scripts/drift" in runs and "--onto" in runs
    uploads = [
        s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")
    ]
    assert uploads and uploads[0]["if"] == "always()"
    # the pinned test lock and torch, as scripts/test installs them
    assert "requirements/cpu-test.txt" in runs and "torch==2.13.0+cpu" in runs
    # acted on: the publish step runs after drift, OK or FAIL, with what gh needs
    (drift,) = [s for s in steps if "scripts/drift --onto" in s.get("run", "")]
    (publish,) = [s for s in steps if "scripts/drift --publish" in s.get("run", "")]
    assert steps.index(publish) > steps.index(drift) and drift["id"] == "drift"
    assert "steps.drift.outcome == 'failure'" in publish["if"]
    assert "GH_TOKEN" in publish["env"]
    perms = job["permissions"]
    assert perms == {"contents": "write", "pull-requests": "write", "issues": "write"}
    # the bisection's caches survive the night
    paths = [s["with"]["path"] for s in steps if "actions/cache" in s.get("uses", "")]
    assert "~/.cache/vstack/drift" in paths


def test_drift_out_is_a_folder_of_its_own(stack, tmp_path):
    """--out DIR was emptied first: --out . deleted the checkout, .git included."""
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "README.md").write_text("mine\n")
    for out in (".", "notes"):
        (checkout / "notes").mkdir(exist_ok=True)
        (checkout / "notes" / "todo.txt").write_text("mine too\n")
        p = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "drift"), "--root", str(stack.root),
             "--out", out, "--python", sys.executable],
            cwd=checkout, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert p.returncode == 2, p.stdout + p.stderr
        assert "is not empty and was not made by scripts/drift" in p.stderr
        assert "Traceback" not in p.stderr
        assert (checkout / ".git").is_dir() and (checkout / "README.md").is_file()
        assert (checkout / "notes" / "todo.txt").read_text() == "mine too\n"
    # (a folder drift made is its own: tests/test_interrupts.py reruns drift there)


def test_drift_is_ok_when_the_stack_pins_the_newest_nightly(stack, drift, capsys):
    """A stack already on the newest nightly has nothing to rebase: drift exited 1
    ("... is the current base; nothing to do")."""
    per_commit_repo(drift.folder, drift.wheels, _sha("ok"))
    with serve(drift.folder) as url:
        assert stack.run("rebase", "--onto", "nightly", "--wheel-index", url) == 0
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "on the nightly")
    p, summary, out = drift("ok")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("drift: OK")
    assert "the stack already pins vLLM nightly: nothing to rebase" in summary
    assert "is vLLM nightly already" in summary.splitlines()[0]
    assert "- tests: passed" in summary
