"""vstack build: the pinned upstream wheel with the series' files swapped in.

Unchanged members keep their exact bytes; RECORD lines for them come from the
upstream RECORD (the wheel's sha256 is pinned, so they are trusted); changed and new
files are hashed here. Output is a pure function of (wheel, base, series).
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from vstack import fsutil, gitutil
from vstack.base import Base, ensure_base, pinned_wheel
from vstack.config import Pin, Project
from vstack.errors import VstackError
from vstack.export import applied_tip
from vstack.series import series_digest, series_paths
from vstack.wheelzip import (
    Member,
    WheelWriter,
    central_date_time,
    central_external_attr,
    read_members,
    read_named,
)


def local_label(label: str, patches: list[Path]) -> str:
    if not patches:
        return f"{label}.empty"
    # "g" keeps the segment alphanumeric: an all-digit hash would be normalised.
    return f"{label}.g{series_digest(patches)[:12]}"


def local_version(upstream: str, label: str) -> str:
    """The build's version: upstream's with the stack label appended to its local
    part (a nightly already has one: 0.34.1.dev12+g1a2b3c4d5.cu129.eplb.g...)."""
    return f"{upstream}{'.' if '+' in upstream else '+'}{label}"


def wheel_dist_version(members: list[Member], source_name: str) -> str:
    """The version in the wheel's dist-info folder name (a nightly's carries the
    build variant, e.g. .cu129, that vllm/_version.py lacks)."""
    for m in members:
        hit = re.fullmatch(r"vllm-([^/]+)\.dist-info/RECORD", m.name)
        if hit:
            return hit.group(1)
    raise ValueError(f"{source_name} has no vllm-*.dist-info/RECORD")


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def patch_version_py(text: str, version: str) -> str:
    """vllm/_version.py with the local version; the commit id stays upstream's."""
    public, local = version.split("+", 1)
    # As setuptools-scm writes it: numbers, then strings (0, 34, 1, 'dev12', ...).
    nums = ", ".join(p if p.isdigit() else repr(p) for p in public.split("."))
    text, n = re.subn(
        r"^(__version__ = version = )'[^']*'$", rf"\g<1>'{version}'", text, flags=re.M
    )
    text = re.sub(
        r"^(__version_tuple__ = version_tuple = )\(.*\)$",
        rf"\g<1>({nums}, '{local}')",
        text,
        flags=re.M,
    )
    if n != 1:
        raise ValueError("vllm/_version.py has no __version__ assignment to patch")
    return text


def patch_metadata(text: str, version: str) -> str:
    text, n = re.subn(
        r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M
    )
    if n != 1:
        raise ValueError("METADATA has no Version field")
    return text


@dataclasses.dataclass
class BuildPlan:
    version: str
    wheel_name: str
    dist_info_old: str
    dist_info_new: str
    replaced: dict[str, bytes]  # member name -> new bytes (same name)
    # member name -> whether the series leaves it executable (mode 100755), for each
    # replaced member: `new mode 100755` in a patch reaches the wheel
    executable: dict[str, bool]
    added: dict[str, tuple[bytes, int]]  # member name -> (bytes, external attr)
    deleted: set[str]
    outside: list[str]  # series files outside the wheel's packages (tests, docs)


def plan_build(
    members: list[Member],
    changes: list[tuple[str, str, str]],
    blobs: dict[str, bytes],
    pin_version: str,
    version: str,
    source_name: str,
) -> BuildPlan:
    """Pure planning: what each member of the output wheel is."""
    names = {m.name for m in members}
    dist_old = f"vllm-{pin_version}.dist-info"
    if f"{dist_old}/RECORD" not in names:
        raise ValueError(f"{source_name} has no {dist_old}/RECORD")
    packages = {
        n.split("/", 1)[0] for n in names if ".dist-info/" not in n and "/" in n
    }
    replaced, added, deleted, outside, executable = {}, {}, set(), [], {}
    for status, path, mode in changes:
        if status != "D" and mode not in ("100644", "100755"):
            raise ValueError(
                f"{path} has mode {mode} in the applied series (a symlink or a "
                f"submodule): a wheel carries regular files only"
            )
        if path.split("/", 1)[0] not in packages:
            outside.append(path)
        elif status == "D":
            deleted.add(path)
        elif path in names:
            replaced[path] = blobs[path]
            executable[path] = mode == "100755"
        else:
            attr = (0o100755 if mode == "100755" else 0o100644) << 16
            added[path] = (blobs[path], attr)
    wheel_name = source_name.replace(f"vllm-{pin_version}-", f"vllm-{version}-", 1)
    return BuildPlan(
        version, wheel_name, dist_old, f"vllm-{version}.dist-info",
        replaced, executable, added, deleted, sorted(outside),
    )  # fmt: skip


def with_mode(attr: int, executable: bool | None) -> int:
    """A member's external attributes with the x bits the series gives it (the
    other bits as upstream has them)."""
    x = 0o111 << 16
    if executable is None or bool(attr & x) == executable:
        return attr
    return attr | x if executable else attr & ~x


@dataclasses.dataclass
class Stock:
    """What the build needs of the upstream wheel beyond its members' raw bytes."""

    dist_data: dict[str, bytes]  # its dist-info members and vllm/_version.py
    record: dict[str, list[str]]  # its RECORD rows by member name
    replaced: dict[str, bytes]  # plan.replaced plus vllm/_version.py (the version)


def read_stock(source: Path, members: list[Member], plan: BuildPlan) -> Stock:
    dist_names = [
        m.name for m in members if m.name.startswith(plan.dist_info_old + "/")
    ]
    dist_data = read_named(source, [*dist_names, "vllm/_version.py"], members)
    record_text = dist_data[f"{plan.dist_info_old}/RECORD"].decode()
    version_py = dist_data["vllm/_version.py"].decode()
    upstream_record = {
        row[0]: row for row in csv.reader(io.StringIO(record_text)) if row
    }
    replaced = dict(plan.replaced)
    replaced["vllm/_version.py"] = patch_version_py(
        replaced.get("vllm/_version.py", version_py.encode()).decode(), plan.version
    ).encode()
    return Stock(dist_data, upstream_record, replaced)


def write_wheel(
    source: Path, members: list[Member], plan: BuildPlan, out: Path, stock: Stock
) -> None:
    dist_data, upstream_record = stock.dist_data, stock.record
    replaced = stock.replaced
    record: list[list[str]] = []
    tmp = out.with_name(f".{out.name}.tmp")
    w = WheelWriter(tmp, source)
    try:
        run: list[Member] = []
        stamp = central_date_time(members[0])
        for m in members:
            raw_ok = (
                m.name not in replaced
                and m.name not in plan.deleted
                and not m.name.startswith(plan.dist_info_old + "/")
            )
            if raw_ok and (not run or run[-1].end == m.offset):
                run.append(m)
                record.append(upstream_record.get(m.name) or [m.name, "", ""])
                continue
            w.copy_raw(run)
            run = []
            if raw_ok:
                run.append(m)
                record.append(upstream_record.get(m.name) or [m.name, "", ""])
            elif m.name in replaced:
                data = replaced[m.name]
                attr = with_mode(central_external_attr(m), plan.executable.get(m.name))
                w.add(m.name, data, central_date_time(m), attr)
                record.append([m.name, record_hash(data), str(len(data))])
        w.copy_raw(run)
        for name in sorted(plan.added):
            data, attr = plan.added[name]
            w.add(name, data, stamp, attr)
            record.append([name, record_hash(data), str(len(data))])
        for m in members:
            if not m.name.startswith(plan.dist_info_old + "/") or m.name.endswith(
                "/RECORD"
            ):
                continue
            data = dist_data[m.name]
            if m.name.endswith("/METADATA"):
                data = patch_metadata(data.decode(), plan.version).encode()
            new_name = plan.dist_info_new + m.name[len(plan.dist_info_old) :]
            w.add(new_name, data, central_date_time(m), central_external_attr(m))
            record.append([new_name, record_hash(data), str(len(data))])
        missing = [r[0] for r in record if not r[1]]
        if missing:
            raise ValueError(f"upstream RECORD lacks hashes for {missing[:3]}")
        record_name = f"{plan.dist_info_new}/RECORD"
        record.append([record_name, "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(record)
        w.add(record_name, buf.getvalue().encode(), stamp, 0o100644 << 16)
        w.close()
    except BaseException:
        w.f.close()
        tmp.unlink(missing_ok=True)
        raise
    fsutil.replace(tmp, out)


IMAGE_DIR = "image"  # the docker build context, in the build's output folder
LAYER_SCRIPT = "vstack-layer.py"
# Where the Dockerfile's RUN step sees the context (a bind mount: it is in no layer)
# and where the layer leaves its record in the image.
CONTEXT_MOUNT = "/tmp/vstack-image"
IMAGE_RECORD = "/opt/vstack"
LAYER_PAYLOAD = Path(__file__).resolve().parent / "payload" / "image_layer.py"


def qualified_image(image: str) -> str:
    """A Docker reference with its registry, as OCI's base.name wants it:
    vllm/vllm-openai:v1 -> docker.io/vllm/vllm-openai:v1, alpine -> docker.io/library/alpine."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if rest else f"docker.io/library/{image}"


def from_reference(pin: Pin) -> str:
    """The Dockerfile's FROM: fully qualified (podman and buildah resolve no short
    names by default), by digest when stack.toml pins one."""
    base = qualified_image(pin.image)
    return f"{base}@{pin.image_digest}" if pin.image_digest else base


def _label_value(text: str) -> str:
    # a double-quoted Dockerfile value: \ and " escaped, $ kept from substitution
    return '"' + re.sub(r'(["\\$])', r"\\\1", text) + '"'


def stack_revision(root: Path) -> tuple[str | None, bool]:
    """(the stack repository's HEAD, whether patches/ or stack.toml differ from it);
    (None, False) when the stack is not in a git repository."""
    p = gitutil.git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return None, False
    dirty = gitutil.git(
        root, "status", "--porcelain", "--untracked-files=all", "--",
        "patches", "stack.toml", check=False,
    ).stdout.strip()  # fmt: skip
    return p.stdout.strip(), bool(dirty)


def _mode(attr: int) -> str:
    # as pip installs a member: executable when the archive says so
    return "755" if (attr >> 16) & 0o111 else "644"


def layer_manifest(members: list[Member], plan: BuildPlan, stock: Stock) -> dict:
    """What the image layer changes in the installed stock wheel: each file with the
    stock sha256 it must find (None for a new file) and the one it writes."""
    by_name = {m.name: m for m in members}
    files = []
    for name, data in sorted(stock.replaced.items()):
        attr = with_mode(
            central_external_attr(by_name[name]), plan.executable.get(name)
        )
        files.append({"path": name, "old": stock.record[name][1],
                      "new": record_hash(data), "size": len(data), "mode": _mode(attr)})  # fmt: skip
    for name, (data, attr) in sorted(plan.added.items()):
        files.append({"path": name, "old": None, "new": record_hash(data),
                      "size": len(data), "mode": _mode(attr)})  # fmt: skip
    meta_name = f"{plan.dist_info_old}/METADATA"
    meta = patch_metadata(stock.dist_data[meta_name].decode(), plan.version).encode()
    return {
        "format": 1,
        "version": plan.version,
        "base_version": plan.dist_info_old[len("vllm-") : -len(".dist-info")],
        "dist_info": {"old": plan.dist_info_old, "new": plan.dist_info_new},
        "metadata": {
            "old": stock.record[meta_name][1],
            "new": record_hash(meta),
            "size": len(meta),
        },  # fmt: skip
        "files": files,
        "deleted": [
            {"path": name, "old": stock.record[name][1]}
            for name in sorted(plan.deleted)
            if name in stock.record
        ],
    }, meta


def dockerfile(pin: Pin, plan: BuildPlan, patches: list[Path], layer: dict,
               revision: str | None, context: str) -> str:  # fmt: skip
    tag = plan.version.replace("+", "-")
    size = sum(f["size"] for f in layer["files"])
    base = qualified_image(pin.image)
    labels = {
        "org.opencontainers.image.title": "vllm-eplb",
        "org.opencontainers.image.description": (
            f"vLLM {pin.version} with the vllm-eplb-stack series ({len(patches)} "
            f"patch(es))"
        ),
        "org.opencontainers.image.version": plan.version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.base.name": base,
        "org.opencontainers.image.base.digest": pin.image_digest or None,
        "vstack.series": series_digest(patches),
        "vstack.patches": ",".join(p.name for p in patches),
    }
    label_lines = " \\\n      ".join(
        f"{k}={_label_value(v)}" for k, v in labels.items() if v
    )
    return f"""\
# Generated by `vstack build`; do not edit (change stack.toml or patches/ instead).
# vLLM {plan.version}: {pin.image_ref} with {len(patches)} stack patch(es).
# Its one layer holds what the series changes ({len(layer["files"])} file(s), {size:,} bytes)
# and vLLM's new dist-info; the whole wheel is beside this folder, for pip.
# Build with this folder as the context (BuildKit: docker 23+, podman, buildah):
#   docker build -t vllm-eplb:{tag} {context}
FROM {from_reference(pin)}
LABEL {label_lines}
# {LAYER_SCRIPT} finds where the image installed vLLM, checks the files it changes
# are the pinned wheel's, writes the series' files and the new dist-info (RECORD
# true, the stock dist-info removed), then verifies: import vllm, the version, the
# sha256 of every changed file against RECORD, pip check for vllm.
RUN --mount=type=bind,source=.,target={CONTEXT_MOUNT} \\
    python3 -B {CONTEXT_MOUNT}/{LAYER_SCRIPT} apply {CONTEXT_MOUNT} {IMAGE_RECORD}
"""


def write_image_context(
    out_dir: Path, project: Project, plan: BuildPlan, members: list[Member],
    stock: Stock, patches: list[Path], info: dict, log, context: str,
) -> dict:  # fmt: skip
    """out_dir/image/: the docker build context (replaced whole: written beside it,
    then moved in)."""
    layer, meta = layer_manifest(members, plan, stock)
    revision, dirty = stack_revision(project.root)
    if revision and dirty:
        revision += "-dirty"
        log(
            "vstack: note: patches/ or stack.toml has uncommitted changes: the "
            f"image's revision label says {revision}"
        )
    files = {
        f"files/{p}": stock.replaced[p] if p in stock.replaced else plan.added[p][0]
        for p in (f["path"] for f in layer["files"])
    }
    files[f"files/{plan.dist_info_new}/METADATA"] = meta
    files[LAYER_SCRIPT] = LAYER_PAYLOAD.read_bytes()
    files["layer.json"] = (json.dumps(layer, indent=2) + "\n").encode()
    image_info = {k: v for k, v in info.items() if k != "seconds"}
    image_info["image"] = {"from": from_reference(project.pin), "revision": revision}
    files["build.json"] = (json.dumps(image_info, indent=2) + "\n").encode()
    files["Dockerfile"] = dockerfile(
        project.pin, plan, patches, layer, revision, context
    ).encode()
    final = out_dir / IMAGE_DIR
    tmp = out_dir / f".{IMAGE_DIR}.tmp"
    fsutil.remove_tree(tmp)
    for rel, data in sorted(files.items()):
        fsutil.write_bytes(tmp / rel, data)
    if final.is_dir() and not final.is_symlink():
        fsutil.remove_tree(final)
    else:
        fsutil.remove(final)
    fsutil.replace(tmp, final)
    return {
        "context": f"{IMAGE_DIR}/",
        "files": len(files),
        "bytes": sum(len(d) for d in files.values()),
        "layer_files": len(layer["files"]),
        "layer_bytes": sum(f["size"] for f in layer["files"]),
        "revision": revision,
    }


def earlier_builds(out_dir: Path, label: str, current: str) -> list[Path]:
    """Wheels an earlier `vstack build` wrote into out_dir (and the partial file of
    one that was killed): only the current build stays in out_dir."""
    found = [
        p
        for p in out_dir.glob(f"vllm-*+{label}.*.whl")
        if p.name != current and p.is_file()
    ]
    found += [p for p in out_dir.glob(f".vllm-*+{label}.*.whl.tmp") if p.is_file()]
    return sorted(found)


def build(project: Project, out_dir: Path | None = None, log=None) -> dict:
    log = log or (lambda s: print(s, file=sys.stderr))
    # An --out folder must be build's own: the earlier builds it removes there are
    # then wheels it wrote, never a user's files (dist/ is vstack's by definition).
    default = out_dir is None
    out_dir = out_dir or project.dist
    fsutil.own_folder(out_dir, "vstack build", default, create=False)
    pin = project.pin
    t0 = time.perf_counter()
    patches = series_paths(project.patches_dir)
    wheel = pinned_wheel(project)
    base: Base = ensure_base(project)
    tip = applied_tip(project, base, patches)
    changes = gitutil.tree_changes(project.repo, base.commit, tip)
    members, _ = read_members(wheel)
    wanted = [p for s, p, _ in changes if s != "D"]
    blobs = gitutil.read_blobs(project.repo, tip, wanted)
    upstream = wheel_dist_version(members, wheel.name)
    version = local_version(upstream, local_label(project.label, patches))
    try:
        plan = plan_build(members, changes, blobs, upstream, version, wheel.name)
    except ValueError as e:
        raise VstackError(f"cannot build: {e}") from None
    fsutil.own_folder(out_dir, "vstack build", default)
    out = out_dir / plan.wheel_name
    log(
        f"vstack: writing {out} ({len(plan.replaced)} changed, {len(plan.added)} new "
        f"files, vllm/_version.py and the dist-info rewritten for the version) ..."
    )
    stock = read_stock(wheel, members, plan)
    write_wheel(wheel, members, plan, out, stock)
    for old in earlier_builds(out_dir, project.label, plan.wheel_name):
        fsutil.remove(old)
        log(f"vstack: removed the earlier build {old.name}")
    info = {
        "version": version,
        "wheel": plan.wheel_name,
        "base": {"version": pin.version, "commit": pin.commit, "wheel": pin.wheel,
                 "sha256": pin.sha256, "git": base.commit, "source": base.source,
                 "image": pin.image_ref},
        "patches": [p.name for p in patches],
        "series": series_digest(patches),
        "applied_commit": tip,
        "changed": sorted(plan.replaced),
        "added": sorted(plan.added),
        "deleted": sorted(plan.deleted),
        "outside_wheel": plan.outside,
    }  # fmt: skip
    context = f"dist/{IMAGE_DIR}/" if default else f"{out_dir / IMAGE_DIR}/"
    image = write_image_context(
        out_dir, project, plan, members, stock, patches, info, log, context
    )
    # what earlier builds wrote for `docker build dist/` (the context is image/ now)
    for old in ("Dockerfile", ".dockerignore"):
        fsutil.remove(out_dir / old)
    info["image"] = image
    info["seconds"] = round(time.perf_counter() - t0, 3)
    fsutil.write_text(out_dir / "build.json", json.dumps(info, indent=2) + "\n")
    if not pin.image_digest:
        log(
            f"vstack: note: FROM {pin.image} follows the tag; set [base] image_digest "
            f"in stack.toml to pin it (docker buildx imagetools inspect {pin.image})"
        )
    return info


def extract_outside(project: Project, out_dir: Path) -> list[str]:
    """Write the series' files outside the wheel (its tests) from the applied tree."""
    patches = series_paths(project.patches_dir)
    base = ensure_base(project)
    tip = applied_tip(project, base, patches)
    changes = gitutil.tree_changes(project.repo, base.commit, tip)
    paths = [p for s, p, _ in changes if s != "D" and not p.startswith("vllm/")]
    for path, data in gitutil.read_blobs(project.repo, tip, paths).items():
        fsutil.write_bytes(out_dir / path, data)
    return paths


def clear_own_folder(folder: Path) -> None:
    """Everything in an output folder vstack owns, except its ownership marker."""
    for child in folder.iterdir():
        if child.name == fsutil.OWN_MARKER:
            continue
        if child.is_dir() and not child.is_symlink():
            fsutil.remove_tree(child)
        else:
            fsutil.remove(child)


def write_test_files(project: Project, out_dir: Path) -> list[str]:
    """`vstack test-files --out DIR`: only into a new or empty folder, or one an
    earlier test-files made (its .vstack-out marker), whose old files it replaces."""
    what = "vstack test-files"
    fsutil.own_folder(out_dir, what, create=False)
    project.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=project.cache) as tmp:
        paths = extract_outside(
            project, Path(tmp)
        )  # a failure leaves out_dir as it was
        fsutil.own_folder(out_dir, what)
        clear_own_folder(out_dir)
        for path in paths:
            fsutil.copy_file(Path(tmp) / path, out_dir / path)
    return paths
