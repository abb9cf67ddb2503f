"""Thread control: the core's OpenMP loops and the BLAS that pygpfast shares with scipy."""

import contextlib
import functools
import numbers
import threading

import scipy.optimize
from threadpoolctl import threadpool_limits

from . import _core

__all__ = ["get_num_threads", "set_num_threads"]

_blas_limiter = None


def get_num_threads():
    """Number of threads pygpfast's OpenMP loops use."""
    return _core.threads.get_num_threads()


def set_num_threads(n=None):
    """Set the number of threads pygpfast uses.

    Parameters
    ----------
    n : int or None
        ``n >= 1`` uses n threads; ``None`` (or ``n <= 0``) restores the default, OpenMP's
        count when the core runs (as scikit-learn's ``n_threads=None``): ``OMP_NUM_THREADS``
        when set and otherwise every available core, or the limit of a
        ``threadpoolctl.threadpool_limits`` block around the call.

    Notes
    -----
    pygpfast runs per-point loops with OpenMP and big products in the BLAS that numpy and
    scipy loaded (one BLAS per process). Both follow this setting, so the BLAS limit also
    applies to numpy/scipy calls in this process until it is reset with ``n=None``.
    Results do not depend on the thread count beyond rounding.
    """
    global _blas_limiter
    if n is not None and (not isinstance(n, numbers.Integral) or isinstance(n, bool)):
        raise ValueError(f"n must be an int or None, got {n!r}")  # (numpy integers pass)
    if _blas_limiter is not None:
        _blas_limiter.restore_original_limits()
        _blas_limiter = None
    if n is None or n <= 0:
        _core.threads.set_num_threads(0)
        return
    n = int(n)
    _core.threads.set_num_threads(n)
    _blas_limiter = threadpool_limits(limits=n, user_api="blas")


# threadpoolctl scopes of one_blas_thread(process_wide=True) open, and the limiter of the first.
_process_wide = {"lock": threading.Lock(), "open": 0, "limiter": None}


@contextlib.contextmanager
def one_blas_thread(*, process_wide=False):
    """The BLAS on one thread within the block (a scope of the core's enter_one_blas_thread,
    counted process-wide with the core's own, so that the count from before the first scope is
    the one restored after the last).

    Where the core cannot set the BLAS's count (OpenBLAS before 0.3.27, as at the dependency
    floors) the scope does nothing, unless ``process_wide``: threadpoolctl then sets the count
    for the process, counted among such scopes in the same way. BLAS calls in other Python
    threads run on one thread meanwhile, and round as they do there, so only code whose results
    must not follow the thread count asks for it (an IS-MOE chunk, whose probit searches ended
    1.3e-4 apart in the objective on one and two BLAS threads).
    """
    entered = _core.threads.enter_one_blas_thread()
    held = process_wide and not entered
    if held:
        with _process_wide["lock"]:
            if _process_wide["open"] == 0:
                _process_wide["limiter"] = threadpool_limits(limits=1, user_api="blas")
            _process_wide["open"] += 1
    try:
        yield
    finally:
        if entered:
            _core.threads.leave_one_blas_thread()
        if held:
            with _process_wide["lock"]:
                _process_wide["open"] -= 1
                if _process_wide["open"] == 0:
                    _process_wide["limiter"].restore_original_limits()
                    _process_wide["limiter"] = None


def minimize(fun, x0, *, callback=None, **kwargs):
    """``scipy.optimize.minimize(fun, x0, callback=callback, **kwargs)`` with scipy's own BLAS
    calls on one thread, and ``fun``'s and ``callback``'s (the core's) on the usual count.

    scipy's L-BFGS-B solves tiny triangular systems (2 x the number of stored pairs) with
    LAPACK's dtrtrs, which OpenBLAS runs on all its threads whatever their size. When scipy's
    OpenBLAS was loaded before pygpfast (``import sklearn`` first), its idle threads spin
    instead of sleeping (pygpfast's OPENBLAS_THREAD_TIMEOUT came too late), and each such
    call waits for a spinning thread that competes with the caller: an SVGPClassifier fit on
    ionosphere (M = 20, 975 L-BFGS-B iterations) took 6.2 s instead of 0.8 s on a loaded
    2-core machine. Where the BLAS's count cannot be set this is plain ``minimize``. (The
    setting is process-wide: while another thread holds a scope, ``fun`` runs on one BLAS
    thread too.)
    """
    if not _core.threads.enter_one_blas_thread():
        return scipy.optimize.minimize(fun, x0, callback=callback, **kwargs)

    def core_threads(f):
        @functools.wraps(f)
        def wrapped(*args, **kw):
            _core.threads.leave_one_blas_thread()
            try:
                return f(*args, **kw)
            finally:
                _core.threads.enter_one_blas_thread()
        return wrapped

    try:
        return scipy.optimize.minimize(core_threads(fun), x0,
                                       callback=None if callback is None else core_threads(callback),
                                       **kwargs)
    finally:
        _core.threads.leave_one_blas_thread()
