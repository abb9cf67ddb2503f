"""Bad input for every estimator of the shared behaviour suite and for the public functions
(issue 27, "Bad input"): each case ends in a clear ValueError or TypeError whose message names
the argument (and says what to change), or in a documented graceful behaviour that the case
checks; never in another exception, a hang (a watchdog ends the run with a traceback) or a
non-finite prediction.

Every outcome is recorded; the last test of the module prints the tally (cases x targets,
clean errors, graceful behaviours) and fails on anything else. Property-based tests
(hypothesis) then throw generated malformed and extreme inputs at every estimator.
"""

import faulthandler
import functools
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning

import pygpfast
from pygpfast import _core
from pygpfast import cvi, kernels, likelihoods, linalg, svgp

from test_estimators_common import ESTIMATORS, IDS, _data

ERROR, GRACEFUL = "clean error", "graceful"
#: (case, target) -> ERROR or GRACEFUL, for every case run in this session.
OUTCOMES = {}
#: A case that runs longer is a hang: faulthandler dumps the stacks and ends the process.
HANG_LIMIT_S = 300
N = 30
MAKE = {name: (make, task) for name, make, task in ESTIMATORS}


def _watched(call):
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True, file=sys.__stderr__)
    try:
        return call()
    finally:
        faulthandler.cancel_dump_traceback_later()


def _clean_error(call, match, types=(ValueError, TypeError)):
    """ERROR when call() raises one of `types` with a message matching `match`; any other
    exception propagates and fails the case."""
    with pytest.raises(types, match=match):
        _watched(call)
    return ERROR


def _fit(make, X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (small settings on purpose)
        return _watched(lambda: make(random_state=0, **kw).fit(X, y))


def _outputs(est, X):
    """Every prediction at X, checked finite and of the right shape: [T] labels, a mean and
    standard deviation, latent mean and variance [T] or [T, L], probabilities [T, C]."""
    T = len(X)
    mean, var = est.predict_latent(X)
    assert mean.shape == var.shape and mean.shape[0] == T
    out = [mean, var]
    if is_classifier(est):
        labels = est.predict(X)
        assert labels.shape == (T,) and set(labels) <= set(est.classes_)
        proba = est.predict_proba(X)
        assert proba.shape == (T, len(est.classes_))
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-9)
        out += [proba, est.predict_log_proba(X)]
    else:
        out += list(est.predict(X, return_std=True))
        assert out[-1].shape == out[-2].shape == (T,)
    for a in out:
        assert np.all(np.isfinite(a)), "a non-finite prediction"
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def _codes(y):
    return np.unique(y, return_inverse=True)[1].reshape(-1)


@functools.lru_cache(maxsize=None)
def _baseline(name):
    """(fitted estimator, X, y, its outputs at X) on the suite's data, n = 30."""
    make, task = MAKE[name]
    X, y = _data(task, n=N)
    est = _fit(make, X, y)
    return est, X, y, _outputs(est, X)


def _graceful_as_baseline(name, X, y, X_test=None, **kw):
    """GRACEFUL when a fit on (X, y) predicts bitwise what the baseline fit predicts."""
    make, _ = MAKE[name]
    _, X0, _, expected = _baseline(name)
    est = _fit(make, X, y, **kw)
    _assert_same(_outputs(est, X0 if X_test is None else X_test), expected)
    return GRACEFUL


def _graceful_finite(name, X, y, X_test=None, **kw):
    make, _ = MAKE[name]
    est = _fit(make, X, y, **kw)
    _outputs(est, X if X_test is None else X_test)
    return est


# ---------------------------------------------------------------------------- estimators: fit
def _nan_y(y, value):
    y = (_codes(y) if y.dtype.kind not in "f" else y).astype(float)
    y[3] = value
    return y


def _set(X, value):
    X = X.copy()
    X[3, 1] = value
    return X


#: name -> (tasks it applies to (None: all), (X, y) -> (X, y), message pattern, exception types)
FIT_ERRORS = {
    "NaN in X": (None, lambda X, y: (_set(X, np.nan), y), "NaN", ValueError),
    "inf in X": (None, lambda X, y: (_set(X, np.inf), y), "infinity", ValueError),
    "NaN in y": (None, lambda X, y: (X, _nan_y(y, np.nan)), "y contains NaN", ValueError),
    "inf in y": (None, lambda X, y: (X, _nan_y(y, np.inf)), "y contains infinity", ValueError),
    "X 1-D": (None, lambda X, y: (X[:, 0], y), "Expected 2D array, got 1D", ValueError),
    "X 3-D": (None, lambda X, y: (X[:, :, None], y), "dim 3", ValueError),
    "X None": (None, lambda X, y: (None, y), "X must be an array of real numbers", ValueError),
    "y 2-D": (None, lambda X, y: (X, np.column_stack([y, y])), "y should be a 1d array", ValueError),
    "length mismatch": (None, lambda X, y: (X, y[:-1]), "inconsistent numbers of samples", ValueError),
    "empty data": (None, lambda X, y: (X[:0], y[:0]), "0 sample", ValueError),
    "no features": (None, lambda X, y: (X[:, :0], y), "0 feature", ValueError),
    "sparse X": (None, lambda X, y: (sp.csr_matrix(X), y), "Sparse data was passed for X.*toarray",
                 TypeError),
    "strings in X": (None, lambda X, y: (np.where(X > 0, "up", "down"), y),
                     "X must be an array of real numbers", ValueError),
    "complex X": (None, lambda X, y: (X + 1j, y), "X must be an array of real numbers", ValueError),
    "ragged rows": (None, lambda X, y: ([list(r) for r in X[:-1]] + [[1.0]], y),
                    "X must be an array of real numbers", ValueError),
    "a single class": (("binary", "multiclass"), lambda X, y: (X, np.full(len(y), y[0])),
                       "(1 class|one class)", ValueError),
    "labels of mixed types": (("binary", "multiclass"),
                              lambda X, y: (X, np.array(["a", 1, 2.5], dtype=object)[_codes(y)]),
                              "label type", ValueError),
    "continuous labels": (("binary", "multiclass"), lambda X, y: (X, np.linspace(0, 1, len(y))),
                          "label type: continuous", ValueError),
    "strings as targets": (("regression", "counts"), lambda X, y: (X, np.full(len(y), "many")),
                           "y must be a numeric", ValueError),
    "a negative count": (("counts",), lambda X, y: (X, np.where(np.arange(len(y)) == 4, -1.0, y)),
                         r"y\[4\] = -1 .*>= 0", ValueError),
    "a count above 2**53": (("counts",), lambda X, y: (X, y * 1e200 + 1.0), r"above 2\*\*53",
                            ValueError),
}

#: name -> (kernel given to the estimator, message pattern)
KERNEL_ERRORS = {
    "lengthscales for 3 features": (lambda: kernels.RBF(1.0, [1.0, 1.0, 1.0]),
                                    "lengthscale has 3 entries but X has 2 features"),
    "kernel variance 1e300": (lambda: kernels.RBF(1e300, 1.0), "kernel=.*prior variance"),
    "kernel variance 1e-300": (lambda: kernels.RBF(1e-300, 1.0), "kernel=.*prior variance"),
    "kernel lengthscale 1e300": (lambda: kernels.Matern32(1.0, 1e300), "kernel=.*lengthscale"),
    "kernel lengthscale 1e-300": (lambda: kernels.RBF(1.0, [1e-300, 1.0]), "kernel=.*lengthscale"),
    "kernel variance 1e300 in a sum": (lambda: kernels.RBF() + kernels.White(1e300),
                                       "kernel=.*prior variance"),
}


def _applies(tasks, task):
    return tasks is None or task in tasks


FIT_ERROR_CASES = [(case, name) for case, (tasks, *_) in FIT_ERRORS.items()
                   for name, _, task in ESTIMATORS if _applies(tasks, task)]


@pytest.mark.parametrize("case, name", FIT_ERROR_CASES)
def test_bad_training_data_is_a_clean_error(case, name):
    OUTCOMES[case, name] = _fit_error(case, name)


def _fit_error(case, name):
    make, task = MAKE[name]
    _, transform, match, types = FIT_ERRORS[case]
    X, y = transform(*_data(task, n=N))
    return _clean_error(lambda: make(random_state=0).fit(X, y), match, types)


@pytest.mark.parametrize("case", list(KERNEL_ERRORS))
@pytest.mark.parametrize("name", IDS)
def test_absurd_kernels_given_by_the_user_are_a_clean_error(case, name):
    OUTCOMES[case, name] = _kernel_error(case, name)


def _kernel_error(case, name):
    make, task = MAKE[name]
    kernel, match = KERNEL_ERRORS[case]
    X, y = _data(task, n=N)
    return _clean_error(lambda: make(random_state=0, kernel=kernel()).fit(X, y), match)


def test_the_kernel_scale_check_accepts_the_range_it_documents():
    # (1e-100 and 1e100 times the data's scale are inside; the measurements behind the range
    # are in pygpfast._base._start.KERNEL_SCALE_RANGE's comment)
    X, y = _data("binary", n=N)
    for kernel in (kernels.RBF(1e-99, 1.0), kernels.RBF(1.0, 1e99), kernels.RBF(1.0, 1e-99)):
        est = _fit(MAKE["SVGPClassifier"][0], X, y, kernel=kernel)
        _outputs(est, X)
    with pytest.raises(ValueError, match="kernel=.*prior variance"):
        pygpfast.VGPClassifier(kernel=kernels.RBF(1e-101, 1.0)).fit(X, y)


# ---------------------------------------------------------------------------- estimators: graceful
def _labels(y, values):
    """y's classes (in sorted order) replaced by `values` (in the same order)."""
    return np.asarray(values)[_codes(y)]


def _relabelled(name, relabel, expected_classes):
    """GRACEFUL when a fit on relabelled classes predicts the baseline's probabilities bitwise,
    with classes_ the new labels and predict the baseline's predictions relabelled."""
    make, task = MAKE[name]
    base, X, y, expected = _baseline(name)
    y_new = relabel(y)
    est = _fit(make, X, y_new)
    np.testing.assert_array_equal(est.classes_, expected_classes[:len(base.classes_)])
    _assert_same(_outputs(est, X), expected)
    mapping = dict(zip(base.classes_.tolist(), est.classes_.tolist()))
    np.testing.assert_array_equal(est.predict(X), [mapping[c] for c in base.predict(X).tolist()])
    return GRACEFUL


def _dataframe(name):
    """feature_names_in_ kept as scikit-learn keeps it; the same predictions on a DataFrame or
    its array, the latter with scikit-learn's UserWarning; other names a ValueError."""
    make, _ = MAKE[name]
    _, X, y, expected = _baseline(name)
    frame = pd.DataFrame(X, columns=["height", "weight"])
    est = _fit(make, frame, pd.Series(y))
    np.testing.assert_array_equal(est.feature_names_in_, ["height", "weight"])
    _assert_same(_outputs(est, frame), expected)
    with pytest.warns(UserWarning, match="does not have valid feature names") as seen:
        out = _outputs(est, X)
    assert all("valid feature names" in str(w.message) for w in seen)
    _assert_same(out, expected)
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict(frame.rename(columns={"height": "age"}))
    return GRACEFUL


def _dataframe_after_arrays(name):
    base, X, _, expected = _baseline(name)
    with pytest.warns(UserWarning, match="fitted without feature names") as seen:
        got = base.predict_proba(pd.DataFrame(X, columns=["a", "b"])) if is_classifier(base) \
            else base.predict(pd.DataFrame(X, columns=["a", "b"]), return_std=True)[0]
    assert len(seen) == 1  # (one warning per call)
    np.testing.assert_array_equal(got, expected[2])
    return GRACEFUL


def _converted_once(name, dtype):
    """A float32 or integer X gives the fit of its float64 values, bitwise, at fit and at
    predict."""
    make, task = MAKE[name]
    X, y = _data(task, n=N)
    Xd = (X * 3).astype(dtype)
    est, ref = _fit(make, Xd, y), _fit(make, Xd.astype(np.float64), y)
    _assert_same(_outputs(est, Xd), _outputs(ref, Xd.astype(np.float64)))
    return GRACEFUL


def _rows_for_each_class(y, per_class):
    codes = _codes(y)
    return np.concatenate([np.flatnonzero(codes == c)[:per_class] for c in np.unique(codes)])


def _fewer_rows(name, per_class):
    """Fewer rows than inducing points, active points or experts: M = N (SVGP), all rows
    active (IVM), partitions that fill fewer experts (IS-MOE), as their docstrings say."""
    make, task = MAKE[name]
    X, y = _data(task, n=N)
    rows = (_rows_for_each_class(y, per_class) if task in ("binary", "multiclass")
            else np.arange(2 * per_class))
    est = _graceful_finite(name, X[rows], y[rows])
    if hasattr(est, "inducing_points_"):
        assert est.inducing_points_.shape[0] == min(len(rows), est.n_inducing)
    return GRACEFUL


def _scaled(name, scale, far=False):
    """Inputs in any units from 1e-200 to 1e300 (the default kernel scales with them); far:
    predictions at points 1e200 times further out than the training data."""
    _, X, y, _ = _baseline(name)
    if far:
        _outputs(_baseline(name)[0], X * 1e200)
        return GRACEFUL
    _graceful_finite(name, X * scale, y)
    return GRACEFUL


def _degenerate_X(name, how):
    _, X, y, _ = _baseline(name)
    if how == "duplicated rows":
        X, y = np.repeat(X[:10], 3, axis=0), np.repeat(y[:10], 3)
        if len(np.unique(y)) < 2:  # (classifiers: both classes among the first rows)
            rows = _rows_for_each_class(y, 5) if is_classifier(_baseline(name)[0]) else None
            X, y = np.repeat(_baseline(name)[1][rows], 3, axis=0), np.repeat(y[rows], 3)
    elif how == "a constant column":
        X = np.column_stack([X[:, 0], np.full(len(X), 7.0)])
    else:
        X = np.full_like(X, -3.0)
    _graceful_finite(name, X, y)
    return GRACEFUL


GRACEFUL_CASES = {
    # (tasks, check(name) -> GRACEFUL)
    "pandas DataFrame and Series": (None, _dataframe),
    "a DataFrame at predict after arrays at fit": (None, _dataframe_after_arrays),
    "float32 X": (None, lambda name: _converted_once(name, np.float32)),
    "integer X": (None, lambda name: _converted_once(name, np.int64)),
    "Fortran-ordered X": (None, lambda name: _graceful_as_baseline(
        name, np.asfortranarray(_baseline(name)[1]), _baseline(name)[2])),
    "a strided view as X": (None, lambda name: _graceful_as_baseline(
        name, np.repeat(_baseline(name)[1], 2, axis=0)[::2], _baseline(name)[2])),
    "misaligned X and y (views at an odd byte offset), at fit and predict": (
        None, lambda name: _graceful_as_baseline(
            name, _misaligned(_baseline(name)[1]), _misaligned(_baseline(name)[2]),
            X_test=_misaligned(_baseline(name)[1]))),
    "an object array of numbers as X": (None, lambda name: _graceful_as_baseline(
        name, _baseline(name)[1].astype(object), _baseline(name)[2])),
    "numeric strings as X": (None, lambda name: _graceful_as_baseline(
        name, _baseline(name)[1].astype(str), _baseline(name)[2])),
    "lists as X and y": (None, lambda name: _graceful_as_baseline(
        name, _baseline(name)[1].tolist(), _baseline(name)[2].tolist())),
    "an np.matrix as X": (None, lambda name: _graceful_as_baseline(
        name, _matrix(_baseline(name)[1]), _baseline(name)[2])),
    "y as a column [N, 1]": (None, lambda name: _column_y(name)),
    "string labels": (("binary", "multiclass"), lambda name: _relabelled(
        name, lambda y: _labels(y, ["c0", "c1", "c2"]), ["c0", "c1", "c2"])),
    "negative integer labels": (("binary", "multiclass"), lambda name: _relabelled(
        name, lambda y: _labels(y, [-7, -5, -2]), [-7, -5, -2])),
    "integer-valued float labels": (("binary", "multiclass"), lambda name: _relabelled(
        name, lambda y: _labels(y, [0.0, 1.0, 2.0]), [0.0, 1.0, 2.0])),
    "object labels": (("binary", "multiclass"), lambda name: _relabelled(
        name, lambda y: _labels(y, ["c0", "c1", "c2"]).astype(object), ["c0", "c1", "c2"])),
    "pandas categorical labels": (("binary", "multiclass"), lambda name: _relabelled(
        name, lambda y: pd.Series(pd.Categorical(_labels(y, ["c0", "c1", "c2"]),
                                                 categories=["c0", "c1", "c2"][:len(set(y))])),
        ["c0", "c1", "c2"])),
    "boolean labels": (("binary",), lambda name: _relabelled(
        name, lambda y: _codes(y) == 1, [False, True])),
    "non-integer counts (documented: the same formula)": (("counts",), lambda name: (
        _graceful_finite(name, _baseline(name)[1], _baseline(name)[2] + 0.37) and GRACEFUL)),
    "constant targets": (("regression", "counts"), lambda name: (
        _graceful_finite(name, _baseline(name)[1], np.full(N, 3.0)) and GRACEFUL)),
    "fewer rows than inducing/active points or experts": (None, lambda name: _fewer_rows(name, 3)),
    "one or two rows per class": (None, lambda name: _fewer_rows(name, 1)),
    "duplicated rows": (None, lambda name: _degenerate_X(name, "duplicated rows")),
    "a constant column": (None, lambda name: _degenerate_X(name, "a constant column")),
    "every column constant": (None, lambda name: _degenerate_X(name, "constant")),
    "X * 1e200": (None, lambda name: _scaled(name, 1e200)),
    "X * 1e300": (None, lambda name: _scaled(name, 1e300)),
    "X * 1e-200": (None, lambda name: _scaled(name, 1e-200)),
    "predictions 1e200 times further out": (None, lambda name: _scaled(name, 1.0, far=True)),
}


def _misaligned(a):
    """A copy of `a` whose data start one byte past a multiple of its item size (a view into a
    byte buffer, as an array unpickled from a message can be): flags.aligned is False."""
    a = np.asarray(a)
    out = np.empty(a.nbytes + 1, dtype=np.uint8)[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def _matrix(X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # (numpy's, on np.matrix)
        return np.asmatrix(X)


def _column_y(name):
    _, X, y, _ = _baseline(name)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        return _graceful_as_baseline(name, X, y[:, None])


GRACEFUL_CASE_LIST = [(case, name) for case, (tasks, _) in GRACEFUL_CASES.items()
                      for name, _, task in ESTIMATORS if _applies(tasks, task)]


@pytest.mark.parametrize("case, name", GRACEFUL_CASE_LIST)
def test_unusual_but_valid_input_is_handled_as_documented(case, name):
    OUTCOMES[case, name] = GRACEFUL_CASES[case][1](name)


# ---------------------------------------------------------------------------- estimators: predict
def _with_nan(X):
    X = X[:3].copy()
    X[1, 0] = np.nan
    return X


PREDICT_ERRORS = {
    "predict: wrong number of columns": (lambda X: np.ones((3, 3)),
                                         "X has 3 features, but .* is expecting 2", ValueError),
    "predict: NaN": (_with_nan, "NaN", ValueError),
    "predict: infinity": (lambda X: np.where(np.isnan(_with_nan(X)), np.inf, X[:3]), "infinity",
                          ValueError),
    "predict: 1-D": (lambda X: X[0], "Expected 2D array, got 1D", ValueError),
    "predict: empty": (lambda X: X[:0], "0 sample", ValueError),
    "predict: sparse": (lambda X: sp.csr_matrix(X[:3]), "Sparse data was passed for X", TypeError),
    "predict: strings": (lambda X: np.full((3, 2), "x"), "X must be an array of real numbers",
                         ValueError),
}


@pytest.mark.parametrize("case", list(PREDICT_ERRORS))
@pytest.mark.parametrize("name", IDS)
def test_bad_prediction_input_is_a_clean_error(case, name):
    OUTCOMES[case, name] = _predict_error(case, name)


def _predict_error(case, name):
    est, X, _, _ = _baseline(name)
    make_X, match, types = PREDICT_ERRORS[case]
    bad = make_X(X)
    _clean_error(lambda: est.predict(bad), match, types)
    return _clean_error(lambda: est.predict_latent(bad), match, types)


def test_inducing_points_of_the_wrong_width_are_a_clean_error():
    X, y = _data("binary", n=N)
    for name in ("SVGPClassifier", "SVGPClassifier-mf"):
        make, _ = MAKE[name]
        _clean_error(lambda: make(random_state=0, inducing_points=np.ones((4, 3))).fit(X, y),
                     "inducing_points has 3 features but X has 2")


# ---------------------------------------------------------------------------- public functions
def _kernel_matrix_equal(kernel, X, reference):
    np.testing.assert_array_equal(kernel(X), reference)
    return GRACEFUL


def _same_inference(a, b):
    assert np.array_equal(a.alpha, b.alpha) and np.array_equal(a.lambda_, b.lambda_)
    assert a.bound == b.bound
    return GRACEFUL


def _small():
    """(X [6, 2], a positive definite A [6, 6]) for the public functions."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (6, 2))
    B = rng.standard_normal((6, 6))
    return X, B @ B.T + 6 * np.eye(6)


FUNCTION_CASES = {
    # (target, case): (call(X, A) -> outcome)
    ("kernels.RBF()", "NaN in X"): lambda X, A: _clean_error(lambda: kernels.RBF()(_set(X, np.nan)), "NaN"),
    ("kernels.RBF()", "X 1-D"): lambda X, A: _clean_error(lambda: kernels.RBF()(X[:, 0]), "2D array"),
    ("kernels.RBF()", "X2 of another width"): lambda X, A: _clean_error(
        lambda: kernels.RBF()(X, np.ones((2, 3))), "X2 has 3 features but X has 2"),
    ("kernels.RBF()", "strings"): lambda X, A: _clean_error(
        lambda: kernels.RBF()(np.full((2, 2), "x")), "X must be an array of real numbers"),
    ("kernels.RBF()", "sparse X"): lambda X, A: _clean_error(
        lambda: kernels.RBF()(sp.csr_matrix(X)), "Sparse data was passed for X", TypeError),
    ("kernels.RBF()", "empty X"): lambda X, A: _clean_error(lambda: kernels.RBF()(X[:0]), "0 sample"),
    ("kernels.RBF()", "float32, integer, Fortran, strided, DataFrame"): lambda X, A: all(
        _kernel_matrix_equal(kernels.RBF(), Xv, kernels.RBF()(np.asarray(Xv, dtype=np.float64)))
        for Xv in (X.astype(np.float32), (3 * X).astype(int), np.asfortranarray(X),
                   np.repeat(X, 2, axis=0)[::2], pd.DataFrame(X))) and GRACEFUL,
    ("kernels.RBF()", "misaligned X and X2"): lambda X, A: _kernel_matrix_equal(
        kernels.RBF(), _misaligned(X), kernels.RBF()(X)) and np.array_equal(
        kernels.RBF()(_misaligned(X), _misaligned(X[:2])), kernels.RBF()(X, X[:2])) and GRACEFUL,
    ("_core.linalg.cholesky (compiled)", "a misaligned array"): lambda X, A: _clean_error(
        lambda: _core.linalg.cholesky(_misaligned(A)), "A must be aligned to its item size"),
    ("kernels.RBF()", "X * 1e200"): lambda X, A: _finite(kernels.RBF()(X * 1e200)),
    ("kernels.RBF(lengthscale=1e300)", "huge lengthscale"): lambda X, A: _kernel_matrix_equal(
        kernels.RBF(2.0, 1e300), X, np.full((6, 6), 2.0)),
    ("kernels.RBF(lengthscale=1e-300)", "tiny lengthscale"): lambda X, A: _kernel_matrix_equal(
        kernels.Matern52(2.0, 1e-300), X, 2.0 * np.eye(6)),
    ("kernels.RBF(lengthscale=0)", "zero lengthscale"): lambda X, A: _clean_error(
        lambda: kernels.RBF(lengthscale=0.0), "lengthscale must be finite and > 0"),
    ("kernels.RBF(lengthscale=-1)", "negative lengthscale"): lambda X, A: _clean_error(
        lambda: kernels.RBF(lengthscale=[1.0, -1.0]), "lengthscale must be finite and > 0"),
    ("kernels.Matern32(variance=nan)", "NaN variance"): lambda X, A: _clean_error(
        lambda: kernels.Matern32(variance=np.nan), "variance must be finite and > 0"),
    ("kernels.RBF(variance=inf)", "infinite variance"): lambda X, A: _clean_error(
        lambda: kernels.RBF(variance=np.inf), "variance must be finite and > 0"),
    ("kernels.RBF(lengthscale='1')", "a string lengthscale"): lambda X, A: _clean_error(
        lambda: kernels.RBF(lengthscale="1"), "lengthscale must be a positive number"),
    ("linalg.cholesky", "NaN"): lambda X, A: _clean_error(
        lambda: linalg.cholesky(_set(A, np.nan)), "NaN"),
    ("linalg.cholesky", "not square"): lambda X, A: _clean_error(
        lambda: linalg.cholesky(A[:3]), "must be square"),
    ("linalg.cholesky", "1-D"): lambda X, A: _clean_error(lambda: linalg.cholesky(A[0]), "2D array"),
    ("linalg.cholesky", "strings"): lambda X, A: _clean_error(
        lambda: linalg.cholesky(np.full((2, 2), "x")), "A must be an array of real numbers"),
    ("linalg.cholesky", "sparse"): lambda X, A: _clean_error(
        lambda: linalg.cholesky(sp.csr_matrix(A)), "Sparse data was passed for A", TypeError),
    ("linalg.cholesky", "float32, Fortran, strided, misaligned"): lambda X, A: all(
        np.array_equal(linalg.cholesky(Av), linalg.cholesky(np.asarray(Av, dtype=np.float64)))
        for Av in (A.astype(np.float32), np.asfortranarray(A), np.repeat(A, 2, axis=0)[::2],
                   _misaligned(A))
    ) and GRACEFUL,
    ("likelihoods.Bernoulli", "misaligned y, mu and var"): lambda X, A: all(
        np.array_equal(u, v) for u, v in zip(
            likelihoods.Bernoulli().variational_expectations(
                _misaligned(np.array([0.0, 1.0, 1.0])), _misaligned(X[:3, 0]),
                _misaligned(np.abs(X[:3, 1]))),
            likelihoods.Bernoulli().variational_expectations(
                np.array([0.0, 1.0, 1.0]), X[:3, 0].copy(), np.abs(X[:3, 1])))) and GRACEFUL,
    ("linalg.solve_lower", "B of the wrong length"): lambda X, A: _clean_error(
        lambda: linalg.solve_lower(np.linalg.cholesky(A), np.ones(5)), "B has 5 rows"),
    ("likelihoods.Gaussian", "NaN mean"): lambda X, A: _clean_error(
        lambda: likelihoods.Gaussian().variational_expectations(np.ones(3), [0.0, np.nan, 0.0], np.ones(3)),
        "mu contains NaN"),
    ("likelihoods.Gaussian", "y of the wrong length"): lambda X, A: _clean_error(
        lambda: likelihoods.Gaussian().variational_expectations(np.ones(2), np.zeros(3), np.ones(3)),
        "y must have length 3"),
    ("likelihoods.Gaussian(variance=0)", "zero variance"): lambda X, A: _clean_error(
        lambda: likelihoods.Gaussian(variance=0.0), "variance must be"),
    ("likelihoods.Poisson", "a negative count"): lambda X, A: _clean_error(
        lambda: likelihoods.Poisson().variational_expectations([1.0, -2.0], np.zeros(2), np.ones(2)),
        r"y\[1\] = -2"),
    ("likelihoods.Poisson", "strings as counts"): lambda X, A: _clean_error(
        lambda: likelihoods.Poisson().variational_expectations(["a", "b"], np.zeros(2), np.ones(2)),
        "y must be a numeric"),
    ("likelihoods.Poisson", "non-integer counts (the same formula)"): lambda X, A: _finite(
        likelihoods.Poisson().variational_expectations([0.5, 2.25], np.zeros(2), np.ones(2))[0]),
    ("likelihoods.Bernoulli", "a label outside {0, 1}"): lambda X, A: _clean_error(
        lambda: likelihoods.Bernoulli().variational_expectations([0.0, 2.0], np.zeros(2), np.ones(2)),
        r"y\[1\] = 2"),
    ("likelihoods.Softmax", "a class index out of range"): lambda X, A: _clean_error(
        lambda: likelihoods.Softmax(3).variational_expectations([0.0, 3.0], np.zeros((2, 3)), np.ones((2, 3))),
        r"y\[1\] = 3"),
    ("cvi.infer", "Sigma not square"): lambda X, A: _clean_error(
        lambda: cvi.infer(A[:3], np.ones(3), cvi.LocalBound("poisson")), "Sigma must be a non-empty square"),
    ("cvi.infer", "NaN in Sigma"): lambda X, A: _clean_error(
        lambda: cvi.infer(_set(A, np.nan), np.ones(6), cvi.LocalBound("poisson")), "Sigma has a non-finite entry"),
    ("cvi.infer", "y of the wrong length"): lambda X, A: _clean_error(
        lambda: cvi.infer(A, np.ones(5), cvi.LocalBound("poisson")), "y must have 6 entries"),
    ("cvi.infer", "strings as y"): lambda X, A: _clean_error(
        lambda: cvi.infer(A, np.full(6, "x"), cvi.LocalBound("poisson")), "y must be an array of real numbers"),
    ("cvi.infer", "strings as Sigma"): lambda X, A: _clean_error(
        lambda: cvi.infer(np.full((2, 2), "x"), np.ones(2), cvi.LocalBound("poisson")),
        "Sigma must be an array of real numbers"),
    ("cvi.infer", "misaligned Sigma, y, mean, alpha and lambda_"): lambda X, A: _same_inference(
        cvi.infer(_misaligned(A), _misaligned(np.arange(6.0)), cvi.LocalBound("poisson"),
                  mean=_misaligned(np.array([0.5])), alpha=_misaligned(np.zeros(6)),
                  lambda_=_misaligned(np.ones(6))),
        cvi.infer(A, np.arange(6.0), cvi.LocalBound("poisson"), mean=[0.5], alpha=np.zeros(6),
                  lambda_=np.ones(6))),
    ("svgp.SVGP", "misaligned Z, X and y"): lambda X, A: np.array_equal(
        svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), _misaligned(X[:3])).elbo(
            _misaligned(X), _misaligned(X[:, 0]))[0],
        svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), X[:3].copy()).elbo(
            X, X[:, 0].copy())[0]) and GRACEFUL,
    ("cvi.infer", "a negative count"): lambda X, A: _clean_error(
        lambda: cvi.infer(A, -np.ones(6), cvi.LocalBound("poisson")), r">= 0"),
    ("cvi.infer", "a local bound that is not one"): lambda X, A: _clean_error(
        lambda: cvi.infer(A, np.ones(6), "poisson"), "local_bound must be a LocalBound"),
    ("svgp.SVGP", "NaN in Z"): lambda X, A: _clean_error(
        lambda: svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), _set(X, np.nan)), "NaN"),
    ("svgp.SVGP", "Z 1-D"): lambda X, A: _clean_error(
        lambda: svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), X[:, 0]), "2D array"),
    ("svgp.SVGP", "strings as Z"): lambda X, A: _clean_error(
        lambda: svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), np.full((2, 2), "x")),
        "Z must be an array of real numbers"),
    ("svgp.SVGP", "X of another width"): lambda X, A: _clean_error(
        lambda: svgp.SVGP(kernels.RBF(), likelihoods.Gaussian(), X).predict_f(np.ones((2, 3))),
        "X has 3 columns but Z has 2"),
}


def _finite(a):
    assert np.all(np.isfinite(a))
    return GRACEFUL


@pytest.mark.parametrize("target, case", list(FUNCTION_CASES), ids=[" / ".join(k) for k in FUNCTION_CASES])
def test_public_functions_on_bad_input(target, case):
    OUTCOMES[case, target] = FUNCTION_CASES[target, case](*_small())


# ---------------------------------------------------------------------------- property-based
@st.composite
def _training_data(draw, task):
    """(X, y) of n in 1..12 rows and 1..3 columns: magnitudes 1e-300..1e300, duplicated rows,
    constant columns, NaN or infinity in X or y, a wrong number of dimensions or of targets."""
    n, d = draw(st.integers(1, 12)), draw(st.integers(1, 3))
    unit = 10.0 ** draw(st.integers(-300, 300))
    X = np.array(draw(st.lists(st.floats(-1.0, 1.0), min_size=n * d, max_size=n * d)))
    X = X.reshape(n, d) * unit
    if draw(st.booleans()):
        X[draw(st.integers(0, n - 1))] = X[0]  # (a duplicated row)
    if draw(st.booleans()):
        X[:, draw(st.integers(0, d - 1))] = draw(st.floats(-1.0, 1.0)) * unit  # (a constant column)
    if task in ("binary", "multiclass"):
        y = np.array(draw(st.lists(st.integers(0, 1 if task == "binary" else 2), min_size=n,
                                   max_size=n)), dtype=float)
    elif task == "counts":
        y = np.array(draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)), dtype=float)
    else:
        y = np.array(draw(st.lists(st.floats(-1.0, 1.0), min_size=n, max_size=n)))
        y *= 10.0 ** draw(st.integers(-100, 100))
    fault = draw(st.sampled_from(["none", "none", "nan X", "inf X", "nan y", "inf y", "X 1-D",
                                  "X 3-D", "y too short", "y 2-D"]))
    row, col = draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))
    if fault in ("nan X", "inf X"):
        X[row, col] = np.nan if fault == "nan X" else -np.inf
    elif fault in ("nan y", "inf y"):
        y[row] = np.nan if fault == "nan y" else np.inf
    elif fault == "X 1-D":
        X = X[:, 0]
    elif fault == "X 3-D":
        X = X[:, :, None]
    elif fault == "y too short":
        y = y[:-1]
    elif fault == "y 2-D":
        y = np.column_stack([y, y])
    return X, y


def _clean_error_or_finite(name, X, y):
    make, _ = MAKE[name]
    try:
        est = _fit(make, X, y)
    except (ValueError, TypeError) as e:
        assert len(str(e)) > 10  # (a message, not a bare exception)
        return
    _outputs(est, X[:5])


@pytest.mark.parametrize("name", IDS)
def test_generated_malformed_and_extreme_training_data(name):
    # (A fit on generated data either refuses it with a ValueError or TypeError that carries a
    # message, or predicts finite values of the right shapes; anything else fails.)
    _, task = MAKE[name]

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(_training_data(task))
    def check(data):
        _clean_error_or_finite(name, *data)

    check()


@pytest.mark.parametrize("name", IDS)
def test_generated_extreme_prediction_input(name):
    est, X, _, _ = _baseline(name)

    @settings(max_examples=25, deadline=None, derandomize=True, database=None)
    @given(st.integers(-300, 300), st.integers(1, 4), st.booleans())
    def check(exponent, rows, duplicate):
        Xt = X[:rows] * 10.0 ** exponent
        if duplicate:
            Xt = np.repeat(Xt, 2, axis=0)
        _outputs(est, Xt)

    check()


# ---------------------------------------------------------------------------- the count
def _every_case():
    """{(case, target): run() -> outcome} over the whole matrix."""
    runs = {(case, name): functools.partial(_fit_error, case, name)
            for case, name in FIT_ERROR_CASES}
    runs.update({(case, name): functools.partial(_kernel_error, case, name)
                 for case in KERNEL_ERRORS for name in IDS})
    runs.update({(case, name): functools.partial(GRACEFUL_CASES[case][1], name)
                 for case, name in GRACEFUL_CASE_LIST})
    runs.update({(case, name): functools.partial(_predict_error, case, name)
                 for case in PREDICT_ERRORS for name in IDS})
    runs.update({(case, target): functools.partial(lambda call: call(*_small()), call)
                 for (target, case), call in FUNCTION_CASES.items()})
    return runs


def test_summary_of_the_bad_input_matrix(capsys):
    """Runs any case of the matrix not yet run in this session (so that the count covers the
    whole matrix under -k too) and prints the tally."""
    for key, run in _every_case().items():
        if key not in OUTCOMES:
            OUTCOMES[key] = run()
    counts = {kind: sum(v == kind for v in OUTCOMES.values()) for kind in (ERROR, GRACEFUL)}
    assert counts[ERROR] + counts[GRACEFUL] == len(OUTCOMES)
    estimators = {name for _, name in OUTCOMES if name in MAKE}
    cases = {case for case, _ in OUTCOMES}
    with capsys.disabled():
        print(f"\nbad input: {len(OUTCOMES)} case x target runs ({len(cases)} cases over "
              f"{len(estimators)} estimators and {len(OUTCOMES) - sum(n in MAKE for _, n in OUTCOMES)} "
              f"public-function runs): {counts[ERROR]} clean errors, {counts[GRACEFUL]} "
              "documented graceful behaviours, 0 crashes, 0 hangs, 0 non-finite outputs")
