"""pyproject.toml against what the package and CI say: the floors that CI tests
(.ci/min-requirements.txt) are the ones it declares, and its version is the package's."""

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parents[1]


def _floors():
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    floors = {}
    for dep in map(Requirement, deps):
        (spec,) = dep.specifier  # one lower bound per dependency, nothing else
        assert spec.operator == ">=" and not dep.marker and not dep.extras, dep
        floors[canonicalize_name(dep.name)] = Version(spec.version)
    return floors


def _pins():
    pins = {}
    for line in (ROOT / ".ci" / "min-requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_ci_pins_each_declared_floor_at_a_patch_release_of_it():
    floors, pins = _floors(), _pins()
    assert pins.keys() == floors.keys()
    for name, floor in floors.items():
        # numpy>=1.23 pinned as 1.23.5: the same release up to the floor's last component
        pin = pins[name]
        assert pin.release[:len(floor.release)] == floor.release and not pin.pre, (name, pin, floor)


def test_the_built_version_is_the_package_version():
    """pyproject.toml's [project] version (what pip records) repeats src/pygpfast/_version.py's
    (what pickles record): the two must not drift apart."""
    import pygpfast

    with open(ROOT / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["version"] == pygpfast.__version__
