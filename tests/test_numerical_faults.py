"""Numerical faults (issue 27): no NaN or infinity out of a fit on real data, likelihoods that
stay finite in their far tails, near-singular kernels that escalate the jitter once and then
fail with a message that says what to change, stochastic fits that detect their own divergence,
and the Opper-Archambeau baseline's report of how far it stopped from its optimum."""

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning

import pygpfast
from pygpfast import likelihoods as lik
from pygpfast.cvi._inference import LocalBound
from pygpfast.exceptions import NumericalWarning

from test_estimators_common import IDS

#: Latent values of the far tails: every log-probability, gradient and predictive probability
#: there is finite (Poisson: below its overflow, see test_poisson_beyond_float64).
FAR = np.array([-1e5, -1e3, 1e3, 1e5])


def _all_finite(*arrays):
    return all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in arrays)


# ---------------------------------------------------------------- every estimator on every data set
def _shared_data():
    """``$PYGPFAST_SHARED_DATA``, else ``shared/data`` beside the checkout or one of its parents
    (a git worktree under another folder), as bench/python/common.py finds it; None if absent."""
    if os.environ.get("PYGPFAST_SHARED_DATA"):
        path = Path(os.environ["PYGPFAST_SHARED_DATA"])
        return path if path.is_dir() else None
    return next((p / "shared" / "data" for p in Path(__file__).resolve().parents
                 if (p / "shared" / "data").is_dir()), None)


#: Rows per data set (a random subsample), and the sets of each task with their arrays:
#: (file, X key, y key, reshape X to 2-D).
_ROWS = 200
_SETS = {
    "binary": [(f"ratsch_{name}.npz", "X", "y") for name in (
        "banana", "breast_cancer", "diabetis", "flare_solar", "german", "heart", "image",
        "ringnorm", "splice", "thyroid", "titanic", "twonorm", "waveform")]
    + [("uci_ionosphere.npz", "X", "y"), ("uci_sonar.npz", "X", "y"), ("uci_pima.npz", "X", "y"),
       ("uci_wdbc.npz", "X", "y"), ("usps_3vs5.npz", "X", "y")],
    "multiclass": [("uci_glass.npz", "X", "y"), ("usps_full.npz", "X_train", "y_train"),
                   ("mnist_test_only.npz", "x_test", "y_test")],
    "regression": [("uci_parkinsons_telemonitoring.npz", "X", "y_motor"),
                   ("sarcos_inv_test.npz", "X", "y")],
    # (Poisson's quasi-likelihood takes real y >= 0: the total UPDRS scores, 7 to 55)
    "counts": [("uci_parkinsons_telemonitoring.npz", "X", "y_total")],
}

#: Every case of test_estimators_common.ESTIMATORS at its default settings but for the number
#: of iterations (and IS-MOE's samples): (id, factory, task).
_DEFAULTS = [
    ("SVGPClassifier", lambda: pygpfast.SVGPClassifier(max_iter=30), "binary"),
    ("SVGPClassifier-softmax", lambda: pygpfast.SVGPClassifier(max_iter=30), "multiclass"),
    ("SVGPClassifier-robustmax", lambda: pygpfast.SVGPClassifier(likelihood="robustmax", max_iter=30),
     "multiclass"),
    ("SVGPClassifier-mf", lambda: pygpfast.SVGPClassifier(method="mf", max_iter=15), "binary"),
    ("SVGPClassifier-natgrad", lambda: pygpfast.SVGPClassifier(optimizer="natgrad", max_iter=5),
     "binary"),
    ("SVGPRegressor", lambda: pygpfast.SVGPRegressor(max_iter=30), "regression"),
    ("SVGPRegressor-poisson", lambda: pygpfast.SVGPRegressor(likelihood="poisson", max_iter=30),
     "counts"),
    ("VGPClassifier", lambda: pygpfast.VGPClassifier(max_iter=15), "binary"),
    ("VGPClassifier-softmax", lambda: pygpfast.VGPClassifier(likelihood="softmax", max_iter=10),
     "multiclass"),
    ("VGPClassifier-ordinal", lambda: pygpfast.VGPClassifier(likelihood="ordinal", max_iter=10),
     "multiclass"),
    ("VGPPoissonRegressor", lambda: pygpfast.VGPPoissonRegressor(max_iter=15), "counts"),
    ("IVMClassifier", lambda: pygpfast.IVMClassifier(max_iter=6), "binary"),
    ("IVMClassifier-joint", lambda: pygpfast.IVMClassifier(max_iter=6), "multiclass"),
    ("IVMClassifier-ovr", lambda: pygpfast.IVMClassifier(max_iter=6, multi_class="ovr"),
     "multiclass"),
    ("ISMOERegressor", lambda: pygpfast.ISMOERegressor(n_samples=4, max_iter=30), "regression"),
    ("ISMOERegressor-minibatch", lambda: pygpfast.ISMOERegressor(
        n_samples=4, batch_size=50, psis=True, max_iter=30), "regression"),
    ("ISMOEClassifier", lambda: pygpfast.ISMOEClassifier(n_samples=4, max_iter=30), "binary"),
    ("ISMOEClassifier-logit-random", lambda: pygpfast.ISMOEClassifier(
        likelihood="logit", partition="random", n_samples=4, max_iter=30), "binary"),
]


def test_the_data_set_sweep_covers_every_estimator_case():
    assert [case[0] for case in _DEFAULTS] == IDS


def _load(folder, file, x_key, y_key):
    data = np.load(folder / file)
    X, y = data[x_key], data[y_key]
    rows = np.random.default_rng(0).permutation(len(y))[:_ROWS]
    return X[rows].reshape(len(rows), -1), y[rows]  # (MNIST's images as rows of pixels)


def test_no_nan_or_inf_from_any_estimator_on_any_data_set():
    """Each estimator at its defaults (few iterations) on a subsample of each data set of its
    task in shared/data, raw features as stored (unscaled Pima, float32 USPS, uint8 MNIST):
    objective_, history_, the fitted kernel's theta, and every prediction (latent marginals,
    class probabilities and their logarithms, predictive means and standard deviations) are
    finite. Warnings about convergence (few iterations) and numerical safeguards are expected;
    any other (a numpy RuntimeWarning from an overflow, say) is a fault."""
    folder = _shared_data()
    if folder is None or not (folder / "ratsch_banana.npz").exists():
        pytest.skip("shared/data is not available (set PYGPFAST_SHARED_DATA)")
    faults, fits = [], 0
    for task, sets in _SETS.items():
        for file, x_key, y_key in sets:
            X, y = _load(folder, file, x_key, y_key)
            for name, make, case_task in _DEFAULTS:
                if case_task != task:
                    continue
                where = f"{name} on {file} ({y_key})"
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    warnings.simplefilter("ignore", NumericalWarning)
                    try:
                        est = make().set_params(random_state=0).fit(X, y)
                        outputs = {"objective_": est.objective_, "history_": est.history_,
                                   "kernel_.theta": est.kernel_.theta,
                                   "predict_latent": est.predict_latent(X)}
                        if is_classifier(est):
                            outputs["predict_proba"] = est.predict_proba(X)
                            outputs["predict_log_proba"] = est.predict_log_proba(X)
                        else:
                            outputs["predict"] = est.predict(X, return_std=True)
                    except Exception as error:  # (recorded: the report lists every fault)
                        faults.append(f"{where}: {type(error).__name__}: {error}")
                        continue
                fits += 1
                bad = [key for key, value in outputs.items()
                       if not _all_finite(*np.atleast_1d(value))]
                if bad:
                    faults.append(f"{where}: not finite: {', '.join(bad)}")
    assert not faults, "\n".join(faults)
    # (estimators x data sets per task: binary 7 x 18, multiclass 6 x 3, regression 3 x 2,
    # counts 2 x 1)
    assert fits == sum(sum(1 for case in _DEFAULTS if case[2] == task) * len(_SETS[task])
                       for task in _SETS) == 7 * 18 + 6 * 3 + 3 * 2 + 2 * 1


# ---------------------------------------------------------------- likelihoods in the far tails
@pytest.mark.parametrize("make,labels", [
    (lambda: lik.Gaussian(variance=0.5), (-3.0, 0.0, 2.0)),
    (lambda: lik.Bernoulli("probit"), (0.0, 1.0)),
    (lambda: lik.Bernoulli("logit"), (0.0, 1.0)),
], ids=["gaussian", "probit", "logit"])
@pytest.mark.parametrize("var", [0.0, 1.0, 1e3])
def test_one_latent_likelihoods_are_finite_in_the_far_tails(make, labels, var):
    likelihood = make()
    v = np.full(FAR.size, var)
    for y in labels:
        yy = np.full(FAR.size, y)
        value, d_mu, d_var = likelihood.variational_expectations(yy, FAR, v)
        log_density = likelihood.predict_log_density(yy, FAR, v)
        assert _all_finite(value, d_mu, d_var, log_density, *likelihood.predict_mean_and_var(FAR, v))
        if isinstance(likelihood, lik.Bernoulli):
            # the right asymptotes: log p -> 0 on the label's side, ~ -|f| (logit) or -f^2/2
            # (probit) against it; a gradient that points back towards the label
            s = 2.0 * y - 1.0
            with_label = s * FAR > 0
            np.testing.assert_allclose(value[with_label], 0.0, atol=1e-12)
            assert np.all(value[~with_label] < -500) and np.all(s * d_mu[~with_label] > 0)
    if isinstance(likelihood, lik.Bernoulli):
        p1 = likelihood.predict_mean_and_var(FAR, v)[0]
        np.testing.assert_array_equal(p1 > 0.5, FAR > 0)


def test_bernoulli_values_at_the_tails_against_scipy():
    from scipy.special import log_expit, log_ndtr

    zero = np.zeros(FAR.size)
    for y in (0.0, 1.0):
        s = 2.0 * y - 1.0
        yy = np.full(FAR.size, y)
        probit = lik.Bernoulli("probit").variational_expectations(yy, FAR, zero)
        logit = lik.Bernoulli("logit").variational_expectations(yy, FAR, zero)
        np.testing.assert_allclose(probit[0], log_ndtr(s * FAR), rtol=1e-14)
        np.testing.assert_allclose(logit[0], log_expit(s * FAR), rtol=1e-14)
        # d/df log Phi(s f) = s phi(f) / Phi(s f), -> -f against the label
        np.testing.assert_allclose(probit[1][s * FAR < 0], -FAR[s * FAR < 0], rtol=1e-5)


@pytest.mark.parametrize("var", [0.0, 1.0, 1e3])
def test_softmax_is_finite_in_the_far_tails(var):
    softmax = lik.Softmax(3)
    mu = FAR[:, None] * np.array([1.0, 0.0, -1.0])
    v = np.full_like(mu, var)
    for y in range(3):
        yy = np.full(FAR.size, float(y))
        value, d_mu, d_var = softmax.variational_expectations(yy, mu, v)
        assert _all_finite(value, d_mu, d_var, softmax.predict_log_density(yy, mu, v))
    proba, log_proba = softmax.predict_proba(mu, v), softmax.predict_log_proba(mu, v)
    assert _all_finite(proba, log_proba)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(log_proba[FAR > 0, 2] < -1000) and np.all(log_proba[FAR < 0, 0] < -1000)


def test_poisson_is_finite_below_its_overflow_and_never_nan_beyond():
    poisson = lik.Poisson()
    for var in (0.0, 1.0, 1e3):
        v = np.full(5, var)
        # log rates mu + var/2 up to 700 (the values), E[y^2] ~ exp(2 mu + 2 var) up to e^600
        mu = np.array([-1e5, -1e3, -var, 300.0 - var, 700.0 - var / 2])
        for y in (0.0, 5.0):
            yy = np.full(mu.size, y)
            assert _all_finite(*poisson.variational_expectations(yy, mu, v),
                               poisson.predict_log_density(yy, mu, v))
        mean, variance = poisson.predict_mean_and_var(mu[:4], v[:4])
        assert _all_finite(mean, variance)  # (was NaN: 0 * inf at mu = -1e5, var = 1e3)
    # Var[y] = m + m^2 (e^var - 1), m = exp(mu + var/2): at mu = -1e3, var = 1e3, m = e^-500
    # and the second term exp(2 mu + 2 var) (1 - e^-var) = 1
    _, variance = poisson.predict_mean_and_var([-1e3], [1e3])
    np.testing.assert_allclose(variance, 1.0, rtol=1e-14)
    # Beyond log(max float64) the rate itself overflows: -inf values, +inf moments, no NaN.
    high = np.array([1e3, 1e5])
    value, d_mu, d_var = poisson.variational_expectations([5.0, 5.0], high, [0.0, 1.0])
    assert np.all(value == -np.inf) and np.all(d_mu == -np.inf) and np.all(d_var == -np.inf)
    with pytest.warns(NumericalWarning, match="overflows float64 at 2 of 2 points"):
        mean, variance = poisson.predict_mean_and_var(high, [0.0, 1.0])
    assert np.all(mean == np.inf) and np.all(variance == np.inf)


@pytest.mark.parametrize("kind,C", [("logit", 0), ("softmax", 3), ("stick-breaking", 3),
                                    ("ordinal", 3), ("poisson", 0)])
@pytest.mark.parametrize("var", [0.0, 1.0, 1e3])
def test_cvi_local_bounds_are_finite_in_the_far_tails(kind, C, var):
    bound = LocalBound(kind, n_classes=C)
    L = bound.n_latent
    m = np.tile(FAR, (L, 1)) * np.linspace(1.0, -1.0, L)[:, None] if L > 1 else FAR[None, :]
    if kind == "poisson":  # (its bound holds exp(m + v/2): finite up to ~709.78)
        m = np.minimum(m, 700.0 - var / 2)
    for y in range(max(C, 2)):
        value, dm, dv, d2m, _ = bound(np.full(FAR.size, float(y)), m, np.full_like(m, var))
        assert _all_finite(value, dm, dv, d2m) and np.all(value <= 1e-12)


@pytest.fixture(scope="module")
def small_vgp_models():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2.0, 2.0, (60, 2))
    y = np.digitize(np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1], [-0.5, 0.5])
    models = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for likelihood in ("ordinal", "stick-breaking", "logit"):
            target = (y > 0).astype(int) if likelihood == "logit" else y
            models[likelihood] = pygpfast.VGPClassifier(likelihood=likelihood, max_iter=3,
                                                        random_state=0).fit(X, target)
    return models


@pytest.mark.parametrize("likelihood", ["ordinal", "stick-breaking", "logit"])
@pytest.mark.parametrize("var", [0.0, 1.0, 1e3])
def test_vgp_class_probabilities_are_finite_in_the_far_tails(small_vgp_models, likelihood, var):
    model = small_vgp_models[likelihood]
    L = model.mean_.size
    mean = np.repeat(FAR[:, None], L, axis=1)
    log_proba = model._log_proba(mean, np.full_like(mean, var))
    assert _all_finite(log_proba)
    np.testing.assert_allclose(np.exp(log_proba).sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(log_proba.max(axis=1) > -1e-6)  # (one class takes it all out there)


# ---------------------------------------------------------------- near-singular kernels
def _duplicated(n_distinct=12, copies=10, seed=0):
    rng = np.random.default_rng(seed)
    X = np.repeat(rng.uniform(-2.0, 2.0, (n_distinct, 2)), copies, axis=0)
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    return X, (f > 0).astype(int), f


@pytest.mark.parametrize("kw", [dict(max_iter=20), dict(optimizer="natgrad", max_iter=3),
                                dict(method="mf", max_iter=10), dict(whiten=False, max_iter=10)],
                         ids=["lbfgs", "natgrad", "mf", "unwhitened"])
def test_svgp_jitter_escalation_warns_once_per_fit(kw):
    # K(Z, Z) on duplicated inducing inputs without jitter: the core escalates at every
    # evaluation (20 to 30 warnings per fit before, one per step and jitter value)
    X, y, _ = _duplicated()
    est = pygpfast.SVGPClassifier(inducing_points=X[::4], jitter=0.0, random_state=0,
                                  optimize_hyperparameters=False, **kw)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est.fit(X, y)
    jitter = [str(w.message) for w in rec if issubclass(w.category, NumericalWarning)
              and "K(Z, Z) was not numerically positive definite" in str(w.message)]
    assert len(jitter) == 1, jitter
    assert "use fewer or distinct inducing_points, or increase jitter" in jitter[0]
    with pytest.warns(NumericalWarning, match="K\\(Z, Z\\) was not numerically") as rec:
        proba = est.predict_proba(X)  # (which escalates as well: one warning per call)
    assert len(rec) == 1 and _all_finite(proba, est.objective_)
    # partial_fit: one per call
    stream = pygpfast.SVGPClassifier(inducing_points=X[::4], jitter=0.0, random_state=0)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            stream.partial_fit(X, y, classes=[0, 1])
        assert sum(issubclass(w.category, NumericalWarning) for w in rec) == 1


def test_duplicated_rows_tiny_lengthscales_fit_every_family_at_the_default_jitter():
    X, y, f = _duplicated()
    RBF = pygpfast.kernels.RBF
    for kernel in (RBF(lengthscale=1.0), RBF(lengthscale=1e-8), RBF(lengthscale=1e8)):
        for est, target in [
            (pygpfast.SVGPClassifier(n_inducing=30, max_iter=10), y),
            (pygpfast.SVGPRegressor(n_inducing=30, max_iter=10), f),
            (pygpfast.VGPClassifier(max_iter=5), y),
            (pygpfast.VGPPoissonRegressor(max_iter=5), np.round(np.exp(f))),
            (pygpfast.IVMClassifier(active_size=30, max_iter=3), y),
            (pygpfast.ISMOERegressor(n_experts=2, n_samples=4, max_iter=10), f),
            (pygpfast.ISMOEClassifier(n_experts=2, n_samples=4, max_iter=10), y),
        ]:
            est.set_params(kernel=kernel, optimize_hyperparameters=False, random_state=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)  # (degenerate on purpose)
                est.fit(X, target)
            out = est.predict_proba(X) if is_classifier(est) else est.predict(X, return_std=True)
            assert _all_finite(*np.atleast_2d(out), est.objective_), (est, kernel)


def test_a_matrix_no_jitter_can_save_fails_with_what_to_change():
    A = np.array([[1.0, 2.0], [2.0, 1.0]])  # (an eigenvalue of -1: no jitter up to 1e-4 helps)
    with pytest.raises(pygpfast.LinAlgError, match="Remove duplicate inputs, increase the "
                                                   "noise/white variance, or increase the "
                                                   "lengthscale's lower bound"):
        pygpfast.linalg.cholesky(A)
    # where escalation is enough: one warning, and L L^T = A + jitter I
    with pytest.warns(NumericalWarning, match="added jitter") as rec:
        L = pygpfast.linalg.cholesky(np.ones((3, 3)))
    assert len(rec) == 1
    np.testing.assert_allclose(L @ L.T, np.ones((3, 3)), atol=1e-8)


_BEYOND_THE_SCALE = "beyond a factor 1e\\+100 of the targets' scale .* give a kernel with a variance nearer"


@pytest.mark.parametrize("make,variance,match", [
    # (beyond 1e100 of the data's scale the estimators refuse the kernel before the fit:
    # _start.start_kernel)
    (lambda: pygpfast.SVGPClassifier(n_inducing=20, max_iter=5), 1e300, _BEYOND_THE_SCALE),
    (lambda: pygpfast.SVGPRegressor(n_inducing=20, max_iter=5), 1e300, _BEYOND_THE_SCALE),
    (lambda: pygpfast.VGPClassifier(max_iter=5), 1e20,
     "VGPClassifier: at the kernel .* use a kernel of smaller variance"),
    (lambda: pygpfast.VGPClassifier(method="opper-archambeau", max_iter=5), 1e300, _BEYOND_THE_SCALE),
    (lambda: pygpfast.VGPPoissonRegressor(max_iter=5), 1e20,
     "VGPPoissonRegressor: at the kernel .* use a kernel of smaller variance"),
    (lambda: pygpfast.IVMClassifier(active_size=30, max_iter=3), 1e20,
     "add a White kernel or raise the lengthscale's lower bound"),
], ids=["SVGPClassifier", "SVGPRegressor", "VGPClassifier", "VGPClassifier-oa",
        "VGPPoissonRegressor", "IVMClassifier-joint"])
def test_huge_kernel_variances_fail_with_what_to_change(make, variance, match):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2.0, 2.0, (120, 2))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    est = make()
    y = (np.digitize(f, [-0.5, 0.5]) if isinstance(est, pygpfast.IVMClassifier)
         else np.round(np.exp(f)) if isinstance(est, pygpfast.VGPPoissonRegressor)
         else f if not is_classifier(est) else (f > 0).astype(int))
    kernel = pygpfast.kernels.RBF(variance=variance) + pygpfast.kernels.RBF(variance=variance)
    est.set_params(kernel=kernel, optimize_hyperparameters=False, random_state=0)
    with pytest.raises((pygpfast.LinAlgError, ValueError), match=match):
        est.fit(X, y)


@pytest.mark.parametrize("variance", [1e9, 1e10, 1e20, 1e300])
@pytest.mark.parametrize("method", ["fixed-point", "opper-archambeau"])
def test_cvi_never_returns_a_bound_that_lost_its_digits(variance, method):
    # Binary labels: the bound is E_q[log p(y | f)] - KL(q || p) <= 0. At prior variances of
    # 1e9 to 1e300, V = (Sigma^-1 + Lambda)^-1 lost its digits and infer returned bounds of
    # +1.6e18, +9.7e16 and +3.5e300 (KL(q || p) computed at -1.6e18 ...), without a warning.
    rng = np.random.default_rng(0)
    X = rng.uniform(-2.0, 2.0, (60, 2))
    y = (np.sin(2.0 * X[:, 0]) > 0).astype(float)
    K = pygpfast.kernels.RBF(variance=variance)(X)
    try:
        r = pygpfast.cvi.infer(K, y, LocalBound("logit"), method=method)
    except pygpfast.LinAlgError as e:
        assert re.search(r"the bound lost its digits: KL\(q \|\| p\) of latent function 0 came "
                         r"out at -\S+ \(it is >= 0; .* use a kernel of smaller variance", str(e))
    except ValueError as e:  # (the Opper-Archambeau start overflows beyond about 1e200)
        assert method == "opper-archambeau" and variance > 1e100
        assert "the prior variance is too large" in str(e)
    else:
        assert r.bound < 0.0 and np.isfinite(r.bound)


def test_poisson_predictions_that_overflow_float64_are_inf_with_a_warning():
    # E[exp f] = exp(mu + var / 2) past 1.8e308 is inf, never NaN, and says where it came from
    with pytest.warns(NumericalWarning, match=r"overflows float64 at 2 of 4 points \(latent "
                                              r"mean up to 1, latent variance up to 2000\)"):
        mean, var = lik.Poisson().predict_mean_and_var(np.array([0.0, 1.0, -1e5, 0.0]),
                                                       np.array([1.0, 2e3, 1e3, 1e3]))
    assert np.isinf(mean[1]) and np.isinf(var[1]) and np.isinf(var[3])
    assert np.isfinite(mean[[0, 2, 3]]).all() and np.isfinite(var[[0, 2]]).all()
    # an estimator whose kernel variance (1e10) leaves latent variances of 2e3..1e4 at the data
    rng = np.random.default_rng(0)
    X = rng.uniform(-2.0, 2.0, (120, 2))
    y = np.round(np.exp(np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]))
    est = pygpfast.VGPPoissonRegressor(kernel=pygpfast.kernels.RBF(variance=1e10),
                                       optimize_hyperparameters=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "fixed-point inference did not converge",
                                ConvergenceWarning)
        est.fit(X, y)
    with pytest.warns(NumericalWarning, match="VGP|Poisson: the predictive mean or variance "
                                              "overflows float64 at 120 of 120 points"):
        mean, std = est.predict(X, return_std=True)
    assert not np.isnan(mean).any() and not np.isnan(std).any() and np.isinf(mean).all()


# ---------------------------------------------------------------- diverging stochastic fits
def _binary(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 2))
    return X, (np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(n) > 0).astype(int)


@pytest.mark.parametrize("make,task", [
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="adam", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="natgrad", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="adadelta", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPRegressor(optimizer="natgrad", **kw), "regression"),
    (lambda **kw: pygpfast.SVGPRegressor(likelihood="poisson", optimizer="adam", **kw), "counts"),
], ids=["adam", "natgrad", "adadelta", "gaussian-natgrad", "poisson-adam"])
def test_a_diverging_stochastic_fit_is_reported_and_keeps_its_best_parameters(make, task):
    X, y = _binary()
    if task == "regression":
        y = np.sin(2.0 * X[:, 0]) + 0.1 * X[:, 1]
    elif task == "counts":
        y = np.random.default_rng(1).poisson(np.exp(1.0 + np.sin(2.0 * X[:, 0]))).astype(float)
    kw = dict(n_inducing=20, max_iter=30, random_state=0)
    with pytest.warns(ConvergenceWarning, match=r"diverged: in epoch 1 .* the parameters of the "
                                                r"start are kept .* reduce learning_rate") as rec:
        est = make(learning_rate=1e3, **kw).fit(X, y)
    assert sum("diverged" in str(w.message) for w in rec) == 1
    assert est.n_iter_ == 1 and len(est.history_) == 1
    # the start's parameters are kept, and objective_ is their full-data objective
    assert np.isfinite(est.objective_) and est.objective_ > est.history_[0]
    t = est._encode_targets(y, first_call=False)
    elbo = est.model_.elbo(np.ascontiguousarray(X, dtype=np.float64), t)[0]
    np.testing.assert_allclose(est.objective_, elbo + est.log_prior_, rtol=1e-10)
    out = est.predict_proba(X) if is_classifier(est) else est.predict(X, return_std=True)
    assert _all_finite(*np.atleast_2d(out), est.kernel_.theta, est.model_.q_mu, est.model_.Z)
    # the default step does not diverge on the same data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "SVGP .* stopped after max_iter", ConvergenceWarning)
        warnings.filterwarnings("ignore", "Number of distinct clusters", ConvergenceWarning)
        healthy = make(**kw).fit(X, y)
    assert healthy.objective_ > est.objective_


@pytest.mark.parametrize("make,task", [
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="adam", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="natgrad", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPClassifier(optimizer="adadelta", **kw), "binary"),
    (lambda **kw: pygpfast.SVGPRegressor(likelihood="poisson", optimizer="adam", **kw), "counts"),
], ids=["adam", "natgrad", "adadelta", "poisson-adam"])
def test_a_diverging_partial_fit_pass_is_undone_and_reported(make, task):
    # (Before: five passes at learning_rate=1e3 left an ELBO of -1.9e5 per row, no warning.)
    X, y = _binary()
    if task == "counts":
        y = np.random.default_rng(1).poisson(np.exp(1.0 + np.sin(2.0 * X[:, 0]))).astype(float)
    kw = dict(classes=[0, 1]) if task == "binary" else {}
    est = make(learning_rate=1e3, n_inducing=20, random_state=0)
    for call in (1, 2):
        before = (est.model_.q_mu, est.model_.q_sqrt, est.model_.Z,
                  est.model_.kernel.theta.copy()) if call == 2 else None
        with pytest.warns(ConvergenceWarning, match=rf"diverged in partial_fit's pass {call}: .* "
                                                    r"the parameters from before the call are "
                                                    r"kept.* reduce learning_rate") as rec:
            est.partial_fit(X, y, **kw)
        assert sum("diverged" in str(w.message) for w in rec) == 1
        if before is not None:
            after = (est.model_.q_mu, est.model_.q_sqrt, est.model_.Z, est.model_.kernel.theta)
            assert all(np.array_equal(u, v) for u, v in zip(before, after))
        out = est.predict_proba(X) if is_classifier(est) else est.predict(X, return_std=True)
        assert _all_finite(*np.atleast_2d(out))
    # at the default step size the same passes do not warn
    healthy = make(n_inducing=20, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            healthy.partial_fit(X, y, **kw)


# ---------------------------------------------------------------- the Opper-Archambeau baseline
def test_opper_archambeau_says_how_far_below_the_optimum_it_stopped():
    # Before: "did not converge in inner_max_iter=200 iterations; increase it or tol", with no
    # word of how far (750 points of banana, RBF(1, 1): 0.066 below the optimum, 2.2e-4 relative).
    X, y = _binary(80, seed=3)
    kw = dict(kernel=pygpfast.kernels.RBF(variance=4.0, lengthscale=1.0),
              optimize_hyperparameters=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp = pygpfast.VGPClassifier(**kw).fit(X, y)
    with pytest.warns(ConvergenceWarning) as rec:
        oa = pygpfast.VGPClassifier(method="opper-archambeau", inner_max_iter=4, **kw).fit(X, y)
    (message,) = [str(w.message) for w in rec]
    found = re.search(r"stopped at inner_max_iter=4 iterations (\S+) \((\S+) relative\) below "
                      r"the optimum of the bound at the fitted hyperparameters: (\S+) against "
                      r"(\S+) \(reached by the fixed-point method in \d+ iterations? from its "
                      r"result\); increase inner_max_iter, or use method='fixed-point'", message)
    assert found, message
    gap, relative, at, optimum = map(float, found.groups())
    np.testing.assert_allclose(at, oa.objective_, rtol=1e-9)
    np.testing.assert_allclose(optimum, fp.objective_, rtol=1e-7)
    np.testing.assert_allclose(gap, fp.objective_ - oa.objective_, rtol=5e-3)  # (3 digits)
    np.testing.assert_allclose(relative, gap / abs(fp.objective_), rtol=0.05)
    assert gap > 1e-3
    # run long enough, it reaches the optimum and says nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        done = pygpfast.VGPClassifier(method="opper-archambeau", inner_max_iter=5000, tol=1e-10,
                                      **kw).fit(X, y)
    np.testing.assert_allclose(done.objective_, fp.objective_, rtol=1e-6)
