"""Comparisons across thread counts (and Dask workers): bitwise where the core can hold the BLAS
to one thread inside its parallel loops (OpenBLAS >= 0.3.27, as in scipy >= 1.13's wheels); to
rounding where it cannot (the dependency floors' OpenBLAS 0.3.21, whose calls then run on all its
threads and round differently with their count, which a search of tens of iterations carries to
about 1e-6 of a prediction)."""

import numpy as np

from pygpfast import _core

EXACT = bool(_core.blas.thread_control)


def assert_same(a, b, rtol=1e-5, bitwise=True):
    """a == b bitwise (when `bitwise`), or to `rtol` where the BLAS cannot be held to one thread
    (integers and labels always exactly)."""
    a, b = np.asarray(a), np.asarray(b)
    if (EXACT and bitwise) or a.dtype.kind not in "fc":
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.max(np.abs(b), initial=0.0))
