"""Thread control: the core's OpenMP loops and the BLAS that pygpfast shares with scipy."""

import numbers

from threadpoolctl import threadpool_limits

from . import _core

__all__ = ["get_num_threads", "set_num_threads"]

_blas_limiter = None


def get_num_threads():
    """Number of threads pygpfast's OpenMP loops use."""
    return _core.get_num_threads()


def set_num_threads(n=None):
    """Set the number of threads pygpfast uses.

    Parameters
    ----------
    n : int or None
        ``n >= 1`` uses n threads; ``None`` (or ``n <= 0``) restores the default, which is
        ``OMP_NUM_THREADS`` when set and otherwise every available core.

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
        _core.set_num_threads(0)
        return
    n = int(n)
    _core.set_num_threads(n)
    _blas_limiter = threadpool_limits(limits=n, user_api="blas")
