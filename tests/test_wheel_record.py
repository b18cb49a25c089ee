"""A wheel's RECORD is checked when the wheel is pinned (issue 28, defect 9): a local
`--onto` wheel whose RECORD does not match its files was pinned unchecked, and
`build` copied its RECORD lines, so the built wheel stated a wrong sha256."""

from __future__ import annotations

import csv
import io
import shutil
import zipfile

from series_lab import commit_project, lines, new_wheel, repin
from vstack_testlib import sha256

from vstack.wheelzip import record_problems


def _lying_copy(wheel, out, name="vllm/b.py", data=b"not what RECORD says\n"):
    """wheel with `name`'s bytes replaced and its RECORD left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, data if info.filename == name else zin.read(info))
    return out


def test_rebase_refuses_a_wheel_whose_record_lies(stack, tmp_path, capsys):
    repin(stack, {"vllm/a.py": lines(), "vllm/b.py": lines()})
    assert stack.run("apply") == 0
    commit_project(stack)
    good = new_wheel(tmp_path / "good", {"vllm/a.py": lines(), "vllm/b.py": lines(2)})
    assert record_problems(good) == []
    bad = _lying_copy(good, tmp_path / "bad" / good.name)
    assert record_problems(bad)[0].startswith("vllm/b.py: RECORD says sha256=")
    toml = (stack.root / "stack.toml").read_bytes()
    capsys.readouterr()
    assert stack.run("rebase", "--onto", str(bad)) == 1
    err = capsys.readouterr().err
    assert "its RECORD does not match its files: vllm/b.py" in err
    assert (stack.root / "stack.toml").read_bytes() == toml
    assert not (stack.cache / bad.name).exists()  # kept out of the wheel cache


def test_build_refuses_a_pinned_wheel_whose_record_lies(stack, tmp_path, capsys):
    """A wheel pinned by hand (stack.toml edited): build checks it before copying."""
    good = stack.wheel
    bad = _lying_copy(good, tmp_path / "x" / good.name, name="vllm/config.py")
    shutil.copy(bad, good)
    toml = stack.root / "stack.toml"
    old = toml.read_text().split('sha256 = "')[1].split('"')[0]
    toml.write_text(toml.read_text().replace(old, sha256(good)))
    capsys.readouterr()
    assert stack.run("build") == 1
    assert "vllm/config.py: RECORD says" in capsys.readouterr().err
    assert not list((stack.root / "dist").glob("*.whl"))


def test_record_problems_names_missing_extra_and_size(tmp_path):
    good = new_wheel(tmp_path, {"vllm/a.py": b"A\n"})
    out = tmp_path / "o" / good.name
    out.parent.mkdir()
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/RECORD"):
                rows = [r for r in csv.reader(io.StringIO(data.decode())) if r]
                rows = [r for r in rows if r[0] != "vllm/a.py"] + [["gone.py", "", ""]]
                rows = [
                    r if r[0] != "vllm/config.py" else [r[0], r[1], "1"] for r in rows
                ]
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerows(rows)
                data = buf.getvalue().encode()
            zout.writestr(info, data)
    found = record_problems(out)
    assert "vllm/a.py is not listed" in found
    assert "gone.py is listed but not in the wheel" in found
    assert any(f.startswith("vllm/config.py: RECORD says 1 bytes") for f in found)
