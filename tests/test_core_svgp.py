"""The raw SVGP binding (pygpfast._core.svgp_elbo): the natural-gradient outputs d ELL / d m
and d ELL / d S against finite differences of a dense reference written in terms of (m, S)."""

import numpy as np
import pytest
import scipy.linalg
from scipy.special import log_ndtr

from pygpfast import _core, kernels, likelihoods

GH_X, GH_W = np.polynomial.hermite.hermgauss(20)


def ref_ell(kernel, Z, X, y, m, S, whiten, scale, jitter):
    """scale * sum_n E[log Phi((2y - 1) f_n)] with q(u) = N(m, S) (q(v) when whitened)."""
    M = Z.shape[0]
    Kzz = kernel(Z) + jitter * np.eye(M)
    Lz = np.linalg.cholesky(Kzz)
    A = scipy.linalg.solve_triangular(Lz, kernel(Z, X), lower=True)
    if not whiten:  # the same marginals from u-space parameters
        m = scipy.linalg.solve_triangular(Lz, m, lower=True)
        S = scipy.linalg.solve_triangular(Lz, scipy.linalg.solve_triangular(Lz, S, lower=True).T, lower=True)
    mu = A.T @ m
    var = kernel.diag(X) - (A * A).sum(0) + np.einsum("mb,mk,kb->b", A, S, A)
    F = mu[:, None] + np.sqrt(2 * var)[:, None] * GH_X
    return scale * (log_ndtr((2 * y - 1)[:, None] * F) @ GH_W).sum() / np.sqrt(np.pi)


@pytest.mark.parametrize("whiten", [True, False])
def test_natural_outputs_match_finite_differences(rng, whiten):
    M, B, D, scale, jitter = 5, 11, 2, 3.0, 1e-6
    X = rng.standard_normal((B, D))
    Z = rng.standard_normal((M, D))
    y = (X[:, 0] + 0.3 * rng.standard_normal(B) > 0).astype(float)
    kernel = kernels.RBF(variance=1.3, lengthscale=np.array([0.8, 1.4]))
    m = 0.3 * rng.standard_normal(M)
    L = np.tril(0.2 * rng.standard_normal((M, M))) + 0.7 * np.eye(M)
    if not whiten:
        L = np.linalg.cholesky(kernel(Z) + jitter * np.eye(M)) @ L
    S = L @ L.T
    lik = likelihoods.Bernoulli("probit")
    codes, params = kernel._spec(D)
    args = (codes, params, *lik._core_args(), Z, m, L, whiten, X, y, scale, jitter, True)
    _, _, _, _, (d_m, d_S, d_Z, d_kern, _) = _core.svgp_elbo(*args, natural=True)
    _, _, _, _, (_, _, d_Z_plain, d_kern_plain, _) = _core.svgp_elbo(*args)
    np.testing.assert_array_equal(d_Z, d_Z_plain)
    np.testing.assert_array_equal(d_kern, d_kern_plain)
    np.testing.assert_array_equal(d_S, d_S.T)

    def f(m_, S_):
        return ref_ell(kernel, Z, X, y, m_, S_, whiten, scale, jitter)

    eps = 1e-6
    num_m = np.array([(f(m + eps * e, S) - f(m - eps * e, S)) / (2 * eps) for e in np.eye(M)])
    np.testing.assert_allclose(d_m, num_m, rtol=1e-6, atol=1e-7)
    num_S = np.zeros((M, M))
    for i in range(M):
        for j in range(i + 1):
            E = np.zeros((M, M))
            E[i, j] = E[j, i] = 1.0  # symmetric perturbation: counts G_ij twice off the diagonal
            num_S[i, j] = num_S[j, i] = (f(m, S + eps * E) - f(m, S - eps * E)) / (2 * eps) / (1 if i == j else 2)
    np.testing.assert_allclose(d_S, num_S, rtol=1e-5, atol=1e-6)
    # Probit is log-concave: d ELL / d S is negative semi-definite.
    assert np.linalg.eigvalsh(d_S).max() <= 1e-10


def test_natural_outputs_gaussian_closed_form(rng):
    """Gaussian likelihood: d ELL / d var = -1 / (2 sigma^2) and d ELL / d mu = (y - mu) / sigma^2,
    so d ELL / d S = scale A A^T (-1 / (2 sigma^2)) and d ELL / d m = scale A (y - mu) / sigma^2."""
    M, B, D = 4, 9, 1
    X = rng.standard_normal((B, D))
    Z = rng.standard_normal((M, D))
    y = np.sin(X[:, 0])
    kernel = kernels.RBF(variance=1.0, lengthscale=0.7)
    lik = likelihoods.Gaussian(variance=0.2)
    codes, params = kernel._spec(D)
    m, L = np.zeros(M), np.eye(M)
    _, _, _, _, (d_m, d_S, _, _, _) = _core.svgp_elbo(
        codes, params, *lik._core_args(), Z, m, L, True, X, y, 2.0, 1e-6, True, natural=True
    )
    Lz = np.linalg.cholesky(kernel(Z) + 1e-6 * np.eye(M))
    A = scipy.linalg.solve_triangular(Lz, kernel(Z, X), lower=True)
    np.testing.assert_allclose(d_S, 2.0 * (-0.5 / 0.2) * A @ A.T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d_m, 2.0 * A @ ((y - A.T @ m) / 0.2), rtol=1e-12, atol=1e-14)
