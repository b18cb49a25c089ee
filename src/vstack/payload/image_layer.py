#!/usr/bin/env python3
"""The RUN step of the image `vstack build` writes (dist/image/Dockerfile): turns the
base image's vLLM into the patched one in place, then verifies the result.

    python3 -B vstack-layer.py apply CONTEXT INTO   # CONTEXT: dist/image, bind-mounted
    python3 -B vstack-layer.py verify [LAYER_JSON]  # again, later: /opt/vstack/layer.json

apply finds where the image installed vLLM (its site-packages, from sys.path; nothing
is hard-coded), checks that the files it changes are those of the pinned wheel (their
sha256 as that wheel's RECORD has them), writes the changed and new files, moves the
dist-info to the new version's name (METADATA's Version changed, RECORD rewritten for
the new files, the stock dist-info removed so that only one vLLM is installed),
removes the files the series deletes and the stale bytecode of the files it changes,
and copies itself, layer.json and build.json to INTO. The result is what installing
the patched wheel with pip gives (tests/test_image.py compares the two on CPU).

verify: exactly one vLLM installed, the new version; every RECORD entry present, the
changed files' sha256 as RECORD says; `import vllm` reports the version; `pip check`
reports nothing about vllm.

Standard library only, Python 3.8 or newer: it runs on the base image's Python.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NAME = "vllm"


class LayerError(Exception):
    pass


def say(msg: str) -> None:
    print(f"vstack-layer: {msg}", flush=True)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _dist_name(folder: str) -> str:
    return folder.split("-", 1)[0].lower().replace("_", "-").replace(".", "-")


def installed_dists() -> list[Path]:
    """Every vllm-*.dist-info (or .egg-info) on sys.path, each folder once."""
    found: dict[str, Path] = {}
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for child in sorted(os.listdir(entry)):
            if (
                child.endswith((".dist-info", ".egg-info"))
                and _dist_name(child) == NAME
            ):
                path = Path(entry, child)
                found.setdefault(os.path.realpath(path), path)
    return list(found.values())


def the_one_dist(expected: str, when: str) -> Path:
    dists = installed_dists()
    if len(dists) != 1:
        where = ", ".join(str(d) for d in dists) or "none on sys.path"
        raise LayerError(
            f"{when}: expected one installed vLLM ({expected}), found {len(dists)}: "
            f"{where}"
        )
    if dists[0].name != expected:
        raise LayerError(
            f"{when}: the image has {dists[0]}, not {expected}: the base image does "
            f"not hold the vLLM the stack is pinned to (check stack.toml's image)"
        )
    return dists[0]


def read_record(dist: Path) -> tuple[list[list[str]], str]:
    """RECORD's rows, and its line end (pip writes \\r\\n, uv \\n)."""
    raw = (dist / "RECORD").read_bytes()
    eol = "\r\n" if b"\r\n" in raw else "\n"
    rows = [r for r in csv.reader(io.StringIO(raw.decode("utf-8"))) if r]
    return rows, eol


def write_record(path: Path, rows: list[list[str]], eol: str) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=eol).writerows(rows)
    write_file(path, buf.getvalue().encode("utf-8"), 0o644)


def write_file(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.vstack-tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def stale_bytecode(path: Path) -> list[Path]:
    """Cached bytecode of the source file path (any interpreter, any optimisation
    level): stale once the file changes, and an image compiled with
    --invalidation-mode unchecked-hash would run it instead of the new source."""
    if path.suffix != ".py":
        return []
    cache = path.parent / "__pycache__"
    if not cache.is_dir():
        return []
    return sorted(p for p in cache.glob(f"{path.stem}.*.pyc") if p.is_file())


def prune_empty(folder: Path, stop: Path) -> None:
    """Remove folder and its parents while they are empty, up to (not) stop."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def apply(context: Path, into: Path) -> None:
    layer = json.loads((context / "layer.json").read_text(encoding="utf-8"))
    old_name, new_name = layer["dist_info"]["old"], layer["dist_info"]["new"]
    old_dist = the_one_dist(old_name, "before the layer")
    site = old_dist.parent
    say(f"vLLM {layer['base_version']} is installed in {site} (Python "
        f"{sys.version.split()[0]})")  # fmt: skip
    if not os.access(site, os.W_OK):
        raise LayerError(
            f"{site} is not writable by uid {os.getuid()}: the base image sets a "
            f"USER without write access there; add `USER root` before the RUN step"
        )
    if (site / new_name).exists():
        raise LayerError(f"{site / new_name} exists already")

    files = layer["files"]  # changed (old hash) and new (old None) files
    metadata = layer["metadata"]
    # 1. the files the layer changes must be the pinned wheel's (else this is not
    #    the base the series was built for, and replacing them would mix two vLLMs)
    wrong = []
    for f in files:
        target = site / f["path"]
        if f["old"] is None:
            if target.exists():
                wrong.append(f"{f['path']} exists (the pinned wheel has no such file)")
        elif not target.is_file():
            wrong.append(f"{f['path']} is missing")
        elif file_hash(target) != f["old"]:
            wrong.append(f"{f['path']} differs from the pinned wheel's")
    for f in layer["deleted"]:
        target = site / f["path"]
        if not target.is_file() or file_hash(target) != f["old"]:
            wrong.append(f"{f['path']} is missing or differs from the pinned wheel's")
    if file_hash(old_dist / "METADATA") != metadata["old"]:
        wrong.append(f"{old_name}/METADATA differs from the pinned wheel's")
    if wrong:
        raise LayerError(
            f"the base image's vLLM is not the pinned wheel: {'; '.join(wrong[:3])}"
            + (f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else "")
        )

    home = tempfile.mkdtemp(prefix="vstack-layer-")
    try:
        layer["pip_check_before"] = pip_check_about_vllm(
            _quiet_env(home), home, [layer["base_version"]]
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)

    rows, eol = read_record(old_dist)
    was_sorted = rows == sorted(rows, key=lambda r: tuple(str(x) for x in r))
    removed = [site / f["path"] for f in layer["deleted"]]
    for f in [*files, *layer["deleted"]]:
        removed += stale_bytecode(site / f["path"])
    removed_rel = {p.relative_to(site).as_posix() for p in removed}

    # 2. the new and changed files
    for f in files:
        data = (context / "files" / f["path"]).read_bytes()
        if record_hash(data) != f["new"]:
            raise LayerError(f"the build context's files/{f['path']} is damaged")
        write_file(site / f["path"], data, int(f["mode"], 8))

    # 3. the dist-info under the new version's name: the installer's files as they
    #    are (INSTALLER, REQUESTED, licenses, entry points), METADATA with the new
    #    version, no direct_url.json (it names the stock wheel's archive and hash),
    #    RECORD rewritten
    new_dist = site / new_name
    for src in sorted(old_dist.rglob("*")):
        rel = src.relative_to(old_dist).as_posix()
        if src.is_dir() or rel in ("RECORD", "METADATA", "direct_url.json"):
            continue
        dst = new_dist / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    meta = (context / "files" / new_name / "METADATA").read_bytes()
    if record_hash(meta) != metadata["new"]:
        raise LayerError(f"the build context's files/{new_name}/METADATA is damaged")
    write_file(new_dist / "METADATA", meta, 0o644)

    new_rows = {f["path"]: [f["path"], f["new"], str(f["size"])] for f in files}
    out, seen = [], set()
    for row in rows:
        path = row[0]
        if path.startswith(old_name + "/"):
            rel = path[len(old_name) + 1 :]
            if rel == "direct_url.json":
                continue
            path = f"{new_name}/{rel}"
            if rel == "RECORD":
                row = [path, "", ""]
            elif rel == "METADATA":
                row = [path, metadata["new"], str(metadata["size"])]
            else:
                row = [path, *row[1:]]
        elif path in removed_rel:
            continue
        elif path in new_rows:
            row = new_rows[path]
        out.append(row)
        seen.add(path)
    out += [r for p, r in sorted(new_rows.items()) if p not in seen]
    if was_sorted:
        out.sort(key=lambda r: tuple(str(x) for x in r))
    write_record(new_dist / "RECORD", out, eol)

    # 4. what goes: the stock dist-info (else two vLLMs are installed), the files
    #    the series deletes, stale bytecode
    shutil.rmtree(old_dist)
    for p in removed:
        p.unlink(missing_ok=True)
        prune_empty(p.parent, site)
    say(
        f"vLLM {layer['version']}: {len(files)} file(s) written, "
        f"{len(layer['deleted'])} removed, {len(removed) - len(layer['deleted'])} "
        f"stale bytecode file(s) removed, {old_name} -> {new_name}"
    )

    # 5. the layer's own record in the image
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__), into / "vstack-layer.py")
    shutil.copyfile(context / "build.json", into / "build.json")
    layer["site"] = str(site)
    layer["removed"] = sorted(removed_rel)
    write_file(
        into / "layer.json", (json.dumps(layer, indent=2) + "\n").encode(), 0o644
    )
    verify(into / "layer.json")


def _quiet_env(home: str) -> dict[str, str]:
    """`import vllm` in a throwaway home: caches and configs it may write stay out of
    the image's layer (and no bytecode is written: -B)."""
    env = dict(os.environ)
    for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TMPDIR",
                "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TRITON_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR"):  # fmt: skip
        env[var] = home
    env.update(PYTHONDONTWRITEBYTECODE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def pip_check_about_vllm(env: dict, cwd: str, versions: list[str]) -> list[str] | None:
    """The lines of `pip check` that name vllm, its version written as <version>
    (so that a problem the base image had reads the same after the layer); None
    when there is no pip."""
    p = subprocess.run(
        [sys.executable, "-B", "-m", "pip", "check"], env=env, cwd=cwd,
        capture_output=True, text=True,
    )  # fmt: skip
    if "No module named pip" in p.stderr:
        return None
    if p.returncode not in (0, 1):
        raise LayerError(f"pip check failed: {p.stderr.strip()[-300:]}")
    about = []
    for line in p.stdout.splitlines():
        if NAME in line.lower().replace(",", " ").split():
            for v in versions:
                line = line.replace(f" {v} ", " <version> ").replace(
                    f" {v}.", " <version>."
                )
            about.append(line.strip())
    return about


def verify(layer_json: Path) -> None:
    layer = json.loads(layer_json.read_text(encoding="utf-8"))
    new_name = layer["dist_info"]["new"]
    dist = the_one_dist(new_name, "after the layer")
    site = dist.parent
    if layer.get("site") and Path(layer["site"]) != site:
        raise LayerError(f"vLLM is in {site}, the layer was applied in {layer['site']}")
    rows, _ = read_record(dist)
    by_path = {r[0]: r for r in rows}
    problems = []
    for row in rows:
        if len(row) < 3 or not row[1]:
            continue  # RECORD itself (and files an installer left unhashed)
        path = Path(os.path.normpath(site / row[0]))
        if not path.is_file():
            problems.append(f"{row[0]} is in RECORD but not installed")
        elif str(path.stat().st_size) != row[2]:
            problems.append(
                f"{row[0]} has {path.stat().st_size} bytes, RECORD says {row[2]}"
            )
    touched = [f["path"] for f in layer["files"]]
    touched += [r[0] for r in rows if r[0].startswith(new_name + "/") and r[1]]
    for rel in touched:
        row = by_path.get(rel)
        if row is None:
            problems.append(f"{rel} is not in RECORD")
        elif (site / rel).is_file() and file_hash(site / rel) != row[1]:
            problems.append(f"{rel}: sha256 is not RECORD's")
    for f in layer["files"]:
        if by_path.get(f["path"], [None, None])[1] != f["new"]:
            problems.append(
                f"{f['path']}: RECORD does not have the patched file's sha256"
            )
    for rel in [f["path"] for f in layer["deleted"]] + layer.get("removed", []):
        if (site / rel).exists():
            problems.append(f"{rel} should have been removed")
    if problems:
        raise LayerError(
            f"{len(problems)} problem(s) in the installed vLLM: {'; '.join(problems[:3])}"
        )
    say(
        f"RECORD: {len(rows)} entries present; {len(touched)} changed or rewritten "
        f"file(s) match their sha256"
    )

    home = tempfile.mkdtemp(prefix="vstack-layer-")
    try:
        env = _quiet_env(home)
        code = (
            "import json, importlib.metadata as m, vllm; "
            "print(json.dumps([vllm.__version__, m.version('vllm'), vllm.__file__]))"
        )
        p = subprocess.run(
            [sys.executable, "-B", "-c", code], env=env, cwd=home,
            capture_output=True, text=True,
        )  # fmt: skip
        if p.returncode != 0:
            tail = p.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise LayerError(f"`import vllm` failed: {tail[0]}")
        version, meta_version, where = json.loads(p.stdout.strip().splitlines()[-1])
        if version != layer["version"] or meta_version != layer["version"]:
            raise LayerError(
                f"`import vllm` reports {version} (metadata {meta_version}), the layer "
                f"is {layer['version']}"
            )
        if Path(where).parent != site / NAME:
            raise LayerError(f"`import vllm` imports {where}, not the one in {site}")
        say(f"import vllm: {version} from {Path(where).parent}")

        found = pip_check_about_vllm(env, home, [layer["version"]])
        if found is None:
            say("pip check: skipped (pip is not installed here)")
        else:
            before = set(layer.get("pip_check_before") or [])
            new = [ln for ln in found if ln not in before]
            if new:
                raise LayerError(f"pip check: {new[0]}" + (
                    f" (and {len(new) - 1} more)" if len(new) > 1 else ""
                ))  # fmt: skip
            say(
                f"pip check: {len(found)} line(s) about vllm, each as in the base "
                f"image: {found[0]}"
                if found
                else "pip check: nothing about vllm"
            )
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "apply":
            apply(Path(argv[1]), Path(argv[2]))
        elif argv[:1] == ["verify"] and len(argv) <= 2:
            verify(Path(argv[1] if len(argv) == 2 else "/opt/vstack/layer.json"))
        else:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return 2
    except LayerError as e:
        print(f"vstack-layer: error: {e}", file=sys.stderr)
        return 1
    say("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
