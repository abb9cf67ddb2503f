"""The concave-VI estimators, :class:`VGPClassifier` and :class:`VGPPoissonRegressor`: the
inference for fixed hyperparameters is in :mod:`._inference`; here, the hyperparameter search
around it and prediction."""

import copy
import threading
import warnings

import numpy as np
import scipy.special
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .. import _core
from .. import kernels as _kernels
from .. import likelihoods as _likelihoods
from .._base import _docs, _start
from .._base._estimator import GPClassifierMixin, GPEstimator
from .._base._memory import check_fits, explain_memory_error
from .._base._optimize import lbfgs
from .._base._params import COMMON, NONE, Interval, Options
from .._validation import as_vector, check_counts, validate_input
from ..exceptions import LinAlgError, warn_at_caller
from ._inference import _BOUND_KINDS, _MAX_NEWTON, _METHODS, LocalBound, _infer_oa

__all__ = ["VGPClassifier", "VGPPoissonRegressor"]

#: Gauss-Hermite points for predictive probabilities (per latent function).
_N_GH = 40
#: Test rows per block of the ordinal likelihood's class probabilities (VGPClassifier._log_proba).
_ORDINAL_BLOCK = 4096
#: The hyperparameter search's relative tolerance (L-BFGS-B's ftol) in units of ``tol``: the
#: bound of an inference stopped at tol is only that accurate (bench/README.md, "VGP search").
_SEARCH_TOL_FACTOR = 100.0


class _Hyperparameters:
    """The learned hyperparameters as one unconstrained vector theta:
    [log kernel params (P)] + [constant prior means (L), when learned] +
    [phi_0, log(phi_1 - phi_0), ..., log(phi_{K-2} - phi_{K-3})] (ordinal thresholds).

    Priors (:mod:`pygpfast.priors`) are those of the kernel's hyperparameters; the means and the
    thresholds are flat.
    """

    def __init__(self, kernel, local_bound, mean, learn_mean):
        self.kernel = kernel
        self.local_bound = local_bound
        self.mean = mean
        self.learn_mean = learn_mean
        self.ordinal = local_bound.likelihood == "ordinal"

    def get(self):
        parts = [self.kernel.theta]
        if self.learn_mean:
            parts.append(self.mean)
        if self.ordinal:
            phi = self.local_bound.thresholds
            parts.append(np.concatenate([phi[:1], np.log(np.diff(phi))]))
        return np.concatenate(parts)

    def bounds(self):
        """The kernel parameters' box of :func:`pygpfast.kernels.hyper_bounds` around their
        starting values (the same search for inputs in any units); +-1e3 for the means and
        the thresholds' coordinates."""
        theta = self.get()
        P = self.kernel.n_params
        box = np.column_stack(_kernels.hyper_bounds(theta[:P]))
        return np.vstack([box, np.tile([-1e3, 1e3], (theta.size - P, 1))])

    def set(self, theta):
        P = self.kernel.n_params
        self.kernel.theta = theta[:P]
        i = P
        if self.learn_mean:
            self.mean = np.array(theta[i:i + self.mean.size])
            i += self.mean.size
        if self.ordinal:
            t = theta[i:]
            with np.errstate(over="ignore"):
                phi = t[0] + np.concatenate([[0.0], np.cumsum(np.exp(t[1:]))])
            lb = self.local_bound
            self.local_bound = LocalBound("ordinal", bound=lb.bound, n_pieces=lb.n_pieces,
                                          n_classes=lb.n_classes, thresholds=phi)

    @property
    def has_prior(self):
        return self.kernel.has_priors

    def log_prior(self):
        """The log prior density at the current theta (0.0 without priors)."""
        return float(self.kernel.log_prior()) if self.kernel.has_priors else 0.0

    def gradient(self, d_kernel, d_mean, d_thresholds):
        """d (bound + log prior) / d theta from the bound's gradients w.r.t. the positive kernel
        parameters, the means and the thresholds (the prior's, at the current theta, added)."""
        d_theta = d_kernel * self.kernel.params
        if self.kernel.has_priors:
            d_theta = d_theta + self.kernel.grad_log_prior()
        parts = [d_theta]
        if self.learn_mean:
            parts.append(d_mean)
        if self.ordinal:
            phi = self.local_bound.thresholds
            tail = np.cumsum(d_thresholds[::-1])[::-1]  # sum_{j >= k} d/dphi_j
            parts.append(np.concatenate([tail[:1], np.diff(phi) * tail[1:]]))
        return np.concatenate(parts)


class _Run:
    """One fit: the hyperparameters, the warm start of the inference, the last evaluation."""

    def __init__(self, estimator, X, t, hyper):
        self.estimator, self.X, self.t, self.hyper = estimator, X, t, hyper
        L, N = hyper.local_bound.n_latent, X.shape[0]
        # The start of every cold inference. The Poisson and multinomial bounds hold
        # exp(m + v/2): from Algorithm 1's own start V = Sigma they overflow once the prior
        # variance reaches a few hundred, where unit site precisions (V <= 1) do not. The
        # Opper-Archambeau path starts there too for Poisson (at prior variance 1000 its bound
        # at lambda = 0 is -1e219 and L-BFGS-B cannot leave), but keeps lambda = 0 for the
        # multinomial bound, which stays finite there (a log-sum-exp) and from which its
        # L-BFGS-B is faster (a 3-class fit with N = 150: 1.8 s from 0, 26 s from 1).
        likelihood = hyper.local_bound.likelihood
        lambda0 = 1.0 if (likelihood == "poisson" or (estimator.method == "fixed-point"
                                                      and likelihood == "softmax")) else 0.0
        self.start = (np.zeros((L, N)), np.full((L, N), lambda0))
        self.alpha, self.lambda_ = self.start[0].copy(), self.start[1].copy()
        self.last = None
        self.evaluations = 0

    def _cold(self):
        """The inference from the start, its failure (LinAlgError, or ValueError for an
        Opper-Archambeau bound that overflows there) told in the estimator's terms: the core's
        messages speak of the site parameters, which the estimators choose themselves."""
        self.alpha, self.lambda_ = self.start[0].copy(), self.start[1].copy()
        try:
            return self.estimator._inference(self.hyper, self.X, self.t, self.alpha, self.lambda_)
        except (LinAlgError, ValueError) as error:
            kernel = self.hyper.kernel
            top = float(np.max(kernel.diag(self.X)))
            raise type(error)(
                f"{error}. {type(self.estimator).__name__}: at the kernel {kernel!r} (prior "
                f"variance up to {top:.3g}) the inference fails from its own start: use a "
                "kernel of smaller variance or longer lengthscales (or, when the hyperparameters "
                "are searched, priors or bounds that keep them moderate), remove duplicate rows, "
                "or increase jitter") from error

    def evaluate(self, theta):
        """The bound and its gradients at theta: (info, (d_kernel, d_mean, d_thresholds))."""
        self.hyper.set(theta)
        self.evaluations += 1
        warm = not (np.array_equal(self.alpha, self.start[0])
                    and np.array_equal(self.lambda_, self.start[1]))
        if not warm:
            out = self._cold()
        else:
            try:
                out = self.estimator._inference(self.hyper, self.X, self.t, self.alpha,
                                                self.lambda_)
                stalled = not out[0]["converged"]
            # (ValueError: the Opper-Archambeau bound overflowed at the warm start)
            except (LinAlgError, ValueError):
                stalled = True
            if stalled:
                # A warm start from far-away hyperparameters can push the rank-one updates into
                # rounding trouble (a site precision so large that the cavity precision
                # 1/v - lambda has no digits left) or stall; the cold start is the safe one.
                out = self._cold()
        info, alpha, lam, grads = out
        # The next evaluation starts here; lambda >= 0 keeps Omega + Lambda positive definite
        # for any kernel (the piecewise bounds allow slightly negative site precisions).
        self.alpha, self.lambda_ = alpha, np.maximum(lam, 0.0)
        self.last = (theta.copy(), info, alpha, lam)
        return info, grads

    def at(self, theta):
        """(info, alpha, lambda) at theta, re-evaluated unless it was the last one."""
        if self.last is None or not np.array_equal(self.last[0], theta):
            self.evaluate(theta)
        self.hyper.set(theta)
        return self.last[1:]


def _kernel_gradient_matrices(kernel):
    """N x N scratch matrices the core's kernel gradient (K_vjp, csrc/src/kernels.cpp) holds at
    once: one for a leaf; a product holds its terms' K, the adjoint of one term and that term's
    own scratch."""
    if isinstance(kernel, _kernels.Product):
        return len(kernel.kernels) + 1 + max(map(_kernel_gradient_matrices, kernel.kernels))
    if isinstance(kernel, _kernels.Sum):
        return max(map(_kernel_gradient_matrices, kernel.kernels))
    return 1


def _fit_matrices(L, kernel, multinomial=False):
    """N x N float64 matrices a fit holds at its peak (csrc/src/cvi.cpp, fit_step): Sigma, V_l
    and their copy saved for the guarded sweep, and the Newton steps' B (2 L + 2), with the
    multinomial bound's coupled steps K_l and S (2 L + 4); then, for the gradient, Sigma, Pi_l
    (over V_l), B, G and the kernel gradient's scratch. The
    Opper-Archambeau path holds K in Python where the core holds B. Measured peaks (resident
    set, N = 3000): 5.2 N^2 doubles for "logit" and Poisson, 10.3 for "softmax" with 3
    classes, against 5 and 10 here."""
    return max(2 * L + 2 + 2 * bool(multinomial), L + 3 + _kernel_gradient_matrices(kernel))


class _VGPEstimator(GPEstimator):
    """Shared fitting logic of VGPClassifier and VGPPoissonRegressor."""

    _FITTED = "alpha_"
    _OBJECTIVE = "bound"
    _parameter_constraints = {
        **COMMON,
        "method": (Options(*_METHODS),),
        "max_iter": (Interval(int, 1, None),),
        "inner_max_iter": (Interval(int, 1, None),),
        "block_size": (NONE, Interval(int, 1, None)),
    }

    #: What to use when the N x N matrices do not fit (subclasses name their sparse peer).
    _SPARSE_PEER = "SVGPClassifier"
    #: Held while a prediction computes predictive_factor_ (see _predictive_factor); on the
    #: class, so that it is never part of an estimator's state (pickles, copies, clones).
    _factor_lock = threading.Lock()

    def _memory_plan(self, N, local_bound, kernel):
        """(N, bytes per N^2, what, advice) of a fit on N points with local_bound's latent
        functions, for pygpfast._base._memory's check_fits and explain_memory_error."""
        L = local_bound.n_latent
        matrices = _fit_matrices(L, kernel, local_bound.likelihood == "softmax")
        latents = f"{L} latent functions" if L > 1 else "1 latent function"
        what = (f"{type(self).__name__}.fit on N = {N} points ({latents}) holds {matrices} "
                f"N x N float64 matrices at its peak, which")

        def advice(largest):
            subsample = f", or fit on a subsample of at most {largest} rows" if largest >= 2 else ""
            return (f"a full GP's memory grows as N^2; use {self._SPARSE_PEER} (sparse, memory "
                    f"O(N M + M^2) for M inducing points) for data this large{subsample}")

        return N, 8.0 * matrices, what, advice

    def _fit(self, X, t, local_bound, mean, learn_mean):
        rs = check_random_state(self.random_state)
        kernel = _start.start_kernel(self.kernel, X, rs)
        self._with_default_priors(kernel, X)
        start = copy.deepcopy(kernel)
        memory = self._memory_plan(X.shape[0], local_bound, kernel)
        check_fits(*memory)
        mean = np.asarray(mean, dtype=np.float64)

        def search(scaled):
            # The search (or none) from `kernel`, or from `scaled` for a second one, with the
            # fitted attributes set at its result.
            run = _Run(self, X, t, _Hyperparameters(kernel if scaled is None else scaled,
                                                    local_bound, mean, learn_mean))
            self._start_reporting()
            theta = self._optimise(run) if self.optimize_hyperparameters else run.hyper.get()
            self._set_fitted(run, theta)
            self._end_reporting()
            self._run, self._theta = run, theta
            return self._callback_stopped

        try:
            with explain_memory_error(*memory):
                found = self._search_twice(search, X, start, rs,
                                           may_search_again=self.optimize_hyperparameters)
                run, theta = self._run, self._theta
                del self._run, self._theta
                info, alpha, lam = self._set_fitted(run, theta)
                self._predictive_factor()
        except BaseException:  # (a callback may have set the attributes of a search that failed)
            self._forget()
            raise
        if not self.optimize_hyperparameters:
            self.history_, self.n_evaluations_ = info["history"][:, 0].copy(), 1
            if run.hyper.has_prior:
                self.history_ += self.log_prior_
            self.n_iter_ = int(info["iterations"])
            if self.verbose:
                print(f"[{type(self).__name__}] bound {self.objective_: .8e}  "
                      f"{self.n_iter_} inference iterations", flush=True)
        if found is not None:
            found.warn(stacklevel=3, suffix=_start.second_search_clause(self.restart_, "bound"))
        if self.method == "opper-archambeau":
            self._check_oa_optimum(run, alpha, lam, float(info["bound"]), bool(info["converged"]))
        elif not info["converged"]:
            warnings.warn(f"{self.method} inference did not converge in inner_max_iter="
                          f"{self.inner_max_iter} iterations; increase it or tol",
                          ConvergenceWarning, stacklevel=3)
        return self

    def _combine_searches(self, first, second):
        self.n_evaluations_ = first["n_evaluations_"] + second["n_evaluations_"]

    def _forget(self):
        super()._forget()
        # (and the previous fit's L N x N factors, which would otherwise stay allocated through
        # the new fit's peak)
        if hasattr(self, "predictive_factor_"):
            del self.predictive_factor_

    def _set_fitted(self, run, theta):
        """The fitted attributes at theta (the final one, or the current one for a callback);
        returns (info, alpha, lambda)."""
        info, alpha, lam = run.at(theta)
        self.kernel_ = copy.deepcopy(run.hyper.kernel)
        self.local_bound_ = copy.deepcopy(run.hyper.local_bound)
        self.mean_ = run.hyper.mean.copy()
        self.log_prior_ = run.hyper.log_prior()
        self.objective_ = float(info["bound"])
        if run.hyper.has_prior:
            self.objective_ += self.log_prior_
        self.inference_info_ = {k: v for k, v in info.items() if k != "history"}
        self.alpha_, self.lambda_ = alpha.T.copy(), lam.T.copy()  # ([N, L]; the core's are [L, N])
        self.predictive_factor_ = None  # (_predictive_factor computes it when first needed)
        self.X_train_ = run.X
        return info, alpha, lam

    def __getstate__(self):
        """The pickled state leaves out predictive_factor_ (L N^2 doubles: 320 MB at N = 2000
        with 10 classes), which the first prediction after unpickling recomputes from
        X_train_, kernel_ and lambda_ (N^3 / 3 flops per latent function), bit for bit."""
        state = super().__getstate__()
        if state.get("predictive_factor_") is not None:
            state = dict(state, predictive_factor_=None)
        return state

    def _predictive_factor(self):
        """predictive_factor_, computed on first use after the posterior changed: fit computes
        it once at the end, and a callback that does not predict skips its N^3 / 3 flops per
        latent function (and K(X, X)) at every iteration of the search. The only state a
        prediction writes: threads that predict at once from a model just loaded compute it
        once (under ``_factor_lock``), and each uses the factor it read or computed."""
        F = self.predictive_factor_
        if F is None:
            with self._factor_lock:
                F = self.predictive_factor_
                if F is None:
                    codes, params = self.kernel_._spec(self.X_train_.shape[1])
                    F = _core.cvi.predictive_factor(
                        codes, params, self.X_train_, jitter=self.jitter,
                        lambda_=np.ascontiguousarray(self.lambda_.T))
                    self.predictive_factor_ = F
        return F

    def _check_oa_optimum(self, run, alpha, lam, bound, converged):
        """Warn when the Opper-Archambeau inference at the fitted hyperparameters stopped short
        of the optimum of the bound, saying how far: the fixed-point method, run from its result
        (up to inner_max_iter iterations, to tol), measures the gap.

        L-BFGS-B on its parameterisation gains slowly near the optimum: at inner_max_iter=200
        it stops about 2e-4 (relative) below it on 750 points of banana with RBF(1, 1), and a
        converged run on an ill-conditioned prior (large variance, long length scales) stops
        where its relative-reduction test passes, far from it. The fixed-point method from there
        takes a few iterations (3 in that example: 1.6 s against 37 s for Opper-Archambeau's
        200), so the warning gives the gap itself, not an estimate. Nothing is said when a
        converged run is within sqrt(tol) |bound| of the optimum (L-BFGS-B's ftol bounds one
        step's relative gain, not the distance to the optimum, which stays well above tol on
        any run: hence sqrt(tol), 1e-4 for the default).
        """
        hyper, X, t = run.hyper, run.X, run.t
        codes, params = hyper.kernel._spec(X.shape[1])

        def fixed_point(a, lam_):
            return _core.cvi.fit_step(
                codes, params, *hyper.local_bound._core_args(), X, t, mean=hyper.mean,
                jitter=self.jitter, alpha=a, lambda_=np.maximum(lam_, 0.0),
                max_iter=self.inner_max_iter, tol=self.tol, block_size=self.block_size or 0,
                max_newton=_MAX_NEWTON, skip_tol=np.sqrt(self.tol), with_grad=False,
                return_Pi=False)[0]

        try:
            optimum = fixed_point(alpha, lam)
        except (LinAlgError, ValueError):  # (a warm start the rank-one updates cannot take)
            optimum = fixed_point(*run.start)
        gap = optimum["bound"] - bound
        if converged and gap <= np.sqrt(self.tol) * max(1.0, abs(bound)):
            return
        how = ("converged" if converged
               else f"stopped at inner_max_iter={self.inner_max_iter} iterations")
        advice = ("its parameterisation is ill-conditioned for this kernel" if converged
                  else "increase inner_max_iter")
        if optimum["converged"]:
            n = optimum["iterations"]
            reached = f"reached by the fixed-point method in {n} iteration{'s' * (n != 1)}"
        else:
            reached = ("a lower bound on it: the fixed-point method had not converged after "
                       f"inner_max_iter={self.inner_max_iter} iterations")
        warnings.warn(
            f"opper-archambeau inference {how} {gap:.3g} ({gap / max(1.0, abs(optimum['bound'])):.2g}"
            f" relative) below the optimum of the bound at the fitted hyperparameters: "
            f"{bound:.10g} against {optimum['bound']:.10g} ({reached} from its result); "
            f"{advice}, or use method='fixed-point'", ConvergenceWarning, stacklevel=4)

    def _optimise(self, run):
        """L-BFGS-B on -(bound + log prior) / N over the hyperparameters: the best theta; a
        ConvergenceWarning when it stopped at max_iter."""
        N = run.X.shape[0]

        def objective(theta):
            info, grads = run.evaluate(theta)
            value = info["bound"]
            if run.hyper.has_prior:
                value = value + run.hyper.log_prior()
            return -value / N, -run.hyper.gradient(*grads) / N

        def on_iteration(it, theta, value):
            return self._report(it, -value * N, f"{run.evaluations} evaluations",
                                before_callback=lambda: self._set_fitted(run, theta))

        res = lbfgs(objective, run.hyper.get(), bounds=run.hyper.bounds(),
                    max_iter=self.max_iter, ftol=_SEARCH_TOL_FACTOR * self.tol, gtol=1e-6,
                    on_iteration=on_iteration)
        self.n_iter_, self.n_evaluations_ = res.n_iter, res.n_evaluations
        if res.problem == "max_iter":
            warn_at_caller(f"hyperparameter optimisation stopped after max_iter={self.max_iter} "
                           "iterations; increase max_iter for a tighter fit", ConvergenceWarning)
        return res.x

    def _inference(self, hyper, X, t, alpha, lam):
        """Inference at hyperparameters `hyper` from the warm start (alpha, lam), with the
        gradients: (info, alpha, lambda, (d_kernel, d_mean, d_thresholds))."""
        codes, params = hyper.kernel._spec(X.shape[1])
        max_iter = self.inner_max_iter
        if self.method == "opper-archambeau":
            K = _core.cvi.prior_covariance(codes, params, X, jitter=self.jitter)
            _, alpha, lam, oa_history, _, oa_converged, oa_info = _infer_oa(
                K, t, hyper.local_bound, hyper.mean, alpha, lam, max_iter, self.tol)
            max_iter = 0  # (the core then only differentiates)
        info, alpha, lam, grads, _ = _core.cvi.fit_step(
            codes, params, *hyper.local_bound._core_args(), X, t, mean=hyper.mean,
            jitter=self.jitter, alpha=alpha, lambda_=lam, max_iter=max_iter, tol=self.tol,
            block_size=self.block_size or 0, max_newton=_MAX_NEWTON, skip_tol=np.sqrt(self.tol),
            with_grad=True, return_Pi=False)
        if self.method == "opper-archambeau":
            info.update({k: v for k, v in oa_info.items() if k != "bound"},
                        history=oa_history, converged=oa_converged)
        return info, alpha, lam, grads

    def predict_latent(self, X):
        """Means and variances of the latent functions at X [T, D] under q: [T] each for one
        latent function, [T, L] for L."""
        mean, var = self._latent(X)
        return (mean[:, 0], var[:, 0]) if mean.shape[1] == 1 else (mean, var)

    def _latent(self, X):
        """Means and variances [T, L] of the latent functions at X [T, D]."""
        check_is_fitted(self)
        X = validate_input(self, X, dtype=np.float64, order="C", reset=False)
        codes, params = self.kernel_._spec(X.shape[1])
        return _core.cvi.predict_f(codes, params, self.X_train_, X, mean=self.mean_,
                                   alpha=np.ascontiguousarray(self.alpha_.T),
                                   lambda_=np.ascontiguousarray(self.lambda_.T),
                                   F=self._predictive_factor())


_PARAMETERS = _docs.KERNEL + """    method : {'fixed-point', 'opper-archambeau'}, default 'fixed-point'
        Algorithm 1 of Khan, Mohamed & Murphy (2012), with mean steps that anticipate the sweep
        (see :func:`infer`), or L-BFGS-B on the Opper-Archambeau reparameterisation (their
        eq. 11); both maximise the same bound.
    max_iter : int, default 200
        Hyperparameter iterations (L-BFGS-B).
    inner_max_iter : int, default 200
        Iterations of the inference for fixed hyperparameters.
    tol : float, default 1e-8
        The inference stops when an iteration raises the bound by less than tol |bound|; the
        hyperparameter search when one raises it by less than 100 tol |bound|.
    block_size : int or None, default None
        Coordinates per BLAS-3 block of Algorithm 1 (1: the literal rank-one updates). None:
        32 below 1500 training points, 64 from there.
""" + _docs.COMMON

_ATTRIBUTES = _docs.ATTRIBUTES + """    n_evaluations_ : int
        Inferences run (one per evaluation of the bound and its gradient; both searches').
    mean_ : ndarray [L]
        Constant prior means of the latent functions.
    local_bound_ : LocalBound
    alpha_, lambda_ : ndarray [N, L]
        The posterior: m_l = mean_l + K alpha_l, V_l = (K^-1 + diag(lambda_l))^-1.
    predictive_factor_ : ndarray [L, N, N]
        Lower Cholesky factors of I + diag(lambda_l)^1/2 K diag(lambda_l)^1/2, for the
        predictive variances (not pickled: recomputed at the first prediction after loading).
    inference_info_ : dict
        Counters of the last inference (iterations, flops, residuals, ...).
    X_train_ : ndarray [N, D]
"""


def _ordered_categories(y):
    """The categories of y in their order when y is an ordered pandas Categorical (or a Series or
    Index of one), else None. Duck-typed on the dtype's ``ordered`` and ``categories``: pandas is
    not imported."""
    dtype = getattr(y, "dtype", None)
    if getattr(dtype, "ordered", None) is True and getattr(dtype, "categories", None) is not None:
        return np.asarray(dtype.categories)
    return None


def _encode_classes(y, classes):
    """(class_order_, t): the classes in their order and the index t [N] (float64) of each
    label of y [N] among them. classes None: the sorted distinct labels. ValueError unless
    classes is 1-D with distinct entries, holds every label of y and each of its entries occurs
    in y."""
    if classes is None:
        classes, t = np.unique(y, return_inverse=True)
        return classes, t.reshape(-1).astype(np.float64)
    classes = np.array(classes)  # (a copy: classes_ must not follow the caller's array)
    if classes.ndim != 1:
        raise ValueError(f"classes must be a 1-D array-like of class labels, got {classes!r}")
    index = {}
    for k, label in enumerate(classes.tolist()):
        if index.setdefault(label, k) != k:
            raise ValueError(f"classes repeats the label {label!r}")
    t = np.array([index.get(label, -1) for label in y.tolist()], dtype=np.float64)
    if np.any(t < 0):
        unknown = sorted({repr(label) for label, k in zip(y.tolist(), t) if k < 0})
        raise ValueError(f"y has labels that are not in classes: {', '.join(unknown)}")
    absent = np.setdiff1d(np.arange(classes.size), t)
    if absent.size:
        raise ValueError(f"the class {classes.tolist()[absent[0]]!r} does not occur in y (every "
                         "entry of classes needs training points)")
    return classes, t


class VGPClassifier(GPClassifierMixin, ClassifierMixin, _VGPEstimator):
    __doc__ = (
        """Full-GP classifier by concave variational inference (Khan, Mohamed & Murphy 2012): a
    Gaussian q per latent function, fitted by maximising a concave lower bound on log p(y)
    plus the log prior of the hyperparameters (``objective_``; the bound alone with
    ``priors=None``) with closed-form local bounds.

    Parameters
    ----------
""" + _PARAMETERS + """    likelihood : {'logit', 'softmax', 'stick-breaking', 'ordinal'}, default 'logit'
        'logit': binary, with a piecewise bound on log(1 + e^x). 'softmax': C latent
        functions, with the log-sum-exp bound. 'stick-breaking': C - 1 latent functions.
        'ordinal': one latent function and C - 1 learned thresholds, for the classes in the
        order of ``class_order_``.
    bound : {'quadratic', 'linear'}, default 'quadratic'
        Piecewise bound on log(1 + e^x) (Marlin, Khan & Murphy 2011) of the logit-based
        likelihoods.
    n_pieces : int, default 20
        Its number of pieces, 3 to 20.
    classes : array_like [C] or None, default None
        The labels in the order the model takes them (the scale's for 'ordinal', lowest
        first; the sticks' for 'stick-breaking'). None: the order of an ordered pandas
        Categorical y for 'ordinal', else sorted. ``classes_`` and predict_proba's columns are
        sorted whatever the order.
    learn_mean : bool or None, default None
        Learn a constant prior mean per latent function. None: for 'softmax' and
        'stick-breaking'.

    Attributes
    ----------
    classes_ : ndarray [C]
        The labels, sorted: the columns of predict_proba.
    class_order_ : ndarray [C]
        The labels in the order the model takes them.
""" + _ATTRIBUTES + _docs.NOTES)

    def __init__(self, kernel=None, *, likelihood="logit", bound="quadratic", n_pieces=20,
                 method="fixed-point", optimize_hyperparameters=True, priors="default",
                 max_iter=200, inner_max_iter=200, tol=1e-8, block_size=None, jitter=1e-6,
                 classes=None, learn_mean=None, random_state=None, verbose=0, callback=None):
        self.likelihood = likelihood
        self.kernel = kernel
        self.bound = bound
        self.n_pieces = n_pieces
        self.method = method
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.max_iter = max_iter
        self.inner_max_iter = inner_max_iter
        self.tol = tol
        self.block_size = block_size
        self.jitter = jitter
        self.classes = classes
        self.learn_mean = learn_mean
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = self.likelihood != "logit"
        return tags

    def fit(self, X, y):
        """Fit q and (optionally) the hyperparameters.

        Parameters
        ----------
        X : array_like [N, D]
        y : array_like [N]
            Class labels (two classes for "logit"); for "ordinal", an ordered pandas Categorical
            gives the order of the classes unless `classes` does.

        Returns
        -------
        self
        """
        if self.likelihood not in ("logit", "softmax", "stick-breaking", "ordinal"):
            raise ValueError("likelihood must be 'logit', 'softmax', 'stick-breaking' or "
                             f"'ordinal', got {self.likelihood!r}")
        if self.bound not in _BOUND_KINDS:
            raise ValueError(f"bound must be one of {_BOUND_KINDS}, got {self.bound!r}")
        self._check_params()
        self._forget()
        order = self.classes
        categories = (_ordered_categories(y) if order is None and self.likelihood == "ordinal"
                      else None)
        # (copy: X_train_ must not follow the caller's array, as class_order_ does not)
        X, y = validate_input(self, X, y, dtype=np.float64, order="C", copy=True)
        check_classification_targets(y)
        if categories is not None:  # (those that y uses)
            present = set(y.tolist())
            order = categories[[label in present for label in categories.tolist()]]
        self.class_order_, t = _encode_classes(y, order)
        self.classes_ = np.unique(self.class_order_)
        C = len(self.classes_)
        if C < 2:
            raise ValueError(f"y has {C} class; a classifier needs at least 2")
        if self.likelihood == "logit" and C != 2:
            raise ValueError(f"Only binary classification is supported by likelihood='logit'; "
                             f"y has {C} classes (use 'softmax' or 'stick-breaking')")
        thresholds = None
        if self.likelihood == "ordinal":  # cut points at the logits of the class frequencies
            cum = np.cumsum(np.bincount(t.astype(int), minlength=C))[:-1] / t.size
            thresholds = scipy.special.logit(np.clip(cum, 1e-3, 1 - 1e-3))
            thresholds = np.maximum.accumulate(thresholds + 1e-3 * np.arange(C - 1))
        lb = LocalBound(self.likelihood, bound=self.bound, n_pieces=self.n_pieces,
                        n_classes=C if self.likelihood != "logit" else 0,
                        thresholds=thresholds)
        learn = self.learn_mean
        if learn is None:
            learn = self.likelihood in ("softmax", "stick-breaking")
        mean = np.zeros(lb.n_latent)
        if learn and self.likelihood == "stick-breaking":  # P(y = k | y >= k) per latent
            counts = np.bincount(t.astype(int), minlength=C).astype(np.float64)
            at_least = np.cumsum(counts[::-1])[::-1][:-1]
            mean = scipy.special.logit(np.clip(counts[:-1] / at_least, 1e-3, 1 - 1e-3))
        elif learn and self.likelihood == "softmax":
            freq = np.bincount(t.astype(int), minlength=C) / t.size
            mean = np.log(np.clip(freq, 1e-3, None))
            mean -= mean.mean()
        return self._fit(X, t, lb, mean, bool(learn))

    def predict_proba(self, X):
        """Class probabilities [T, C] (columns in the order of ``classes_``)."""
        mean, var = self._latent(X)
        if self.likelihood == "softmax":
            proba = _likelihoods.Softmax(mean.shape[1], n_gh=_N_GH).predict_proba(mean, var)
        elif self.likelihood == "logit":
            sig = _likelihoods.Bernoulli(link="logit", n_gh=_N_GH)
            p1 = np.clip(sig.predict_mean_and_var(mean[:, 0], var[:, 0])[0], 0.0, 1.0)
            proba = np.column_stack([1.0 - p1, p1])
        else:
            proba = np.exp(self._log_proba(mean, var))
        return self._sorted_columns(proba)

    def predict_log_proba(self, X):
        """log p(y = class | X) [T, C]: computed in log space, finite however small the
        probability."""
        mean, var = self._latent(X)
        if self.likelihood == "softmax":
            softmax = _likelihoods.Softmax(mean.shape[1], n_gh=_N_GH)
            log_proba = softmax.predict_log_proba(mean, var)
        else:
            log_proba = self._log_proba(mean, var)
        return self._sorted_columns(log_proba)

    def _sorted_columns(self, per_class):
        """per_class [T, C], columns in the order of class_order_, with those of classes_."""
        return per_class[:, np.unique(self.class_order_, return_index=True)[1]]

    def _log_proba(self, mean, var):
        """log p(y = class) [T, C] (columns in the order of class_order_) from the latent
        marginals mean, var [T, L] by Gauss-Hermite quadrature in log space (logit,
        stick-breaking, ordinal)."""
        sig = _likelihoods.Bernoulli(link="logit", n_gh=_N_GH)
        n = len(mean)

        def log_expected_sigmoid(sign, j):  # log E[s(sign z_j)], z_j ~ N(mean_j, var_j)
            return sig.predict_log_density(np.full(n, 0.5 * (1.0 + sign)), mean[:, j], var[:, j])

        if self.likelihood == "logit":
            return np.column_stack([log_expected_sigmoid(-1, 0), log_expected_sigmoid(1, 0)])
        if self.likelihood == "stick-breaking":
            # Latents are independent under q: p(k) = E[s(z_k)] prod_{j<k} E[s(-z_j)].
            L = mean.shape[1]
            up = np.column_stack([log_expected_sigmoid(1, j) for j in range(L)])
            down = np.column_stack([np.zeros(n)] + [log_expected_sigmoid(-1, j) for j in range(L)])
            rest = np.cumsum(down, axis=1)
            return np.column_stack([up + rest[:, :-1], rest[:, -1]])
        # ordinal: p(y = k | z) = s(phi_k - z) - s(phi_{k-1} - z) = s(phi_k - z) s(z - phi_{k-1})
        # (1 - e^(phi_{k-1} - phi_k)), without the first factor for the last class and the second
        # for the first: a product, whose logarithm loses no digits to cancellation, averaged
        # over the nodes in log space. The 2 (K - 1) arrays [rows, nodes] of a block are 80 (K -
        # 1) times its output: blocks of _ORDINAL_BLOCK rows bound them (all rows at once took
        # 875 MiB for an output of 8 MiB at T = 2e5, K = 5).
        x, w = np.polynomial.hermite_e.hermegauss(_N_GH)
        phi = self.local_bound_.thresholds
        log_proba = np.empty((n, phi.size + 1))
        for start in range(0, n, _ORDINAL_BLOCK):
            rows = slice(start, start + _ORDINAL_BLOCK)
            z = mean[rows, :1] + np.sqrt(var[rows, :1]) * x  # [rows, nodes]
            below, above = [], []  # log s(phi_k - z) and log s(z - phi_k)
            for u in (p - z for p in phi):
                soft = np.log1p(np.exp(-np.abs(u)))  # log s(+-u) = min(+-u, 0) - soft
                below.append(np.minimum(u, 0.0) - soft)
                above.append(np.minimum(-u, 0.0) - soft)
            for k in range(phi.size + 1):
                terms = (below[k] if k < phi.size else 0.0) + (above[k - 1] if k > 0 else 0.0)
                top = terms.max(axis=1)
                gap = np.log(-np.expm1(phi[k - 1] - phi[k])) if 0 < k < phi.size else 0.0
                log_proba[rows, k] = (top + np.log(np.exp(terms - top[:, None]) @ (w / w.sum()))
                                      + gap)
        return log_proba



class VGPPoissonRegressor(RegressorMixin, _VGPEstimator):
    __doc__ = (
        """Full-GP Poisson regression (rate exp(f)) by concave variational inference (Khan,
    Mohamed & Murphy 2012): the local bound is the exact expectation
    y m - exp(m + v/2) - lgamma(y + 1); real targets y >= 0 are taken by the same formula.
    The fit maximises the lower bound on log p(y) plus the log prior of the hyperparameters
    (``objective_``; the bound alone with ``priors=None``).

    Parameters
    ----------
""" + _PARAMETERS + """    learn_mean : bool, default True
        Learn a constant prior mean of the log rate (started at log mean(y)).

    Attributes
    ----------
""" + _ATTRIBUTES + _docs.NOTES)

    _SPARSE_PEER = "SVGPRegressor(likelihood='poisson')"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        return tags

    def __init__(self, kernel=None, *, method="fixed-point", optimize_hyperparameters=True,
                 priors="default", max_iter=200, inner_max_iter=200, tol=1e-8, block_size=None,
                 jitter=1e-6, learn_mean=True, random_state=None, verbose=0, callback=None):
        self.kernel = kernel
        self.method = method
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.max_iter = max_iter
        self.inner_max_iter = inner_max_iter
        self.tol = tol
        self.block_size = block_size
        self.jitter = jitter
        self.learn_mean = learn_mean
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def fit(self, X, y):
        """Fit q and (optionally) the hyperparameters.

        Parameters
        ----------
        X : array_like [N, D]
        y : array_like [N]
            Counts, or real values >= 0 (by the same formula), at most 2**53.

        Returns
        -------
        self
        """
        self._check_params()
        self._forget()
        X, y = validate_input(self, X, y, dtype=np.float64, order="C",
                              copy=True)  # (X_train_ keeps X)
        t = check_counts(as_vector(y, "y"))  # (the core checks t >= 0)
        mean = np.array([np.log(max(t.mean(), 1e-3))])
        return self._fit(X, t, LocalBound("poisson"), mean, bool(self.learn_mean))

    def predict(self, X, return_std=False):
        """Predictive mean [T] of the counts, and their standard deviation [T]."""
        mean, var = self._latent(X)
        ymean, yvar = _likelihoods.Poisson().predict_mean_and_var(mean[:, 0], var[:, 0])
        return (ymean, np.sqrt(yvar)) if return_std else ymean
