"""dist/image/: the docker build context `vstack build` writes. Its one layer holds
what the series changes; tested on CPU by running the Dockerfile's own RUN step in a
throwaway venv that holds the stock wheel (what the base image holds) and comparing
with the patched wheel installed by pip: the same files, RECORD and `pip show`.
Where buildah is installed, the image is also built for real (test_image_buildah.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from vstack_testlib import git, make_wheel, sha256

from vstack.build import CONTEXT_MOUNT, IMAGE_RECORD, qualified_image

STOCK = {
    "vllm/__init__.py": b"from vllm._version import __version__\n",
    "vllm/config.py": b"A = 1\n",
    "vllm/cli.py": b"def main():\n    print('vllm cli')\n",
    "vllm/legacy/only.py": b"GONE = False\n",
    # Python (compileall reads it); commit_state_edit changes its line 5
    "vllm/distributed/eplb/state.py": "".join(
        f"# line {i}\n" for i in range(1, 41)
    ).encode(),
    "vllm-1.0.0.dist-info/entry_points.txt": b"[console_scripts]\nvllm = vllm.cli:main\n",
    "vllm-1.0.0.dist-info/licenses/LICENSE": b"Apache-2.0, for the test\n",
}
COMMIT_MSG = "[EPLB] {}\n\nWhy: for the test.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>"


def stock_wheel(stack, files=None) -> Path:
    """The stack's pinned wheel, remade with STOCK's files (a console script, a
    license folder, a package the series deletes); stack.toml re-pinned to it."""
    wheel = make_wheel(stack.wheel, files={**STOCK, **(files or {})})
    toml = stack.root / "stack.toml"
    old = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(old, sha256(wheel)))
    return wheel


def series_and_build(stack) -> dict:
    """A series that edits a file, adds one, deletes the only file of a package
    and makes a file executable; then `vstack build`."""
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    repo = stack.repo
    (repo / "vllm/distributed/eplb/symm.py").write_text("X = 1\n")
    (repo / "vllm/a_first.py").write_text("FIRST = 1\n")  # sorts early in RECORD
    (repo / "vllm/legacy/only.py").unlink()
    (repo / "vllm/config.py").write_text("A = 2\n")
    (repo / "vllm/config.py").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", COMMIT_MSG.format("Add, delete, chmod"))
    assert stack.run("export") == 0
    assert stack.run("build") == 0
    return json.loads((stack.root / "dist/build.json").read_text())


def run_step(dockerfile: Path) -> str:
    """The Dockerfile's RUN step as a command line, --mount flags left out."""
    text = dockerfile.read_text().replace("\\\n", " ")
    runs = [ln for ln in text.splitlines() if ln.startswith("RUN ")]
    assert len(runs) == 1, runs
    words = shlex.split(runs[0][len("RUN ") :])
    return shlex.join([w for w in words if not w.startswith("--mount=")])


def venv(path: Path) -> Path:
    """A venv without packages but pip (linked from the test environment: fast)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True
    )
    site = (
        path
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages"
    )
    import pip

    (site / "pip").symlink_to(Path(pip.__file__).parent)
    return path / "bin" / "python"


def _umask022():
    os.umask(0o022)  # as in a docker RUN step; pip's file modes follow the umask


def pip(py: Path, *args: str) -> str:
    p = subprocess.run(
        [str(py), "-B", "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True, text=True, preexec_fn=_umask022,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def install(py: Path, wheel: Path, *extra: str, by_path=False) -> None:
    """pip install of the wheel: by name from a folder of wheels, or by its path
    (as vLLM's Dockerfile installs its wheel; pip then writes direct_url.json)."""
    version = wheel.name.split("-")[1]
    what = [str(wheel)] if by_path else [f"vllm=={version}"]
    pip(py, "install", "-q", "--no-index", "--find-links", str(wheel.parent),
        "--no-deps", *extra, *what)  # fmt: skip


def apply_layer(stack, py: Path, into: Path, ctx=None, env=None):
    """The Dockerfile's RUN step in the venv: python3 is the venv's, the bind mount
    of the context is dist/image itself, the image's record goes to `into`."""
    ctx = ctx or stack.root / "dist" / "image"
    cmd = run_step(ctx / "Dockerfile")
    assert cmd.startswith("python3 -B ")
    cmd = cmd.replace(CONTEXT_MOUNT, str(ctx)).replace(IMAGE_RECORD, str(into))
    argv = [str(py), *shlex.split(cmd)[1:]]
    return subprocess.run(
        argv, capture_output=True, text=True, preexec_fn=_umask022, env=env
    )


def tree(root: Path, skip=(), digest=False) -> dict[str, tuple]:
    """Every entry under root: kind, mode and bytes, or their sha256 with digest
    (links not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if any(rel == s or rel.startswith(s + "/") for s in skip):
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                data = p.read_bytes()
                data = hashlib.sha256(data).hexdigest() if digest else data
                out[rel] = ("file", stat.S_IMODE(st.st_mode), data)
    return out


def site_of(py: Path) -> Path:
    return next(py.parent.parent.glob("lib/python*/site-packages"))


def test_layer_equals_the_patched_wheel_installed_by_pip(stack, tmp_path):
    """The RUN step on the stock wheel installed (no bytecode, as uv installs the
    official image's vLLM) gives byte for byte what pip gives for the patched
    wheel: every file and mode, RECORD, the console script, `pip show -f`."""
    stock = stock_wheel(stack)
    info = series_and_build(stack)
    env = tmp_path / "env"  # both at the same path: the same script shebangs
    py = venv(env)
    install(py, next((stack.root / "dist").glob("*.whl")), "--no-compile")
    want, want_show = tree(env), pip(py, "show", "-f", "vllm")
    shutil.rmtree(env)

    py = venv(env)
    install(py, stock, "--no-compile", by_path=True)
    assert (site_of(py) / "vllm-1.0.0.dist-info/direct_url.json").is_file()
    into = tmp_path / "opt-vstack"
    p = apply_layer(stack, py, into)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.splitlines()
    assert out[-1] == "vstack-layer: ok"
    assert "vstack-layer: pip check: nothing about vllm" in out
    assert (
        f"vstack-layer: import vllm: {info['version']} from {site_of(py)}/vllm" in out
    )
    have = tree(env)
    assert sorted(have) == sorted(want)
    assert [k for k in want if have[k] != want[k]] == []
    assert pip(py, "show", "-f", "vllm") == want_show
    site = site_of(py).relative_to(env).as_posix()
    assert f"{site}/vllm/legacy" not in have  # the deleted package's folder too
    assert have[f"{site}/vllm/config.py"][:2] == ("file", 0o755)
    assert not list(site_of(py).glob("vllm-1.0.0.dist-info"))
    # the image's record of the build
    assert sorted(p.name for p in into.iterdir()) == [
        "build.json",
        "layer.json",
        "vstack-layer.py",
    ]
    recorded = json.loads((into / "build.json").read_text())
    assert recorded["version"] == info["version"] and "seconds" not in recorded
    # verify, run again later (as `docker run IMAGE python3 /opt/vstack/...` would)
    p = subprocess.run([str(py), "-B", str(into / "vstack-layer.py"), "verify",
                        str(into / "layer.json")], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0 and p.stdout.endswith("vstack-layer: ok\n"), p.stderr


def test_empty_series_layer_changes_only_the_version(stack, tmp_path):
    """No patch: the layer still renames vLLM to <version>+eplb.empty (_version.py,
    the dist-info), as pip's install of the built wheel has it."""
    stock = stock_wheel(stack)
    assert stack.run("build") == 0
    env = tmp_path / "env"
    py = venv(env)
    wheel = next((stack.root / "dist").glob("*.whl"))
    assert "+eplb.empty-" in wheel.name
    install(py, wheel, "--no-compile")
    want = tree(env)
    shutil.rmtree(env)
    py = venv(env)
    install(py, stock, "--no-compile")
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 file(s) written, 0 removed" in p.stdout
    assert tree(env) == want


def test_context_holds_only_the_delta(stack):
    stock_wheel(stack)
    info = series_and_build(stack)
    ctx = stack.root / "dist" / "image"
    files = sorted(p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file())
    new_dist = f"vllm-{info['version']}.dist-info"
    assert files == sorted([
        "Dockerfile", "build.json", "layer.json", "vstack-layer.py",
        "files/vllm/_version.py", "files/vllm/a_first.py", "files/vllm/config.py",
        "files/vllm/distributed/eplb/state.py", "files/vllm/distributed/eplb/symm.py",
        f"files/{new_dist}/METADATA",
    ])  # fmt: skip
    layer = json.loads((ctx / "layer.json").read_text())
    assert [f["path"] for f in layer["deleted"]] == ["vllm/legacy/only.py"]
    assert {f["path"]: f["old"] is None for f in layer["files"]} == {
        "vllm/_version.py": False, "vllm/config.py": False,
        "vllm/distributed/eplb/state.py": False, "vllm/distributed/eplb/symm.py": True,
        "vllm/a_first.py": True,
    }  # fmt: skip
    # the whole wheel stays beside it, for pip; the old dist/Dockerfile is gone
    assert (stack.root / "dist" / info["wheel"]).is_file()
    assert not (stack.root / "dist" / "Dockerfile").exists()
    assert info["image"]["context"] == "image/"


def test_dockerfile_from_labels_and_note(stack, capsys):
    stock_wheel(stack)
    capsys.readouterr()
    info = series_and_build(stack)
    err = capsys.readouterr().err
    note = (
        "vstack: note: FROM vllm/vllm-openai:v1.0.0 follows the tag; set [base] "
        "image_digest in stack.toml to pin it"
    )
    assert note in err
    text = (stack.root / "dist/image/Dockerfile").read_text()
    # fully qualified: podman and buildah resolve no short names by default
    assert "\nFROM docker.io/vllm/vllm-openai:v1.0.0\n" in text
    labels = dict(re.findall(r'([a-z][\w.-]+)="([^"]*)"', text.split("\nLABEL ")[1]))
    patches = (stack.root / "patches/series").read_text().split()
    patches = [p for p in patches if p.endswith(".patch")]
    assert labels["org.opencontainers.image.version"] == info["version"]
    assert (
        labels["org.opencontainers.image.base.name"]
        == "docker.io/vllm/vllm-openai:v1.0.0"
    )
    assert "org.opencontainers.image.base.digest" not in labels
    assert "org.opencontainers.image.revision" not in labels  # the stack is no repo
    assert labels["vstack.series"] == info["series"]
    assert labels["vstack.patches"] == ",".join(patches)
    # pinned by digest, in a repository: FROM by digest, base.digest, revision
    digest = "sha256:" + "ab" * 32
    toml = stack.root / "stack.toml"
    toml.write_text(
        toml.read_text().replace('image_digest = ""', f'image_digest = "{digest}"')
    )
    git(stack.root, "init", "-q")
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")
    head = git(stack.root, "rev-parse", "HEAD").strip()
    capsys.readouterr()
    assert stack.run("build") == 0
    assert "follows the tag" not in capsys.readouterr().err
    text = (stack.root / "dist/image/Dockerfile").read_text()
    assert f"\nFROM docker.io/vllm/vllm-openai:v1.0.0@{digest}\n" in text
    in_image = json.loads((stack.root / "dist/image/build.json").read_text())
    assert in_image["image"] == {
        "from": f"docker.io/vllm/vllm-openai:v1.0.0@{digest}",
        "revision": head,
    }
    assert f'org.opencontainers.image.base.digest="{digest}"' in text
    assert f'org.opencontainers.image.revision="{head}"' in text
    # uncommitted patches/: the revision says so
    (stack.root / "patches" / "series").write_text(
        (stack.root / "patches" / "series").read_text() + "\n"
    )
    capsys.readouterr()
    assert stack.run("build") == 0
    assert f"revision label says {head}-dirty" in capsys.readouterr().err
    assert (
        f'revision="{head}-dirty"' in (stack.root / "dist/image/Dockerfile").read_text()
    )


@pytest.mark.parametrize(
    "old,new,says",
    [
        ('image_digest = ""', 'image_digest = "abc"',
         '[base] image_digest is not "sha256:" and 64 lowercase hex digits (or "" to '
         "follow the image tag)"),
        # a digest in image: FROM image@image_digest would have two
        (':v1.0.0"', f':v1.0.0@sha256:{"ab" * 32}"',
         "[base] image must be a name and tag without spaces or a digest "
         "(vllm/vllm-openai:v0.34.0); put the digest in image_digest"),
        # a line break would add a line of its own to the Dockerfile
        (':v1.0.0"', r':v1.0.0\nRUN rm -rf /"', "put the digest in image_digest"),
    ],
)  # fmt: skip
def test_a_bad_image_or_digest_is_one_line(stack, capsys, old, new, says):
    toml = stack.root / "stack.toml"
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new))
    capsys.readouterr()
    assert stack.run("build") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(says)
    assert not (stack.root / "dist" / "image").exists()


@pytest.mark.parametrize(
    "image,name",
    [
        ("vllm/vllm-openai:v0.34.0", "docker.io/vllm/vllm-openai:v0.34.0"),
        ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("ghcr.io/o/vllm:x", "ghcr.io/o/vllm:x"),
        ("localhost:5000/vllm:x", "localhost:5000/vllm:x"),
        ("localhost/vllm:x", "localhost/vllm:x"),
    ],
)
def test_base_name_label_is_a_full_reference(image, name):
    assert qualified_image(image) == name


def test_stale_bytecode_goes_and_the_new_code_runs(stack, tmp_path):
    """A base image whose vLLM was compiled with unchecked-hash pycs would run the
    stale bytecode of a changed file: the layer removes it (and that of the files
    the series deletes), and RECORD stays true."""
    stock = stock_wheel(stack)
    series_and_build(stack)
    py = venv(tmp_path / "env")
    install(py, stock, "--no-compile")
    site = site_of(py)
    subprocess.run(
        [str(py), "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash",
         str(site / "vllm")], check=True,
    )  # fmt: skip
    assert (site / "vllm/__pycache__").is_dir()
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (
        "4 stale bytecode file(s) removed" in p.stdout
    )  # _version, config, state, only
    assert not (site / "vllm/legacy").exists()
    run = subprocess.run(
        [str(py), "-c", "import vllm.config, vllm; print(vllm.config.A, vllm.__version__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.split()[0] == "2" and "+eplb.g" in run.stdout
    # bytecode of unchanged files stays (vllm/__init__, cli)
    assert sorted(
        p.name.split(".")[0] for p in (site / "vllm/__pycache__").iterdir()
    ) == ["__init__", "cli"]


def test_refuses_a_base_that_is_not_the_pinned_wheel(stack, tmp_path):
    stock = stock_wheel(stack)
    series_and_build(stack)
    py = venv(tmp_path / "env")
    install(py, stock, "--no-compile")
    site = site_of(py)
    (site / "vllm/config.py").write_text("A = 'someone else built this'\n")
    before = tree(site)
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "vstack-layer: error: the base image's vLLM is not the pinned wheel: "
        "vllm/config.py differs from the pinned wheel's"
    ]
    assert tree(site) == before  # nothing written
    # two vLLMs installed (an old dist-info left over): refused, naming both
    (site / "vllm/config.py").write_text("A = 1\n")
    (site / "vllm-0.9.0.dist-info").mkdir()
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 1 and "expected one installed vLLM" in p.stderr
    assert "vllm-0.9.0.dist-info" in p.stderr and "vllm-1.0.0.dist-info" in p.stderr


def test_verify_catches_a_changed_file_and_a_new_pip_check_problem(stack, tmp_path):
    stock = stock_wheel(stack)
    series_and_build(stack)
    py = venv(tmp_path / "env")
    install(py, stock, "--no-compile")
    site = site_of(py)
    # a package that pins vLLM exactly: the layer's version breaks it
    plugin = site / "plugin-1.0.dist-info"
    plugin.mkdir()
    (plugin / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plugin\nVersion: 1.0\nRequires-Dist: vllm===1.0.0\n"
    )
    (plugin / "RECORD").write_text("plugin-1.0.dist-info/METADATA,,\n")
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 1
    assert (
        "vstack-layer: error: pip check: plugin 1.0 has requirement vllm===1.0.0"
        in p.stderr
    )
    shutil.rmtree(plugin)
    p = subprocess.run([str(py), "-B", str(tmp_path / "opt/vstack-layer.py"), "verify",
                        str(tmp_path / "opt/layer.json")], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr
    (site / "vllm/distributed/eplb/state.py").write_text("tampered\n")
    p = subprocess.run([str(py), "-B", str(tmp_path / "opt/vstack-layer.py"), "verify",
                        str(tmp_path / "opt/layer.json")], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 1
    assert "vllm/distributed/eplb/state.py has 9 bytes, RECORD says" in p.stderr


def test_a_vllm_problem_the_base_had_is_not_the_layers(stack, tmp_path):
    """pip check is limited to what the layer changed: a dependency of vLLM the base
    image lacks already is noted, not failed."""
    meta = (
        b"Metadata-Version: 2.4\nName: vllm\nVersion: 1.0.0\n"
        b"Requires-Dist: not-installed-anywhere\n\nA test wheel.\n"
    )
    stock = stock_wheel(stack, {"vllm-1.0.0.dist-info/METADATA": meta})
    series_and_build(stack)
    py = venv(tmp_path / "env")
    install(py, stock, "--no-compile")
    p = apply_layer(stack, py, tmp_path / "opt")
    assert p.returncode == 0, p.stderr
    assert (
        "vstack-layer: pip check: 1 line(s) about vllm, each as in the base image: "
        "vllm <version> requires not-installed-anywhere, which is not installed."
    ) in p.stdout


def test_build_prints_the_docker_build_command(stack, capsys, monkeypatch, tmp_path):
    """The build's last line is the docker build command, its context named as the
    user's shell sees it (relative inside the project, absolute outside, --out as
    given); the Dockerfile's own comment has the same tag."""
    monkeypatch.chdir(stack.root)
    capsys.readouterr()
    assert stack.run("build") == 0
    got = capsys.readouterr()
    out = got.out.splitlines()
    info = json.loads((stack.root / "dist/build.json").read_text())
    tag = info["version"].replace("+", "-")
    assert out[-1] == f"vstack: next: docker build -t vllm-eplb:{tag} dist/image/"
    assert out[-2].startswith("vstack: wrote dist/image/ (the docker build context: ")
    # the layer changes one file more than the wheel line counts: it says which
    series = len(info["changed"]) + len(info["added"])
    assert info["image"]["layer_files"] == series + 1
    what = f"the {series} the series changes or adds, and " if series else "only "
    assert (f"its layer changes {series + 1} file(s) of vLLM: {what}vllm/_version.py, "
            "which carries the version) and build.json") in out[-2], out[-2]  # fmt: skip
    assert "vllm/_version.py and the dist-info rewritten for the version" in (
        got.out + got.err
    )
    dockerfile = (stack.root / "dist/image/Dockerfile").read_text()
    assert f"#   docker build -t vllm-eplb:{tag} dist/image/\n" in dockerfile
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert stack.run("build") == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(f" {stack.root / 'dist/image'}/")
    assert stack.run("build", "--out", "my out") == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(" 'my out/image/'")
    assert (elsewhere / "my out/image/Dockerfile").is_file()
