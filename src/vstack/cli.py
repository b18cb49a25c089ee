"""The vstack command line: one verb per module, each a thin wrapper."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shlex
import sys
from pathlib import Path

from vstack.config import load_project
from vstack.errors import VstackError

DESCRIPTION = """\
Maintain the vLLM EPLB patch series.

The stack is stack.toml (the pinned vLLM base), patches/series and the patch files.
vstack materialises the base as a git repository in .vstack/repo, applies the series
on a work branch there, turns that branch back into patches/ (export), and builds a
patched vLLM wheel and an image's docker build context into dist/.

Typical edit loop:
  vstack apply                       # fresh 'work' branch = base + series
  (edit, commit or --amend in .vstack/repo)
  vstack export                      # work branch -> patches/
  vstack build                       # dist/vllm-<version>+<label>.<hash>-*.whl

Following upstream:
  vstack rebase --onto nightly       # or a release (0.34.0), a commit id, a wheel file
  vstack pin --submodule             # the vllm/ gitlink at the pinned commit
"""


def _project(args):
    return load_project(Path(args.root) if args.root else None)


def run_pin(args):
    from vstack.pin import cmd_pin

    if args.submodule:
        from vstack.submodule import cmd_submodule

        return cmd_submodule(_project(args), args.url)
    return cmd_pin(_project(args))


def run_base(args):
    from vstack.base import ensure_base

    b = ensure_base(_project(args))
    print(
        f"base {b.version} at {b.commit} (from {b.source}, upstream {b.upstream_commit})"
    )
    return 0


def run_apply(args):
    from vstack.apply import cmd_apply

    return cmd_apply(_project(args), force=args.force, cont=args.cont)


def run_export(args):
    from vstack.export import cmd_export

    return cmd_export(_project(args), check=args.check, force=args.force)


def layer_note(info: dict) -> str:
    """Why the layer changes more files than the wheel line counts: the version
    file, which the series does not change and the build rewrites."""
    series = len(info["changed"]) + len(info["added"])
    extra = info["image"]["layer_files"] - series
    if extra <= 0:
        return ""
    if extra == 1:
        what = f"the {series} the series changes or adds, and " if series else "only "
        return f": {what}vllm/_version.py, which carries the version"
    return f": the {series} the series changes or adds, and {extra} more"


def run_build(args):
    from vstack.build import build

    project = _project(args)
    out = Path(args.out) if args.out else None
    info = build(project, out)
    print(
        f"vstack: built {info['wheel']} ({len(info['patches'])} patch(es)) in {info['seconds']} s"
    )
    img = info["image"]
    if out:
        where = f"{args.out.rstrip('/')}/{img['context']}"
    else:  # as the user's shell names it: relative to where they are, if inside
        ctx = project.dist / img["context"]
        try:
            where = f"{ctx.relative_to(Path.cwd()).as_posix()}/"
        except ValueError:
            where = f"{ctx}/"
    print(
        f"vstack: wrote {where} (the docker build context: {img['files']} files, "
        f"{img['bytes'] / 1024:,.0f} KB; its layer changes {img['layer_files']} "
        f"file(s) of vLLM{layer_note(info)}) and build.json"
    )
    tag = info["version"].replace("+", "-")
    print(f"vstack: next: docker build -t vllm-eplb:{tag} {shlex.quote(where)}")
    return 0


def run_test_files(args):
    from vstack.build import write_test_files

    paths = write_test_files(_project(args), Path(args.out))
    for p in paths:
        print(p)
    return 0


def run_lint(args):
    from vstack.lint import cmd_lint

    return cmd_lint(_project(args), args.git, args.mbox)


def run_rebase(args):
    from vstack import rebase

    project = _project(args)
    if args.abort:
        return rebase.cmd_abort(project)
    if args.cont:
        return rebase.cmd_continue(project)
    if args.skip:
        return rebase.cmd_skip(project, args.reason)
    if not args.onto:
        raise VstackError("give --onto <target>, --continue or --abort")
    return rebase.cmd_rebase(project, args.onto, args.git, args.wheel, args.wheel_index)


def run_check(args):
    from vstack.check import cmd_check

    if not args.per_patch:
        raise VstackError("only --per-patch is implemented: vstack check --per-patch")
    return cmd_check(_project(args), args.python)


def run_upstream(args):
    from vstack.upstream import cmd_upstream

    if args.check:
        from vstack.upstreamcheck import cmd_check as cmd_upstream_check

        given = [f for f, v in (("a patch", args.patch), ("--all", args.all),
                                ("--signoff", args.signoff is not None),
                                ("--revision", args.revision is not None),
                                ("--no-tests", args.no_tests), ("--base", args.base),
                                ("--git", args.git)) if v]  # fmt: skip
        if given:
            raise VstackError(f"--check reads upstream/ only: drop {', '.join(given)}")
        return cmd_upstream_check(_project(args))
    return cmd_upstream(
        _project(args), args.patch, args.git, args.base, all_patches=args.all,
        signoff=args.signoff, revision=args.revision, run_tests=not args.no_tests,
        python=args.python, wheel_index=args.wheel_index,
    )  # fmt: skip


def run_bench(args):
    from vstack.bench import bench_build, bench_rebase

    if args.what == "rebase":
        return bench_rebase(_project(args), args.onto)
    return bench_build(_project(args), repeat=args.repeat)


def run_gpu_check(args):
    from vstack import gpucheck

    if args.list:
        return gpucheck.list_checks()
    project = _project(args)
    if args.bundle:
        gpucheck.make_bundle(project, Path(args.bundle))
        return 0
    out = Path(args.out) if args.out else None
    return gpucheck.run_checks(project, args.python, args.only, out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vstack", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--root", help="project root (default: the folder holding stack.toml)"
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    s = sub.add_parser(
        "pin", help="show the pinned base; check vllm/ against it; write its gitlink",
        description="Prints the pin (version, commit, wheel, sha256, image), the "
        "vllm/ gitlink the repository records, and checks a populated vllm/ checkout "
        "against the pin. --submodule stages the gitlink (git update-index --cacheinfo "
        "160000,<sha>,vllm) at the pinned commit; the full id comes from the pin, the "
        "vllm/ checkout, or git ls-remote of the upstream URL (.gitmodules; "
        "VSTACK_UPSTREAM_URL or --url override it): the tag v<version>, or a branch "
        "tip starting with the pinned id. Exit 1, in one line, when it cannot.",
    )  # fmt: skip
    s.add_argument(
        "--submodule",
        action="store_true",
        help="stage the vllm/ gitlink at the pinned commit",
    )
    s.add_argument(
        "--url", help="with --submodule: the upstream repository to ls-remote"
    )
    s.set_defaults(func=run_pin)

    s = sub.add_parser(
        "base", help="materialise the pinned base in .vstack/repo (cached)",
        description="From the vllm/ checkout when populated (it must be at the pinned "
        "commit), else from the pinned wheel: downloaded with pip into the wheel cache "
        "(VSTACK_WHEEL_CACHE, default ~/.cache/vstack/wheels), sha256-checked, its "
        "source files committed as one base commit. A second call reuses it.",
    )  # fmt: skip
    s.set_defaults(func=run_base)

    s = sub.add_parser(
        "apply", help="apply patches/series onto a fresh 'work' branch of the base",
        description="git am --3way, one patch at a time, with a per-patch result. On "
        "failure the patch, files and hunks are named and the work tree is left in "
        "`git am` state: resolve there and --continue (the rest of the series is "
        "applied after it); until then `vstack export` refuses, since the work branch "
        "lacks the end of the series. patches/ is never modified. Refuses to reset a "
        "work branch that holds unexported commits unless --force (then a backup ref "
        "is kept).",
    )  # fmt: skip
    s.add_argument(
        "--force",
        action="store_true",
        help="discard unexported work-branch commits (kept as a backup ref)",
    )
    s.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="after a stop: commit the resolved patch and apply the rest of the series",
    )
    s.set_defaults(func=run_apply)

    s = sub.add_parser(
        "export", help="write the work branch back into patches/ and patches/series",
        description="Deterministic git format-patch (zeroed commit ids, full index, no "
        "signature, no stat, subject kept, renames as a delete and an add whatever "
        "the user's diff.renames: a rename patch imported from elsewhere is "
        "rewritten so once, with the same content). Without a work branch, exports "
        "the series "
        "applied afresh (a round trip). Refuses while a rebase, a git am or an apply "
        "is unfinished, when the work branch is not built on the pinned base, when a "
        "commit cannot become a patch that applies and builds as committed (empty, "
        "binary, a symlink, not UTF-8), and when patches/ changed since the last "
        "apply/export (a pull: `vstack apply` picks it up; --force overwrites it). "
        "Writes patches/series and the patches it lists in one journaled change; "
        "*.patch files not listed there are named, never removed. The previous "
        "patches/ is saved under .vstack/backup/ before anything changes.",
    )  # fmt: skip
    s.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 and list the files if exporting would change patches/",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="write the work branch over patches/ even though patches/ changed since "
        "the last apply/export (the previous patches/ is saved under .vstack/backup/)",
    )
    s.set_defaults(func=run_export)

    s = sub.add_parser(
        "build", help="build the patched wheel and the image's context into dist/",
        description="The pinned upstream wheel with the series' changed files replaced "
        "and new ones added: unchanged members copied raw, RECORD regenerated, version "
        "<version>+<label>.g<series hash> (or .empty) in METADATA, the dist-info name "
        "and vllm/_version.py. Also writes dist/build.json and dist/image/: a docker "
        "build context (Dockerfile, the changed files, vstack-layer.py) whose one "
        "layer on the pinned image holds only what the series changes (docs/image.md). "
        "Two builds of the same inputs are byte-identical.",
    )  # fmt: skip
    s.add_argument(
        "--out",
        help="output folder (default: dist/); one of its own: a new or empty folder, "
        "or one an earlier `vstack build --out` made (earlier wheels there are "
        "replaced); any other non-empty folder is refused",
    )
    s.set_defaults(func=run_build)

    s = sub.add_parser(
        "test-files",
        help="write the files the series adds outside the wheel (its tests) into a folder",
        description="The series applied on the pinned base (cached) holds files that "
        "are not part of the vllm package, chiefly tests under vLLM's tests/ tree. "
        "They are written under --out with their repository paths (OUT/tests/...) and "
        "listed one a line; scripts/test runs pytest on them against the built wheel. "
        "patches/ and the work branch are not touched.",
    )  # fmt: skip
    s.add_argument("--out", required=True, help="folder to write them into (created)")
    s.set_defaults(func=run_test_files)

    s = sub.add_parser(
        "lint", help="check the series: entries, descriptions, trailers, SPDX, whitespace, sign-off",
        description="Every series entry exists and every patch file is listed; every patch "
        "says why it exists and has Upstream-Status: (and Upstream-PR: once submitted); "
        "new Python files carry vLLM's SPDX header lines; no trailing whitespace or new "
        "direct torch.cuda calls in added lines; Triton imported only through "
        "vllm.triton_utils and regex instead of re (vLLM's import hooks, restated); a "
        "Signed-off-by, if any, is a person's (no bot or placeholder); Depends-On: names "
        "an earlier patch. With a vLLM checkout (the populated vllm/ "
        "submodule, or --git PATH) whose pinned commit has .pre-commit-config.yaml, and "
        "pre-commit installed, vLLM's own hooks also run on each patch's files (the "
        "patch staged on its parent; SKIP=hook,... skips some).",
    )  # fmt: skip
    s.add_argument(
        "--git",
        help="a vLLM checkout at the pinned commit whose pre-commit hooks to run",
    )
    s.add_argument(
        "mbox", nargs="*",
        help="check only these mboxes, as mails to send: each signed off by a person, "
        "its author among them; the stack's shared identity or a placeholder as the "
        "author of a signed mail is refused (without: the series, resolutions/ and "
        "every signed mbox under .vstack/outgoing/)",
    )  # fmt: skip
    s.set_defaults(func=run_lint)

    s = sub.add_parser(
        "rebase", help="move the series onto a new vLLM base, with a per-patch report",
        description="The target is a vLLM version from the package index (0.34.0), a "
        "local wheel file, `nightly` or a commit id of vLLM's main branch (the wheel "
        "from vLLM's per-commit wheel repository: --wheel-index, else "
        "VSTACK_WHEEL_INDEX, else [base] wheel_index in stack.toml, else "
        "https://wheels.vllm.ai; downloaded into the wheel cache, sha256 recorded; "
        "the pin then records the full commit), or a revision of a git checkout (--git "
        "PATH; the vllm/ submodule by default). Each patch is first checked against upstream (it "
        "reverse-applies on the new base, or its Upstream-PR number is in an upstream "
        "commit subject): such patches are dropped-upstream. The rest are applied with "
        "git am -3 and classified clean / offset / 3way / conflict; a patch with a "
        "recorded resolution for the target (resolutions/<version>/<patch>, else the "
        "newest recorded release between the old and the new base) is ported "
        "from it, or superseded when the record has no diff. On success patches/ "
        "is re-exported, stack.toml re-pinned and the vllm/ gitlink moved (when "
        "the full commit can be resolved); on conflict, resolve in .vstack/repo "
        "and --continue, or --abort to restore everything. Report: "
        ".vstack/reports/rebase.{md,json}.",
    )  # fmt: skip
    s.add_argument(
        "--onto",
        help="version, wheel file, `nightly`, a commit id (per-commit wheels), "
        "or a git revision (with --git)",
    )
    s.add_argument(
        "--git",
        nargs="?",
        const="",
        help="the checkout --onto names a revision of (default vllm/)",
    )
    s.add_argument(
        "--wheel", help="with --git: the wheel (file or version) to pin for builds"
    )
    s.add_argument(
        "--wheel-index",
        metavar="URL",
        help="per-commit wheel repository for `nightly` / commit targets "
        "(overrides VSTACK_WHEEL_INDEX and stack.toml)",
    )
    s.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="resume after resolving a conflict",
    )
    s.add_argument(
        "--abort",
        action="store_true",
        help="give up and restore the state before the rebase",
    )
    s.add_argument(
        "--skip",
        action="store_true",
        help="drop the conflicting patch: the new base supersedes it (needs --reason; "
        "recorded under resolutions/<version>/ when the rebase completes)",
    )
    s.add_argument("--reason", help="with --skip: what in the new base supersedes it")
    s.set_defaults(func=run_rebase)

    s = sub.add_parser(
        "check", help="per series prefix: applies, compiles, imports, tests added so far pass",
        description="For each prefix of the series (like git rebase --exec): it applies; "
        "the Python files it touches compile; the vllm modules it touches import in the "
        "test environment (scripts/test's, or --python / VSTACK_TEST_PYTHON); the tests "
        "added so far pass. The first failing prefix is named.",
    )  # fmt: skip
    s.add_argument("--per-patch", action="store_true", required=True)
    s.add_argument("--python", help="interpreter of the test environment")
    s.set_defaults(func=run_check)

    s = sub.add_parser(
        "upstream", help="a vLLM PR draft per patch in upstream/ (offline, never pushes)",
        description="One PR per patch: its commit on the upstream base (the pinned "
        "commit, or --base REV of a vLLM checkout: --git PATH or the populated vllm/), "
        "after the PRs it depends on (its Depends-On: trailers, else inferred), whose "
        "commits the draft names instead of carrying; stack-only trailers removed. "
        "Checks as vLLM's CI runs them (ruff check / format with vLLM's config, SPDX, "
        "torch.cuda, Triton and regex imports, config docs, vLLM's own pre-commit hooks "
        "given a checkout, DCO) and the PR's own tests on its base (scripts/test's "
        "environment or --python; a [Bugfix] PR's tests must fail without the fix). "
        "A run with its tests and no sign-off records the draft in "
        "upstream/<patch>/{title.txt,body.md,checks.txt,meta.json} (the range-diff from "
        "the previous revision too; no mbox: every revision records the patch files it "
        "was made from, and --revision N regenerates it); a title, body or checks file "
        "you edited is kept. --signoff (or VSTACK_SIGNOFF) and --no-tests never change "
        "upstream/: they write .vstack/outgoing/<patch>/ (the signed v<N>.mbox, "
        "title, body, checks). Signing: an author that is the stack's shared identity "
        "or a placeholder becomes the signer (said in one line); a person's "
        "authorship is kept and the signer's sign-off added; bots and placeholders "
        "cannot sign. With a vLLM checkout the draft's branch vstack/<patch>-v<N> is "
        "written there, but a branch vstack did not leave as it is (your commits) is "
        "never moved: the draft takes the next free name. --base nightly (or a commit "
        "id, without a checkout) re-cuts each draft on that per-commit wheel and says "
        "per PR whether it applies and whether its tests pass (copies under "
        ".vstack/outgoing/<patch>/on-<commit>/). --all: every patch, the RFC issue "
        "drafts of the documents stack.toml's [upstream] rfcs and RFC: trailers name, "
        "and upstream/index.md. Exit 1 if a check fails.",
    )  # fmt: skip
    s.add_argument(
        "patch", nargs="?", help="a patches/series entry (or a unique part of its name)"
    )
    s.add_argument("--all", action="store_true",
                   help="every patch of the series, the RFC drafts and upstream/index.md")  # fmt: skip
    s.add_argument("--signoff", nargs="?", const="", metavar="'NAME <EMAIL>'",
                   help="sign off as this person (bare: VSTACK_SIGNOFF, else git's "
                   "user.name/user.email) and write the copy to send to .vstack/outgoing/")  # fmt: skip
    s.add_argument("--revision", type=int, metavar="N",
                   help="regenerate revision N of the patch's draft (.vstack/outgoing/)")  # fmt: skip
    s.add_argument("--no-tests", action="store_true",
                   help="do not run the PR's tests (writes only under .vstack/outgoing/)")  # fmt: skip
    s.add_argument("--check", action="store_true",
                   help="run nothing, write nothing: exit 1, one line per stale record, "
                   "when a draft's meta.json (the patch files and pin its revision was "
                   "made from), an RFC draft or upstream/index.md does not match "
                   "patches/ and stack.toml, or a draft's patch left the series (CI runs it)")  # fmt: skip
    s.add_argument(
        "--python", help="the test environment's interpreter (scripts/test's)"
    )
    s.add_argument("--git", help="a vLLM git checkout (default: vllm/ when populated)")
    s.add_argument(
        "--base", help="upstream revision of the checkout to branch from (default: the "
        "pinned commit); `nightly` or a commit id of vLLM's main branch: its per-commit "
        "wheel, no checkout needed (the newest nightly in the wheel cache when the "
        "index cannot be reached)",
    )  # fmt: skip
    s.add_argument(
        "--wheel-index",
        help="per-commit wheel repository for --base nightly / a commit id (default: "
        "VSTACK_WHEEL_INDEX, else stack.toml's wheel_index)",
    )
    s.set_defaults(func=run_upstream)

    s = sub.add_parser(
        "gpu-check", help="the patched vLLM's checks on one NVIDIA GPU, or a bundle of them",
        description="Builds the patched wheel and a bundle that runs on a GPU machine "
        "with its own Python, torch and Triton, no vLLM and no network: the patched "
        "vllm/ sources (zipped), the pure-Python packages the imports need, the "
        "runner. Without --bundle, runs the checks here (each in a subprocess, 8 "
        "minutes at most) and writes benchmarks/results/gpu-check-<gpu>.json; on a "
        "machine without a GPU every check is skipped with the reason.",
    )  # fmt: skip
    s.add_argument("--list", action="store_true", help="print the checks, run nothing")
    s.add_argument("--bundle", metavar="OUT", help="write the bundle to OUT and stop")
    s.add_argument(
        "--python", default="python3", help="interpreter with torch (python3)"
    )
    s.add_argument("--only", nargs="+", help="run these checks only")
    s.add_argument("--out", help="results file (default benchmarks/results/...)")
    s.set_defaults(func=run_gpu_check)

    s = sub.add_parser(
        "bench", help="benchmarks of the tool itself",
        description="build: times a plain copy of the pinned wheel, `vstack build` "
        "(best of --repeat) and a naive unzip + rezip, prints the ratios (targets: "
        "build <= 3x copy, naive >= 10x build) and writes "
        "benchmarks/results/bench_build.json. rebase: rebases a throwaway copy of the "
        "stack (stack.toml, patches/, resolutions/) onto --onto in a fresh .vstack, "
        "prints the time of each step (download, base extraction, apply, export; "
        "target <= 60 s end to end) and writes benchmarks/results/bench_rebase.json. "
        "Exit 2 when a target is missed.",
    )  # fmt: skip
    s.add_argument("what", choices=["build", "rebase"], help="what to time")
    s.add_argument("--repeat", type=int, default=3, help="build: best of N runs")
    s.add_argument("--onto", default="0.34.0", help="rebase: the target release")
    s.set_defaults(func=run_bench)
    return p


# Verbs that write to .vstack/ (the stack repository, dist/) or to the project: one
# at a time per project, each after finishing what an interrupted one left.
LOCKED_VERBS = (
    "base", "apply", "export", "build", "test-files", "rebase", "check", "upstream",
    "bench", "lint", "gpu-check",
)  # fmt: skip


def _locked(args) -> bool:
    if args.verb == "gpu-check" and args.list:
        return False  # names the checks; needs no project
    if args.verb == "upstream" and args.check:
        return False  # reads upstream/ and patches/ only
    return args.verb in LOCKED_VERBS or (args.verb == "pin" and args.submodule)


def _run(args) -> int:
    if not _locked(args):
        return args.func(args)
    with locked(_project(args), args.verb):
        return args.func(args)


@contextlib.contextmanager
def locked(project, verb: str):
    """The project lock, and the recovery every command that writes runs first."""
    from vstack import journal, locks

    with locks.project_lock(project.root, verb):
        locks.recover(project.cache, project.repo)
        journal.recover(
            project.root,
            project.cache,
            lambda s: print(f"vstack: {s}", file=sys.stderr),
        )
        yield


def _os_error(e: OSError) -> str:
    """One line for a failure of the environment (disk, permissions, network)."""
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f)
    what = e.strerror or str(e) or type(e).__name__
    cannot = (
        " (vstack cannot write there: give it a folder it can, e.g. "
        "VSTACK_WHEEL_CACHE for the wheel cache, --out for a build)"
    )
    hint = {
        errno.ENOSPC: " (the disk is full: free some space and rerun; what was "
        "interrupted is finished or undone by the next vstack command)",
        errno.EDQUOT: " (disk quota exceeded)",
        errno.EFBIG: " (the file size limit stops the write: raise it, ulimit -f, "
        "and rerun; what was interrupted is finished or undone by the next vstack "
        "command)",
        errno.EROFS: cannot,
        errno.EACCES: cannot,
        errno.EPERM: cannot,
    }.get(e.errno, "")
    return f"{where}: {what}{hint}" if where else f"{what}{hint}"


def _resume_hint(args, argv: list[str]) -> str:
    """The command that finishes what an interrupted command was doing (the state
    it leaves is recovered by it, as by every later vstack command)."""
    import shlex

    words = list(argv)
    if "--root" in words:  # run from the project, as the user does
        i = words.index("--root")
        del words[i : i + 2]
    again = "vstack " + shlex.join(words)
    try:
        project = _project(args)
    except Exception:  # noqa: BLE001 (no project: rerunning is all there is)
        return f"; `{again}` again finishes it"
    cache = project.cache
    if args.verb == "rebase" and not getattr(args, "abort", False):
        state = cache / "rebase" / "state.json"
        if state.is_file() and not (
            getattr(args, "skip", False) and _skip_pending(state)
        ):
            return (
                "; `vstack rebase --continue` goes on from where it was (or `vstack "
                "rebase --abort` puts everything back)"
            )
    if args.verb == "apply":
        journal = cache / "apply.json"
        try:
            j = json.loads(journal.read_text()) if journal.is_file() else {}
        except ValueError:
            j = {}
        if isinstance(j, dict) and (
            j.get("resume") or (j.get("state") == "stopped" and args.cont)
        ):
            return "; `vstack apply --continue` finishes it"
    return f"; `{again}` finishes it"


def _skip_pending(state_file) -> bool:
    """Whether a rebase --skip has not recorded its skip yet (the stop is still a
    conflict): rerunning --skip finishes it, --continue would not."""
    try:
        d = json.loads(state_file.read_text())
        last = d["results"][-1]
        return last["status"] == "conflict" and len(d["results"]) == d["next"] + 1
    except (ValueError, KeyError, IndexError, TypeError):
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        rc = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit as a traceback
        return rc
    except VstackError as e:
        print(f"vstack: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        try:
            hint = _resume_hint(args, argv)
        except BaseException:  # noqa: BLE001 (a second Ctrl-C, an unreadable state)
            hint = ""
        print(f"vstack: interrupted{hint}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (vstack pin | head -1): stop quietly, as git does;
        # output still buffered must not raise again at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        print(f"vstack: error: {_os_error(e)}", file=sys.stderr)
        return 1
