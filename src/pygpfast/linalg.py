"""Dense linear algebra from the compiled core (Cholesky with jitter, triangular solves,
rank-one Cholesky updates)."""

import numbers

import numpy as np

from . import _core
from ._validation import as_matrix, as_vector
from .exceptions import LinAlgError, warn_at_caller

__all__ = ["cholesky", "solve_lower", "cholesky_update", "cholesky_downdate"]


def _square(A, name):
    A = as_matrix(A, name)
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"{name} must be square, got shape {A.shape}")
    return A


def _lower_factor(L, name="L"):
    """A square L whose diagonal has no zero (a triangular solve with it would divide by 0)."""
    L = _square(L, name)
    zero = np.flatnonzero(np.diagonal(L) == 0.0)
    if zero.size:
        raise LinAlgError(f"{name} is singular: {name}[{zero[0]}, {zero[0]}] = 0")
    return L


def cholesky(A, *, max_relative_jitter=1e-4):
    """Lower Cholesky factor of a symmetric positive-definite matrix.

    When A is not numerically positive definite, jitter (from 1e-10 up to
    ``max_relative_jitter`` times the mean diagonal, growing x10) is added to the diagonal
    and a :class:`~pygpfast.exceptions.NumericalWarning` says how much was needed.

    Parameters
    ----------
    A : array_like [N, N]
        Only the lower triangle is read.
    max_relative_jitter : float, default 1e-4
        Largest jitter tried, relative to the mean diagonal (finite, >= 0).

    Returns
    -------
    L : ndarray [N, N], lower triangular with L @ L.T = A + jitter * I.

    Raises
    ------
    pygpfast.LinAlgError
        When no jitter up to the limit makes A positive definite.
    """
    A = _square(A, "A")
    if (
        not isinstance(max_relative_jitter, numbers.Real)
        or isinstance(max_relative_jitter, bool)
        or not (np.isfinite(max_relative_jitter) and max_relative_jitter >= 0)
    ):
        raise ValueError(
            f"max_relative_jitter must be a finite number >= 0, got {max_relative_jitter!r}")
    L, jitter = _core.linalg.cholesky(A, 1e-10, float(max_relative_jitter))
    if jitter > 0:
        warn_at_caller(f"cholesky: the matrix was not numerically positive definite; added "
                       f"jitter {jitter:.3g} to its diagonal")
    return L


def solve_lower(L, B, *, transpose=False):
    """Solve ``L X = B`` (or ``L.T X = B``) for lower-triangular L [N, N]; B [N] or [N, R].

    Only the lower triangle of L is read; LinAlgError when L has a zero on its diagonal.
    """
    L = _lower_factor(L)
    B_arr = np.asarray(B, dtype=np.float64)
    vector = B_arr.ndim == 1
    B2 = as_matrix(B_arr.reshape(-1, 1) if vector else B_arr, "B")
    if B2.shape[0] != L.shape[0]:
        raise ValueError(f"B has {B2.shape[0]} rows but L is {L.shape[0]}x{L.shape[0]}")
    X = _core.linalg.solve_lower(L, B2, bool(transpose))
    return X[:, 0] if vector else X


def cholesky_update(L, x):
    """Lower factor of ``L @ L.T + x x^T`` in O(N^2) (returns a new array).

    Only the lower triangle of L is read; LinAlgError when L has a zero on its diagonal.
    """
    L = _lower_factor(L)
    return _core.linalg.cholesky_update(L, as_vector(x, "x", size=L.shape[0]))


def cholesky_downdate(L, x):
    """Lower factor of ``L @ L.T - x x^T`` in O(N^2); LinAlgError if that is not PD.

    Only the lower triangle of L is read; LinAlgError when L has a zero on its diagonal.
    """
    L = _lower_factor(L)
    return _core.linalg.cholesky_downdate(L, as_vector(x, "x", size=L.shape[0]))
