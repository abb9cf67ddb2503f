"""The second search after a degenerate full-batch fit (restart_; the estimators' Notes): the
warnings of the search it discards are dropped and those of the search kept are issued, and a
start on which the prior is flat (a kernel variance of 1e-8: "stalled") is searched again like a
start with far-off lengthscales."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

import pygpfast
import pygpfast.cvi
import pygpfast.svgp
from pygpfast import (SVGPClassifier, SVGPRegressor, VGPClassifier, VGPPoissonRegressor,
                      likelihoods)
from pygpfast.exceptions import HeldWarnings
from pygpfast.kernels import RBF, Linear
from test_far_lengthscales import _data

# (estimator factory with keyword arguments, target)
CASES = {
    "VGP logit": (lambda k, **kw: VGPClassifier(kernel=k, **kw), "binary"),
    "VGP Poisson": (lambda k, **kw: VGPPoissonRegressor(kernel=k, **kw), "counts"),
    "SVGP probit": (lambda k, **kw: SVGPClassifier(kernel=k, n_inducing=20, optimizer="lbfgs",
                                                   random_state=0, **kw), "binary"),
    "SVGP mf": (lambda k, **kw: SVGPClassifier(kernel=k, n_inducing=20, method="mf",
                                               random_state=0, **kw), "binary"),
    "SVGP Poisson": (lambda k, **kw: SVGPRegressor(kernel=k, likelihood=likelihoods.Poisson(),
                                                   n_inducing=20, optimizer="lbfgs",
                                                   random_state=0, **kw), "counts"),
    "SVGP Gaussian": (lambda k, **kw: SVGPRegressor(kernel=k, n_inducing=20, optimizer="lbfgs",
                                                    random_state=0, **kw), "real"),
}


def _objective(est):
    return est.bound_ if hasattr(est, "bound_") else est.elbo_


def _caught(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = fit()
    return est, caught


# ---------------------------------------------------------------- the discarded search's warnings

def test_the_warnings_of_a_discarded_search_are_dropped():
    # From RBF(lengthscale=1e-4) method='mf' needs 17 L-BFGS-B iterations to reach its
    # degenerate end (ELBO -104.0), the second search 11 to reach -36.5. With max_iter=15 the
    # first stopped at max_iter and its ConvergenceWarning reached the user although the fit
    # kept the second search, which converged.
    X, ys = _data()
    make, target = CASES["SVGP mf"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = make(RBF(lengthscale=1e-4), max_iter=15).fit(X, ys[target])
    assert est.restart_["kept"] == "data-scaled"
    first, second = est.restart_["elbos"]
    assert first < -100 and second > -37


def test_the_warnings_of_the_search_kept_are_issued_at_the_callers_line():
    # From RBF(lengthscale=1e4) the first search converges (5 iterations), the second stops at
    # max_iter=10: the fit kept is the one that stopped short, and says so.
    X, ys = _data()
    make, target = CASES["SVGP mf"]
    est, caught = _caught(lambda: make(RBF(lengthscale=1e4), max_iter=10).fit(X, ys[target]))
    assert est.restart_["kept"] == "data-scaled"
    assert [str(w.message) for w in caught] == [
        "SVGP (mf): L-BFGS-B stopped after max_iter=10 iterations; increase max_iter for a "
        "tighter fit"]
    assert caught[0].category is ConvergenceWarning and caught[0].filename == __file__


def _tagging_callback(stop_second):
    """A callback that warns at every iteration, naming the search (each counts its iterations
    from 1), and stops the second one at once when `stop_second`."""
    searches = []

    def callback(est, iteration, objective):
        if iteration == 1:
            searches.append(iteration)
        warnings.warn(f"in search {len(searches)}", UserWarning)
        return stop_second and len(searches) == 2

    return callback


@pytest.mark.parametrize("case", ["VGP logit", "VGP Poisson", "SVGP probit", "SVGP mf",
                                  "SVGP Gaussian"])
@pytest.mark.parametrize("kept", ["data-scaled", "given"])
def test_only_the_search_kept_warns(monkeypatch, case, kept):
    # Any warning issued during a search (here the callback's) is the kept search's or none.
    make, target = CASES[case]
    X, ys = _data()
    if kept == "given":
        # A second start that is worse, stopped at its first iteration: a memoriser with a
        # kernel variance of 1e4 (bound -158 for VGPClassifier, ELBO -3.7e5 for
        # SVGPClassifier, against the first search's -104).
        def worse(start, X, random_state, variance=1.0):
            return RBF(variance=1e4, lengthscale=1e-4)

        for module in (pygpfast.svgp, pygpfast.cvi):
            monkeypatch.setattr(module, "_second_start", worse)
    est, caught = _caught(lambda: make(RBF(lengthscale=1e4),
                                       callback=_tagging_callback(kept == "given"))
                          .fit(X, ys[target]))
    assert est.restart_["kept"] == kept
    ours = [w for w in caught if w.category is UserWarning]
    searched = "in search 2" if kept == "data-scaled" else "in search 1"
    assert {str(w.message) for w in ours} == {searched}
    assert len(ours) == 1 and ours[0].filename == __file__  # (once, at the callback's line)
    degenerate = [w for w in caught if w.category is ConvergenceWarning]
    if kept == "given":  # (the first search ended degenerate, and is kept)
        assert len(degenerate) == 1 and "reached a lower" in str(degenerate[0].message)
    else:
        assert not degenerate


def test_a_search_that_fails_issues_its_warnings():
    # The warnings before a failure are not lost with the search.
    make, target = CASES["SVGP probit"]
    X, ys = _data()

    def callback(est, iteration, objective):
        warnings.warn("before the failure", UserWarning)
        raise KeyError("the callback failed")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError, match="the callback failed"):
            make(RBF(), callback=callback).fit(X, ys[target])
    assert [str(w.message) for w in caught] == ["before the failure"]


def test_a_held_warning_from_a_command_line_script_is_issued():
    # A release that gave warnings.warn_explicit the module globals of the warning's location
    # had their __loader__ asked for the source line, which for ``python -c``'s __main__
    # raises ImportError: the fit failed.
    script = ("import numpy as np, pygpfast\n"
              "X = np.random.default_rng(0).standard_normal((60, 2))\n"
              "pygpfast.VGPClassifier(max_iter=2).fit(X, (X[:, 0] > 0).astype(int))\n")
    root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    out = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    assert "<string>:3: ConvergenceWarning: hyperparameter optimisation stopped" in out.stderr


def _warn_from_another_module(message):
    exec(compile("import warnings\nwarnings.warn(message)\n", "elsewhere.py", "exec"),
         {"__name__": "package.elsewhere", "message": message})


def test_held_warnings_are_issued_as_they_were_at_the_release():
    # Each once at its location, through the filters in force at the release: those that
    # match its module, and an "error" filter, which raises it there and not inside the search.
    with HeldWarnings() as held:
        for _ in range(3):
            warnings.warn("here", UserWarning)
        _warn_from_another_module("elsewhere")
        warnings.warn("outside the stack", UserWarning, stacklevel=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module="package")  # (its module, not its file's name)
        held.release()
    assert [(str(w.message), w.filename) for w in caught] == [
        ("here", __file__), ("outside the stack", "sys")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with HeldWarnings() as held:
            warnings.warn("an error at the release", UserWarning)
        with pytest.raises(UserWarning, match="an error at the release"):
            held.release()


# ---------------------------------------------------------------- a flat start

@pytest.mark.parametrize("case", list(CASES))
def test_a_flat_start_is_searched_again_from_the_data_scale(case):
    # From RBF(variance=1e-8) the prior varies across the inputs by 1e-8: the bound's gradients
    # are as small, and the searches stopped at once (0 to 2 iterations) with the bound at the
    # prior's (-104.0 for the classifiers, where -33 is reached from variance 1, -36.5 by 'mf';
    # -561 against -273 for Poisson counts; -213 against 28 for the Gaussian), the latent
    # function numerically zero (probabilities 0.5 everywhere, accuracy 0.93 only by the sign
    # of a mean of 1e-8; R^2 0 for the regressors) and a ConvergenceWarning.
    make, target = CASES[case]
    X, ys = _data()
    y = ys[target]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = make(RBF(variance=1e-8, lengthscale=1.0)).fit(X, y)
        healthy = make(RBF(lengthscale=1.0)).fit(X, y)
    assert est.restart_["reason"] == "stalled" and est.restart_["kept"] == "data-scaled"
    assert est.restart_["start"].variance == 1.0  # (the latent scale, as the default kernel's)
    first, second = est.restart_.get("bounds", est.restart_.get("elbos"))
    assert first < _objective(healthy) - 50 and second == _objective(est)
    # (the healthy fit's optimum, or one as good: within 0.07 measured)
    assert _objective(est) == pytest.approx(_objective(healthy), abs=0.2)
    assert est.score(X, y) == pytest.approx(healthy.score(X, y), abs=0.01)
    Xt = _data(seed=1)[0]
    spread = np.std(est.predict_proba(Xt)[:, -1] if hasattr(est, "predict_proba")
                    else est.predict(Xt))
    assert spread > 0.1


@pytest.mark.parametrize("how", ["natgrad", "no lengthscales", "callback", "flat factor"])
def test_a_flat_start_that_remains_is_a_convergence_warning(how):
    # Where there is no second search (a stochastic optimizer, a kernel without lengthscales to
    # set from the data, a search the callback stopped), the flat start is named; so it is where
    # the data-scaled start is flat too (a factor without lengthscales keeps it so), which the
    # fit took for labels without signal when both searches ended constant, without a word.
    X, ys = _data()
    kernel = {"no lengthscales": Linear(variance=1e-8),
              "flat factor": Linear(variance=1e-8) * RBF()}.get(how, RBF(variance=1e-8))
    kw = {"natgrad": dict(optimizer="natgrad", max_iter=5),
          "callback": dict(optimizer="lbfgs", callback=lambda *args: True)}.get(
              how, dict(optimizer="lbfgs"))
    est, caught = _caught(lambda: SVGPClassifier(kernel=kernel, n_inducing=20, random_state=0,
                                                 **kw).fit(X, ys["binary"]))
    flat = [w for w in caught if "a draw from the prior varies across the training inputs by a "
            "variance of only" in str(w.message)]
    assert len(flat) == 1 and flat[0].category is ConvergenceWarning
    message = str(flat[0].message)
    assert ("optimizer='lbfgs' would search again from there, 'natgrad' does not" in message) \
        == (how == "natgrad")
    if how == "flat factor":
        assert est.restart_["reason"] == "stalled" and not est.restart_["both_constant"]
        assert "a second search, from a kernel variance and lengthscales" in message
    else:
        assert est.restart_ is None


@pytest.mark.parametrize("Estimator", [VGPClassifier, SVGPClassifier])
def test_fixed_hyperparameters_are_not_searched_again(Estimator):
    # A kernel variance the user fixed is theirs: no second search replaces it (nor is it
    # warned about: kernels.diagnose's "stalled" check needs a search, see the Notes).
    X, ys = _data()
    kw = dict(n_inducing=20, random_state=0) if Estimator is SVGPClassifier else {}
    est = Estimator(kernel=RBF(variance=1e-8), optimize_hyperparameters=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.fit(X, ys["binary"])
    kernel = est.kernel_ if Estimator is VGPClassifier else est.model_.kernel
    assert est.restart_ is None and kernel.variance == pytest.approx(1e-8, rel=1e-12)
