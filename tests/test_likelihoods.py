"""Public likelihoods against closed forms, scipy quadrature and finite differences."""

import copy
import pickle
import warnings

import numpy as np
import pytest
from scipy import integrate, special, stats

import pygpfast
from pygpfast.likelihoods import Bernoulli, Gaussian, Likelihood, Poisson

MU_GRID = [-3.0, -1.0, 0.0, 0.7, 2.5]
VAR_GRID = [0.0, 0.01, 0.5, 1.0, 2.0, 5.0]


def grid(var_grid=VAR_GRID):
    mu, var = np.meshgrid(MU_GRID, var_grid)
    return mu.ravel(), var.ravel()


def labels_for(lik, n):
    """Alternating labels in the likelihood's support."""
    if isinstance(lik, Bernoulli):
        return (np.arange(n) % 2).astype(float)
    if isinstance(lik, Poisson):
        return (np.arange(n) % 5).astype(float)
    return np.cos(np.arange(n))


def log_p(lik, y):
    """log p(y | f) as a function of f, written with scipy (the reference)."""
    if isinstance(lik, Gaussian):
        return lambda f: stats.norm.logpdf(y, f, np.sqrt(lik.variance))
    if isinstance(lik, Poisson):
        return lambda f: y * f - np.exp(f) - special.gammaln(y + 1)
    s = 2 * y - 1
    if lik.link == "probit":
        return lambda f: special.log_ndtr(s * f)
    return lambda f: -np.logaddexp(0.0, -s * f)


def normal_expectation(g, mu, var):
    """E[g(f)] under N(f | mu, var) by adaptive quadrature; g(mu) when var = 0."""
    if var == 0:
        return g(mu)
    sd = np.sqrt(var)

    def integrand(f):
        return g(f) * np.exp(-0.5 * ((f - mu) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))

    value, _ = integrate.quad(
        integrand, mu - 40 * sd, mu + 40 * sd, points=[mu], epsabs=1e-14, epsrel=1e-13, limit=500
    )
    return value


def reference_expectations(lik, y, mu, var):
    return np.array([normal_expectation(log_p(lik, yi), m, v) for yi, m, v in zip(y, mu, var)])


LIKELIHOODS = [
    Gaussian(0.7),
    Poisson(),
    Bernoulli("probit", n_gh=100),
    Bernoulli("logit", n_gh=100),
]


# ---- variational expectations -------------------------------------------------------------


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=repr)
def test_variational_expectation_values(lik):
    mu, var = grid()
    y = labels_for(lik, mu.size)
    value, _, _ = lik.variational_expectations(y, mu, var)
    reference = reference_expectations(lik, y, mu, var)
    np.testing.assert_allclose(value, reference, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_bernoulli_20_points(link):
    mu, var = grid()
    y = labels_for(Bernoulli(), mu.size)
    value_20 = Bernoulli(link, n_gh=20).variational_expectations(y, mu, var)[0]
    value_100 = Bernoulli(link, n_gh=100).variational_expectations(y, mu, var)[0]
    # Measured: 1.4e-5 (probit) and 5e-6 (logit) at var = 5; far less at var <= 1.
    np.testing.assert_allclose(value_20, value_100, rtol=0, atol=3e-5)
    small = var <= 1.0
    np.testing.assert_allclose(value_20[small], value_100[small], rtol=0, atol=1e-8)


def central_difference(fn, x, h):
    return (fn(x + h) - fn(x - h)) / (2 * h)


@pytest.mark.parametrize(
    "lik", LIKELIHOODS + [Bernoulli("probit", n_gh=20), Bernoulli("logit", n_gh=20)], ids=repr
)
def test_variational_expectation_derivatives(lik):
    # The derivatives come from the same quadrature rule (Bonnet/Price), so they equal the
    # derivatives of the quadrature value to within its error: small variances for 20 points.
    var_grid = [0.01, 0.5, 1.0] if isinstance(lik, Bernoulli) and lik.n_gh == 20 else VAR_GRID[1:]
    mu, var = grid(var_grid)
    y = labels_for(lik, mu.size)
    _, d_mu, d_var = lik.variational_expectations(y, mu, var)
    h = 1e-5
    fd_mu = central_difference(lambda m: lik.variational_expectations(y, m, var)[0], mu, h)
    fd_var = central_difference(lambda v: lik.variational_expectations(y, mu, v)[0], var, h)
    np.testing.assert_allclose(d_mu, fd_mu, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(d_var, fd_var, rtol=1e-7, atol=1e-8)


def test_gaussian_parameter_derivative():
    mu, var = grid()
    y = labels_for(Gaussian(), mu.size)
    lik = Gaussian(0.7)
    value, d_mu, d_var, d_params = lik.variational_expectations(y, mu, var, return_param_grad=True)
    np.testing.assert_array_equal(value, lik.variational_expectations(y, mu, var)[0])
    assert d_params.shape == (mu.size, 1)

    def value_at(variance):
        return Gaussian(variance).variational_expectations(y, mu, var)[0]

    np.testing.assert_allclose(d_params[:, 0], central_difference(value_at, 0.7, 1e-6), rtol=1e-7)
    np.testing.assert_allclose(d_mu, (y - mu) / 0.7, rtol=1e-14)
    np.testing.assert_allclose(d_var, -0.5 / 0.7, rtol=1e-14)


@pytest.mark.parametrize("lik", [Poisson(), Bernoulli()], ids=repr)
def test_parameter_free_likelihoods_have_empty_param_grad(lik):
    out = lik.variational_expectations([1.0, 0.0], [0.1, 0.2], [1.0, 2.0], return_param_grad=True)
    assert len(out) == 4 and out[3].shape == (2, 0)


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_bernoulli_point_mass_is_log_density(link):
    # var = 0 puts every node at mu: the expectation is log p(y | mu) with its derivatives,
    # including the asymptotic branch of log Phi far in the tail.
    f = np.concatenate([np.linspace(-1000, 40, 1041), [-20 - 1e-9, -20 + 1e-9, -38.5, 8.3]])
    lik = Bernoulli(link)
    for y in (0.0, 1.0):
        labels = np.full(f.size, y)
        value, d_mu, d_var = lik.variational_expectations(labels, f, np.zeros(f.size))
        s = 2 * y - 1
        # (scipy's log_ndtr, the reference, is itself off by 1.1e-13 relative at log Phi(29..36)
        # ~ -1e-185..-1e-284, checked against mpmath at 400 digits; the core is within 1.1e-15.)
        np.testing.assert_allclose(value, log_p(lik, y)(f), rtol=2e-13, atol=1e-300)
        if link == "probit":
            ref_d_mu = s * np.exp(stats.norm.logpdf(f) - special.log_ndtr(s * f))
        else:
            ref_d_mu = s * special.expit(-s * f)
        np.testing.assert_allclose(d_mu, ref_d_mu, rtol=1e-9, atol=1e-300)
        h = 1e-4 * np.maximum(1.0, np.abs(f))
        fd_d_mu = (
            lik.variational_expectations(labels, f + h, np.zeros(f.size))[1]
            - lik.variational_expectations(labels, f - h, np.zeros(f.size))[1]
        ) / (2 * h)
        np.testing.assert_allclose(d_var, 0.5 * fd_d_mu, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(
    "lik", [Gaussian(0.3), Poisson(), Bernoulli("probit"), Bernoulli("logit")], ids=repr
)
def test_extreme_inputs_are_finite(lik):
    mu, var = np.meshgrid([-500.0, -50.0, 50.0, 500.0], [0.0, 1e-8, 100.0])
    mu, var = mu.ravel(), var.ravel()
    for y in np.unique(labels_for(lik, 4)):
        labels = np.full(mu.size, y)
        for out in lik.variational_expectations(labels, mu, var):
            assert np.all(np.isfinite(out))
        assert np.all(np.isfinite(lik.predict_log_density(labels, mu, var)))
    # A Poisson rate exp(500) has a variance beyond float64 (exp(1100)): only mu <= 50 is
    # finite, and the overflow is announced
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, variance = lik.predict_mean_and_var(mu, var)
    assert [str(w.message)[:60] for w in caught] == (
        ["Poisson: the predictive mean or variance overflows float64 a"]
        if isinstance(lik, Poisson) else [])
    assert np.all(np.isfinite(mean))
    finite = mu <= 50 if isinstance(lik, Poisson) else np.ones(mu.size, bool)
    assert np.all(np.isfinite(variance[finite]))
    # Beyond the double range the variance is inf, not NaN (expm1(0) * inf * inf at var = 0).
    assert not np.any(np.isnan(variance))


def probit_curvature_lower_tail(f):
    """d2 log Phi(f) / df2 for f <= -100, from the asymptotic series of the Mills ratio R:
    with x = -f and u = 1 / x^2, x R = 1 - u + 3u^2 - 15u^3 + 105u^4 (next term below 1e-17
    relative), lambda = 1 / R and lambda + f = x (1 - x R) / (x R)."""
    x = -np.asarray(f, dtype=float)
    u = 1.0 / x**2
    xr = 1.0 - u + 3 * u**2 - 15 * u**3 + 105 * u**4
    c = x * (u - 3 * u**2 + 15 * u**3 - 105 * u**4) / xr
    return -(x + c) * c


@pytest.mark.parametrize("n_gh", [20, 100])
def test_probit_variance_derivative_far_in_the_tail(n_gh):
    # Far in the lower tail log Phi(f) ~ -f^2 / 2, so d/dvar ~ -1/2 for every variance. The
    # x-weighted node sum cancels there (it returned -0.75 at mu = -1e16, var = 1, and -13 at
    # mu = -1e8, var = 1e-12 through lambda + f), so the core switches to Price's form E[d2] / 2
    # with the tail's d2 from a continued fraction. Reference: E[d2] / 2 by adaptive quadrature
    # of an asymptotic series over the standardised variable, on both labels (y = 0 mirrors f).
    mu, var = np.meshgrid([-1e4, -1e6, -1e8, -1e12, -1e16, -1e50, -1e150],
                          [0.0, 1e-12, 1e-6, 1.0, 100.0])
    mu, var = mu.ravel(), var.ravel()
    lik = Bernoulli("probit", n_gh=n_gh)
    def half_expected_curvature(m, v):  # E[d2] / 2 over the standardised variable
        value, _ = integrate.quad(
            lambda t: probit_curvature_lower_tail(m + np.sqrt(v) * t) * stats.norm.pdf(t),
            -40, 40, epsabs=1e-15, epsrel=1e-13, limit=200)
        return 0.5 * value

    reference = np.array([half_expected_curvature(m, v) for m, v in zip(mu, var)])
    for y, sign in ((1.0, 1.0), (0.0, -1.0)):
        value, d_mu, d_var = lik.variational_expectations(np.full(mu.size, y), sign * mu, var)
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(d_mu))
        np.testing.assert_allclose(d_var, reference, rtol=1e-12)
    # Between that regime and the ordinary one the derivative stays continuous to rounding:
    # the switch sits where sqrt(2 var) = 1e-4 |mu|. (The jump there, relative: 6.8e-13 at
    # n_gh = 20 and 1.05e-12 at 100 as compiled, without FMA; 7.9e-13 and 7e-14 with the FMA
    # rounding of an AVX-512 build that contracted a * b + c.)
    m = np.array([-1e4, -1e4])
    v = 0.5 * (1e-4 * 1e4) ** 2 * np.array([1 - 1e-9, 1 + 1e-9])
    d_var = lik.variational_expectations(np.ones(2), m, v)[2]
    np.testing.assert_allclose(d_var[0], d_var[1], rtol=2e-12)


# ---- predictions ----------------------------------------------------------------------------


def test_gaussian_predictions():
    mu, var = grid()
    y = labels_for(Gaussian(), mu.size)
    lik = Gaussian(0.4)
    mean, variance = lik.predict_mean_and_var(mu, var)
    np.testing.assert_array_equal(mean, mu)
    np.testing.assert_allclose(variance, var + 0.4, rtol=1e-15)
    reference = stats.norm.logpdf(y, mu, np.sqrt(var + 0.4))
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), reference, rtol=1e-13)


def test_probit_predictions():
    mu, var = grid()
    y = labels_for(Bernoulli(), mu.size)
    lik = Bernoulli("probit")
    mean, variance = lik.predict_mean_and_var(mu, var)
    by_quad = [normal_expectation(special.ndtr, m, v) for m, v in zip(mu, var)]
    np.testing.assert_allclose(mean, by_quad, rtol=1e-12)
    np.testing.assert_allclose(mean, stats.norm.cdf(mu / np.sqrt(1 + var)), rtol=1e-14)
    np.testing.assert_allclose(variance, mean * (1 - mean), rtol=1e-12)
    s = 2 * y - 1
    np.testing.assert_allclose(
        lik.predict_log_density(y, mu, var), special.log_ndtr(s * mu / np.sqrt(1 + var)), rtol=1e-14
    )
    # Far in the tail the log density stays exact instead of log(0).
    np.testing.assert_allclose(
        lik.predict_log_density([1.0, 0.0], [-900.0, 900.0], [3.0, 3.0]),
        special.log_ndtr(-900 / 2.0),
        rtol=1e-13,
    )


# Measured worst relative errors (at var = 5): 1e-11 with 100 points, 4.4e-5 with 20.
@pytest.mark.parametrize("n_gh, rtol", [(100, 3e-11), (20, 1e-4)])
def test_logit_predictions(n_gh, rtol):
    mu, var = grid()
    y = labels_for(Bernoulli(), mu.size)
    lik = Bernoulli("logit", n_gh=n_gh)
    mean, variance = lik.predict_mean_and_var(mu, var)
    ref_mean = np.array([normal_expectation(special.expit, m, v) for m, v in zip(mu, var)])
    np.testing.assert_allclose(mean, ref_mean, rtol=rtol)
    np.testing.assert_allclose(variance, ref_mean * (1 - ref_mean), rtol=rtol)
    s = 2 * y - 1
    ref_density = [
        normal_expectation(lambda f: special.expit(si * f), m, v) for si, m, v in zip(s, mu, var)
    ]
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), np.log(ref_density), rtol=rtol)


# exp(y f - e^f) is far from a polynomial over the Gauss-Hermite nodes when var is large:
# measured worst relative errors of the log density, 1.1e-6 at var = 2 with 100 points,
# 3.9e-5 at var = 0.5 (1.6e-3 at var = 1) with 20.
@pytest.mark.parametrize("n_gh, max_var, rtol", [(100, 2.0, 3e-6), (20, 0.5, 1e-4)])
def test_poisson_predictions(n_gh, max_var, rtol):
    mu, var = grid([v for v in VAR_GRID if v <= max_var])
    y = labels_for(Poisson(), mu.size)
    lik = Poisson(n_gh=n_gh)
    mean, variance = lik.predict_mean_and_var(mu, var)
    ref_mean = np.array([normal_expectation(np.exp, m, v) for m, v in zip(mu, var)])
    ref_second = np.array(
        [normal_expectation(lambda f: np.exp(f) + np.exp(2 * f), m, v) for m, v in zip(mu, var)]
    )
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-12)
    np.testing.assert_allclose(variance, ref_second - ref_mean**2, rtol=1e-10)
    ref_density = [
        normal_expectation(lambda f: stats.poisson.pmf(yi, np.exp(f)), m, v)
        for yi, m, v in zip(y, mu, var)
    ]
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), np.log(ref_density), rtol=rtol)


POISSON_REAL_Y = np.array([0.0, 0.3, 1.0, 2.5, 7.25, 40.5])


def test_poisson_real_targets_use_the_same_formula():
    # Non-integer y: y f - e^f - lgamma(y + 1), as scikit-learn's Poisson models take them;
    # the derivatives do not involve lgamma.
    mu = np.array([-1.0, 0.0, 0.7, 1.2, 2.0, 3.5])
    var = np.array([0.5, 0.0, 1.0, 0.2, 0.6, 0.1])
    lik = Poisson(n_gh=100)
    value, d_mu, d_var = lik.variational_expectations(POISSON_REAL_Y, mu, var)
    reference = reference_expectations(lik, POISSON_REAL_Y, mu, var)
    np.testing.assert_allclose(value, reference, rtol=1e-11, atol=1e-11)
    rate = np.exp(mu + var / 2)
    np.testing.assert_allclose(d_mu, POISSON_REAL_Y - rate, rtol=1e-14)
    np.testing.assert_allclose(d_var, -rate / 2, rtol=1e-14)
    density = [normal_expectation(lambda f: np.exp(log_p(lik, yi)(f)), m, v)
               for yi, m, v in zip(POISSON_REAL_Y, mu, var)]
    np.testing.assert_allclose(lik.predict_log_density(POISSON_REAL_Y, mu, var), np.log(density),
                               rtol=3e-6)
    with pytest.raises(ValueError, match=r"y\[2\] = -0.5 is outside the support of the Poisson "
                                         r"likelihood: labels must be finite and >= 0"):
        lik.variational_expectations([1.5, 0.0, -0.5], mu[:3], var[:3])


# ---- threads, bad input, parameters, pickling -------------------------------------------------


@pytest.mark.parametrize(
    "lik", [Gaussian(0.3), Poisson(), Bernoulli("probit"), Bernoulli("logit")], ids=repr
)
def test_thread_count_changes_nothing(lik):
    rng = np.random.default_rng(0)
    n = 100_000
    mu = rng.normal(0, 3, n)
    var = rng.exponential(1.0, n)
    y = labels_for(lik, n)
    results = []
    try:
        for threads in (1, 2):
            pygpfast.set_num_threads(threads)
            results.append(
                lik.variational_expectations(y, mu, var, return_param_grad=True)
                + lik.predict_mean_and_var(mu, var)
                + (lik.predict_log_density(y, mu, var),)
            )
    finally:
        pygpfast.set_num_threads(None)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("lik", [Gaussian(), Poisson(), Bernoulli()], ids=repr)
def test_bad_points(lik):
    y, mu, var = [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]
    with pytest.raises(ValueError, match="NaN or infinity"):
        lik.variational_expectations(y, [0.0, np.nan], var)
    with pytest.raises(ValueError, match="NaN or infinity"):
        lik.predict_mean_and_var(mu, [np.inf, 1.0])
    with pytest.raises(ValueError, match="length 2"):
        lik.variational_expectations(y, mu, [1.0])
    with pytest.raises(ValueError, match="length 2"):
        lik.predict_log_density([1.0, 0.0, 1.0], mu, var)
    with pytest.raises(ValueError, match="empty"):
        lik.predict_mean_and_var([], [])
    with pytest.raises(ValueError, match="1-D"):
        lik.variational_expectations(np.ones((2, 1)), mu, var)
    with pytest.raises(ValueError, match=r"var\[1\] = -0.5"):
        lik.variational_expectations(y, mu, [1.0, -0.5])
    with pytest.raises(ValueError, match=r"var\[0\] = -1"):
        lik.predict_mean_and_var(mu, [-1.0, 1.0])


@pytest.mark.parametrize(
    "lik, bad",
    [
        (Bernoulli(), 0.5),
        (Bernoulli("logit"), -1.0),
        (Bernoulli(), 2.0),
        (Poisson(), -1.0),
        (Poisson(), -0.5),
    ],
    ids=repr,
)
def test_labels_outside_the_support(lik, bad):
    y = [1.0, bad]
    with pytest.raises(ValueError, match=rf"y\[1\] = {bad:g} is outside the support"):
        lik.variational_expectations(y, [0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=rf"y\[1\] = {bad:g}"):
        lik.predict_log_density(y, [0.0, 0.0], [1.0, 1.0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_labels_are_named(bad):
    y = [1.0, 2.0, bad]
    with pytest.raises(ValueError, match=rf"y contains NaN or infinity: y\[2\] = {bad}"):
        Poisson().variational_expectations(y, np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match=rf"y contains NaN or infinity: y\[2\] = {bad}"):
        Poisson().predict_log_density(y, np.zeros(3), np.ones(3))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Bernoulli("cloglog"),
        lambda: Bernoulli(n_gh=0),
        lambda: Bernoulli(n_gh=101),
        lambda: Bernoulli(n_gh=2.5),
        lambda: Bernoulli(n_gh=True),
        lambda: Poisson(n_gh=-3),
        lambda: Gaussian(0.0),
        lambda: Gaussian(-1.0),
        lambda: Gaussian(np.nan),
        lambda: Gaussian("1"),
    ],
)
def test_bad_construction(make):
    with pytest.raises(ValueError):
        make()


def test_parameters():
    lik = Gaussian(0.5)
    assert lik.param_names == ("variance",) and lik.n_params == 1
    np.testing.assert_array_equal(lik.params, [0.5])
    np.testing.assert_allclose(lik.theta, [np.log(0.5)], rtol=1e-15)
    lik.theta = [np.log(2.0)]
    assert lik.variance == pytest.approx(2.0, rel=1e-15)
    lik.params = np.array([3.0])
    assert lik.variance == 3.0
    with pytest.raises(ValueError, match="positive"):
        lik.params = [-1.0]
    with pytest.raises(ValueError, match="length 1"):
        lik.theta = [0.0, 1.0]
    for other in (Bernoulli(), Poisson()):
        assert other.n_params == 0 and other.param_names == ()
        assert other.params.shape == (0,) and other.theta.shape == (0,)
        other.theta = []


@pytest.mark.parametrize(
    "lik", [Gaussian(0.3), Poisson(n_gh=7), Bernoulli("logit", n_gh=9)], ids=repr
)
def test_pickle_and_deepcopy(lik):
    y, mu, var = [1.0, 0.0, 2.0], [0.1, -0.4, 1.2], [0.5, 1.0, 0.0]
    if isinstance(lik, Bernoulli):
        y[2] = 1.0
    expected = lik.variational_expectations(y, mu, var) + (lik.predict_log_density(y, mu, var),)
    for clone in (pickle.loads(pickle.dumps(lik)), copy.deepcopy(lik)):
        assert type(clone) is type(lik) and repr(clone) == repr(lik)
        got = clone.variational_expectations(y, mu, var) + (clone.predict_log_density(y, mu, var),)
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)


def test_repr_and_base_class():
    assert repr(Gaussian(0.25)) == "Gaussian(variance=0.25)"
    assert repr(Bernoulli("logit", n_gh=7)) == "Bernoulli(link='logit', n_gh=7)"
    assert repr(Poisson()) == "Poisson(n_gh=20)"
    assert all(isinstance(lik, Likelihood) for lik in LIKELIHOODS)
