"""AOT compile tests: every Triton kernel the series adds or changes compiles for
sm_90a and sm_100a, in the variants vLLM's launch wrappers produce, with no
spills, no stack frame of its own, and registers within budget of the stock
kernel of the pinned base compiled in the same run.

What to compile comes from the series itself (aot_support.series_kernels: the
jit functions that differ between the installed patched vLLM and the pinned
wheel, and the kernels that call them) and from launching vLLM's own wrappers
(aot_drivers, aot_worker). The table is printed (pytest -s); `VSTACK_AOT_RECORD=1` also writes it to
benchmarks/results/aot-registers.json. `VSTACK_AOT_FULL=1` compiles the full
product of the variant axes instead of the all-pairs sample.

Budget (aot_support.register_budget): patched registers <= max(stock + 8, 32).
8 registers per thread is one ptxas allocation step (registers are allocated
per warp in units of 256); up to 32 registers per thread, registers cannot limit
occupancy on sm_90/sm_100 (65536 registers per SM for at most 2048 threads), so
a count in that range costs nothing whatever stock uses. The stock side is the
same variant with EPLB off, or with the stock replica rule ("hash") where the
patched variant has EPLB on with any rule.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aot_drivers import sample, stock_key, variant_key
from aot_support import (
    compare,
    format_table,
    problems,
    register_budget,
    run_workers,
    series_kernels,
    stock_sources,
)
from aot_worker import parse_ptxas

from vstack.config import load_project

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "aot-registers.json"

# --- the real matrix -------------------------------------------------------------


def _installed_vllm() -> Path:
    """The folder holding the installed vllm/ (not a vllm/ checkout in cwd)."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs the CPU test environment (scripts/test)")
    return Path(dist.locate_file("vllm")).parent


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    for mod in ("torch", "triton"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"needs {mod} (the CPU test environment, scripts/test)")
    project = load_project(ROOT)
    pin = project.pin
    site = _installed_vllm()
    version = importlib.metadata.version("vllm")
    if version.split("+")[0] != pin.version:
        pytest.skip(
            f"installed vLLM {version} is not a build of the pinned {pin.version}"
        )
    wheel = project.wheel_cache / pin.wheel
    if not wheel.is_file():
        if os.environ.get("VSTACK_OFFLINE"):
            pytest.skip("VSTACK_OFFLINE and the pinned wheel is not cached")
        from vstack.fetch import fetch_wheel

        wheel = fetch_wheel(pin.version, project.wheel_cache, pin.wheel, pin.sha256)
    stock = stock_sources(wheel, pin.sha256, project.wheel_cache.parent / "aot-src")
    kernels = series_kernels(stock, site)
    if not kernels:
        pytest.skip(f"the series changes no Triton kernel of vLLM {pin.version}")
    out = tmp_path_factory.mktemp("aot")
    full = os.environ.get("VSTACK_AOT_FULL") == "1"
    results = run_workers(stock, out, full=full)
    rows = compare(results["patched"], results["stock"])
    table = format_table(rows)
    print(f"\nAOT registers, vLLM {version} vs stock {pin.version}, "
          f"triton {results['patched']['triton']}:\n{table}")  # fmt: skip
    # A test run leaves the checkout as it found it: the recorded table is
    # rewritten only on request.
    results_file = RESULTS if os.environ.get("VSTACK_AOT_RECORD") == "1" else (
        out / RESULTS.name)  # fmt: skip
    results_file.write_text(json.dumps({
        "what": "ptxas -v figures of the Triton kernels the series adds or changes, "
        "per launch variant, patched vs stock (tests/test_aot_kernels.py)",
        "vllm": version, "base": pin.version, "triton": results["patched"]["triton"],
        "sampling": "full" if full else "all-pairs",
        "budget": "patched regs <= max(stock regs + 8, 32); no spills; "
        "no stack frame beyond the stock equivalent's",
        "kernels": kernels,
        "compiles": {s: r["compiles"] for s, r in results.items()},
        "seconds": {s: r["total_s"] for s, r in results.items()},
        "rows": [{k: v for k, v in r.items() if k != "compile_s"} for r in rows],
    }, indent=1) + "\n")  # fmt: skip
    return {"kernels": kernels, "results": results, "rows": rows}


@pytest.mark.real_wheel
@pytest.mark.venv
def test_aot_every_series_kernel_is_launched_by_a_driver(aot):
    launched = {r["kernel"] for r in aot["results"]["patched"]["records"]}
    missing = {k: why for k, why in aot["kernels"].items() if k not in launched}
    assert not missing, (
        "the series adds or changes these Triton kernels, but no driver in "
        f"tests/aot_drivers.py launches them: {missing}"
    )


@pytest.mark.real_wheel
@pytest.mark.venv
def test_aot_both_sides_compiled_the_intended_vllm(aot):
    patched, stock = aot["results"]["patched"], aot["results"]["stock"]
    assert Path(patched["vllm_file"]).parent.parent == _installed_vllm()
    assert "aot-src" in stock["vllm_file"]
    assert {r["arch"] for r in patched["records"]} == {90, 100}
    # Every patched variant with a stock kernel of the same name has its
    # stock equivalent compiled (the comparison is not vacuous).
    stock_kernels = {r["kernel"] for r in stock["records"]}
    rows = [r for r in aot["rows"] if f"{r['module']}:{r['kernel']}" in stock_kernels]
    assert rows and all(r["stock_regs"] is not None for r in rows if not r["error"])


@pytest.mark.real_wheel
@pytest.mark.venv
def test_aot_kernels_compile_without_spills_or_stack_within_budget(aot):
    bad = problems(aot["rows"])
    assert not bad, "\n".join(bad)


# --- the pieces, on synthetic input ----------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


HELPER = '''
from vllm.triton_utils import tl, triton

SCALE = 2

@triton.jit
def helper(x):
    """Doc."""
    return x * SCALE
'''
KERNELS = """
from vllm.triton_utils import tl, triton
from vllm.ops.helper import helper
import vllm.ops.helper as h

@triton.jit(do_not_specialize=["n"])
def uses_helper(ptr, n, BLOCK: tl.constexpr):
    tl.store(ptr, helper(tl.load(ptr)))

@triton.jit
def uses_module_attr(ptr):
    tl.store(ptr, h.helper(tl.load(ptr)))

@triton.jit
def unrelated(ptr):
    tl.store(ptr, 1)
"""


def test_aot_series_kernels_follow_changed_device_functions(tmp_path):
    stock = _tree(tmp_path / "stock", {
        "vllm/ops/helper.py": HELPER, "vllm/ops/kernels.py": KERNELS,
    })  # fmt: skip
    same = _tree(tmp_path / "same", {
        "vllm/ops/helper.py": HELPER.replace('"""Doc."""', '"""Other doc."""'),
        "vllm/ops/kernels.py": KERNELS,
    })  # fmt: skip
    assert series_kernels(stock, same) == {}
    changed = _tree(tmp_path / "changed", {
        "vllm/ops/helper.py": HELPER.replace("x * SCALE", "x * SCALE + 1"),
        "vllm/ops/kernels.py": KERNELS,
    })  # fmt: skip
    got = series_kernels(stock, changed)
    assert set(got) == {
        "vllm.ops.kernels:uses_helper",
        "vllm.ops.kernels:uses_module_attr",
    }
    assert "vllm.ops.helper:helper" in got["vllm.ops.kernels:uses_helper"]
    glob = _tree(tmp_path / "global", {
        "vllm/ops/helper.py": HELPER.replace("SCALE = 2", "SCALE = 3"),
        "vllm/ops/kernels.py": KERNELS,
    })  # fmt: skip
    assert "SCALE" in series_kernels(stock, glob)["vllm.ops.kernels:uses_helper"]
    decorated = _tree(tmp_path / "decorated", {
        "vllm/ops/helper.py": HELPER,
        "vllm/ops/kernels.py": KERNELS.replace('do_not_specialize=["n"]', ""),
    })  # fmt: skip
    assert set(series_kernels(stock, decorated)) == {"vllm.ops.kernels:uses_helper"}
    added = _tree(tmp_path / "added", {
        "vllm/ops/helper.py": HELPER,
        "vllm/ops/kernels.py": KERNELS,
        "vllm/ops/new.py": "from vllm.triton_utils import tl, triton\n\n"
        "if True:\n    @triton.jit\n    def fresh(p):\n        pass\n",
    })  # fmt: skip
    assert series_kernels(stock, added) == {"vllm.ops.new:fresh": "added by the series"}


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    {stack} bytes stack frame, {st} bytes spill stores, {ld} bytes spill loads
ptxas info    : Used {regs} registers, used 1 barriers
"""


def test_aot_ptxas_figures_and_problems():
    got = parse_ptxas(PTXAS.format(stack=8, st=4, ld=12, regs=90), "k")
    assert got == {"regs": 90, "stack": 8, "spill_stores": 4, "spill_loads": 12}
    with pytest.raises(ValueError):
        parse_ptxas(PTXAS.format(stack=0, st=0, ld=0, regs=9), "other")
    assert register_budget(10) == 32 and register_budget(36) == 44

    def rec(key, regs, stack=0, spills=0, error=None):
        return {"kernel": "m:k", "driver": "d", "arch": 90, "key": key,
                "stock_key": key.replace("rank_hash", "hash"), "regs": regs,
                "stack": stack, "spill_stores": spills, "spill_loads": 0,
                "error": error, "compile_s": 0.1}  # fmt: skip

    stock = {"records": [rec("eplb=off", 36), rec("eplb=hash", 36, stack=8)]}
    ok = {"records": [rec("eplb=off", 44), rec("eplb=rank_hash", 30, stack=8)]}
    assert problems(compare(ok, stock)) == []
    for bad, what in [
        (rec("eplb=off", 45), "45 registers, budget 44"),
        (rec("eplb=off", 20, stack=16), "16 bytes stack frame"),
        (rec("eplb=off", 20, spills=4), "4 bytes of register spills"),
        (rec("eplb=off", None, error="CompilationError: x"), "does not compile"),
    ]:
        found = problems(compare({"records": [bad]}, stock))
        assert len(found) == 1 and what in found[0], found


def test_aot_sample_covers_every_pair_and_maps_rules_to_stock():
    axes = {"a": [1, 2, 3], "b": ["x", "y"], "c": [0, 1], "eplb": ["off", "hash", "r"]}
    got = sample(axes, lambda v: not (v["a"] == 3 and v["b"] == "y"), full=False)
    full = sample(axes, lambda v: not (v["a"] == 3 and v["b"] == "y"), full=True)
    assert len(got) < len(full) == 30
    names = list(axes)
    for v in full:
        for i, p in enumerate(names):
            for q in names[i + 1 :]:
                assert any(g[p] == v[p] and g[q] == v[q] for g in got), (p, q, v)
    assert got[0] == {"a": 1, "b": "x", "c": 0, "eplb": "off"}
    assert stock_key({"eplb": "r", "tokens": 4}) == variant_key(
        {"tokens": 4, "eplb": "hash"}
    )


def test_aot_worker_refuses_the_interpreter(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "aot_worker.py"), "--side", "patched",
         "--out", str(tmp_path / "x.json")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "TRITON_INTERPRET" in proc.stderr
