"""dist/image/ built for real with buildah (daemonless; `apt-get install buildah`),
where it is installed: a base image made here (this machine's Python, pip, and the
stock wheel installed with pip, as vLLM's image has it; no registry is reachable),
FROM it by digest, the layer built, its labels read, its one new layer's entries
listed, and the result verified inside the image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_image import series_and_build, stock_wheel

BASE = "localhost/vstack-test-base:1"
OUT = "localhost/vllm-eplb:test"


class Buildah:
    def __init__(self, tmp: Path):
        self.exe = shutil.which("buildah")
        store = tmp / "storage"
        self.flags = ["--root", str(store / "root"), "--runroot", str(store / "run"),
                      "--storage-driver", "vfs"]  # fmt: skip

    def __call__(self, *args: str, check=True) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [self.exe, *self.flags, *args], capture_output=True, text=True, timeout=300
        )
        if check and p.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {p.stdout}{p.stderr}")
        return p

    def bud(self, tag: str, context: Path) -> str:
        """Builds context as tag; the build's output (its RUN steps' too)."""
        p = self("bud", "--isolation", "chroot", "--pull-never", "--layers=false",
                 "-t", tag, str(context), check=False)  # fmt: skip
        if p.returncode != 0:
            raise AssertionError(f"buildah bud {context}:\n{p.stdout}{p.stderr}")
        return p.stdout + p.stderr


def _ldd(path: Path) -> list[str]:
    p = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    found = []
    for line in p.stdout.splitlines():
        parts = line.split()
        for word in parts:
            if word.startswith("/"):
                found.append(word)
    return found


def python_rootfs(root: Path) -> tuple[str, str]:
    """A root file system holding this machine's Python (its base interpreter, the
    standard library, the libraries they link), /bin/sh and pip: (python, site)."""
    exe = os.path.realpath(
        Path(sys.base_prefix)
        / "bin"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )
    ask = "import sysconfig; print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('purelib'))"
    stdlib, site = subprocess.run(
        [exe, "-I", "-c", ask], capture_output=True, text=True, check=True
    ).stdout.split()
    sh = os.path.realpath("/bin/sh")
    libs = {exe, sh, *_ldd(Path(exe)), *_ldd(Path(sh))}
    for so in Path(stdlib).glob("lib-dynload/*.so"):
        libs.update(_ldd(so))
    for f in sorted(libs):
        dst = root / f.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(f), dst)
    skip = shutil.ignore_patterns("test", "tests", "__pycache__", "site-packages",
                                  "dist-packages", "idlelib", "tkinter", "turtledemo",
                                  "config-*", "ensurepip", "lib2to3", "pydoc_data")  # fmt: skip
    shutil.copytree(stdlib, root / stdlib.lstrip("/"), ignore=skip, symlinks=True)
    import pip

    pip_dir = Path(pip.__file__).parent
    target = root / site.lstrip("/")
    shutil.copytree(
        pip_dir, target / "pip", ignore=shutil.ignore_patterns("__pycache__")
    )
    for info in pip_dir.parent.glob("pip-*.dist-info"):
        shutil.copytree(info, target / info.name)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    if not (root / "usr/bin/python3").exists():
        (root / "usr/bin/python3").symlink_to(exe)
    if not (root / "bin/sh").exists():
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin/sh").symlink_to(sh)
    for d in ("tmp", "etc", "proc", "sys", "dev", "run"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for f in ("etc/hosts", "etc/resolv.conf", "etc/hostname"):
        (root / f).touch()
    return exe, site


@pytest.fixture
def buildah(tmp_path):
    if not shutil.which("buildah"):
        pytest.skip("buildah is not installed (apt-get install buildah); the layer's "
                    "steps are tested on CPU by tests/test_image.py")  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("buildah with chroot isolation and vfs storage needs root here")
    b = Buildah(tmp_path)
    probe = b("images", check=False)
    if probe.returncode != 0:
        pytest.skip(f"buildah cannot run here: {probe.stderr.strip()[:200]}")
    yield b
    b("rm", "--all", check=False)
    b("rmi", "--all", "--force", check=False)


def _layers(b: Buildah, image: str, where: Path) -> list[Path]:
    b("push", "-q", image, f"oci:{where}:x")
    index = json.loads((where / "index.json").read_text())
    blob = where / "blobs" / "sha256"
    manifest = json.loads(
        (blob / index["manifests"][0]["digest"].split(":")[1]).read_text()
    )
    return [blob / layer["digest"].split(":")[1] for layer in manifest["layers"]]


def test_image_builds_with_buildah_and_adds_one_small_layer(stack, buildah, tmp_path):
    stock = stock_wheel(stack)
    base_ctx = tmp_path / "base"
    _, site = python_rootfs(base_ctx / "rootfs")
    shutil.copy(stock, base_ctx / stock.name)
    (base_ctx / "Dockerfile").write_text(
        "FROM scratch\nCOPY rootfs/ /\n"
        f"COPY {stock.name} /tmp/\n"
        'RUN ["python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps", '
        f'"--no-compile", "--disable-pip-version-check", "/tmp/{stock.name}"]\n'
    )
    buildah.bud(BASE, base_ctx)
    digest = buildah("images", "--format", "{{.Digest}}", BASE).stdout.strip()
    assert digest.startswith("sha256:")
    toml = stack.root / "stack.toml"
    text = toml.read_text().replace(
        'image = "vllm/vllm-openai:v1.0.0"', f'image = "{BASE}"'
    )
    toml.write_text(text.replace('image_digest = ""', f'image_digest = "{digest}"'))
    info = series_and_build(stack)

    out = buildah.bud(OUT, stack.root / "dist" / "image")
    assert "vstack-layer: ok" in out, out
    assert f"vstack-layer: import vllm: {info['version']} from {site}/vllm" in out
    assert "vstack-layer: pip check: nothing about vllm" in out

    config = json.loads(buildah("inspect", "--type", "image", OUT).stdout)
    labels = config["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == info["version"]
    assert labels["org.opencontainers.image.base.name"] == BASE
    assert labels["org.opencontainers.image.base.digest"] == digest
    assert labels["vstack.series"] == info["series"]
    assert labels["vstack.patches"] == ",".join(info["patches"])

    base_layers = _layers(buildah, BASE, tmp_path / "oci-base")
    layers = _layers(buildah, OUT, tmp_path / "oci-out")
    assert len(layers) == len(base_layers) + 1  # one new layer
    with tarfile.open(layers[-1]) as t:
        entries = {m.name.rstrip("/"): m for m in t.getmembers()}
    new_dist = f"vllm-{info['version']}.dist-info"
    s = site.lstrip("/")
    files = sorted(n for n, m in entries.items() if not m.isdir())
    assert files == sorted([
        f"{s}/vllm/_version.py", f"{s}/vllm/a_first.py", f"{s}/vllm/config.py",
        f"{s}/vllm/distributed/eplb/state.py", f"{s}/vllm/distributed/eplb/symm.py",
        f"{s}/.wh.vllm-1.0.0.dist-info", f"{s}/vllm/.wh.legacy",
        *(f"{s}/{new_dist}/{n}" for n in ("INSTALLER", "METADATA", "RECORD", "REQUESTED",
                                           "WHEEL", "entry_points.txt", "top_level.txt",
                                           "licenses/LICENSE")),
        "opt/vstack/build.json", "opt/vstack/layer.json", "opt/vstack/vstack-layer.py",
    ]), files  # fmt: skip
    assert entries[f"{s}/vllm/config.py"].mode & 0o777 == 0o755
    size = sum(m.size for m in entries.values())
    assert size < 64 * 1024, size  # this test's series; the real one: docs/image.md

    # the image runs its verification again, and vLLM reports the new version
    ctr = buildah("from", "--pull-never", OUT).stdout.strip()
    p = buildah("run", "--isolation", "chroot", ctr, "--", "python3", "-B",
                "/opt/vstack/vstack-layer.py", "verify")  # fmt: skip
    assert p.stdout.endswith("vstack-layer: ok\n")
    p = buildah("run", "--isolation", "chroot", ctr, "--", "python3", "-B", "-c",
                "import vllm, vllm.config; print(vllm.__version__, vllm.config.A)")  # fmt: skip
    assert p.stdout.split() == [info["version"], "2"]
