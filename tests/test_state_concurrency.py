"""State and concurrency (issue 27): pickles that record the pygpfast version and state format
that wrote them (loaded where the format is this one, refused with a clear error otherwise);
pickling of unfitted estimators and of the building blocks; threads predicting from one model
at once, and fits in two threads at once, give the one-thread answers; predictions of a fitted
model do not depend on the thread count; a RandomState instance reproduces a fit; a streaming
fit from np.memmap under a memory limit smaller than the file; IS-MOE on Dask with a worker
killed mid-fit and with the client's connection lost mid-fit.

The bitwise pickle round trip of every fitted estimator, the reproducibility of a fit with an
integer random_state and fits on 1 and 2 threads are in the shared behaviour suite
(tests/test_estimators_common.py).
"""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning, NotFittedError

import pygpfast
from pygpfast import kernels, likelihoods, priors
from pygpfast._base import _estimator
from pygpfast.cvi import LocalBound
from pygpfast.piecewise import llp_bound
from pygpfast.svgp import SVGP

from blas_rounding import assert_same

quiet = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

#: One estimator of each family (small settings), with its task.
FAMILIES = {
    "SVGPClassifier-softmax": (lambda: pygpfast.SVGPClassifier(n_inducing=10, max_iter=30,
                                                               random_state=0), "multiclass"),
    "VGPClassifier": (lambda: pygpfast.VGPClassifier(max_iter=10, random_state=0), "binary"),
    "IVMClassifier-joint": (lambda: pygpfast.IVMClassifier(active_size=25, max_iter=5,
                                                           random_state=0), "multiclass"),
    "ISMOERegressor": (lambda: pygpfast.ISMOERegressor(n_experts=3, n_samples=4, max_iter=30,
                                                       random_state=0), "regression"),
}


def _data(task, n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 2))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    if task == "binary":
        return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, "yes", "no")
    if task == "multiclass":
        return X, np.digitize(f + 0.2 * rng.standard_normal(n), [-0.5, 0.5])
    return X, f + 0.1 * rng.standard_normal(n)


def _quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (the settings are small on purpose)
        return est.fit(X, y)


def _outputs(est, X):
    """Everything an estimator predicts at X."""
    out = list(est.predict_latent(X))
    if is_classifier(est):
        out += [est.predict_proba(X), est.predict(X)]
    else:
        out += list(est.predict(X, return_std=True))
    return out


def _assert_outputs_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert_same(u, v)


@pytest.fixture(scope="module")
def fitted():
    """{name: (fitted estimator, test inputs [300, 2])} for FAMILIES."""
    out = {}
    for name, (make, task) in FAMILIES.items():
        X, y = _data(task)
        Xt = np.random.default_rng(1).uniform(-2.5, 2.5, (300, 2))
        out[name] = (_quiet_fit(make(), X, y), Xt)
    return out


# ---------------------------------------------------------------- pickles and versions
@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_records_the_version_and_the_state_format(fitted, name):
    est, _ = fitted[name]
    state = est.__getstate__()
    assert state["_pygpfast_version"] == pygpfast.__version__
    assert state["_pygpfast_state_format"] == _estimator.STATE_FORMAT
    loaded = pickle.loads(pickle.dumps(est))
    # (the fields describe the pickle, not the model: loading drops them)
    assert "_pygpfast_version" not in vars(loaded) and "_pygpfast_state_format" not in vars(loaded)
    assert set(vars(loaded)) == set(vars(est))


def _pickled_by(monkeypatch, est, *, version=None, state_format=None, unversioned=False):
    """The bytes another pygpfast would write for `est`: another version string, another state
    format, or (`unversioned`) a pygpfast from before versioned pickles."""
    with monkeypatch.context() as m:
        if version is not None:
            m.setattr(_estimator, "__version__", version)
        if state_format is not None:
            m.setattr(_estimator, "STATE_FORMAT", state_format)
        if unversioned:
            m.setattr(_estimator.GPEstimator, "__getstate__",
                      lambda self: dict(vars(self)))
        return pickle.dumps(est)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_of_another_version_with_this_format_loads_silently(fitted, monkeypatch, name):
    est, Xt = fitted[name]
    data = _pickled_by(monkeypatch, est, version="0.0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (loads silently: no InconsistentVersionWarning)
        loaded = pickle.loads(data)
    for u, v in zip(_outputs(loaded, Xt), _outputs(est, Xt)):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_of_another_state_format_is_refused_naming_both_versions(fitted, monkeypatch,
                                                                          name):
    est, _ = fitted[name]
    here, fmt = pygpfast.__version__, _estimator.STATE_FORMAT
    cls = type(est).__name__
    data = _pickled_by(monkeypatch, est, version="9.0.0", state_format=fmt + 1)
    with pytest.raises(ValueError) as e:
        pickle.loads(data)
    assert str(e.value) == (
        f"Cannot load this {cls}: it was pickled by pygpfast 9.0.0 (state format {fmt + 1}), "
        f"and pygpfast {here} reads state format {fmt} only. Fit it again with pygpfast "
        f"{here}, or load it with pygpfast 9.0.0.")
    data = _pickled_by(monkeypatch, est, unversioned=True)
    with pytest.raises(ValueError, match=(
            f"pickled by a pygpfast that did not record its version \\(no state format\\), and "
            f"pygpfast {here} reads state format {fmt} only.*load it with the pygpfast that "
            "wrote it")):
        pickle.loads(data)


def test_unfitted_estimators_pickle_unfitted_with_their_parameters():
    kernel = kernels.RBF(lengthscale=[0.5, 2.0], priors={"variance": priors.LogNormal(0.0, 1.0)})
    classes = [getattr(pygpfast, n) for n in pygpfast.__all__
               if isinstance(getattr(pygpfast, n), type)
               and issubclass(getattr(pygpfast, n), _estimator.GPEstimator)]
    assert len(classes) == 7
    for cls in classes:
        est = cls(kernel, random_state=np.random.RandomState(3))
        loaded = pickle.loads(pickle.dumps(est))
        assert type(loaded) is cls
        params, loaded_params = est.get_params(deep=False), loaded.get_params(deep=False)
        rs, loaded_rs = params.pop("random_state"), loaded_params.pop("random_state")
        assert repr(loaded_params) == repr(params)
        assert loaded.kernel is not kernel and repr(loaded.kernel) == repr(kernel)
        np.testing.assert_array_equal(loaded_rs.randint(1 << 30, size=4),
                                      rs.randint(1 << 30, size=4))
        with pytest.raises(NotFittedError):
            loaded.predict(np.zeros((2, 2)))


def test_building_blocks_pickle_and_compute_the_same():
    rng = np.random.default_rng(2)
    X, X2 = rng.normal(size=(7, 2)), rng.normal(size=(5, 2))
    prior = priors.LogNormal(0.3, 0.7)
    ks = [kernels.RBF(2.0, [0.5, 1.5], priors={"lengthscale": prior}), kernels.Matern12(),
          kernels.Matern32(lengthscale=0.7), kernels.Matern52(1.3, [1.0, 2.0]),
          kernels.Linear(0.5), kernels.Constant(2.0), kernels.White(0.1),
          kernels.RBF() + kernels.White(0.01), kernels.Matern32() * kernels.Linear()]
    for k in ks:
        loaded = pickle.loads(pickle.dumps(k))
        assert repr(loaded) == repr(k)
        np.testing.assert_array_equal(loaded(X), k(X))
        np.testing.assert_array_equal(loaded(X, X2), k(X, X2))
        assert loaded.log_prior() == k.log_prior()
    assert pickle.loads(pickle.dumps(prior)) == prior
    mu, var = rng.normal(size=6), rng.uniform(0.1, 2.0, 6)
    liks = [(likelihoods.Gaussian(0.3, priors={"variance": prior}), rng.normal(size=6)),
            (likelihoods.Bernoulli("logit"), rng.integers(0, 2, 6).astype(float)),
            (likelihoods.Bernoulli("probit"), rng.integers(0, 2, 6).astype(float)),
            (likelihoods.Poisson(), rng.poisson(2.0, 6).astype(float))]
    for lik, y in liks:
        loaded = pickle.loads(pickle.dumps(lik))
        assert repr(loaded) == repr(lik) and loaded.log_prior() == lik.log_prior()
        for u, v in zip(loaded.predict_mean_and_var(mu, var), lik.predict_mean_and_var(mu, var)):
            np.testing.assert_array_equal(u, v)
        for u, v in zip(loaded.variational_expectations(y, mu, var),
                        lik.variational_expectations(y, mu, var)):
            np.testing.assert_array_equal(u, v)
    softmax = likelihoods.Softmax(3)
    M3, V3 = rng.normal(size=(6, 3)), rng.uniform(0.1, 1.0, (6, 3))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(softmax)).predict_proba(M3, V3),
                                  softmax.predict_proba(M3, V3))
    # the SVGP model object: its ELBO with gradients and its predictions
    M = 4
    model = SVGP(ks[0], likelihoods.Bernoulli("logit"), rng.normal(size=(M, 2)),
                 q_mu=rng.normal(size=M), q_sqrt=np.tril(rng.normal(size=(M, M))) + 2 * np.eye(M),
                 prior_mean=[0.2])
    loaded = pickle.loads(pickle.dumps(model))
    yb = liks[1][1]
    (e1, g1), (e2, g2) = (m.elbo(X[:6], yb, with_grad=True) for m in (loaded, model))
    assert e1 == e2 and g1.keys() == g2.keys()
    for key in g1:
        np.testing.assert_array_equal(g1[key], g2[key])
    for u, v in zip(loaded.predict_f(X2), model.predict_f(X2)):
        np.testing.assert_array_equal(u, v)
    # concave-VI local bounds and the piecewise bound under them
    for bound in (LocalBound("logit"), LocalBound("poisson"), LocalBound("softmax", n_classes=3)):
        loaded = pickle.loads(pickle.dumps(bound))
        assert repr(loaded) == repr(bound)
        y = np.zeros(6) if bound.n_latent == 1 else np.arange(6) % 3.0
        m = rng.normal(size=(bound.n_latent, 6))
        v = rng.uniform(0.1, 1.0, (bound.n_latent, 6))
        for u, w in zip(loaded(y, m, v), bound(y, m, v)):
            np.testing.assert_array_equal(u, w)
    piece = llp_bound(10, "linear")
    x = np.linspace(-30, 30, 101)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(piece))(x), piece(x))
