"""AOT compile worker (run by test_aot_kernels.py in a subprocess, one per side).

    python tests/aot_worker.py --side patched --out result.json [--arch 90 --arch 100]

Imports the vLLM found on sys.path (the stock sources go first on PYTHONPATH
for --side stock), drives every launch wrapper in aot_drivers with CPU tensors
and, instead of launching, records what Triton would have compiled: Triton's
own specialization (signature, constexprs, alignment attributes, options) of the
real call, taken through `knobs.runtime.jit_cache_hook` with a stand-in driver
that reports the GPU target. Each distinct specialization is then compiled for
that target by `JITFunction.preload` (Triton's path for serialized
specializations) and the PTX is run through the ptxas the Triton wheel bundles
with `-v`, which gives registers, spills and stack (a compiled kernel's own
n_regs needs a driver to load it).

The environment is set by the caller and checked here: no TRITON_INTERPRET (the
interpreter replaces Triton's functions in-process), CUDA_VISIBLE_DEVICES empty
before vLLM is imported (vllm/triton_utils/importing.py then accepts a Triton
with no active driver instead of swapping in placeholders) and a fresh
TRITON_CACHE_DIR so that nothing comes from a cache.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_ptxas(log: str, kernel: str) -> dict:
    """Registers, spills and stack of `kernel` from `ptxas -v` output."""
    props = re.search(
        rf"Function properties for {re.escape(kernel)}\s*\n\s*(\d+) bytes stack frame, "
        r"(\d+) bytes spill stores, (\d+) bytes spill loads",
        log,
    )
    regs = re.search(
        rf"Compiling entry function '{re.escape(kernel)}'.*?Used (\d+) registers",
        log,
        re.S,
    )
    if not props or not regs:
        raise ValueError(f"no ptxas -v figures for {kernel} in:\n{log}")
    stack, stores, loads = map(int, props.groups())
    return {
        "regs": int(regs.group(1)),
        "stack": stack,
        "spill_stores": stores,
        "spill_loads": loads,
    }


def ptxas_stats(ptx: str, kernel: str, arch: int, fp_fusion: bool) -> dict:
    """Run the bundled ptxas as Triton's make_cubin does (same binary, the
    same -lineinfo/--regAllocOptLevel/--fmad flags), with -v."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [
            get_ptxas(arch).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
            *([] if fp_fusion else ["--fmad=false"]),
            f"--gpu-name=sm_{arch}a", str(src), "-o", str(src.with_suffix(".o")),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse_ptxas(proc.stdout + proc.stderr, kernel)


class TargetDriver:
    """The part of a Triton driver that JITFunction.run needs before it
    compiles: the target, a device index and a stream. No GPU is touched."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _use_target(arch: int, fns) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(TargetDriver(GPUTarget("cuda", arch, 32)))
    for fn in fns:  # binders and caches are per target
        fn.device_caches.clear()


def _wait_for(path: Path, timeout: float = 1800.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.5)
    return json.loads(path.read_text())


def capture(
    archs: list[int], full: bool, variants_from: Path | None, variants_out: Path | None
):
    """Drive every wrapper for every arch; return the captured launches, the
    JITFunctions launched and the replica rules. The patched side samples the
    variants (and writes them to `variants_out`); the stock side launches the
    stock equivalent of each variant in `variants_from`, which it waits for."""
    import aot_drivers
    from triton import knobs

    rules = aot_drivers.replica_rules()
    seen_fns: dict[str, object] = {}
    records: list[dict] = []
    current: list = []

    def hook(*, fn, compile, **_):
        current.append((fn.jit_function, compile["specialization_data"]))
        return True  # skip the compile: the worker compiles later, per target

    modules = [(driver, driver.load()) for driver in aot_drivers.DRIVERS]
    if variants_from is not None:
        wanted = _wait_for(variants_from)
        plan = [
            (d, mod, aot_drivers.stock_variants(d, mod, wanted.get(d.name, [])))
            for d, mod in modules
        ]
    else:
        plan = [
            (d, mod, aot_drivers.driver_variants(d, mod, rules, full))
            for d, mod in modules
        ]
    if variants_out is not None:
        tmp = variants_out.with_suffix(".tmp")
        tmp.write_text(json.dumps({d.name: v for d, _, v in plan}))
        os.replace(tmp, variants_out)

    quiet: dict[str, list] = {}  # variants that launched nothing
    knobs.runtime.jit_cache_hook = hook
    try:
        for arch in archs:
            _use_target(arch, seen_fns.values())
            for driver, mod, variants in plan:
                for variant in variants:
                    current.clear()
                    driver.launch(mod, variant)
                    key = aot_drivers.variant_key(variant)
                    if not current:
                        quiet.setdefault(driver.name, []).append(key)
                    for fn, spec in current:
                        name = f"{fn.module}:{fn.fn.__qualname__}"
                        seen_fns[name] = fn
                        records.append({
                            "kernel": name, "driver": driver.name, "arch": arch,
                            "variant": variant, "key": key,
                            "stock_key": aot_drivers.stock_key(variant),
                            "spec": spec,
                        })  # fmt: skip
    finally:
        knobs.runtime.jit_cache_hook = None
    return records, quiet, seen_fns, rules


_FNS: dict = {}


def _compile_one(task: tuple[str, str, int]) -> dict:
    name, spec, arch = task
    fn = _FNS[name]
    start = time.perf_counter()
    try:
        _use_target(arch, [fn])
        kernel = fn.preload(spec)
        compiled_s = time.perf_counter() - start
        options = json.loads(spec)["options"]
        stats = ptxas_stats(
            kernel.asm["ptx"], kernel.name, arch, options["enable_fp_fusion"]
        )
        return {**stats, "compile_s": round(compiled_s, 3), "error": None}
    except Exception as e:  # reported per variant; the test fails on it
        # Triton wraps an error in a device function into one per call site:
        # report the innermost first, where the cause is.
        chain = []
        while e is not None and len(chain) < 8:
            chain.append("".join(traceback.format_exception_only(type(e), e)))
            e = e.__cause__ or e.__context__
        return {"error": "\n".join(reversed(chain))[:3000], "compile_s": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", required=True, choices=["stock", "patched"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--arch", type=int, action="append", default=[])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--full", action="store_true")
    ap.add_argument(
        "--variants-out", type=Path, help="where to write the variants (patched side)"
    )
    ap.add_argument(
        "--variants-from",
        type=Path,
        help="the patched side's variants (stock side; waited for)",
    )
    args = ap.parse_args(argv)
    archs = args.arch or [90, 100]

    problems = []
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        problems.append("TRITON_INTERPRET is set")
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        problems.append("CUDA_VISIBLE_DEVICES is not set to the empty string")
    if problems:
        print("aot_worker: " + "; ".join(problems), file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(1)
    import triton
    import vllm
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        print("aot_worker: vLLM disabled Triton (placeholders)", file=sys.stderr)
        return 2

    started = time.perf_counter()
    records, quiet, fns, rules = capture(
        archs, args.full, args.variants_from, args.variants_out
    )
    captured_s = time.perf_counter() - started
    _FNS.update(fns)

    tasks = sorted({(r["kernel"], r["spec"], r["arch"]) for r in records})
    if args.jobs > 1:
        # fork: the children inherit the imported vLLM and the JITFunctions.
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as ex:
            results = dict(zip(tasks, ex.map(_compile_one, tasks), strict=True))
    else:
        results = {t: _compile_one(t) for t in tasks}

    for r in records:
        r.update(results[(r["kernel"], r["spec"], r["arch"])])
        r["spec_id"] = tasks.index((r["kernel"], r["spec"], r["arch"]))
        del r["spec"]
    out = {
        "side": args.side,
        "vllm_file": vllm.__file__,
        "vllm_version": vllm.__version__,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "replica_rules": rules,
        "archs": archs,
        "compiles": len(tasks),
        "capture_s": round(captured_s, 2),
        "total_s": round(time.perf_counter() - started, 2),
        "records": records,
        "quiet": quiet,
    }
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
