"""The real pinned vLLM wheel: build it, install it with --no-deps into a throwaway
venv, import it, and let independent tools check RECORD."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from vstack.config import load_project

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.real_wheel


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("needs the CPU test environment (run scripts/test)")
    project = load_project(ROOT)
    if not (project.wheel_cache / project.pin.wheel).is_file() and os.environ.get(
        "VSTACK_OFFLINE"
    ):
        pytest.skip("VSTACK_OFFLINE set and the pinned wheel is not cached")
    from vstack.build import build

    out = tmp_path_factory.mktemp("dist")
    info = build(project, out)
    return project, out / info["wheel"], info


def test_real_build_is_byte_identical_twice(built, tmp_path):
    project, wheel, info = built
    from vstack.build import build

    again = build(project, tmp_path)
    assert (tmp_path / again["wheel"]).read_bytes() == wheel.read_bytes()


def test_real_wheel_installs_and_reports_version(built, tmp_path):
    project, wheel, info = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # Reuse torch and vLLM's dependencies from the test environment through a .pth
    # file: it is read after the throwaway venv's own site-packages, so `vllm` itself
    # resolves to the freshly installed wheel.
    site = Path(subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip())  # fmt: skip
    parent = sysconfig.get_path("purelib")
    (site / "zz_test_env.pth").write_text(parent + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
         "--no-index", "--disable-pip-version-check", str(wheel)],
        check=True,
    )  # fmt: skip
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    code = (
        "import json, vllm, importlib.metadata as m, pathlib;"
        "d = m.distribution('vllm');"
        "print(json.dumps({'version': vllm.__version__, 'meta': d.version,"
        " 'file': vllm.__file__}))"
    )
    proc = subprocess.run(
        [str(py), "-c", code], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"] == info["version"] == got["meta"]
    assert got["file"].startswith(str(venv))
    # Every installed file matches its RECORD hash (pip wrote RECORD from the wheel's).
    check = (
        "import importlib.metadata as m, hashlib, base64, sys;"
        "d = m.distribution('vllm'); bad = []; n = 0\n"
        "for f in d.files:\n"
        "    if f.hash is None: continue\n"
        "    n += 1; data = f.locate().read_bytes()\n"
        "    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()\n"
        "    bad += [str(f)] if h != f.hash.value or len(data) != f.size else []\n"
        "print(n, len(bad)); sys.exit(1 if bad or n < 5000 else 0)"
    )
    subprocess.run([str(py), "-c", check], check=True, env=env)
    # pip uninstall removes exactly what RECORD lists: nothing of vLLM may remain.
    assert Path(got["file"]).parent.parent == site
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "vllm"], check=True)
    assert not (site / "vllm").exists()
    assert not list(site.glob("vllm-*.dist-info"))


def test_real_wheel_record_verified_by_wheel_unpack(built, tmp_path):
    pytest.importorskip("wheel")
    _, wheel, info = built
    # `wheel unpack` checks every member against RECORD and fails on a mismatch.
    subprocess.run(
        [sys.executable, "-m", "wheel", "unpack", "-d", str(tmp_path), str(wheel)],
        check=True,
        capture_output=True,
    )
    with zipfile.ZipFile(wheel) as zf:
        assert f"vllm-{info['version']}.dist-info/RECORD" in zf.namelist()


def test_real_image_layer_equals_the_patched_wheel_installed(built, tmp_path):
    """Issue 29: the image's RUN step (dist/image/) on the real stock wheel installed
    by path, as vLLM's image installs it, gives the files, RECORD and `pip show -f`
    of the real patched wheel installed by pip; the context and the layer are small."""
    from test_image import apply_layer, install, pip, site_of, tree, venv

    project, wheel, info = built
    ctx = wheel.parent / "image"
    stock = project.wheel_cache / project.pin.wheel
    # vLLM's dependencies (torch, ...) from the test environment, vLLM itself not:
    # the layer refuses an environment with two vLLMs installed
    deps = tmp_path / "deps"
    deps.mkdir()
    for p in Path(sysconfig.get_path("purelib")).iterdir():
        if not p.name.startswith(("vllm", "__pycache__")) and p.suffix != ".pth":
            (deps / p.name).symlink_to(p)
    env = tmp_path / "env"

    def fresh_env() -> Path:
        py = venv(env)
        (site_of(py) / "zz_deps.pth").write_text(f"{deps}\n")
        (site_of(py) / "pip").unlink()  # the one in deps/
        return py

    py = fresh_env()
    install(py, wheel, "--no-compile")
    want, want_show = tree(env, digest=True), pip(py, "show", "-f", "vllm")
    shutil.rmtree(env)
    py = fresh_env()
    install(py, stock, "--no-compile", by_path=True)
    run_env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    p = apply_layer(None, py, tmp_path / "opt", ctx=ctx, env=run_env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.endswith("vstack-layer: ok\n")
    have = tree(env, digest=True)
    assert sorted(have) == sorted(want)
    assert [k for k in want if have[k] != want[k]] == []
    assert pip(py, "show", "-f", "vllm") == want_show
    # sizes: the context, and the layer (what the RUN step wrote) as a gzip'd tar
    layer = json.loads((tmp_path / "opt" / "layer.json").read_text())
    site = site_of(py)
    written = [site / f["path"] for f in layer["files"]]
    written += [p for p in (site / layer["dist_info"]["new"]).rglob("*") if p.is_file()]
    written += list((tmp_path / "opt").iterdir())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for f in written:
            t.add(f)
    raw = sum(f.stat().st_size for f in written)
    print(
        f"context {info['image']['bytes']} B; layer {raw} B, {len(buf.getvalue())} B gzip"
    )
    assert info["image"]["bytes"] < 1 << 20
    assert len(buf.getvalue()) < 1 << 20
