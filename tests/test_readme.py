"""The README is the front door: short, every patch of the series named, a quick
start that ends in `docker build`, and every command it or docs/workflow.md
shows in code is one the tool accepts (verb and options, per `--help`)."""

from __future__ import annotations

import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "workflow.md"]
COMMAND = re.compile(r"(?:scripts/)?\bvstack ([a-z][a-z-]*)((?: [^`\n#|;&]*)?)")


def _code(text: str) -> list[str]:
    """The text of fenced blocks and inline code spans."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


@cache
def _help(*verb: str) -> str:
    p = subprocess.run(
        [str(ROOT / "scripts" / "vstack"), *verb, "--help"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0, (verb, p.stderr)
    return p.stdout


def _verbs() -> set[str]:
    usage = _help()
    return set(re.findall(r"^    ([a-z][a-z-]+) ", usage, flags=re.M)) | set(
        re.findall(r"^    ([a-z][a-z-]+)$", usage, flags=re.M)
    )


def test_the_readme_is_short_and_names_every_patch():
    text = README.read_text()
    assert len(text.split()) <= 2500, len(text.split())
    series = (ROOT / "patches" / "series").read_text().split("\n")
    patches = [p for p in series if p.strip() and not p.startswith("#")]
    missing = [p for p in patches if f"`{p}`" not in text]
    assert not missing, f"patches the README does not name: {missing}"


def test_the_quick_start_ends_in_the_docker_build_the_tool_prints():
    text = README.read_text()
    start = text.index("## Quick start")
    block = re.search(r"```bash\n(.*?)```", text[start:], flags=re.S)
    assert block is not None
    last = block.group(1).strip().splitlines()[-1]
    # scripts/build's last line: `vstack: next: docker build -t vllm-eplb:<tag> <dir>`
    cli = (ROOT / "src" / "vstack" / "cli.py").read_text()
    assert "next: docker build -t vllm-eplb:{tag} " in cli
    assert re.fullmatch(r"docker build -t vllm-eplb:[\w.-]+ dist/image/", last), last
    for script in ("scripts/build", "scripts/test"):
        assert script in block.group(1) and (ROOT / script).is_file()


def test_links_to_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+\.md)\)", doc.read_text()):
            assert (doc.parent / target).is_file(), (doc.name, target)


def _shown_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in DOCS:
        for code in _code(doc.read_text()):
            for verb, rest in COMMAND.findall(code):
                words = shlex.split(rest.replace("\\", " "), posix=True, comments=True)
                options = [w.split("=")[0] for w in words if w.startswith("--")]
                found.append((doc.name, verb, options))
    return found


def test_the_docs_show_only_verbs_and_options_the_tool_accepts():
    shown = _shown_commands()
    assert len(shown) > 20  # the extraction works
    verbs = _verbs()
    assert {"apply", "export", "rebase", "upstream", "build"} <= verbs
    wrong = []
    for doc, verb, options in shown:
        if verb not in verbs:
            wrong.append(f"{doc}: vstack {verb}: no such verb")
            continue
        usage = _help(verb)
        wrong += [f"{doc}: vstack {verb} {o}: not in its --help" for o in options
                  if o not in usage]  # fmt: skip
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("script", ["build", "test", "drift", "gpu-check"])
def test_the_scripts_the_readme_relies_on_exist(script):
    path = ROOT / "scripts" / script
    assert path.is_file() and path.stat().st_mode & 0o111, path
