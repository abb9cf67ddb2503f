"""The package's version, in one place for the package and the pickled estimators' state
(pyproject.toml repeats it for the build)."""

__version__ = "0.1.0"
