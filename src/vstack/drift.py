"""scripts/drift: does the series still move onto vLLM's newest nightly, and when it
does not, which patches stop applying and which upstream commit broke each one.

  1. A throwaway copy of the stack is rebased with `vstack rebase --onto <target>`.
     When a patch stops applying, drift goes on (`vstack rebase --skip` in the copy;
     a stale recorded resolution is taken out of the copy and the patch tried as it
     is), so every patch is tried on the new base plus the patches before it that
     did apply, and gets one status.
  2. A patch that stops applying after another one did is "blocked by" it when it
     does not apply on the old base without that patch either (git decides, in a
     scratch worktree); else upstream broke it too ("conflict").
  3. For the patches that stop applying, the upstream commits between the pin and
     the nightly (`git rev-list --first-parent` in a vLLM repository) are bisected
     with the per-commit wheels of vLLM's wheel repository: the sources of each
     wheel probed are kept in a git cache, so a commit is downloaded once.
  4. When every patch goes through, the copy is built and the rebased series' CPU
     tests run against its wheel.
  5. `scripts/drift --publish` turns the report into one bump PR or one issue (gh).

Pure planners (Bisection, render_md, the statuses) are separate from the git and
network steps; the CLI is scripts/drift.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from vstack import fsutil, gitutil
from vstack.errors import VstackError

TOOL = Path(__file__).resolve().parents[2]

HELP = """\
Upstream drift: does the series still move onto vLLM's newest nightly, and if not,
which patch stops applying since which upstream commit?

  1. A throwaway copy of the stack (stack.toml, patches/, resolutions/) is rebased
     with `vstack rebase --onto nightly` (or --onto <commit>) from the per-commit
     wheel repository (--wheel-index, VSTACK_WHEEL_INDEX, stack.toml, vLLM's).
     Every patch is tried: one that stops applying is left out of the copy and the
     next ones are tried on the new base plus the patches before them that applied.
     Each gets one status: clean, offset, 3-way, dropped upstream, ported or
     superseded (a recorded resolution), stale record, conflict, or blocked by
     <patch> (it does not apply without that patch on the old base either).
  2. The culprit: for each patch that stops applying, the upstream commits between
     the pinned commit and the nightly (git rev-list --first-parent, in the vLLM
     repository --vllm-repo, default the vllm/ submodule's remote) are bisected,
     fetching the per-commit wheel of each commit probed (its sources are cached in
     ~/.cache/vstack/drift); the first commit at which the patch stops applying is
     named (full sha, subject, PR number). The cost is printed.
  3. When every patch goes through: the copy builds its patched wheel and the
     rebased series' CPU tests run against it, in the test environment given by
     --python (or VSTACK_TEST_PYTHON).

Nothing of this checkout changes. The report goes to --out, a folder of drift's own
(a new or empty one, or one an earlier drift made; anything else is refused):
drift.md (verdict, per-patch table with each first bad commit, the command that
reproduces a failure), drift.json (the same, for tools), bump/ (stack.toml,
patches/, resolutions/ as the rebase left them, when drift is OK), and the logs.
drift.md is also appended to $GITHUB_STEP_SUMMARY when set. Exit 0 when the series
rebases, builds and its tests pass; 1 when a patch stops applying, a recorded
resolution is stale, the build or a test fails; 2 on a usage error.

`scripts/drift --publish` (CI, after a drift run) acts on the report in --out with
`gh`: when drift was OK it pushes the bump (from the checkout's HEAD) to the branch
vstack/drift-bump and opens or updates one PR with the report as its body, and
closes the drift issue; otherwise it opens or updates one issue (label
vstack-drift) with the conflict set and the culprits. See docs/drift.md.

Usage: scripts/drift [--onto nightly] [--vllm-repo PATH_OR_URL] [--out DIR]
                     [--python PY] [--max-probes N] [-- pytest args]
       scripts/drift --publish [--out DIR] [--base BRANCH]
"""

# What drift writes into --out: all of it is replaced by the next run, nothing else
# there is touched (rebase.md/json: written by older drifts, removed).
OUTPUTS = (
    "rebase.log", "build.log", "tests.log", "bisect.log", "drift.md", "drift.json",
    "rebase.md", "rebase.json",
)  # fmt: skip
BUMP = "bump"
BUMP_BRANCH = "vstack/drift-bump"
LABEL = "vstack-drift"
TRAILER = "Vstack-Drift-Nightly"
SKIP_REASON = "scripts/drift: left out to try the patches after it"
# Lines of vstack's own output that drift echoes while the copy rebases (progress);
# the rest goes to rebase.log only: it talks about the throwaway copy (resolve the
# markers in ..., --continue), which is gone when drift ends.
PROGRESS = (
    "vstack: downloading", "vstack:   ", "vstack: vLLM ", "vstack: rebasing",
    "vstack: using the cached", "  [",
)  # fmt: skip
COPY = "<drift's copy, deleted>"
# GitHub refuses an issue or PR body over 65536 characters.
BODY_MAX = 60000
# A probe: one wheel downloaded (~240-340 MB) and ~20 s of import, fetch and git am
# on 2 cores (docs/drift.md); ~12 probes name one culprit in a few thousand
# commits, so 40 name about three in 15-25 minutes of the job's 120.
DEFAULT_MAX_PROBES = 40

STATUS_TEXT = {
    "3way": "3-way",
    "dropped-upstream": "dropped upstream",
    "stale-record": "stale record",
}
FAILED = ("conflict", "blocked")


def status_text(row: dict) -> str:
    if row["status"] == "blocked":
        return f"blocked by {row['blocked_by']}"
    return STATUS_TEXT.get(row["status"], row["status"])


# ---------------------------------------------------------------- pure helpers


def pr_number(subject: str) -> int | None:
    """The PR a vLLM squash merge names at the end of its subject ("... (#12345)");
    of several, the last (`Revert "X (#1)" (#2)` is PR 2)."""
    found = re.findall(r"\(#(\d+)\)", subject)
    return int(found[-1]) if found else None


class Bisection:
    """The first bad commit of several patches at once, over commits[0..n]: index 0
    (the pin) is good for every patch, n (the nightly) bad. One probe at index i
    says, for every patch, whether it stops applying there, and narrows each
    interval that holds i (as git bisect does for one). An index without a wheel is
    skipped; the nearest other one in the interval is probed instead."""

    def __init__(self, names: list[str], n: int):
        self.n = n
        self.lo = dict.fromkeys(names, 0)
        self.hi = dict.fromkeys(names, n)
        self.skipped: set[int] = set()

    def _point(self, lo: int, hi: int) -> int | None:
        mid = (lo + hi) // 2
        for k in range(hi - lo):
            for i in (mid + k, mid - k):
                if lo < i < hi and i not in self.skipped:
                    return i
        return None

    def next_probe(self) -> int | None:
        """The midpoint of the widest interval still open (series order on ties)."""
        best = None
        for name in self.lo:
            lo, hi = self.lo[name], self.hi[name]
            if hi - lo > 1 and (best is None or hi - lo > best[0]):
                point = self._point(lo, hi)
                if point is not None:
                    best = (hi - lo, point)
        return best[1] if best else None

    def record(self, i: int, failing: set[str]) -> None:
        for name in self.lo:
            if self.lo[name] < i < self.hi[name]:
                if name in failing:
                    self.hi[name] = i
                else:
                    self.lo[name] = i

    def skip(self, i: int) -> None:
        self.skipped.add(i)

    def exact(self, name: str) -> bool:
        return self.hi[name] - self.lo[name] == 1

    def can_narrow(self, name: str) -> bool:
        """Whether a commit with a wheel is left to probe in name's interval."""
        return self._point(self.lo[name], self.hi[name]) is not None


def render_md(report: dict) -> str:
    """drift.md: the verdict, the steps, how to reproduce a failure, one line per
    patch (with the first bad upstream commit of each one that stops applying),
    and the bisection."""
    o, n = report.get("old"), report.get("new")
    if o and n and report.get("rebased"):
        head = (
            f"# vLLM drift: {o['version']} -> {n['version']} "
            f"(commit {n['commit'].removeprefix('g')[:12]})"
        )
    elif o and not report.get("rebased") and report["verdict"] != "error":
        head = (
            f"# vLLM drift: {o['version']} (commit "
            f"{o['commit'].removeprefix('g')[:12]}) is vLLM {report['target']} already"
        )
    else:
        head = f"# vLLM drift: onto {report['target']}"
    ok = report["verdict"] == "ok"
    lines = [head, "", f"**{'OK' if ok else 'FAIL'}**: {report['summary']}", ""]
    if report.get("steps"):
        lines += [f"- {s}" for s in report["steps"]] + [""]
    if report.get("reproduce"):
        lines += [f"Reproduce locally: `{report['reproduce']}`", ""]
    rows = report.get("patches") or []
    if rows:
        lines += [
            "| # | patch | status | first bad upstream commit | files | details |",
            "|---|---|---|---|---|---|",
        ]
        for i, r in enumerate(rows, 1):
            det = "<br>".join(
                _cell(x)
                for x in r.get("details", [])
                + [f"upstream: {c}" for c in r.get("upstream_commits", [])]
            )
            lines.append(
                f"| {i} | {_cell(r['patch'])} | {_cell(status_text(r))} | "
                f"{_cell(culprit_text(r))} | "
                f"{', '.join(r.get('files', []))} | {det} |"
            )
        lines.append("")
    failed = [r for r in rows if r["status"] in FAILED]
    if failed:
        lines += ["## First bad upstream commit of each patch that stops applying", ""]
        for r in failed:
            lines.append(f"- {r['patch']} ({status_text(r)}): {culprit_text(r)}")
        lines.append("")
    b = report.get("bisection")
    if b:
        lines += [
            f"Bisected {b['commits']} first-parent commit(s) of {b['repository']} "
            f"({b['old'][:12]}..{b['new'][:12]}), {len(b['probes'])} probed"
            + (f": {', '.join(s[:12] for s in b['probes'])}" if b["probes"] else "")
            + "."
            + (f" {b['note']}" if b.get("note") else ""),
            "",
        ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """text as inline code: an upstream subject's @name must not mention anyone
    (vLLM's say @torch.compile) in the issue drift opens."""
    if "`" not in text:
        return f"`{text}`"
    quoted = text.replace("``", "'")
    return f"`` {quoted} ``"


def culprit_text(row: dict) -> str:
    fb = row.get("first_bad")
    if fb:
        pr = f" (PR #{fb['pr']})" if fb.get("pr") else ""
        return f"{fb['commit']} {_code(fb['subject'])}{pr}"
    rng = row.get("first_bad_range")
    if rng:
        return (
            f"one of {rng['commits']} commits after {rng['after'][:12]} up to "
            f"{rng['through']} ({rng['why']})"
        )
    return row.get("culprit_note") or ("-" if row["status"] in FAILED else "")


# ---------------------------------------------------------------- the copy


class Copy:
    """The throwaway copy of the stack drift rebases, and the vstack runs in it."""

    def __init__(self, root: Path, work: Path, out: Path):
        self.work, self.out = work, out
        self.proj = work / "stack"
        self.proj.mkdir()
        for name in ("stack.toml", "patches", "resolutions"):
            src = root / name
            if src.is_dir():
                shutil.copytree(src, self.proj / name)
            elif src.is_file():
                shutil.copy(src, self.proj / name)
        # The series as it was: the copy's patches/ is rewritten by the rebase.
        self.series_dir = work / "series"
        if (root / "patches").is_dir():
            shutil.copytree(root / "patches", self.series_dir)
        else:
            self.series_dir.mkdir()

    def clean(self, text: str) -> str:
        for p in {str(self.work), str(self.work.resolve())}:
            text = text.replace(p, COPY)
        return text

    def run(self, cmd: list[str], log: str, echo=None, **kw) -> int:
        """cmd with its output kept in log (the copy's paths replaced) and shown
        (all of it, or what echo(line) returns: the line to show, or nothing)."""
        with open(self.out / log, "a") as f:
            f.write(self.clean(f"$ {' '.join(cmd)}\n"))
            f.flush()
            env = {**kw.pop("env", os.environ), "PYTHONUNBUFFERED": "1"}
            p = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", env=env, **kw,
            )  # fmt: skip
            for line in p.stdout:
                line = self.clean(line)
                shown = line if echo is None else echo(line)
                if shown:
                    sys.stdout.write(shown)
                    sys.stdout.flush()
                f.write(line)
            return p.wait()

    def vstack(self, *args: str, left_out: str | None = None) -> int:
        """vstack in the copy, its progress shown; left_out: the patch this call
        skips, shown as the conflict it is (the copy's --skip is drift's way past
        it: vstack itself calls it "superseded")."""
        cmd = [str(TOOL / "scripts" / "vstack"), "--root", str(self.proj), *args]

        def echo(line: str) -> str | None:
            if not line.startswith(PROGRESS):
                return None
            m = re.fullmatch(r"(\s*\[\d+/\d+\] )superseded +(\S+)\n?", line)
            if m and m[2] == left_out:
                return (
                    f"{m[1]}{'conflict':<16} {left_out} (left out: the patches after "
                    f"it are tried without it)\n"
                )
            return line

        return self.run(cmd, "rebase.log", echo=echo)

    def state(self) -> dict | None:
        p = self.proj / ".vstack" / "rebase" / "state.json"
        return json.loads(p.read_text()) if p.is_file() else None


def _stop(d: dict) -> dict | None:
    """The result a rebase in progress stopped at, if it stopped at one."""
    res = d.get("results") or []
    if res and len(res) == d.get("next", 0) + 1:
        return res[-1]
    return None


@dataclasses.dataclass
class Rebased:
    rows: list[dict]
    old: dict | None = None  # pin + "git" (the base commit in the copy's repo)
    new: dict | None = None
    nothing: bool = False  # the stack pins the target already
    error: str | None = None  # the rebase failed for a reason other than a patch


def rebase_every_patch(c: Copy, onto: str, index_flag: str | None) -> Rebased:
    """`vstack rebase` in the copy, driven past every stop so that each patch gets
    a status: a conflict is left out (--skip), a stale record is removed from the
    copy and the patch tried as it is (--continue)."""
    from vstack.config import load_project
    from vstack.rebase import resolution_for

    cmd = ["rebase", "--onto", onto]
    if index_flag:
        cmd += ["--wheel-index", index_flag]
    rc = c.vstack(*cmd)
    reports = c.proj / ".vstack" / "reports" / "rebase.json"
    if rc == 0 and c.state() is None and not reports.is_file():
        return Rebased([], nothing=True)
    first = c.state()
    skipped: dict[str, dict] = {}  # patch -> the conflict it stopped at
    stale: dict[str, list[str]] = {}  # patch -> what drift found about its record
    seen: set[tuple] = set()
    project = load_project(c.proj)
    d = first
    while d is not None:
        last = _stop(d)
        if last is None:
            break  # the rebase failed, not at a patch (rebase.log says why)
        key = (last["patch"], last["status"], len(d["results"]))
        if key in seen:
            return _tried_outside(c, d, skipped, stale, "the rebase did not go on")
        seen.add(key)
        name = last["patch"]
        record = None
        if last["status"] == "stale-record":
            record = c.proj / last["record"]
        elif last["status"] == "conflict":
            record = resolution_for(
                project, d["new_pin"]["version"], name, d["old_pin"]["version"]
            )
        if record is not None and record.is_file():
            where = record.relative_to(c.proj).as_posix()
            why = (
                "it was recorded from another version of the patch"
                if last["status"] == "stale-record"
                else "it no longer applies"
            )
            stale.setdefault(name, []).append(
                f"the recorded resolution {where} is stale: {why}"
            )
            if last["status"] == "stale-record":
                stale[name] += last["details"]
            record.unlink()
            repo = c.proj / ".vstack" / "repo"
            if gitutil.op_in_progress(repo):
                gitutil.git(repo, "am", "--abort", check=False)
            c.vstack("rebase", "--continue")
        else:
            skipped[name] = {
                k: last.get(k, [])
                for k in ("patch", "status", "files", "details", "upstream_commits")
            }
            skipped[name]["head"] = last.get("head")
            c.vstack("rebase", "--skip", "--reason", SKIP_REASON, left_out=name)
        d = c.state()
    if d is not None:
        return _failed(c, d, skipped, stale)
    if not reports.is_file():
        return Rebased([], error=_last_line(c))
    rep = json.loads(reports.read_text())
    rows = [_row(r, skipped, stale) for r in rep["patches"]]
    return Rebased(rows, rep["old"], rep["new"])


def _row(r: dict, skipped: dict, stale: dict) -> dict:
    name = r["patch"]
    if name in skipped:
        row = dict(skipped[name])
        row.pop("head", None)
        row["details"] = stale.get(name, []) + row["details"]
        return row
    row = {k: r.get(k, []) for k in ("patch", "status", "files", "details")}
    if name in stale:
        row["details"] = stale[name] + [
            f"without the record the patch is {status_text(r)}"
        ]
        row["status"] = "stale-record"
    return row


def _last_line(c: Copy) -> str:
    log = c.out / "rebase.log"
    lines = (
        [ln for ln in log.read_text().splitlines() if ln.strip()]
        if log.is_file()
        else []
    )
    return lines[-1].strip() if lines else "vstack rebase failed"


def _failed(c: Copy, d: dict, skipped: dict, stale: dict) -> Rebased:
    """The rebase ended for another reason than a patch (a git or network error)."""
    done = [_row(r, skipped, stale) for r in d["results"]]
    names = {r["patch"] for r in done}
    why = _last_line(c)
    rest = [
        {"patch": n, "status": "not tried", "files": [], "details": [why]}
        for n in d["patches"]
        if n not in names
    ]
    return Rebased(done + rest, _pin(d, "old"), _pin(d, "new"), error=why)


def _pin(d: dict, which: str) -> dict:
    return {**d[f"{which}_pin"], "git": d[f"{which}_base"]}


def _tried_outside(c: Copy, d: dict, skipped, stale, why: str) -> Rebased:
    """The rebase cannot be moved past a stop: the patches after it are tried by
    drift itself on where it stopped (git am -3, as the rebase would, no records)."""
    last = _stop(d)
    skipped[last["patch"]] = {
        k: last.get(k, []) for k in ("patch", "status", "files", "details", "upstream_commits")
    }  # fmt: skip
    if last["status"] != "conflict":
        skipped[last["patch"]]["status"] = "conflict"
    done = [_row(r, skipped, stale) for r in d["results"]]
    names = [n for n in d["patches"] if n not in {r["patch"] for r in done}]
    paths = [c.series_dir / n for n in names]
    repo = c.proj / ".vstack" / "repo"
    try:
        got = trial(repo, last["head"], paths, c.proj / ".vstack")
    except VstackError as e:
        why = c.clean(str(e))
        got = {}
    note = f"tried by drift on top of where the rebase stopped ({why} after {last['patch']})"
    from vstack.series import load_patch

    rest = [
        {"patch": p.name, "status": got.get(p.name, "not tried"),
         "files": load_patch(p)[1].files,
         "details": [note if p.name in got else f"not tried: {why}"]}
        for p in paths
    ]  # fmt: skip
    return Rebased(done + rest, _pin(d, "old"), _pin(d, "new"))


# ---------------------------------------------------------------- trials (git decides)


def trial(
    repo: Path, base: str, patches: list[Path], parent: Path, skip=frozenset()
) -> dict[str, str]:
    """Each patch (but those in skip) applied in order on base with git am -3, in a
    scratch worktree, as the rebase applies it: status clean, offset, 3way,
    dropped-upstream (the base has it) or conflict (left out: the next patch is
    tried without it)."""
    from vstack.rebase import base_top_dirs, forward
    from vstack.series import load_patch

    got: dict[str, str] = {}
    top = base_top_dirs(repo, base)
    with gitutil.temp_worktree(repo, base, parent) as wt:
        for p in patches:
            if p.name in skip:
                continue
            _, info = load_patch(p)
            before = gitutil.out(wt, "rev-parse", "HEAD")
            # The rebase's own probe: dropped only when git shows the base has it.
            r = forward(wt, p, info, before, top)
            if r.status == "conflict":
                gitutil.git(wt, "am", "--abort", check=False)
                gitutil.git(wt, "reset", "-q", "--hard", before)
                gitutil.git(wt, "clean", "-q", "-fd")
            got[p.name] = r.status
    return got


def classify_blocked(
    repo: Path, old_base: str, series: list[Path], rows: list[dict], parent: Path
) -> None:
    """A patch that stops applying after others did: "blocked by" the first of them
    it cannot apply without on the old base (git decides), else a conflict of its
    own (rows are updated)."""
    index = {p.name: i for i, p in enumerate(series)}
    failed: list[str] = []
    for row in rows:
        if row["status"] != "conflict" or row["patch"] not in index:
            continue
        name = row["patch"]
        if failed:
            prefix = series[: index[name] + 1]
            alone = trial(repo, old_base, prefix, parent, skip=set(failed))
            if alone.get(name) == "conflict":
                for k in range(1, len(failed) + 1):
                    got = trial(repo, old_base, prefix, parent, skip=set(failed[k:]))
                    if got.get(name) != "conflict":
                        row["status"], row["blocked_by"] = "blocked", failed[k - 1]
                        row["details"] = [
                            f"does not apply without {failed[k - 1]} on the old base "
                            f"either: it is tried again once that one is ported"
                        ] + row["details"]
                        break
        failed.append(name)


# ---------------------------------------------------------------- upstream history


@dataclasses.dataclass
class History:
    repo: Path
    where: str
    commits: list[str]  # [pin, then the first-parent commits up to the nightly]
    note: str = ""


def _net_git(args: list[str], timeout: float = 3600) -> subprocess.CompletedProcess:
    """A git call that reaches a remote: the user's configuration (proxy, URL
    rewriting, credentials) applies; a transfer that stalls for the download
    timeout is given up."""
    from vstack.fetch import download_timeout

    stall = str(int(max(download_timeout(), 1)))
    cmd = ["git", "-c", "http.lowSpeedLimit=1000", "-c", f"http.lowSpeedTime={stall}"]
    try:
        return gitutil.run(
            cmd + args, capture_output=True, text=True, errors="replace",
            timeout=timeout, env=gitutil.git_env(user_config=True),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise VstackError(
            f"git {' '.join(args[:3])}: no answer in {timeout:g} s"
        ) from None


def _why(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit {p.returncode}"


def _commit(repo: Path, rev: str) -> str | None:
    if not re.fullmatch(r"[0-9a-f]{7,40}", rev):
        return None
    return gitutil.rev_parse(repo, rev)


def history(spec: str, old: str, old_version: str, new: str, cache: Path) -> History:
    """The first-parent commits from the pinned commit `old` to the nightly `new`
    (short or full ids) in the vLLM repository spec: a local clone (read only), or
    a URL fetched into a commits-only (--filter=tree:0) clone under cache."""
    local = Path(spec).expanduser()
    if local.is_dir():
        p = gitutil.git(local, "rev-parse", "--is-bare-repository", check=False)
        top = gitutil.git(local, "rev-parse", "--show-toplevel", check=False)
        if p.returncode != 0 or (
            p.stdout.strip() != "true"
            and Path(top.stdout.strip() or "/nonexistent").resolve() != local.resolve()
        ):
            raise VstackError(f"--vllm-repo {spec}: not a git repository")
        repo = local
    elif spec.startswith(("/", "./", "../", "~")):
        raise VstackError(f"--vllm-repo {spec}: no such folder")
    else:
        repo = _fetched(spec, cache, old, old_version, new)
    olds, news = _commit(repo, old), _commit(repo, new)
    if olds is None or news is None:
        which = old if olds is None else new
        shallow = gitutil.out(repo, "rev-parse", "--is-shallow-repository", check=False)
        hint = (
            " (a shallow clone: git fetch --unshallow there)"
            if shallow == "true"
            else " (git fetch there)"
            if repo == local
            else ""
        )
        raise VstackError(f"{spec} does not have vLLM commit {which}{hint}")
    note = ""
    anc = gitutil.git(repo, "merge-base", "--is-ancestor", olds, news, check=False)
    if anc.returncode != 0:
        base = gitutil.out(repo, "merge-base", olds, news, check=False)
        note = (
            f"The pinned commit {olds[:12]} is not an ancestor of {news[:12]} (a "
            f"release branch?): the range is the nightly's first-parent line since "
            f"their merge base {base[:12] or '(none)'}."
        )
    listed = gitutil.out(
        repo, "rev-list", "--first-parent", "--reverse", news, f"^{olds}"
    )
    commits = [olds] + [s for s in listed.split() if re.fullmatch(r"[0-9a-f]{40}", s)]
    if commits[-1] != news:
        raise VstackError(
            f"vLLM {news[:12]} is not after the pinned {olds[:12]} in {spec}: no "
            f"upstream commits between them to bisect"
        )
    return History(repo, spec, commits, note)


def _fetched(url: str, cache: Path, old: str, old_version: str, new: str) -> Path:
    """A commits-only clone of url under cache, brought up to date, with the two
    commits in it (a release pin's tag fetched when main does not have it)."""
    repo = cache / f"vllm-{hashlib.sha1(url.encode()).hexdigest()[:12]}.git"
    print(f"==> vLLM history from {url}", flush=True)
    if not (repo / "HEAD").is_file():
        # (under drift's lock on cache: any .clone-* is what a killed run left)
        for left in cache.glob(".clone-*"):
            fsutil.remove_tree(left)
        tmp = cache / f".clone-{os.getpid()}"
        p = _net_git(["clone", "-q", "--bare", "--filter=tree:0", "--single-branch",
                      "--no-tags", url, str(tmp)])  # fmt: skip
        if p.returncode != 0:
            fsutil.remove_tree(tmp)
            raise VstackError(f"git clone {url} failed: {_why(p)}")
        gitutil.git(tmp, "config", "gc.auto", "0")
        fsutil.remove_tree(repo)
        os.replace(tmp, repo)
    else:
        p = _net_git(["-C", str(repo), "fetch", "-q", "--no-tags", "origin"])
        if p.returncode != 0:
            raise VstackError(f"git fetch {url} failed: {_why(p)}")
    for rev in (old, new):
        if _commit(repo, rev) is None:
            want = [rev] if len(rev) == 40 else []
            if rev == old and re.fullmatch(r"\d+\.\d+\.\d+", old_version):
                tag = f"refs/tags/v{old_version}"
                want.append(f"+{tag}:{tag}")
            for w in want:
                _net_git(["-C", str(repo), "fetch", "-q", "--no-tags", "origin", w])
    return repo


def subjects(repo: Path, shas: list[str]) -> dict[str, str]:
    """{sha: subject}, read in one git log -z."""
    if not shas:
        return {}
    text = gitutil.git(
        repo, "log", "--no-walk=unsorted", "-z", "--format=%H%x00%s", *shas
    ).stdout
    f = text.split("\0")
    return {f[i]: f[i + 1] for i in range(0, len(f) - 1, 2)}


# ---------------------------------------------------------------- per-commit sources


class Sources:
    """The sources of per-commit wheels, one commit each in a bare git cache
    (<cache>/sources.git, ref refs/vstack/per-commit/<variant>/<commit>), fetched
    into the copy's repository when probed. A wheel is downloaded into the copy's
    folder, imported and deleted."""

    def __init__(self, project, repo: Path, cache: Path, index: str, work: Path):
        self.project, self.repo, self.index, self.work = project, repo, index, work
        self.git = cache / "sources.git"
        self.fetched = self.cached = 0
        if not (self.git / "HEAD").is_file():
            self.git.mkdir(parents=True, exist_ok=True)
            gitutil.git(self.git, "init", "-q", "--bare")
            gitutil.git(self.git, "config", "gc.auto", "0")

    def ref(self, sha: str) -> str:
        return f"refs/vstack/per-commit/{self.project.wheel_variant or 'default'}/{sha}"

    def base(self, sha: str, log) -> str | None:
        """The base commit (in the copy's repository) of upstream commit sha, or
        None when the wheel repository has no wheel for it."""
        ref = self.ref(sha)
        if gitutil.rev_parse(self.git, ref) is None:
            if not self._import(sha, ref, log):
                return None
            self.fetched += 1
        else:
            self.cached += 1
            log(f"  {sha[:12]}: sources cached")
        gitutil.git(
            self.repo, "fetch", "-q", "--no-tags", str(self.git), f"+{ref}:{ref}"
        )
        return gitutil.rev_parse(self.repo, ref)

    def _import(self, sha: str, ref: str, log) -> bool:
        from vstack.base import import_wheel, read_wheel_version
        from vstack.nightly import (
            _arch,
            choose_wheel,
            download,
            package_url,
            parse_simple_index,
        )

        page = package_url(self.index, sha, self.project.wheel_variant)
        html = _page(page)
        if html is None:
            log(f"  {sha[:12]}: no wheel ({page}: HTTP 404/403)")
            return False
        try:
            link = choose_wheel(parse_simple_index(html, page), _arch(), page)
        except VstackError as e:
            log(f"  {sha[:12]}: no wheel ({e})")
            return False
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=self.work) as tmp:
            wheel = Path(tmp) / link.name
            digest = download(link.url, wheel, link.sha256)
            _, reported = read_wheel_version(wheel)
            if reported and not sha.startswith(reported.removeprefix("g")):
                raise VstackError(
                    f"{link.name} reports commit {reported}, but the index files it "
                    f"under {sha[:12]}"
                )
            import_wheel(self.git, wheel, ref, digest)
        log(f"  {sha[:12]}: fetched {link.name}")
        return True

    def prune(self, keep: set[str]) -> None:
        """Drop the cached sources of commits outside this run's range (the pin
        moved on): the cache holds one range, not every nightly ever probed."""
        prefix = f"refs/vstack/per-commit/{self.project.wheel_variant or 'default'}/"
        text = gitutil.out(self.git, "for-each-ref", "--format=%(refname)", prefix)
        gone = [r for r in text.splitlines() if r.rsplit("/", 1)[-1] not in keep]
        for r in gone:
            gitutil.git(self.git, "update-ref", "-d", r)
        if gone:
            gitutil.git(self.git, "gc", "-q", "--prune=now", check=False)


def _page(url: str) -> str | None:
    """The text at url, or None when the server has nothing there: HTTP 404, or
    403 (what S3 behind a CDN answers for a key it does not have)."""
    import http.client

    from vstack.fetch import download_timeout

    timeout = download_timeout()
    req = urllib.request.Request(url, headers={"User-Agent": "vstack"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        if e.code in (403, 404):
            return None
        raise VstackError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise VstackError(f"cannot reach {url}: {e.reason}") from None
    except (TimeoutError, http.client.HTTPException, OSError) as e:
        raise VstackError(f"{url}: no answer ({e or type(e).__name__})") from None


# ---------------------------------------------------------------- bisecting


def bisect(ctx: dict, rows: list[dict], hist: History, max_probes: int, log) -> dict:
    """Name the first bad commit of every row that stops applying (rows updated);
    return the bisection's record for the report."""
    names = [r["patch"] for r in rows if r["status"] in FAILED]
    series: list[Path] = ctx["series"]
    order = {p.name: i for i, p in enumerate(series)}
    upto = series[: max(order[n] for n in names) + 1]
    commits = hist.commits
    n = len(commits) - 1
    probes: list[str] = []

    def failing_at(i: int) -> set[str] | None:
        sha = commits[i]
        base = ctx["new_base"] if i == n else ctx["sources"].base(sha, log)
        if base is None:
            return None
        got = trial(ctx["repo"], base, upto, ctx["parent"])
        bad = {x for x in names if got.get(x) == "conflict"}
        log(
            f"probe {sha[:12]} ({i}/{n}): stop applying: {', '.join(sorted(bad)) or 'none'}"
        )
        return bad

    at_new = failing_at(n)
    unbisected = [x for x in names if x not in at_new]
    for r in rows:
        if r["patch"] in unbisected:
            r["culprit_note"] = (
                "not bisected: it applies on the nightly when drift tries the series "
                "with git am alone (the stop came from the rebase's own steps)"
            )
    b = Bisection([x for x in names if x in at_new], n)
    stopped = None  # why the bisection ended with intervals still open
    while (i := b.next_probe()) is not None:
        if len(probes) >= max_probes:
            stopped = f"the probe budget (--max-probes {max_probes}) ran out"
            break
        try:
            bad = failing_at(i)
        except VstackError as e:
            # what was narrowed so far stays; the rest is a range, with the reason
            stopped = f"the bisection stopped: {e}"
            log(stopped)
            break
        probes.append(commits[i])
        if bad is None:
            b.skip(i)
        else:
            b.record(i, bad)
    first = {x: commits[b.hi[x]] for x in b.lo if b.exact(x)}
    subj = subjects(hist.repo, sorted(set(first.values())))
    for r in rows:
        x = r["patch"]
        if x not in b.lo:
            continue
        if b.exact(x):
            sha = first[x]
            r["first_bad"] = {
                "commit": sha,
                "subject": subj.get(sha, ""),
                "pr": pr_number(subj.get(sha, "")),
            }
        else:
            lo, hi = b.lo[x], b.hi[x]
            why = (
                stopped
                if stopped and b.can_narrow(x)
                else "the wheel repository has no wheel for the commits between"
            )
            r["first_bad_range"] = {
                "after": commits[lo], "through": commits[hi], "commits": hi - lo,
                "why": why,
            }  # fmt: skip
    return {
        "repository": hist.where,
        "old": commits[0],
        "new": commits[-1],
        "commits": n,
        "probes": probes,
        "note": hist.note,
    }


# ---------------------------------------------------------------- build and tests


def cpu_tests(c: Copy, py, pytest_args, steps) -> str | None:
    """The rebased series' own tests against its wheel; a verdict on failure."""
    vstack = [str(TOOL / "scripts" / "vstack"), "--root", str(c.proj)]
    if not py:
        steps.append(
            "tests: FAILED: no test environment (--python / VSTACK_TEST_PYTHON)"
        )
        return "no CPU test environment given (--python / VSTACK_TEST_PYTHON)"
    tests = c.work / "stack-tests"
    c.run([*vstack, "test-files", "--out", str(tests)], "tests.log")
    if not (tests / "tests").is_dir():
        steps.append("tests: the rebased series adds no tests")
        return None
    wheel = json.loads((c.proj / "dist" / "build.json").read_text())["wheel"]
    site = c.work / "site"
    print(f"==> the rebased series' tests against {wheel}", flush=True)
    rc = c.run(
        [py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
         "--target", str(site), str(c.proj / "dist" / wheel)], "tests.log",
    )  # fmt: skip
    if rc:
        steps.append("tests: FAILED: the wheel does not install")
        return "the rebased wheel does not install into the test environment"
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu", "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }  # fmt: skip
    rc = c.run(
        [py, "-m", "pytest", "-p", "no:cacheprovider", "-ra", "tests", *pytest_args],
        "tests.log", cwd=tests, env=env,
    )  # fmt: skip
    if rc:
        steps.append(f"tests: FAILED (pytest exit {rc}, tests.log)")
        return "the rebased series' CPU tests fail (tests.log)"
    steps.append("tests: passed (tests.log)")
    return None


# ---------------------------------------------------------------- drift


def _input_digests(root: Path) -> dict[str, str]:
    """sha256 of each file drift copied: publish checks HEAD has the same."""
    got = {}
    for name in ("stack.toml", "patches", "resolutions"):
        p = root / name
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in files:
            got[f.relative_to(root).as_posix()] = hashlib.sha256(
                f.read_bytes()
            ).hexdigest()
    return got


def _reproduce(project, new: dict | None, onto: str, index_flag: str | None) -> str:
    from vstack.nightly import DEFAULT_INDEX, index_url

    commit = (new or {}).get("commit", "").removeprefix("g") or onto
    cmd = f"scripts/vstack rebase --onto {commit}"
    used = index_url(project, index_flag)
    if used != (project.wheel_index or DEFAULT_INDEX).rstrip("/"):
        cmd += f" --wheel-index {used}"
    return cmd


def run_drift(args) -> int:
    root = Path(args.root).resolve()
    out = Path(args.out).resolve()
    try:
        fsutil.own_folder(out, "scripts/drift")
    except VstackError as e:
        print(f"drift: error: {e}", file=sys.stderr)
        return 2
    for name in OUTPUTS:
        fsutil.remove(out / name)
    fsutil.remove_tree(out / BUMP)
    if not (root / "stack.toml").is_file():
        print(
            f"drift: error: {root} has no stack.toml: give the stack's folder with "
            f"--root",
            file=sys.stderr,
        )
        return 2
    py = args.python or os.environ.get("VSTACK_TEST_PYTHON")
    from vstack.locks import held_folder

    _sweep_copies()
    work = Path(tempfile.mkdtemp(prefix="vstack-drift-"))
    try:
        with held_folder(work):
            return _drift(args, root, out, work, py)
    except VstackError as e:
        why = str(e).replace(str(work), COPY).replace(str(work.resolve()), COPY)
        # a report still: the publish step opens an issue that says why
        report = {
            "target": args.onto, "verdict": "error", "rebased": False,
            "summary": f"drift could not run: {why}", "patches": [], "steps": [],
            "reproduce": f"scripts/drift --onto {args.onto}",
        }  # fmt: skip
        fsutil.write_text(out / "drift.md", render_md(report))
        fsutil.write_text(out / "drift.json", json.dumps(report, indent=2) + "\n")
        print(f"drift: error: {why}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _sweep_copies() -> None:
    """Remove the copies that drifts killed with SIGKILL left (a copy, a wheel half
    downloaded): a folder of ours has a .lock its drift holds while it runs; one
    without a .lock is not known to be ours and is left alone."""
    for d in Path(tempfile.gettempdir()).glob("vstack-drift-*"):
        lock = d / ".lock"
        if not lock.is_file():
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a drift at work
        finally:
            os.close(fd)
        fsutil.remove_tree(d)


def _drift(args, root: Path, out: Path, work: Path, py) -> int:
    from vstack.config import load_project

    c = Copy(root, work, out)
    project = load_project(c.proj)
    print(f"==> rebasing a copy of the series onto vLLM {args.onto}", flush=True)
    reb = rebase_every_patch(c, args.onto, args.wheel_index)
    steps: list[str] = []
    report: dict = {
        "target": args.onto, "verdict": "fail", "summary": "", "rebased": not reb.nothing,
        "old": reb.old, "new": reb.new, "patches": reb.rows, "reproduce": None,
        "bisection": None, "steps": steps, "input": _input_digests(root),
    }  # fmt: skip
    if reb.nothing:
        pin = tomllib.loads((c.proj / "stack.toml").read_text())["base"]
        report["old"] = {**pin}
        steps.append(
            f"rebase: the stack already pins vLLM {args.onto}: nothing to rebase"
        )
    verdict = None
    if reb.error and not reb.rows:
        verdict = f"the rebase failed: {reb.error}"
        report["verdict"] = "error"
        steps.append(f"rebase: FAILED: {reb.error} (rebase.log)")
    rows = reb.rows
    failed = []
    if rows and reb.old:
        repo = c.proj / ".vstack" / "repo"
        series = _series(c)
        try:
            classify_blocked(repo, reb.old["git"], series, rows, c.proj / ".vstack")
        except VstackError as e:
            steps.append(f"blocked-by check: not done: {c.clean(str(e))}")
        failed = [r for r in rows if r["status"] in FAILED]
        stale = [r for r in rows if r["status"] == "stale-record"]
        if failed:
            names = ", ".join(f"{r['patch']} ({status_text(r)})" for r in failed)
            verdict = f"{len(failed)} of {len(rows)} patches stop applying: {names}"
        elif stale:
            verdict = "; ".join(f"{r['details'][0]} ({r['patch']})" for r in stale)
        elif reb.error:
            verdict = f"the rebase failed: {reb.error}"
        if failed:
            _culprits(args, root, project, c, reb, series, rows, report, out)
        if verdict:
            steps.append(f"rebase: FAILED: {verdict}")
        else:
            steps.append("rebase: every patch applied or was resolved")
    if verdict is None:
        print("==> building the rebased series' wheel", flush=True)
        vstack = [str(TOOL / "scripts" / "vstack"), "--root", str(c.proj)]
        if c.run([*vstack, "build"], "build.log"):
            verdict = "the rebased series does not build (build.log)"
            steps.append(f"build: FAILED: {verdict}")
        else:
            info = json.loads((c.proj / "dist" / "build.json").read_text())
            steps.append(f"build: {info['wheel']}")
    if verdict is None:
        verdict = cpu_tests(c, py, args.pytest_args, steps)
    if verdict is None:
        report["verdict"] = "ok"
        report["summary"] = (
            "rebases, builds, tests pass" if not reb.nothing else "builds, tests pass"
        )
        if reb.rows:
            _write_bump(c, out)
    else:
        if report["verdict"] != "error":
            report["verdict"] = "fail"
        report["summary"] = verdict
        if reb.nothing:
            report["reproduce"] = (
                f"scripts/drift --onto {args.onto} --python <the CPU test python>"
            )
        elif failed or "recorded resolution" in verdict or reb.error:
            report["reproduce"] = _reproduce(
                project, reb.new, args.onto, args.wheel_index
            )
        else:
            report["reproduce"] = (
                _reproduce(project, reb.new, args.onto, args.wheel_index).replace(
                    "scripts/vstack rebase", "scripts/drift"
                )
                + " --python <the CPU test python>"
            )
    md = render_md(report)
    fsutil.write_text(out / "drift.md", md)
    fsutil.write_text(out / "drift.json", json.dumps(report, indent=2) + "\n")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(md + "\n")
    for i, r in enumerate(rows, 1):
        line = f"  {i:>2}. {r['patch']}: {status_text(r)}"
        if r["status"] in FAILED:
            line += f"; first bad upstream commit: {culprit_text(r)}"
        print(line)
    ok = report["verdict"] == "ok"
    print(f"drift: {'OK' if ok else 'FAIL: ' + report['summary']} (report: {out})")
    if report["reproduce"]:
        print(f"drift: reproduce locally: {report['reproduce']}")
    return 0 if ok else 1


def _series(c: Copy) -> list[Path]:
    from vstack.series import series_paths

    return series_paths(c.series_dir)


def _culprits(args, root, project, c, reb, series, rows, report, out) -> None:
    """Bisect the upstream range for the rows that stop applying; a reason in the
    report instead when it cannot be done (no vLLM repository, no per-commit
    base)."""
    from vstack.nightly import index_url
    from vstack.submodule import upstream_url

    def note(why: str) -> None:
        for r in rows:
            if r["status"] in FAILED and "first_bad" not in r:
                r["culprit_note"] = f"not bisected: {why}"
        report["steps"].append(f"bisect: not done: {why}")

    if args.max_probes <= 0:
        return note("--max-probes 0")
    try:
        from vstack.config import load_project

        spec = args.vllm_repo or upstream_url(load_project(root))
    except VstackError:
        spec = args.vllm_repo
    if not spec:
        return note(
            "no vLLM repository (--vllm-repo PATH_OR_URL; default: the URL of the "
            "vllm/ submodule in .gitmodules)"
        )
    t = time.perf_counter()
    cache = project.wheel_cache.parent / "drift"
    cache.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(s: str) -> None:
        lines.append(s)
        print(f"drift: {s}", flush=True)

    sources = None
    try:
        with _cache_lock(cache):
            hist = history(
                spec, reb.old["commit"].removeprefix("g"), reb.old["version"],
                reb.new["commit"].removeprefix("g"), cache,
            )  # fmt: skip
            print(
                f"==> bisecting {len(hist.commits) - 1} upstream commit(s) for "
                f"{sum(r['status'] in FAILED for r in rows)} patch(es)",
                flush=True,
            )
            repo = c.proj / ".vstack" / "repo"
            sources = Sources(
                project, repo, cache, index_url(project, args.wheel_index), c.work
            )
            ctx = {"series": series, "repo": repo, "parent": c.proj / ".vstack",
                   "new_base": reb.new["git"], "sources": sources}  # fmt: skip
            report["bisection"] = bisect(ctx, rows, hist, args.max_probes, log)
            sources.prune(set(hist.commits))
    except VstackError as e:
        note(c.clean(str(e)))
    secs = time.perf_counter() - t
    fetched = sources.fetched if sources else 0
    cached = sources.cached if sources else 0
    cost = (
        f"bisect cost: {fetched} wheel(s) fetched, {cached} from the cache, "
        f"{secs:.1f} s"
    )
    lines.append(cost)
    print(f"drift: {cost}", flush=True)
    fsutil.write_text(out / "bisect.log", "\n".join(lines) + "\n")


@contextlib.contextmanager
def _cache_lock(cache: Path):
    """One drift at a time uses the caches under cache (the lock is released by the
    kernel when the holder dies); a second one says that it waits."""
    fd = os.open(cache / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"drift: waiting for another drift using {cache} ...", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_bump(c: Copy, out: Path) -> None:
    """bump/: stack.toml, patches/ and resolutions/ as the rebase left the copy."""
    dest = out / BUMP
    for name in ("stack.toml", "patches", "resolutions"):
        src = c.proj / name
        if src.is_file():
            fsutil.copy_file(src, dest / name)
        elif src.is_dir():
            for f in sorted(src.rglob("*")):
                if f.is_file():
                    fsutil.copy_file(f, dest / f.relative_to(c.proj))


# ---------------------------------------------------------------- publish (gh)


def _gh(checkout: Path, *args: str, body: str | None = None) -> str:
    """gh with args (a body goes through a --body-file); its stdout; one line on
    failure."""
    gh = os.environ.get("VSTACK_GH", "gh")
    with tempfile.TemporaryDirectory(prefix="vstack-gh-") as tmp:
        extra = []
        if body is not None:
            f = Path(tmp) / "body.md"
            f.write_text(body)
            extra = ["--body-file", str(f)]
        try:
            p = subprocess.run(
                [gh, *args, *extra], cwd=checkout, capture_output=True, text=True,
                errors="replace", timeout=300,
            )  # fmt: skip
        except FileNotFoundError:
            raise VstackError(f"`{gh}` is not installed (GitHub CLI)") from None
        except subprocess.TimeoutExpired:
            raise VstackError(
                f"{gh} {' '.join(args[:2])}: no answer in 300 s"
            ) from None
    if p.returncode != 0:
        raise VstackError(f"{gh} {' '.join(args[:2])} failed: {_why(p)}")
    return p.stdout


def _body(md: str, footer: str) -> str:
    if len(md) + len(footer) > BODY_MAX:
        md = md[: BODY_MAX - len(footer) - 200] + (
            "\n\n(cut here: the whole report is drift.md in the run's drift-report "
            "artifact)\n"
        )
    return md + footer


def _where(report: dict) -> str:
    n = report.get("new") or {}
    commit = (n.get("commit") or "").removeprefix("g")[:12]
    if not commit:
        return f"vLLM {report['target']}"
    return f"vLLM {n.get('version', report['target'])} (commit {commit})"


def _short(title: str, n: int = 200) -> str:
    """GitHub refuses a title over 256 characters."""
    return title if len(title) <= n else title[: n - 3] + "..."


def pr_title(report: dict) -> str:
    o = report.get("old") or {}
    return _short(f"vLLM bump: {o.get('version', '?')} -> {_where(report)}")


def issue_title(report: dict) -> str:
    failed = [r for r in report.get("patches") or [] if r["status"] in FAILED]
    if failed:
        what = f"{len(failed)} patch(es) stop applying"
    else:
        what = report["summary"].split(" (")[0]
    return _short(f"vLLM drift: {what} on {_where(report)}")


def publish(args) -> int:
    out = Path(args.out).resolve()
    checkout = Path(args.root).resolve()
    path = out / "drift.json"
    if not path.is_file():
        print(
            f"drift: error: no drift report in {out} (run scripts/drift first)",
            file=sys.stderr,
        )
        return 2
    report = json.loads(path.read_text())
    md = (out / "drift.md").read_text() if (out / "drift.md").is_file() else ""
    try:
        if report["verdict"] == "ok":
            url = None
            if (out / BUMP).is_dir():
                url = _bump_pr(checkout, out, report, md, pr_title(report), args)
            else:
                print("drift: the stack pins that nightly already: no bump")
            _close_issues(checkout, report, url)
        else:
            _issue(checkout, md, issue_title(report), report)
    except VstackError as e:
        print(f"drift: error: {e}", file=sys.stderr)
        return 1
    return 0


def _issue(checkout: Path, md: str, title: str, report: dict) -> None:
    footer = (
        "\n---\nOpened by scripts/drift (ci/drift.yml); updated in place each night "
        "until the nightly applies again. The run's drift-report artifact has the logs.\n"
    )
    _gh(checkout, "label", "create", LABEL, "--force", "--color", "d93f0b",
        "--description", "vLLM nightly drift of the patch series")  # fmt: skip
    found = json.loads(
        _gh(checkout, "issue", "list", "--label", LABEL, "--state", "open",
            "--json", "number,title") or "[]"
    )  # fmt: skip
    body = _body(md, footer)
    if found:
        num = str(found[0]["number"])
        _gh(checkout, "issue", "edit", num, "--title", title, body=body)
        if found[0].get("title") != title:
            _gh(checkout, "issue", "comment", num, body=f"{report['summary']}\n")
        print(f"drift: updated issue #{num}: {title}")
    else:
        got = _gh(
            checkout, "issue", "create", "--title", title, "--label", LABEL, body=body
        )
        print(f"drift: opened issue {got.strip()}: {title}")


def _close_issues(checkout: Path, report: dict, pr_url: str | None) -> None:
    found = json.loads(
        _gh(checkout, "issue", "list", "--label", LABEL, "--state", "open",
            "--json", "number") or "[]"
    )  # fmt: skip
    n = report.get("new") or {}
    for issue in found:
        num = str(issue["number"])
        msg = (
            f"vLLM {n.get('version', report['target'])} applies, builds and passes "
            f"the series' tests" + (f": {pr_url}" if pr_url else "") + "\n"
        )
        _gh(checkout, "issue", "close", num, "--comment", msg)
        print(f"drift: closed issue #{num}")


def _check_inputs(checkout: Path, report: dict) -> None:
    """The bump must be made from what HEAD has: drift copied the work tree."""
    want = report.get("input") or {}
    have_names = [
        x for x in gitutil.out(
            checkout, "ls-tree", "-r", "-z", "--name-only", "HEAD", "--",
            "stack.toml", "patches", "resolutions",
        ).split("\0") if x
    ]  # fmt: skip
    blobs = gitutil.read_blobs(checkout, "HEAD", have_names)
    have = {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}
    if have != want:
        diff = sorted(set(have.items()) ^ set(want.items()))
        raise VstackError(
            f"the report was made from other files than HEAD of {checkout} has "
            f"({diff[0][0]}{' ...' if len(diff) > 1 else ''}): run drift on a clean "
            f"checkout of HEAD, then --publish"
        )


def _bump_pr(
    checkout: Path, out: Path, report: dict, md: str, title: str, args
) -> str | None:
    _check_inputs(checkout, report)
    base = args.base or gitutil.out(
        checkout, "symbolic-ref", "-q", "--short", "HEAD", check=False
    )
    if not base:
        raise VstackError("HEAD is detached: give the PR's base branch with --base")
    nightly = (report["new"]["commit"]).removeprefix("g")
    remote_tip = _remote_tip(checkout, args.remote)
    if remote_tip and not _ours(checkout, args.remote, remote_tip):
        raise VstackError(
            f"{args.remote}/{BUMP_BRANCH} has commits drift did not make (its tip "
            f"{remote_tip[:12]} has no {TRAILER} trailer): not overwritten; merge or "
            f"close that PR and delete the branch, or push the bump by hand"
        )
    with tempfile.TemporaryDirectory(prefix="vstack-bump-") as tmp:
        wt = Path(tmp) / "wt"
        gitutil.git(checkout, "worktree", "prune", check=False)  # a killed run's
        gitutil.git(checkout, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
        try:
            _fill(wt, out / BUMP, nightly)
            names = [
                x
                for x in ("stack.toml", "patches", "resolutions")
                if (wt / x).exists() or gitutil.out(wt, "ls-files", "-z", "--", x)
            ]
            gitutil.git(wt, "add", "-A", "--", *names)
            if (
                gitutil.git(wt, "diff", "--cached", "--quiet", check=False).returncode
                == 0
            ):
                print("drift: the bump changes nothing in HEAD: no PR")
                return None
            msg = (
                f"{title}\n\nMade by scripts/drift from the report below; the series "
                f"rebases onto the nightly, builds, and its CPU tests pass.\n\n"
                f"{TRAILER}: {nightly}\n"
            )
            env = {
                k: v
                for k, v in os.environ.items()
                if k.startswith("GIT_AUTHOR_") or k.startswith("GIT_COMMITTER_")
            }
            gitutil.git(wt, "commit", "-q", "-m", msg, env={
                "GIT_AUTHOR_NAME": "vstack drift", "GIT_AUTHOR_EMAIL": "vstack-drift@localhost",
                "GIT_COMMITTER_NAME": "vstack drift", "GIT_COMMITTER_EMAIL": "vstack-drift@localhost",
                **env,
            })  # fmt: skip
            lease = f"--force-with-lease=refs/heads/{BUMP_BRANCH}:{remote_tip or ''}"
            p = _net_git(["-C", str(wt), "push", "-q", lease, args.remote,
                          f"HEAD:refs/heads/{BUMP_BRANCH}"])  # fmt: skip
            if p.returncode != 0:
                raise VstackError(
                    f"git push {args.remote} {BUMP_BRANCH} failed: {_why(p)}"
                )
        finally:
            gitutil.git(checkout, "worktree", "remove", "--force", str(wt), check=False)
            gitutil.git(checkout, "worktree", "prune", check=False)
    footer = (
        f"\n---\nOpened by scripts/drift (ci/drift.yml): branch `{BUMP_BRANCH}` is "
        f"force-pushed with each night's bump while only drift commits to it.\n"
    )
    body = _body(md, footer)
    found = json.loads(
        _gh(checkout, "pr", "list", "--head", BUMP_BRANCH, "--state", "open",
            "--json", "number,url") or "[]"
    )  # fmt: skip
    if found:
        num = str(found[0]["number"])
        _gh(checkout, "pr", "edit", num, "--title", title, body=body)
        print(f"drift: updated PR #{num}: {title}")
        return found[0].get("url") or f"#{num}"
    got = _gh(checkout, "pr", "create", "--base", base, "--head", BUMP_BRANCH,
              "--title", title, body=body).strip()  # fmt: skip
    print(f"drift: opened PR {got}: {title}")
    return got


def _remote_tip(checkout: Path, remote: str) -> str | None:
    p = _net_git(
        ["-C", str(checkout), "ls-remote", remote, f"refs/heads/{BUMP_BRANCH}"]
    )
    if p.returncode != 0:
        raise VstackError(f"git ls-remote {remote} failed: {_why(p)}")
    for line in p.stdout.splitlines():
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{BUMP_BRANCH}":
            return sha
    return None


def _ours(checkout: Path, remote: str, tip: str) -> bool:
    """Whether the remote bump branch's tip is a commit drift made (its trailer)."""
    if gitutil.rev_parse(checkout, tip) is None:
        p = _net_git(["-C", str(checkout), "fetch", "-q", "--no-tags", remote,
                      f"refs/heads/{BUMP_BRANCH}"])  # fmt: skip
        if p.returncode != 0:
            raise VstackError(f"git fetch {remote} {BUMP_BRANCH} failed: {_why(p)}")
    got = gitutil.out(
        checkout, "log", "-1", f"--format=%(trailers:key={TRAILER},valueonly)", tip
    )
    return bool(got.strip())


def _fill(wt: Path, bump: Path, nightly: str) -> None:
    """The worktree's stack.toml, patches/ and resolutions/ become the bump's; the
    vllm/ gitlink (when the repository has one) moves to the nightly."""
    for name in ("patches", "resolutions"):
        if (wt / name).is_dir():
            shutil.rmtree(wt / name)
    for f in sorted(bump.rglob("*")):
        if f.is_file():
            dest = wt / f.relative_to(bump)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
    staged = gitutil.out(wt, "ls-files", "-s", "-z", "--", "vllm").split("\0")
    if any(x.startswith("160000 ") for x in staged) and re.fullmatch(
        r"[0-9a-f]{40}", nightly
    ):
        gitutil.git(wt, "update-index", "--cacheinfo", f"160000,{nightly},vllm")


# ---------------------------------------------------------------- the command line


def parser(prog: str = "scripts/drift") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--onto", default="nightly", help="nightly (default) or a vLLM commit"
    )
    ap.add_argument("--wheel-index", help="per-commit wheel repository URL")
    ap.add_argument(
        "--root", default=str(TOOL), help="the stack (default: this checkout)"
    )
    ap.add_argument(
        "--out", default="drift-report", help="report folder (default: drift-report)"
    )
    ap.add_argument("--python", help="the CPU test environment's python")
    ap.add_argument(
        "--vllm-repo", metavar="PATH_OR_URL",
        help="vLLM repository whose first-parent history is bisected: a local clone "
        "(read only) or a URL (a commits-only clone is cached); default: the vllm/ "
        "submodule's URL in .gitmodules (VSTACK_UPSTREAM_URL overrides it)",
    )  # fmt: skip
    ap.add_argument(
        "--max-probes", type=int, default=DEFAULT_MAX_PROBES, metavar="N",
        help=f"at most N commits probed in the bisection (default {DEFAULT_MAX_PROBES}; "
        "0: no bisection); a range is reported where it runs out",
    )  # fmt: skip
    ap.add_argument(
        "--publish", action="store_true",
        help="act on the report in --out with gh: the bump PR or the drift issue",
    )  # fmt: skip
    ap.add_argument("--base", help="--publish: the PR's base branch (default: HEAD's)")
    ap.add_argument(
        "--remote", default="origin", help="--publish: where the bump branch is pushed"
    )
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.publish:
            return publish(args)
        if args.max_probes < 0 or args.max_probes > 1000:
            print("drift: error: --max-probes must be 0..1000", file=sys.stderr)
            return 2
        return run_drift(args)
    except KeyboardInterrupt:
        # --out holds what was written so far; the next run replaces all of it
        print("drift: interrupted", file=sys.stderr)
        return 130
