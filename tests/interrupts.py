"""Interrupting vstack at every point where it changes state, for the interrupt tests.

An interrupt point is each git process vstack starts (vstack.gitutil.run) and each
file it writes, replaces or removes (the leaf functions of vstack.fsutil): between
two of them vstack changes nothing on disk, so a kill anywhere is a kill at one of
them. run_forked() runs a vstack command in a forked child that counts the points
and, at point k, sends itself a real signal just before that call:

  SIGINT  -- what Ctrl-C does: Python raises KeyboardInterrupt there, every
             `finally` and `except` on the way out runs (exit 130);
  SIGKILL -- nothing of vstack runs any more (exit -9).

The seam is here, in the tests: the child wraps those module functions; production
code has no branch for it (vstack.fsutil documents that callers use the module's
attributes, so that the wrapper sees every call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from vstack import fsutil, gitutil

# verb -> {"points": n, "SIGINT": n, "SIGKILL": n}: printed at the end of the session
COUNTS: dict[str, dict] = {}

# (module, function) pairs that are interrupt points; fsutil.write_text goes through
# write_bytes, so it is one point, not two.
POINTS = [
    (gitutil, "run"),
    (fsutil, "write_bytes"),
    (fsutil, "copy_file"),
    (fsutil, "replace"),
    (fsutil, "remove"),
    (fsutil, "remove_tree"),
]


def _label(mod, name: str, args) -> str:
    if name == "run":
        cmd = [
            a for a in args[0] if not a.startswith(("-c", "core.", "diff.", "format."))
        ]
        cmd = [a for a in cmd if "=" not in a or a.startswith("--")]
        verb = next((a for a in cmd[1:] if not a.startswith("-") and "/" not in a), "?")
        return f"git {verb}"
    return f"{name} {Path(str(args[0])).name}"


@dataclasses.dataclass
class Run:
    status: int  # exit code, or -signal
    points: list[str]  # labels of the points reached (counting runs)
    log: str


def run_forked(fn, log: Path, kill_at: int | None = None, sig: int = 0) -> Run:
    """fn() in a forked child; with kill_at, the child sends itself sig just before
    interrupt point number kill_at (1-based)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 99
        try:
            os.close(r)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            signal.signal(signal.SIGINT, signal.default_int_handler)
            labels: list[str] = []
            for mod, name in POINTS:
                real = getattr(mod, name)

                def hooked(*a, _real=real, _mod=mod, _name=name, **kw):
                    labels.append(_label(_mod, _name, a))
                    if len(labels) == kill_at:
                        os.kill(os.getpid(), sig)
                        for _ in range(10000):  # SIGINT's handler raises in here
                            pass
                        raise AssertionError("the signal did not interrupt")
                    return _real(*a, **kw)

                setattr(mod, name, hooked)
            try:
                code = fn()
            finally:
                os.write(w, json.dumps(labels).encode())
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 98)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    data = b"".join(chunks)
    return Run(code, json.loads(data) if data else [], log.read_text(errors="replace"))


def _copy_or_link(src: str, dst: str) -> None:
    # git never changes an object file once written (a new one is written beside
    # it and renamed): a hard link is as good as a copy, and much cheaper
    if f"{os.sep}objects{os.sep}" in src and f"{os.sep}.git{os.sep}" in src:
        with contextlib.suppress(OSError):  # another file system: copied below
            os.link(src, dst)
            return
    shutil.copy2(src, dst)


def restore(snapshot: Path, root: Path) -> None:
    """root becomes a copy of snapshot (the project with its .vstack)."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(snapshot, root, symlinks=True, copy_function=_copy_or_link)


def files_under(folder: Path, skip=()) -> dict[str, bytes]:
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(s in p.relative_to(folder).parts for s in skip)
    }


@dataclasses.dataclass
class Scenario:
    """One state-changing command, from one starting state.

    setup(stack): builds the starting state in stack.root (its .vstack included);
    command: the vstack arguments that are interrupted;
    recover(stack): what a user does next, until the command's work is done (rerun
      it, --continue, --abort, resolve a conflict on the way); also run after the
      uninterrupted command, so that both end the same way;
    outputs(stack): the bytes that must come out identical;
    after_kill(stack): optional checks of the state an interrupt left (before
      recovery), e.g. that export refuses instead of deleting patches.
    """

    name: str
    setup: object
    command: list[str]
    recover: object
    outputs: object
    after_kill: object = None
    run: object = None  # fn(stack, args) -> int in the child; default: the CLI


def enumerate_interrupts(stack, scenario: Scenario, tmp: Path, signals) -> dict:
    """Run scenario once uninterrupted, then once per (signal, point), each from a
    fresh copy of the starting state, recovering as a user would; returns counts.
    Fails naming the signal and point whose recovery differs. The trials are
    independent: they run in up to WORKERS processes, each in a project folder of
    its own (nothing compared holds the project's path)."""
    from vstack_testlib import vstack_main

    gitutil._user_safe_directories()  # cached before forking: same points in all
    scenario.setup(stack)
    snap = tmp / f"start-{scenario.name.replace(' ', '')}"
    shutil.copytree(stack.root, snap, symlinks=True)
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    go = scenario.run or (lambda st, args: vstack_main(["--root", str(st.root), *args]))
    first = run_forked(
        lambda: go(stack, scenario.command), logs / f"{scenario.name}-0.log"
    )
    assert first.status in (0, 1), first.log
    points = first.points
    scenario.recover(stack)
    expected = scenario.outputs(stack)
    trials = [(sig, k) for sig in signals for k in range(1, len(points) + 1)]
    workers = max(1, min(WORKERS, len(trials)))

    def trial(st, sig: int, k: int) -> str | None:
        want = 130 if sig == signal.SIGINT else -sig
        where = (
            f"{signal.Signals(sig).name} at point {k}/{len(points)} ({points[k - 1]})"
        )
        restore(snap, st.root)
        log = logs / f"{scenario.name}-{sig}-{k}.log"
        got = run_forked(lambda: go(st, scenario.command), log, k, sig)
        if got.status != want:
            return f"{where}: exit {got.status}\n{got.log}"
        if scenario.after_kill:
            scenario.after_kill(st, where)
        scenario.recover(st)
        have = scenario.outputs(st)
        if have != expected:
            diff = sorted(
                n for n in set(have) | set(expected) if have.get(n) != expected.get(n)
            )
            return f"{where}: recovery differs in {diff}\n{got.log}"
        return None

    def worker(i: int) -> list[str]:
        root = tmp / f"worker-{i}" / stack.root.name
        root.parent.mkdir(parents=True, exist_ok=True)
        st = type(stack)(root, stack.cache, stack.wheel)
        failed = []
        for sig, k in trials[i::workers]:
            try:
                why = trial(st, sig, k)
            except BaseException as e:  # an assertion of the scenario's
                why = f"{signal.Signals(sig).name} at point {k}: {e!r}"
            if why:
                failed.append(why)
                break
        return failed

    failures = _in_processes(worker, workers, tmp / f"workers-{scenario.name}.log")
    restore(snap, stack.root)
    assert not failures, f"{scenario.name}: " + "\n".join(failures)
    counts = {
        "points": len(points),
        **{signal.Signals(s).name: len(points) for s in signals},
    }
    COUNTS[scenario.name] = counts
    return {**counts, "labels": points}


# Trials run in parallel in this many processes (each forks its own children).
WORKERS = min(4, os.cpu_count() or 1)


@contextlib.contextmanager
def scratch(fallback: Path):
    """A folder for the trials' project copies: in memory (/dev/shm) where there
    is one, as hundreds of copies and removals of a small git repository are
    mostly file-system metadata; else under fallback."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="vstack-interrupts-", dir=shm))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    else:
        fallback.mkdir(parents=True, exist_ok=True)
        yield fallback


def _in_processes(fn, n: int, log: Path) -> list[str]:
    """fn(0) .. fn(n-1) in n forked processes; the concatenated lists they return."""
    pids = []
    for i in range(n):
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            out = ["worker crashed"]
            try:
                os.close(r)
                fd = os.open(f"{log}.{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                out = fn(i)
            except BaseException:
                out = [traceback.format_exc()]
            finally:
                os.write(w, json.dumps(out).encode())
                os._exit(0)
        os.close(w)
        pids.append((pid, r))
    found = []
    for pid, r in pids:
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        os.close(r)
        os.waitpid(pid, 0)
        found += json.loads(b"".join(chunks) or b'["worker died"]')
    return found
