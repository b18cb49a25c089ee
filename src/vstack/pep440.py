"""PEP 440 versions in the standard library: parsing, the normalised form and the
order, as `packaging.version.Version` has them (tests/test_pep440.py checks that on
generated versions). The tool and scripts/test compare versions with this one rule;
the tool's core needs no third-party package.
"""

from __future__ import annotations

import functools
import re
import sys

# PEP 440, appendix B (the permissive form: any spelling PEP 440 normalises).
_PATTERN = re.compile(
    r"""
    v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>
        [-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?
    )?
    (?P<post>
        (?:-(?P<post_n1>[0-9]+))
        |
        (?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)
    )?
    (?P<dev>
        [-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?
    )?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    """,
    re.VERBOSE | re.IGNORECASE,
)
_PRE_SPELLING = {"alpha": "a", "beta": "b", "c": "rc", "pre": "rc", "preview": "rc"}


class InvalidVersion(ValueError):
    pass


@functools.total_ordering
class _Low:
    """Sorts below everything else (and equals only itself)."""

    def __eq__(self, other):
        return isinstance(other, _Low)

    def __lt__(self, other):
        return not isinstance(other, _Low)

    def __hash__(self):
        return 0

    def __repr__(self):
        return "LOW"


@functools.total_ordering
class _High:
    """Sorts above everything else (and equals only itself)."""

    def __eq__(self, other):
        return isinstance(other, _High)

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return not isinstance(other, _High)

    def __hash__(self):
        return 1

    def __repr__(self):
        return "HIGH"


LOW, HIGH = _Low(), _High()


@functools.total_ordering
class Version:
    """A PEP 440 version: Version("0.34.1.dev12+g1a2b3c4d5") < Version("0.34.1rc1").
    Raises InvalidVersion for a string PEP 440 does not define."""

    __slots__ = ("epoch", "release", "pre", "post", "dev", "local", "_key")

    def __init__(self, text: str):
        # Surrounding whitespace is allowed; the version itself is ASCII (else
        # IGNORECASE would let the Kelvin sign stand for k, the long s for s).
        core = text.strip()
        m = _PATTERN.fullmatch(core) if core.isascii() else None
        if not m:
            raise InvalidVersion(f"not a PEP 440 version: {text!r}")
        self.epoch = int(m["epoch"] or 0)
        self.release = tuple(int(x) for x in m["release"].split("."))
        self.pre = None
        if m["pre_l"]:
            letter = m["pre_l"].lower()
            self.pre = (_PRE_SPELLING.get(letter, letter), int(m["pre_n"] or 0))
        self.post = None
        if m["post"]:
            self.post = int(m["post_n1"] or m["post_n2"] or 0)
        self.dev = int(m["dev_n"] or 0) if m["dev"] else None
        self.local = None
        if m["local"]:
            self.local = tuple(
                int(p) if p.isdigit() else p.lower()
                for p in re.split(r"[-_.]", m["local"])
            )
        self._key = _sort_key(self)

    @property
    def public(self) -> str:
        return str(self).split("+", 1)[0]

    def __str__(self) -> str:
        out = f"{self.epoch}!" if self.epoch else ""
        out += ".".join(str(x) for x in self.release)
        if self.pre is not None:
            out += f"{self.pre[0]}{self.pre[1]}"
        if self.post is not None:
            out += f".post{self.post}"
        if self.dev is not None:
            out += f".dev{self.dev}"
        if self.local is not None:
            out += "+" + ".".join(str(x) for x in self.local)
        return out

    def __repr__(self) -> str:
        return f"<Version {str(self)!r}>"

    def key(self) -> tuple:
        return self._key

    def __eq__(self, other):
        return isinstance(other, Version) and self._key == other._key

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key < other._key

    def __hash__(self):
        return hash(self._key)


def _sort_key(v: Version) -> tuple:
    release = list(v.release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()  # 1.0.0 == 1.0 == 1
    if v.pre is None and v.post is None and v.dev is not None:
        pre = LOW  # 1.0.dev0 sorts before 1.0a0
    elif v.pre is None:
        pre = HIGH  # a final (or post) release sorts after its pre-releases
    else:
        pre = v.pre  # ("a", n) < ("b", n) < ("rc", n)
    post = LOW if v.post is None else v.post
    dev = HIGH if v.dev is None else v.dev
    if v.local is None:
        local = LOW
    else:
        # numeric segments sort above alphanumeric ones, and among themselves by value
        local = tuple((x, "") if isinstance(x, int) else (LOW, x) for x in v.local)
    return (v.epoch, tuple(release), pre, post, dev, local)


def parse(text: str) -> Version | None:
    """The version, or None when `text` is not a PEP 440 version."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _main(argv: list[str]) -> int:
    """python -m vstack.pep440 A OP B: exit 0 when the comparison holds (OP one of
    lt le eq ne ge gt), 1 when not, 2 when A or B is not a version."""
    ops = {"lt": "__lt__", "le": "__le__", "eq": "__eq__", "ne": "__ne__",
           "ge": "__ge__", "gt": "__gt__"}  # fmt: skip
    if len(argv) != 3 or argv[1] not in ops:
        print("usage: python -m vstack.pep440 VERSION {lt,le,eq,ne,ge,gt} VERSION",
              file=sys.stderr)  # fmt: skip
        return 2
    a, b = parse(argv[0]), parse(argv[2])
    bad = [x for x, v in ((argv[0], a), (argv[2], b)) if v is None]
    if bad:
        print(f"vstack: error: not a PEP 440 version: {bad[0]!r}", file=sys.stderr)
        return 2
    return 0 if getattr(a, ops[argv[1]])(b) else 1


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
