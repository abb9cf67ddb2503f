"""The raw binary-IVM bindings (pygpfast._core.ivm.binary_*) against dense numpy/scipy references:
stub marginals after every inclusion, the exact GP in the all-active Gaussian limit, ADF moments
against numerical integration, the bound and its gradient against a dense bound and finite
differences, the greedy choice against a brute-force search, reproducibility, bad input."""

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
from scipy.special import log_ndtr, ndtr
from scipy.stats import multivariate_normal, norm

from pygpfast import _core, kernels

ivm = _core.ivm


# ---------------------------------------------------------------------------------------------
# problems and dense references


def make_problem(n, D=2, seed=0, gaussian=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    if gaussian:
        y = f + 0.3 * rng.standard_normal(n)
    else:
        y = np.where(f + 0.4 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def make_kernel(white=0.0, D=2):
    k = kernels.RBF(variance=1.4, lengthscale=np.array([0.8, 1.3])[:D])
    if white > 0:
        k = k + kernels.White(variance=white)
    codes, params = k._spec(D)
    return k, codes, params


def dense_K(codes, params, X, X2=None):
    """The kernel matrix through the core's kernel binding (K(X) with White on the diagonal)."""
    return _core.kernels.K(codes, params, X, X2)


def dense_marginals(K, active, b, pi):
    """h, a of Q(u) ∝ N(0, K) prod_I N-sites: A = K - K_{.,I} (Pi^-1 + K_I)^-1 K_{I,.}, h = A b."""
    I = np.asarray(active)
    C = K[np.ix_(I, I)] + np.diag(1.0 / pi)
    KnI = K[:, I]
    cf = scipy.linalg.cho_factor(C, lower=True)
    A = K - KnI @ scipy.linalg.cho_solve(cf, KnI.T)
    h = KnI @ scipy.linalg.cho_solve(cf, b / pi)
    return h, A


def probit_adf(y, h, a, bias=0.0, s2=1.0):
    z = y * (h + bias) / np.sqrt(s2 + a)
    r = np.exp(norm.logpdf(z) - log_ndtr(z))
    alpha = y * r / np.sqrt(s2 + a)
    nu = r * (z + r) / (s2 + a)
    return log_ndtr(z), alpha, nu


def gains(y, h, a, criterion, bias=0.0):
    _, alpha, nu = probit_adf(y, h, a, bias)
    ent = -0.5 * np.log1p(-a * nu)
    if criterion == "entropy":
        return ent
    return ent + 0.5 * (a * alpha**2 - a * nu)


def select(codes, params, X, y, d, **kw):
    kw.setdefault("seed", 3)
    return ivm.binary_select(codes, params, X, y, active_size=d, **kw)


# ---------------------------------------------------------------------------------------------
# representation


def test_stub_marginals_equal_dense_recompute_after_every_inclusion():
    X, y = make_problem(70, seed=1)
    _, codes, params = make_kernel()
    K = dense_K(codes, params, X)
    d, bias = 18, 0.3
    prev = None
    for k in range(1, d + 1):
        r = select(codes, params, X, y, k, bias=bias)
        act = r["active"]
        assert act.dtype == np.int32 and act.shape == (k,)
        assert len(set(act.tolist())) == k
        if prev is not None:  # a run of size k begins with the run of size k - 1
            np.testing.assert_array_equal(act[:-1], prev)
        prev = act
        h, A = dense_marginals(K, act, r["site_b"], r["site_pi"])
        np.testing.assert_allclose(r["h"], h, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r["a"], np.diag(A), rtol=0, atol=1e-12)
        # the small representation: L L^T = B, M = L^-1 Pi^1/2 K_{I,.}, h = M^T beta = K_{.,I} xi
        sq = np.sqrt(r["site_pi"])
        B = np.eye(k) + sq[:, None] * K[np.ix_(act, act)] * sq[None, :]
        np.testing.assert_allclose(r["L"] @ r["L"].T, B, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.triu(r["L"], 1), 0.0)
        M = scipy.linalg.solve_triangular(r["L"], sq[:, None] * K[act, :], lower=True)
        np.testing.assert_allclose(r["M"], M, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r["M"].T @ r["beta"], r["h"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(K[:, act] @ r["xi"], r["h"], rtol=0, atol=1e-12)
    # the literal (K^-1 + Pi)^-1 on a well-conditioned kernel, after the last inclusion
    _, codes_w, params_w = make_kernel(white=0.2)
    Kw = dense_K(codes_w, params_w, X)
    r = select(codes_w, params_w, X, y, d, bias=bias)
    Pi = np.zeros(len(y))
    bfull = np.zeros(len(y))
    Pi[r["active"]] = r["site_pi"]
    bfull[r["active"]] = r["site_b"]
    A = np.linalg.inv(np.linalg.inv(Kw) + np.diag(Pi))
    np.testing.assert_allclose(r["a"], np.diag(A), rtol=0, atol=1e-11)
    np.testing.assert_allclose(r["h"], A @ bfull, rtol=0, atol=1e-11)


def test_included_point_takes_its_tilted_moments():
    X, y = make_problem(40, seed=2)
    _, codes, params = make_kernel()
    for k in range(2, 8):
        before = select(codes, params, X, y, k - 1, bias=-0.2)
        after = select(codes, params, X, y, k, bias=-0.2)
        i = after["active"][-1]
        h, a = before["h"][i], before["a"][i]
        _, alpha, nu = probit_adf(y[i], h, a, bias=-0.2)
        np.testing.assert_allclose(after["h"][i], h + a * alpha, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(after["a"][i], a * (1 - a * nu), rtol=1e-12, atol=1e-14)


def test_gaussian_likelihood_all_active_is_the_exact_gp():
    n, s2, bias = 45, 0.15, 0.4
    X, y = make_problem(n, seed=3, gaussian=True)
    _, codes, params = make_kernel()
    K = dense_K(codes, params, X)
    r = select(codes, params, X, y, n, likelihood="gaussian", bias=bias, noise_variance=s2)
    assert sorted(r["active"].tolist()) == list(range(n))
    np.testing.assert_allclose(r["site_pi"], 1 / s2, rtol=1e-15)
    Ky = K + s2 * np.eye(n)
    cf = scipy.linalg.cho_factor(Ky, lower=True)
    mean = K @ scipy.linalg.cho_solve(cf, y - bias)
    cov = K - K @ scipy.linalg.cho_solve(cf, K)
    np.testing.assert_allclose(r["h"], mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(r["a"], np.diag(cov), rtol=0, atol=1e-10)
    # predictions at new points
    Xs = np.random.default_rng(9).standard_normal((25, 2))
    Ks = dense_K(codes, params, Xs, X)
    p = ivm.binary_predict(codes, params, X[r["active"]], site_pi=r["site_pi"], L=r["L"], beta=r["beta"],
                           Xnew=Xs, likelihood="gaussian", bias=bias, noise_variance=s2)
    np.testing.assert_allclose(p["mean"], Ks @ scipy.linalg.cho_solve(cf, y - bias), rtol=0, atol=1e-10)
    var = 1.4 - np.einsum("ij,ji->i", Ks, scipy.linalg.cho_solve(cf, Ks.T))
    np.testing.assert_allclose(p["var"], var, rtol=0, atol=1e-10)
    assert "proba" not in p
    # the bound is tight at the exact posterior: F = -log N(y | bias, K + s2 I)
    bd = ivm.binary_bound(codes, params, X, y, active=r["active"], site_b=r["site_b"], site_pi=r["site_pi"],
                          likelihood="gaussian", bias=bias, noise_variance=s2)
    nll = -multivariate_normal(np.full(n, bias), Ky).logpdf(y)
    np.testing.assert_allclose(bd["value"], nll, rtol=1e-11)


# ---------------------------------------------------------------------------------------------
# ADF site update


@pytest.mark.parametrize(
    "y,h,a,bias,s2",
    [
        (1.0, 0.3, 0.8, 0.0, 1.0),
        (-1.0, 0.3, 0.8, 0.2, 1.0),
        (1.0, -2.5, 2.0, 0.1, 1.0),
        (1.0, -6.0, 0.3, 0.0, 1.0),  # lower tail, z = -5.3
        (-1.0, 4.0, 1e-3, 0.0, 0.5),  # lower tail, tiny cavity variance
        (1.0, 5.0, 3.0, -0.5, 2.0),  # upper tail
        (1.0, 0.0, 0.0, 0.0, 1.0),  # no cavity variance
    ],
)
def test_probit_adf_matches_numerical_integration(y, h, a, bias, s2):
    u = ivm.binary_adf(np.array([y]), np.array([h]), np.array([a]), bias=bias, noise_variance=s2)
    # the probit of scale s2: P(y|u) = Phi(y (u + bias) / sqrt(s2)); integrate against N(u | h, a)
    if a > 0:
        sd = np.sqrt(a)

        def moment(p):
            f = lambda t: (h + sd * t) ** p * ndtr(y * (h + sd * t + bias) / np.sqrt(s2)) * norm.pdf(t)
            return scipy.integrate.quad(f, -12, 12, epsabs=0, epsrel=1e-13, limit=200)[0]

        Z, m1, m2 = moment(0), moment(1), moment(2)
        mean = m1 / Z
        var = m2 / Z - mean**2
    else:
        Z = ndtr(y * (h + bias) / np.sqrt(s2))
        mean, var = h, 0.0
    np.testing.assert_allclose(u["log_z"], np.log(Z), rtol=1e-10)
    np.testing.assert_allclose(h + a * u["alpha"], mean, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(a * (1 - a * u["nu"]), var, rtol=1e-7, atol=1e-12)
    # the site reproduces the tilted moments: (1/a + pi)^-1 = var, (h/a + b) var = mean
    if a > 0:
        pi, b = u["site_pi"][0], u["site_b"][0]
        np.testing.assert_allclose(1 / (1 / a + pi), var, rtol=1e-7)
        np.testing.assert_allclose((h / a + b) / (1 / a + pi), mean, rtol=1e-8, atol=1e-12)


def test_gaussian_adf_is_closed_form():
    y, h, a = np.array([0.7, -1.2]), np.array([0.1, 0.5]), np.array([0.4, 2.0])
    s2, bias = 0.3, 0.2
    u = ivm.binary_adf(y, h, a, likelihood="gaussian", bias=bias, noise_variance=s2)
    np.testing.assert_allclose(u["log_z"], norm.logpdf(y, h + bias, np.sqrt(s2 + a)), rtol=1e-14)
    np.testing.assert_allclose(u["alpha"], (y - bias - h) / (s2 + a), rtol=1e-14)
    np.testing.assert_allclose(u["nu"], 1 / (s2 + a), rtol=1e-14)
    np.testing.assert_allclose(u["site_pi"], 1 / s2, rtol=1e-15)
    np.testing.assert_allclose(u["site_b"], (y - bias) / s2, rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# selection


@pytest.mark.parametrize("criterion", ["entropy", "kl"])
def test_greedy_choice_is_the_brute_force_argmax(criterion):
    X, y = make_problem(60, seed=4)
    _, codes, params = make_kernel()
    K = dense_K(codes, params, X)
    n_random, d, bias = 2, 14, 0.1
    full = select(codes, params, X, y, d, n_random=n_random, criterion=criterion, bias=bias)
    for k in range(n_random, d):
        act = full["active"][:k]
        # the marginals after k inclusions, densely from the sites
        h, A = dense_marginals(K, act, full["site_b"][:k], full["site_pi"][:k])
        g = gains(y, h, np.diag(A), criterion, bias)
        g[act] = -np.inf
        assert full["active"][k] == np.argmax(g), k
        np.testing.assert_allclose(full["score"][k], g.max(), rtol=1e-9)
        assert np.sort(g)[-2] < g.max()  # (no tie)


def test_reproducible_with_the_seed():
    X, y = make_problem(150, seed=5)
    _, codes, params = make_kernel()
    a = select(codes, params, X, y, 20, seed=12, n_random=3)
    b = select(codes, params, X, y, 20, seed=12, n_random=3)
    for key in ("active", "site_b", "site_pi", "h", "a", "L", "M"):
        np.testing.assert_array_equal(a[key], b[key])
    others = {tuple(select(codes, params, X, y, 3, seed=s, n_random=3)["active"]) for s in range(6)}
    assert len(others) > 1  # the seed moves the random picks
    # the random picks are a fixed function of the seed (splitmix64): same on every platform
    np.testing.assert_array_equal(select(codes, params, X, y, 3, seed=12, n_random=3)["active"], a["active"][:3])


def test_ties_are_broken_by_the_seed():
    # Gaussian likelihood, constant kernel diagonal, points far apart: every candidate has the
    # same gain 1/2 log(1 + a / s2) until its neighbours are included, so greedy picks are ties.
    X = np.arange(30.0)[:, None] * 50.0
    y = np.zeros(30)
    k = kernels.RBF(variance=1.0, lengthscale=1.0)
    codes, params = k._spec(1)
    runs = [ivm.binary_select(codes, params, X, y, active_size=5, n_random=0, seed=s, likelihood="gaussian")
            for s in range(4)]
    assert len({tuple(r["active"]) for r in runs}) > 1
    again = ivm.binary_select(codes, params, X, y, active_size=5, n_random=0, seed=2, likelihood="gaussian")
    np.testing.assert_array_equal(again["active"], runs[2]["active"])


def test_selection_does_not_depend_on_the_thread_count(restore_threads):
    X, y = make_problem(2500, seed=6)
    _, codes, params = make_kernel()
    out = []
    for t in (1, 2):
        _core.threads.set_num_threads(t)
        out.append(select(codes, params, X, y, 50))
    for key in ("active", "h", "a", "M"):
        np.testing.assert_array_equal(out[0][key], out[1][key])


# ---------------------------------------------------------------------------------------------
# prediction


def test_probit_prediction_matches_dense():
    X, y = make_problem(80, seed=7)
    _, codes, params = make_kernel(white=0.05)
    r = select(codes, params, X, y, 25, bias=0.2)
    act = r["active"]
    Xs = np.random.default_rng(1).standard_normal((30, 2))
    p = ivm.binary_predict(codes, params, X[act], site_pi=r["site_pi"], L=r["L"], beta=r["beta"], Xnew=Xs, bias=0.2)
    K = dense_K(codes, params, X)
    KsI = dense_K(codes, params, Xs, X[act])
    C = K[np.ix_(act, act)] + np.diag(1 / r["site_pi"])
    mean = KsI @ np.linalg.solve(C, r["site_b"] / r["site_pi"])
    var = 1.4 + 0.05 - np.einsum("ij,ji->i", KsI, np.linalg.solve(C, KsI.T))
    np.testing.assert_allclose(p["mean"], mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p["var"], var, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p["proba"], ndtr((mean + 0.2) / np.sqrt(1 + var)), rtol=1e-13)
    # at inactive training points the prediction equals the stub marginals (at active ones the
    # training matrix holds White's variance, which new inputs do not)
    q = ivm.binary_predict(codes, params, X[act], site_pi=r["site_pi"], L=r["L"], beta=r["beta"], Xnew=X)
    rest = np.setdiff1d(np.arange(len(y)), act)
    np.testing.assert_allclose(q["mean"][rest], r["h"][rest], rtol=0, atol=1e-12)
    np.testing.assert_allclose(q["var"][rest], r["a"][rest], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# bound and gradient


def dense_bound(codes, params, X, y, act, b, pi, bias, s2, n_gh, likelihood):
    K = dense_K(codes, params, X)
    h, A = dense_marginals(K, act, b, pi)
    a = np.diag(A)
    if likelihood == "gaussian":
        enll = 0.5 * np.log(2 * np.pi * s2) + ((y - bias - h) ** 2 + a) / (2 * s2)
    else:
        x, w = np.polynomial.hermite.hermgauss(n_gh)
        U = h[:, None] + np.sqrt(2 * a)[:, None] * x
        enll = -(log_ndtr(y[:, None] * (U + bias) / np.sqrt(s2)) @ w) / np.sqrt(np.pi)
    # KL[N(h_I, A_I) || N(0, K_I)]
    KI, AI, hI, d = K[np.ix_(act, act)], A[np.ix_(act, act)], h[act], len(act)
    kl = 0.5 * (np.trace(np.linalg.solve(KI, AI)) + hI @ np.linalg.solve(KI, hI) - d
                + np.linalg.slogdet(KI)[1] - np.linalg.slogdet(AI)[1])
    return enll.sum() + kl, kl


@pytest.mark.parametrize("likelihood", ["probit", "gaussian"])
def test_bound_equals_dense_bound(likelihood):
    X, y = make_problem(60, seed=8, gaussian=likelihood == "gaussian")
    _, codes, params = make_kernel(white=0.1)
    bias, s2 = 0.25, (1.0 if likelihood == "probit" else 0.2)
    r = select(codes, params, X, y, 15, bias=bias, likelihood=likelihood, noise_variance=s2)
    act, b, pi = r["active"], r["site_b"], r["site_pi"]
    bd = ivm.binary_bound(codes, params, X, y, active=act, site_b=b, site_pi=pi, likelihood=likelihood,
                          bias=bias, noise_variance=s2, n_gh=40)
    value, kl = dense_bound(codes, params, X, y, act, b, pi, bias, s2, 40, likelihood)
    np.testing.assert_allclose(bd["kl"], kl, rtol=1e-9)
    np.testing.assert_allclose(bd["value"], value, rtol=1e-11)
    np.testing.assert_allclose(bd["h"], r["h"], rtol=0, atol=1e-12)  # fixed-site rebuild = inclusions
    np.testing.assert_allclose(bd["a"], r["a"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["probit", "gaussian"])
@pytest.mark.parametrize("white", [0.0, 0.1])
def test_bound_gradient_matches_finite_differences(likelihood, white):
    X, y = make_problem(50, seed=9, gaussian=likelihood == "gaussian")
    _, codes, params = make_kernel(white=white)
    bias, s2 = -0.15, (0.8 if likelihood == "probit" else 0.25)
    r = select(codes, params, X, y, 12, bias=bias, likelihood=likelihood, noise_variance=s2)
    fixed = dict(active=r["active"], site_b=r["site_b"], site_pi=r["site_pi"], likelihood=likelihood, n_gh=32)

    def F(p, bias_, s2_):
        return ivm.binary_bound(codes, p, X, y, bias=bias_, noise_variance=s2_, with_grad=False, **fixed)["value"]

    g = ivm.binary_bound(codes, params, X, y, bias=bias, noise_variance=s2, **fixed)
    num = []
    for i in range(len(params)):
        e = np.zeros_like(params)
        e[i] = 1e-5 * params[i]
        num.append((F(params + e, bias, s2) - F(params - e, bias, s2)) / (2 * e[i]))
    np.testing.assert_allclose(g["grad_params"], num, rtol=1e-6, atol=1e-8)
    eb = 1e-5
    np.testing.assert_allclose(g["grad_bias"], (F(params, bias + eb, s2) - F(params, bias - eb, s2)) / (2 * eb),
                               rtol=1e-6, atol=1e-8)
    es = 1e-5 * s2
    np.testing.assert_allclose(g["grad_noise_variance"],
                               (F(params, bias, s2 + es) - F(params, bias, s2 - es)) / (2 * es), rtol=1e-6, atol=1e-8)


def test_bound_with_given_distances_equals_the_bound_computing_them():
    # An isotropic leaf reads the squared distances of X_I and X (K(X_I, X) and its vjp): given
    # once per selection (kernels.squared_distances, as the search does) or computed by the call,
    # the same value and gradient bit for bit; the gradient through them against central
    # differences.
    X, y = make_problem(60, seed=10)
    codes, params = (kernels.RBF(variance=1.4, lengthscale=0.9) + kernels.White(variance=0.05))._spec(2)
    r = select(codes, params, X, y, 15)
    fixed = dict(active=r["active"], site_b=r["site_b"], site_pi=r["site_pi"])
    dist = _core.kernels.squared_distances(np.ascontiguousarray(X[r["active"]]), X)
    plain = ivm.binary_bound(codes, params, X, y, **fixed)
    given = ivm.binary_bound(codes, params, X, y, distances=dist, **fixed)
    assert given["value"] == plain["value"] and np.array_equal(given["grad_params"], plain["grad_params"])
    num = []
    for i in range(len(params)):
        e = np.zeros_like(params)
        e[i] = 1e-5 * params[i]
        num.append((ivm.binary_bound(codes, params + e, X, y, with_grad=False, distances=dist, **fixed)["value"]
                    - ivm.binary_bound(codes, params - e, X, y, with_grad=False, distances=dist, **fixed)["value"])
                   / (2 * e[i]))
    np.testing.assert_allclose(given["grad_params"], num, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match=r"\[d, n\]"):
        ivm.binary_bound(codes, params, X, y, distances=(np.ascontiguousarray(dist[0][:, 1:]), dist[1]), **fixed)


def test_bound_is_an_upper_bound_on_the_negative_log_likelihood_gaussian():
    # fewer active points than n: F >= -log N(y | bias, K + s2 I) (strictly)
    n, s2, bias = 50, 0.2, 0.1
    X, y = make_problem(n, seed=10, gaussian=True)
    _, codes, params = make_kernel()
    K = dense_K(codes, params, X)
    nll = -multivariate_normal(np.full(n, bias), K + s2 * np.eye(n)).logpdf(y)
    for d in (5, 20, 40):
        r = select(codes, params, X, y, d, likelihood="gaussian", bias=bias, noise_variance=s2)
        bd = ivm.binary_bound(codes, params, X, y, active=r["active"], site_b=r["site_b"], site_pi=r["site_pi"],
                              likelihood="gaussian", bias=bias, noise_variance=s2, with_grad=False)
        assert bd["value"] > nll
        assert "grad_params" not in bd


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_input_raises_value_error():
    X, y = make_problem(20, seed=11)
    _, codes, params = make_kernel()
    with pytest.raises(ValueError, match="labels"):
        select(codes, params, X, (y > 0).astype(float), 5)  # 0/1 labels for the probit
    with pytest.raises(ValueError, match="active_size"):
        select(codes, params, X, y, 0)
    with pytest.raises(ValueError, match="active_size"):
        select(codes, params, X, y, 21)
    with pytest.raises(ValueError, match="length"):
        select(codes, params, X, y[:-1], 5)
    with pytest.raises(ValueError, match="float64"):
        select(codes, params, X.astype(np.float32), y, 5)
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        select(codes, params, Xn, y, 5)
    with pytest.raises(ValueError, match="likelihood"):
        select(codes, params, X, y, 5, likelihood="logit")
    with pytest.raises(ValueError, match="criterion"):
        select(codes, params, X, y, 5, criterion="variance")
    with pytest.raises(ValueError, match="noise_variance"):
        select(codes, params, X, y, 5, noise_variance=-1.0)
    with pytest.raises(ValueError, match="n_random"):
        select(codes, params, X, y, 5, n_random=-1)
    r = select(codes, params, X, y, 5)
    fixed = dict(site_b=r["site_b"], site_pi=r["site_pi"])
    with pytest.raises(ValueError, match="twice"):
        ivm.binary_bound(codes, params, X, y, active=np.array([1, 2, 2, 3, 4]), **fixed)
    with pytest.raises(ValueError, match="out of range"):
        ivm.binary_bound(codes, params, X, y, active=np.array([1, 2, 3, 4, 20]), **fixed)
    with pytest.raises(ValueError, match="integer"):
        ivm.binary_bound(codes, params, X, y, active=r["active"].astype(float), **fixed)
    with pytest.raises(ValueError, match="site_pi"):
        ivm.binary_bound(codes, params, X, y, active=r["active"], site_b=r["site_b"], site_pi=-r["site_pi"])
    with pytest.raises(ValueError, match="length"):
        ivm.binary_bound(codes, params, X, y, active=r["active"], site_b=r["site_b"][:-1], site_pi=r["site_pi"])
    with pytest.raises(ValueError, match="n_gh"):
        ivm.binary_bound(codes, params, X, y, active=r["active"], n_gh=0, **fixed)
    with pytest.raises(ValueError, match="L"):
        ivm.binary_predict(codes, params, X[r["active"]], site_pi=r["site_pi"], L=r["L"][:4, :4], beta=r["beta"],
                           Xnew=X)
    with pytest.raises(ValueError, match="columns"):
        ivm.binary_predict(codes, params, X[r["active"]], site_pi=r["site_pi"], L=r["L"], beta=r["beta"],
                           Xnew=np.ascontiguousarray(X[:, :1]))
    with pytest.raises(ValueError):
        ivm.binary_adf(np.array([0.5]), np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError):
        ivm.binary_adf(np.array([1.0]), np.array([0.0]), np.array([-1.0]))


def test_keyword_only_arguments():
    X, y = make_problem(20, seed=12)
    _, codes, params = make_kernel()
    with pytest.raises(TypeError):
        ivm.binary_select(codes, params, X, y, 5)  # active_size is keyword-only


# ---------------------------------------------------------------------------------------------
# label noise: P(y | u) = eps + (1 - 2 eps) Phi(y (u + bias) / sqrt(s2))


def noisy_adf(y, h, a, eps, bias=0.0, s2=1.0):
    """log Z, alpha, nu of the noisy probit in numpy (nu < 0 kept: the reference, unclipped)."""
    z = y * (h + bias) / np.sqrt(s2 + a)
    log_clean = np.log1p(-2 * eps) + log_ndtr(z)
    log_z = np.logaddexp(np.log(eps), log_clean)
    wr = np.exp(log_clean - log_z + norm.logpdf(z) - log_ndtr(z))
    return log_z, y * wr / np.sqrt(s2 + a), wr * (z + wr) / (s2 + a)


@pytest.mark.parametrize(
    "y,h,a,bias,s2,eps",
    [
        (1.0, 0.3, 1.2, 0.0, 1.0, 0.05),
        (-1.0, 0.8, 2.5, 0.2, 0.7, 0.01),
        (1.0, -1.0, 0.6, 0.0, 1.0, 0.1),  # on the wrong side, still a site (nu > 0)
        (1.0, 4.0, 3.0, -0.5, 2.0, 1e-3),  # upper tail
    ],
)
def test_label_noise_adf_matches_numerical_integration(y, h, a, bias, s2, eps):
    """log Z and the tilted moments of eps + (1 - 2 eps) Phi against quadrature; the site
    reproduces them where nu >= 0."""
    u = ivm.binary_adf(np.array([y]), np.array([h]), np.array([a]), bias=bias, noise_variance=s2,
                       label_noise=eps)
    sd = np.sqrt(a)

    def moment(p):
        f = lambda t: (h + sd * t) ** p * (eps + (1 - 2 * eps) * ndtr(y * (h + sd * t + bias) / np.sqrt(s2))) * norm.pdf(t)
        return scipy.integrate.quad(f, -14, 14, epsabs=0, epsrel=1e-13, limit=400)[0]

    Z, m1, m2 = moment(0), moment(1), moment(2)
    mean, var = m1 / Z, m2 / Z - (m1 / Z) ** 2
    np.testing.assert_allclose(u["log_z"], np.log(Z), rtol=1e-10)
    ref = noisy_adf(y, h, a, eps, bias, s2)
    np.testing.assert_allclose(u["log_z"], ref[0], rtol=1e-13)
    assert u["nu"][0] >= 0.0 and ref[2] > 0.0
    np.testing.assert_allclose(h + a * u["alpha"], mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a * (1 - a * u["nu"]), var, rtol=1e-7, atol=1e-10)
    pi, b = u["site_pi"][0], u["site_b"][0]
    np.testing.assert_allclose(1 / (1 / a + pi), var, rtol=1e-7)
    np.testing.assert_allclose((h / a + b) / (1 / a + pi), mean, rtol=1e-8, atol=1e-10)


def test_label_noise_adf_gives_no_site_where_the_tilted_variance_grows():
    """A point well on the wrong side with a wide cavity: the mixture's tilted variance
    exceeds the cavity's (nu < 0 in the reference); the update is the constrained one, no site
    and no step (its selection score, 0, is checked in the greedy test below)."""
    for h, a in ((-3.0, 4.0), (-2.5, 0.6), (-40.0, 1.0)):  # (the last: log Z at the floor eps)
        y, eps = np.array([1.0]), 0.05
        ref = noisy_adf(y[0], h, a, eps)
        assert ref[2] < 0.0
        u = ivm.binary_adf(y, np.array([h]), np.array([a]), label_noise=eps)
        np.testing.assert_allclose(u["log_z"], ref[0], rtol=1e-13)
        assert u["alpha"][0] == 0.0 and u["nu"][0] == 0.0 and u["site_pi"][0] == 0.0 and u["site_b"][0] == 0.0



def test_tiny_label_noise_is_the_plain_probit_bitwise():
    """eps = 1e-300 runs the label-noise path (ADF and blocked scores) and must give the plain
    probit's selection bit for bit: log(1 - 2 eps) = 0, eps's term is e^-690 below log Phi, w = 1."""
    X, y = make_problem(80, seed=13)
    _, codes, params = make_kernel()
    plain = select(codes, params, X, y, 20, bias=0.1)
    tiny = select(codes, params, X, y, 20, bias=0.1, label_noise=1e-300)
    for key in ("active", "site_b", "site_pi", "score", "h", "a"):
        np.testing.assert_array_equal(plain[key], tiny[key])
    u0 = ivm.binary_adf(y, np.linspace(-3, 3, 80), np.full(80, 0.7))
    u1 = ivm.binary_adf(y, np.linspace(-3, 3, 80), np.full(80, 0.7), label_noise=1e-300)
    for key in ("log_z", "alpha", "nu", "site_b", "site_pi"):
        np.testing.assert_array_equal(u0[key], u1[key])


@pytest.mark.parametrize("criterion", ["entropy", "kl"])
def test_label_noise_greedy_choice_is_the_brute_force_argmax(criterion):
    """With label noise the selection's (blocked, vectorised) scores are the ADF's: the greedy
    choice against the dense marginals and the numpy scores (nu < 0 scored 0)."""
    X, y = make_problem(60, seed=4)
    y = y.copy()
    y[::7] *= -1  # mislabelled points
    _, codes, params = make_kernel()
    K = dense_K(codes, params, X)
    eps, d, bias = 0.05, 14, 0.1
    full = select(codes, params, X, y, d, n_random=2, criterion=criterion, bias=bias, label_noise=eps)
    for k in range(2, d):
        act = full["active"][:k]
        h, A = dense_marginals(K, act, full["site_b"][:k], full["site_pi"][:k])
        a = np.diag(A)
        _, alpha, nu = noisy_adf(y, h, a, eps, bias)
        alpha, nu = np.where(nu < 0, 0.0, alpha), np.maximum(nu, 0.0)
        g = -0.5 * np.log1p(-a * nu)
        if criterion == "kl":
            g = np.maximum(0.0, g + 0.5 * (a * alpha**2 - a * nu))
        g[act] = -np.inf
        assert full["active"][k] == np.argmax(g), k
        np.testing.assert_allclose(full["score"][k], g.max(), rtol=1e-9)


def test_label_noise_bound_and_gradient():
    """The bound's expected negative log-likelihood with label noise (the core's noisy
    Bernoulli by Gauss-Hermite) against the dense reference, and its gradient by central
    differences."""
    X, y = make_problem(50, seed=9)
    _, codes, params = make_kernel(white=0.1)
    bias, s2, eps = -0.15, 0.8, 0.03
    r = select(codes, params, X, y, 12, bias=bias, noise_variance=s2, label_noise=eps)
    fixed = dict(active=r["active"], site_b=r["site_b"], site_pi=r["site_pi"], n_gh=32, label_noise=eps)
    g = ivm.binary_bound(codes, params, X, y, bias=bias, noise_variance=s2, **fixed)
    K = dense_K(codes, params, X)
    h, A = dense_marginals(K, r["active"], r["site_b"], r["site_pi"])
    x, w = np.polynomial.hermite.hermgauss(32)
    U = h[:, None] + np.sqrt(2 * np.diag(A))[:, None] * x
    log_p = np.logaddexp(np.log(eps), np.log1p(-2 * eps) + log_ndtr(y[:, None] * (U + bias) / np.sqrt(s2)))
    np.testing.assert_allclose(g["expected_neg_log_lik"], -(log_p @ w).sum() / np.sqrt(np.pi), rtol=1e-11)

    def F(p, bias_, s2_):
        return ivm.binary_bound(codes, p, X, y, bias=bias_, noise_variance=s2_, with_grad=False, **fixed)["value"]

    for i in range(len(params)):
        e = np.zeros_like(params)
        e[i] = 1e-5 * params[i]
        assert g["grad_params"][i] == pytest.approx((F(params + e, bias, s2) - F(params - e, bias, s2)) / (2 * e[i]),
                                                   rel=1e-6, abs=1e-8)
    eb, es = 1e-5, 1e-5 * s2
    assert g["grad_bias"] == pytest.approx((F(params, bias + eb, s2) - F(params, bias - eb, s2)) / (2 * eb),
                                           rel=1e-6, abs=1e-8)
    assert g["grad_noise_variance"] == pytest.approx(
        (F(params, bias, s2 + es) - F(params, bias, s2 - es)) / (2 * es), rel=1e-6, abs=1e-8)


def test_label_noise_prediction_and_refusals():
    X, y = make_problem(60, seed=10)
    _, codes, params = make_kernel()
    r = select(codes, params, X, y, 15, label_noise=0.1)
    q = ivm.binary_predict(codes, params, X[r["active"]], site_pi=r["site_pi"], L=r["L"], beta=r["beta"],
                           Xnew=50 * X, label_noise=0.1)
    np.testing.assert_allclose(q["proba"], 0.1 + 0.8 * ndtr(q["mean"] / np.sqrt(1 + q["var"])), rtol=1e-14)
    assert q["proba"].min() >= 0.1 and q["proba"].max() <= 0.9
    for bad in (-0.1, 0.5, np.nan):
        with pytest.raises(ValueError, match="label_noise must be in"):
            ivm.binary_adf(y, np.zeros(60), np.ones(60), label_noise=bad)
    with pytest.raises(ValueError, match="label_noise needs the probit"):
        ivm.binary_adf(y, np.zeros(60), np.ones(60), likelihood="gaussian", label_noise=0.1)
