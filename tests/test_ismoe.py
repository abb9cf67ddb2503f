"""IS-MOE estimators (seed 003; notes/ismoe-math.md) against numpy references: K = 1, J = 1,
B = N is the exact GP; the weights are the sums of the blocks' evidences; PSIS; the ESS warning;
random partitions; reproducibility, thread counts, pickling, bad input; the classifier; Dask
(equality with threads, a worker lost mid-fit, dask missing)."""

import builtins
import pickle
import sys
import warnings

import numpy as np
import pytest
import scipy.optimize
from scipy.special import logsumexp
from scipy.stats import multivariate_normal, norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score

import pygpfast
from pygpfast import ISMOEClassifier, ISMOERegressor
from pygpfast.kernels import RBF
from pygpfast.moe import _psis

from blas_rounding import assert_same
from dask_cluster import loopback_cluster, wait_for_workers


def _data(n=120, seed=0, D=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, D))
    y = np.sin(5 * X[:, 0]) + (0.5 * X[:, 1] if D > 1 else 0) + 0.2 * rng.standard_normal(n)
    return X, y


def _rbf(params, A, B):
    r2 = (((A[:, None, :] - B[None, :, :]) / params[1:]) ** 2).sum(-1)
    return params[0] * np.exp(-0.5 * r2)


def _quiet(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def test_one_expert_one_sample_all_rows_is_the_full_gp():
    X, y = _data(80)
    Xt = np.linspace(-1.2, 1.2, 13)[:, None]
    m = ISMOERegressor(n_experts=1, n_samples=1, random_state=0).fit(X, y)
    st = m.experts_
    params, s2, mu = st["params"][0], st["noise_variance"][0], st["mean"][0]
    ys = (y - m.y_mean_) / m.y_scale_
    C = _rbf(params, X, X) + s2 * np.eye(80)
    Ks = _rbf(params, Xt, X)
    f = mu + Ks @ np.linalg.solve(C, ys - mu)
    v = params[0] - np.einsum("ij,ji->i", Ks, np.linalg.solve(C, Ks.T))
    logev = multivariate_normal(np.full(80, mu), C).logpdf(ys) - 80 * np.log(m.y_scale_)
    np.testing.assert_allclose(m.objective_, logev, rtol=1e-10)
    np.testing.assert_allclose(m.log_weights_, [logev], rtol=1e-10)
    assert m.weights_.tolist() == [1.0] and m.effective_sample_size_ == 1.0
    mean, std = m.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean, f * m.y_scale_ + m.y_mean_, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(std, np.sqrt(v + s2) * m.y_scale_, rtol=1e-8)
    lm, lv = m.predict_latent(Xt)
    np.testing.assert_allclose(lv, v * m.y_scale_**2, rtol=1e-7, atol=1e-12)
    yt = np.sin(5 * Xt[:, 0])
    ref = norm(f * m.y_scale_ + m.y_mean_, np.sqrt(v + s2) * m.y_scale_).logpdf(yt)
    np.testing.assert_allclose(m.predict_log_density(Xt, yt), ref, rtol=1e-9)
    # the fitted hyperparameters are the ML-II optimum: the gradient vanishes (or a bound holds)
    assert m.kernel_.params.tolist() == params.tolist()


def test_one_expert_all_rows_gives_equal_weights_for_any_J():
    X, y = _data(60)
    m = ISMOERegressor(n_experts=1, n_samples=3, random_state=0).fit(X, y)
    np.testing.assert_allclose(m.weights_, 1 / 3, rtol=1e-12)
    assert m.effective_sample_size_ == pytest.approx(3.0)
    assert m.n_iter_ == 3 and m.history_.size == 3


def test_weights_are_the_normalised_sums_of_block_evidences():
    """log w_j = sum_k log N(y_jk | m_jk, K_jk + s2_jk I) at the experts' fitted values, by a
    direct numpy computation from the fitted state."""
    X, y = _data(90, D=2)
    m = _quiet(ISMOERegressor(n_experts=3, n_samples=5, batch_size=60, min_block_size=5,
                              random_state=1), X, y)
    st = m.experts_
    assert st["samples"].tolist() == list(range(5)) or m.effective_sample_size_ < 5
    ys = (y - m.y_mean_) / m.y_scale_
    b = 0
    for i, j in enumerate(st["samples"]):
        total, rows = 0.0, 0
        for p in range(b, b + st["n_blocks"][i]):
            idx = st["rows"][st["offsets"][p]:st["offsets"][p + 1]]
            C = _rbf(st["params"][p], X[idx], X[idx]) + st["noise_variance"][p] * np.eye(idx.size)
            total += multivariate_normal(np.full(idx.size, st["mean"][p]), C).logpdf(ys[idx])
            rows += idx.size
        b += st["n_blocks"][i]
        assert rows == 60  # (the sample's own minibatch, every row in one expert)
        np.testing.assert_allclose(m.log_weights_[j], total - 60 * np.log(m.y_scale_), rtol=1e-9)
    np.testing.assert_allclose(m.weights_, np.exp(m.log_weights_ - logsumexp(m.log_weights_)),
                               rtol=1e-12)
    np.testing.assert_allclose(m.objective_, logsumexp(m.log_weights_) - np.log(5), rtol=1e-12)
    assert m.effective_sample_size_ == pytest.approx(1 / np.sum(m.weights_**2))


def test_scale_evidence_raises_the_weights_to_N_over_B():
    X, y = _data(90)
    kw = dict(n_experts=2, n_samples=4, batch_size=45, random_state=3)
    a = _quiet(ISMOERegressor(**kw), X, y)
    b = _quiet(ISMOERegressor(scale_evidence=True, **kw), X, y)
    np.testing.assert_allclose(b.log_weights_, 2 * a.log_weights_, rtol=1e-12)


def test_mixture_prediction_against_numpy():
    """Algorithm 1: mean = sum_j w_j sum_k rho_jk m_jk, with rho the sample's mixture
    responsibilities over its non-empty experts, recomputed here from the fitted state."""
    X, y = _data(100, D=2)
    m = _quiet(ISMOERegressor(n_experts=3, n_samples=4, weighting="uniform", random_state=2), X, y)
    st = m.experts_
    Xt = np.random.default_rng(5).uniform(-1, 1, (6, 2))
    Xs = (Xt - m.x_mean_) / m.x_scale_
    ys = (y - m.y_mean_) / m.y_scale_
    mean, second = np.zeros(6), np.zeros(6)
    b = 0
    for i, j in enumerate(st["samples"]):
        n = st["n_blocks"][i]
        logr = []
        for k in st["expert"][b:b + n]:
            Gamma = np.linalg.inv(st["R"][i][k] @ st["R"][i][k].T)
            logr.append(st["log_pi"][i][k] + multivariate_normal(st["mu"][i][k], Gamma).logpdf(Xs))
        rho = np.exp(np.array(logr) - logsumexp(logr, axis=0))
        for c, p in enumerate(range(b, b + n)):
            idx = st["rows"][st["offsets"][p]:st["offsets"][p + 1]]
            prm, s2, mu = st["params"][p], st["noise_variance"][p], st["mean"][p]
            C = _rbf(prm, X[idx], X[idx]) + s2 * np.eye(idx.size)
            Ks = _rbf(prm, Xt, X[idx])
            f = mu + Ks @ np.linalg.solve(C, ys[idx] - mu)
            v = prm[0] - np.einsum("ij,ji->i", Ks, np.linalg.solve(C, Ks.T)) + s2
            mean += m.weights_[j] * rho[c] * f
            second += m.weights_[j] * rho[c] * (v + f**2)
        b += n
    got_mean, got_std = m.predict(Xt, return_std=True)
    np.testing.assert_allclose(got_mean, mean * m.y_scale_ + m.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(got_std, np.sqrt(second - mean**2) * m.y_scale_, rtol=1e-7)
    np.testing.assert_allclose(m.weights_, 0.25)


def test_blocks_of_negligible_weight_are_left_out_of_predictions(monkeypatch):
    """Each test row is predicted only by the blocks whose weight there is at least 1e-12 / P of
    its largest (with a Gaussian-mixture partition, a few experts per sample): the mixture
    equals the one over every block to ~1e-12, with far fewer (row, block) pairs computed."""
    from pygpfast import _core

    X, y = _data(300, D=2)
    Xt, yt = _data(400, seed=3, D=2)
    m = _quiet(ISMOERegressor(n_experts=8, n_samples=6, weighting="uniform", random_state=0), X, y)
    st = m.experts_
    P = st["expert"].size
    core = _core.moe.predict_blocks
    pairs = []

    def counting(*args, **kwargs):
        pairs.append(kwargs["test_rows"].size)
        return core(*args, **kwargs)

    monkeypatch.setattr(_core.moe, "predict_blocks", counting)
    mean, std = m.predict(Xt, return_std=True)
    # (72% of the pairs here, in 2-D; 11% on the 28-D Higgs-like set of bench/ismoe_scale.py)
    assert 0 < sum(pairs) < 0.8 * len(Xt) * P, (sum(pairs), len(Xt) * P)
    log_density = m.predict_log_density(Xt, yt)
    # the same mixture over every block, from the dense prediction
    codes, _ = m._start._spec(2)
    dense = core(codes, st["params"], m._Xb, st["offsets"], np.arange(len(m._Xb), dtype=np.int64), Xt,
                 st["alpha"], st["factor"], noise_variance=st["noise_variance"], mean=st["mean"])
    log_c = m._log_assignment((Xt - m.x_mean_) / m.x_scale_)
    c = np.exp(log_c)
    mu = np.sum(c * dense["mean"], axis=1)
    var = np.sum(c * (dense["var_y"] + (dense["mean"] - mu[:, None]) ** 2), axis=1)
    np.testing.assert_allclose(mean, mu * m.y_scale_ + m.y_mean_, rtol=1e-11)
    np.testing.assert_allclose(std, np.sqrt(var) * m.y_scale_, rtol=1e-11)
    ys = (yt - m.y_mean_) / m.y_scale_
    lp = -0.5 * (np.log(2 * np.pi * dense["var_y"]) + (ys[:, None] - dense["mean"]) ** 2 / dense["var_y"])
    np.testing.assert_allclose(log_density, logsumexp(log_c + lp, axis=1) - np.log(m.y_scale_),
                               rtol=1e-11, atol=1e-11)


def _dense_objective(u, X, ys, loc, scale):
    """log N(ys | m, K + s2 I) + sum of the Gaussian log densities of u = (log variance, log
    lengthscales, log s2, m) where scale > 0: one exact-GP expert's MAP objective."""
    prm, s2, m = np.exp(u[:-2]), np.exp(u[-2]), u[-1]
    C = _rbf(prm, X, X) + s2 * np.eye(len(X))
    value = multivariate_normal(np.full(len(X), m), C).logpdf(ys)
    on = scale > 0
    value += np.sum(norm(loc[on], scale[on]).logpdf(u[on]))
    return value


@pytest.mark.parametrize("share", [False, True])
def test_default_priors_fit_each_expert_at_its_map_point(share, monkeypatch):
    """priors='default' (the default): one expert of all rows is the exact GP at the MAP point
    of the default priors (log-normal lengthscales and variances, and noise variance centred at
    a tenth of the standardised targets' scale), in the core's search and in the shared
    hyperparameters' search alike; the weight stays the evidence, without the prior."""
    from pygpfast import _core
    from pygpfast.priors import LogNormal

    X, y = _data(60, D=2)
    seen = {}
    core = _core.moe.fit_blocks

    def spy(*args, **kwargs):
        seen.update(loc=kwargs["prior_loc"], scale=kwargs["prior_scale"])
        return core(*args, **kwargs)

    monkeypatch.setattr(_core.moe, "fit_blocks", spy)
    m = _quiet(ISMOERegressor(n_experts=1, n_samples=1, share_hyperparameters=share, tol=1e-14,
                              random_state=0), X, y)
    priors = m.kernel_.priors
    assert set(priors) == {"variance", "lengthscale"}
    assert all(isinstance(p, LogNormal) for p in priors.values())
    loc = np.concatenate([[priors["variance"].loc], np.broadcast_to(priors["lengthscale"].loc, 2),
                          [np.log(0.1)], [0.0]])
    scale = np.concatenate([[priors["variance"].scale], np.broadcast_to(priors["lengthscale"].scale, 2),
                            [np.sqrt(3.0)], [0.0]])  # (no prior on the constant mean)
    np.testing.assert_array_equal(seen["loc"], loc)
    np.testing.assert_array_equal(seen["scale"], scale)
    st = m.experts_
    ys = (y - m.y_mean_) / m.y_scale_
    u = np.concatenate([np.log(st["params"][0]), [np.log(st["noise_variance"][0])],
                        [st["mean"][0]]])
    # scipy's L-BFGS-B on the dense MAP objective, from the fit's optimum and from the start,
    # finds nothing higher; the fit's own weight is the plain evidence there
    best = _dense_objective(u, X, ys, loc, scale)
    u0 = np.concatenate([np.log(m._start._spec(2)[1]), [np.log(m._NOISE_START)], [0.0]])
    for start in (u, u0):
        ref = scipy.optimize.minimize(lambda v: -_dense_objective(v, X, ys, loc, scale), start,
                                      method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-9})
        assert -ref.fun <= best + 1e-6 * abs(best)
    evidence = _dense_objective(u, X, ys, loc, np.zeros(5))
    np.testing.assert_allclose(m.log_weights_[0], evidence - len(y) * np.log(m.y_scale_),
                               rtol=1e-9)
    assert m.log_prior_ == 0.0


def test_priors_none_is_type_ii_maximum_likelihood_and_keeps_a_set_prior(monkeypatch):
    from pygpfast import _core
    from pygpfast.priors import LogNormal

    X, y = _data(60, D=2)
    seen = []
    core = _core.moe.fit_blocks

    def spy(*args, **kwargs):
        seen.append((kwargs["prior_loc"], kwargs["prior_scale"]))
        return core(*args, **kwargs)

    monkeypatch.setattr(_core.moe, "fit_blocks", spy)
    m = _quiet(ISMOERegressor(n_experts=1, n_samples=1, priors=None, tol=1e-14, random_state=0),
               X, y)
    assert seen[-1] == (None, None)
    st = m.experts_
    ys = (y - m.y_mean_) / m.y_scale_
    u = np.concatenate([np.log(st["params"][0]), [np.log(st["noise_variance"][0])],
                        [st["mean"][0]]])
    flat = np.zeros(5)
    ref = scipy.optimize.minimize(lambda v: -_dense_objective(v, X, ys, flat, flat), u,
                                  method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-9})
    assert -ref.fun <= _dense_objective(u, X, ys, flat, flat) + 1e-9
    # a prior the user set on the kernel is used with priors=None too, and only it
    kernel = RBF(lengthscale=[0.5, 0.5])
    kernel.priors = {"lengthscale": LogNormal(np.log(0.3), 0.5)}
    _quiet(ISMOERegressor(kernel, n_experts=1, n_samples=1, priors=None, random_state=0), X, y)
    np.testing.assert_array_equal(seen[-1][0], [0, np.log(0.3), np.log(0.3), 0, 0])
    np.testing.assert_array_equal(seen[-1][1], [0, 0.5, 0.5, 0, 0])


def test_random_partition_and_gmm():
    X, y = _data(150, D=2)
    Xt, yt = _data(100, seed=9, D=2)
    g = _quiet(ISMOERegressor(n_experts=4, n_samples=6, random_state=0), X, y)
    r = _quiet(ISMOERegressor(n_experts=4, n_samples=6, partition="random", random_state=0), X, y)
    assert "R" not in r.experts_ and "R" in g.experts_
    for m in (g, r):
        assert np.isfinite(m.predict_log_density(Xt, yt)).all()
        assert m.score(Xt, yt) > 0.5
    # a random partition's test point goes to each non-empty expert with equal probability
    log_c = r._log_assignment((Xt - r.x_mean_) / r.x_scale_)
    n0 = r.experts_["n_blocks"][0]
    np.testing.assert_allclose(np.exp(log_c[:, :n0]),
                               r.weights_[r.experts_["samples"][0]] / n0, rtol=1e-12)


def test_psis_on_and_off():
    # the smoothing itself, on a heavy tail: the largest weights shrink, the order is kept
    rng = np.random.default_rng(0)
    lw = rng.standard_normal(200) * 3.0
    smoothed, k = _psis.psis(lw)
    assert np.isfinite(k) and 0.3 < k < 1.0  # (log-normal, sigma = 3: a heavy tail)
    np.testing.assert_allclose(logsumexp(smoothed), 0.0, atol=1e-12)
    raw = lw - logsumexp(lw)
    below = lw <= np.sort(lw)[-41]  # (the tail: M = ceil(min(S / 5, 3 sqrt(S))) = 40)
    body = (smoothed - raw)[below][0]  # (the body keeps its raw ratios: one shift)
    assert smoothed.max() - body <= raw.max() + 1e-12  # (truncated at the largest raw weight)
    tail = ~below
    assert np.max(np.abs(smoothed[tail] - body - raw[tail])) > 0.05  # (the tail is replaced)
    np.testing.assert_array_equal(np.argsort(smoothed[lw > np.sort(lw)[-41]]),
                                  np.argsort(raw[lw > np.sort(lw)[-41]]))
    np.testing.assert_allclose(smoothed[below] - raw[below], body, rtol=1e-12)
    # exponential weights (a Pareto shape near 0) and too short a tail (S < 10: no smoothing)
    _, k0 = _psis.psis(np.log(rng.exponential(size=4000)))
    assert abs(k0) < 0.15
    # Pareto weights of index a have the tail shape 1 / a
    _, k2 = _psis.psis(np.log(rng.pareto(2.0, size=4000) + 1.0))
    _, k1 = _psis.psis(-np.log(rng.uniform(size=4000)))
    assert abs(k2 - 0.5) < 0.1 and abs(k1 - 1.0) < 0.15
    s, kinf = _psis.psis(lw[:8])
    assert kinf == np.inf
    np.testing.assert_allclose(s, lw[:8] - logsumexp(lw[:8]))
    # in the estimator
    X, y = _data(100)
    kw = dict(n_experts=3, n_samples=12, random_state=0)
    off = _quiet(ISMOERegressor(**kw), X, y)
    on = _quiet(ISMOERegressor(psis=True, **kw), X, y)
    np.testing.assert_array_equal(on.log_weights_, off.log_weights_)
    assert off.pareto_k_ is None and on.pareto_k_ is not None
    ref, _ = _psis.psis(off.log_weights_)
    np.testing.assert_allclose(on.weights_, np.exp(ref), rtol=1e-12)
    assert np.isfinite(on.predict(X[:5])).all()


def test_ess_collapse_warns():
    X, y = _data(150)
    with pytest.warns(ConvergenceWarning, match="effective sample size"):
        m = ISMOERegressor(n_experts=6, n_samples=6, random_state=0).fit(X, y)
    assert m.effective_sample_size_ < 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ISMOERegressor(n_experts=6, n_samples=6, weighting="uniform", random_state=0).fit(X, y)


def test_same_random_state_same_fit_bitwise_and_thread_invariance(restore_threads):
    X, y = _data(150, D=2)
    outs = []
    for n in (1, 2, 2):
        pygpfast.set_num_threads(n)
        m = _quiet(ISMOERegressor(n_experts=3, n_samples=5, batch_size=100, random_state=7), X, y)
        outs.append((m.log_weights_, *m.predict(X[:20], return_std=True)))
    for o in outs[1:]:
        for a, b in zip(outs[0], o):
            assert_same(a, b)
    m2 = _quiet(ISMOERegressor(n_experts=3, n_samples=5, batch_size=100, random_state=8), X, y)
    assert not np.array_equal(m2.log_weights_, outs[0][0])


def test_samples_do_not_depend_on_the_batching():
    X, y = _data(100)
    a = _quiet(ISMOERegressor(n_experts=3, n_samples=6, samples_per_iteration=1, random_state=0), X, y)
    b = _quiet(ISMOERegressor(n_experts=3, n_samples=6, samples_per_iteration=4, random_state=0), X, y)
    np.testing.assert_array_equal(a.log_weights_, b.log_weights_)
    assert a.n_iter_ == 6 and b.n_iter_ == 2
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_shared_hyperparameters_one_kernel_per_sample():
    X, y = _data(100)
    m = _quiet(ISMOERegressor(n_experts=3, n_samples=3, share_hyperparameters=True,
                              weighting="uniform", random_state=0), X, y)
    st = m.experts_
    b = 0
    for n in st["n_blocks"]:
        np.testing.assert_array_equal(st["params"][b:b + n], np.tile(st["params"][b], (n, 1)))
        assert np.all(st["noise_variance"][b:b + n] == st["noise_variance"][b])
        b += n
    # K = 1: the shared fit is the single expert's fit
    one = ISMOERegressor(n_experts=1, n_samples=1, random_state=0).fit(X, y)
    shared = ISMOERegressor(n_experts=1, n_samples=1, share_hyperparameters=True,
                            random_state=0).fit(X, y)
    np.testing.assert_allclose(shared.objective_, one.objective_, rtol=1e-6)


def test_pickle_round_trip():
    X, y = _data(80)
    m = _quiet(ISMOERegressor(n_experts=2, n_samples=3, random_state=0), X, y)
    m2 = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(m2.predict(X), m.predict(X))


def test_fixed_hyperparameters_keep_the_kernel():
    X, y = _data(80)
    k = RBF(variance=1.0, lengthscale=0.3)
    m = _quiet(ISMOERegressor(k, n_experts=2, n_samples=2, optimize_hyperparameters=False,
                              random_state=0), X, y)
    np.testing.assert_array_equal(m.experts_["params"], np.tile([1.0, 0.3], (m.n_blocks_, 1)))
    np.testing.assert_array_equal(m.kernel_.params, [1.0, 0.3])


@pytest.mark.parametrize("name, value, match", [
    ("n_experts", 0, "n_experts must be"),
    ("n_samples", 1.5, "n_samples must be"),
    ("batch_size", 0, "batch_size must be"),
    ("partition", "kmeans", "partition must be"),
    ("backend", "mpi", "backend must be"),
    ("client", "localhost", "client must be"),
    ("weighting", "equal", "weighting must be"),
])
def test_bad_parameters(name, value, match):
    X, y = _data(30)
    with pytest.raises(ValueError, match=match):
        ISMOERegressor(**{name: value}).fit(X, y)


def test_bad_input():
    X, y = _data(30)
    with pytest.raises(ValueError, match="NaN"):
        ISMOERegressor().fit(np.where(X > 0.9, np.nan, X), y)
    with pytest.raises(ValueError, match="inconsistent"):
        ISMOERegressor().fit(X, y[:-1])
    with pytest.raises(ValueError, match="only one class"):
        ISMOEClassifier().fit(X, np.zeros(30))
    with pytest.raises(ValueError, match="binary"):
        ISMOEClassifier().fit(X, np.arange(30) % 3)
    with pytest.raises(ValueError, match="backend='threads'"):
        ISMOERegressor(client=object.__new__(type("C", (), {"submit": 1, "scatter": 1})),
                       backend="threads").fit(X, y)


@pytest.mark.parametrize("likelihood", ["probit", "logit"])
def test_classifier_beats_chance(likelihood):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (300, 2))
    f = np.sin(2 * X[:, 0]) + X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(300) > 0, "b", "a")
    Xt = rng.uniform(-2, 2, (200, 2))
    yt = np.where(np.sin(2 * Xt[:, 0]) + Xt[:, 1] > 0, "b", "a")
    c = _quiet(ISMOEClassifier(likelihood=likelihood, n_experts=3, n_samples=6, random_state=0), X, y)
    p = c.predict_proba(Xt)
    assert np.all((p > 0) & (p < 1))
    np.testing.assert_allclose(p.sum(1), 1.0)
    np.testing.assert_allclose(np.exp(c.predict_log_proba(Xt)), p, rtol=1e-9)
    assert c.score(Xt, yt) > 0.85
    assert roc_auc_score(yt == "b", p[:, 1]) > 0.9
    # weights: the sums of the experts' Laplace evidences
    st = c.experts_
    b = 0
    for i, j in enumerate(st["samples"]):
        n = st["n_blocks"][i]
        np.testing.assert_allclose(c.log_weights_[j], st["log_evidence"][b:b + n].sum(), rtol=1e-12)
        b += n


# ---------------------------------------------------------------------------- Dask


def test_without_dask_the_package_works(monkeypatch):
    real_import = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    for mod in [m for m in sys.modules if m.split(".")[0] in ("dask", "distributed")]:
        monkeypatch.delitem(sys.modules, mod)
    X, y = _data(60)
    m = _quiet(ISMOERegressor(n_experts=2, n_samples=2, random_state=0), X, y)
    assert np.isfinite(m.predict(X)).all()
    with pytest.raises(ImportError, match="pygpfast\\[distributed\\]"):
        ISMOERegressor(backend="dask").fit(X, y)


@pytest.fixture(scope="module")
def dask_cluster():
    with loopback_cluster() as pair:
        yield pair


def test_dask_equals_threads_bitwise(dask_cluster):
    _, client = dask_cluster
    X, y = _data(200, D=2)
    kw = dict(n_experts=3, n_samples=8, batch_size=120, samples_per_iteration=2, random_state=4)
    threads = _quiet(ISMOERegressor(**kw), X, y)
    dask = _quiet(ISMOERegressor(client=client, **kw), X, y)
    assert_same(dask.log_weights_, threads.log_weights_)
    assert_same(dask.history_, threads.history_)
    for a, b in zip(dask.predict(X, return_std=True), threads.predict(X, return_std=True)):
        assert_same(a, b)
    # the current client, with backend='dask'; the classifier too
    yc = (y > 0).astype(int)
    kc = dict(n_experts=2, n_samples=4, samples_per_iteration=1, random_state=0)
    a = _quiet(ISMOEClassifier(backend="dask", **kc), X, yc)
    b = _quiet(ISMOEClassifier(**kc), X, yc)
    assert_same(a.predict_proba(X), b.predict_proba(X))
    # a fitted model keeps no client in its state, and pickles with client=None
    est = pickle.loads(pickle.dumps(dask.set_params(client=None)))
    assert_same(est.predict(X), threads.predict(X))


def test_dask_survives_a_lost_worker(dask_cluster):
    cluster, client = dask_cluster
    X, y = _data(400, D=2)
    kw = dict(n_experts=2, n_samples=24, samples_per_iteration=1, random_state=5)
    ref = _quiet(ISMOERegressor(**kw), X, y)
    victim = sorted(client.scheduler_info()["workers"])[0]

    def exit_soon():
        import os
        import threading

        threading.Timer(0.3, os._exit, (1,)).start()

    client.run(exit_soon, workers=[victim])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ISMOERegressor(client=client, **kw).fit(X, y)
    assert_same(got.log_weights_, ref.log_weights_)
    assert_same(got.predict(X), ref.predict(X))
    wait_for_workers(client, 2, timeout=30)
