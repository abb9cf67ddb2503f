"""Bernoulli likelihoods with label noise (Kim & Ghahramani 2008):
p(y | f) = eps + (1 - 2 eps) p0(y | f), in the core, in pygpfast.likelihoods.Bernoulli and in
SVGPClassifier(label_noise=...), against numpy references and their limiting cases."""

import numpy as np
import pytest
from scipy import integrate
from scipy.special import expit, log_ndtr, ndtr

import pygpfast
from pygpfast import _core
from pygpfast.likelihoods import Bernoulli
from pygpfast.svgp import SVGP

from noisy_labels import flipped_data

LINK_P0 = {"probit": ndtr, "logit": expit}
MU = np.array([0.4, -1.3, 2.5, -0.2, 0.0, 3.0])
VAR = np.array([0.7, 1.9, 0.3, 0.0, 2.5, 1e-12])
Y = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])


def log_p_noisy(link, eps, y, f):
    """log(eps + (1 - 2 eps) p0(y | f)) in numpy, in log space."""
    s = 2.0 * y - 1.0
    log_p0 = log_ndtr(s * f) if link == "probit" else -np.logaddexp(0.0, -s * f)
    return np.logaddexp(np.log1p(-2.0 * eps) + log_p0, np.log(eps))


def gh_expectation(link, eps, y, mu, var, n_gh=20):
    """The 20-point Gauss-Hermite value the core computes, written out in numpy."""
    x, w = np.polynomial.hermite.hermgauss(n_gh)
    f = mu[:, None] + np.sqrt(2.0 * var)[:, None] * x
    return (w / np.sqrt(np.pi) * log_p_noisy(link, eps, y[:, None], f)).sum(axis=1)


@pytest.mark.parametrize("link", ["probit", "logit"])
@pytest.mark.parametrize("eps", [1e-3, 0.05, 0.3])
def test_expectation_is_the_gauss_hermite_sum_and_the_integral(link, eps):
    """The core's value is the Gauss-Hermite sum; with 100 points it is the integral to 1e-6
    (relative). With the default 20 the probit's is off by up to 1.2e-4: its log density bends
    sharply where the floor eps takes over from log Phi, at f ~ -sqrt(2 log(1 / eps))."""
    lik = Bernoulli(link, label_noise=eps)
    value, _, _ = lik.variational_expectations(Y, MU, VAR)
    np.testing.assert_allclose(value, gh_expectation(link, eps, Y, MU, VAR), rtol=1e-12, atol=1e-14)
    value = Bernoulli(link, label_noise=eps, n_gh=100).variational_expectations(Y, MU, VAR)[0]
    for i in range(len(MU)):  # and the integral itself, to the rule's accuracy
        if VAR[i] < 1e-6:
            exact = log_p_noisy(link, eps, Y[i], MU[i])
        else:
            sd = np.sqrt(VAR[i])
            exact = integrate.quad(
                lambda f: log_p_noisy(link, eps, Y[i], f) * np.exp(-0.5 * ((f - MU[i]) / sd) ** 2)
                / (sd * np.sqrt(2 * np.pi)), MU[i] - 12 * sd, MU[i] + 12 * sd, epsabs=1e-13, limit=200)[0]
        assert value[i] == pytest.approx(exact, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("link", ["probit", "logit"])
@pytest.mark.parametrize("eps", [1e-3, 0.1])
def test_derivatives_match_finite_differences(link, eps):
    """d/dmu, d/dvar and d/deps of the returned value (the quadrature's own), by central
    differences."""
    keep = VAR > 1e-3  # (the var-difference stays inside the domain)
    mu, var, y = MU[keep], VAR[keep], Y[keep]
    lik = Bernoulli(link, label_noise=eps)
    _, dmu, dvar, dparam = lik.variational_expectations(y, mu, var, return_param_grad=True)
    h = 1e-6

    def value(m=mu, v=var, e=eps):
        return Bernoulli(link, label_noise=e).variational_expectations(y, m, v)[0]

    np.testing.assert_allclose(dmu, (value(m=mu + h) - value(m=mu - h)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dvar, (value(v=var + h) - value(v=var - h)) / (2 * h), rtol=1e-5, atol=1e-7)
    # (the parameter derivative comes from the core; the Python likelihood has no parameter)
    assert dparam.shape == (len(y), 0)
    core = _core.likelihoods.variational_expectations(*lik._core_args(), y, mu, var)
    he = 1e-4 * eps
    fd = (value(e=eps + he) - value(e=eps - he)) / (2 * he)
    np.testing.assert_allclose(core[3], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_zero_label_noise_is_the_plain_link_bitwise(link):
    plain, noisy = Bernoulli(link), Bernoulli(link, label_noise=0.0)
    for a, b in zip(plain.variational_expectations(Y, MU, VAR), noisy.variational_expectations(Y, MU, VAR)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(plain.predict_log_density(Y, MU, VAR), noisy.predict_log_density(Y, MU, VAR))


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_tiny_label_noise_tends_to_the_plain_link(link):
    a = Bernoulli(link).variational_expectations(Y, MU, VAR)
    b = Bernoulli(link, label_noise=1e-300).variational_expectations(Y, MU, VAR)
    for x, z in zip(a, b):
        np.testing.assert_allclose(z, x, rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("link", ["probit", "logit"])
@pytest.mark.parametrize("eps", [1e-3, 0.2])
def test_far_tails_are_finite_and_bounded_by_log_eps(link, eps):
    """A point far on the wrong side costs log eps (the plain probit's cost is -f^2 / 2 there);
    on the right side nothing; derivatives vanish in both tails (the likelihood is flat)."""
    mu = np.array([-1e3, 1e3, -1e5, 1e5])
    var = np.array([1.0, 1.0, 4.0, 0.0])
    y = np.ones(4)
    value, dmu, dvar = Bernoulli(link, label_noise=eps).variational_expectations(y, mu, var)
    np.testing.assert_allclose(value, [np.log(eps), np.log1p(-eps)] * 2, rtol=1e-12)
    assert np.all(np.isfinite(dmu)) and np.all(np.isfinite(dvar))
    np.testing.assert_allclose(dmu, 0.0, atol=1e-300)
    np.testing.assert_allclose(dvar, 0.0, atol=1e-300)
    np.testing.assert_allclose(Bernoulli(link, label_noise=eps).predict_log_density(y, mu, var),
                               [np.log(eps), np.log1p(-eps)] * 2, rtol=1e-12)


def test_probit_predictions_are_exact():
    eps = 0.07
    lik = Bernoulli("probit", label_noise=eps)
    mean, var = lik.predict_mean_and_var(MU, VAR)
    p = eps + (1 - 2 * eps) * ndtr(MU / np.sqrt(1 + VAR))
    np.testing.assert_allclose(mean, p, rtol=1e-14)
    np.testing.assert_allclose(var, p * (1 - p), rtol=1e-13)
    np.testing.assert_allclose(lik.predict_log_density(Y, MU, VAR), np.log(np.where(Y == 1, p, 1 - p)), rtol=1e-13)


def test_logit_predictions_against_quadrature():
    eps = 0.07
    lik = Bernoulli("logit", label_noise=eps, n_gh=40)
    mean, _ = lik.predict_mean_and_var(MU, VAR)
    for i in range(len(MU)):
        sd = np.sqrt(VAR[i])
        p0 = expit(MU[i]) if sd < 1e-6 else integrate.quad(
            lambda f: expit(f) * np.exp(-0.5 * ((f - MU[i]) / sd) ** 2) / (sd * np.sqrt(2 * np.pi)),
            MU[i] - 12 * sd, MU[i] + 12 * sd, epsabs=1e-14)[0]
        assert mean[i] == pytest.approx(eps + (1 - 2 * eps) * p0, rel=1e-9)


@pytest.mark.parametrize("bad", [0.5, -0.01, np.nan, 1.0, "0.1", True])
def test_bad_label_noise(bad):
    with pytest.raises(ValueError, match="label_noise must be a number in \\[0, 0.5\\)"):
        Bernoulli(label_noise=bad)


def test_svgp_elbo_gradients_with_label_noise():
    """The ELBO's gradients in q and the kernel through the noisy likelihood, by central
    differences (SVGP.elbo with a fixed Z)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=40) > 0).astype(float)
    Z = X[:6].copy()
    model = SVGP(pygpfast.kernels.RBF(lengthscale=1.2), Bernoulli("probit", label_noise=0.05), Z)
    model.q_mu = rng.normal(size=6)
    _, g = model.elbo(X, y, with_grad=True)
    h = 1e-6
    for j in range(6):
        d = np.zeros(6)
        d[j] = h
        model.q_mu = model.q_mu + d
        up = model.elbo(X, y)[0]
        model.q_mu = model.q_mu - 2 * d
        down = model.elbo(X, y)[0]
        model.q_mu = model.q_mu + d
        assert g["q_mu"][j] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-7)


def test_svgp_classifier_probabilities_stay_inside_the_floor():
    X, y = flipped_data()
    eps = 0.05
    clf = pygpfast.SVGPClassifier(label_noise=eps, n_inducing=20, max_iter=500, random_state=0).fit(X, y)
    P = clf.predict_proba(np.vstack([X, 50 * X]))
    assert np.all(P >= eps - 1e-15) and np.all(P <= 1 - eps + 1e-15)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), clf.predict_proba(X), rtol=1e-12)
    assert clf.likelihood_.label_noise == eps


def test_label_noise_helps_on_flipped_labels():
    """10% of the training labels flipped at random; the test labels clean: the robust
    likelihood's hold-out log loss is lower than the plain probit's (same data, same settings)."""
    X, y = flipped_data(n=400, flip=0.1, seed=1)
    Xt, yt = flipped_data(n=2000, flip=0.0, seed=2)
    losses = {}
    for eps in (0.0, 0.05):
        clf = pygpfast.SVGPClassifier(label_noise=eps, n_inducing=30, max_iter=1000, random_state=0).fit(X, y)
        P = clf.predict_proba(Xt)
        losses[eps] = -np.mean(np.log(P[np.arange(len(yt)), yt]))
    assert losses[0.05] < losses[0.0]


def test_label_noise_needs_two_classes_and_method_kl():
    X, y = flipped_data(n=60)
    y3 = y + (X[:, 1] > 1)
    with pytest.raises(ValueError, match="label_noise=0.1 needs a Bernoulli likelihood"):
        pygpfast.SVGPClassifier(label_noise=0.1, max_iter=3).fit(X, y3)
    with pytest.raises(ValueError, match="method='mf'.*label_noise=0.1"):
        pygpfast.SVGPClassifier(label_noise=0.1, method="mf", max_iter=3).fit(X, y)
    with pytest.raises(ValueError, match="label_noise"):
        pygpfast.SVGPClassifier(label_noise=0.5).fit(X, y)


# ---------------------------------------------------------------- learned label noise
def _packed_objective(model, X, y, packer):
    """The L-BFGS-B objective's value and gradient at the packer's vector (ELBO + log prior)."""
    def f(x):
        value, g = model.elbo(X, y, scale=1.0, with_grad=True, hyper=packer.apply(x))
        return packer.add_log_prior(value, packer.grad(g, x), x)
    return f


@pytest.mark.parametrize("kind", ["bernoulli", "robustmax"])
def test_learned_label_noise_gradient_matches_finite_differences(kind):
    """With epsilon learned, the search's gradient in log epsilon (the core's d/deps times
    epsilon, plus the default prior's) and in the kernel's log parameters, by central
    differences of the search's own objective."""
    from pygpfast._base._priors import attach_default_noise_prior
    from pygpfast.likelihoods import RobustMax
    from pygpfast.svgp._optim import Packer

    rng = np.random.default_rng(11)
    X = rng.normal(size=(50, 2))
    if kind == "bernoulli":
        y = (X[:, 0] + 0.5 * rng.normal(size=50) > 0).astype(float)
        lik = Bernoulli("logit", label_noise=0.04, learn_label_noise=True)
    else:
        y = np.argmax(X @ rng.normal(size=(2, 3)) + 0.5 * rng.normal(size=(50, 3)), axis=1).astype(float)
        lik = RobustMax(3, epsilon=0.04, learn_epsilon=True)
    attach_default_noise_prior(lik)
    model = SVGP(pygpfast.kernels.RBF(variance=1.3, lengthscale=[0.9, 1.4]), lik, X[:7].copy())
    model.q_mu = 0.3 * rng.normal(size=model.q_mu.shape)
    packer = Packer(model, train_Z=False)
    assert packer.n_lik == 1 and np.isfinite(packer.lower[-1]) and np.exp(packer.upper[-1]) < lik._NOISE_MAX
    f = _packed_objective(model, X, y, packer)
    x0 = packer.get()
    assert np.exp(x0[-1]) == pytest.approx(0.04, rel=1e-15)
    _, grad = f(x0)
    h = 1e-5
    for j in range(packer._hyper_start, packer.size):  # kernel variance, lengthscales, epsilon
        e = np.zeros_like(x0)
        e[j] = h
        numeric = (f(x0 + e)[0] - f(x0 - e)[0]) / (2 * h)
        assert grad[j] == pytest.approx(numeric, rel=1e-6, abs=1e-8)


def test_learned_label_noise_follows_the_flipped_share():
    """epsilon learned on clean labels stays small; with 15% of the labels flipped it grows
    towards the flip rate and the hold-out log loss on clean labels beats the fixed-at-0 fit.
    The fit's epsilon is inside its box, the prior's share in log_prior_, and the floor of the
    predicted probabilities is the learned epsilon."""
    X, y = flipped_data(n=400, flip=0.0, seed=1)
    Xf, yf = flipped_data(n=400, flip=0.15, seed=1)
    Xt, yt = flipped_data(n=2000, flip=0.0, seed=2)
    clean = pygpfast.SVGPClassifier(label_noise="learn", n_inducing=30, random_state=0).fit(X, y)
    noisy = pygpfast.SVGPClassifier(label_noise="learn", n_inducing=30, random_state=0).fit(Xf, yf)
    plain = pygpfast.SVGPClassifier(n_inducing=30, random_state=0).fit(Xf, yf)
    eps_clean, eps_noisy = clean.likelihood_.label_noise, noisy.likelihood_.label_noise
    assert eps_clean < 0.02 and 0.05 < eps_noisy < 0.2
    for clf in (clean, noisy):
        lik = clf.likelihood_
        lower, upper = lik.theta_bounds()
        assert lower[0] + 1 < lik.theta[0] < upper[0] - 1
        assert set(lik.priors) == {"label_noise"}
        assert clf.log_prior_ == pytest.approx(clf.kernel_.log_prior() + lik.log_prior(), rel=1e-12)
    P = noisy.predict_proba(50 * Xt)
    assert P.min() >= eps_noisy * (1 - 1e-12)

    def loss(clf):
        return -np.mean(clf.predict_log_proba(Xt)[np.arange(len(yt)), yt])

    assert loss(noisy) < loss(plain)
    # Without priors epsilon is learned by the ELBO alone.
    flat = pygpfast.SVGPClassifier(label_noise="learn", priors=None, n_inducing=30, random_state=0).fit(Xf, yf)
    assert flat.likelihood_.priors == {} and flat.log_prior_ == 0.0
    assert 0.05 < flat.likelihood_.label_noise < 0.2


def test_learned_label_noise_validation_and_repr():
    from pygpfast.likelihoods import RobustMax

    with pytest.raises(ValueError, match="learn_label_noise=True needs label_noise > 0"):
        Bernoulli(learn_label_noise=True)
    with pytest.raises(ValueError, match="learn_label_noise must be True or False"):
        Bernoulli(label_noise=0.1, learn_label_noise="yes")
    lik = Bernoulli(label_noise=0.1, learn_label_noise=True)
    assert lik.param_names == ("label_noise",) and lik.learn_label_noise
    assert repr(lik) == "Bernoulli(link='probit', n_gh=20, label_noise=0.1, learn_label_noise=True)"
    with pytest.raises(ValueError, match=r"label_noise must be a number in \(0, 0.5\)"):
        lik.params = [0.5]
    lik.theta = [np.log(0.2)]
    assert lik.label_noise == pytest.approx(0.2, rel=1e-15)
    assert np.exp(lik.theta_bounds()[1][0]) < 0.5
    fixed = Bernoulli(label_noise=0.1)
    assert fixed.param_names == () and fixed.n_params == 0 and not fixed.learn_label_noise
    rm = RobustMax(4, epsilon=0.1, learn_epsilon=True)
    assert rm.param_names == ("epsilon",) and np.exp(rm.theta_bounds()[1][0]) < 0.75
    with pytest.raises(ValueError, match=r"epsilon must be a number in \(0, 0.75\)"):
        rm.params = [0.8]
    X, y = flipped_data(n=60)
    with pytest.raises(ValueError, match="label_noise='learn' needs a Bernoulli likelihood"):
        pygpfast.SVGPClassifier(label_noise="learn", max_iter=3).fit(X, y + (X[:, 1] > 1))
    with pytest.raises(ValueError, match="method='mf'.*label_noise='learn'"):
        pygpfast.SVGPClassifier(label_noise="learn", method="mf", max_iter=3).fit(X, y)
    with pytest.raises(ValueError, match="label_noise"):
        pygpfast.SVGPClassifier(label_noise="learned").fit(X, y)
