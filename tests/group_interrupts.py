"""Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group, so a
git that vstack is running gets it too, in the middle of its own work (issue 28,
defect 11). tests/interrupts.py stops vstack between two git calls; this stops it
inside one.

vstack runs as a child in a session of its own (its own process group, like a job
of a shell). tests/gitpoints.c, preloaded into every process of that group and
active in git processes only, numbers each change git makes to the file system (a
file opened for writing, a rename, an unlink, a mkdir/rmdir, a link) across all the
git processes of the run; at point VSTACK_POINT_AT it sends SIGINT to the group
right after that change. The shim is compiled with the machine's C compiler once
per test session."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def shim() -> Path:
    """tests/gitpoints.c built as a shared library (cached by its source's hash)."""
    source = HERE / "gitpoints.c"
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"vstack-gitpoints-{key}.so"
    if not out.is_file():
        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc, "a C compiler (cc) is needed to interrupt git from inside"
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(source), "-ldl"],
            check=True, capture_output=True,
        )  # fmt: skip
        os.replace(tmp, out)
    return out


@dataclasses.dataclass
class GroupRun:
    rc: int
    out: str
    err: str
    points: list[str]  # labels of the git points reached, in order


def run(root: Path, args: list[str], work: Path, at: int | None = None) -> GroupRun:
    """`vstack --root root ARGS` in a process group of its own; with `at`, SIGINT
    to the group right after git's file-system change number `at`."""
    work.mkdir(parents=True, exist_ok=True)
    counter, log = work / "points", work / "points.log"
    counter.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "LD_PRELOAD": str(shim()),
        "VSTACK_POINTS": str(counter),
        "VSTACK_POINTS_LOG": str(log),
    }
    env.pop("VSTACK_POINT_AT", None)
    if at is not None:
        env["VSTACK_POINT_AT"] = str(at)
    p = subprocess.Popen(
        [sys.executable, "-m", "vstack", "--root", str(root), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, err = p.communicate(timeout=300)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    points = log.read_text().splitlines() if log.is_file() else []
    return GroupRun(p.returncode, out, err, [ln.split(" ", 1)[1] for ln in points])


def printed_command(err: str) -> list[str] | None:
    """The vstack command an interrupted run says finishes its work ("vstack:
    interrupted; to finish: `vstack ...`"), as arguments."""
    import shlex

    for line in err.splitlines():
        if line.startswith("vstack: interrupted") and "`vstack " in line:
            cmd = line.split("`vstack ", 1)[1].split("`", 1)[0]
            return shlex.split(cmd)
    return None
