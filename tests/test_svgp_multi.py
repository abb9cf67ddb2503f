"""SVGP core with L > 1 latent functions sharing Z and the kernel (the multi-class softmax
case): the ELBO against a dense numpy reference built per latent function, the gradients
against finite differences, and predict_f against the reference marginals."""

import numpy as np
import pytest
import scipy.linalg

from pygpfast import _core, kernels, likelihoods
from dense import jittered

C = 3


def make_problem(rng, M=5, B=12, D=2):
    X = rng.standard_normal((B, D))
    Z = rng.standard_normal((M, D))
    y = rng.integers(0, C, B).astype(float)
    kernel = kernels.RBF(variance=1.3, lengthscale=np.array([0.8, 1.5]))
    q_mu = 0.4 * rng.standard_normal((M, C))
    q_sqrt = np.stack([np.tril(0.2 * rng.standard_normal((M, M))) + 0.7 * np.eye(M) for _ in range(C)])
    return X, y, Z, kernel, q_mu, q_sqrt


def ref_marginals(kernel, Z, q_mu, q_sqrt, whiten, X, jitter):
    """mean, var [B, C] and the summed KL, latent function by latent function."""
    M = Z.shape[0]
    Kzz = jittered(kernel(Z), jitter)
    Kzx, kxx = kernel(Z, X), kernel.diag(X)
    Lz = np.linalg.cholesky(Kzz)
    mean, var, kl = [], [], 0.0
    for c in range(q_mu.shape[1]):
        m, L = q_mu[:, c], np.tril(q_sqrt[c])
        if not whiten:  # the same posterior in whitened coordinates
            m = scipy.linalg.solve_triangular(Lz, m, lower=True)
            L = scipy.linalg.solve_triangular(Lz, L, lower=True)
        A = scipy.linalg.solve_triangular(Lz, Kzx, lower=True)
        mean.append(A.T @ m)
        var.append(kxx - (A * A).sum(0) + ((L.T @ A) ** 2).sum(0))
        S = L @ L.T
        kl += 0.5 * (np.trace(S) + m @ m - M - np.linalg.slogdet(S)[1])
    return np.stack(mean, 1), np.stack(var, 1), kl


def core_elbo(kernel, lik, Z, q_mu, q_sqrt, whiten, X, y, scale, jitter=1e-6, with_grad=True):
    codes, params = kernel._spec(Z.shape[1])
    kind, variance, n_gh, n_classes = lik._core_args()
    return _core.svgp.elbo(codes, params, kind, variance, n_gh, n_classes, Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=whiten, X=X,
                           y=y, scale=scale, jitter=jitter, with_grad=with_grad)


@pytest.mark.parametrize("whiten", [True, False])
def test_multi_latent_elbo_matches_reference(rng, whiten):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    lik = likelihoods.Softmax(C)
    scale = 7.0
    elbo, ell, kl, _, _ = core_elbo(kernel, lik, Z, q_mu, q_sqrt, whiten, X, y, scale, with_grad=False)
    mean, var, kl_ref = ref_marginals(kernel, Z, q_mu, q_sqrt, whiten, X, 1e-6)
    ell_ref = scale * lik.variational_expectations(y, mean, var)[0].sum()
    np.testing.assert_allclose(kl, kl_ref, rtol=1e-10)
    np.testing.assert_allclose(ell, ell_ref, rtol=1e-10)
    np.testing.assert_allclose(elbo, ell_ref - kl_ref, rtol=1e-10)


@pytest.mark.parametrize("whiten", [True, False])
def test_multi_latent_gradients_match_finite_differences(rng, whiten):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    lik = likelihoods.Softmax(C)
    _, _, _, _, (d_mu, d_sqrt, d_Z, d_kern, _, _) = core_elbo(kernel, lik, Z, q_mu, q_sqrt, whiten, X, y, 3.0)
    assert d_mu.shape == q_mu.shape and d_sqrt.shape == q_sqrt.shape
    assert np.all(np.triu(d_sqrt, 1) == 0)

    def value(**kw):
        args = dict(Z=Z, q_mu=q_mu, q_sqrt=q_sqrt)
        args.update(kw)
        return core_elbo(kernel, lik, args["Z"], args["q_mu"], args["q_sqrt"], whiten, X, y, 3.0,
                         with_grad=False)[0]

    eps = 1e-6
    for name, base, analytic, mask in [
        ("q_mu", q_mu, d_mu, np.ones_like(q_mu, bool)),
        ("q_sqrt", q_sqrt, d_sqrt, np.stack([np.tril(np.ones(q_sqrt.shape[1:], bool))] * C)),
        ("Z", Z, d_Z, np.ones_like(Z, bool)),
    ]:
        for idx in zip(*np.nonzero(mask)):
            plus, minus = base.copy(), base.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd = (value(**{name: plus}) - value(**{name: minus})) / (2 * eps)
            np.testing.assert_allclose(analytic[idx], fd, rtol=2e-5, atol=2e-6, err_msg=f"{name}{idx}")
    # Kernel parameters (positive), through the kernel's own parameter vector.
    codes, params = kernel._spec(Z.shape[1])
    kind, variance, n_gh, n_classes = lik._core_args()
    for p in range(params.size):
        vals = []
        for sign in (1, -1):
            pp = params.copy()
            pp[p] += sign * eps
            vals.append(_core.svgp.elbo(codes, pp, kind, variance, n_gh, n_classes, Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=whiten,
                                        X=X, y=y, scale=3.0, jitter=1e-6, with_grad=False)[0])
        np.testing.assert_allclose(d_kern[p], (vals[0] - vals[1]) / (2 * eps), rtol=2e-5, atol=2e-6)


def test_multi_latent_prior_mean(rng):
    """One constant prior mean per latent function: its gradient [C] against finite differences,
    and predict_f's means shifted by it column by column."""
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    lik = likelihoods.Softmax(C)
    codes, params = kernel._spec(Z.shape[1])
    prior_mean = np.array([0.5, -1.0, 2.0])

    def elbo(pm, with_grad=False):
        return _core.svgp.elbo(codes, params, *lik._core_args(), Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=True, X=X, y=y, scale=3.0, jitter=1e-6,
                               with_grad=with_grad, prior_mean=pm)

    d_mean = elbo(prior_mean, with_grad=True)[4][5]
    eps = 1e-6
    fd = [(elbo(prior_mean + eps * e)[0] - elbo(prior_mean - eps * e)[0]) / (2 * eps) for e in np.eye(C)]
    np.testing.assert_allclose(d_mean, fd, rtol=2e-6, atol=1e-7)
    mean, var, _ = _core.svgp.predict_f(codes, params, Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=True, Xnew=X, jitter=1e-6, prior_mean=prior_mean)
    mean0, var0, _ = _core.svgp.predict_f(codes, params, Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=True, Xnew=X, jitter=1e-6)
    np.testing.assert_allclose(mean, mean0 + prior_mean, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(var, var0)


def test_single_latent_shapes_equal_one_column(rng):
    """q_mu [M] with q_sqrt [M, M] is the L = 1 case of q_mu [M, 1] with q_sqrt [1, M, M]."""
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    yb = (y > 0).astype(float)
    lik = likelihoods.Bernoulli()
    a = core_elbo(kernel, lik, Z, q_mu[:, 0].copy(), q_sqrt[0].copy(), True, X, yb, 2.0)
    b = core_elbo(kernel, lik, Z, q_mu[:, :1].copy(), q_sqrt[:1].copy(), True, X, yb, 2.0)
    assert a[0] == b[0]
    np.testing.assert_array_equal(a[4][0], b[4][0][:, 0])
    np.testing.assert_array_equal(a[4][1], b[4][1][0])
    np.testing.assert_array_equal(a[4][2], b[4][2])


@pytest.mark.parametrize("whiten", [True, False])
def test_multi_latent_predict_f(rng, whiten):
    X, _, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    codes, params = kernel._spec(Z.shape[1])
    mean, var, _ = _core.svgp.predict_f(codes, params, Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=whiten, Xnew=X, jitter=1e-6)
    assert mean.shape == var.shape == (X.shape[0], C)
    mean_ref, var_ref, _ = ref_marginals(kernel, Z, q_mu, q_sqrt, whiten, X, 1e-6)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-10, atol=1e-12)


def test_latent_count_must_match_the_likelihood(rng):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng)
    with pytest.raises(ValueError, match="latent functions"):
        core_elbo(kernel, likelihoods.Softmax(C + 1), Z, q_mu, q_sqrt, True, X, y, 1.0)
    with pytest.raises(ValueError, match="q_sqrt"):
        core_elbo(kernel, likelihoods.Softmax(C), Z, q_mu, q_sqrt[:2].copy(), True, X, y, 1.0)
