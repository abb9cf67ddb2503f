"""The IS-MOE estimators, :class:`ISMOERegressor` and :class:`ISMOEClassifier` (Zhang &
Williamson, seed 003; notes/ismoe-math.md): J partitions drawn from a Gaussian-mixture proposal,
K local GPs per partition fitted by the compiled core, importance weights from their evidences,
predictions as the weighted mixture of experts (Algorithm 1)."""

import copy
import math
import warnings

import numpy as np
from scipy.special import logsumexp
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import LabelEncoder
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .. import _core
from .._base import _docs, _priors, _start
from .._base._estimator import GPClassifierMixin, GPEstimator
from .._base._params import BOOL, COMMON, NONE, Interval, Kind, Options
from .._validation import as_vector, mean_and_std, validate_input
from ..priors import is_flat
from . import _dask, _engine, _proposal
from ._psis import psis as _psis

__all__ = ["ISMOEClassifier", "ISMOERegressor"]

_LOG_2PI = float(np.log(2.0 * np.pi))


class _ISMOEEstimator(GPEstimator):
    """Shared fitting and prediction of the IS-MOE estimators."""

    _FITTED = "objective_"
    _OBJECTIVE = "log evidence"
    _parameter_constraints = {
        **COMMON,
        "n_experts": (Interval(int, 1, None),),
        "n_samples": (Interval(int, 1, None),),
        "batch_size": (NONE, Interval(int, 1, None)),
        "partition": (Options("gmm", "random"),),
        "share_hyperparameters": (BOOL,),
        "scale_evidence": (BOOL,),
        "weighting": (Options("importance", "uniform"),),
        "psis": (BOOL,),
        "min_block_size": (Interval(int, 1, None),),
        "samples_per_iteration": (NONE, Interval(int, 1, None)),
        "max_iter": (Interval(int, 1, None),),
        "client": (NONE, Kind(lambda v: hasattr(v, "submit") and hasattr(v, "scatter"),
                              "a dask.distributed Client")),
        "backend": (Options(None, "threads", "dask"),),
    }

    #: The log-normal bounds of the experts' hyperparameters around their start: kernel
    #: parameters within a factor of 1e3 either way; the noise variance in [1e-4, 10] and the
    #: constant mean in [-10, 10] (standardised targets).
    _KERNEL_RANGE = math.log(1e3)
    _NOISE_BOUNDS = (1e-4, 10.0)
    _NOISE_START = 0.1
    #: An ConvergenceWarning when the effective sample size falls below max(2, this x J).
    _ESS_FRACTION = 0.01
    #: Predictions drop the lightest samples whose weights sum to less than this.
    _NEGLIGIBLE_MASS = 1e-12
    #: Test rows per prediction step: bounded so that the [rows, blocks] arrays stay ~64 MB.
    _PREDICT_BYTES = 64 << 20

    # ---------------------------------------------------------------- fitting
    def fit(self, X, y):
        """Fit the J importance samples: draw each partition, fit its experts, weigh it.

        Parameters
        ----------
        X : array_like [N, D]
        y : array_like [N]

        Returns
        -------
        self
        """
        self._check_params()
        self._forget()
        X, y = validate_input(self, X, y, dtype=np.float64, order="C")
        t = self._encode_targets(y)
        try:
            return self._fit(X, t)
        except BaseException:
            self._forget()
            raise

    def _fit(self, X, t):
        N, D = X.shape
        rs = check_random_state(self.random_state)
        seed = int(rs.randint(2**31 - 1))
        start = self._with_default_priors(_start.start_kernel(self.kernel, X, rs, 1.0), X)
        codes, params0 = start._spec(D)
        prior_loc, prior_scale = self._core_priors(start, params0)
        J, K = self.n_samples, self.n_experts
        B = N if self.batch_size is None else min(self.batch_size, N)
        self.x_mean_, scale = mean_and_std(X, axis=0)
        self.x_scale_ = np.where(scale > 0, scale, 1.0)
        Xs = np.ascontiguousarray((X - self.x_mean_) / self.x_scale_)
        theta0 = np.log(params0)
        lower = np.concatenate([theta0 - self._KERNEL_RANGE, [np.log(self._NOISE_BOUNDS[0])], [-10.0]])
        upper = np.concatenate([theta0 + self._KERNEL_RANGE, [np.log(self._NOISE_BOUNDS[1])], [10.0]])
        cfg = _engine.Config(
            codes=codes, params0=params0, likelihood=self._core_likelihood(), K=K, B=B,
            partition=self.partition, prior=_proposal.Prior.default(K, D), seed=seed,
            gamma=N / B if self.scale_evidence else 1.0, share=self.share_hyperparameters,
            optimize=self.optimize_hyperparameters, noise0=self._NOISE_START, lower=lower,
            upper=upper, max_iter=self.max_iter, tol=self.tol, jitter=self.jitter,
            min_block_size=self.min_block_size, fit_mean=self._FIT_MEAN, prior_loc=prior_loc,
            prior_scale=prior_scale)
        per = self.samples_per_iteration or max(1, math.ceil(J / 8))
        chunks = [list(range(a, min(a + per, J))) for a in range(0, J, per)]
        client = _dask.resolve_client(self.client, self.backend)
        prune = self.weighting == "importance" and not self.psis  # (else every sample counts)
        top = [-np.inf]

        def needed(log_weight):
            # (the samples the threaded fit keeps after this chunk: within the pruning ratio of
            # the running maximum; a Dask worker sends back only their experts)
            top[0] = max(top[0], float(np.max(log_weight)))
            return log_weight >= top[0] - _engine.PRUNE_LOG_RATIO

        if client is not None:
            results = _dask.run_chunks(client, X, Xs, t, cfg, chunks,
                                       needed=needed if prune else None, who=type(self).__name__)
        else:
            results = ((p["log_weight"], p) for p in
                       (_engine.fit_chunk(X, Xs, t, cfg, c) for c in chunks))
        self._start = start
        self._unit_shift = cfg.gamma * B * self._log_unit()
        self._start_reporting()
        state, log_w = None, []
        for it, (chunk_log_weight, part) in enumerate(results, start=1):
            part["log_weight"] = part["log_weight"] - self._unit_shift
            log_w.append(chunk_log_weight - self._unit_shift)
            state = part if state is None else _engine.merge([state, part])
            if prune:
                state = _engine.prune(state)
            lw = np.concatenate(log_w)
            objective = float(logsumexp(lw) - math.log(lw.size))
            if self._report(it, objective, f"samples {lw.size}",
                            before_callback=lambda: self._set_fitted(X, state, lw)):
                break
        self._end_reporting()
        self._set_fitted(X, state, np.concatenate(log_w))
        if self.weighting == "importance" and self.log_weights_.size >= 2:
            ess, J_done = self.effective_sample_size_, self.log_weights_.size
            if ess < max(2.0, self._ESS_FRACTION * J_done):
                warnings.warn(
                    f"{type(self).__name__}: the importance weights collapsed: effective sample "
                    f"size {ess:.3g} of {J_done} samples (the largest weight is "
                    f"{self.weights_.max():.3g}); predictions rest on few partitions. More "
                    "n_samples, fewer n_experts, psis=True, or weighting='uniform' may help",
                    ConvergenceWarning, stacklevel=3)
        return self

    def _core_priors(self, kernel, params0):
        """The experts' priors in the core's coordinates u = (log params [P], log noise variance,
        mean): (loc [P + 2], scale [P + 2]), scale 0 where a coordinate has none; (None, None)
        when none has one (plain type-II maximum likelihood, as the core fits without)."""
        P = params0.size
        blocks = kernel._prior_blocks()
        noise = (_priors.default_noise_prior() if self._core_likelihood() == "gaussian"
                 and self._default_priors_on() else None)
        if is_flat(blocks) and noise is None:
            return None, None
        loc, scale = np.zeros(P + 2), np.zeros(P + 2)
        start = 0
        for size, prior, name in blocks:
            if prior is not None:
                prior._check_size(size, name)
                loc[start:start + size] = prior.loc
                scale[start:start + size] = prior.scale
            start += size
        if start != P:  # (the kernel's theta and the core's parameters share one layout)
            raise RuntimeError(f"the kernel's priors describe {start} parameters, its core "
                               f"description {P}")
        if noise is not None:
            loc[P], scale[P] = noise.loc, noise.scale
        return loc, scale

    def _set_fitted(self, X, state, log_weights):
        """The fitted attributes from the samples fitted so far."""
        J = log_weights.size
        self.log_weights_ = log_weights
        self.objective_ = float(logsumexp(log_weights) - math.log(J))
        self.log_prior_ = 0.0
        if self.weighting == "uniform":
            lw = np.full(J, -math.log(J))
            self.pareto_k_ = None
        elif self.psis:
            lw, self.pareto_k_ = _psis(log_weights)
        else:
            lw = log_weights - logsumexp(log_weights)
            self.pareto_k_ = None
        self.weights_ = np.exp(lw)
        self.effective_sample_size_ = float(1.0 / np.sum(self.weights_**2))
        # Predictions leave out the lightest samples whose weights add up to under
        # _NEGLIGIBLE_MASS (any predicted probability moves by less than that) and renormalise
        # over the rest: with an ESS near 1, one or a few samples instead of every one.
        order = np.argsort(self.weights_, kind="stable")
        light = order[np.cumsum(self.weights_[order]) < self._NEGLIGIBLE_MASS]
        used = np.ones(J, dtype=bool)
        used[light] = False
        keep = np.isin(state["samples"], np.flatnonzero(used))
        state = _engine.select_samples(state, keep)
        self.experts_ = state
        self._log_mass = float(np.log(np.sum(self.weights_[state["samples"]])))
        self._Xb = np.ascontiguousarray(X[state["rows"]])
        self.n_blocks_ = int(state["n_blocks"].sum())
        # kernel_: the largest expert of the sample with the largest weight
        s = int(np.argmax(self.weights_[state["samples"]]))
        first = int(state["n_blocks"][:s].sum())
        sizes = np.diff(state["offsets"])[first:first + state["n_blocks"][s]]
        kernel = copy.deepcopy(self._start)
        kernel.params = state["params"][first + int(np.argmax(sizes))]
        self.kernel_ = kernel
        self.restart_ = None

    # ---------------------------------------------------------------- prediction
    def _validate_X(self, X):
        check_is_fitted(self)
        return validate_input(self, X, dtype=np.float64, order="C", reset=False)

    def _log_assignment(self, Xs):
        """log(w_j rho_jk(x)) [T, blocks]: each sample's weight times the probability of each of
        its non-empty experts at the rows of Xs (standardised)."""
        st = self.experts_
        out = np.empty((Xs.shape[0], st["expert"].size))
        b = 0
        for i, j in enumerate(st["samples"]):
            n = int(st["n_blocks"][i])
            experts = st["expert"][b:b + n]
            if self.partition == "gmm":
                logr = _proposal.log_responsibilities(Xs, st["log_pi"][i], st["mu"][i],
                                                      st["R"][i], experts)
            else:
                logr = np.full((Xs.shape[0], n), -math.log(n))
            out[:, b:b + n] = logr + (np.log(self.weights_[j]) - self._log_mass)
            b += n
        return out

    def _components(self, X):
        """Yield (rows slice, log c [T, P], predict_blocks' dict) a chunk of test rows at a
        time, for validated X (:meth:`_validate_X`): c = w_j rho_jk, the mixture weights of
        the blocks."""
        st = self.experts_
        P = st["expert"].size
        step = max(1, self._PREDICT_BYTES // (8 * 6 * max(P, 1)))
        codes, _ = self._start._spec(X.shape[1])
        rows = np.arange(self._Xb.shape[0], dtype=np.int64)
        gaussian = self._core_likelihood() == "gaussian"
        for a in range(0, X.shape[0], step):
            Xc = X[a:a + step]
            log_c = self._log_assignment((Xc - self.x_mean_) / self.x_scale_)
            # Each row needs only the blocks of non-negligible weight (with a Gaussian-mixture
            # partition a few experts per sample): the pairs below _NEGLIGIBLE_MASS / P of the
            # row's largest weight, under _NEGLIGIBLE_MASS of its total together, are left out
            # and the rest renormalised, as for the lightest samples.
            top = np.max(log_c, axis=1, keepdims=True)
            kept = log_c >= top + math.log(self._NEGLIGIBLE_MASS / P)
            log_c = np.where(kept, log_c, -np.inf)
            _proposal.normalise_rows(log_c)
            block, row = np.nonzero(kept.T)  # (by block, rows ascending)
            test_offsets = np.zeros(P + 1, dtype=np.int64)
            np.cumsum(np.bincount(block, minlength=P), out=test_offsets[1:])
            pred = _core.moe.predict_blocks(
                codes, st["params"], self._Xb, st["offsets"], rows, Xc, st["alpha"],
                st["factor"], likelihood=self._core_likelihood(),
                noise_variance=st["noise_variance"] if gaussian else None,
                mean=st["mean"] if gaussian else None, W=None if gaussian else st["W"],
                test_offsets=test_offsets, test_rows=np.ascontiguousarray(row, dtype=np.int64))
            yield slice(a, a + Xc.shape[0]), log_c, pred

    @staticmethod
    def _moments(c, m, v):
        mean = np.sum(c * m, axis=1)
        var = np.sum(c * (v + (m - mean[:, None]) ** 2), axis=1)
        return mean, var

    def _mixture_latent(self, X):
        X = self._validate_X(X)
        T = len(X)
        mean, var = np.empty(T), np.empty(T)
        for sl, log_c, pred in self._components(X):
            mean[sl], var[sl] = self._moments(np.exp(log_c), pred["mean"], pred["var"])
        return mean, var


_PARAMETERS = """
    Parameters
    ----------
""" + _docs.KERNEL + """    n_experts : int, default 10
        K, the experts (mixture components) of each partition; with fewer rows than K some
        experts are empty (the partition uses those it fills).
    n_samples : int, default 32
        J, the importance samples (partitions).
    batch_size : int or None, default None
        B, the rows of each sample's own minibatch, drawn without replacement (seed section
        3.3); None: all N rows.
    partition : {'gmm', 'random'}, default 'gmm'
        'gmm': labels from a K-component Gaussian mixture drawn from its Dirichlet x
        Normal-inverse-Wishart prior on standardised inputs (seed eq. 1); 'random': uniform
        labels (seed Table 5), and a test point is then assigned uniformly too.
    share_hyperparameters : bool, default False
        One kernel (and noise) per sample, shared by its experts, fitted on the sum of their
        evidences; False fits each expert's own.
    scale_evidence : bool, default False
        Raise the minibatch evidences to N / B in the weights (seed section 3.3, the
        "stochastic approximation"); False weighs samples by the plain minibatch evidence.
    weighting : {'importance', 'uniform'}, default 'importance'
        'uniform' averages the samples with equal weights (seed Table 4).
    psis : bool, default False
        Pareto-smooth the importance weights (Vehtari et al. 2015/2024); ``pareto_k_`` holds
        the fitted shape (above 0.7: unreliable).
    min_block_size : int, default 10
        Experts with fewer rows keep the starting (or the sample's shared) hyperparameters.
    samples_per_iteration : int or None, default None
        Samples fitted per iteration (one call of the core, or one Dask task); None:
        ceil(J / 8).
    max_iter : int, default 200
        L-BFGS iterations per expert (or per sample with share_hyperparameters).
    tol : float, default 1e-9
        Relative change of an expert's objective that ends its search.
    client : dask.distributed.Client or None, default None
        Fit the batches of samples on this Dask cluster (needs ``pygpfast[distributed]``).
    backend : {None, 'threads', 'dask'}, default None
        None: the client if given, else threads; 'dask': the client, or the current one.
"""

_COMMON = """    optimize_hyperparameters : bool, default True
        Fit each expert's hyperparameters (box bounds around the start), at the MAP point
        under ``priors``; False keeps the starting kernel.
    priors : {'default', None}, default 'default'
        'default': each expert is fitted at the MAP point of its hyperparameters under the
        default priors (:mod:`pygpfast._base._priors`: log-normal lengthscales centred by the
        input dimension and the data's spread, Hvarfner, Hellsten & Nardi 2024; log-normal
        kernel and noise variances), in the compiled core; priors set on the kernel's
        hyperparameters (``kernel.priors``) are kept either way. None: type-II maximum
        likelihood. The importance weights stay the experts' evidences at their fitted
        hyperparameters: the priors shape each expert, not the weights.
    jitter : float in [0, 1), default 1e-6
        The smallest jitter tried, relative to the mean diagonal, when a Cholesky fails.
    random_state""" + _docs.COMMON.split("    random_state", 1)[1]

_ATTRIBUTES = """
    Attributes
    ----------
    objective_ : float
        log of the mean unnormalised weight, logsumexp(log_weights_) - log J: an estimate of
        the log evidence (optimistic, hyperparameters being plugged in; of the minibatch
        evidence when B < N). Each sample's fit maximises its own log weight.
    history_ : ndarray [n_iter_]
        objective_ over the samples fitted after each iteration.
    n_iter_ : int
        Iterations: batches of ``samples_per_iteration`` samples fitted.
    log_weights_ : ndarray [J]
        Unnormalised log weights: (N/B if scale_evidence) x the sum of the sample's block log
        evidences (the note's reading R1: no p(X | phi) term).
    weights_ : ndarray [J]
        Self-normalised weights (after PSIS, or uniform, as asked).
    effective_sample_size_ : float
        1 / sum(weights_^2); a ConvergenceWarning when below max(2, J / 100).
    pareto_k_ : float or None
        PSIS's fitted shape (inf when J < 10 leaves no tail to fit); None without PSIS.
    kernel_ : pygpfast.kernels.Kernel
        The largest expert's fitted kernel in the sample of largest weight (a copy).
    restart_ : None
    log_prior_ : float
        0.0: the weights, and so objective_, are evidences without the priors' densities.
    experts_ : dict
        The fitted experts that predictions use, arrays (see
        ``pygpfast.moe._engine.fit_chunk``): those of every sample but the lightest whose
        weights add up to under 1e-12 (predictions renormalise over the rest; a predicted
        probability moves by less than 1e-12).
    n_features_in_ : int
"""


class ISMOERegressor(RegressorMixin, _ISMOEEstimator):
    __doc__ = ("""Importance-sampled mixture of Gaussian-process experts for regression
    (Zhang & Williamson, "Embarrassingly parallel inference for Gaussian processes", JMLR
    2019): J partitions of the inputs drawn from a Gaussian-mixture proposal, K exact GPs per
    partition (each with its own kernel, noise and constant mean), weighted by their evidence.
    """ + _PARAMETERS + _COMMON + _ATTRIBUTES + """    y_mean_, y_scale_ : float
        The targets' mean and scale (the experts see standardised targets).
    """)

    _FIT_MEAN = True

    def __init__(self, kernel=None, *, n_experts=10, n_samples=32, batch_size=None,
                 partition="gmm", share_hyperparameters=False, scale_evidence=False,
                 weighting="importance", psis=False, min_block_size=10,
                 samples_per_iteration=None, max_iter=200, tol=1e-9, client=None, backend=None,
                 optimize_hyperparameters=True, priors="default", jitter=1e-6, random_state=None,
                 verbose=0,
                 callback=None):
        self.kernel = kernel
        self.n_experts = n_experts
        self.n_samples = n_samples
        self.batch_size = batch_size
        self.partition = partition
        self.share_hyperparameters = share_hyperparameters
        self.scale_evidence = scale_evidence
        self.weighting = weighting
        self.psis = psis
        self.min_block_size = min_block_size
        self.samples_per_iteration = samples_per_iteration
        self.max_iter = max_iter
        self.tol = tol
        self.client = client
        self.backend = backend
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def _core_likelihood(self):
        return "gaussian"

    def _encode_targets(self, y):
        y = as_vector(y, "y")
        mean, std = mean_and_std(y)
        self.y_mean_, self.y_scale_ = float(mean), float(std) if std > 0 else 1.0
        return np.ascontiguousarray((y - self.y_mean_) / self.y_scale_)

    def _log_unit(self):
        return math.log(self.y_scale_)  # (log weights in y's units: - B log y_scale_ per sample)

    def predict_latent(self, X):
        """Mixture mean [T] and variance [T] of the latent function at X [T, D] (the variance
        is inf where it exceeds float64, for targets beyond about 1e154)."""
        mean, var = self._mixture_latent(X)
        with np.errstate(over="ignore"):
            return mean * self.y_scale_ + self.y_mean_, var * self.y_scale_ * self.y_scale_

    def predict(self, X, return_std=False):
        """Mixture mean [T] of a new observation at X [T, D], and with ``return_std`` its
        standard deviation [T] (noise included; the mixture's, spread of the experts' means
        included)."""
        X = self._validate_X(X)
        T = len(X)
        mean, var = np.empty(T), np.empty(T)
        for sl, log_c, pred in self._components(X):
            mean[sl], var[sl] = self._moments(np.exp(log_c), pred["mean"], pred["var_y"])
        mean = mean * self.y_scale_ + self.y_mean_
        if not return_std:
            return mean
        return mean, np.sqrt(var) * self.y_scale_

    def predict_log_density(self, X, y):
        """log p(y | x) [T] of observations y [T] at X [T, D] under the mixture predictive
        (sum over samples and experts of w_j rho_jk N(y | m_jk, v_jk)); its sum is the test
        log likelihood."""
        X = self._validate_X(X)
        y = (np.asarray(y, dtype=np.float64).ravel() - self.y_mean_) / self.y_scale_
        out = np.empty(y.size)
        for sl, log_c, pred in self._components(X):
            m, v = pred["mean"], pred["var_y"]
            lp = -0.5 * (_LOG_2PI + np.log(v) + (y[sl, None] - m) ** 2 / v)
            out[sl] = logsumexp(log_c + lp, axis=1)
        return out - math.log(self.y_scale_)


class ISMOEClassifier(GPClassifierMixin, ClassifierMixin, _ISMOEEstimator):
    __doc__ = ("""Importance-sampled mixture of Gaussian-process experts for binary
    classification (Zhang & Williamson, JMLR 2019, section 4.2.3): as
    :class:`ISMOERegressor`, with a Laplace approximation in each expert (Rasmussen & Williams
    2006, Algorithm 3.1) for its evidence and its predictions.
    """ + _PARAMETERS + """    likelihood : {'probit', 'logit'}, default 'probit'
        The experts' link.
""" + _COMMON + _ATTRIBUTES + """    classes_ : ndarray [2]
    """)

    _FIT_MEAN = False
    _parameter_constraints = {**_ISMOEEstimator._parameter_constraints,
                              "likelihood": (Options("probit", "logit"),)}

    def __init__(self, kernel=None, *, likelihood="probit", n_experts=10, n_samples=32,
                 batch_size=None, partition="gmm", share_hyperparameters=False,
                 scale_evidence=False, weighting="importance", psis=False, min_block_size=10,
                 samples_per_iteration=None, max_iter=200, tol=1e-9, client=None, backend=None,
                 optimize_hyperparameters=True, priors="default", jitter=1e-6, random_state=None,
                 verbose=0,
                 callback=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.n_experts = n_experts
        self.n_samples = n_samples
        self.batch_size = batch_size
        self.partition = partition
        self.share_hyperparameters = share_hyperparameters
        self.scale_evidence = scale_evidence
        self.weighting = weighting
        self.psis = psis
        self.min_block_size = min_block_size
        self.samples_per_iteration = samples_per_iteration
        self.max_iter = max_iter
        self.tol = tol
        self.client = client
        self.backend = backend
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def _core_likelihood(self):
        return self.likelihood

    def _log_unit(self):
        return 0.0

    def _encode_targets(self, y):
        check_classification_targets(y)
        self._label_encoder = LabelEncoder().fit(y)
        self.classes_ = self._label_encoder.classes_
        C = len(self.classes_)
        if C < 2:
            raise ValueError(f"ISMOEClassifier needs samples of at least 2 classes; the data "
                             f"contain only one class: {self.classes_[0]!r}")
        if C > 2:
            raise ValueError(f"Only binary classification is supported by ISMOEClassifier; y "
                             f"has {C} classes")
        return self._label_encoder.transform(y).astype(np.float64)

    def predict_latent(self, X):
        """Mixture mean [T] and variance [T] of the latent function at X [T, D]."""
        return self._mixture_latent(X)

    def _log_proba_columns(self, X):
        X = self._validate_X(X)
        T = len(X)
        out = np.empty((T, 2))
        with np.errstate(divide="ignore"):
            for sl, log_c, pred in self._components(X):
                p = np.clip(pred["prob"], 0.0, 1.0)
                out[sl, 1] = logsumexp(log_c + np.log(p), axis=1)
                out[sl, 0] = logsumexp(log_c + np.log1p(-p), axis=1)
        return out

    def predict_proba(self, X):
        """Class probabilities [T, 2] (columns in the order of ``classes_``): the mixture of the
        experts' P(y = 1)."""
        X = self._validate_X(X)
        T = len(X)
        out = np.empty((T, 2))
        for sl, log_c, pred in self._components(X):
            p1 = np.clip(np.sum(np.exp(log_c) * pred["prob"], axis=1), 0.0, 1.0)
            out[sl, 1], out[sl, 0] = p1, 1.0 - p1
        return out

    def predict_log_proba(self, X):
        """log p(y = class | X) [T, 2], computed in log space."""
        return self._log_proba_columns(X)
