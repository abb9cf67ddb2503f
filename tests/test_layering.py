"""The package's layering (STYLE.md, "Layout that shows the architecture"), read from the
imports of every module under src/pygpfast:

- building blocks (kernels, likelihoods, linalg, piecewise, datasets, exceptions and the private
  _validation, _threads, _core) import no family and not _base;
- _base imports building blocks only;
- a family (svgp, cvi, ivm, moe) imports _base, building blocks, its own modules, and only the
  public names of other families (``from ..svgp import SVGPClassifier``, never
  ``..svgp._estimators``).
"""

import ast
import pathlib

import pytest

import pygpfast

PACKAGE = pathlib.Path(pygpfast.__file__).parent
FAMILIES = {"svgp", "cvi", "ivm", "moe"}
BLOCKS = {"kernels", "likelihoods", "linalg", "piecewise", "datasets", "exceptions", "_validation",
          "_threads", "_core", "demo"}


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _imported(path):
    """The pygpfast modules `path` imports, as dotted names below pygpfast ("svgp._optim",
    "_base", ...)."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = here[:-1] if here[-1] != "__init__" else here[:-1]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
            elif node.module and node.module.split(".")[0] == "pygpfast":
                base = []
                node_module = node.module.split(".")[1:]
                names += [".".join(node_module + [a.name]) if not node_module else
                          ".".join(node_module) for a in node.names]
                continue
            else:
                continue
            module = base + (node.module.split(".") if node.module else [])
            if node.module:
                names.append(".".join(module))
            else:  # from . import x
                names += [".".join(module + [a.name]) for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pygpfast" and "." in a.name:
                    names.append(a.name.split(".", 1)[1])
    return here, [n for n in names if n]


def _layer(parts):
    top = parts[0]
    if top in FAMILIES:
        return "family"
    if top == "_base":
        return "base"
    return "block"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_respect_the_layers(path):
    here, imported = _imported(path)
    if here == ("__init__",):
        return  # (the package's front door imports everything it exports)
    layer, family = _layer(here), here[0]
    for name in imported:
        parts = name.split(".")
        target = _layer(parts)
        if layer == "block":
            assert target == "block", f"building block {'.'.join(here)} imports {name}"
        elif layer == "base":
            assert target in ("block", "base"), f"_base module {'.'.join(here)} imports {name}"
        elif target == "family" and parts[0] != family:
            assert len(parts) == 1 or not parts[1].startswith("_"), (
                f"{'.'.join(here)} imports {name}: another family's private module; import its "
                "public names from the family package instead")


def test_the_layering_test_sees_the_families_imports():
    # (a guard against a parser that finds nothing and so passes everything)
    _, imported = _imported(PACKAGE / "svgp" / "_estimators.py")
    assert "_base._estimator" in imported and "svgp._optim" in imported
    assert any(name.startswith("kernels") or name == "likelihoods" for name in imported)
