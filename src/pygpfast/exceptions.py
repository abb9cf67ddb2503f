"""Exceptions and warnings raised by pygpfast."""

import contextlib
import sys
import threading
import warnings

import numpy as np

__all__ = ["LinAlgError", "NumericalWarning"]


class LinAlgError(np.linalg.LinAlgError):
    """A factorisation failed; the message names the routine and what to change."""


class NumericalWarning(UserWarning):
    """A computation needed a numerical safeguard (for example jitter on a Cholesky)."""


class _Holds(threading.local):
    """The :class:`HeldWarnings` blocks active on a thread, innermost last: a hold is the
    thread's own, so a fit holds its own warnings and no other thread's."""

    def __init__(self):
        self.stack = []


_holds = _Holds()


def warn_at_caller(message, category=NumericalWarning):
    """warnings.warn attributed to the caller of the outermost pygpfast frame (the user's line
    that called fit, say): a safeguard taken at every step of a fit is then one warning there
    (Python shows a warning once per message and location), not one per step pointing inside
    the optimiser, or at scipy's, which calls the objective. Within a :class:`HeldWarnings`
    block on this thread, the innermost block holds it instead (its release issues it)."""
    if _holds.stack:
        _holds.stack[-1]._held.setdefault((category, str(message)), message)
        return
    frame, level, outermost = sys._getframe(1), 2, 2
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "pygpfast":
            outermost = level
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=outermost + 1)


class _JitterReports(threading.local):
    """The :class:`JitterReport` blocks active on a thread, innermost last."""

    def __init__(self):
        self.stack = []


_jitter_reports = _JitterReports()


def warn_inducing_jitter(who, extra, mean_diag):
    """The NumericalWarning for `extra` jitter (absolute) added to K(Z, Z), whose mean diagonal
    is `mean_diag`, by the core's escalation; within a :class:`JitterReport` block on this
    thread, recorded there instead (the block's end issues one warning for all)."""
    if not extra > 0:
        return
    relative = extra / mean_diag
    if _jitter_reports.stack:
        _jitter_reports.stack[-1]._record(who, relative)
        return
    warn_at_caller(_jitter_message(who, relative, 1))


def _jitter_message(who, relative, count):
    times = "" if count == 1 else f" (in {count} evaluations)"
    return (f"{who}: K(Z, Z) was not numerically positive definite; added jitter of up to "
            f"{relative:.0e} times its mean diagonal{times}. Inducing points may be duplicated: "
            "use fewer or distinct inducing_points, or increase jitter.")


class JitterReport:
    """Within a ``with`` block on this thread, :func:`warn_inducing_jitter` records the jitter
    escalations (the largest and how many) instead of warning at each; leaving the block issues
    one NumericalWarning for them all (through :func:`warn_at_caller`, so a
    :class:`HeldWarnings` block around it holds it). A fit evaluates K(Z, Z) at every step: one
    warning per fit, not one per step (nor one per distinct jitter)."""

    def __init__(self):
        self._who, self._largest, self._count = None, 0.0, 0

    def _record(self, who, relative):
        self._who = self._who or who
        self._largest = max(self._largest, relative)
        self._count += 1

    def __enter__(self):
        _jitter_reports.stack.append(self)
        return self

    def __exit__(self, kind, value, traceback):
        _jitter_reports.stack.pop()
        if self._count and kind is None:
            warn_at_caller(_jitter_message(self._who, self._largest, self._count))
        return False


class HeldWarnings:
    """pygpfast's warnings issued on this thread within a ``with`` block, held back instead of
    shown: those of a hyperparameter search that a second search may replace (the estimators'
    ``restart_``). :meth:`release` issues them, each once, through :func:`warn_at_caller`: at
    the user's line, under the filters in force then (an "error" filter raises it there), or,
    within another block, into that block's hold. A search that is discarded drops them with
    this object. A block left by an exception releases them on the way out (the exception wins
    over a filter that would raise one).

    Only what pygpfast issues through :func:`warn_at_caller` is held, and only on the thread
    that entered the block: the process's warning filters and ``warnings.showwarning`` are left
    alone, so that fits in concurrent threads neither hold nor drop each other's warnings, nor
    anyone else's. Warnings that numpy, scipy or scikit-learn issue during a search (a
    RuntimeWarning, KMeans's), or a callback with ``warnings.warn``, are shown as they occur,
    whichever search is kept. ``HeldWarnings(False)`` adds no hold (one around it still holds).
    """

    def __init__(self, hold=True):
        self.hold = hold
        self._held = {}  # (category, text) -> message

    def __enter__(self):
        if self.hold:
            _holds.stack.append(self)
        return self

    def __exit__(self, kind, value, traceback):
        if self.hold:
            _holds.stack.pop()  # (blocks on one thread nest: this one is the innermost)
            if kind is not None:
                with contextlib.suppress(Warning):
                    self.release()
        return False

    def release(self):
        """Issue the warnings held (once: they are then no longer held)."""
        held, self._held = self._held, {}
        for (category, _), message in held.items():
            warn_at_caller(message, category)
