"""Covariance functions (kernels).

A kernel object is declarative: it holds its positive hyperparameters (floats, or 1-D arrays
for per-dimension values) and every evaluation hands a flat description of the kernel to the
compiled core. Kernels combine with ``+`` and ``*``::

    k = RBF(lengthscale=[1.0, 2.0]) * Linear() + White(1e-2)

Notation (GPflow's glossary): X [N, D], X2 [M, D], K(X, X2) [N, M].

Hyperparameters are positive. :attr:`Kernel.params` lists them flat, in the order of
:attr:`Kernel.param_names`; :attr:`Kernel.theta` is their logarithm, the unconstrained
parameterisation that optimisers use (the positivity transform is ``exp``), with box
constraints :attr:`Kernel.bounds`.
"""

import copy
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from . import _core
from ._validation import as_matrix, as_vector, check_same_dim

__all__ = [
    "PARAM_BOUNDS",
    "Constant",
    "Kernel",
    "Linear",
    "Matern12",
    "Matern32",
    "Matern52",
    "Product",
    "RBF",
    "Sum",
    "White",
]

#: Lower and upper bound of every hyperparameter, used by :attr:`Kernel.bounds`.
PARAM_BOUNDS = (1e-5, 1e5)


def hyper_bounds(theta0):
    """Box constraints (lower [n], upper [n]) for a search over log hyperparameters that start
    at ``theta0`` [n]: log PARAM_BOUNDS, widened to log PARAM_BOUNDS + theta0 where that reaches
    further, so a starting value outside PARAM_BOUNDS (the median-distance lengthscale of
    features on a scale of 1e6, a user's White(1e-8)) is kept, with the same range of 1e5
    either way. Used by every estimator's hyperparameter search."""
    theta0 = np.asarray(theta0, dtype=np.float64)
    lo, hi = np.log(PARAM_BOUNDS)
    return np.minimum(lo, theta0 + lo), np.maximum(hi, theta0 + hi)


def _query_rows(n, max_rows):
    """At most `max_rows` evenly spaced row indices of n rows."""
    return np.unique(np.linspace(0, n - 1, min(n, max_rows)).astype(np.intp))


def prior_spread(kernel, X, max_rows=300):
    """How much a draw f from the prior N(0, K) varies across the rows of X [N, D]: the mean
    variance of f(x_i) about its average over the rows, mean_i K_ii - mean_ij K_ij (>= 0), on
    at most `max_rows` evenly spaced rows (a float)."""
    K = kernel(np.asarray(X[_query_rows(X.shape[0], max_rows)], dtype=np.float64))
    return max(0.0, float(np.mean(np.diag(K)) - np.mean(K)))


#: A kernel is numerically diagonal on a set of inputs when a typical input's (the median
#: input's) largest correlation with the others is below this. Measured: healthy fits (the test
#: suite's, the default kernel's, standardised data) 0.4 and above, typically above 0.98; a
#: lengthscale 1e-2 on standard normal inputs (N = 300, D = 2) 5e-5 in K(X, X), 1e-240 in
#: K(X, Z) of 20 k-means inducing inputs.
ISOLATED_CORRELATION = 1e-3
#: A kernel is numerically constant on a set of inputs when a draw from it varies across them by
#: less than this share of its variance (1 - the mean correlation): a lengthscale beyond ~70
#: times the inputs' spread. Measured: healthy fits 5e-3 and above; a lengthscale 1e4 on
#: standard normal inputs 2e-8.
FLAT_SHARE = 1e-4
#: The latent function is numerically constant when a draw from the prior (without its
#: Constant and White terms) varies across the training inputs by a variance below this share
#: of the latent scale (the estimators' scale: 1, or the targets' mean square for unnormalised
#: Gaussian regression): a standard deviation of 0.1, which moves a logistic probability by
#: 0.025. Measured: the searches from far starts that collapse end at 1e-5 and below; labels
#: without signal, fitted from the default kernel, 1e-4 to 1e-3 (and a lengthscale 2e-4 in one
#: of two dimensions, as good as any other there); healthy fits 0.19 and above.
FLAT_SPREAD = 1e-2
#: A search stalls on a prior that varies across the training inputs by a variance below this
#: share of the latent scale: the bound is as flat in the log hyperparameters (its gradients
#: are of the order of the spread), and L-BFGS-B's tolerances stop at once (a kernel variance of
#: 1e-8; a Linear kernel on features in units of 1e-3). The "stalled" check of :func:`diagnose`.
STALLED_SPREAD = 1e-4
#: Fewest inputs for which a diagonal kernel is a memoriser (a handful of points may well be
#: far apart on the kernel's scale).
_HANDFUL = 5


def _leaves(kernel):
    """The leaf kernels in the tree of `kernel`, in order."""
    if isinstance(kernel, _Combination):
        return [leaf for k in kernel.kernels for leaf in _leaves(k)]
    return [kernel]


def _varying_part(kernel):
    """The part of `kernel` that correlates distinct inputs by their distance: a sum without its
    Constant and White terms (which shift every covariance or only the diagonal), or None when
    nothing is left (a kernel that is only those)."""
    terms = kernel.kernels if isinstance(kernel, Sum) else [kernel]
    kept = [k for k in terms if not isinstance(k, (Constant, White))]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else Sum(kept)


def nearest_correlation(kernel, X, Z=None, max_rows=1000, block=64):
    """The median, over at most `max_rows` evenly spaced rows x of X [N, D], of x's largest
    correlation k(x, x') / sqrt(k(x, x) k(x', x')) with the rows x' of Z [M, D] (Z None: with
    the other rows of X). Near 0: K(X, X) (or K(X, Z)) is numerically diagonal (zero) for a
    typical input."""
    idx = _query_rows(X.shape[0], max_rows)
    other = X if Z is None else Z
    scale = 1.0 / np.sqrt(np.maximum(kernel.diag(other), np.finfo(float).tiny))
    best = np.empty(idx.size)
    for start in range(0, idx.size, block):
        rows = idx[start:start + block]
        C = kernel(X[rows], other)
        C *= scale
        C *= 1.0 / np.sqrt(np.maximum(kernel.diag(X[rows]), np.finfo(float).tiny))[:, None]
        if Z is None:
            C[np.arange(rows.size), rows] = -np.inf
        best[start:start + rows.size] = C.max(axis=1)
    return float(np.median(best))


def flat_share(kernel, X, max_rows=300):
    """The share of its variance by which a draw from `kernel` varies across the rows of X:
    :func:`prior_spread` over the mean diagonal (1 - the mean correlation, for a stationary
    kernel), in [0, 1]."""
    idx = _query_rows(X.shape[0], max_rows)
    mean_diag = float(np.mean(kernel.diag(X[idx])))
    return prior_spread(kernel, X, max_rows) / mean_diag if mean_diag > 0 else 1.0


def _lengthscales(kernel):
    """The lengthscales of the stationary leaves of `kernel`, flat (empty when it has none)."""
    parts = [np.atleast_1d(k.lengthscale) for k in _leaves(kernel) if isinstance(k, _Stationary)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _typical_distance(X, max_rows=300):
    """The median Euclidean distance between (at most `max_rows` evenly spaced) rows of X."""
    sub = X[_query_rows(X.shape[0], max_rows)]
    sq = np.sum(sub * sub, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * sub @ sub.T
    upper = d2[np.triu_indices(len(sub), 1)]
    return float(np.sqrt(max(np.median(upper), 0.0))) if upper.size else 0.0


def _range_text(values):
    lo, hi = float(np.min(values)), float(np.max(values))
    return f"{lo:.2g}" if hi <= 1.01 * lo else f"{lo:.2g} to {hi:.2g}"


class Degeneracy:
    """What makes a fitted GP useless, from :func:`diagnose`.

    Attributes
    ----------
    kind : {"isolated", "unreached", "constant", "stalled", "flat"}
        "isolated": K(X, X) is numerically diagonal (a memoriser: the prior away from the
        training inputs); "unreached": K(X, Z) is numerically zero (q(f) at the training inputs
        is the prior); "constant": the latent function is numerically constant because the
        search started from lengthscales far above the inputs' spread; "stalled": the search
        stopped at (or moving away from) a start on which the prior barely varies; "flat": the
        user fixed such a prior. After any of the first four the estimators search again from
        the data's scale where they can (learned hyperparameters, a full-batch search, a kernel
        with lengthscales: their ``restart_``).
    message : str
    """

    def __init__(self, kind, message):
        self.kind, self.message = kind, message

    def warn(self, stacklevel, suffix=""):
        message = self.message[:-1] + suffix + "." if self.message.endswith(".") else (
            self.message + suffix)
        warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel + 1)

    def __repr__(self):
        return f"Degeneracy({self.kind!r}, {self.message!r})"


def diagnose(kernel, X, *, start, scale, who, searched, fixed=False, Z=None):
    """A :class:`Degeneracy` when the fitted `kernel` makes the model useless on the training
    inputs X [N, D] (float64), else None.

    Parameters
    ----------
    kernel : Kernel
        The fitted kernel.
    X : ndarray [N, D]
        The training inputs (or an evenly spaced subsample of them).
    start : Kernel
        Where the hyperparameter search started (`kernel` itself when there was none).
    scale : float
        The latent functions' scale (the default kernel's variance).
    who : str
        The estimator's name, for the message.
    searched : bool
        Whether the hyperparameters were searched (the "stalled" check needs a search).
    fixed : bool
        Whether the user fixed the kernel (optimize_hyperparameters=False): the "flat" check.
    Z : ndarray [M, D], optional
        Inducing inputs (sparse models).

    The checks, on the kernel without its Constant and White terms, first match wins:

    * "unreached" (with Z): the median training input's largest correlation with an inducing
      input is below :data:`ISOLATED_CORRELATION`;
    * "isolated": the median training input's largest correlation with another (and, with more
      than a handful of inducing inputs, the median inducing input's with another) is below it,
      on more than a handful of training inputs.

      Either is not reported when the search moved there from a start that was neither and the
      latent function is constant (:func:`latent_is_constant`): labels without signal;
    * "constant": the latent function is constant and the search's start was numerically
      constant on the training inputs (a share of its variance below :data:`FLAT_SHARE`); a
      constant reached from a start that varies is the data's verdict, not a degeneracy;
    * "stalled" (searched only): the prior varies by less than :data:`STALLED_SPREAD`, 1e-4, of
      the latent scale and the search ended at its start (no log hyperparameter moved by 0.1)
      or stopped while moving towards more variation. Such a start is flat in the log
      hyperparameters (the gradient is of the order of the spread: a variance of 1e-8, a Linear
      kernel on features in units of 1e-3): L-BFGS-B's tolerances stop at once, and Adam's
      fixed-size steps creep (from Linear(variance=1) on such features: variance 3.8 after 30
      epochs, R^2 0.02);
    * "flat" (fixed only): the same prior, fixed by the user: the model is its prior mean.
    """
    varying = _varying_part(kernel)
    if varying is None or X.shape[0] <= _HANDFUL:
        message = _stalled_message(kernel, start, X, scale, who) if searched else None
        return None if message is None else Degeneracy("stalled", message)
    start_varying = _varying_part(start)
    ls, ls0 = _lengthscales(kernel), _lengthscales(start)
    moved = searched and not (ls.size == ls0.size and np.allclose(ls, ls0, rtol=0.1))
    what = (f"the kernel's lengthscales ({_range_text(ls)}"
            + (f", from {_range_text(ls0)} at the start of the search)" if moved else ")")
            if ls.size else f"the kernel {kernel!r}")
    cure = ("Standardise X, or start the lengthscales nearer the data's scale (the default "
            "kernel, kernel=None, starts them there)" if ls.size else
            "Standardise X, or use a kernel that varies on the scale of the training inputs")
    xz = nearest_correlation(varying, X, Z) if Z is not None else 1.0
    unreached = xz < ISOLATED_CORRELATION
    isolated = False
    if not unreached:
        xx = nearest_correlation(varying, X)
        # (with Z, a memoriser needs inducing inputs at the training inputs, apart from one
        # another: K(Z, Z) diagonal too; a handful of them cannot memorise)
        zz = (0.0 if Z is None else
              nearest_correlation(varying, Z) if Z.shape[0] > _HANDFUL else 1.0)
        isolated = xx < ISOLATED_CORRELATION and zz < ISOLATED_CORRELATION
    started_there = (unreached or isolated) and start_varying is not None and (
        nearest_correlation(start_varying, X, Z if unreached else None) < ISOLATED_CORRELATION)
    if ((unreached or isolated) and searched and not started_there
            and latent_is_constant(kernel, X, scale)):
        unreached = isolated = False  # (a search that moved to a constant: labels without signal)
    if unreached or isolated:
        far = (f"{what} {'are' if ls.size else 'is'} far below the distances between the "
               f"training inputs (median {_typical_distance(X):.2g})")
        if isolated:
            effect = (f"K(X, X) is numerically diagonal (a typical training input's largest "
                      f"correlation with another is {xx:.1g}), so the model memorises the "
                      f"training points and predicts the prior away from them")
        else:
            effect = (f"K(X, Z) is numerically zero (a typical training input's largest "
                      f"correlation with an inducing input is {xz:.1g}), so q(f) at the "
                      f"training inputs is the prior, and the model predicts the prior "
                      f"everywhere{_collapse(kernel)}")
        if searched and not started_there:
            cure = ("The search moved there from a start that correlates the inputs: it lost "
                    "its way (a start with other lengthscales may reach a higher bound), or the "
                    "bound favours independent values at the training points (targets noisier "
                    "than the likelihood allows, such as overdispersed counts); try other "
                    "starting lengthscales, or fix them (optimize_hyperparameters=False)")
        return Degeneracy("isolated" if isolated else "unreached",
                          f"{who}: {far}: {effect}. {cure}.")
    spread = prior_spread(varying, X)
    share = (flat_share(start_varying, X)
             if spread < FLAT_SPREAD * scale and start_varying is not None else 1.0)
    distance = _typical_distance(X) if share < FLAT_SHARE else 0.0
    if share < FLAT_SHARE and distance > 0:  # (not identical rows, on which any kernel is flat)
        if not ls0.size:
            far = f"the kernel {start!r} is numerically constant over the training inputs"
        elif searched:
            far = (f"the search started from lengthscales ({_range_text(ls0)}) far above the "
                   f"distances between the training inputs (median {distance:.2g})")
        else:
            far = (f"the kernel's lengthscales ({_range_text(ls)}) are far above the distances "
                   f"between the training inputs (median {distance:.2g})")
        return Degeneracy("constant", (
            f"{who}: {far}: K(X, X) {'started' if searched else 'is'} numerically constant (a "
            f"draw from the prior varies across the training inputs by {share:.1g} of its "
            f"variance), and the latent function {'ended' if searched else 'is'} constant (a "
            f"variance of {spread:.2g} across them at {kernel!r}, latent scale {scale:.3g}): "
            f"the model predicts the same everywhere. {cure}."))
    if searched:
        message = _stalled_message(kernel, start, X, scale, who)
        return None if message is None else Degeneracy("stalled", message)
    if fixed and spread < STALLED_SPREAD * scale and _typical_distance(X) > 0:
        return Degeneracy("flat", (
            f"{who}: the kernel is fixed (optimize_hyperparameters=False) at {kernel!r}, where "
            f"a draw from the prior varies across the training inputs by a variance of only "
            f"{spread:.3g} (latent scale {scale:.3g}): the latent function is numerically its "
            f"prior mean, and the model predicts the same everywhere. Give the kernel a "
            f"variance of the order of {scale:.3g}, or learn it (optimize_hyperparameters=True)"))
    return None


def latent_is_constant(kernel, X, scale):
    """Whether a draw from `kernel` (without its Constant and White terms) varies across the
    rows of X by less than :data:`FLAT_SPREAD` of the latent scale `scale`."""
    varying = _varying_part(kernel)
    return varying is None or prior_spread(varying, X) < FLAT_SPREAD * scale


def _collapse(kernel):
    """', where the search shrank the kernel variance to its lower bound' when it did."""
    variances = [k.variance for k in _leaves(kernel) if isinstance(k, _Stationary)]
    if variances and max(variances) <= 1.01 * PARAM_BOUNDS[0]:
        return f" (the search shrank the kernel variance to its lower bound, {PARAM_BOUNDS[0]:g})"
    return ""


def _stalled_message(kernel, start, X, scale, who):
    """The "stalled" check of :func:`diagnose` (a message, or None)."""
    spread = prior_spread(kernel, X)
    if spread >= STALLED_SPREAD * scale:
        return None
    if np.max(np.abs(kernel.theta - start.theta), initial=0.0) < 0.1:
        where = "ended at its start"
    else:
        if spread <= prior_spread(start, X):
            return None
        where = "stopped while still moving away from its start"
    return (
        f"{who}: the hyperparameter search {where}, at {kernel!r}, where a draw from the prior "
        f"varies across the training inputs by a variance of only {spread:.3g} (latent scale "
        f"{scale:.3g}): the bound is flat there, and the search cannot see the way to its "
        f"optimum. Start the kernel nearer the data's scale (a variance of the order of "
        f"{scale:.3g}, length scales of the order of the distances between inputs) or "
        "standardise X")


# Node type codes of the core (csrc/include/pygpfast/kernels.hpp, enum KernelType).
_RBF, _MATERN12, _MATERN32, _MATERN52, _LINEAR, _CONSTANT, _WHITE, _SUM, _PRODUCT = range(9)


def _check_positive(values, name):
    """Raise ValueError unless every entry of `values` (an ndarray) is finite and > 0."""
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {values}")


def _as_hyperparameter(value, name, per_dimension):
    """A positive float, or (when `per_dimension`) a non-empty 1-D float64 array copy."""
    try:
        if np.asarray(value).dtype == bool:  # True would be taken for 1.0
            raise TypeError("a bool is not a number here")
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a positive number, got {value!r}") from e
    if arr.ndim == 0:
        _check_positive(arr, name)
        return float(arr)
    if not per_dimension:
        raise ValueError(f"{name} must be a positive scalar, got shape {arr.shape}")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a scalar or a non-empty 1-D array, got shape {arr.shape}")
    _check_positive(arr, name)
    return arr.copy()


class _Hyperparameter:
    """A validated positive hyperparameter attribute, stored on the instance as ``_<name>``.

    With ``per_dimension`` it may also be a 1-D array with one value per input dimension.
    """

    def __init__(self, per_dimension=False):
        self.per_dimension = per_dimension

    def __set_name__(self, owner, name):
        self.name = name
        self.storage = "_" + name

    def __get__(self, obj, objtype=None):
        return self if obj is None else getattr(obj, self.storage)

    def __set__(self, obj, value):
        label = f"{type(obj).__name__}.{self.name}"
        setattr(obj, self.storage, _as_hyperparameter(value, label, self.per_dimension))


class Kernel:
    """Base class of the covariance functions.

    Subclasses describe themselves to the core; this class provides evaluation, gradients,
    the flat parameter vector and the ``+`` / ``*`` algebra.
    """

    # ---- evaluation ----

    def __call__(self, X, X2=None):
        """Covariance matrix K(X, X2).

        Parameters
        ----------
        X : array_like [N, D]
        X2 : array_like [M, D] or None
            None means X2 is X (and then :class:`White` contributes its diagonal).

        Returns
        -------
        K : ndarray [N, M] (M = N when X2 is None)
        """
        X, X2 = self._inputs(X, X2)
        codes, params = self._spec(X.shape[1])
        return _core.kernels.K(codes, params, X, X2)

    def diag(self, X):
        """Diagonal of K(X, X) [N], without forming the matrix."""
        X = as_matrix(X, "X")
        codes, params = self._spec(X.shape[1])
        return _core.kernels.Kdiag(codes, params, X)

    # ---- gradients (vector-Jacobian products of sum(G * K)) ----

    def vjp(self, X, X2, G, *, wrt_X=False, wrt_X2=False):
        """All gradients of ``sum(G * K(X, X2))`` in one pass.

        Parameters
        ----------
        X : array_like [N, D]
        X2 : array_like [M, D] or None
            None means X2 is X.
        G : array_like [N, M]
            The adjoint (the gradient of a scalar objective with respect to K).
        wrt_X, wrt_X2 : bool
            Whether to compute the gradients with respect to X and X2.

        Returns
        -------
        dparams : ndarray [n_params]
            Gradient with respect to :attr:`params`.
        dX : ndarray [N, D] or None
        dX2 : ndarray [M, D] or None
            With X2=None, dX and dX2 are the partial gradients through the first and the
            second argument of K(X, X); the gradient with respect to X is ``dX + dX2``.
        """
        X, X2 = self._inputs(X, X2)
        G = as_matrix(G, "G")
        shape = (X.shape[0], X.shape[0] if X2 is None else X2.shape[0])
        if G.shape != shape:
            raise ValueError(f"G has shape {G.shape} but K(X, X2) has shape {shape}")
        codes, params = self._spec(X.shape[1])
        return _core.kernels.K_vjp(codes, params, X, X2, G, bool(wrt_X), bool(wrt_X2))

    def grad_params(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to :attr:`params` [n_params]."""
        return self.vjp(X, X2, G)[0]

    def grad_theta(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to :attr:`theta` [n_params]."""
        return self.grad_params(X, X2, G) * self.params

    def grad_X(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to X [N, D].

        With X2=None this is the partial gradient through the first argument only; the
        gradient of ``sum(G * K(X, X))`` is ``grad_X(X, None, G) + grad_X2(X, None, G)``.
        """
        return self.vjp(X, X2, G, wrt_X=True)[1]

    def grad_X2(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to X2 [M, D] (see :meth:`grad_X`)."""
        return self.vjp(X, X2, G, wrt_X2=True)[2]

    def grad_diag_params(self, X, g):
        """Gradient of ``sum(g * k.diag(X))`` with respect to :attr:`params`; g is [N]."""
        X = as_matrix(X, "X")
        g = as_vector(g, "g", size=X.shape[0])
        codes, params = self._spec(X.shape[1])
        return _core.kernels.Kdiag_vjp(codes, params, X, g)

    def grad_diag_theta(self, X, g):
        """Gradient of ``sum(g * k.diag(X))`` with respect to :attr:`theta`; g is [N]."""
        return self.grad_diag_params(X, g) * self.params

    # ---- parameters ----

    @property
    def params(self):
        """The positive hyperparameters, flat [n_params] (order: :attr:`param_names`)."""
        return np.concatenate(self._param_arrays())

    @params.setter
    def params(self, values):
        values = as_vector(values, "params", size=self.n_params)
        _check_positive(values, "params")
        self._assign(values)

    @property
    def n_params(self):
        """Number of hyperparameters."""
        return sum(a.size for a in self._param_arrays())

    @property
    def param_names(self):
        """Names of the hyperparameters, e.g. ``"rbf.lengthscale[0]"`` (list of str)."""
        return self._names()

    @property
    def theta(self):
        """log(:attr:`params`) [n_params], the unconstrained parameterisation.

        Setting it sets the parameters to ``exp(theta)``; values that overflow or underflow
        (outside about [-745, 709]) raise ValueError.
        """
        return np.log(self.params)

    @theta.setter
    def theta(self, values):
        values = as_vector(values, "theta", size=self.n_params)
        with np.errstate(over="ignore"):
            params = np.exp(values)
        _check_positive(params, "exp(theta)")
        self._assign(params)

    @property
    def bounds(self):
        """Box constraints on :attr:`theta`, [n_params, 2]: log of :data:`PARAM_BOUNDS`."""
        return np.tile(np.log(PARAM_BOUNDS), (self.n_params, 1))

    # ---- scikit-learn's parameter protocol ----

    def get_params(self, deep=True):
        """The kernel's parameters by name, in scikit-learn's protocol (dict).

        A leaf kernel gives its hyperparameters (``variance``, ``lengthscale``); a sum or
        product gives ``kernels`` and, with ``deep``, each term as ``kernels__<i>`` and that
        term's own as ``kernels__<i>__<name>``. Through them an estimator's ``set_params`` and
        ``GridSearchCV`` reach the kernel: ``set_params(kernel__lengthscale=2.0)``.
        """
        return self._get_params(deep)

    def set_params(self, **params):
        """Set parameters named as by :meth:`get_params` (nested ones with ``__``); returns
        self. ValueError names the valid parameters when one is not."""
        nested = {}
        for key, value in params.items():
            head, _, rest = key.partition("__")
            nested.setdefault(head, {})[rest] = value
        valid = self._get_params(deep=False)
        for head, items in nested.items():
            if head not in valid:
                raise ValueError(f"invalid parameter {head!r} for kernel {self!r}; valid "
                                 f"parameters are {sorted(valid)}")
            self._set_param(head, items)
        return self

    def __sklearn_clone__(self):
        # (scikit-learn's clone rebuilds an object from get_params and checks that the
        # constructor stored each value as given; kernels store validated copies)
        return copy.deepcopy(self)

    # ---- algebra ----

    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum([*_operands(self, Sum), *_operands(other, Sum)])

    def __mul__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Product([*_operands(self, Product), *_operands(other, Product)])

    # ---- the description for the core ----

    def _spec(self, input_dim):
        """Flat description for the core: (codes int32 [*], params float64 [n_params]).

        Raises ValueError when a per-dimension hyperparameter does not have `input_dim`
        entries.
        """
        codes, params = [], []
        self._describe(int(input_dim), codes, params)
        return np.asarray(codes, dtype=np.int32), np.concatenate(params)

    def _inputs(self, X, X2):
        X = as_matrix(X, "X")
        if X2 is not None:
            X2 = as_matrix(X2, "X2")
            check_same_dim(X, X2)
        return X, X2

    # Subclasses implement:
    #   _param_arrays() -> list of 1-D float64 arrays, the parameters in core order
    #   _assign(values) -> set the parameters from a validated flat array of that layout
    #   _names()        -> list of parameter names
    #   _describe(input_dim, codes, params) -> append the core description


def _combinations(kernel):
    """The sums and products in the tree of `kernel`, itself included when it is one."""
    found, stack = [], [kernel]
    while stack:
        k = stack.pop()
        if isinstance(k, _Combination):
            found.append(k)
            stack.extend(k.kernels)
    return found


def _operands(kernel, cls):
    """The terms of `kernel` when it is a `cls` (so that sums and products stay flat)."""
    return kernel.kernels if type(kernel) is cls else [kernel]


class _Leaf(Kernel):
    """A kernel with its own hyperparameters, listed in `_fields` in the core's order."""

    _code = None  # core type code
    _label = None  # prefix of parameter names
    _fields = ()

    def _param_arrays(self):
        return [np.atleast_1d(np.asarray(getattr(self, f), dtype=np.float64)) for f in self._fields]

    def _assign(self, values):
        start = 0
        for field, current in zip(self._fields, self._param_arrays()):
            stop = start + current.size
            chunk = values[start:stop]
            setattr(self, field, chunk if np.ndim(getattr(self, field)) else chunk[0])
            start = stop

    def _names(self):
        names = []
        for field in self._fields:
            value = getattr(self, field)
            if np.ndim(value):
                names += [f"{self._label}.{field}[{d}]" for d in range(len(value))]
            else:
                names.append(f"{self._label}.{field}")
        return names

    def _describe(self, input_dim, codes, params):
        arrays = self._param_arrays()
        for field in self._fields:
            value = getattr(self, field)
            if np.ndim(value) and len(value) != input_dim:
                raise ValueError(
                    f"{type(self).__name__}.{field} has {len(value)} entries but X has "
                    f"{input_dim} features; give one value per feature or a scalar"
                )
        codes += [self._code, sum(a.size for a in arrays)]
        params += arrays

    def _get_params(self, deep):
        return {f: _copy_value(getattr(self, f)) for f in self._fields}

    def _set_param(self, name, items):
        if set(items) != {""}:
            inner = sorted(f"{name}__{k}" for k in items if k)
            raise ValueError(f"invalid parameter {inner[0]!r} for kernel {self!r}: {name} has no "
                             "parameters of its own")
        setattr(self, name, items[""])

    def __repr__(self):
        args = ", ".join(f"{f}={_format(getattr(self, f))}" for f in self._fields)
        return f"{type(self).__name__}({args})"


def _copy_value(value):
    return value.copy() if isinstance(value, np.ndarray) else value


def _format(value):
    return repr(value.tolist()) if isinstance(value, np.ndarray) else repr(value)


class _Stationary(_Leaf):
    _fields = ("variance", "lengthscale")
    variance = _Hyperparameter()
    lengthscale = _Hyperparameter(per_dimension=True)

    def __init__(self, variance=1.0, lengthscale=1.0):
        self.variance = variance
        self.lengthscale = lengthscale


_STATIONARY_DOC = """{summary}

    ``k(x, x2) = variance * {formula}`` with ``r^2 = sum_d (x_d - x2_d)^2 / lengthscale_d^2``.

    Parameters
    ----------
    variance : float
        Signal variance, > 0.
    lengthscale : float or array_like [D]
        One lengthscale (isotropic) or one per input dimension (ARD), > 0.
    """


class RBF(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Squared-exponential (radial basis function) kernel.", formula="exp(-r^2 / 2)"
    )
    _code, _label = _RBF, "rbf"


class Matern12(_Stationary):
    __doc__ = _STATIONARY_DOC.format(summary="Matern kernel with nu = 1/2.", formula="exp(-r)")
    _code, _label = _MATERN12, "matern12"


class Matern32(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Matern kernel with nu = 3/2.", formula="(1 + sqrt(3) r) exp(-sqrt(3) r)"
    )
    _code, _label = _MATERN32, "matern32"


class Matern52(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Matern kernel with nu = 5/2.",
        formula="(1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)",
    )
    _code, _label = _MATERN52, "matern52"


class Linear(_Leaf):
    """Linear (dot-product) kernel ``k(x, x2) = sum_d variance_d x_d x2_d``.

    Parameters
    ----------
    variance : float or array_like [D]
        One variance shared by all dimensions or one per dimension (ARD), > 0.
    """

    _code, _label, _fields = _LINEAR, "linear", ("variance",)
    variance = _Hyperparameter(per_dimension=True)

    def __init__(self, variance=1.0):
        self.variance = variance


class Constant(_Leaf):
    """Constant kernel ``k(x, x2) = variance``.

    Parameters
    ----------
    variance : float
        > 0.
    """

    _code, _label, _fields = _CONSTANT, "constant", ("variance",)
    variance = _Hyperparameter()

    def __init__(self, variance=1.0):
        self.variance = variance


class White(_Leaf):
    """White-noise kernel: ``variance * I`` for K(X) and 0 between different inputs.

    ``White()(X)`` (X2 omitted) is ``variance * I``; ``White()(X, X2)`` is zero even when
    X2 holds the same points, because X2 is taken to be a different set of inputs.
    :meth:`diag` is ``variance`` everywhere.

    Parameters
    ----------
    variance : float
        Noise variance, > 0.
    """

    _code, _label, _fields = _WHITE, "white", ("variance",)
    variance = _Hyperparameter()

    def __init__(self, variance=1.0):
        self.variance = variance


class _Combination(Kernel):
    """A kernel combining others; the children are held (shared), not copied. A kernel object
    occurs at most once in a combination's tree (ValueError otherwise)."""

    _code = None
    _label = None
    _symbol = None

    def __init__(self, kernels):
        self.kernels = self._checked_terms(kernels)
        self._check_distinct()

    def _check_distinct(self, kernels=None):
        """ValueError when one kernel object occurs twice in the tree (of `kernels`, default
        the terms): its hyperparameters would be listed twice in params and theta, and setting
        them keeps the last copy only."""
        seen = set()
        stack = list(self.kernels if kernels is None else kernels)
        while stack:
            k = stack.pop()
            if id(k) in seen:
                raise ValueError(
                    f"the kernel object {k!r} occurs more than once in this "
                    f"{type(self).__name__.lower()}: its hyperparameters would be listed once per "
                    "occurrence in params and theta, and setting them would keep the last "
                    "occurrence's values only (a hyperparameter search would follow gradients of "
                    "entries that change nothing). Use copy.deepcopy(k) for an independent copy.")
            seen.add(id(k))
            if isinstance(k, _Combination):
                stack.extend(k.kernels)

    def _checked_terms(self, kernels):
        try:
            if isinstance(kernels, Kernel):  # Sum(k): not a sequence
                raise TypeError
            kernels = list(kernels)
        except TypeError as e:
            raise ValueError(
                f"{type(self).__name__} takes a sequence of Kernel objects, got {kernels!r}"
            ) from e
        if not kernels:
            raise ValueError(f"{type(self).__name__} needs at least one kernel")
        for k in kernels:
            if not isinstance(k, Kernel):
                raise ValueError(f"{type(self).__name__} takes Kernel objects, got {k!r}")
        return kernels

    def _get_params(self, deep):
        params = {"kernels": list(self.kernels)}
        if deep:
            for i, k in enumerate(self.kernels):
                params[f"kernels__{i}"] = k
                params.update((f"kernels__{i}__{n}", v) for n, v in k.get_params(True).items())
        return params

    def _set_param(self, name, items):
        whole = items.pop("", None)
        kernels = list(self.kernels) if whole is None else self._checked_terms(whole)
        terms = {}
        for key, value in items.items():
            index, _, rest = key.partition("__")
            if not (index.isdigit() and int(index) < len(kernels)):
                raise ValueError(f"invalid parameter 'kernels__{key}' for kernel {self!r}: "
                                 f"the terms are kernels__0 to kernels__{len(kernels) - 1}")
            terms.setdefault(int(index), {})[rest] = value
        for i, sub in terms.items():
            replacement = sub.pop("", None)
            if replacement is not None:
                kernels[i] = self._checked_terms([replacement])[0]
        self._check_distinct(kernels)
        # (a term's own set_params checks its subtree only; a replacement deeper down that
        # occurs elsewhere in this tree is undone)
        terms_before = [(c, list(c.kernels)) for c in _combinations(self)]
        self.kernels = kernels
        try:
            for i, sub in terms.items():
                if sub:
                    kernels[i].set_params(**sub)
            self._check_distinct()
        except ValueError:
            for c, before in terms_before:
                c.kernels = before
            raise

    def _param_arrays(self):
        return [a for k in self.kernels for a in k._param_arrays()]

    def _assign(self, values):
        start = 0
        for k in self.kernels:
            stop = start + k.n_params
            k._assign(values[start:stop])
            start = stop

    def _names(self):
        return [f"{self._label}[{i}].{n}" for i, k in enumerate(self.kernels) for n in k._names()]

    def _describe(self, input_dim, codes, params):
        codes += [self._code, len(self.kernels)]
        for k in self.kernels:
            k._describe(input_dim, codes, params)

    def __repr__(self):
        parts = []
        for k in self.kernels:
            text = repr(k)
            parts.append(f"({text})" if isinstance(k, _Combination) else text)
        return f" {self._symbol} ".join(parts)


class Sum(_Combination):
    """Sum of kernels, ``k(x, x2) = sum_c k_c(x, x2)``; also made by ``k1 + k2``.

    Parameters
    ----------
    kernels : sequence of Kernel
    """

    _code, _label, _symbol = _SUM, "sum", "+"


class Product(_Combination):
    """Product of kernels, ``k(x, x2) = prod_c k_c(x, x2)``; also made by ``k1 * k2``.

    Parameters
    ----------
    kernels : sequence of Kernel
    """

    _code, _label, _symbol = _PRODUCT, "product", "*"
