"""scripts/gpu-check on a machine without a GPU: the list, a bundle that imports
the patched vLLM from itself alone in a Python with only torch, Triton and
numpy, every check skipped with its reason and recorded in the JSON, and the
checks' own logic on CPU (--dry-run-cpu, the Triton interpreter)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vstack.config import load_project
from vstack.series import series_paths

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "src" / "vstack" / "payload" / "gpu_check.py"


def _runner_module():
    if "gpu_check_runner" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check_runner", RUNNER)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check_runner"] = module  # dataclasses look it up
        spec.loader.exec_module(module)
    return sys.modules["gpu_check_runner"]


def test_gpu_check_list_names_every_check_without_torch():
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--list"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    names = [c.name for c in _runner_module().CHECKS]
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert listed == names
    assert {"fused-mapping-graph-replay", "symm-mem-two-procs", "staging-time"} <= set(
        names
    )
    # --list imports no torch: it works in a Python that has none.
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(RUNNER), "--list"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.count("\n") == len(names)


def test_gpu_check_checks_fit_the_8_minute_budget():
    runner = _runner_module()
    assert sum(c.timeout_s for c in runner.CHECKS) <= runner.TOTAL_BUDGET_S == 480
    assert set(runner.RUNNERS) == {c.name for c in runner.CHECKS}


def test_gpu_check_bundle_never_replaces_a_foreign_folder(tmp_path):
    from vstack.errors import VstackError
    from vstack.gpucheck import make_bundle

    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(VstackError, match="not a gpu-check bundle"):
        make_bundle(load_project(ROOT), keep, log=lambda s: None)
    assert (keep / "notes.txt").read_text() == "mine"


# --- a real bundle -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs the CPU test environment (scripts/test)")
    project = load_project(ROOT)
    if not (project.wheel_cache / project.pin.wheel).is_file() and os.environ.get(
        "VSTACK_OFFLINE"
    ):
        pytest.skip("VSTACK_OFFLINE and the pinned wheel is not cached")
    from vstack.gpucheck import make_bundle

    out = tmp_path_factory.mktemp("gpu-check") / "bundle"
    manifest = make_bundle(project, out, log=lambda s: None)
    return out, manifest


def _torch_only_site(dest: Path) -> Path:
    """A folder with torch, Triton and numpy and what they require (links to
    the test environment's copies), nothing else: a bare GPU image."""
    dest.mkdir()
    todo, seen = ["torch", "triton", "numpy"], set()
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(name)
        for req in dist.requires or []:
            if "extra ==" not in req and "python_version" not in req:
                todo.append(re.split(r"[ <>=!;\[(~]", req, maxsplit=1)[0])
        tops = {str(f).split("/")[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    return dest


@pytest.mark.real_wheel
@pytest.mark.venv
def test_gpu_check_bundle_imports_with_torch_only(bundle, tmp_path):
    out, manifest = bundle
    series = series_paths(ROOT / "patches")
    assert manifest["source"]["patches"] == [p.name for p in series]
    site = _torch_only_site(tmp_path / "site")
    assert not (site / "vllm").exists() and not (site / "pydantic").exists()
    results = tmp_path / "results.json"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_"))
    }
    env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(out / "gpu_check.py"), f"--site={site}",
         "--out", str(results)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    data = json.loads(results.read_text())
    imports = data["imports"]
    assert imports["status"] == "pass", imports.get("reason")
    assert imports["vllm_file"].startswith(str(out / "vllm.zip"))
    assert all(f.startswith(str(out / "vllm.zip")) for f in imports["modules"].values())
    # What stood in for missing packages is listed, and only allowed names.
    assert "pydantic" in imports["stand_ins"]
    assert set(imports["stand_ins"]) <= set(manifest["stand_ins"]) | set(
        manifest["extensions"]
    )
    assert set(data["checks"]) == {c.name for c in _runner_module().CHECKS}
    import torch

    if not torch.cuda.is_available():
        assert proc.returncode == 0, proc.stderr[-3000:]
        for name, rec in data["checks"].items():
            assert rec["status"] == "skip", (name, rec)
            assert "no CUDA GPU" in rec["reason"], (name, rec)


@pytest.mark.real_wheel
@pytest.mark.venv
def test_gpu_check_dry_run_cpu_runs_the_checks_logic(bundle, tmp_path):
    """The CPU sibling of the GPU checks: the same code on CPU tensors under
    the Triton interpreter (no CUDA graph, timing or symmetric memory)."""
    out, _ = bundle
    results = tmp_path / "dry.json"
    only = ["fused-mapping-graph-replay", "staging-fp8-bytes",
            "index-copy-select-dtypes", "async-apply-no-sync"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-I", str(out / "gpu_check.py"), "--dry-run-cpu",
         "--out", str(results), "--only", *only],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    data = json.loads(results.read_text())
    statuses = {n: r["status"] for n, r in data["checks"].items()}
    assert proc.returncode == 0 and set(statuses.values()) == {"pass"}, (
        statuses,
        {n: r.get("reason") for n, r in data["checks"].items()},
    )
    # The series' staged apply, not stock's _move_to_workspace.
    assert data["checks"]["async-apply-no-sync"]["details"]["apply"] == (
        "_apply_staged_layer"
    )
    replay = data["checks"]["fused-mapping-graph-replay"]["details"]
    assert {k.split("/")[0] for k in replay} == {"mxfp8", "nvfp4"}
    for variant in ("mxfp8", "bf16", "nvfp4"):
        fp8 = data["checks"]["staging-fp8-bytes"]["details"][variant]
        assert all(fp8["identical"].values()) and fp8["ids_mapped"]


@pytest.mark.real_wheel
@pytest.mark.venv
def test_gpu_check_command_writes_results_file(bundle, tmp_path):
    out = tmp_path / "gpu-check-x.json"
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--python", sys.executable,
         "--only", "index-copy-select-dtypes", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    import torch

    data = json.loads(out.read_text())
    assert set(data["checks"]) == {"index-copy-select-dtypes"}
    if not torch.cuda.is_available():
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert data["checks"]["index-copy-select-dtypes"]["status"] == "skip"
        assert "skip     index-copy-select-dtypes: no CUDA GPU" in proc.stdout
