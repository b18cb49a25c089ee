"""vstack rebase onto vLLM's per-commit wheel repository (`nightly`, a commit id),
served by a local http.server laid out like vLLM's; the nightly pin builds offline."""

from __future__ import annotations

import hashlib
import json
import shutil
import tomllib
import zipfile

import pytest
from vstack_testlib import (
    git,
    make_wheel,
    per_commit_repo,
    serve,
    sha256,
)

from vstack.config import load_project
from vstack.nightly import (
    choose_wheel,
    commit_of,
    index_url,
    nearest_record,
    parse_simple_index,
    version_key,
)

OLD = hashlib.sha1(b"older commit").hexdigest()
NEW = hashlib.sha1(b"newest commit").hexdigest()
OLD_VERSION = f"1.0.1.dev3+g{OLD[:9]}"
NEW_VERSION = f"1.0.1.dev12+g{NEW[:9]}"
# As vLLM names a non-default CUDA build: the variant joins the local version.
NEW_WHEEL = f"vllm-{NEW_VERSION}.cu129-cp38-abi3-manylinux_2_31_x86_64.whl"
OLD_WHEEL = f"vllm-{OLD_VERSION}-cp38-abi3-manylinux_2_31_x86_64.whl"


def _state(shift: int) -> bytes:
    return "".join(f"line {i + shift}\n" for i in range(1, 41)).encode()


@pytest.fixture
def nightly(stack, tmp_path):
    """A one-patch stack (git repo) pinned at 1.0.0 and a per-commit repository with
    two commits of main; returns the folder to serve."""
    assert stack.run("apply") == 0
    stack.commit_state_edit()
    assert stack.run("export") == 0
    (stack.root / ".gitignore").write_text("/.vstack/\n/dist/\n")
    git(stack.root, "init", "-q")
    git(stack.root, "add", "-A")
    git(stack.root, "commit", "-q", "-m", "stack")
    built = tmp_path / "built"
    files = {"vllm/distributed/eplb/state.py": _state(0), "vllm/new_upstream.py": b""}
    old = make_wheel(built / OLD_WHEEL, OLD_VERSION, "g" + OLD[:9], files)
    new = make_wheel(
        built / NEW_WHEEL, NEW_VERSION, "g" + NEW[:9], files,
        dist_version=NEW_VERSION + ".cu129",
    )  # fmt: skip
    return per_commit_repo(tmp_path / "wheels.example", {OLD: old, NEW: new}, NEW)


def _pin(stack) -> dict:
    return tomllib.loads((stack.root / "stack.toml").read_text())["base"]


def _back_to_old_pin(stack):
    git(stack.root, "checkout", "-q", "HEAD", "--", "patches", "stack.toml")
    assert stack.run("apply", "--force") == 0


def test_rebase_onto_nightly_pins_it_and_builds_offline(
    stack, nightly, monkeypatch, capsys
):
    with serve(nightly) as url:
        monkeypatch.setenv("VSTACK_WHEEL_INDEX", url)
        assert stack.run("rebase", "--onto", "nightly") == 0
    cap = capsys.readouterr()
    assert f"vLLM nightly is commit {NEW[:12]}: {NEW_WHEEL}" in cap.err
    assert f"downloading {url}/{NEW}/{NEW_WHEEL.replace('+', '%2B')}" in cap.err
    assert "[1/1] clean" in cap.out and f"onto vLLM {NEW_VERSION}" in cap.out
    served = nightly / NEW / NEW_WHEEL
    assert _pin(stack) == {
        "version": NEW_VERSION,
        "commit": "g" + NEW,
        "wheel": NEW_WHEEL,
        "sha256": sha256(served),
        "image": f"vllm/vllm-openai:nightly-{NEW}",
        "image_digest": "",
    }
    assert (stack.cache / NEW_WHEEL).read_bytes() == served.read_bytes()
    # the server is gone and pip may not reach an index: the build uses the cache
    assert stack.run("build") == 0
    info = json.loads((stack.root / "dist/build.json").read_text())
    version = info["version"]
    assert version.startswith(f"{NEW_VERSION}.cu129.eplb.g")
    whl = stack.root / "dist" / info["wheel"]
    assert whl.name == NEW_WHEEL.replace(f"{NEW_VERSION}.cu129-", f"{version}-")
    with zipfile.ZipFile(whl) as zf:
        version_py = zf.read("vllm/_version.py").decode()
        compile(version_py, "_version.py", "exec")  # a valid module, tuple included
        assert f"__version__ = version = '{version}'" in version_py
        assert "(1, 0, 1, 'dev12', " in version_py
        meta = zf.read(f"vllm-{version}.dist-info/METADATA").decode()
        assert f"Version: {version}\n" in meta
        assert "line five" in zf.read("vllm/distributed/eplb/state.py").decode()
    assert (
        f"FROM docker.io/vllm/vllm-openai:nightly-{NEW}\n"
        in (stack.root / "dist/image/Dockerfile").read_text()
    )


def test_rebase_onto_a_commit_full_or_short(stack, nightly, monkeypatch, capsys):
    with serve(nightly) as url:
        monkeypatch.setenv("VSTACK_WHEEL_INDEX", url)
        assert stack.run("rebase", "--onto", OLD) == 0
        assert _pin(stack)["version"] == OLD_VERSION
        assert _pin(stack)["commit"] == "g" + OLD
        assert _pin(stack)["sha256"] == sha256(nightly / OLD / OLD_WHEEL)
        _back_to_old_pin(stack)
        # a short id is made full through the nightly page when it is the nightly
        assert stack.run("rebase", "--onto", NEW[:9]) == 0
        assert _pin(stack)["commit"] == "g" + NEW
        _back_to_old_pin(stack)
        # ... but the repository has no folders for short ids
        capsys.readouterr()
        before = stack.snapshot()
        assert stack.run("rebase", "--onto", OLD[:10]) == 1
        err = capsys.readouterr().err
        assert f"{OLD[:10]} is not the newest nightly" in err
        assert "give all 40 hex digits" in err
        missing = "f" * 40
        assert stack.run("rebase", "--onto", missing) == 1
        assert f"{url}/{missing}/vllm/: HTTP 404" in capsys.readouterr().err
        assert stack.snapshot() == before


def test_flag_beats_environment_beats_stack_toml(stack, nightly, monkeypatch):
    toml = stack.root / "stack.toml"
    toml.write_text(
        toml.read_text().replace(
            'image_digest = ""',
            'image_digest = ""\nwheel_index = "http://toml.example/"',
        )
    )
    project = load_project(stack.root)
    assert project.wheel_index == "http://toml.example/"
    monkeypatch.delenv("VSTACK_WHEEL_INDEX")
    assert index_url(project) == "http://toml.example"
    monkeypatch.setenv("VSTACK_WHEEL_INDEX", "http://env.example")
    assert index_url(project) == "http://env.example"
    assert index_url(project, "http://flag.example/") == "http://flag.example"
    git(stack.root, "commit", "-q", "-am", "index in stack.toml")
    # the environment points nowhere; the flag wins
    monkeypatch.setenv("VSTACK_WHEEL_INDEX", "http://127.0.0.1:9")
    with serve(nightly) as url:
        assert stack.run("rebase", "--onto", "nightly", "--wheel-index", url) == 0
    assert _pin(stack)["commit"] == "g" + NEW
    assert 'wheel_index = "http://toml.example/"' in toml.read_text()  # kept


def test_fresh_clone_downloads_the_pinned_nightly_once(
    stack, nightly, monkeypatch, capsys
):
    with serve(nightly) as url:
        monkeypatch.setenv("VSTACK_WHEEL_INDEX", url)
        assert stack.run("rebase", "--onto", "nightly") == 0
        (stack.cache / NEW_WHEEL).unlink()  # another machine: an empty wheel cache
        shutil.rmtree(stack.root / ".vstack")
        capsys.readouterr()
        assert stack.run("build") == 0
        assert f"downloading {url}/{NEW}/" in capsys.readouterr().err
    assert (stack.cache / NEW_WHEEL).is_file()
    assert stack.run("build") == 0  # and from then on offline
    # a wheel whose bytes are not the pinned ones is refused and not kept
    (stack.cache / NEW_WHEEL).unlink()
    (nightly / NEW / NEW_WHEEL).write_bytes(b"not the pinned wheel")
    with serve(nightly) as url:
        monkeypatch.setenv("VSTACK_WHEEL_INDEX", url)
        capsys.readouterr()
        assert stack.run("build") == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not (stack.cache / NEW_WHEEL).exists()
    assert not list(stack.cache.glob(".download-*"))


def test_an_unreachable_or_silent_index_fails_in_one_line(
    stack, nightly, monkeypatch, capsys
):
    import http.server
    import threading
    import time

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(3)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("VSTACK_DOWNLOAD_TIMEOUT", "1")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        t0 = time.monotonic()
        assert stack.run("rebase", "--onto", "nightly", "--wheel-index", url) == 1
        assert time.monotonic() - t0 < 3
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"vstack: error: no answer from {url}/nightly/vllm/ in 1 s"
    finally:
        server.shutdown()
        server.server_close()
    assert stack.run("rebase", "--onto", "nightly") == 1  # port 9: refused
    assert "cannot reach http://127.0.0.1:9/nightly/vllm/" in capsys.readouterr().err


def test_index_parsing_and_wheel_choice():
    page = "http://w.example/nightly/vllm/"
    html = (
        f'<a href="../../{NEW}/vllm-1.0.1.dev12%2Bgabc-cp38-abi3-manylinux_2_31_aarch64.whl">a</a>'
        f'<a href="../../{NEW}/vllm-1.0.1.dev12%2Bgabc-cp38-abi3-manylinux_2_31_x86_64.whl#sha256={"0" * 64}">b</a>'
        '<a href="../">up</a>'
    )
    links = parse_simple_index(html, page)
    assert [link.name for link in links] == [
        "vllm-1.0.1.dev12+gabc-cp38-abi3-manylinux_2_31_aarch64.whl",
        "vllm-1.0.1.dev12+gabc-cp38-abi3-manylinux_2_31_x86_64.whl",
    ]
    assert links[1].url.startswith(f"http://w.example/{NEW}/vllm-1.0.1.dev12%2Bgabc")
    assert links[1].sha256 == "0" * 64 and links[0].sha256 is None
    assert commit_of(links[0].url) == NEW
    assert choose_wheel(links, "x86_64", page) is links[1]
    assert choose_wheel(links, "aarch64", page) is links[0]
    with pytest.raises(Exception, match="no vllm wheel for ppc64le"):
        choose_wheel(links, "ppc64le", page)


def test_version_order_and_the_record_a_nightly_replays(tmp_path):
    order = ["0.33.0", "0.34.0", "0.34.1.dev3+g1a2b3c4", "0.34.1.dev12+g9",
             "0.34.1rc1", "0.34.1", "0.34.1.post1", "0.35.0.dev0"]  # fmt: skip
    keys = [version_key(v) for v in order]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert version_key("nightly") is None
    for v, text in (("0.34.0", "a"), ("0.34.1", "b"), ("0.33.0", "c")):
        (tmp_path / "resolutions" / v).mkdir(parents=True)
        (tmp_path / "resolutions" / v / "p.patch").write_text(text)
    rec = nearest_record(tmp_path, "p.patch", "0.34.1.dev12+g9", "0.33.0")
    assert rec.read_text() == "a"  # the release the nightly follows
    assert (
        nearest_record(tmp_path, "p.patch", "0.35.0.dev1", "0.33.0").read_text() == "b"
    )
    assert nearest_record(tmp_path, "p.patch", "0.34.1.dev12", "0.34.0") is None
    assert nearest_record(tmp_path, "other.patch", "0.34.1", "0.33.0") is None
