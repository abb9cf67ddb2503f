"""Exceptions and warnings raised by pygpfast."""

import contextlib
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


class HeldWarnings:
    """The warnings issued within a ``with`` block, held back instead of shown: those of a
    hyperparameter search that a second search may replace (the estimators' ``restart_``).
    :meth:`release` issues them, each once, at the location and through the module's registry
    it was issued with, under the filters in force then (an "error" filter raises it there); a
    search that is discarded drops them with this object. A block left by an exception releases
    them on the way out (the exception wins over a filter that would raise one).

    Holding sets the process's warning filters and ``warnings.showwarning`` for the block, as
    ``warnings.catch_warnings`` does (not thread-safe). ``HeldWarnings(False)`` holds nothing.
    """

    def __init__(self, hold=True):
        self.hold = hold
        self._held = {}  # (category, text, filename, lineno) -> (message, where)

    def __enter__(self):
        if self.hold:
            self._saved = warnings.catch_warnings()
            self._saved.__enter__()
            # (every warning reaches _keep, also those that the filters would raise, ignore
            # or show once: they apply at the release)
            warnings.simplefilter("always")
            warnings.showwarning = self._keep
        return self

    def _keep(self, message, category, filename, lineno, file=None, line=None):
        # The frame the warning is attributed to gives the module that the filters match and
        # the registry with which the "default" and "module" actions show it once, as
        # warnings.warn takes them (for a location outside the stack, warn_explicit's own).
        frame = sys._getframe(1)
        while frame is not None and (frame.f_code.co_filename, frame.f_lineno) != (filename,
                                                                                   lineno):
            frame = frame.f_back
        where = {} if frame is None else {
            "module": frame.f_globals.get("__name__", "<string>"),
            "registry": frame.f_globals.setdefault("__warningregistry__", {})}
        self._held.setdefault((category, str(message), filename, lineno), (message, where))

    def __exit__(self, kind, value, traceback):
        if self.hold:
            self._saved.__exit__(kind, value, traceback)
            if kind is not None:
                with contextlib.suppress(Warning):
                    self.release()
        return False

    def release(self):
        """Issue the warnings held (once: they are then no longer held)."""
        held, self._held = self._held, {}
        for (category, _, filename, lineno), (message, where) in held.items():
            # (module_globals is left out, as warnings.warn leaves it: warn_explicit would ask
            # its __loader__ for the source line, which raises ImportError for the __main__ of
            # ``python -c``)
            warnings.warn_explicit(message, category, filename, lineno, **where)
