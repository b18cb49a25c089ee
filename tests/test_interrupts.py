"""Every state-changing verb, interrupted at each of its interrupt points (each git
call, each file write) by SIGINT and by SIGKILL, then recovered as a user would
(rerun, --continue, --abort): patches/, stack.toml, resolutions/, the report, the
work branch and the sync record come out byte for byte as after an uninterrupted
run. The points per verb are counted and printed at the end of the test session
(see conftest.py); tests/interrupts.py explains the points."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from interrupts import Scenario, enumerate_interrupts, files_under, run_forked, scratch
from vstack_testlib import (
    ROOT,
    git,
    make_wheel,
    numbered_lines,
    per_commit_repo,
    sha256,
    vstack_main,
)

from vstack import journal
from vstack.base import ensure_base
from vstack.config import load_project
from vstack.export import applied_tip
from vstack.series import series_paths

SIGNALS = (signal.SIGINT, signal.SIGKILL)
SIGNED = "\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


@pytest.fixture
def harness(stack, tmp_path, monkeypatch):
    """Runs a scenario's trials in a scratch folder; temporary files of killed
    children stay inside it."""
    with scratch(tmp_path / "trials") as work:
        tmp = work / "tmp"
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))

        def go(scenario: Scenario) -> dict:
            counts = enumerate_interrupts(stack, scenario, work, SIGNALS)
            assert counts["points"] > 0
            return counts

        yield go


def _outputs(stack, report=True) -> dict:
    root, cache = stack.root, stack.root / ".vstack"
    out = {f"patches/{k}": v for k, v in files_under(root / "patches").items()}
    out.update(
        {f"resolutions/{k}": v for k, v in files_under(root / "resolutions").items()}
    )
    out["stack.toml"] = (root / "stack.toml").read_bytes()
    if report:
        for name in ("rebase.md", "rebase.json"):
            p = cache / "reports" / name
            out[f"report/{name}"] = p.read_bytes() if p.is_file() else None
    work = subprocess.run(
        ["git", "-C", str(stack.repo), "rev-parse", "-q", "--verify", "refs/heads/work"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    out["work"] = work.encode()
    sync = cache / "synced.json"
    out["synced.json"] = sync.read_bytes() if sync.is_file() else None
    if (root / ".git").exists():
        out["git index"] = git(root, "ls-files", "-s").encode()
    # nothing unfinished is left behind
    out["unfinished"] = repr(
        [
            p
            for p in ("journal", "apply.json", "rebase/state.json")
            if (cache / p).exists()
        ]
    ).encode()
    return out


def _series(files: dict[str, bytes]) -> list[str]:
    text = files.get("series", b"").decode()
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


# What `vstack export` may change: saved around the check below and put back.
_EXPORT_WRITES = ("patches", ".vstack/synced.json", ".vstack/journal", ".vstack/backup")


def _refuses_export(stack, where: str) -> None:
    """After an interrupt, `vstack export` must refuse, or (when the interrupted
    command had in fact finished) keep every patch: never write a partial work
    branch over patches/ (issue 21, case 4). The recovery then starts from what the
    interrupt left: what export may change is saved and put back."""
    keep = stack.root.parent / "export-check"
    shutil.rmtree(keep, ignore_errors=True)
    for rel in _EXPORT_WRITES:
        src = stack.root / rel
        if src.is_dir():
            shutil.copytree(src, keep / rel)
        elif src.is_file():
            (keep / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, keep / rel)
    try:
        # what any vstack command does first: finish a decided change
        journal.recover(stack.root, stack.root / ".vstack")
        before = files_under(stack.root / "patches")
        rc = vstack_main(["--root", str(stack.root), "export"])
        after = files_under(stack.root / "patches")
        if rc != 0:
            assert after == before, f"{where}: a refused export changed patches/"
        else:
            assert _series(after) == _series(before), f"{where}: export lost patches"
            assert set(after) >= set(before), f"{where}: export removed files"
    finally:
        for rel in _EXPORT_WRITES:
            dst = stack.root / rel
            shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(
                missing_ok=True
            )
            if (keep / rel).is_dir():
                shutil.copytree(keep / rel, dst)
            elif (keep / rel).is_file():
                shutil.copy2(keep / rel, dst)


# ---------------------------------------------------------------- apply, export


def _three_patches(stack) -> list[str]:
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    stack.commit_on_work(
        "vllm/config.py",
        "A = 1\nB = 20\nC = 3\n",
        "[EPLB] Tune B\n\nB must be twenty." + SIGNED,
    )
    stack.commit_on_work("vllm/new.py", "X = 1\n", "[EPLB] New module\n\nA module of its own." + SIGNED)  # fmt: skip
    assert stack.run("export") == 0
    return [
        ln for ln in (stack.root / "patches/series").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]  # fmt: skip


def _pulled(stack) -> None:
    """patches/ as a pull leaves it: a colleague changed the last patch (exported
    by vstack, so that export after apply is a no-op)."""
    _three_patches(stack)
    v1 = files_under(stack.root / "patches")
    stack.commit_on_work("vllm/new.py", "X = 2\n", "tmp")
    git(stack.repo, "reset", "-q", "--soft", "HEAD~2")
    git(
        stack.repo,
        "commit",
        "-q",
        "-m",
        "[EPLB] New module\n\nA module of its own." + SIGNED,
    )
    assert stack.run("export") == 0
    v2 = files_under(stack.root / "patches")
    assert v2 != v1
    for name, data in v1.items():
        (stack.root / "patches" / name).write_bytes(data)
    assert stack.run("apply") == 0  # the branch as it was before the pull
    for name, data in v2.items():
        (stack.root / "patches" / name).write_bytes(data)


def test_apply_interrupted_anywhere_is_finished_by_rerunning_it(stack, harness):
    harness(Scenario(
        "apply", _pulled, ["apply"],
        recover=lambda st: _until_ok(st, ["apply"]),
        outputs=_outputs, after_kill=_refuses_export,
    ))  # fmt: skip


def _stopped_apply(stack) -> None:
    names = _three_patches(stack)
    bad = stack.root / "patches" / names[0]
    bad.write_text(bad.read_text().replace(" line 4\n", " line FOUR\n"))
    assert stack.run("apply") == 1
    state = stack.repo / "vllm/distributed/eplb/state.py"
    state.write_text(state.read_text().replace("line 5\n", "line five\n"))


def _continue_apply(stack) -> None:
    journal = stack.root / ".vstack/apply.json"
    for _ in range(3):
        if not journal.exists():
            return
        vstack_main(["--root", str(stack.root), "apply", "--continue"])
    raise AssertionError("`vstack apply --continue` did not finish the series")


def test_apply_continue_interrupted_anywhere_resumes(stack, harness):
    harness(Scenario(
        "apply --continue", _stopped_apply, ["apply", "--continue"],
        recover=_continue_apply,
        outputs=_outputs, after_kill=_refuses_export,
    ))  # fmt: skip


def _to_export(stack) -> None:
    _three_patches(stack)
    stack.commit_on_work(
        "vllm/distributed/eplb/state.py",
        (stack.repo / "vllm/distributed/eplb/state.py").read_text() + "line 41\n",
        "[EPLB] One more line\n\nThe state needs it." + SIGNED,
    )
    (stack.root / "patches/notes-unlisted.patch").write_text("not the series'\n")


def test_export_interrupted_anywhere_is_finished_by_rerunning_it(stack, harness):
    harness(Scenario(
        "export", _to_export, ["export"],
        recover=lambda st: _until_ok(st, ["export"]), outputs=_outputs,
    ))  # fmt: skip


def _until_ok(stack, args: list[str], tries: int = 3) -> None:
    for _ in range(tries):
        if vstack_main(["--root", str(stack.root), *args]) == 0:
            return
    raise AssertionError(f"`vstack {' '.join(args)}` did not succeed again")


# ---------------------------------------------------------------- rebase


def _c_resolved(stack) -> None:
    (stack.repo / "vllm/c.py").write_text(
        numbered_lines({20: "line 20 upstream and ours"})
    )


def _rebase_stack(stack) -> Path:
    """Three one-line patches on a 1.0.0 wheel (a project in git), and a 1.1.0 wheel
    (returned) on which they rebase as: a.py clean, c.py conflict (resolved or
    skipped), e.py offset. The series' preimages are cached in .vstack (as after
    any build), so the points counted are the rebase's own."""
    new = make_wheel(
        stack.cache / "vllm-1.1.0-cp38-abi3-manylinux_2_28_x86_64.whl", version="1.1.0",
        commit="gdef5678", files={
            "vllm/a.py": numbered_lines().encode(),
            "vllm/c.py": numbered_lines({20: "line 20 upstream"}).encode(),
            "vllm/e.py": numbered_lines(insert_top=5).encode(),
        },
    )  # fmt: skip
    old = make_wheel(
        stack.wheel, files={f"vllm/{x}.py": numbered_lines().encode() for x in "ace"}
    )
    toml = stack.root / "stack.toml"
    pinned = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(pinned, sha256(old)))
    assert stack.run("apply") == 0
    for x, n in (("a", 5), ("c", 20), ("e", 40)):
        stack.commit_on_work(
            f"vllm/{x}.py", numbered_lines({n: f"line {n} ours"}),
            f"[EPLB] Edit {x}\n\nOur change to {x} exists for testing." + SIGNED,
        )  # fmt: skip
    assert stack.run("export") == 0
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")
    project = load_project(stack.root)
    applied_tip(project, ensure_base(project), series_paths(project.patches_dir))
    return new


def _drive_rebase(stack, target: Path, on_conflict) -> None:
    """What a user does until the rebase is through: rerun it when it never began,
    --continue after an interrupt, and at the stop at eplb-edit-c.patch, resolve
    it (or --skip it)."""
    run = lambda *a: vstack_main(["--root", str(stack.root), *a])  # noqa: E731
    state = stack.root / ".vstack/rebase/state.json"
    for _ in range(8):
        if not state.is_file():
            if 'version = "1.1.0"' in (stack.root / "stack.toml").read_text():
                return
            run("rebase", "--onto", str(target))
            continue
        d = json.loads(state.read_text())
        last = d["results"][-1] if len(d["results"]) == d["next"] + 1 else None
        if last and last["status"] == "conflict":
            on_conflict(stack, run)
        else:
            run("rebase", "--continue")
    raise AssertionError("the rebase did not finish")


def _resolve(stack, run) -> None:
    _c_resolved(stack)
    run("rebase", "--continue")


def _skip(stack, run) -> None:
    run("rebase", "--skip", "--reason", "upstream's line 20 does it")


def _rebase_scenario(name, command, on_conflict, stopped: bool) -> Scenario:
    target = {}

    def setup(stack):
        target["wheel"] = _rebase_stack(stack)
        if stopped:
            assert stack.run("rebase", "--onto", str(target["wheel"])) == 1
            if on_conflict is _resolve:
                _c_resolved(stack)

    cmd = [a if a != "TARGET" else None for a in command]

    def go(stack, _args):
        args = [str(target["wheel"]) if a is None else a for a in cmd]
        return vstack_main(["--root", str(stack.root), *args])

    return Scenario(
        name, setup, command,
        recover=lambda st: _drive_rebase(st, target["wheel"], on_conflict),
        outputs=_outputs, after_kill=_refuses_export, run=go,
    )  # fmt: skip


def test_rebase_interrupted_anywhere_continues_to_the_same_result(stack, harness):
    harness(_rebase_scenario("rebase", ["rebase", "--onto", "TARGET"], _resolve, False))


def test_rebase_continue_interrupted_anywhere(stack, harness):
    harness(
        _rebase_scenario("rebase --continue", ["rebase", "--continue"], _resolve, True)
    )


def test_rebase_skip_interrupted_anywhere(stack, harness):
    harness(
        _rebase_scenario(
            "rebase --skip",
            ["rebase", "--skip", "--reason", "upstream's line 20 does it"],
            _skip,
            True,
        )
    )


def _abort_until_gone(stack) -> None:
    state = stack.root / ".vstack/rebase/state.json"
    for _ in range(3):
        if not state.is_file():
            return
        vstack_main(["--root", str(stack.root), "rebase", "--abort"])
    raise AssertionError("--abort did not end the rebase")


@pytest.mark.parametrize(
    "command", [["rebase", "--onto", "TARGET"], ["rebase", "--continue"]]
)
def test_rebase_interrupted_anywhere_then_aborted_puts_everything_back(
    stack, harness, command
):
    """The other way out of an interrupted rebase (before it stopped, or while its
    finish was writing patches/ and stack.toml): --abort, and all is as before."""
    target = {}

    def setup(st):
        target["wheel"] = _rebase_stack(st)
        target["before"] = _outputs(st, report=False)
        if command[1] == "--continue":
            assert st.run("rebase", "--onto", str(target["wheel"])) == 1
            _c_resolved(st)

    def go(st, _args):
        args = [str(target["wheel"]) if a == "TARGET" else a for a in command]
        return vstack_main(["--root", str(st.root), *args])

    def recover(st):
        if (st.root / ".vstack/rebase/state.json").is_file():
            _abort_until_gone(st)
        elif 'version = "1.1.0"' in (st.root / "stack.toml").read_text():
            # it had finished: the rebase is in git's hands now (git checkout)
            git(st.root, "checkout", "-q", "HEAD", "--", "patches", "stack.toml")
            git(st.root, "clean", "-q", "-fd", "--", "resolutions")
            assert st.run("apply", "--force") == 0

    def outputs(st):
        out = _outputs(st, report=False)
        out.pop("work")  # after a finished rebase, apply --force rebuilt it
        out.pop("synced.json")
        want = dict(target["before"])
        want.pop("work")
        want.pop("synced.json")
        assert out == want, "--abort did not put everything back"
        return out

    name = f"{' '.join(command[:2]).replace('TARGET', '')}, then --abort"
    harness(Scenario(name, setup, command, recover, outputs, run=go))


def test_rebase_abort_interrupted_anywhere(stack, harness):
    target = {}

    def setup(st):
        target["wheel"] = _rebase_stack(st)
        target["before"] = _outputs(st, report=False)
        assert st.run("rebase", "--onto", str(target["wheel"])) == 1

    def outputs(st):
        out = _outputs(st, report=False)
        assert out == target["before"], "--abort did not put everything back"
        return out

    harness(Scenario(
        "rebase --abort", setup, ["rebase", "--abort"],
        recover=_abort_until_gone, outputs=outputs,
    ))  # fmt: skip


# ---------------------------------------------------------------- build, pin --submodule


def test_build_interrupted_anywhere_is_finished_by_rerunning_it(stack, harness):
    def setup(st):
        assert st.run("apply") == 0
        st.commit_state_edit()
        assert st.run("export") == 0

    def outputs(st):
        dist = files_under(st.root / "dist")
        info = json.loads(dist["build.json"])
        info.pop("seconds")  # how long it took: the one thing that differs
        dist["build.json"] = json.dumps(info, sort_keys=True).encode()
        return {
            **_outputs(st, report=False),
            **{f"dist/{k}": v for k, v in dist.items()},
        }

    harness(Scenario(
        "build", setup, ["build"],
        recover=lambda st: _until_ok(st, ["build"]), outputs=outputs,
    ))  # fmt: skip


def test_pin_submodule_interrupted_anywhere(stack, harness, tmp_path):
    up = tmp_path / "upstream"
    (up / "vllm").mkdir(parents=True)
    (up / "vllm/config.py").write_text("A = 1\n")
    git(up, "init", "-q")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "release")
    git(up, "tag", "v1.0.0")
    sha = git(up, "rev-parse", "HEAD").strip()

    def setup(st):
        toml = st.root / "stack.toml"
        toml.write_text(toml.read_text().replace("gabc1234", "g" + sha[:9]))
        (st.root / ".gitmodules").write_text(
            f'[submodule "vllm"]\n\tpath = vllm\n\turl = {up}\n'
        )
        (st.root / ".gitignore").write_text("/.vstack/\n")
        git(st.root, "init", "-q")
        git(st.root, "add", "-A")
        git(st.root, "commit", "-q", "-m", "stack")

    def outputs(st):
        out = _outputs(st, report=False)
        assert f"160000 {sha} 0\tvllm" in out["git index"].decode()
        out["vllm/"] = str((st.root / "vllm").is_dir()).encode()
        return out

    harness(Scenario(
        "pin --submodule", setup, ["pin", "--submodule"],
        recover=lambda st: _until_ok(st, ["pin", "--submodule"]), outputs=outputs,
    ))  # fmt: skip


# ---------------------------------------------------------------- scripts/drift


def _load_drift():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(
        "drift_script", str(ROOT / "scripts/drift")
    )
    spec = importlib.util.spec_from_loader("drift_script", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.fixture
def index_server(tmp_path):
    """A per-commit wheel repository served by a child process (no thread here:
    the harness forks)."""
    folder = tmp_path / "per-commit"
    folder.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0",
         "--directory", str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = p.stdout.readline()
        port = line.split(" port ")[1].split()[0]
        yield folder, f"http://127.0.0.1:{port}"
    finally:
        p.kill()
        p.wait()


def test_drift_interrupted_anywhere_is_finished_by_rerunning_it(
    stack, harness, tmp_path, index_server
):
    folder, url = index_server
    drift = _load_drift()
    sha = "d" * 40
    version = f"1.0.1.dev1+g{sha[:9]}"

    def setup(st):
        assert st.run("apply") == 0
        st.commit_state_edit()
        assert st.run("export") == 0
        # the nightly changed line 5 too: the patch stops applying (drift FAIL),
        # which ends the run before the build (the build has its own test)
        wheel = make_wheel(
            tmp_path / "built" / f"vllm-{version}-cp38-abi3-manylinux_2_31_x86_64.whl",
            version, "g" + sha[:9],
            {"vllm/distributed/eplb/state.py": numbered_lines({5: "line 5 up"}, n=40).encode()},
        )  # fmt: skip
        per_commit_repo(folder, {sha: wheel}, sha)

    def go(st, _args):
        out = st.root / "drift-out"  # restored with the project
        sys.argv = ["drift", "--root", str(st.root), "--wheel-index", url,
                    "--out", str(out), "--python", sys.executable]  # fmt: skip
        return drift.main()

    def recover(st):
        r = run_forked(lambda: go(st, None), st.root.parent / "drift-recover.log")
        assert r.status == 1, r.log  # FAIL: the patch stops applying

    def outputs(st):
        got = files_under(st.root / "drift-out")
        for log in ("rebase.log", "build.log", "tests.log"):
            got.pop(log, None)  # timings and paths: not compared
        assert b"stops applying" in got["drift.md"]
        return got

    harness(Scenario("drift", setup, ["drift"], recover, outputs, run=go))


def test_the_harness_interrupts_where_it_says(stack, tmp_path):
    """The seam itself: the signal arrives just before the point named."""
    log = tmp_path / "log"

    def apply():
        return vstack_main(["--root", str(stack.root), "apply"])

    assert apply() == 0  # the base imported: every run below takes the same path
    full = run_forked(apply, log)
    assert full.status == 0
    k = full.points.index("write_bytes apply.json") + 1
    killed = run_forked(apply, log, k, signal.SIGKILL)
    assert killed.status == -signal.SIGKILL
    assert not (stack.root / ".vstack/apply.json").exists()  # not written
    interrupted = run_forked(apply, log, k + 1, signal.SIGINT)
    assert interrupted.status == 130
    assert interrupted.log.strip().startswith("vstack: interrupted")
    assert (stack.root / ".vstack/apply.json").exists()  # written, then stopped
