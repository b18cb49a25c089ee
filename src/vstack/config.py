"""The project layout and the pin in stack.toml."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path

from vstack.errors import VstackError

STACK_TOML = "stack.toml"


@dataclasses.dataclass(frozen=True)
class Pin:
    version: str
    commit: str  # as vllm/_version.py reports it, e.g. "g4ba787ec9"
    wheel: str
    sha256: str
    image: str
    image_digest: str = ""

    @property
    def short_hash(self) -> str:
        """The git hash part of `commit` ("g4ba787ec9" -> "4ba787ec9")."""
        c = self.commit
        return c[1:] if re.fullmatch(r"g[0-9a-f]{7,40}", c) else c

    @property
    def image_ref(self) -> str:
        return f"{self.image}@{self.image_digest}" if self.image_digest else self.image


@dataclasses.dataclass(frozen=True)
class Project:
    root: Path
    pin: Pin
    label: str
    # [base] wheel_index / wheel_variant: vLLM's per-commit wheel repository and the
    # build variant folder in it ("" = the default build); see vstack.nightly.
    wheel_index: str = ""
    wheel_variant: str = ""

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def cache(self) -> Path:
        return self.root / ".vstack"

    @property
    def repo(self) -> Path:
        """The git repository holding base commits and the work branch."""
        return self.cache / "repo"

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def submodule(self) -> Path:
        return self.root / "vllm"

    @property
    def wheel_cache(self) -> Path:
        env = os.environ.get("VSTACK_WHEEL_CACHE")
        if env:
            return Path(env)
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(xdg) / "vstack" / "wheels"


# wheel and sha256 may be empty for a base taken from a git checkout (a nightly);
# `vstack build` then says that it needs a wheel.
_REQUIRED = ("version", "commit", "image")


_STRING_KEYS = {
    "stack": ("label",),
    "base": ("version", "commit", "wheel", "sha256", "image", "image_digest",
             "wheel_index", "wheel_variant"),
}  # fmt: skip


def wrong_type(data: dict) -> str | None:
    """The first table or key of a parsed stack.toml that has the wrong type, as
    "[table] key is a <type>, not a string", or None."""
    for table, keys in _STRING_KEYS.items():
        t = data.get(table)
        if t is None:
            continue
        if not isinstance(t, dict):
            return f"[{table}] is a {type(t).__name__}, not a table"
        for key in keys:
            if key in t and not isinstance(t[key], str):
                return (
                    f"[{table}] {key} is a {type(t[key]).__name__}, not a string "
                    f'(put the value in double quotes: {key} = "...")'
                )
    return None


def parse_pin(data: dict, where: str) -> Pin:
    base = data.get("base")
    if not isinstance(base, dict):
        raise VstackError(f"{where}: missing [base] table")
    bad = wrong_type(data)
    if bad:
        raise VstackError(f"{where}: {bad}")
    missing = [k for k in _REQUIRED if not base.get(k)]
    if missing:
        raise VstackError(f"{where}: [base] lacks {', '.join(missing)}")
    if base.get("wheel") and not re.fullmatch(r"[0-9a-f]{64}", base.get("sha256", "")):
        raise VstackError(f"{where}: [base] sha256 is not 64 lowercase hex digits")
    if "@" in base["image"] or re.search(r"\s", base["image"]):
        # FROM {image}@{image_digest}: a digest in image too would make it invalid
        raise VstackError(
            f"{where}: [base] image must be a name and tag without spaces or a "
            f"digest (vllm/vllm-openai:v0.34.0); put the digest in image_digest"
        )
    digest = base.get("image_digest", "")
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise VstackError(
            f'{where}: [base] image_digest is not "sha256:" and 64 lowercase hex '
            f'digits (or "" to follow the image tag)'
        )
    return Pin(
        version=base["version"],
        commit=base["commit"],
        wheel=base.get("wheel", ""),
        sha256=base.get("sha256", ""),
        image=base["image"],
        image_digest=base.get("image_digest", ""),
    )


def find_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / STACK_TOML).is_file():
            return d
    raise VstackError(f"no {STACK_TOML} found in {here} or its parents (use --root)")


def load_project(root: Path | None = None) -> Project:
    root = find_root(root)
    path = root / STACK_TOML
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise VstackError(
            f"{path}: line {line} is not UTF-8 (byte {e.object[e.start]:#04x}); "
            f"TOML files are UTF-8: save it so"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise VstackError(f"{path}: {e}") from None
    except OSError as e:
        raise VstackError(f"cannot read {path}: {e.strerror or e}") from None
    bad = wrong_type(data)
    if bad:
        raise VstackError(f"{path}: {bad}")
    label = data.get("stack", {}).get("label", "stack")
    if not re.fullmatch(r"[a-z][a-z0-9]*", label):
        raise VstackError(f"{path}: [stack] label must be lowercase alphanumeric")
    base = data.get("base") if isinstance(data.get("base"), dict) else {}
    return Project(
        root=root, pin=parse_pin(data, str(path)), label=label,
        wheel_index=base.get("wheel_index", ""),
        wheel_variant=base.get("wheel_variant", ""),
    )  # fmt: skip


_KEY_LINE = re.compile(
    r"(?P<indent>[ \t]*)(?P<q>[\"']?)(?P<key>[A-Za-z0-9_-]+)(?P=q)(?P<eq>[ \t]*=[ \t]*)"
    r"(?P<value>.*?)(?P<eol>\r?\n?)$"
)


def toml_string(value: str) -> str:
    """value as a TOML basic string."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _string_end(text: str) -> int | None:
    """Where the one-line TOML string at the start of text ends (the index after its
    closing quote), or None when text does not start with one."""
    if text.startswith(('"""', "'''")):
        return None  # a multi-line string: not rewritten in place
    if text.startswith("'"):
        end = text.find("'", 1)
        return end + 1 if end > 0 else None
    if text.startswith('"'):
        i = 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
            elif text[i] == '"':
                return i + 1
            else:
                i += 1
    return None


def render_stack_toml(old_text: str, pin: Pin) -> str:
    """old_text with the [base] values replaced by pin's: comments (also those after a
    value on its line), quoting of keys, order and line ends kept. A [base] key the
    file lacks is added after the table's last key."""
    values = dataclasses.asdict(pin)
    lines = old_text.splitlines(keepends=True)
    section = None
    seen: set[str] = set()
    result: list[str] = []
    last_base_key = None  # index in result of [base]'s last key line
    for line in lines:
        header = re.match(r"[ \t]*\[([^\[\]]+)\][ \t]*(#.*)?\r?\n?$", line)
        if header:
            section = header.group(1).strip().strip("\"'")
        kv = _KEY_LINE.match(line) if not header else None
        if section == "base" and kv:
            last_base_key = len(result)
        if section == "base" and kv and kv["key"] in values:
            key, value = kv["key"], kv["value"]
            end = _string_end(value)
            if end is None:
                raise VstackError(
                    f"{STACK_TOML}: [base] {key} is not a one-line string; write it "
                    f'as {key} = "..." (a comment may follow)'
                )
            line = (
                f"{kv['indent']}{kv['q']}{key}{kv['q']}{kv['eq']}"
                f"{toml_string(values[key])}{value[end:]}{kv['eol']}"
            )
            seen.add(key)
        result.append(line)
    missing = [k for k in values if k not in seen]
    if missing and last_base_key is None:
        raise VstackError(f"{STACK_TOML}: no [base] table with keys to update")
    if missing:
        at = last_base_key
        eol = "\r\n" if result[at].endswith("\r\n") else "\n"
        if not result[at].endswith("\n"):
            result[at] += eol
        added = [f"{k} = {toml_string(values[k])}{eol}" for k in missing]
        result[at + 1 : at + 1] = added
    return "".join(result)
