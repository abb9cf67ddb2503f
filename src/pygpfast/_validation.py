"""Input validation shared by the public API (scikit-learn's utilities underneath)."""

import numbers

import numpy as np
from sklearn.utils import check_array

__all__ = ["KernelParams", "array_of_matrix", "as_matrix", "as_vector", "check_int",
           "check_same_dim"]


def check_int(value, name, low, *, allow_bool=False):
    """Raise ValueError unless value is an int >= low (a bool only with allow_bool, for
    ``verbose=True``)."""
    if not (isinstance(value, numbers.Integral) and (allow_bool or not isinstance(value, bool))
            and value >= low):
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


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


def callback_says_stop(answer):
    """Whether a user callback's return value asks the fit to stop (None or False: go on). A
    value with no truth value of its own (an array of several entries) is a clear TypeError."""
    try:
        return bool(answer)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"callback must return a bool (True stops the fit) or None, got {answer!r}") from exc


class KernelParams:
    """set_params of an estimator whose `kernel` may be None (a default kernel made from the
    data at fit): a kernel's own parameter (``kernel__lengthscale``) without a kernel is a
    ValueError that says so; scikit-learn's set_params raised AttributeError ('NoneType' object
    has no attribute 'set_params'), e.g. from GridSearchCV over ``kernel__lengthscale``."""

    def set_params(self, **params):
        nested = sorted(key for key in params if key.startswith("kernel__"))
        if nested and params.get("kernel", self.kernel) is None:
            raise ValueError(
                f"{nested[0]!r} is a parameter of the kernel, but {type(self).__name__} has "
                "kernel=None (a default kernel is made from the data at fit); pass a kernel, "
                "e.g. kernel=pygpfast.kernels.RBF(), to set or search its parameters")
        return super().set_params(**params)
