"""The type stubs in src/pygpfast/_core/ name exactly what each compiled submodule holds."""

import ast
import pathlib

import pytest

import pygpfast
import pygpfast._core as core

STUBS = pathlib.Path(pygpfast.__file__).parent / "_core"


def _stub_names(path):
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names if node.level == 1)
    return names - {"F64"}


def _runtime_names(module):
    return {name for name in dir(module) if not name.startswith("_")}


def test_every_submodule_has_its_stub_file():
    submodules = {name for name in _runtime_names(core) if name not in ("F64",)}
    assert submodules == {p.stem for p in STUBS.glob("*.pyi")} - {"__init__"}
    assert _stub_names(STUBS / "__init__.pyi") == submodules


@pytest.mark.parametrize("path", sorted(STUBS.glob("*.pyi")), ids=lambda p: p.stem)
def test_a_stub_names_what_its_submodule_holds(path):
    if path.stem == "__init__":
        return
    assert _stub_names(path) == _runtime_names(getattr(core, path.stem))
