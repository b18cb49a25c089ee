"""stack.toml rewriting (vstack rebase re-pins [base]): comments stay, also the ones
after a pinned value on its line; generated files are read back with tomllib."""

from __future__ import annotations

import dataclasses
import random
import tomllib

import pytest
from vstack_testlib import git, make_two_wheels
from vstack_testlib import numbered_lines as _lines

from vstack.config import Pin, render_stack_toml
from vstack.errors import VstackError

KEYS = ("version", "commit", "wheel", "sha256", "image", "image_digest")
AWKWARD = ['"', "\\", "#", "'", "é", " ", "\t", "=", "]"]


def _text(rng: random.Random) -> str:
    return "".join(
        rng.choice([*"abc019.+-", *AWKWARD]) for _ in range(rng.randint(0, 12))
    )


def _basic(value: str) -> str:
    return (
        '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'
    )


def _generated_toml(rng: random.Random, eol: str) -> tuple[str, list[str]]:
    """A stack.toml spelled in ways TOML allows, and the comments it holds."""
    comments, lines = [], []

    def comment() -> str:
        c = "# " + _text(rng).replace("\n", "")
        comments.append(c)
        return c

    lines.append(comment())
    header = rng.choice(["[base]", "[ base ]", '["base"]', "[base]  "])
    lines.append(header + (comment() if header.endswith(" ") else ""))
    keys = list(KEYS)
    rng.shuffle(keys)
    if rng.random() < 0.3:
        keys.remove("image_digest")  # optional: the writer adds it
    for key in keys:
        if rng.random() < 0.3:
            lines.append(comment())
        old = _text(rng).replace("'", "").replace("\n", "")
        value = f"'{old}'" if rng.random() < 0.3 else _basic(old)
        name = rng.choice([key, key, f'"{key}"'])
        sep = rng.choice(["=", " = ", "\t=  "])
        tail = rng.choice(["", "", "  ", " ", "\t"])
        tail += comment() if tail in ("  ", " ") else ""
        lines.append(f"{rng.choice(['', '  '])}{name}{sep}{value}{tail}")
        if rng.random() < 0.2 and not any(ln.startswith("wheel_index") for ln in lines):
            lines.append(
                f'wheel_index = "https://x/#{_text(rng).count("#")}"  ' + comment()
            )
    lines += ["", "[stack]", f'label = "eplb"  {comment()}', ""]
    return eol.join(lines), comments


def _pin(rng: random.Random) -> Pin:
    return Pin(*(_text(rng) for _ in KEYS))


def test_rewrite_keeps_comments_and_reads_back():
    rng = random.Random(29)
    for _ in range(300):
        eol = rng.choice(["\n", "\r\n"])
        old, comments = _generated_toml(rng, eol)
        tomllib.loads(old)  # the generator writes valid TOML
        pin = _pin(rng)
        new = render_stack_toml(old, pin)
        data = tomllib.loads(new)
        assert {k: data["base"][k] for k in KEYS} == dataclasses.asdict(pin), new
        assert data["stack"] == {"label": "eplb"}
        for c in comments:
            assert c in new, (c, new)
        assert render_stack_toml(new, pin) == new
        # only the pinned keys' lines changed, plus an added one
        assert len(new.split(eol)) - len(old.split(eol)) in (0, 1)
        assert new.count("\n") == new.count(eol)  # the file's line ends throughout


def test_a_comment_after_a_pinned_value_stays():
    old = (
        "[base]\n"
        'version = "0.34.0"   # the release we pin\n'
        'commit = "g62d4bc3c7"\n'
        'wheel = "w.whl"\n'
        'sha256 = "' + "a" * 64 + '"\n'
        "image = 'vllm/vllm-openai:v0.34.0' # tag\n"
        'image_digest = ""  # set it: "sha256:..."\n'
    )
    pin = Pin("0.35.0", "gabc", "v.whl", "b" * 64, "vllm/vllm-openai:v0.35.0", "")
    new = render_stack_toml(old, pin)
    assert 'version = "0.35.0"   # the release we pin\n' in new
    assert 'image = "vllm/vllm-openai:v0.35.0" # tag\n' in new
    assert 'image_digest = ""  # set it: "sha256:..."\n' in new


def test_a_missing_optional_key_is_added_and_a_multiline_value_refused():
    old = '[base]\nversion = "1"\ncommit = "g1"\nwheel = ""\nsha256 = ""\nimage = "i"\n\n[stack]\n'
    new = render_stack_toml(old, Pin("2", "g2", "", "", "j", "sha256:" + "c" * 64))
    assert tomllib.loads(new)["base"]["image_digest"] == "sha256:" + "c" * 64
    assert new.index("image_digest") < new.index("[stack]")
    with pytest.raises(VstackError, match="image is not a one-line string"):
        render_stack_toml(old.replace('image = "i"', 'image = """i"""'), Pin(*"abcdef"))


def test_rebase_keeps_the_comments_of_stack_toml(stack, capsys):
    toml = stack.root / "stack.toml"
    text = toml.read_text()
    text = text.replace(
        'version = "1.0.0"', 'version = "1.0.0"  # bump with vstack rebase'
    )
    text = text.replace('image_digest = ""', 'image_digest = ""  # pin me')
    toml.write_text(text)
    new = make_two_wheels(stack)
    assert stack.run("rebase", "--onto", str(new)) == 1  # c.py conflicts
    (stack.repo / "vllm/c.py").write_text(_lines({20: "line 20 upstream and ours"}))
    assert stack.run("rebase", "--continue") == 0
    after = toml.read_text()
    assert 'version = "1.1.0"  # bump with vstack rebase\n' in after
    assert 'image_digest = ""  # pin me\n' in after
    assert git(stack.root, "status", "--porcelain", "stack.toml").strip()
