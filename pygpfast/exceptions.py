"""Exceptions and warnings raised by pygpfast."""

import numpy as np

__all__ = ["LinAlgError", "NumericalWarning"]


class LinAlgError(np.linalg.LinAlgError):
    """A factorisation failed; the message names the routine and what to change."""


class NumericalWarning(UserWarning):
    """A computation needed a numerical safeguard (for example jitter on a Cholesky)."""
