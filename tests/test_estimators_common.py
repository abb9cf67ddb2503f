"""The behaviour every pygpfast estimator shares (GLOSSARY.md, "Estimators").

A new estimator joins by adding a line to ESTIMATORS: an id, a factory taking keyword arguments
(small, fast settings) and the task it solves. Each test below then runs on it: shapes, the
shared vocabulary, pickling, clone, determinism with random_state, thread-count invariance, a
callback that stops the fit, and clear errors for bad input.
"""

import inspect
import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone, is_classifier
from sklearn.exceptions import ConvergenceWarning, NotFittedError

import pygpfast
from pygpfast.kernels import Kernel

from blas_rounding import assert_same

#: (id, factory(**kw) -> estimator, task); task in "binary", "multiclass", "regression", "counts".
ESTIMATORS = [
    ("SVGPClassifier", lambda **kw: pygpfast.SVGPClassifier(n_inducing=8, max_iter=40, **kw), "binary"),
    ("SVGPClassifier-softmax", lambda **kw: pygpfast.SVGPClassifier(n_inducing=8, max_iter=40, **kw), "multiclass"),
    ("SVGPClassifier-robustmax", lambda **kw: pygpfast.SVGPClassifier(likelihood="robustmax", n_inducing=8, max_iter=40, **kw), "multiclass"),
    ("SVGPClassifier-mf", lambda **kw: pygpfast.SVGPClassifier(n_inducing=8, max_iter=40, method="mf", **kw), "binary"),
    ("SVGPClassifier-natgrad", lambda **kw: pygpfast.SVGPClassifier(n_inducing=8, max_iter=5, optimizer="natgrad", batch_size=32, **kw), "binary"),
    ("SVGPRegressor", lambda **kw: pygpfast.SVGPRegressor(n_inducing=8, max_iter=40, **kw), "regression"),
    ("SVGPRegressor-poisson", lambda **kw: pygpfast.SVGPRegressor(likelihood="poisson", n_inducing=8, max_iter=40, **kw), "counts"),
    ("VGPClassifier", lambda **kw: pygpfast.VGPClassifier(max_iter=15, **kw), "binary"),
    ("VGPClassifier-softmax", lambda **kw: pygpfast.VGPClassifier(likelihood="softmax", max_iter=10, **kw), "multiclass"),
    ("VGPClassifier-ordinal", lambda **kw: pygpfast.VGPClassifier(likelihood="ordinal", max_iter=10, **kw), "multiclass"),
    ("VGPPoissonRegressor", lambda **kw: pygpfast.VGPPoissonRegressor(max_iter=15, **kw), "counts"),
    ("IVMClassifier", lambda **kw: pygpfast.IVMClassifier(active_size=20, max_iter=6, **kw), "binary"),
    ("IVMClassifier-joint", lambda **kw: pygpfast.IVMClassifier(active_size=20, max_iter=6, **kw), "multiclass"),
    ("IVMClassifier-ovr", lambda **kw: pygpfast.IVMClassifier(active_size=20, max_iter=6, multi_class="ovr", **kw), "multiclass"),
    ("ISMOERegressor", lambda **kw: pygpfast.ISMOERegressor(n_experts=3, n_samples=4, max_iter=30, **kw), "regression"),
    ("ISMOERegressor-minibatch", lambda **kw: pygpfast.ISMOERegressor(n_experts=2, n_samples=4, batch_size=50, psis=True, max_iter=30, **kw), "regression"),
    ("ISMOEClassifier", lambda **kw: pygpfast.ISMOEClassifier(n_experts=2, n_samples=4, max_iter=30, **kw), "binary"),
    ("ISMOEClassifier-logit-random", lambda **kw: pygpfast.ISMOEClassifier(likelihood="logit", partition="random", n_experts=2, n_samples=4, max_iter=30, **kw), "binary"),
]
IDS = [case[0] for case in ESTIMATORS]


def _data(task, n=90, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 2))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    if task == "binary":
        y = np.where(f + 0.3 * rng.standard_normal(n) > 0, "yes", "no")
    elif task == "multiclass":
        y = np.digitize(f + 0.2 * rng.standard_normal(n), [-0.5, 0.5])
    elif task == "regression":
        y = f + 0.1 * rng.standard_normal(n)
    else:
        y = rng.poisson(np.exp(1.0 + 0.5 * f)).astype(float)
    return X, y


def _fit(make, task, **kw):
    X, y = _data(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (the settings are small on purpose)
        return make(random_state=0, **kw).fit(X, y), X, y


def _outputs(est, X):
    """Everything an estimator predicts at X, as arrays."""
    out = [np.asarray(est.predict(X), dtype=object if is_classifier(est) else float)]
    out += [np.asarray(a) for a in est.predict_latent(X)]
    if is_classifier(est):
        out.append(est.predict_proba(X))
    else:
        out += list(est.predict(X, return_std=True))
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


@pytest.fixture(params=ESTIMATORS, ids=IDS)
def case(request):
    return request.param


def test_constructor_takes_the_kernel_and_keywords(case):
    _, make, _ = case
    params = list(inspect.signature(type(make()).__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["kernel"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[1:])
    assert params[0].default is None  # (None: a default kernel made from the data)


def test_fit_and_predict_shapes(case):
    _, make, task = case
    est, X, y = _fit(make, task)
    T = 7
    assert est.predict(X[:T]).shape == (T,)
    if is_classifier(est):
        proba = est.predict_proba(X[:T])
        assert proba.shape == (T, len(np.unique(y)))
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
        assert set(est.predict(X)) <= set(est.classes_)
        np.testing.assert_array_equal(est.classes_, np.unique(y))
        log_proba = est.predict_log_proba(X[:T])
        np.testing.assert_allclose(np.exp(log_proba), proba, rtol=1e-9, atol=1e-12)
    else:
        mean, std = est.predict(X[:T], return_std=True)
        assert mean.shape == std.shape == (T,) and np.all(std > 0)
    assert np.isfinite(est.score(X, y))
    assert est.n_features_in_ == X.shape[1]


def test_the_shared_vocabulary(case):
    _, make, task = case
    est, X, _ = _fit(make, task)
    # objective_: the value the fit maximised, a finite float; history_: one entry per iteration
    assert isinstance(est.objective_, float) and np.isfinite(est.objective_)
    # log_prior_: the priors' share of objective_ (priors="default": the MAP point), a float;
    # priors is "default" by default (IS-MOE: its experts are MAP fits, but its objective_, the
    # mean importance weight, is made of evidences, so the priors' share is 0)
    assert isinstance(est.log_prior_, float) and np.isfinite(est.log_prior_)
    assert est.priors == "default"
    if "ISMOE" in type(est).__name__:
        assert est.log_prior_ == 0.0
    elif not isinstance(est.kernel_, list):
        assert est.log_prior_ == est.kernel_.log_prior() + (
            est.likelihood_.log_prior() if hasattr(est, "likelihood_") else 0.0)
    assert isinstance(est.history_, np.ndarray) and est.history_.dtype == np.float64
    assert est.history_.ndim == 1 and est.history_.size == est.n_iter_ >= 1
    # predict_latent: [T] each for one latent function, [T, L] for L
    mean, var = est.predict_latent(X[:5])
    assert mean.shape == var.shape and mean.shape[0] == 5 and mean.ndim in (1, 2)
    assert mean.ndim == 1 or mean.shape[1] >= 2
    assert np.all(var >= 0)
    # kernel_: the fitted kernel, never the kernel parameter itself
    assert isinstance(est.kernel_, Kernel) and est.kernel_ is not est.kernel
    assert est.restart_ is None or set(est.restart_) >= {"reason", "kept", "objectives"}


def test_a_given_kernel_is_not_changed_by_the_fit(case):
    _, make, task = case
    kernel = pygpfast.kernels.RBF(variance=1.0, lengthscale=[1.0, 1.0])
    est, _, _ = _fit(make, task, kernel=kernel)
    assert est.kernel is kernel
    np.testing.assert_array_equal(kernel.params, [1.0, 1.0, 1.0])
    assert est.kernel_ is not kernel


def test_pickle_round_trip_predicts_identically(case):
    _, make, task = case
    est, X, _ = _fit(make, task)
    _assert_same(_outputs(pickle.loads(pickle.dumps(est)), X), _outputs(est, X))


def test_clone_is_unfitted_with_the_same_parameters(case):
    _, make, task = case
    est, X, _ = _fit(make, task)
    twin = clone(est)
    assert twin.get_params() == est.get_params()
    with pytest.raises(NotFittedError):
        twin.predict(X[:3])


def test_random_state_makes_a_fit_reproducible(case):
    _, make, task = case
    a, X, _ = _fit(make, task)
    b, _, _ = _fit(make, task)
    _assert_same(_outputs(a, X), _outputs(b, X))
    assert a.objective_ == b.objective_
    np.testing.assert_array_equal(a.history_, b.history_)


def test_the_thread_count_changes_nothing(case, restore_threads):
    # (At the dependency floors, OpenBLAS 0.3.21, whose thread count the core cannot set, the
    # IS-MOE probit experts' searches ended 1.3e-4 apart in the objective, a latent mean far
    # from the data at 8.64 on one thread and 8.96 on two, until IS-MOE's chunks held the BLAS
    # to one thread through threadpoolctl there: _threads.one_blas_thread(process_wide=True).)
    _, make, task = case
    fits = []
    for n in (1, 2):
        pygpfast.set_num_threads(n)
        est, X, _ = _fit(make, task)
        fits.append((est.objective_, _outputs(est, X)))
    # (to rounding: the mean-field SVGP and the joint IVM's gradients sum in a thread-dependent
    # order; the families' own tests check bitwise equality where it holds. The same
    # tolerances hold at the dependency floors)
    assert_same(fits[0][0], fits[1][0], rtol=1e-8, bitwise=False)
    for u, v in zip(fits[0][1], fits[1][1]):
        assert_same(u, v, rtol=1e-6, bitwise=False)


def test_a_callback_that_returns_true_stops_the_fit(case):
    _, make, task = case
    seen = []

    def stop_at_two(est, iteration, objective):
        seen.append((iteration, objective, est.history_.copy()))
        return iteration >= 2

    est, X, _ = _fit(make, task, callback=stop_at_two)
    assert [s[0] for s in seen] == [1, 2]
    assert est.n_iter_ == 2 and est.history_.size == 2
    np.testing.assert_array_equal(est.history_, [s[1] for s in seen])
    assert seen[1][2].size == 2  # (history_ is current in the callback)
    assert est.predict(X[:3]).shape == (3,)


def test_verbose_prints_the_objective_per_iteration(case, capsys):
    _, make, task = case
    est, _, _ = _fit(make, task, verbose=1)
    out = capsys.readouterr().out
    assert f"[{type(est).__name__}] iter     1" in out


@pytest.mark.parametrize("bad, match", [
    ("nan", "NaN"),
    ("inf", "infinity"),
    ("length", "inconsistent|length"),
    ("empty", "0 sample"),
    ("1d", "2D|2-D|1-D"),
])
def test_bad_training_input_is_a_clear_error(case, bad, match):
    _, make, task = case
    X, y = _data(task, n=30)
    if bad == "nan":
        X[3, 1] = np.nan
    elif bad == "inf":
        X[3, 1] = np.inf
    elif bad == "length":
        y = y[:-1]
    elif bad == "empty":
        X, y = X[:0], y[:0]
    else:
        X = X[:, 0]
    with pytest.raises(ValueError, match=match):
        make(random_state=0).fit(X, y)


def test_prediction_input_is_checked(case):
    _, make, task = case
    est, X, _ = _fit(make, task)
    with pytest.raises(ValueError, match="features"):
        est.predict(np.ones((3, X.shape[1] + 1)))
    bad = X[:3].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.predict(bad)


def test_bad_parameters_name_the_parameter(case):
    _, make, task = case
    X, y = _data(task, n=30)
    for name, value in (("jitter", -1.0), ("tol", -1.0), ("verbose", -1), ("callback", 3),
                        ("kernel", "rbf"), ("max_iter", 0)):
        if name not in make().get_params():  # (IVMClassifier has no jitter)
            continue
        with pytest.raises(ValueError, match=f"{name} must be"):
            make(random_state=0).set_params(**{name: value}).fit(X, y)
