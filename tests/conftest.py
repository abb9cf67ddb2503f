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
