"""The estimator base every family builds on: parameter checks, fitted state and its rollback,
reporting (``verbose``, ``callback``, ``history_``) and the second search after a degenerate
fit. The vocabulary it fixes is written down in GLOSSARY.md."""

import copy
import time

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._version import __version__
from ..exceptions import HeldWarnings
from . import _diagnose, _priors, _start
from ._params import KernelParams, callback_says_stop, check_params

#: The layout of the pickled state of pygpfast's estimators. A release that changes the fitted
#: attributes so that a model pickled by an earlier release would predict wrongly, or not at
#: all, raises it; models pickled with another number are refused when loaded.
STATE_FORMAT = 1


class GPEstimator(KernelParams, BaseEstimator):
    """Base of every pygpfast estimator.

    A family sets ``_parameter_constraints`` (:data:`pygpfast._base._params.COMMON` and its
    own), ``_FITTED`` (the attribute whose presence means fitted) and ``_OBJECTIVE`` (how
    ``verbose`` names the objective: "ELBO", "bound", ...), and may override
    :meth:`_target_scale` (the latent scale the default kernel's variance starts at).

    Fitted attributes every estimator has: ``objective_`` (the value the fit maximised: the
    objective plus ``log_prior_``, the log prior density of the fitted hyperparameters),
    ``history_`` (ndarray [n_iter_], the objective after each iteration), ``n_iter_``,
    ``kernel_`` (the fitted kernel: a copy, never the ``kernel`` parameter itself) and
    ``restart_`` (the second search, or None).
    """

    _parameter_constraints = {}
    _FITTED = "objective_"
    _OBJECTIVE = "objective"

    def _target_scale(self):
        return 1.0

    # ------------------------------------------------------------------ priors
    def _default_priors_on(self):
        """Whether the fit attaches the default priors: priors='default' and a search."""
        return self.priors == "default" and bool(self.optimize_hyperparameters)

    def _with_default_priors(self, kernel, X):
        """`kernel` (a copy the fit owns) with the default priors on the hyperparameters that
        have none set, when :meth:`_default_priors_on`; in place, returned."""
        if self._default_priors_on():
            _priors.attach_default_priors(kernel, X, self._target_scale())
        return kernel

    def _with_default_noise_prior(self, likelihood):
        """`likelihood` with the default prior on its learned parameter (a Gaussian noise
        variance, a learned label-noise probability), when :meth:`_default_priors_on`; in
        place, returned."""
        if self._default_priors_on():
            _priors.attach_default_noise_prior(likelihood, self._target_scale())
        return likelihood

    # ------------------------------------------------------------------ pickling
    def __getstate__(self):
        """The instance's attributes, with the pygpfast version and :data:`STATE_FORMAT` that
        wrote them (``_pygpfast_version``, ``_pygpfast_state_format``)."""
        return dict(super().__getstate__(), _pygpfast_version=__version__,
                    _pygpfast_state_format=STATE_FORMAT)

    def __setstate__(self, state):
        """Load a pickled estimator: silently when it was written with this
        :data:`STATE_FORMAT`, by this or another pygpfast version; else a ValueError that names
        the version that wrote it and this one. (scikit-learn loads any pickle and warns when
        the versions differ; a format number says when a model would no longer predict as it
        did when it was saved.)"""
        state = dict(state)
        version = state.pop("_pygpfast_version", None)
        state_format = state.pop("_pygpfast_state_format", None)
        if state_format != STATE_FORMAT:
            if version is None:
                wrote = "a pygpfast that did not record its version"
                loader = "the pygpfast that wrote it"
            else:
                wrote = loader = f"pygpfast {version}"
            what = "no state format" if state_format is None else f"state format {state_format}"
            raise ValueError(
                f"Cannot load this {type(self).__name__}: it was pickled by {wrote} ({what}), "
                f"and pygpfast {__version__} reads state format {STATE_FORMAT} only. Fit it "
                f"again with pygpfast {__version__}, or load it with {loader}.")
        super().__setstate__(state)

    def __sklearn_is_fitted__(self):
        # (a failed fit removes the marker but may leave other attributes, which scikit-learn's
        # check_is_fitted would take for a fit)
        return hasattr(self, self._FITTED)

    def _check_params(self):
        check_params(self, self._parameter_constraints)

    # ------------------------------------------------------------------ fitted state
    def _fitted_state(self):
        """The attributes that fitting sets: all but the parameters."""
        params = self._get_param_names()
        return {name: value for name, value in vars(self).items() if name not in params}

    def _restore_state(self, state):
        """Replace the fitted attributes by `state` (from :meth:`_fitted_state`)."""
        for name in self._fitted_state():
            delattr(self, name)
        vars(self).update(state)

    def _forget(self):
        """Unfit: a fit that fails leaves no mix of the previous fit and this one."""
        if hasattr(self, self._FITTED):
            delattr(self, self._FITTED)

    # ------------------------------------------------------------------ reporting
    def _start_reporting(self, history=()):
        """A new search: history_ restarts (or continues from `history`), the clock too."""
        self._history = list(history)
        self.history_ = np.array(self._history, dtype=np.float64)
        self._clock = time.perf_counter()
        self._callback_stopped = False

    def _report(self, iteration, objective, detail="", before_callback=None):
        """After each iteration: records the objective in history_, prints it every ``verbose``
        iterations, and calls ``callback(self, iteration, objective)`` (after
        ``before_callback()``, which sets the fitted attributes at the current iterate for it).
        Returns whether the callback asked to stop."""
        self.n_iter_, self.objective_ = iteration, float(objective)
        self._history.append(float(objective))
        if self.verbose and iteration % self.verbose == 0:
            detail = f"  {detail}" if detail else ""
            print(f"[{type(self).__name__}] iter {iteration:5d}  {self._OBJECTIVE} "
                  f"{objective: .6e}{detail}  {time.perf_counter() - self._clock:.1f} s",
                  flush=True)
        if self.callback is None:
            return False
        if before_callback is not None:
            before_callback()
        self.history_ = np.array(self._history)
        stop = callback_says_stop(self.callback(self, iteration, float(objective)))
        self._callback_stopped = self._callback_stopped or stop
        return stop

    def _end_reporting(self):
        """history_ as the ndarray of the search kept; the running list goes."""
        if hasattr(self, "_history"):
            self.history_ = np.array(self._history, dtype=np.float64)
            del self._history

    # ------------------------------------------------------------------ searches
    def _diagnose(self, sample, start, searched):
        """The fitted kernel_'s degeneracy on `sample` (a Degeneracy, or None); see
        :func:`pygpfast._base._diagnose.diagnose`."""
        return _diagnose.diagnose(self.kernel_, sample, start=start, scale=self._target_scale(),
                                  who=type(self).__name__, searched=searched,
                                  fixed=not self.optimize_hyperparameters,
                                  Z=getattr(self, "inducing_points_", None))

    def _search_twice(self, search, X, start, random_state, *, may_search_again):
        """Run ``search(None)`` (the first search, from `start`), and when it ends degenerate (or,
        with priors on the hyperparameters, started degenerate) and `may_search_again`,
        ``search(kernel)`` from the data-scaled start
        (:func:`pygpfast._base._start.second_start`); keep whichever reaches the higher
        objective_, with pygpfast's warnings of that search only, and record both in restart_.

        ``search(kernel)`` runs one search and sets the fitted attributes (objective_, kernel_,
        ...); it returns whether the callback stopped it (a stopped search is not repeated).
        Returns the kept fit's Degeneracy (None when healthy, or when both searches ended at a
        constant latent function: labels without signal), for the family to warn about.
        """
        sample = _start.diagnosis_sample(X)
        self.restart_ = None
        with HeldWarnings(may_search_again) as held:
            stopped = search(None)
        found = self._diagnose(sample, start, self.optimize_hyperparameters)
        again = found
        if (found is None and may_search_again and not stopped and start.has_priors
                and self.kernel is not None):  # (the default kernel starts at the data's scale)
            # Priors pull a search off a degenerate start (the lengthscales towards the data's
            # scale), but it may stall on the way where the objective is still nearly flat:
            # from RBF(lengthscale=1e-4), SVGP Poisson stopped at a log joint of -554 (R^2
            # 0.04) against -278 from the data's scale. Such a start is searched again too.
            again = _diagnose.diagnose(start, sample, start=start, scale=self._target_scale(),
                                       who=type(self).__name__, searched=False,
                                       Z=getattr(self, "inducing_points_", None))
        if again is not None and may_search_again and not stopped:
            scale = self._target_scale()
            scaled = _start.second_start(start, X, random_state, scale)
            if scaled is not None:
                first = self._fitted_state()
                if self.verbose:
                    what = "ended" if found is not None else "started"
                    print(f"[{type(self).__name__}] the search {what} degenerate ({again.kind}); "
                          f"searching again from {scaled!r}", flush=True)
                with HeldWarnings() as held_second:
                    search(copy.deepcopy(scaled))
                second = self._fitted_state()
                kept = "data-scaled" if self.objective_ >= first["objective_"] else "given"
                both_constant = _start.both_constant(first["kernel_"], self.kernel_, scaled,
                                                     sample, scale)
                if kept == "given":
                    self._restore_state(first)
                else:
                    held, start = held_second, scaled
                self._combine_searches(first, second)
                self.restart_ = {"reason": again.kind, "start": copy.deepcopy(scaled),
                                 "kept": kept,
                                 "objectives": (float(first["objective_"]),
                                                float(second["objective_"])),
                                 "both_constant": both_constant}
                found = self._diagnose(sample, start, True)
                if found is not None and both_constant:
                    found = None  # (both starts agree: the data show no signal)
        held.release()
        return found

    def _combine_searches(self, first, second):
        """After a second search, with the kept one's state in place: counters that add up
        over both searches (a family's hook)."""


class GPClassifierMixin:
    """predict from predict_proba, for the classifiers of every family."""

    def predict(self, X):
        """Most probable class [T] for X [T, D]."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
