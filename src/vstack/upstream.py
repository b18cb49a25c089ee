"""vstack upstream: one vLLM PR draft per patch of the series (offline, never pushes).

A draft is the patch as one commit on stock vLLM, or on stock vLLM plus the PRs it
depends on (its `Depends-On:` trailers; inferred from the series when it has none),
whose commits it names instead of carrying. Stack-only trailers are removed. The
checks vLLM's CI runs are run on it (ruff with vLLM's configuration, SPDX, imports,
config docs, DCO, vLLM's pre-commit hooks given a checkout, the PR's own tests on the
base it targets) and written to upstream/<patch>/checks.txt with the title, a short
body (purpose, design, test plan, key results from the patch's results files) and
the current revision's mbox. A changed draft becomes revision N+1 with a range-diff
against N; every revision records the patch files (git blobs) it was made from, so
`--revision N` regenerates it. The drafts in upstream/ are never signed off: the
person who sends one adds their sign-off with --signoff (or VSTACK_SIGNOFF), which
writes a sendable copy under .vstack/outgoing/. RFC documents (stack.toml [upstream]
rfcs, or a patch's `RFC:` trailer) become RFC issue drafts.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from vstack import drafts, fsutil, gitutil, identity, settings
from vstack.apply import apply_patches
from vstack.base import (
    Base,
    base_from_git,
    base_from_wheel,
    ensure_base,
    pinned_base_anywhere,
    submodule_head,
)
from vstack.config import Pin, Project
from vstack.errors import VstackError
from vstack.export import applied_tip
from vstack.identity import Identity
from vstack.lint import SPDX_LINES, _added_lines, forbidden_import, new_torch_cuda_call
from vstack.nightly import NIGHTLY, fetch_per_commit, is_per_commit_target
from vstack.series import parse_patch, series_paths

# Trailers a vLLM commit may carry; every other trailer of a stack patch
# (Upstream-Status, Upstream-PR, Stack-Results, Ported-From, Depends-On, RFC, ...)
# is the stack's own and never reaches a draft.
UPSTREAM_TRAILERS = (
    "Signed-off-by", "Co-authored-by", "Reviewed-by", "Acked-by", "Tested-by",
    "Reported-by", "Suggested-by", "Helped-by", "Fixes", "Closes", "Link", "Cc",
)  # fmt: skip
# The stack's own trailers: a last paragraph holding one of these or of the above
# is the trailer block (a body paragraph like "Why: ..." is not).
STACK_TRAILERS = (
    "Upstream-Status", "Upstream-PR", "Stack-Results", "Ported-From", "Depends-On",
    "RFC", "Resolves-Patch-Sha256",
)  # fmt: skip
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")
TITLE_TAGS = re.compile(r"^(\[[^\]\s][^\]]*\])+ \S")
RFC_LINES = 500
RFC_EXEMPT = ("tests/", "csrc/", "vllm/config/", "benchmarks/")
CPU_ENV = "TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu"
TEST_TIMEOUT_S = 1800  # VSTACK_UPSTREAM_TEST_TIMEOUT overrides it, read when used
OUTGOING = "outgoing"


@dataclasses.dataclass
class Check:
    name: str
    where: str
    message: str
    status: str = "FAIL"  # PASS, FAIL, SKIP, NOTE, UNSIGNED

    def __str__(self):
        return (
            f"{self.where}: [{self.name}] {self.message}"
            if self.where
            else f"[{self.name}] {self.message}"
        )


# ---------------------------------------------------------------- messages


def _split_trailers(message: str) -> tuple[str, list[str]]:
    """(the message before its trailer block, the trailer lines)."""
    text = message.rstrip("\n")
    head, sep, last = text.rpartition("\n\n")
    lines = last.split("\n")
    if (
        sep
        and all(_TRAILER.match(ln) for ln in lines)
        and any(
            _TRAILER.match(ln).group(1) in UPSTREAM_TRAILERS + STACK_TRAILERS
            for ln in lines
        )
    ):
        return head, lines
    return text, []


def strip_stack_trailers(message: str) -> str:
    """The message with only the trailers vLLM takes, and no sign-off of a bot or
    placeholder identity."""
    head, lines = _split_trailers(message)
    kept = []
    for ln in lines:
        key, value = _TRAILER.match(ln).groups()
        if key not in UPSTREAM_TRAILERS:
            continue
        if key == "Signed-off-by":
            ident = identity.parse(value)
            if ident is None or identity.refusal(ident):
                continue
        kept.append(ln)
    text = re.sub(r"\n{3,}", "\n\n", head).rstrip("\n")
    return text + ("\n\n" + "\n".join(kept) if kept else "") + "\n"


def with_signoff(message: str, ident: Identity) -> str:
    head, lines = _split_trailers(message)
    line = f"Signed-off-by: {ident}"
    if line not in lines:
        lines = [*lines, line]
    return head.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"


def signoffs(message: str) -> list[str]:
    _, lines = _split_trailers(message)
    return [ln.split(": ", 1)[1] for ln in lines if ln.startswith("Signed-off-by: ")]


def split_message(body: str) -> tuple[str, str, str]:
    """(purpose, design, testing) of a commit body: its first paragraph, the
    paragraphs up to the first about tests, and those (labels like "Why:" cut)."""
    paras = [p for p in body.strip().split("\n\n") if p.strip()]
    cut = next(
        (
            i
            for i, p in enumerate(paras)
            if i
            and re.match(
                r"(Tests?|Tested|Testing|How (it was )?tested|Test plan)\b", p, re.I
            )
        ),
        len(paras),
    )
    head, testing = paras[:cut], paras[cut:]

    def unlabel(p: str) -> str:
        return re.sub(r"^(Why|What|How|Design):\s*", "", p.strip())

    purpose = unlabel(head[0]) if head else ""
    design = "\n\n".join(unlabel(p) for p in head[1:])
    return purpose, design, "\n\n".join(testing)


# ---------------------------------------------------------------- pure helpers


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
    conservative, so try the chain without each candidate (latest first, since
    later patches build on earlier ones) and keep the removal when the rest still
    applies and no kept patch imports a module the removed one adds."""
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


def diff_files(diff_text: str):
    """(path, changed line) of each added or removed line of a diff."""
    path = None
    for line in diff_text.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
        elif line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            yield path, line


def loc_outside_exempt(diff_text: str) -> int:
    return sum(
        1
        for path, _ in diff_files(diff_text)
        if not (path.startswith(RFC_EXEMPT) or "/kernels/" in path or "_kernel" in path)
    )


def non_test_lines(diff_text: str) -> int:
    return sum(1 for path, _ in diff_files(diff_text) if not path.startswith("tests/"))


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
            where = f"{path}:{stmt.lineno}"
            if stmt.value is None:
                found.append(
                    Check("config", where, f"{cls.name}.{name} has no default")
                )
            nxt = body[i + 1] if i + 1 < len(body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):  # fmt: skip
                found.append(
                    Check("config", where, f"{cls.name}.{name} has no docstring")
                )
    return found


def _command(data: dict) -> str:
    """The recorded command, with the machine-specific interpreter path shortened."""
    cmd = data.get("command", "(command not recorded)")
    return re.sub(r"^\S*/python[\d.]*(?=\s|$)", "python", cmd)


def _machine(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items() if v not in ("", None))
    return str(value)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


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


def render_results(path: Path, data: dict) -> str:
    """One results file as a short table: its "summary" (else its numbers), keys
    "<variant>: <metric>" pivoted to a row per metric and a column per variant
    (stock first, as the results files list it), with where it was measured."""
    rows = (
        list(data["summary"].items())
        if isinstance(data.get("summary"), dict)
        else flatten_numbers(data)[:12]
    )
    when = data.get("when") or data.get("timestamp") or ""
    machine = _machine(data.get("machine", "machine not recorded"))
    lines = [
        f"`{path.name}` ({machine}{f', {when}' if when else ''}; `{_command(data)}`):",
        "",
    ]
    cols: list[str] = []
    metrics: dict[str, dict[str, object]] = {}
    loose = []
    for key, value in rows:
        variant, sep, metric = str(key).partition(": ")
        if sep:
            cols += [variant] if variant not in cols else []
            metrics.setdefault(metric, {})[variant] = value
        else:
            loose.append((key, value))
    if metrics:
        lines += ["| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for metric, by in metrics.items():
            lines.append(
                f"| {metric} | " + " | ".join(_fmt(by.get(c, "")) for c in cols) + " |"
            )
    if loose:
        if metrics:
            lines.append("")
        lines += [f"- {k}: {_fmt(v)}" for k, v in loose]
    return "\n".join(lines)


def measured_on_gpu(data: dict) -> bool:
    text = json.dumps(data.get("machine", "")).lower()
    return "gpu" in text and "not measured on gpu" not in text and "cpu" not in text


# ---------------------------------------------------------------- the series


def pick_patch(names: list[str], given: str) -> str:
    """The entry of `names` (patches/series) that `given` names: the entry itself,
    with or without .patch, or a part of exactly one entry's name."""
    for name in (given, given + ".patch"):
        if name in names:
            return name
    hits = [n for n in names if given in n]
    if len(hits) == 1:
        return hits[0]
    if hits:
        shown = ", ".join(n.removesuffix(".patch") for n in hits[:4])
        more = f", ... ({len(hits) - 4} more)" if len(hits) > 4 else ""
        raise VstackError(
            f"{given} is ambiguous: matches {len(hits)} patches ({shown}{more}): "
            f"give more of the name"
        )
    raise VstackError(
        f"{given} is not in patches/series ({', '.join(names) or 'empty'})"
    )


@dataclasses.dataclass
class Stack:
    """The series and the upstream base its drafts target."""

    project: Project
    patches: list[Path]
    names: list[str]
    infos: list
    base: Base
    checkout: Path | None
    ruff_config: Path
    # a base other than the pin (`--base nightly`, a commit's wheel): its drafts
    # are re-cuts, written under .vstack/outgoing/<patch>/on-<commit>/ only
    recut: str | None = None
    _deps: dict = dataclasses.field(default_factory=dict)

    def outgoing(self, slug: str) -> Path:
        """Where this run's copies of a draft go (never upstream/)."""
        folder = self.project.cache / OUTGOING / slug
        return folder / f"on-{self.recut}" if self.recut else folder

    def index(self, patch_name: str) -> int:
        return self.names.index(pick_patch(self.names, patch_name))

    def slug(self, i: int) -> str:
        return self.names[i][: -len(".patch")]

    def where(self, chain: list[int]) -> str:
        base = f"stock vLLM {self.base.version}"
        return base + (f" + {', '.join(self.slug(j) for j in chain)}" if chain else "")

    def deps(self, i: int) -> tuple[list[int], str]:
        """(the patches i names as its dependencies, how: "declared", "inferred"
        or "none"). Declared: its Depends-On: trailers. Inferred (no trailer, and it
        does not stand alone): the fewest earlier patches it applies on."""
        if i in self._deps:
            return self._deps[i]
        declared = self.infos[i].trailers.get("Depends-On", [])
        if declared:
            direct = []
            for dep in declared:
                want = dep.strip()
                want = want if want.endswith(".patch") else want + ".patch"
                if want not in self.names[:i]:
                    raise VstackError(
                        f"patches/{self.names[i]}: Depends-On: {dep} is not an earlier "
                        f"patch of patches/series"
                    )
                direct.append(self.names.index(want))
            result = (sorted(set(direct)), "declared")
        else:
            text = self.patches[i].read_text(errors="replace")
            imports = imported_paths(text)
            with gitutil.temp_worktree(
                self.project.repo, self.base.commit, self.project.cache
            ) as probe:
                alone = apply_patches(probe, [self.patches[i]], log=lambda s: None)[
                    -1
                ].ok
            cands = dependencies(self.infos, i, alone, imports)
            need = prune_dependencies(
                self.project, self.base.commit, self.patches, cands, i, self.infos
            )
            below = set().union(*(self.closure(j) for j in need)) if need else set()
            direct = [j for j in need if j not in below]
            result = (direct, "inferred" if direct else "none")
        self._deps[i] = result
        return result

    def closure(self, i: int) -> set[int]:
        direct, _ = self.deps(i)
        out = set(direct)
        for j in direct:
            out |= self.closure(j)
        return out


def load_stack(project: Project, git_path: str | None, base_rev: str | None,
               wheel_index: str | None = None) -> Stack:  # fmt: skip
    patches = series_paths(project.patches_dir)
    infos = [parse_patch(p.read_text(errors="replace")) for p in patches]
    checkout = (
        Path(git_path).resolve()
        if git_path
        else (project.submodule if submodule_head(project) else None)
    )
    ruff_config = Path(__file__).with_name("vllm_ruff.toml")
    recut = None
    if base_rev and (
        base_rev == NIGHTLY or (checkout is None and is_per_commit_target(base_rev))
    ):
        # a per-commit wheel of vLLM's main branch: no checkout needed
        base, _ = per_commit_base(project, base_rev, wheel_index)
        # named after the commit the wheel reports, whether fetched or cached
        recut, checkout = base.upstream_commit.removeprefix("g")[:12], None
    elif checkout is not None:
        if not gitutil.is_repo(checkout):
            raise VstackError(f"{checkout} is not a git checkout")
        rev = base_rev or project.pin.short_hash
        if gitutil.git(checkout, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}",
                       check=False).returncode:  # fmt: skip
            raise VstackError(f"{rev} is not a commit of {checkout} (give --base)")
        base = base_from_git(project, checkout, rev, project.pin.version)
        if (checkout / "pyproject.toml").is_file():
            ruff_config = checkout / "pyproject.toml"
    elif base_rev:
        raise VstackError(
            f"--base {base_rev}: without a vLLM checkout (--git PATH, or a populated "
            f"vllm/) the base is `nightly` or a commit id of vLLM's main branch (its "
            f"per-commit wheel)"
        )
    else:
        base = ensure_base(project)
    # Whether a patch stands alone, and which earlier ones it needs, is decided with
    # 3-way merges, which need every patch's preimage blobs: present only once the
    # series has been applied here. Applying it first (cached) makes the answer, and
    # so the PR revision, the same in a fresh clone as after `scripts/build`.
    applied_tip(project, pinned_base_anywhere(project), patches)
    names = [p.name for p in patches]
    return Stack(project, patches, names, infos, base, checkout, ruff_config, recut)


def per_commit_base(
    project: Project, target: str, flag: str | None
) -> tuple[Base, str]:
    """(base, upstream commit) of a per-commit wheel (`nightly`, a commit id); when the wheel
    index cannot be reached for `nightly`, the newest nightly already in the wheel
    cache, said so in one line (the newest base this machine can reach)."""
    try:
        got = fetch_per_commit(project, target, flag)
    except VstackError as e:
        if target != NIGHTLY:
            raise
        cached = newest_cached_nightly(project)
        if cached is None:
            raise VstackError(
                f"{e}; and the wheel cache ({project.wheel_cache}) holds no vLLM "
                f"nightly newer than the pinned {project.pin.version} to use instead"
            ) from None
        print(f"vstack upstream: {e}: using the newest nightly in the wheel cache, "
              f"{cached.name}", file=sys.stderr)  # fmt: skip
        from vstack.fetch import sha256_file

        base = base_from_wheel(project, cached, sha256_file(cached))
        return base, base.upstream_commit.removeprefix("g")
    return base_from_wheel(project, got.wheel, got.sha256), got.commit


def newest_cached_nightly(project: Project) -> Path | None:
    """The wheel cache's vLLM wheel of the newest development version (a nightly:
    `.devN+g<commit>`) newer than the pin, or None."""
    from vstack.nightly import WHEEL_NAME, version_key

    pinned = version_key(project.pin.version)
    best = None
    for wheel in sorted(project.wheel_cache.glob("vllm-*.whl")):
        m = WHEEL_NAME.match(wheel.name)
        key = version_key(m["version"]) if m else None
        if key is None or key[3] == float("inf") or "+g" not in m["version"]:
            continue
        if pinned is not None and key <= pinned:
            continue
        if best is None or key > best[0]:
            best = (key, wheel)
    return best[1] if best else None


# ---------------------------------------------------------------- git steps


def _rewrite(repo: Path, base: str, tip: str, signer: Identity | None,
             replaced: list | None = None) -> list[str]:  # fmt: skip
    """Re-create base..tip (trees and author dates kept) with stack-only trailers
    removed; with a signer, their sign-off added, and an author that names no
    person (the stack's shared identity, a placeholder) replaced by them: the DCO
    check wants the author's own sign-off. A person's authorship is kept; a bot or
    tool author other than the stack's own is an error, never replaced. Each
    replacement is appended to `replaced` as (old author, why, subject)."""
    parent, made = base, []
    for sha in gitutil.out(repo, "rev-list", "--reverse", f"{base}..{tip}").split():
        fmt = gitutil.out(repo, "log", "-1", "--date=raw",
                          "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd", sha)  # fmt: skip
        an, ae, ad, cn, ce, cd = fmt.split("\0")
        msg = strip_stack_trailers(
            gitutil.git(repo, "log", "-1", "--format=%B", sha).stdout
        )
        if signer is not None:
            author = identity.parse(f"{an} <{ae}>")
            why_replace = identity.author_to_replace(author)
            if why_replace:
                if replaced is not None:
                    replaced.append(
                        (f"{an} <{ae}>", why_replace, msg.split("\n", 1)[0])
                    )
                an, ae = signer.name, signer.email
            elif author is None or identity.refusal(author):
                subject = msg.split("\n", 1)[0]
                why = identity.refusal(author) if author else "not an identity"
                raise VstackError(
                    f"commit {sha[:12]} ('{subject}'): its author {an} <{ae}> cannot "
                    f"sign off ({why}) and vstack never replaces an author: set the "
                    f"patch's From: to the person who wrote it, then rerun"
                )
            cn, ce = signer.name, signer.email
            msg = with_signoff(msg, signer)
        tree = gitutil.out(repo, "rev-parse", f"{sha}^{{tree}}")
        env = {"GIT_AUTHOR_NAME": an, "GIT_AUTHOR_EMAIL": ae, "GIT_AUTHOR_DATE": ad,
               "GIT_COMMITTER_NAME": cn, "GIT_COMMITTER_EMAIL": ce, "GIT_COMMITTER_DATE": cd}  # fmt: skip
        parent = gitutil.out(repo, "commit-tree", tree, "-p", parent, "-F", "-",
                             input=msg, env=env)  # fmt: skip
        made.append(parent)
    return made


def build_chain(project: Project, base: str, patches: list[Path], what: str,
                signer: Identity | None = None, rewrite: bool = True,
                replaced: list | None = None) -> list[str]:  # fmt: skip
    """The commits of the patches applied in order on base (stack trailers removed
    unless rewrite=False)."""
    repo = project.repo
    with gitutil.temp_worktree(repo, base, project.cache) as tmp:
        results = apply_patches(tmp, patches, log=lambda s: None)
        bad = next((r for r in results if not r.ok), None)
        if bad is not None or len(results) != len(patches):
            r = bad or results[-1]
            raise VstackError(
                f"{r.patch} does not apply on {what}: "
                f"{'; '.join(r.details[:2]) or ', '.join(r.files) or r.status}"
            )
        tip = gitutil.out(tmp, "rev-parse", "HEAD")
    count = len(gitutil.out(repo, "rev-list", f"{base}..{tip}").split())
    if rewrite and count != len(patches):
        raise VstackError(
            f"{len(patches)} patch file(s) made {count} commit(s) on {what}: a draft "
            f"needs one commit per patch (vstack export writes them so)"
        )
    if not rewrite:
        return gitutil.out(repo, "rev-list", "--reverse", f"{base}..{tip}").split()
    return _rewrite(repo, base, tip, signer, replaced)


def format_mbox(repo: Path, start: str, tip: str) -> bytes:
    return gitutil.git(repo, "format-patch", "--stdout", "--zero-commit", "--full-index",
                       "--no-signature", "--keep-subject", f"{start}..{tip}",
                       text=False).stdout  # fmt: skip


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


# ---------------------------------------------------------------- checks


def static_checks(project: Project, start: str, tip: str, patch_text: str,
                  ruff_config: Path) -> list[Check]:  # fmt: skip
    """SPDX, torch.cuda, imports, config docs from the patch; ruff (check and
    format, vLLM's configuration) on the files start..tip changes, lines it adds."""
    repo = project.repo
    found: list[Check] = []
    changes = gitutil.tree_changes(repo, start, tip)
    py_files = [p for s, p, _ in changes if s != "D" and p.endswith(".py")]
    blobs = gitutil.read_blobs(repo, tip, py_files)
    info = parse_patch(patch_text)
    added: dict[str, set[int]] = {}
    for _, file, new_no, line in _added_lines(patch_text):
        added.setdefault(file, set()).add(new_no)
        if new_torch_cuda_call(file, line):
            found.append(Check("torch-cuda", f"{file}:{new_no}",
                               "new direct torch.cuda call (use torch.accelerator / current_platform)"))  # fmt: skip
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
    ruff = find_ruff(project)
    if ruff is None:
        return found + [
            Check(
                "ruff",
                "",
                "ruff not found (pip install ruff==0.14.0, or set VSTACK_RUFF)",
            )
        ]
    if not blobs:
        return found
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # ruff reads pyproject.toml ([tool.ruff]) or ruff.toml (top-level keys)
        name = "pyproject.toml" if ruff_config.name == "pyproject.toml" else "ruff.toml"
        shutil.copy(ruff_config, tmp / name)
        for path, data in blobs.items():
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp / path).write_bytes(data)
        p = subprocess.run([ruff, "check", "--no-cache", "--output-format=concise", *blobs],
                           cwd=tmp, capture_output=True, text=True)  # fmt: skip
        # Only what the change adds is the PR's to fix: upstream's own lines pass
        # upstream's configuration (ours only restates it when no checkout exists).
        for line in p.stdout.splitlines():
            m = re.match(r"^(.+?):(\d+):\d+: (.+)$", line)
            if m and int(m.group(2)) in added.get(m.group(1), ()):
                found.append(Check("ruff", f"{m.group(1)}:{m.group(2)}", m.group(3)))
        p = subprocess.run([ruff, "format", "--no-cache", "--diff", *blobs], cwd=tmp,
                           capture_output=True, text=True)  # fmt: skip
        current = None
        for line in p.stdout.splitlines():
            if line.startswith("--- "):
                current = line[4:].strip()
            m = re.match(r"^@@ -(\d+)(?:,(\d+))?", line)
            if m and current:
                start_no, n = int(m.group(1)), int(m.group(2) or 1)
                if set(range(start_no, start_no + max(n, 1))) & added.get(
                    current, set()
                ):
                    found.append(Check("ruff-format", f"{current}:{start_no}",
                                       "not formatted as `ruff format` would"))  # fmt: skip
    return found


def dco_check(repo: Path, commits: list[str], hint: str) -> Check:
    """The DCO app's rule on every commit: a Signed-off-by of its author, by a
    person. No sign-off at all is "unsigned: not sendable", not a failure."""
    unsigned, bad = [], []
    for sha in commits:
        an, ae, subject = gitutil.out(
            repo, "log", "-1", "--format=%an%x00%ae%x00%s", sha
        ).split("\0")
        author = Identity(an, ae)
        values = signoffs(gitutil.git(repo, "log", "-1", "--format=%B", sha).stdout)
        if not values:
            unsigned.append(subject)
            continue
        idents = [identity.parse(v) for v in values]
        refused = [v for v, i in zip(values, idents, strict=True)
                   if i is None or identity.refusal(i)]  # fmt: skip
        if refused:
            bad.append(f"'{subject}': Signed-off-by {refused[0]} is not a person's")
        elif identity.refusal(author):
            bad.append(f"'{subject}': its author {author} is not a person")
        elif not any(i.same_as(author) for i in idents):
            bad.append(f"'{subject}': no Signed-off-by from its author {author}")
    if bad:
        return Check("dco", "", "; ".join(bad))
    if unsigned:
        return Check("dco", "", f"unsigned: not sendable ({hint})", status="UNSIGNED")
    return Check("dco", "", f"every commit ({len(commits)}) signed off by its author",
                 status="PASS")  # fmt: skip


# ---------------------------------------------------------------- a draft


@dataclasses.dataclass
class Draft:
    index: int
    slug: str
    title: str
    direct: list[int]
    chain: list[int]
    how: str  # declared / inferred / none
    start: str  # the commit the PR's own commits sit on (stock + dependencies)
    tip: str
    mbox: bytes
    checks: list[Check]
    tests: list[str]
    test_run: object | None = None
    repro_run: object | None = None
    non_test: int = 0
    loc: int = 0
    revision: int = 0
    rfc: str | None = None
    # (old author, why, subject) of each commit whose author the signer replaced
    replaced: list = dataclasses.field(default_factory=list)
    recorded: bool = True  # its revision is the one upstream/<patch>/ records

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAIL"]

    @property
    def signed(self) -> bool:
        return not any(c.status == "UNSIGNED" for c in self.checks)

    @property
    def failed_dco(self) -> bool:
        return any(c.name == "dco" and c.status == "FAIL" for c in self.checks)


def _own_tests(info, tip_files: set[str]) -> list[str]:
    return sorted(
        p for p in info.files
        if p.startswith("tests/") and Path(p).name.startswith("test_")
        and p.endswith(".py") and p in tip_files
    )  # fmt: skip


def _test_files(info) -> list[str]:
    return [p for p in info.files if p.startswith("tests/") and p not in info.deleted]


def rfc_of(stack: Stack, i: int) -> str | None:
    values = stack.infos[i].trailers.get("RFC", [])
    return values[0].strip() if values else None


def make_draft(stack: Stack, i: int, python: Path | None, run_tests: bool,
               signer: Identity | None) -> tuple[Draft, list[str] | None]:  # fmt: skip
    """The draft of patch i, and with a signer the signed commits."""
    project, repo = stack.project, stack.project.repo
    info = stack.infos[i]
    direct, how = stack.deps(i)
    chain = sorted(stack.closure(i))
    paths = [stack.patches[j] for j in chain] + [stack.patches[i]]
    where = stack.where(chain)
    print(f"vstack upstream: {stack.names[i]} on {where}")
    commits = build_chain(project, stack.base.commit, paths, where)
    start = commits[len(chain) - 1] if chain else stack.base.commit
    tip = commits[-1]
    mbox = format_mbox(repo, start, tip)
    slug = stack.slug(i)
    checks: list[Check] = []
    if how == "declared":
        msg = f"on {where} (its Depends-On)"
    elif how == "inferred":
        msg = (f"on {where}: inferred, as it does not apply on stock vLLM alone; "
               f"declare with `Depends-On: <patch>` trailers")  # fmt: skip
    else:
        msg = f"on stock vLLM {stack.base.version} alone"
    checks.append(Check("applies", "", msg, status="PASS"))
    title = info.subject
    if TITLE_TAGS.match(title):
        checks.append(Check("title", "", "vLLM's bracketed tags", status="PASS"))
    else:
        checks.append(Check("title", f"{stack.names[i]}:1",
                            f"title '{title}' lacks vLLM's bracketed tags ([EPLB][Perf] ...)"))  # fmt: skip
    text = stack.patches[i].read_text(errors="replace")
    static = static_checks(project, start, tip, text, stack.ruff_config)
    checks += static or [Check("lint", "", "ruff check + format (vLLM's configuration), "
                               "SPDX, torch.cuda, imports, config docs", status="PASS")]  # fmt: skip
    if stack.checkout is not None:
        from vstack.precommit import run_on_commit, why_not

        reason = why_not(project, repo, stack.base.commit)
        if reason:
            checks.append(
                Check(
                    "pre-commit", "", f"vLLM's hooks not run: {reason}", status="SKIP"
                )
            )
        else:
            print("  running vLLM's own pre-commit hooks on the changed files ...")
            failures = run_on_commit(project, repo, start, tip)
            checks += [Check("pre-commit", f.hook, f.summary()) for f in failures] or [
                Check("pre-commit", "", "vLLM's hooks on the changed files", status="PASS")]  # fmt: skip
    else:
        checks.append(Check("pre-commit", "", "vLLM's hooks not run: no vLLM checkout "
                            "(populate vllm/ or --git)", status="SKIP"))  # fmt: skip
    # the PR's own tests, on the base it targets
    tip_files = set(
        gitutil.out(
            repo, "ls-tree", "-r", "--name-only", tip, "--", "tests"
        ).splitlines()
    )
    tests = _own_tests(info, tip_files)
    test_run = repro_run = None
    if not tests:
        checks.append(Check("tests", "", "the PR adds no tests", status="NOTE"))
    elif not run_tests:
        checks.append(Check("tests", "", "not run (--no-tests)", status="SKIP"))
    elif python is None:
        checks.append(Check("tests", "", "not run: no test environment (scripts/test "
                            "creates it; or --python)"))  # fmt: skip
    else:
        from vstack.check import check_prefix, tests_at

        timeout = settings.env_seconds("VSTACK_UPSTREAM_TEST_TIMEOUT", TEST_TIMEOUT_S)
        print(f"  tests on {where} + this PR: {' '.join(tests)} ...")
        runs: list = []
        problems = check_prefix(repo, start, tip, tests, python, log=lambda s: None,
                                stop_first=False, timeout=timeout, runs=runs)  # fmt: skip
        test_run = runs[0] if runs else None
        if problems:
            checks += [
                Check("tests", "", f"on {where} + this PR: {p}") for p in problems
            ]
        else:
            checks.append(Check("tests", "", f"{test_run.summary} on {where} + this PR (CPU)",
                                status="PASS"))  # fmt: skip
            if "[Bugfix]" in title:
                repro_run = tests_at(repo, start, tests, python,
                                     overlay=(tip, _test_files(info)),
                                     stop_first=False, timeout=timeout)  # fmt: skip
                if repro_run.ok:
                    checks.append(Check("reproduces", "", f"the tests pass on {where} "
                                        f"without the fix ({repro_run.summary}): they do not "
                                        "show the bug"))  # fmt: skip
                else:
                    checks.append(Check("reproduces", "", f"without the fix, on {where}: "
                                        f"{repro_run.summary}", status="PASS"))  # fmt: skip
    # results, RFC, DCO
    for rel in info.trailers.get("Stack-Results", []):
        if not (project.root / rel.strip()).is_file():
            checks.append(Check("results", f"{stack.names[i]}:1",
                                f"Stack-Results file {rel} does not exist"))  # fmt: skip
    diff = gitutil.git(repo, "diff", "--no-renames", start, tip).stdout
    loc = loc_outside_exempt(diff)
    rfc = rfc_of(stack, i)
    if rfc is not None:
        exists = (project.root / rfc).is_file()
        checks.append(Check("rfc", "", f"implements the RFC drafted from {rfc}"
                            + ("" if exists else " (not written yet)"),
                            status="PASS" if exists else "NOTE"))  # fmt: skip
    elif loc > RFC_LINES:
        checks.append(Check("rfc", "", f"{loc} lines outside kernels/tests/config (over "
                            f"{RFC_LINES}): vLLM asks for an RFC issue first; name its "
                            f"document with an `RFC: docs/<name>.md` trailer", status="NOTE"))  # fmt: skip
    hint = f'scripts/vstack upstream {slug} --signoff "Full Name <you@domain>"'
    signed_commits, replaced = None, []
    if signer is not None:
        signed_commits = build_chain(project, stack.base.commit, paths, where, signer,
                                     replaced=replaced)  # fmt: skip
        checks.append(dco_check(repo, signed_commits[len(chain) :], hint))
    else:
        checks.append(dco_check(repo, commits[len(chain) :], hint))
    draft = Draft(i, slug, title, direct, chain, how, start, tip, mbox, checks, tests,
                  test_run, repro_run, non_test_lines(diff), loc, rfc=rfc,
                  replaced=replaced)  # fmt: skip
    return draft, signed_commits


# ---------------------------------------------------------------- the body


def render_body(stack: Stack, d: Draft) -> str:
    info = stack.infos[d.index]
    purpose, design, testing = split_message(info.body)
    parts = ["## Purpose", "", purpose or "(the patch has no description)", ""]
    for j in d.direct:
        pr = stack.infos[j].trailers.get("Upstream-PR", [])
        ref = (
            f"#{pr[0].strip()}"
            if pr
            else f"the PR drafted in `upstream/{stack.slug(j)}/` (not opened yet)"
        )
        parts.append(f"**Depends on** {ref}: {stack.infos[j].subject}.")
    if d.direct:
        parts += [
            "Its commit(s) come first on this branch; review only this PR's own commit.",
            "",
        ]
    if d.rfc:
        parts += [
            f"**Part of the RFC** drafted from `{d.rfc}` (`upstream/{rfc_slug(d.rfc)}/`).",
            "",
        ]
    if design:
        parts += ["## Design", "", design, ""]
    parts += ["## Test Plan", "", "```bash"]
    if d.tests:
        parts += [
            f"# CPU (Triton kernels under the interpreter), as run for revision {d.revision}:",
            f"{CPU_ENV} pytest -q {' '.join(d.tests)}",
            "# on a GPU (the GPU-only tests run too):",
            f"pytest -q {' '.join(d.tests)}",
        ]
    else:
        parts.append("# (this change adds no tests)")
    results = []
    for rel in info.trailers.get("Stack-Results", []):
        path = stack.project.root / rel.strip()
        if path.is_file():
            results.append((path, json.loads(path.read_text())))
    if results:
        parts.append("# the benchmarks behind the results below:")
        parts += list(dict.fromkeys(_command(data) for _, data in results))
    parts += ["```", ""]
    if testing:
        parts += [re.sub(r"^(Tests?|Tested|Testing)( \([^)]*\))?:\s*", "", testing), ""]
    parts += ["## Test Result", ""]
    where = stack.where(d.chain)
    if d.test_run is not None:
        parts.append(f"- Tests of revision {d.revision} on {where} + this PR, CPU: "
                     f"**{d.test_run.summary}**.")  # fmt: skip
        if d.test_run.skipped:
            reasons: dict[str, int] = {}
            for s in d.test_run.skipped:
                reason = s.split(": ", 1)[-1]
                reasons[reason] = reasons.get(reason, 0) + 1
            parts.append(
                "  Skipped: "
                + "; ".join(f"{n} ({r})" for r, n in reasons.items())
                + "."
            )
    else:
        parts.append(f"- Tests: not run for revision {d.revision} (see checks.txt).")
    if d.repro_run is not None:
        failed = ", ".join(f"`{f.split('::')[-1]}`" for f in d.repro_run.failed)
        parts.append(f"- Without the fix (revision {d.revision}), on {where}: "
                     f"**{d.repro_run.summary}**"
                     + (f" ({failed})." if failed else "."))  # fmt: skip
    parts.append("")
    for path, data in results:
        parts += [render_results(path, data), ""]
    gpu = [p.name for p, data in results if measured_on_gpu(data)]
    skipped = len(d.test_run.skipped) if d.test_run is not None else 0
    parts.append(
        "**Not run on a GPU**: no test or number here ran on a GPU"
        + (f" (except {', '.join(gpu)})" if gpu else "")
        + "; everything above ran on CPU"
        + (
            f", and the {skipped} test(s) skipped there still need a GPU run."
            if skipped
            else "."
        )
    )
    parts += [
        "", f"Lines changed outside tests: {d.non_test}.",
        "", "<details><summary>Essential Elements of an Effective PR Description Checklist</summary>", "",
        "- [x] The purpose of the PR, such as \"Fix some issue (link existing issues this PR will resolve)\".",
        "- [x] The test plan, such as providing test command.",
        "- [x] The test results, such as pasting the results comparison before and after, or e2e results.",
        "", "</details>", "",
    ]  # fmt: skip
    return "\n".join(parts)


# ---------------------------------------------------------------- revisions


def _blob(root: Path, path: Path) -> str:
    """The patch file's git blob id; written into the project's object database
    (a revision regenerates before its files are committed, on this machine)."""
    write = ["-w"] if gitutil.is_repo(root) else []
    return gitutil.out(root, "hash-object", *write, str(path))


def _pin_record(pin: Pin) -> dict:
    return {"version": pin.version, "commit": pin.commit, "wheel": pin.wheel,
            "sha256": pin.sha256}  # fmt: skip


def _legacy_source(root: Path, rel: str, digest: str) -> dict | None:
    """The project commit holding an old revision's mbox (revisions written before
    their sources were recorded kept it in the tree)."""
    if not gitutil.is_repo(root):
        return None
    p = gitutil.git(root, "rev-list", "HEAD", "--", rel, check=False)
    for commit in p.stdout.split():
        data = gitutil.git(root, "show", f"{commit}:{rel}", check=False, text=False)
        if data.returncode == 0 and hashlib.sha256(data.stdout).hexdigest() == digest:
            return {"commit": commit, "path": rel}
    return None


def parse_meta(data: bytes, path: Path) -> dict:
    """A draft's meta.json, or one error naming it (torn by a kill, a merge
    conflict's markers, a hand edit)."""
    fix = (f"restore it from git (git checkout -- {path}) or, to start the draft's "
           f"revisions over, remove it")  # fmt: skip
    try:
        meta = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        conflict = b"\n<<<<<<< " in b"\n" + data
        what = (
            "holds git merge conflict markers"
            if conflict
            else f"is not valid JSON ({e})"
        )
        raise VstackError(f"{path} {what}: {fix}") from None
    revs = meta.get("revisions") if isinstance(meta, dict) else None
    if not isinstance(revs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("revision"), int)
        and isinstance(r.get("digest"), str) for r in revs
    ):  # fmt: skip
        raise VstackError(
            f"{path} is not a draft's record (a list of revisions): {fix}"
        )
    return meta


def load_meta(project: Project, slug: str) -> dict:
    path = project.root / "upstream" / slug / "meta.json"
    meta = parse_meta(path.read_bytes(), path) if path.is_file() else {"revisions": []}
    for rev in meta["revisions"]:
        if "patches" in rev or "legacy_mbox" in rev:
            continue
        rel = f"upstream/{slug}/v{rev['revision']}.mbox"
        src = _legacy_source(project.root, rel, rev["digest"])
        if src is not None:
            rev["legacy_mbox"] = src
    return meta


def _rev_ref(slug: str, n: int, what: str = "tip") -> str:
    return f"refs/vstack/upstream/{slug}/v{n}" + ("" if what == "tip" else f"-{what}")


def rebuild(project: Project, slug: str, rev: dict, signer: Identity | None = None,
            replaced: list | None = None) -> tuple[str, str, bytes]:  # fmt: skip
    """(start, tip, mbox) of a recorded revision, from the git objects it records:
    the patch blobs applied on the recorded pin's base, or an old revision's mbox
    from the project commit that held it."""
    root = project.root
    if "legacy_mbox" in rev:
        src = rev["legacy_mbox"]
        data = gitutil.git(
            root, "show", f"{src['commit']}:{src['path']}", text=False
        ).stdout
        if signer is not None:
            raise VstackError(f"revision {rev['revision']} of {slug} predates recorded "
                              f"sources: sign a current revision instead")  # fmt: skip
        base = rev.get("base")
        with tempfile.TemporaryDirectory() as tmp:
            mbox = Path(tmp) / f"v{rev['revision']}.mbox"
            mbox.write_bytes(data)
            tip = None
            if base and gitutil.rev_parse(project.repo, base):
                tip = build_chain(project, base, [mbox], f"base {base[:12]}",
                                  rewrite=False)[-1]  # fmt: skip
        return base, tip, data
    if "patches" not in rev:
        raise VstackError(f"revision {rev['revision']} of {slug} records no sources "
                          f"(meta.json)")  # fmt: skip
    pin = Pin(image="", **rev["pin"])
    base = ensure_base(project, pin)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for k, p in enumerate(rev["patches"]):
            got = gitutil.git(
                root, "cat-file", "blob", p["blob"], check=False, text=False
            )
            if got.returncode:
                raise VstackError(
                    f"revision {rev['revision']} of {slug}: {p['name']} (blob "
                    f"{p['blob'][:12]}) is not in this repository's git objects: it was "
                    f"never committed"
                )
            path = Path(tmp) / f"{k:03d}-{p['name']}"
            path.write_bytes(got.stdout)
            paths.append(path)
        commits = build_chain(project, base.commit, paths, f"vLLM {pin.version}",
                              signer, replaced=replaced)  # fmt: skip
    start = commits[-2] if len(commits) > 1 else base.commit
    mbox = format_mbox(project.repo, start, commits[-1])
    if signer is None and hashlib.sha256(mbox).hexdigest() != rev["digest"]:
        raise VstackError(f"revision {rev['revision']} of {slug} rebuilt differently "
                          f"from its recorded digest")  # fmt: skip
    return start, commits[-1], mbox


def range_diff(project: Project, slug: str, prev: dict, start: str, tip: str) -> str:
    repo = project.repo
    if "patches" in prev:
        old_start = gitutil.rev_parse(repo, _rev_ref(slug, prev["revision"], "start"))
        old_tip = gitutil.rev_parse(repo, _rev_ref(slug, prev["revision"]))
    else:  # written before revisions recorded their sources: base..tip
        old_start = prev.get("base")
        old_tip = gitutil.rev_parse(repo, prev["tip"]) if prev.get("tip") else None
    try:
        if old_tip is None or old_start is None:
            old_start, old_tip, _ = rebuild(project, slug, prev)
    except VstackError as e:
        old_tip = None
        why = str(e)
    if old_tip is None:
        why = locals().get("why", "its commits are not here")
        return f"(revision {prev['revision']} cannot be rebuilt here: {why})\n"
    return gitutil.git(repo, "range-diff", "--no-color", f"{old_start}..{old_tip}",
                       f"{start}..{tip}").stdout  # fmt: skip


def revision_of(project: Project, slug: str, mbox: bytes) -> tuple[int, bool]:
    """(revision number, recorded?) of a draft's mbox, reading upstream/ only: a
    recorded revision with this digest, else the number it would be given."""
    revs = load_meta(project, slug)["revisions"]
    digest = hashlib.sha256(mbox).hexdigest()
    for rev in reversed(revs):
        if rev["digest"] == digest:
            return rev["revision"], True
    return (revs[-1]["revision"] + 1 if revs else 1), False


def record_revision(stack: Stack, d: Draft) -> tuple[int, str | None, dict]:
    """The draft's revision number (a new one when its mbox changed), for a new
    revision after the first the range-diff against the previous one, and the
    draft's meta.json to write."""
    project = stack.project
    meta = load_meta(project, d.slug)
    digest = hashlib.sha256(d.mbox).hexdigest()
    revs = meta["revisions"]
    paths = [stack.patches[j] for j in d.chain] + [stack.patches[d.index]]
    sources = {
        "pin": _pin_record(project.pin), "base": stack.base.commit,
        "depends_on": [stack.names[j] for j in d.direct],
        "patches": [{"name": p.name, "blob": _blob(project.root, p)} for p in paths],
    }  # fmt: skip
    if revs and revs[-1]["digest"] == digest:
        # The same mbox made from other patch files (a patch it depends on
        # changed elsewhere): the revision stays, and records what made it now,
        # which is what `vstack upstream --check` compares with patches/.
        n, rd = revs[-1]["revision"], None
        revs[-1].update(sources)
    else:
        n = (revs[-1]["revision"] + 1) if revs else 1
        rd = range_diff(project, d.slug, revs[-1], d.start, d.tip) if revs else None
        revs.append({"revision": n, "digest": digest, **sources})
    meta["patch"] = stack.names[d.index]
    repo = project.repo
    gitutil.git(repo, "update-ref", _rev_ref(d.slug, n), d.tip)
    gitutil.git(repo, "update-ref", _rev_ref(d.slug, n, "start"), d.start)
    return n, rd, meta


def _meta_text(meta: dict) -> str:
    return json.dumps(meta, indent=2) + "\n"


def write_draft(stack: Stack, d: Draft, range_text: str | None,
                meta: dict) -> tuple[Path, list[str]]:  # fmt: skip
    """upstream/<patch>/: title, body, checks, the range-diff from the previous
    revision and meta.json; no mbox (regenerated from the patch files in git).
    A file the user edited is kept (the new one goes to .vstack/outgoing/); an
    mbox or range-diff of an earlier revision is removed when git or the
    recorded patch files can give it back. (folder, notes to print)"""
    root = stack.project.root
    out = root / "upstream" / d.slug
    files = {"title.txt": (d.title + "\n").encode(),
             "body.md": render_body(stack, d).encode(),
             "checks.txt": render_checks(stack, d).encode()}  # fmt: skip
    current_rd = f"range-diff-v{d.revision - 1}-v{d.revision}.txt"
    if range_text is not None:
        files[current_rd] = range_text.encode()
    record = meta.setdefault("files", {})
    changed = {n for n in drafts.edited(root, out, files, record)
               if not (out / n).is_file() or (out / n).read_bytes() != files[n]}  # fmt: skip
    for name, data in files.items():
        if name not in changed:
            if (out / name).is_file():  # its content now is vstack's too
                drafts.remember(record, name, (out / name).read_bytes())
            drafts.remember(record, name, data)
    out.mkdir(parents=True, exist_ok=True)
    # meta.json first: a run killed before the files are written still knows
    # both their old and their new content as its own
    fsutil.write_text(out / "meta.json", _meta_text(meta))
    notes = []
    spill = stack.outgoing(d.slug)
    for name, data in files.items():
        path = out / name
        if name in changed:
            fsutil.write_bytes(spill / name, data)
            notes.append(f"kept upstream/{d.slug}/{name}: it holds edits vstack did not "
                         f"make (vstack's new one: {spill / name})")  # fmt: skip
        elif not (path.is_file() and path.read_bytes() == data):
            fsutil.write_bytes(path, data)
    regenerable = {r["digest"] for r in meta["revisions"] if "patches" in r}
    removed = False
    for old in sorted([*out.glob("v*.mbox"), *out.glob("range-diff-*.txt")]):
        if old.name in files or old.name == current_rd:
            continue
        if (
            old.suffix == ".mbox"
            and hashlib.sha256(old.read_bytes()).hexdigest() in regenerable
        ) or drafts.is_ours(root, old, record.get(old.name)):
            fsutil.remove(old)
            removed |= record.pop(old.name, None) is not None
        else:
            notes.append(f"kept upstream/{d.slug}/{old.name}: vstack cannot regenerate "
                         f"it (not committed, or edited): remove it once you no "
                         f"longer need it")  # fmt: skip
    if removed:
        fsutil.write_text(out / "meta.json", _meta_text(meta))
    return out, notes


def render_checks(stack: Stack, d: Draft) -> str:
    deps = ", ".join(stack.slug(j) for j in d.direct) or "none"
    lines = [
        f"draft {d.slug} v{d.revision}: {d.title}",
        f"base: vLLM {stack.base.version} ({stack.base.commit[:12]}, from "
        f"{stack.base.source}); depends on: {deps}"
        + (" (inferred)" if d.how == "inferred" else ""),
        f"lines changed outside tests: {d.non_test}",
        "",
    ]
    lines += [f"{c.status:<8} {c}" for c in d.checks]
    lines += ["", f"result: {result_line(d)}"]
    return "\n".join(lines) + "\n"


def result_line(d: Draft) -> str:
    """The verdict of checks.txt: no check that did not run counts as passed."""
    if d.failed:
        return f"{len(d.failed)} check(s) failed"
    skipped = [c.name for c in d.checks if c.status == "SKIP"]
    text = (f"all checks that ran passed ({len(skipped)} skipped: {', '.join(skipped)})"
            if skipped else "all checks passed")  # fmt: skip
    return text + ("" if d.signed else "; unsigned: not sendable yet")


# ---------------------------------------------------------------- RFC drafts


def rfc_slug(doc: str) -> str:
    return "rfc-" + re.sub(r"[^a-z0-9]+", "-", Path(doc).stem.lower()).strip("-")


def rfc_documents(stack: Stack) -> list[str]:
    return rfc_docs(stack.project.root, stack.infos)


def rfc_docs(root: Path, infos: list) -> list[str]:
    """stack.toml [upstream] rfcs, then every document a patch (its parsed info,
    in series order) names in `RFC:`."""
    data = tomllib.loads((root / "stack.toml").read_text())
    docs = list(data.get("upstream", {}).get("rfcs", []))
    for info in infos:
        values = info.trailers.get("RFC", [])
        doc = values[0].strip() if values else None
        if doc and doc not in docs:
            docs.append(doc)
    return docs


def render_rfc(
    doc: str, text: str, prs: list[tuple[str, str, list[str]]]
) -> tuple[str, str]:
    """(title, issue body) in vLLM's RFC issue template from a Markdown document:
    its first heading is the title, a section named like Motivation / Why /
    Problem / Background the motivation, the rest the proposed change; `prs` =
    (draft, title, what it depends on) of the PRs that implement it."""
    lines = text.splitlines()
    title = next(
        (ln.lstrip("#").strip() for ln in lines if ln.startswith("# ")), Path(doc).stem
    )
    sections: list[tuple[str, list[str]]] = [("", [])]
    for ln in lines:
        if ln.startswith("# "):
            continue
        m = re.match(r"^(#{2,})\s+(.*)$", ln)
        if m and len(m.group(1)) == 2:
            sections.append((m.group(2).strip(), []))
        else:
            sections[-1][1].append(ln)
    motivation, change = [], []
    for name, body in sections:
        block = "\n".join(body).strip()
        if not block:
            continue
        if re.match(r"(motivation|why|problem|background)", name, re.I) or (
            not name and not motivation
        ):
            motivation.append(block)
        else:
            change.append((f"#### {name}\n\n" if name else "") + block)
    impl = [f"{k}. `upstream/{slug}/`: {t}" + (f" (depends on {', '.join(deps)})" if deps else "")
            for k, (slug, t, deps) in enumerate(prs, 1)]  # fmt: skip
    body = [
        "### Motivation.", "", "\n\n".join(motivation) or "(see the proposed change)", "",
        "### Proposed Change.", "", "\n\n".join(change) or "(see the document)", "",
        "#### Implementation", "",
        *(impl or ["No patch of the stack names this document in an `RFC:` trailer yet."]),
        "", "### Feedback Period.", "", "To be set by the submitter when the issue is opened.", "",
        "### CC List.", "", "To be filled in by the submitter (the EPLB maintainers).", "",
        "### Any Other Things.", "",
        f"Drafted by `vstack upstream` from `{doc}` of the EPLB stack. No number in it was "
        "measured on a GPU.", "",
    ]  # fmt: skip
    return f"[RFC]: {title}", "\n".join(body)


def write_rfcs(stack: Stack, drafts: dict[int, Draft]) -> list[str]:
    notes = []
    for doc in rfc_documents(stack):
        path = stack.project.root / doc
        slug = rfc_slug(doc)
        prs = [(d.slug, d.title, [stack.slug(j) for j in d.direct])
               for d in drafts.values() if d.rfc == doc]  # fmt: skip
        if not path.is_file():
            notes.append(f"RFC {doc} does not exist yet: no RFC issue draft written"
                         + (f" ({len(prs)} PR(s) name it)" if prs else ""))  # fmt: skip
            continue
        title, body = render_rfc(doc, path.read_text(), prs)
        out = stack.project.root / "upstream" / slug
        out.mkdir(parents=True, exist_ok=True)
        fsutil.write_text(out / "title.txt", title + "\n")
        fsutil.write_text(out / "issue.md", body)
        notes.append(
            f"RFC issue draft upstream/{slug}/ from {doc} ({len(prs)} implementation PR(s))"
        )
    return notes


# ---------------------------------------------------------------- the verb


def _mbox_name(stack: Stack, d: Draft, signed: bool) -> str:
    stem = "pr" if stack.recut else f"v{d.revision}"
    return f"{stem}.mbox" if signed else f"{stem}.unsigned.mbox"


def write_outgoing(stack: Stack, d: Draft, signed: list[str] | None,
                   signer: Identity | None, recording: bool) -> tuple[Path, Path | None]:  # fmt: skip
    """.vstack/outgoing/<patch>/ (on-<commit>/ for a re-cut): the mbox (signed:
    v<N>.mbox, only when the DCO check passes; unsigned: v<N>.unsigned.mbox),
    and, unless this run records upstream/<patch>/, its checks, title and body:
    upstream/<patch>/'s own title and body (the user's edits and the recorded
    test evidence) when that is this revision, else the ones made now.
    (folder, the mbox to send or None)"""
    folder = stack.outgoing(d.slug)
    folder.mkdir(parents=True, exist_ok=True)
    start = d.start
    if signer is not None:
        start = signed[len(d.chain) - 1] if d.chain else stack.base.commit
        tip = signed[-1]
    else:
        tip = d.tip
    mbox = None
    if signer is None or not d.failed_dco:
        mbox = folder / _mbox_name(stack, d, signer is not None)
        fsutil.write_bytes(mbox, format_mbox(stack.project.repo, start, tip))
    if signer is not None and d.failed_dco:
        fsutil.remove(folder / _mbox_name(stack, d, True))
    if recording:
        return folder, mbox
    recorded = stack.project.root / "upstream" / d.slug
    files = {"title.txt": d.title + "\n", "body.md": render_body(stack, d)}
    # A re-cut keeps the recorded title (the user's edits); its body is made
    # for the new base, as the recorded one states evidence for the pinned base.
    for name in ["title.txt"] if stack.recut else list(files):
        if d.recorded and (recorded / name).is_file():
            files[name] = (recorded / name).read_text(errors="replace")
            if name == "body.md":
                d.checks.append(Check("body", "", recorded_body_note(d), status="NOTE"))
    files["checks.txt"] = render_checks(stack, d)
    for name, text in files.items():
        fsutil.write_text(folder / name, text)
    return folder, mbox


def recorded_body_note(d: Draft) -> str:
    """What a copy's checks say when its body is the recorded one: whose results
    the body states."""
    ran = d.test_run is not None
    return (f"body.md is upstream/{d.slug}/body.md: its results are revision "
            f"{d.revision}'s recorded run (upstream/{d.slug}/checks.txt), "
            + ("this run's are above" if ran else "this run ran no tests"))  # fmt: skip


def _authors_line(
    stack: Stack, d: Draft, signer: Identity, signed: list[str]
) -> list[str]:
    """One line naming every author the signer replaced (the stack's shared
    identity, a placeholder) and on which commits, and one per person whose
    authorship is kept."""
    by: dict[tuple[str, str], list[str]] = {}
    for old, why, subject in d.replaced:
        by.setdefault((old, why), []).append(subject)
    parts = []
    for (old, why), subjects in by.items():
        own = sum(1 for s in subjects if s == d.title)
        what = [f"this PR's commit{'s' if own > 1 else ''}"] if own else []
        if len(subjects) > own:
            what.append(f"{len(subjects) - own} commit(s) of the PRs it depends on")
        parts.append(f"{old} ({why}) on {' and '.join(what)}")
    lines = [f"  author: {signer} replaces {'; '.join(parts)}"] if parts else []
    for sha in signed[len(d.chain) :]:
        who = gitutil.out(stack.project.repo, "log", "-1", "--format=%an <%ae>", sha)
        if who != f"{signer.name} <{signer.email}>":
            lines.append(f"  author: {who} (a person) is kept; {signer} adds their "
                         f"sign-off")  # fmt: skip
    return lines


def _publish(stack: Stack, d: Draft, tip: str) -> tuple[str, list[str]]:
    """The draft's branch in the vLLM checkout (drafts.publish_branch)."""
    repo = stack.project.repo
    known = {d.tip}
    for ref in gitutil.out(repo, "for-each-ref", "--format=%(objectname)",
                           f"refs/vstack/upstream/{d.slug}/").split():  # fmt: skip
        known.add(ref)
    return drafts.publish_branch(
        stack.checkout, repo, f"vstack/{d.slug}-v{d.revision}", tip, known
    )


def _report(stack: Stack, d: Draft, written: list[str], range_text: str | None,
            signer: Identity | None, sendable: Path | None, signed: list[str] | None,
            notes: list[str]) -> None:  # fmt: skip
    for j in d.direct:
        print(f"  depends on: {stack.names[j]} ({stack.infos[j].subject})"
              + (" [inferred]" if d.how == "inferred" else ""))  # fmt: skip
    rev = f"revision {d.revision}" + ("" if d.recorded or stack.recut else
                                      " (not recorded in upstream/ yet)")  # fmt: skip
    if stack.recut:
        rev = f"re-cut on vLLM {stack.base.version}"
    print(f"  {rev}; title: {d.title}; {d.non_test} non-test line(s)")
    for line in written:
        print(f"  {line}")
    if range_text is not None:
        print(f"  range-diff v{d.revision - 1} -> v{d.revision}:")
        print("".join(f"    {ln}\n" for ln in range_text.splitlines()), end="")
    for c in d.checks:
        if c.status in ("FAIL", "NOTE"):
            print(f"  {c.status} {c}")
    if signer is not None and signed:
        for line in _authors_line(stack, d, signer, signed):
            print(line)
    branch = None
    if stack.checkout is not None and not stack.recut and not d.failed_dco:
        tip = signed[-1] if signed else d.tip
        branch, bnotes = _publish(stack, d, tip)
        notes = [*notes, *bnotes]
        print(f"  branch {branch} in {stack.checkout} ({len(d.chain) + 1} commit(s)"
              + (f", signed off by {signer})" if signer else ", unsigned)"))  # fmt: skip
    for n in notes:
        print(f"  note: {n}")
    if signer is None:
        base = f" --base {stack.recut}" if stack.recut else ""
        print(f"  unsigned: not sendable yet: scripts/vstack upstream {d.slug}{base} "
              f'--signoff "Full Name <you@domain>" (or VSTACK_SIGNOFF) makes the copy '
              "to send")  # fmt: skip
        return
    if sendable is None:
        print(
            f"  not sendable: the DCO check fails (see {stack.outgoing(d.slug) / 'checks.txt'})"
        )
        return
    print(f"  sendable: {sendable} (signed off by {signer})")
    print("  next steps (not run):")
    onto = (f"<the branch of {stack.slug(d.direct[-1])}>" if d.direct
            else stack.base.upstream_commit.lstrip("g"))  # fmt: skip
    if branch is not None:
        print(f"    git -C {stack.checkout} push <your-fork> {branch}:{d.slug}")
    else:
        print(f"    git -C <your vLLM clone> checkout -b {d.slug} {onto} && "
              f"git -C <your vLLM clone> am -k {sendable}")  # fmt: skip
        print(f"    git -C <your vLLM clone> push <your-fork> {d.slug}")
    folder = stack.outgoing(d.slug)
    title = (
        (folder / "title.txt").read_text().strip()
        if (folder / "title.txt").is_file()
        else d.title
    )
    print(f"    gh pr create --repo vllm-project/vllm --base main --head <you>:{d.slug} "
          f"--title {shlex.quote(title)} --body-file {shlex.quote(str(folder / 'body.md'))}")  # fmt: skip


def upstream_one(stack: Stack, i: int, python: Path | None, run_tests: bool,
                 signer: Identity | None, recording: bool) -> Draft:  # fmt: skip
    """One draft. A recording run (unsigned, tests run, the pinned base) records
    its revision and writes upstream/<patch>/; any other run writes only under
    .vstack/outgoing/ and leaves upstream/ as it is."""
    d, signed = make_draft(stack, i, python, run_tests, signer)
    root = stack.project.root
    range_text, notes = None, []
    if recording:
        d.revision, range_text, meta = record_revision(stack, d)
        out, notes = write_draft(stack, d, range_text, meta)
        names = ["title.txt", "body.md", "checks.txt"]
        if range_text is not None:
            names.append(f"range-diff-v{d.revision - 1}-v{d.revision}.txt")
        written = [f"wrote {out.relative_to(root)}/{{{','.join(names)},meta.json}}"]
    elif stack.recut:
        d.revision, d.recorded = 0, False
        written = []
    else:
        d.revision, d.recorded = revision_of(stack.project, d.slug, d.mbox)
        written = []
    folder, sendable = write_outgoing(stack, d, signed, signer, recording)
    shown = sorted(p.name for p in folder.iterdir() if p.is_file())
    rel = folder.relative_to(root) if folder.is_relative_to(root) else folder
    written.append(f"wrote {rel}/{{{','.join(shown)}}}")
    if not recording and not stack.recut:
        why = "--signoff" if signer else "--no-tests"
        written.append(f"upstream/{d.slug}/ unchanged ({why}: writes only under "
                       f".vstack/outgoing/)")  # fmt: skip
    _report(stack, d, written, range_text, signer, sendable, signed, notes)
    if gitutil.is_repo(root) and recording:
        dirty = gitutil.out(root, "status", "--porcelain", "--", "patches").strip()
        if dirty:
            print("  note: commit patches/ with upstream/: a revision is regenerated from "
                  "the committed patch files it records")  # fmt: skip
    return d


def render_index(stack: Stack, drafts_: list[Draft], notes: list[str]) -> str:
    where = (f"re-cut on vLLM {stack.base.version} (commit {stack.recut})" if stack.recut
             else f"against vLLM {stack.base.version}")  # fmt: skip
    lines = [
        "# PR drafts", "",
        f"Generated by `scripts/vstack upstream --all` {where}; one folder per PR "
        "(title.txt, body.md, checks.txt, meta.json, the range-diff from the previous "
        "revision). The mboxes are not kept here: `--revision N` regenerates one from the "
        "patch files in git, `--signoff` makes the signed copy to send (.vstack/outgoing/).",
        "",
        "| # | draft | rev | non-test lines | depends on | tests on its base | checks |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for k, d in enumerate(drafts_, 1):
        deps = (
            ", ".join(
                f"#{drafts_.index(x) + 1}" for x in drafts_ if x.index in d.direct
            )
            or "stock"
        )
        tests = d.test_run.summary if d.test_run is not None else "not run"
        skipped = [c.name for c in d.checks if c.status == "SKIP"]
        status = f"{len(d.failed)} failed" if d.failed else "pass"
        status += f" ({len(skipped)} skipped: {', '.join(skipped)})" if skipped else ""
        status += "" if d.signed else ", unsigned"
        notes_d = [c.name for c in d.checks if c.status == "NOTE"]
        status += f" (note: {', '.join(notes_d)})" if notes_d else ""
        lines.append(
            f"| {k} | `{d.slug}` | {d.revision} | {d.non_test} | {deps} | {tests} | {status} |"
        )
    lines += ["", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def stale_draft_verdict(
    has_own_files: bool, tracked: list[str], changed: list[str], git_error: str | None
) -> str | None:
    """None when a draft folder no patch makes any more may be removed (vstack
    upstream wrote it and git holds every file of it as it is), else why not."""
    if not has_own_files:
        return "it holds no meta.json or issue.md: vstack upstream did not write it"
    if git_error:
        return f"git cannot tell whether it is committed ({git_error})"
    if changed:
        shown = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
        return f"it holds files not committed in git ({shown})"
    if not tracked:
        return "it is not committed in git"
    return None


def remove_stale_draft(root: Path, folder: Path) -> str:
    """Remove a draft folder the series no longer makes, only when nothing is lost;
    else keep it. The note to print either way."""
    rel = folder.relative_to(root).as_posix()
    if not any(folder.iterdir()):
        folder.rmdir()
        return f"removed upstream/{folder.name}/: empty, and no patch of the series makes it"
    status = gitutil.git(root, "status", "--porcelain", "--untracked-files=all",
                         "--ignored", "--", rel, check=False)  # fmt: skip
    tracked = gitutil.git(root, "ls-files", "--", rel, check=False)
    err = (status.stderr.strip().splitlines() or ["not a git repository"])[-1]
    why = stale_draft_verdict(
        (folder / "meta.json").is_file() or (folder / "issue.md").is_file(),
        tracked.stdout.split(),
        [ln[3:] for ln in status.stdout.splitlines()],
        err if status.returncode or tracked.returncode else None,
    )
    if why:
        return (f"kept upstream/{folder.name}/: no patch of the series makes it any "
                f"more, but {why}; remove it yourself once you no longer need it")  # fmt: skip
    fsutil.remove_tree(folder)
    return (f"removed upstream/{folder.name}/: no patch of the series makes it any "
            f"more (its files are committed: they stay in git history)")  # fmt: skip


def write_index(stack: Stack, drafts_: list[Draft], notes: list[str],
                recording: bool) -> str:  # fmt: skip
    """upstream/index.md on a recording run (kept when the user edited it: the
    new one goes beside the drafts' copies), else .vstack/outgoing/'s. The path
    written, relative to the project when inside it."""
    root = stack.project.root
    text = render_index(stack, drafts_, notes).encode()
    outgoing = stack.project.cache / OUTGOING
    name = f"index-on-{stack.recut}.md" if stack.recut else "index.md"
    path = root / "upstream" / "index.md"
    mark = outgoing / ".index.md.written"
    written = mark.read_text().split() if mark.is_file() else None
    if not recording or not (
        drafts.is_ours(root, path, written)
        or (path.is_file() and path.read_bytes() == text)
    ):
        path = outgoing / name
    else:
        fsutil.write_text(mark, " ".join([drafts.digest(text), *(written or [])][:8]))
    fsutil.write_bytes(path, text)
    return str(path.relative_to(root) if path.is_relative_to(root) else path)


def _recut_row(k: int, stack: Stack, i: int, d: Draft | None, error: str | None) -> str:
    """One PR's line of a re-cut's summary: does it apply, do its tests pass."""
    name = stack.slug(i)
    if d is None:
        return f"  {k:>2} {name}: does not apply: {error}"
    deps = ", ".join(stack.slug(j) for j in d.direct)
    applies = "applies" + (f" (on {deps})" if deps else " (on stock)")
    tests = next((c for c in d.checks if c.name == "tests"), None)
    if tests is None or tests.status == "NOTE":
        t = "no tests of its own"
    elif tests.status == "SKIP":
        t = "tests not run (--no-tests)"
    elif tests.status == "PASS":
        t = f"tests pass ({d.test_run.summary})" if d.test_run else "tests pass"
    else:
        t = f"tests FAIL ({tests.message})"
    others = [c for c in d.failed if c.name != "tests"]
    extra = f"; {len(others)} other check(s) failed" if others else ""
    return f"  {k:>2} {name}: {applies}; {t}{extra}"


def cmd_upstream(project: Project, patch_name: str | None, git_path: str | None,
                 base_rev: str | None, *, all_patches: bool = False,
                 signoff: str | None = None, revision: int | None = None,
                 run_tests: bool = True, python: str | None = None,
                 wheel_index: str | None = None) -> int:  # fmt: skip
    signer = identity.signer(signoff, project.root)
    if signer is not None and signer.given:
        print(
            f"vstack upstream: signing off as {signer} (git records {signer.given} so)"
        )
    if revision is not None:
        if not patch_name:
            raise VstackError("--revision N needs a patch")
        if base_rev or git_path:
            raise VstackError(
                f"--revision {revision} rebuilds a recorded revision on the base it "
                f"records: drop --base/--git (or leave out --revision to re-cut)"
            )
        return cmd_revision(project, patch_name, revision, signer)
    if not all_patches and not patch_name:
        raise VstackError("give a patch (a patches/series entry) or --all")
    from vstack.check import test_env_python

    if patch_name and not all_patches:  # a wrong name says so before any work
        pick_patch([p.name for p in series_paths(project.patches_dir)], patch_name)
    py = Path(python) if python else test_env_python(project)
    stack = load_stack(project, git_path, base_rev, wheel_index)
    indices = range(len(stack.names)) if all_patches else [stack.index(patch_name)]
    recording = signer is None and run_tests and stack.recut is None
    if not recording and all_patches and stack.recut is None:
        print("vstack upstream: with --signoff or --no-tests nothing in upstream/ "
              "changes: every copy goes to .vstack/outgoing/")  # fmt: skip
    made: list[Draft] = []
    rows = []
    for k, i in enumerate(indices, 1):
        if stack.recut is None:
            made.append(upstream_one(stack, i, py, run_tests, signer, recording))
            continue
        try:
            d = upstream_one(stack, i, py, run_tests, signer, recording)
        except VstackError as e:
            print(f"  does not apply: {e}")
            rows.append(_recut_row(k, stack, i, None, str(e)))
            continue
        made.append(d)
        rows.append(_recut_row(k, stack, i, d, None))
    if all_patches:
        notes = []
        if recording:
            notes = write_rfcs(stack, {d.index: d for d in made})
            keep = {d.slug for d in made} | {
                rfc_slug(doc) for doc in rfc_documents(stack)
            }
            for folder in sorted((project.root / "upstream").iterdir()):
                if folder.is_dir() and folder.name not in keep:
                    notes.append(remove_stale_draft(project.root, folder))
        where = write_index(stack, made, notes, recording)
        for n in notes:
            print(f"vstack upstream: {n}")
        print(f"vstack upstream: wrote {where}")
    failed = [d for d in made if d.failed]
    if stack.recut is not None:
        applied = len(made)
        passed = sum(1 for d in made if not d.failed)
        print(f"vstack upstream: re-cut on vLLM {stack.base.version} (commit "
              f"{stack.recut}): {applied} of {len(rows)} PR(s) apply, {passed} pass "
              f"their checks and tests there; copies in .vstack/outgoing/<patch>/"
              f"on-{stack.recut}/")  # fmt: skip
        for row in rows:
            print(row)
        return 1 if failed or applied < len(rows) else 0
    if failed:
        print(f"vstack upstream: checks failed in {', '.join(d.slug for d in failed)}")
    return 1 if failed else 0


def cmd_revision(
    project: Project, patch_name: str, n: int, signer: Identity | None
) -> int:
    names = [p.name for p in series_paths(project.patches_dir)]
    slug = patch_name.removesuffix(".patch")
    if not (project.root / "upstream" / slug / "meta.json").is_file():
        slug = pick_patch(names, patch_name).removesuffix(".patch")
    meta = load_meta(project, slug)
    rev = next((r for r in meta["revisions"] if r["revision"] == n), None)
    if rev is None:
        have = ", ".join(str(r["revision"]) for r in meta["revisions"]) or "none"
        raise VstackError(f"upstream/{slug} has no revision {n} (revisions: {have})")
    replaced: list = []
    start, tip, mbox = rebuild(project, slug, rev, signer, replaced)
    out = project.cache / OUTGOING / slug
    out.mkdir(parents=True, exist_ok=True)
    if signer is not None:
        own = gitutil.out(project.repo, "rev-list", f"{start}..{tip}").split()
        dco = dco_check(project.repo, own, "")
        if dco.status != "PASS":
            raise VstackError(f"revision {n} of {slug}, signed off by {signer}: "
                              f"the DCO check fails: {dco.message}")  # fmt: skip
    path = out / (f"v{n}.mbox" if signer else f"v{n}.unsigned.mbox")
    fsutil.write_bytes(path, mbox)
    olds = dict.fromkeys(f"{old} ({why})" for old, why, _ in replaced)
    if olds:
        print(f"  author: {signer} replaces {'; '.join(olds)}")
    how = f"signed off by {signer}" if signer else "as recorded, unsigned"
    print(f"vstack upstream: revision {n} of {slug} regenerated: {path} ({how})")
    return 0
