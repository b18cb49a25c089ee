"""vstack check --per-patch: every prefix of the series applies, compiles, imports and
passes the tests added so far (like `git rebase --exec` over the series)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from vstack import gitutil
from vstack.base import ensure_base
from vstack.config import Project
from vstack.errors import VstackError
from vstack.export import applied_tip
from vstack.series import series_paths

TORCH_PIN = "torch==2.13.0+cpu"  # keep in step with scripts/test


def test_env_python(project: Project) -> Path | None:
    """The interpreter of the environment scripts/test builds (same key), if it exists."""
    env = os.environ.get("VSTACK_TEST_PYTHON")
    if env:
        return Path(env)
    lock = project.root / "requirements" / "cpu-test.txt"
    if not lock.is_file():
        return None
    ver = subprocess.run(
        [os.environ.get("PYTHON", "python3.11"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    key = hashlib.sha256(
        lock.read_bytes() + f"{TORCH_PIN}\n".encode() + ver.encode()
    ).hexdigest()[:16]
    root = os.environ.get("VSTACK_VENV_ROOT") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "vstack"
        / "venvs"
    )
    py = Path(root) / f"cpu-{key}" / "bin" / "python"
    return py if py.exists() else None


def module_name(path: str) -> str | None:
    if not path.endswith(".py") or not path.startswith("vllm/"):
        return None
    mod = path[: -len(".py")].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _env(tree: Path) -> dict[str, str]:
    """The tree's vllm/ first on the path, on vLLM's CPU platform with Triton
    kernels under the interpreter (chosen before vLLM is imported), as
    scripts/test runs the series' tests."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.setdefault("TRITON_INTERPRET", "1")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclasses.dataclass
class TestRun:
    returncode: int
    summary: str  # pytest's counts, e.g. "27 passed, 3 skipped" (no timing)
    skipped: list[str]  # "path::test: reason" of each skipped test
    failed: list[str]  # node ids of failed tests
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode in (0, 5)


def run_pytest(tree: Path, tests: list[str], python: Path, stop_first: bool = True,
               timeout: float | None = None) -> TestRun:  # fmt: skip
    """pytest on `tests` in a tree holding vllm/ (see _env)."""
    t = time.perf_counter()
    # pytest's default import mode, as vLLM's CI and scripts/test run the tests: a test
    # may import a helper module beside it.
    cmd = [str(python), "-m", "pytest", "-q", "-rsf",
           "-p", "no:cacheprovider", *(["-x"] if stop_first else []), *tests]  # fmt: skip
    try:
        p = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True,
                           text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return TestRun(124, f"timed out after {timeout:.0f} s", [], [], timeout or 0)
    lines = p.stdout.strip().splitlines() or ["?"]
    summary = lines[-1].strip("= ")
    summary = re.sub(r"\s+in [\d.]+s( \([\d:]+\))?$", "", summary)
    summary = ", ".join(
        part for part in summary.split(", ") if not re.match(r"\d+ warnings?$", part)
    )
    skipped = []  # pytest -rs folds equal skips into "SKIPPED [count] where: reason"
    for ln in lines:
        m = re.match(r"^SKIPPED \[(\d+)\] (.*)$", ln)
        if m:
            skipped += [m.group(2)] * int(m.group(1))
    failed = [ln.split()[1] for ln in lines if ln.startswith("FAILED ")]
    return TestRun(p.returncode, summary, skipped, failed, time.perf_counter() - t)


def tests_at(repo: Path, rev: str, tests: list[str], python: Path,
             overlay: tuple[str, list[str]] | None = None, **kw) -> TestRun:  # fmt: skip
    """run_pytest in a temporary worktree of `rev`; `overlay` = (another rev, paths):
    those files taken from it first (a PR's tests on the base without its fix)."""
    with gitutil.temp_worktree(repo, rev, repo.parent) as tree:
        if overlay:
            gitutil.git(tree, "checkout", overlay[0], "--", *overlay[1])
        return run_pytest(tree, tests, python, **kw)


def check_prefix(
    repo: Path, prev: str, tip: str, added_tests: list[str], python: Path, log,
    stop_first: bool = True, timeout: float | None = None, runs: list | None = None,
) -> list[str]:  # fmt: skip
    """Problems of one prefix (empty when it passes). The test run, when there is
    one, is appended to `runs`."""
    changes = gitutil.tree_changes(repo, prev, tip)
    touched = [p for s, p, _ in changes if s != "D" and p.endswith(".py")]
    problems = []
    for path, data in gitutil.read_blobs(repo, tip, touched).items():
        try:
            compile(data, path, "exec")
        except SyntaxError as e:
            problems.append(f"{path}:{e.lineno}: does not compile: {e.msg}")
    if problems:
        return problems
    mods = [m for m in (module_name(p) for p in touched) if m]
    with gitutil.temp_worktree(repo, tip, repo.parent) as tree:
        if mods:
            code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            p = subprocess.run([str(python), "-c", code, *mods], cwd=tree, env=_env(tree),
                               capture_output=True, text=True)  # fmt: skip
            if p.returncode != 0:
                last = (p.stderr.strip().splitlines() or ["?"])[-1]
                problems.append(f"import of {', '.join(mods)} failed: {last}")
                return problems
            log(f"      imports ok: {', '.join(mods)}")
        if added_tests:
            run = run_pytest(tree, added_tests, python, stop_first, timeout)
            if runs is not None:
                runs.append(run)
            if not run.ok:
                problems.append(f"tests failed: {run.summary}")
            else:
                log(
                    f"      tests ({len(added_tests)} file(s), {run.seconds:.0f} s): {run.summary}"
                )
    return problems


def cmd_check(project: Project, python: str | None = None) -> int:
    py = Path(python) if python else test_env_python(project)
    if py is None or not py.exists():
        raise VstackError(
            "no test environment: run scripts/test once, or pass --python"
        )
    patches = series_paths(project.patches_dir)
    base = ensure_base(project)
    repo = project.repo
    prev = base.commit
    tests: list[str] = []
    print(f"vstack check: {len(patches)} prefix(es) with {py}")
    for i, patch in enumerate(patches, 1):
        print(f"  [{i}/{len(patches)}] {patch.name}")
        try:
            tip = applied_tip(project, base, patches[:i])
        except VstackError as e:
            print(
                f"vstack check: prefix {i} ({patch.name}) fails: {e}", file=sys.stderr
            )
            return 1
        changes = gitutil.tree_changes(repo, prev, tip)
        tests += [
            p
            for s, p, _ in changes
            if s == "A"
            and p.startswith("tests/")
            and Path(p).name.startswith("test_")
            and p.endswith(".py")
        ]
        problems = check_prefix(repo, prev, tip, tests, py, log=print)
        if problems:
            for pr in problems:
                print(f"      {pr}", file=sys.stderr)
            print(
                f"vstack check: first failing prefix: {i} ({patch.name})",
                file=sys.stderr,
            )
            return 1
        prev = tip
    print(f"vstack check: all {len(patches)} prefix(es) pass")
    return 0
