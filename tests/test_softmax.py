"""The softmax likelihood: against a numpy transcription of its rule, against independent
high-accuracy quadrature (a tensor Gauss-Hermite rule for C = 3, the Bernoulli-logit for C = 2),
finite differences, the var -> 0 limit, extreme inputs, bad input and thread counts."""

import copy
import itertools
import pickle

import numpy as np
import pytest
from scipy import integrate, special
from scipy.special import logsumexp, softmax

import pygpfast
from pygpfast.likelihoods import Bernoulli, Softmax

# The rule's constants (csrc/src/softmax.cpp).
STEP, TAIL_SCALE, STOP, MAX_NODES, PRICE_VARIANCE, MAX_SCALED_EXPONENT = 0.5, 1e-2, 1e-12, 1024, 1e-10, 600.0


def normal_rule(n):
    x, w = np.polynomial.hermite.hermgauss(n)
    return np.sqrt(2.0) * x, w / np.sqrt(np.pi)


def rule_reference(y, mu, var, n_gh):
    """The likelihood's rule written out in numpy for one point (mu, var [C]): returns
    E[log softmax_y], its derivatives in mu and var, and log E[softmax_c] [C]."""
    z, w = normal_rule(n_gh)
    C = mu.size
    s = np.sqrt(var)
    f = mu[:, None] + s[:, None] * z  # [C, K]
    shift = STEP * np.floor(logsumexp(f, b=np.broadcast_to(w, f.shape)) / STEP)
    e = np.exp(f - shift)
    a, b, c = e @ w, e**2 @ w, e**3 @ w
    A = a.sum()
    k2_c = b - a**2
    k2, k3 = k2_c.sum(), (c - 3 * a * b + 2 * a**3).sum()
    top = e[:, -1:]  # the largest node of each class
    ratio = np.divide(e, top, out=np.zeros_like(e), where=top > 0)
    r4 = (top[:, 0] * (ratio**4 @ w) ** 0.25).sum()
    j_lo = int(np.ceil((np.log(TAIL_SCALE) - np.log(r4)) / STEP))
    price = var < PRICE_VARIANCE
    offset = np.maximum(mu - shift, mu - shift + s * z[-1] - MAX_SCALED_EXPONENT)
    g = np.exp((mu - shift - offset)[:, None] + s[:, None] * z)
    g1, g2, g3 = g @ w, (g * e) @ w, (g * e**2) @ w
    vsum = d_a = 0.0
    gmu, gvar, pacc = np.zeros(C), np.zeros(C), np.zeros(C)
    stop_value = stop_proba = False
    for j in range(j_lo, j_lo + MAX_NODES):
        t = np.exp(j * STEP)
        q = np.exp(-t * e)
        L = q @ w
        others = np.array([np.prod(np.delete(L, k)) for k in range(C)])
        P, P0 = np.prod(L), np.exp(-t * A)
        m = (e * q) @ w
        n_z = (e * q) @ (w * z)
        n_price = t * (t * e**2 * q - e * q) @ w
        if not stop_value:
            vsum += P0 - P
            d_a += t * P0
            gmu += t * m * others
            gvar += np.where(price, -0.5 * n_price, t * n_z / (2 * np.where(price, 1.0, s))) * others
            stop_value = P + P0 + (t * m * others).sum() < STOP
        if not stop_proba:
            term, cv = (g * q) @ w * others * t, g1 * P0 * t
            pacc += term - cv
            stop_proba = P + P0 + (term + cv).sum() < STOP
        if stop_value and stop_proba:
            break
    G2 = STEP * np.exp(2 * j_lo * STEP) / np.expm1(2 * STEP)
    G3 = STEP * np.exp(3 * j_lo * STEP) / np.expm1(3 * STEP)
    lse = shift + np.log(A) + STEP * vsum - 0.5 * k2 * G2 + (k3 / 6 + 0.5 * A * k2) * G3
    c1, c2, c3 = 1 / A - STEP * d_a + 0.5 * k2 * G3, -0.5 * G2 + 0.5 * A * G3, G3 / 6
    ss = np.where(price, 1.0, 2 * s)
    da = np.where(price, a / 2, (e * z) @ w / ss)
    db = np.where(price, 2 * b, 2 * (e**2 * z) @ w / ss)
    dc = np.where(price, 4.5 * c, 3 * (e**3 * z) @ w / ss)

    def chain(da, db, dc):
        return c1 * da + c2 * (db - 2 * a * da) + c3 * (dc - 3 * (b * da + a * db) + 6 * a**2 * da)

    dlse_mu = chain(a, 2 * b, 3 * c) + STEP * gmu
    dlse_var = chain(da, db, dc) + STEP * gvar
    K1, K2 = A - a, k2 - k2_c
    third = g3 / 2 + g2 * K1 + g1 * (K2 - a * (2 * A - a)) / 2
    scaled = g1 / A + STEP * pacc + (g1 * a - g2) * G2 + third * G3
    log_p = offset + np.log(scaled)
    return mu[y] - lse, np.eye(C)[y] - dlse_mu, -dlse_var, log_p - logsumexp(log_p)


def random_points(rng, n, C, max_var=3.0):
    mu = rng.normal(0.0, 2.0, (n, C))
    var = np.exp(rng.uniform(np.log(1e-3), np.log(max_var), (n, C)))
    y = rng.integers(0, C, n).astype(float)
    return y, mu, var


@pytest.mark.parametrize("C, n_gh", [(2, 20), (3, 20), (5, 7), (4, 32)])
def test_matches_numpy_transcription_of_the_rule(rng, C, n_gh):
    y, mu, var = random_points(rng, 12, C)
    var[0, 0] = 0.0  # Price's form
    var[1] = 1e-12
    mu[2, 1] = -900.0  # a class far below the others
    lik = Softmax(C, n_gh=n_gh)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    proba = lik.predict_proba(mu, var)
    log_density = lik.predict_log_density(y, mu, var)
    for i in range(len(y)):
        v_ref, dmu_ref, dvar_ref, logp_ref = rule_reference(int(y[i]), mu[i], var[i], n_gh)
        np.testing.assert_allclose(value[i], v_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d_mu[i], dmu_ref, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(d_var[i], dvar_ref, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(proba[i], np.exp(logp_ref), rtol=1e-11, atol=1e-300)
        np.testing.assert_allclose(log_density[i], logp_ref[int(y[i])], rtol=1e-12, atol=1e-11)


def tensor_gauss_hermite(mu, var, n=40):
    """E[lse(f)], E[softmax(f)] and E[softmax(f)^2] for one point of C = 3 by the n^3-point
    product Gauss-Hermite rule (an independent reference: 40 and 60 points per axis agree to
    1e-14 for var <= 1)."""
    z, w = normal_rule(n)
    grids = np.meshgrid(*[m + np.sqrt(v) * z for m, v in zip(mu, var)], indexing="ij")
    F = np.stack([g.ravel() for g in grids], axis=1)
    W = np.einsum("i,j,k->ijk", w, w, w).ravel()
    p = softmax(F, axis=1)
    return W @ logsumexp(F, axis=1), W @ p, W @ p**2


def test_accuracy_against_tensor_quadrature(rng):
    """C = 3 against an independent 64 000-point product rule: the value, both gradients
    (Bonnet: dE[lse]/dmu_c = E[p_c]; Price: dE[lse]/dvar_c = E[p_c - p_c^2] / 2) and the
    predictions agree to the accuracy of the outer rule (step 1/2: about 1e-9 in the value,
    1e-7 in gradients and probabilities; the inner rule is more accurate at these variances)."""
    y, mu, var = random_points(rng, 8, 3, max_var=1.0)
    lik = Softmax(3)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    proba = lik.predict_proba(mu, var)
    log_density = lik.predict_log_density(y, mu, var)
    for i in range(len(y)):
        lse, p, p2 = tensor_gauss_hermite(mu[i], var[i])
        k = int(y[i])
        np.testing.assert_allclose(value[i], mu[i, k] - lse, atol=2e-9)
        np.testing.assert_allclose(d_mu[i], np.eye(3)[k] - p, atol=2e-7)
        np.testing.assert_allclose(d_var[i], -0.5 * (p - p2), atol=2e-7)
        np.testing.assert_allclose(proba[i], p, atol=2e-7)
        np.testing.assert_allclose(log_density[i], np.log(p[k]), rtol=1e-6)


@pytest.mark.parametrize("var_scale", [0.3, 3.0])
def test_two_classes_are_the_bernoulli_logit(rng, var_scale):
    """softmax_1(f0, f1) = sigmoid(f1 - f0) with f1 - f0 ~ N(mu1 - mu0, var0 + var1): the value,
    the gradients (d/dmu1 = -d/dmu0 = d/dm; d/dvar_c = d/dv) and the predictions agree with the
    one-dimensional Bernoulli-logit rule."""
    y, mu, var = random_points(rng, 20, 2, max_var=var_scale)
    lik = Softmax(2, n_gh=32)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    m, v = mu[:, 1] - mu[:, 0], var.sum(1)
    logit = Bernoulli("logit", n_gh=100)
    v_ref, dm_ref, dv_ref = logit.variational_expectations(y, m, v)
    tol = 1e-8 if var_scale < 1 else 1e-6  # value; gradients and probabilities: 100 x
    np.testing.assert_allclose(value, v_ref, atol=tol)
    np.testing.assert_allclose(d_mu[:, 1], dm_ref, atol=100 * tol)
    np.testing.assert_allclose(d_mu[:, 0], -dm_ref, atol=100 * tol)
    np.testing.assert_allclose(d_var, np.stack([dv_ref, dv_ref], 1), atol=100 * tol)
    np.testing.assert_allclose(lik.predict_proba(mu, var)[:, 1], logit.predict_mean_and_var(m, v)[0],
                               atol=100 * tol)
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), logit.predict_log_density(y, m, v),
                               rtol=100 * tol, atol=100 * tol)


def test_accuracy_improves_with_n_gh(rng):
    """At large variances the inner Gauss-Hermite rule sets the error; it falls with n_gh."""
    y, mu, var = random_points(rng, 10, 2, max_var=8.0)
    m, v = mu[:, 1] - mu[:, 0], var.sum(1)
    exact = Bernoulli("logit", n_gh=100).variational_expectations(y, m, v)[0]
    errors = [np.abs(Softmax(2, n_gh=n).variational_expectations(y, mu, var)[0] - exact).max()
              for n in (8, 16, 32)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-6


@pytest.mark.parametrize("C", [2, 4])
def test_derivatives_match_finite_differences(rng, C):
    y, mu, var = random_points(rng, 6, C)
    var[0, 0] = 2e-10  # just above the threshold of Price's form
    var[1, 0] = 0.0  # Price's form (forward differences)
    lik = Softmax(C)
    _, d_mu, d_var = lik.variational_expectations(y, mu, var)

    def value(i, m, v):
        return lik.variational_expectations(y[i:i + 1], m[i:i + 1], v[i:i + 1])[0][0]

    for i, c in itertools.product(range(len(y)), range(C)):
        for which, analytic, eps in (("mu", d_mu, 1e-5), ("var", d_var, 1e-6)):
            plus = {"mu": mu.copy(), "var": var.copy()}
            minus = {"mu": mu.copy(), "var": var.copy()}
            plus[which][i, c] += eps
            central = which == "mu" or var[i, c] > 2 * eps
            if central:
                minus[which][i, c] -= eps
            fd = (value(i, plus["mu"], plus["var"]) - value(i, minus["mu"], minus["var"])) / (
                (2 if central else 1) * eps)
            np.testing.assert_allclose(analytic[i, c], fd, rtol=1e-5, atol=1e-8 if central else 1e-6)


def test_point_mass_is_log_softmax(rng):
    """var = 0: the value is log softmax_y(mu), the mean gradient e_y - softmax(mu) and the
    predictions softmax(mu), to rounding (the control variate is exact there); the variance
    gradient (Price) -(p - p^2) / 2 to the outer rule's accuracy."""
    y, mu, _ = random_points(rng, 30, 6)
    mu *= 3
    var = np.zeros_like(mu)
    lik = Softmax(6)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    p = softmax(mu, axis=1)
    k = y.astype(int)
    log_p = mu - logsumexp(mu, axis=1, keepdims=True)
    np.testing.assert_allclose(value, log_p[np.arange(30), k], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(d_mu, np.eye(6)[k] - p, atol=1e-13)
    np.testing.assert_allclose(d_var, -0.5 * (p - p * p), atol=5e-7)
    np.testing.assert_allclose(lik.predict_proba(mu, var), p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(lik.predict_log_density(y, mu, var), log_p[np.arange(30), k], rtol=1e-12)


def test_adding_a_constant_to_all_classes_changes_nothing(rng):
    y, mu, var = random_points(rng, 10, 4)
    lik = Softmax(4)
    base = lik.variational_expectations(y, mu, var)
    for shift in (0.3, -7.0, 250.0):  # (0.3: the grid moves by a fraction of its step)
        moved = lik.variational_expectations(y, mu + shift, var)
        np.testing.assert_allclose(moved[0], base[0], rtol=1e-12, atol=2e-8)
        for a, b in zip(base[1:], moved[1:]):
            np.testing.assert_allclose(a, b, atol=5e-7)
        np.testing.assert_allclose(lik.predict_proba(mu + shift, var), lik.predict_proba(mu, var), atol=5e-7)


def test_predictions_sum_to_one_and_stay_finite_in_extremes():
    mu = np.array([[0.0, -800.0, 5.0], [1e6, 1e6, 1e6], [0.0, 0.0, 0.0], [3.0, -2.0, 0.5]])
    var = np.array([[0.5, 0.5, 1e-14], [1.0, 1.0, 1.0], [1e4, 1e4, 1e4], [0.0, 50.0, 2.0]])
    y = np.array([1.0, 2.0, 0.0, 1.0])
    lik = Softmax(3)
    proba = lik.predict_proba(mu, var)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(proba[1], 1 / 3, rtol=1e-8)
    np.testing.assert_allclose(proba[2], 1 / 3, rtol=1e-8)
    log_density = lik.predict_log_density(y, mu, var)
    assert np.all(np.isfinite(log_density))
    # Class 1 of point 0 lies 805 below class 2: log p ~ -805 + var/2, where exp underflows.
    np.testing.assert_allclose(log_density[0], -805.0 + 0.25, atol=0.01)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    assert np.all(np.isfinite(value)) and np.all(np.isfinite(d_mu)) and np.all(np.isfinite(d_var))
    assert np.all(value <= 0) and np.all(d_var <= 1e-12)  # E[log softmax] <= 0, concave in f
    assert value[0] < -800
    # All classes' log probabilities at once, in log space: log(predict_proba) was -inf for
    # class 1 of point 0 (VGPClassifier's multinomial predict_log_proba took that logarithm).
    log_proba = lik.predict_log_proba(mu, var)
    np.testing.assert_allclose(log_proba[np.arange(4), y.astype(int)], log_density, rtol=1e-13)
    np.testing.assert_allclose(np.exp(log_proba), proba, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(log_proba[0, 1], -805.0 + 0.25, atol=0.01)
    with pytest.raises(ValueError, match="softmax"):
        pygpfast._core.likelihoods.predict_log_class_probabilities(*Bernoulli()._core_args(), mu[:, 0].copy(), var[:, 0].copy())


def logistic_moments(m, v):
    """E[log sigmoid(d)], E[sigmoid(d)] and E[sigmoid(d) sigmoid(-d)] for d ~ N(m, v), by
    adaptive quadrature (an independent reference at any variance)."""
    s = np.sqrt(v)
    lo, hi = m - 40 * s, m + 40 * s
    # Pieces: the logistic's bend [-60, 60] alone, so that quad cannot step over it.
    cuts = [lo] + [c for c in (-60.0, 60.0) if lo < c < hi] + [hi]
    out = []
    for g in (special.log_expit, special.expit, lambda d: special.expit(d) * special.expit(-d)):
        f = lambda d, g=g: g(d) * np.exp(-0.5 * ((d - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        out.append(sum(integrate.quad(f, a, b, limit=400, epsabs=1e-15, epsrel=1e-13)[0]
                       for a, b in zip(cuts[:-1], cuts[1:])))
    return out


@pytest.mark.parametrize("big", [10.5, 60.0, 1e3, 1e5])
def test_two_classes_at_large_variances(big):
    """Above variance 10 a class's inner integral takes the Gumbel form (softmax.hpp). C = 2
    against adaptive quadrature of the logistic integral in d = f1 - f0 ~ N(mu1 - mu0, var0 +
    var1), with one or both classes wide: the value, both gradients and the predictions agree
    to the outer rule's floor (~1e-9 in the value with a narrow class, 1e-13 relative without
    one; 1e-7 in the rest). The Gauss-Hermite rule alone erred by 2.5e-3 in the probabilities at
    variance 30 and 4e-2 at 1000, and its value was wrong at 1e4."""
    mu = np.array([[0.4, -1.3], [2.0, 2.5], [-3.0, 4.0]])
    var = np.array([[big, 0.7], [big, big], [0.0, big]])
    y = np.array([1.0, 0.0, 1.0])
    lik = Softmax(2)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    proba = lik.predict_proba(mu, var)
    log_density = lik.predict_log_density(y, mu, var)
    for i in range(len(y)):
        sign = 1.0 if y[i] == 1 else -1.0
        e_log, p1, pq = logistic_moments(sign * (mu[i, 1] - mu[i, 0]), var[i].sum())
        p1 = p1 if sign > 0 else 1.0 - p1  # E[sigmoid(f1 - f0)] = P(y = 1)
        # (The fine grid's trapezoidal sum of e^-t exceeded its integral by 3.5e-9 in every wide
        # point; every class wide, e^-t is gone; with a narrow class, the excess is subtracted.)
        tol = 1e-13 * max(1.0, abs(e_log)) if var[i].min() > 10 else 3e-9
        np.testing.assert_allclose(value[i], e_log, rtol=0, atol=tol)
        np.testing.assert_allclose(d_mu[i], np.array([1.0 - y[i], y[i]]) - np.array([1 - p1, p1]),
                                   atol=3e-7)
        np.testing.assert_allclose(d_var[i], -0.5 * pq, atol=3e-7)
        np.testing.assert_allclose(proba[i], [1 - p1, p1], atol=3e-7)
        np.testing.assert_allclose(log_density[i], np.log([1 - p1, p1][int(y[i])]), rtol=1e-6)


@pytest.mark.parametrize("big", [1e7, 1e9, 1e12])
def test_all_wide_points_at_any_variance(big):
    """Every class above variance 10: the grid's step follows the smallest standard deviation,
    so variances of 1e8 and beyond are integrated (the fine grid was capped at 2^17 nodes,
    ~1e7, and gave probabilities [1, 0, 0] where Monte Carlo gives [4e-5, 2e-3, 0.998]). C = 2
    against the logistic integral; C = 3 against 10^6 Monte Carlo draws."""
    mu = np.array([[2.0, 2.5], [-3e3, 4e3]])
    var = np.array([[big, big], [big, 0.3 * big]])
    y = np.array([0.0, 1.0])
    lik = Softmax(2)
    value, d_mu, d_var = lik.variational_expectations(y, mu, var)
    proba = lik.predict_proba(mu, var)
    for i in range(2):
        sign = 1.0 if y[i] == 1 else -1.0
        e_log, p1, pq = logistic_moments(sign * (mu[i, 1] - mu[i, 0]), var[i].sum())
        p1 = p1 if sign > 0 else 1.0 - p1
        np.testing.assert_allclose(value[i], e_log, rtol=2e-12)
        np.testing.assert_allclose(d_mu[i], np.array([1.0 - y[i], y[i]]) - np.array([1 - p1, p1]), atol=1e-13)
        np.testing.assert_allclose(d_var[i], -0.5 * pq, rtol=1e-6, atol=1e-20)
        np.testing.assert_allclose(proba[i], [1 - p1, p1], atol=1e-13)
    mu3 = np.array([-67462.8, 15873.6, 51589.2])
    var3 = np.array([9.03e8, 1.224e8, 3.856e7])
    f = mu3 + np.sqrt(var3) * np.random.default_rng(3).standard_normal((10**6, 3))
    counts = np.bincount(f.argmax(1), minlength=3) / len(f)  # softmax = argmax at this scale
    np.testing.assert_allclose(Softmax(3).predict_proba(mu3[None], var3[None])[0], counts, atol=2e-4)


@pytest.mark.parametrize("var", [10.01, 20.0, 100.0, 400.0])
def test_wide_points_log_probabilities_far_below_the_top(var):
    """Classes 1000 below the top one: log E[softmax_c] = -1000 + var to within e^-(1000 - 2 var)
    (E[e^{f_c - f_top}], the other terms of the sum negligible). Above variance 10 it was
    log(max(p, DBL_MIN)) = -708.4 for every such class, however far below; the narrow rule just
    below 10 gives the same formula."""
    lik = Softmax(3)
    mu = np.array([[0.0, 1000.0, -5.0]])
    for v in (9.99, var):
        log_proba = lik.predict_log_proba(mu, np.full((1, 3), v))[0]
        np.testing.assert_allclose(log_proba, [-1000.0 + v, 0.0, -1005.0 + v], rtol=1e-10, atol=1e-12)
        log_density = lik.predict_log_density([2.0], mu, np.full((1, 3), v))
        np.testing.assert_allclose(log_density, -1005.0 + v, rtol=1e-10)


def log_expected_sigmoid(m, v):
    """log E[sigmoid(d)] for d ~ N(m, v) by adaptive quadrature around the integrand's peak, in
    log space (an independent reference for probabilities far below e^-708)."""
    s = np.sqrt(v)
    log_f = lambda d: special.log_expit(d) - 0.5 * ((d - m) / s) ** 2 - np.log(s * np.sqrt(2 * np.pi))
    grid = np.linspace(m - 40 * s, max(m + 40 * s, 60.0), 20001)
    peak_at = grid[np.argmax(log_f(grid))]
    peak = log_f(peak_at)
    value = sum(integrate.quad(lambda d: np.exp(log_f(d) - peak), a, b, limit=400, epsabs=0, epsrel=1e-13)[0]
                for a, b in [(peak_at - 40 * s - 60, peak_at), (peak_at, peak_at + 40 * s + 60)])
    return peak + np.log(value)


@pytest.mark.parametrize("mu, var", [
    ([0.0, 60.0], [30.0, 20.0]),      # both wide, class 0 at e^-35
    ([-100.0, 80.0], [12.0, 400.0]),  # e^-(hundreds)
    ([0.0, 45.0], [11.0, 0.5]),       # a narrow class on top (mixed point)
    ([-30.0, 71.5], [10.5, 0.1]),
])
def test_wide_points_small_log_probabilities_against_the_logistic_integral(mu, var):
    """Below 1e-8 a wide point's class probability is recomputed in log space by tilting: the
    wide grid's own value rests on the Gumbel rule's tails and was off by up to 96 in log p on
    random points (C = 4), e.g. -228.6 where the answer is -93.6. C = 2 against the logistic
    integral in d = f0 - f1, in log space."""
    lik = Softmax(2)
    mu, var = np.array([mu]), np.array([var])
    reference = log_expected_sigmoid(mu[0, 0] - mu[0, 1], var.sum())
    assert reference < np.log(1e-8)
    # (2e-9: the reference's quadrature; at mu = (0, 45) the answer is -39.25 - O(e^-67), which
    # the likelihood gives to the last digit and quad to 4e-8)
    np.testing.assert_allclose(lik.predict_log_proba(mu, var)[0, 0], reference, rtol=2e-9)
    np.testing.assert_allclose(lik.predict_log_density([0.0], mu, var), [reference], rtol=2e-9)
    # predict_proba keeps the wide grid's value: wrong in its digits there, not in 1e-12.
    assert abs(lik.predict_proba(mu, var)[0, 0] - np.exp(reference)) < 1e-12


def test_narrow_class_beside_classes_too_wide_for_the_grid_is_refused():
    # A class of variance <= 10 keeps the fine step, so the grid would need ~2.6e6 nodes: refused
    # rather than cut short (which gave silently wrong values).
    lik = Softmax(3)
    mu, var = np.array([[0.0, 1.0, 2.0]]), np.array([[1.0, 1e10, 1e9]])
    with pytest.raises(ValueError, match="quadrature nodes.*standardise the inputs"):
        lik.variational_expectations([0], mu, var)
    with pytest.raises(ValueError, match="latent variances from 1 to 10000000000"):
        lik.predict_proba(mu, var)


def test_wide_classes_too_far_apart_for_the_grid_are_refused_with_their_own_reason():
    # Every class is wide, so the step is s_min / 2 over the widest class's reach: variances
    # 11 and 1e10 need ~5e5 nodes. The message blamed "a class of variance <= 10", which the
    # point does not have. Variances up to ~2e8 apart are integrated (Monte Carlo at 1e9).
    lik = Softmax(3)
    mu = np.zeros((1, 3))
    with pytest.raises(ValueError, match="from 11 to 10000000000: with every class wider than 10") as info:
        lik.predict_proba(mu, np.array([[11.0, 1e10, 11.0]]))
    assert "<= 10" not in str(info.value)
    var = np.array([11.0, 1e9, 11.0])
    f = np.sqrt(var) * np.random.default_rng(4).standard_normal((10**6, 3))
    e = np.exp(f - f.max(1, keepdims=True))
    np.testing.assert_allclose(lik.predict_proba(mu, var[None])[0], (e / e.sum(1, keepdims=True)).mean(0),
                               atol=3e-3)


def test_large_variance_derivatives_and_the_switch_at_ten(rng):
    """The Gumbel form's derivatives are those of its value (finite differences, C = 3 with
    wide, narrow and point-mass classes), and the switch from the Gauss-Hermite form at
    variance 10 moves the result by no more than that rule's own error there."""
    lik = Softmax(3)
    mu = np.array([[0.3, 2.0, -1.0], [1.0, -4.0, 0.5]])
    var = np.array([[0.5, 50.0, 3.0], [500.0, 0.0, 20.0]])
    y = np.array([0.0, 2.0])
    _, d_mu, d_var = lik.variational_expectations(y, mu, var)

    def value(i, m, v):
        return lik.variational_expectations(y[i:i + 1], m[None], v[None])[0][0]

    for i, c in itertools.product(range(2), range(3)):
        step = np.eye(3)[c]
        fd_mu = (value(i, mu[i] + 1e-5 * step, var[i]) - value(i, mu[i] - 1e-5 * step, var[i])) / 2e-5
        np.testing.assert_allclose(d_mu[i, c], fd_mu, atol=1e-8)
        if var[i, c] > 0:
            h = 1e-5 * var[i, c]
            fd_var = (value(i, mu[i], var[i] + h * step) - value(i, mu[i], var[i] - h * step)) / (2 * h)
            np.testing.assert_allclose(d_var[i, c], fd_var, atol=1e-8)
    at = lik.variational_expectations(y, mu, np.full((2, 3), 10.0))
    above = lik.variational_expectations(y, mu, np.full((2, 3), 10.0 * (1 + 1e-12)))
    assert np.abs(at[0] - above[0]).max() < 1e-4
    assert np.abs(at[1] - above[1]).max() < 5e-4 and np.abs(at[2] - above[2]).max() < 5e-4


def test_variances_of_predictions():
    lik = Softmax(3)
    mu, var = np.array([[0.2, -1.0, 1.5]]), np.array([[0.3, 0.1, 2.0]])
    mean, variance = lik.predict_mean_and_var(mu, var)
    np.testing.assert_array_equal(variance, mean * (1 - mean))


def test_thread_count_changes_nothing(rng, restore_threads):
    y, mu, var = random_points(rng, 400, 5)
    lik = Softmax(5)
    pygpfast.set_num_threads(1)
    one = lik.variational_expectations(y, mu, var) + (lik.predict_proba(mu, var),)
    pygpfast.set_num_threads(2)
    two = lik.variational_expectations(y, mu, var) + (lik.predict_proba(mu, var),)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_bad_input():
    lik = Softmax(3)
    mu, var, y = np.zeros((2, 3)), np.ones((2, 3)), np.array([0.0, 2.0])
    for bad in (3.0, -1.0, 0.5):
        with pytest.raises(ValueError, match=r"y\[1\] = .* outside the support of the softmax likelihood "
                                             r"with 3 classes: labels must be class indices"):
            lik.variational_expectations([0.0, bad], mu, var)
        with pytest.raises(ValueError, match="outside the support"):
            lik.predict_log_density([0.0, bad], mu, var)
    with pytest.raises(ValueError, match=r"mu must have shape \[N, 3\]"):
        lik.variational_expectations(y, np.zeros((2, 4)), var)
    with pytest.raises(ValueError, match="var must have the shape of mu"):
        lik.predict_mean_and_var(mu, np.ones((2, 2)))
    with pytest.raises(ValueError, match="y must have length 2"):
        lik.variational_expectations(y[:1], mu, var)
    with pytest.raises(ValueError, match="2D array"):
        lik.predict_proba(np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        lik.variational_expectations(y, np.full((2, 3), np.nan), var)
    with pytest.raises(ValueError, match=r"var\[1, 2\] = -1: marginal variances must be finite and >= 0"):
        lik.variational_expectations(y, mu, np.array([[1.0, 1, 1], [1, 1, -1]]))
    for args in ((1,), (2.5,), (True,), (3, 0), (3, 101), (3, 2.0)):
        with pytest.raises(ValueError, match="n_classes|n_gh"):
            Softmax(*args)


def test_attributes_repr_pickle():
    lik = Softmax(4, n_gh=12)
    assert lik.n_classes == lik.n_latent == 4 and lik.n_gh == 12
    assert lik.n_params == 0 and lik.params.shape == (0,)
    assert repr(lik) == "Softmax(n_classes=4, n_gh=12)"
    assert Bernoulli().n_latent == 1
    assert "Softmax" in pygpfast.likelihoods.__all__
    mu, var, y = np.array([[0.1, 0.2, -0.3, 1.0]]), np.array([[0.5, 0.1, 0.2, 0.0]]), np.array([3.0])
    for other in (pickle.loads(pickle.dumps(lik)), copy.deepcopy(lik)):
        assert repr(other) == repr(lik)
        np.testing.assert_array_equal(other.variational_expectations(y, mu, var)[0],
                                      lik.variational_expectations(y, mu, var)[0])
    value, d_mu, d_var, d_params = lik.variational_expectations(y, mu, var, return_param_grad=True)
    assert d_params.shape == (1, 0) and d_mu.shape == d_var.shape == (1, 4)


def test_narrow_class_beside_wide_ones_far_from_the_top_mean():
    """A class of variance <= 10 (Gauss-Hermite) in a point with wide classes (Gumbel form),
    its mean hundreds below the largest: the wide grid reaches t = e^u beyond the double range
    while the narrow class's e^{f - shift} underflows, and t e was inf * 0: every output NaN
    (a multi-class SVGP on features in the thousands then failed in a Cholesky). Against Monte
    Carlo of E[softmax(f)] and E[log softmax_y(f)], 10^6 draws."""
    lik = Softmax(3)
    mu = np.array([[-500.0, 400.0, -300.0], [-428.1, 383.1, 44.9]])
    var = np.array([[25000.0, 75000.0, 7.0], [2.9, 42181.3, 13372.5]])
    draws = np.random.default_rng(5).standard_normal((10**6, 3))
    for i in range(2):
        f = mu[i] + np.sqrt(var[i]) * draws
        prob = lik.predict_proba(mu[i:i + 1], var[i:i + 1])[0]
        np.testing.assert_allclose(prob, softmax(f, axis=1).mean(0), atol=2e-3)
        for y in range(3):
            value, d_mu, d_var = lik.variational_expectations([y], mu[i:i + 1], var[i:i + 1])
            assert np.all(np.isfinite(d_mu)) and np.all(np.isfinite(d_var))
            reference = np.mean(f[:, y] - logsumexp(f, axis=1))
            assert value[0] == pytest.approx(reference, rel=2e-3, abs=0.5)
