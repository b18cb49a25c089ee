"""vstack gpu-check: the patched vLLM's GPU checks, carried to one NVIDIA GPU.

A bundle is a folder that runs with whatever Python, torch and Triton the GPU
machine has, without vLLM and without network: the runner
(payload/gpu_check.py), the patched vllm/ Python sources of the built wheel in
one zip, the few pure-Python packages vLLM's imports need (as wheels), and a
manifest. The checks themselves are listed by `--list` and described in the
runner. For the several-GPU scenarios (`scripts/gpu-check --multi`) the bundle
also carries the series' files outside vllm/ (its tests: --multi drives EPLB
with the series' own test driver) and the stock vLLM's sources (vllm-stock.zip,
the ITL baseline).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from vstack import fsutil
from vstack.base import pinned_wheel
from vstack.build import build, clear_own_folder, extract_outside
from vstack.config import Project, load_project
from vstack.errors import VstackError

RUNNER = Path(__file__).resolve().parent / "payload" / "gpu_check.py"

# Pure-Python packages carried in the bundle: vLLM's imports use them at import
# time in ways an inert stand-in cannot satisfy (version comparisons, generic
# classes). Versions come from requirements/cpu-test.txt.
CARRIED = ("packaging", "cachetools")

# Packages vLLM's module-level imports reach on the way to the checked modules,
# none of which the checks use; where the GPU machine lacks one, the runner puts
# an inert stand-in in its place (never over an installed package), and records
# it in the results. Found by importing the checked modules from a bundle in a
# Python that has only torch, Triton and numpy
# (tests/test_gpu_check.py::test_gpu_check_bundle_imports_with_torch_only), plus
# vLLM dependencies its CUDA platform path may import (blake3, gguf,
# mistral_common, openai, sentencepiece, tokenizers, yaml), not seen on CPU.
STAND_INS = (
    "PIL", "aiohttp", "blake3", "cbor2", "cloudpickle", "cpuinfo", "gguf",
    "huggingface_hub", "llguidance", "mistral_common", "msgspec", "openai",
    "prometheus_client", "psutil", "pybase64", "pydantic", "pydantic_core",
    "regex", "requests", "safetensors", "sentencepiece", "tokenizers",
    "transformers", "urllib3", "uvloop", "xgrammar", "yaml", "zmq",
)  # fmt: skip

_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def list_checks() -> int:
    return subprocess.run([sys.executable, str(RUNNER), "--list"]).returncode


def _pins(project: Project) -> dict[str, str]:
    lock = project.root / "requirements" / "cpu-test.txt"
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _pure_wheel(name: str, version: str, cache: Path) -> Path:
    """The py3-none-any wheel of name==version, from the wheel cache or pip."""
    norm = name.replace("-", "_")
    hits = sorted(cache.glob(f"{norm}-{version}-*-none-any.whl"))
    if hits:
        return hits[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(cache), f"{name}=={version}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    hits = sorted(cache.glob(f"{norm}-{version}-*-none-any.whl"))
    if proc.returncode != 0 or not hits:
        last = (proc.stderr.strip().splitlines() or ["no pure-Python wheel"])[-1]
        raise VstackError(f"gpu-check bundle: cannot get {name}=={version}: {last}")
    return hits[0]


def _module_name(member: str) -> str:
    """vllm/_C.abi3.so -> vllm._C"""
    parts = member.split("/")
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(parts)


def write_vllm_zip(wheel: Path, out: Path) -> list[str]:
    """The wheel's vllm/**.py and its dist-info metadata in one zip (importable
    with zipimport); returns the dotted names of its compiled extensions."""
    extensions = []
    with (
        zipfile.ZipFile(wheel) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst,
    ):
        for info in src.infolist():
            name = info.filename
            keep = (name.startswith("vllm/") and name.endswith(".py")) or re.fullmatch(
                r"vllm-[^/]+\.dist-info/(METADATA|entry_points\.txt)", name
            )
            if name.startswith("vllm/") and name.endswith(".so"):
                extensions.append(_module_name(name))
            if keep:
                item = zipfile.ZipInfo(name, _ZIP_DATE)
                item.compress_type = zipfile.ZIP_DEFLATED
                item.external_attr = 0o644 << 16
                dst.writestr(item, src.read(name))
    return sorted(extensions)


WHAT = "vstack gpu-check --bundle"


def make_bundle(project: Project, out: Path, log=None) -> dict:
    """Build the patched wheel (scripts/build) and write the bundle to `out`."""
    log = log or (lambda s: print(s, file=sys.stderr))
    # The folder's old content is removed: only a folder this command made (the
    # .vstack-out marker, as for build --out) or its own default under .vstack/.
    default = out.resolve() == (project.cache / "gpu-check" / "bundle").resolve()
    fsutil.own_folder(out, WHAT, default, create=False)
    info = build(project, log=log)
    wheel = project.dist / info["wheel"]
    fsutil.own_folder(out, WHAT, default)
    clear_own_folder(out)
    (out / "site").mkdir(parents=True)
    log(f"vstack: gpu-check bundle in {out} ...")
    extensions = write_vllm_zip(wheel, out / "vllm.zip")
    # --multi: the stock baseline and the series' test driver.
    write_vllm_zip(pinned_wheel(project), out / "vllm-stock.zip")
    series_files = extract_outside(project, out / "series")
    pins = _pins(project)
    carried = []
    for name in CARRIED:
        if name not in pins:
            raise VstackError(f"requirements/cpu-test.txt pins no {name}")
        whl = _pure_wheel(name, pins[name], project.wheel_cache)
        shutil.copy2(whl, out / "site" / whl.name)
        carried.append(whl.name)
    shutil.copy2(RUNNER, out / "gpu_check.py")
    manifest = {
        "source": {
            "vllm": info["version"], "wheel": info["wheel"], "base": info["base"],
            "patches": info["patches"], "applied_commit": info["applied_commit"],
        },
        "changed_files": sorted(info["changed"] + info["added"]),
        "stock": {"zip": "vllm-stock.zip", "wheel": info["base"]["wheel"]},
        "series_files": sorted(series_files),
        "extensions": extensions,
        "stand_ins": sorted(STAND_INS),
        "carried": carried,
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"vstack: gpu-check bundle ready: {out} ({size / 2**20:.1f} MiB); run it with "
        f"`python {out / 'gpu_check.py'}` on the GPU machine")  # fmt: skip
    return manifest


def run_checks(project: Project, python: str, only: list[str] | None, out: Path | None):
    """Bundle, then run the checks here with `python`; results into
    benchmarks/results/gpu-check-<gpu>.json unless --out says otherwise."""
    bundle = project.cache / "gpu-check" / "bundle"
    make_bundle(project, bundle)
    tmp = bundle / "results" / "run.json"
    cmd = [python, str(bundle / "gpu_check.py"), "--out", str(tmp)]
    cmd += ["--only", *only] if only else []
    rc = subprocess.run(cmd).returncode
    if not tmp.is_file():
        raise VstackError(f"the gpu-check runner wrote no results (exit {rc})")
    results = json.loads(tmp.read_text())
    gpu = results.get("environment", {}).get("gpu") or "no-gpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    final = out or project.root / "benchmarks" / "results" / f"gpu-check-{slug}.json"
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(tmp, final)
    for name, rec in results["checks"].items():
        reason = f": {rec['reason'][:200]}" if rec.get("reason") else ""
        print(f"{rec['status']:8s} {name}{reason}")
    print(f"vstack: gpu-check results: {final}", file=sys.stderr)
    return rc


def run_multi(project: Project, python: str, rest: list[str], out: Path | None):
    """`scripts/gpu-check --multi`: refuse at once without 2 GPUs, else bundle
    and run the several-GPU scenarios here with `python`; results into
    benchmarks/results/gpu-check-multi-<gpu>.json unless --out says otherwise."""
    # Before the build: a machine without 2 GPUs learns it in one line.
    try:
        pre = subprocess.run([python, str(RUNNER), "--multi", "--preflight", *rest],
                             capture_output=True, text=True)  # fmt: skip
    except OSError as e:
        print(f"gpu-check --multi: needs >= 2 GPUs; cannot run {python}: {e}",
              file=sys.stderr)  # fmt: skip
        return 2
    if pre.returncode != 0:
        lines = (pre.stderr.strip() or pre.stdout.strip()).splitlines()
        print(lines[-1] if lines else f"gpu-check --multi: {python} failed",
              file=sys.stderr)  # fmt: skip
        return pre.returncode
    bundle = project.cache / "gpu-check" / "bundle"
    make_bundle(project, bundle)
    tmp = bundle / "results" / "multi.json"
    rc = subprocess.run([python, str(bundle / "gpu_check.py"), "--multi",
                         "--out", str(tmp), *rest]).returncode  # fmt: skip
    if not tmp.is_file():
        raise VstackError(f"gpu-check --multi wrote no results (exit {rc})")
    results = json.loads(tmp.read_text())
    gpu = "cpu-dry-run" if results.get("dry_run_cpu") else results.get("gpu") or "gpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    name = f"gpu-check-multi-{slug}.json"
    final = out or project.root / "benchmarks" / "results" / name
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(tmp, final)
    for scenario, rec in results["scenarios"].items():
        reason = f": {rec['reason'][:200]}" if rec.get("reason") else ""
        print(f"{rec['status']:8s} {scenario}{reason}")
    print(f"vstack: gpu-check --multi results: {final}", file=sys.stderr)
    return rc


def main(argv=None) -> int:
    """`python -m vstack.gpucheck --multi ...` (what `scripts/gpu-check
    --multi` runs: the vstack command line has no --multi)."""
    import argparse

    ap = argparse.ArgumentParser(prog="scripts/gpu-check --multi",
                                 description=run_multi.__doc__)  # fmt: skip
    ap.add_argument("--root", default=".", help=argparse.SUPPRESS)
    ap.add_argument("--multi", action="store_true", required=True)
    ap.add_argument("--python", default="python3", help="interpreter with torch")
    ap.add_argument("--out", help="results file (default benchmarks/results/...)")
    args, rest = ap.parse_known_args(argv)
    try:
        from vstack.cli import locked

        project = load_project(Path(args.root))
        with locked(project, "gpu-check"):
            return run_multi(project, args.python, rest,
                             Path(args.out) if args.out else None)  # fmt: skip
    except VstackError as e:
        print(f"vstack: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
