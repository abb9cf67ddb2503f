"""The package's version, in one place for the package and the pickled estimators' state
(pyproject.toml repeats it for the build; tests/test_min_requirements.py checks that the two agree)."""

__version__ = "0.1.0"
