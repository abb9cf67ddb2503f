"""_core.ivm multi-class IVM bindings against dense numpy/scipy references (seed 002)."""
import itertools

import numpy as np
import pytest
from scipy.linalg import block_diag
from scipy.optimize import minimize

from pygpfast import _core

ivm = _core.ivm

RBF_WHITE = np.array([7, 2, 0, 3, 6, 1], dtype=np.int32)  # Sum(RBF(var, ls_1, ls_2), White(var))
RBF = np.array([0, 3], dtype=np.int32)


def rbf_white(A, B, p, same):
    d2 = ((A[:, None, :] / p[1:3] - B[None, :, :] / p[1:3]) ** 2).sum(-1)
    K = p[0] * np.exp(-0.5 * d2)
    if same and len(p) > 3:
        K = K + p[3] * np.eye(len(A))
    return K


def problem(n=40, C=3, D=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = (np.argmax(X @ rng.normal(size=(D, C)) + 0.5 * rng.normal(size=(n, C)), axis=1)).astype(float)
    beta = rng.normal(scale=0.3, size=C)
    return X, y, beta


def dense_marginals(K_list, active, pi, b):
    """Dense (K^-1 + Pi)^-1 of the class-major nC x nC system: h [n, C], A [n, C, C]."""
    C, n, m = len(K_list), K_list[0].shape[0], len(active)
    Kf = block_diag(*K_list)
    idx = np.concatenate([c * n + np.asarray(active) for c in range(C)])
    Pi = np.zeros((C * m, C * m))
    bI = np.zeros(C * m)
    for k in range(m):
        ii = [c * m + k for c in range(C)]
        Pi[np.ix_(ii, ii)] = np.diag(pi[k]) - np.outer(pi[k], pi[k]) / pi[k].sum()
        bI[ii] = b[k]
    KI, KnI = Kf[np.ix_(idx, idx)], Kf[:, idx]
    W = Pi @ np.linalg.inv(np.eye(C * m) + KI @ Pi)
    A = Kf - KnI @ W @ KnI.T
    h = KnI @ np.linalg.solve(np.eye(C * m) + Pi @ KI, bI)
    pts = [[c * n + j for c in range(C)] for j in range(n)]
    return np.ascontiguousarray(h.reshape(C, n).T), np.stack([A[np.ix_(p, p)] for p in pts]), (KI, Pi, bI)


def hermgauss_product(points, C):
    x, w = np.polynomial.hermite.hermgauss(points)
    x, w = x * np.sqrt(2.0), w / np.sqrt(np.pi)
    nodes = np.array(list(itertools.product(x, repeat=C)))
    weights = np.prod(np.array(list(itertools.product(w, repeat=C))), axis=1)
    return nodes, weights


def reference_tilted(h, A, y, beta, points=20):
    z, w = hermgauss_product(points, len(h))
    u = h + z @ np.linalg.cholesky(A).T
    v = u + beta
    logP = v[:, y] - np.log(np.exp(v - v.max(1, keepdims=True)).sum(1)) - v.max(1)
    P = w * np.exp(logP)
    Z = P.sum()
    mean = (P[:, None] * u).sum(0) / Z
    cov = ((P[:, None, None] * np.einsum("ki,kj->kij", u - mean, u - mean)).sum(0)) / Z
    return np.log(Z), mean, cov


def random_cavity(rng, C, scale=1.0):
    G = rng.normal(size=(C, C))
    return rng.normal(size=C) * scale, scale * (G @ G.T / C + 0.3 * np.eye(C))


# ---------------------------------------------------------------- cubature


@pytest.mark.parametrize("C", [1, 2, 3, 4, 5, 6])
def test_cubature_exact_degrees_standard_normal(C):
    """GH3: every monomial with all exponents <= 5; Stroud5: total degree <= 5; both under N(0, I)."""
    def exact(alpha):
        return np.prod([0.0 if a % 2 else float(np.prod(np.arange(a - 1, 0, -2))) if a else 1.0 for a in alpha])

    z3, w3 = ivm.cubature(0, C)
    zs, ws = ivm.cubature(1, C)
    assert z3.shape == (3**C, C) and zs.shape == (2 * C * C + 1, C)
    assert abs(w3.sum() - 1) < 1e-14 and abs(ws.sum() - 1) < 1e-14
    worst3 = worsts = 0.0
    for alpha in itertools.product(range(6), repeat=C):
        ref = exact(alpha)
        worst3 = max(worst3, abs((w3 * np.prod(z3**np.array(alpha), 1)).sum() - ref))
        if sum(alpha) <= 5:
            worsts = max(worsts, abs((ws * np.prod(zs**np.array(alpha), 1)).sum() - ref))
    assert worst3 < 1e-11 and worsts < 1e-12
    if C >= 2:  # degree 6 is not exact (the stated degrees are sharp)
        a6 = (6,) + (0,) * (C - 1)
        assert abs((w3 * z3[:, 0] ** 6).sum() - 15) > 1
        assert abs((ws * zs[:, 0] ** 6).sum() - 15) > 1
    assert (ws.min() < 0) == (C >= 5)


@pytest.mark.parametrize("rule", [0, 1])
def test_cubature_exact_under_general_gaussian(rule):
    """Polynomials of degree <= 5 in u ~ N(mu, Sigma) (mapped by the Cholesky factor) are exact."""
    rng = np.random.default_rng(3)
    C = 3
    mu, Sigma = random_cavity(rng, C)
    L = np.linalg.cholesky(Sigma)
    z, w = ivm.cubature(rule, C)
    u = mu + z @ L.T
    # Reference by a 12-point product rule (exact to degree 23 per coordinate).
    zr, wr = hermgauss_product(12, C)
    ur = mu + zr @ L.T
    for f in [lambda u: u[:, 0] ** 2 * u[:, 1] * u[:, 2] ** 2,
              lambda u: u[:, 0] ** 5 - 3 * u[:, 1] ** 3 * u[:, 2],
              lambda u: (u[:, 0] * u[:, 1] - u[:, 2]) ** 2 + u[:, 1] ** 4]:
        assert abs((w * f(u)).sum() - (wr * f(ur)).sum()) < 1e-10 * (1 + abs((wr * f(ur)).sum()))


def test_tilted_moments_accuracy_of_both_rules():
    """Tilted moments of the softmax vs a 20-point product Gauss-Hermite rule on realistic cavities."""
    rng = np.random.default_rng(5)
    C = 3
    errs = {0: [], 1: []}
    for _ in range(40):
        h, A = random_cavity(rng, C, scale=rng.uniform(0.3, 2.0))
        y = int(rng.integers(C))
        beta = rng.normal(scale=0.3, size=C)
        logZ, mean, cov = reference_tilted(h, A, y, beta)
        for rule in (0, 1):
            r = ivm.multiclass_tilted(h[None], A[None], np.array([float(y)]), beta=beta, rule=rule)
            assert r["valid"][0]
            e = max(np.abs(r["mean"][0] - mean).max(), np.abs(r["cov"][0] - cov).max()) / np.abs(cov).max()
            errs[rule].append(e)
            assert abs(r["log_Z"][0] - logZ) < 0.15
    med3, meds = np.median(errs[0]), np.median(errs[1])
    print(f"tilted moments relative error: GH3 median {med3:.3g} max {max(errs[0]):.3g}; "
          f"Stroud5 median {meds:.3g} max {max(errs[1]):.3g}")
    assert med3 < 0.05 and meds < 0.08
    assert max(errs[0]) < 0.3 and max(errs[1]) < 0.4


def far_out_cavities(rng, C, count):
    """Cavities whose variances and means reach 10^2.5 times the unit scale: where the product of
    the softmax with the Gaussian concentrates on few of Stroud's nodes."""
    out = []
    for _ in range(count):
        scale = 10 ** rng.uniform(0, 2.5)
        h, A = random_cavity(rng, C, scale)
        out.append((h * rng.uniform(0, 3) / np.sqrt(scale), A, int(rng.integers(C))))
    return out


@pytest.mark.parametrize("C", [5, 6, 7, 8, 9, 10])
def test_stroud_moments_at_far_out_cavities_are_flagged_where_no_measure_has_them(C):
    """Stroud's negative axis weights (C >= 5) give, at far-out cavities, a non-positive Z, an
    indefinite covariance or cavity probabilities outside (0, 1) (a start pi0 <= 0 for the
    projection): all flagged invalid. The moments it reports valid are close to the product rule's."""
    rng = np.random.default_rng(40 + C)
    cav = far_out_cavities(rng, C, 150)
    h = np.stack([c[0] for c in cav])
    A = np.stack([c[1] for c in cav])
    y = np.array([float(c[2]) for c in cav])
    s = ivm.multiclass_tilted(h, A, y, rule=1)
    g = ivm.multiclass_tilted(h, A, y, rule=0)
    assert 0.1 < np.mean(~s["valid"]) < 0.9  # (the failure is provoked, and not everywhere)
    v = s["valid"]
    assert np.all((s["p_cavity"][v] > 0) & (s["p_cavity"][v] < 1))
    assert np.all(np.linalg.eigvalsh(s["cov"][v]).min(axis=1) > 0)
    assert np.all(np.isfinite(s["log_Z"][v])) and np.all(np.isfinite(s["mean"][v]))
    # The product rule's weights are positive: its probabilities always lie in [0, 1] (its
    # covariance can still be singular where the tilted mass sits on one layer of its nodes).
    assert np.all((g["p_cavity"] >= 0) & (g["p_cavity"] <= 1 + 1e-12))
    assert g["valid"].mean() > 0.9
    both = v & g["valid"]
    # cavity probabilities where both are valid: two degree-5 rules agree to a few percent
    assert np.median(np.abs(s["p_cavity"][both] - g["p_cavity"][both]).max(axis=1)) < 0.05


def test_projection_starts_from_underflowed_probabilities():
    """A far-out cavity makes some entries of E[softmax] underflow to 0, so pi0 = (e_y + p) / 2
    has zeros: the projection starts there (clipped to 1e-10) and reaches the optimum it reaches
    from the clipped start."""
    C = 4
    h = np.array([0.0, -1500.0, 3.0, -2000.0])
    A = np.diag([1.0, 2.0, 1.5, 1.0])
    t = ivm.multiclass_tilted(h[None], A[None], np.array([2.0]), rule=0)
    assert t["valid"][0] and t["p_cavity"][0][1] == 0.0
    pi0 = 0.5 * (np.eye(C)[2] + t["p_cavity"][0])
    r = ivm.multiclass_project(h, A, t["mean"][0], t["cov"][0], pi0)
    r2 = ivm.multiclass_project(h, A, t["mean"][0], t["cov"][0], np.maximum(pi0, 1e-10))
    assert np.array_equal(r["pi"], r2["pi"]) and np.all(r["pi"] > 0) and np.all(np.isfinite(r["b"]))
    with pytest.raises(ValueError, match="non-negative"):
        ivm.multiclass_project(h, A, t["mean"][0], t["cov"][0], pi0 - 0.1)


def test_expected_nll_derivatives_are_exact_for_the_rule():
    rng = np.random.default_rng(7)
    C = 4
    h, A = random_cavity(rng, C)
    beta = rng.normal(size=C)
    for rule in (0, 1):
        f = lambda hh, AA: ivm.multiclass_expected_nll(hh[None], AA[None], np.array([2.0]), beta=beta, rule=rule)
        r = f(h, A)
        eps = 1e-6
        for c in range(C):
            e = np.zeros(C)
            e[c] = eps
            fd = (f(h + e, A)["value"][0] - f(h - e, A)["value"][0]) / (2 * eps)
            assert abs(fd - r["g_h"][0, c]) < 1e-8
            for k in range(c + 1):
                E = np.zeros((C, C))
                E[c, k] = E[k, c] = eps
                fd = (f(h, A + E)["value"][0] - f(h, A - E)["value"][0]) / (2 * eps)
                an = r["G_A"][0, c, k] * (2 if c != k else 1)
                assert abs(fd - an) < 1e-7


# ---------------------------------------------------------------- projection


def brute_force_projection(A, A_hat):
    f = lambda lp: ivm.multiclass_projection_objective(A, A_hat, np.exp(lp))[0]
    best = None
    rng = np.random.default_rng(0)
    for _ in range(6):
        r = minimize(f, rng.normal(size=len(A)), method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12})
        if best is None or r.fun < best.fun:
            best = r
    return best.fun


@pytest.mark.parametrize("C", [3, 5])
def test_projection_matches_brute_force_and_moments(C):
    rng = np.random.default_rng(11 + C)
    iters = []
    for _ in range(12):
        h, A = random_cavity(rng, C)
        y = float(rng.integers(C))
        t = ivm.multiclass_tilted(h[None], A[None], np.array([y]), rule=0)
        h_hat, A_hat = t["mean"][0], t["cov"][0]
        pi0 = 0.5 * (np.eye(C)[int(y)] + t["p_cavity"][0])
        r = ivm.multiclass_project(h, A, h_hat, A_hat, pi0)
        iters.append(r["iterations"])
        # objective: a dense re-evaluation and the best of 6 L-BFGS-B restarts
        pi = r["pi"]
        Pi = np.diag(pi) - np.outer(pi, pi) / pi.sum()
        f_dense = 0.5 * (-np.linalg.slogdet(np.linalg.inv(A) + Pi)[1] + np.trace(Pi @ A_hat))
        assert abs(f_dense - r["objective"]) < 1e-12
        assert r["objective"] <= brute_force_projection(A, A_hat) + 1e-9
        # the new marginal's mean is the tilted mean. (1^T b = 0 holds for exact tilted moments only:
        # a rule's h_hat - h is not A grad log Z, so b's sum is small but not zero.)
        S = np.linalg.inv(np.linalg.inv(A) + Pi)
        assert np.abs(S @ (np.linalg.solve(A, h) + r["b"]) - h_hat).max() < 1e-10
        assert np.abs(Pi @ np.ones(C)).max() < 1e-12
        # gradient formula vs finite differences; at the optimum the covariance matches along e_k - rho
        f0, g, H = ivm.multiclass_projection_objective(A, A_hat, pi)
        eps = 1e-6 * pi
        for k in range(C):
            e = np.zeros(C)
            e[k] = eps[k]
            fd = (ivm.multiclass_projection_objective(A, A_hat, pi + e)[0]
                  - ivm.multiclass_projection_objective(A, A_hat, pi - e)[0]) / (2 * eps[k])
            assert abs(fd - g[k]) < 1e-6 * (1 + abs(g[k]))
        if r["converged"] and pi.max() < 1e3:
            rho = pi / pi.sum()
            for k in range(C):
                wk = np.eye(C)[k] - rho
                assert abs(wk @ (A_hat - S) @ wk) < 1e-6
    print(f"C={C}: Newton iterations median {np.median(iters)}, max {max(iters)}")
    assert np.median(iters) <= 10


# ---------------------------------------------------------------- selection


# (n, C): the stub pass takes 3 to 8 classes eight columns at a time in registers and other
# counts, or a last column block that is not whole lanes (77 = 64 + 13), by its general loops.
# (Stroud's rule alone at C = 9, where the Gauss-Hermite product has 3^9 nodes.)
@pytest.mark.parametrize("per_class", [False, True])
@pytest.mark.parametrize("rule, n, C", [(0, 40, 3), (1, 40, 3), (0, 77, 5), (1, 77, 5), (1, 70, 9)])
def test_stub_marginals_equal_dense_after_every_inclusion(rule, per_class, n, C):
    X, y, beta = problem(n=n, C=C)
    d = 12
    params = np.array([1.5, 1.0, 0.8, 0.05])
    if per_class:
        params = np.array([[1.5, 1.0, 0.8, 0.05], [0.7, 0.6, 1.2, 0.05], [2.0, 1.5, 1.5, 0.05]] * 3)[:C]
    r = ivm.multiclass_select(RBF_WHITE, params, X, y, num_classes=C, active_size=d, seed=3, rule=rule,
                              beta=beta, record_marginals=True)
    P = params if per_class else np.tile(params, (C, 1))
    K_list = [rbf_white(X, X, P[c], True) for c in range(C)]
    assert len(set(r["active"].tolist())) == d
    assert np.all(r["pi"] > 0)
    worst = 0.0
    for t in range(d):
        h, A, _ = dense_marginals(K_list, r["active"][: t + 1], r["pi"][: t + 1], r["b"][: t + 1])
        worst = max(worst, np.abs(r["history_h"][t] - h).max(), np.abs(r["history_A"][t] - A).max())
    assert worst < 1e-12
    assert np.abs(r["h"] - r["history_h"][-1]).max() < 1e-14
    assert np.all(r["newton_converged"][np.asarray(r["newton_iterations"]) < 50] == 1)


def test_inclusion_matches_tilted_mean_and_scores_are_information_gains():
    X, y, beta = problem(n=50, C=3, seed=2)
    params = np.array([1.0, 1.0, 1.0, 0.05])
    r = ivm.multiclass_select(RBF_WHITE, params, X, y, num_classes=3, active_size=8, seed=1, beta=beta,
                              record_marginals=True, keep_fraction=0.5)
    assert np.all(np.isnan(r["scores"][:2])) and np.all(r["scores"][2:] > 0)
    for t in range(1, 8):
        i = r["active"][t]
        h0, A0 = r["history_h"][t - 1][i], r["history_A"][t - 1][i]
        tm = ivm.multiclass_tilted(h0[None], A0[None], np.array([y[i]]), beta=beta, rule=0)
        # after including i its marginal mean is the tilted mean
        assert np.abs(r["history_h"][t][i] - tm["mean"][0]).max() < 1e-10
        if t >= 2:  # the greedy pick scores KL(N(h_hat, A_hat) || N(h, A))
            Ah, mh = tm["cov"][0], tm["mean"][0]
            kl = 0.5 * (np.trace(np.linalg.solve(A0, Ah)) - 3 + (mh - h0) @ np.linalg.solve(A0, mh - h0)
                        + np.linalg.slogdet(A0)[1] - np.linalg.slogdet(Ah)[1])
            assert abs(kl - r["scores"][t]) < 1e-10


@pytest.mark.parametrize("C", [5, 6, 7, 8, 9, 10])
def test_stroud_selection_at_far_out_marginals(C):
    """Stroud's rule with a kernel variance of 100 (far-out marginals): the candidates and random
    picks whose Stroud moments are invalid take the product rule's (counted), and the selection
    is the stub-buffer algorithm as ever: marginals equal the dense posterior, every site positive,
    the included point's new mean its tilted mean by the rule that gave its moments."""
    X, y, beta = problem(n=50, C=C, seed=C)
    d = 20  # (before the guard, the projection's start pi0 <= 0 failed this selection at every C)
    params = np.array([100.0, 1.0, 1.0, 0.05])
    r = ivm.multiclass_select(RBF_WHITE, params, X, y, num_classes=C, active_size=d, seed=1, rule=1,
                              beta=beta, record_marginals=True)
    assert r["quadrature_fallbacks"] > 0 and r["invalid_moments"] == 0
    assert np.all(r["pi"] > 0) and np.all(np.isfinite(r["b"])) and np.all(np.isfinite(r["scores"][2:]))
    K = rbf_white(X, X, params, True)
    h, A, _ = dense_marginals([K] * C, r["active"], r["pi"], r["b"])
    assert np.abs(r["h"] - h).max() < 1e-8 * max(1.0, np.abs(h).max())
    assert np.abs(r["A"] - A).max() < 1e-8 * np.abs(A).max()
    for t in range(1, d):
        i = r["active"][t]
        h0, A0 = r["history_h"][t - 1][i], r["history_A"][t - 1][i]
        s = ivm.multiclass_tilted(h0[None], A0[None], np.array([y[i]]), beta=beta, rule=1)
        tm = s if s["valid"][0] else ivm.multiclass_tilted(h0[None], A0[None], np.array([y[i]]), beta=beta,
                                                           rule=0)
        assert np.abs(r["history_h"][t][i] - tm["mean"][0]).max() < 1e-8 * max(1.0, np.abs(h0).max())
    # the prediction's probabilities at far-out points stay in (0, 1) (the product rule where
    # Stroud's leave it)
    Xnew = np.random.default_rng(2).normal(size=(40, 2)) * 2
    p = ivm.multiclass_predict(RBF_WHITE, params, X[r["active"]], r["pi"], r["b"], Xnew, beta=beta, rule=1)
    assert np.all((p["prob"] > 0) & (p["prob"] < 1)) and np.abs(p["prob"].sum(1) - 1).max() < 1e-12


def test_selection_skips_points_no_rule_gives_moments_above_twelve_classes():
    """Above 12 classes only Stroud's rule is offered: random picks and candidates whose moments it
    cannot give are skipped (invalid_moments counts them) and the selection completes."""
    C = 13
    X, y, beta = problem(n=60, C=C, seed=C)
    r = ivm.multiclass_select(RBF_WHITE, np.array([10.0, 1.0, 1.0, 0.05]), X, y, num_classes=C, active_size=20,
                              seed=1, rule=1)
    assert r["invalid_moments"] > 0 and r["quadrature_fallbacks"] == 0
    assert len(set(r["active"].tolist())) == 20 and np.all(r["pi"] > 0)


def test_selection_is_reproducible_with_the_seed():
    X, y, beta = problem(n=60, C=4, seed=4)
    params = np.array([1.0, 1.0, 1.0, 0.05])
    kw = dict(num_classes=4, active_size=10, beta=beta, rule=1)
    a = ivm.multiclass_select(RBF_WHITE, params, X, y, seed=7, **kw)
    b = ivm.multiclass_select(RBF_WHITE, params, X, y, seed=7, **kw)
    c = ivm.multiclass_select(RBF_WHITE, params, X, y, seed=8, **kw)
    assert np.array_equal(a["active"], b["active"]) and np.array_equal(a["pi"], b["pi"])
    assert not np.array_equal(a["active"], c["active"])


def test_thread_count_invariance():
    X, y, beta = problem(n=1200, C=3, seed=6)
    params = np.array([1.0, 1.0, 1.0, 0.05])
    kw = dict(num_classes=3, active_size=15, beta=beta, seed=2)
    before = _core.threads.get_num_threads()
    try:
        _core.threads.set_num_threads(1)
        a = ivm.multiclass_select(RBF_WHITE, params, X, y, **kw)
        _core.threads.set_num_threads(2)
        b = ivm.multiclass_select(RBF_WHITE, params, X, y, **kw)
    finally:
        _core.threads.set_num_threads(before)
    assert np.array_equal(a["active"], b["active"])
    assert np.array_equal(a["A"], b["A"]) and np.array_equal(a["h"], b["h"])


# ---------------------------------------------------------------- prediction and bound


def test_prediction_equals_dense_posterior():
    X, y, beta = problem(n=40, C=3, seed=8)
    params = np.array([[1.5, 1.0, 0.8], [0.7, 0.6, 1.2], [2.0, 1.5, 1.5]])
    r = ivm.multiclass_select(RBF, params, X, y, num_classes=3, active_size=10, seed=0, beta=beta)
    Xnew = np.random.default_rng(1).normal(size=(7, 2))
    Xall = np.vstack([X, Xnew])
    K_list = [rbf_white(Xall, Xall, params[c], False) + 1e-12 * np.eye(len(Xall)) for c in range(3)]
    h, A, _ = dense_marginals(K_list, r["active"], r["pi"], r["b"])
    for rule in (0, 1):
        p = ivm.multiclass_predict(RBF, params, X[r["active"]], r["pi"], r["b"], Xnew, beta=beta, rule=rule)
        assert np.abs(p["mean"] - h[40:]).max() < 1e-10 and np.abs(p["cov"] - A[40:]).max() < 1e-10
        assert np.abs(p["prob"].sum(1) - 1).max() < 1e-12
        # the training points' marginals agree with the selection's
    p = ivm.multiclass_predict(RBF, params, X[r["active"]], r["pi"], r["b"], X, beta=beta)
    assert np.abs(p["mean"] - r["h"]).max() < 1e-10 and np.abs(p["cov"] - r["A"]).max() < 1e-10


@pytest.mark.parametrize("rule", [0, 1])
@pytest.mark.parametrize("per_class", [False, True])
def test_bound_value_and_gradient(rule, per_class):
    X, y, beta = problem(n=45, C=3, seed=9)
    C = 3
    params = np.array([1.3, 0.9, 1.1, 0.05])
    if per_class:
        params = np.array([[1.3, 0.9, 1.1, 0.05], [0.8, 1.4, 0.7, 0.03], [1.7, 1.0, 1.2, 0.08]])
    r = ivm.multiclass_select(RBF_WHITE, params, X, y, num_classes=C, active_size=12, seed=5, beta=beta, rule=rule)
    act = r["active"].astype(np.int64)
    f = lambda p, bb: ivm.multiclass_bound(RBF_WHITE, p, X, y, act, r["pi"], r["b"], beta=bb, rule=rule,
                                           with_grad=True)
    res = f(params, beta)
    # value: dense KL and the rule's expected nll of the dense marginals
    P = params if per_class else np.tile(params, (C, 1))
    K_list = [rbf_white(X, X, P[c], True) for c in range(C)]
    h, A, (KI, Pi, bI) = dense_marginals(K_list, act, r["pi"], r["b"])
    assert np.abs(h - r["h"]).max() < 1e-10
    m = len(bI)
    xi = np.linalg.solve(np.eye(m) + Pi @ KI, bI)
    kl = 0.5 * (np.trace(np.linalg.inv(np.eye(m) + Pi @ KI)) + xi @ KI @ xi - m
                + np.linalg.slogdet(np.eye(m) + KI @ Pi)[1])
    enll = ivm.multiclass_expected_nll(h, A, y, beta=beta, rule=rule)["value"].sum()
    assert abs(res["kl"] - kl) < 1e-9 and abs(res["expected_nll"] - enll) < 1e-9
    assert abs(res["value"] - kl - enll) < 1e-9
    # gradient vs central differences (relative steps)
    flat = params.ravel()
    for k in range(flat.size):
        eps = 1e-5 * flat[k]
        pp, pm = flat.copy(), flat.copy()
        pp[k] += eps
        pm[k] -= eps
        fd = (f(pp.reshape(params.shape), beta)["value"] - f(pm.reshape(params.shape), beta)["value"]) / (2 * eps)
        assert abs(fd - res["d_params"].ravel()[k]) < 1e-6 * (1 + abs(fd)), (k, fd, res["d_params"].ravel()[k])
    for c in range(C):
        e = np.zeros(C)
        e[c] = 1e-5
        fd = (f(params, beta + e)["value"] - f(params, beta - e)["value"]) / 2e-5
        assert abs(fd - res["d_beta"][c]) < 1e-6 * (1 + abs(fd))


@pytest.mark.parametrize("per_class", [False, True])
def test_bound_with_given_distances_equals_the_bound_computing_them(per_class):
    # A search evaluates the bound many times with one active set: the squared distances of the
    # active rows and X (read by the isotropic leaves and their vjps) can be computed once by
    # kernels.squared_distances and given. Same value and gradient, bit for bit.
    iso_white = np.array([7, 2, 0, 2, 6, 1], dtype=np.int32)  # Sum(RBF(var, ls), White(var))
    X, y, beta = problem(n=50, C=3, seed=11)
    params = np.array([1.3, 0.9, 0.05])
    if per_class:
        params = np.array([[1.3, 0.9, 0.05], [0.8, 1.4, 0.03], [1.7, 1.1, 0.08]])
    r = ivm.multiclass_select(iso_white, params, X, y, num_classes=3, active_size=12, seed=5, beta=beta)
    act = r["active"].astype(np.int64)
    r2, max_norm = _core.kernels.squared_distances(np.ascontiguousarray(X[act]), X)
    np.testing.assert_allclose(r2, ((X[act][:, None, :] - X[None, :, :]) ** 2).sum(-1), rtol=1e-12, atol=1e-12)
    assert max_norm > 0
    kw = dict(beta=beta, with_grad=True)
    plain = ivm.multiclass_bound(iso_white, params, X, y, act, r["pi"], r["b"], **kw)
    given = ivm.multiclass_bound(iso_white, params, X, y, act, r["pi"], r["b"], distances=(r2, max_norm), **kw)
    assert given["value"] == plain["value"]
    assert np.array_equal(given["d_params"], plain["d_params"]) and np.array_equal(given["d_beta"], plain["d_beta"])
    with pytest.raises(ValueError, match=r"\[d, n\]"):
        ivm.multiclass_bound(iso_white, params, X, y, act, r["pi"], r["b"], distances=(np.ascontiguousarray(r2[:, :-1]), max_norm),
                              **kw)


# ---------------------------------------------------------------- bad input


def test_bad_input_raises_value_error():
    X, y, beta = problem(n=20, C=3)
    params = np.array([1.0, 1.0, 1.0, 0.05])
    sel = lambda **kw: ivm.multiclass_select(RBF_WHITE, params, X, kw.pop("y", y),
                                             **{**dict(num_classes=3, active_size=5), **kw})
    with pytest.raises(ValueError):
        sel(active_size=0)
    with pytest.raises(ValueError):
        sel(active_size=21)
    with pytest.raises(ValueError):
        sel(num_classes=1)
    with pytest.raises(ValueError):
        sel(rule=2)
    with pytest.raises(ValueError):
        sel(keep_fraction=1.5)
    with pytest.raises(ValueError):
        sel(y=np.where(y == 0, 3.0, y))
    with pytest.raises(ValueError):
        sel(y=y + 0.5)
    with pytest.raises(ValueError):
        sel(beta=np.zeros(2))
    with pytest.raises(ValueError):
        ivm.multiclass_select(RBF_WHITE, np.ones((2, 4)), X, y, num_classes=3, active_size=5)
    with pytest.raises(ValueError):
        ivm.cubature(0, 13)
    pi = np.ones((2, 3))
    with pytest.raises(ValueError):
        ivm.multiclass_bound(RBF_WHITE, params, X, y, np.array([0, 0], dtype=np.int64), pi, np.zeros((2, 3)))
    with pytest.raises(ValueError):
        ivm.multiclass_bound(RBF_WHITE, params, X, y, np.array([0, 1], dtype=np.int64), -pi, np.zeros((2, 3)))
    with pytest.raises(ValueError):
        ivm.multiclass_predict(RBF_WHITE, params, X[:2], pi, np.zeros((3, 3)), X)
    with pytest.raises(ValueError):
        ivm.multiclass_project(np.zeros(3), np.eye(3), np.zeros(3), np.eye(3), -np.ones(3))
