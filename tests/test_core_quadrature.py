"""The compiled Gauss-Hermite rules (pygpfast._core.likelihoods.gauss_hermite) against numpy's hermgauss."""

import math

import numpy as np
import pytest
from numpy.polynomial.hermite import hermgauss

from pygpfast import _core

ALL_N = range(1, 101)


@pytest.mark.parametrize("n", ALL_N)
def test_matches_hermgauss(n):
    x, w = _core.likelihoods.gauss_hermite(n)
    x_ref, w_ref = hermgauss(n)
    assert x.shape == w.shape == (n,)
    # Reached: nodes within 2.3e-16 * max(1, |x|); weights within 5.7e-14 relative, the
    # difference being hermgauss' error on the smallest weights (ours are within 1e-16 of a
    # 50-digit computation).
    np.testing.assert_array_less(np.abs(x - x_ref), 1e-14 * np.maximum(1.0, np.abs(x_ref)))
    np.testing.assert_allclose(w, w_ref, rtol=2e-13, atol=0)


@pytest.mark.parametrize("n", ALL_N)
def test_nodes_ascending_and_symmetric(n):
    x, w = _core.likelihoods.gauss_hermite(n)
    assert np.all(np.diff(x) > 0)
    np.testing.assert_array_equal(x, -x[::-1])
    np.testing.assert_array_equal(w, w[::-1])
    assert np.all(w > 0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 10, 20, 33, 50, 77, 100])
def test_integrates_even_monomials_exactly(n):
    # integral x^(2k) exp(-x^2) dx = Gamma(k + 1/2), exact for 2k <= 2n - 1.
    x, w = _core.likelihoods.gauss_hermite(n)
    for k in range(n):
        np.testing.assert_allclose(np.sum(w * x ** (2 * k)), math.gamma(k + 0.5), rtol=1e-13)


def test_rule_is_cached_and_copied():
    x1, _ = _core.likelihoods.gauss_hermite(20)
    x1[:] = 0.0  # the binding returns copies: the cached rule is untouched
    x2, _ = _core.likelihoods.gauss_hermite(20)
    np.testing.assert_array_equal(x2, hermgauss(20)[0])


@pytest.mark.parametrize("n", [0, -1, 101, 1000])
def test_bad_n(n):
    with pytest.raises(ValueError, match="between 1 and 100"):
        _core.likelihoods.gauss_hermite(n)
