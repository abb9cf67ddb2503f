import numpy as np
import pytest

import pygpfast


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def restore_threads():
    """Give a test free use of pygpfast.set_num_threads and restore the default after it."""
    yield
    pygpfast.set_num_threads(None)


@pytest.fixture
def one_blas_thread():
    """Run the test's BLAS calls on one thread. The core does so itself for problems of fewer
    than 512 points where the BLAS's thread count can be set (openblas_set_num_threads_local:
    OpenBLAS >= 0.3.27, scipy >= 1.13's wheels); without it (scipy 1.11's OpenBLAS 0.3.21) their calls use all the BLAS's threads
    and round differently, which moves the fuzz cases pinned to one rounding path."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
