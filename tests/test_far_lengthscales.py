"""Kernels whose lengthscales are far from the distances between the training inputs: the fit
searches again from the data's scale where it is full-batch, and otherwise warns (the
estimators' Notes; kernels.diagnose)."""

import warnings

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from sklearn.exceptions import ConvergenceWarning

import pygpfast._base._start  # noqa: F401  (monkeypatched through pygpfast._base._start)
from pygpfast._base import _diagnose
from pygpfast import (SVGPClassifier, SVGPRegressor, VGPClassifier, VGPPoissonRegressor,
                      kernels)
from pygpfast.kernels import RBF, Constant, White

N = 150


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    f = X[:, 0] + 0.3 * rng.standard_normal(n)
    return X, {"binary": (f > 0).astype(int), "ordered": np.digitize(f, [-0.5, 0.5]),
               "counts": rng.poisson(np.exp(1.0 + X[:, 0])),
               "real": np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)}


# (estimator factory, target). Type-II maximum likelihood (priors=None): the default priors pull
# a far start back to the data's scale in the first search (tests/test_priors.py), and these
# tests are about the second search.
CASES = {
    "VGP logit": (lambda k: VGPClassifier(kernel=k, priors=None), "binary"),
    "VGP multinomial": (lambda k: VGPClassifier(likelihood="softmax", kernel=k, priors=None),
                        "ordered"),
    "VGP ordinal": (lambda k: VGPClassifier(likelihood="ordinal", kernel=k, priors=None),
                    "ordered"),
    "VGP stick-breaking": (lambda k: VGPClassifier(likelihood="stick-breaking", kernel=k,
                                                   priors=None), "ordered"),
    "VGP Poisson": (lambda k: VGPPoissonRegressor(kernel=k, priors=None), "counts"),
    "SVGP probit": (lambda k: SVGPClassifier(kernel=k, n_inducing=20, random_state=0,
                                             priors=None), "binary"),
    "SVGP mf": (lambda k: SVGPClassifier(kernel=k, n_inducing=20, method="mf", random_state=0,
                                         priors=None), "binary"),
    "SVGP softmax": (lambda k: SVGPClassifier(kernel=k, n_inducing=20, random_state=0,
                                              priors=None), "ordered"),
    "SVGP Poisson": (lambda k: SVGPRegressor(kernel=k, likelihood="poisson", n_inducing=20,
                                             random_state=0, priors=None), "counts"),
    "SVGP Gaussian": (lambda k: SVGPRegressor(kernel=k, n_inducing=20, random_state=0,
                                              priors=None), "real"),
}


@pytest.mark.parametrize("lengthscale", [1e-4, 1e4])
@pytest.mark.parametrize("case", list(CASES))
def test_a_far_start_is_searched_again_from_the_data_scale(case, lengthscale):
    # From RBF(lengthscale=1e-4) K(X, X) is numerically diagonal (K(X, Z) numerically zero),
    # from 1e4 numerically constant: the bound's gradients vanish, and the searches stopped
    # there without a word: VGPClassifier a memoriser (training accuracy 1, probabilities
    # 0.41 to 0.59, the prior at new points), the others with the kernel variance at its lower
    # bound 1e-5 and every prediction the class frequencies (accuracy 0.52 where 0.93 is
    # reached from lengthscale 1), R^2 0 for the regressors.
    make, target = CASES[case]
    X, ys = _data()
    y = ys[target]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = make(RBF(lengthscale=lengthscale)).fit(X, y)
        healthy = make(RBF(lengthscale=1.0)).fit(X, y).score(X, y)
    assert est.score(X, y) > healthy - 0.03  # (0.93 and 0.87 for the classifiers, from 0.52)
    # New points get predictions of the fitted function, not the prior's.
    Xt = _data(seed=1)[0]
    spread = np.std(est.predict_proba(Xt)[:, -1] if hasattr(est, "predict_proba")
                    else est.predict(Xt))
    assert spread > 0.1
    assert est.restart_["kept"] == "data-scaled"
    assert est.restart_["reason"] in (("isolated", "unreached") if lengthscale < 1
                                      else ("constant",))
    first, second = est.restart_.get("bounds", est.restart_.get("objectives"))
    assert second > first


def test_the_second_search_is_deterministic_and_keeps_the_kernels_structure():
    # The data-scaled start keeps the given kernel's family and ARD shape, and comes from
    # random_state (the default kernel's heuristic subsamples above 1000 rows).
    X, ys = _data(1200)
    kernel = kernels.Matern32(lengthscale=[1e-4, 1e-4]) + White(0.01)
    fits = [SVGPClassifier(kernel=kernel, n_inducing=10, random_state=3, priors=None)
            .fit(X, ys["binary"]) for _ in range(2)]
    start = fits[0].restart_["start"]
    assert isinstance(start, kernels.Sum) and isinstance(start.kernels[0], kernels.Matern32)
    assert start.kernels[1].variance == 0.01  # (a White term as given)
    assert np.all(start.kernels[0].lengthscale > 0.5)
    np.testing.assert_array_equal(start.params, fits[1].restart_["start"].params)
    np.testing.assert_array_equal(fits[0].kernel_.params, fits[1].kernel_.params)
    assert kernel.kernels[0].lengthscale.tolist() == [1e-4, 1e-4]  # (the caller's untouched)


@pytest.mark.parametrize("Estimator", [VGPClassifier, SVGPClassifier])
@pytest.mark.parametrize("lengthscale, match", [
    (1e-4, r"lengthscales \(0\.0001\) are far below the distances between the training inputs"
           r" \(median 1\.\d\): K\(X, [XZ]\) is numerically (diagonal|zero)"),
    (1e4, r"lengthscales \(1e\+04\) are far above the distances between the training inputs "
          r"\(median 1\.\d\): K\(X, X\) is numerically constant")])
def test_fixed_far_hyperparameters_are_a_convergence_warning(Estimator, lengthscale, match):
    # With the hyperparameters fixed there is no search to repeat: the fit warns, naming the
    # cause with its numbers.
    X, ys = _data()
    kw = dict(n_inducing=20, random_state=0) if Estimator is SVGPClassifier else {}
    est = Estimator(kernel=RBF(lengthscale=lengthscale), optimize_hyperparameters=False, **kw)
    with pytest.warns(ConvergenceWarning, match=match) as caught:
        est.fit(X, ys["binary"])
    assert est.restart_ is None
    assert all(w.filename == __file__ for w in caught if "far" in str(w.message))


@pytest.mark.parametrize("optimizer", ["natgrad", "adam"])
def test_a_far_start_of_a_stochastic_fit_is_a_convergence_warning(optimizer):
    # Minibatch fits are not searched again; they ended at accuracy 0.52 (1e-4: the variance
    # creeping, K(X, Z) zero throughout) without a word.
    X, ys = _data()
    est = SVGPClassifier(kernel=RBF(lengthscale=1e-4), n_inducing=20, optimizer=optimizer,
                         max_iter=5, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, ys["binary"])
    ours = [w for w in caught if "far below" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, ConvergenceWarning)
    assert f"optimizer='lbfgs' would search again from there, '{optimizer}' does not" in str(
        ours[0].message)


def test_partial_fit_warns_of_a_far_start_on_its_first_chunk():
    X, ys = _data()
    est = SVGPClassifier(kernel=RBF(lengthscale=1e4), n_inducing=20, random_state=0)
    with pytest.warns(ConvergenceWarning, match="far above.*first chunk only"):
        est.partial_fit(X[:75], ys["binary"][:75], classes=[0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.partial_fit(X[75:], ys["binary"][75:])  # (later chunks are not checked)


@pytest.mark.parametrize("Estimator", [VGPClassifier, SVGPClassifier])
def test_a_callback_that_stops_the_search_is_not_searched_again(Estimator):
    X, ys = _data()
    kw = dict(n_inducing=20, random_state=0) if Estimator is SVGPClassifier else {}
    est = Estimator(kernel=RBF(lengthscale=1e4), callback=lambda *args: True, **kw)
    with pytest.warns(ConvergenceWarning, match="far above"):
        est.fit(X, ys["binary"])
    assert est.restart_ is None and est.n_iter_ == 1


def _memoriser_data(seed, n=50):
    # Counts around e^5: from the default kernel's median-distance start, L-BFGS-B's first
    # steps leave the search at a lengthscale of 1e-5 in the first feature (seeds 0 and 3): the
    # bound at -304 where starts at 0.5 to 20 reach -223, the log rate at new points
    # uncorrelated with the truth.
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = rng.poisson(np.exp(5.0 + np.sin(3.0 * X[:, 0])))
    Xnew = rng.standard_normal((500, 2))
    return X, y, Xnew, 5.0 + np.sin(3.0 * Xnew[:, 0])


@pytest.mark.parametrize("seed", [0, 3])
def test_a_memoriser_reached_from_the_default_start_is_searched_again_from_a_smoother_one(seed):
    # The default kernel's start is the data-scaled one, so the second search starts from the
    # same structure with lengthscales e^2 longer.
    X, y, Xnew, truth = _memoriser_data(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = VGPPoissonRegressor(random_state=0, priors=None).fit(X, y)
    assert est.restart_["reason"] == "isolated" and est.restart_["kept"] == "data-scaled"
    first, second = est.restart_["objectives"]
    assert first < -300 and second > -230
    default = VGPPoissonRegressor(optimize_hyperparameters=False, random_state=0).fit(X, y)
    np.testing.assert_allclose(est.restart_["start"].lengthscale,
                               np.exp(2.0) * default.kernel_.lengthscale, rtol=1e-12)
    assert np.corrcoef(np.log(est.predict(Xnew)), truth)[0, 1] > 0.95


def test_a_memoriser_the_search_moved_to_is_a_convergence_warning(monkeypatch):
    # Where there is no second start, the memoriser is named.
    import pygpfast.cvi

    monkeypatch.setattr(pygpfast._base._start, "second_start", lambda *args: None)
    X, y, _, _ = _memoriser_data(3)
    with pytest.warns(ConvergenceWarning, match=r"numerically diagonal.*The search moved there "
                                                r"from a start that correlates the inputs"):
        est = VGPPoissonRegressor(random_state=0, priors=None).fit(X, y)
    assert est.restart_ is None


@pytest.mark.parametrize("kernel, scale", [(None, 1.0), (None, 1e3),
                                           (RBF(lengthscale=1.0), 1.0)])
@pytest.mark.parametrize("make", [
    lambda k: VGPClassifier(kernel=k),
    lambda k: VGPClassifier(likelihood="ordinal", kernel=k, priors=None),
    lambda k: SVGPClassifier(kernel=k, n_inducing=20, random_state=0),
    lambda k: SVGPClassifier(kernel=k, n_inducing=20, optimizer="natgrad", max_iter=200,
                             random_state=0),
    lambda k: VGPPoissonRegressor(kernel=k),
    lambda k: SVGPRegressor(kernel=k, n_inducing=20, normalize_y=False, random_state=0)])
def test_healthy_fits_do_not_warn(make, kernel, scale):
    # The default kernel on inputs in any units, and RBF(lengthscale=1) on standardised inputs.
    X, ys = _data()
    est = make(kernel)
    y = ys["counts"] if isinstance(est, VGPPoissonRegressor) else (
        ys["real"] if isinstance(est, SVGPRegressor) else
        ys["ordered"] if getattr(est, "likelihood", None) == "ordinal" else ys["binary"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "SVGP \\(natgrad\\) stopped", ConvergenceWarning)
        est.fit(scale * X, y)
    assert est.restart_ is None


@pytest.mark.parametrize("Estimator", [VGPClassifier, SVGPClassifier])
@pytest.mark.parametrize("lengthscale", [None, 1e-4, 1e4])
def test_labels_without_signal_are_not_a_far_lengthscale(Estimator, lengthscale):
    # Labels without signal are not a degenerate kernel: no warning (the only check before),
    # lengthscales of the data's scale, and from a far start the fit that a start at
    # lengthscale 1 reaches.
    X, _ = _data(300)
    y = np.random.default_rng(5).integers(0, 2, 300)
    kw = dict(n_inducing=20, random_state=0) if Estimator is SVGPClassifier else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = Estimator(kernel=None if lengthscale is None else RBF(lengthscale=lengthscale),
                        **kw).fit(X, y)
        healthy = Estimator(kernel=RBF(lengthscale=1.0), **kw).fit(X, y)
    # Lengthscales within a factor 10 of the median distance between the inputs (1.65):
    # measured 1.4 to 4.1 (the default ARD kernel's; 1.7 and 1.9 isotropic).
    median = np.median(pdist(X))
    assert np.all((est.kernel_.lengthscale > median / 10) & (est.kernel_.lengthscale < 10 * median))
    if lengthscale is not None:
        # From a far start, the optimum of the start at lengthscale 1: objectives measured
        # 6e-8 (VGP) and 2e-6 to 1.1e-5 (SVGP: where L-BFGS-B stops depends on the path; 1.1e-5
        # after the start's median distance changed to the pairs that differ) apart,
        # probabilities at new inputs 1e-4 and 1e-3.
        assert est.objective_ == pytest.approx(healthy.objective_, rel=3e-5)
        Xt = _data(seed=1)[0]
        np.testing.assert_allclose(est.predict_proba(Xt), healthy.predict_proba(Xt), atol=3e-3)


def test_diagnose_reads_the_part_of_the_kernel_that_varies():
    X = np.random.default_rng(0).standard_normal((100, 2))
    common = dict(scale=1.0, who="test", searched=False)
    # A Constant or White term does not hide a memoriser.
    for k in (RBF(lengthscale=1e-4) + Constant(1.0), RBF(lengthscale=1e-4) + White(1.0)):
        assert _diagnose.diagnose(k, X, start=k, **common).kind == "isolated"
    # Neither is a degeneracy on its own, nor a healthy kernel, nor a handful of points.
    for k in (RBF(lengthscale=1.0), RBF() + White(1e-2), Constant(), White()):
        assert _diagnose.diagnose(k, X, start=k, **common) is None
    assert _diagnose.diagnose(RBF(lengthscale=1e-4), X[:5], start=RBF(lengthscale=1e-4),
                            **common) is None
    # Identical inputs are flat for any kernel: not the lengthscales' doing.
    same = np.ones((20, 2))
    assert _diagnose.diagnose(RBF(lengthscale=1e4), same, start=RBF(lengthscale=1e4),
                            **common) is None
