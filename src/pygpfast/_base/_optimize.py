"""The one L-BFGS-B driver of every estimator's full-batch search."""

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import _threads


@dataclass
class LBFGSResult:
    """What :func:`lbfgs` returns."""

    x: np.ndarray  #: the last accepted iterate (where the callback stopped, if it did)
    value: float  #: the objective there
    n_iter: int  #: iterations (accepted iterates)
    n_evaluations: int  #: evaluations of the objective
    stopped: bool  #: ``on_iteration`` asked to stop
    #: None when the search converged or was stopped; "max_iter" when it ran out of iterations;
    #: else L-BFGS-B's own reason for giving up early (a failed line search, say).
    problem: Optional[str]
    message: str  #: L-BFGS-B's own message

    @property
    def converged(self):
        """Whether the search met its tolerances (neither stopped nor out of iterations)."""
        return self.problem is None and not self.stopped


def lbfgs(objective, x0, *, bounds, max_iter, ftol, gtol, on_iteration=None, max_evaluations=None):
    """Minimise ``objective(x) -> (value, gradient)`` by scipy's L-BFGS-B, with scipy's own BLAS
    calls on one thread (:func:`pygpfast._threads.minimize`).

    Parameters
    ----------
    objective : callable
        ``objective(x [P]) -> (float, ndarray [P])``.
    x0 : ndarray [P]
    bounds : sequence of (low, high) pairs, or scipy.optimize.Bounds
    max_iter : int
    ftol, gtol : float
        scipy's tolerances on the relative change of the value and on the projected gradient.
    on_iteration : callable, optional
        ``on_iteration(iteration, x, value) -> bool`` at each accepted iterate (iterations count
        from 1); a true answer stops the search there.
    max_evaluations : int, optional
        scipy's ``maxfun`` (default: its own, 15000).

    Returns
    -------
    LBFGSResult
    """
    count = {"it": 0, "stopped": False}

    def callback(intermediate_result):
        count["it"] += 1
        if on_iteration is not None and on_iteration(count["it"], intermediate_result.x,
                                                     float(intermediate_result.fun)):
            count["stopped"] = True
            raise StopIteration  # (L-BFGS-B then returns the current iterate)

    options = {"maxiter": max_iter, "ftol": ftol, "gtol": gtol}
    if max_evaluations is not None:
        options["maxfun"] = max_evaluations
    res = _threads.minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                            callback=callback, options=options)
    if res.success or count["stopped"]:
        problem = None
    elif res.nit >= max_iter:
        problem = "max_iter"
    else:
        problem = f"L-BFGS-B stopped after {res.nit} iterations ({str(res.message).rstrip(': ')})"
    return LBFGSResult(x=np.asarray(res.x), value=float(res.fun), n_iter=int(res.nit),
                       n_evaluations=int(res.nfev), stopped=count["stopped"], problem=problem,
                       message=str(res.message))
