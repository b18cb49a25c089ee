"""vstack check --per-patch: every prefix of the series applies, compiles, imports and
passes the tests added so far (like `git rebase --exec` over the series)."""

from __future__ import annotations

import hashlib
import os
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
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_prefix(
    repo: Path, prev: str, tip: str, added_tests: list[str], python: Path, log
) -> list[str]:
    """Problems of one prefix (empty when it passes)."""
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
            t = time.perf_counter()
            # pytest's default import mode, as scripts/test and vLLM's CI run
            # them: a test imports the helpers beside it by name.
            p = subprocess.run(
                [str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                 *added_tests],
                cwd=tree, env=_env(tree), capture_output=True, text=True,
            )  # fmt: skip
            lines = p.stdout.strip().splitlines()
            summary = (lines or ["?"])[-1]
            if p.returncode not in (0, 5):
                first_error = next((ln for ln in lines if ln.startswith("E ")), "")
                problems.append(f"tests failed: {summary} {first_error.strip()}")
            else:
                log(
                    f"      tests ({len(added_tests)} file(s), {time.perf_counter() - t:.0f} s): {summary}"
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
