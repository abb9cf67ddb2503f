"""Robustness of SVGPClassifier / SVGPRegressor under adversarial but plausible use: feature
scales, frozen parameters, callbacks under method='mf', failed refits, bad parameters and
streaming with a small first chunk."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from pygpfast import NumericalWarning, SVGPClassifier, SVGPRegressor, kernels, svgp
from pygpfast.kernels import PARAM_BOUNDS, hyper_bounds


def _data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    return X, (X[:, 0] > 0).astype(int), np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(n)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("scale", [1e-4, 1e6, 1e200, 1e-200])
@pytest.mark.parametrize("optimizer", ["lbfgs", "natgrad"])
def test_fit_does_not_depend_on_the_units_of_the_features(scale, optimizer):
    # Before: Adam's absolute steps on Z scattered the inducing inputs of features on a scale
    # of 1e-4 (R^2 = 0, accuracy = majority class), and the hyperparameter bounds clipped the
    # starting lengthscale (~1e6) of features on a scale of 1e6 to 1e5 (R^2 = 0). Beyond
    # ~1e154 the squares in k-means and in the spread of Z overflowed (a non-finite K(Z, Z)).
    X, yc, yr = _data()
    kw = dict(n_inducing=10, max_iter=60 if optimizer == "lbfgs" else 30, optimizer=optimizer, random_state=0)
    unit = SVGPRegressor(**kw).fit(X, yr).score(X, yr)
    assert unit > 0.95
    assert SVGPRegressor(**kw).fit(X * scale, yr).score(X * scale, yr) > unit - 0.02
    assert SVGPClassifier(**kw).fit(X * scale, yc).score(X * scale, yc) > 0.95


@pytest.mark.parametrize("scale", [1e-6, 1e7, 1e200])
def test_method_mf_does_not_depend_on_the_units_of_the_features(scale):
    X, yc, _ = _data(120)
    clf = SVGPClassifier(n_inducing=8, method="mf", max_iter=60, random_state=0).fit(X * scale, yc)
    assert clf.score(X * scale, yc) > 0.95
    # The lengthscale of the relevant feature followed the data (the old bounds held it at
    # 1e-5 or 1e5).
    assert 1e-2 * scale < clf.kernel_.lengthscale[0] < 1e2 * scale


def test_hyper_bounds_contain_the_start_and_widen_only_outside_param_bounds():
    lo, hi = np.log(PARAM_BOUNDS)
    theta0 = np.log([1.0, 1e-8, 1e7])
    lower, upper = hyper_bounds(theta0)
    np.testing.assert_allclose(lower, [lo, theta0[1] + lo, lo])
    np.testing.assert_allclose(upper, [hi, hi, theta0[2] + hi])
    assert np.all((lower < theta0) & (theta0 < upper))


def test_lbfgs_with_everything_frozen_optimises_q_for_max_iter_and_warns():
    # Before: q got at most min(max_iter / 4, 100) iterations (2 for max_iter=8) and no
    # ConvergenceWarning was raised, whatever the ELBO.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 2))
    y = (np.sin(3 * X[:, 0]) + X[:, 1] > 0).astype(int)
    kw = dict(kernel=kernels.RBF(lengthscale=0.5, variance=3.0), n_inducing=40, random_state=0,
              train_inducing=False, optimize_hyperparameters=False)
    with pytest.warns(ConvergenceWarning, match="max_iter=8"):
        short = SVGPClassifier(max_iter=8, **kw).fit(X, y)
    assert short.n_iter_ == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        full = SVGPClassifier(max_iter=40, **kw).fit(X, y)
        ref = SVGPClassifier(max_iter=400, **kw).fit(X, y)
    assert 10 < full.n_iter_ < 40
    assert full.objective_ == pytest.approx(ref.objective_, rel=1e-6)
    assert short.objective_ < full.objective_


def test_mf_callback_sees_the_current_posterior():
    # Before: under method='mf' the callback saw the initial q(u) = prior, so predict_proba
    # was 0.5 everywhere at every iteration (documented: the fitted attributes hold the
    # current parameters).
    X, y, _ = _data(150)
    seen = []

    def cb(est, it, bound):
        seen.append(est.predict_proba(X))
        return it >= 4

    clf = SVGPClassifier(n_inducing=8, method="mf", callback=cb, random_state=0).fit(X, y)
    assert len(seen) == 4
    assert np.abs(seen[0][:, 1] - 0.5).mean() > 0.1
    np.testing.assert_allclose(seen[-1], clf.predict_proba(X), atol=1e-8)
    # The snapshots cost time only: the fit is the same without a callback.
    free = SVGPClassifier(n_inducing=8, method="mf", max_iter=4, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        free.fit(X, y)
    np.testing.assert_allclose(free.predict_proba(X), clf.predict_proba(X), atol=1e-8)


@pytest.mark.parametrize(
    "make, X_bad, y_bad",
    [
        (SVGPClassifier, lambda X: X, lambda yc, yr: np.zeros(len(yc))),  # one class
        (SVGPClassifier, lambda X: np.c_[X, X], lambda yc, yr: np.zeros(len(yc))),  # and 4 features
        (SVGPRegressor, lambda X: np.c_[X, X], lambda yc, yr: np.where(yr > 1, np.nan, yr)),
    ],
)
def test_failed_refit_leaves_the_estimator_unfitted(make, X_bad, y_bad):
    # Before: classes_ or n_features_in_ came from the failed call and model_ from the earlier
    # fit: predict raised IndexError or a misleading feature count.
    X, yc, yr = _data(60)
    y = yc if make is SVGPClassifier else yr
    est = make(n_inducing=5, max_iter=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
        with pytest.raises(ValueError):
            est.fit(X_bad(X), y_bad(yc, yr))
        with pytest.raises(NotFittedError):
            est.predict(X)
        assert est.fit(X, y).predict(X).shape == (60,)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"kernel": "rbf"}, "kernel must be"), ({"kernel": lambda a, b: a @ b.T}, "kernel must be"),
     ({"jitter": np.inf}, r"jitter must be a finite number in \[0, 1\)")],
)
def test_bad_kernel_and_jitter_give_clear_errors(kwargs, match):
    # Before: AttributeError "'str' object has no attribute '_spec'" from deep in SVGP, and
    # the core's "jitter must be >= 0" for jitter=inf.
    X, yc, yr = _data(20)
    with pytest.raises(ValueError, match=match):
        SVGPClassifier(**kwargs).fit(X, yc)
    with pytest.raises(ValueError, match=match):
        SVGPRegressor(**kwargs).partial_fit(X, yr)


def test_partial_fit_warns_when_the_first_chunk_caps_the_inducing_points():
    X, yc, _ = _data(96)
    with pytest.warns(UserWarning, match="32 inducing points instead of n_inducing=50"):
        clf = SVGPClassifier(n_inducing=50, random_state=0).partial_fit(X[:32], yc[:32], classes=[0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf.partial_fit(X[32:], yc[32:])  # later chunks do not warn
        SVGPClassifier(n_inducing=20, random_state=0).partial_fit(X[:32], yc[:32], classes=[0, 1])
        SVGPClassifier(inducing_points=X[:50], random_state=0).partial_fit(X[:32], yc[:32], classes=[0, 1])
    assert clf.inducing_points_.shape == (32, 2)


def test_unnormalised_targets_in_the_hundreds_are_not_fitted_as_noise():
    # normalize_y=False: the default kernel and noise variances start at the targets' mean
    # square; from 1 the fit explained targets of amplitude 100 as noise (R^2 about 0).
    rng = np.random.default_rng(3)
    X = rng.standard_normal((200, 2))
    y = 100.0 * np.sin(2.0 * X[:, 0]) + 5.0 * rng.standard_normal(200)
    reg = SVGPRegressor(normalize_y=False, n_inducing=20, max_iter=1000, random_state=0).fit(X, y)
    assert reg.score(X, y) > 0.9
    assert reg.kernel_.variance > 100.0
    assert reg.y_mean_ == 0.0 and reg.y_scale_ == 1.0


def test_lbfgs_giving_up_early_is_a_convergence_warning(monkeypatch):
    # A line search that failed at once ("ABNORMAL", 0 iterations) left the model at the prior
    # (p = 0.5 everywhere) and the fit counted as converged (nit < max_iter).
    rng = np.random.RandomState(0)
    X = rng.randn(80, 2)
    y = (X[:, 0] + 0.3 * rng.randn(80) > 0).astype(int)
    monkeypatch.setattr(svgp._estimators, "fit_lbfgs",
                        lambda *a, **k: (0, "L-BFGS-B stopped after 0 iterations (ABNORMAL)"))
    with pytest.warns(ConvergenceWarning, match="L-BFGS-B stopped after 0 iterations"):
        SVGPClassifier(n_inducing=5, random_state=0).fit(X, y)


@pytest.mark.parametrize("jitter", [1e-9, 1e-12, 1e-15])
def test_unwhitened_on_a_near_singular_kzz_is_a_numerical_warning(jitter):
    # Duplicated inducing inputs, unwhitened, with a jitter below 1e-7: K(Z, Z) is singular but
    # for the jitter, L-BFGS-B stopped after 0 to 2 iterations with the model at the prior
    # (p = 0.5 everywhere), sometimes with a ConvergenceWarning ("ABNORMAL"), sometimes
    # without one, as rounding went.
    rng = np.random.RandomState(0)
    X = rng.randn(80, 2)
    y = (X[:, 0] + 0.3 * rng.randn(80) > 0).astype(int)
    Z = np.vstack([X[:5], X[:5]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SVGPClassifier(inducing_points=Z, whiten=False, jitter=jitter, random_state=0).fit(X, y)
    assert any(issubclass(w.category, NumericalWarning) and "near-singular" in str(w.message)
               for w in caught)
    with warnings.catch_warnings():  # the same inducing inputs whitened fit normally
        warnings.simplefilter("error")
        clf = SVGPClassifier(inducing_points=Z, jitter=jitter, random_state=0).fit(X, y)
    assert clf.score(X, y) > 0.9


@pytest.mark.parametrize("scale", [1e155, 1e300])
def test_targets_beyond_1e154(scale):
    # y * y and np.std overflowed: y_scale_ = inf and every prediction NaN (normalize_y), or a
    # "kernel params[0] must be finite, got nan" from deep inside the fit (normalize_y=False).
    rng = np.random.RandomState(0)
    X = rng.randn(60, 2)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(60)
    with warnings.catch_warnings():  # (both fits stop at the same max_iter)
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = SVGPRegressor(n_inducing=10, max_iter=50, random_state=0).fit(X, y * scale)
        small = SVGPRegressor(n_inducing=10, max_iter=50, random_state=0).fit(X, y)
    assert reg.y_scale_ == pytest.approx(small.y_scale_ * scale, rel=1e-12)
    # (unconverged after 50 iterations: the last bits of y_scale_ move the stopping point)
    np.testing.assert_allclose(reg.predict(X) / scale, small.predict(X), rtol=1e-5, atol=1e-8)
    with pytest.raises(ValueError, match="normalize_y=True"):
        SVGPRegressor(normalize_y=False, n_inducing=10, random_state=0).fit(X, y * scale)


@pytest.mark.parametrize("Estimator", [SVGPClassifier, SVGPRegressor])
def test_a_fit_stopped_by_an_exception_leaves_the_estimator_unfitted(Estimator):
    # The model was installed before training, so a callback that raised (KeyboardInterrupt
    # included) or a step that failed left a half-trained or broken model that predicted, where
    # VGPClassifier's failed fits leave it unfitted.
    rng = np.random.RandomState(0)
    X = rng.randn(60, 2)
    y = (X[:, 0] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Estimator(n_inducing=10, max_iter=20, random_state=0).fit(X, y)

    def interrupt(estimator, iteration, elbo):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        est.set_params(callback=interrupt).fit(X, y)
    with pytest.raises(NotFittedError):
        est.predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert est.set_params(callback=None).fit(X, y).predict(X).shape == (60,)


def test_callback_answers_and_partial_fit_state():
    # A callback returning an array hit numpy's "truth value ... is ambiguous" deep inside
    # the fit; and partial_fit's n_total_ stayed on the estimator after a later fit.
    rng = np.random.RandomState(0)
    X = rng.randn(60, 2)
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(TypeError, match="callback must return a bool"):
        SVGPClassifier(n_inducing=10, callback=lambda e, i, v: np.array([False, False]),
                       random_state=0).fit(X, y)
    clf = SVGPClassifier(n_inducing=10, random_state=0)
    clf.partial_fit(X, y, classes=[0, 1])
    assert clf.n_total_ == 60
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.set_params(callback=lambda e, i, v: np.bool_(i >= 3)).fit(X, y)
    assert not hasattr(clf, "n_total_") and clf.n_iter_ == 3


def test_targets_in_small_units_without_normalisation():
    # The jitter was an absolute 1e-6 on K(Z, Z)'s diagonal, and the kernel's variance starts at
    # mean(y^2) ~ 5e-9 for targets of order 1e-4: the jitter swamped the prior, and the fit was a
    # flat line (R^2 = -0.002, no warning). It is now relative to K(Z, Z)'s mean diagonal.
    rng = np.random.RandomState(0)
    X = rng.randn(80, 2)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(80)
    raw = SVGPRegressor(normalize_y=False, n_inducing=10, random_state=0).fit(X, 1e-4 * y)
    normalised = SVGPRegressor(n_inducing=10, random_state=0).fit(X, 1e-4 * y)
    assert raw.score(X, 1e-4 * y) > 0.97
    assert raw.score(X, 1e-4 * y) == pytest.approx(normalised.score(X, 1e-4 * y), abs=0.01)


@pytest.mark.parametrize("method", ["kl", "mf"])
def test_a_kernel_that_vanishes_at_the_inducing_inputs_is_named(method):
    # A Linear kernel with every inducing input at 0 has K(Z, Z) = 0: the relative jitter has no
    # scale to be relative to, and the error blamed the kernel variance ("its mean diagonal is
    # 0 (check the kernel variance)"). It now names the inducing inputs and what to change.
    X, yc, yr = _data(40)
    Z = np.zeros((4, 2))
    est = (SVGPRegressor(kernels.Linear(), inducing_points=Z) if method == "kl"
           else SVGPClassifier(kernels.Linear(), method="mf", inducing_points=Z))
    with pytest.raises(np.linalg.LinAlgError, match="vanishes at the inducing inputs Z") as info:
        est.fit(X, yr if method == "kl" else yc)
    assert "kernel variance" not in str(info.value)


@pytest.mark.parametrize("scale", [1e-20, 1e-80])
def test_unwhitened_fit_of_targets_in_tiny_units(scale):
    # Unwhitened q lives in f's units: its gradients scale as 1 / sqrt(diag Kzz), and L-BFGS-B
    # stopped after one iteration with every hyperparameter at its start (R^2 0.969 against
    # 0.998 whitened, no warning) at 1e-20; at 1e-80 a marginal variance came out NaN. The
    # Packer now holds an unwhitened q in units of the prior's standard deviation.
    rng = np.random.RandomState(0)
    X = rng.randn(60, 1)
    y = (2 * X[:, 0] + 0.1 * rng.randn(60)) * scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = SVGPRegressor(normalize_y=False, whiten=False, n_inducing=10, max_iter=200,
                            random_state=0).fit(X, y)
    assert reg.score(X, y) > 0.997
    assert reg.likelihood_.variance < 1e-2 * np.mean(y**2)  # the noise left its start, mean(y^2)


@pytest.mark.parametrize("method", ["kl", "mf", "natgrad"])
def test_a_search_stuck_on_a_flat_prior_is_a_convergence_warning(method):
    # A Linear kernel (variance 1) on features in units of 1e-3: the prior varies by ~1e-6
    # across the inputs, the ELBO's gradients are as small, and L-BFGS-B stopped after one
    # iteration at R^2 0.001 (0.997 on the same features in units of 1), without a word.
    rng = np.random.default_rng(0)
    X = 1e-3 * rng.standard_normal((150, 2))
    f = X @ np.array([2e3, -1e3])
    # With natural gradients and Adam (fixed-size steps) the variance crept from 1 to 3.8 in 30
    # epochs (R^2 0.02), also without a word.
    Estimator, y = (SVGPClassifier, (f > 0).astype(int)) if method == "mf" else \
        (SVGPRegressor, f + 0.1 * rng.standard_normal(150))
    kw = dict(kernel=kernels.Linear(), n_inducing=10, random_state=0)
    kw.update(dict(optimizer="natgrad", max_iter=30) if method == "natgrad" else dict(method=method))
    where = "still moving away from its start" if method == "natgrad" else "ended at its start"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Estimator(**kw).fit(X, y)
    assert any(issubclass(w.category, ConvergenceWarning) and where in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Estimator(**kw).fit(1e3 * X, y)
    assert not any("flat" in str(w.message) for w in caught)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("optimizer", ["lbfgs", "natgrad", "adam", "adadelta"])
def test_inducing_points_are_the_fitted_ones(optimizer):
    # inducing_points_ was the array model_.Z held before training; the stochastic optimisers
    # replace model_.Z at every step, so after them (and after partial_fit) it kept the k-means
    # start, up to 0.09 away from the Z the model predicts with (5 epochs of Adam).
    X, yc, _ = _data(200)
    seen = []

    def callback(est, iteration, elbo):
        seen.append(np.array_equal(est.inducing_points_, est.model_.Z))

    clf = SVGPClassifier(n_inducing=8, optimizer=optimizer, max_iter=3, batch_size=50,
                         callback=callback, random_state=0).fit(X, yc)
    start = clf.set_params(train_inducing=False, callback=None).fit(X, yc).inducing_points_
    clf.set_params(train_inducing=True, callback=callback).fit(X, yc)
    assert not np.array_equal(clf.model_.Z, start)
    np.testing.assert_array_equal(clf.inducing_points_, clf.model_.Z)
    assert len(seen) >= 6 and all(seen)  # (mid-fit too)
    if optimizer != "lbfgs":
        clf.partial_fit(X, yc)
        np.testing.assert_array_equal(clf.inducing_points_, clf.model_.Z)


def test_a_kl_refit_drops_the_mean_field_locations():
    # mf_a_ (method='mf' only) stayed after a refit with method='kl': the locations of an
    # earlier fit, of another length when the data changed.
    X, yc, _ = _data(60)
    clf = SVGPClassifier(n_inducing=5, method="mf", max_iter=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, yc)
        assert clf.mf_a_.shape == (60,)
        clf.set_params(method="kl").fit(X[:40], yc[:40])
    assert not hasattr(clf, "mf_a_")


@pytest.mark.parametrize("optimizer", ["natgrad", "adam"])
def test_a_partial_fit_that_raises_leaves_the_stream_as_it_was(optimizer):
    # partial_fit kept what a call that raised had done: the first call left a fitted model,
    # and a later one the chunk's steps (q and Z moved, the kernel too or not, depending on
    # where it stopped), with n_rows_seen_ already counting the chunk. Passing each chunk again
    # then fitted it twice: probabilities 0.085 (natgrad) and 0.025 (adam) away from the
    # uninterrupted stream's, n_iter_ 6 and n_rows_seen_ 600 for 3 chunks of 100 rows.
    X, yc, _ = _data(300)
    chunks = [slice(0, 100), slice(100, 200), slice(200, 300)]
    kw = dict(n_inducing=6, optimizer=optimizer, batch_size=50, random_state=0)
    stream = SVGPClassifier(**kw)
    for c in chunks:
        stream.partial_fit(X[c], yc[c], classes=[0, 1])

    def interrupt(est, iteration, elbo):
        raise KeyboardInterrupt

    clf = SVGPClassifier(callback=interrupt, **kw)
    with pytest.raises(KeyboardInterrupt):
        clf.partial_fit(X[chunks[0]], yc[chunks[0]], classes=[0, 1])
    with pytest.raises(NotFittedError):
        clf.predict(X)
    for c in chunks:
        with pytest.raises(KeyboardInterrupt):
            clf.set_params(callback=interrupt).partial_fit(X[c], yc[c], classes=[0, 1])
        clf.set_params(callback=None).partial_fit(X[c], yc[c], classes=[0, 1])
    np.testing.assert_array_equal(clf.predict_proba(X), stream.predict_proba(X))
    np.testing.assert_array_equal(clf.history_, stream.history_)
    assert (clf.n_iter_, clf.n_steps_, clf.n_rows_seen_) == (3, 6, 300)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("kwargs", [{}, {"optimizer": "natgrad", "batch_size": 50}, {"method": "mf"}])
def test_a_callback_reads_the_current_fit(kwargs):
    # L-BFGS-B and method='mf' set n_iter_ and objective_ at the end of the fit, the stochastic
    # optimisers n_iter_: a refit's callback read the earlier fit's (n_iter_ 5 and objective_ -22.9
    # at iterations 1, 2, 3 whose ELBO was -67.0, -59.9, -26.7), and a checkpoint pickled by
    # the callback of a first fit had neither.
    X, yc, _ = _data(100)
    seen = []

    def callback(est, iteration, elbo):
        seen.append((est.n_iter_, est.objective_, len(est.history_)) == (iteration, elbo, iteration))

    clf = SVGPClassifier(n_inducing=5, max_iter=4, random_state=0, **kwargs)
    clf.fit(X, yc)
    clf.set_params(max_iter=2, callback=callback).fit(X, yc)
    assert seen and all(seen)


def test_jitter_taken_at_every_step_is_one_warning_at_the_callers_line():
    # Duplicated inducing inputs with jitter=1e-16 need the core's jitter escalation at every
    # step. Each step warned with the absolute jitter in its text (19 distinct messages under
    # Python's default filter in a 30-iteration fit), pointing inside the optimiser.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 2))
    y = (X[:, 0] > 0).astype(int)
    model = SVGPClassifier(inducing_points=np.repeat(X[:5], 2, axis=0), jitter=1e-16,
                           train_inducing=False, optimizer="lbfgs", max_iter=30, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert len(caught) == 1
    assert "times its mean diagonal" in str(caught[0].message)
    assert caught[0].filename == __file__


def test_unwhitened_start_on_near_duplicate_inducing_inputs_escalates_the_jitter():
    # q_sqrt's unwhitened start (the prior's Cholesky factor) came from np.linalg.cholesky
    # without the core's jitter escalation: numpy's bare "Matrix is not positive definite"
    # for inducing inputs 1e-12 apart with jitter=1e-16, where the whitened model fits.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 2))
    y = (X[:, 0] > 0).astype(int)
    Z = np.vstack([X[:5], X[:5] + 1e-12])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = SVGPClassifier(inducing_points=Z, whiten=False, jitter=1e-16, max_iter=20,
                               random_state=0).fit(X, y)
        proba = model.predict_proba(X)  # (which needs the jitter too)
    assert np.all(np.isfinite(proba))
    said = [str(w.message) for w in caught if issubclass(w.category, NumericalWarning)]
    assert any("was not numerically positive definite" in m for m in said)
    assert any("near-singular" in m for m in said)
