"""Sparse mean-field GP classification (Hensman, Matthews & Ghahramani 2015 section 3.1, ``method="mf"``; probit only).

The probit model is augmented with g = f + eps, eps ~ N(0, I) (eq. 9); Titsias' bound on p(g)
and a factorising q(g) give the bound of eq. (12), whose factors are truncated Gaussians with
free locations ``a`` [N] (eq. 11). The compiled core evaluates the bound and its gradients in
O(N M^2) (csrc/include/pygpfast/svgp_mf.hpp).

Fitting. ``a`` is not optimised by the outer optimiser: for fixed Z and kernel parameters its
optimum is unique, and the core finds it to ~1e-10 with a damped Newton iteration in an
M-dimensional variable (a few O(N M^2) steps; the paper's inner loop used O(N M) gradient
steps). The outer optimiser then maximises the bound at the optimal ``a`` over Z and the log
kernel parameters; by the envelope theorem its gradient is the partial gradient at the optimal
``a``. It is scipy's L-BFGS-B (the paper used scaled conjugate gradients). As in the KL fit the
variational parameters come first with the hyperparameters frozen: the first inner solve at
the initial Z and kernel is exactly that stage.

Prediction uses the paper's Gaussian approximation: q(u) = N(Sigma Kzz^-1 Kzx E[g], Sigma),
Sigma = Kzz - Kzx (Q + I)^-1 Kxz, stored whitened so that :class:`pygpfast.svgp.SVGP`
predicts with it (O(M^2) per test point).
"""

import time
from dataclasses import dataclass

import numpy as np
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning

from .. import _core
from .._base._optimize import lbfgs
from ._optim import column_spread
from ..exceptions import warn_at_caller, warn_inducing_jitter
from ..kernels import hyper_bounds

__all__ = ["MFFit", "check_estimator_params", "fit", "mf_bound", "mf_posterior"]

#: Newton iterations and tolerance of the inner solve for the optimal ``a``.
INNER_MAX_ITER = 100
INNER_TOL = 1e-10


def _warn_jitter(extra, codes, params, Z):
    if extra > 0:
        warn_inducing_jitter("SVGP (mf)", extra, np.mean(_core.kernels.Kdiag(codes, params, Z)))


def mf_bound(kernel, Z, X, y, a, *, jitter=1e-6, solve_a=False, with_grad=False):
    """The sparse mean-field bound of Hensman, Matthews & Ghahramani 2015 eq. (12), optionally at the optimal ``a``.

    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel
    Z : ndarray [M, D], float64 C-contiguous
        Inducing inputs.
    X : ndarray [N, D], float64 C-contiguous
    y : ndarray [N]
        Labels in {0, 1}.
    a : ndarray [N]
        Locations of the truncated Gaussians q(g_n) (the starting point when ``solve_a``).
    jitter : float
        Added to the diagonal of K(Z, Z), relative to its mean diagonal.
    solve_a : bool
        Replace ``a`` by its optimum for this Z and kernel before evaluating.
    with_grad : bool

    Returns
    -------
    bound : float
    a : ndarray [N]
        The ``a`` the bound was evaluated at (a copy; the optimum when ``solve_a``).
    grads : dict or None
        ``a`` [N], ``Z`` [M, D] and ``kernel`` [P] (w.r.t. the positive kernel parameters):
        gradients of the bound.
    info : dict
        ``inner_iterations``, ``inner_residual``, ``inner_converged`` of the solve for ``a``.
    """
    codes, params = kernel._spec(Z.shape[1])
    value, a_out, extra, (iters, resid, converged), g = _core.svgp.mf_bound(
        codes, params, Z=Z, X=X, y=y, a=a, jitter=float(jitter), solve_a=bool(solve_a), max_iter=INNER_MAX_ITER, tol=INNER_TOL,
        with_grad=bool(with_grad),
    )
    _warn_jitter(extra, codes, params, Z)
    info = {"inner_iterations": iters, "inner_residual": resid, "inner_converged": converged}
    grads = None if g is None else {"a": g[0], "Z": g[1], "kernel": g[2]}
    return value, a_out, grads, info


def mf_posterior(kernel, Z, X, y, a, *, jitter=1e-6):
    """Whitened Gaussian approximation q(v) = N(q_mu, q_sqrt q_sqrt^T), v = Lz^-1 u.

    Returns
    -------
    q_mu : ndarray [M]
    q_sqrt : ndarray [M, M], lower triangular
    """
    codes, params = kernel._spec(Z.shape[1])
    q_mu, q_sqrt, extra = _core.svgp.mf_posterior(codes, params, Z=Z, X=X, y=y, a=a, jitter=float(jitter))
    _warn_jitter(extra, codes, params, Z)
    return q_mu, q_sqrt


@dataclass
class MFFit:
    """Result of :func:`fit`: the fitted arrays (the kernel is updated in place)."""

    a: np.ndarray  #: [N] optimal locations of q(g_n)
    Z: np.ndarray  #: [M, D] inducing inputs
    q_mu: np.ndarray  #: [M] whitened mean of the Gaussian approximation of q(u)
    q_sqrt: np.ndarray  #: [M, M] its lower-triangular square root
    bound: float  #: eq. (12) at the result
    n_iter: int  #: L-BFGS-B iterations
    #: the log prior density of the kernel's hyperparameters at the result (0.0 without
    #: priors); the search maximised bound + log_prior
    log_prior: float = 0.0


def fit(kernel, Z, X, y, *, jitter=1e-6, train_Z=True, train_hyper=True, max_iter=5000, tol=1e-6,
        report=None):
    """Maximise the sparse mean-field bound over a, Z and the kernel parameters.

    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel
        Initial kernel; its parameters are updated in place.
    Z : ndarray [M, D]
        Initial inducing inputs.
    X : ndarray [N, D], float64 C-contiguous
    y : ndarray [N]
        Labels in {0, 1}.
    jitter : float
    train_Z, train_hyper : bool
        Optimise Z, the kernel parameters (log scale, within ``kernels.hyper_bounds`` of
        their starting values).
    max_iter : int
        L-BFGS-B iterations.
    tol : float
        L-BFGS-B's relative tolerance on the bound (``ftol``).
    report : callable, optional
        ``report(iteration, bound, rows_per_s, current)`` after every iteration; True stops.
        With priors on the kernel's hyperparameters (:mod:`pygpfast.priors`) the search
        maximises the bound plus their log density, and ``bound`` here is that sum.
        ``current()`` returns the :class:`MFFit` at the iterate (its posterior costs an
        O(N M^2) solve, so call it only when needed); the kernel holds the iterate's
        parameters during the call.

    Returns
    -------
    MFFit
    """
    N = X.shape[0]
    M, D = Z.shape
    Z = np.ascontiguousarray(Z, dtype=np.float64).copy()
    state = {"a": np.zeros(N), "bound": -np.inf, "it": 0, "clock": time.perf_counter(),
             "inner_failures": 0}

    def solve(with_grad):
        value, a, grads, info = mf_bound(kernel, Z, X, y, state["a"], jitter=jitter, solve_a=True,
                                         with_grad=with_grad)
        if not info["inner_converged"]:
            state["inner_failures"] += 1
        state["a"] = a
        state["bound"] = value
        return value, grads

    # Stage 1 (hyperparameters and Z frozen): the optimal variational parameters.
    solve(False)

    n_Z = M * D if train_Z else 0
    # Z in units of the spread of its columns (as in svgp._optim.Packer): steps independent of
    # the scale of the features.
    z_scale = column_spread(Z)

    def set_x(x):
        nonlocal Z
        if train_Z:
            Z = x[:n_Z].reshape(M, D) * z_scale
        if train_hyper:
            kernel.theta = x[n_Z:]

    with_prior = kernel.has_priors

    def objective(x):
        set_x(x)
        value, g = solve(True)
        parts = []
        if train_Z:
            parts.append((g["Z"] * z_scale).ravel())
        if train_hyper:
            d_theta = g["kernel"] * kernel.params  # d/dtheta = params * d/dparams
            if with_prior:
                value += kernel.log_prior()
                d_theta += kernel.grad_log_prior()
            parts.append(d_theta)
        return -value / N, -np.concatenate(parts) / N

    def log_prior():
        return kernel.log_prior() if with_prior else 0.0

    def current():
        q_mu, q_sqrt = mf_posterior(kernel, Z, X, y, state["a"], jitter=jitter)
        return MFFit(a=state["a"].copy(), Z=Z.copy(), q_mu=q_mu, q_sqrt=q_sqrt,
                     bound=float(state["bound"]), n_iter=state["it"], log_prior=log_prior())

    def on_iteration(_, x, __):
        state["it"] += 1
        now = time.perf_counter()
        rate = N / max(now - state["clock"], 1e-12)
        state["clock"] = now
        set_x(x)  # the accepted iterate, not the last line-search trial
        return report is not None and report(state["it"], state["bound"] + log_prior(), rate,
                                             current)

    # Stage 2: Z and the kernel parameters at the optimal a.
    if train_Z or train_hyper:
        x0, bounds = [], []
        if train_Z:
            x0.append((Z / z_scale).ravel())
            bounds += [(None, None)] * n_Z
        if train_hyper:
            x0.append(kernel.theta)
            bounds += list(zip(*hyper_bounds(kernel.theta)))
        x0 = np.concatenate(x0)
        res = lbfgs(objective, x0, bounds=bounds, max_iter=max_iter, ftol=tol, gtol=1e-8,
                    on_iteration=on_iteration)
        set_x(res.x)
        solve(False)  # a at the final Z and kernel
        problem = res.problem
        if problem is not None:
            reason = (f"L-BFGS-B stopped after max_iter={max_iter} iterations; increase max_iter "
                      "for a tighter fit" if problem == "max_iter" else
                      f"{problem}; the fit may be far from the optimum")
            warn_at_caller(f"SVGP (mf): {reason}", ConvergenceWarning)
    if state["inner_failures"]:
        warn_at_caller(
            f"SVGP (mf): the solve for the variational parameters a did not reach its tolerance "
            f"in {state['inner_failures']} evaluation(s); gradients there are approximate",
            ConvergenceWarning,
        )
    q_mu, q_sqrt = mf_posterior(kernel, Z, X, y, state["a"], jitter=jitter)
    return MFFit(a=state["a"], Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, bound=float(state["bound"]),
                 n_iter=state["it"], log_prior=log_prior())


def check_estimator_params(estimator):
    """ValueError unless an SVGP estimator's settings allow ``method="mf"``."""
    if not estimator._is_probit():
        what = "SVGPRegressor"
        if is_classifier(estimator):
            what = (f"likelihood={estimator.likelihood!r}" if estimator.label_noise in ("auto", 0.0)
                    else f"label_noise={estimator.label_noise!r}")
        raise ValueError(
            "method='mf' (Hensman, Matthews & Ghahramani 2015 section 3.1) rests on the probit augmentation of eq. (9); "
            f"it needs SVGPClassifier with the plain probit likelihood, not {what}. Use method='kl'."
        )
    if estimator.optimizer not in ("auto", "lbfgs") or estimator.batch_size != "auto":
        raise ValueError(
            "method='mf' optimises its N coupled variational parameters with full-batch "
            "L-BFGS-B; use optimizer='auto' or 'lbfgs' and batch_size='auto' (minibatch "
            "optimisers apply to method='kl' only)"
        )
