"""Array validation shared by the public API (scikit-learn's utilities underneath)."""

import numpy as np
from sklearn.utils import check_array

__all__ = ["array_of_matrix", "as_matrix", "as_vector", "check_same_dim", "power_of_two_unit"]


def array_of_matrix(X):
    """An np.matrix as the plain ndarray that holds its data (no copy); anything else as it is.

    scikit-learn's ``check_array`` (and so ``validate_data``) refuses np.matrix with a TypeError;
    SVGP's ``check_rows`` takes it as the 2-D array it is, and the estimators that validate
    through scikit-learn pass their inputs through this first to do the same.
    """
    return np.asarray(X) if isinstance(X, np.matrix) else X


def as_matrix(X, name="X", *, allow_empty=False):
    """Return X as a finite float64 C-contiguous 2-D array, or raise ValueError.

    A 1-D input is refused (reshape it to [N, 1] or [1, D]) as in scikit-learn.
    """
    try:
        X = check_array(
            X,
            dtype=np.float64,
            order="C",
            ensure_2d=True,
            ensure_all_finite=True,
            ensure_min_samples=0 if allow_empty else 1,
            ensure_min_features=1,
            input_name=name,
        )
    except TypeError as e:  # e.g. a string array
        raise ValueError(f"{name} must be numeric: {e}") from e
    return X


def as_vector(v, name, *, size=None, allow_empty=False):
    """Return v as a finite float64 contiguous 1-D array of length `size`, or raise ValueError."""
    try:
        v = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a numeric 1-D array: {e}") from e
    if v.ndim == 0:
        v = v.reshape(1)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {v.shape}")
    if size is not None and v.shape[0] != size:
        raise ValueError(f"{name} must have length {size}, got {v.shape[0]}")
    if v.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise ValueError(f"{name} contains NaN or infinity: {name}[{bad[0]}] = {v[bad[0]]}")
    return np.ascontiguousarray(v)


def check_same_dim(X, X2, name="X2"):
    if X2.shape[1] != X.shape[1]:
        raise ValueError(
            f"{name} has {X2.shape[1]} features but X has {X.shape[1]}; they must match"
        )


def power_of_two_unit(a, axis=None):
    """A power of two within a factor 2 below max |a| (over `axis`; 1 where that is 0). Data
    divided by it has entries in [-2, 2], so sums of squares do not overflow, and dividing by
    a power of two is exact."""
    largest = np.maximum(np.max(a, axis=axis), -np.min(a, axis=axis))  # (no copy of a)
    return np.where(largest > 0, np.ldexp(1.0, np.frexp(largest)[1] - 1), 1.0)
