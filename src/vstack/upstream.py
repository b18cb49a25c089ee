"""vstack upstream <patch>: a vLLM PR from one patch of the series (offline).

Makes the commits (the patch plus the earlier patches it needs, stack-only trailers
stripped) on the chosen upstream base, runs the checks vLLM's CI runs on the changed
files, and writes the PR title and body (vLLM's template, numbers only from recorded
results files) under upstream/<patch>/. Never pushes: it prints the commands.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vstack import gitutil
from vstack.apply import apply_patches
from vstack.base import (
    base_from_git,
    ensure_base,
    pinned_base_anywhere,
    submodule_head,
)
from vstack.config import Project
from vstack.errors import VstackError
from vstack.export import applied_tip
from vstack.lint import (
    SPDX_LINES,
    _added_lines,
    author_signed_off,
    forbidden_import,
    new_torch_cuda_call,
)
from vstack.series import parse_patch, series_paths

STACK_ONLY_TRAILERS = ("Upstream-Status", "Upstream-PR", "Stack-Results")
TITLE_TAGS = re.compile(r"^(\[[^\]\s][^\]]*\])+ \S")
RFC_LINES = 500
RFC_EXEMPT = ("tests/", "csrc/", "vllm/config/", "benchmarks/")


@dataclasses.dataclass
class Check:
    name: str
    where: str
    message: str

    def __str__(self):
        return f"{self.where}: [{self.name}] {self.message}"


# ---------------------------------------------------------------- pure helpers


def strip_stack_trailers(message: str) -> str:
    lines = message.rstrip("\n").split("\n")
    kept = [
        ln
        for ln in lines
        if not ln.startswith(tuple(t + ":" for t in STACK_ONLY_TRAILERS))
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).rstrip("\n") + "\n"


def imported_paths(patch_text: str) -> set[str]:
    """Files (as paths) that the patch's added lines import from."""
    found = set()
    for _, _, _, line in _added_lines(patch_text):
        m = re.match(r"\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", line)
        if m:
            mod = (m.group(1) or m.group(2)).replace(".", "/")
            found |= {mod + ".py", mod + "/__init__.py"}
    return found


def dependencies(
    infos: list, index: int, applies_alone: bool, imports=frozenset()
) -> list[int]:
    """Earlier patches the target needs: those adding a module it imports, and,
    when it does not apply alone on the base, those touching its files;
    transitively over the files of what is pulled in."""
    need = {
        j for j in range(index) if set(imports) & set(getattr(infos[j], "added", []))
    }
    files = set().union(*(set(infos[j].files) for j in need)) if need else set()
    if not applies_alone:
        files |= set(infos[index].files)
    changed = True
    while changed:
        changed = False
        for j in range(index):
            if j not in need and files & set(infos[j].files):
                need.add(j)
                files |= set(infos[j].files)
                changed = True
    return sorted(need)


def prune_dependencies(project, base: str, patches, dep_idx, index, infos) -> list[int]:
    """Drop candidates the chain does not need: file overlap is transitive and
    conservative, so try the chain without each candidate (earliest first) and keep
    the removal when the rest still applies and no kept patch imports a module the
    removed one adds. Latest first, since later patches build on earlier ones."""
    keep = list(dep_idx)
    for j in reversed(dep_idx):
        trial = [k for k in keep if k != j]
        chain = trial + [index]
        needed_by_import = any(
            set(infos[j].added) & imported_paths(patches[k].read_text(errors="replace"))
            for k in chain
        )
        if needed_by_import:
            continue
        with gitutil.temp_worktree(project.repo, base, project.cache) as tree:
            results = apply_patches(
                tree, [patches[k] for k in chain], log=lambda s: None
            )
        if all(r.ok for r in results) and len(results) == len(chain):
            keep = trial
    return keep


def loc_outside_exempt(diff_text: str) -> int:
    n, exempt = 0, False
    for line in diff_text.splitlines():
        if line.startswith("diff --git "):
            exempt = (
                line.split(" b/", 1)[-1].startswith(RFC_EXEMPT)
                or "/kernels/" in line
                or "_kernel" in line
            )
        elif (
            line.startswith(("+", "-"))
            and not line.startswith(("+++", "---"))
            and not exempt
        ):
            n += 1
    return n


def undocumented_config_fields(path: str, source: str, added: set[int]) -> list[Check]:
    """New class-level fields in vllm/config/ need a default and a docstring."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        body = cls.body
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.AnnAssign) or stmt.lineno not in added:
                continue
            name = getattr(stmt.target, "id", "?")
            if stmt.value is None:
                found.append(
                    Check(
                        "config",
                        f"{path}:{stmt.lineno}",
                        f"{cls.name}.{name} has no default",
                    )
                )
            nxt = body[i + 1] if i + 1 < len(body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):  # fmt: skip
                found.append(
                    Check(
                        "config",
                        f"{path}:{stmt.lineno}",
                        f"{cls.name}.{name} has no docstring",
                    )
                )
    return found


def flatten_numbers(obj, prefix="") -> list[tuple[str, object]]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("command", "machine", "when", "note", "notes"):
                continue
            out += flatten_numbers(v, f"{prefix}{k}.")
    elif (
        isinstance(obj, list)
        and all(isinstance(x, dict) for x in obj)
        and len(obj) <= 12
    ):
        for i, v in enumerate(obj):
            label = next(
                (
                    str(v[k])
                    for k in ("name", "label", "mode", "rule", "case")
                    if k in v
                ),
                str(i),
            )
            out += flatten_numbers(v, f"{prefix}{label}.")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append((prefix.rstrip("."), obj))
    return out


def _command(data: dict) -> str:
    """The recorded command, with the machine-specific interpreter path shortened."""
    cmd = data.get("command", "(command not recorded)")
    return re.sub(r"^\S*/python[\d.]*(?=\s|$)", "python", cmd)


def _machine(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items() if v not in ("", None))
    return str(value)


def render_results(path: Path, data: dict) -> str:
    """One results file as Markdown: where it came from, then its numbers (the
    file's own "summary" when it has one, else every numeric leaf)."""
    cmd = _command(data)
    machine = _machine(data.get("machine", "(machine not recorded)"))
    when = data.get("when") or data.get("timestamp") or ""
    lines = [
        f"**{path.name}**: `{cmd}` on {machine}{f', {when}' if when else ''}",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    rows = (
        list(data["summary"].items())
        if isinstance(data.get("summary"), dict)
        else flatten_numbers(data)[:40]
    )
    for k, v in rows:
        lines.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    gpu_keys = [k for k in data if "gpu" in k.lower()]
    if "not measured on gpu" in json.dumps(data).lower() or not gpu_keys:
        lines += ["", "Not measured on GPU."]
    return "\n".join(lines)


def split_description(body: str) -> tuple[str, str]:
    """(purpose, testing notes): the commit body up to its first paragraph about
    tests, and the rest."""
    paras = body.strip().split("\n\n")
    for i, p in enumerate(paras):
        if i and re.match(
            r"(Tests?|Testing|How (it was )?tested|Test plan)\b", p.strip(), re.I
        ):
            return "\n\n".join(paras[:i]), "\n\n".join(paras[i:])
    return body.strip(), ""


def render_body(
    info, deps: list[str], tests: list[str], results: list[tuple[Path, dict]], loc: int
) -> str:
    purpose, testing = split_description(info.body)
    parts = ["## Purpose", "", purpose or "(the patch has no description)", ""]
    if deps:
        parts += [
            "This PR includes, as separate commits, the earlier stack changes it builds on:",
            "",
        ]
        parts += [f"- {d}" for d in deps] + [""]
    parts += ["## Test Plan", "", "```bash"]
    if tests:
        parts.append(f"VLLM_TARGET_DEVICE=cpu pytest -q {' '.join(tests)}")
    else:
        parts.append("# (this change adds no tests)")
    for _, data in results:
        if data.get("command"):
            parts.append(_command(data))
    parts += ["```", ""]
    if testing:
        parts += ["From the commit message:", "", testing, ""]
    parts += ["## Test Result", ""]
    if results:
        for path, data in results:
            parts += [render_results(path, data), ""]
    else:
        parts += [
            "No recorded benchmark results for this change. Not measured on GPU.",
            "",
        ]
    parts += [f"Lines changed outside tests/kernels/config: {loc}."]
    if loc > RFC_LINES:
        parts += ["", f"> **RFC first**: this is over ~{RFC_LINES} lines outside kernels/tests/config; "
                      "vLLM asks for an RFC issue before a PR of this size."]  # fmt: skip
    parts += [
        "", "<details><summary>Essential Elements of an Effective PR Description Checklist</summary>", "",
        "- [x] The purpose of the PR, such as \"Fix some issue (link existing issues this PR will resolve)\".",
        "- [x] The test plan, such as providing test command.",
        "- [x] The test results, such as pasting the results comparison before and after, or e2e results.",
        "", "</details>", "",
    ]  # fmt: skip
    return "\n".join(parts)


# ---------------------------------------------------------------- git steps


def _rewrite_messages(repo: Path, base: str, tip: str) -> str:
    """Re-create base..tip with stack-only trailers removed (trees and authors kept)."""
    parent = base
    for sha in gitutil.out(
        repo, "rev-list", "--reverse", f"{base}..{tip}"
    ).splitlines():
        fmt = gitutil.out(
            repo,
            "log",
            "-1",
            "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd",
            "--date=raw",
            sha,
        )
        an, ae, ad, cn, ce, cd = fmt.split("\0")
        msg = gitutil.git(repo, "log", "-1", "--format=%B", sha).stdout
        tree = gitutil.out(repo, "rev-parse", f"{sha}^{{tree}}")
        env = {"GIT_AUTHOR_NAME": an, "GIT_AUTHOR_EMAIL": ae, "GIT_AUTHOR_DATE": ad,
               "GIT_COMMITTER_NAME": cn, "GIT_COMMITTER_EMAIL": ce, "GIT_COMMITTER_DATE": cd}  # fmt: skip
        parent = gitutil.out(repo, "commit-tree", tree, "-p", parent, "-F", "-",
                             input=strip_stack_trailers(msg), env=env)  # fmt: skip
    return parent


def build_commits(project: Project, base: str, patches: list[Path]) -> str:
    repo = project.repo
    with gitutil.temp_worktree(repo, base, project.cache) as tmp:
        results = apply_patches(tmp, patches, log=lambda s: print(s, file=sys.stderr))
        if results and not results[-1].ok:
            raise VstackError(f"{results[-1].patch} does not apply on the upstream base {base[:12]}: "
                              f"{'; '.join(results[-1].details[:2])}")  # fmt: skip
        tip = gitutil.out(tmp, "rev-parse", "HEAD")
    return _rewrite_messages(repo, base, tip)


def find_ruff(project: Project) -> str | None:
    env = os.environ.get("VSTACK_RUFF")
    if env:
        return env
    for cand in (Path(sys.executable).parent / "ruff", shutil.which("ruff")):
        if cand and Path(cand).exists():
            return str(cand)
    from vstack.check import test_env_python

    py = test_env_python(project)
    if py and (py.parent / "ruff").exists():
        return str(py.parent / "ruff")
    return None


def run_checks(project: Project, base: str, tip: str, patch_texts: list[tuple[str, str]],
               ruff_config: Path) -> list[Check]:  # fmt: skip
    repo = project.repo
    found: list[Check] = []
    added_lines: dict[str, set[int]] = {}
    changes = gitutil.tree_changes(repo, base, tip)
    py_files = [p for s, p, _ in changes if s != "D" and p.endswith(".py")]
    blobs = gitutil.read_blobs(repo, tip, py_files)
    # DCO, SPDX, torch.cuda, config docs: from the patch texts
    for name, text in patch_texts:
        info = parse_patch(text)
        signed, author = author_signed_off(text, info.trailers.get("Signed-off-by", []))
        if not signed:
            found.append(
                Check(
                    "dco",
                    f"{name}:1",
                    f"commit '{info.subject}' lacks Signed-off-by: {author or '?'}",
                )
            )
        added: dict[str, set[int]] = {}
        for _, file, new_no, line in _added_lines(text):
            added.setdefault(file, set()).add(new_no)
            added_lines.setdefault(file, set()).add(new_no)
            if new_torch_cuda_call(file, line):
                found.append(
                    Check(
                        "torch-cuda",
                        f"{file}:{new_no}",
                        "new direct torch.cuda call (use torch.accelerator / current_platform)",
                    )
                )
            advice = forbidden_import(file, line)
            if advice:
                found.append(
                    Check("import", f"{file}:{new_no}", f"`{line.strip()}`: {advice}")
                )
        for file in info.added:
            if file.endswith(".py") and file in blobs and blobs[file].strip():
                head = blobs[file].decode(errors="replace").splitlines()[:5]
                if not all(s in head for s in SPDX_LINES):
                    found.append(
                        Check("spdx", f"{file}:1", "missing vLLM's SPDX header lines")
                    )
        for file, lines in added.items():
            if file.startswith("vllm/config/") and file in blobs:
                found += undocumented_config_fields(
                    file, blobs[file].decode(errors="replace"), lines
                )
    # ruff with vLLM's configuration, on the changed files
    ruff = find_ruff(project)
    if ruff is None:
        found.append(
            Check(
                "ruff",
                "-",
                "ruff not found (pip install ruff==0.14.0, or set VSTACK_RUFF)",
            )
        )
        return found
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # ruff reads pyproject.toml ([tool.ruff]) or ruff.toml (top-level keys)
        shutil.copy(
            ruff_config,
            tmp
            / (
                "pyproject.toml"
                if ruff_config.name == "pyproject.toml"
                else "ruff.toml"
            ),
        )
        for path, data in blobs.items():
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp / path).write_bytes(data)
        if not blobs:
            return found
        p = subprocess.run([ruff, "check", "--no-cache", "--output-format=concise", *blobs],
                           cwd=tmp, capture_output=True, text=True)  # fmt: skip
        # Only what the change adds is the PR's to fix: upstream's own lines pass
        # upstream's configuration (ours only restates it when no checkout exists).
        for line in p.stdout.splitlines():
            m = re.match(r"^(.+?):(\d+):\d+: (.+)$", line)
            if m and int(m.group(2)) in added_lines.get(m.group(1), ()):
                found.append(Check("ruff", f"{m.group(1)}:{m.group(2)}", m.group(3)))
        p = subprocess.run(
            [ruff, "format", "--no-cache", "--diff", *blobs],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        current = None
        for line in p.stdout.splitlines():
            if line.startswith("--- "):
                current = line[4:].strip()
            m = re.match(r"^@@ -(\d+)(?:,(\d+))?", line)
            if m and current:
                start, n = int(m.group(1)), int(m.group(2) or 1)
                if set(range(start, start + max(n, 1))) & added_lines.get(
                    current, set()
                ):
                    found.append(
                        Check(
                            "ruff-format",
                            f"{current}:{start}",
                            "not formatted as `ruff format` would",
                        )
                    )
    return found


# ---------------------------------------------------------------- the verb


def cmd_upstream(
    project: Project, patch_name: str, git_path: str | None, base_rev: str | None
) -> int:
    patches = series_paths(project.patches_dir)
    names = [p.name for p in patches]
    if patch_name not in names:
        stem_hits = [n for n in names if patch_name in n]
        if len(stem_hits) != 1:
            raise VstackError(
                f"{patch_name} is not in patches/series ({', '.join(names) or 'empty'})"
            )
        patch_name = stem_hits[0]
    index = names.index(patch_name)
    infos = [parse_patch(p.read_text(errors="replace")) for p in patches]
    slug = patch_name[: -len(".patch")]
    # the upstream base: a checkout's revision, or the pinned base
    checkout = (
        Path(git_path).resolve()
        if git_path
        else (project.submodule if submodule_head(project) else None)
    )
    if checkout is not None:
        if not gitutil.is_repo(checkout):
            raise VstackError(f"{checkout} is not a git checkout")
        rev = base_rev or project.pin.short_hash
        if gitutil.git(
            checkout,
            "rev-parse",
            "--verify",
            "--quiet",
            f"{rev}^{{commit}}",
            check=False,
        ).returncode:
            raise VstackError(f"{rev} is not a commit of {checkout} (give --base)")
        base = base_from_git(project, checkout, rev, project.pin.version)
        pyproject = checkout / "pyproject.toml"
        ruff_config = (
            pyproject
            if pyproject.is_file()
            else Path(__file__).with_name("vllm_ruff.toml")
        )
    else:
        base = ensure_base(project)
        ruff_config = Path(__file__).with_name("vllm_ruff.toml")
    repo = project.repo
    # Whether a patch stands alone, and which earlier ones it needs, is decided with
    # 3-way merges, which need every patch's preimage blobs: present only once the
    # series has been applied here. Applying it first (cached) makes the answer, and
    # so the PR revision, the same in a fresh clone as after `scripts/build`.
    applied_tip(project, pinned_base_anywhere(project), patches)
    with gitutil.temp_worktree(repo, base.commit, project.cache) as probe:
        # A patch that needs only a 3-way merge (context from an unrelated earlier
        # patch) still stands alone upstream.
        alone = apply_patches(probe, [patches[index]], log=lambda s: None)[-1].ok
    dep_idx = dependencies(
        infos, index, alone, imported_paths(patches[index].read_text(errors="replace"))
    )
    dep_idx = prune_dependencies(project, base.commit, patches, dep_idx, index, infos)
    chosen = [patches[j] for j in dep_idx] + [patches[index]]
    print(f"vstack upstream: {patch_name} on {base.commit[:12]} ({base.source})")
    for j in dep_idx:
        print(f"  depends on: {names[j]} ({infos[j].subject})")
    tip = build_commits(project, base.commit, chosen)
    texts = [(p.name, p.read_text(errors="replace")) for p in chosen]
    checks = run_checks(project, base.commit, tip, texts, ruff_config)
    if checkout is not None:
        from vstack.precommit import run_on_commit, why_not

        reason = why_not(project, repo, base.commit)
        if reason:
            print(f"  vLLM's own pre-commit hooks not run: {reason}")
        else:
            print("  running vLLM's own pre-commit hooks on the changed files ...")
            for failure in run_on_commit(project, repo, base.commit, tip):
                checks.append(Check("pre-commit", failure.hook, failure.summary()))
    info = infos[index]
    title = info.subject
    if not TITLE_TAGS.match(title):
        checks.insert(
            0,
            Check(
                "title",
                f"{patch_name}:1",
                f"title '{title}' lacks vLLM's bracketed tags ([EPLB][Perf] ...)",
            ),
        )
    # results files named by the patch's Stack-Results trailers
    results = []
    for rel in info.trailers.get("Stack-Results", []):
        path = project.root / rel.strip()
        if not path.is_file():
            checks.append(
                Check(
                    "results",
                    f"{patch_name}:1",
                    f"Stack-Results file {rel} does not exist",
                )
            )
            continue
        results.append((path, json.loads(path.read_text())))
    diff = gitutil.git(repo, "diff", "--no-renames", base.commit, tip).stdout
    loc = loc_outside_exempt(diff)
    tests = sorted(
        p
        for p in info.added
        if p.startswith("tests/")
        and p.endswith(".py")
        and Path(p).name.startswith("test_")
    )
    deps_text = [f"{infos[j].subject} (stack patch {names[j]})" for j in dep_idx]
    body = render_body(info, deps_text, tests, results, loc)
    # revisions: a new one whenever the content of the PR changes
    out = project.root / "upstream" / slug
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    meta = (
        json.loads(meta_path.read_text()) if meta_path.is_file() else {"revisions": []}
    )
    mbox = gitutil.git(repo, "format-patch", "--stdout", "--zero-commit", "--full-index", "--no-signature",
                       "--keep-subject", f"{base.commit}..{tip}", text=False).stdout  # fmt: skip
    digest = hashlib.sha256(mbox).hexdigest()
    revs = meta["revisions"]
    if revs and revs[-1]["digest"] == digest:
        rev_no, range_diff = revs[-1]["revision"], None
    else:
        rev_no = len(revs) + 1
        range_diff = (
            _range_diff(project, out, revs[-1], base.commit, tip) if revs else None
        )
        revs.append(
            {"revision": rev_no, "digest": digest, "base": base.commit, "tip": tip}
        )
        gitutil.git(repo, "update-ref", f"refs/vstack/upstream/{slug}/v{rev_no}", tip)
    (out / f"v{rev_no}.mbox").write_bytes(mbox)
    (out / "title.txt").write_text(title + "\n")
    (out / "body.md").write_text(body)
    (out / "checks.txt").write_text(
        "".join(f"{c}\n" for c in checks) or "all checks passed\n"
    )
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    branch = f"vstack/{slug}-v{rev_no}"
    if checkout is not None:
        gitutil.git(
            checkout,
            "fetch",
            "-q",
            "--no-tags",
            str(repo.resolve()),
            f"+{tip}:refs/heads/{branch}",
        )
        print(f"  branch {branch} in {checkout} ({len(chosen)} commit(s))")
    print(f"  revision {rev_no}; title: {title}")
    print(
        f"  wrote {out.relative_to(project.root)}/{{title.txt,body.md,v{rev_no}.mbox,checks.txt}}"
    )
    if range_diff is not None:
        print(f"  range-diff v{rev_no - 1} -> v{rev_no}:")
        print("".join(f"    {ln}\n" for ln in range_diff.splitlines()))
    for c in checks:
        print(f"  FAIL {c}")
    print("  next steps (not run):")
    if checkout is not None:
        print(f"    git -C {checkout} push <your-fork> {branch}:{slug}")
    else:
        print(f"    git -C <your vLLM clone> checkout -b {slug} {base.upstream_commit.lstrip('g')} && "
              f"git -C <your vLLM clone> am {out / f'v{rev_no}.mbox'}")  # fmt: skip
        print(f"    git -C <your vLLM clone> push <your-fork> {slug}")
    print(f"    gh pr create --repo vllm-project/vllm --base main --head <you>:{slug} "
          f"--title {json.dumps(title)} --body-file {out / 'body.md'}")  # fmt: skip
    return 1 if checks else 0


def _range_diff(project: Project, out: Path, prev: dict, base: str, tip: str) -> str:
    repo = project.repo
    old_tip = gitutil.rev_parse(repo, prev["tip"])
    if old_tip is None:  # a fresh clone: rebuild the previous revision from its mbox
        old_tip = build_commits(
            project, prev["base"], [out / f"v{prev['revision']}.mbox"]
        )
    text = gitutil.git(
        repo, "range-diff", "--no-color", f"{prev['base']}..{old_tip}", f"{base}..{tip}"
    ).stdout
    (out / f"range-diff-v{prev['revision']}-v{prev['revision'] + 1}.txt").write_text(
        text
    )
    return text
