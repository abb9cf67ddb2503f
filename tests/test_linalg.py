"""pygpfast.linalg against numpy/scipy references."""

import pickle

import numpy as np
import pytest
import scipy.linalg

import pygpfast
from pygpfast import linalg


def spd(rng, n, cond_shift=1.0):
    B = rng.standard_normal((n, n))
    return B @ B.T + cond_shift * n * np.eye(n)


@pytest.mark.parametrize("n", [1, 2, 17, 200])
def test_cholesky_matches_numpy(rng, n):
    A = spd(rng, n)
    L = linalg.cholesky(A)
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=1e-12, atol=1e-12)
    assert np.all(np.triu(L, 1) == 0)


def test_cholesky_reads_only_lower_triangle(rng):
    A = spd(rng, 10)
    A_garbage = np.tril(A) + np.triu(np.full_like(A, 1e6), 1)
    np.testing.assert_allclose(linalg.cholesky(A_garbage), np.linalg.cholesky(A), rtol=1e-12)


def test_cholesky_jitter_escalation_warns(rng):
    X = rng.standard_normal((30, 2))
    A = X @ X.T  # rank 2, PSD but singular
    with pytest.warns(pygpfast.NumericalWarning, match="jitter"):
        L = linalg.cholesky(A)
    resid = L @ L.T - A
    # The jitter is small relative to the matrix scale.
    assert np.abs(resid).max() < 1e-3 * np.abs(np.diag(A)).mean()
    np.testing.assert_allclose(np.tril(resid, -1), 0, atol=1e-9)


def test_cholesky_raises_linalgerror_that_is_numpys(rng):
    A = -spd(rng, 5)
    with pytest.raises(pygpfast.LinAlgError, match="not positive definite"):
        linalg.cholesky(A)
    with pytest.raises(np.linalg.LinAlgError):
        linalg.cholesky(np.diag([1.0, -1.0, 1.0]))


# (12 x 3: one TRSM; 300 x 400 and 257 x 256: the core's recursive halving into GEMMs)
@pytest.mark.parametrize("n, r", [(12, 3), (300, 400), (257, 256)])
def test_solve_lower(rng, n, r):
    L = np.linalg.cholesky(spd(rng, n))
    B = rng.standard_normal((n, r))
    for trans in (0, 1):
        np.testing.assert_allclose(
            linalg.solve_lower(L, B, transpose=bool(trans)),
            scipy.linalg.solve_triangular(L, B, lower=True, trans=trans), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(
        linalg.solve_lower(L, B[:, 0], transpose=True),
        scipy.linalg.solve_triangular(L, B[:, 0], lower=True, trans="T"),
        rtol=1e-11,
    )


def test_rank_one_update_and_downdate(rng):
    n = 25
    A = spd(rng, n)
    L = np.linalg.cholesky(A)
    x = rng.standard_normal(n)
    L_up = linalg.cholesky_update(L, x)
    np.testing.assert_allclose(L_up, np.linalg.cholesky(A + np.outer(x, x)), rtol=1e-10, atol=1e-12)
    L_down = linalg.cholesky_downdate(L_up, x)
    np.testing.assert_allclose(L_down, L, rtol=1e-9, atol=1e-11)
    # L itself is not modified.
    np.testing.assert_array_equal(L, np.linalg.cholesky(A))


def test_many_rank_one_updates_stay_accurate(rng):
    n = 40
    A = spd(rng, n)
    L = np.linalg.cholesky(A)
    for _ in range(300):
        x = 0.3 * rng.standard_normal(n)
        L = linalg.cholesky_downdate(linalg.cholesky_update(L, x), x)
    np.testing.assert_allclose(L @ L.T, A, rtol=1e-9, atol=1e-9 * np.abs(A).max())


def test_downdate_to_indefinite_raises(rng):
    L = np.eye(3)
    with pytest.raises(pygpfast.LinAlgError, match="not positive definite"):
        linalg.cholesky_downdate(L, np.array([0.0, 2.0, 0.0]))


@pytest.mark.parametrize(
    "bad",
    [
        np.array([[1.0, np.nan], [np.nan, 1.0]]),
        np.array([[1.0, np.inf], [0.0, 1.0]]),
        np.ones((2, 3)),
        np.ones(4),
        np.ones((0, 0)),
        np.array([["a", "b"], ["c", "d"]]),
    ],
)
def test_bad_input_is_valueerror(bad):
    with pytest.raises(ValueError):
        linalg.cholesky(bad)


def test_bad_vector_for_update():
    L = np.eye(3)
    with pytest.raises(ValueError, match="length 3"):
        linalg.cholesky_update(L, np.ones(2))
    with pytest.raises(ValueError, match="NaN"):
        linalg.cholesky_update(L, np.array([1.0, np.nan, 0.0]))


def test_non_contiguous_and_integer_inputs_are_converted(rng):
    A = spd(rng, 6)
    A_f = np.asfortranarray(A)
    np.testing.assert_allclose(linalg.cholesky(A_f), np.linalg.cholesky(A), rtol=1e-12)
    np.testing.assert_allclose(linalg.cholesky(np.eye(3, dtype=int)), np.eye(3))


def test_module_pickles_functions():
    assert pickle.loads(pickle.dumps(linalg.cholesky)) is linalg.cholesky
