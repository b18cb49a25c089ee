"""Helpers of the AOT compile tests (test_aot_kernels.py): the stock vLLM sources
of the pinned wheel, which Triton kernels the series adds or changes, and the
register budget. No torch or Triton here; the compiling happens in aot_worker.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import defaultdict
from pathlib import Path

from vstack.fetch import sha256_file

HERE = Path(__file__).resolve().parent

# --- the stock sources -------------------------------------------------------


def stock_sources(wheel: Path, sha256: str, cache_root: Path) -> Path:
    """The `vllm/**.py` files of the pinned wheel, extracted once into
    `cache_root/vllm-<sha256>/` (a folder on sys.path that imports as vllm)."""
    dest = cache_root / f"vllm-{sha256}"
    if (dest / ".complete").is_file():
        return dest
    got = sha256_file(wheel)
    if got != sha256:
        raise RuntimeError(f"{wheel}: sha256 {got}, stack.toml pins {sha256}")
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    zf.extract(name, tmp)
        (tmp / ".complete").write_text(wheel.name + "\n")
        if dest.exists():  # an interrupted extraction
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


# --- which kernels the series changes ------------------------------------------


@dataclasses.dataclass
class JitFn:
    module: str
    name: str
    path: Path
    dump: str  # the function's AST without docstring or positions
    calls: set[tuple[str, str]]  # (module, name) candidates it calls
    globals_used: set[str]


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = (
        target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    )
    return name == "jit"


def _strip_docstring(fn: ast.FunctionDef) -> ast.FunctionDef:
    fn = ast.parse(ast.unparse(fn)).body[0]  # a copy
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        fn.body = fn.body[1:] or [ast.Pass()]
    return fn


def _imports(
    tree: ast.Module, module: str, is_pkg: bool
) -> dict[str, tuple[str, str | None]]:
    """alias -> (module, name) for `from m import name`, (module, None) for
    `import m [as alias]`."""
    out: dict[str, tuple[str, str | None]] = {}
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for a in node.names:
                out[a.asname or a.name] = (base, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = (a.name, None)
                else:
                    out[a.name.split(".")[0]] = (a.name.split(".")[0], None)
    return out


def _called(fn: ast.FunctionDef, module: str, imports: dict) -> set[tuple[str, str]]:
    calls = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in imports and imports[f.id][1] is not None:
                calls.add(imports[f.id])
            calls.add((module, f.id))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            alias = f.value.id
            if alias in imports:
                mod, name = imports[alias]
                calls.add((mod if name is None else f"{mod}.{name}", f.attr))
    return calls


def _has_jit(text: str) -> bool:
    return "@triton.jit" in text or "@jit" in text or ".jit(" in text


def scan_jit_functions(
    root: Path, files: list[Path] | None = None, dump: set[str] | None = None
) -> dict:
    """(module, name) -> JitFn for every @triton.jit function under root/vllm
    (or in `files`, relative to root), module-level globals as a second value.
    The AST dumps (for comparisons) are made for the modules in `dump` only
    (all when None)."""
    fns: dict[tuple[str, str], JitFn] = {}
    module_globals: dict[str, dict[str, str]] = {}
    paths = files if files is not None else [
        p.relative_to(root) for p in sorted((root / "vllm").rglob("*.py"))
    ]  # fmt: skip
    for rel in paths:
        path = root / rel
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not _has_jit(text):
            continue
        tree = ast.parse(text)
        module = _module_name(rel)
        imports = _imports(tree, module, rel.name == "__init__.py")
        assigns = {}
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for t in targets:
                    if isinstance(t, ast.Name):
                        assigns[t.id] = ast.dump(node)
        module_globals[module] = assigns
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                _is_jit(d) for d in node.decorator_list
            ):
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                wanted = dump is None or module in dump
                fns[(module, node.name)] = JitFn(
                    module, node.name, rel,
                    ast.dump(_strip_docstring(node)) if wanted else "",
                    _called(node, module, imports), used & assigns.keys(),
                )  # fmt: skip
    return {"fns": fns, "globals": module_globals}


def changed_files(stock: Path, patched: Path) -> list[Path]:
    """vllm/**.py files whose bytes differ between the two trees, or that only
    the patched tree has."""
    out = []
    for p in sorted((patched / "vllm").rglob("*.py")):
        rel = p.relative_to(patched)
        other = stock / rel
        if not other.is_file() or other.read_bytes() != p.read_bytes():
            out.append(rel)
    return out


def series_kernels(stock: Path, patched: Path) -> dict[str, str]:
    """Kernels (jit functions no jit function calls) that the series adds or
    changes, or that call (transitively) a device function it adds or changes,
    as "module:name" -> why. A function changes when its code (docstring aside),
    its decorators or a module-level global it reads differ from the stock one."""
    files = changed_files(stock, patched)
    touched = {_module_name(f) for f in files}
    new = scan_jit_functions(patched, dump=touched)
    old = scan_jit_functions(stock, files)
    fns = new["fns"]
    changed: dict[tuple[str, str], str] = {}
    for key, fn in fns.items():
        if fn.module not in touched:
            continue
        before = old["fns"].get(key)
        if before is None:
            changed[key] = "added by the series"
        elif before.dump != fn.dump:
            changed[key] = "changed by the series"
        else:
            g_new = new["globals"].get(fn.module, {})
            g_old = old["globals"].get(fn.module, {})
            moved = sorted(g for g in fn.globals_used if g_new.get(g) != g_old.get(g))
            if moved:
                changed[key] = f"reads changed global(s) {', '.join(moved)}"
    callers = defaultdict(set)
    for key, fn in fns.items():
        for callee in fn.calls:
            if callee in fns and callee != key:
                callers[callee].add(key)
    why = dict(changed)
    todo = list(changed)
    while todo:
        callee = todo.pop()
        for caller in callers[callee]:
            if caller not in why:
                why[caller] = f"calls {callee[0]}:{callee[1]} ({why[callee]})"
                todo.append(caller)
    return {
        f"{m}:{n}": reason
        for (m, n), reason in sorted(why.items())
        if not callers[(m, n)]
    }


# --- the register budget -------------------------------------------------------

# Registers per thread up to which registers never limit occupancy on sm_90 and
# sm_100: 65536 registers per SM / 2048 resident threads.
FREE_REGISTERS = 32
# One allocation step: ptxas allocates registers per warp in units of 256, i.e.
# 8 per thread.
REGISTER_STEP = 8


def register_budget(stock_regs: int) -> int:
    """Most registers a patched kernel may use where stock uses `stock_regs`:
    one allocation step more, or any count that cannot cost occupancy."""
    return max(stock_regs + REGISTER_STEP, FREE_REGISTERS)


# --- running the workers ---------------------------------------------------------


def worker_env(side: str, cache_dir: Path, stock_root: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = [str(HERE)]
    if side == "stock":
        path.insert(0, str(stock_root))
    env.update(
        CUDA_VISIBLE_DEVICES="",
        VLLM_TARGET_DEVICE="cpu",
        TRITON_CACHE_DIR=str(cache_dir),
        TRITON_ALWAYS_COMPILE="1",
        VLLM_LOGGING_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_workers(
    stock_root: Path,
    out_dir: Path,
    archs=(90, 100),
    full: bool = False,
    timeout: int = 1800,
) -> dict[str, dict]:
    """Both sides at once: the patched side samples the variants and writes
    them out; the stock side imports meanwhile, then compiles the stock
    equivalent of each. Each compiles on every CPU."""
    variants = out_dir / "variants.json"
    procs = {}
    for side in ("patched", "stock"):
        cmd = [sys.executable, str(HERE / "aot_worker.py"), "--side", side,
               "--out", str(out_dir / f"{side}.json"),
               "--jobs", str(os.cpu_count() or 1)]  # fmt: skip
        cmd += [f"--arch={a}" for a in archs] + (["--full"] if full else [])
        cmd += [
            "--variants-out" if side == "patched" else "--variants-from",
            str(variants),
        ]
        env = worker_env(side, out_dir / f"triton-cache-{side}", stock_root)
        log = open(out_dir / f"{side}.log", "w")  # noqa: SIM115 (closed below)
        procs[side] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log)
    deadline = time.monotonic() + timeout
    failed = None
    while any(p.poll() is None for p, _ in procs.values()):
        for side, (p, _) in procs.items():
            if p.poll() not in (None, 0):
                failed = failed or f"aot_worker --side {side} failed ({p.returncode})"
        if failed or time.monotonic() > deadline:
            failed = failed or f"aot_worker timed out after {timeout} s"
            for p, _ in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.5)
    for side, (p, log) in procs.items():
        log.close()
        if not failed and p.returncode != 0:
            failed = f"aot_worker --side {side} failed ({p.returncode})"
    if failed:
        logs = "\n".join(
            f"--- {s}.log ---\n{(out_dir / f'{s}.log').read_text()[-3000:]}"
            for s in procs
        )
        raise RuntimeError(f"{failed}\n{logs}")
    return {s: json.loads((out_dir / f"{s}.json").read_text()) for s in procs}


def compare(patched: dict, stock: dict) -> list[dict]:
    """One row per patched (kernel, variant, arch), with the stock equivalent's
    figures where stock launches the same kernel for that variant."""
    stock_by = {(r["kernel"], r["key"], r["arch"]): r for r in stock["records"]}
    rows = []
    for r in patched["records"]:
        s = stock_by.get((r["kernel"], r["stock_key"], r["arch"]))
        budget = register_budget(s["regs"]) if s and s.get("regs") is not None else None
        rows.append({
            "kernel": r["kernel"].split(":")[1], "module": r["kernel"].split(":")[0],
            "driver": r["driver"], "variant": r["key"], "arch": f"sm_{r['arch']}a",
            "stock_variant": r["stock_key"] if s else None,
            "stock_regs": s.get("regs") if s else None,
            "stock_stack": s.get("stack") if s else None,
            "stock_spills": (s["spill_stores"] + s["spill_loads"])
            if s and s.get("regs") is not None else None,
            "regs": r.get("regs"), "budget": budget,
            "spills": (r["spill_stores"] + r["spill_loads"])
            if r.get("regs") is not None else None,
            "stack": r.get("stack"), "error": r.get("error"),
            "compile_s": r.get("compile_s"),
        })  # fmt: skip
    return rows


def problems(rows: list[dict]) -> list[str]:
    """What fails the test: a compile error, spills, a stack frame (beyond the
    stock equivalent's own), registers over budget."""
    out = []
    for row in rows:
        where = f"{row['kernel']} [{row['variant']}] {row['arch']}"
        if row["error"]:
            out.append(f"{where}: does not compile: {row['error'].strip()[:800]}")
            continue
        if row["spills"]:
            out.append(f"{where}: {row['spills']} bytes of register spills")
        if row["stack"] and row["stack"] > (row["stock_stack"] or 0):
            out.append(
                f"{where}: {row['stack']} bytes stack frame "
                f"(stock: {row['stock_stack']})"
            )
        if row["budget"] is not None and row["regs"] > row["budget"]:
            out.append(
                f"{where}: {row['regs']} registers, budget {row['budget']} "
                f"(stock [{row['stock_variant']}]: {row['stock_regs']})"
            )
    return out


def format_table(rows: list[dict]) -> str:
    head = (
        "kernel",
        "variant",
        "arch",
        "stock regs",
        "patched regs",
        "spills",
        "stack",
    )
    body = [
        (
            r["kernel"], r["variant"], r["arch"],
            "-" if r["stock_regs"] is None else str(r["stock_regs"]),
            "ERROR" if r["error"] else str(r["regs"]),
            "-" if r["spills"] is None else str(r["spills"]),
            "-" if r["stack"] is None else str(r["stack"]),
        )
        for r in rows
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body
    ]
    return "\n".join(line.rstrip() for line in lines)
