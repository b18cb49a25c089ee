"""vstack.pep440 (stdlib) against packaging.version on generated versions: the same
strings valid, the same normalised form, the same order; and the one rule in use by
the tool (nightly wheel choice, resolution records, lint) and by scripts/test."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest

from vstack import pep440

ROOT = Path(__file__).resolve().parents[1]
packaging_version = pytest.importorskip("packaging.version")


def _spell(rng: random.Random, words: list[str]) -> str:
    w = rng.choice(words)
    return w.upper() if rng.random() < 0.1 else w


def _sep(rng: random.Random) -> str:
    return rng.choice(["", "", ".", "-", "_"])


def _num(rng: random.Random) -> str:
    return rng.choice(["0", "1", "2", "9", "10", "01", "007", "123456789012"])


def generated_version(rng: random.Random) -> str:
    """A version spelled any way PEP 440 allows, sometimes broken on purpose."""
    parts = []
    if rng.random() < 0.1:
        parts.append(rng.choice(["v", "V", " ", "\t"]))
    if rng.random() < 0.15:
        parts.append(_num(rng) + "!")
    parts.append(".".join(_num(rng) for _ in range(rng.randint(1, 4))))
    if rng.random() < 0.4:
        label = _spell(rng, ["a", "alpha", "b", "beta", "c", "rc", "pre", "preview"])
        parts.append(
            _sep(rng) + label + (_sep(rng) + _num(rng) if rng.random() < 0.8 else "")
        )
    if rng.random() < 0.3:
        if rng.random() < 0.3:
            parts.append("-" + _num(rng))
        else:
            label = _spell(rng, ["post", "rev", "r"])
            parts.append(
                _sep(rng)
                + label
                + (_sep(rng) + _num(rng) if rng.random() < 0.8 else "")
            )
    if rng.random() < 0.35:
        parts.append(
            _sep(rng)
            + _spell(rng, ["dev"])
            + (_sep(rng) + _num(rng) if rng.random() < 0.8 else "")
        )
    if rng.random() < 0.4:
        segs = [rng.choice(["g1a2b3c4d", "cu129", "eplb", "7", "007", "ubuntu", "A", "x1", "0"])
                for _ in range(rng.randint(1, 4))]  # fmt: skip
        parts.append("+" + "".join(s + rng.choice(".-_") for s in segs[:-1]) + segs[-1])
    text = "".join(parts)
    if rng.random() < 0.15:  # a broken one: a character dropped, doubled or inserted
        i = rng.randrange(len(text) + 1)
        junk = rng.choice(
            ["", ".", "+", "-", "!", "x", "é", "..", " ", "\u212a", "ſ", "\u2003"]
        )
        text = text[:i] + junk + text[i + rng.randint(0, 1) :]
    if rng.random() < 0.05:
        text += rng.choice([" ", "\n", "\u2003", "\x1c"])
    return text


def _theirs(text: str):
    try:
        return packaging_version.Version(text)
    except packaging_version.InvalidVersion:
        return None


def test_parse_and_normalise_agree_with_packaging():
    rng = random.Random(440)
    seen = 0
    for _ in range(4000):
        text = generated_version(rng)
        ours, theirs = pep440.parse(text), _theirs(text)
        assert (ours is None) == (theirs is None), text
        if ours is not None:
            seen += 1
            assert str(ours) == str(theirs), text
            assert ours.public == theirs.public, text
    assert seen > 2000  # most generated versions are valid ones


def test_order_agrees_with_packaging():
    rng = random.Random(441)
    versions = []
    while len(versions) < 600:
        text = generated_version(rng)
        if pep440.parse(text) is not None:
            versions.append(text)
    # every pair: <, == and > as packaging has them
    ours = [pep440.Version(v) for v in versions]
    theirs = [packaging_version.Version(v) for v in versions]
    for i, j in itertools.combinations(range(len(versions)), 2):
        a, b = ours[i], ours[j]
        x, y = theirs[i], theirs[j]
        assert (a < b, a == b, a > b) == (x < y, x == y, x > y), (
            versions[i],
            versions[j],
        )
    ordered = sorted(versions, key=pep440.Version)
    assert all(
        packaging_version.Version(a) <= packaging_version.Version(b)
        for a, b in itertools.pairwise(ordered)
    )


@pytest.mark.parametrize(
    "smaller,bigger",
    [
        ("0.34.0", "0.34.1.dev12+g1a2b3c4d5"),
        ("0.34.1.dev12+g1a2b3c4d5", "0.34.1rc1"),
        ("0.34.1rc1", "0.34.1"),
        ("0.34.1", "0.34.1.post1"),
        ("1.0.dev0", "1.0a0"),
        ("1.0+abc", "1.0+7"),
        ("1.0", "1.0+anything"),
        ("0.9", "0.10"),
        ("99.0", "1!0.1"),
    ],
)
def test_known_orders(smaller, bigger):
    assert pep440.Version(smaller) < pep440.Version(bigger)
    assert packaging_version.Version(smaller) < packaging_version.Version(bigger)


def test_the_tool_uses_the_rule():
    """nightly.version_key orders local labels and pre-releases as PEP 440 does (it
    ignored the local part, and lint compared release numbers only)."""
    from vstack.lint import newer_than_pin
    from vstack.nightly import version_key

    assert version_key("1.0+7") > version_key("1.0+abc")
    assert version_key("0.34.1rc1") < version_key("0.34.1")
    assert newer_than_pin("0.34.1", "0.34.1rc1")
    assert not newer_than_pin("0.34.1rc1", "0.34.1")
    assert not newer_than_pin("0.34.0", "0.34")
    assert not newer_than_pin("not-a-version", "0.34.0")


def test_scripts_test_compares_with_the_rule():
    """scripts/test picks the resolutions/<version>/ folders newer than the pin with
    `python -m vstack.pep440` (it imported packaging from the test environment)."""
    text = (ROOT / "scripts" / "test").read_text()
    assert "packaging" not in text
    assert "vstack.pep440" in text
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "vstack.pep440"]

    def rc(*args):
        return subprocess.run([*run, *args], env=env, capture_output=True).returncode

    assert rc("0.34.1", "gt", "0.34.1rc1") == 0
    assert rc("0.34.1rc1", "gt", "0.34.1") == 1
    assert rc("0.34.1", "gt", "0.34.1.0") == 1
    assert rc("resolutions", "gt", "0.34.1") == 2
