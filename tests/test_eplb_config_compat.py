"""The series' `--eplb-config` surface stays compatible with vLLM 0.34.0: moving
from the patched 0.33.0 image to 0.34.0 changes no flag the two have in common,
and every key only the stack has is listed (with its default) in README.md."""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import pytest
from test_rebase_real import NEW, _copy_real_stack

from vstack.fetch import fetch_wheel

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
    section = text.split("## `--eplb-config` compared with vLLM 0.34.0", 1)[1]
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
    s = _copy_real_stack(tmp_path_factory.mktemp("compat"), with_resolutions=False)
    assert s.run("apply") == 0
    ours = eplb_surface((s.repo / PARALLEL).read_text())
    base = eplb_surface(_wheel_file(s.wheel, PARALLEL))
    new = eplb_surface(_wheel_file(fetch_wheel(NEW, s.cache), PARALLEL))
    return ours, base, new


def test_every_communicator_value_is_one_0_34_0_accepts(surfaces):
    ours, _, new = surfaces
    assert "symm_mem" in ours["communicator"][1]
    assert ours["communicator"][1] <= new["communicator"][1], (
        ours["communicator"][1] - new["communicator"][1]
    )


def test_keys_the_series_adds_are_upstream_ones_or_listed_in_readme(surfaces):
    ours, base, new = surfaces
    added = {k: v for k, v in ours.items() if k not in base}
    assert added, "the series adds EPLBConfig keys; the parser found none"
    shared = {k for k in added if k in new}
    for key in shared:
        # Same key on both sides: the same type and accepted values.
        assert added[key][:2] == new[key][:2], (key, added[key], new[key])
    listed = readme_stack_only_keys()
    assert set(listed) == set(added) - shared, (
        "README.md's stack-only key table is out of date",
        sorted(listed),
        sorted(set(added) - shared),
    )
    for key, default in listed.items():
        assert added[key][2] == default, (key, added[key][2], default)
