"""The raw SVGP binding (pygpfast._core.svgp.elbo): the natural-gradient outputs d ELL / d m
and d ELL / d S against finite differences of a dense reference written in terms of (m, S)."""

import numpy as np
import pytest
import scipy.linalg
from scipy.special import log_ndtr

from pygpfast import _core, kernels, likelihoods
from blas_rounding import assert_same
from dense import jittered

GH_X, GH_W = np.polynomial.hermite.hermgauss(20)


def ref_ell(kernel, Z, X, y, m, S, whiten, scale, jitter):
    """scale * sum_n E[log Phi((2y - 1) f_n)] with q(u) = N(m, S) (q(v) when whitened)."""
    M = Z.shape[0]
    Kzz = jittered(kernel(Z), jitter)
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
        L = np.linalg.cholesky(jittered(kernel(Z), jitter)) @ L
    S = L @ L.T
    lik = likelihoods.Bernoulli("probit")
    codes, params = kernel._spec(D)
    args = (codes, params, *lik._core_args())
    kw = dict(Z=Z, q_mu=m, q_sqrt=L, whiten=whiten, X=X, y=y, scale=scale, jitter=jitter,
              with_grad=True)
    _, _, _, _, (d_m, d_S, d_Z, d_kern, _, _) = _core.svgp.elbo(*args, **kw, natural=True)
    _, _, _, _, (_, _, d_Z_plain, d_kern_plain, _, _) = _core.svgp.elbo(*args, **kw)
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
    _, _, _, _, (d_m, d_S, _, _, _, _) = _core.svgp.elbo(
        codes, params, *lik._core_args(), Z=Z, q_mu=m, q_sqrt=L, whiten=True, X=X, y=y, scale=2.0, jitter=1e-6, with_grad=True, natural=True
    )
    Lz = np.linalg.cholesky(jittered(kernel(Z), 1e-6))
    A = scipy.linalg.solve_triangular(Lz, kernel(Z, X), lower=True)
    np.testing.assert_allclose(d_S, 2.0 * (-0.5 / 0.2) * A @ A.T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d_m, 2.0 * A @ ((y - A.T @ m) / 0.2), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- the two marginal paths
def path_problem(rng, M, B, D=2, lengthscale=1.2, whiten=True):
    X = rng.standard_normal((B, D))
    Z = rng.standard_normal((M, D))
    y = (np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(B) > 0).astype(float)
    kernel = kernels.RBF(variance=1.1, lengthscale=np.full(D, lengthscale))
    m = 0.3 * rng.standard_normal(M)
    L = np.tril(0.1 * rng.standard_normal((M, M)), -1) + np.diag(0.4 + 0.5 * rng.random(M))
    if not whiten:
        L = np.linalg.cholesky(jittered(kernel(Z), 1e-6)) @ L
    return X, y, Z, kernel, m, L


def elbo_by_path(kernel, Z, m, L, whiten, X, y, path, natural=False, jitter=1e-6):
    lik = likelihoods.Bernoulli("probit")
    codes, params = kernel._spec(Z.shape[1])
    return _core.svgp.elbo(codes, params, *lik._core_args(), Z=Z, q_mu=m, q_sqrt=L, whiten=whiten, X=X, y=y, scale=3.0, jitter=jitter, with_grad=True,
                           natural=natural, path=path, return_path=True)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("natural", [False, True])
def test_paths_agree(rng, whiten, natural):
    X, y, Z, kernel, m, L = path_problem(rng, M=12, B=90, whiten=whiten)
    solve = elbo_by_path(kernel, Z, m, L, whiten, X, y, "solve", natural)
    pre = elbo_by_path(kernel, Z, m, L, whiten, X, y, "precomputed", natural)
    assert (solve[5], pre[5]) == ("solve", "precomputed")
    # The paths round differently, and the precomputed one loses ~log10(cond(Kzz)) digits
    # (svgp.hpp); unwhitened gradients pass once more through Lz^-T.
    cond = np.linalg.cond(jittered(kernel(Z), 1e-6))
    rtol = 1e-13 * cond * (1.0 if whiten else np.sqrt(cond))
    np.testing.assert_allclose(pre[0], solve[0], rtol=1e-12)
    for a, b in zip(pre[4][:4], solve[4][:4]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


@pytest.mark.parametrize("whiten", [True, False])
def test_precomputed_gradients_match_finite_differences(rng, whiten):
    X, y, Z, kernel, m, L = path_problem(rng, M=5, B=40, whiten=whiten)
    _, _, _, _, (d_m, d_L, d_Z, d_kern, _, _), path = elbo_by_path(kernel, Z, m, L, whiten, X, y, "precomputed")
    assert path == "precomputed"

    def value(m_=m, L_=L, Z_=Z, kern=kernel):
        return elbo_by_path(kern, Z_, m_, L_, whiten, X, y, "precomputed")[0]

    eps = 1e-6
    num = np.array([(value(m_=m + eps * e) - value(m_=m - eps * e)) / (2 * eps) for e in np.eye(5)])
    np.testing.assert_allclose(d_m, num, rtol=1e-6, atol=1e-7)
    num = np.zeros_like(L)
    for i, j in zip(*np.tril_indices(5)):
        E = np.zeros_like(L)
        E[i, j] = eps
        num[i, j] = (value(L_=L + E) - value(L_=L - E)) / (2 * eps)
    np.testing.assert_allclose(d_L, num, rtol=1e-5, atol=1e-6)
    num = np.zeros_like(Z)
    for i, j in np.ndindex(*Z.shape):
        E = np.zeros_like(Z)
        E[i, j] = eps
        num[i, j] = (value(Z_=Z + E) - value(Z_=Z - E)) / (2 * eps)
    np.testing.assert_allclose(d_Z, num, rtol=1e-5, atol=1e-6)
    num = []
    for p in range(kernel.n_params):
        ks = []
        for sign in (1, -1):
            k2 = kernels.RBF(variance=kernel.params[0], lengthscale=kernel.params[1:].copy())
            params = kernel.params.copy()
            params[p] += sign * eps
            k2.params = params
            ks.append(value(kern=k2))
        num.append((ks[0] - ks[1]) / (2 * eps))
    np.testing.assert_allclose(d_kern, num, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", ["solve", "precomputed"])
@pytest.mark.parametrize("whiten", [True, False])
def test_gradients_through_kzz_at_several_cholesky_blocks(rng, path, whiten):
    """M = 150 spans three column blocks of the blocked Cholesky reverse (64, 64, 22): the
    gradients that pass through Kzz (Z and the kernel's parameters) against central differences
    along a random direction."""
    M = 150
    X, y, Z, kernel, m, L = path_problem(rng, M=M, B=400, D=3, lengthscale=1.5, whiten=whiten)
    _, _, _, _, (_, _, d_Z, d_kern, _, _), used = elbo_by_path(kernel, Z, m, L, whiten, X, y, path, jitter=1e-4)
    assert used == path
    dZ = rng.standard_normal(Z.shape)
    dlog = rng.standard_normal(kernel.n_params)

    def value(t):
        k = kernels.RBF(variance=1.1, lengthscale=np.full(3, 1.5))
        k.params = kernel.params * np.exp(t * dlog)
        return elbo_by_path(k, Z + t * dZ, m, L, whiten, X, y, path, jitter=1e-4)[0]

    h = 1e-5
    numeric = (value(h) - value(-h)) / (2 * h)
    analytic = np.sum(d_Z * dZ) + np.sum(d_kern * kernel.params * dlog)
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-6 * abs(value(0.0)))


@pytest.mark.parametrize("whiten", [True, False])
def test_relative_jitter_is_differentiated(rng, whiten):
    """The jitter is jitter x mean(diag Kzz), so the kernel's gradient has a share through it,
    made visible here by a large jitter (0.3 x the variance on Kzz's diagonal)."""
    X, y, Z, kernel, m, L = path_problem(rng, M=6, B=40, D=2, whiten=whiten)
    _, ell, _, _, (_, _, _, d_kern, _, _), _ = elbo_by_path(kernel, Z, m, L, whiten, X, y, "solve", jitter=0.3)
    S = L @ L.T
    assert ell == pytest.approx(ref_ell(kernel, Z, X, y, m, S, whiten, 3.0, 0.3), rel=1e-10)
    dlog = rng.standard_normal(kernel.n_params)

    def value(t):
        k = kernels.RBF(variance=1.1, lengthscale=np.full(2, 1.2))
        k.params = kernel.params * np.exp(t * dlog)
        return elbo_by_path(k, Z, m, L, whiten, X, y, "solve", jitter=0.3)[0]

    h = 1e-5
    numeric = (value(h) - value(-h)) / (2 * h)
    assert np.sum(d_kern * kernel.params * dlog) == pytest.approx(numeric, rel=1e-7)


def test_auto_picks_the_cheaper_path(rng):
    X, y, Z, kernel, m, L = path_problem(rng, M=8, B=400)
    assert elbo_by_path(kernel, Z, m, L, True, X, y, "auto")[5] == "precomputed"
    assert elbo_by_path(kernel, Z, m, L, True, X[:8], y[:8], "auto")[5] == "solve"


def test_precomputed_falls_back_when_inaccurate(rng):
    """Nearly coincident inducing inputs with a small jitter make Kzz ill-conditioned (cond ~3e9):
    the precomputed variances fail the check and the solve path takes over."""
    X, y, Z, kernel, m, L = path_problem(rng, M=30, B=300, lengthscale=3.0)
    Z[1::2] = Z[::2] + 1e-3
    solve = elbo_by_path(kernel, Z, m, L, True, X, y, "solve", jitter=1e-8)
    pre = elbo_by_path(kernel, Z, m, L, True, X, y, "precomputed", jitter=1e-8)
    assert pre[5] == "solve"
    np.testing.assert_array_equal(pre[0], solve[0])


@pytest.mark.parametrize("whiten, natural", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("path", ["solve", "precomputed"])
def test_phases_do_not_depend_on_the_thread_count(rng, restore_threads, whiten, natural, path):
    """The evaluation's three phases (svgp.cpp: the O(M^3) work beside the kept blocks' kernels,
    the blocks, the O(M^3) reverse beside the kept blocks' vjps) give the same result to the
    bit on one and two threads, here with 8 blocks of which 7 are kept (M = 300, B = 7500: kept
    blocks hold at most 2^21 entries) and the last evaluates its kernel and vjp inline."""
    import pygpfast

    X, y, Z, kernel, m, L = path_problem(rng, M=300, B=7500, D=6, lengthscale=1.5, whiten=whiten)
    out = []
    for threads in (1, 2):
        pygpfast.set_num_threads(threads)
        out.append(elbo_by_path(kernel, Z, m, L, whiten, X, y, path, natural=natural))
    assert out[0][5] == out[1][5] == path
    # Where the BLAS cannot be held to one thread (the dependency floors), the blocks' BLAS
    # calls run on its threads, one or two here, and round differently with their count: to
    # rounding, measured up to 6e-13 relative in the ELBO and 1e-9 of a gradient's largest entry
    # (the unwhitened precomputed path, through Kzz^-1; 1e-13 whitened).
    assert_same(out[0][0], out[1][0], rtol=1e-11)
    for a, b in zip(out[0][4], out[1][4]):
        assert_same(a, b, rtol=1e-8)


def test_an_error_in_the_parallel_phases_reaches_the_caller(rng, restore_threads):
    """A Cholesky that fails in the first phase (two threads, the kernels beside it) raises its
    error in the caller, not a crash or a partial result."""
    import pygpfast

    pygpfast.set_num_threads(2)
    X, y, Z, kernel, m, L = path_problem(rng, M=300, B=4000, D=3)
    Z[1] = np.nan  # (a NaN in K(Z, Z) defeats every jitter)
    with pytest.raises(ValueError, match="cholesky: matrix has a non-finite entry"):
        elbo_by_path(kernel, Z, m, L, True, X, y, "solve")


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_add_up(rng, restore_threads, threads):
    """A minibatch large enough to be cut into several column blocks (bounded at ~1M entries
    of M x columns each) per thread gives the dense reference's ELBO and the same gradients
    on both paths, whatever the thread count."""
    import pygpfast

    pygpfast.set_num_threads(threads)
    M, B = 300, 7500
    X, y, Z, kernel, m, L = path_problem(rng, M=M, B=B, D=6, lengthscale=1.5)
    lik = likelihoods.Bernoulli("probit")
    solve = elbo_by_path(kernel, Z, m, L, True, X, y, "solve", natural=True)
    pre = elbo_by_path(kernel, Z, m, L, True, X, y, "precomputed", natural=True)
    assert pre[5] == "precomputed"
    Lz = np.linalg.cholesky(jittered(kernel(Z), 1e-6))
    A = scipy.linalg.solve_triangular(Lz, kernel(Z, X), lower=True)
    mu = A.T @ m
    var = kernel.diag(X) - (A * A).sum(0) + ((L.T @ A) ** 2).sum(0)
    ell = 3.0 * lik.variational_expectations(y, mu, var)[0].sum()
    kl = 0.5 * (np.sum(L**2) + m @ m - M - 2 * np.log(np.diag(L)).sum())
    np.testing.assert_allclose(solve[0], ell - kl, rtol=1e-10)
    np.testing.assert_allclose(pre[0], ell - kl, rtol=1e-10)
    for a, b in zip(pre[4][:4], solve[4][:4]):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-7 * np.abs(b).max())
