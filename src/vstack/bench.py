"""vstack bench build: the wheel build against a plain copy and a naive rezip."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from vstack.base import pinned_wheel
from vstack.build import build
from vstack.config import Project


def _best(fn, repeat: int, clean=None) -> float:
    """Best wall time of fn; clean() runs untimed before each run, so that neither
    side pays for unlinking the previous 336 MB output."""
    times = []
    for _ in range(repeat):
        if clean:
            clean()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def naive_rezip(src: Path, dst: Path, scratch: Path) -> None:
    """What a script without raw copies does: extract everything, deflate it again."""
    with zipfile.ZipFile(src) as zf:
        zf.extractall(scratch)
        names = zf.namelist()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as out:
        for name in names:
            out.write(scratch / name, name)


def bench_build(project: Project, repeat: int = 3) -> int:
    wheel = pinned_wheel(project)
    size = wheel.stat().st_size
    with tempfile.TemporaryDirectory(dir=project.cache) as tmp:
        tmp = Path(tmp)
        build(project, tmp / "warm", log=lambda s: None)  # base + applied series cached
        t_copy = _best(
            lambda: shutil.copyfile(wheel, tmp / "copy.whl"), repeat,
            lambda: (tmp / "copy.whl").unlink(missing_ok=True),
        )  # fmt: skip
        t_build = _best(
            lambda: build(project, tmp / "dist", log=lambda s: None), repeat,
            lambda: shutil.rmtree(tmp / "dist", ignore_errors=True),
        )  # fmt: skip
        print("vstack bench: naive unzip + rezip (one run, slow) ...", file=sys.stderr)
        scratch = tmp / "x"
        t_naive = _best(lambda: naive_rezip(wheel, tmp / "naive.whl", scratch), 1)
    res = {
        "wheel": wheel.name,
        "wheel_mb": round(size / 1e6, 1),
        "plain_copy_s": round(t_copy, 3),
        "vstack_build_s": round(t_build, 3),
        "naive_rezip_s": round(t_naive, 3),
        "build_over_copy": round(t_build / t_copy, 2),
        "naive_over_build": round(t_naive / t_build, 1),
        "targets": {"build_over_copy_max": 3.0, "naive_over_build_min": 10.0},
        "repeat": repeat,
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, CPU only",
        "command": "scripts/bench-build",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{'step':<28}{'seconds':>10}")
    print(f"{'plain byte copy':<28}{t_copy:>10.3f}")
    print(f"{'vstack build':<28}{t_build:>10.3f}")
    print(f"{'naive unzip + rezip':<28}{t_naive:>10.3f}")
    print(f"build / copy   = {res['build_over_copy']:.2f}  (target <= 3)")
    print(f"naive / build  = {res['naive_over_build']:.1f}  (target >= 10)")
    out = project.root / "benchmarks" / "results" / "bench_build.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"results: {out.relative_to(project.root)}")
    ok = res["build_over_copy"] <= 3 and res["naive_over_build"] >= 10
    return 0 if ok else 2


def bench_rebase(project: Project, onto: str) -> int:
    """Rebase a throwaway copy of this stack (stack.toml, patches/, resolutions/)
    onto `onto`, end to end in a fresh .vstack (wheels from the warm cache), and
    print the split. A stop on a conflict ends the run (timed up to there)."""
    import subprocess

    from vstack.config import load_project
    from vstack.rebase import cmd_abort, cmd_rebase

    with tempfile.TemporaryDirectory(prefix="vstack-bench-rebase-") as tmp:
        root = Path(tmp)
        shutil.copy(project.root / "stack.toml", root / "stack.toml")
        shutil.copytree(project.patches_dir, root / "patches")
        if (project.root / "resolutions").is_dir():
            shutil.copytree(project.root / "resolutions", root / "resolutions")
        (root / ".gitignore").write_text("/.vstack/\n")
        for args in (
            ["init", "-q"],
            ["add", "-A"],
            ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "copy"],
        ):
            subprocess.run(
                ["git", "-C", str(root), *args], check=True, capture_output=True
            )
        copy = load_project(root)
        t = time.perf_counter()
        rc = cmd_rebase(copy, onto)
        total = time.perf_counter() - t
        report_path = copy.cache / "reports" / "rebase.json"
        state_path = copy.cache / "rebase" / "state.json"
        if rc != 0:
            data = json.loads(state_path.read_text())
            timings = data["timings"]
            cmd_abort(copy)
        else:
            data = json.loads(report_path.read_text())
            # the report has no timings (it is the same for every run of one rebase)
            timings = json.loads(
                (copy.cache / "reports" / "rebase-timings.json").read_text()
            )
        rows = data.get("results") or data.get("patches") or []
        statuses = {r["patch"]: r["status"] for r in rows}
    print(f"\n{'step':<20}{'seconds':>10}")
    for k in ("download", "base_extraction", "apply", "export"):
        print(f"{k:<20}{timings.get(k, 0.0):>10.2f}")
    print(f"{'total (end to end)':<20}{total:>10.2f}   target <= 60 s")
    for name, status in statuses.items():
        print(f"  {status:<18}{name}")
    res = {"onto": onto, "rc": rc, "timings": timings, "total_s": round(total, 2),
           "patches": statuses,
           "machine": f"{platform.machine()} {os.cpu_count()} cores, CPU only",
           "command": f"scripts/vstack bench rebase --onto {onto}",
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    out = project.root / "benchmarks" / "results" / "bench_rebase.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"results: {out.relative_to(project.root)}")
    return 0 if total <= 60 else 2
