"""Sparse mean-field SVGP (seed 000 section 3.1): the bound of eq. (12) and its gradients against
a dense numpy reference, the optimal variational parameters, limiting cases, predictions and
the estimator with method="mf"."""

import pickle

import numpy as np
import pytest
import scipy.stats
from scipy.special import log_ndtr

import pygpfast
from pygpfast import _core, kernels
from pygpfast.svgp._mf import mf_bound, mf_posterior
from pygpfast.svgp import SVGPClassifier, SVGPRegressor
from dense import jittered

JITTER = 1e-6


# ---------------------------------------------------------------- dense reference
def dense_parts(kernel, Z, X, jitter=JITTER):
    """Q = Kxz Kzz^-1 Kzx, C = Q + I and C^-1 as N x N matrices."""
    Kzz = jittered(kernel(Z), jitter)
    Kzx = kernel(Z, X)
    Q = Kzx.T @ np.linalg.solve(Kzz, Kzx)
    C = Q + np.eye(len(X))
    return Kzz, Kzx, Q, C, np.linalg.inv(C)


def truncated_moments(a, s2, y):
    """Mean and variance of N(a, s2) truncated to g > 0 (y = 1) or g < 0 (y = 0)."""
    s = np.sqrt(s2)
    lo = np.where(y == 1, -a / s, -np.inf)
    hi = np.where(y == 1, np.inf, -a / s)
    mean, var = scipy.stats.truncnorm.stats(lo, hi, loc=a, scale=s, moments="mv")
    return np.asarray(mean, float), np.asarray(var, float)


def ref_bound_eq12(kernel, Z, X, y, a, jitter=JITTER):
    """Eq. (12) term by term, with scipy's truncated-normal moments."""
    _, _, Q, C, Ci = dense_parts(kernel, Z, X, jitter)
    s2 = 1.0 / np.diag(Ci)
    sgn = 2 * y - 1
    Eg, Vg = truncated_moments(a, s2, y)
    Egg = np.outer(Eg, Eg) + np.diag(Vg)
    E_sq = Vg + (Eg - a) ** 2  # E[(a - g)^2]
    return (
        log_ndtr(sgn * a / np.sqrt(s2)).sum()
        - 0.5 * np.linalg.slogdet(C)[1]
        - 0.5 * np.trace(Ci @ Egg)
        + 0.5 * np.sum(np.log(s2) + E_sq / s2)
        - 0.5 * (kernel.diag(X).sum() - np.trace(Q))
    )


def ref_bound_log_space(kernel, Z, X, y, a, jitter=JITTER):
    """Eq. (12) after its cancellations, with log Phi from scipy (accurate for any z):
    sum[log Phi(z) + lambda^2 / 2] - 1/2 sum log beta - 1/2 log|C| - 1/2 E[g]^T C^-1 E[g]
    - 1/2 tr(K - Q), z = s a sqrt(beta), beta = diag C^-1, E[g] = a + s lambda / sqrt(beta)."""
    _, _, Q, C, Ci = dense_parts(kernel, Z, X, jitter)
    beta = np.diag(Ci)
    sgn = 2 * y - 1
    z = sgn * a * np.sqrt(beta)
    log_cdf = log_ndtr(z)
    lam = np.exp(scipy.stats.norm.logpdf(z) - log_cdf)
    Eg = a + sgn * lam / np.sqrt(beta)
    return (
        np.sum(log_cdf + 0.5 * lam**2) - 0.5 * np.log(beta).sum() - 0.5 * np.linalg.slogdet(C)[1]
        - 0.5 * Eg @ Ci @ Eg - 0.5 * (kernel.diag(X).sum() - np.trace(Q))
    )


def make_problem(rng, N=14, M=5, D=2):
    X = rng.standard_normal((N, D))
    Z = rng.standard_normal((M, D))
    y = (X[:, 0] + 0.5 * rng.standard_normal(N) > 0).astype(float)
    kernel = kernels.RBF(variance=1.4, lengthscale=np.array([0.9, 1.6])) + kernels.Linear(variance=0.2)
    a = rng.standard_normal(N)
    return X, y, Z, kernel, a


def bound(kernel, Z, X, y, a, **kw):
    return mf_bound(kernel, np.ascontiguousarray(Z), X, y, np.ascontiguousarray(a), **kw)


# ---------------------------------------------------------------- the bound
def test_bound_matches_eq12_dense_reference(rng):
    for _ in range(3):
        X, y, Z, kernel, a = make_problem(rng)
        value = bound(kernel, Z, X, y, a)[0]
        np.testing.assert_allclose(value, ref_bound_eq12(kernel, Z, X, y, a), rtol=1e-10)


def test_bound_matches_reference_for_every_kernel(rng):
    X, y, Z, _, a = make_problem(rng, N=10, M=4)
    for kernel in (kernels.Matern12(variance=0.7, lengthscale=1.3),
                   kernels.Matern32(lengthscale=np.array([0.5, 2.0])),
                   kernels.RBF() * kernels.Linear(variance=np.array([0.3, 1.1])) + kernels.Constant(0.4)):
        np.testing.assert_allclose(bound(kernel, Z, X, y, a)[0], ref_bound_eq12(kernel, Z, X, y, a),
                                   rtol=1e-10)


def test_bound_is_accurate_far_in_the_tails(rng):
    # z = s a sqrt(beta) from -40 to 40: log Phi(z) and lambda^2 / 2 cancel to O(log |z|) there.
    X, y, Z, kernel, _ = make_problem(rng, N=9)
    s = 2 * y - 1
    for zval in (-40.0, -12.0, -4.2, -4.0, -3.8, 8.0, 40.0):
        beta = np.diag(dense_parts(kernel, Z, X)[4])
        a = s * zval / np.sqrt(beta)
        value, _, g, _ = bound(kernel, Z, X, y, a, with_grad=True)
        ref = ref_bound_log_space(kernel, Z, X, y, a)
        np.testing.assert_allclose(value, ref, rtol=1e-9, atol=1e-9)
        assert np.all(np.isfinite(g["a"])) and np.all(np.isfinite(g["kernel"]))


def test_bound_is_smooth_across_the_tail_switch(rng):
    # The per-point terms switch formulas at z = -4; the bound must not jump there.
    X, y, Z, kernel, a = make_problem(rng, N=6)
    beta = np.diag(dense_parts(kernel, Z, X)[4])
    s = 2 * y - 1
    direction = np.zeros(6)
    direction[0] = s[0] / np.sqrt(beta[0])  # moves z_0 by one unit per unit step
    base = a.copy()
    base[0] = -4.0 * direction[0]
    h = 1e-7
    lo = bound(kernel, Z, X, y, base - h * direction)[0]
    mid, _, g, _ = bound(kernel, Z, X, y, base, with_grad=True)
    hi = bound(kernel, Z, X, y, base + h * direction)[0]
    slope = g["a"][0] * direction[0]
    np.testing.assert_allclose([(mid - lo) / h, (hi - mid) / h], [slope, slope], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- gradients
def fd(f, x0, eps=1e-6):
    x0 = np.asarray(x0, float)
    out = np.zeros(x0.size)
    for i in range(x0.size):
        e = np.zeros(x0.size)
        e[i] = eps
        out[i] = (f((x0.ravel() + e).reshape(x0.shape)) - f((x0.ravel() - e).reshape(x0.shape))) / (2 * eps)
    return out.reshape(x0.shape)


def test_gradients_match_finite_differences(rng):
    X, y, Z, kernel, a = make_problem(rng)
    a[:3] = (2 * y[:3] - 1) * np.array([-9.0, -5.0, 6.0])  # some points deep in the tails
    _, _, g, _ = bound(kernel, Z, X, y, a, with_grad=True)
    num_a = fd(lambda v: bound(kernel, Z, X, y, v)[0], a)
    np.testing.assert_allclose(g["a"], num_a, rtol=1e-6, atol=1e-8)
    num_Z = fd(lambda v: bound(kernel, v, X, y, a)[0], Z)
    np.testing.assert_allclose(g["Z"], num_Z, rtol=1e-6, atol=1e-8)
    p0 = kernel.params

    def at_params(p):
        kernel.params = p
        value = bound(kernel, Z, X, y, a)[0]
        kernel.params = p0
        return value

    np.testing.assert_allclose(g["kernel"], fd(at_params, p0), rtol=1e-6, atol=1e-8)


def test_relative_jitter_is_differentiated(rng):
    # The jitter is jitter x mean(diag Kzz): the kernel's gradient includes its share, which a
    # large jitter makes visible (0.3 x the variance on Kzz's diagonal).
    X, y, Z, kernel, a = make_problem(rng)
    value, _, g, _ = bound(kernel, Z, X, y, a, jitter=0.3, with_grad=True)
    np.testing.assert_allclose(value, ref_bound_eq12(kernel, Z, X, y, a, jitter=0.3), rtol=1e-10)
    p0 = kernel.params

    def at_params(p):
        kernel.params = p
        value = bound(kernel, Z, X, y, a, jitter=0.3)[0]
        kernel.params = p0
        return value

    np.testing.assert_allclose(g["kernel"], fd(at_params, p0), rtol=1e-6, atol=1e-8)


def test_profiled_gradient_is_the_envelope_gradient(rng):
    # At the optimal a, the partial gradient w.r.t. the kernel parameters and Z is the gradient of
    # the profiled bound max_a L (what the outer optimiser sees).
    X, y, Z, kernel, a = make_problem(rng, N=12, M=4)
    _, a_opt, g, info = bound(kernel, Z, X, y, a, solve_a=True, with_grad=True)
    assert info["inner_converged"]
    p0 = kernel.params

    def profiled(p):
        kernel.params = p
        value = bound(kernel, Z, X, y, a_opt, solve_a=True)[0]
        kernel.params = p0
        return value

    np.testing.assert_allclose(g["kernel"], fd(profiled, p0, eps=1e-5), rtol=1e-5, atol=1e-7)
    num_Z = fd(lambda v: bound(kernel, v, X, y, a_opt, solve_a=True)[0], Z, eps=1e-5)
    np.testing.assert_allclose(g["Z"], num_Z, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- optimal a
def test_optimal_a_is_the_mean_field_fixed_point(rng):
    X, y, Z, kernel, a = make_problem(rng, N=20, M=6)
    kernel = kernels.RBF(variance=8.0, lengthscale=np.array([2.0, 2.0]))  # strongly correlated
    value, a_opt, g, info = bound(kernel, Z, X, y, 5 * a, solve_a=True, with_grad=True)
    assert info["inner_converged"] and info["inner_iterations"] < 30
    assert np.abs(g["a"]).max() < 1e-9
    # Coordinate-ascent update of q(g_n) (dense): a_n = E[g_n] - (C^-1 E[g])_n / [C^-1]_nn.
    Ci = dense_parts(kernel, Z, X)[4]
    Eg, _ = truncated_moments(a_opt, 1.0 / np.diag(Ci), y)
    np.testing.assert_allclose(a_opt, Eg - (Ci @ Eg) / np.diag(Ci), rtol=1e-8, atol=1e-8)
    # A maximum: every perturbation lowers the bound; and the optimum is unique.
    for _ in range(5):
        assert bound(kernel, Z, X, y, a_opt + 0.05 * rng.standard_normal(20))[0] < value
    other = bound(kernel, Z, X, y, -20 * np.ones(20), solve_a=True)
    np.testing.assert_allclose(other[1], a_opt, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(other[0], value, rtol=1e-12)


def test_warm_start_at_the_optimum_takes_no_newton_step(rng):
    X, y, Z, kernel, a = make_problem(rng)
    _, a_opt, _, _ = bound(kernel, Z, X, y, a, solve_a=True)
    _, a_again, _, info = bound(kernel, Z, X, y, a_opt, solve_a=True)
    assert info["inner_iterations"] == 0
    np.testing.assert_allclose(a_again, a_opt, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- limiting cases
def orthant_log_probability(C, y):
    """log P(s_n g_n > 0 for all n), g ~ N(0, C), N = 3 (the exact probit marginal likelihood
    with C = K + I): 1/8 + sum_{i<j} arcsin(rho_ij) / (4 pi)."""
    s = 2 * y - 1
    d = np.sqrt(np.diag(C))
    R = (s[:, None] * s[None, :]) * C / np.outer(d, d)
    return np.log(0.125 + (np.arcsin(R[0, 1]) + np.arcsin(R[0, 2]) + np.arcsin(R[1, 2])) / (4 * np.pi))


def test_bound_never_exceeds_exact_probit_marginal_likelihood(rng):
    # Titsias' bound on p(g) holds for every g, so eq. (12) bounds log p(y) for every Z and a.
    X = rng.standard_normal((3, 2))
    y = np.array([1.0, 0.0, 1.0])
    kernel = kernels.RBF(variance=2.0, lengthscale=np.array([1.5, 1.0]))
    exact = orthant_log_probability(kernel(X) + np.eye(3), y)
    for _ in range(10):
        Z = rng.standard_normal((int(rng.integers(1, 5)), 2))
        assert bound(kernel, Z, X, y, rng.standard_normal(3))[0] < exact
        assert bound(kernel, Z, X, y, np.zeros(3), solve_a=True)[0] < exact
    # With Z = X the trace term vanishes: at the optimal a the bound is the full mean-field
    # bound, below log p(y) by a gap that comes from the posterior correlations mean field drops.
    gaps = []
    for lengthscale in (3.0, 1.0, 0.3, 0.03):
        kernel.lengthscale = np.array([lengthscale, lengthscale])
        exact = orthant_log_probability(kernel(X) + np.eye(3), y)
        gaps.append(exact - bound(kernel, X, X, y, np.zeros(3), solve_a=True, jitter=1e-10)[0])
    assert gaps[0] > 1e-3 and np.all(np.diff(gaps) < 0) and 0 <= gaps[-1] < 1e-8


def test_independent_points_make_mean_field_exact(rng):
    # Z = X and K diagonal (points far apart on the lengthscale): the posterior of g factorises,
    # mean field is exact and the bound at the optimal a is log p(y) = N log(1/2).
    X = 10.0 * np.arange(5.0)[:, None]
    y = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    kernel = kernels.RBF(variance=3.0, lengthscale=1.0)
    value, a_opt, _, _ = bound(kernel, X, X, y, np.ones(5), solve_a=True, jitter=1e-10)
    np.testing.assert_allclose(value, 5 * np.log(0.5), atol=1e-8)
    np.testing.assert_allclose(a_opt, 0.0, atol=1e-8)  # q(g_n) = N(0, 1 + k) truncated


def test_inducing_at_data_equals_the_non_sparse_mean_field_bound(rng):
    X, y, _, kernel, a = make_problem(rng, N=8)
    K = kernel(X)
    C = K + np.eye(8)
    Ci = np.linalg.inv(C)
    s2 = 1 / np.diag(Ci)
    Eg, Vg = truncated_moments(a, s2, y)
    full = (log_ndtr((2 * y - 1) * a / np.sqrt(s2)).sum() - 0.5 * np.linalg.slogdet(C)[1]
            - 0.5 * (Eg @ Ci @ Eg + np.diag(Ci) @ Vg) + 0.5 * np.sum(np.log(s2) + (Vg + (Eg - a) ** 2) / s2))
    np.testing.assert_allclose(bound(kernel, X, X, y, a, jitter=1e-10)[0], full, rtol=1e-7)


# ---------------------------------------------------------------- predictions
def test_posterior_and_predictions_match_the_paper_formulas(rng):
    X, y, Z, kernel, a = make_problem(rng)
    Xs = rng.standard_normal((30, 2))
    q_mu, q_sqrt = mf_posterior(kernel, Z, X, y, a)
    assert np.all(np.triu(q_sqrt, 1) == 0)
    Kzz, Kzx, _, _, Ci = dense_parts(kernel, Z, X)
    Eg, _ = truncated_moments(a, 1 / np.diag(Ci), y)
    Sigma = Kzz - Kzx @ Ci @ Kzx.T  # the paper's p(u | y) ~ N(Sigma Kzz^-1 Kzx E[g], Sigma)
    mu_u = Sigma @ np.linalg.solve(Kzz, Kzx @ Eg)
    Lz = np.linalg.cholesky(Kzz)
    np.testing.assert_allclose(Lz @ q_mu, mu_u, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Lz @ q_sqrt @ q_sqrt.T @ Lz.T, Sigma, rtol=1e-8, atol=1e-10)
    model = pygpfast.svgp.SVGP(kernel, pygpfast.likelihoods.Bernoulli(), Z, q_mu, q_sqrt, whiten=True,
                               jitter=JITTER)
    mean, var = model.predict_f(Xs)
    Ksz = kernel(Xs, Z)
    P = np.linalg.solve(Kzz, Ksz.T).T
    np.testing.assert_allclose(mean, P @ mu_u, rtol=1e-8, atol=1e-10)
    ref_var = kernel.diag(Xs) - (P * Ksz).sum(1) + (P @ Sigma * P).sum(1)
    np.testing.assert_allclose(var, ref_var, rtol=1e-8, atol=1e-10)


def test_bound_thread_invariant(rng, restore_threads):
    N = 5000
    X = rng.standard_normal((N, 3))
    y = (X[:, 0] > 0).astype(float)
    Z = rng.standard_normal((6, 3))
    kernel = kernels.RBF(lengthscale=np.ones(3))
    out = []
    for T in (1, 2):
        pygpfast.set_num_threads(T)
        out.append(bound(kernel, Z, X, y, np.zeros(N), solve_a=True, with_grad=True))
    np.testing.assert_array_equal(out[0][1], out[1][1])
    assert out[0][0] == out[1][0]
    for key in ("a", "Z", "kernel"):
        np.testing.assert_array_equal(out[0][2][key], out[1][2][key])


# ---------------------------------------------------------------- core input checks
def test_core_rejects_bad_input(rng):
    X, y, Z, kernel, a = make_problem(rng, N=6)
    codes, params = kernel._spec(2)

    def call(**over):
        args = dict(codes=codes, params=params, Z=Z, X=X, y=y, a=a, jitter=JITTER, solve_a=False,
                    max_iter=10, tol=1e-10, with_grad=True)
        args.update(over)
        return _core.svgp.mf_bound(**args)

    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        call(y=2 * y - 1)
    with pytest.raises(ValueError, match="not finite"):
        call(a=np.where(np.arange(6) == 2, np.nan, a))
    with pytest.raises(ValueError, match="length 6"):
        call(a=a[:5])
    with pytest.raises(ValueError, match="columns"):
        call(X=np.ascontiguousarray(np.c_[X, X]))
    with pytest.raises(ValueError, match="tol"):
        call(solve_a=True, tol=0.0)


# ---------------------------------------------------------------- the estimator
def banana(rng, n):
    from sklearn.datasets import make_moons

    X, y = make_moons(n, noise=0.2, random_state=int(rng.integers(1 << 30)))
    return X, np.where(y == 1, "pos", "neg")


def test_classifier_mf_fits_banana_like_data(rng):
    X, y = banana(rng, 300)
    Xt, yt = banana(rng, 500)
    clf = SVGPClassifier(method="mf", n_inducing=12, random_state=0, max_iter=300).fit(X, y)
    assert clf.score(Xt, yt) > 0.93
    P = clf.predict_proba(Xt)
    np.testing.assert_allclose(P.sum(1), 1.0)
    nlp = -np.mean(np.log(P[np.arange(500), (yt == "pos").astype(int)]))
    assert nlp < 0.25
    assert clf.mf_a_.shape == (300,) and clf.inducing_points_.shape == (12, 2)
    assert clf.optimizer_ == "lbfgs" and len(clf.history_) == clf.n_iter_ > 0
    # objective_ is eq. (12) at the fitted a, Z and kernel plus the log prior of the kernel's
    # hyperparameters, and the history increases overall.
    t = (y == "pos").astype(float)
    value = bound(clf.kernel_, clf.inducing_points_, X, t, clf.mf_a_)[0]
    assert clf.log_prior_ == clf.kernel_.log_prior() < 0.0
    np.testing.assert_allclose(clf.objective_, value + clf.log_prior_, rtol=1e-10)
    assert clf.history_[-1] >= clf.history_[0]
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(clone.predict_proba(Xt), P)


def test_classifier_mf_with_frozen_hyperparameters_only_solves_a(rng):
    X, y = banana(rng, 100)
    clf = SVGPClassifier(method="mf", n_inducing=6, random_state=0, train_inducing=False,
                         optimize_hyperparameters=False, kernel=kernels.RBF(lengthscale=0.5)).fit(X, y)
    assert clf.n_iter_ == 0 and clf.history_.size == 0
    assert clf.kernel_.lengthscale == 0.5
    t = (y == "pos").astype(float)
    _, _, g, _ = bound(clf.kernel_, clf.inducing_points_, X, t, clf.mf_a_, with_grad=True)
    assert np.abs(g["a"]).max() < 1e-8


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SVGPClassifier(method="mf", likelihood="logit"), "probit"),
        (lambda: SVGPRegressor(method="mf"), "probit"),
        (lambda: SVGPClassifier(method="mf", optimizer="adam"), "L-BFGS-B"),
        (lambda: SVGPClassifier(method="mf", batch_size=32), "L-BFGS-B"),
        (lambda: SVGPClassifier(method="ep"), "one of 'kl', 'mf'"),
    ],
)
def test_mf_bad_settings(make, match):
    X = np.random.default_rng(0).standard_normal((20, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match=match):
        make().fit(X, y)


def test_mf_rejects_multiclass():
    X = np.random.default_rng(0).standard_normal((30, 2))
    y = np.arange(30) % 3
    with pytest.raises(ValueError, match="classes"):
        SVGPClassifier(method="mf", n_inducing=4).fit(X, y)


@pytest.mark.parametrize("nit, match", [(0, "stopped after 0 iterations"), (5, "max_iter=5")])
def test_lbfgs_stops_are_convergence_warnings_at_the_caller(monkeypatch, nit, match):
    # An L-BFGS-B stop short of max_iter (a failed line search) counted as converged; both
    # stops now warn, from the caller's line. scipy's result is replaced by an unsuccessful one.
    import warnings

    import scipy.optimize
    from sklearn.exceptions import ConvergenceWarning

    real = scipy.optimize.minimize

    def failing(*args, **kwargs):
        res = real(*args, **{**kwargs, "options": {**kwargs["options"], "maxiter": 1}})
        res.success, res.nit, res.message = False, nit, "ABNORMAL: "
        return res

    monkeypatch.setattr(scipy.optimize, "minimize", failing)
    rng = np.random.RandomState(0)
    X = rng.randn(60, 2)
    y = (X[:, 0] > 0).astype(int)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pygpfast.SVGPClassifier(n_inducing=8, method="mf", max_iter=5, random_state=0).fit(X, y)
    mine = [w for w in caught if issubclass(w.category, ConvergenceWarning) and match in str(w.message)]
    assert mine and mine[0].filename == __file__
