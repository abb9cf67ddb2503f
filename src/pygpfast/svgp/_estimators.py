"""The SVGP estimators, :class:`SVGPClassifier` and :class:`SVGPRegressor`: the model is in
:mod:`._model`, its optimisers in :mod:`._optim`, the mean-field method in :mod:`._mf`."""

import copy
import time
import warnings

import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import LabelEncoder
from sklearn.utils import assert_all_finite, check_random_state, column_or_1d
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets, unique_labels
from sklearn.utils.validation import check_consistent_length, check_is_fitted, validate_data

from .. import likelihoods as _likelihoods
from .._base._memory import check_fits, explain_memory_error
from .._base._streaming import block_rows, check_rows, iter_blocks, minibatches
from .._base import _docs, _priors, _start
from .._base._estimator import GPClassifierMixin, GPEstimator
from .._base._params import (BOOL, COMMON, NONE, Interval, Kind, Options, check_int,
                             check_params)
from .._validation import (as_matrix, as_vector, check_counts, check_same_dim, core_array,
                           power_of_two_unit)
from ..exceptions import JitterReport, warn_at_caller
from . import _mf
from ._model import SVGP
from ._optim import StochasticTrainer, fit_lbfgs, natural_gap

__all__ = ["SVGPClassifier", "SVGPRegressor"]


class _SVGPEstimator(GPEstimator):
    """Shared fitting logic of SVGPClassifier and SVGPRegressor."""

    _FITTED = "model_"
    _OBJECTIVE = "ELBO"
    _parameter_constraints = {
        **COMMON,
        "n_inducing": (Interval(int, 1, None),),
        "inducing_points": (NONE, Kind(lambda v: not isinstance(v, (str, bool)), "an array [M, D]")),
        "method": (Options("kl", "mf"),),
        "whiten": (BOOL,),
        "optimizer": (Options("auto", "lbfgs", "natgrad", "adam", "adadelta"),),
        "batch_size": (Options("auto"), Interval(int, 1, None)),
        "learning_rate": (Options("auto"), Interval(float, 0.0, None, closed="neither")),
        "natgrad_step": (Options("auto"), Interval(float, 0.0, 1.0, closed="right")),
        "max_iter": (NONE, Interval(int, 1, None)),
        "n_iter_no_change": (Interval(int, 1, None),),
        "train_inducing": (BOOL,),
    }

    #: Peak memory of a fit in float64 M x M matrices, (a, b) for a L + b with L latent
    #: functions: q_sqrt and its gradient, L-BFGS-B's correction pairs over the packed q (10
    #: pairs of L M^2 / 2 each, and its workspace), the natural gradients' precisions, Adam's
    #: moments, the core's K(Z, Z) factors. A little under the measured peaks (resident set):
    #: L-BFGS-B 37.5 M^2 doubles at L = 1 (M = 2100) and 155 at L = 5 (M = 1000); natgrad 16.6,
    #: 54 and 1550 at L = 1, 5 and 200 (M = 600); Adam 19.9 at L = 1. The mean-field method
    #: counts as L-BFGS-B. The stochastic optimisers' fit holds one more L M^2 for the q_sqrt of
    #: its best epoch (_run_epochs' snapshot), not in those measurements.
    _FIT_MATRICES = {"lbfgs": (28, 5), "natgrad": (8.5, 8), "adam": (13, 7), "adadelta": (13, 7)}

    #: optimizer="auto" uses full-batch L-BFGS-B up to this many rows.
    LBFGS_AUTO_MAX_ROWS = 10_000
    #: batch_size="auto".
    AUTO_BATCH_SIZE = 256
    #: learning_rate="auto" per optimizer.
    AUTO_LEARNING_RATE = {"natgrad": 0.01, "adam": 0.01, "adadelta": 0.1}
    #: natgrad_step="auto" (non-conjugate or minibatch): see _HarmonicStep.
    _NATGRAD_FLOOR_EPOCHS = 1.0
    #: Adam and Adadelta (fit): the factor on the step size at each plateau of the ELBO, and
    #: the most reductions before a plateau stops the fit (see _run_epochs).
    _STEP_REDUCTION = 0.2
    _MAX_STEP_REDUCTIONS = 2
    #: The stochastic optimisers (fit): an epoch whose mean ELBO per row falls below the best
    #: so far (the start's included) by more than this, relative to max(1, |best ELBO / N|),
    #: or is not finite, has diverged (see _run_epochs). Healthy fits' epochs fell below their
    #: best by minibatch noise only: at most 6% (Adam, Adadelta and natural gradients at their
    #: default steps on 300 rows, probit, Gaussian and Poisson), 48% for natural gradients on
    #: Poisson counts of 1e4 (2000 rows, M = 20); at learning_rate=1e3 the same fits fell by
    #: factors of 14 to 1e232.
    _DIVERGENCE = 2.0
    #: ... and so has an epoch in which one step moved a packed coordinate (a log
    #: hyperparameter, Z in units of its spread) by more than this: a factor of 1000 in a
    #: hyperparameter. Adam's steps are at most about 3.2 learning_rate (its bias-corrected
    #: ratio), so only steps of learning_rate above about 2 reach it; at 1e3 natural gradients
    #: on probit threw the hyperparameters from one bound of their box to the other while the
    #: ELBO stayed near the start's (it cannot fall far: log Phi <= 0).
    _MAX_MOVE = np.log(1e3)
    #: Adam and Adadelta (fit): a ConvergenceWarning when one full-data natural-gradient step
    #: on q(u) would raise the ELBO per row by more than this (relative to max(1, |ELBO / N|)).
    _Q_GAP_TOL = 0.01

    # Subclasses implement:
    #   _encode_targets(y, first_call, classes) -> float64 targets for the core
    #   _make_likelihood() -> the likelihood (after _encode_targets)
    # and may override _target_scale() (the default kernel's variance, after _encode_targets)
    # and _prior_mean(t) (the starting constant mean, learned with the hyperparameters; None:
    # a zero mean, not learned).

    def _prior_mean(self, t):
        return None

    # ---------------------------------------------------------------- parameters
    def _check_params(self):
        check_params(self, self._parameter_constraints)
        if self.method == "mf":
            _mf.check_estimator_params(self)

    def _resolve_optimizer(self, n_rows, streaming):
        if self.optimizer == "auto":
            return "natgrad" if streaming or n_rows > self.LBFGS_AUTO_MAX_ROWS else "lbfgs"
        if streaming and self.optimizer == "lbfgs":
            raise ValueError(
                "partial_fit takes minibatch steps; optimizer='lbfgs' is full-batch. Use "
                "optimizer='auto', 'natgrad', 'adam' or 'adadelta'."
            )
        return self.optimizer

    def _batch_size(self, n_rows):
        return min(n_rows, self.AUTO_BATCH_SIZE if self.batch_size == "auto" else self.batch_size)

    def _natgrad_schedule(self, likelihood, full_batch):
        """rho(t) for natural-gradient step t = 0, 1, ..."""
        if self.natgrad_step != "auto":
            return _ConstantStep(float(self.natgrad_step))
        if isinstance(likelihood, _likelihoods.Gaussian) and full_batch:
            return _ConstantStep(1.0)
        return _HarmonicStep(self._NATGRAD_FLOOR_EPOCHS)

    def _make_trainer(self, model, optimizer, full_batch):
        lr = self.learning_rate
        if lr == "auto":
            lr = self.AUTO_LEARNING_RATE[optimizer]
        return StochasticTrainer(
            model, optimizer=optimizer, learning_rate=float(lr),
            natgrad_step=self._natgrad_schedule(model.likelihood, full_batch),
            train_Z=self.train_inducing, train_hyper=self.optimize_hyperparameters,
        )

    # ---------------------------------------------------------------- data
    def _validate_Xy(self, X, y, reset):
        rows = check_rows(X, estimator=self)
        validate_data(self, X, y, skip_check_array=True, reset=reset)  # feature names and count
        y = column_or_1d(y, warn=True)
        assert_all_finite(y, input_name="y")
        check_consistent_length(rows, y)
        return rows, y

    def _validate_X(self, X):
        check_is_fitted(self, "model_")
        rows = check_rows(X, estimator=self)
        validate_data(self, X, skip_check_array=True, reset=False)
        return rows

    def _memory_plan(self, M, L, optimizer, call):
        """(M, bytes per M^2, what, advice) of a fit (by `call`) with M inducing points and L
        latent functions, for pygpfast._base._memory's check_fits and explain_memory_error."""
        how = "method='mf'" if self.method == "mf" else f"optimizer={optimizer!r}"
        optimizer = "lbfgs" if self.method == "mf" else optimizer  # (its L-BFGS-B's count)
        a, b = self._FIT_MATRICES[optimizer]
        matrices = a * L + b
        latents = f", {L} latent functions" if L > 1 else ""
        what = (f"{type(self).__name__}.{call} ({how}) with M = {M} inducing "
                f"points{latents} holds about {matrices} M x M float64 matrices, which")

        def advice(largest):
            fewer = f"n_inducing at most {largest}" if largest >= 1 else "fewer inducing points"
            if optimizer == "lbfgs" and self.method == "kl":
                fewer += " or optimizer='natgrad' (about a third of L-BFGS-B's memory)"
            return f"memory grows as M^2; use {fewer}"

        return M, 8.0 * matrices, what, advice

    def _init_model(self, X, t, rs, optimizer, call="fit"):
        """(the starting SVGP, its memory plan); MemoryError, before the k-means of the
        inducing inputs, when the fit cannot fit in memory."""
        if self.inducing_points is not None:
            Z = as_matrix(self.inducing_points, "inducing_points")
            check_same_dim(X, Z, "inducing_points")
            M = Z.shape[0]
        else:
            Z, M = None, min(self.n_inducing, X.shape[0])
        likelihood = self._with_default_noise_prior(self._make_likelihood())
        memory = self._memory_plan(M, likelihood.n_latent, optimizer, call)
        check_fits(*memory)
        kernel = _start.start_kernel(self.kernel, X, rs, self._target_scale())
        self._with_default_priors(kernel, X)
        if Z is None:
            Z = _start.init_inducing(X, M, rs)
        return SVGP(kernel, likelihood, Z, whiten=self.whiten, jitter=self.jitter,
                    prior_mean=self._prior_mean(t)), memory

    def _set_model(self, model):
        self.model_ = model
        self.kernel_ = model.kernel
        self.likelihood_ = model.likelihood

    @property
    def inducing_points_(self):
        """The fitted inducing inputs Z [M, D] (``model_.Z``)."""
        # (model_.Z itself: the optimisers replace that array at every step, and an attribute
        # set with the model kept the starting Z after the stochastic optimisers and partial_fit.)
        return self.model_.Z

    # ---------------------------------------------------------------- fitting
    def fit(self, X, y):
        """Fit the SVGP by maximising the ELBO.

        Parameters
        ----------
        X : array_like [N, D]
            A numpy array or ``np.memmap`` of any numeric dtype is read in blocks, never copied
            whole (except by ``optimizer='lbfgs'``, which holds X as one float64 array).
        y : array_like [N]

        Returns
        -------
        self
        """
        self._check_params()
        self._forget()  # (a refit that fails leaves the estimator unfitted, not mixed)
        X, y = self._validate_Xy(X, y, reset=True)
        t = self._encode_targets(y, first_call=True)
        try:
            with JitterReport():  # (one NumericalWarning for all the fit's escalations)
                return self._fit_encoded(X, t)
        except BaseException:  # (a failed step, or a callback that raised, KeyboardInterrupt too)
            self._forget()
            raise

    def _fit_encoded(self, X, t):
        rs = check_random_state(self.random_state)
        N = X.shape[0]
        optimizer = self._resolve_optimizer(N, streaming=False)
        model, memory = self._init_model(X, t, rs, optimizer)
        start, Z0 = copy.deepcopy(model.kernel), model.Z.copy()
        # (partial_fit's, as a fit weighs minibatches against N; method='mf''s, set again by
        # _fit_mf: both described an earlier fit)
        for stale in ("n_total_", "mf_a_"):
            if hasattr(self, stale):
                delattr(self, stale)
        self._rng, self._trainer, self.n_rows_seen_ = rs, None, N
        self._started_with = self.get_params(deep=False)  # (for partial_fit's later calls)
        full_batch = self.method == "mf" or optimizer == "lbfgs"

        def search(kernel):
            # The first search fits the model started above; a second one, from `kernel`, a
            # model with the same starting Z, q(u) and likelihood.
            fitted = model if kernel is None else SVGP(
                kernel, self._with_default_noise_prior(self._make_likelihood()), Z0,
                whiten=self.whiten, jitter=self.jitter, prior_mean=self._prior_mean(t))
            self._set_model(fitted)
            self._start_reporting()
            self._fit_model(fitted, X, t, optimizer)
            self._end_reporting()
            return self._callback_stopped

        with explain_memory_error(*memory):
            found = self._search_twice(search, X, start, rs, may_search_again=(
                self.optimize_hyperparameters and full_batch))
        if found is not None:
            suffix = _start.second_search_clause(self.restart_, "ELBO")
            if (self.restart_ is None and self.optimize_hyperparameters and not full_batch
                    and _start.has_stationary_leaf(start)):
                suffix = (f"; the full-batch optimizer='lbfgs' would search again from "
                          f"there, {self.optimizer_!r} does not")
            found.warn(stacklevel=3, suffix=suffix)
        return self

    #: max_iter=None: L-BFGS-B iterations, and epochs of the stochastic optimisers.
    _DEFAULT_ITERATIONS = {"lbfgs": 5000, "epochs": 1000}

    def _max_iter(self, optimizer):
        """max_iter for `optimizer` ('lbfgs' or a stochastic one), None resolved."""
        if self.max_iter is not None:
            return self.max_iter
        return self._DEFAULT_ITERATIONS["lbfgs" if optimizer == "lbfgs" else "epochs"]

    def _fit_model(self, model, X, t, optimizer):
        """Fit `model` by the method and the (resolved) optimizer."""
        if self.method == "mf":
            self._fit_mf(model, core_array(X), t)
        else:
            self._fit_kl(model, X, t, optimizer)
        self.log_prior_ = self._log_prior(self.model_)

    @staticmethod
    def _log_prior(model):
        """The log prior density of the model's kernel and likelihood parameters (0.0 without
        priors): log_prior_."""
        return float(model.kernel.log_prior() + model.likelihood.log_prior())

    def _fit_kl(self, model, X, t, optimizer):
        """method='kl' with the (resolved) optimizer: L-BFGS-B or minibatch steps."""
        N = X.shape[0]
        self.optimizer_ = optimizer
        if optimizer == "lbfgs":
            X = core_array(X)
            self.n_iter_, problem = fit_lbfgs(
                model, X, t, train_Z=self.train_inducing, train_hyper=self.optimize_hyperparameters,
                max_iter=self._max_iter("lbfgs"), tol=self.tol, report=self._report_step,
            )
            converged = problem != "max_iter"
            if problem not in (None, "max_iter"):
                warn_at_caller(f"SVGP: {problem}; the fit may be far from the optimum (a "
                               "near-singular K(Z, Z)? larger jitter, distinct inducing_points "
                               "or whiten=True can help)", ConvergenceWarning)
            self._set_model(model)
            self.objective_ = model.elbo(X, t)[0]
            if model.kernel.has_priors or model.likelihood.has_priors:
                self.objective_ += self._log_prior(model)
            self.n_steps_ = self.n_iter_
            unit = "iterations"
        else:
            B = self._batch_size(N)
            self._trainer = self._make_trainer(model, optimizer, full_batch=B == N)
            self.n_iter_, stopped, gap = self._run_epochs(X, t, B)
            self.n_steps_ = self._trainer.t
            converged = stopped != "max_iter"
            unit = "epochs"
            if stopped == "diverged":
                (kept, top, move), fell = gap, self._history[-1]
                where = "the start" if kept == 0 else f"epoch {kept}"
                what = (f"the ELBO per row fell to {fell / N:.4g} from {top / N:.4g} at {where}"
                        if self._fell(fell, top, N)
                        else f"one step moved a log hyperparameter or inducing input by {move:.3g}")
                warn_at_caller(
                    f"SVGP ({optimizer}) diverged: in epoch {self.n_iter_} {what}; the parameters "
                    f"of {where} are kept (ELBO {top:.6g}, objective_). The steps are too large: "
                    f"reduce learning_rate (Adam's or Adadelta's step size, "
                    f"{self._trainer.opt.lr:g} here)"
                    + (" or natgrad_step" if self._trainer.natural else ""),
                    ConvergenceWarning)
            if stopped == "q_gap":
                (gap, scale), opt = gap, self.optimizer_
                measured = (f"one natural-gradient step on q(u) would still raise it by {gap:.3g} "
                            f"per row ({gap / scale:.1%} of its size)" if np.isfinite(gap) else
                            "every natural-gradient step on q(u), down to size 1e-9, overshoots "
                            "(the gap cannot be measured)")
                warn_at_caller(
                    f"SVGP ({opt}) stopped after {self.n_iter_} epochs with q(u) far from its "
                    f"optimum: the ELBO stalled at step size learning_rate * "
                    f"{self._trainer.step_scale:.3g} (reduced {self._MAX_STEP_REDUCTIONS} times), "
                    f"and {measured}. {opt.capitalize()}'s steps are about "
                    "the step size in every parameter whatever the curvature of the ELBO, and "
                    "crawl or jitter where q(u) is sharply peaked (large counts, a small noise "
                    "variance, many rows per inducing point); use optimizer='natgrad', which "
                    "steps q(u) by its curvature",
                    ConvergenceWarning)
        if not converged:
            warn_at_caller(
                f"SVGP ({self.optimizer_}) stopped after max_iter={self._max_iter(self.optimizer_)} "
                f"{unit} before the ELBO per row stopped improving by tol={self.tol:g}; increase "
                "max_iter for a tighter fit",
                ConvergenceWarning,
            )

    def _run_epochs(self, X, t, B):
        """Epochs of ceil(N / B) minibatch steps until the epoch-mean ELBO per row has not
        improved on its best by more than tol for n_iter_no_change epochs (a plateau).

        Natural gradients stop at the first plateau. Adam and Adadelta, whose steps are about
        learning_rate in every parameter whatever the curvature of the ELBO, may plateau
        because their steps do not suit q(u) (on a sharply peaked q(u) they jitter across its
        narrow directions and crawl along the others), not because the ELBO is at its
        optimum: at their plateaus the natural-gradient gap of q(u) is measured (_q_gap).
        Within _Q_GAP_TOL the fit stops; otherwise the step size is multiplied by
        _STEP_REDUCTION and the epochs go on (the jitter shrinks with the step), up to
        _MAX_STEP_REDUCTIONS times, after which the fit stops with the gap reported.
        Measured: Adam at 0.01 on Poisson counts of 6e4 (20 000 rows, M = 30) stalled at an
        ELBO of -7.41 per row against natural gradients' -7.02, and reached -7.02 after the two
        reductions; on 2000 rows it stalled at -31.6 against -7.5 and the reductions do not
        help (the crawl only slows), so that fit warns.

        Divergence: the parameters at the best epoch (by its mean ELBO, plus the log prior when
        there are priors), or at the start (its full-data value, one pass), are kept. An epoch
        that falls below that best by more than _DIVERGENCE max(1, |best / N|) per row, whose
        ELBO is not finite, or in which a step moved a coordinate by more than _MAX_MOVE, ends
        the fit with them restored (objective_ their value).

        Returns (epochs, why it stopped: 'converged', 'callback', 'max_iter', 'q_gap' or
        'diverged', and for 'q_gap' the last (gap, scale) measured, for 'diverged' (the epoch
        kept, 0 for the start, its objective, the largest move of the last epoch), else the
        last gap measured or None)."""
        N = X.shape[0]
        batches = minibatches(X, t, B, self._rng)
        steps = -(-N // B)
        trainer = self._trainer
        best, stall, reductions, gap = -np.inf, 0, 0, None
        top, kept = self._data_objective(X, t, B), (0, self._snapshot())
        max_iter = self._max_iter(self.optimizer_)
        for epoch in range(1, max_iter + 1):
            t0 = time.perf_counter()
            elbo, rows = trainer.run(batches, steps, N)
            if self._report_step(epoch, elbo, rows / max(time.perf_counter() - t0, 1e-12)):
                return epoch, "callback", gap
            if (self._fell(elbo, top, N)
                    or trainer.largest_move > self._MAX_MOVE):
                self._restore(kept[1])
                self.objective_ = top
                return epoch, "diverged", (kept[0], top, trainer.largest_move)
            if elbo > top:
                top, kept = elbo, (epoch, self._snapshot())
            if elbo / N > best + self.tol:
                best, stall = elbo / N, 0
                continue
            stall += 1
            if stall < self.n_iter_no_change:
                continue
            if trainer.natural:
                return epoch, "converged", gap
            gap = self._q_gap(X, t, B)
            if gap[0] <= self._Q_GAP_TOL * gap[1]:
                return epoch, "converged", gap
            if reductions == self._MAX_STEP_REDUCTIONS:
                return epoch, "q_gap", gap
            trainer.reduce_step(self._STEP_REDUCTION)
            reductions += 1
            stall = 0
            if self.verbose:
                short = f"{gap[0]:.3g} per row" if np.isfinite(gap[0]) else "an unmeasured gap"
                print(f"[{type(self).__name__}] the ELBO stalled with q(u) {short} short of its "
                      f"optimum: step size reduced to {trainer.opt.lr:.3g}", flush=True)
        return max_iter, "max_iter", gap

    def _data_objective(self, X, t, B):
        """The full-data ELBO (plus the log prior when there are priors) at the model's
        current parameters: one pass in blocks of max(B, 2048) rows."""
        model, N = self.model_, X.shape[0]
        value = 0.0
        for start, block in iter_blocks(X, max(B, 2048)):
            n = len(block)
            value += n / N * model.elbo(block, t[start : start + n], scale=N / n)[0]
        return value + self._log_prior(model)

    def _snapshot(self):
        """The model's parameters, for :meth:`_restore`: q(u), Z and the prior mean by reference
        (the optimisers' steps replace those arrays, never change them in place), the kernel's
        and the likelihood's theta by value."""
        m = self.model_
        return m.q_mu, m.q_sqrt, m.Z, m.prior_mean, m.kernel.theta, m.likelihood.theta

    def _restore(self, snapshot):
        m = self.model_
        m.q_mu, m.q_sqrt, m.Z, m.prior_mean, m.kernel.theta, m.likelihood.theta = snapshot

    def _q_gap(self, X, t, B):
        """(the natural-gradient gap of q(u) per row, max(1, |ELBO / N|)) on the data X, t: see
        pygpfast.svgp._optim.natural_gap (two passes over the data, one more per halving of
        the step; blocks of max(B, 2048) rows, so that the core's O(rows M) scratch stays near
        a minibatch's)."""
        N = X.shape[0]
        rows = max(B, 2048)

        def passes():
            return ((block, t[start : start + len(block)]) for start, block in iter_blocks(X, rows))

        gap, elbo = natural_gap(self.model_, passes, N)
        return gap, max(1.0, abs(elbo) / N)

    def _streams(self):
        """available_if's test for partial_fit (as scikit-learn's MLPClassifier does for its
        full-batch solver): an estimator with method='mf' has none, so that scikit-learn's
        checks and meta-estimators see it as full-batch."""
        if self.method == "mf":
            raise AttributeError("method='mf' is full-batch only; partial_fit needs method='kl'")
        return True

    @available_if(_streams)
    def partial_fit(self, X, y, classes=None, n_total=None):
        """One pass of minibatch steps over a chunk of data (streaming / out-of-core fitting).

        The first call initialises the model from this chunk (default kernel, k-means
        inducing inputs) and the optimiser; later calls continue it. ``optimizer='auto'``
        means natural gradients for q(u) with Adam on Z and the hyperparameters. There is no
        stopping rule: the caller decides how many passes to make, and partial_fit neither
        reduces Adam's or Adadelta's step size nor measures how far q(u) is from its optimum
        (fit's plateau rule, see tol); it continues at the step size a preceding fit reached.
        A call that raises (a callback's exception or a KeyboardInterrupt included) leaves the
        estimator as it was before the call (unfitted before the first), so that the chunk
        can be passed again. A pass that diverges (fit's test, see ``learning_rate``: its mean
        ELBO per row far below its first minibatch's, or one step moving a log hyperparameter
        by more than log 1000) is undone with a ConvergenceWarning: the parameters from before
        the call are kept and the optimiser starts afresh at the next call.

        Parameters
        ----------
        X : array_like [n, D]
            The chunk (a numpy array or ``np.memmap`` is read in blocks, not copied whole).
        y : array_like [n]
        classes : array_like, optional
            SVGPClassifier: all the labels the stream can contain; required on the first call
            (scikit-learn's convention), checked on later ones.
        n_total : int, optional
            Number of rows of the whole data set the chunks are drawn from: the minibatch ELBO
            is scaled by n_total / B, so the KL term is weighted against n_total rows. Default:
            the number of rows passed to partial_fit so far (the data seen up to now), which
            is right for a stream visited once and too small if chunks are revisited.

        Returns
        -------
        self
        """
        self._check_params()
        # (A copy of the fitted state: the steps update the kernel, the optimiser's moments and
        # the random state in place, so a call stopped half-way left a mix. q(u), Z and the
        # natural gradients' cache, the O(L M^2) part, are replaced by every step, never
        # changed in place (Packer.apply, NaturalGradient.step): the copy shares them, which
        # keeps partial_fit's memory that of fit.)
        before = copy.deepcopy(self._fitted_state(), {id(a): a for a in self._replaced_arrays()})
        try:
            with JitterReport():  # (one NumericalWarning for all the call's escalations)
                return self._partial_fit(X, y, classes, n_total)
        except BaseException:
            for name in self._fitted_state():
                delattr(self, name)
            vars(self).update(before)
            raise

    def _replaced_arrays(self):
        """The fitted arrays that steps replace rather than change (see partial_fit)."""
        if not hasattr(self, "model_"):
            return []
        arrays = [self.model_.q_mu, self.model_.q_sqrt, self.model_.Z]
        natgrad = getattr(self._trainer, "natgrad", None)
        if natgrad is not None and natgrad._prec is not None:
            arrays += [natgrad._prec, natgrad._shift]
        return arrays

    def _fitted_state(self):
        """The attributes that fit and partial_fit set: all but the parameters."""
        params = self._get_param_names()
        return {name: value for name, value in vars(self).items() if name not in params}

    def _partial_fit(self, X, y, classes, n_total):
        first = not hasattr(self, "model_")
        if first and is_classifier(self) and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        X, y = self._validate_Xy(X, y, reset=first)
        t = self._encode_targets(y, first_call=first, classes=classes)
        n = X.shape[0]
        # (the optimizer a start of the model or of the optimiser takes)
        optimizer = (self._resolve_optimizer(n, streaming=True)
                     if first or self._trainer is None else None)
        if n_total is not None:
            check_int(n_total, "n_total", 1)
        if first:
            if self.inducing_points is None and n < self.n_inducing:
                warnings.warn(
                    "partial_fit places the inducing points by k-means on the first chunk, "
                    f"which has {n} rows: the model keeps {n} inducing points instead of "
                    f"n_inducing={self.n_inducing}. Pass a first chunk of at least n_inducing "
                    "rows, or inducing_points.",
                    UserWarning,
                    stacklevel=3,
                )
            if not is_classifier(self) and n > 1 and np.all(t == t[0]):
                # (partial_fit's normalisation and a Poisson prior mean come from this chunk)
                warnings.warn(
                    f"partial_fit takes the targets' scale from the first chunk (y_mean_ and "
                    "y_scale_; for a Poisson likelihood the prior mean's start, log mean(y)), and "
                    f"every target of this one is {y[0]:g}: the model starts far from later "
                    "chunks that vary (R^2 -55 on a stream whose first chunk was constant). Pass "
                    "a first chunk representative of the data.",
                    UserWarning,
                    stacklevel=3,
                )
            self._rng = check_random_state(self.random_state)
            self._set_model(self._init_model(X, t, self._rng, optimizer, "partial_fit")[0])
            start = copy.deepcopy(self.model_.kernel)
            self.restart_ = None  # (partial_fit does not search again)
            self._start_reporting()
            self.n_iter_ = 0
            self.n_rows_seen_ = self.n_steps_ = 0
            self._trainer = None
            self._started_with = self.get_params(deep=False)
        else:
            self._warn_ignored_params(optimiser_starts=self._trainer is None)
            clock = self._clock  # (verbose's time counts from the first call)
            self._start_reporting(self.history_)
            self._clock = clock
        if self._trainer is None:  # first call, or after a full-batch fit
            self.optimizer_ = optimizer
            self._trainer = self._make_trainer(self.model_, self.optimizer_, full_batch=False)
        self.n_rows_seen_ += n
        self.n_total_ = int(n_total) if n_total is not None else self.n_rows_seen_
        B = self._batch_size(n)
        t0 = time.perf_counter()
        steps = -(-n // B)
        kept = self._snapshot()
        elbo, rows = self._trainer.run(minibatches(X, t, B, self._rng), steps, self.n_total_)
        self.n_iter_ += 1
        self.n_steps_ += steps
        self._report_step(self.n_iter_, elbo, rows / max(time.perf_counter() - t0, 1e-12))
        self._end_reporting()
        self._check_pass(elbo, kept)
        self.log_prior_ = self._log_prior(self.model_)
        if first:  # (the start, on the first chunk: minibatch steps cannot search again)
            found = self._diagnose(_start.diagnosis_sample(X), start, False)
            if found is not None:
                found.warn(stacklevel=3, suffix="; partial_fit checks its first chunk only")
        return self

    @classmethod
    def _fell(cls, elbo, reference, N):
        """Whether an ELBO (or an epoch's mean) fell below `reference` by more than
        _DIVERGENCE max(1, |reference / N|) per row of N, or is not finite: divergence."""
        return not elbo / N >= reference / N - cls._DIVERGENCE * max(1.0, abs(reference) / N)

    def _check_pass(self, elbo, kept):
        """partial_fit's divergence check, fit's (see _run_epochs) on one pass: the pass's mean
        minibatch ELBO against its first minibatch's (at the parameters the call started from),
        per row of n_total_, and the largest step. A diverged pass is undone: the parameters
        `kept` are restored, and the optimiser, whose moments came from the diverged steps,
        starts afresh at the next call."""
        trainer, N = self._trainer, self.n_total_
        first = trainer.first_value
        fell = self._fell(elbo, first, N)
        if not fell and trainer.largest_move <= self._MAX_MOVE:
            return
        what = (f"the ELBO per row fell to {elbo / N:.4g} from {first / N:.4g} at its first "
                "minibatch" if fell else
                f"one step moved a log hyperparameter or inducing input by {trainer.largest_move:.3g}")
        warn_at_caller(
            f"SVGP ({self.optimizer_}) diverged in partial_fit's pass {self.n_iter_}: {what}; the "
            "parameters from before the call are kept, and the optimiser starts afresh at the "
            f"next call. The steps are too large: reduce learning_rate ({trainer.opt.lr:g} here)"
            + (" or natgrad_step" if trainer.natural else ""), ConvergenceWarning)
        self._restore(kept)
        self._trainer = None

    #: What partial_fit reads only when it starts the model (the first call) or the optimiser
    #: (the first call, or the first after a fit); it reads the other parameters at every call.
    _MODEL_PARAMS = ("kernel", "likelihood", "noise_variance", "n_inducing", "inducing_points",
                     "method", "whiten", "priors",
                     "jitter", "random_state", "normalize_y")
    _OPTIMISER_PARAMS = ("optimizer", "learning_rate", "natgrad_step", "train_inducing",
                         "optimize_hyperparameters")

    def _warn_ignored_params(self, optimiser_starts):
        """A UserWarning when set_params changed, since the model (or the optimiser) was
        started, parameters that only a start reads: partial_fit would ignore them silently."""
        params, started = self.get_params(deep=False), self._started_with
        names = self._MODEL_PARAMS + (() if optimiser_starts else self._OPTIMISER_PARAMS)
        changed = [name for name in names
                   if name in params and not _start.same_param(params[name], started[name])]
        if changed:
            warnings.warn(
                f"partial_fit continues the model{'' if optimiser_starts else ' and optimiser'} "
                f"started earlier, so it ignores the change to {', '.join(changed)} (used from "
                "the next fit on)", UserWarning, stacklevel=4)
        self._started_with = params

    def _report_step(self, it, elbo, rows_per_s):
        """The base's report, with the rows per second of the iteration."""
        return self._report(it, elbo, f"{rows_per_s:,.0f} rows/s")

    def _fit_mf(self, model, X, t):
        """The sparse mean-field method (Hensman, Matthews & Ghahramani 2015 section 3.1); see pygpfast.svgp._mf."""
        if len(self.classes_) != 2:
            raise ValueError(
                f"Only binary classification is supported by method='mf'; y has {len(self.classes_)} classes"
            )

        def report(it, bound, rows_per_s, current):
            if self.callback is not None:  # which may predict: give it the current q(u)
                self._set_mf(model, current())
            return self._report_step(it, bound, rows_per_s)

        fit = _mf.fit(
            model.kernel, model.Z, X, t, jitter=self.jitter, train_Z=self.train_inducing,
            train_hyper=self.optimize_hyperparameters, max_iter=self._max_iter("lbfgs"), tol=self.tol,
            report=report,
        )
        self._set_mf(model, fit)
        self.optimizer_ = "lbfgs"
        self.n_iter_ = self.n_steps_ = fit.n_iter
        self.objective_ = fit.bound + fit.log_prior
        return self

    def _set_mf(self, model, fit):
        """Fitted attributes from a method='mf' result (a _mf.MFFit)."""
        # Its Gaussian approximation of q(u), whitened whatever `whiten` says.
        self._set_model(SVGP(model.kernel, model.likelihood, fit.Z, fit.q_mu, fit.q_sqrt, whiten=True,
                             jitter=self.jitter))
        self.mf_a_ = fit.a

    # ---------------------------------------------------------------- prediction
    def _latent(self, X):
        """Marginals of q(f) at validated X, computed a block of rows at a time."""
        X = self._validate_X(X)
        L = self.model_.n_latent
        shape = (X.shape[0],) if L == 1 else (X.shape[0], L)
        mean, var = np.empty(shape), np.empty(shape)
        for start, block in iter_blocks(X):
            mean[start : start + len(block)], var[start : start + len(block)] = self.model_.predict_f(block)
        return mean, var


_PARAMETERS = """
    Parameters
    ----------
""" + _docs.KERNEL + """    n_inducing : int, default 100
        Number of inducing inputs M, placed by k-means on a subsample of max(10 M, 10000) rows;
        with fewer than M training rows N, M = N (the rows themselves).
    inducing_points : array_like [M, D] or None, default None
        Starting inducing inputs (overrides n_inducing).
    method : {'kl', 'mf'}, default 'kl'
        'kl': the KL method (Hensman, Matthews & Ghahramani 2015, section 4). 'mf': the sparse
        mean-field method of their section 3.1 (binary probit only, full-batch L-BFGS-B;
        predictions use its Gaussian approximation of q(u)).
    whiten : bool, default True
        Parameterise q through v = Lz^-1 u, with p(v) = N(0, I).
    optimizer : {'auto', 'lbfgs', 'natgrad', 'adam', 'adadelta'}, default 'auto'
        'lbfgs': full-batch L-BFGS-B, q first with the kernel and Z frozen, then everything.
        'natgrad': minibatch natural-gradient steps on q(u), Adam on Z and the hyperparameters.
        'adam', 'adadelta': minibatch steps on everything. 'auto': 'lbfgs' up to 10 000 rows,
        'natgrad' above and in partial_fit.
    batch_size : int or 'auto', default 'auto'
        Minibatch size B of the stochastic optimisers ('auto': 256).
    learning_rate : float or 'auto', default 'auto'
        Step size of Adam (0.01 for 'adam', and 0.01 / sqrt(1 + t / 100) for the Adam steps of
        'natgrad') or step rate of Adadelta (0.1).
    natgrad_step : float in (0, 1] or 'auto', default 'auto'
        Natural-gradient step size on q(u). 'auto': 1 for a Gaussian likelihood on the full
        batch; otherwise max(1 / (t + 1), B / N) at step t.
    max_iter : int or None, default None
        L-BFGS-B iterations, or epochs of the stochastic optimisers. None: 5000 iterations, or
        1000 epochs.
    tol : float, default 1e-6
        L-BFGS-B stops when an iteration changes the ELBO per row by less than tol (relative to
        max(1, |ELBO| / N)). The stochastic optimisers stop when the epoch-mean ELBO per row has
        not improved by more than tol for n_iter_no_change epochs; 'adam' and 'adadelta' first
        check, with one full-data natural-gradient step, that q(u) is near its optimum, and
        otherwise reduce their step (at most twice, then warn).
    n_iter_no_change : int, default 5
        Patience of the stochastic optimisers, in epochs.
    train_inducing : bool, default True
        Learn Z.
""" + _docs.COMMON

_ATTRIBUTES = _docs.ATTRIBUTES + """    model_ : SVGP
        The fitted model (kernel, likelihood, Z, q(u)).
    likelihood_ : pygpfast.likelihoods.Likelihood
    inducing_points_ : ndarray [M, D]
        The fitted inducing inputs (``model_.Z``).
    n_steps_ : int
        Optimiser steps (minibatch steps for the stochastic optimisers).
    optimizer_ : str
        The optimizer used ('auto' resolved).
    n_total_, n_rows_seen_ : int
        partial_fit only: the row count minibatches are weighted against, and the rows passed.
"""


class SVGPClassifier(GPClassifierMixin, ClassifierMixin, _SVGPEstimator):
    _parameter_constraints = {**_SVGPEstimator._parameter_constraints,
                              "likelihood": (Options(None, "probit", "logit", "softmax", "robustmax"),),
                              "label_noise": (Options("auto", "learn"), Interval(float, 0.0, 0.5, closed="left"))}
    __doc__ = (
        """Gaussian-process classifier with a sparse variational posterior (SVGP), binary or
    multi-class, for labels of any type. The fit maximises the ELBO plus the log prior of the
    hyperparameters (``objective_``; the ELBO alone with ``priors=None``).
""" + _PARAMETERS + """    likelihood : {None, 'probit', 'logit', 'softmax', 'robustmax'}, default None
        'probit', 'logit': Bernoulli with that link, one latent function (two classes only).
        'softmax': C latent functions sharing Z and the kernel (any C >= 2). 'robustmax': C
        latent functions likewise, the label the argmax of the latent values with probability
        1 - epsilon and each other class with epsilon / (C - 1) (Hernandez-Lobato et al. 2011;
        :class:`pygpfast.likelihoods.RobustMax`; epsilon is ``label_noise``). None: 'probit'
        for two classes, 'softmax' for more.
    label_noise : float, 'auto' or 'learn', default 'auto'
        epsilon, the probability of a label against the latent functions' verdict;
        method='kl' only. With a Bernoulli likelihood, epsilon in [0, 0.5): each label is taken
        to be drawn at random with probability 2 epsilon, ``p(y | f) = epsilon + (1 - 2
        epsilon) p0(y | f)`` with p0 the link's (Kim & Ghahramani 2008;
        :class:`pygpfast.likelihoods.Bernoulli`); 0 is the plain link. With 'robustmax',
        epsilon in (0, 0.5). Either way it bounds the cost of a mislabelled point (by ``-log
        epsilon``, ``log((C - 1) / epsilon)`` for robust-max). The softmax takes none (0). A
        float: fixed at that value. 'auto': fixed at 0 for the Bernoulli likelihoods and the
        softmax, 1e-3 for 'robustmax' (GPflow's default). 'learn': learned with the
        hyperparameters from 0.01, in log space, with the default prior LogNormal(log 0.01,
        sqrt(3)) on log epsilon under ``priors='default'`` (a user's prior through
        ``likelihood_.priors`` is not offered: the likelihood is made by the fit); the fitted
        value is ``likelihood_.label_noise`` (``likelihood_.epsilon`` for robust-max).

    Attributes
    ----------
    classes_ : ndarray [C]
""" + _ATTRIBUTES + """    mf_a_ : ndarray [N]
        method='mf' only: the locations of the truncated Gaussians q(g_n) (section 3.1, eq. 11).
""" + _docs.NOTES)

    def __init__(self, kernel=None, *, likelihood=None, label_noise="auto", n_inducing=100,
                 inducing_points=None, method="kl", whiten=True, optimizer="auto", batch_size="auto", learning_rate="auto",
                 natgrad_step="auto", max_iter=None, tol=1e-6, n_iter_no_change=5,
                 train_inducing=True, optimize_hyperparameters=True, priors="default", jitter=1e-6,
                 random_state=None, verbose=0, callback=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.label_noise = label_noise
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.whiten = whiten
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.natgrad_step = natgrad_step
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.train_inducing = train_inducing
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()  # (_make_likelihood and _fit_mf refuse C > 2 for these)
        tags.classifier_tags.multi_class = not (
            self.method == "mf" or self.likelihood in ("probit", "logit"))
        return tags

    def _is_probit(self):
        return self.likelihood in (None, "probit") and self.label_noise in ("auto", 0.0)

    def _make_likelihood(self):
        name, C = self.likelihood, len(self.classes_)
        if name in ("probit", "logit") and C > 2:
            # (scikit-learn's wording, which its check for binary-only classifiers looks for)
            raise ValueError(
                f"Only binary classification is supported by likelihood={name!r}; y has {C} "
                "classes: use likelihood=None, 'softmax' or 'robustmax'")
        learn = self.label_noise == "learn"

        def epsilon(auto):  # the fixed value, or where 'learn' starts
            return {"auto": auto, "learn": _priors.LABEL_NOISE_CENTRE}.get(self.label_noise, self.label_noise)

        if name == "robustmax":
            if self.label_noise == 0.0:
                raise ValueError("likelihood='robustmax' needs label_noise > 0 (its epsilon; 'auto': 1e-3)")
            return _likelihoods.RobustMax(C, epsilon=float(epsilon(1e-3)), learn_epsilon=learn)
        if name == "softmax" or (name is None and C > 2):
            if self.label_noise not in ("auto", 0.0):
                raise ValueError(
                    f"label_noise={self.label_noise!r} needs a Bernoulli likelihood (two classes) or "
                    f"'robustmax'; the softmax takes no label noise: use label_noise='auto' or 0.0")
            return _likelihoods.Softmax(C)
        return _likelihoods.Bernoulli(link=name or "probit", label_noise=float(epsilon(0.0)),
                                      learn_label_noise=learn)

    def _encode_targets(self, y, first_call, classes=None):
        check_classification_targets(y)
        if first_call:
            if classes is not None:
                unique_labels(classes)  # (a ValueError unless they are class labels)
            # (np.unique's order and dtype, as scikit-learn's classifiers: object labels, a pandas
            # Series of strings say, stay object; unique_labels made them fixed-width strings)
            self._label_encoder = LabelEncoder().fit(y if classes is None else classes)
            self.classes_ = self._label_encoder.classes_
        elif classes is not None and not np.array_equal(unique_labels(classes), self.classes_):
            raise ValueError(f"classes={classes!r} differs from the first call's {self.classes_!r}")
        unseen = np.setdiff1d(unique_labels(y), self.classes_)
        if unseen.size:  # (before the count below: classes=[0] for y in {0, 1} had "one class")
            raise ValueError(f"y contains labels not in classes_ {self.classes_!r}: {unseen!r}")
        if first_call and len(self.classes_) < 2:
            what = "the data contain" if classes is None else "classes holds"
            raise ValueError(
                f"SVGPClassifier needs samples of at least 2 classes; {what} only one class: "
                f"{self.classes_[0]!r}"
            )
        return self._label_encoder.transform(y).astype(np.float64)

    def predict_latent(self, X):
        """Mean and variance of the latent functions at X [T, D]: [T] each for two classes
        with a Bernoulli likelihood, [T, C] with the softmax or robust-max."""
        return self._latent(X)

    def _of_latent(self, X, per_block):
        """per_block(mean, var) -> [rows, C] for the marginals of q(f) at X, a block of rows at a
        time, into one [T, C] array: its temporaries stay those of a block (all rows
        at once held the marginals and the likelihood's scratch for every row, about 5 times
        the output for multi-class probabilities)."""
        X = self._validate_X(X)
        width = len(self.classes_)
        out = np.empty((X.shape[0], width))
        # (a block's marginals, their likelihood's scratch and its output: ~5 width per row)
        for start, block in iter_blocks(X, block_rows(max(X.shape[1], 5 * width))):
            out[start : start + len(block)] = per_block(*self.model_.predict_f(block))
        return out

    def predict_proba(self, X):
        """Class probabilities [T, C] (columns in the order of ``classes_``)."""
        return self._of_latent(X, self._proba)

    def predict_log_proba(self, X):
        """log p(y = class | X) [T, C], computed in log space."""
        return self._of_latent(X, self._log_proba)

    def _proba(self, mean, var):
        if self.model_.n_latent > 1:
            return self.likelihood_.predict_proba(mean, var)
        p1 = np.clip(self.likelihood_.predict_mean_and_var(mean, var)[0], 0.0, 1.0)
        return np.column_stack([1.0 - p1, p1])

    def _log_proba(self, mean, var):
        if self.model_.n_latent > 1:
            return self.likelihood_.predict_log_proba(mean, var)
        return np.column_stack([self.likelihood_.predict_log_density(np.full(len(mean), float(c)),
                                                                     mean, var) for c in (0, 1)])



class SVGPRegressor(RegressorMixin, _SVGPEstimator):
    _parameter_constraints = {**_SVGPEstimator._parameter_constraints,
                              "likelihood": (Options("gaussian", "poisson"),),
                              "noise_variance": (Options("auto"),
                                                 Interval(float, 0.0, None, closed="neither")),
                              "normalize_y": (BOOL,)}
    __doc__ = (
        """Sparse variational GP regression (Hensman, Fusi & Lawrence 2013): real targets with a
    Gaussian likelihood, or counts with a Poisson one. The fit maximises the ELBO plus the log
    prior of the hyperparameters (``objective_``, of the standardised targets when normalize_y;
    the ELBO alone with ``priors=None``).
""" + _PARAMETERS + """    likelihood : {'gaussian', 'poisson'}, default 'gaussian'
        'poisson': count regression, the log rate a learned constant (started at log mean(y),
        ``model_.prior_mean``) plus the GP; real targets y >= 0 are taken by the same formula
        (targets above 2**53 are refused).
    noise_variance : float or 'auto', default 'auto'
        Starting variance of the Gaussian likelihood's noise (learned with the
        hyperparameters). 'auto': 1 on standardised targets, else the targets' mean square.
    normalize_y : bool, default True
        Gaussian likelihood: fit to (y - mean) / std of the training targets (of the first
        chunk for partial_fit); predictions are in the original units.

    Attributes
    ----------
""" + _ATTRIBUTES + """    y_mean_, y_scale_ : float
        The standardisation of y (0 and 1 when not normalized).
""" + _docs.NOTES)

    def __init__(self, kernel=None, *, likelihood="gaussian", noise_variance="auto",
                 normalize_y=True, n_inducing=100,
                 inducing_points=None, method="kl", whiten=True, optimizer="auto", batch_size="auto",
                 learning_rate="auto", natgrad_step="auto", max_iter=None, tol=1e-6, n_iter_no_change=5,
                 train_inducing=True, optimize_hyperparameters=True, priors="default", jitter=1e-6,
                 random_state=None, verbose=0, callback=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.noise_variance = noise_variance
        self.normalize_y = normalize_y
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.whiten = whiten
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.natgrad_step = natgrad_step
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.train_inducing = train_inducing
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = self.likelihood == "poisson"
        return tags

    def _is_probit(self):
        return False

    def _target_scale(self):
        # Unnormalised Gaussian targets: the default kernel and noise variances start at the
        # targets' mean square (the zero-mean prior's scale), as they start at 1 on
        # standardised ones; from 1, targets in the hundreds are fitted as noise.
        if self.normalize_y or not self._gaussian():
            return 1.0
        return self._y_power

    def _prior_mean(self, t):
        # Counts: log rate = a constant (started at log mean(y)) + a zero-mean GP. Without it the
        # GP itself had to reach log(1e4) ~ 9.2 everywhere on counts of 1e4: the kernel variance
        # and lengthscales that allows took L-BFGS-B 1100 iterations, and natural gradients
        # stalled far from it (ELBO -3.5e5 against -1.4e4, rates 6% off where Poisson noise is 1%).
        if self.likelihood == "poisson":
            return np.array([np.log(max(float(np.mean(t)), 0.5 / t.size))])
        return None

    def _make_likelihood(self):
        if self.likelihood == "poisson":
            return _likelihoods.Poisson()
        return _likelihoods.Gaussian(variance=self._target_scale() if self.noise_variance == "auto"
                                     else float(self.noise_variance))

    def _gaussian(self):
        return self.likelihood == "gaussian"

    def _encode_targets(self, y, first_call, classes=None):
        y = as_vector(y, "y")
        if first_call:
            self.y_mean_, self.y_scale_ = 0.0, 1.0
            # Moments of y in units of a power of two near max|y|, scaled back: y * y and np.std
            # overflowed from |y| ~ 1e154 on (y_scale_ = inf and NaN predictions).
            big = float(power_of_two_unit(y)) if y.size else 1.0
            unit = y / big
            with np.errstate(over="ignore"):
                power = big * big * float(np.mean(unit * unit)) if y.size else 0.0
            standardise = self.normalize_y and self._gaussian()
            if power == np.inf and self._gaussian() and not standardise:
                raise ValueError(
                    f"targets up to |y| = {np.max(np.abs(y)):.3g}: their mean square, the prior "
                    "variance a Gaussian likelihood needs for them, overflows float64; use "
                    "normalize_y=True")
            self._y_power = power if 0.0 < power < np.inf else 1.0
            if standardise:
                std = big * float(np.std(unit))
                self.y_mean_, self.y_scale_ = big * float(np.mean(unit)), std if std > 0 else 1.0
        t = (y - self.y_mean_) / self.y_scale_ if self.y_scale_ != 1.0 or self.y_mean_ else y
        if not self._gaussian():
            check_counts(t)
        # (all rows here: the core checks each minibatch, and would name a row of the minibatch)
        (self._make_likelihood() if first_call else self.likelihood_)._check_labels(t)
        return t

    def predict_latent(self, X):
        """Mean [T] and variance [T] of the latent function at X [T, D] (in y's units for a
        normalized Gaussian likelihood; the variance is inf where it exceeds float64, for
        targets beyond about 1e154)."""
        mean, var = self._latent(X)
        with np.errstate(over="ignore"):
            return mean * self.y_scale_ + self.y_mean_, var * self.y_scale_ * self.y_scale_

    def predict(self, X, return_std=False):
        """Predictive mean [T] of y, and with ``return_std`` its standard deviation [T]
        (likelihood noise included)."""
        mean, var = self._latent(X)
        ymean, yvar = self.likelihood_.predict_mean_and_var(mean, var)
        ymean = ymean * self.y_scale_ + self.y_mean_
        if not return_std:
            return ymean
        return ymean, np.sqrt(yvar) * self.y_scale_


class _ConstantStep:
    """A constant natural-gradient step size (picklable)."""

    def __init__(self, rho):
        self.rho = rho

    def __call__(self, t, batch_fraction):
        return self.rho


class _HarmonicStep:
    """rho_t = max(1 / (t + 1), min(1, batch_fraction / floor_epochs)): q becomes the running
    average of the per-minibatch targets (exact averaging for a conjugate likelihood with
    fixed hyperparameters) until the average spans floor_epochs passes over the data, then
    an exponential average over about that many passes, which keeps tracking Z and the
    hyperparameters as they move."""

    def __init__(self, floor_epochs):
        self.floor_epochs = floor_epochs

    def __call__(self, t, batch_fraction):
        return max(1.0 / (t + 1), min(1.0, batch_fraction / self.floor_epochs))
