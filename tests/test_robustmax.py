"""The robust-max likelihood (Hernandez-Lobato et al. 2011; pygpfast.likelihoods.RobustMax) and
SVGPClassifier(likelihood="robustmax"): values and predictive probabilities against adaptive
quadrature (scipy.integrate.quad) and Monte Carlo, derivatives against finite differences,
the limits in epsilon, far tails, and a small three-class fit."""

import numpy as np
import pytest
from scipy import integrate, stats

from sklearn.exceptions import ConvergenceWarning

from pygpfast import SVGPClassifier, _core
from pygpfast.likelihoods import RobustMax


def argmax_probability(y, mu, var):
    """P(f_y > f_c for all c != y) under independent N(mu_c, var_c), by adaptive quadrature."""
    others = [c for c in range(len(mu)) if c != y]
    sd_y = np.sqrt(var[y])

    def integrand(x):  # f_y = mu_y + sd_y x, x ~ N(0, 1)
        f = mu[y] + sd_y * x
        return stats.norm.pdf(x) * np.prod([stats.norm.cdf((f - mu[c]) / np.sqrt(var[c])) for c in others])

    return integrate.quad(integrand, -12.0, 12.0, epsabs=1e-13, epsrel=1e-12, limit=400)[0]


def reference_value(y, mu, var, eps):
    C = len(mu)
    A = argmax_probability(y, mu, var)
    return np.log(eps / (C - 1)) + A * (np.log1p(-eps) - np.log(eps / (C - 1)))


def reference_proba(mu, var, eps):
    C = len(mu)
    A = np.array([argmax_probability(c, mu, var) for c in range(C)])
    return eps / (C - 1) + (1.0 - eps - eps / (C - 1)) * A


def marginals(rng, n, C, var_range=(0.3, 2.0)):
    mu = rng.normal(0.0, 1.5, (n, C))
    var = rng.uniform(*var_range, (n, C))
    y = rng.integers(0, C, n).astype(float)
    return y, mu, var


@pytest.mark.parametrize("C", [2, 3, 5])
def test_value_matches_adaptive_quadrature(C):
    rng = np.random.default_rng(C)
    y, mu, var = marginals(rng, 8, C)
    for n_gh, tol in ((20, 1e-3), (100, 1e-9)):
        lik = RobustMax(C, epsilon=1e-2, n_gh=n_gh)
        value, _, _ = lik.variational_expectations(y, mu, var)
        ref = [reference_value(int(y[i]), mu[i], var[i], 1e-2) for i in range(len(y))]
        np.testing.assert_allclose(value, ref, rtol=0, atol=tol)


def test_two_classes_closed_form():
    # C = 2: A_y = Phi((mu_y - mu_other) / sqrt(var_y + var_other)).
    rng = np.random.default_rng(1)
    y, mu, var = marginals(rng, 10, 2)
    lik = RobustMax(2, epsilon=0.05, n_gh=60)
    value, _, _ = lik.variational_expectations(y, mu, var)
    yi = y.astype(int)
    diff = mu[np.arange(10), yi] - mu[np.arange(10), 1 - yi]
    A = stats.norm.cdf(diff / np.sqrt(var.sum(axis=1)))
    np.testing.assert_allclose(value, np.log(0.05) + A * (np.log(0.95) - np.log(0.05)), atol=1e-10)


def test_value_matches_monte_carlo():
    rng = np.random.default_rng(7)
    C, eps = 4, 1e-3
    y, mu, var = marginals(rng, 3, C)
    value, _, _ = RobustMax(C, epsilon=eps).variational_expectations(y, mu, var)
    draws = rng.standard_normal((400_000, C))
    for i in range(3):
        f = mu[i] + np.sqrt(var[i]) * draws
        right = np.argmax(f, axis=1) == int(y[i])
        mc = np.mean(np.where(right, np.log1p(-eps), np.log(eps / (C - 1))))
        se = np.std(np.where(right, np.log1p(-eps), np.log(eps / (C - 1)))) / np.sqrt(len(draws))
        assert abs(value[i] - mc) < 5 * se


def finite_difference(lik, y, mu, var, which, h):
    out = np.empty_like(mu)
    for c in range(mu.shape[1]):
        step = np.zeros_like(mu)
        step[:, c] = h
        if which == "mu":
            up, down = lik.variational_expectations(y, mu + step, var)[0], lik.variational_expectations(y, mu - step, var)[0]
        else:
            up, down = lik.variational_expectations(y, mu, var + step)[0], lik.variational_expectations(y, mu, var - step)[0]
        out[:, c] = (up - down) / (2 * h)
    return out


@pytest.mark.parametrize("var_range", [(0.3, 2.0), (1e-3, 1e-2), (5.0, 50.0)])
def test_derivatives_match_finite_differences(var_range):
    rng = np.random.default_rng(3)
    C = 4
    y, mu, var = marginals(rng, 12, C, var_range)
    lik = RobustMax(C, epsilon=1e-2)
    _, d_mu, d_var = lik.variational_expectations(y, mu, var)
    h = 1e-5 * var_range[0]
    np.testing.assert_allclose(d_mu, finite_difference(lik, y, mu, var, "mu", 1e-6), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(d_var, finite_difference(lik, y, mu, var, "var", h), rtol=5e-4, atol=1e-8)
    # A depends on the differences of the means only.
    np.testing.assert_allclose(d_mu.sum(axis=1), 0.0, atol=1e-12)


def test_label_variance_to_zero():
    # var_y -> 0: the value tends to prod_{c != y} Phi((mu_y - mu_c) / sd_c) (scaled), and the
    # derivative in var_y (Price's form below 1e-10) is continuous through the switch.
    C, eps = 3, 1e-2
    lik = RobustMax(C, epsilon=eps)
    mu = np.array([[0.4, -0.2, 0.1]])
    y = np.array([0.0])
    A0 = np.prod(stats.norm.cdf((0.4 - mu[0, 1:]) / np.sqrt([0.5, 0.8])))
    d_var_y = []
    for v in (1e-6, 1e-9, 1e-11, 0.0):
        var = np.array([[v, 0.5, 0.8]])
        value, d_mu, d_var = lik.variational_expectations(y, mu, var)
        d_var_y.append(d_var[0, 0])
        np.testing.assert_allclose(value[0], np.log(eps / 2) + A0 * (np.log1p(-eps) - np.log(eps / 2)),
                                   atol=1e-5)
        assert np.all(np.isfinite(d_mu)) and np.all(np.isfinite(d_var))
    np.testing.assert_allclose(d_var_y, d_var_y[-1], rtol=1e-4)
    h = 1e-4
    up = lik.variational_expectations(y, mu, np.array([[2 * h, 0.5, 0.8]]))[0][0]
    down = lik.variational_expectations(y, mu, np.array([[0.0, 0.5, 0.8]]))[0][0]
    np.testing.assert_allclose(d_var_y[-1], (up - down) / (2 * h), rtol=1e-3)


def test_step_classes():
    # var_c = 0 for every other class: Phi becomes a step at mu_c (the rule then sums the weights
    # of the nodes above the largest of them) and those classes' derivatives are 0.
    n_gh = 20
    lik = RobustMax(3, epsilon=1e-2, n_gh=n_gh)
    y, mu, var = np.array([0.0]), np.array([[0.0, 0.5, -1.0]]), np.array([[1.0, 0.0, 0.0]])
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    x, w = _core.likelihoods.gauss_hermite(n_gh)
    A = np.sum(w[np.sqrt(2.0) * x > 0.5]) / np.sqrt(np.pi)
    np.testing.assert_allclose(value[0], np.log(5e-3) + A * (np.log(0.99) - np.log(5e-3)), rtol=1e-14)
    np.testing.assert_array_equal(d_mu, 0.0)
    np.testing.assert_array_equal(d_var[0, 1:], 0.0)
    assert np.isfinite(d_var[0, 0])


def test_epsilon_derivative():
    rng = np.random.default_rng(5)
    C, eps, h = 3, 0.1, 1e-6
    y, mu, var = marginals(rng, 6, C)
    args = (5, eps, 20, C, y, mu, var)
    _, _, _, d_eps = _core.likelihoods.variational_expectations(*args)
    up = RobustMax(C, epsilon=eps + h).variational_expectations(y, mu, var)[0]
    down = RobustMax(C, epsilon=eps - h).variational_expectations(y, mu, var)[0]
    np.testing.assert_allclose(d_eps, (up - down) / (2 * h), rtol=1e-6)


@pytest.mark.parametrize("C", [2, 3, 6])
def test_predictive_probabilities(C):
    rng = np.random.default_rng(11 + C)
    _, mu, var = marginals(rng, 6, C)
    lik = RobustMax(C, epsilon=0.02, n_gh=60)
    P = lik.predict_proba(mu, var)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-14)
    ref = np.array([reference_proba(mu[i], var[i], 0.02) for i in range(len(mu))])
    np.testing.assert_allclose(P, ref, atol=1e-8)
    np.testing.assert_allclose(lik.predict_log_proba(mu, var), np.log(P), rtol=1e-14)
    mean, variance = lik.predict_mean_and_var(mu, var)
    np.testing.assert_array_equal(mean, P)
    np.testing.assert_allclose(variance, P * (1 - P))
    y = rng.integers(0, C, len(mu)).astype(float)
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), np.log(P[np.arange(len(mu)), y.astype(int)]),
                               rtol=1e-14)


def test_epsilon_limits():
    rng = np.random.default_rng(2)
    C = 4
    y, mu, var = marginals(rng, 5, C)
    A = np.array([[argmax_probability(c, mu[i], var[i]) for c in range(C)] for i in range(5)])
    # epsilon -> 0: the probabilities are the argmax probabilities themselves.
    P = RobustMax(C, epsilon=1e-14, n_gh=60).predict_proba(mu, var)
    np.testing.assert_allclose(P, A, atol=1e-8)
    # epsilon -> 1 - 1/C: every class equally likely whatever f; the value is log(1/C), flat.
    eps = (1.0 - 1.0 / C) * (1 - 1e-12)
    lik = RobustMax(C, epsilon=eps)
    np.testing.assert_allclose(lik.predict_proba(mu, var), 1.0 / C, atol=1e-11)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    np.testing.assert_allclose(value, np.log(1.0 / C), atol=1e-11)
    np.testing.assert_allclose(d_mu, 0.0, atol=1e-11)
    np.testing.assert_allclose(d_var, 0.0, atol=1e-11)


def test_far_tails_are_finite():
    C, eps = 5, 1e-3
    lik = RobustMax(C, epsilon=eps)
    mu = np.array([[1e6, 0.0, -1e6, 3.0, 2.0],
                   [-1e8, 1e8, 0.0, 0.0, 0.0],
                   [0.0, 0.0, 0.0, 0.0, 0.0],
                   [40.0, -40.0, 0.0, 0.0, 0.0]])
    var = np.array([[1e-300, 1e-8, 1e8, 1.0, 0.0],
                    [1e10, 1e-10, 1.0, 1.0, 1.0],
                    [0.0, 0.0, 0.0, 0.0, 0.0],
                    [1e-4, 1e-4, 1e-4, 1e-4, 1e-4]])
    for label in range(C):
        y = np.full(len(mu), float(label))
        value, d_mu, d_var = lik.variational_expectations(y, mu, var)
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(d_mu)) and np.all(np.isfinite(d_var))
        assert np.all(value >= np.log(eps / (C - 1)) - 1e-12) and np.all(value <= np.log1p(-eps) + 1e-12)
    value = lik.variational_expectations(np.array([0.0, 1.0, 0.0, 1.0]), mu, var)[0]
    np.testing.assert_allclose(value[[0, 1]], np.log1p(-eps), rtol=0, atol=1e-14)  # far ahead
    np.testing.assert_allclose(value[3], np.log(eps / (C - 1)), rtol=0, atol=1e-14)  # far behind
    P = lik.predict_proba(mu, var)
    assert np.all(np.isfinite(P)) and np.all(P >= eps / (C - 1) * (1 - 1e-12))
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-14)
    np.testing.assert_allclose(P[2], 1.0 / C, atol=1e-14)  # all steps at one point: a tie


def test_validation():
    for bad in (0.0, -0.1, 0.7, "x", True):
        with pytest.raises(ValueError, match="epsilon"):
            RobustMax(3, epsilon=bad)
    with pytest.raises(ValueError, match="n_classes"):
        RobustMax(1)
    lik = RobustMax(3)
    with pytest.raises(ValueError, match="support"):
        lik.variational_expectations([3.0], np.zeros((1, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="shape"):
        lik.predict_proba(np.zeros((2, 4)), np.ones((2, 4)))
    assert repr(lik) == "RobustMax(n_classes=3, epsilon=0.001, n_gh=20)"


def three_blobs(n, seed):
    rng = np.random.default_rng(seed)
    centres = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    y = rng.integers(0, 3, n)
    return centres[y] + 0.8 * rng.standard_normal((n, 2)), np.array(["a", "b", "c"])[y]


def test_svgp_classifier_fits_three_classes():
    X, y = three_blobs(150, 0)
    Xt, yt = three_blobs(300, 1)
    clf = SVGPClassifier(likelihood="robustmax", n_inducing=12, random_state=0).fit(X, y)
    assert isinstance(clf.likelihood_, RobustMax) and clf.likelihood_.epsilon == 1e-3
    P = clf.predict_proba(Xt)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert P.min() >= 1e-3 / 2 * (1 - 1e-12) and P.max() <= 1 - 1e-3
    assert np.mean(clf.predict(Xt) == yt) > 0.9
    np.testing.assert_allclose(clf.predict_log_proba(Xt), np.log(P), rtol=1e-12)
    with pytest.warns(ConvergenceWarning):
        eps = SVGPClassifier(likelihood="robustmax", label_noise=0.05, n_inducing=12, max_iter=5,
                             random_state=0).fit(X, y)
    assert eps.likelihood_.epsilon == 0.05


def test_svgp_classifier_label_noise_rules():
    X, y = three_blobs(60, 0)
    with pytest.raises(ValueError, match="robustmax"):
        SVGPClassifier(likelihood="robustmax", label_noise=0.0, n_inducing=5).fit(X, y)
    with pytest.raises(ValueError, match="softmax takes no label noise"):
        SVGPClassifier(likelihood="softmax", label_noise=0.1, n_inducing=5).fit(X, y)
    # 'auto' is the plain softmax for C > 2 and the plain probit for two classes.
    with pytest.warns(ConvergenceWarning):
        assert type(SVGPClassifier(n_inducing=5, max_iter=2).fit(X, y).likelihood_).__name__ == "Softmax"
    with pytest.warns(ConvergenceWarning):
        two = SVGPClassifier(n_inducing=5, max_iter=2).fit(X[y != "c"], y[y != "c"])
    assert two.likelihood_.label_noise == 0.0


def test_svgp_classifier_learns_epsilon():
    """label_noise='learn' with robust-max: epsilon from 0.01 under its default prior, small
    on separable blobs and larger with 20% of the labels replaced at random; the fitted
    model pickles with it."""
    import pickle

    X, y = three_blobs(240, 0)
    rng = np.random.default_rng(4)
    noisy = y.copy()
    swap = rng.random(len(y)) < 0.2
    noisy[swap] = rng.choice(np.array(["a", "b", "c"]), swap.sum())
    fits = [SVGPClassifier(likelihood="robustmax", label_noise="learn", n_inducing=12,
                           random_state=0).fit(X, labels) for labels in (y, noisy)]
    eps = [f.likelihood_.epsilon for f in fits]
    assert eps[0] < 0.03 and eps[1] > 2 * eps[0]
    assert all(f.likelihood_.learn_epsilon and "epsilon" in f.likelihood_.priors for f in fits)
    back = pickle.loads(pickle.dumps(fits[1]))
    assert back.likelihood_.epsilon == eps[1]
    np.testing.assert_array_equal(back.predict_proba(X), fits[1].predict_proba(X))
