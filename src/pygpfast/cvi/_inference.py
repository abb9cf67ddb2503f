"""Concave variational inference for full GP models (Khan, Mohamed & Murphy 2012).

Full (non-sparse) GP models with non-conjugate likelihoods: a Gaussian posterior approximation
q(z_l) = N(m_l, V_l) for each of the L latent functions, fitted by maximising the lower bound of
Khan, Mohamed & Murphy 2012 eq. (6) with closed-form local bounds f_b(y, m, v) <= E_q[log p(y | z)]:

========================  ======  ============================================================
likelihood                latents local bound
========================  ======  ============================================================
``"logit"``               1       y m - E[B(z)], B >= log(1 + e^z) piecewise (Marlin et al.)
``"poisson"``             1       y m - exp(m + v/2) - lgamma(y + 1)  (exact; real y >= 0 too)
``"softmax"``         C       m_y - lse(m + v/2)  (Blei & Lafferty)
``"stick-breaking"``      C - 1   log sigmoid(z_k) + sum_{j<k} log sigmoid(-z_j), piecewise
``"ordinal"``             1       cumulative logit p(y <= k) = sigmoid(phi_k - z), piecewise
========================  ======  ============================================================

Two methods reach the same optimum of the same bound:

* ``"fixed-point"``: Algorithm 1 of the seed. Coordinate ascent on the diagonal of V^-1 with
  the scalar fixed-point iteration of eq. (16) (accelerated and guarded), rank-one updates of V
  (eqs. 19-20; applied in blocks as BLAS-3 updates, ``block_size=1`` is the literal BLAS-2
  algorithm), then Newton's method for the means (eq. 21). Where that alternation converges
  slowly (large prior variances from a cold start; for the multinomial bound, whose latents are
  coupled, warm starts too), the means' step becomes Newton's step for the bound maximised over
  the site precisions, which anticipates the next sweep: about half the iterations of the
  seed's alternation, and for the multinomial bound at large variances a quarter (cold starts)
  to a tenth (warm starts) of them (``coupled_means=False`` in :func:`infer` runs the seed's).
  See ``csrc/include/pygpfast/cvi.hpp``.
* ``"opper-archambeau"``: the reparameterisation of eq. (11), m = mean + Sigma alpha,
  V = (Sigma^-1 + diag(lambda))^-1, optimised over (alpha, lambda >= 0) by L-BFGS-B. The
  seed's baseline: on ill-conditioned priors (large variances, long length scales) it can stop
  well short of the optimum; the estimators then warn (one fixed-point iteration from its
  result measures the gap).

Hyperparameters (kernel, constant prior means, ordinal thresholds) are learned by maximising the
bound at the optimum with L-BFGS-B; its gradient comes from the envelope theorem in O(N^2) once V
is known. Predictions: latent means and variances at new inputs, class probabilities by
Gauss-Hermite quadrature (for ``"softmax"``, E[softmax(z)] by :class:`pygpfast.likelihoods.Softmax`).

This module holds the inference for a given prior covariance (:func:`infer`, :func:`oa_objective`,
:class:`LocalBound`); the estimators around it are in :mod:`._estimators`. Latent arrays are
[N, L] here as everywhere in the API; the compiled core's are latent-major [L, N].
"""

import numbers
import time
from dataclasses import dataclass

import numpy as np

from .. import _core
from .._base._optimize import lbfgs
from .._base._params import check_int
from .._validation import core_array, naming_conversion_errors
from ..piecewise import llp_bound

__all__ = ["LocalBound", "InferenceResult", "infer", "oa_objective"]

# Codes of pygpfast::cvi::LocalBoundType (csrc/include/pygpfast/cvi.hpp).
_KINDS = {"logit": 0, "poisson": 1, "softmax": 2, "stick-breaking": 3, "ordinal": 4}
_METHODS = ("fixed-point", "opper-archambeau")
_BOUND_KINDS = ("quadratic", "linear")

#: Newton iterations for the means per outer iteration of Algorithm 1.
_MAX_NEWTON = 30
#: Flops charged per (alpha, lambda) coordinate for one L-BFGS-B iteration (two-loop recursion
#: with 10 pairs and the bound projections); negligible next to the O(N^3) objective.
_LBFGS_FLOPS_PER_COORDINATE = 50


class LocalBound:
    """A local variational bound f_b(y, m, v) <= E_{N(z | m, v)}[log p(y | z)].

    Parameters
    ----------
    likelihood : {"logit", "poisson", "softmax", "stick-breaking", "ordinal"}
    bound : {"quadratic", "linear"}
        Kind of the piecewise bound on log(1 + e^x) (logit, stick-breaking, ordinal).
    n_pieces : int
        Its number of pieces R (3 to 20).
    n_classes : int
        C (multinomial, stick-breaking) or K (ordinal); ignored otherwise.
    thresholds : array_like [K - 1], optional
        Ordinal cut points phi (strictly increasing); default evenly spaced on [-1, 1].
    """

    def __init__(self, likelihood, *, bound="quadratic", n_pieces=20, n_classes=0,
                 thresholds=None):
        if not isinstance(likelihood, str) or likelihood not in _KINDS:
            raise ValueError(f"likelihood must be one of {tuple(_KINDS)}, got {likelihood!r}")
        if not isinstance(bound, str) or bound not in _BOUND_KINDS:
            raise ValueError(f"bound must be one of {_BOUND_KINDS}, got {bound!r}")
        self.likelihood = likelihood
        self.bound = bound
        self.n_pieces = n_pieces
        self.llp = llp_bound(n_pieces, bound)
        multi = likelihood in ("softmax", "stick-breaking", "ordinal")
        if multi:
            if not (isinstance(n_classes, numbers.Integral) and n_classes >= 2):
                raise ValueError(f"the {likelihood} likelihood needs n_classes >= 2, "
                                 f"got {n_classes!r}")
            self.n_classes = int(n_classes)
        else:
            self.n_classes = 0
        if likelihood == "ordinal":
            if thresholds is None:
                thresholds = np.linspace(-1.0, 1.0, self.n_classes - 1)
            thresholds = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
            if thresholds.shape != (self.n_classes - 1,):
                raise ValueError(f"thresholds must have {self.n_classes - 1} entries")
            if not (np.all(np.isfinite(thresholds)) and np.all(np.diff(thresholds) > 0)):
                raise ValueError("thresholds must be finite and strictly increasing")
            self.thresholds = core_array(thresholds)
        else:
            self.thresholds = np.zeros(0)

    @property
    def n_latent(self):
        """L, the number of latent functions."""
        if self.likelihood == "softmax":
            return self.n_classes
        if self.likelihood == "stick-breaking":
            return self.n_classes - 1
        return 1

    def _core_args(self):
        b = self.llp
        return (_KINDS[self.likelihood], b.knots, b.a, b.b, b.c, self.n_classes, self.thresholds)

    def __call__(self, y, m, v):
        """f_b per point with its derivatives.

        Parameters
        ----------
        y : array_like [N]
            Labels (0/1, class indices 0..C-1, or for "poisson" counts or reals >= 0).
        m, v : array_like [L, N]
            Means and variances (>= 0) of the latent marginals (a 1-D array is [1, N]).

        Returns
        -------
        value : ndarray [N]
        dm, dv, d2m : ndarray [L, N]
            d f_b / dm, d f_b / dv and d^2 f_b / dm^2 (per latent).
        dthresholds : ndarray [K - 1]
            sum over points of d f_b / d phi (ordinal; empty otherwise).
        """
        y = core_array(y)
        m = np.atleast_2d(np.asarray(m, dtype=np.float64))
        v = np.atleast_2d(np.asarray(v, dtype=np.float64))
        return _core.cvi.local_bounds(*self._core_args(), y, m=core_array(m),
                                      v=core_array(v))

    def __repr__(self):
        extra = f", n_classes={self.n_classes}" if self.n_classes else ""
        return (f"LocalBound({self.likelihood!r}, bound={self.bound!r}, "
                f"n_pieces={self.n_pieces}{extra})")


@dataclass
class InferenceResult:
    """The optimum of the bound for fixed hyperparameters.

    Attributes
    ----------
    bound : float
    alpha, lambda_ : ndarray [N, L]
        m_l = mean_l + Sigma alpha_l and V_l = (Sigma^-1 + diag(lambda_l))^-1.
    V : ndarray [L, N, N] or None
    history : ndarray [n, 4]
        Per iteration (row 0: the start): bound, cumulative flops, cumulative local-bound
        evaluations, cumulative seconds.
    iterations : int
    converged : bool
    info : dict
        The core's counters (residuals of eqs. 7-8, damped sweeps, ...).
    """

    bound: float
    alpha: np.ndarray
    lambda_: np.ndarray
    V: object
    history: np.ndarray
    iterations: int
    converged: bool
    info: dict


def _check_local_bound(local_bound):
    if not isinstance(local_bound, LocalBound):
        raise ValueError(f"local_bound must be a LocalBound, got {local_bound!r}")


def _check_sigma(Sigma):
    """Sigma as a C-contiguous float64 [N, N]: ValueError unless it is square, non-empty and
    symmetric to rounding (the core reads both triangles); asymmetry within rounding is
    averaged out."""
    with naming_conversion_errors("Sigma"):
        Sigma = core_array(Sigma)
    if Sigma.ndim != 2 or Sigma.shape[0] != Sigma.shape[1] or Sigma.shape[0] == 0:
        raise ValueError(f"Sigma must be a non-empty square matrix, got shape {Sigma.shape}")
    if not np.array_equal(Sigma, Sigma.T):  # (NaN fails here too, and the core names it)
        gap = np.max(np.abs(Sigma - Sigma.T))
        if gap > 1e-10 * np.max(np.abs(Sigma)):
            raise ValueError(f"Sigma must be symmetric, got |Sigma - Sigma^T| up to {gap:.3g}")
        Sigma = core_array(0.5 * (Sigma + Sigma.T))
    return Sigma


def _latent_array(x, L, N, name, default=0.0):
    """`x` [N, L] (or [N] for one latent function; None: `default`) as the core's latent-major
    [L, N]."""
    if x is None:
        return np.full((L, N), default)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1 and L == 1:
        x = x[:, None]
    if x.shape != (N, L):
        raise ValueError(f"{name} must be [{N}, {L}], got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinity")
    return core_array(x.T)


def _mean_vector(mean, L):
    if mean is None:
        return np.zeros(L)
    mean = core_array(np.atleast_1d(np.asarray(mean, dtype=np.float64)))
    if mean.shape != (L,):
        raise ValueError(f"mean must have {L} entries (one per latent function)")
    return mean


def infer(Sigma, y, local_bound, *, mean=None, alpha=None, lambda_=None, method="fixed-point",
          max_iter=200, tol=1e-10, block_size=None, skip_tol=0.0, coupled_means=True,
          return_V=False):
    """Maximise the bound over q for the prior N(mean_l, Sigma) of each latent function.

    Parameters
    ----------
    Sigma : array_like [N, N]
        Prior covariance (symmetric positive semi-definite; it is never inverted).
    y : array_like [N]
    local_bound : LocalBound
    mean : array_like [L], optional
        Constant prior means (zeros by default).
    alpha, lambda_ : array_like [N, L], optional
        Starting point (zeros: Algorithm 1's initialisation V = Sigma, m = mean).
    method : {"fixed-point", "opper-archambeau"}
    max_iter : int >= 0
        Outer iterations of Algorithm 1, or L-BFGS-B iterations (0: the start's V and bound).
    tol : float
        Relative tolerance on the bound (<= 0: run max_iter iterations).
    block_size : int or None
        Coordinates per BLAS-3 block of Algorithm 1 (1: literal rank-one updates). None: the
        core's choice by N, 32 below 1500 points and 64 from there (the faster).
    skip_tol : float
        Algorithm 1 leaves a coordinate whose variance would change by less than this fraction
        (not with the multinomial bound, whose Newton steps for the means need its site
        precisions at their fixed point lambda = p).
    coupled_means : bool
        Where the iterations converge slowly, a step for the means that anticipates the next
        sweep (Newton's step for the bound maximised over the site precisions; not in the
        seed; from cold starts, lambda = 0, and for the multinomial bound from any start: see
        ``csrc/include/pygpfast/cvi.hpp``): at large prior variances about half the
        iterations, for the multinomial bound a quarter to a tenth. False runs the seed's
        Algorithm 1 as written.
    return_V : bool
        Also return the posterior covariances (fixed-point method).

    Returns
    -------
    InferenceResult
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    _check_local_bound(local_bound)
    check_int(max_iter, "max_iter", 0)
    if block_size is not None:
        check_int(block_size, "block_size", 1)
    for name, value, low in (("tol", tol, -np.inf), ("skip_tol", skip_tol, 0.0)):
        if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                and low <= value < np.inf):
            raise ValueError(f"{name} must be a finite number"
                             f"{' >= 0' if low == 0 else ''}, got {value!r}")
    Sigma = _check_sigma(Sigma)
    N, L = Sigma.shape[0], local_bound.n_latent
    with naming_conversion_errors("y"):
        y = core_array(y)
    if y.shape != (N,):
        raise ValueError(f"y must have {N} entries, got shape {y.shape}")
    mean = _mean_vector(mean, L)
    alpha = _latent_array(alpha, L, N, "alpha")
    lambda_ = _latent_array(lambda_, L, N, "lambda_")
    if method == "opper-archambeau":
        bound, a, lam, history, iterations, converged, info = _infer_oa(
            Sigma, y, local_bound, mean, alpha, np.maximum(lambda_, 0.0), max_iter, tol)
        return InferenceResult(bound, a.T.copy(), lam.T.copy(), None, history, iterations,
                               converged, info)
    info, a, lam, V = _core.cvi.infer(
        *local_bound._core_args(), y, Sigma, mean=mean, alpha=alpha, lambda_=lambda_,
        max_iter=int(max_iter), tol=float(tol), block_size=block_size or 0,
        max_newton=_MAX_NEWTON, skip_tol=float(skip_tol), coupled_means=bool(coupled_means),
        return_V=bool(return_V))
    history = info.pop("history")
    return InferenceResult(info["bound"], a.T.copy(), lam.T.copy(), V, history, info["iterations"],
                           info["converged"], info)


def oa_objective(Sigma, y, local_bound, alpha, lambda_, *, mean=None):
    """The Opper-Archambeau objective (Khan, Mohamed & Murphy 2012 eq. 11) and its gradients.

    Parameters
    ----------
    Sigma : array_like [N, N]
    y : array_like [N]
    local_bound : LocalBound
    alpha, lambda_ : array_like [N, L]
        lambda_ >= 0.
    mean : array_like [L], optional

    Returns
    -------
    value : float
    d_alpha, d_lambda : ndarray [N, L]
    """
    _check_local_bound(local_bound)
    Sigma = _check_sigma(Sigma)
    N, L = Sigma.shape[0], local_bound.n_latent
    with naming_conversion_errors("y"):
        y = core_array(y)
    value, da, dl, _, _ = _core.cvi.oa_objective(
        *local_bound._core_args(), y, Sigma,
        mean=_mean_vector(mean, L), alpha=_latent_array(alpha, L, N, "alpha"),
        lambda_=_latent_array(lambda_, L, N, "lambda_"))
    return value, da.T.copy(), dl.T.copy()


def _infer_oa(Sigma, y, lb, mean, alpha, lambda_, max_iter, tol):
    """L-BFGS-B over (alpha, lambda >= 0) on eq. (11), recording the bound per iteration.

    With the Poisson bound a trial step can overflow exp(m + v / 2) (m = Sigma alpha moves by
    Sigma times the step). L-BFGS-B's line search cannot backtrack from an
    infinite value: it returns to its start and reports convergence. A trial point whose bound
    is not finite is therefore given the value of a quadratic wall around the current iterate,
    higher than the iterate's own, so that the line search shortens the step; such a point is
    never accepted.
    """
    L, N = alpha.shape
    args = lb._core_args()
    # x, value: the last call; at_x, at_value: the current iterate
    state = {"flops": 0.0, "evals": 0.0, "x": None, "value": None, "at_x": None,
             "at_value": None, "walls": 0}
    start = time.perf_counter()

    def objective(x):
        value, grad = -np.inf, None
        if np.isfinite(x).all():  # (a step from a gradient near overflow need not be)
            a = core_array(x[: L * N].reshape(L, N))
            lam = core_array(x[L * N:].reshape(L, N))
            value, da, dl, flops, evals = _core.cvi.oa_objective(*args, y, Sigma, mean=mean,
                                                                 alpha=a, lambda_=lam)
            state["flops"] += flops + _LBFGS_FLOPS_PER_COORDINATE * x.size
            state["evals"] += evals
            grad = np.concatenate([da.ravel(), dl.ravel()])
        if not (np.isfinite(value) and np.isfinite(grad).all()):
            if state["at_x"] is None:
                raise ValueError(
                    "opper-archambeau: the bound is not finite at the starting point (exp(m + "
                    "v/2) overflows: the prior variance is too large for these site "
                    "parameters); start from positive site precisions lambda_")
            state["walls"] += 1
            d = x - state["at_x"]
            return -state["at_value"] + 1.0 + d @ d, 2.0 * d
        state["x"], state["value"] = x.copy(), value
        return -value, -grad

    x0 = np.concatenate([alpha.ravel(), lambda_.ravel()])
    f0, _ = objective(x0)
    state["at_x"], state["at_value"] = x0, -f0
    history = [(-f0, state["flops"], state["evals"], time.perf_counter() - start)]

    def on_iteration(_, x, value):
        state["at_x"], state["at_value"] = x.copy(), -value
        history.append((-value, state["flops"], state["evals"], time.perf_counter() - start))

    bounds = [(None, None)] * (L * N) + [(0.0, None)] * (L * N)
    res = lbfgs(objective, x0, bounds=bounds, max_iter=int(max_iter), ftol=float(tol), gtol=1e-12,
                max_evaluations=20 * int(max_iter) + 20, on_iteration=on_iteration)
    x = res.x
    if np.array_equal(state["x"], x):  # L-BFGS-B usually returns its last evaluated point
        value = state["value"]
    else:
        value = _core.cvi.oa_objective(
            *args, y, Sigma, mean=mean, alpha=core_array(x[: L * N].reshape(L, N)),
            lambda_=core_array(x[L * N:].reshape(L, N)))[0]
    info = {"bound": value, "iterations": res.n_iter, "converged": res.converged,
            "flops": state["flops"], "bound_evaluations": state["evals"],
            "function_evaluations": res.n_evaluations, "message": res.message,
            "overflowing_trials": state["walls"]}
    return (value, x[: L * N].reshape(L, N).copy(), x[L * N:].reshape(L, N).copy(),
            np.array(history), res.n_iter, res.converged, info)
