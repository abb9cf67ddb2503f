"""The estimators inside the scikit-learn ecosystem: model selection with joblib's process and
thread backends, meta-estimators, metrics and scorers, fitted-state checks, persistence."""

import os
import subprocess
import sys
import threading
import time
import warnings

import joblib
import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import get_scorer, roc_auc_score
from sklearn.model_selection import GridSearchCV, KFold, cross_val_predict
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_info

import pygpfast._core
from blas_rounding import EXACT
import pygpfast.svgp
import pygpfast._base._start
from pygpfast import SVGPClassifier, SVGPRegressor, VGPClassifier, VGPPoissonRegressor
from pygpfast.kernels import RBF


@pytest.fixture(autouse=True)
def _quiet_short_fits():
    # (the fits here stop at a few iterations on purpose)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    return X, (X[:, 0] > 0).astype(int), X[:, 0] + 0.1 * rng.standard_normal(n), rng.poisson(
        2.0, n)


# (estimator, which target of _data)
ESTIMATORS = [
    (lambda **kw: SVGPClassifier(n_inducing=5, max_iter=5, random_state=0, **kw), 1),
    (lambda **kw: SVGPRegressor(n_inducing=5, max_iter=5, random_state=0, **kw), 2),
    (lambda **kw: VGPClassifier(max_iter=2, **kw), 1),
    (lambda **kw: VGPPoissonRegressor(max_iter=2, **kw), 3),
]
IDS = ["SVGPClassifier", "SVGPRegressor", "VGPClassifier", "VGPPoissonRegressor"]


def test_threaded_fits_leave_the_blas_thread_count(monkeypatch):
    # scikit-learn's KMeans (the inducing points' start) limits the BLAS to one thread while it
    # runs, reading the process-wide count on entry and setting it back on exit; two such
    # limits overlapping in threads restored in the wrong order, and SVGP fits in threads
    # (GridSearchCV with the threading backend) left numpy's and scipy's BLAS on one thread for
    # the rest of the process. pygpfast's k-means runs one at a time. (The core's own scopes:
    # tests/test_threads.py.)
    active, peak, guard = [0], [0], threading.Lock()

    class Tracked(KMeans):
        def fit(self, X, y=None, sample_weight=None):
            with guard:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.1)  # (long enough for the other thread to arrive)
            try:
                return super().fit(X, y, sample_weight)
            finally:
                with guard:
                    active[0] -= 1

    monkeypatch.setattr(pygpfast._base._start, "KMeans", Tracked)
    X, y, _, _ = _data(200)

    def blas_threads():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas_threads()
    fits = [threading.Thread(target=SVGPClassifier(n_inducing=20, max_iter=2, random_state=i).fit,
                             args=(X, y)) for i in range(4)]
    for t in fits:
        t.start()
    for t in fits:
        t.join()
    assert peak[0] == 1
    assert blas_threads() == before


def test_threading_backend_matches_serial_fits():
    # Bitwise for SVGP where the core can set the BLAS's thread count (at M < 256 its BLAS calls
    # then run on one thread; where it cannot, as with scipy 1.11's OpenBLAS, the BLAS splits
    # calls by how busy its pool is, and the rounding follows: the 3 to 10 iterations here carried
    # it to 3.8e-8 of one prediction in about one run of ten). VGP's prediction calls the BLAS
    # on its own count, which is process-wide: a one-thread scope of the fit in the other
    # thread changes it, and the rounding with it.
    X, y, yr, _ = _data(200)
    cv = KFold(3, shuffle=True, random_state=0)
    svgp_rtol = 0 if pygpfast._core.blas.thread_control else 1e-6
    for est, target, method, rtol in (
            (SVGPClassifier(n_inducing=10, max_iter=10, random_state=0), y, "predict_proba",
             svgp_rtol),
            (SVGPRegressor(n_inducing=10, max_iter=3, optimizer="natgrad", random_state=0), yr,
             "predict", svgp_rtol),
            (VGPClassifier(max_iter=3), y, "predict_proba", 1e-12)):
        serial = cross_val_predict(est, X, target, cv=cv, method=method)
        with joblib.parallel_config(backend="threading"):
            threaded = cross_val_predict(est, X, target, cv=cv, method=method, n_jobs=2)
        np.testing.assert_allclose(threaded, serial, rtol=rtol, atol=0)


@pytest.mark.parametrize("make, target", ESTIMATORS, ids=IDS)
def test_read_only_memmap_inputs(make, target, tmp_path):
    # (what joblib's process backends pass for arrays over max_nbytes)
    data = _data(100)
    X, y = data[0], data[target].astype(np.float64)
    ro = []
    for name, a in (("X", X), ("y", y)):
        joblib.dump(a, tmp_path / name)
        ro.append(joblib.load(tmp_path / name, mmap_mode="r"))
    assert isinstance(ro[0], np.memmap) and not ro[0].flags.writeable
    est = make().fit(*ro)
    np.testing.assert_array_equal(est.predict(ro[0]), make().fit(X, y).predict(X))
    if hasattr(est, "partial_fit"):
        est.partial_fit(*ro)


def test_process_backend_grid_search_and_a_model_loaded_in_a_fresh_process(tmp_path):
    X, y, yr, counts = _data(120)
    with joblib.parallel_config(backend="loky", max_nbytes=1):  # (every array as a memmap)
        search = GridSearchCV(SVGPClassifier(RBF(), n_inducing=5, max_iter=5, random_state=0),
                              {"kernel__lengthscale": [0.5, 2.0]}, cv=2, n_jobs=2).fit(X, y)
    serial = GridSearchCV(SVGPClassifier(RBF(), n_inducing=5, max_iter=5, random_state=0),
                          {"kernel__lengthscale": [0.5, 2.0]}, cv=2).fit(X, y)
    np.testing.assert_array_equal(search.cv_results_["mean_test_score"],
                                  serial.cv_results_["mean_test_score"])
    models = [search.best_estimator_,
              SVGPRegressor(n_inducing=5, max_iter=5, random_state=0).fit(X, yr),
              VGPClassifier(likelihood="ordinal", classes=["b", "a"], max_iter=2).fit(
                  X, np.where(y == 1, "a", "b")),
              VGPPoissonRegressor(max_iter=2).fit(X, counts)]
    np.save(tmp_path / "X.npy", X)
    for i, model in enumerate(models):
        joblib.dump(model, tmp_path / f"{i}.joblib", compress=3)
        np.save(tmp_path / f"{i}.npy", model.predict(X))
    code = (
        "import sys, numpy as np, joblib\n"
        "d = sys.argv[1]\n"
        "X = np.load(d + '/X.npy')\n"
        f"for i in range({len(models)}):\n"
        "    m = joblib.load(f'{d}/{i}.joblib')\n"
        "    p, ref = m.predict(X), np.load(f'{d}/{i}.npy', allow_pickle=True)\n"
        "    same = (np.array_equal(p, ref) if exact or p.dtype.kind != 'f'\n"
        "            else np.allclose(p, ref, rtol=1e-9, atol=0))\n"
        "    assert same, i\n"
    )
    # (bitwise where the BLAS can be held to one thread; at the floors' OpenBLAS 0.3.21 the
    # predictive factors recomputed after loading round with the fresh process's BLAS threads)
    code = f"exact = {EXACT}\n" + code
    # (the same pygpfast as this session, installed or built in place: from the checkout's
    # root, `python -c` would import the source tree, which has no compiled core when installed)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(pygpfast.__file__)))
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr



@pytest.mark.parametrize("make, target", ESTIMATORS, ids=IDS)
def test_check_is_fitted_after_a_failed_fit(make, target):
    # A failed fit removed the posterior (predict: NotFittedError) but left other fitted
    # attributes (classes_, n_features_in_, history_, ...), which scikit-learn's check_is_fitted
    # (meta-estimators, FrozenEstimator, the HTML repr) took for a fitted estimator.
    data = _data()
    X, y = data[0], data[target]

    def broken(est, iteration, value):
        raise RuntimeError("stop")

    est = make()
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    check_is_fitted(est.fit(X, y))
    with pytest.raises(RuntimeError, match="stop"):
        est.set_params(callback=broken).fit(X, y)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    with pytest.raises(NotFittedError):
        est.predict(X)


@pytest.mark.parametrize("make, target", ESTIMATORS, ids=IDS)
def test_kernel_parameters_need_a_kernel(make, target):
    # set_params(kernel__lengthscale=...) with the default kernel=None (GridSearchCV over a
    # kernel's parameters) raised AttributeError: 'NoneType' object has no attribute 'set_params'.
    data = _data()
    X, y = data[0], data[target]
    with pytest.raises(ValueError, match="'kernel__lengthscale'.*kernel=None.*RBF"):
        make().set_params(kernel__lengthscale=2.0)
    with pytest.raises(ValueError, match="kernel=None"):
        GridSearchCV(make(), {"kernel__lengthscale": [1.0, 2.0]}, cv=2).fit(X, y)
    # with a kernel (given before, or in the same call) they are set and searched
    assert make().set_params(kernel=RBF(), kernel__lengthscale=2.0).kernel.lengthscale == 2.0
    search = GridSearchCV(make(kernel=RBF()), {"kernel__lengthscale": [0.5, 2.0]}, cv=2).fit(X, y)
    assert search.best_estimator_.kernel.lengthscale in (0.5, 2.0)
    with pytest.raises(ValueError, match="kernel=None"):
        make(kernel=RBF()).set_params(kernel=None, kernel__variance=1.0)


@pytest.mark.parametrize("Estimator", [SVGPClassifier, VGPClassifier])
def test_object_labels_keep_their_dtype(Estimator):
    # SVGPClassifier turned object labels (a pandas Series of strings) into a fixed-width string
    # classes_ and predictions; scikit-learn's classifiers and VGPClassifier keep np.unique's.
    pd = pytest.importorskip("pandas")
    X, y, _, _ = _data()
    labels = pd.Series(np.where(y == 1, "yes", "no"), dtype=object)
    kw = dict(n_inducing=5, max_iter=5) if Estimator is SVGPClassifier else dict(max_iter=2)
    est = Estimator(**kw).fit(X, labels)
    ref = LogisticRegression().fit(X, labels)
    assert est.classes_.dtype == ref.classes_.dtype == object
    assert list(est.classes_) == ["no", "yes"]
    assert est.predict(X).dtype == ref.predict(X).dtype


LEVELS = np.array(["low", "mid", "high"])  # an ordinal scale whose sorted order is not its own


def test_vgp_classes_keeps_classes_sorted_for_scikit_learns_scorers():
    # classes= (an ordinal scale, or any order) gave classes_ and the columns of predict_proba
    # in that order; scikit-learn's metrics and scorers take the columns to be sorted labels,
    # and silently scored the wrong columns: roc_auc 0.0 for a perfect model with
    # classes=["b", "a"], neg_log_loss 5.3 for an ordinal model whose log loss is 0.34.
    X, y, _, _ = _data(120)
    labels = np.where(y == 1, "a", "b")
    clf = VGPClassifier(classes=["b", "a"], max_iter=5).fit(X, labels)
    assert list(clf.class_order_) == ["b", "a"] and list(clf.classes_) == ["a", "b"]
    assert get_scorer("roc_auc")(clf, X, labels) == pytest.approx(
        roc_auc_score(labels == "b", clf.predict_proba(X)[:, 1])) == pytest.approx(1.0)

    rng = np.random.default_rng(1)
    levels = LEVELS[np.digitize(X[:, 0] + 0.3 * rng.standard_normal(120), [-0.5, 0.5])]
    clf = VGPClassifier(likelihood="ordinal", classes=list(LEVELS), max_iter=5).fit(X, levels)
    assert list(clf.class_order_) == list(LEVELS) and list(clf.classes_) == sorted(LEVELS)
    proba = clf.predict_proba(X)
    own = -np.mean(np.log(proba[np.arange(120), np.searchsorted(clf.classes_, levels)]))
    assert -get_scorer("neg_log_loss")(clf, X, levels) == pytest.approx(own)
    assert own < 0.5
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), proba, rtol=1e-12)
    assert np.array_equal(clf.predict(X), clf.classes_[np.argmax(proba, axis=1)])
