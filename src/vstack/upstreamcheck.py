"""vstack upstream --check: upstream/ records what patches/ and the pin hold now.

Every draft's meta.json records, for its latest revision, the pin it was made on
and the git blob of every patch file it was made from (the patch itself and the
PRs it depends on). A draft is stale when one of those blobs is not the blob of
patches/<name> today, when the pin changed, or when its patch left the series;
upstream/index.md is stale when a row does not say what the drafts' records say;
an RFC issue draft is stale when its document or the PRs implementing it changed.
Nothing is built or run: git hash-object and the files under upstream/ are all
it reads, so it runs on a bare machine in a second (CI's .ci/run calls it).

A patch newly inserted before a draft that the draft would now need (an inferred
dependency, no `Depends-On:`) changes no recorded blob: a recording run finds it.
"""

from __future__ import annotations

import re
from pathlib import Path

from vstack import gitutil
from vstack.config import Project
from vstack.errors import VstackError
from vstack.series import parse_patch, series_paths

FIX_ALL = "scripts/vstack upstream --all"


def blobs_of(root: Path, paths: list[Path]) -> dict[str, str]:
    """{file name: git blob id} of the patch files, as `vstack upstream` records
    them (git hash-object, without writing)."""
    if not paths:
        return {}
    ids = gitutil.out(root, "hash-object", "--", *map(str, paths)).split()
    return {p.name: b for p, b in zip(paths, ids, strict=True)}


def draft_problem(
    slug: str, meta: dict, blobs: dict[str, str], pin: dict, checks_head: str | None
) -> str | None:
    """Why upstream/<slug>/ is not what a recording run would record now, or None.
    `blobs`: {patch file name in patches/series: its blob}; `pin`: the pin as a
    revision records it; `checks_head`: the first line of its checks.txt."""
    revs = meta.get("revisions") or []
    if not revs:
        return "meta.json records no revision"
    rev = revs[-1]
    n = rev["revision"]
    if "patches" not in rev:
        return f"revision {n} records no patch files (an older vstack wrote it)"
    if rev.get("pin") != pin:
        was = (rev.get("pin") or {}).get("version", "?")
        return (f"revision {n} was made on vLLM {was} ({(rev.get('pin') or {}).get('wheel')}), "
                f"the pin is now {pin['version']} ({pin['wheel']})")  # fmt: skip
    own = f"{slug}.patch"
    made = rev["patches"]
    if not made or made[-1].get("name") != own:
        last = made[-1].get("name") if made else "nothing"
        return f"revision {n} records {last} as its patch, not {own}"
    for p in [made[-1], *made[:-1]]:  # its own patch first
        name, blob = p.get("name"), p.get("blob", "")
        what = "" if name == own else " (a patch it depends on)"
        if name not in blobs:
            return (f"revision {n} was made with patches/{name}{what}, which is no "
                    f"longer in patches/series")  # fmt: skip
        if blobs[name] != blob:
            return (f"revision {n} was made from another version of patches/{name}"
                    f"{what} (blob {blob[:12]}, now {blobs[name][:12]})")  # fmt: skip
    if checks_head is not None:
        m = re.match(rf"^draft {re.escape(slug)} v(\d+):", checks_head)
        if not m or int(m.group(1)) != n:
            return f"checks.txt is not revision {n}'s (its first line: {checks_head[:60]!r})"
    return None


def index_rows(text: str) -> list[list[str]]:
    """The table rows of upstream/index.md, cells stripped (header rows left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or not line.rstrip().endswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].isdigit():
            rows.append(cells)
    return rows


def index_problems(text: str, expected: list[dict]) -> list[str]:
    """What upstream/index.md says differently from the drafts' records. expected:
    one dict per draft in series order: slug, rev, non_test, deps, tests (None
    when unknown)."""
    rows = index_rows(text)
    slugs = [r[1].strip("`") if len(r) > 1 else "" for r in rows]
    want = [e["slug"] for e in expected]
    if slugs != want:
        missing = [s for s in want if s not in slugs]
        extra = [s for s in slugs if s not in want]
        what = (f"lacks {', '.join(missing)}" if missing else
                f"lists {', '.join(extra)}, which no patch of the series makes"
                if extra else "lists the drafts in another order than patches/series")  # fmt: skip
        return [f"upstream/index.md {what}"]
    found = []
    for k, (row, e) in enumerate(zip(rows, expected, strict=True), 1):
        if len(row) < 7:
            found.append(
                f"upstream/index.md row {k} ({e['slug']}) is not a draft's row"
            )
            continue
        said = {"rev": row[2], "non-test lines": row[3], "depends on": row[4],
                "tests": row[5]}  # fmt: skip
        true = {"rev": str(e["rev"]), "non-test lines": e["non_test"],
                "depends on": e["deps"], "tests": e["tests"]}  # fmt: skip
        diff = [f"{key} {said[key]!r}, its draft says {true[key]!r}"
                for key in said if true[key] is not None and said[key] != true[key]]  # fmt: skip
        if diff:
            found.append(f"upstream/index.md row {k} ({e['slug']}): {'; '.join(diff)}")
    return found


def _checks_facts(text: str) -> tuple[str | None, str | None]:
    """(lines changed outside tests, the tests summary) as a checks.txt states them."""
    m = re.search(r"^lines changed outside tests: (\d+)$", text, re.M)
    t = re.search(r"^PASS +\[tests\] (.+?) on .+ \+ this PR", text, re.M)
    tests = t.group(1) if t else None
    if tests is None and re.search(r"^(SKIP|NOTE) +\[tests\]", text, re.M):
        tests = "not run"
    return (m.group(1) if m else None), tests


def check(project: Project) -> tuple[list[str], int]:
    """(one line per stale draft, index or RFC draft, the number of drafts checked)."""
    from vstack.upstream import (
        _pin_record,
        parse_meta,
        render_rfc,
        rfc_docs,
        rfc_slug,
    )

    root, up = project.root, project.root / "upstream"
    paths = series_paths(project.patches_dir)
    names = [p.name for p in paths]
    blobs = blobs_of(root, paths)
    pin = _pin_record(project.pin)
    found: list[str] = []
    expected: list[dict] = []
    metas: dict[str, dict] = {}
    for name in names:
        slug = name.removesuffix(".patch")
        folder = up / slug
        fix = f"`scripts/vstack upstream {slug}` re-records it (runs its tests)"
        if not (folder / "meta.json").is_file():
            found.append(f"upstream/{slug}/: no draft recorded: `scripts/vstack "
                         f"upstream {slug}` records it (runs its tests)")  # fmt: skip
            expected.append({"slug": slug, "rev": None, "non_test": None,
                             "deps": None, "tests": None})  # fmt: skip
            continue
        try:
            meta = parse_meta((folder / "meta.json").read_bytes(), folder / "meta.json")
        except VstackError as e:
            found.append(f"upstream/{slug}/: {e}")
            expected.append({"slug": slug, "rev": None, "non_test": None,
                             "deps": None, "tests": None})  # fmt: skip
            continue
        metas[slug] = meta
        checks = folder / "checks.txt"
        text = checks.read_text(errors="replace") if checks.is_file() else ""
        why = draft_problem(slug, meta, blobs, pin,
                            text.splitlines()[0] if text else None)  # fmt: skip
        if why:
            found.append(f"upstream/{slug}/: stale: {why}: {fix}")
        rev = (meta.get("revisions") or [{}])[-1]
        deps = [d.removesuffix(".patch") for d in rev.get("depends_on", [])]
        slugs = [n.removesuffix(".patch") for n in names]
        non_test, tests = _checks_facts(text)
        expected.append({
            "slug": slug, "rev": rev.get("revision"), "non_test": non_test,
            "deps": ", ".join(f"#{slugs.index(d) + 1}" for d in deps if d in slugs) or "stock",
            "tests": tests,
        })  # fmt: skip
    # RFC issue drafts: from their document and the PRs that name it
    infos = {p.name: parse_patch(p.read_text(errors="replace")) for p in paths}
    docs = rfc_docs(root, [infos[n] for n in names])
    for doc in docs:
        slug = rfc_slug(doc)
        folder = up / slug
        if not (root / doc).is_file():
            continue  # `upstream --all` writes none until the document exists
        prs = []
        for name in names:
            if (infos[name].trailers.get("RFC") or [""])[0].strip() != doc:
                continue
            s = name.removesuffix(".patch")
            rev = ((metas.get(s) or {}).get("revisions") or [{}])[-1]
            deps = [d.removesuffix(".patch") for d in rev.get("depends_on", [])]
            prs.append((s, infos[name].subject, deps))
        title, body = render_rfc(doc, (root / doc).read_text(), prs)
        have = [(folder / f).read_text(errors="replace") if (folder / f).is_file() else None
                for f in ("title.txt", "issue.md")]  # fmt: skip
        if have != [title + "\n", body]:
            found.append(f"upstream/{slug}/: stale: the RFC issue draft is not what "
                         f"{doc} and the PRs naming it make now: `{FIX_ALL}` rewrites "
                         f"it")  # fmt: skip
    # folders no patch or document makes any more
    keep = {n.removesuffix(".patch") for n in names} | {rfc_slug(d) for d in docs}
    if up.is_dir():
        for folder in sorted(p for p in up.iterdir() if p.is_dir()):
            own = (folder / "meta.json").is_file() or (folder / "issue.md").is_file()
            if folder.name not in keep and own:
                found.append(f"upstream/{folder.name}/: stale: no patch of "
                             f"patches/series makes it any more: `{FIX_ALL}` removes it "
                             f"(when committed), or `git rm -r upstream/{folder.name}`")  # fmt: skip
    index = up / "index.md"
    if not index.is_file():
        found.append(f"upstream/index.md: missing: `{FIX_ALL}` writes it")
    else:
        found += [f"{p}: `{FIX_ALL}` rewrites it"
                  for p in index_problems(index.read_text(errors="replace"), expected)]  # fmt: skip
    return found, len(metas)


def cmd_check(project: Project) -> int:
    if not project.patches_dir.is_dir():
        raise VstackError(f"{project.patches_dir} does not exist")
    if not (project.root / "upstream").is_dir():
        print("vstack upstream --check: no upstream/ folder: no draft recorded, none "
              "stale (`scripts/vstack upstream --all` records them)")  # fmt: skip
        return 0
    found, n = check(project)
    for line in found:
        print(line)
    if found:
        print(f"vstack upstream --check: {len(found)} stale record(s) in upstream/; "
              f"`{FIX_ALL}` re-records every draft and index.md (runs each PR's "
              f"tests), then commit upstream/")  # fmt: skip
        return 1
    print(f"vstack upstream --check: upstream/ matches patches/ and the pin "
          f"({n} draft(s), index.md)")  # fmt: skip
    return 0
