"""Degenerate fits: kernels whose lengthscales or variance leave the latent function useless
(numerically diagonal or constant on the training inputs), found after a fit by
:func:`diagnose`. Every estimator runs it; a degenerate first search is searched again from the
data's scale (:mod:`pygpfast._base._start`) or reported as a ``ConvergenceWarning``."""

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from .. import kernels as _kernels
from .._validation import power_of_two_unit

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


def _varying_part(kernel):
    """The part of `kernel` that correlates distinct inputs by their distance: a sum without its
    Constant and White terms (which shift every covariance or only the diagonal), or None when
    nothing is left (a kernel that is only those)."""
    terms = kernel.kernels if isinstance(kernel, _kernels.Sum) else [kernel]
    kept = [k for k in terms if not isinstance(k, (_kernels.Constant, _kernels.White))]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else _kernels.Sum(kept)


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
    parts = [np.atleast_1d(k.lengthscale) for k in _kernels._leaves(kernel) if isinstance(k, _kernels._Stationary)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _typical_distance(X, max_rows=300):
    """The median Euclidean distance between (at most `max_rows` evenly spaced) rows of X
    (computed in units of a power of two near max |X|: squares overflow beyond ~1e154)."""
    sub = X[_query_rows(X.shape[0], max_rows)]
    unit = float(power_of_two_unit(sub))
    sub = sub / unit
    sq = np.sum(sub * sub, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * sub @ sub.T
    upper = d2[np.triu_indices(len(sub), 1)]
    return unit * float(np.sqrt(max(np.median(upper), 0.0))) if upper.size else 0.0


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
    variances = [k.variance for k in _kernels._leaves(kernel) if isinstance(k, _kernels._Stationary)]
    if variances and max(variances) <= 1.01 * _kernels.PARAM_BOUNDS[0]:
        return f" (the search shrank the kernel variance to its lower bound, {_kernels.PARAM_BOUNDS[0]:g})"
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



