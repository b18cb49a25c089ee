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


# Issue 20, item 7.
NEW_CHECKS = ("logical-load-nccl-contract", "byte-view-index-copy",
              "staged-apply-delayed-stream", "graph-follows-staged-apply")  # fmt: skip


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
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    listed = [line.split()[0] for line in lines]
    # The one-GPU checks, then the several-GPU mode.
    assert listed == [*names, "--multi"]
    assert {"fused-mapping-graph-replay", "symm-mem-two-procs", "staging-time"} <= set(
        names
    )
    assert set(NEW_CHECKS) <= set(names)
    assert "needs >= 2 GPUs" in lines[-1] and "scripts/gpu-check --multi" in lines[-1]
    # --list imports no torch: it works in a Python that has none.
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(RUNNER), "--list"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.count("\n") == len(names) + 1


def test_gpu_check_checks_fit_the_8_minute_budget():
    runner = _runner_module()
    assert sum(c.timeout_s for c in runner.CHECKS) <= runner.TOTAL_BUDGET_S == 480
    assert set(runner.RUNNERS) == {c.name for c in runner.CHECKS}


def _no_two_gpus() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return torch.cuda.device_count() < 2


@pytest.mark.venv
def test_gpu_check_multi_refuses_without_two_gpus_in_one_line():
    """--multi on a machine with < 2 GPUs: exit 2 and one line that says so,
    from the runner and from scripts/gpu-check before it builds anything."""
    if importlib.util.find_spec("torch") is None or not _no_two_gpus():
        pytest.skip("needs the CPU test environment on a machine with < 2 GPUs")
    want = "gpu-check --multi: needs >= 2 GPUs; this machine has "
    for cmd in (
        [sys.executable, str(RUNNER), "--multi"],
        [str(ROOT / "scripts" / "gpu-check"), "--multi", "--python", sys.executable],
        [sys.executable, str(RUNNER), "--multi", "--gpus", "2"],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (cmd, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(want.split(";")[0]), lines
        assert "this machine has" in lines[0] and not proc.stdout.strip(), proc.stdout
    # A Python without torch: the same one line, naming the reason.
    proc = subprocess.run([sys.executable, "-I", "-S", str(RUNNER), "--multi"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot import torch" in lines[0]


def test_gpu_check_multi_judges_every_rank():
    """The --multi verdicts from the ranks' results (no torch needed): a rank
    with another placement fails, a missing rank is a hang, a skip stays one."""
    judge = _runner_module()._judge
    cfg = {"layers": 2}
    ok = {"applied": [[[0], [1]], [[0], [1]]], "placements": [[[0, 1]], [[0, 1]]],
          "differ_from_sync": [], "rearranged": True}  # fmt: skip
    assert judge("equivalence", cfg, [("ok", ok), ("ok", ok)])["status"] == "pass"
    split = {**ok, "placements": [[[0, 1]], [[1, 0]]]}
    rec = judge("equivalence", cfg, [("ok", split), ("ok", split)])
    assert rec["status"] == "fail" and "different placements" in rec["reason"]
    late = {**ok, "applied": [[[0], [1]], [[0], [], [1]]]}
    rec = judge("equivalence", cfg, [("ok", late), ("ok", late)])
    assert rec["status"] == "fail" and "different steps" in rec["reason"]
    rec = judge("equivalence", cfg, [("ok", {**ok, "differ_from_sync": ["layer 1"]}),
                                     ("ok", ok)])  # fmt: skip
    assert rec["status"] == "fail" and "async differs from sync" in rec["reason"]
    rec = judge("equivalence", cfg, [("ok", ok), ("missing", "no result (hang?)")])
    assert rec["status"] == "timeout" and rec["reason"].startswith("rank 1")
    skip = {"skip": "NIXL is not importable here"}
    assert judge("ft-failure", cfg, [("ok", skip)] * 2)["status"] == "skip"
    ft = {"first": [[[0]], [[0]]], "second": [[[]], [[]]], "paused": True,
          "placements": ok["placements"], "worker_alive": True}  # fmt: skip
    assert judge("ft-failure", cfg, [("ok", ft)] * 2)["status"] == "pass"
    rec = judge("ft-failure", cfg, [("ok", ft), ("ok", {**ft, "paused": False})])
    assert rec["status"] == "fail" and "did not pause" in rec["reason"]
    rec = judge("ft-failure", cfg, [("ok", ft), ("ok", {**ft, "worker_alive": False})])
    assert rec["status"] == "fail" and "worker died" in rec["reason"]
    itl = {"steady": [0.001] * 10, "migration": [0.001] * 9 + [0.004]}
    rec = judge("itl", cfg, [("ok", itl)] * 2)
    assert rec["details"]["p99_migration_over_steady"] == 4.0


def test_gpu_check_bundle_never_replaces_a_foreign_folder(tmp_path):
    from vstack.errors import VstackError
    from vstack.gpucheck import make_bundle

    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(VstackError, match="was not made by vstack gpu-check --bundle"):
        make_bundle(load_project(ROOT), keep, log=lambda s: None)
    assert (keep / "notes.txt").read_text() == "mine"


def test_gpu_check_bundle_never_replaces_a_folder_it_did_not_make(tmp_path):
    """A folder holding a manifest.json (anyone's) was rmtree'd: only a folder with
    the .vstack-out marker (as build --out) is replaced."""
    from vstack.errors import VstackError
    from vstack.gpucheck import make_bundle

    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "manifest.json").write_text("{}")
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(VstackError, match="no .vstack-out in it"):
        make_bundle(load_project(ROOT), keep, log=lambda s: None)
    assert (keep / "notes.txt").read_text() == "mine"
    assert (keep / "manifest.json").read_text() == "{}"


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
            "index-copy-select-dtypes", "async-apply-no-sync",
            "async-decision-path"]  # fmt: skip
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
    # Issue 27: the DP sync's provider hands the table to decide(): the peer's
    # one staged layer bounds the first step, the cycle ends, a failure names
    # the peer (the check fails, and with it this test, otherwise).
    decision = data["checks"]["async-decision-path"]["details"]
    assert decision["applied_after_each_step"] == [1, 2]
    assert "EP rank(s) [1]" in decision["failure_error"]


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


def _logical_load_oracle(out: Path, runner) -> tuple[bool, list[int]]:
    """Contiguity and strides of the bundle's own _logical_expert_load on the
    check's shapes, run here from its source (the series reworks it)."""
    import ast
    import zipfile

    import torch

    source = zipfile.ZipFile(out / "vllm.zip").read(
        "vllm/distributed/eplb/eplb_state.py"
    )
    fn = next(n for n in ast.parse(source).body
              if isinstance(n, ast.FunctionDef) and n.name == "_logical_expert_load")  # fmt: skip
    space = {"torch": torch}
    exec(compile(ast.Module([fn], []), "eplb_state.py", "exec"), space)
    window = torch.ones(4, 6, runner.NUM_PHYSICAL, dtype=torch.int32)
    p2l = torch.arange(runner.NUM_PHYSICAL).remainder(runner.NUM_LOGICAL).repeat(6, 1)
    got = space["_logical_expert_load"](window, p2l, runner.NUM_LOGICAL)
    return got.is_contiguous(), list(got.stride())


@pytest.mark.real_wheel
@pytest.mark.venv
def test_gpu_check_dry_run_cpu_runs_the_issue_20_checks(bundle, tmp_path):
    """The CPU dry runs of the logical-load, byte-view, delayed-apply and
    graph checks: the series' real functions on CPU tensors."""
    out, _ = bundle
    results = tmp_path / "dry.json"
    subprocess.run(
        [sys.executable, "-I", str(out / "gpu_check.py"), "--dry-run-cpu",
         "--out", str(results), "--only", *NEW_CHECKS],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    checks = json.loads(results.read_text())["checks"]
    statuses = {n: (r["status"], r.get("reason")) for n, r in checks.items()}

    # 1. On the current series _logical_expert_load returns a strided view
    # (strides [65, 1]): NCCL would refuse it; the dry run says so and fails.
    load = checks["logical-load-nccl-contract"]
    contiguous, strides = _logical_load_oracle(out, _runner_module())
    assert load["details"]["contiguous"] is contiguous, load
    assert load["details"]["strides"] == strides
    assert load["details"]["values_match_reference"] is True
    assert load["details"]["all_reduce"] == "ok"  # gloo takes strided tensors
    if contiguous:
        assert load["status"] == "pass", load
    else:
        assert load["status"] == "fail", load
        assert "non-contiguous" in load["reason"]
        assert "Tensors must be contiguous" in load["reason"]

    # 2. Byte view, per-row copy_ and the apply's _row_views give the same bytes.
    copy = checks["byte-view-index-copy"]
    assert copy["status"] == "pass", statuses
    identical = copy["details"]["identical"]
    assert set(identical) == {"byte_view_index_copy", "per_row_copy",
                              "wide_view_index_copy"}  # fmt: skip
    assert all(len(r) == 6 and all(r.values()) for r in identical.values())
    assert copy["details"]["bytes_moved"] > 0
    # e4m3 rows of 7168 (dry run: 256) bytes move as int64 through _row_views.
    assert copy["details"]["wide_dtypes"]["w13"] == "int64"
    assert "float8_e8m0fnu" in copy["details"]["dtypes"].values()

    # 3. The worker's staging on its own thread, applied layer by layer.
    delayed = checks["staged-apply-delayed-stream"]
    assert delayed["status"] == "pass", statuses
    for slots in ("staged_layers=1", "staged_layers=2"):
        run = delayed["details"][slots]
        assert run["wrong_steps"] == 0 and len(run["steps"]) == 4
        assert all(s["rows"] > 0 and not s["problems"] for s in run["steps"])

    # 4. The (eager, on CPU) forward reads the new weights and maps.
    graph = checks["graph-follows-staged-apply"]
    assert graph["status"] == "pass", statuses
    assert graph["details"]["addresses_unchanged"] is True
    rounds = graph["details"]["rounds"]
    assert len(rounds) == 3 and {r["layer"] for r in rounds} == {0, 1}
    assert all(r["slots_changed"] and not r["problems"] for r in rounds)


@pytest.mark.real_wheel
@pytest.mark.venv
def test_gpu_check_multi_dry_run_cpu_drives_the_series_helpers(bundle, tmp_path):
    """--multi's scenarios on forked CPU gloo ranks with the series' own test
    driver from the bundle; the stock ITL run imports the stock vLLM."""
    out, manifest = bundle
    assert (
        f"tests/distributed/eplb/{'eplb_async_helpers'}.py" in manifest["series_files"]
    )
    assert (out / "vllm-stock.zip").is_file()
    results = tmp_path / "multi.json"
    only = ["equivalence/torch_gloo", "equivalence/nixl", "ft-failure/torch_gloo",
            "itl/stock"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-I", str(out / "gpu_check.py"), "--multi", "--dry-run-cpu",
         "--out", str(results), "--only", *only],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    data = json.loads(results.read_text())
    scenarios = data["scenarios"]
    assert list(scenarios) == only
    assert proc.returncode == 0, (proc.stderr[-3000:], scenarios)
    assert scenarios["equivalence/nixl"]["status"] == "skip"
    assert "needs CUDA" in scenarios["equivalence/nixl"]["reason"]
    equivalence = scenarios["equivalence/torch_gloo"]
    assert equivalence["status"] == "pass", equivalence
    assert equivalence["details"]["layers_applied"] == list(range(6))
    ft = scenarios["ft-failure/torch_gloo"]
    assert ft["status"] == "pass", ft
    # Layer 2 failed on rank 1: layers 0 and 1 stay applied, the rest old.
    assert ft["details"]["first_cycle_layers"] == [0, 1]
    # Paused until FT recovery rebuilds the EPLB group: no second cycle.
    assert ft["details"]["second_cycle_layers"] == []
    itl = scenarios["itl/stock"]
    assert itl["status"] == "pass", itl
    assert itl["vllm"] == "vllm-stock.zip" and equivalence["vllm"] == "vllm.zip"
    assert itl["details"]["steady"]["n"] > 0 and itl["details"]["migration"]["n"] > 0
