"""VGPClassifier and VGPPoissonRegressor on adversarial but plausible inputs: large counts and
prior variances, features in any units, tiny class probabilities, bad parameters."""

import warnings

import numpy as np
import pytest
from scipy import integrate, special
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from pygpfast import LinAlgError, VGPClassifier, VGPPoissonRegressor, cvi
from latent_major import infer as _infer, oa_objective as _oa_objective
from pygpfast.kernels import RBF, Linear



@pytest.mark.parametrize("seed", [0, 3])
def test_poisson_search_survives_far_trial_points(seed):
    # Rates around e^5: L-BFGS-B's first trial point puts every hyperparameter on its bounds,
    # where the inference warm-started from the previous optimum overflowed (a ValueError
    # from the core's Cholesky) and ended the fit instead of falling back to a cold start.
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((50, 2))
    y = rng.poisson(np.exp(5.0 + np.sin(3.0 * X[:, 0])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = VGPPoissonRegressor(random_state=0).fit(X, y)
    assert np.isfinite(reg.objective_) and reg.objective_ < 0
    pred = reg.predict(X)
    assert np.all(np.isfinite(pred))
    assert np.corrcoef(np.log(pred), 5.0 + np.sin(3.0 * X[:, 0]))[0, 1] > 0.9


def _poisson_problem(n=200, variance=100.0):
    rng = np.random.default_rng(0)
    X = rng.uniform(-3.0, 3.0, (n, 1))
    y = rng.poisson(np.exp(1.0 + np.cos(X[:, 0]))).astype(np.float64)
    K = RBF(variance=variance, lengthscale=1.0)(X) + 1e-8 * variance * np.eye(n)
    return X, y, K


def test_opper_archambeau_backs_off_from_overflowing_steps():
    # From unit site precisions at prior variance 100, L-BFGS-B's first trial step overflowed
    # exp(m + v/2); its line search cannot backtrack from an infinite value, so it went back
    # to the start and reported convergence there (bound -923 against the optimum's -402).
    _, y, K = _poisson_problem()
    lb = cvi.LocalBound("poisson")
    best = _infer(K, y, lb, lambda_=np.ones((1, len(y))), tol=1e-13)
    oa = _infer(K, y, lb, method="opper-archambeau", lambda_=np.ones((1, len(y))),
                   max_iter=300, tol=1e-12)
    assert oa.info["overflowing_trials"] >= 1
    assert np.all(np.isfinite(oa.history[:, 0])) and np.all(np.diff(oa.history[:, 0]) >= 0)
    assert oa.history[0, 0] < -900.0
    assert best.bound - 0.02 * abs(best.bound) < oa.bound <= best.bound + 1e-9


def test_opper_archambeau_start_with_infinite_bound_is_a_clear_error():
    _, y, K = _poisson_problem(variance=1e4)
    with pytest.raises(ValueError, match="not finite at the starting point"):
        _infer(K, y, cvi.LocalBound("poisson"), method="opper-archambeau")


@pytest.mark.parametrize("variance", [100.0, 1e3])
def test_opper_archambeau_estimator_says_when_it_stops_short(variance):
    # Prior variance 1000 crashed the fit ("the Opper-Archambeau parameters must be finite");
    # at 100 L-BFGS-B's relative-reduction test passed 6.6 nats below the optimum, silently.
    X, y, _ = _poisson_problem()
    kernel = RBF(variance=variance, lengthscale=1.0)
    with pytest.warns(ConvergenceWarning, match="below the optimum"):
        oa = VGPPoissonRegressor(kernel=kernel, method="opper-archambeau",
                                 optimize_hyperparameters=False).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        fp = VGPPoissonRegressor(kernel=kernel, optimize_hyperparameters=False).fit(X, y)
    assert np.isfinite(oa.objective_) and oa.objective_ < fp.objective_
    assert np.all(np.isfinite(oa.predict(X)))


@pytest.mark.parametrize("variance", [500.0, 1e3, 1e5])
def test_poisson_large_prior_variance(variance, rng):
    # exp(m + v/2) from the start V = K overflowed: a LinAlgError or ValueError from the core,
    # or a non-converged "bound" of +4e95 (a bound on log p(y) <= 0).
    X = rng.standard_normal((40, 2))
    y = rng.poisson(np.exp(1.0 + np.sin(X[:, 0])))
    with warnings.catch_warnings():  # (at 1e5 the core stops short of tol: refused solves)
        warnings.simplefilter("ignore" if variance > 1e3 else "error", ConvergenceWarning)
        reg = VGPPoissonRegressor(kernel=RBF(variance=variance, lengthscale=1.0),
                                  optimize_hyperparameters=False).fit(X, y)
    assert np.isfinite(reg.objective_) and reg.objective_ < 0
    assert np.all(np.diff(reg.history_) >= -1e-9 * abs(reg.objective_))
    assert np.all(np.isfinite(reg.predict(X)))


def test_poisson_large_counts_with_hyperparameter_learning(rng):
    X = rng.standard_normal((40, 2))
    y = 1000 * rng.poisson(np.exp(1.0 + np.sin(X[:, 0])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = VGPPoissonRegressor(random_state=0).fit(X, y)
    assert np.isfinite(reg.objective_) and reg.objective_ < 0


@pytest.mark.parametrize("scale", [1e3, 1e7])
def test_poisson_counts_of_millions_predict_the_counts(scale):
    # Sites with lambda ~ counts ~ 1e7: Pi = Lambda - Lambda V Lambda lost every digit, and the
    # predictions at the training inputs were up to 1e15 times the counts (latent variances of
    # 69 instead of ~1e-7), with the inference converged and no warning. Poisson noise is
    # 1 / sqrt(counts) relative, so the posterior mean must sit within a few of those.
    rng = np.random.RandomState(2)
    X = rng.uniform(-2, 2, (60, 1))
    y = rng.poisson(scale * np.exp(0.5 * np.sin(2 * X[:, 0])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = VGPPoissonRegressor(random_state=0).fit(X, y)
    assert np.max(np.abs(reg.predict(X) / y - 1)) < 5 / np.sqrt(y.min())
    # The latent variances at the training inputs, ~1/y = 1e-7 at 1e7 counts: the explicit
    # quadratic form k** - k^T Pi k left an absolute error of that order (5x too large). The
    # reference has no cancellation: with Kj = K + d I (the fit's jitter d), Pi = (Kj +
    # Lambda^-1)^-1 and b = (B^-1)_ii, B = I + Lambda^1/2 Kj Lambda^1/2, the variance at x_i
    # is K_ii - k_i^T Pi k_i = (1 - b) / lambda_i + d - 2 d b - d^2 lambda_i b.
    _, var = reg.predict_latent(X)
    K = reg.kernel_(X)
    d = reg.jitter * np.mean(np.diag(K))
    lam = reg.lambda_[:, 0]
    r = np.sqrt(lam)
    b = np.diag(np.linalg.inv(np.eye(len(y)) + r[:, None] * (K + d * np.eye(len(y))) * r[None, :]))
    np.testing.assert_allclose(var, (1 - b) / lam + d - 2 * d * b - d * d * lam * b,
                               rtol=1e-6)


@pytest.mark.parametrize("likelihood", ["logit", "softmax"])
def test_hyperparameter_search_does_not_depend_on_feature_units(likelihood, rng):
    # The default lengthscales follow the data (median heuristic), but the search box was the
    # kernel's absolute [1e-5, 1e5]: with features in the millions L-BFGS-B clipped the start
    # and the multinomial model collapsed to the class frequencies.
    X = rng.standard_normal((60, 2))
    y = np.digitize(X[:, 0] + 0.2 * rng.standard_normal(60), [-0.5, 0.5])
    if likelihood == "logit":
        y = (y > 0).astype(int)
    kw = dict(random_state=0, max_iter=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = VGPClassifier(likelihood=likelihood, **kw).fit(X, y)
        fits = {s: VGPClassifier(likelihood=likelihood, **kw).fit(X * s, y) for s in (1e-6, 1e6)}
    for s, clf in fits.items():
        assert clf.objective_ == pytest.approx(ref.objective_, rel=1e-5)
        assert np.allclose(clf.predict_proba(X * s), ref.predict_proba(X), atol=1e-3)
        assert np.allclose(clf.kernel_.params[1:], s * ref.kernel_.params[1:], rtol=1e-2)


def _with_latents(clf, mean, var):
    """clf answering predict_latent with the given [T, L] marginals."""
    clf._latent = lambda X: (np.array(mean, dtype=float), np.array(var, dtype=float))
    return clf


def test_ordinal_tiny_probabilities_keep_their_digits(rng):
    X = rng.standard_normal((30, 1))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    clf = VGPClassifier(likelihood="ordinal", kernel=RBF(variance=1.0, lengthscale=1.0),
                        optimize_hyperparameters=False).fit(X, y)
    phi = clf.local_bound_.thresholds
    m = np.array([-60.0, 60.0, 0.0])
    _with_latents(clf, m[:, None], np.zeros((3, 1)))
    logp = clf.predict_log_proba(np.zeros((3, 1)))
    # With var = 0: p(0) = s(phi_0 - m), p(1) = s(phi_1 - m) - s(phi_0 - m), p(2) = s(m - phi_1);
    # the middle one from the complements where those are small.
    p1 = np.where(m < 0, special.expit(m - phi[0]) - special.expit(m - phi[1]),
                  special.expit(phi[1] - m) - special.expit(phi[0] - m))
    ref = np.column_stack([special.log_expit(phi[0] - m), np.log(p1), special.log_expit(m - phi[1])])
    assert np.all(np.isfinite(logp))  # was -inf for p(2) at m = -60 (1 - F rounded to 0)
    assert np.allclose(logp, ref, rtol=1e-9, atol=1e-12)
    assert np.allclose(np.exp(logp).sum(1), 1.0, atol=1e-12)


def test_stick_breaking_tiny_probabilities_keep_their_digits(rng):
    X = rng.standard_normal((30, 1))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    clf = VGPClassifier(likelihood="stick-breaking", kernel=RBF(variance=1.0, lengthscale=1.0),
                        optimize_hyperparameters=False).fit(X, y)
    mean = np.array([[60.0, 0.0], [-60.0, 60.0], [1.0, -2.0]])
    _with_latents(clf, mean, np.zeros_like(mean))
    logp = clf.predict_log_proba(np.zeros((3, 1)))
    s = special.log_expit
    ref = np.column_stack([s(mean[:, 0]), s(-mean[:, 0]) + s(mean[:, 1]),
                           s(-mean[:, 0]) + s(-mean[:, 1])])
    assert np.all(np.isfinite(logp))  # was -inf: 1 - E[s(60)] rounded to 0
    assert np.allclose(logp, ref, rtol=1e-9, atol=1e-12)
    assert np.allclose(np.exp(logp).sum(1), 1.0, atol=1e-12)


def _expected(fn, m, v, points=()):
    """E[fn(z)] for z ~ N(m, v) by adaptive quadrature in the standardised variable (split at
    the given points of z)."""
    s = np.sqrt(v)
    cuts = sorted(t for t in ((p - m) / s for p in points) if -14 < t < 14)
    edges = [-14.0, *cuts, 14.0]
    return sum(integrate.quad(lambda t: fn(m + s * t) * np.exp(-0.5 * t * t), lo, hi,
                              epsabs=1e-15, epsrel=1e-13, limit=200)[0]
               for lo, hi in zip(edges[:-1], edges[1:])) / np.sqrt(2 * np.pi)


def _quadrature_proba(likelihood, clf, mean, var):
    """Class probabilities [T, C] from latent marginals [T, L] by adaptive quadrature: ordinal
    E[s(phi_k - z) - s(phi_{k-1} - z)]; stick-breaking E[s(z_k)] prod_{j<k} E[s(-z_j)] (the
    latents independent under q)."""
    T, L = mean.shape
    if likelihood == "ordinal":
        phi = np.concatenate([[-np.inf], clf.local_bound_.thresholds, [np.inf]])
        return np.array([[_expected(lambda z: special.expit(hi - z) - special.expit(lo - z),
                                    mean[i, 0], var[i, 0], phi[1:-1])
                          for lo, hi in zip(phi[:-1], phi[1:])] for i in range(T)])
    up = np.array([[_expected(special.expit, mean[i, j], var[i, j], [0.0]) for j in range(L)]
                   for i in range(T)])
    rest = np.cumprod(np.column_stack([np.ones(T), 1.0 - up]), axis=1)
    return np.column_stack([up * rest[:, :-1], rest[:, -1]])


@pytest.mark.parametrize("likelihood", ["ordinal", "stick-breaking"])
def test_probabilities_at_nonzero_latent_variance_match_quadrature(likelihood, rng):
    # (Only variance 0 was checked.) The 40-point Gauss-Hermite rule in log space against
    # adaptive quadrature: on a fitted model's marginals (variances 0.2 to 4, test inputs from
    # the data to far outside it) and on given ones; measured at most 2e-8 apart (the rule's
    # error on the sigmoid at variance 4; 1e-15 at variance 1).
    X = rng.standard_normal((30, 1))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    clf = VGPClassifier(likelihood=likelihood, kernel=RBF(variance=4.0, lengthscale=1.0),
                        optimize_hyperparameters=False).fit(X, y)
    Xt = np.linspace(-5.0, 5.0, 21)[:, None]
    mean, var = clf._latent(Xt)
    assert var.min() < 0.5 and var.max() > 3.9
    proba = clf.predict_proba(Xt)
    np.testing.assert_allclose(proba, _quadrature_proba(likelihood, clf, mean, var), rtol=0,
                               atol=1e-7)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(Xt)), proba, rtol=1e-12)
    L = mean.shape[1]
    m = np.repeat(np.array([-3.0, -0.7, 0.0, 1.2, 2.5])[:, None], L, axis=1)
    m[:, -1] *= -0.5  # (stick-breaking: latents that differ)
    for v in (0.1, 1.0, 4.0):
        _with_latents(clf, m, np.full_like(m, v))
        np.testing.assert_allclose(clf.predict_proba(Xt[:5]),
                                   _quadrature_proba(likelihood, clf, m, np.full_like(m, v)),
                                   rtol=0, atol=1e-7)


@pytest.mark.parametrize("likelihood", ["ordinal", "stick-breaking", "softmax"])
def test_log_probabilities_beyond_the_double_range_are_finite(likelihood, rng):
    # Latent means 1000 from the thresholds: predict_log_proba was log(predict_proba), -inf for
    # every class but the nearest one (its probabilities underflowed); the logit likelihood's
    # was finite. In the tails E[s(x + z)] = e^(x + v/2) for z ~ N(0, v), x << 0; for the
    # multinomial, log E[softmax_c] = m_c - m_top + (v_c + v_top) / 2 where m_top dominates.
    X = rng.standard_normal((30, 1))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    clf = VGPClassifier(likelihood=likelihood, kernel=RBF(variance=1.0, lengthscale=1.0),
                        optimize_hyperparameters=False).fit(X, y)
    v = np.array([1.0, 4.0])
    if likelihood == "ordinal":
        phi = clf.local_bound_.thresholds
        m = np.array([1000.0, -1000.0])
        _with_latents(clf, m[:, None], v[:, None])
        ref = np.array([[phi[0] - m[0] + v[0] / 2,
                         np.log(np.exp(phi[1]) - np.exp(phi[0])) - m[0] + v[0] / 2, 0.0],
                        [0.0, m[1] + v[1] / 2 + np.log(np.exp(-phi[0]) - np.exp(-phi[1])),
                         m[1] - phi[1] + v[1] / 2]])
    elif likelihood == "softmax":
        mean = np.array([[1000.0, -1000.0, 0.0], [0.0, 0.0, 1000.0]])
        var = np.array([[1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
        _with_latents(clf, mean, var)
        ref = np.array([[0.0, -2000.0 + 1.0, -1000.0 + 1.0],
                        [-1000.0 + 4.0, -1000.0 + 4.0, 0.0]])
    else:  # p(0) = s(z_0), p(1) = s(-z_0) s(z_1), p(2) = s(-z_0) s(-z_1)
        mean = np.array([[-1000.0, 1000.0], [1000.0, -1000.0]])
        _with_latents(clf, mean, np.column_stack([v, v]))
        ref = np.array([[-1000.0 + v[0] / 2, 0.0, -1000.0 + v[0] / 2],
                        [0.0, -2000.0 + v[1], -1000.0 + v[1] / 2]])
    logp = clf.predict_log_proba(np.zeros((2, 1)))
    np.testing.assert_allclose(logp, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(clf.predict_proba(np.zeros((2, 1))), np.exp(ref), atol=1e-12)


def test_clear_errors_for_bad_parameters_and_targets(rng):
    X = rng.standard_normal((20, 2))
    y = (X[:, 0] > 0).astype(int)
    kw = dict(kernel=RBF(), optimize_hyperparameters=False)
    with pytest.raises(ValueError, match="kernel must be None or a pygpfast.kernels.Kernel"):
        VGPClassifier(kernel=RBF).fit(X, y)  # the class, not an instance
    with pytest.raises(ValueError, match="kernel must be None or a pygpfast.kernels.Kernel"):
        VGPPoissonRegressor(kernel="rbf").fit(X, y)
    for tol in (True, np.inf, np.nan, -1.0):  # (0 is allowed: no early stop)
        with pytest.raises(ValueError, match="tol"):
            VGPClassifier(tol=tol, **kw).fit(X, y)
    with pytest.raises(ValueError, match="y must be a numeric"):  # was numpy's UFuncTypeError
        VGPPoissonRegressor(**kw).fit(X, np.array(["one", "two"])[y])
    # (numeric strings are converted, as every estimator converts numeric targets)
    np.testing.assert_array_equal(VGPPoissonRegressor(**kw).fit(X, np.array(["0", "1"])[y]).predict(X),
                                  VGPPoissonRegressor(**kw).fit(X, y).predict(X))
    assert np.isfinite(VGPPoissonRegressor(**kw).fit(X, y.astype(bool)).objective_)


def test_overflowing_site_precisions_are_a_linalg_error(rng):
    # A warm start from far-away hyperparameters can carry site precisions whose products with
    # the kernel overflow in Newton's I + Lambda^1/2 Sigma Lambda^1/2. That is a numerical
    # breakdown (pygpfast.LinAlgError, on which the estimators retry from a cold start), not
    # bad input: it came out as ValueError("cholesky: matrix has a non-finite entry").
    X = rng.standard_normal((30, 2))
    y = rng.poisson(2.0, 30).astype(np.float64)
    K = RBF(variance=1e10)(X) + 1e-6 * np.eye(30)
    with pytest.raises(LinAlgError, match="overflowed"):
        _infer(K, y, cvi.LocalBound("poisson"), alpha=np.full((1, 30), 1e3),
                  lambda_=np.full((1, 30), 1e300))


def test_huge_counts_from_the_prior_start_reach_the_optimum(one_blas_thread):
    # Counts of 1e6 under prior variance 1e3 from Algorithm 1's start V = Sigma (fuzz F9): the
    # first site's scalar solve bracketed its root between v = 1e3, where g = 1 - v (c + e^(v/2))
    # is -1e220, and v = e^-500, where g = 1; the Illinois steps stayed at e^-500 (halving -1e220
    # takes 730 steps) and set lambda = 1.4e217. The next sweep's rank-one updates then rounded
    # a variance to <= 0: a LinAlgError saying that the kernel matrix (smallest eigenvalue 0.03)
    # was not positive semi-definite.
    X = np.random.RandomState(0).randn(20, 2)
    K = RBF(variance=1e3)(X) + 1e-3 * np.eye(20)
    y = np.full(20, 1e6)
    lb = cvi.LocalBound("poisson")
    r = _infer(K, y, lb, tol=1e-12)
    ref = _infer(K, y, lb, tol=1e-12, lambda_=np.ones((1, 20)))  # (the estimators' start)
    # Reached the optimum: lambda ~ 1e6 to its last ~7 digits (a residual of 4.7, 5e-6
    # relative), the bound and alpha below. The solver's own test stays unmet here without
    # fused multiply-adds (-ffp-contract=off): its threshold tol * |bound| = 3.4e-10 lies under
    # the bound's rounding noise (~3e-8: a sum of terms near 1e7 that cancel), so it reports a
    # stall; with fused rounding it had happened to pass.
    assert r.info["refused_solves"] == 0
    assert r.info["max_residual_lambda"] <= 1e-5 * np.abs(r.lambda_).max()
    assert r.bound == pytest.approx(ref.bound, rel=1e-9)  # (lambda Sigma_ii ~ 1e9)
    np.testing.assert_allclose(K @ r.alpha[0], np.log(1e6), atol=1e-6)


def test_site_precisions_too_large_for_the_prior_are_named_as_the_cause():
    # A start whose site precisions exceed the prior's by 1e19 cannot be represented (V's
    # rank-one updates cancel every digit): the error said "the kernel matrix is not
    # numerically positive semi-definite; add a White kernel" for a well-conditioned kernel.
    X = np.random.RandomState(0).randn(20, 2)
    K = RBF(variance=1e3)(X) + 1e-3 * np.eye(20)
    with pytest.raises(LinAlgError, match="site precisions are too large for this prior"):
        _infer(K, np.full(20, 3.0), cvi.LocalBound("poisson"), lambda_=np.full((1, 20), 1e16))
    # An indefinite Sigma with moderate site precisions is still blamed on the kernel.
    with pytest.raises(LinAlgError, match="kernel matrix is not numerically positive semi-def"):
        _infer(K - 5.0 * np.eye(20), (X[:, 0] > 0).astype(float), cvi.LocalBound("logit"))


@pytest.mark.parametrize("failure", ["one class", "callback"])
def test_failed_refit_leaves_the_estimator_unfitted(failure, rng):
    # A refit that failed after validation kept the previous posterior under the new classes_
    # (or, with a callback, the attributes of the failed search's last iteration).
    X = rng.standard_normal((40, 2))
    y = (X[:, 0] > 0).astype(int)
    clf = VGPClassifier(optimize_hyperparameters=False).fit(X, y)

    def broken(est, iteration, bound):
        raise RuntimeError("stop")

    if failure == "one class":
        with pytest.raises(ValueError, match="at least 2"):
            clf.fit(X, np.zeros(40))
    else:
        with pytest.raises(RuntimeError, match="stop"):
            clf.set_params(optimize_hyperparameters=True, callback=broken).fit(X, y)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    assert clf.set_params(callback=None).fit(X, y).predict(X).shape == (40,)


def test_building_block_arguments_are_checked(rng):
    # Found by the building-block audit: each of these was accepted (and misread) or failed
    # with an unrelated error (AttributeError, TypeError, "exp(m + v/2) overflows").
    X = rng.standard_normal((20, 2))
    y = (X[:, 0] > 0).astype(np.float64)
    K = RBF()(X) + 1e-6 * np.eye(20)
    lb = cvi.LocalBound("logit")
    zeros = np.zeros((1, 20))
    with pytest.raises(ValueError, match="likelihood must be"):
        cvi.LocalBound(["logit"])
    with pytest.raises(ValueError, match="local_bound must be a LocalBound"):
        _oa_objective(K, y, "logit", zeros, zeros)
    with pytest.raises(ValueError, match="thresholds must have 2 entries"):
        cvi.LocalBound("ordinal", n_classes=3, thresholds=[[-1.0, 1.0]])
    with pytest.raises(ValueError, match="max_iter"):
        _infer(K, y, lb, max_iter=1.5)
    with pytest.raises(ValueError, match="max_iter"):
        _infer(K, y, lb, method="opper-archambeau", max_iter=-1)
    with pytest.raises(ValueError, match="alpha contains NaN"):
        _infer(K, y, lb, method="opper-archambeau", alpha=np.full((1, 20), np.nan))
    asymmetric = K.copy()
    asymmetric[0, 5] += 0.1
    with pytest.raises(ValueError, match="symmetric"):
        _infer(asymmetric, y, lb)
    # Asymmetry within rounding (K from a product, say) is averaged out, not refused.
    rounded = K.copy()
    rounded[0, 5] *= 1 + 1e-15
    assert _infer(rounded, y, lb).bound == pytest.approx(_infer(K, y, lb).bound, rel=1e-12)


@pytest.mark.parametrize("variance", [1e-8, 1e-4])
def test_a_search_stuck_on_a_flat_prior_is_searched_again(variance, rng):
    # From RBF(variance=1e-8) the bound's gradient in log variance is ~1e-8: L-BFGS-B stopped
    # after 0 iterations (1 from 1e-4) with the prior as the posterior, training accuracy 0.87
    # where 1.0 is reached from variance 1, and said nothing; then it warned. It is now searched
    # again from the data-scaled start, which reaches the fit from variance 1 (bound -36.8
    # against -83.2). Without lengthscales to set from the data there is no second search, and
    # the fit warns.
    X = rng.standard_normal((120, 3))
    y = (np.sin(2 * X[:, 0]) + X[:, 1] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # (type-II maximum likelihood: the default prior on the variance pulls it off 1e-8)
        est = VGPClassifier(kernel=RBF(variance=variance), priors=None).fit(X, y)
    assert est.restart_["reason"] == "stalled" and est.restart_["kept"] == "data-scaled"
    assert est.score(X, y) == 1.0
    assert est.objective_ == pytest.approx(
        VGPClassifier(kernel=RBF(), priors=None).fit(X, y).objective_, abs=1e-3)
    with pytest.warns(ConvergenceWarning, match="ended at its start"):
        VGPClassifier(kernel=Linear(variance=1e-8)).fit(X, y)


def test_labels_without_signal_are_not_called_a_stuck_search(rng):
    # The search moves from the default kernel to a near-constant prior: no warning.
    X = rng.standard_normal((150, 3))
    y = rng.integers(0, 2, 150)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = VGPClassifier().fit(X, y)
    assert model.kernel_.params[0] < 0.5


@pytest.mark.parametrize("Estimator", [VGPClassifier, VGPPoissonRegressor])
def test_the_fit_does_not_follow_the_callers_array(Estimator, rng):
    # X_train_ was the caller's float64 array itself (validate_data copies only to convert):
    # scaling X in place after the fit changed every prediction (p = 0.001 -> 3e-24).
    X = rng.standard_normal((40, 2))
    y = (X[:, 0] > 0).astype(int)
    Xt = rng.standard_normal((5, 2))
    est = Estimator(optimize_hyperparameters=False).fit(X, y)
    before = est.predict(Xt) if Estimator is VGPPoissonRegressor else est.predict_proba(Xt)
    X *= 10.0
    after = est.predict(Xt) if Estimator is VGPPoissonRegressor else est.predict_proba(Xt)
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("Estimator", [VGPClassifier, VGPPoissonRegressor])
def test_a_callback_reads_the_current_fit(Estimator, rng):
    # history_ and n_iter_ were set at the end of the search: a refit's callback read the
    # earlier fit's (n_iter_ 3 and three bounds at every iteration).
    X = rng.standard_normal((30, 2))
    y = (X[:, 0] > 0).astype(int)
    seen = []

    def callback(est, iteration, bound):
        seen.append((est.n_iter_, list(est.history_[-1:]), len(est.history_))
                    == (iteration, [bound], iteration) and est.objective_ == pytest.approx(bound))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Estimator(max_iter=3).fit(X, y)
        est.set_params(max_iter=2, callback=callback).fit(X, y)
    assert seen and all(seen)
