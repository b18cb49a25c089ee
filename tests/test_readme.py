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


def test_the_readme_quotes_the_build_s_tag_as_the_tool_prints_it():
    """The README quotes the tag `scripts/build` prints (<version>-eplb.g<hash>,
    the pinned version) next to the short tag of the quick start."""
    import tomllib

    text = README.read_text()
    version = tomllib.loads((ROOT / "stack.toml").read_text())["base"]["version"]
    quoted = re.search(
        r"`vstack: next: docker build -t vllm-eplb:(\S+) dist/image/`", text
    )
    assert quoted is not None
    assert quoted.group(1) == f"{version}-eplb.g<hash>", quoted.group(1)
    cli = (ROOT / "src" / "vstack" / "cli.py").read_text()
    assert 'tag = info["version"].replace("+", "-")' in cli
    assert "next: docker build -t vllm-eplb:{tag} " in cli


def test_the_readme_s_signing_example_signs_and_its_placeholders_are_refused():
    """The README's sign-off example is an identity --signoff takes; every
    placeholder it says is refused is refused; its next step is the `git am -k`
    the tool prints."""
    from vstack.errors import VstackError
    from vstack.identity import checked, parse, refusal

    text = README.read_text()
    section = text[text.index("## Sending a patch upstream") :]
    example = re.search(r'--signoff "([^"]+)"', section).group(1)
    assert checked(example, "--signoff").email == parse(example).email
    for refused in ("Jane Doe <jane@example.com>", "Your Name <jane@acme.ai>",
                    "Jane Doe <you@domain>", "Jane Doe <root@acme.ai>",
                    "Jane Doe <noreply@acme.ai>",
                    "ubuntu <ubuntu@ip-10-0-0-1.ec2.internal>", "Jane Doe <jd@mbp.local>"):  # fmt: skip
        with pytest.raises(VstackError):
            checked(refused, "--signoff")
        assert refusal(parse(refused)), refused
    for shown in ("example.com", "Your Name", "you@domain", "root@", "noreply",
                  "ubuntu@ip-10-0-0-1.ec2.internal", "*.local", "git am -k <mbox>"):  # fmt: skip
        assert shown in section, shown
    src = (ROOT / "src" / "vstack" / "upstream.py").read_text()
    assert "am -k {sendable}" in src


def test_the_docs_say_whether_the_vllm_gitlink_is_committed():
    """README and docs/workflow.md claimed a committed vllm/ gitlink that the tree
    did not hold; they must say what `git ls-files` and `vstack pin` show."""
    staged = subprocess.run(["git", "ls-files", "-s", "--", "vllm"], cwd=ROOT,
                            capture_output=True, text=True).stdout  # fmt: skip
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    readme, workflow = README.read_text(), (ROOT / "docs" / "workflow.md").read_text()
    pin = (ROOT / "src" / "vstack" / "pin.py").read_text()
    if staged.startswith("160000"):
        assert "no gitlink is committed" not in readme + workflow
    else:
        assert "no gitlink is committed yet" in readme
        assert "**no gitlink is committed yet**" in workflow
        assert "`git submodule update --init` does nothing" in readme + workflow
        assert '"none (`vstack pin --submodule` writes it)"' in pin
        assert "`gitlink  none`" in workflow
    assert "(README: the vllm/ submodule)" not in workflow
