"""Informative vector machine classifiers (Lawrence, Seeger & Herbrich 2003; Seeger & Jordan
2004).

An IVM keeps Gaussian site approximations for an active set I of d training points, chosen
greedily by information gain, with assumed-density-filtering (ADF) site updates; every other
training point enters only through the hyperparameter criterion. Two latent models:

* one latent function with the probit likelihood Phi(u + beta) (two classes; and each of the C
  one-against-rest IVMs of ``multi_class="ovr"``, Seeger & Jordan's *binary* baseline, each with its
  own active set),
* C coupled latent functions with the softmax likelihood and the constrained site precisions
  of Seeger & Jordan's eq. (3) (``multi_class="joint"``, their *multi*), moments by C-dimensional
  cubature.

Hyperparameters (kernel parameters and intercepts beta) are learned as in Seeger & Jordan's
section 4: minimise the upper bound F(theta) >= -log P(y | theta) with I and the natural site
parameters fixed, by L-BFGS-B with the analytic gradient of the core; every
``reselect_every`` iterations I and the sites are selected again at the current
hyperparameters and the quasi-Newton search restarts (its first step along the negative
gradient). The bound, its gradient, the selection
and the predictions are the compiled core's (``pygpfast._core.ivm``).
"""

import copy

import numpy as np
import scipy.linalg
import scipy.special
from sklearn.base import ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .. import _core, _threads
from .. import kernels as _kernels
from .._base import _start
from .._base._estimator import GPClassifierMixin, GPEstimator
from .._base._optimize import lbfgs
from .._base._params import BOOL, COMMON, Interval, Options
from .._validation import validate_input
from ..exceptions import warn_at_caller

__all__ = ["IVMClassifier"]

#: Cubature rules of the core (pygpfast/ivm/cubature.hpp).
_RULES = {"gauss-hermite": 0, "stroud": 1}
#: "auto" takes the 3-point Gauss-Hermite product (3^C nodes, positive weights) up to this many
#: classes and Stroud's degree-5 rule (2 C^2 + 1 nodes) above.
_AUTO_GH_MAX_CLASSES = 5
#: Box of the intercepts in the hyperparameter search.
_INTERCEPT_BOUND = 20.0
#: Probit start of an intercept: Phi^-1 of the positive share, clipped to this.
_PROBIT_START_CLIP = 3.0


class IVMClassifier(GPClassifierMixin, ClassifierMixin, GPEstimator):
    """Sparse GP classifier by the informative vector machine (Lawrence, Seeger & Herbrich
    2003; joint multi-class IVM of Seeger & Jordan 2004).

    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel, optional
        Prior covariance of each latent function, and where the hyperparameter search starts.
        Default: RBF with ARD lengthscales from the median-distance heuristic.
    active_size : int, default 100
        d, the number of active points (selected greedily). Larger than the number of
        training points N: all N are active (``active_set_`` then has N entries).
    multi_class : {"joint", "ovr"}, default "joint"
        With C > 2 classes: "joint", one model of C coupled latent functions with the softmax
        likelihood (Seeger & Jordan 2004); "ovr", C one-against-rest probit IVMs with their
        own active sets (Seeger & Jordan's *binary* baseline), predicting the normalised one-vs-rest
        probabilities. Two classes always make one probit IVM.
    label_noise : float, default 0.0
        epsilon in [0, 0.5), fixed: each probit IVM's likelihood is ``P(y | u) = epsilon + (1 -
        2 epsilon) Phi(y (u + beta))`` (Kim & Ghahramani 2008), so a mislabelled point costs at
        most ``-log epsilon``; in its ADF update a point whose tilted variance would exceed its
        cavity variance (far on the wrong side, where the floor epsilon holds its mass) gets no
        site, and scores 0 in the selection. Two classes or ``multi_class="ovr"`` only (the
        joint model's softmax takes none); 0: the plain probit.
    shared_kernel : bool, default True
        One kernel for every latent function; False: a kernel per latent function (the
        setting of Seeger & Jordan 2004; C times the hyperparameters), all starting from `kernel`.
    optimize_hyperparameters : bool, default True
        Learn the kernel parameters and the intercepts by the section-4 bound.
    priors : {'default', None}, default 'default'
        Priors on the kernel's hyperparameters: the search minimises the section-4 bound minus
        their log density (the MAP point; the intercepts are flat). 'default': the shared
        default priors (dimension-scaled log-normal lengthscales, a weak log-normal variance;
        :mod:`pygpfast._base._priors`) where the kernel sets none; None: the kernel's own
        priors only (none unless set: the bound alone).
    max_iter : int, default 30
        L-BFGS-B iterations of the hyperparameter search, over all restarts.
    reselect_every : int, default 10
        L-BFGS-B iterations between re-selections of the active set and the sites (after
        each the search restarts).
    tol : float, default 1e-6
        Relative tolerance of each L-BFGS-B run (scipy's ftol); the search also stops when
        a re-selection changes the bound by less than tol |bound| after a converged run.
    cubature : {"auto", "gauss-hermite", "stroud"}, default "auto"
        C-dimensional rule of the joint model's Gaussian expectations: the 3-point
        Gauss-Hermite product (3^C nodes) or Stroud's degree-5 rule (2 C^2 + 1 nodes);
        "auto": Gauss-Hermite up to 5 classes. Stroud's rule has negative weights from C = 5
        on: at a point where its tilted moments or class probabilities are those of no
        positive measure (a normaliser <= 0, an indefinite covariance, a probability outside
        (0, 1)), the selection and the prediction take that point's by the Gauss-Hermite
        product (up to 12 classes; above, the selection skips the point). The bound keeps
        the chosen rule throughout.
    n_random : int, default 2
        The first inclusions are drawn at random (Seeger & Jordan 2004: "2 or 3").
    keep_fraction : float, default 0.5
        Joint model: the fraction of top scorers kept in the selection index J between
        inclusions (the rest of J, of size ceil(N / C), is drawn at random).
    random_state : int, RandomState or None
        Seeds the random inclusions and the default kernel's heuristic.
    verbose : int or bool, default 0
        Print the bound every `verbose` hyperparameter iterations.
    callback : callable, optional
        ``callback(estimator, iteration, objective) -> bool`` after every hyperparameter
        iteration (the fitted attributes hold the current iterate); True stops the search.

    Attributes
    ----------
    classes_ : ndarray [C]
    n_features_in_ : int
    active_set_ : ndarray [d] of int, or list of C such arrays
        Indices into the training rows of the active points, in inclusion order; for
        "ovr" (C > 2) one array per class.
    kernel_ : pygpfast.kernels.Kernel or list of Kernel
        The fitted kernel (a copy); with ``shared_kernel=False`` and C > 2 a list of C
        kernels, ``kernel_[c]`` for the latent function of ``classes_[c]``.
    intercept_ : ndarray [L]
        The intercepts beta of the L latent functions (L = 1 for two classes, else C).
    objective_ : float
        Minus the section-4 bound at the fitted hyperparameters and the active set selected
        there: a lower bound on log P(y | theta) (for "ovr", on the sum over the C
        one-against-rest problems), plus ``log_prior_``. A re-selection can lower the bound (Seeger & Jordan 2004,
        section 4): the fit keeps the hyperparameters, active set and sites of the selection (the
        first, or one after a run of L-BFGS-B) with the highest objective.
    history_ : ndarray [n_iter_]
        The objective after each L-BFGS-B iteration, under the active set and sites of its
        run (non-decreasing within a run; it may jump at a re-selection); [objective_] when
        no iteration ran.
    n_iter_ : int
        Hyperparameter iterations (0 when the hyperparameters are fixed).
    n_selections_ : int
        Selections of the active set run (one per restart, and the first).
    restart_ : None
        No second search is run (the estimators' common attribute).
    log_prior_ : float
        The log prior density of the fitted kernel hyperparameters (of each latent function's
        kernel, summed; see :mod:`pygpfast.priors`): the priors' share of ``objective_``.
    X_active_ : ndarray [d, D] or list of C such arrays
        The active training inputs.
    """

    _FITTED = "objective_"
    _OBJECTIVE = "objective"
    _parameter_constraints = {
        **{k: v for k, v in COMMON.items() if k != "jitter"},
        "active_size": (Interval(int, 1, None),),
        "multi_class": (Options("joint", "ovr"),),
        "label_noise": (Interval(float, 0.0, 0.5, closed="left"),),
        "shared_kernel": (BOOL,),
        "max_iter": (Interval(int, 1, None),),
        "reselect_every": (Interval(int, 1, None),),
        "cubature": (Options("auto", "gauss-hermite", "stroud"),),
        "n_random": (Interval(int, 1, None),),
        "keep_fraction": (Interval(float, 0.0, 1.0),),
    }

    def __init__(self, kernel=None, *, active_size=100, multi_class="joint", label_noise=0.0,
                 shared_kernel=True, optimize_hyperparameters=True, priors="default", max_iter=30, reselect_every=10,
                 tol=1e-6, cubature="auto", n_random=2, keep_fraction=0.5, random_state=None,
                 verbose=0, callback=None):
        self.kernel = kernel
        self.active_size = active_size
        self.multi_class = multi_class
        self.label_noise = label_noise
        self.shared_kernel = shared_kernel
        self.optimize_hyperparameters = optimize_hyperparameters
        self.priors = priors
        self.max_iter = max_iter
        self.reselect_every = reselect_every
        self.tol = tol
        self.cubature = cubature
        self.n_random = n_random
        self.keep_fraction = keep_fraction
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    # ------------------------------------------------------------------ fit
    def fit(self, X, y):
        """Select the active set and (optionally) learn the hyperparameters.

        Parameters
        ----------
        X : array_like [N, D]
        y : array_like [N]
            Class labels (any hashable labels, at least two classes).

        Returns
        -------
        self
        """
        self._check_params()
        self._forget()
        X, y = validate_input(self, X, y, dtype=np.float64, order="C")
        check_classification_targets(y)
        self.classes_, t = np.unique(y, return_inverse=True)
        t = t.reshape(-1)
        C = len(self.classes_)
        if C < 2:
            raise ValueError(f"y has {C} class; a classifier needs at least 2")
        if self.label_noise and C > 2 and self.multi_class == "joint":
            raise ValueError(f"label_noise={self.label_noise!r} needs two classes or "
                             f"multi_class='ovr' (probit IVMs); the joint model's softmax takes "
                             f"none: y has {C} classes")
        rs = check_random_state(self.random_state)
        kernel = _start.start_kernel(self.kernel, X, rs)
        self._with_default_priors(kernel, X)
        seed = int(rs.randint(np.iinfo(np.int32).max))
        model = _Model(self, X, t, C, kernel, seed)
        try:
            self._search(model)
        except BaseException:
            self._forget()
            raise
        return self

    def _search(self, model):
        x = model.start()
        self._start_reporting()
        sites = model.select(x)
        # (with the gradient when a run of L-BFGS-B starts there: its first evaluation)
        value, grad = model.bound(x, sites, with_grad=self.optimize_hyperparameters)
        selections, iteration, stopped = 1, 0, False
        if self.optimize_hyperparameters:
            N = model.N
            box = model.bounds(x)
            best = (value, x, sites)  # (the lowest bound after a selection, where it was)
            while iteration < self.max_iter and not stopped:
                current = sites
                wall = {"x": x, "value": value / N}
                first = (x, value, grad)

                def objective(z, current=current, wall=wall, first=first):
                    if first[2] is not None and np.array_equal(z, first[0]):
                        return first[1] / N, first[2] / N
                    try:
                        F, grad = model.bound(z, current, with_grad=True)
                    except (ValueError, np.linalg.LinAlgError):
                        F, grad = np.nan, None
                    if not (np.isfinite(F) and grad is not None and np.isfinite(grad).all()):
                        # (a trial step into overflow: a quadratic wall above the iterate
                        # makes the line search shorten it; never accepted)
                        step = z - wall["x"]
                        return wall["value"] + 1.0 + step @ step, 2.0 * step
                    return F / N, grad / N

                start_iteration = iteration

                def on_iteration(it, z, F, current=current, wall=wall, start=start_iteration):
                    wall["x"], wall["value"] = z.copy(), F
                    return self._report(start + it, -F * N, f"selection {selections}",
                                        before_callback=lambda: self._set_fitted(model, z,
                                                                                 current))

                res = lbfgs(objective, x, bounds=box,
                            max_iter=min(self.reselect_every, self.max_iter - iteration),
                            ftol=self.tol, gtol=1e-8, on_iteration=on_iteration)
                iteration += res.n_iter
                stopped = res.stopped
                x = res.x
                if res.n_iter == 0 and not stopped:
                    break
                try:
                    sites = model.select(x)
                except (ValueError, np.linalg.LinAlgError) as exc:
                    # (far from the start, e.g. at kernel variances where the cubature's
                    # tilted moments overflow; the search keeps its best selection)
                    warn_at_caller(f"the re-selection after hyperparameter iteration "
                                   f"{iteration} failed ({exc}); the fit keeps the best "
                                   "selection before it", ConvergenceWarning)
                    break
                selections += 1
                previous = value
                value, grad = model.bound(x, sites, with_grad=iteration < self.max_iter
                                          and not stopped)
                if value < best[0] or stopped:  # (a callback's stop keeps its iterate)
                    best = (value, x, sites)
                if res.converged and abs(value - previous) <= self.tol * max(1.0, abs(value)):
                    break
            value, x, sites = best
        self.n_iter_ = iteration
        self.n_selections_ = selections
        self._set_fitted(model, x, sites)
        self.objective_ = -float(value)
        if iteration == 0:
            self._history = [self.objective_]
        self._end_reporting()
        self.restart_ = None

    def _set_fitted(self, model, x, sites):
        """The fitted attributes at hyperparameters x with the sites `sites`."""
        kernels, intercepts = model.unpack(x)
        self.kernel_ = copy.deepcopy(kernels[0] if model.n_kernels == 1 else kernels)
        self.intercept_ = intercepts.copy()
        self.log_prior_ = model.log_prior(x)[0]
        self._sites = model.prediction_state(kernels, intercepts, sites)
        if model.joint:
            self.active_set_ = sites["active"].copy()
            self.X_active_ = model.X[self.active_set_]
        else:
            actives = [s["active"].astype(np.intp) for s in sites]
            self.active_set_ = actives[0] if model.L == 1 else actives
            X_active = [model.X[a] for a in actives]
            self.X_active_ = X_active[0] if model.L == 1 else X_active
        self._mode = "joint" if model.joint else ("binary" if model.L == 1 else "ovr")
        self._rule = model.rule
        self._label_noise = model.label_noise

    # ------------------------------------------------------------------ prediction
    def _checked(self, X):
        check_is_fitted(self)
        return validate_input(self, X, dtype=np.float64, order="C", reset=False)

    def _kernel_list(self):
        if isinstance(self.kernel_, list):
            return self.kernel_
        L = 1 if self._mode == "binary" else len(self.classes_)
        return [self.kernel_] * L

    def predict_latent(self, X):
        """Means and variances of the latent functions (intercepts included) at X [T, D]:
        [T] each for one latent function, [T, C] for C."""
        X = self._checked(X)
        mean, var, _ = self._latent(X, with_prob=False)
        return (mean[:, 0], var[:, 0]) if mean.shape[1] == 1 else (mean, var)

    def _latent(self, X, with_prob):
        """mean, var [T, L] (intercepts included) and, for the joint model with `with_prob`,
        the class probabilities [T, C]."""
        kernels = self._kernel_list()
        if self._mode == "joint":
            codes, params = _joint_spec(self.kernel_, X.shape[1])
            X_active = np.ascontiguousarray(self.X_active_)
            out = _core.ivm.multiclass_predict(
                codes, params, X_active, self._sites["pi"], self._sites["b"], X,
                beta=np.ascontiguousarray(self.intercept_), rule=self._rule, with_cov=True,
                with_prob=with_prob)
            var = np.ascontiguousarray(np.diagonal(out["cov"], axis1=1, axis2=2))
            return out["mean"] + self.intercept_, var, out["prob"]
        X_active = self.X_active_ if isinstance(self.X_active_, list) else [self.X_active_]
        means, variances = [], []
        for kernel, XA, state, bias in zip(kernels, X_active, self._sites, self.intercept_):
            codes, params = kernel._spec(X.shape[1])
            out = _core.ivm.binary_predict(codes, params, np.ascontiguousarray(XA),
                                           site_pi=state["site_pi"], L=state["L"],
                                           beta=state["beta"], Xnew=X, bias=float(bias))
            means.append(out["mean"] + bias)
            variances.append(np.maximum(out["var"], 0.0))
        return np.column_stack(means), np.column_stack(variances), None

    def predict_log_proba(self, X):
        """log P(y = class | X) [T, C] (columns in the order of ``classes_``)."""
        X = self._checked(X)
        return self._log_proba(X)

    def predict_proba(self, X):
        """Class probabilities [T, C] (columns in the order of ``classes_``)."""
        return np.exp(self.predict_log_proba(X))

    def _log_proba(self, X):
        mean, var, prob = self._latent(X, with_prob=self._mode == "joint")
        if self._mode == "joint":
            prob = np.clip(prob, np.finfo(np.float64).tiny, None)
            return np.log(prob / prob.sum(axis=1, keepdims=True))
        # probit: log Phi(+-(mean) / sqrt(1 + var)), with label noise eps + (1 - 2 eps) Phi
        z = mean / np.sqrt(1.0 + var)
        log_pos, log_neg = scipy.special.log_ndtr(z), scipy.special.log_ndtr(-z)
        eps = getattr(self, "_label_noise", 0.0)
        if eps:
            log_pos, log_neg = (np.logaddexp(np.log(eps), np.log1p(-2.0 * eps) + lp)
                                for lp in (log_pos, log_neg))
        if self._mode == "binary":
            return np.column_stack([log_neg[:, 0], log_pos[:, 0]])
        # one-vs-rest: P(c) proportional to each expert's P(y = c)
        return log_pos - scipy.special.logsumexp(log_pos, axis=1, keepdims=True)



def _joint_spec(kernel, input_dim):
    """(codes, params [P] or [C, P]) of the joint model's kernel (or list of kernels)."""
    if not isinstance(kernel, list):
        return kernel._spec(input_dim)
    specs = [k._spec(input_dim) for k in kernel]
    return specs[0][0], np.ascontiguousarray(np.stack([s[1] for s in specs]))


class _Model:
    """One fit's latent model: the hyperparameters as one vector x = [log kernel parameters
    (one block per kernel), intercepts (one per latent function)], the selection and the
    section-4 bound with its gradient in x."""

    def __init__(self, est, X, t, C, kernel, seed):
        self.X, self.t, self.C, self.seed = X, t, C, seed
        self.N = X.shape[0]
        self.d = min(int(est.active_size), self.N)
        self.joint = C > 2 and est.multi_class == "joint"
        self.L = 1 if C == 2 else C
        self.n_kernels = 1 if (est.shared_kernel or self.L == 1) else self.L
        self.kernel = kernel
        self.P = kernel.n_params
        self.n_random = int(est.n_random)
        self.keep_fraction = float(est.keep_fraction)
        self.label_noise = float(est.label_noise)
        rule = est.cubature
        if rule == "auto":
            rule = "gauss-hermite" if C <= _AUTO_GH_MAX_CLASSES else "stroud"
        self.rule = _RULES[rule]
        self.n_hyper = self.n_kernels * self.P + self.L
        #: whether a stationary leaf of the kernel has one lengthscale (and reads squared distances)
        self.reads_distances = any(np.size(leaf.lengthscale) == 1
                                   for leaf, _ in _start.stationary_leaves(kernel))
        self.has_prior = kernel.has_priors
        if self.joint:
            self.y = t.astype(np.float64)
        else:  # +-1 labels of each probit latent function
            positive = [t == 1] if self.L == 1 else [t == c for c in range(C)]
            self.ypm = [np.where(p, 1.0, -1.0) for p in positive]

    def start(self):
        """The start x: the kernel's log parameters (each kernel's block the same) and the
        intercepts at the class frequencies."""
        freq = np.bincount(self.t, minlength=self.C) / self.N
        if self.joint:
            beta = np.log(np.clip(freq, 1e-3, None))
            beta -= beta.mean()
        else:
            share = np.array([np.mean(y > 0) for y in self.ypm])
            beta = np.clip(scipy.special.ndtri(share), -_PROBIT_START_CLIP, _PROBIT_START_CLIP)
        return np.concatenate([np.tile(self.kernel.theta, self.n_kernels), beta])

    def bounds(self, x):
        P = self.n_kernels * self.P
        lo, hi = _kernels.hyper_bounds(x[:P])
        box = np.column_stack([lo, hi])
        return np.vstack([box, np.tile([-_INTERCEPT_BOUND, _INTERCEPT_BOUND], (self.L, 1))])

    def unpack(self, x):
        """(kernels: list of n_kernels Kernel, intercepts [L])."""
        kernels = []
        for k in range(self.n_kernels):
            kernel = copy.deepcopy(self.kernel)
            kernel.theta = x[k * self.P:(k + 1) * self.P]
            kernels.append(kernel)
        return kernels, np.array(x[self.n_kernels * self.P:], dtype=np.float64)

    def _spec(self, kernels):
        D = self.X.shape[1]
        specs = [k._spec(D) for k in kernels]
        return specs[0][0], [s[1] for s in specs]

    def select(self, x):
        """The active set(s) and sites selected at x."""
        kernels, beta = self.unpack(x)
        codes, params = self._spec(kernels)
        if self.joint:
            P = params[0] if self.n_kernels == 1 else np.ascontiguousarray(np.stack(params))
            s = _core.ivm.multiclass_select(
                codes, P, self.X, self.y, num_classes=self.C, active_size=self.d,
                n_random=min(self.n_random, self.d), seed=self.seed, rule=self.rule,
                keep_fraction=self.keep_fraction, beta=np.ascontiguousarray(beta))
            return {"active": np.ascontiguousarray(s["active"], dtype=np.int64),
                    "pi": s["pi"], "b": s["b"]}
        sites = []
        for l in range(self.L):
            s = _core.ivm.binary_select(
                codes, params[l % self.n_kernels], self.X, self.ypm[l], active_size=self.d,
                n_random=min(self.n_random, self.d), seed=self.seed + l, bias=float(beta[l]),
                label_noise=self.label_noise)
            sites.append({"active": np.ascontiguousarray(s["active"], dtype=np.int64),
                          "site_b": s["site_b"], "site_pi": s["site_pi"]})
        return sites

    def log_prior(self, x):
        """(log prior density of the kernels' hyperparameters at x, its gradient [n_hyper]):
        each kernel block's, summed (the intercepts are flat)."""
        grad = np.zeros(self.n_hyper)
        value = 0.0
        for k in range(self.n_kernels):
            block = slice(k * self.P, (k + 1) * self.P)
            value += float(self.kernel.log_prior(x[block]))
            grad[block] = self.kernel.grad_log_prior(x[block])
        return value, grad

    def bound(self, x, sites, *, with_grad):
        """(F, dF/dx or None): the section-4 bound at x with `sites` fixed, minus the log prior
        of the hyperparameters when the kernel has priors (what the search minimises)."""
        F, grad = self._bound(x, sites, with_grad=with_grad)
        if self.has_prior:
            lp, d_lp = self.log_prior(x)
            F -= lp
            if grad is not None:
                grad -= d_lp
        return F, grad

    def _cache_distances(self, sites):
        """The squared distances of a selection's active rows and X, which the isotropic leaves
        read, into sites["distances"]: computed once per selection, where each bound evaluation
        ran the d x n x D GEMM."""
        if self.reads_distances and "distances" not in sites:
            sites["distances"] = _core.kernels.squared_distances(
                np.ascontiguousarray(self.X[np.asarray(sites["active"], dtype=np.intp)]), self.X)

    def _bound(self, x, sites, *, with_grad):
        kernels, beta = self.unpack(x)
        codes, params = self._spec(kernels)
        grad = np.zeros_like(x) if with_grad else None
        KP = self.n_kernels * self.P
        if self.joint:
            P = params[0] if self.n_kernels == 1 else np.ascontiguousarray(np.stack(params))
            self._cache_distances(sites)
            r = _core.ivm.multiclass_bound(codes, P, self.X, self.y, sites["active"],
                                           sites["pi"], sites["b"],
                                           beta=np.ascontiguousarray(beta), rule=self.rule,
                                           with_grad=with_grad, distances=sites.get("distances"))
            if with_grad:
                grad[:KP] = (np.asarray(r["d_params"]) * P).ravel()
                grad[KP:] = r["d_beta"]
            return float(r["value"]), grad
        value = 0.0
        for l in range(self.L):
            k = l % self.n_kernels
            s = sites[l]
            self._cache_distances(s)
            r = _core.ivm.binary_bound(codes, params[k], self.X, self.ypm[l], active=s["active"],
                                       site_b=s["site_b"], site_pi=s["site_pi"],
                                       bias=float(beta[l]), label_noise=self.label_noise,
                                       with_grad=with_grad, distances=s.get("distances"))
            value += float(r["value"])
            if with_grad:
                grad[k * self.P:(k + 1) * self.P] += r["grad_params"] * params[k]
                grad[KP + l] = r["grad_bias"]
        return value, grad

    def prediction_state(self, kernels, beta, sites):
        """What prediction needs besides the kernels and intercepts: the joint model's sites,
        or per probit IVM the factor L of B = I + Pi^1/2 K_I Pi^1/2 and L^-1 Pi^-1/2 b at
        these kernels."""
        if self.joint:
            return {"pi": np.ascontiguousarray(sites["pi"]), "b": np.ascontiguousarray(sites["b"])}
        with _threads.one_blas_thread():  # (d x d work: threads only wait for each other)
            return [self._probit_state(kernels[l % self.n_kernels], s)
                    for l, s in enumerate(sites)]

    def _probit_state(self, kernel, s):
        root = np.sqrt(s["site_pi"])
        B = root[:, None] * kernel(self.X[s["active"]]) * root[None, :]
        B[np.diag_indices_from(B)] += 1.0
        Lf = scipy.linalg.cholesky(B, lower=True)  # (scipy's BLAS: the one the scope limits)
        beta = scipy.linalg.solve_triangular(Lf, s["site_b"] / root, lower=True)
        return {"site_pi": np.ascontiguousarray(s["site_pi"]), "L": np.ascontiguousarray(Lf),
                "beta": np.ascontiguousarray(beta)}
