"""Where a fit starts: the default kernel, k-means inducing inputs, and the data-scaled start of
the second search that every estimator runs after a degenerate first one (see
:mod:`pygpfast._base._diagnose`)."""

import copy
import numbers
import threading

import numpy as np
from sklearn.cluster import KMeans
from sklearn.utils.random import sample_without_replacement
from threadpoolctl import threadpool_limits

from .. import _core
from .. import kernels as _kernels
from .._threads import get_num_threads, one_blas_thread
from .._validation import power_of_two_unit
from . import _diagnose

#: Held around the k-means of init_inducing. scikit-learn's KMeans limits the BLAS to one
#: thread while it runs (threadpoolctl: it reads the process-wide count on entry and sets it
#: back on exit), and two such limits that overlap in threads restore in the wrong order: SVGP
#: fits in threads (GridSearchCV with the threading backend) left numpy's and scipy's BLAS on
#: one thread for the rest of the process. (It runs in a one_blas_thread scope too, so that its
#: limit does not interleave with the core's scopes on scipy's BLAS either.)
KMEANS_LOCK = threading.Lock()


def init_inducing(X, M, random_state):
    """M inducing inputs [M, D]: k-means centres (k-means++ start, at most 30 Lloyd
    iterations) of a random subsample of max(10 M, 10000) rows of X, read at once, so the cost
    does not grow with N (about 0.1 s for M = 100 on one core) and memory-mapped data is
    touched only there. The k-means threads follow pygpfast.set_num_threads, but a clustering
    of under ~1e9 flops (n_sub M D per iteration times 30) runs on one thread: on a shared
    machine its many short parallel regions each wait for a paused thread (measured under
    load: 1.4 s on two threads against 0.36 s on one)."""
    N = X.shape[0]
    if M >= N:
        return np.array(X, dtype=np.float64, order="C")
    n_sub = min(N, max(10 * M, 10000))
    idx = np.sort(sample_without_replacement(N, n_sub, random_state=random_state))
    sub = np.asarray(X[idx], dtype=np.float64)
    # (In units of a power of two: k-means' squared distances overflow for inputs beyond
    # ~1e154, and the scaling is exact, so the centres are otherwise bitwise the same.)
    scale = float(power_of_two_unit(sub))
    km = KMeans(n_clusters=M, n_init=1, max_iter=30, random_state=random_state.randint(2**31 - 1))
    threads = 1 if 30.0 * 3 * n_sub * M * sub.shape[1] < 1e9 else get_num_threads()
    with KMEANS_LOCK, one_blas_thread(), threadpool_limits(limits=threads, user_api="openmp"):
        km.fit(np.divide(sub, scale, out=sub))  # (sub is a copy already)
    return np.ascontiguousarray(km.cluster_centers_ * scale)


def same_param(a, b):
    """Whether parameter values a and b are the same: equal numbers or strings, else the same
    object (a kernel, an array)."""
    plain = (numbers.Number, str, type(None))
    return a is b or (isinstance(a, plain) and isinstance(b, plain) and a == b)


def dimension_spread(rows, others):
    """m_d [D]: per input dimension, the median of |x_d - x'_d| over the pairs of `rows` [R, D] and
    `others` [P, D] that differ in dimension d; 1 for a dimension where none does (or where the
    median is not finite). The scale of the default kernel's lengthscales and of the default
    priors' (:mod:`pygpfast._base._priors`).

    (Over the pairs that differ: in a dimension where half the pairs agree exactly, such as the
    pixels of a digit's border that are mostly 0, the median over all pairs is the smallest
    difference, ~1e-3 on USPS, and one point that differs there is cut off from all others.)

    The core selects each dimension's median (``_core.kernels.dimension_spread``, dimensions on
    threads): numpy's per-dimension masks and medians took 0.6 s for 800 x 200 pairs of 784
    pixels, a third of a joint IVM's fit on MNIST's train5 shape."""
    return _core.kernels.dimension_spread(np.ascontiguousarray(rows, dtype=np.float64),
                                          np.ascontiguousarray(others, dtype=np.float64))


def reference_lengthscale(X, max_rows=1000, pairs=200):
    """m_d sqrt(D) [D]: :func:`dimension_spread` over `max_rows` x `pairs`
    pairs of evenly spaced rows of X (deterministic: the random state is not touched), times
    sqrt(D). The lengthscale of the default kernel's start, up to its random subsample."""
    N, D = X.shape
    sub = np.asarray(X[_diagnose._query_rows(N, max_rows)], dtype=np.float64)
    other = sub[_diagnose._query_rows(sub.shape[0], pairs)]  # (spread over all rows: X may be sorted)
    return dimension_spread(sub, other) * np.sqrt(D)


def default_kernel(X, random_state, variance=1.0):
    """RBF with ARD lengthscales set by the median-distance heuristic per input dimension:
    :func:`dimension_spread` over 1000 x 200 pairs of a random subsample, times sqrt(D)."""
    N, D = X.shape
    idx = np.sort(sample_without_replacement(N, min(N, 1000), random_state=random_state))
    sub = np.asarray(X[idx], dtype=np.float64)
    return _kernels.RBF(variance=variance, lengthscale=dimension_spread(sub, sub[:200]) * np.sqrt(D))


#: A given kernel's prior variance k(x, x) and its stationary leaves' lengthscales must lie
#: within this factor of the data's scale (the targets' scale; default_kernel's lengthscales).
#: Measured on the shared behaviour suite's problems: every estimator fits from variances and
#: lengthscales of 1e-100 and 1e100 times those; from 1e-200 (variance or lengthscale) the CVI
#: fits failed deep in the search with messages about site precisions or ordinal thresholds.
KERNEL_SCALE_RANGE = 1e100


def start_kernel(kernel, X, random_state, variance=1.0):
    """The kernel a fit starts from: a copy of the user's `kernel`, or default_kernel(X,
    random_state, variance) for None. A ValueError naming ``kernel`` when the given one is
    beyond KERNEL_SCALE_RANGE of the data's scale: its prior variance k(x, x) at a row of X
    outside [1e-100, 1e100] times `variance` (the targets' scale), or a stationary leaf's
    lengthscales outside [1e-100, 1e100] times the median-distance ones of default_kernel."""
    if kernel is None:
        return default_kernel(X, random_state, variance)
    low, high = 1.0 / KERNEL_SCALE_RANGE, KERNEL_SCALE_RANGE
    rows = np.ascontiguousarray(X[: min(X.shape[0], 10)], dtype=np.float64)
    prior = kernel.diag(rows) / variance
    if not np.all((prior >= low) & (prior <= high)):
        raise ValueError(
            f"kernel={kernel!r} has prior variance k(x, x) = {prior[0] * variance:.3g} at the "
            f"first rows of X, beyond a factor {high:.0e} of the targets' scale {variance:.3g}: "
            "no fit can start there; give a kernel with a variance nearer that scale, or "
            "kernel=None")
    leaves = stationary_leaves(kernel)
    if leaves:
        # (over 200 x 20 rows: the check's range is 1e100, and 1000 x 200 pairs took 0.7 s at
        # D = 784)
        reference = reference_lengthscale(X, max_rows=200, pairs=20)
        for leaf, _ in leaves:
            ratio = np.asarray(leaf.lengthscale) / (reference if np.ndim(leaf.lengthscale)
                                                    else np.exp(np.mean(np.log(reference))))
            if not np.all((ratio >= low) & (ratio <= high)):
                raise ValueError(
                    f"kernel={kernel!r} has a lengthscale beyond a factor {high:.0e} of the "
                    f"data's scale (median distances {np.array2string(reference, precision=3)}"
                    "): no fit can start there; give lengthscales nearer that scale, or "
                    "kernel=None")
    return copy.deepcopy(kernel)


def diagnosis_sample(X, max_rows=2000):
    """At most `max_rows` evenly spaced rows of X (float64), read at once (a memory-mapped X is
    touched only there), for _diagnose.diagnose."""
    return np.ascontiguousarray(X[_diagnose._query_rows(X.shape[0], max_rows)], dtype=np.float64)


def stationary_leaves(kernel, carries_variance=True):
    """[(leaf, carries_variance)] for the stationary leaves of `kernel` in order. In a product
    only the stationary leaves of its first term that has any carry the product's variance (the
    others' variances multiply into it); each term of a sum carries its own."""
    if isinstance(kernel, _kernels._Stationary):
        return [(kernel, carries_variance)]
    if isinstance(kernel, _kernels.Product):
        pairs = []
        for term in kernel.kernels:
            pairs += stationary_leaves(term, carries_variance and not pairs)
        return pairs
    if isinstance(kernel, _kernels.Sum):
        return [pair for term in kernel.kernels for pair in stationary_leaves(term, carries_variance)]
    return []


def data_scaled_kernel(kernel, X, random_state, variance=1.0):
    """A copy of `kernel` started where the default kernel starts (:func:`default_kernel`):
    each stationary leaf with the median-distance lengthscales (their geometric mean for an
    isotropic one) and the variance `variance` (1 for all but the first stationary leaf of a
    product, whose variances multiply); the other leaves (Linear, Constant, White) as they are.
    None when `kernel` has no stationary leaf. The start of the estimators' second search after
    a first one from `kernel` ended degenerate (_diagnose.diagnose)."""
    if not has_stationary_leaf(kernel):
        return None
    reference = default_kernel(X, random_state, variance).lengthscale
    scaled = copy.deepcopy(kernel)

    for leaf, carries_variance in stationary_leaves(scaled):
        leaf.lengthscale = (reference if np.ndim(leaf.lengthscale)
                            else float(np.exp(np.mean(np.log(reference)))))
        leaf.variance = variance if carries_variance else 1.0
    return scaled


def has_stationary_leaf(kernel):
    """Whether `kernel` has a stationary leaf, whose lengthscales and variance a second search
    can start from the data's scale (:func:`data_scaled_kernel`)."""
    return bool(stationary_leaves(kernel))


def second_start(start, X, random_state, variance=1.0):
    """The start of the estimators' second search after the first, from `start`, ended
    degenerate: the data-scaled kernel (:func:`data_scaled_kernel`), or, where that is
    `start` itself (kernel=None), the same with lengthscales e^2 longer: a smoother prior, from
    which the search reaches short lengthscales from above. (From the median-distance start,
    L-BFGS-B's first steps can land in a memorising optimum at the short end: Poisson counts
    around e^5 on 50 rows, where starts at a quarter to ten times that lengthscale all find
    the smooth optimum.) None when `start` has no stationary leaf."""
    scaled = data_scaled_kernel(start, X, random_state, variance)
    if scaled is not None and np.allclose(scaled.theta, start.theta, rtol=0, atol=0.1):
        for leaf in _kernels._leaves(scaled):
            if isinstance(leaf, _kernels._Stationary):
                leaf.lengthscale = np.exp(2.0) * leaf.lengthscale
    return scaled


def both_constant(first, second, scaled, X, scale):
    """restart_["both_constant"]: whether the searches from the given start and from the
    data-scaled one, `scaled`, ended at kernels (`first`, `second`) whose latent functions are
    constant on the rows of X (:func:`_diagnose.latent_is_constant`, latent scale `scale`), and
    `scaled` is not flat there. Such agreement is the data's verdict (labels without signal);
    a data-scaled start that a factor without lengthscales keeps flat (Linear(variance=1e-8) in
    a product) stalls as the first did, and agrees with it by that alone."""
    return (_diagnose.prior_spread(scaled, X) >= _diagnose.STALLED_SPREAD * scale
            and all(_diagnose.latent_is_constant(k, X, scale) for k in (first, second)))


def second_search_clause(restart, objective):
    """What a degenerate fit's warning adds about the second search recorded in `restart`
    (restart_; `objective` names the objective in the text, "bound" or "ELBO"): "" when there
    was none."""
    if restart is None:
        return ""
    first, second = restart["objectives"]
    return ("; a second search, from a kernel variance and lengthscales set by the data's "
            "scale, "
            + (f"reached a lower {objective} ({second:.6g} against {first:.6g})"
               if restart["kept"] == "given" else
               f"was kept for its higher {objective} ({second:.6g} against {first:.6g}), and "
               f"is degenerate too"))
