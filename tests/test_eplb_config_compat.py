"""The series' `--eplb-config` surface stays compatible with the pinned vLLM:
moving between the patched image and stock vLLM changes no flag the two have in
common, and every key only the stack has is listed (with its default) in
README.md, so users know what to remove for stock vLLM."""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import pytest
from vstack_testlib import Stack, git

from vstack.config import load_project

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = "vllm/config/parallel.py"
pytestmark = pytest.mark.real_wheel


def _default(value: ast.expr | None):
    """The default of a dataclass field: `x = 1` or `x = Field(default=1, ...)`."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Field":
        value = next(k.value for k in value.keywords if k.arg == "default")
    return ast.literal_eval(value) if value is not None else None


def eplb_surface(src: str) -> dict[str, tuple[str, frozenset | None, object]]:
    """EPLBConfig's fields: annotation, the values of the Literal types it
    names (None when it names none), default."""
    tree = ast.parse(src)
    literals: dict[str, set] = {}
    for node in tree.body:
        value = getattr(node, "value", None)
        if (
            isinstance(node, ast.Assign)
            and isinstance(value, ast.Subscript)
            and getattr(value.value, "id", "") == "Literal"
        ):
            elts = (
                value.slice.elts
                if isinstance(value.slice, ast.Tuple)
                else [value.slice]
            )
            literals[node.targets[0].id] = {ast.literal_eval(e) for e in elts}
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EPLBConfig"
    )
    fields = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
            values = set().union(*(literals[n] for n in names if n in literals))
            fields[node.target.id] = (
                ast.unparse(node.annotation),
                frozenset(values) if names & literals.keys() else None,
                _default(node.value),
            )
    return fields


def readme_stack_only_keys() -> dict[str, object]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## `--eplb-config` compared with stock vLLM", 1)[1]
    section = section.split("\n## ", 1)[0]
    keys = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            keys[cells[0].strip("`")] = json.loads(cells[1].strip("`"))
    return keys


def _wheel_file(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode()


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    """EPLBConfig of the applied series and of the pinned stock wheel."""
    real = load_project(ROOT)
    root = tmp_path_factory.mktemp("compat")
    (root / "stack.toml").write_bytes((ROOT / "stack.toml").read_bytes())
    (root / "patches").mkdir()
    for f in (ROOT / "patches").iterdir():
        (root / "patches" / f.name).write_bytes(f.read_bytes())
    (root / ".gitignore").write_text("/.vstack/\n")
    git(root, "init", "-q")
    s = Stack(root, real.wheel_cache, real.wheel_cache / real.pin.wheel)
    assert s.run("apply") == 0
    ours = eplb_surface((s.repo / PARALLEL).read_text())
    base = eplb_surface(_wheel_file(s.wheel, PARALLEL))
    return ours, base


def test_every_communicator_value_is_one_stock_vllm_accepts(surfaces):
    ours, base = surfaces
    assert "symm_mem" in ours["communicator"][1]
    assert ours["communicator"][1] <= base["communicator"][1], (
        ours["communicator"][1] - base["communicator"][1]
    )


def test_keys_the_series_adds_are_listed_in_readme(surfaces):
    ours, base = surfaces
    for key in set(ours) & set(base):
        # Same key on both sides: the same type and accepted values.
        assert ours[key][:2] == base[key][:2], (key, ours[key], base[key])
    added = {k: v for k, v in ours.items() if k not in base}
    assert added, "the series adds EPLBConfig keys; the parser found none"
    listed = readme_stack_only_keys()
    assert set(listed) == set(added), (
        "README.md's stack-only key table is out of date",
        sorted(listed),
        sorted(added),
    )
    for key, default in listed.items():
        assert added[key][2] == default, (key, added[key][2], default)
