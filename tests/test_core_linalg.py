"""Raw bindings of the BLAS table and linalg: references and argument checks."""

import numpy as np
import pytest

from pygpfast import _core


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_blas_gemm_all_transposes(rng, ta, tb):
    A = rng.standard_normal((7, 5) if not ta else (5, 7))
    B = rng.standard_normal((5, 3) if not tb else (3, 5))
    ref = (A.T if ta else A) @ (B.T if tb else B)
    np.testing.assert_allclose(_core.blas.gemm(A, B, ta, tb), ref, rtol=1e-13, atol=1e-13)


def test_blas_gemm_large_matches_numpy(rng):
    A = rng.standard_normal((300, 200))
    B = rng.standard_normal((200, 100))
    np.testing.assert_allclose(_core.blas.gemm(A, B), A @ B, rtol=1e-12, atol=1e-11)


def test_blas_gemm_shape_mismatch_is_valueerror(rng):
    with pytest.raises(ValueError, match="inner dimensions"):
        _core.blas.gemm(np.ones((2, 3)), np.ones((2, 3)))


@pytest.mark.parametrize(
    "arr, match",
    [
        (np.ones((3, 3), dtype=np.float32), "float64"),
        (np.ones((3, 3), order="F")[:, :2], "C-contiguous"),
        (np.ones(3), "2-D"),
    ],
)
def test_raw_bindings_refuse_bad_arrays(arr, match):
    with pytest.raises(ValueError, match=match):
        _core.linalg.cholesky(arr)


def test_raw_cholesky_returns_jitter(rng):
    A = np.ones((4, 4))
    L, jitter = _core.linalg.cholesky(A)
    assert jitter > 0
    np.testing.assert_allclose(L @ L.T, A + jitter * np.eye(4), atol=1e-12)


def test_blas_source_is_scipy():
    assert "scipy" in _core.blas.source
