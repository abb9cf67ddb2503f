"""Array validation shared by the public API (scikit-learn's utilities underneath)."""

import contextlib

import numpy as np
from sklearn.utils import check_array
from sklearn.utils.validation import validate_data

__all__ = ["aligned", "array_of_matrix", "as_matrix", "as_vector", "check_counts", "check_same_dim",
           "core_array", "mean_and_std", "naming_conversion_errors", "power_of_two_unit",
           "validate_input"]

#: The starts of numpy's and scikit-learn's messages for an input that is not real numbers
#: (strings, complex numbers, ragged sequences); they do not say which argument they are about.
_CONVERSION_ERRORS = ("could not convert", "Complex data not supported",
                      "float() argument must be", "setting an array element with a sequence",
                      "Expected 2D array, got scalar array")

#: The largest Poisson count: beyond 2**53 float64 does not hold every integer.
MAX_COUNT = 2.0**53


@contextlib.contextmanager
def naming_conversion_errors(name):
    """Re-raise numpy's and scikit-learn's conversion errors (strings that are not numbers,
    complex numbers, ragged rows, scalars) as an error of the same type (ValueError, or
    TypeError for objects that are not numbers) that names the argument `name` and says what
    it must hold, the original message after it; other errors pass unchanged."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if not str(e).startswith(_CONVERSION_ERRORS):
            raise
        first = str(e).splitlines()[0]
        raise type(e)(f"{name} must be an array of real numbers (numbers or numeric strings; "
                      f"convert other data first): {first}") from e


def validate_input(estimator, X, y="no_validation", **check_params):
    """scikit-learn's ``validate_data`` (float64 X, feature names, ``n_features_in_``) for the
    estimators, with conversion errors that name X (:func:`naming_conversion_errors`), an
    ``np.matrix`` taken as its array (:func:`array_of_matrix`). y, when given, is checked
    (1-D, finite) but not converted: numeric targets go through :func:`as_vector`, which
    names y."""
    with naming_conversion_errors("X"):
        out = validate_data(estimator, array_of_matrix(X), y, **check_params)
    if isinstance(out, tuple):
        return (aligned(out[0]),) + out[1:]
    return aligned(out)


def core_array(a):
    """`a` as the compiled core reads it: float64, C-contiguous and aligned (a copy only where
    it is not already)."""
    return aligned(np.ascontiguousarray(a, dtype=np.float64))


def aligned(a):
    """`a` itself, or (where its data do not start at a multiple of its item size, as in a
    view into a byte buffer at an odd offset) an aligned copy of it in the same memory order.
    The compiled core reads only aligned arrays: a misaligned load is undefined behaviour."""
    if not isinstance(a, np.ndarray) or a.flags.aligned:
        return a
    return np.require(a, requirements="A")


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
    with naming_conversion_errors(name):
        return aligned(check_array(
            X,
            dtype=np.float64,
            order="C",
            ensure_2d=True,
            ensure_all_finite=True,
            ensure_min_samples=0 if allow_empty else 1,
            ensure_min_features=1,
            input_name=name,
        ))


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
    return core_array(v)


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


def mean_and_std(a, axis=None):
    """Mean and standard deviation of `a` along `axis`, computed in units of a power of two near
    max |a| (:func:`power_of_two_unit`): np.std squares the entries and overflows from |a| ~
    1e154 on (an infinite scale, then NaN everywhere it divides)."""
    unit = power_of_two_unit(a, axis=axis)
    scaled = a / (unit if axis is None else np.expand_dims(unit, axis))
    return np.mean(scaled, axis=axis) * unit, np.std(scaled, axis=axis) * unit


def check_counts(y, name="y"):
    """Poisson targets y [N] (float64, finite) as they are, or a ValueError naming `name` when
    one exceeds MAX_COUNT (2**53): no Poisson fit of such counts is computed faithfully (their
    rates overflow the fits' intermediate terms); negative targets are the likelihood's own
    check."""
    big = np.flatnonzero(y > MAX_COUNT)
    if big.size:
        raise ValueError(
            f"{name}[{big[0]}] = {y[big[0]]:.3g} is above 2**53 = {MAX_COUNT:.3g}, the largest "
            "count a Poisson likelihood takes (float64 holds every integer up to there); rescale "
            "the targets or use a Gaussian likelihood")
    return y
