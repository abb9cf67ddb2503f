"""Exceptions and warnings raised by pygpfast."""

import sys
import warnings

import numpy as np

__all__ = ["LinAlgError", "NumericalWarning"]


class LinAlgError(np.linalg.LinAlgError):
    """A factorisation failed; the message names the routine and what to change."""


class NumericalWarning(UserWarning):
    """A computation needed a numerical safeguard (for example jitter on a Cholesky)."""


def warn_at_caller(message, category=NumericalWarning):
    """warnings.warn attributed to the caller of the outermost pygpfast frame (the user's line
    that called fit, say): a safeguard taken at every step of a fit is then one warning there
    (Python shows a warning once per message and location), not one per step pointing inside
    the optimiser, or at scipy's, which calls the objective."""
    frame, level, outermost = sys._getframe(1), 2, 2
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "pygpfast":
            outermost = level
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=outermost + 1)


def warn_inducing_jitter(who, extra, mean_diag):
    """The NumericalWarning for `extra` jitter (absolute) added to K(Z, Z), whose mean diagonal
    is `mean_diag`, by the core's escalation (factors of 10: the message takes few values)."""
    if extra > 0:
        warn_at_caller(
            f"{who}: K(Z, Z) was not numerically positive definite; added jitter of "
            f"{extra / mean_diag:.0e} times its mean diagonal. Inducing points may be "
            "duplicated; consider fewer of them or a larger jitter.")
