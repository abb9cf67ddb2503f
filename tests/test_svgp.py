"""SVGP: ELBO and gradients against a dense numpy reference, the paper's limiting cases,
and the estimators' behaviour."""


import copy

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from scipy.special import gammaln, log_ndtr

import pygpfast
from pygpfast import _core, kernels, likelihoods
from pygpfast.svgp import SVGP, SVGPClassifier, SVGPRegressor
from dense import jittered

GH_X, GH_W = np.polynomial.hermite.hermgauss(20)


# ---------------------------------------------------------------- dense reference
def ref_expectation(name, y, mu, var, noise=1.0):
    if name == "gaussian":
        return -0.5 * np.log(2 * np.pi * noise) - 0.5 * ((y - mu) ** 2 + var) / noise
    if name.startswith("poisson"):
        return y * mu - np.exp(mu + var / 2) - gammaln(y + 1)
    F = mu[:, None] + np.sqrt(2 * var)[:, None] * GH_X
    s = (2 * y - 1)[:, None]
    logp = log_ndtr(s * F) if name == "probit" else -np.logaddexp(0, -s * F)
    return logp @ GH_W / np.sqrt(np.pi)


def ref_elbo(kernel, name, noise, Z, q_mu, q_sqrt, whiten, X, y, scale, jitter, prior_mean=0.0):
    M = Z.shape[0]
    Kzz = jittered(kernel(Z), jitter)
    Kzx = kernel(Z, X)
    kxx = kernel.diag(X)
    Lz = np.linalg.cholesky(Kzz)
    L = np.tril(q_sqrt)
    S = L @ L.T
    if whiten:
        A = scipy.linalg.solve_triangular(Lz, Kzx, lower=True)
        mu = A.T @ q_mu
        var = kxx - (A * A).sum(0) + ((L.T @ A) ** 2).sum(0)
        kl = 0.5 * (np.trace(S) + q_mu @ q_mu - M - np.linalg.slogdet(S)[1])
    else:
        KiKzx = np.linalg.solve(Kzz, Kzx)
        mu = KiKzx.T @ q_mu
        var = kxx - (Kzx * KiKzx).sum(0) + ((L.T @ KiKzx) ** 2).sum(0)
        Kinv = np.linalg.inv(Kzz)
        kl = 0.5 * (
            np.trace(Kinv @ S) + q_mu @ Kinv @ q_mu - M
            + np.linalg.slogdet(Kzz)[1] - np.linalg.slogdet(S)[1]
        )
    return scale * ref_expectation(name, y, mu + prior_mean, var, noise).sum() - kl


LIKELIHOODS = {
    "gaussian": lambda: likelihoods.Gaussian(variance=0.3),
    "probit": lambda: likelihoods.Bernoulli(link="probit"),
    "logit": lambda: likelihoods.Bernoulli(link="logit"),
    "poisson": lambda: likelihoods.Poisson(),
    "poisson-real": lambda: likelihoods.Poisson(),  # (non-integer targets: the same formula)
}


def make_problem(rng, name, M=6, B=15, D=2):
    X = rng.standard_normal((B, D))
    Z = rng.standard_normal((M, D))
    if name == "gaussian":
        y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(B)
    elif name == "poisson":
        y = rng.poisson(2.0, B).astype(float)
    elif name == "poisson-real":
        y = rng.poisson(2.0, B) + rng.uniform(0.0, 1.0, B)
        y[0] = 2.5
    else:
        y = (X[:, 0] > 0).astype(float)
    kernel = kernels.RBF(variance=1.4, lengthscale=np.array([0.9, 1.6])) + kernels.Linear(variance=0.2)
    q_mu = 0.3 * rng.standard_normal(M)
    q_sqrt = np.tril(0.2 * rng.standard_normal((M, M))) + 0.8 * np.eye(M)
    return X, y, Z, kernel, q_mu, q_sqrt


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_elbo_matches_dense_reference(rng, name, whiten):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng, name)
    lik = LIKELIHOODS[name]()
    q_sqrt_with_junk = q_sqrt + np.triu(np.ones_like(q_sqrt), 1)  # upper triangle is ignored
    model = SVGP(kernel, lik, Z, q_mu, q_sqrt, whiten=whiten, jitter=1e-6)
    model.q_sqrt = q_sqrt_with_junk
    value, _ = model.elbo(X, y, scale=3.0)
    ref = ref_elbo(kernel, name, 0.3, Z, q_mu, q_sqrt, whiten, X, y, 3.0, 1e-6)
    np.testing.assert_allclose(value, ref, rtol=1e-10)


def _fd_check(model, X, y, scale, attr_get, attr_set, analytic, eps=1e-5, rtol=2e-5, atol=1e-6):
    # (eps = 1e-5: the ELBO's rounding noise, ~1e-13 relative on the precomputed path, over a
    # smaller step would swamp the central difference)
    x0 = attr_get().copy()
    num = np.zeros_like(x0)
    flat = x0.reshape(-1)
    for i in range(flat.size):
        xp, xm = flat.copy(), flat.copy()
        xp[i] += eps
        xm[i] -= eps
        attr_set(xp.reshape(x0.shape))
        fp = model.elbo(X, y, scale=scale)[0]
        attr_set(xm.reshape(x0.shape))
        fm = model.elbo(X, y, scale=scale)[0]
        num.reshape(-1)[i] = (fp - fm) / (2 * eps)
    attr_set(x0)
    np.testing.assert_allclose(analytic, num, rtol=rtol, atol=atol)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("name", ["poisson", "poisson-real", "probit"])
def test_constant_prior_mean(rng, name, whiten):
    """f = prior_mean + a zero-mean GP: the ELBO against the dense reference with the marginal
    means shifted, its gradient against finite differences on both marginal paths, and the
    predictions shifted by it (the KL, about u's deviation from the mean, is unchanged)."""
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng, name, B=40)
    model = SVGP(kernel, LIKELIHOODS[name](), Z, q_mu, q_sqrt, whiten=whiten, prior_mean=[0.7])
    value, g = model.elbo(X, y, scale=2.5, with_grad=True)
    ref = ref_elbo(kernel, name, 0.3, Z, q_mu, q_sqrt, whiten, X, y, 2.5, 1e-6, prior_mean=0.7)
    np.testing.assert_allclose(value, ref, rtol=1e-10)
    _fd_check(model, X, y, 2.5, lambda: model.prior_mean, lambda v: setattr(model, "prior_mean", v),
              g["prior_mean"])
    codes, params = kernel._spec(2)
    for path in ("solve", "precomputed"):
        *_, grads, used = _core.svgp.elbo(codes, params, *model.likelihood._core_args(), Z=Z, q_mu=q_mu, q_sqrt=q_sqrt,
                                         whiten=whiten, X=X, y=y, scale=2.5, jitter=1e-6, with_grad=True, path=path, return_path=True,
                                         prior_mean=model.prior_mean)
        assert used == path
        np.testing.assert_allclose(grads[5], g["prior_mean"], rtol=1e-9)
    mean, var = model.predict_f(X[:7])
    zero = SVGP(kernel, LIKELIHOODS[name](), Z, q_mu, q_sqrt, whiten=whiten)
    mean0, var0 = zero.predict_f(X[:7])
    np.testing.assert_allclose(mean, mean0 + 0.7, rtol=1e-13)
    np.testing.assert_array_equal(var, var0)
    with pytest.raises(ValueError, match="prior_mean"):
        _core.svgp.elbo(codes, params, *model.likelihood._core_args(), Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=whiten, X=X, y=y,
                        scale=1.0, jitter=1e-6, with_grad=False, prior_mean=np.array([np.nan]))


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_gradients_match_finite_differences(rng, name, whiten):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng, name)
    model = SVGP(kernel, LIKELIHOODS[name](), Z, q_mu, q_sqrt, whiten=whiten, jitter=1e-6)
    scale = 2.5
    _, g = model.elbo(X, y, scale=scale, with_grad=True)

    def setter(attr):
        def set_(v):
            setattr(model, attr, np.ascontiguousarray(v))
        return set_

    _fd_check(model, X, y, scale, lambda: model.q_mu, setter("q_mu"), g["q_mu"])
    analytic_L = g["q_sqrt"]
    assert np.all(np.triu(analytic_L, 1) == 0)
    _fd_check(model, X, y, scale, lambda: model.q_sqrt, setter("q_sqrt"),
              np.where(np.tri(len(q_mu), dtype=bool), analytic_L, 0.0))
    _fd_check(model, X, y, scale, lambda: model.Z, setter("Z"), g["Z"])

    def kset(p):
        model.kernel.theta = np.log(p)

    _fd_check(model, X, y, scale, lambda: model.kernel.params, kset, g["kernel"])
    if name == "gaussian":
        def lset(p):
            model.likelihood.theta = np.log(p)

        _fd_check(model, X, y, scale, lambda: model.likelihood.params, lset, g["likelihood"])


def optimal_gaussian_q(kernel, Z, X, y, noise, jitter):
    """The optimal whitened q(v) for a Gaussian likelihood (full batch)."""
    M = Z.shape[0]
    Lz = np.linalg.cholesky(jittered(kernel(Z), jitter))
    A = scipy.linalg.solve_triangular(Lz, kernel(Z, X), lower=True)
    Sigma = np.linalg.inv(np.eye(M) + A @ A.T / noise)
    m = Sigma @ A @ y / noise
    return m, np.linalg.cholesky(Sigma), A


def test_optimal_q_gives_titsias_collapsed_bound(rng):
    X = rng.uniform(-3, 3, (60, 1))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(60)
    Z = np.linspace(-3, 3, 9)[:, None]
    kernel = kernels.RBF(variance=1.2, lengthscale=0.7)
    noise, jitter = 0.05, 1e-8
    m, L, A = optimal_gaussian_q(kernel, Z, X, y, noise, jitter)
    model = SVGP(kernel, likelihoods.Gaussian(variance=noise), Z, m, L, whiten=True, jitter=jitter)
    elbo, g = model.elbo(X, y, with_grad=True)
    Qff = A.T @ A
    titsias = (
        scipy.stats.multivariate_normal(np.zeros(60), Qff + noise * np.eye(60)).logpdf(y)
        - (kernel.diag(X).sum() - np.trace(Qff)) / (2 * noise)
    )
    np.testing.assert_allclose(elbo, titsias, rtol=1e-9)
    # The optimum is stationary in q.
    assert np.abs(g["q_mu"]).max() < 1e-7 * max(1.0, np.abs(m).max())
    assert np.abs(g["q_sqrt"]).max() < 1e-6


def test_inducing_at_data_gives_exact_marginal_likelihood(rng):
    X = rng.uniform(-3, 3, (25, 2))
    y = np.cos(X[:, 0]) * X[:, 1] + 0.1 * rng.standard_normal(25)
    kernel = kernels.Matern52(variance=0.8, lengthscale=np.array([1.1, 0.9]))
    noise, jitter = 0.1, 1e-9
    m, L, _ = optimal_gaussian_q(kernel, X, X, y, noise, jitter)
    for whiten in (True, False):
        if whiten:
            q_mu, q_sqrt = m, L
        else:
            Lz = np.linalg.cholesky(jittered(kernel(X), jitter))
            q_mu, q_sqrt = Lz @ m, Lz @ L
        model = SVGP(kernel, likelihoods.Gaussian(variance=noise), X, q_mu, q_sqrt, whiten=whiten,
                     jitter=jitter)
        exact = scipy.stats.multivariate_normal(np.zeros(25), kernel(X) + noise * np.eye(25)).logpdf(y)
        np.testing.assert_allclose(model.elbo(X, y)[0], exact, rtol=1e-7)


def test_predict_f_matches_reference(rng):
    X, y, Z, kernel, q_mu, q_sqrt = make_problem(rng, "probit")
    Xs = rng.standard_normal((40, 2))
    for whiten in (True, False):
        model = SVGP(kernel, likelihoods.Bernoulli(), Z, q_mu, q_sqrt, whiten=whiten)
        mean, var = model.predict_f(Xs)
        Kzz = jittered(kernel(Z), 1e-6)
        Kzs = kernel(Z, Xs)
        S = q_sqrt @ q_sqrt.T
        if whiten:
            Lz = np.linalg.cholesky(Kzz)
            A = scipy.linalg.solve_triangular(Lz, Kzs, lower=True)
            ref_m = A.T @ q_mu
            ref_v = kernel.diag(Xs) - (A * A).sum(0) + (A * (S @ A)).sum(0)
        else:
            KiK = np.linalg.solve(Kzz, Kzs)
            ref_m = KiK.T @ q_mu
            ref_v = kernel.diag(Xs) - (Kzs * KiK).sum(0) + (KiK * (S @ KiK)).sum(0)
        np.testing.assert_allclose(mean, ref_m, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(var, ref_v, rtol=1e-9, atol=1e-12)


def test_elbo_thread_invariant(rng, restore_threads):
    X = rng.standard_normal((3000, 3))
    y = (X[:, 0] + X[:, 1] > 0).astype(float)
    Z = rng.standard_normal((50, 3))
    model = SVGP(kernels.RBF(lengthscale=np.ones(3)), likelihoods.Bernoulli(), Z,
                 0.1 * rng.standard_normal(50), np.eye(50) * 0.7)
    out = []
    for T in (1, 2):
        pygpfast.set_num_threads(T)
        v, g = model.elbo(X, y, scale=2.0, with_grad=True)
        out.append((v, g))
    # The minibatch's column blocks depend on B alone, each runs single-threaded BLAS and their
    # partial gradients are summed in block order (svgp.hpp): the same result to the bit. Where
    # the BLAS thread count cannot be set the blocks run on one thread and their calls on the
    # BLAS's threads (threads_for_blas_calls), which round differently (Z's gradient 2e-12 apart).
    if pygpfast._core.blas.thread_control:
        assert out[0][0] == out[1][0]
        for key in ("q_mu", "q_sqrt", "Z", "kernel"):
            np.testing.assert_array_equal(out[0][1][key], out[1][1][key])
    else:
        assert out[0][0] == pytest.approx(out[1][0], rel=1e-13)
        for key in ("q_mu", "q_sqrt", "Z", "kernel"):
            a, b = out[0][1][key], out[1][1][key]
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10 * np.abs(a).max())


# ---------------------------------------------------------------- estimators
def two_moons(rng, n):
    from sklearn.datasets import make_moons

    X, y = make_moons(n, noise=0.2, random_state=int(rng.integers(1 << 30)))
    return X, np.where(y == 1, "yes", "no")


def test_classifier_fits_and_predicts(rng):
    X, y = two_moons(rng, 400)
    Xt, yt = two_moons(rng, 400)
    clf = SVGPClassifier(n_inducing=20, max_iter=2000, random_state=0).fit(X, y)
    assert set(clf.classes_) == {"no", "yes"}
    assert clf.score(Xt, yt) > 0.93
    P = clf.predict_proba(Xt)
    assert P.shape == (400, 2)
    np.testing.assert_allclose(P.sum(1), 1.0)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(Xt)), P, rtol=1e-9, atol=1e-12)
    assert clf.inducing_points_.shape == (20, 2)
    assert np.isfinite(clf.objective_) and len(clf.history_) > 0
    mean, var = clf.predict_latent(Xt)
    assert mean.shape == var.shape == (400,) and np.all(var > 0)


def test_classifier_adam_minibatch_path(rng):
    X, y = two_moons(rng, 2000)
    clf = SVGPClassifier(n_inducing=16, optimizer="adam", batch_size=128, learning_rate=0.05,
                         max_iter=600, random_state=1).fit(X, y)
    assert clf.optimizer_ == "adam"
    assert clf.score(*two_moons(rng, 500)) > 0.9


def exact_gp_map(kernel, likelihood, X, t):
    """Copies of `kernel` and the Gaussian `likelihood` at the maximum of the exact GP's log
    marginal likelihood of targets t plus their log priors (the objective SVGPRegressor
    bounds), densely by Nelder-Mead from their current hyperparameters."""
    kernel, likelihood = copy.deepcopy(kernel), copy.deepcopy(likelihood)
    n = kernel.n_params

    def negative(theta):
        kernel.theta, likelihood.theta = theta[:n], theta[n:]
        L = np.linalg.cholesky(kernel(X) + likelihood.params[0] * np.eye(len(X)))
        a = scipy.linalg.solve_triangular(L, t, lower=True)
        return 0.5 * a @ a + np.log(np.diag(L)).sum() - kernel.log_prior() - likelihood.log_prior()

    r = scipy.optimize.minimize(negative, np.concatenate([kernel.theta, likelihood.theta]),
                                method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10})
    assert r.success
    negative(r.x)
    return kernel, likelihood


def test_regressor_recovers_function(rng, one_blas_thread):
    X = rng.uniform(-3, 3, (300, 1))
    f = np.sin(2 * X[:, 0])
    y = f + 0.1 * rng.standard_normal(300)
    reg = SVGPRegressor(n_inducing=15, max_iter=2000, random_state=0).fit(X, y)
    Xs = np.linspace(-2.5, 2.5, 50)[:, None]
    mean, std = reg.predict(Xs, return_std=True)
    assert np.abs(mean - np.sin(2 * Xs[:, 0])).max() < 0.15
    # The noise variance at the exact GP's optimum of the same objective (the sparse bound's
    # optimum lies near it with M = 15 on this 1-D function): 0.0096076 against 0.0096189,
    # 1.2e-3 apart (1e-3 to 1.2e-2 over data seeds 0 to 4; rtol 0.5 against the truth before).
    # That optimum is itself the truth 0.01 up to sampling, sd 0.01 sqrt(2 / 300) = 8e-4.
    noise = reg.likelihood_.params[0] * reg.y_scale_**2
    _, exact = exact_gp_map(reg.kernel_, reg.likelihood_, X, (y - reg.y_mean_) / reg.y_scale_)
    np.testing.assert_allclose(noise, exact.params[0] * reg.y_scale_**2, rtol=1e-2)
    assert abs(noise - 0.01) < 3 * 0.01 * np.sqrt(2 / 300)
    assert np.all(std > 0.05)


@pytest.mark.parametrize("optimizer, rtol", [("lbfgs", 0.05), ("natgrad", 0.1)])
def test_poisson_regressor_fits_real_targets(rng, optimizer, rtol):
    # Exact (non-integer) rates as targets: the Poisson quasi-likelihood's optimum is the rate.
    # (fit, and three passes of partial_fit over four chunks; measured 0.018 and 0.029)
    X = rng.uniform(-2, 2, (200, 1))
    rate = 5.0 * np.exp(1.0 + np.sin(2 * X[:, 0]))
    reg = SVGPRegressor(likelihood="poisson", optimizer=optimizer, n_inducing=15,
                        max_iter=300, random_state=0)
    if optimizer == "lbfgs":
        reg.fit(X, rate)
    else:
        for chunk in 3 * np.array_split(np.arange(200), 4):
            reg.partial_fit(X[chunk], rate[chunk])
    Xs = np.linspace(-1.5, 1.5, 20)[:, None]
    pred = reg.predict(Xs)
    np.testing.assert_allclose(pred, 5.0 * np.exp(1.0 + np.sin(2 * Xs[:, 0])), rtol=rtol)


@pytest.mark.parametrize("bad", [-1.0, -0.25])
def test_poisson_regressor_names_a_negative_target(rng, bad):
    # Minibatch steps checked each batch, and named a row of the batch: y[3] for y[7].
    X = rng.standard_normal((40, 2))
    y = rng.poisson(2.0, 40).astype(float)
    y[7] = bad
    message = (rf"y\[7\] = {bad:g} is outside the support of the Poisson likelihood: labels must "
               r"be finite and >= 0")
    for optimizer in ("lbfgs", "adam"):
        reg = SVGPRegressor(likelihood="poisson", optimizer=optimizer, batch_size=8,
                            n_inducing=5, max_iter=3, random_state=0)
        with pytest.raises(ValueError, match=message):
            reg.fit(X, y)
    reg = SVGPRegressor(likelihood="poisson", batch_size=8, n_inducing=5, random_state=0)
    reg.partial_fit(X[20:], y[20:])
    with pytest.raises(ValueError, match=message):
        reg.partial_fit(X, y)
    for value, what in ((np.nan, "NaN"), (np.inf, "infinity")):  # (scikit-learn's message)
        y[7] = value
        with pytest.raises(ValueError, match=f"Input y contains {what}"):
            SVGPRegressor(likelihood="poisson").fit(X, y)


def test_callback_can_stop_and_verbose_prints(rng, capsys):
    X, y = two_moons(rng, 200)
    seen = []

    def cb(est, it, elbo):
        seen.append(elbo)
        return it >= 3

    SVGPClassifier(n_inducing=8, max_iter=100, verbose=1, callback=cb, random_state=0).fit(X, y)
    assert len(seen) == 3
    assert "ELBO" in capsys.readouterr().out
    seen.clear()
    SVGPClassifier(n_inducing=8, max_iter=100, verbose=True, callback=cb, random_state=0).fit(X, y)
    assert capsys.readouterr().out.count("ELBO") == 3  # True: every iteration


@pytest.mark.parametrize(
    "X, y, match",
    [
        (np.ones((4, 2)), np.array([0.5, 1.5, 2.5, 3.5]), "Unknown label type"),
        (np.ones((3, 0)), np.array([0, 1, 0]), "0 feature.* required by SVGPClassifier"),
    ],
)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_classifier_bad_input(X, y, match):
    with pytest.raises(ValueError, match=match):
        SVGPClassifier(max_iter=5).fit(X, y)


@pytest.mark.parametrize(
    "kwargs",
    [{"optimizer": "sgd"}, {"n_inducing": 0}, {"max_iter": 0}, {"batch_size": -3},
     {"learning_rate": 0.0}, {"method": "ep"}],
)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_bad_parameters(kwargs):
    X = np.random.default_rng(0).standard_normal((20, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError):
        SVGPClassifier(**kwargs).fit(X, y)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_predict_before_fit_and_wrong_width(rng):
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        SVGPClassifier().predict(np.ones((2, 2)))
    X, y = two_moons(rng, 100)
    clf = SVGPClassifier(n_inducing=5, max_iter=10).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(np.ones((2, 3)))
