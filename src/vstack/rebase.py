"""vstack rebase: move the series onto a new vLLM base, patch by patch, with a report.

State lives in .vstack/rebase/state.json while a rebase is in progress (written
atomically; its appearance is the moment the rebase begins, its removal the moment
it ends). It is a record of results, not of where git is: every step first
re-derives that from the stack repository (HEAD must be the last result's commit;
a `git am` or a checkout that a killed run left is undone) before trusting it.
stack.toml, patches/ and the records are written only when every patch is through,
in one journaled change (vstack.journal), so --abort has only the work branch to
put back, and, after a run killed while writing them, patches/ and stack.toml from
the copy saved in .vstack/rebase/saved/.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from vstack import fsutil, gitutil, records, synced
from vstack.apply import (
    AM_OP,
    NoChange,
    PatchResult,
    apply_one,
    backup_branch,
    clear_interrupted_git,
    clear_journal,
    descends,
    ensure_clean,
    load_journal,
    repo_state,
    require_on_work,
    require_whole_series,
    stray_changes,
    take_resolution,
    unexported_work,
)
from vstack.base import (
    WORK_BRANCH,
    Base,
    base_from_git,
    base_from_wheel,
    pinned_base_anywhere,
    read_wheel_version,
)
from vstack.config import STACK_TOML, Pin, Project, render_stack_toml
from vstack.errors import VstackError
from vstack.export import (
    FORMAT_PATCH,
    applied_tip,
    current_files,
    diff_files,
    render,
    write_patches,
)
from vstack.fetch import (
    VerifiedCache,
    cache_local_wheel,
    check_record,
    fetch_wheel,
    sha256_file,
)
from vstack.nightly import (
    fetch_per_commit,
    image_for,
    is_per_commit_target,
    nearest_record,
)
from vstack.series import load_patch, read_series, series_paths
from vstack.submodule import after_pin_moved, current_gitlink, write_gitlink

MARKER = re.compile(r"^(<{7}|={7}|>{7}|\|{7})( |$)")

# Statuses of patches that leave the series.
DROPPED = ("dropped-upstream", "superseded")

# Recorded resolutions (git rerere, one level up): resolutions/<new base version>/<patch
# file name> holds the patch as it was ported onto that base, or, with no diff, why the
# base supersedes it. A rebase onto that base uses the record instead of re-asking.
RESOLUTIONS = "resolutions"


# ---------------------------------------------------------------- planning (pure)


def classify_target(onto: str, git_path: str | None) -> str:
    """'wheel' (a local .whl), 'git' (a revision of a checkout), 'per-commit'
    (`nightly` or a commit of vLLM's per-commit wheel repository) or 'version'."""
    if onto.endswith(".whl"):
        return "wheel"
    if git_path is not None:
        return "git"
    if is_per_commit_target(onto):
        return "per-commit"
    if re.fullmatch(r"\d+\.\d+(\.\d+)?([.+-]?[A-Za-z0-9.]+)?", onto):
        return "version"
    raise VstackError(
        f"cannot tell what '{onto}' is: give a vLLM version (0.34.0), a wheel file "
        f"(*.whl), nightly, a commit id, or a revision with --git PATH"
    )


def _revert_depth(subject: str) -> int:
    """How many times a subject reverts what it quotes: `Revert "X"` 1, `Revert
    "Revert "X""` or `Reapply "X"` 2 (git's names for a revert of a revert)."""
    s = re.sub(r"^[0-9a-f]{4,40} ", "", subject)
    depth = 0
    while True:
        if s.startswith('Revert "'):
            depth, s = depth + 1, s[len('Revert "') :]
        elif s.startswith('Reapply "'):
            depth, s = depth + 2, s[len('Reapply "') :]
        else:
            return depth


def pr_in_subjects(pr: str, subjects: list[str]) -> str | None:
    """The subject by which upstream PR `pr` is in, as vLLM's squash merges name it
    ('(#123)'), unless a later revert took it out again. subjects: newest first, as
    git log lists them."""
    num = re.sub(r"\D", "", pr.rsplit("/", 1)[-1])
    if not num:
        return None
    pat = re.compile(rf"\(#{num}\)|(?<![\w/])#{num}\b")
    merged = None
    for s in reversed(subjects):
        if pat.search(s):
            merged = None if _revert_depth(s) % 2 else s
    return merged


def ours_ranges(text: str) -> list[tuple[int, int]]:
    """Line ranges (1-based, in HEAD's version of the file) of the HEAD side of each
    conflict block left by a 3-way merge."""
    ranges, line, side, start = [], 0, None, 0
    for raw in text.splitlines():
        if raw.startswith("<<<<<<< "):
            side, start = "ours", line + 1
            continue
        if side and (
            raw.startswith("|||||||") or raw == "=======" or raw.startswith("======= ")
        ):
            if side == "ours":
                ranges.append((start, max(start, line)))
            side = "theirs"
            continue
        if side and raw.startswith(">>>>>>> "):
            side = None
            continue
        if side in (None, "ours"):
            line += 1
    return ranges


def added_surface(diff_text: str) -> list[tuple[str, str, str]]:
    """What a patch adds that users or other modules can name: (kind, name, file) for
    module-level classes and public functions, and string values new to vllm/config/
    (the choices of a Literal, e.g. a communicator name)."""
    found: list[tuple[str, str, str]] = []
    file, added, removed = None, set(), set()

    def flush():
        if file and file.startswith("vllm/config/"):
            for v in sorted(added - removed):
                found.append(("value", v, file))

    from vstack import gitparse

    heads = gitparse.file_headers(diff_text.encode("utf-8", errors="surrogateescape"))
    for i, line in enumerate(diff_text.split("\n")):
        if line.startswith("diff --git "):
            flush()
            f = heads.get(i)
            file, added, removed = (f.path if f else None), set(), set()
            continue
        if file is None or file.startswith("tests/") or line.startswith(("+++", "---")):
            continue
        if line.startswith("+"):
            m = re.match(r"^\+(class|def) ([A-Za-z]\w*)", line)
            if m:
                found.append((m.group(1), m.group(2), file))
            added.update(re.findall(r'"([a-z][a-z0-9_]*)"', line))
        elif line.startswith("-"):
            removed.update(re.findall(r'"([a-z][a-z0-9_]*)"', line))
    flush()
    return found


def render_report(report: dict) -> str:
    o, n = report["old"], report["new"]
    lines = [
        f"# Rebase report: vLLM {o['version']} -> {n['version']}",
        "",
        "| | old | new |",
        "|---|---|---|",
        f"| version | {o['version']} | {n['version']} |",
        f"| commit | {o['commit']} | {n['commit']} |",
        f"| wheel sha256 | {o.get('sha256') or '-'} | {n.get('sha256') or '-'} |",
        f"| base (stack repo) | {o['git'][:12]} | {n['git'][:12]} |",
        "",
        "| # | patch | status | files | details |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(report["patches"], 1):
        det = "<br>".join(
            r["details"] + [f"upstream: {c}" for c in r.get("upstream_commits", [])]
        )
        lines.append(
            f"| {i} | {r['patch']} | {r['status']} | {', '.join(r['files'])} | {det} |"
        )
    dropped = [r for r in report["patches"] if r["status"] in DROPPED]
    if dropped:
        lines += ["", "Left the series (each kept as a commit on the old base under "
                  "the ref named; `git -C .vstack/repo format-patch -1 <ref>` gives "
                  "the patch back):", ""]  # fmt: skip
        lines += [
            f"- {r['patch']}: {r['status']}, {r.get('backup') or 'no backup ref'}"
            for r in dropped
        ]
    if report.get("stopped_at"):
        lines += ["", f"Stopped at {report['stopped_at']}: the rebase is not finished."]
    return "\n".join(lines) + "\n"


def upstream_provides(repo: Path, rev: str, diff_text: str) -> list[str]:
    """The parts of a patch's added surface that the new base already has."""
    hits = []
    for kind, name, file in added_surface(diff_text):
        if kind == "value":
            p = gitutil.git(
                repo, "grep", "-q", "-F", f'"{name}"', rev, "--", file, check=False
            )
            if p.returncode == 0:
                hits.append(f'upstream now has: value "{name}" ({file})')
            continue
        p = gitutil.git(
            repo,
            "grep",
            "-l",
            "-E",
            rf"^{kind} {name}\b",
            rev,
            "--",
            "vllm",
            check=False,
        )
        where = [ln.split(":", 1)[1] for ln in p.stdout.splitlines()]
        if where:
            hits.append(f"upstream now has: {kind} {name} ({', '.join(where)})")
    return hits


def short_table(report: dict) -> str:
    rows = [
        f"  {i:>2}. {r['status']:<16} {r['patch']}"
        for i, r in enumerate(report["patches"], 1)
    ]
    return "\n".join(rows)


# ---------------------------------------------------------------- state


# What every step reads from the state: without one, it is damaged.
REQUIRED = {
    "old_pin", "new_pin", "old_base", "new_base", "old_work", "patches", "results",
    "next",
}  # fmt: skip


@dataclasses.dataclass
class State:
    path: Path
    data: dict

    @classmethod
    def load(cls, project: Project) -> State | None:
        p = project.cache / "rebase" / "state.json"
        if not p.is_file():
            return None
        try:
            data = json.loads(p.read_text())
        except ValueError:
            data = None
        if not isinstance(data, dict) or REQUIRED - set(data):
            what = (
                f"lacks {', '.join(sorted(REQUIRED - set(data))[:3])}"
                if isinstance(data, dict)
                else "is not a JSON object"
            )
            raise VstackError(
                f"{p} is damaged ({what}): the rebase it "
                f"records cannot be resumed or aborted by vstack; check patches/ and "
                f"stack.toml with git status, then remove {p.parent}"
            )
        data.setdefault("timings", {})
        return cls(p, data)

    def save(self) -> None:
        fsutil.write_text(self.path, json.dumps(self.data, indent=1))

    def clear(self) -> None:
        # state.json first: once it is gone the rebase is over, whatever of the
        # folder a kill leaves (the next rebase removes that).
        fsutil.remove(self.path)
        fsutil.remove_tree(self.path.parent)


# ---------------------------------------------------------------- steps


def _target_base(
    project: Project, onto: str, git_path, wheel_arg, timings, wheel_index=None
) -> tuple[Base, Pin]:
    kind = classify_target(onto, git_path)
    old = project.pin
    verified = VerifiedCache(project.cache / "verified.json")
    t = time.perf_counter()
    wheel = sha = per_commit = None
    if kind == "wheel":
        wheel = Path(onto).resolve()
        if not wheel.is_file():
            raise VstackError(f"no such wheel file: {onto}")
        check_record(wheel)  # before the wheel cache gets it
        wheel = cache_local_wheel(wheel, project.wheel_cache)
        verified.remember_record(wheel)
    elif kind == "version":
        wheel = fetch_wheel(onto, project.wheel_cache, verified=verified)
    elif kind == "per-commit":
        per_commit = fetch_per_commit(project, onto, wheel_index)
        wheel = per_commit.wheel
    if kind == "git" and wheel_arg:
        if wheel_arg.endswith(".whl"):
            check_record(Path(wheel_arg).resolve())
        wheel = (
            cache_local_wheel(Path(wheel_arg).resolve(), project.wheel_cache)
            if wheel_arg.endswith(".whl")
            else fetch_wheel(wheel_arg, project.wheel_cache, verified=verified)
        )
    if wheel is not None:
        sha = per_commit.sha256 if per_commit else sha256_file(wheel)
        # build copies the RECORD lines of what it does not change: checked now,
        # before the wheel is pinned
        check_record(wheel, verified)
    timings["download"] = time.perf_counter() - t
    t = time.perf_counter()
    if kind == "git":
        checkout = Path(git_path).resolve() if git_path else project.submodule
        if not gitutil.is_repo(checkout):
            raise VstackError(f"{checkout} is not a git checkout")
        version = _describe_version(checkout, onto)
        base = base_from_git(project, checkout, onto, version)
        commit = "g" + base.commit[:9]
    else:
        version, commit = read_wheel_version(wheel)
        base = base_from_wheel(project, wheel, sha)
        commit = commit or ""
    timings["base_extraction"] = time.perf_counter() - t
    if per_commit:
        commit = "g" + per_commit.commit
    image = (
        image_for(version, per_commit.commit)
        if per_commit
        else f"vllm/vllm-openai:v{version}"
        if re.fullmatch(r"\d+\.\d+\.\d+", version)
        else old.image
    )
    pin = Pin(
        version=version, commit=commit, wheel=wheel.name if wheel else "",
        sha256=sha or "", image=image, image_digest="",
    )  # fmt: skip
    return base, pin


def _describe_version(checkout: Path, rev: str) -> str:
    p = gitutil.git(checkout, "describe", "--tags", "--abbrev=0", rev, check=False)
    tag = p.stdout.strip()
    sha = gitutil.out(checkout, "rev-parse", "--short=9", f"{rev}^{{commit}}")
    if p.returncode != 0 or not tag:
        return f"0.0.0.dev0+g{sha}"
    return (
        tag.lstrip("v")
        if gitutil.out(checkout, "rev-parse", f"{tag}^{{commit}}").startswith(
            gitutil.out(checkout, "rev-parse", f"{rev}^{{commit}}")
        )
        else f"{tag.lstrip('v')}.dev0+g{sha}"
    )


def _upstream_subjects(repo: Path, old: str, new: str) -> list[str] | None:
    """Subjects of upstream commits old..new, or None when the bases share no history."""
    p = gitutil.git(repo, "merge-base", "--is-ancestor", old, new, check=False)
    if p.returncode != 0:
        return None
    return gitutil.out(
        repo, "log", "--no-merges", "--format=%h %s", f"{old}..{new}"
    ).splitlines()


def _blame_conflicts(
    repo: Path, old_base: str, files: list[str], has_history: bool
) -> list[str]:
    if not has_history:
        return []
    found: dict[str, str] = {}
    for f in files:
        path = repo / f
        if not path.is_file():
            continue
        for a, b in ours_ranges(path.read_text(errors="replace")):
            p = gitutil.git(
                repo, "blame", "--line-porcelain", "-L", f"{a},{b}",
                f"{old_base}..HEAD", "--", f, check=False,
            )  # fmt: skip
            sha = None
            for ln in p.stdout.splitlines():
                m = re.match(r"^([0-9a-f]{40}) \d+ \d+", ln)
                if m:
                    sha = m.group(1)
                elif ln == "boundary":
                    sha = None
                elif ln.startswith("summary ") and sha:
                    found.setdefault(sha[:12], f"{sha[:12]} {ln[8:]} ({f}:{a}-{b})")
    return list(found.values())


def resolution_for(
    project: Project, version: str, name: str, after: str | None = None
) -> Path | None:
    """resolutions/<version>/<name>; else, given the old base's version, the record
    of the newest release between the two (what a nightly after it replays)."""
    path = project.root / RESOLUTIONS / version / name
    if path.is_file():
        return path
    return nearest_record(project.root, name, version, after) if after else None


def _undo(repo: Path, before: str) -> None:
    """Back to `before`, clean: what a probe of a patch left (a `git am` stopped on a
    conflict, or its commit) is undone."""
    if gitutil.op_in_progress(repo):
        gitutil.git(repo, "am", "--abort", check=False)
    gitutil.git(repo, "reset", "-q", "--hard", before)


def forward(repo: Path, patch: Path, info, before: str, top: set[str]) -> PatchResult:
    """`git am -3` of the whole patch onto HEAD (= before), and what it proves: a
    patch whose application changes nothing is `dropped-upstream` (the base has
    all of it: renames, copies, modes and quoted names as git applies them). A
    base without some top-level folder (a wheel has vllm/ but no tests/) cannot
    show those files: a patch that changes nothing in what the base has, and only
    adds files where the base has nothing to compare, is dropped too, saying which."""
    r = apply_one(repo, patch)
    if r.status == "empty":
        return PatchResult(patch.name, "dropped-upstream", info.files, [
            "git am -3 of the whole patch onto the new base left no change: the "
            "base already has all of it"
        ])  # fmt: skip
    if r.ok and r.commit:
        touched = [f for f in info.files if f.split("/", 1)[0] in top]
        changed = [p for _, p, _ in gitutil.tree_changes(repo, before, r.commit)]
        left = [f for f in changed if f.split("/", 1)[0] in top]
        if touched and not left:
            gitutil.git(repo, "reset", "-q", "--hard", before)
            missing = sorted({f.split("/", 1)[0] + "/" for f in changed})
            return PatchResult(patch.name, "dropped-upstream", info.files, [
                f"git am -3 of the whole patch onto the new base changed nothing in "
                f"{', '.join(touched)}: the base already has it there; what it "
                f"changes in {', '.join(changed)} cannot be compared (the base has "
                f"no {', '.join(missing)})"
            ])  # fmt: skip
    return r


def _use_resolution(
    repo: Path,
    patch: Path,
    info,
    record: Path,
    root: Path,
    before: str,
    top: set[str],
) -> PatchResult | dict:
    """Replay a recorded resolution of `patch` after the proof it rests on, checked
    on the base at hand: a "superseded" record (no diff) only where the patch does
    not apply (as `--skip` requires), a recorded port only where it applies and
    changes something. Returns the result, or a stale-record stop (a dict)."""
    text, rec = load_patch(record)
    where = record.relative_to(root).as_posix()
    if not rec.files:
        reason = rec.body.strip().split("\n\n")[0].replace("\n", " ") or "(no reason)"
        probe = forward(repo, patch, info, before, top)
        if probe.status == "dropped-upstream":
            probe.details.append(f"(recorded as superseded in {where})")
            return probe
        if probe.status != "conflict":
            _undo(repo, before)
            return _stale_record_result(patch.name, where, None, None, info.files, (
                f"{where} says the patch is superseded, but it applies on this base "
                f"({probe.status}): the record does not hold here"
            ))  # fmt: skip
        _undo(repo, before)
        return PatchResult(
            patch.name, "superseded", info.files,
            [f"recorded in {where}: {reason}", "the patch does not apply on this base"],
        )  # fmt: skip
    # The commit gets the port's own message: the record's hash trailer stays out.
    with tempfile.TemporaryDirectory(prefix="vstack-record-") as tmp:
        port = Path(tmp) / record.name
        port.write_bytes(records.strip_patch_hash(text).encode())
        r = apply_one(repo, port)
    r.patch = patch.name
    if r.status == "empty":
        return _stale_record_result(patch.name, where, None, None, info.files, (
            f"the recorded port {where} changes nothing on this base: it is no "
            f"resolution of the patch here"
        ))  # fmt: skip
    if r.status == "conflict":
        r.details.insert(0, f"the recorded port {where} does not apply either")
    else:
        r.details = [f"recorded port {where} ({r.status})"]
        r.status = "ported"
    return r


def base_top_dirs(repo: Path, rev: str) -> set[str]:
    """Top-level entries of a base: a wheel has vllm/ but no tests/."""
    return set(gitutil.out(repo, "ls-tree", "--name-only", "-z", rev).split("\0")) - {
        ""
    }


def _ref_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "-", text).strip(".") or "-"


def keep_dropped(repo: Path, d: dict, name: str) -> str | None:
    """A ref to the dropped patch as a commit on the old base (format-patch -1 of it
    gives the patch back): refs/vstack/dropped/<new version>/<patch>."""
    old = d.get("old_applied") or []
    if name not in d["patches"] or len(old) != len(d["patches"]):
        return None
    sha = old[d["patches"].index(name)]
    stem = f"refs/vstack/dropped/{_ref_part(d['new_pin']['version'])}/{_ref_part(name)}"
    ref, n = stem, 2
    while (have := gitutil.rev_parse(repo, ref)) not in (None, sha):
        ref, n = f"{stem}-{n}", n + 1
    if have is None:
        gitutil.git(repo, "update-ref", ref, sha)
    return ref


def _dropped_stems(d: dict) -> dict[str, str]:
    """{patch file stem: status} of the patches this rebase dropped so far."""
    return {
        r["patch"].removesuffix(".patch"): r["status"]
        for r in d["results"]
        if r["status"] in DROPPED
    }


def follow_drops(
    repo: Path, commit: str, dropped: dict[str, str]
) -> tuple[str, list[str]]:
    """commit, or a copy of it (same tree, parent, author and committer) whose
    message has no `Depends-On:` trailer naming a dropped patch (they follow the
    drop: the base has what they named). The trailers are git's (interpret-trailers);
    (new commit, what was removed)."""
    from vstack import gitparse

    msg = gitutil.git(repo, "log", "-1", "--format=%B", commit, text=False).stdout
    message = msg.decode("utf-8", errors="surrogateescape").rstrip("\n") + "\n"
    named = [
        v for k, v in gitparse.trailers(message)
        if k.lower() == "depends-on" and v.removesuffix(".patch") in dropped
    ]  # fmt: skip
    if not named:
        return commit, []
    body, _, block = message.rstrip("\n").rpartition("\n\n")
    kept, removed = [], []
    for line in block.split("\n"):
        key, sep, value = line.partition(":")
        stem = value.strip().removesuffix(".patch")
        if sep and key.strip().lower() == "depends-on" and stem in dropped:
            removed.append(f"Depends-On: {stem} removed ({stem} left the series: "
                           f"{dropped[stem]})")  # fmt: skip
        else:
            kept.append(line)
    new_msg = (body + ("\n\n" + "\n".join(kept) if kept else "")).rstrip("\n") + "\n"
    who = gitutil.out(
        repo, "log", "-1", "--date=raw",
        "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd%x00%T%x00%P", commit,
    ).split("\0")  # fmt: skip
    env = dict(zip(
        ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
         "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"),
        who[:6], strict=True,
    ))  # fmt: skip
    parents = [a for p in who[7].split() for a in ("-p", p)]
    new = gitutil.out(
        repo, "commit-tree", who[6], *parents, "-F", "-", input=new_msg, env=env
    )
    return new, removed


def _stale_record_result(
    name: str, where: str, want: str | None, have: str | None, files, why=None
) -> dict:
    """A stop at a record that does not hold: made from another version of the
    patch (want/have: the hashes), or `why` the proof failed on this base."""
    return {
        "patch": name, "status": "stale-record", "files": files, "record": where,
        "head": None, "changed": why is None,
        "details": [
            why or f"{where} was recorded from another version of patches/{name} "
            f"(Resolves-Patch-Sha256 {str(want)[:12]}, the patch is now "
            f"{str(have)[:12]}): replaying it would drop what changed in the patch since",
        ],
    }  # fmt: skip


def _expected_head(d: dict) -> str:
    """Where the work branch must be for the rebase to go on from its state: the
    commit of the last patch that went through (or HEAD before a stop)."""
    for r in reversed(d["results"]):
        if r.get("commit") or r.get("head"):
            return r.get("commit") or r["head"]
    return d["new_base"]


def _resync(project: Project, d: dict) -> None:
    """Put the stack repository where the state says the rebase is, undoing what a
    killed run left (a `git am` half done, a commit the state does not record, the
    checkout of the new base not made yet), instead of trusting that it is there."""
    repo = project.repo
    expected = _expected_head(d)
    # No stop waits for the user here: a `git am` or changes in the work tree are
    # what a git that vstack ran left when it was stopped (Ctrl-C reaches it too);
    # they are kept under a backup ref, then undone.
    clear_interrupted_git(repo)
    head, branch, _ = repo_state(repo)
    if head == expected and branch == WORK_BRANCH:
        return
    # Commits past where the state says the rebase is (a killed `git am`'s, or
    # someone's) are kept under a ref before HEAD goes back; old_work is in the state.
    tip = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    for sha in dict.fromkeys((head, tip)):
        if sha not in (None, d.get("old_work")) and not descends(repo, sha, expected):
            ref = backup_branch(repo, "rebase-found", sha)
            print(
                f"vstack: commits the rebase did not record kept as {ref}",
                file=sys.stderr,
            )
    gitutil.git(repo, "checkout", "-q", "-f", "-B", WORK_BRANCH, expected)


def _run_patches(project: Project, state: State) -> int:
    repo = project.repo
    d = state.data
    _resync(project, d)
    patches = [project.patches_dir / n for n in d["patches"]]
    subjects = d.get("upstream_subjects")
    version = d["new_pin"]["version"]
    top = base_top_dirs(repo, d["new_base"])
    t = time.perf_counter()
    head = _expected_head(d)  # where _resync has just put HEAD
    while d["next"] < len(patches):
        patch = patches[d["next"]]
        text, info = load_patch(patch)
        before = head
        notes: list[str] = []
        pr_hit = None
        for pr in info.trailers.get("Upstream-PR", []):
            pr_hit = pr_hit or (pr_in_subjects(pr, subjects) if subjects else None)
        if pr_hit:
            # evidence, not proof: the patch leaves only when the base has it
            notes.append(f"upstream commit naming its Upstream-PR: {pr_hit}")
        record = resolution_for(project, version, patch.name, d["old_pin"]["version"])
        if record is not None:
            where = record.relative_to(project.root).as_posix()
            verdict, want, have = records.check_record(
                record.read_text(errors="replace"), patch.read_bytes()
            )
            if verdict == "stale":
                res = _stale_record_result(patch.name, where, want, have, info.files)
                res["head"] = before
                return _stop(project, state, res, t)
            if verdict == "unverifiable":
                notes.append(
                    f"{where} has no {records.TRAILER}: trailer (recorded before "
                    f"vstack wrote one), so whether patches/{patch.name} changed since "
                    f"cannot be checked; replayed as recorded"
                )
                print(f"vstack: note: {notes[-1]}", file=sys.stderr)
            got = _use_resolution(repo, patch, info, record, project.root, before, top)
            if isinstance(got, dict):
                got["head"] = before
                got["details"] += notes
                return _stop(project, state, got, t)
            r = got
        else:
            r = forward(repo, patch, info, before, top)
        res = dataclasses.asdict(r)
        del res["commit"]
        res["details"] = res["details"] + notes
        if r.status not in ("clean", "dropped-upstream"):
            res["details"] += upstream_provides(repo, d["new_base"], text)
        if r.status == "conflict":
            res["head"] = before
            if record is not None:
                res["source"] = record.relative_to(project.root).as_posix()
            res["upstream_commits"] = _blame_conflicts(
                repo, d["old_base"], r.files, subjects is not None
            )
            return _stop(project, state, res, t)
        if r.status in DROPPED:
            ref = keep_dropped(repo, d, patch.name)
            if ref:
                res["backup"] = ref
                res["details"].append(f"kept as {ref}")
        elif r.commit:
            head, removed = follow_drops(repo, r.commit, _dropped_stems(d))
            if head != r.commit:
                gitutil.git(repo, "update-ref", f"refs/heads/{WORK_BRANCH}", head)
                res["details"] += removed
        res["commit"] = head
        d["results"].append(res)
        d["next"] += 1
        print(f"  [{d['next']}/{len(patches)}] {r.status:<16} {patch.name}")
        state.save()
    d["timings"]["apply"] = d["timings"].get("apply", 0) + time.perf_counter() - t
    return _finish(project, state)


def _stop(project: Project, state: State, res: dict, t: float) -> int:
    """The rebase stops at res (a conflict or a stale record): state and report."""
    d = state.data
    d["results"].append(res)
    d["timings"]["apply"] = d["timings"].get("apply", 0) + time.perf_counter() - t
    # The report first: a run killed between the two is resumed from the state,
    # which does not record the stop yet, and writes both again.
    md, js = write_report(project, state_report(d))
    state.save()
    if res["status"] == "stale-record":
        _print_stale(project, res)
    else:
        _print_conflict(project, res)
    print(f"vstack: report so far: {md} and {js}", file=sys.stderr)
    return 1


def state_report(d: dict) -> dict:
    """The report of a rebase in progress or complete: results so far, the patch
    it stopped at, and the patches not reached yet."""
    done = {r["patch"] for r in d["results"]}
    pending = [
        {"patch": n, "status": "pending", "files": [], "details": []}
        for n in d["patches"]
        if n not in done
    ]
    last = d["results"][-1] if d["results"] else None
    stopped = (
        last["patch"]
        if last
        and last["status"] in ("conflict", "stale-record")
        and len(d["results"]) == d["next"] + 1
        else None
    )
    # No timings: the report is a function of the inputs, the same whether or not
    # a run was interrupted and resumed (they are printed, and in rebase-timings.json).
    report = {
        "old": {**d["old_pin"], "git": d["old_base"]},
        "new": {**d["new_pin"], "git": d["new_base"]},
        "target": d["target"],
        "patches": d["results"] + pending,
    }
    if stopped:
        report["stopped_at"] = stopped
    return report


def _print_stale(project: Project, res: dict) -> None:
    record = res["record"]
    print(f"  stale record for {res['patch']}:", file=sys.stderr)
    for line in res["details"]:
        print(f"     {line}", file=sys.stderr)
    still = (
        f"; or, when the record still holds, set its {records.TRAILER}: to the "
        f"patch's sha256 and --continue"
        if res.get("changed", True)
        else ""
    )
    print(
        f"vstack: re-resolve it: remove the record (git rm {record}) and "
        f"`vstack rebase --continue` (the patch is applied and, when it conflicts, "
        f"resolved and recorded anew){still}; or `vstack rebase --abort`. "
        f"patches/ and {STACK_TOML} are unchanged.",
        file=sys.stderr,
    )


def _print_conflict(project: Project, res: dict) -> None:
    repo = project.repo
    print(f"  conflict in {res['patch']}:", file=sys.stderr)
    for line in res["details"]:
        print(f"     {line}", file=sys.stderr)
    for c in res.get("upstream_commits", []):
        print(f"     upstream: {c}", file=sys.stderr)
    print(
        f"vstack: resolve the conflict markers in {repo} "
        f"({', '.join(res['files'])}), then `vstack rebase --continue`; "
        f"`vstack rebase --skip --reason TEXT` when the new base supersedes the patch; "
        f"or `vstack rebase --abort` to put everything back. "
        f"patches/ and {STACK_TOML} are unchanged until the rebase completes.",
        file=sys.stderr,
    )


def _finish(project: Project, state: State) -> int:
    d = state.data
    repo = project.repo
    t = time.perf_counter()
    tip = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    new = render(repo, d["new_base"], tip)
    new_pin = Pin(**d["new_pin"])
    toml = project.root / STACK_TOML
    new_toml = render_stack_toml(toml.read_text(), new_pin).encode()
    planned = planned_records(project, d)
    # What the writes below change, saved first: --abort after a run killed among
    # them puts back exactly what this rebase wrote (see restore_project_files).
    # (Added to, not replaced: a --continue after a killed finish runs it again.)
    old = current_files(project.patches_dir)
    fin = d.setdefault("finishing", {"patches": {}, "records": {}})
    fin["patches"].update({
        n: records.patch_sha256(new[n]) if n in new else None
        for n in diff_files(old, new)
    })  # fmt: skip
    fin["stack_toml"] = records.patch_sha256(new_toml)
    fin["records"].update({
        path.relative_to(project.root).as_posix(): records.patch_sha256(data)
        for path, data in planned.items()
    })  # fmt: skip
    state.save()
    # patches/, stack.toml, the records and the sync record change together.
    extra: dict[str, bytes | None] = {STACK_TOML: new_toml}
    extra.update(
        {p.relative_to(project.root).as_posix(): b for p, b in planned.items()}
    )
    extra[synced.REL] = synced.record_bytes(tip, d["new_base"], new)
    write_patches(project, new, "rebase", extra)
    after_pin_moved(project, new_pin)
    recorded = list(planned)
    d["timings"]["export"] = time.perf_counter() - t
    report = state_report(d)
    md, js = write_report(project, report, d["timings"])
    clear_journal(project)  # the work branch now holds the whole (rebased) series
    state.clear()
    print(short_table(report))
    kept = sum(r["status"] not in DROPPED for r in d["results"])
    print(
        f"vstack: rebased onto vLLM {new_pin.version}: {kept} patch(es) kept, "
        f"{len(d['results']) - kept} dropped (upstream has them); "
        f"{STACK_TOML} and patches/ updated"
    )
    for r in d["results"]:
        if r["status"] in DROPPED:
            print(
                f"vstack: {r['patch']} left the series ({r['status']}); kept as "
                f"{r.get('backup') or '(no backup ref)'} in {repo}"
            )
    for path in recorded:
        print(f"vstack: recorded the resolution in {path.relative_to(project.root)}")
    print(
        "vstack: timings: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in d["timings"].items())
    )
    print(f"vstack: report: {md} and {js}")
    return 0


def superseded_record(
    subject: str, version: str, reason: str, patch_sha256: str | None = None
) -> str:
    """A resolution with no diff: the patch is dropped on `version`, for `reason`.
    patch_sha256: of the patch file it resolves (see vstack.records)."""
    text = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"Subject: {subject}\n\n"
        f"Superseded by vLLM {version}: {reason.strip()}\n"
    )
    return records.with_patch_hash(text, patch_sha256) if patch_sha256 else text


def _patch_hash(project: Project, d: dict, name: str) -> str | None:
    """sha256 of patches/<name> as the rebase found it (saved when it started)."""
    known = d.get("patch_sha256", {}).get(name)
    if known:
        return known
    path = project.patches_dir / name
    return records.patch_sha256(path.read_bytes()) if path.is_file() else None


def planned_records(project: Project, d: dict) -> dict[Path, bytes]:
    """{path: bytes} of the records this rebase's manual resolutions make, each
    carrying the hash of the patch it resolves; paths that exist are left out."""
    out = project.root / RESOLUTIONS / d["new_pin"]["version"]
    planned = {}
    for res in d["results"]:
        sha = _patch_hash(project, d, res["patch"])
        if res["status"] == "conflict-resolved":
            # bytes: a CR the port adds is content (text mode would drop it)
            data = gitutil.git(
                project.repo, *FORMAT_PATCH, "-1", res["commit"], text=False
            ).stdout
            text = data.decode("utf-8", errors="surrogateescape")
            text = records.with_patch_hash(text, sha) if sha else text
        elif res["status"] == "superseded" and res.get("reason"):
            text = superseded_record(
                res["subject"], d["new_pin"]["version"], res["reason"], sha
            )
        else:
            continue
        data = text.encode("utf-8", errors="surrogateescape")
        path = out / res["patch"]
        fin = (d.get("finishing") or {}).get("records", {})
        rel = path.relative_to(project.root).as_posix()
        if path.exists() and fin.get(rel) != records.patch_sha256(path.read_bytes()):
            if path.read_bytes() != data:
                print(
                    f"vstack: note: {path.relative_to(project.root)} exists and differs "
                    f"from this rebase's resolution; left as it is",
                    file=sys.stderr,
                )
            continue
        planned[path] = data
    return planned


def record_resolutions(
    project: Project, d: dict, planned: dict[Path, bytes] | None = None
) -> list[Path]:
    """Write what this rebase resolved by hand under resolutions/<version>/, so the
    next rebase onto the same base (CI, a colleague) replays it. Never overwrites
    (the finish of a rebase writes them with patches/, see _finish)."""
    if planned is None:
        planned = planned_records(project, d)
    written = []
    for path, data in planned.items():
        if path.exists():
            continue
        fsutil.write_bytes(path, data)
        written.append(path)
    return written


# ---------------------------------------------------------------- patches/ on --abort


def save_project_files(project: Project, saved: Path) -> None:
    """A copy of patches/ (series + .patch files) and stack.toml as the rebase
    starts: what --abort compares with, and restores after a killed finish."""
    fsutil.remove_tree(saved)  # a copy left by a run killed before it began
    for name, data in current_files(project.patches_dir).items():
        fsutil.write_bytes(saved / "patches" / name, data)
    (saved / "patches").mkdir(parents=True, exist_ok=True)
    fsutil.copy_file(project.root / STACK_TOML, saved / STACK_TOML)


def restore_project_files(project: Project, d: dict, saved: Path) -> tuple[list, list]:
    """(restored, differing) project paths. A file that differs from the saved copy
    is put back when it is what the rebase's finish wrote; anything else that
    differs was changed by someone else and is only named."""
    if not saved.is_dir():
        return [], []
    fin = d.get("finishing") or {}
    restored, differs = [], []
    old = {p.name: p.read_bytes() for p in (saved / "patches").iterdir()}
    cur = current_files(project.patches_dir)
    wrote = fin.get("patches", {})
    for name in diff_files(old, cur):
        target = project.patches_dir / name
        have = records.patch_sha256(cur[name]) if name in cur else None
        if name in wrote and wrote[name] == have:
            if name in old:
                fsutil.write_bytes(target, old[name])
            else:
                fsutil.remove(target)
            restored.append(f"patches/{name}")
        else:
            differs.append(f"patches/{name}")
    toml = project.root / STACK_TOML
    before = (saved / STACK_TOML).read_bytes()
    now = toml.read_bytes() if toml.is_file() else b""
    if now != before:
        if fin.get("stack_toml") == records.patch_sha256(now):
            fsutil.write_bytes(toml, before)
            restored.append(STACK_TOML)
        else:
            differs.append(STACK_TOML)
    for rel, sha in fin.get("records", {}).items():
        path = project.root / rel
        if path.is_file() and records.patch_sha256(path.read_bytes()) == sha:
            fsutil.remove(path)
            restored.append(f"{rel} (removed)")
            with_parent = path.parent
            if with_parent.is_dir() and not any(with_parent.iterdir()):
                with_parent.rmdir()
    return restored, differs


def write_report(
    project: Project, report: dict, timings: dict | None = None
) -> tuple[Path, Path]:
    out = project.cache / "reports"
    md, js = out / "rebase.md", out / "rebase.json"
    fsutil.write_text(md, render_report(report))
    fsutil.write_text(js, json.dumps(report, indent=2) + "\n")
    if timings is not None:
        fsutil.write_text(
            out / "rebase-timings.json", json.dumps(timings, indent=2) + "\n"
        )
    return md, js


def _project_files_dirty(project: Project) -> list[str]:
    if not gitutil.is_repo(project.root):
        return []
    p = gitutil.git(
        project.root, "status", "--porcelain", "--", "patches", STACK_TOML, check=False
    )
    return [ln[3:] for ln in p.stdout.splitlines()]


# ---------------------------------------------------------------- verbs


def _require_keepable_messages(patches: list[Path]) -> None:
    """Refuse, before anything changes, a patch whose message git am would not keep:
    the finish (export) refuses such a commit, and a reword of the rebased branch
    at that point is not what --continue goes on from, so the user was stuck."""
    from vstack.message import patch_file_problem

    for p in patches:
        found = patch_file_problem(p.read_text(encoding="utf-8", errors="replace"))
        if found:
            n, what = found
            raise VstackError(
                f"patches/{p.name}:{n}: {what}; reword that line of the message (in "
                f"the patch, or on the work branch then `vstack export`) before "
                f"rebasing: nothing was changed"
            )


def cmd_rebase(
    project: Project,
    onto: str,
    git_path: str | None = None,
    wheel: str | None = None,
    wheel_index: str | None = None,
) -> int:
    if State.load(project):
        raise VstackError(
            "a rebase is already in progress: `vstack rebase --continue` after resolving, "
            "or `vstack rebase --abort`"
        )
    dirty = _project_files_dirty(project)
    if dirty:
        raise VstackError(
            f"uncommitted changes in {', '.join(dirty[:3])}: commit or stash them first "
            f"(a rebase rewrites patches/ and {STACK_TOML})"
        )
    patches = series_paths(project.patches_dir)
    old_base = pinned_base_anywhere(project)
    repo = project.repo
    require_whole_series(project)
    _require_keepable_messages(patches)
    ensure_clean(repo)
    require_on_work(repo, "rebase")
    why = unexported_work(project, old_base, load_journal(project))
    if why:
        raise VstackError(
            f"{why} (or `vstack apply --force` to drop it) before rebasing: the "
            f"rebase moves patches/, not the work branch"
        )
    # git am -3 merges with each patch's preimage blobs, which exist only once the
    # series has been applied on the old base in this repository (a fresh clone
    # has just the base): without them a conflict leaves no markers to resolve.
    old_tip = applied_tip(project, old_base, patches)
    work = gitutil.rev_parse(repo, f"refs/heads/{WORK_BRANCH}")
    timings: dict[str, float] = {}
    new_base, new_pin = _target_base(
        project, onto, git_path, wheel, timings, wheel_index
    )
    if new_base.commit == old_base.commit:
        print(
            f"vstack: {onto} is the pinned base already (vLLM {project.pin.version}, "
            f"{old_base.commit[:12]}): nothing to rebase"
        )
        return 0
    sync_file = project.cache / synced.FILE
    state = State(project.cache / "rebase" / "state.json", {
        "target": onto,
        "old_pin": dataclasses.asdict(project.pin),
        "new_pin": dataclasses.asdict(new_pin),
        "old_base": old_base.commit,
        "new_base": new_base.commit,
        "old_work": work,
        "old_synced_record": sync_file.read_text() if sync_file.is_file() else None,
        "old_head": gitutil.out(repo, "symbolic-ref", "-q", "HEAD", check=False) or gitutil.out(repo, "rev-parse", "HEAD"),
        "patches": [p.name for p in patches],
        # each patch as a commit on the old base: a dropped one is kept under a ref
        "old_applied": gitutil.out(
            repo, "rev-list", "--reverse", f"{old_base.commit}..{old_tip}"
        ).split(),
        "patch_sha256": {p.name: records.patch_sha256(p.read_bytes()) for p in patches},
        "old_gitlink": current_gitlink(project),
        "results": [],
        "next": 0,
        "timings": timings,
        "upstream_subjects": _upstream_subjects(repo, old_base.commit, new_base.commit),
    })  # fmt: skip
    save_project_files(project, state.path.parent / "saved")
    # The rebase begins when state.json appears; the work branch moves to the new
    # base in _run_patches, which checks out wherever the state says HEAD must be.
    state.save()
    print(
        f"vstack: rebasing {len(patches)} patch(es): vLLM {project.pin.version} "
        f"({old_base.commit[:12]}) -> {new_pin.version} ({new_base.commit[:12]})"
    )
    return _run_patches(project, state)


def _require_state(project: Project) -> State:
    state = State.load(project)
    if state is None:
        raise VstackError("no rebase in progress")
    return state


def _stopped(d: dict) -> dict | None:
    """The result the rebase stopped at (a conflict or a stale record), if any."""
    last = d["results"][-1] if d["results"] else None
    if last is not None and len(d["results"]) == d["next"] + 1:
        return last
    return None


def patches_moved(project: Project, d: dict) -> list[str]:
    """The series' files in patches/ that changed since the rebase began (a patch
    edited, added and listed, ...), but for what the rebase's own finish wrote:
    the finish would overwrite them with the rebased series."""
    saved = project.cache / "rebase" / "saved" / "patches"
    if not saved.is_dir():
        return []
    old = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    cur = current_files(project.patches_dir)
    try:
        listed = set(read_series(project.patches_dir))
    except VstackError:
        listed = set()
    ours = set(d["patches"]) | listed | {"series"}
    wrote = (d.get("finishing") or {}).get("patches", {})
    return [
        n for n in diff_files(old, cur)
        if n in ours
        and not (n in wrote and wrote[n] == (records.patch_sha256(cur[n]) if n in cur else None))
    ]  # fmt: skip


def _refuse_moved(project: Project, d: dict, verb: str) -> None:
    moved = patches_moved(project, d)
    if moved:
        raise VstackError(
            f"patches/ changed since the rebase began "
            f"({', '.join('patches/' + n for n in moved[:3])}"
            f"{' ...' if len(moved) > 3 else ''}): `vstack rebase {verb}` would "
            f"overwrite that with the rebased series. Put the change aside (git stash, "
            f"or copy the files out; the rebase's copy of patches/ is in "
            f"{project.cache / 'rebase' / 'saved'}) and make it again after the rebase, "
            f"or `vstack rebase --abort`"
        )


def cmd_continue(project: Project) -> int:
    state = _require_state(project)
    repo = project.repo
    d = state.data
    _refuse_moved(project, d, "--continue")
    last = _stopped(d)
    if last and last["status"] == "stale-record":
        d["results"].pop()  # checked again: removed or refreshed by now, or stops again
        return _run_patches(project, state)
    if not last or last["status"] != "conflict":
        return _run_patches(project, state)  # a killed run: _resync puts HEAD back
    op = gitutil.op_in_progress(repo)
    if op not in (None, AM_OP):
        ensure_clean(repo)  # names it and how to drop it
    head = gitutil.rev_parse(repo, "HEAD")
    if not descends(repo, last["head"], head):
        raise VstackError(
            f"HEAD of {repo} ({head[:12]}) is not on top of where the rebase stopped "
            f"({last['head'][:12]}): --continue cannot take it as the resolution of "
            f"{last['patch']}; check out the resolution there, or --abort"
        )
    unresolved = []
    for f in last["files"]:
        path = repo / f
        if path.is_file():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if MARKER.match(line):
                    unresolved.append(f"{f}:{n}")
                    break
    if unresolved:
        raise VstackError(
            f"unresolved conflict markers in {', '.join(unresolved)}; resolve them, then --continue"
        )
    patch = project.patches_dir / last["patch"]
    _, info = load_patch(patch)
    stray = stray_changes(repo, set(last["files"]) | set(info.files))
    if stray:
        raise VstackError(
            f"uncommitted changes outside {last['patch']}'s files in {repo} "
            f"({', '.join(stray[:3])}): --continue would commit them as part of the "
            f"patch, or apply the next patches over them. `git add` them if they belong "
            f"to the resolution; else commit or discard them (git -C {repo} checkout -- "
            f"<file>), then --continue"
        )
    # What was being applied: the patch, or the recorded port of it.
    source = last.get("source")
    data = (
        records.strip_patch_hash(
            (project.root / source).read_text(errors="replace")
        ).encode()
        if source and (project.root / source).is_file()
        else patch.read_bytes()
    )
    try:
        new = take_resolution(
            repo,
            data,
            last["patch"],
            last["head"],
            set(last["files"]) | set(info.files),
        )
    except NoChange as e:
        raise VstackError(
            f"git am --continue failed in {repo}: {e}: the resolution leaves no change "
            f"of {last['patch']} on the new base; `vstack rebase --skip --reason TEXT` "
            f"when the new base supersedes it, else resolve it again and --continue"
        ) from None
    if new is None:
        # Nothing was resolved for the stopped patch and no merge waits: the stop
        # was not a conflict left to resolve here. Try the patch again.
        d["results"].pop()
        print(f"vstack: nothing was resolved for {last['patch']}; applying it again")
        return _run_patches(project, state)
    commit, removed = follow_drops(repo, new, _dropped_stems(d))
    if commit != new:
        gitutil.git(repo, "reset", "-q", "--soft", commit)
        last["details"] = last["details"] + removed
    last["status"] = "conflict-resolved"
    last["commit"] = commit
    d["next"] += 1
    state.save()
    print(f"  [{d['next']}/{len(d['patches'])}] conflict-resolved {last['patch']}")
    return _run_patches(project, state)


def cmd_skip(project: Project, reason: str | None) -> int:
    """Drop the patch that stopped the rebase: the new base supersedes it."""
    state = _require_state(project)
    repo = project.repo
    d = state.data
    _refuse_moved(project, d, "--skip")
    last = _stopped(d)
    if not last or last["status"] != "conflict":
        raise VstackError("--skip: no patch is stopped on a conflict")
    if not reason:
        raise VstackError(
            "--skip needs --reason TEXT: what in the new base supersedes the patch "
            "(it goes into the report and resolutions/)"
        )
    patch = project.patches_dir / last["patch"]
    _, info = load_patch(patch)
    stray = stray_changes(repo, set(last["files"]) | set(info.files))
    if stray:
        raise VstackError(
            f"uncommitted changes outside {last['patch']}'s files in {repo} "
            f"({', '.join(stray[:3])}): --skip discards what is left of the patch there "
            f"and would apply the next patches over them; commit or discard them first"
        )
    if gitutil.op_in_progress(repo):
        gitutil.git(repo, "am", "--abort", check=False)
    head = gitutil.rev_parse(repo, "HEAD")
    if head != last["head"]:
        raise VstackError(
            f"commits were made in {repo} since the rebase stopped at {last['patch']} "
            f"(HEAD {head[:12]}, the stop {last['head'][:12]}): --continue takes them as "
            f"its resolution; to skip it, reset them (git -C {repo} reset --hard "
            f"{last['head'][:12]}) first"
        )
    gitutil.git(repo, "reset", "-q", "--hard", "HEAD", check=False)
    if info.files:
        gitutil.git(
            repo, "clean", "-q", "-f", "--", *info.files, check=False,
            env={"GIT_LITERAL_PATHSPECS": "1"},
        )  # fmt: skip
    # The proof a "superseded" record rests on (it drops this patch on every later
    # rebase onto this base): the whole patch does not apply here.
    probe = forward(repo, patch, info, head, base_top_dirs(repo, d["new_base"]))
    _undo(repo, head)
    if probe.status not in ("conflict", "dropped-upstream"):
        raise VstackError(
            f"--skip refused: {last['patch']} applies on the new base "
            f"({probe.status}; the stop was not a conflict); `vstack rebase "
            f"--continue` applies it"
        )
    last.update(
        status="superseded", reason=reason, subject=info.subject, commit=head,
        details=[f"skipped: {reason}"] + [
            x for x in last["details"] if x.startswith("upstream now has")
        ],
    )  # fmt: skip
    ref = keep_dropped(repo, d, last["patch"])
    if ref:
        last["backup"] = ref
        last["details"].append(f"kept as {ref}")
    d["next"] += 1
    state.save()
    print(f"  [{d['next']}/{len(d['patches'])}] superseded       {last['patch']}")
    return _run_patches(project, state)


def cmd_abort(project: Project) -> int:
    state = _require_state(project)
    repo = project.repo
    d = state.data
    if gitutil.op_in_progress(repo):
        gitutil.git(repo, "am", "--abort", check=False)
    restored, differs = restore_project_files(project, d, state.path.parent / "saved")
    # The finish may have staged the vllm/ gitlink of the new pin.
    old_link = d.get("old_gitlink")
    if (
        d.get("finishing")
        and old_link
        and current_gitlink(project) not in (None, old_link)
    ):
        write_gitlink(project, old_link)
        restored.append("the vllm/ gitlink")
    if d["old_work"]:
        gitutil.git(repo, "checkout", "-q", "-f", "-B", WORK_BRANCH, d["old_work"])
    else:
        gitutil.git(repo, "checkout", "-q", "-f", "--detach", d["old_base"])
        gitutil.git(repo, "branch", "-q", "-D", WORK_BRANCH, check=False)
    head = d.get("old_head") or ""
    if head.startswith("refs/heads/") and head != f"refs/heads/{WORK_BRANCH}":
        gitutil.git(
            repo, "checkout", "-q", "-f", head[len("refs/heads/") :], check=False
        )
    old_record = d.get("old_synced_record")
    if old_record:
        fsutil.write_text(project.cache / synced.FILE, old_record)
    elif "old_synced_record" in d:
        synced.clear(project)
    # Untracked files are not the rebase's (a `git am` it stopped was aborted
    # above): the user's, left as they are.
    kept = [
        f for f in gitutil.out(
            repo, "ls-files", "--others", "--exclude-standard", "-z"
        ).split("\0") if f
    ]  # fmt: skip
    if kept:
        print(
            f"vstack: note: untracked files in {repo} left as they are: "
            f"{', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''}",
            file=sys.stderr,
        )
    # The rebase started with patches/ and stack.toml committed (it refuses
    # otherwise): whatever git sees changed now is a difference, whoever made it.
    differs += [f for f in _project_files_dirty(project) if f not in differs]
    state.clear()
    if restored:
        print(
            f"vstack: the interrupted rebase had begun writing the new series: put back "
            f"as they were before it: {', '.join(restored)}"
        )
    if differs:
        print(
            f"vstack: rebase aborted; the work branch is as before, but these differ "
            f"from before the rebase and were not written by it (left as they are): "
            f"{', '.join(differs)}",
            file=sys.stderr,
        )
        return 0
    print(
        f"vstack: rebase aborted; the work branch, patches/ and {STACK_TOML} are as before"
    )
    return 0
